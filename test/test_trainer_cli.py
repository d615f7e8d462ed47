"""
Bad-input tests of the trainers' command line, and an end-to-end CPU training run.

Every bad input must end with exactly one line on stderr, starting with "error:" and
naming the flag, file or value, and a non-zero exit: never a crash, a hang or a stack of
messages. The GPU trainer checks flags, model files and data before its first CUDA call,
so these tests run it on CI machines without a GPU too. The CPU trainer (train_gpt2cpu)
shares the flag table, the data loader and the checkpoint code, and also trains end to end
here: loss goes down, and a resumed run is bitwise identical to an uninterrupted one, with
either optimizer (-opt adamw | adamw8), across optimizers (a checkpoint of one resumes under
the other), and in FP8 (-p fp8, the CPU reference's emulation).
"""
import json
import os
import re
import struct
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = os.path.join(ROOT, "train_gpt2cpu")
GPU = os.path.join(ROOT, "train_gpt2_fp8")
TRAINERS = [b for b in (CPU, GPU)]
V = 50257


def write_shard(path, tokens, magic=20240520, version=1, count=None, truncate_by=0):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    body = np.asarray(tokens, dtype=np.uint16).tobytes()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body[: len(body) - truncate_by] if truncate_by else body)


def random_tokens(n, seed=0, high=1000):
    rng = np.random.default_rng(seed)
    return rng.integers(0, high, size=n)


@pytest.fixture
def data(tmp_path):
    """a small valid train/val split"""
    write_shard(tmp_path / "d_train_000001.bin", random_tokens(20000, 1))
    write_shard(tmp_path / "d_val_000000.bin", random_tokens(5000, 2))
    return tmp_path


def run(binary, args, timeout=120, env_extra=None):
    """binary with args from the checkout's root; env_extra: variables added to this environment"""
    if not os.path.exists(binary):
        pytest.fail(f"{binary} is not built (make train_gpt2cpu train_gpt2_fp8)")
    return subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, **(env_extra or {})))


def base_args(data, extra=(), model="tiny"):
    return ["-e", model, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-b", 2, "-t", 32,
            "-v", 0, "-s", 0, "-x", 2] + list(extra)


def small_vocab_model(data):
    """-e tiny's shape (2 layers, 2 heads, C = 128) with 1000 tokens, random_tokens' range, as an llm.c model file in
    data: a CPU step takes a fraction of -e tiny's, whose 50257-token lm_head and loss were most of its time. For the
    runs that compare bits or data positions (run_straight, run_split), which need not learn which tokens occur."""
    path = data / "small_vocab.bin"
    if not path.exists():
        import sim_model
        sim_model.write_model(path, layers=2, heads=2, channels=128, vocab=1000)
    return path


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0, f"expected failure, got exit 0; stdout={result.stdout[-500:]}"
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}: {result.stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert str(fragment) in lines[0], f"{fragment!r} not in {lines[0]!r}"


@pytest.mark.parametrize("binary", TRAINERS, ids=["cpu", "gpu"])
class TestBadInput:
    def test_unknown_flag(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-Q", 1])), "-Q")

    def test_glob_expanded_by_the_shell(self, binary, data):
        """-i dir/*.bin unquoted: the shell hands the trainer several files, the second where a flag should be"""
        args = base_args(data) + ["-i", data / "d_train_000001.bin", data / "d_val_000000.bin"]
        assert_one_line_error(run(binary, args), "'" + str(data / "d_val_000000.bin") + "' is not a flag", "quote -i")

    def test_flag_out_of_range(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-r", 7])), "-r", "7", "0..2")

    def test_gelu_fusion_out_of_range(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-ge", 3])), "-ge", "3", "0..2")

    @pytest.mark.parametrize("flag,value", [("-sl", -1), ("-sg", -0.5), ("-lg", -2)])
    def test_outlier_skip_flag_out_of_range(self, binary, data, flag, value):
        assert_one_line_error(run(binary, base_args(data, [flag, value])), flag, str(value))

    @pytest.mark.parametrize("value", [0, -2])
    def test_val_batches_out_of_range(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-m", value])), "-m", str(value))

    def test_flag_not_a_number(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-l", "fast"])), "-l", "fast")

    def test_flag_missing_value(self, binary, data):
        assert_one_line_error(run(binary, base_args(data) + ["-b"]), "-b")

    def test_unknown_choice(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-k", "exponential"])), "-k", "exponential", "cosine")

    def test_unknown_model_descriptor(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-e", "d13"])), "d13")

    def test_missing_train_data(self, binary, data):
        pattern = data / "nothing_train_*.bin"
        assert_one_line_error(run(binary, base_args(data, ["-i", pattern])),
                              f"flag -i '{pattern}': no token shards match it (check the path; dev/data/ makes shards)")

    def test_missing_val_data(self, binary, data):
        """-j matching nothing (a folder too small for a val split has no val shard): the line says how to train
        without val; with -v 0 the val glob is not read"""
        pattern = data / "nothing_val_*.bin"
        assert_one_line_error(run(binary, base_args(data, ["-j", pattern, "-v", 1])),
                              f"flag -j '{pattern}': no token shards match it", '-j "" trains without val')
        if binary == CPU:
            assert run(binary, base_args(data, ["-j", pattern, "-v", 0])).returncode == 0

    def test_wrong_shard_magic(self, binary, data):
        write_shard(data / "bad_train_000001.bin", random_tokens(20000), magic=12345)
        assert_one_line_error(run(binary, base_args(data, ["-i", data / "bad_train_*.bin"])), "bad_train_000001.bin")

    def test_wrong_shard_version(self, binary, data):
        write_shard(data / "bad_train_000001.bin", random_tokens(20000), version=7)
        assert_one_line_error(run(binary, base_args(data, ["-i", data / "bad_train_*.bin"])), "bad_train_000001.bin")

    def test_truncated_shard(self, binary, data):
        write_shard(data / "bad_train_000001.bin", random_tokens(20000), truncate_by=1000)
        assert_one_line_error(run(binary, base_args(data, ["-i", data / "bad_train_*.bin"])), "bad_train_000001.bin")

    def test_epoch_of_more_steps_than_an_int_refused(self, binary, tmp_path):
        """-x -1 over 70 shards of 2^31 - 1 tokens (one sparse file, linked 70 times), 64 tokens a step: 2.3 billion
        steps do not fit the step counter, so one line asks for -x (a cast to int made it negative, then 1 step)"""
        big = tmp_path / "big.bin"
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1], header[2] = 20240520, 1, 2**31 - 1
        with open(big, "wb") as f:
            f.write(header.tobytes())
            f.truncate(1024 + 2 * (2**31 - 1))
        for i in range(70):
            (tmp_path / f"big_train_{i:06d}.bin").symlink_to(big)
        args = ["-e", "tiny", "-i", tmp_path / "big_train_*.bin", "-j", "", "-b", 2, "-t", 32, "-v", 0, "-s", 0, "-x", -1]
        assert_one_line_error(run(binary, args), "-x -1", "one epoch of the train data is 2348810170 steps")

    def test_token_id_out_of_vocab(self, binary, data):
        tokens = random_tokens(20000)
        tokens[10] = V + 3
        write_shard(data / "bad_train_000001.bin", tokens)
        assert_one_line_error(run(binary, base_args(data, ["-i", data / "bad_train_*.bin"])), "bad_train_000001.bin", V + 3)

    def test_seq_len_above_max(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-t", 2048])), "-t", "2048", "1024")

    def test_total_batch_not_divisible(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-d", 1000])), "-d", "1000", "64")

    def test_negative_steps(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-x", -2])), "flag -x", "-2 is out of range")

    def test_negative_warmup(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-u", -1])), "flag -u", "-1 is out of range", "0..")

    def test_total_batch_zero(self, binary, data):  # once a division by zero (SIGFPE), or NaN steps with exit 0
        assert_one_line_error(run(binary, base_args(data, ["-d", 0])), "-d 0", "positive multiple", "64")

    def test_unwritable_output_dir(self, binary, data):
        blocker = data / "a_file"
        blocker.write_text("not a directory")
        assert_one_line_error(run(binary, base_args(data, ["-o", blocker / "logs"])), "a_file/logs")

    def test_starting_over_into_a_dir_with_checkpoints(self, binary, data):
        out = data / "used"
        out.mkdir()
        (out / "DONE_00000004").write_bytes(b"")
        assert_one_line_error(run(binary, base_args(data, ["-o", out, "-n", 2])), "used", "step 4", "-y 1")

    def test_model_file_is_a_directory(self, binary, data):  # once "read failed: Is a directory (checkpoint.h:201)"
        (data / "model_dir.bin").mkdir()
        assert_one_line_error(run(binary, base_args(data, ["-e", data / "model_dir.bin"])), "model_dir.bin",
                              "a directory, not a regular file")

    def test_missing_tokenizer_given_with_tk(self, binary, data):  # the CPU trainer too: its command lines run on a GPU
        assert_one_line_error(run(binary, base_args(data, ["-tk", data / "no_tokenizer.bin"])), "-tk", "no_tokenizer.bin")

    def test_data_glob_matching_a_directory(self, binary, data):
        (data / "d_train_000002.bin").mkdir()
        assert_one_line_error(run(binary, base_args(data)), "d_train_000002.bin", "a directory, not a regular file")

    def test_missing_model_file(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-e", data / "missing_model.bin"])), "-e", "missing_model.bin", "no such model file")

    def test_wrong_model_magic(self, binary, data):
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1] = 1234, 3
        (data / "bad_model.bin").write_bytes(header.tobytes())
        assert_one_line_error(run(binary, base_args(data, ["-e", data / "bad_model.bin"])), "bad_model.bin")

    def test_wrong_model_version(self, binary, data):
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1] = 20240326, 4
        header[2:8] = [1024, V, 2, 4, 128, 50304]
        (data / "bad_model.bin").write_bytes(header.tobytes())
        assert_one_line_error(run(binary, base_args(data, ["-e", data / "bad_model.bin"])), "bad_model.bin")

    def test_resume_without_output_dir(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-y", 1])), "-y", "-o")

    def test_checkpoints_without_output_dir(self, binary, data):  # else -n would write nothing, silently
        assert_one_line_error(run(binary, base_args(data, ["-n", 1])), "flag -n 1 needs an output dir -o")

    # FP8 flags: checked by the shared flag table before any GPU work
    def test_fp8_unknown_precision(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp4"])), "-p", "fp4", "bf16 fp8")

    def test_fp8_unknown_recipe(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fr", "tensorwise"])), "-fr", "tensorwise", "delayed current block")

    @pytest.mark.parametrize("value", [0, 1025])
    def test_fp8_history_out_of_range(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fh", value])), "-fh", str(value), "1..1024")

    @pytest.mark.parametrize("value", [-1, 17])
    def test_fp8_margin_out_of_range(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fm", value])), "-fm", str(value), "0..16")

    def test_fp8_numerics_interval_negative(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fn", -5])), "-fn", "-5")

    @pytest.mark.parametrize("value,fragment", [("qkv,mlp", "'mlp'"), ("", "''"), ("qkv,", "''"), ("fc,fc", "twice")])
    def test_fp8_bad_linear_list(self, binary, data, value, fragment):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-f8", value])), "-f8", fragment)

    @pytest.mark.parametrize("value,fragment", [("fwd,bwd", "'bwd'"), ("fc.bogus", "'bogus' is not a pass"),
                                                ("mlp.wgrad", "'mlp' is not a linear"), ("fwd,fwd", "twice"),
                                                ("fc.dgrad,fc.dgrad", "twice"), ("", "''"),
                                                ("lm_head.fwd", "lm_head, which -f8 does not list")])
    def test_fp8_bad_pass_list(self, binary, data, value, fragment):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-f8p", value])), "-f8p", f"'{value}'", fragment)

    def test_fp8_pass_for_a_linear_outside_f8(self, binary, data):
        """<linear>.<pass> needs its linear in -f8: fc.wgrad with -f8 qkv is refused, naming both lists"""
        result = run(binary, base_args(data, ["-p", "fp8", "-f8", "qkv", "-f8p", "fwd,fc.wgrad"]))
        assert_one_line_error(result, "-f8p", "'fc.wgrad'", "-f8 qkv")

    def test_fp8_unknown_weight_scaling(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fw", "lazy"])), "-fw", "lazy", "current delayed")

    def test_fp8_unknown_gradient_scaling(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fg", "history"])), "-fg", "history",
                              "current delayed pow2")

    @pytest.mark.parametrize("scaling", ["delayed", "pow2"])
    def test_fp8_one_pass_gradients_refused_with_block_recipe(self, binary, data, scaling):
        """the block recipe's 1x128 gradient tiles are scaled by their own amax, in one pass already"""
        r = run(binary, base_args(data, ["-p", "fp8", "-fr", "block", "-fg", scaling]))
        assert_one_line_error(r, f"-fg {scaling}", "-fr block", "-fg current")

    def test_fp8_delayed_weights_refused_with_block_recipe(self, binary, data):
        """block scales come from each 128x128 block's own amax: there is no per-tensor scale to delay"""
        r = run(binary, base_args(data, ["-p", "fp8", "-fr", "block", "-fw", "delayed"]))
        assert_one_line_error(r, "-fw delayed", "-fr block", "-fw current")

    @pytest.mark.parametrize("linears,passes,refused", [
        ("qkv,attproj,fc,fcproj", "dgrad,wgrad", "qkv"), ("all", "all", None), ("all", "fwd,fc.dgrad", "qkv"),
        ("qkv,fc", "all", None), ("qkv,fc,lm_head", "qkv.fwd,fc.dgrad", "qkv"), ("lm_head", "all", "lm_head")])
    def test_fp8_delayed_weights_need_weights_the_optimizer_casts(self, binary, data, linears, passes, refused):
        """-fw delayed acts in the optimizer pass, which casts the block linears' weights only when each FP8 one runs
        all three GEMMs in FP8; otherwise (refused names the first block linear with a bf16 GEMM), and for lm_head, the
        weights are cast after the update from bf16, current-scaled, and the flag would do nothing"""
        r = run(binary, base_args(data, ["-p", "fp8", "-f8", linears, "-f8p", passes, "-fw", "delayed",
                                         "-i", data / "nothing_train_*.bin"]))
        if refused is None:
            assert_one_line_error(r, "nothing_train_")  # the flags pass: the run gets as far as the (missing) data
        elif refused == "lm_head":
            assert_one_line_error(r, "-fw delayed", "-f8 lm_head", "no FP8 block linear", "-fw current")
        else:
            assert_one_line_error(r, "-fw delayed", f"-f8p {passes}", f"leaves {refused} a bf16 GEMM", "-fw current")

    @pytest.mark.parametrize("scaling", ["delayed", "pow2"])
    @pytest.mark.parametrize("linears,passes,refused", [
        ("lm_head", "all", True), ("qkv,lm_head", "fwd", True), ("fc,lm_head", "fwd,fc.wgrad", False)])
    def test_fp8_one_pass_gradients_need_a_block_linear_dy(self, binary, data, linears, passes, refused, scaling):
        """-fg delayed and pow2 scale the block linears' output gradients; lm_head's is scaled from its bound under any
        -fg, so with no block linear's dy cast the flag would do nothing"""
        r = run(binary, base_args(data, ["-p", "fp8", "-f8", linears, "-f8p", passes, "-fg", scaling,
                                         "-i", data / "nothing_train_*.bin"]))
        if refused:
            assert_one_line_error(r, f"-fg {scaling}", f"-f8 {linears} -f8p {passes}", "no block linear", "bound",
                                  "-fg current")
        else:
            assert_one_line_error(r, "nothing_train_")  # the flags pass: the run gets as far as the (missing) data

    @pytest.mark.parametrize("extra,fragments", [
        (["-fr", "current", "-r", 0], ["-fe 1", "-fr delayed", "-fr current"]),
        (["-fr", "block", "-r", 0], ["-fe 1", "-fr delayed", "-fr block"]),
        (["-r", 1], ["-fe 1", "-r 0", "given -r 1"]),
        ([], ["-fe 1", "-r 0", "given -r 1"]),  # -r 1 is the default
        (["-r", 0, "-f8p", "fwd,fcproj.dgrad"], ["-fe 1", "fcproj", "-f8p fwd,fcproj.dgrad"]),
        (["-r", 0, "-f8", "qkv,attproj,fcproj"], ["-fe 1", "fc's forward", "-f8 qkv,attproj,fcproj"]),
        (["-r", 0, "-fe", 2], ["-fe", "2"]),
    ], ids=["current", "block", "recompute", "default-recompute", "fcproj-partly-bf16", "fc-bf16", "out-of-range"])
    def test_fc_codes_refusals(self, binary, data, extra, fragments):
        """-fe 1 (fc's GEMM writes fcproj's x codes) needs a scale known before the GEMM (-fr delayed), both forwards
        and fcproj's wgrad in FP8, and fcproj's x^T kept from the forward (-r 0)"""
        assert_one_line_error(run(binary, base_args(data, ["-p", "fp8", "-fe", 1] + extra)), *fragments)

    @pytest.mark.parametrize("extra", [["-p", "fp8", "-fe", 1, "-r", 0], ["-p", "fp8", "-fe", 1, "-r", 0, "-f8", "all"],
                                       ["-p", "bf16", "-fe", 1]], ids=["fp8", "fp8-lm_head", "bf16-ignores-it"])
    def test_fc_codes_accepted(self, binary, data, extra):
        """valid -fe 1 settings pass: the run gets as far as the (missing) data; -p bf16 has no FP8 codes to write"""
        assert_one_line_error(run(binary, base_args(data, extra + ["-i", data / "nothing_train_*.bin"])), "nothing_train_")

    # optimizer flags
    @pytest.mark.parametrize("value", ["sgd", "adam", "ADAMW8", ""])
    def test_unknown_optimizer(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-opt", value])), "-opt", f"'{value}'", "adamw adamw8")

    @pytest.mark.parametrize("value", ["some", "8bit", ""])
    def test_unknown_adamw8_state_selection(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-opt", "adamw8", "-qs", value])), "-qs", f"'{value}'", "default all none")

    @pytest.mark.parametrize("opt,qs", [("adamw", "default"), ("adamw8", "default"), ("adamw8", "all"), ("adamw8", "none"), ("adamw", "all")])
    def test_optimizer_flags_accepted(self, binary, data, opt, qs):
        """valid values pass the shared parser: the run gets as far as the data (missing here), on both trainers"""
        result = run(binary, base_args(data, ["-opt", opt, "-qs", qs, "-i", data / "nothing_train_*.bin"]))
        assert_one_line_error(result, "nothing_train_")


    def test_rank_not_below_process_count(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-pn", 2, "-pr", 2])), "-pr 2", "-pn 2")

    def test_unknown_nccl_init_method(self, binary, data):
        assert_one_line_error(run(binary, base_args(data, ["-pi", "carrier-pigeon"])), "-pi", "carrier-pigeon", "fs")

    @pytest.mark.parametrize("value", ["fp16", "fp8", ""])
    def test_unknown_gradient_reduce_type(self, binary, data, value):
        assert_one_line_error(run(binary, base_args(data, ["-pa", value])), "-pa", f"'{value}'", "bf16 fp32")

    @pytest.mark.parametrize("flag,value", [("-pn", 0), ("-pt", 0), ("-pg", -1), ("-pc", -1)])
    def test_multi_gpu_flag_out_of_range(self, binary, data, flag, value):
        assert_one_line_error(run(binary, base_args(data, [flag, value])), flag, str(value))


def test_cpu_trainer_refuses_several_processes(data):
    assert_one_line_error(run(CPU, base_args(data, ["-pn", 2])), "-pn 2", "one process")


# multi-GPU launch checks of the GPU trainer that happen before its first CUDA call (no NCCL either)
def test_zero_stage_0_refused_with_several_gpus(data):
    assert_one_line_error(run(GPU, base_args(data, ["-pn", 2, "-z", 0])), "-z 0", "2 GPUs")


@pytest.mark.parametrize("extra,fragments", [
    (["-z", 2], ["-z 2", "0 (one GPU), 1 and 3"]),
    (["-z", 3], ["-z 3", "several GPUs", "-z 1"]),
    (["-pn", 2, "-z", 3, "-p", "fp8", "-fr", "block"], ["-z 3 with -fr block", "-fr delayed or current"]),
    (["-pn", 2, "-z", 3, "-p", "fp8", "-fw", "delayed"], ["-z 3", "-fw current"]),
    (["-pn", 2, "-z", 3, "-p", "fp8", "-f8p", "fwd,fc.dgrad,fc.wgrad"], ["-z 3", "qkv", "-z 1"]),
    (["-pn", 2, "-z", 3, "-p", "fp8", "-f8", "qkv,attproj", "-f8p", "qkv.fwd,qkv.dgrad,qkv.wgrad,attproj.wgrad"], ["-z 3", "attproj", "-z 1"]),
], ids=["stage-2", "one-gpu", "block-recipe", "delayed-weights", "mixed-passes", "mixed-one-linear"])
def test_zero3_refusals(data, extra, fragments):
    """ZeRO-3 gathers each block linear's weight in one format, per-tensor FP8 codes or bf16: what it
    cannot serve is refused before any GPU work"""
    assert_one_line_error(run(GPU, base_args(data, extra)), *fragments)


@pytest.mark.parametrize("extra", [
    ["-p", "fp8"],
    ["-p", "bf16"],
    ["-p", "bf16", "-fr", "block", "-f8p", "fwd"],
    ["-p", "fp8", "-f8", "qkv,attproj,fc"],
], ids=["fp8", "bf16", "bf16-ignores-fp8-flags", "fp8-and-bf16-linears"])
def test_zero3_flags_accepted(data, extra):
    """-z 3 in FP8 (every pass), in bf16, and with some block linears in each passes the checks:
    rank 1 gets as far as its (missing) data"""
    result = run(GPU, base_args(data, ["-pn", 2, "-pr", 1, "-z", 3, *extra, "-i", data / "missing_*.bin"]))
    assert_one_line_error(result, "missing_")


def test_total_batch_counts_every_process(data):
    """-d is global: 2 ranks x B=2 x T=32 = 128 tokens per micro-step, so -d 64 is refused"""
    assert_one_line_error(run(GPU, base_args(data, ["-pn", 2, "-pr", 1, "-d", 64])), "-d 64", "processes", "128")


def test_tokens_per_micro_step_beyond_int_range_are_refused(data):
    """65536 x 1024 x 32 processes = 2^31 tokens per micro-step: one line, not a wrapped count"""
    result = run(GPU, base_args(data, ["-e", "d12", "-b", 65536, "-t", 1024, "-pn", 32, "-pr", 1]))
    assert_one_line_error(result, "-b 65536", "2147483648", "lower -b")


def test_tokens_per_gpu_beyond_the_kernels_grid_are_refused(data):
    """8192 x 1024 tokens on one GPU: more than the 65535 x 128 rows the bias gradient's and the FP8 casts' grids
    take (a CUDA launch error at the first step otherwise): one line naming -b. 65535 x 128 itself passes the check
    and stops at the fixture's data, too short for such a batch"""
    result = run(GPU, base_args(data, ["-b", 8192, "-t", 1024]))
    assert_one_line_error(result, "-b 8192", "8388608", "8388480", "lower -b")
    result = run(GPU, base_args(data, ["-b", 65535, "-t", 128]))
    assert_one_line_error(result, "fewer than one batch needs")


@pytest.mark.parametrize("variable,value,flags,fragments", [
    ("SLURM_STEP_NUM_TASKS", "2", [], ["started by srun as 2 processes (SLURM_STEP_NUM_TASKS)", "-pn N -pr R"]),
    ("PMI_SIZE", "3", [], ["started by an MPI launcher as 3 processes (PMI_SIZE)", "-pn N -pr R"]),
    ("OMPI_COMM_WORLD_SIZE", "2", ["-pi", "fs"], ["started by mpirun as 2 processes", "-pi fs|tcp"]),
], ids=["srun", "mpich-mpiexec", "mpirun-with-pi-fs"])
def test_copies_a_launcher_started_as_rank_0_of_1_are_refused(data, variable, value, flags, fragments):
    """N copies, each rank 0 of 1 (no rank flags, or an MPI the binary cannot talk to), would each train alone on GPU 0
    into the same files: the launcher's variable gives them away, before any data or GPU is touched"""
    result = run(GPU, base_args(data, flags), env_extra={variable: value})
    assert_one_line_error(result, *fragments, "rank 0 of 1")


def test_a_one_task_srun_step_is_no_world(data):
    """srun -n 1 (or an interactive srun --pty shell) sets SLURM_STEP_NUM_TASKS=1: a plain single-GPU run. On this
    machine the trainer goes on to its GPU check, which is its first failure without a GPU"""
    result = run(GPU, base_args(data), env_extra={"SLURM_STEP_NUM_TASKS": "1"})
    assert "srun" not in result.stderr and "CUDA" in result.stderr, result.stderr[-2000:]


def test_ranks_that_cannot_learn_their_rank_are_refused(data):
    """Copies that would each train alone as rank 0 of 1 on GPU 0, writing the same files. Built without MPI: mpirun
    starting N copies (it sets OMPI_COMM_WORLD_SIZE). Built with it (the Makefile found OpenMPI, as CI installs it):
    a copy started by hand with -pi mpi -pn 2 is a world of 1 (MPI_Init without mpirun); test_sim_trainer.py runs
    the real mpirun"""
    if not os.path.exists(GPU):
        pytest.fail(f"{GPU} is not built (make train_gpt2_fp8)")
    if "libmpi" in subprocess.run(["ldd", GPU], capture_output=True, text=True).stdout:
        result = run(GPU, base_args(data, ["-pi", "mpi", "-pn", 2]),
                     env_extra={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        assert_one_line_error(result, "flag -pn 2", "MPI has 1 process", "mpirun -np", "-pi fs")
    else:
        result = run(GPU, base_args(data), env_extra={"OMPI_COMM_WORLD_SIZE": "2"})
        assert_one_line_error(result, "mpirun", "2 processes", "without MPI", "-pi fs")


def test_each_rank_checks_its_data_before_the_gpu(data):
    """rank 1 of 2 validates the shards too; its stdout is silenced, its error is one stderr line"""
    result = run(GPU, base_args(data, ["-pn", 2, "-pr", 1, "-i", data / "missing_*.bin"]))
    assert_one_line_error(result, "missing_")
    assert result.stdout == ""


# the FP8 shape rules are the GPU trainer's (cuBLASLt FP8), checked before its first CUDA call
def test_fp8_tokens_not_multiple_of_16(data):
    assert_one_line_error(run(GPU, base_args(data, ["-p", "fp8", "-b", 1, "-t", 24])), "qkv", "B*T", "24", "multiple of 16")


def test_fp8_lm_head_shape_checked_only_when_in_fp8(data):
    """listing only lm_head in FP8 makes lm_head the linear whose shape fails"""
    result = run(GPU, base_args(data, ["-p", "fp8", "-fr", "block", "-b", 1, "-t", 24, "-f8", "lm_head"]))
    assert_one_line_error(result, "lm_head", "B*T", "24")


def test_fp8_good_flags_accepted(data, tmp_path):
    """every FP8 flag with a valid value passes the shared parser: the CPU trainer, which shares it, trains"""
    extra = ["-p", "fp8", "-fr", "block", "-fh", 1024, "-fm", 16, "-f8", "all", "-f8p", "dgrad,wgrad", "-fn", 0, "-x", 1]
    result = run(CPU, base_args(data, extra), timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("heads,channels,attention,expected", [
    (4, 128, "fallback", "the fallback attention kernels take 64 or 128"),
    (8, 96, "cudnn", "cuDNN attention takes a multiple of 8 up to 128"),
    (1, 256, "cudnn", "cuDNN attention takes a multiple of 8 up to 128")])
def test_gpu_trainer_refuses_a_head_size_its_attention_cannot_run(data, heads, channels, attention, expected):
    """a model whose head size C/NH the chosen attention backend does not take stops at startup,
    naming the model file and the remedy, before the GPU is touched (not at the first forward)"""
    import sim_model
    path = data / f"heads_{heads}x{channels // heads}.bin"
    sim_model.write_model(path, layers=1, heads=heads, channels=channels)
    r = run(GPU, base_args(data, ["-e", path, "-at", attention]))
    assert_one_line_error(r, f"model '{path}'", f"head size C/NH = {channels}/{heads} = {channels // heads}", expected)


def test_gpu_trainer_refuses_a_padded_vocab_its_gemms_cannot_take(data):
    """lm_head's GEMM has Vp rows: a model file whose Vp is not a multiple of 8 stops the GPU trainer at startup,
    naming the file (it died at the first GEMM, in cuBLASLt's terms); one whose Vp is a multiple of 8 but not of 16
    passes in bf16 and with lm_head in FP8 is refused naming lm_head and the remedy. The CPU trainer takes any Vp"""
    import sim_model
    for padded in (1004, 1000):  # the shards' ids lie below 1000
        sim_model.write_model(data / f"vp{padded}.bin", layers=1, vocab=1000, padded_vocab=padded)
    r = run(GPU, base_args(data, ["-e", data / "vp1004.bin"]))
    assert_one_line_error(r, f"model '{data / 'vp1004.bin'}'", "padded vocab Vp = 1004 must be a multiple of 8", "50304")
    r = run(GPU, base_args(data, ["-e", data / "vp1000.bin", "-p", "fp8", "-f8", "all"]))
    assert_one_line_error(r, "fp8 lm_head linear", "OC (output width) = 1000", "leave lm_head out of -f8")
    r = run(GPU, base_args(data, ["-e", data / "vp1000.bin"]))
    assert "Vp" not in r.stderr and "multiple of" not in r.stderr, r.stderr
    r = run(CPU, base_args(data, ["-e", data / "vp1004.bin", "-x", 1]))
    assert r.returncode == 0, r.stderr


def test_gpu_trainer_refuses_8bit_weights_off_the_block_grid(data):
    """adamw8 updates each layer's matmul weight on its own, in whole 256-element blocks: with C = 72 (a multiple of 8,
    not of 16) qkvw's layer slice 3C^2 = 15552 is not, and the GPU trainer stops at startup naming it and the remedy
    (it died at its first update); -qs none passes that check, and the CPU trainer, which updates whole tensors, trains"""
    import sim_model
    path = data / "c72.bin"
    sim_model.write_model(path, layers=2, heads=9, channels=72, vocab=1000)
    r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8"]))
    assert_one_line_error(r, "-opt adamw8 -qs default", "qkvw's layer slice of 15552 elements", "C=72", "-qs none")
    r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8", "-qs", "none"]))
    assert "qkvw's layer slice" not in r.stderr, r.stderr
    r = run(CPU, base_args(data, ["-e", path, "-opt", "adamw8", "-x", 1]))
    assert r.returncode == 0, r.stderr


def test_gpu_trainer_refuses_8bit_states_cut_inside_a_block_on_every_rank(data):
    """L = 3, C = 384 puts attprojw off the 256-element block grid, and 3 ranks would cut its 8-bit states inside a
    block: every rank stops at startup with the same line naming the rank, the tensor and the remedies, with the
    nearest rank counts that work (the rank whose part it was died in its optimizer setup, the others in the first
    weight gather, with an NCCL error); 2 ranks, -qs none and 1 rank pass that check"""
    import sim_model
    path = data / "l3c384.bin"
    sim_model.write_model(path, layers=3, heads=3, channels=384, vocab=1000, max_t=128)
    expected = ("-opt adamw8 -qs default over 3 GPUs: rank 1's part of attprojw starts at its element 147072, inside a "
                "256-element block", "use another number of GPUs (2 or 4 would do), -qs none or -opt adamw")
    for rank in (0, 1, 2):
        r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8", "-pn", 3, "-pr", rank]))
        assert_one_line_error(r, *expected)
    # 8 ranks: 9 cut a block too, so the nearest larger count that works is 10
    r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8", "-pn", 8, "-pr", 0]))
    assert_one_line_error(r, "over 8 GPUs: rank 3's part of attprojw", "use another number of GPUs (7 or 10 would do)")
    # -qs all over 13 ranks cuts ln1b, a tensor -qs default keeps in 32 bits: that -qs is the remedy named
    r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8", "-qs", "all", "-pn", 13, "-pr", 0]))
    assert_one_line_error(r, "-qs all over 13 GPUs: rank 1's part of ln1b", "-qs default or -opt adamw")
    for flags in (["-pn", 2, "-pr", 1], ["-pn", 3, "-pr", 1, "-qs", "none"], []):
        r = run(GPU, base_args(data, ["-e", path, "-opt", "adamw8"] + flags))
        assert "block" not in r.stderr, r.stderr


def test_gpu_trainer_without_a_gpu_says_so(data):
    """on a machine without a GPU or driver (CI), the GPU trainer's first CUDA call fails: one line that says there
    is no GPU and names the CPU trainer, not the runtime's 'driver version is insufficient'"""
    if subprocess.run(["bash", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has a GPU")
    assert_one_line_error(run(GPU, base_args(data, ["-j", ""])), "no usable NVIDIA GPU here", "train_gpt2cpu")


def test_gpu_trainer_hellaswag_without_its_file(data):
    """-h 1 without dev/data/hellaswag/hellaswag_val.bin: one line naming the flag, the working directory the path is
    read from, and the script that makes the file, at startup (the run scripts pass -h 1); the trainer runs from a
    directory that has no such file"""
    r = subprocess.run([GPU] + [str(a) for a in base_args(data, ["-h", 1])], capture_output=True, text=True, timeout=120,
                       cwd=data)
    assert_one_line_error(r, f"flag -h 1: no dev/data/hellaswag/hellaswag_val.bin in the working directory {data} (run "
                          "from the checkout", "dev/data/hellaswag.py")


def test_cpu_trainer_help_shows_its_own_default_model():
    """the CPU trainer trains tiny unless -e says otherwise, and its --help says so"""
    line = [l for l in run(CPU, ["--help"]).stdout.splitlines() if l.startswith("  -e ")]
    assert len(line) == 1 and '(default "tiny")' in line[0], line
    line = [l for l in run(GPU, ["--help"]).stdout.splitlines() if l.startswith("  -e ")]
    assert len(line) == 1 and '(default "d12")' in line[0], line


def test_cpu_trainer_help_marks_the_flags_it_ignores():
    """train_gpt2cpu accepts the GPU trainer's whole flag table; its --help marks the flags that do nothing there (its
    CPU_FLAGS_WITHOUT_EFFECT) and no other, and the GPU trainer's --help marks none"""
    marked = {l.split()[0] for l in run(CPU, ["--help"]).stdout.splitlines()
              if l.startswith("  -") and "[no effect in train_gpt2cpu]" in l}
    assert marked == {"-at", "-ad", "-r", "-ge", "-kt", "-lg", "-z", "-fn", "-fe", "-w", "-f", "-pr", "-pg", "-pi", "-pf",
                      "-ps", "-pa", "-pt", "-pc", "-tk", "-s", "-g", "-h"}, marked
    assert "[no effect" not in run(GPU, ["--help"]).stdout


def test_nondeterministic_attention_backward_needs_cudnn(data):
    """-ad 0 asks for cuDNN's backward with float atomics: with -at fallback it stops at startup,
    naming both flags; -ad takes only 0 or 1"""
    r = run(GPU, base_args(data, ["-at", "fallback", "-ad", 0]))
    assert_one_line_error(r, "-ad 0", "-at fallback", "leave -ad at 1")
    r = run(GPU, base_args(data, ["-ad", 2]))
    assert_one_line_error(r, "-ad")


@pytest.mark.parametrize("binary", TRAINERS, ids=["cpu", "gpu"])
def test_help_lists_every_flag_with_default(binary):
    result = run(binary, ["--help"])
    assert result.returncode == 0
    flags = ["-i", "-j", "-e", "-o", "-tk", "-p", "-fr", "-fh", "-fm", "-fw", "-fg", "-f8", "-f8p", "-fn", "-opt", "-qs", "-k", "-at", "-ad", "-n", "-nk", "-nm", "-y", "-b", "-t", "-d", "-l", "-u", "-q",
             "-c", "-gc", "-x", "-v", "-m", "-s", "-g", "-h", "-a", "-w", "-r", "-ge", "-z", "-sh", "-kt",
             "-sl", "-sg", "-lg", "-pn", "-pr", "-pg", "-pi", "-pf", "-ps", "-pa", "-pt", "-pc"]
    lines = result.stdout.splitlines()
    for flag in flags:
        matching = [l for l in lines if l.strip().startswith(flag + " ")]
        assert matching, f"--help does not list {flag}"
        assert "default" in matching[0], matching[0]


def read_log(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def test_cpu_training_reduces_loss(data, tmp_path):
    out = tmp_path / "runs" / "tiny" / "run"  # missing levels are created, as mkdir -p does
    result = run(CPU, base_args(data, ["-x", 30, "-l", 3e-3, "-o", out, "-v", 10, "-m", 2]), timeout=600)
    assert result.returncode == 0, result.stderr
    train = [l for l in read_log(out / "main.log") if " trl:" in l]
    assert len(train) == 30
    first = float(train[0].split("trl:")[1].split()[0])
    last = float(train[-1].split("trl:")[1].split()[0])
    assert last < first - 0.5, (first, last)
    assert any(" tel:" in l for l in read_log(out / "main.log"))
    assert os.path.exists(out / "main.jsonl")


def test_cpu_resume_is_bitwise_identical(data, tmp_path):
    """6 steps straight vs 3 steps, stop, resume for 3 more: same losses and same final weights."""
    common = ["-x", 6, "-l", 1e-3, "-k", "constant", "-n", 3, "-v", 0]
    straight, split = tmp_path / "straight", tmp_path / "split"
    r1 = run(CPU, base_args(data, common + ["-o", straight]), timeout=600)
    assert r1.returncode == 0, r1.stderr
    # first half: a run whose last step is 3, then resume the same run to 6
    r2 = run(CPU, base_args(data, ["-x", 3, "-l", 1e-3, "-k", "constant", "-n", 3, "-v", 0, "-o", split]), timeout=600)
    assert r2.returncode == 0, r2.stderr
    assert os.path.exists(split / "DONE_00000003")
    (split / "state_00000006_00001.bin").write_bytes(b"debris of a run cut off writing step 6")
    r3 = run(CPU, base_args(data, common + ["-o", split, "-y", 1]), timeout=600)
    assert r3.returncode == 0, r3.stderr
    assert not (split / "state_00000006_00001.bin").exists(), "writing step 6 keeps another run's file of that step"
    a = (straight / "model_00000006.bin").read_bytes()
    b = (split / "model_00000006.bin").read_bytes()
    assert a == b, "resumed run's final weights differ from the uninterrupted run's"
    la = [l for l in read_log(straight / "main.log") if " trl:" in l]
    lb = [l for l in read_log(split / "main.log") if " trl:" in l]
    assert la[3:] == lb[-3:], (la, lb)
    r4 = run(CPU, base_args(data, common + ["-o", split, "-y", 1]), timeout=600)  # resumed at the run's end
    assert r4.returncode == 0 and "resumed at step 6, and the run has 6 steps (-x): nothing left to train" in r4.stdout, r4.stdout


@pytest.mark.parametrize("descriptor,shape", [("gpt3:c384", (2048, 6, 6, 384)), ("gpt2:d6", (1024, 6, 6, 384))])
def test_cpu_trains_llmcs_descriptors(data, tmp_path, descriptor, shape):
    """llm.c's descriptors, gpt3:cN included (its run_gpt3_125M.sh passes -e "gpt3:c768"): a step trains, and the model
    file's header holds the shape (maxT, L, NH, C)"""
    out = tmp_path / "run"
    r = run(CPU, base_args(data, ["-e", descriptor, "-x", 1, "-b", 1, "-n", 1, "-o", out]), timeout=600)
    assert r.returncode == 0, r.stderr
    header = np.fromfile(out / "model_00000001.bin", dtype=np.int32, count=8)
    assert (header[2], header[4], header[5], header[6]) == shape, header


def test_cpu_x_0_evaluates_only(data, tmp_path):
    """-x 0, as in llm.c: step 0 is the last step, so the run evaluates the model as it starts (val loss) and trains
    nothing: no step, no checkpoint (even with -n), no note about a warmup longer than the run, nor about -q 1's
    schedule"""
    out = tmp_path / "eval_only"
    result = run(CPU, base_args(data, ["-x", 0, "-v", 5, "-m", 2, "-u", 10, "-n", 1, "-o", out]), timeout=600)
    assert result.returncode == 0, result.stderr
    assert read_log(out / "main.log") == [l for l in read_log(out / "main.log") if l.startswith("s:0 tel:")]
    assert len(read_log(out / "main.log")) == 1
    assert result.stdout.count("val loss") == 1 and not re.search(r"^step +\d+/", result.stdout, re.M), result.stdout[-1500:]
    assert not any(name.startswith(("model_", "state_", "DONE_")) for name in os.listdir(out))
    assert "note: -u" not in result.stdout and "note: -q 1" not in result.stdout, result.stdout[:2000]


@pytest.mark.parametrize("flags,noted", [(["-h", 1], ["-h 1"]), (["-s", 5, "-g", 32], ["-s 5", "-g 32"]),
                                         (["-z", 2, "-r", 0, "-pa", "fp32", "-f", 0], ["-f 0", "-r 0", "-z 2", "-pa \"fp32\""]),
                                         (["-s", 0, "-r", 1], [])],
                         ids=["hellaswag", "samples", "gpu-and-ranks", "defaults"])
def test_cpu_trainer_notes_the_flags_it_ignores(data, flags, noted):
    """the flags the CPU trainer accepts (one flag table) and ignores (CPU_FLAGS_WITHOUT_EFFECT), given a value other than
    their default, get one note each, in the flag table's order, rather than a run taken for one that measured HellaSwag
    or printed samples; a flag given its default value gets none"""
    result = run(CPU, base_args(data, flags))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stdout.splitlines() if "has no effect in train_gpt2cpu" in line]
    assert notes == [f"note: {flag} has no effect in train_gpt2cpu (train_gpt2_fp8 has it; --help marks the flags "
                     "train_gpt2cpu ignores)" for flag in noted], result.stdout[:2000]


@pytest.mark.parametrize("schedule", ["cosine", "linear", "wsd"])
def test_cpu_trainer_notes_a_schedule_with_nothing_to_decay_to(schedule, data):
    """-q 1 (llm.c's default) leaves a decaying schedule at the peak rate: one note naming -k, none with -q below 1 or
    -k constant; the startup line shows the warmup and the final fraction"""
    result = run(CPU, base_args(data, ["-k", schedule, "-l", 0.002]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"note: -q 1 (the default, as in llm.c): -k {schedule} decays to the peak rate -l itself, "
                               "so the rate stays at 0.002 after the warmup; llm.c's scripts pass -q 0.0") == 1, result.stdout
    assert f"lr 0.002 ({schedule}, warmup 0, final frac 1)" in result.stdout, result.stdout[:2000]
    for flags in (["-k", schedule, "-q", 0.0], ["-k", "constant"]):
        assert "note: -q" not in run(CPU, base_args(data, flags)).stdout


def test_fp8_flags_without_fp8_are_noted(data):
    """FP8 flags set away from their defaults in a run without -p fp8 change nothing: one note names them with their
    values; none under -p fp8, and none where no FP8 flag was moved (the GPU trainer's is test_sim_trainer's)"""
    result = run(CPU, base_args(data, ["-fr", "current", "-fh", 4, "-x", 1]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('note: -fr "current", -fh 4: FP8 flags, and this run has -p bf16: they change nothing') == 1, \
        result.stdout[:2000]
    for flags in (["-p", "fp8", "-fr", "current", "-fh", 4, "-x", 1], ["-x", 1]):
        assert "FP8 flags" not in run(CPU, base_args(data, flags)).stdout


@pytest.mark.parametrize("flags,notes", [
    (["-fr", "current", "-fh", 4], ["note: -fh 4: no tensor of this run keeps an amax history (-fr current -fg current; "
                                    "-fr delayed or -fg delayed would): it changes nothing"]),
    (["-fr", "block", "-fh", 4, "-fm", 2], ["note: -fh 4: no tensor of this run keeps an amax history (-fr block -fg "
                                            "current; -fr delayed or -fg delayed would): it changes nothing",
                                            "note: -fm 2: the margin divides per-tensor scales, and -fr block scales "
                                            "each tile and block by its own amax: it changes nothing"]),
    (["-fr", "current", "-fg", "delayed", "-fh", 4, "-fm", 2], []),
    (["-fh", 4, "-fm", 2], [])], ids=["current", "block", "-fg-delayed", "delayed"])
def test_fp8_tuning_the_recipe_does_not_read_is_noted(data, flags, notes):
    """-fh (the amax history of -fr delayed's activations and -fg delayed's gradients) and -fm (a margin for per-tensor
    scales) moved off their defaults in an FP8 run whose recipe reads neither: one note each, none where it is read"""
    result = run(CPU, base_args(data, ["-p", "fp8", "-x", 1] + flags))
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if "it changes nothing" in line] == notes, result.stdout[:2000]


def test_cpu_trainer_notes_that_fc_codes_are_the_gpus(data):
    """-fe 1 is a cuBLASLt epilogue of the GPU trainer: the CPU trainer accepts it (one flag table), says it changes
    nothing there, and trains as -fe 0"""
    result = run(CPU, base_args(data, ["-p", "fp8", "-fe", 1, "-r", 0, "-x", 1]))
    assert result.returncode == 0, result.stderr
    assert "note: -fe 1 has no effect in train_gpt2cpu" in result.stdout, result.stdout[:2000]
    assert "note: -fe" not in run(CPU, base_args(data, ["-p", "fp8", "-r", 0, "-x", 1])).stdout
    assert "note: -r 0 has no effect in train_gpt2cpu" in result.stdout, result.stdout[:2000]


@pytest.mark.parametrize("trainer", ["cpu", "gpu"])
def test_llmc_tf32_switch_accepted_and_changes_nothing(trainer, data, tmp_path):
    """llm.c's -f (TF32 on or off; its README's exact-match command passes -f 0): both values run, and train bit for bit
    as without the flag, since no matmul here is fp32 (the GPU trainer under cudasim); any other value is refused
    naming -f, by the GPU build too"""
    from sim_model import SIM_TRAINER
    binary = CPU if trainer == "cpu" else SIM_TRAINER
    logs = []
    for name, extra in [("none", []), ("off", ["-f", 0]), ("on", ["-f", 1])]:
        out = tmp_path / name
        result = run(binary, base_args(data, extra + ["-e", small_vocab_model(data), "-o", out]), timeout=600)
        assert result.returncode == 0, result.stderr
        logs.append([l for l in read_log(out / "main.log") if " trl:" in l])
    assert len(logs[0]) == 2 and logs[1] == logs[0] and logs[2] == logs[0], logs
    assert_one_line_error(run(CPU if trainer == "cpu" else GPU, base_args(data, ["-f", 2])), "-f", "2", "0..1")


def test_cpu_warmup_longer_than_the_run_warms_up_throughout(data, tmp_path):
    """llm.c's scripts' -u 700 with a short -x (a smoke test, the quickstart's -x 50): as in llm.c the run warms up
    all along, at lr * (step + 1) / warmup, with a note"""
    result = run(CPU, base_args(data, ["-u", 8, "-x", 3, "-l", 1e-3, "-o", tmp_path / "out"]), timeout=600)
    assert result.returncode == 0, result.stderr
    assert "note: -u 8 is longer than the run's 3 steps (-x): the learning rate warms up throughout" in result.stdout
    rates = [float(l.split("lr:")[1].split()[0]) for l in read_log(tmp_path / "out" / "main.log") if " trl:" in l]
    assert rates == pytest.approx([1e-3 * (k + 1) / 8 for k in range(3)], rel=1e-5), rates


def test_cpu_val_batches_whole_split_once(data, tmp_path):
    """-m -1 evaluates the whole val split (llm.c's meaning); a larger -m than the split's batches reads each once, with
    a note, instead of wrapping around and counting the first batches twice (a val shard of 1000 tokens: 15 batches of
    B=2 x T=32); -x 0 evaluates once and trains nothing"""
    write_shard(data / "small_val_000000.bin", random_tokens(1000, 3))
    def val_loss(m):
        r = run(CPU, base_args(data, ["-x", 0, "-v", 1, "-m", m, "-j", data / "small_val_*.bin"]), timeout=600)
        assert r.returncode == 0, r.stderr
        return r, re.findall(r"^val loss (\S+)$", r.stdout, re.M)
    whole, exact, more, fewer = val_loss(-1), val_loss(15), val_loss(1000), val_loss(14)
    assert whole[1] and whole[1] == exact[1] == more[1] != fewer[1], (whole[1], exact[1], more[1], fewer[1])
    assert "note: -m 1000: the val split has 15 batches of B x T, so each evaluation reads those 15, once each" in more[0].stdout
    assert "note: -m" not in whole[0].stdout + exact[0].stdout


def state_data_position(path):
    """a state file's loader position and shuffle trailer: ((shard, sample), the trailer's bytes): the uint64s at header
    slots 30 and 32, and the trailer after the body's fp32 arrays (m and v unless slot 6 says they are in sections,
    the master with slot 4), sized by its own counts (shard order, sample order, llm.c's 2520-byte rng)"""
    blob = path.read_bytes()
    header = np.frombuffer(blob[:1024], dtype=np.int32)
    n = (os.path.getsize(path.parent / f"model_{path.name[6:14]}.bin") - 1024) // 4  # the step's fp32 model file
    at = 1024 + 4 * n * ((0 if header[6] else 2) + (1 if header[4] else 0))
    start = at
    if header[5]:
        shards = struct.unpack_from("<Q", blob, at)[0]
        at += 8 + 4 * shards
        samples = struct.unpack_from("<Q", blob, at)[0]
        at += 8 + 4 * samples + 2520
    return struct.unpack_from("<QQ", blob, 120), blob[start:at]


@pytest.mark.parametrize("shuffle,optimizer", [(0, "adamw"), (1, "adamw"), (1, "adamw8")])
def test_cpu_resume_with_another_micro_batch_replays_the_loader(data, tmp_path, shuffle, optimizer):
    """a checkpoint of -b 2 resumed with -b 4 (the same -d): the saved position counts samples of 2 x T tokens, so the
    loader is replayed to where a -b 4 run is at that step (it skipped data unshuffled, and died shuffled): position
    and shuffle state as the -b 4 run's. adamw8: its state reader walks past the trailer without taking it (it read
    the old B's sample order into the loader before the replay: garbage token ids)"""
    flags = ["-d", 256, "-sh", shuffle, "-n", 3, "-v", 0, "-opt", optimizer, "-qs", "all"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    model = small_vocab_model(data)
    r = run(CPU, base_args(data, flags + ["-x", 6, "-b", 4, "-o", straight], model), timeout=600)
    assert r.returncode == 0, r.stderr
    r = run(CPU, base_args(data, flags + ["-x", 3, "-b", 2, "-o", split], model), timeout=600)
    assert r.returncode == 0, r.stderr
    r = run(CPU, base_args(data, flags + ["-x", 6, "-b", 4, "-o", split, "-y", 1], model), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "written with B=2 T=32, this run has B=4 T=32: data loader replayed 6 batches" in r.stdout, r.stdout[-2000:]
    states = [state_data_position(d / "state_00000006_00000.bin") for d in (straight, split)]
    assert states[0] == states[1] and states[0][0] != (0, 0), states
    assert bool(states[0][1]) == bool(shuffle)


def test_cpu_overfit_single_batch_resumes_bitwise(data, tmp_path):
    """-a 1 trains every micro-step on the first batch; a resumed run takes that batch again (it trained on unfilled
    token ids) and goes on bit for bit"""
    flags = ["-a", 1, "-d", 128]  # 2 micro-steps of B=2, T=32
    run_straight(data, tmp_path / "straight", flags)
    r = run_split(data, tmp_path / "split", flags, flags)
    assert r.returncode == 0, r.stderr
    assert final_model(tmp_path / "straight") == final_model(tmp_path / "split")
    assert train_losses(tmp_path / "straight")[3:] == train_losses(tmp_path / "split")[-3:]


def train_losses(out):
    return [float(l.split("trl:")[1].split()[0]) for l in read_log(out / "main.log") if " trl:" in l]


def test_cpu_adamw8_training_reduces_loss(data, tmp_path):
    out = tmp_path / "run"
    result = run(CPU, base_args(data, ["-x", 30, "-l", 3e-3, "-o", out, "-opt", "adamw8"]), timeout=600)
    assert result.returncode == 0, result.stderr
    assert "optimizer adamw8 (-qs default: 8-bit states for 4 of 16 tensors)" in result.stdout
    losses = train_losses(out)
    assert len(losses) == 30
    assert losses[-1] < losses[0] - 0.5, (losses[0], losses[-1])


def run_split(data, out, first, second, steps=6, half=3):
    """`half` steps with the `first` flags, checkpoint, then resume to `steps` with the `second` ones"""
    common = ["-l", 1e-3, "-k", "constant", "-n", half, "-v", 0, "-o", out]
    model = small_vocab_model(data)
    r1 = run(CPU, base_args(data, common + ["-x", half] + first, model), timeout=600)
    assert r1.returncode == 0, r1.stderr
    r2 = run(CPU, base_args(data, common + ["-x", steps, "-y", 1] + second, model), timeout=600)
    return r2


def run_straight(data, out, flags, steps=6):
    result = run(CPU, base_args(data, ["-l", 1e-3, "-k", "constant", "-v", 0, "-o", out, "-x", steps, "-n", steps] + flags,
                                small_vocab_model(data)), timeout=600)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("binary", TRAINERS, ids=["cpu", "gpu"])
@pytest.mark.parametrize("flags", [[], ["-n", 2]], ids=["no-checkpoints", "checkpoints"])
def test_fresh_run_into_a_dir_with_checkpoints_is_refused(data, tmp_path, binary, flags):
    """one -o, one run: a fresh run (-y 0) where complete checkpoints are is refused before it writes anything,
    whether or not it would write checkpoints of its own (its main.log would replace the old run's, and a later
    -y 1 resume the old run onto it); the GPU trainer refuses it before it looks for a GPU"""
    out = tmp_path / "run"
    run_straight(data, out, [])
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".llm8.lock"}
    r = run(binary, base_args(data, ["-o", out, "-x", 2] + flags, small_vocab_model(data)))
    assert_one_line_error(r, f"-o {out} already holds the checkpoints of a run (the newest: step 6): -y 1 resumes it")
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".llm8.lock"}
    assert after == before, sorted(set(after) ^ set(before))


def final_model(out, step=6):
    return (out / f"model_{step:08d}.bin").read_bytes()


def complete_checkpoints(out):
    return sorted(int(name[5:]) for name in os.listdir(out) if name.startswith("DONE_"))


@pytest.mark.parametrize("flags,kept", [(["-n", 1, "-nk", 2, "-nm", 3], [3, 6, 7]), (["-n", 3, "-nk", 2], [6, 7]),
                                        (["-n", 2], [2, 4, 6, 7])])
def test_cpu_checkpoint_retention(data, tmp_path, flags, kept):
    """-nk keeps the newest N complete checkpoints and -nm the major ones besides; the last step's checkpoint (7, off
    the -n grid) counts like the others, so -n 3 -nk 2 keeps 6 and 7, not 3 as well"""
    out = tmp_path / "run"
    r = run(CPU, base_args(data, ["-x", 7, "-o", out] + flags), timeout=600)
    assert r.returncode == 0, r.stderr
    assert complete_checkpoints(out) == kept
    assert sorted(int(n[6:14]) for n in os.listdir(out) if n.startswith("model_")) == kept  # the files went too


def test_cpu_adamw8_resume_is_bitwise_identical(data, tmp_path):
    flags = ["-opt", "adamw8"]
    run_straight(data, tmp_path / "straight", flags)
    r = run_split(data, tmp_path / "split", flags, flags)
    assert r.returncode == 0, r.stderr
    assert final_model(tmp_path / "straight") == final_model(tmp_path / "split")
    assert train_losses(tmp_path / "straight")[3:] == train_losses(tmp_path / "split")[-3:]
    # and the 8-bit run is not plain AdamW in disguise
    run_straight(data, tmp_path / "adamw", ["-opt", "adamw"])
    assert final_model(tmp_path / "adamw") != final_model(tmp_path / "straight")


@pytest.mark.parametrize("fp8", [[], ["-p", "fp8", "-fw", "delayed"]], ids=["fp32", "fp8-delayed-weights"])
def test_cpu_adamw8_without_8bit_tensors_is_adamw_bitwise(data, tmp_path, fp8):
    """-qs none keeps every tensor in fp32 states: plain AdamW's arithmetic, so the same bits
    (with -fw delayed, both optimizers also do the FP8 weights' part of the step)"""
    run_straight(data, tmp_path / "adamw", ["-opt", "adamw"] + fp8)
    run_straight(data, tmp_path / "none", ["-opt", "adamw8", "-qs", "none"] + fp8)
    assert final_model(tmp_path / "adamw") == final_model(tmp_path / "none")


@pytest.mark.parametrize("first,second", [("adamw", "adamw8"), ("adamw8", "adamw")])
def test_cpu_checkpoint_converts_between_optimizers_bitwise(data, tmp_path, first, second):
    """with -qs none the conversion is a copy of fp32 moments, so switching optimizer mid-run is exact"""
    run_straight(data, tmp_path / "straight", ["-opt", "adamw"])
    r = run_split(data, tmp_path / "split", ["-opt", first, "-qs", "none"], ["-opt", second, "-qs", "none"])
    assert r.returncode == 0, r.stderr
    assert ("quantized into 8-bit states" if second == "adamw8" else "dequantized into fp32 moments") in r.stdout
    assert final_model(tmp_path / "straight") == final_model(tmp_path / "split")


@pytest.mark.parametrize("first,second", [("adamw", "adamw8"), ("adamw8", "adamw")])
def test_cpu_checkpoint_converts_between_optimizers(data, tmp_path, first, second):
    """8-bit states for the matmul weights: the resumed run continues within 1% of an uninterrupted run of the new optimizer"""
    run_straight(data, tmp_path / "straight", ["-opt", second])
    r = run_split(data, tmp_path / "split", ["-opt", first], ["-opt", second])
    assert r.returncode == 0, r.stderr
    assert ("quantized into 8-bit states" if second == "adamw8" else "dequantized into fp32 moments") in r.stdout
    assert final_model(tmp_path / "straight") != final_model(tmp_path / "split"), "the first half's optimizer left no trace"
    want, got = train_losses(tmp_path / "straight")[3:], train_losses(tmp_path / "split")[-3:]
    assert np.allclose(got, want, rtol=1e-2, atol=0), (got, want)


@pytest.mark.parametrize("second", [["-opt", "adamw8"], ["-opt", "adamw"], ["-opt", "adamw8", "-qs", "none"]])
def test_cpu_resume_with_other_adamw8_state_selection_refused(data, tmp_path, second):
    r = run_split(data, tmp_path / "split", ["-opt", "adamw8", "-qs", "all"], second)
    assert_one_line_error(r, "state_00000003_00000.bin", "-qs all", "resume with -qs all")


@pytest.mark.parametrize("selection", ["default", "none"])
def test_cpu_resume_with_own_adamw8_state_selection_where_another_keeps_the_same_tensors(data, tmp_path, selection):
    """in a model with C < 32 no tensor reaches 8-bit states under -qs default, as under -qs none: a checkpoint
    written with either resumes with the same flag (it was refused, naming the other -qs, so it never resumed)"""
    import sim_model
    path = data / "c16.bin"
    sim_model.write_model(path, layers=1, heads=2, channels=16, vocab=1000)
    flags = ["-e", path, "-opt", "adamw8", "-qs", selection]
    r = run_split(data, tmp_path / "split", flags, flags)
    assert r.returncode == 0, r.stderr
    run_straight(data, tmp_path / "straight", flags)
    assert final_model(tmp_path / "straight") == final_model(tmp_path / "split")


def test_cpu_fp8_is_honoured(data, tmp_path):
    """-p fp8 trains through the reference's FP8 emulation: close to fp32, but not the same bits"""
    fp32 = run_straight(data, tmp_path / "fp32", [])
    fp8 = run_straight(data, tmp_path / "fp8", ["-p", "fp8"])
    assert "precision fp8 emulated, recipe delayed" in fp8.stdout
    assert "precision fp32" in fp32.stdout
    assert final_model(tmp_path / "fp32") != final_model(tmp_path / "fp8"), "-p fp8 trained exactly like fp32: FP8 ignored"
    assert np.allclose(train_losses(tmp_path / "fp8"), train_losses(tmp_path / "fp32"), rtol=2e-2)


@pytest.mark.parametrize("fp8_flags", [["-fr", "delayed", "-f8", "all"], ["-fr", "block", "-f8", "all"],
                                       ["-fr", "delayed", "-f8", "all", "-f8p", "qkv.fwd,fc.dgrad,fcproj.wgrad,lm_head.fwd"],
                                       ["-fr", "delayed", "-fw", "delayed", "-f8", "all"],
                                       ["-fr", "current", "-fg", "delayed"]],
                         ids=["delayed", "block", "per-linear passes", "delayed weights", "delayed gradients"])
def test_cpu_fp8_resume_is_bitwise_identical(data, tmp_path, fp8_flags):
    """the scaling states go into the state file (with -fw delayed the weights' too: the scale
    the forwards use is the previous step's), and val evaluations put them back"""
    flags = ["-p", "fp8", "-opt", "adamw8"] + fp8_flags
    run_straight(data, tmp_path / "straight", flags)
    r = run_split(data, tmp_path / "split", flags + ["-v", 1, "-m", 1], flags + ["-v", 1, "-m", 1])
    assert r.returncode == 0, r.stderr
    assert final_model(tmp_path / "straight") == final_model(tmp_path / "split")


@pytest.mark.parametrize("recipe,idle", [(["-fr", "block"], ["-fh", 4, "-fm", 2]), (["-fr", "current"], ["-fh", 4])],
                         ids=["block", "current"])
def test_cpu_fp8_resume_takes_other_idle_tuning(data, tmp_path, recipe, idle):
    """-fh and -fm where the recipe reads neither (the notes say they change nothing) are held at their defaults: a
    checkpoint written with them resumes without them, and one written without them resumes with them, bitwise"""
    flags = ["-p", "fp8", "-f8", "all"] + recipe
    run_straight(data, tmp_path / "straight", flags)
    for name, first, second in (("given", flags + idle, flags), ("added", flags, flags + idle)):
        r = run_split(data, tmp_path / name, first, second)
        assert r.returncode == 0, r.stderr
        assert final_model(tmp_path / name) == final_model(tmp_path / "straight"), name


@pytest.mark.parametrize("recipe,tuning", [
    ([], ", history 8, margin 2"),
    (["-fr", "current"], ", margin 2"),
    (["-fr", "current", "-fg", "delayed"], ", history 8, margin 2"),
    (["-fr", "block"], "")], ids=["delayed", "current", "current-fg-delayed", "block"])
def test_cpu_fp8_startup_line_shows_the_tuning_read(data, tmp_path, recipe, tuning):
    """the startup line shows -fh and -fm only where the recipe reads them: elsewhere they are held at their
    defaults (fp8_settings_read_history/_margin), and a value printed there would claim otherwise"""
    r = run_straight(data, tmp_path / "run", ["-p", "fp8", "-f8", "all", "-fh", 8, "-fm", 2] + recipe)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("precision fp8 emulated"))
    assert re.search(r", passes [^|]*" + re.escape(tuning) + r" \| optimizer", line), line
    assert ("history" in line) == ("history" in tuning) and ("margin" in line) == ("margin" in tuning), line


def test_cpu_fp8_delayed_weights_are_honoured(data, tmp_path):
    """-fw delayed trains through the emulation's delayed weight cast: the same first step, then other bits"""
    current = run_straight(data, tmp_path / "current", ["-p", "fp8"])
    delayed = run_straight(data, tmp_path / "delayed", ["-p", "fp8", "-fw", "delayed"])
    assert "recipe delayed, weights delayed" in delayed.stdout and "recipe delayed, weights current" in current.stdout
    assert train_losses(tmp_path / "delayed")[0] == train_losses(tmp_path / "current")[0]
    assert final_model(tmp_path / "delayed") != final_model(tmp_path / "current"), "-fw delayed trained like -fw current"


def test_cpu_fp8_delayed_gradients_are_honoured(data, tmp_path):
    """-fg delayed trains through the emulation's delayed dy scaling: the same first step (its history is
    seeded with the current path), then other bits"""
    current = run_straight(data, tmp_path / "current", ["-p", "fp8"])
    delayed = run_straight(data, tmp_path / "delayed", ["-p", "fp8", "-fg", "delayed"])
    assert "gradients delayed" in delayed.stdout and "gradients current" in current.stdout
    assert train_losses(tmp_path / "delayed")[0] == train_losses(tmp_path / "current")[0]
    assert final_model(tmp_path / "delayed") != final_model(tmp_path / "current"), "-fg delayed trained like -fg current"


@pytest.mark.parametrize("second,difference", [
    (["-fr", "current"], "-fr delayed (this run: current): resume with the same -fr"),
    (["-fw", "delayed"], "-fw current (this run: delayed): resume with the same -fw"),
    (["-fg", "delayed"], "-fg current (this run: delayed): resume with the same -fg"),
    (["-fh", 8, "-fm", 2], "-fh 16 (this run: 8), -fm 0 (this run: 2): resume with the same -fh -fm")])
def test_cpu_fp8_resume_with_other_recipe_refused(data, tmp_path, second, difference):
    """the error names only the flags whose value differs, the file's value and the run's as the flags write them
    (not as enum numbers)"""
    r = run_split(data, tmp_path / "split", ["-p", "fp8"], ["-p", "fp8"] + second)
    assert_one_line_error(r, "state_00000003_00000.bin' was written with other FP8 settings: " + difference)
    assert r.stderr.strip().endswith(difference), r.stderr


def test_cpu_resume_notes_an_unused_model_flag(data, tmp_path):
    """-y 1 resumes the checkpoint's model whatever -e says, as llm.c; an -e of another shape gets a note, the same
    -e none"""
    r = run_split(data, tmp_path / "same", [], [])
    assert r.returncode == 0 and "note: -y 1 resumes" not in r.stdout, r.stdout[-2000:]
    r = run_split(data, tmp_path / "other", [], ["-e", "d6"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^note: -y 1 resumes \S+model_00000003.bin \(L=2 NH=2 C=128\); -e d6 \(L=6 NH=6 C=384\) is not used$",
                     r.stdout, re.M), r.stdout[-2000:]


@pytest.mark.parametrize("second,tokens,note", [
    (["-b", 1], 32, "-d 64 trains on with the checkpoint's"),
    (["-b", 4], 128, "the checkpoint's are not a multiple of this run's B*T*processes, 128"),
    (["-b", 1, "-d", 64], 64, None),
    ([], 64, None)], ids=["halved", "doubled", "kept-by-d", "same"])
def test_cpu_resume_notes_another_total_batch(data, tmp_path, second, tokens, note):
    """the state file records the run's tokens per step (header slot 11); a resume whose -b, -t or rank count moves
    -d's default, B*T*processes, gets a note naming the -d that keeps the checkpoint's (B=2 T=32: 64)"""
    out = tmp_path / "split"
    r = run_split(data, out, [], second)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stdout.splitlines() if "tokens per step" in line]
    expected = [] if note is None else [f"note: {out}/state_00000003_00000.bin was written by a run of 64 tokens per "
                                        f"step (-d); this run's are {tokens}: {note}"]
    assert notes == expected, r.stdout[-2000:]
    for step, written in ((3, 64), (6, tokens)):
        header = np.fromfile(out / f"state_{step:08d}_00000.bin", dtype=np.int32, count=12)
        assert header[11] == written, (step, header)


def add_master_weights(out, step, scale):
    """rewrites a CPU run's checkpoint as a GPU run with -w 1 writes it: the state file (version 1: fp32 m and v, no
    sections) gets header slot 4 = 1 and, after v, the fp32 master weights: the model file's weights times scale"""
    state = out / f"state_{step:08d}_00000.bin"
    model = np.fromfile(out / f"model_{step:08d}.bin", dtype=np.int32, count=256)
    assert model[1] == 3, "the CPU trainer writes fp32 model files"
    weights = np.fromfile(out / f"model_{step:08d}.bin", dtype=np.float32, offset=1024)
    raw = bytearray(state.read_bytes())
    header = np.frombuffer(raw[:1024], dtype=np.int32).copy()
    assert header[1] == 1 and header[4] == 0, header[:8]
    header[4] = 1
    body_end = 1024 + 2 * 4 * weights.size
    state.write_bytes(header.tobytes() + bytes(raw[1024:body_end]) + (weights * np.float32(scale)).tobytes() +
                      bytes(raw[body_end:]))


def test_cpu_resumes_a_checkpoint_with_master_weights(data, tmp_path):
    """a GPU run's checkpoint (-w 1, llm.c's default too) keeps fp32 master weights in the state file. The CPU trainer,
    whose weights are fp32 (no -w), takes them as its weights: the model file's own values resume as the plain
    checkpoint does, bit for bit, and other values train on from there"""
    plain = run_split(data, tmp_path / "plain", [], [])
    assert plain.returncode == 0, plain.stderr
    common = ["-l", 1e-3, "-k", "constant", "-n", 3, "-v", 0]
    for name, scale in (("same", 1.0), ("halved", 0.5)):
        out = tmp_path / name
        first = run(CPU, base_args(data, common + ["-o", out, "-x", 3], small_vocab_model(data)), timeout=600)
        assert first.returncode == 0, first.stderr
        add_master_weights(out, 3, scale)
        resumed = run(CPU, base_args(data, common + ["-o", out, "-x", 6, "-y", 1], small_vocab_model(data)), timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        assert "state_00000003_00000.bin: the weights are its fp32 master weights" in resumed.stdout, resumed.stdout[-2000:]
    assert final_model(tmp_path / "same") == final_model(tmp_path / "plain")
    assert train_losses(tmp_path / "halved")[3:] != train_losses(tmp_path / "plain")[3:]


def test_cpu_resume_of_a_several_ranks_checkpoint_says_what_resumes_it(data, tmp_path):
    """train_gpt2_fp8 reshards a checkpoint of N ranks; the CPU trainer does not, and says so in one line naming
    train_gpt2_fp8 and the model file to start from (the file here: a CPU checkpoint whose header says rank 0 of 2)"""
    out = tmp_path / "ranks"
    r = run_straight(data, out, [], steps=2)
    assert r.returncode == 0, r.stderr
    state = out / "state_00000002_00000.bin"
    header = np.fromfile(state, dtype=np.int32, count=256)
    header[2] = 2  # processes
    header[11] *= 2  # the tokens per step of 2 ranks at the same B and T
    with open(state, "r+b") as f:
        f.write(header.tobytes())
    r = run(CPU, base_args(data, ["-l", 1e-3, "-k", "constant", "-v", 0, "-o", out, "-x", 4, "-n", 2, "-y", 1],
                           small_vocab_model(data)))
    assert_one_line_error(r, "state_00000002_00000.bin' is one of 2 ranks'", "resume it with train_gpt2_fp8",
                          f"-e {out}/model_00000002.bin")


def test_cpu_resume_of_an_fp8_run_in_bf16_names_the_flag(data, tmp_path):
    """a checkpoint whose state sections this run does not keep (an FP8 run's scaling resumed in bf16): the error
    says which flag wrote them"""
    r = run_split(data, tmp_path / "split", ["-p", "fp8"], ["-p", "bf16"])
    assert_one_line_error(r, "state_00000003_00000.bin", "'fp8emu_config'", "written by a -p fp8 run?")


def test_cpu_fp8_resume_with_other_passes_refused(data, tmp_path):
    """the state file records each linear's passes: a resume that moves one pass of one linear is refused"""
    r = run_split(data, tmp_path / "split", ["-p", "fp8", "-f8p", "fwd,fc.dgrad,fc.wgrad"], ["-p", "fp8", "-f8p", "fwd,fc.dgrad"])
    assert_one_line_error(r, "state_00000003_00000.bin", "FP8 passes qkv=fwd attproj=fwd fc=fwd,dgrad,wgrad fcproj=fwd "
                          "(this run: qkv=fwd attproj=fwd fc=fwd,dgrad fcproj=fwd): resume with the same -f8 -f8p")


def patch_int32(offset, value):
    return lambda b: b[:offset] + struct.pack("<i", value) + b[offset + 4:]


# an adamw8 state file of the CPU trainer holds no fp32 arrays (no m, v or master): the
# shuffle trailer starts right after the header, with 1 shard: u64 1, int32 0, u64 count, then
# the sample order at byte 1044
STATE_CORRUPTIONS = {
    "step_not_the_checkpoints": (patch_int32(4 * 10, 2), ["holds step 2, expected 1"]),
    "sample_index_past_the_shard": (lambda b: b[:128] + struct.pack("<Q", 2**40) + b[136:], ["sample index 1099511627776"]),
    "sample_order_not_a_permutation": (lambda b: b[:1044] + b[1048:1052] + b[1048:], ["sample order entry 1 repeats"]),
    "flag_slot_not_0_or_1": (patch_int32(4 * 6, 2), ["2 in header slot 6", "expected 0 or 1"]),
}


@pytest.mark.parametrize("corruption", sorted(STATE_CORRUPTIONS))
def test_cpu_resume_from_corrupt_state_file_refused(data, tmp_path, corruption):
    """corruptions test/fuzz_inputs.py found resumed silently (or failed naming another file): each is one
    line naming the state file"""
    patch, fragments = STATE_CORRUPTIONS[corruption]
    common = ["-opt", "adamw8", "-n", 1, "-o", tmp_path / "out"]
    r1 = run(CPU, base_args(data, common + ["-x", 1]))
    assert r1.returncode == 0, r1.stderr
    state = tmp_path / "out" / "state_00000001_00000.bin"
    state.write_bytes(patch(state.read_bytes()))
    r2 = run(CPU, base_args(data, common + ["-x", 3, "-y", 1]))
    assert_one_line_error(r2, "state_00000001_00000.bin", *fragments)


def patch_state_float(section, index, value):
    """float `index` of a state file's array: "m" or "v" of the body (fp32 moments, after the 1024-byte header; the
    parameter count in header slots 42-43), else the section tagged `section` (a 16-byte tag, a uint64 size)"""
    def patch(blob):
        if section in ("m", "v"):
            at = 1024 + 4 * (index + (struct.unpack_from("<Q", blob, 4 * 42)[0] if section == "v" else 0))
        else:
            at = blob.index(section.encode() + b"\0") + 24 + 4 * index
        return blob[:at] + struct.pack("<f", value) + blob[at + 4:]
    return patch


# values no run writes, in state files that pass every check of their shape: the first update would take the
# moment into the weights (a NaN moment is no non-finite gradient, which skips the step), a NaN absmax would leave
# its block frozen
STATE_VALUE_CORRUPTIONS = {
    "adamw_m_nan": ("adamw", patch_state_float("m", 7, float("nan")), "AdamW m of parameter 7 of this rank's window is nan"),
    "adamw_v_negative": ("adamw", patch_state_float("v", 5, -1.0), "AdamW v of parameter 5 of this rank's window is -1, expected a finite number >= 0"),
    "adamw8_absmax_inf": ("adamw8", patch_state_float("adamw8.v_absmax", 3, float("inf")), "adamw8 v absmax of block 3"),
    "adamw8_m32_nan": ("adamw8", patch_state_float("adamw8.m32", 0, float("nan")), "adamw8 32-bit m of element 0"),
}


@pytest.mark.parametrize("corruption", sorted(STATE_VALUE_CORRUPTIONS))
def test_cpu_resume_from_state_with_non_finite_values_refused(data, tmp_path, corruption):
    """a moment or absmax that is NaN, Inf or (v) negative: one line naming the state file and the value"""
    optimizer, patch, message = STATE_VALUE_CORRUPTIONS[corruption]
    common = ["-opt", optimizer, "-n", 1, "-o", tmp_path / "out"]
    r1 = run(CPU, base_args(data, common + ["-x", 1]))
    assert r1.returncode == 0, r1.stderr
    state = tmp_path / "out" / "state_00000001_00000.bin"
    state.write_bytes(patch(state.read_bytes()))
    r2 = run(CPU, base_args(data, common + ["-x", 3, "-y", 1]))
    assert_one_line_error(r2, "state_00000001_00000.bin", message)


def test_cpu_shards_shorter_than_a_batch_are_passed_over(data):
    """a split's last shard is often short (what was left over): one of 30 tokens beside 20000, at B*T+1 = 65, holds
    no batch and is passed over with a note naming it, in the train and the val glob (llm.c refuses the glob); the
    run trains as it does without it, loss for loss (-sh 0: a shuffle draws the shard order of the glob it has)"""
    def losses(stdout):
        return re.findall(r"(?:val loss|\| loss) ([0-9.]+)", stdout)
    reference = run(CPU, base_args(data, ["-v", 1, "-sh", 0]))
    assert reference.returncode == 0, reference.stderr
    write_shard(data / "d_train_000002.bin", random_tokens(30, 3))
    write_shard(data / "d_val_000001.bin", random_tokens(0, 4))
    r = run(CPU, base_args(data, ["-v", 1, "-sh", 0]))
    assert r.returncode == 0, r.stderr
    assert ("note: -i: 1 of the 2 token shards hold fewer than one batch's num_processes*B*T+1 = 65 tokens and are "
            f"passed over (the smallest: '{data / 'd_train_000002.bin'}', 30 tokens)") in r.stdout, r.stdout[-2000:]
    assert "note: -j: 1 of the 2 token shards" in r.stdout and "d_val_000001.bin', 0 tokens)" in r.stdout
    assert len(losses(r.stdout)) == 5 and losses(r.stdout) == losses(reference.stdout), (r.stdout, reference.stdout)


def test_cpu_resume_without_a_complete_checkpoint_names_the_incomplete_step(data, tmp_path):
    """-y 1 where the newest files lack their DONE marker (a write cut off): the run starts from scratch, as llm.c's
    does, and its line names the step it passed over"""
    out = tmp_path / "out"
    r1 = run(CPU, base_args(data, ["-n", 1, "-o", out, "-x", 1]))
    assert r1.returncode == 0, r1.stderr
    (out / "DONE_00000001").unlink()
    r2 = run(CPU, base_args(data, ["-n", 1, "-o", out, "-x", 1, "-y", 1]))
    assert r2.returncode == 0, r2.stderr
    assert (f"-y 1: no complete checkpoint in {out} (step 1's files have no DONE_00000001: a write cut off?), "
            "starting from scratch") in r2.stdout, r2.stdout[-2000:]
    assert (out / "DONE_00000001").exists()


def test_cpu_model_file_with_a_non_finite_weight_refused(data, tmp_path):
    """a model file holding a NaN (corrupt, or saved from a run that diverged) would make every forward non-finite
    and every step skip: one line names the file, the tensor and the element"""
    from sim_model import write_model
    model = tmp_path / "model.bin"
    write_model(model, layers=1, vocab=1000)
    blob = model.read_bytes()
    C, maxT, padded = 128, 1024, 1024  # sim_model's width; V = 1000 padded to a multiple of 128
    at = 1024 + 4 * (padded * C + maxT * C + 3)  # ln1w's element 3, after wte and wpe
    model.write_bytes(blob[:at] + struct.pack("<f", float("nan")) + blob[at + 4:])
    r = run(CPU, ["-e", model, "-i", data / "d_train_*.bin", "-j", "", "-b", 2, "-t", 32, "-x", 1, "-v", 0, "-s", 0])
    assert_one_line_error(r, "model.bin", "element 3 of ln1w is nan, expected a finite number")


def test_cpu_resume_with_a_state_of_another_model_refused(data, tmp_path):
    """a checkpoint whose state file is a larger model's (2 layers, the model file 1): refused by the parameter
    count the state records (header slots 42-43), before its shuffle trailer is read from inside its arrays (which
    named a count of shards in the quintillions)"""
    from sim_model import write_model
    for layers in (1, 2):
        write_model(tmp_path / f"model_l{layers}.bin", layers=layers, vocab=1000)
    out = tmp_path / "out"
    common = ["-i", data / "d_train_*.bin", "-j", "", "-b", 2, "-t", 32, "-v", 0, "-s", 0, "-n", 1, "-o", out]
    r1 = run(CPU, ["-e", tmp_path / "model_l2.bin", "-x", 1] + common)
    assert r1.returncode == 0, r1.stderr
    (out / "model_00000001.bin").write_bytes((tmp_path / "model_l1.bin").read_bytes())
    r2 = run(CPU, ["-e", tmp_path / "model_l1.bin", "-x", 2, "-y", 1] + common)
    assert_one_line_error(r2, "state_00000001_00000.bin", "parameters per rank, this run", "a state of another model?")


# the emulation's Fp8LinearState (gpt2_ref.h) starts with an int, then its x state (sim_model.SCALING_FIELD_OFFSETS)
SCALING_CORRUPTIONS = {
    "position_past_the_ring": ("position", struct.pack("<i", 5000), "ring position lies outside its history"),
    "scale_zero": ("scale", struct.pack("<f", 0.0), "not a positive normal float"),
    # scale then scale_inv: a subnormal scale whose inverse rounds to +Inf, its fp8_reciprocal
    "scale_subnormal": ("scale", struct.pack("<ff", 1e-40, float("inf")), "not a positive normal float"),
    "position_off_its_count": ("position", struct.pack("<i", 3), "ring position does not follow its count of amaxes"),
}


@pytest.mark.parametrize("corruption", sorted(SCALING_CORRUPTIONS))
def test_cpu_resume_from_corrupt_fp8_scaling_state_refused(data, tmp_path, corruption):
    """a scaling state whose ring position lies past its history (the next update would write past the ring), or
    is not where its count of amaxes puts it (a slot never recorded would count as history), or whose scale is 0
    or subnormal (casts to nothing, an Inf dequantization): one line naming the state file and the state"""
    field, value, message = SCALING_CORRUPTIONS[corruption]
    common = ["-p", "fp8", "-n", 1, "-o", tmp_path / "out"]
    r1 = run(CPU, base_args(data, common + ["-x", 1]))
    assert r1.returncode == 0, r1.stderr
    state = tmp_path / "out" / "state_00000001_00000.bin"
    blob = state.read_bytes()
    from sim_model import SCALING_FIELD_OFFSETS
    at = blob.index(b"fp8emu_linears\0") + 24 + 4 + SCALING_FIELD_OFFSETS[field]  # tag 16, size 8, the linear's int
    state.write_bytes(blob[:at] + value + blob[at + len(value):])
    r2 = run(CPU, base_args(data, common + ["-x", 3, "-y", 1]))
    assert_one_line_error(r2, "state_00000001_00000.bin", "FP8 scaling state of x of linear 0", message)


@pytest.mark.parametrize("offset,shown", [(0, "-fr invalid (1073741824) (this run: delayed)"),
                                          (4, "FP8 passes qkv=invalid (1073741824) attproj=fwd,dgrad,wgrad"),
                                          (32, "-fw invalid (1073741824) (this run: current)"),
                                          (36, "-fg invalid (1073741824) (this run: current)")],
                         ids=["recipe", "qkv-passes", "weight_scaling", "grad_scaling"])
def test_cpu_resume_from_corrupt_fp8_config_refused(data, tmp_path, offset, shown):
    """the emulation's settings section (Fp8Emulation, gpt2_ref.h: recipe, passes[5], history, margin,
    weight_scaling, grad_scaling) holding a value no flag gives: one line naming the state file and the value,
    not a crash while the error names it"""
    common = ["-p", "fp8", "-n", 1, "-o", tmp_path / "out"]
    r1 = run(CPU, base_args(data, common + ["-x", 1]))
    assert r1.returncode == 0, r1.stderr
    state = tmp_path / "out" / "state_00000001_00000.bin"
    blob = state.read_bytes()
    at = blob.index(b"fp8emu_config\0")
    assert struct.unpack_from("<Q", blob, at + 16)[0] == 40, "Fp8Emulation is 10 int32s"
    state.write_bytes(patch_int32(at + 24 + offset, 1 << 30)(blob))
    r2 = run(CPU, base_args(data, common + ["-x", 3, "-y", 1]))
    assert_one_line_error(r2, "state_00000001_00000.bin' was written with other FP8 settings: " + shown)


@pytest.mark.parametrize("passes,shown", [("fwd,fc.dgrad,fc.wgrad", "passes qkv=fwd attproj=fwd fc=fwd,dgrad,wgrad fcproj=fwd"),
                                          ("dgrad", "passes qkv=dgrad attproj=dgrad fc=dgrad fcproj=dgrad"),
                                          ("wgrad", "passes qkv=wgrad attproj=wgrad fc=wgrad fcproj=wgrad")])
def test_cpu_fp8_per_linear_passes_train(data, tmp_path, passes, shown):
    """per-linear passes, and dgrad and wgrad each without the other, train through the emulation: each set
    of passes is a model of its own, between fp32 and every pass in FP8"""
    result = run_straight(data, tmp_path / "chosen", ["-p", "fp8", "-f8p", passes])
    assert shown in result.stdout
    run_straight(data, tmp_path / "fp32", [])
    run_straight(data, tmp_path / "all", ["-p", "fp8"])
    chosen = final_model(tmp_path / "chosen")
    assert chosen != final_model(tmp_path / "fp32"), f"-f8p {passes} trained exactly like fp32"
    assert chosen != final_model(tmp_path / "all"), f"-f8p {passes} trained exactly like every pass in FP8"
    assert np.allclose(train_losses(tmp_path / "chosen"), train_losses(tmp_path / "fp32"), rtol=2e-2)


def test_readme_flag_table_matches_help():
    """every flag in --help has a row in the README's flag table, and the table has no extra rows; each row's
    default (its first `...`) is the one --help prints, but -e's (train_gpt2cpu trains tiny unless told) and -s's
    (train_gpt2cpu has no sampler: 0)"""
    help_defaults = {}
    for line in run(CPU, ["--help"]).stdout.splitlines():
        if line.startswith("  -") and not line.strip().startswith("--help"):
            default = line[line.rindex("(default ") + len("(default "):]
            help_defaults[line.split()[0]] = default[1:default.index('"', 1)] if default[0] == '"' else re.split("[;)]", default)[0]
    with open(os.path.join(ROOT, "README.md")) as f:
        table_defaults = {line.split("`")[1]: re.match(r" *`([^`]*)`", line.split("|")[2]).group(1)
                          for line in f if line.startswith("| `-")}
    assert set(help_defaults) == set(table_defaults), (set(help_defaults) - set(table_defaults),
                                                       set(table_defaults) - set(help_defaults))
    for flag, default in table_defaults.items():
        shown = help_defaults[flag]
        if flag == "-e":
            assert (default, shown) == ("d12", "tiny"), (default, shown)
        elif flag == "-s":
            assert (default, shown) == ("20", "0"), (default, shown)
        elif default == '""' or not re.fullmatch(r"-?[0-9.e+-]+", default):
            assert shown == default.strip('"'), (flag, default, shown)
        else:
            assert float(shown) == pytest.approx(float(default), rel=1e-6), (flag, default, shown)


# -sl / -sg: a tiny model learns a random walk for 140 steps, then the data turns to uniform tokens it has not learned
SPIKE_STEP = 141  # the first step whose batch (-b 4 -t 32, no shuffling) holds the new data
SKIP_RE = r"^step (\d+): (loss|gradient norm) \S+ is \S+ standard deviations above the last 128 steps' mean \((-s[lg]) 3\): update skipped"


def spike_args(tmp_path, extra):
    import sim_model
    if not (tmp_path / "spike_train_000001.bin").exists():
        sim_model.write_model(tmp_path / "spike.bin", layers=1, heads=2, channels=32, vocab=256, max_t=64)
        sim_model.write_shard(tmp_path / "spike_train_000001.bin", 30000, 3, vocab=256, learnable=True,
                              change_at=(SPIKE_STEP - 1) * 4 * 32)
    return ["-e", tmp_path / "spike.bin", "-i", tmp_path / "spike_train_*.bin", "-j", "", "-b", 4, "-t", 32, "-l", 3e-3,
            "-k", "constant", "-sh", 0, "-v", 0, "-s", 0] + list(extra)


def skipped_steps(stdout):
    return {int(m.group(1)): (m.group(2), m.group(3)) for m in re.finditer(SKIP_RE, stdout, re.M)}


@pytest.mark.parametrize("flag,quantity", [("-sl", "loss"), ("-sg", "gradient norm")])
def test_cpu_outlier_steps_are_skipped(tmp_path, flag, quantity):
    """-sl / -sg 3: the first steps on data the model has not learned lie far above the previous 128 steps' loss and
    gradient norm and skip their updates, from the first such step on and none before; the skipped step leaves the
    weights as they were (its checkpoint's model file is the previous step's); the JSONL log marks it; the checks
    are off by default"""
    out = tmp_path / "on"
    r = run(CPU, spike_args(tmp_path, [flag, 3, "-x", SPIKE_STEP, "-n", 1, "-nk", 2, "-o", out]), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    skipped = skipped_steps(r.stdout)
    other = {"-sl": "-sg", "-sg": "-sl"}[flag]
    assert "outliers | skip an update whose loss" in r.stdout and f"({flag} 3)" in r.stdout and f"({other} off)" in r.stdout
    assert list(skipped) == [SPIKE_STEP] and skipped[SPIKE_STEP] == (quantity, flag), r.stdout[-3000:]
    assert (out / f"model_{SPIKE_STEP:08d}.bin").read_bytes() == (out / f"model_{SPIKE_STEP - 1:08d}.bin").read_bytes()
    summary = {"-sl": "1 for a loss outlier (-sl)", "-sg": "1 for a gradient norm outlier (-sg)"}[flag]
    assert "1 updates were skipped: 0 for a non-finite loss or gradient norm, " in r.stdout and summary in r.stdout
    records = [json.loads(l) for l in open(out / "main.jsonl")]
    flags = {rec["step"]: rec["skipped"] for rec in records if rec["type"] == "train"}
    assert flags[SPIKE_STEP - 1] == 1 and sum(flags.values()) == 1, flags  # the log's s:k is update k + 1
    off = run(CPU, spike_args(tmp_path, ["-x", SPIKE_STEP + 5]), timeout=600)
    assert off.returncode == 0 and not skipped_steps(off.stdout) and "SKIPPED" not in off.stdout
    assert "outliers |" not in off.stdout


def test_cpu_fp8_skipped_step_leaves_the_scaling_as_it_was(tmp_path):
    """-p fp8 -sl 3: the skipped spike step saw activations far outside the history, but its amaxes are not kept:
    every scaling state (the 3 of each linear, Fp8TensorScaling after the linear's int, sim_model.SCALING_BYTES each) in step
    141's checkpoint is step 140's, byte for byte (its non-finite counts too: the spike is finite)"""
    out = tmp_path / "fp8"
    r = run(CPU, spike_args(tmp_path, ["-p", "fp8", "-sl", 3, "-x", SPIKE_STEP, "-n", 1, "-nk", 2, "-o", out]), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(skipped_steps(r.stdout)) == [SPIKE_STEP], r.stdout[-3000:]
    from sim_model import SCALING_BYTES, state_section
    before, after = (state_section(out / f"state_{step:08d}_00000.bin", "fp8emu_linears") for step in (SPIKE_STEP - 1, SPIKE_STEP))
    linears = 4 * 1 + 1
    stride = len(before) // linears
    for i in range(linears):
        scaling = slice(i * stride + 4, i * stride + 4 + 3 * SCALING_BYTES)
        assert before[scaling] == after[scaling], f"linear {i}: the skipped step changed its scaling states"
    assert before != after, "the step's casts left no statistics (the test would not see a change)"


def test_cpu_outlier_windows_resume_bitwise(tmp_path):
    """the windows are in the state file: a run checkpointed at step 135 and resumed skips exactly the steps the
    uninterrupted run skips (without the windows it would have none to judge by) and ends on the same model; a
    checkpoint written without -sl resumes under -sl with empty windows, said so"""
    straight = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 150, "-n", 150, "-o", tmp_path / "straight"]), timeout=600)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert min(skipped_steps(straight.stdout)) == SPIKE_STEP, straight.stdout[-3000:]
    split = tmp_path / "split"
    first = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 135, "-n", 135, "-o", split]), timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 150, "-n", 150, "-y", 1, "-o", split]), timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert skipped_steps(second.stdout) == skipped_steps(straight.stdout)
    assert (split / "model_00000150.bin").read_bytes() == (tmp_path / "straight" / "model_00000150.bin").read_bytes()
    plain = tmp_path / "plain"
    first = run(CPU, spike_args(tmp_path, ["-x", 135, "-n", 135, "-o", plain]), timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 150, "-y", 1, "-o", plain]), timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "has no -sl/-sg windows (written without them): the checks start 128 steps from now" in second.stdout
    assert not skipped_steps(second.stdout)
    # resumed after a skip: the counts come back with the state, so the run's lines count the whole run
    after_skip = tmp_path / "after_skip"
    first = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", SPIKE_STEP + 2, "-n", SPIKE_STEP + 2, "-o", after_skip]),
                timeout=600)
    assert first.returncode == 0 and SPIKE_STEP in skipped_steps(first.stdout), first.stdout[-3000:]
    second = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 150, "-n", 150, "-y", 1, "-o", after_skip]), timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    summary = re.compile(r"^\d+ updates were skipped: .*$", re.M)
    assert summary.findall(straight.stdout), straight.stdout[-3000:]
    assert summary.findall(second.stdout) == summary.findall(straight.stdout), second.stdout[-3000:]


def test_cpu_corrupt_outlier_windows_are_refused(tmp_path):
    """a state file whose -sl window could not be one (its count past the ring) stops the resume with one line naming
    the file and the section, instead of indexing past the window"""
    out = tmp_path / "run"
    r = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 5, "-n", 5, "-o", out]), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    state = out / "state_00000005_00000.bin"
    data = bytearray(state.read_bytes())
    at = data.index(b"outlier_windows\0") + 16 + 8  # tag, byte count, then the loss window's values, count, next
    count_at = at + 128 * 8
    assert struct.unpack_from("<i", data, count_at)[0] == 5
    struct.pack_into("<i", data, count_at, 100000)
    state.write_bytes(bytes(data))
    r = run(CPU, spike_args(tmp_path, ["-sl", 3, "-x", 6, "-y", 1, "-o", out]), timeout=600)
    assert_one_line_error(r, str(state), "outlier_windows", "loss window (count 100000")


def test_probe_epilogues_command_line():
    """./probe_epilogues (dev/bench/probe_epilogues.cu) takes no flags: --help prints its usage, anything else is
    one error line naming it; without a GPU (CI) it says so in one line"""
    probe = os.path.join(ROOT, "probe_epilogues")
    r = run(probe, ["--help"])
    assert r.returncode == 0 and r.stdout.startswith("usage: ./probe_epilogues"), r.stdout
    assert_one_line_error(run(probe, ["--models"]), "unknown argument '--models'")
    if subprocess.run(["bash", "-c", "nvidia-smi -L"], capture_output=True).returncode != 0:
        assert_one_line_error(run(probe, []), "no usable NVIDIA GPU here")


def test_probe_epilogues_under_cudasim():
    """the probe's own code on cudasim's cuBLASLt, which has the bf16-D epilogues the trainer uses and an E4M3 D with
    a bf16 aux and its amax (-fe 1's GEMM), but no fp16 or FP8 aux, no D amax with a bf16 D and no DGELU with an FP8
    D (refused as an H200 refused them): the two controls and the two bf16-aux E4M3 cases are accepted and run once
    (a misaligned scale pointer, refused on an H200, would fail them; the E4M3 ones write their amax), and each other
    case shows its refusal instead of ending the probe"""
    probe = os.path.join(ROOT, "build", "sim", "probe_epilogues")
    r = run(probe, [])
    assert r.returncode == 0, r.stderr[-2000:]
    # dev/gpu_session.sh's summary finds the table by its title
    with open(os.path.join(ROOT, "dev", "gpu_session.sh")) as f:
        title = re.search(r"env_section '(\^## cuBLASLt[^']*)'", f.read())
    assert title and re.match(title.group(1), r.stdout), r.stdout[:200]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| fc") or line.startswith("| fcproj")]
    assert len(rows) == 14 and sum("(control" in row for row in rows) == 2, r.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if "(control" in cells[0]:
            assert cells[1:] == ["yes", "yes", "-"], row
        elif cells[0].startswith("fc fwd: E4M3 D, GELU") and ("bf16 aux" in cells[0] or "_AUX_" not in cells[0]):
            assert cells[1:] == ["yes", "yes", "yes"], row
        elif "E4M3 aux" in cells[0]:
            assert cells[1] == "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER refused: CUBLAS_STATUS_NOT_SUPPORTED", row
        else:
            assert cells[1:] == ["CUBLAS_STATUS_NOT_SUPPORTED", "-", "-"], row
