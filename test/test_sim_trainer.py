"""
The GPU trainer's main program end to end, under cudasim (build/sim/train_gpt2_fp8, made by
make test): the paths the kernel and model tests (test/test_*.cu) do not reach, on the CPU.
- bf16 and FP8 (+ adamw8) runs with validation, text samples, HellaSwag, the FP8 numerics
  log and checkpoints: exit 0, loss finite and falling, main.log in llm.c's line format,
  main.jsonl, numerics.jsonl rows for every FP8 tensor, DONE markers; each step line's tok/s,
  MFU (per GPU, llm.c's FLOP count, with cudasim named as an H100) and ETA as they follow from the
  step's time;
- a text sample is llm.c's draw, token by token, from the weights that sampled (a float64
  forward of step 1's model file, llm.c's xorshift* coins), and HellaSwag's count llm.c's on the
  model -x 0 starts from;
- the schedule's rate at each step from step 0; weight decay on the 2D tensors only; gradient
  accumulation averages its micro-steps; checkpoints at every -n steps and at the last step;
- each FP8 weight cast with its own layer's amax after the update (the state file's records);
- -y 1 resumes bitwise: the resumed steps print the losses of the uninterrupted run; also with each linear's
  own FP8 passes, resumed with val, HellaSwag, samples and -r 2, which change nothing, and a block run's
  checkpoint resumed without the -fh and -fm it was given (the recipe reads neither);
- -fr delayed and -fg delayed take the current path in the first step only (its model is -fr current's);
- -ge 2 (GELU's derivative in fcproj's dgrad epilogue), bf16 and FP8: trains, tracking -ge 1;
- -fe 1 (fc's GEMM writes fcproj's x codes): step 1 is -fe 0's, then it tracks -fe 0, logs fcproj's x, resumes bitwise;
- -r 0, 1 and 2 in FP8 (each recipe, and with only some wgrads in FP8): the same losses, model,
  state and numerics files, bit for bit, and the device memory falls by exactly the x^T codes
  the backward casts again instead of keeping; in bf16 too where a layer's activations are not
  a multiple of 256 bytes (cudasim's cuBLASLt, like the library, may sum in another order for
  a less aligned operand);
- a descriptor (-e tiny, and -y 1 with no checkpoint yet) draws train_gpt2cpu's random init;
  -x -1 trains one epoch;
- a run whose every forward overflows (a weight of 3e38): its non-finite steps are counted
  and skipped, the run ends cleanly, and the model file it writes holds no Inf or NaN;
- the block recipe at C = 192 (tiles along K that end short, as d48's): trains, resumes
  bitwise, and a cuBLASLt without such kernels gives one line naming the remedy;
- the `comm |` line counts each collective's payload at its element size (bf16 or -pa fp32
  gradients, FP8 codes, bf16 weights, uint32 amaxes);
- 2 ranks (ZeRO-1, FP8) give the same losses when cudasim runs the streams' work newest first
  or in call order (CUDASIM_STREAM_ORDER): the forward waits for each stage of the weight gather
  it reads, and each stage is issued after the update of what it sends.
- -pc 1 over 2 ranks finds what the weight gather makes identical identical (bf16, FP8 with delayed
  weights, block, ZeRO-3), and stops both ranks, one line each, when cudasim loses one of the
  gather's deliveries to rank 1 (CUDASIM_NCCL_LOSE_BROADCAST);
- a killed rank stops its peer within -pt (test/gpu_trainer_ranks.py's killed section), also
  with each stream's launch queue bounded (where the survivor may block inside a launch);
- a skipped step (-sl) leaves the FP8 scaling states as they were; a corrupt scaling state or cast
  record in a state file is refused with one line;
- the memory figures the trainer prints (bytes per parameter, each optimizer and master-weight
  mode) match the device memory the runs allocate (CUDASIM_MEMORY_REPORT);
- 2 ranks whose batches are twins (a shard of one repeated sample) train the 1-rank model bit
  for bit, model file included, under ZeRO-1 (bf16, FP8 with adamw8, delayed weights, block)
  and ZeRO-3 (also at C = 192, whose weight slices are not all 256-byte aligned), and so do 3
  ranks with -pa fp32 (ZeRO-1 and ZeRO-3), ZeRO-3's text samples included; a checkpoint of 1 rank
  resumed on 2, and of 2 on 1, goes on bit for bit.
- on ordinary data, 2 ranks x -b 4 with 2 micro-steps track 1 rank x -b 8: each rank reads its half
  of the batch, and the gradients are averaged once per step;
- ZeRO-3 on a 3-layer model (2 ranks, twin batches, newest first, 2 micro-steps): a layer's gather into a
  reused slot waits for the slot's previous layer (the 2-layer model never reuses one within a pass).
test/sim_model.py's small model keeps a step near a second. The same program on a GPU is
make gpucheck's (test/test_gpt2.cu, test/gpu_trainer_ranks.py).
"""
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import sim_model

from sim_model import SIM_TRAINER, state_section, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """a model file, train/val shards, and the HellaSwag file where the trainer looks for it"""
    d = tmp_path_factory.mktemp("sim_trainer")
    sim_model.write_run_files(d, 60_000)
    # C = 192 (3 heads of 64): slices not all 256-byte aligned (qkvb's 3C bf16 are 1152 bytes, a layer's B*T*C need
    # not be a multiple of 128 either)
    sim_model.write_model(d / "model_c192.bin", layers=1, heads=3, channels=192)
    sim_model.write_model(d / "model_c192_l2.bin", layers=2, heads=3, channels=192)
    sim_model.write_model(d / "model_l3.bin", layers=3)  # 3 layers: ZeRO-3 reuses a layer slot within a pass
    os.makedirs(d / "dev" / "data" / "hellaswag")
    sim_model.write_hellaswag(d / "dev" / "data" / "hellaswag" / "hellaswag_val.bin")
    return d


losses = sim_model.step_losses

# cudasim named as a GPU whose dense bf16 peak the trainer knows (989 TFLOP/s, llmc/cuda_common.h), for its MFU
AS_H100 = {"CUDASIM_DEVICE_NAME": "NVIDIA H100 80GB HBM3"}


def check_progress_figures(stdout, out_dir, ranks, steps, first_only=False):
    """Each step line's figures as they follow from the step's time (main.jsonl's, exact): tok/s is the total batch
    over it; MFU, llm.c's FLOPs per token (6 per parameter + 6*L*C*T) times the total batch, per GPU, over it and the
    H100's 989 TFLOP/s; the ETA, the steps left times the moving average of the step times after the first.
    first_only: the first `steps` steps of a run stopped after them"""
    assert re.search(r"^llm8 \| device NVIDIA H100 80GB HBM3 \(\d+ SMs, bf16 peak 989 TFLOP/s\)$", stdout, re.M), stdout[:2000]
    L, C, params = map(int, re.search(r"^model \| L=(\d+) NH=\d+ C=(\d+) .*\| (\d+) parameters", stdout, re.M).groups())
    T, total = map(int, re.search(r"^train \| .*\| B=\d+ T=(\d+) \| total batch (\d+) tokens", stdout, re.M).groups())
    records = [json.loads(line) for line in open(out_dir / "main.jsonl") if '"type":"train"' in line]
    lines = re.findall(r"^step +\d+/(\d+) \| .* \| ([\d.]+) ms \| (\d+) tok/s \| MFU (\S+) \| ETA (\S+) \|", stdout, re.M)
    if first_only:
        records, lines = records[:steps], lines[:steps]
    assert len(records) == len(lines) == steps, (records, lines)
    flops_per_step = (6.0 * params + 6.0 * L * C * T) * total
    ema_ms = -1.0
    for step, (record, (num_steps, ms_text, tok_text, mfu_text, eta_text)) in enumerate(zip(records, lines)):
        ms = float(np.float32(record["ms"]))  # the float the trainer timed (main.jsonl writes 9 digits)
        tok_per_s, mfu = total / (ms / 1000.0), flops_per_step / ranks / (ms / 1000.0) / (989.0 * 1e12)
        assert np.float32(record["tok_per_s"]) == np.float32(tok_per_s) and np.float32(record["mfu"]) == np.float32(mfu), \
            (record, tok_per_s, mfu)
        assert (ms_text, tok_text, mfu_text) == ("%.2f" % ms, "%.0f" % tok_per_s, "%.1f%%" % (100.0 * mfu)), lines[step]
        if step > 0:
            ema_ms = ms if ema_ms < 0 else 0.95 * ema_ms + 0.05 * ms
        seconds = int((int(num_steps) - step - 1) * (ema_ms if ema_ms > 0 else ms) / 1000.0)
        assert eta_text == "%dh%02dm%02ds" % (seconds // 3600, seconds // 60 % 60, seconds % 60), (lines[step], ema_ms)


@pytest.mark.parametrize("flags", [["-p", "bf16"], ["-p", "fp8", "-opt", "adamw8", "-fn", 2]], ids=["bf16", "fp8-adamw8"])
def test_training_run_with_eval_samples_logs_and_checkpoints(workdir, flags):
    out = workdir / ("run_" + flags[1])
    r = train(workdir, flags + ["-x", 6, "-l", 3e-3, "-v", 4, "-s", 3, "-g", 8, "-h", 1, "-n", 3, "-o", out],
              env_extra=AS_H100)
    assert r.returncode == 0, r.stderr[-2000:]
    check_progress_figures(r.stdout, out, ranks=1, steps=6)
    steps = losses(r.stdout)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and all(np.isfinite(list(steps.values())))
    assert steps[6] < steps[1], steps
    assert len(re.findall(r"^val loss \d+\.\d+$", r.stdout, re.M)) >= 2
    # two samples (steps 3 and 6), each of -g 8 tokens: the <|endoftext|> prompt and 7 drawn (token ids: no tokenizer here)
    samples = re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)
    assert len(samples) == 2 and all(len(s.split()) == 7 for s in samples), samples
    # main.log numbers its lines as llm.c does: s:k trl is the loss of the update after k updates, like s:k tel;
    # val at every -v 4 steps and at the end (step 6); HellaSwag at the val steps after step 0 and at the end
    log = open(out / "main.log").read().splitlines()
    train_steps = [int(m.group(1)) for m in (re.fullmatch(r"s:(\d+) trl:\d+\.\d+ lr:\S+ norm:\S+", l) for l in log) if m]
    assert train_steps == [0, 1, 2, 3, 4, 5], log
    assert [l.split()[0] for l in log if " tel:" in l] == ["s:0", "s:4", "s:6"], log
    eval_lines = [line for line in log if re.fullmatch(r"s:\d+ eval:[\d.]+", line)]
    assert [l.split()[0] for l in eval_lines] == ["s:4", "s:6"], log
    assert all(0.0 <= float(line.split("eval:")[1]) <= 1.0 for line in eval_lines), log
    hellaswag = re.findall(r"^HellaSwag: (\d+)/(\d+) = ([\d.]+)$", r.stdout, re.M)  # llm.c's line
    assert len(hellaswag) == 2 and all(int(t) == 8 and abs(int(c) / 8 - float(a)) < 1e-6 for c, t, a in hellaswag), hellaswag
    events = [json.loads(line) for line in open(out / "main.jsonl")]
    assert [e["step"] for e in events if e["type"] == "train"] == [0, 1, 2, 3, 4, 5]  # main.log's numbering
    for step in (3, 6):
        assert (out / f"DONE_{step:08d}").exists() and (out / f"model_{step:08d}.bin").exists()
    if "fp8" in flags:
        rows = [json.loads(line) for line in open(out / "numerics.jsonl")]
        tensors = {row["tensor"] for row in rows}
        # -fn 2 over 6 steps: the progress line's count (README), one more than main.jsonl's step of the same update
        assert sorted({row["step"] for row in rows}) == [2, 4, 6], sorted({row["step"] for row in rows})
        for layer in range(sim_model.LAYERS):  # x, W and dy of every block linear
            for linear in ("qkv", "attproj", "fc", "fcproj"):
                for operand in ("x", "w", "dy"):
                    assert f"L{layer}.{linear}.{operand}" in tensors, sorted(tensors)
        assert all(row["amax"] > 0 and row["scale"] > 0 and 0 <= row["frac_saturated"] <= 1 and
                   0 <= row["frac_flushed"] <= 1 and row["nonfinite"] == 0 for row in rows), rows
        # every cast counts whole tensors: B*T*K codes of a linear's x, K*OC of its W, B*T*OC of its dy (-b 4 -t 64)
        c = sim_model.CHANNELS
        shapes = {"qkv": (c, 3 * c), "attproj": (c, c), "fc": (c, 4 * c), "fcproj": (4 * c, c)}
        for row in rows:
            if row["linear"] not in shapes:
                continue
            k, oc = shapes[row["linear"]]
            whole = {"x": 4 * 64 * k, "w": k * oc, "dy": 4 * 64 * oc}[row["operand"]]
            assert row["elements"] > 0 and row["elements"] % whole == 0, (row, whole)
        # the weights are cast with the scale of their own amax (-fw current): none saturates, and the gradients'
        # E5M2 codes flush some of dy's smallest values
        assert all(row["frac_saturated"] == 0 for row in rows if row["operand"] == "w"), rows
        assert any(row["frac_flushed"] > 0 for row in rows if row["operand"] == "dy"), rows
        # each row names its codes' format (E5M2 output gradients, E4M3 activations and weights); a current-scaled
        # cast (the weights, the output gradients: -fg current) maps its amax to the format's largest value, so the
        # interval's largest amax times its smallest scale is that value, and nothing saturates
        for row in rows:
            assert row["format"] == ("e5m2" if row["operand"] == "dy" else "e4m3"), row
            if row["operand"] != "x":
                largest = 57344.0 if row["operand"] == "dy" else 448.0
                assert abs(row["amax"] * row["scale"] / largest - 1) < 1e-6 and row["amax"] < 1 < row["scale"], row
                assert row["frac_saturated"] == 0, row


def test_eta_of_a_long_run_follows_the_moving_average(workdir):
    """The ETA of a run of 100000 steps (stopped after its fourth): the steps left times the moving average of the step
    times after the first, so at this many steps left a millisecond of the average moves it by over a minute, and
    the first step's time (one-time setup) or the last step's alone in its place shows"""
    out = workdir / "long_eta"
    cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 100000, "-v", 0,
           "-s", 0, "-o", out]
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir,
                            env=dict(os.environ, **AS_H100))
    stdout = ""
    try:
        for line in proc.stdout:
            stdout += line
            if line.startswith("step     4/"):
                break
    finally:
        proc.kill()
        proc.communicate()
    check_progress_figures(stdout, out, ranks=1, steps=3, first_only=True)


def test_gc_0_trains_unclipped(workdir):
    """-gc 0 is no clipping: its updates are those of a bound no norm reaches (-gc 1e6), bit for bit, and not those of
    the default -gc 1, which the sim model's first norms pass"""
    runs = {}
    for clip in (0, 1e6, 1):
        r = train(workdir, ["-x", 2, "-l", 3e-3, "-v", 0, "-s", 0, "-j", "", "-gc", clip])
        assert r.returncode == 0, r.stderr[-2000:]
        runs[clip] = losses(r.stdout)
    assert "tokenizer" not in r.stdout, r.stdout[:2000]  # -s 0: no sample, no tokenizer looked for
    norm = float(re.search(r"^step +1/2 \| loss \S+ \| norm ([\d.]+)", r.stdout, re.M).group(1))
    assert norm > 1, r.stdout[-2000:]
    assert runs[0] == runs[1e6] and runs[0][2] != runs[1][2], runs


def test_cpu_trainer_resuming_a_gpu_fp8_checkpoint_says_which_trainer_resumes_it(workdir, tmp_path):
    """an FP8 checkpoint holds its trainer's scaling state (the GPU's fp8_ sections, the CPU's fp8emu_ ones): the CPU
    trainer given the GPU's, with the same -p fp8, stops in one line that says to resume it on the trainer that wrote
    it, not that -p differs"""
    out = tmp_path / "gpu_fp8"
    r = train(workdir, ["-p", "fp8", "-x", 1, "-n", 1, "-o", out, "-v", 0, "-s", 0, "-j", ""])
    assert r.returncode == 0, r.stderr[-2000:]
    cpu = subprocess.run([os.path.join(ROOT, "train_gpt2cpu"), "-p", "fp8", "-e", "model.bin", "-i", "s_train_*.bin",
                          "-j", "", "-t", "64", "-b", "4", "-x", "2", "-n", "1", "-o", str(out), "-y", "1", "-v", "0"],
                         capture_output=True, text=True, timeout=300, cwd=workdir)
    lines = [l for l in cpu.stderr.splitlines() if l.strip()]
    assert cpu.returncode != 0 and len(lines) == 1, cpu.stderr[-2000:]
    assert "has a section 'fp8_settings' this run does not keep" in lines[0], lines[0]
    assert "on the trainer that wrote it" in lines[0], lines[0]


def test_fp8_flags_in_a_bf16_run_are_noted(workdir):
    """the GPU trainer notes FP8 flags that a run without -p fp8 ignores, as the CPU trainer does"""
    r = train(workdir, ["-x", 1, "-v", 0, "-s", 0, "-j", "", "-fg", "delayed"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'note: -fg "delayed": FP8 flags, and this run has -p bf16: they change nothing' in r.stdout, r.stdout[:2000]


def test_fp8_tuning_the_recipe_does_not_read_is_noted(workdir):
    """the GPU trainer notes -fh and -fm where the FP8 recipe reads neither, as the CPU trainer does (its cases are
    test_trainer_cli's)"""
    r = train(workdir, ["-p", "fp8", "-fr", "block", "-fm", 3, "-x", 1, "-v", 0, "-s", 0, "-j", ""])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: -fm 3: the margin divides per-tensor scales, and -fr block scales each tile and block by its own " \
           "amax: it changes nothing" in r.stdout, r.stdout[:2000]
    assert "note: -fh" not in r.stdout, r.stdout[:2000]


def test_a_schedule_with_nothing_to_decay_to_is_noted(workdir):
    """-q 1, llm.c's default, makes every decaying schedule constant after the warmup: the GPU trainer says so once
    (the CPU trainer's note is test_trainer_cli's), and not where -q leaves room or the schedule is constant"""
    note = "note: -q 1 (the default, as in llm.c): -k cosine decays to the peak rate -l itself"
    base = ["-x", 1, "-v", 0, "-s", 0, "-j", ""]
    r = train(workdir, base)
    assert r.returncode == 0 and r.stdout.count(note) == 1, (r.stdout[:2000], r.stderr[-2000:])
    for flags in (["-q", 0.1], ["-k", "constant"]):
        r = train(workdir, base + flags)
        assert r.returncode == 0 and "note: -q" not in r.stdout, (flags, r.stdout[:2000], r.stderr[-2000:])


@pytest.mark.parametrize("flags", [["-p", "bf16"], ["-p", "fp8", "-opt", "adamw8", "-fw", "delayed", "-fg", "delayed"],
                                   ["-p", "fp8", "-f8", "all", "-fw", "delayed", "-w", "0"]],
                         ids=["bf16", "fp8-delayed-weights-gradients-adamw8", "fp8-lm_head-delayed-weights-no-master"])
def test_resume_is_bitwise(workdir, flags):
    """a run checkpointed at step 3 and resumed gives steps 4..6 the straight run's losses bit for bit; under -fw
    delayed the resume rebuilds the weights' codes with the saved scale, from the fp32 master or (-w 0) from the
    bf16 weights (and lm_head's, current-scaled from the bf16 wte, are checked against their saved records).
    Resumed once more, at the run's end, it notes that nothing is left to train"""
    out = workdir / ("resume_" + "_".join(str(f) for f in flags))
    common = flags + ["-x", 6, "-l", 3e-3, "-v", 0, "-s", 0, "-n", 3, "-o", out]
    straight = train(workdir, common)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert re.search(r"^wrote checkpoint \S+/model_00000003\.bin \(\+ 1 state file, DONE\)$", straight.stdout, re.M), \
        straight.stdout[-2000:]
    os.remove(out / "DONE_00000006")
    resumed = train(workdir, common + ["-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = losses(straight.stdout), losses(resumed.stdout)
    assert sorted(b) == [4, 5, 6]
    assert all(a[s] == b[s] for s in (4, 5, 6)), (a, b)
    # resumed at the run's end: a note, and no step; -e names a model of another shape, which the resume does not
    # use (the checkpoint's is), and a note says so
    again = train(workdir, common + ["-y", 1, "-e", "model_c192.bin"])
    assert again.returncode == 0 and not losses(again.stdout), again.stdout[-2000:]
    assert "resumed at step 6, and the run has 6 steps (-x): nothing left to train" in again.stdout, again.stdout[-2000:]
    assert re.search(r"^note: -y 1 resumes \S+model_00000006\.bin \(L=2 NH=2 C=128\); -e model_c192\.bin \(L=1 NH=3 "
                     r"C=192\) is not used$", again.stdout, re.M), again.stdout[:2000]
    assert "is not used" not in resumed.stdout, resumed.stdout[:2000]  # -e the checkpoint's shape: no note


def test_block_resume_takes_other_idle_tuning(workdir):
    """-fh and -fm, which -fr block reads neither of (a note says so), are held at their defaults: a checkpoint of
    a block run given them resumes without them, its steps the straight run's bit for bit, and the startup line
    shows neither"""
    out = workdir / "block_idle_tuning"
    common = ["-p", "fp8", "-fr", "block", "-x", 4, "-l", 3e-3, "-v", 0, "-s", 0, "-n", 2, "-o", out]
    straight = train(workdir, common + ["-fh", 4, "-fm", 2])
    assert straight.returncode == 0, straight.stderr[-2000:]
    # the startup line shows neither held value (fp8_tuning_text)
    assert re.search(r"^fp8 \| recipe block \(weights 128x128 blocks, gradients 1x128 tiles\) \| passes ", straight.stdout,
                     re.M), straight.stdout[:3000]
    os.remove(out / "DONE_00000004")
    resumed = train(workdir, common + ["-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = losses(straight.stdout), losses(resumed.stdout)
    assert sorted(b) == [3, 4] and all(a[s] == b[s] for s in (3, 4)), (a, b)


@pytest.mark.parametrize("changed,expected", [
    (["-fr", "current"], ["other FP8 settings: -fr delayed \\(this run: current\\): resume with the same -fr$"]),
    (["-f8p", "fwd"], ["other FP8 settings: FP8 passes qkv=fwd,dgrad,wgrad attproj=fwd,dgrad,wgrad fc=fwd,dgrad,wgrad "
                       "fcproj=fwd,dgrad,wgrad \\(this run: qkv=fwd attproj=fwd fc=fwd fcproj=fwd\\): resume with the same "
                       "-f8 -f8p$"]),
    (["-fh", "8", "-fm", "1"], ["other FP8 settings: -fh 16 \\(this run: 8\\), -fm 0 \\(this run: 1\\): resume with the "
                                "same -fh -fm$"]),
    (["-fw", "delayed"], ["other FP8 settings: -fw current \\(this run: delayed\\): resume with the same -fw$"]),
    (["-fg", "delayed"], ["other FP8 settings: -fg current \\(this run: delayed\\): resume with the same -fg$"]),
    (["-fg", "pow2"], ["other FP8 settings: -fg current \\(this run: pow2\\): resume with the same -fg$"]),
    (["-f8", "all"], ["section 'fp8_scaling' is", "other FP8 linears or passes\\? resume with the same -f8 and -f8p"]),
    (["-p", "bf16"], ["has a section 'fp8_settings' this run does not keep", "written by a -p fp8 run\\?"]),
], ids=["-fr", "-f8p", "-fh-fm", "-fw", "-fg", "-fg-pow2", "-f8", "-p"])
def test_resume_with_other_fp8_settings_is_refused(workdir, changed, expected):
    """a checkpoint of the default FP8 run resumed with another recipe, other FP8 passes, another history or
    margin, or the weights' or gradients' scaling changed: one error line naming only the flags that differ, each
    with the state file's value and this run's (expected: regular expressions)"""
    out = workdir / "fp8_settings_checkpoint"
    if not (out / "DONE_00000001").exists():
        r = train(workdir, ["-p", "fp8", "-x", 1, "-v", 0, "-s", 0, "-n", 1, "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
    r = train(workdir, ["-p", "fp8", "-x", 2, "-v", 0, "-s", 0, "-n", 1, "-o", out, "-y", 1] + changed)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(re.search(e, errors[0]) for e in expected), r.stderr[-2000:]
    assert not (out / "DONE_00000002").exists()


def test_resume_of_a_bf16_run_in_fp8_is_refused(workdir):
    """a bf16 checkpoint holds no FP8 scaling state: resumed with -p fp8, one line saying it was a bf16 run's"""
    out = workdir / "bf16_checkpoint_for_fp8"
    r = train(workdir, ["-p", "bf16", "-x", 1, "-v", 0, "-s", 0, "-n", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    r = train(workdir, ["-p", "fp8", "-x", 2, "-v", 0, "-s", 0, "-n", 1, "-o", out, "-y", 1])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr[-2000:]
    assert "has no section 'fp8_" in errors[0] and "written by a -p bf16 run? resume with -p bf16" in errors[0], errors


def quartered_scale(pair):
    """a record's scale_inv and scale (8 bytes) made 4/s and s/4: still each other's inverse, exactly"""
    scale_inv, scale = struct.unpack("<ff", pair)
    return struct.pack("<ff", scale_inv * 4, scale / 4)


# (section, tensor group, field, the field's new bytes from its old, what the error says): the x state of linear 0
# with its ring position past its history (the next update would write past the ring on the GPU); qkv's weight
# record with a NaN scale_inv (the GEMMs' dequantization scale until the next update, which never comes: every step
# would be skipped), a subnormal scale beside its inverse +Inf (the same failure), a NaN pending amax (folded into the
# next weight scale) or one with the sign bit set (it would outrank every real amax, NaN included, in the unsigned
# atomicMax of the fold), or its scale and inverse quartered together (the codes the restored weights cast to would
# be read 4x too large: the loss changed)
FP8_STATE_CORRUPTIONS = {
    "state_position": ("fp8_scaling", "x", "position", lambda old: struct.pack("<i", 5000),
                       "FP8 scaling state of x of linear 0 (qkv) is corrupt: its ring position lies outside its history"),
    "record_scale_inv": ("fp8_records", "w", "scale_inv", lambda old: struct.pack("<f", float("nan")),
                         "FP8 cast record of w of linear 0 (qkv) is corrupt: its scale is not a positive normal float"),
    "record_scale_subnormal": ("fp8_records", "w", "scale_inv", lambda old: struct.pack("<ff", float("inf"), 1e-40),
                               "FP8 cast record of w of linear 0 (qkv) is corrupt: its scale is not a positive normal float"),
    "record_amax": ("fp8_records", "w", "amax_bits", lambda old: struct.pack("<I", 0x7fc00000),
                    "FP8 cast record of w of linear 0 (qkv) is corrupt: its pending amax is not a finite amax"),
    "record_amax_negative": ("fp8_records", "w", "amax_bits", lambda old: struct.pack("<I", 0x80000001),
                             "FP8 cast record of w of linear 0 (qkv) is corrupt: its pending amax is not a finite amax"),
    "record_scale_pair": ("fp8_records", "w", "scale_inv", quartered_scale,
                          "FP8 weight of linear 0 (qkv) was cast with scale"),
}


@pytest.mark.parametrize("corruption", sorted(FP8_STATE_CORRUPTIONS))
def test_resume_from_a_corrupt_fp8_state_is_refused(workdir, corruption):
    """a state file's FP8 scaling state or cast record that no run writes: one line names the file and the tensor,
    and the run stops before its first step"""
    section, group, field, patch, message = FP8_STATE_CORRUPTIONS[corruption]
    out = workdir / f"fp8_corrupt_{corruption}"
    r = train(workdir, ["-p", "fp8", "-x", 1, "-v", 0, "-s", 0, "-n", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    state = out / "state_00000001_00000.bin"
    blob = state.read_bytes()
    if section == "fp8_scaling":
        offset = sim_model.SCALING_FIELD_OFFSETS[field]
    else:  # 3 n records: x, dy, then w of each linear
        linears = len(sim_model.state_section(state, section)) // sim_model.RECORD_BYTES // 3
        offset = ("x", "dy", "w").index(group) * linears * sim_model.RECORD_BYTES + sim_model.RECORD_FIELD_OFFSETS[field]
    at = blob.index(section.encode() + b"\0") + 24 + offset  # after the tag and size
    value = patch(blob[at:at + 8])
    state.write_bytes(blob[:at] + value + blob[at + len(value):])
    r = train(workdir, ["-p", "fp8", "-x", 2, "-v", 0, "-s", 0, "-n", 1, "-o", out, "-y", 1])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr[-2000:]
    assert "state_00000001_00000.bin" in errors[0] and message in errors[0], errors
    assert not losses(r.stdout), r.stdout[-2000:]


def test_gradient_scalings_are_honoured(workdir):
    """-fg delayed: the first backward seeds each dy history with the current path (the same first step),
    then the one-pass cast with the history's scale trains other bits than -fg current. -fg pow2: the first
    backward takes the current path with power-of-two scales, which already changes the first update (the loss
    of step 1 is the same), then the one pass with the predicted scale"""
    runs = {}
    for grads in ("current", "delayed", "pow2"):
        out = workdir / f"grads_{grads}"
        r = train(workdir, ["-p", "fp8", "-fg", grads, "-x", 3, "-v", 0, "-s", 0, "-n", 3, "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"gradients {grads}, history 16, margin 0)" in r.stdout, r.stdout[:2000]
        runs[grads] = (losses(r.stdout), open(out / "model_00000003.bin", "rb").read(), r.stdout)
    assert runs["current"][0][1] == runs["delayed"][0][1] == runs["pow2"][0][1]
    assert runs["current"][1] != runs["delayed"][1], "-fg delayed trained like -fg current"
    assert runs["current"][1] != runs["pow2"][1], "-fg pow2 trained like -fg current"
    assert runs["current"][0][2] != runs["pow2"][0][2], "-fg pow2's first update was -fg current's"
    # steps 2 and 3 predict fc's and qkv's dy scales in every layer: a line says how many held
    predicted = re.findall(r"-fg pow2: (\d+) output gradients cast with a predicted scale, (\d+) cast again", runs["pow2"][2])
    layers = int(re.search(r"\bL=(\d+) ", runs["pow2"][2]).group(1))
    assert predicted and int(predicted[0][0]) == 2 * 2 * layers and int(predicted[0][1]) <= int(predicted[0][0]), predicted


SCALING_RECORDED = sim_model.SCALING_FIELD_OFFSETS["position"] + 4  # Fp8TensorScaling.recorded, after position


def test_delayed_scalings_take_the_current_path_in_the_first_step_only(workdir):
    """-fr delayed's activations and -fg delayed's output gradients are seeded by the first step's current-scaled
    casts: step 1's model is -fr current -fg current's bit for bit, and from step 2 on each delayed choice trains other
    bits (the histories' scales). Each state takes one update per use in every recipe"""
    models = {}
    for name, flags in (("current", ["-fr", "current"]), ("delayed x", ["-fr", "delayed"]),
                        ("delayed x and dy", ["-fr", "delayed", "-fg", "delayed"])):
        out = workdir / ("seeding_" + name.replace(" ", "_"))
        r = train(workdir, ["-p", "fp8", "-x", 2, "-l", 3e-3, "-v", 0, "-s", 0, "-n", 1, "-o", out] + flags)
        assert r.returncode == 0, r.stderr[-2000:]
        models[name] = [open(out / f"model_{step:08d}.bin", "rb").read() for step in (1, 2)]
        # one update of each activation's and output gradient's state per use (a step here), seeding included
        states = state_section(out / "state_00000002_00000.bin", "fp8_scaling")
        n = len(states) // sim_model.SCALING_BYTES // 3
        recorded = [struct.unpack_from("<i", states, t * sim_model.SCALING_BYTES + SCALING_RECORDED)[0]
                    for t in range(2 * n)]
        assert recorded == [2] * (2 * n), (name, recorded)
    assert models["current"][0] == models["delayed x"][0] == models["delayed x and dy"][0], "a delayed first step"
    assert models["current"][1] != models["delayed x"][1], "-fr delayed's second step took the current path"
    assert models["delayed x"][1] != models["delayed x and dy"][1], "-fg delayed's second step took the current path"


def test_fp8_passes_per_linear_resume_bitwise_whatever_the_evaluation(workdir):
    """each linear with its own FP8 passes (test_gpt2's fp8_settings_per_linear: qkv the forward alone, attproj both
    backward GEMMs, fc the dgrad alone, fcproj the wgrad alone, lm_head forward and dgrad), -fg delayed: a run
    checkpointed at step 2 and resumed with -r 2 and val loss, HellaSwag and samples at every step trains steps 3 and 4
    as the straight run without any (and -r 0), bit for bit, and appends the straight run's numerics rows of those
    steps (evaluation puts the scaling and records back; the resume finds every cast tensor's state seeded, a tensor
    cast for one pass only included); no step is skipped (every cast a GEMM reads was written)"""
    out = workdir / "passes_per_linear"
    common = ["-p", "fp8", "-f8", "all", "-fg", "delayed", "-x", 4, "-l", 3e-3, "-n", 2, "-fn", 1, "-o", out,
              "-f8p", "qkv.fwd,attproj.dgrad,attproj.wgrad,fc.dgrad,fcproj.wgrad,lm_head.fwd,lm_head.dgrad"]
    straight = train(workdir, common + ["-v", 0, "-s", 0])
    assert straight.returncode == 0, straight.stderr[-2000:]
    a = losses(straight.stdout)
    assert sorted(a) == [1, 2, 3, 4] and all(np.isfinite(list(a.values()))), a
    os.remove(out / "DONE_00000004")
    log = (out / "numerics.jsonl").read_text()
    resumed = train(workdir, common + ["-v", 1, "-s", 1, "-g", 4, "-h", 1, "-r", 2, "-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.findall(r"^val loss \d+\.\d+$", resumed.stdout, re.M), resumed.stdout[-2000:]
    b = losses(resumed.stdout)
    assert sorted(b) == [3, 4] and all(a[s] == b[s] for s in (3, 4)), (a, b)
    # every cast a GEMM reads was written: no NaN code (cudasim's fresh 0xff bytes) made a gradient non-finite
    assert "update skipped" not in straight.stdout + resumed.stdout, straight.stdout[-2000:]
    # the numerics log goes on after the resume's first step with steps 3 and 4's rows as the straight run wrote them
    later = "".join(line for line in log.splitlines(keepends=True) if json.loads(line)["step"] > 2)
    assert later and (out / "numerics.jsonl").read_text() == log + later


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_gelu_backward_in_the_dgrad_epilogue(workdir, precision):
    """-ge 2 (llm.c's flag): fcproj's dgrad GEMM multiplies by GELU's derivative (DGELU) instead of a pass over fc's
    output gradient; the first forward is -ge 1's, and the losses after it track -ge 1's within 1% on other bits"""
    runs = {}
    for gelu_fusion in (1, 2):
        out = workdir / f"gelu_fusion_{precision}_{gelu_fusion}"
        r = train(workdir, ["-p", precision, "-ge", gelu_fusion, "-x", 3, "-v", 0, "-s", 0, "-n", 3, "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"gelu fusion {gelu_fusion}" in r.stdout, r.stdout[:2000]
        runs[gelu_fusion] = (losses(r.stdout), open(out / "model_00000003.bin", "rb").read())
    assert runs[1][0][1] == runs[2][0][1]
    assert all(abs(runs[2][0][s] - runs[1][0][s]) <= 0.01 * abs(runs[1][0][s]) for s in (2, 3)), runs
    assert runs[1][1] != runs[2][1], "-ge 2 trained like -ge 1"


def test_fc_gemm_writes_gelu_codes(workdir):
    """-fe 1 (-fr delayed, -r 0): once the activations' scales come from their histories (step 2 on), fc's forward GEMM
    writes fcproj's E4M3 x codes through cuBLASLt's GELU epilogue (cudasim's: GELU of the fp32 pre-activation, rounded
    once into the code) and a byte transpose makes x^T: step 1 is -fe 0's bit for bit, the losses after it track -fe 0's
    within 1% on other bits, and the kernel breakdown names the GEMM and the transpose where -fe 0 names the GELU cast.
    The numerics log keeps fcproj's x rows: every element counted, step 2's scale that of -fe 0 (the same step 1), its
    amax within 2% (GELU of the unrounded pre-activation). A checkpoint at step 2 resumed with -y 1 trains steps 3 and 4
    bit for bit."""
    runs = {}
    for fe in (0, 1):
        out = workdir / f"fc_codes_{fe}"
        r = train(workdir, ["-p", "fp8", "-fe", fe, "-r", 0, "-x", 4, "-v", 0, "-s", 0, "-n", 2, "-fn", 1, "-kt", 1,
                            "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [json.loads(line) for line in open(out / "numerics.jsonl")]
        runs[fe] = (losses(r.stdout), r.stdout, {(row["step"], row["layer"]): row for row in rows
                                                  if row["linear"] == "fcproj" and row["operand"] == "x"})
    assert sorted(runs[1][0]) == [1, 2, 3, 4] and runs[1][0][1] == runs[0][0][1], runs
    assert all(abs(runs[1][0][s] - runs[0][0][s]) <= 0.01 * abs(runs[0][0][s]) for s in (2, 3, 4)), runs
    assert runs[1][0][4] != runs[0][0][4], "-fe 1 trained like -fe 0"
    assert "matmul fc+gelu fp8 codes fwd" in runs[1][1] and "fp8 transpose gelu out" in runs[1][1], runs[1][1][-3000:]
    assert "| fcproj's x codes from fc's GEMM (-fe 1) |" in runs[1][1] and "(-fe 1)" not in runs[0][1], runs[1][1][:3000]
    assert "matmul fc+gelu fp8 codes fwd" not in runs[0][1] and "gelu+fp8 cast fwd" in runs[0][1], runs[0][1][-3000:]
    fused, unfused = runs[1][2], runs[0][2]
    assert sorted(fused) == sorted(unfused) and len(fused) == 4 * sim_model.LAYERS, sorted(fused)
    for key, row in fused.items():
        assert row["elements"] == 4 * 64 * 4 * sim_model.CHANNELS and row["nonfinite"] == 0, row
        assert 0 <= row["frac_saturated"] <= 1 and 0 <= row["frac_flushed"] < 0.01, row
        if key[0] == 2:
            assert row["scale"] == unfused[key]["scale"], (row, unfused[key])
            assert abs(row["amax"] - unfused[key]["amax"]) <= 0.02 * unfused[key]["amax"], (row, unfused[key])
    out = workdir / "fc_codes_1"
    os.remove(out / "DONE_00000004")
    resumed = train(workdir, ["-p", "fp8", "-fe", 1, "-r", 0, "-x", 4, "-v", 0, "-s", 0, "-n", 2, "-fn", 1, "-o", out,
                              "-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    b = losses(resumed.stdout)
    assert sorted(b) == [3, 4] and all(b[s] == runs[1][0][s] for s in (3, 4)), (b, runs[1][0])


def test_overfit_single_batch_reuses_the_first_batch_and_resumes(workdir):
    """-a 1, as llm.c: every micro-step of every step trains on the first batch (with -d 2 B T, step 1's loss and
    gradient norm are the -d B T run's: the micro-steps' gradients are averaged, not summed); a resumed run takes that
    batch again, not an unfilled one, and goes on bit for bit"""
    flags = ["-a", 1, "-v", 0, "-s", 2, "-g", 5, "-l", 1e-3, "-k", "constant"]
    runs, norms = {}, {}
    for name, extra in (("one", ["-d", 256, "-x", 1]), ("straight", ["-d", 512, "-x", 4, "-n", 4])):
        r = train(workdir, flags + extra + ["-o", workdir / f"overfit_{name}"])
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = losses(r.stdout)
        norms[name] = float(re.search(r"^step +1/\d+ \| loss \S+ \| norm (\S+) ", r.stdout, re.M)[1])
    samples = re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)  # the straight run's, at steps 2 and 4
    assert len(samples) == 2, r.stdout[-3000:]
    assert abs(runs["one"][1] - runs["straight"][1]) <= 1e-6 * runs["one"][1], runs
    assert abs(norms["one"] - norms["straight"]) <= 1e-3 * norms["one"], norms
    assert runs["straight"][4] < runs["straight"][1], runs
    split = workdir / "overfit_split"
    for steps, resume in ((2, 0), (4, 1)):
        r = train(workdir, flags + ["-d", 512, "-x", steps, "-n", 2, "-y", resume, "-o", split])
        assert r.returncode == 0, r.stderr[-2000:]
    assert losses(r.stdout) == {3: runs["straight"][3], 4: runs["straight"][4]}, r.stdout[-2000:]
    assert (split / "model_00000004.bin").read_bytes() == (workdir / "overfit_straight" / "model_00000004.bin").read_bytes()
    # each sample draws from a generator seeded afresh: the resumed run's step-4 sample is the uninterrupted run's
    assert samples[-1] == re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)[-1]


def test_nonfinite_steps_are_skipped_and_never_reach_the_weights(workdir):
    out = workdir / "overflow"
    sim_model.write_model(workdir / "overflow.bin", first_qkv_weight=3e38)  # every forward overflows
    r = train(workdir, ["-p", "fp8", "-x", 3, "-v", 0, "-s", 0, "-n", 3, "-o", out], model="overflow.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "update skipped" in r.stdout, r.stdout[-2000:]
    skipped = re.search(r"^(\d+) updates were skipped: (\d+) for a non-finite loss or gradient norm, 0 for a loss outlier",
                        r.stdout, re.M)
    assert skipped and int(skipped.group(1)) == 3 and int(skipped.group(2)) == 3, r.stdout[-2000:]
    with open(out / "model_00000003.bin", "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240326 and header[1] == 5  # bf16 weights
        bits = np.frombuffer(f.read(), dtype=np.uint16)
    assert not np.any((bits & 0x7F80) == 0x7F80), "Inf or NaN reached the weights"
    # no step happened: the weights are the input's, rounded to bf16 (nearest even), the master is the input's
    # fp32 bit for bit, and AdamW's moments are still zero
    start = np.fromfile(workdir / "overflow.bin", dtype=np.float32, offset=1024)
    start_bits = start.view(np.uint32)
    rounded = ((start_bits + 0x7FFF + ((start_bits >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(bits, rounded), f"{np.count_nonzero(bits != rounded)} weights changed in skipped steps"
    n = start.size
    body = np.fromfile(out / "state_00000003_00000.bin", dtype=np.float32, offset=1024, count=3 * n)
    m, v, master = body[:n], body[n:2 * n], body[2 * n:]
    assert not np.any(m) and not np.any(v), "skipped steps changed AdamW's moments"
    assert np.array_equal(master.view(np.uint32), start_bits), "skipped steps changed the fp32 master weights"
    # resumed, the count of skipped updates goes on from the checkpoint's (a state section): the whole run's
    r = train(workdir, ["-p", "fp8", "-x", 4, "-v", 0, "-s", 0, "-n", 4, "-o", out, "-y", 1], model="overflow.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "update skipped (4 so far)" in r.stdout, r.stdout[-2000:]
    assert re.search(r"^4 updates were skipped: 4 for a non-finite", r.stdout, re.M), r.stdout[-2000:]


def test_resume_after_a_skipped_first_step_seeds_like_the_running_trainer(tmp_path):
    """step 1 overflows (a token only the first batch holds meets a huge qkv weight: 5e37 times its ln1 of 10.75
    exceeds fp32, the other rows', below 2.7 in the first 3 batches, do not) and is skipped (main.jsonl: its loss null
    and "skipped" 1, as each step's flag follows its step line), step 2's loss is finite; -fg delayed. The skipped
    step's scaling is rolled back, so step 2 seeds its delayed scales again: a run resumed from the checkpoint of
    step 1 must too (it counted the non-finite use as seeding and cast dy with the initial scale 1: step 3's loss
    differed)"""
    token = 7
    sim_model.write_model(tmp_path / "model.bin", first_qkv_weight=5e37)
    blob = bytearray((tmp_path / "model.bin").read_bytes())
    struct.pack_into("<f", blob, 1024 + token * sim_model.CHANNELS * 4, 1.0)  # wte[token][0]: overflows qkv
    (tmp_path / "model.bin").write_bytes(bytes(blob))
    tokens = (np.cumsum(np.random.default_rng(1).integers(1, 3, size=60000)) % 64 + 100).astype(np.uint16)
    tokens[10] = token  # in the first batch only
    for name, part in (("s_train_000001.bin", tokens), ("s_val_000000.bin", tokens[1000:6000])):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = [20240520, 1, len(part)]
        (tmp_path / name).write_bytes(header.tobytes() + part.tobytes())
    common = ["-p", "fp8", "-fg", "delayed", "-x", 4, "-l", 1e-3, "-v", 0, "-s", 0, "-sh", 0, "-n", 1, "-o", tmp_path / "out"]
    straight = train(tmp_path, common)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert "step 1: non-finite loss" in straight.stdout and np.isfinite(losses(straight.stdout)[2]), straight.stdout[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "out" / "main.jsonl") if '"type":"train"' in line]
    marked = {int(step) for step in re.findall(r"^step +(\d+)/\d+ .*\| SKIPPED$", straight.stdout, re.M)}
    assert [rec["skipped"] for rec in records] == [int(rec["step"] + 1 in marked) for rec in records], records
    assert records[0]["loss"] is None and records[1]["skipped"] == 0 and records[1]["loss"] is not None, records
    for step in (2, 3, 4):
        (tmp_path / "out" / f"DONE_{step:08d}").unlink()
    resumed = train(tmp_path, common + ["-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected = {step: loss for step, loss in losses(straight.stdout).items() if step > 1}
    assert losses(resumed.stdout) == expected, (losses(straight.stdout), losses(resumed.stdout))


def test_printed_memory_figures_match_the_allocations(workdir):
    """issue 4's memory figures: the persistent bytes per parameter the trainer prints at startup (16 for AdamW with fp32
    master weights, 12 without, adamw8's less; DESIGN.md section 4) account for the device memory each run allocates.
    Between AdamW with master weights and each of the other three, the most device memory allocated at once
    (CUDASIM_MEMORY_REPORT: every cudaMalloc, rounded to 256 bytes) differs by the printed figures' difference times
    the parameter count, within the printing's 3 decimals and 0.5% (adamw8's per-tensor padding of its codes). The
    line names what it counts: the fp32 master but with -w 0, 8-bit m+v with adamw8"""
    measured = {}
    for name, flags in (("adamw", []), ("adamw8", ["-opt", "adamw8"]), ("adamw -w 0", ["-w", "0"]),
                        ("adamw8 -w 0", ["-opt", "adamw8", "-w", "0"])):
        cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0]
        r = subprocess.run([str(c) for c in cmd + flags], capture_output=True, text=True, timeout=300, cwd=workdir,
                           env=dict(os.environ, CUDASIM_MEMORY_REPORT="1"))
        assert r.returncode == 0, r.stderr[-2000:]
        persistent = float(re.search(r"^memory \| persistent ([\d.]+) bytes/parameter", r.stdout, re.M).group(1))
        what = re.search(r"^memory \| .* on one GPU \((bf16 weights\+grads(, fp32 master)?, (8-bit|fp32) m\+v)", r.stdout,
                         re.M)
        assert what and (what.group(2) is None) == ("-w" in flags) and (what.group(3) == "8-bit") == ("adamw8" in flags), \
            (name, what and what.group(1))
        assert "on this rank" not in r.stdout, r.stdout[:2000]  # one GPU holds the whole optimizer state
        parameters = int(re.search(r"^model \|.*\| (\d+) parameters", r.stdout, re.M).group(1))
        peak = int(re.search(r"cudasim: at most (\d+) bytes of device memory allocated at once", r.stderr).group(1))
        measured[name] = (persistent, parameters, peak)
    base_persistent, parameters, base_peak = measured["adamw"]
    assert base_persistent == 16.0 and measured["adamw -w 0"][0] == 12.0, measured
    for name, (persistent, _, peak) in measured.items():
        expected = (base_persistent - persistent) * parameters
        assert abs((base_peak - peak) - expected) <= 0.001 * parameters + 0.005 * abs(expected), (name, base_peak - peak, expected)


@pytest.mark.parametrize("flags", [["-fr", "delayed"], ["-fr", "current", "-ge", "2"], ["-fr", "block", "-f8", "all"],
                                   ["-fr", "delayed", "-f8p", "fwd,fc.wgrad,fcproj.wgrad"]],
                         ids=["delayed", "current-ge2", "block-lm_head", "delayed-wgrad-alone"])
def test_fp8_recompute_changes_memory_not_results(workdir, flags):
    """-r in FP8: the wgrads' x^T codes are not kept from the forward but cast again in the backward (fcproj's from
    -r 1, qkv's, attproj's and fc's from -r 2) as replays of the forward's casts: the same losses, model and state
    files and numerics log as -r 0, bit for bit, in every recipe (the first step of delayed takes the current path;
    where only the wgrad is FP8 the forward writes x^T all the same). The most device memory allocated at once
    (CUDASIM_MEMORY_REPORT) falls by the x^T codes no longer kept per layer, less the one scratch that holds them
    (and in the block recipe their 1x128 scales)"""
    L, C, BT = sim_model.LAYERS, sim_model.CHANNELS, 4 * 64
    block = "block" in flags
    fc_wgrad_alone = "-f8p" in flags  # qkv and attproj run in FP8 in the forward only: no x^T
    runs = {}
    for r in (0, 1, 2):
        out = workdir / f"fp8_recompute_{flags[1]}_{len(flags)}_{r}"
        cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 3, "-v", 0,
               "-s", 0, "-n", 3, "-fn", 1, "-p", "fp8", "-r", r, "-o", out] + flags
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir,
                                env=dict(os.environ, CUDASIM_MEMORY_REPORT="1"))
        assert result.returncode == 0, result.stderr[-2000:]
        peak = int(re.search(r"cudasim: at most (\d+) bytes of device memory allocated at once", result.stderr).group(1))
        files = [open(out / name, "rb").read() for name in ("model_00000003.bin", "state_00000003_00000.bin", "numerics.jsonl")]
        runs[r] = (losses(result.stdout), files, peak)
    assert len(runs[0][0]) == 3, runs[0][0]
    for r in (1, 2):
        assert runs[r][0] == runs[0][0], (r, runs[r][0], runs[0][0])
        for name, got, want in zip(("model", "state", "numerics log"), runs[r][1], runs[0][1]):
            assert got == want, f"-r {r}: the {name} file differs from -r 0's"

    def x_t_bytes(K):  # a kept x^T and, in the block recipe, its 1x128 scales (one per 128 tokens of each of K rows)
        return K * BT + (4 * K * ((BT + 127) // 128) if block else 0)
    recast_widths = {1: [4 * C], 2: [C, 4 * C] if fc_wgrad_alone else [C, C, C, 4 * C]}  # fcproj's K is 4C
    for r in (1, 2):
        expected = L * sum(map(x_t_bytes, recast_widths[r])) - x_t_bytes(4 * C)
        if fc_wgrad_alone and r == 2:  # qkv's bf16 wgrad reads ln1, which -r 2 recomputes too (one layer's bf16 buffer)
            expected += (L - 1) * BT * C * 2
        assert runs[0][2] - runs[r][2] == expected, (r, runs[0][2] - runs[r][2], expected)


def test_gpu_lines_every_n_steps(workdir):
    """-lg 2: after every second step one line of what NVML reports for the device the trainer runs on, found by its
    PCI bus id (cudasim's: 0000:00:00.0), here from the stand-in NVML (test/fake_nvml.c); without NVML one note and
    the run goes on"""
    fake = os.path.join(ROOT, "build", "libfake_nvml.so")
    assert os.path.exists(fake), "build/libfake_nvml.so is not built (make build/libfake_nvml.so)"
    args = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 4, "-v", 0, "-s", 0,
            "-lg", 2]
    env = dict(os.environ, LLM8_NVML_LIBRARY=fake, FAKE_NVML_BUS_ID="0000:00:00.0", FAKE_NVML_REASONS="44")
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    gpu = [i for i, line in enumerate(lines) if line.startswith("gpu |")]
    assert len(gpu) == 2 and lines[gpu[0] - 1].startswith("step     2/4") and lines[gpu[1] - 1].startswith("step     4/4"), \
        r.stdout[-3000:]
    assert lines[gpu[0]] == ("gpu | SM 97% | memory 64% | SM clock 1755/1980 MHz | power 689/700 W | 71 C | clock held by: "
                             "power cap, thermal (hardware)")
    env["LLM8_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1"
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: -lg 2: cannot load NVML ('/nonexistent/libnvidia-ml.so.1'" in r.stdout and "gpu |" not in r.stdout
    # -lg 0 (the default) is off: NVML is not even looked for, whether it loads or not
    for library in (fake, "/nonexistent/libnvidia-ml.so.1"):
        env["LLM8_NVML_LIBRARY"] = library
        r = subprocess.run([str(a) for a in args[:-2] + ["-x", 1, "-lg", 0]], capture_output=True, text=True, timeout=300,
                           cwd=workdir, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "gpu |" not in r.stdout and "-lg" not in r.stdout and "NVML" not in r.stdout, r.stdout[-3000:]


def test_checkpoint_retention(workdir):
    """-n 2 -nk 2 -nm 4 on the GPU trainer over 7 steps: checkpoints at steps 2, 4 and 6 and at the last step, 7; the
    newest 2 complete checkpoints stay, and the older ones at multiples of 4"""
    out = workdir / "retention"
    r = train(workdir, ["-x", 7, "-n", 2, "-nk", 2, "-nm", 4, "-v", 0, "-s", 0, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(int(name[5:]) for name in os.listdir(out) if name.startswith("DONE_")) == [4, 6, 7]
    assert sorted(name for name in os.listdir(out) if name.startswith(("model_", "state_"))) == [
        f"{kind}_{step:08d}{suffix}" for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")) for step in (4, 6, 7)]
    assert re.findall(r"^wrote checkpoint \S+/model_(\d+)\.bin", r.stdout, re.M) == ["00000002", "00000004", "00000006",
                                                                                   "00000007"], r.stdout[-3000:]


def test_a_descriptor_starts_from_the_cpu_trainers_random_init(workdir):
    """-e tiny with no model file (-y 1 in an empty -o: no checkpoint, so the descriptor): the GPU trainer draws the
    weights train_gpt2cpu draws (llm.c's init order, seed and normal_) and, as llm.c, keeps their bf16 rounding, the
    fp32 master weights included. With -l 0 a step leaves the master as it started, so each bf16 weight of its model
    file is the CPU trainer's fp32 weight rounded to the nearest bf16 (even on a tie): the stochastic rounding of an
    update has nothing to round"""
    cpu_trainer = os.path.join(ROOT, "train_gpt2cpu")
    assert os.path.exists(cpu_trainer), f"{cpu_trainer} is not built (make train_gpt2cpu)"
    gpu_out, cpu_out = workdir / "descriptor_gpu", workdir / "descriptor_cpu"
    common = ["-e", "tiny", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 1, "-l", 0, "-s", 0, "-n", 1]
    r = subprocess.run([str(c) for c in [SIM_TRAINER] + common + ["-o", gpu_out, "-y", 1]], capture_output=True,
                       text=True, timeout=300, cwd=workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"-y 1: no complete checkpoint in {gpu_out}, starting from scratch" in r.stdout, r.stdout[:2000]
    assert "model | L=2 NH=2 C=128 maxT=1024 V=50257 Vp=50304" in r.stdout, r.stdout[:2000]
    c = subprocess.run([str(a) for a in [cpu_trainer] + common + ["-o", cpu_out]], capture_output=True, text=True,
                       timeout=300, cwd=workdir)
    assert c.returncode == 0, c.stderr[-2000:]
    cpu_bits = np.fromfile(cpu_out / "model_00000001.bin", dtype=np.uint32, offset=1024)
    gpu_bits = np.fromfile(gpu_out / "model_00000001.bin", dtype=np.uint16, offset=1024)
    assert cpu_bits.size == gpu_bits.size == 6966784
    nearest = ((cpu_bits + 0x7FFF + ((cpu_bits >> 16) & 1)) >> 16).astype(np.uint16)  # no NaN or Inf in an init
    assert np.array_equal(gpu_bits, nearest)
    assert losses(r.stdout)[1] == pytest.approx(losses(c.stdout)[1], rel=1e-4)


def test_a_checkpoint_without_master_weights_resumes_with_them(workdir):
    """train_gpt2cpu's checkpoint (fp32 weights in the model file, no master in the state) resumed by the GPU trainer
    with -w 1 (the default): a note, and the master weights start from the model file's fp32 weights, exactly. With
    -l 0 the step leaves them as they started, so the state file the GPU run writes holds the CPU trainer's weights
    bit for bit as its master (a master taken from the bf16 weights would differ in the low bits)"""
    cpu_trainer = os.path.join(ROOT, "train_gpt2cpu")
    assert os.path.exists(cpu_trainer), f"{cpu_trainer} is not built (make train_gpt2cpu)"
    out = workdir / "cpu_then_gpu"
    common = ["-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-v", 0, "-s", 0, "-n", 1, "-o", out]
    c = subprocess.run([str(a) for a in [cpu_trainer] + common + ["-x", 1]], capture_output=True, text=True, timeout=300,
                       cwd=workdir)
    assert c.returncode == 0, c.stderr[-2000:]
    r = train(workdir, ["-v", 0, "-s", 0, "-n", 1, "-o", out, "-x", 2, "-y", 1, "-l", 0])
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{out}/state_00000001_00000.bin has no fp32 master weights (a -w 0 run's, or train_gpt2cpu's): the master " \
           "weights (-w 1) start from its model file's weights" in r.stdout, r.stdout[-2000:]
    cpu_weights = np.fromfile(out / "model_00000001.bin", dtype=np.uint32, offset=1024)
    state = out / "state_00000002_00000.bin"
    header = np.fromfile(state, dtype=np.int32, count=256)
    assert header[4] == 1, "the GPU run's state has master weights"
    n = cpu_weights.size
    master = np.fromfile(state, dtype=np.uint32, offset=1024 + 2 * 4 * n, count=n)  # after llm.c's fp32 m and v
    assert np.array_equal(master, cpu_weights)
    assert not np.array_equal(cpu_weights & 0xFFFF, np.zeros_like(cpu_weights)), "the CPU weights are not bf16 values"


def test_bf16_takes_a_token_count_not_a_multiple_of_8(workdir):
    """-b 3 -t 63, 189 tokens a step: a bf16 GEMM takes any B*T, as llm.c's do (cuBLASLt needs only the leading
    dimensions, C and OC, to keep columns 16-byte aligned; llmc/matmul.cuh had asked it of B*T too and stopped at the
    first GEMM). The run, val loss included, tracks train_gpt2cpu's fp32 losses at bf16's precision; FP8 still needs
    B*T a multiple of 16 and says so at startup"""
    common = ["-e", "model.bin", "-i", "s_train_*.bin", "-j", "s_val_*.bin", "-b", 3, "-t", 63, "-x", 3, "-l", 3e-3,
              "-v", 3, "-s", 0]
    gpu = subprocess.run([str(c) for c in [SIM_TRAINER] + common + ["-p", "bf16"]], capture_output=True, text=True,
                         timeout=300, cwd=workdir)
    assert gpu.returncode == 0, gpu.stdout[-2000:] + gpu.stderr[-2000:]
    cpu = subprocess.run([str(c) for c in [os.path.join(ROOT, "train_gpt2cpu")] + common], capture_output=True,
                         text=True, timeout=300, cwd=workdir)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    a, b = losses(gpu.stdout), losses(cpu.stdout)
    assert sorted(a) == [1, 2, 3] and sorted(b) == [1, 2, 3], (a, b)
    assert all(a[s] == pytest.approx(b[s], rel=2e-3) for s in a), (a, b)
    val_gpu, val_cpu = ([float(v) for v in re.findall(r"^val loss (\S+)$", out, re.M)] for out in (gpu.stdout, cpu.stdout))
    assert len(val_gpu) == len(val_cpu) == 2, (gpu.stdout[-2000:], cpu.stdout[-2000:])
    assert all(g == pytest.approx(c, rel=2e-3) for g, c in zip(val_gpu, val_cpu)), (val_gpu, val_cpu)
    fp8 = subprocess.run([str(c) for c in [SIM_TRAINER] + common + ["-p", "fp8"]], capture_output=True, text=True,
                         timeout=300, cwd=workdir)
    assert fp8.returncode != 0 and "B*T = 189 must be a positive multiple of 16" in fp8.stderr, fp8.stderr[-2000:]


def test_bf16_recompute_changes_memory_not_results_at_unaligned_layer_slices(workdir):
    """-r 0, 1 and 2 in bf16 at C = 192 (3 heads of 64), B*T = 189, 2 layers: a layer's B*T*C bf16 activations are
    72576 bytes, not a multiple of 256, so layer 1's kept ln1 and ln2 outputs would sit 128 bytes past cuBLASLt's 256-byte
    alignment where -r's one shared buffer is 256-byte aligned; cuBLASLt's heuristic may pick another algorithm for
    the less aligned pointer (cudasim's sums in another order), and -r would change the bits. The trainer starts each
    layer's slice at 256 bytes: the same losses and model file, bit for bit (-ge 0: the fused GELU forward is
    cuBLASLt's, the recompute llm8's kernel)"""
    runs = {}
    for r in (0, 1, 2):
        out = workdir / f"bf16_recompute_c192_{r}"
        cmd = [SIM_TRAINER, "-e", "model_c192_l2.bin", "-i", "s_train_*.bin", "-j", "", "-b", 3, "-t", 63, "-x", 3,
               "-v", 0, "-s", 0, "-n", 3, "-p", "bf16", "-ge", 0, "-r", r, "-o", out]
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir)
        assert result.returncode == 0, result.stderr[-2000:]
        runs[r] = (losses(result.stdout), open(out / "model_00000003.bin", "rb").read())
    assert sorted(runs[0][0]) == [1, 2, 3], runs[0][0]
    for r in (1, 2):
        assert runs[r][0] == runs[0][0], (r, runs[r][0], runs[0][0])
        assert runs[r][1] == runs[0][1], f"-r {r}: the model file differs from -r 0's"


@pytest.mark.parametrize("name,shards,flags,steps", [("epoch", [2000], ["-b", 8], 3),
                                                     ("epochshort", [2000], ["-b", 8, "-d", 4096], 1),
                                                     ("epochtails", [1000, 1000, 1000], ["-b", 8], 3)],
                         ids=["3-steps", "short-split", "shard-tails"])
def test_x_minus_1_trains_one_epoch(workdir, name, shards, flags, steps):
    """-x -1: as many steps as the train shards hold total batches (2000 tokens, 512 a step: 3); a split shorter
    than one step (-d 4096: 8 micro-steps of 512) still trains one step, its micro-steps wrapping around the shard;
    three shards of 1000 tokens hold one batch each (the loader reads whole samples of a shard), so 3 steps, not
    llm.c's 3000 / 512 = 5, whose last two would start a second epoch"""
    for i, tokens in enumerate(shards):
        sim_model.write_shard(workdir / f"{name}_train_{i:06d}.bin", tokens, 4 + i, learnable=True)
    r = train(workdir, flags + ["-x", -1, "-v", 0, "-s", 0], data=f"{name}_train_*.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"| {steps} steps |" in r.stdout and sorted(losses(r.stdout)) == list(range(1, steps + 1)), r.stdout[-2000:]


def test_each_step_takes_the_schedules_rate_from_step_0(workdir):
    """-l 1e-3 -u 2 -k cosine -q 0.1 over 4 steps: the update after k updates (main.jsonl's step k) takes llm.c's rate
    at k: the warmup's (k + 1) / 2 of -l, then half a cosine from -l down to a tenth of it at the last step. With -h 1
    and -v 0, HellaSwag runs once, at the end"""
    out = workdir / "schedule"
    r = train(workdir, ["-x", 4, "-l", 1e-3, "-u", 2, "-k", "cosine", "-q", 0.1, "-v", 0, "-s", 0, "-h", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    rates = [json.loads(line)["lr"] for line in open(out / "main.jsonl") if '"type":"train"' in line]
    assert rates == pytest.approx([5e-4, 1e-3, 1e-3, 1e-4 + 0.5 * 9e-4], rel=1e-6), rates
    assert len(re.findall(r"^HellaSwag: \d+/8 = ", r.stdout, re.M)) == 1, r.stdout[-3000:]
    assert [line.split()[0] for line in (out / "main.log").read_text().splitlines() if " eval:" in line] == ["s:4"]


def test_weight_decay_shrinks_the_2d_tensors_only(workdir):
    """-c 10 -l 1e-2, one step, against -c 0: AdamW's decay takes lr * wd = 0.1 of each weight of the 2D tensors (wte,
    wpe and the four matmul weights, as llm.c) and leaves every bias and layernorm parameter bit for bit as -c 0 does
    (the same gradient, the same rounding seeds)"""
    models = {}
    for wd in (0, 10):
        out = workdir / f"decay_{wd}"
        r = train(workdir, ["-x", 1, "-l", 1e-2, "-c", wd, "-v", 0, "-s", 0, "-n", 1, "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
        models[wd] = sim_model.read_model(out / "model_00000001.bin")[4]
    start = sim_model.read_model(workdir / "model.bin")[4]
    names = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
             "fcprojb", "lnfw", "lnfb"]
    for name, w, plain, decayed in zip(names, start, models[0], models[10]):
        if name in ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"):
            shrink = np.dot(decayed - plain, w) / np.dot(w, w)  # -lr * wd, up to the bf16 rounding of each weight
            assert abs(shrink + 0.1) < 2e-3, (name, shrink)
        else:
            assert np.array_equal(decayed, plain), name


def test_fp8_weight_scales_follow_each_layers_own_weights(workdir):
    """-p fp8 (-fw current), one step at -l 1e-2 (each weight moves about 1e-2, a tenth of the largest): the scale each
    block linear's weight was cast with after the update (its cast record in the state file) is 448 over that layer's
    own largest weight after the update, up to the bf16 rounding of the model file's weights (2^-7), not a stale
    or another layer's amax. The optimizer pass writes these amaxes, a call per layer of each weight tensor"""
    out = workdir / "fp8_weight_scales"
    r = train(workdir, ["-p", "fp8", "-x", 1, "-l", 1e-2, "-v", 0, "-s", 0, "-n", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    records = state_section(out / "state_00000001_00000.bin", "fp8_records")
    L, _, _, _, tensors = sim_model.read_model(out / "model_00000001.bin")
    weights = [tensors[i].reshape(L, -1) for i in (4, 6, 10, 12)]  # qkvw, attprojw, fcw, fcprojw: the linears' order
    n = len(records) // sim_model.RECORD_BYTES // 3  # x, dy and W records of each FP8 linear
    assert n == 4 * L, n
    for i in range(n):
        at = (2 * n + i) * sim_model.RECORD_BYTES + sim_model.RECORD_FIELD_OFFSETS["scale"]
        scale = struct.unpack_from("<f", records, at)[0]
        largest = np.abs(weights[i % 4][i // 4]).max()
        assert abs(448 / scale / largest - 1) < 2 ** -7, (i, 448 / scale, largest)


def test_outlier_step_is_skipped_after_a_resume(workdir):
    """-sl 3 on the GPU trainer: a model learns a random walk for 140 steps, then the data turns to uniform tokens. A run
    checkpointed at step 135 and resumed gets its -sl window back from the state file (an empty one could not judge
    step 141) and skips step 141's update: none before it, and step 141's model file is step 140's bit for bit.
    Step 142 then casts and trains as a run resumed at step 141 does"""
    sim_model.write_model(workdir / "spike.bin", layers=1, heads=2, channels=128, vocab=256, max_t=64)
    sim_model.write_shard(workdir / "spike_train_000001.bin", 30000, 3, vocab=256, learnable=True, change_at=140 * 4 * 32)
    out = workdir / "spike_run"
    common = ["-p", "fp8", "-t", 32, "-l", 3e-3, "-k", "constant", "-sh", 0, "-v", 0, "-s", 0, "-sl", 3, "-o", out]
    r = train(workdir, common + ["-x", 135, "-n", 135], model="spike.bin", data="spike_train_*.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "update skipped" not in r.stdout, r.stdout[-3000:]
    r = train(workdir, common + ["-x", 142, "-n", 1, "-nk", 3, "-y", 1], model="spike.bin", data="spike_train_*.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    skips = re.findall(r"^step (\d+): loss \S+ is \S+ standard deviations above the last 128 steps' mean \(-sl 3\): "
                       r"update skipped", r.stdout, re.M)
    assert skips[:1] == ["141"], r.stdout[-3000:]
    # the step after the skip casts as a run resumed from the skipped step's checkpoint does (its delayed scales
    # seeded: the skip put back the seeding state of before it, not of a fresh run): the same records and model
    straight_model = (out / "model_00000142.bin").read_bytes()
    shutil.copy(out / "state_00000142_00000.bin", workdir / "spike_state_142.bin")
    os.remove(out / "DONE_00000142")
    r = train(workdir, common + ["-x", 142, "-n", 1, "-nk", 3, "-y", 1], model="spike.bin", data="spike_train_*.bin")
    assert r.returncode == 0 and sorted(losses(r.stdout)) == [142], r.stdout[-2000:]
    assert (out / "model_00000142.bin").read_bytes() == straight_model, "step 142's model differs after a resume"
    assert state_section(out / "state_00000142_00000.bin", "fp8_records") == \
        state_section(workdir / "spike_state_142.bin", "fp8_records"), "step 142's casts differ after a resume"
    assert (out / "model_00000141.bin").read_bytes() == (out / "model_00000140.bin").read_bytes()
    # nor in the FP8 scaling: the spike's activation amaxes are not in the histories (the records keep them, for the log)
    before, after = (state_section(out / f"state_{step:08d}_00000.bin", "fp8_scaling") for step in (140, 141))
    assert before == after, "the skipped step changed the FP8 scaling states"
    assert state_section(out / "state_00000140_00000.bin", "fp8_records") != state_section(out / "state_00000141_00000.bin",
                                                                                          "fp8_records")


def test_block_recipe_at_a_width_not_a_multiple_of_128(workdir):
    """C = 192 (3 heads of 64), as d48's C = 1600 not a multiple of 128: the block recipe's tiles
    along C and 3C end short, training runs and learns, and resume is bitwise. A cuBLASLt without
    short K blocks (cudasim's CUDASIM_CUBLASLT_WHOLE_K_BLOCKS=1) stops the run in one line that
    names the remedy."""
    sim_model.write_model(workdir / "wide.bin", heads=3, channels=192)
    out = workdir / "block_192"
    common = ["-p", "fp8", "-fr", "block", "-f8", "all", "-x", 6, "-l", 3e-3, "-v", 0, "-s", 0, "-n", 3, "-o", out]
    straight = train(workdir, common, model="wide.bin")
    assert straight.returncode == 0, straight.stderr[-2000:]
    a = losses(straight.stdout)
    assert sorted(a) == [1, 2, 3, 4, 5, 6] and all(np.isfinite(list(a.values()))) and a[6] < a[1], a
    os.remove(out / "DONE_00000006")
    resumed = train(workdir, common + ["-y", 1], model="wide.bin")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    b = losses(resumed.stdout)
    assert sorted(b) == [4, 5, 6] and all(a[s] == b[s] for s in (4, 5, 6)), (a, b)

    env = dict(os.environ, CUDASIM_CUBLASLT_WHOLE_K_BLOCKS="1")
    cmd = [SIM_TRAINER, "-e", "wide.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4, "-p", "fp8", "-fr", "block",
           "-x", 1, "-v", 0, "-s", 0, "-o", workdir / "block_refused"]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "short last K block" in errors[0] and "-fr delayed" in errors[0], r.stderr[-2000:]


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_ranks(workdir, ranks, args, stream_order="", rank1_env=None, name=None, data="s_train_*.bin", id_exchange="fs",
                rank1_args=(), timeout_s=300, env_extra=None):
    """`ranks` ranks of the sim trainer (ZeRO-1 unless args say -z 3; the NCCL id through a file, -pi fs, or with
    id_exchange="tcp" from rank 0 at 127.0.0.1, -pi tcp; one rank: no -pn; -pt timeout_s) with
    CUDASIM_STREAM_ORDER=stream_order ("": random) and env_extra in every rank's environment, rank 1 with rank1_env
    added to its environment and rank1_args after its flags; returns (exit codes, rank 0's stdout and stderr, the
    last rank's stderr)"""
    fs_dir = workdir / f"ranks_{name or stream_order or 'random'}"
    os.makedirs(fs_dir, exist_ok=True)
    env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1", CUDASIM_STREAM_ORDER=stream_order, **(env_extra or {}))
    procs = []
    exchange = ["-pi", "fs", "-pf", fs_dir] if id_exchange == "fs" else ["-pi", "tcp", "-ps", f"127.0.0.1:{free_tcp_port()}"]
    for rank in range(ranks):
        cmd = [SIM_TRAINER, "-e", "model.bin", "-i", data, "-t", 64, "-b", 4] + list(args)
        if ranks > 1:
            cmd += ["-pn", ranks, "-pr", rank, "-pg", 1, "-pt", timeout_s] + exchange
        if rank == 1:
            cmd += list(rank1_args)
        rank_env = dict(env, **(rank1_env or {})) if rank == 1 else env
        procs.append(subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=workdir, env=rank_env))
    outputs = [p.communicate(timeout=900) for p in procs]
    return [p.returncode for p in procs], outputs[0][0] + outputs[0][1], outputs[-1][1]


def test_two_ranks_give_the_same_bits_in_any_stream_order(workdir):
    """ZeRO-1 over 2 ranks, FP8 (codes gathered) with 2 micro-steps: the forward waits for each stage of the weight
    gather where it reads it, so running the streams' work newest first (each stage as late as those waits allow;
    a read that does not wait gets the previous step's weights) gives the losses of cudasim's random order; and so
    does running it in call order (each stage as early as its own waits allow: a stage issued before the update of
    what it sends, as wpe's gather issued after wte's update alone, sends the old weights). The second run's ranks
    get the NCCL id over TCP from rank 0 (-pi tcp, as scripts/slurm_gpt2.sbatch launches several nodes), the
    others' through a file (-pi fs)"""
    args = ["-p", "fp8", "-d", 2 * 2 * 4 * 64, "-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0]
    codes, default, _ = train_ranks(workdir, 2, args)
    assert codes == [0, 0], default[-2000:]
    codes, newest_first, _ = train_ranks(workdir, 2, args, "newest-first", id_exchange="tcp")
    assert codes == [0, 0], newest_first[-2000:]
    assert "ZeRO-1 over 2 ranks (-pi fs)" in default and "ZeRO-1 over 2 ranks (-pi tcp)" in newest_first, newest_first[:3000]
    codes, in_order, _ = train_ranks(workdir, 2, args, "in-order")
    assert codes == [0, 0], in_order[-2000:]
    a, b, c = losses(default), losses(newest_first), losses(in_order)
    assert sorted(a) == [1, 2, 3] and a == b == c, (a, b, c)


def test_a_long_val_is_progress_for_the_watchdog(workdir):
    """2 ranks, -pt 5, each stream's queue bounded at 4 (CUDASIM_LAUNCH_QUEUE, as a GPU's launch queue is bounded, so
    the host blocks in a launch while the queue drains), -x 0's val of 160 batches a rank (40, the first choice, took
    4.3 s on a CI machine of 2026-12-02, under -pt; 160 took 11.5 s on a machine like it, over twice -pt): a ZeRO-1 val
    forward has no collective and no wait of its own, so the watchdog saw no progress and ended the run as a hang; the
    val loss's bounded wait every 4 batches is progress. Both ranks finish and print the val loss"""
    sim_model.write_shard(workdir / "long_val_000000.bin", 2 * 160 * 4 * 64 + 1, 2, learnable=True)
    args = ["-j", "long_val_*.bin", "-x", 0, "-m", 160, "-s", 0]
    started = time.monotonic()
    codes, rank0, rank1_err = train_ranks(workdir, 2, args, name="long_val", timeout_s=5,
                                          env_extra={"CUDASIM_LAUNCH_QUEUE": "4"})
    elapsed = time.monotonic() - started
    assert codes == [0, 0], rank0[-2000:] + rank1_err[-2000:]
    assert len(re.findall(r"^val loss \S+$", rank0, re.M)) == 1, rank0[-2000:]
    assert elapsed > 5, f"the run took {elapsed:.1f} s: too short for its val to outlast -pt 5 s (raise -m)"


def test_x_0_evaluates_the_model_and_trains_nothing(workdir):
    """-x 0, as in llm.c: step 0 is the last step, so the run measures the model it starts from (val loss, HellaSwag, a
    sample) and takes no step; no checkpoint is written, -n 1 notwithstanding. HellaSwag's count is llm.c's on that
    model (a float64 forward: each example's closest call is far wider than bf16's rounding)"""
    out = workdir / "eval_only"
    r = train(workdir, ["-x", 0, "-v", 3, "-s", 3, "-g", 8, "-h", 1, "-n", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    assert losses(r.stdout) == {}, r.stdout[-3000:]
    assert len(re.findall(r"^val loss \d+\.\d+$", r.stdout, re.M)) == 1, r.stdout[-3000:]
    hellaswag = re.findall(r"^HellaSwag: (\d+)/8 = [\d.]+$", r.stdout, re.M)
    correct, closest = sim_model.hellaswag_reference(sim_model.read_model(workdir / "model.bin"),
                                                     workdir / "dev" / "data" / "hellaswag" / "hellaswag_val.bin")
    assert closest > 1e-3 and hellaswag == [str(correct)], (hellaswag, correct, closest)
    assert len(re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)) == 1, r.stdout[-3000:]
    log = [line.split() for line in (out / "main.log").read_text().splitlines()]
    assert [fields[0] for fields in log] == ["s:0", "s:0"] and sorted(f[1].split(":")[0] for f in log) == ["eval", "tel"]
    assert not any(name.startswith(("model_", "state_", "DONE_")) for name in os.listdir(out))


def test_a_sample_longer_than_the_sequence_stops_at_it(workdir):
    """-g above -t (by one): the sample stops at T tokens (the prompt and T - 1 drawn), with a note at startup. Each
    token is llm.c's draw from the weights that sampled (step 1's model file, bf16 exact): the coins of xorshift*
    seeded 1337, token t the first whose running sum of softmax(logits of position t - 1) passes coin t, the prompt
    <|endoftext|> (0 where the vocabulary has no 50256). The reference forward (float64) misses the trainer's bf16
    rounding, so a draw may land on a neighbour where a coin falls within 2e-4 of a token's edge (2e-5 seen)"""
    out = workdir / "sample_capped"
    r = train(workdir, ["-p", "bf16", "-x", 1, "-v", 0, "-s", 1, "-g", 65, "-n", 1, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: -g 65 is longer than -t 64: samples stop at 64 tokens" in r.stdout, r.stdout[:3000]
    samples = re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)
    assert len(samples) == 1 and len(samples[0].split()) == 63, samples
    tokens = [0] + [int(token) for token in samples[0].split()]
    logits = sim_model.forward_logits(sim_model.read_model(out / "model_00000001.bin"), tokens)
    exact = 0
    for t, coin in enumerate(sim_model.llmc_coins(63), start=1):
        p = np.exp(logits[t - 1] - logits[t - 1].max())
        cdf = np.cumsum(p / p.sum())
        drawn = tokens[t]
        exact += drawn == int(np.searchsorted(cdf, coin, side="right"))
        assert (cdf[drawn - 1] if drawn > 0 else 0.0) - 2e-4 <= coin <= cdf[drawn] + 2e-4, (t, drawn, coin)
    assert exact >= 60, exact


def test_a_sample_as_long_as_the_sequence_has_no_note(workdir):
    """-g equal to -t: the sample takes all T tokens (the prompt and T - 1 drawn), and no note says it stops short"""
    r = train(workdir, ["-p", "bf16", "-x", 0, "-v", 0, "-s", 1, "-t", 8, "-g", 8])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "is longer than -t" not in r.stdout, r.stdout[:3000]
    samples = re.findall(r"^generating:\n---\n(.*)\n---$", r.stdout, re.M)
    assert len(samples) == 1 and len(samples[0].split()) == 7, samples


def test_out_of_gpu_memory_says_what_to_lower(workdir):
    """a GPU too small for the run (cudasim's device cut to 8 MiB): one line naming what was asked for and the flags
    that lower it, and a non-zero exit, not a CUDA error code"""
    cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=workdir,
                       env=dict(os.environ, CUDASIM_MEMORY_BYTES=str(8 << 20)))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr[-2000:]
    assert re.match(r"error: out of GPU memory: \d+\.\d+ GiB requested for .+, \d+\.\d+ GiB free of 0\.01 GiB; lower the "
                    r"batch size \(-b\), turn on activation recompute \(-r\), or use a higher ZeRO stage$", errors[0]), errors


def test_ranks_started_with_different_flags_stop_at_startup(workdir):
    """each rank launched by hand with its own command line, one of them mistyped (here -l): the ranks compare a
    fingerprint of their flags and model at startup, and every rank stops with one line saying so, before training"""
    codes, rank0_out, rank1_err = train_ranks(workdir, 2, ["-x", 1, "-v", 0, "-s", 0, "-l", "1e-3"], name="mismatch",
                                              rank1_args=["-l", "2e-3"])
    for rank, (out, value) in enumerate(((rank0_out, "0.001"), (rank1_err, "0.002"))):
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert codes[rank] != 0 and len(errors) == 1, (rank, out[-2000:])
        assert errors[0] == (f"error: rank {rank} of 2: the ranks were started with different -l (this rank's: {value}): "
                             "launch every rank with the same command line and -o"), errors
        assert not re.search(r"^step ", out, re.M), out[-2000:]


@pytest.mark.parametrize("differs", ["model", "checkpoint"])
def test_ranks_that_find_other_files_under_the_same_names_stop_at_startup(workdir, differs):
    """each rank started in its own folder with the same command line (-e model.bin, -o run -y 1): the flags agree, but
    rank 1's model.bin has another shape, or its run/ holds an older complete checkpoint than rank 0's. The ranks
    compare the model's shape and the step they resume from too, and every rank stops with one line, before training"""
    base = workdir / f"other_files_{differs}"
    folders = [base / "rank0", base / "rank1"]
    for rank, folder in enumerate(folders):
        os.makedirs(folder, exist_ok=True)
        model = "model_c192.bin" if differs == "model" and rank == 1 else "model.bin"
        for name, target in (("model.bin", model), ("s_train_000001.bin", "s_train_000001.bin")):
            if not os.path.lexists(folder / name):
                os.symlink(workdir / target, folder / name)
    cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "", "-t", 64, "-b", 4, "-x", 3, "-v", 0, "-s", 0]
    if differs == "checkpoint":  # checkpoints of steps 1 and 2; rank 1's copy has only step 1's complete
        r = subprocess.run([str(c) for c in cmd + ["-x", 2, "-n", 1, "-o", "run"]], capture_output=True, text=True,
                           timeout=300, cwd=folders[0])
        assert r.returncode == 0, r.stderr[-2000:]
        shutil.copytree(folders[0] / "run", folders[1] / "run")
        os.remove(folders[1] / "run" / "DONE_00000002")
        cmd += ["-n", 1, "-o", "run", "-y", 1]
    fs_dir = base / "id"
    os.makedirs(fs_dir, exist_ok=True)
    env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1")
    procs = [subprocess.Popen([str(c) for c in cmd + ["-pn", 2, "-pr", rank, "-pg", 1, "-pt", 10, "-pi", "fs", "-pf", fs_dir]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder, env=env)
             for rank, folder in enumerate(folders)]
    outputs = [p.communicate(timeout=300) for p in procs]
    values = ({"model": "L=2 NH=2 C=128", "checkpoint": "step 2"}[differs],
              {"model": "L=1 NH=3 C=192", "checkpoint": "step 1"}[differs])
    what = {"model": "models", "checkpoint": "checkpoints to resume (-y 1 in -o)"}[differs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert p.returncode != 0 and len(errors) == 1, (rank, (out + err)[-2000:])
        assert f"rank {rank} of 2: the ranks were started with different {what} (this rank's: {values[rank]}" in errors[0], \
            errors
        assert not re.search(r"^step ", out, re.M), out[-2000:]


def test_hellaswag_over_two_ranks_counts_every_example_once(workdir):
    """-x 0 -h 1 on 2 ranks: each rank scores its share of the 8 examples, and the line gives the sum over the ranks,
    llm.c's count on the model the run starts from (test_x_0_evaluates_the_model_and_trains_nothing's), out of 8"""
    codes, out, _ = train_ranks(workdir, 2, ["-x", 0, "-v", 0, "-s", 0, "-h", 1], name="hellaswag_two_ranks")
    assert codes == [0, 0], out[-2000:]
    correct, _ = sim_model.hellaswag_reference(sim_model.read_model(workdir / "model.bin"),
                                               workdir / "dev" / "data" / "hellaswag" / "hellaswag_val.bin")
    assert re.findall(r"^HellaSwag: (\d+)/(\d+) = ", out, re.M) == [(str(correct), "8")], out[-2000:]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_tcp_id_exchange_without_its_peer_stops_within_the_timeout(workdir, rank):
    """-pi tcp with the other rank never started: rank 0 waits for a connection, rank 1 for an answer, each -pt 2
    seconds, then stops in one line naming the address"""
    server = f"127.0.0.1:{free_tcp_port()}"
    cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0,
           "-pn", 2, "-pr", rank, "-pg", 1, "-pi", "tcp", "-ps", server, "-pt", 2]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, cwd=workdir)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    expected = (f"rank 0: only 1 of 2 ranks connected to {server} within 2 s" if rank == 0 else
                f"rank 1: no NCCL id from rank 0 at {server} after 2 s")
    assert len(errors) == 1 and expected in errors[0], r.stderr[-2000:]


def test_a_tcp_rank_whose_server_answers_no_connection_stops_within_the_timeout(workdir):
    """rank 0's address takes no connection (here a listener whose accept queue is full, which drops the SYNs as a
    firewall would): rank 1's connect is bounded by -pt 2 like its read, and it stops in one line (a blocking connect
    waited out the kernel's SYN retries, a minute and more)"""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    server = f"127.0.0.1:{listener.getsockname()[1]}"
    fillers = []
    try:
        for _ in range(4):  # the queue holds one or two; the rest wait in SYN retries, as rank 1's would
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        time.sleep(0.2)
        cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0,
               "-pn", 2, "-pr", 1, "-pg", 1, "-pi", "tcp", "-ps", server, "-pt", 2]
        start = time.monotonic()
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir)
        elapsed = time.monotonic() - start
    finally:
        for sock in fillers + [listener]:
            sock.close()
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr[-2000:]
    assert f"rank 1: no NCCL id from rank 0 at {server} after 2 s" in errors[0], errors
    # a blocking connect returns after the kernel's SYN retries, 127 s by Linux's default (135 s here); the bound is
    # wide for a loaded machine's startup
    assert elapsed < 60, f"rank 1 stopped after {elapsed:.1f} s, -pt 2"


# -pi tcp's protocol (llmc/multi_gpu.h): a rank's hello, rank 0's reply
TCP_MAGIC = 0x4449384C
TCP_HELLO = struct.Struct("<Iii")           # magic, rank, -pn
TCP_REPLY = struct.Struct("<Iii128s")       # magic, verdict (0 accepted, 1 other -pn, 2 bad rank, 3 taken), -pn, id


def tcp_rank(workdir, server, rank, num_processes=2):
    """rank `rank` of num_processes at -pi tcp with rank 0 at server (-pt 60), started"""
    cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0,
           "-pn", num_processes, "-pr", rank, "-pg", 1, "-pi", "tcp", "-ps", server, "-pt", 60]
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=workdir, env=dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1"))


def tcp_ask(server, message):
    """connects to rank 0 at server (retrying while it starts), sends message, returns all it answers before it
    closes the connection"""
    host, port = server.split(":")
    deadline = time.monotonic() + 120
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=30)
            break
        except OSError:
            assert time.monotonic() < deadline, f"rank 0 never listened at {server}"
            time.sleep(0.1)
    with sock:
        sock.sendall(message)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:  # rank 0 closed with bytes of ours unread
            pass
        return answer


def test_a_tcp_rank_0_serves_only_the_ranks_of_its_own_run(workdir):
    """before rank 1 comes, rank 0 of 2 at -pi tcp hears from no llm8 rank (a port scanner's bytes), a rank of a run of
    3 and a rank 2 of 2: it refuses each (a note naming the peer and why; the llm8 ones told why, no id), and they take
    no place: rank 1 then joins, and the run trains"""
    server = f"127.0.0.1:{free_tcp_port()}"
    rank0 = tcp_rank(workdir, server, 0)
    try:
        assert tcp_ask(server, b"GET / HTTP/1.0\r\n\r\n") == b""
        for rank, count, verdict in [(1, 3, 1), (2, 2, 2), (0, 2, 2)]:
            magic, answer, its_count, _ = TCP_REPLY.unpack(tcp_ask(server, TCP_HELLO.pack(TCP_MAGIC, rank, count)))
            assert (magic, answer, its_count) == (TCP_MAGIC, verdict, 2)
        rank1 = tcp_rank(workdir, server, 1)
        _, rank1_err = rank1.communicate(timeout=600)
        out, err = rank0.communicate(timeout=600)
    finally:
        rank0.kill()
    assert rank0.returncode == 0 and rank1.returncode == 0, err[-2000:] + rank1_err[-2000:]
    assert re.search(r"^note: rank 0: 127\.0\.0\.1:\d+ connected to .* but is no llm8 rank; ignored$", err, re.M), err
    assert re.search(r"^note: rank 0: refused rank 1 of 3 from 127\.0\.0\.1:\d+: its -pn differs from rank 0's$", err,
                     re.M), err
    for rank in (2, 0):
        assert re.search(rf"^note: rank 0: refused rank {rank} of 2 from 127\.0\.0\.1:\d+: its rank is not one of 1 \.\. "
                         r"-pn - 1$", err, re.M), err
    assert losses(out), out[-2000:]


@pytest.mark.parametrize("case", ["rank-taken", "other-size"])
def test_a_tcp_rank_that_rank_0_refuses_stops_at_once_saying_why(workdir, case):
    """rank 1 at -pi tcp refused by rank 0 of 3, which still waits for a rank, and told why: an earlier launch's rank 1
    (here a fake) got the id first, or this rank 1 was given another -pn. It stops at once (not at -pt 60) with one
    line naming rank 0's run and the reason"""
    server = f"127.0.0.1:{free_tcp_port()}"
    rank0 = tcp_rank(workdir, server, 0, 3)
    try:
        count = 3
        if case == "rank-taken":
            magic, verdict, _, nccl_id = TCP_REPLY.unpack(tcp_ask(server, TCP_HELLO.pack(TCP_MAGIC, 1, 3)))
            assert (magic, verdict) == (TCP_MAGIC, 0) and nccl_id != bytes(128)
        else:
            count = 2
        started = time.monotonic()
        rank1 = tcp_rank(workdir, server, 1, count)
        _, rank1_err = rank1.communicate(timeout=300)
        elapsed = time.monotonic() - started
    finally:
        rank0.kill()
        rank0.communicate()
    reason = ("that rank has already joined (an earlier launch's rank still running, or two ranks given the same -pr?)"
              if case == "rank-taken" else "its -pn differs from rank 0's")
    errors = [line for line in rank1_err.splitlines() if line.startswith("error:")]
    assert rank1.returncode != 0 and errors == [f"error: rank 1 of {count}: rank 0 at {server} (a run of 3 ranks) "
                                                f"refused it: {reason}"], rank1_err[-2000:]
    assert elapsed < 50, f"rank 1 stopped after {elapsed:.1f} s"

REPLICAS_RE = re.compile(r"^replicas \| after (\d+) steps: (\d+) regions .* bitwise identical on 2 ranks$", re.M)


def test_a_killed_rank_stops_its_peer_within_the_timeout():
    """make gpucheck's killed-rank section (test/gpu_trainer_ranks.py killed) under cudasim: 2 ranks train, rank 1 is
    killed after rank 0's first step, and rank 0 exits non-zero within -pt with one line naming its rank and the
    collective it was in"""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "test", "gpu_trainer_ranks.py"), "killed"],
                       env=dict(os.environ, LLM8_TRAINER=SIM_TRAINER), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "gpu_trainer_ranks: 0 failed" in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.count("\nok   killed rank:") == 3, r.stdout[-3000:]
    assert r.stdout.count("\nok   killed rank, launch queue of 4:") == 3, r.stdout[-3000:]


@pytest.mark.parametrize("flags", [["-p", "bf16"], ["-p", "fp8", "-fw", "delayed"], ["-p", "fp8", "-fr", "block"],
                                   ["-p", "fp8", "-fr", "current", "-z", 3]],
                         ids=["bf16", "fp8-delayed-weights", "fp8-block", "fp8-zero3"])
def test_two_ranks_replica_check_finds_the_gathered_weights_identical(workdir, flags):
    """-pc 1: after every weight gather (and the start) each rank's fingerprints of what the gather makes
    identical (bf16 slices, FP8 codes, W^T, block scales, weight scaling states) equal rank 0's; bf16 with -pc 2:
    every second step and at the end (step 3, no multiple of 2)"""
    every = 2 if flags == ["-p", "bf16"] else 1
    args = flags + ["-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-pc", every]
    codes, out, _ = train_ranks(workdir, 2, args, name="replicas_" + "_".join(map(str, flags)))
    assert codes == [0, 0], out[-2000:]
    checks = REPLICAS_RE.findall(out)
    assert [int(u) for u, _ in checks] == ([0, 2, 3] if every == 2 else [0, 1, 2, 3]), out[-2000:]
    assert all(int(n) >= 20 for _, n in checks), checks  # the sim model's 2 layers: at least wte, wpe, lnf, 8 per layer


@pytest.mark.parametrize("lost,tensor", [(9, "wte (bf16)"), (12, "layer 0 ln1b (bf16)"), (16, "layer 1 qkv W (FP8 codes)")],
                         ids=["first-region", "bf16-slice", "fp8-codes"])
def test_two_ranks_replica_check_catches_a_lost_weight_delivery(workdir, lost, tensor):
    """cudasim drops the lost-th ncclBroadcast rank 1 receives (CUDASIM_NCCL_LOSE_BROADCAST; the startup gather's
    are before the first update, the later ones are weight gathers after updates): rank 1 keeps a stale slice, the
    run would go on without a sign, and -pc 1 must stop both ranks at the next check, one line naming the tensor
    (the first region the check compares, wte's, included)"""
    args = ["-p", "fp8", "-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-pc", 1]
    codes, out, rank1_err = train_ranks(workdir, 2, args, rank1_env={"CUDASIM_NCCL_LOSE_BROADCAST": str(lost)},
                                        name=f"replicas_lost_{lost}")
    assert codes[0] != 0 and codes[1] != 0, out[-2000:]
    for err in (out, rank1_err):
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err[-2000:]
        assert errors[0].startswith(f"error: -pc: after 1 steps rank 1's {tensor} differs from rank 0's"), errors[0]


def twin_shard(workdir):
    """a shard whose every sample of B*T = 4 * 64 tokens is the same (for the twin-batch tests)"""
    name = "twin_train_000001.bin"
    if not os.path.exists(workdir / name):
        sim_model.write_shard(workdir / name, 20_000, 4, period=4 * 64)
    return name


@pytest.mark.parametrize("ranks,flags,rank_flags", [
    (2, ["-p", "bf16"], []),
    (2, ["-p", "fp8", "-opt", "adamw8", "-w", 0], []),
    (2, ["-p", "fp8", "-fw", "delayed"], []),
    (2, ["-p", "fp8", "-fr", "block", "-w", 0], []),
    (2, ["-p", "fp8", "-fr", "current"], ["-z", 3]),
    (2, ["-p", "fp8", "-f8", "lm_head"], []),
    (2, ["-p", "fp8", "-f8", "all", "-fw", "delayed", "-opt", "adamw8"], []),
    (2, ["-p", "fp8", "-f8", "all", "-fr", "block"], []),
    (2, ["-p", "fp8", "-f8p", "fwd,fc.wgrad"], []),
    (2, ["-p", "fp8", "-f8", "all", "-f8p", "fwd", "-fr", "current", "-opt", "adamw8"], []),
    (3, ["-p", "fp8", "-opt", "adamw8", "-pa", "fp32"], []),
    (3, ["-p", "fp8", "-fr", "current", "-opt", "adamw8", "-pa", "fp32"], ["-z", 3]),
    (2, ["-p", "bf16", "-e", "model_c192.bin"], ["-z", 3]),
    (2, ["-p", "fp8", "-f8", "qkv,fc"], []),
], ids=["2-bf16", "2-fp8-adamw8-no-master", "2-fp8-delayed-weights", "2-fp8-block-no-master", "2-fp8-zero3", "2-fp8-lm-head-alone",
        "2-fp8-lm-head-delayed-weights", "2-fp8-lm-head-block", "2-fp8-partial-passes", "2-fp8-partial-lm-head-current", "3-fp8-adamw8-fp32-reduce",
        "3-fp8-zero3-fp32-reduce", "2-bf16-zero3-c192", "2-fp8-qkv-fc-linears"])
def test_ranks_on_twin_batches_train_the_one_rank_model_bit_for_bit(workdir, ranks, flags, rank_flags):
    """Every sample of the shard is the same B*T tokens, so each of N ranks x -b 4 computes exactly what 1 rank x -b 4
    computes: the same loss and FP8 amaxes, and a gradient whose average over the ranks is itself: exact for 2 ranks
    in bf16 (x + x halved), and for 3 with -pa fp32 (3x is exact in fp32, and so is 3x / 3), whose shard boundaries
    fall inside the replicated tensors (here wpe). The optimizer is elementwise, its shards cut 256-element blocks
    where the 8-bit states do, and each rank's FP8 cast of its part with the all-reduced amax is the whole weight's
    cast (from its fp32 master part, or with -w 0 from its bf16 weights). So ZeRO-1 and ZeRO-3 must train the 1-rank model bit for bit: the same model file (the losses too, but for
    3 ranks their mean may round: compared to 1e-6). Unlike -pc, this also sees bytes wrong alike on every rank, or
    a checkpoint read before the last gather arrived (the 3-rank ZeRO-3 case found that one): the ranks run their
    streams' work newest first, so whatever reads without waiting reads early. At C = 192 a layer's attproj weight
    sits 128 bytes past 256-byte alignment in the parameters, and ZeRO-3's gathered copy must too: cudasim's cuBLASLt,
    like the library's heuristic, may take another algorithm (other bits) for another alignment. No clipping: the global norm sums
    the ranks' partial sums, so its last bit may differ from one rank's single sum. With FP8 on qkv and fc alone, their
    weights travel as FP8 codes and attproj's and fcproj's in bf16, in the same stages; with lm_head alone in FP8 it
    is cast from wte once wte's stage has arrived, with no FP8 gather (and its join) before. Under ZeRO-3 a text sample's
    forwards gather the weights, so every rank takes part (rank 0 prints): the sample is the 1-rank run's"""
    name = f"twin_{ranks}_" + "_".join(map(str, flags + rank_flags))
    sample = ["-s", 3, "-g", 4] if "-z" in rank_flags else ["-s", 0]
    common = flags + ["-x", 3, "-l", 3e-3, "-v", 0] + sample + ["-sh", 0, "-gc", 0, "-n", 3]
    codes, one, _ = train_ranks(workdir, 1, common + ["-d", 4 * 64, "-o", workdir / (name + "_1")], data=twin_shard(workdir))
    assert codes == [0], one[-2000:]
    if "-f8p" in flags:  # the startup line says where the weights are cast (fp8_weight_cast_in_update)
        assert "(from bf16 after the update: a block linear has a bf16 GEMM" in one, one[:3000]
    elif "all" in flags:
        assert "lm_head from bf16 after the update" in one, one[:3000]
    if flags[-2:] == ["-f8", "all"]:  # per tensor, all passes: lm_head's dy scale comes from its bound (fp8_gradient_recipe)
        assert "gradients current, lm_head's from its bound" in one, one[:3000]
    codes, many, _ = train_ranks(workdir, ranks, common + rank_flags + ["-d", ranks * 4 * 64, "-o", workdir / (name + "_n")],
                                 "newest-first", name=name, data=twin_shard(workdir))
    assert codes == [0] * ranks, many[-2000:]
    if "-z" in rank_flags:  # the memory ZeRO-3 saves differs by rank (rank 0's range lies in wte): both ends are printed
        saved = re.search(r"saves (-?[\d.]+) MiB per GPU at least, (-?[\d.]+) at most", many)
        assert saved and float(saved[1]) <= float(saved[2]), many[:3000]
        # the weights gathered after the update leave out the sharded matmul weights (gathered per layer instead),
        # which are all of those that travel as FP8
        assert "weights gathered per step: 0.0 MB as FP8 + " in many, many[:3000]
    a, b = losses(one), losses(many)
    assert sorted(a) == [1, 2, 3] and sorted(b) == [1, 2, 3], (a, b)
    assert all(abs(a[s] - b[s]) <= (0 if ranks == 2 else 1e-6 * abs(a[s])) for s in a), (a, b)
    model_1 = (workdir / (name + "_1") / "model_00000003.bin").read_bytes()
    model_n = (workdir / (name + "_n") / "model_00000003.bin").read_bytes()
    assert model_1 == model_n, f"the {ranks}-rank run's model file differs from the 1-rank run's"
    if "-z" in rank_flags:
        samples = [re.findall(r"^generating:\n---\n(.*)\n---$", out, re.M) for out in (one, many)]
        assert len(samples[0]) == 1 and samples[1] == samples[0], samples


def test_zero3_gathers_into_a_layer_slot_only_once_its_last_layer_is_done(workdir):
    """ZeRO-3 gathers each layer one layer ahead into one of 2 slots (FP8_LAYER_SLOTS): with 3 layers the forward's
    gather of layer 2 reuses layer 0's slot, and the backward's of layer 0 layer 2's, so each must wait for the slot's
    previous layer's GEMMs (zero_comm_gather_layer's slot_free, recorded by zero_comm_release_layer). The sim model's 2
    layers never reuse a slot for another layer within a pass, so the twin tests above cannot see that wait missing.
    2 micro-steps: the last one's backward reduces each layer's gradients on the communication stream before it
    gathers the next layer, which orders the gather after the GEMMs anyway; the first one's does not. Newest first, a
    gather that does not wait lands before the GEMMs that read the slot: 2 ranks on twin batches then no longer give
    the 1-rank run's loss (the forward's) or model file (the backward's)"""
    name = "zero3_l3"
    common = ["-p", "fp8", "-fr", "current", "-e", "model_l3.bin", "-x", 1, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0,
              "-gc", 0, "-n", 1]
    codes, one, _ = train_ranks(workdir, 1, common + ["-d", 2 * 4 * 64, "-o", workdir / (name + "_1")],
                                data=twin_shard(workdir))
    assert codes == [0], one[-2000:]
    codes, two, _ = train_ranks(workdir, 2, common + ["-z", 3, "-d", 2 * 2 * 4 * 64, "-o", workdir / (name + "_n")],
                                "newest-first", name=name, data=twin_shard(workdir))
    assert codes == [0, 0], two[-2000:]
    assert "L=3" in two and "2 micro-steps" in two, two[:3000]
    a, b = losses(one), losses(two)
    assert sorted(a) == [1] and a == b, (a, b)
    model_1 = (workdir / (name + "_1") / "model_00000001.bin").read_bytes()
    model_n = (workdir / (name + "_n") / "model_00000001.bin").read_bytes()
    assert model_1 == model_n, "the 2-rank ZeRO-3 run's model file differs from the 1-rank run's"


@pytest.mark.parametrize("flags", [["-p", "fp8", "-fr", "current"], ["-p", "fp8", "-f8", "qkv,fc"], ["-p", "bf16"]],
                         ids=["fp8", "fp8-qkv-fc", "bf16"])
def test_zero3_memory_line_is_what_zero3_saves(workdir, flags):
    """the zero3 line's saving against ZeRO-1, the least and the most over the ranks (what stays sharded, less the
    FP8 and bf16 layer slots), is what each rank's most device memory allocated at once (CUDASIM_MEMORY_REPORT) drops
    from -z 1 to -z 3, to the line's 0.1 MiB: every linear in FP8 (FP8 slots alone), two in FP8 (slots of both
    kinds), bf16 (bf16 slots alone). The sim model is so small that the parameters' mapping granules outweigh what
    it shards, so here the saving is negative; a slot the line does not count would show as a larger loss"""
    peaks, line = {}, None
    for zero in (1, 3):
        codes, out, rank1_err = train_ranks(workdir, 2, flags + ["-x", 1, "-v", 0, "-s", 0, "-z", zero],
                                            name=f"zero3_memory_{zero}_{'_'.join(flags)}", env_extra={"CUDASIM_MEMORY_REPORT": "1"})
        assert codes == [0, 0], out[-2000:]
        peaks[zero] = [int(re.search(r"cudasim: at most (\d+) bytes of device memory allocated at once", err).group(1))
                       for err in (out, rank1_err)]
        line = line or re.search(r"^zero3 \|.* \| saves (\S+) MiB per GPU at least, (\S+) at most( \(below 0: [^)]*\))? \|",
                                 out, re.M)
    assert line, out[:3000]
    assert (line.group(3) is not None) == (float(line.group(1)) < 0), line.group(0)  # a saving below 0 says why
    saved = sorted((peaks[1][rank] - peaks[3][rank]) / 1048576.0 for rank in range(2))
    printed = [float(line.group(1)), float(line.group(2))]
    assert all(abs(m - p) <= 0.06 for m, p in zip(saved, printed)), (saved, line.group(0))


COMM_RE = re.compile(r"^comm \| step 1, payload by collective: (.*) \| total ([\d.]+) MB", re.M)


@pytest.mark.parametrize("ranks,flags,grad_bytes", [(2, ["-p", "fp8"], 2), (3, ["-p", "fp8", "-pa", "fp32"], 4)],
                         ids=["2-fp8-bf16-reduce", "3-fp8-fp32-reduce"])
def test_comm_line_counts_each_collectives_payload(workdir, ranks, flags, grad_bytes):
    """The `comm |` line (zero_comm_print_traffic) adds up what each collective of step 1 was handed, by kind: every
    parameter's gradient once at the wire's element size (2 bytes bf16, 4 with -pa fp32), the block linears' weights
    gathered once as 1-byte FP8 codes, everything else once in bf16, and one uint32 amax per block linear weight.
    The twin-batch runs above cannot see these counters (they change no bit), and make gpucheck's checks
    (test/gpu_trainer_ranks.py) leave the fp32 reduce's bytes out: a counter at the wrong element size passed. Rank 0's
    startup line, what it receives per step, must count the matmul weights at 1 byte too"""
    log_dir = workdir / f"comm_line_{ranks}_{grad_bytes}_log"
    args = flags + ["-x", 1, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-d", ranks * 4 * 64, "-o", log_dir]
    codes, out, _ = train_ranks(workdir, ranks, args, name=f"comm_line_{ranks}_{grad_bytes}", env_extra=AS_H100)
    assert codes == [0] * ranks, out[-2000:]
    check_progress_figures(out, log_dir, ranks, steps=1)  # MFU per GPU: the FLOPs of the total batch over the ranks
    m = COMM_RE.search(out)
    assert m, out[-3000:]
    payload = {name.strip(): round(float(mb) * 1e6) for name, mb in re.findall(r"([A-Za-z0-9 -]+?) ([\d.]+) MB", m.group(1))}
    L, C, Vp, max_t = sim_model.LAYERS, sim_model.CHANNELS, (sim_model.VOCAB + 127) // 128 * 128, 1024
    params = Vp * C + max_t * C + L * (12 * C * C + 13 * C) + 2 * C
    matmul = 12 * L * C * C
    assert payload == {"gradient reduce": grad_bytes * params, "FP8 weight amax all-reduce": 4 * 4 * L,
                       "FP8 weight gather": matmul, "bf16 weight gather": 2 * (params - matmul)}, (payload, m.group(0))
    assert round(float(m.group(2)) * 1e6) == sum(payload.values()), m.group(0)
    # rank 0's startup line: what it receives per step (every element outside its range: the matmul weights as
    # 1-byte codes, the rest in bf16, and all of it in bf16 for comparison), in the flat order of the tensors
    sizes = [(Vp * C, 0), (max_t * C, 0), (2 * L * C, 0), (3 * L * C * C, 1), (3 * L * C, 0), (L * C * C, 1),
             (3 * L * C, 0), (4 * L * C * C, 1), (4 * L * C, 0), (4 * L * C * C, 1), (L * C + 2 * C, 0)]
    shard = -(-params // (ranks * 256)) * 256
    at, owned = 0, [0, 0]
    for size, is_matmul in sizes:
        owned[is_matmul] += max(0, min(at + size, shard) - at)
        at += size
    fp8_mb, bf16_mb, all_mb = (matmul - owned[1]) / 1e6, 2 * (params - matmul - owned[0]) / 1e6, 2 * (params - shard) / 1e6
    assert f"weights gathered per step: {fp8_mb:.1f} MB as FP8 + {bf16_mb:.1f} MB as bf16 (all bf16: {all_mb:.1f} MB)" \
        in out, out[:3000]
    # and the shard (its padding the flat vector's to ranks whole shards), the gradients' reduce at the wire's element
    # size, and the optimizer state counted per rank
    assert f"| {shard} parameters per rank ({ranks * shard - params} padding) |" in out, out[:3000]
    reduce = "fp32" if grad_bytes == 4 else "bf16"
    assert re.search(rf"gradient reduce [\d.]+ MB \({reduce}\),", m.group(0)), m.group(0)
    assert f"| gradients reduced per step: {grad_bytes * params / 1e6:.1f} MB {reduce}" in out, out[:3000]
    assert re.search(r"^memory \|.* \| optimizer \S+ m\+v [\d.]+ GiB on this rank \|", out, re.M), out[:3000]


def test_three_ranks_average_bf16_gradients_without_a_bias(workdir):
    """3 ranks with -pa bf16 on twin batches: each rank's gradient is the 1-rank run's g, and their average must be g
    up to bf16 rounding, not a scaled g. NCCL's ncclAvg multiplies each rank's bf16 value by 1/3 rounded to bf16
    (0.333984375) before summing (cudasim does as NCCL does: test/cudasim/cudasim_nccl.cpp), which made the average
    0.2% large, the gradient norm with it; the ranks now sum (ncclSum) and the owner divides by 3 in fp32. Step 1's
    gradient norm matches the 1-rank run's within 5e-4 (with ncclAvg it was 1.5e-3 off)"""
    common = ["-p", "bf16", "-x", 1, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0]
    codes, one, _ = train_ranks(workdir, 1, common + ["-d", 4 * 64], data=twin_shard(workdir))
    assert codes == [0], one[-2000:]
    codes, three, _ = train_ranks(workdir, 3, common + ["-d", 3 * 4 * 64], name="twin_3_bf16_average",
                                  data=twin_shard(workdir))
    assert codes == [0, 0, 0], three[-2000:]
    norms = [float(re.search(r"^step +1/1 \| loss \S+ \| norm (\S+) ", out, re.M)[1]) for out in (one, three)]
    assert abs(norms[1] / norms[0] - 1) < 5e-4, norms


def test_two_ranks_split_the_one_rank_batch(workdir):
    """On ordinary data (not twins), 2 ranks x -b 4 read the 1-rank run's -b 8 batches, each rank its half of the rows,
    and average the gradients of all their micro-steps (2 a step here) once: step 1's loss is the 1-rank run's (a mean
    of the ranks' means, to 1e-6) and so is its gradient norm, up to the bf16 sums of the reduce; the later steps
    track it. A rank reading the other's rows, or a reduce after each micro-step, is off by far more"""
    common = ["-p", "bf16", "-d", 1024, "-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0]
    codes, one, _ = train_ranks(workdir, 1, common + ["-b", 8])
    assert codes == [0], one[-2000:]
    codes, two, _ = train_ranks(workdir, 2, common, name="split_batch")
    assert codes == [0, 0], two[-2000:]
    assert "total batch 1024 tokens = 2 micro-steps" in one and "total batch 1024 tokens = 2 micro-steps" in two
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3] and abs(a[1] - b[1]) <= 1e-6 * a[1], (a, b)
    assert all(abs(a[s] - b[s]) <= 5e-4 * a[s] for s in (2, 3)), (a, b)  # 8e-5 seen
    norms = [float(re.search(r"^step +1/3 \| loss \S+ \| norm (\S+) ", out, re.M)[1]) for out in (one, two)]
    assert abs(norms[1] / norms[0] - 1) < 1e-3, norms  # 2e-4 seen


@pytest.mark.parametrize("first,second,flags", [
    (1, 2, ["-p", "fp8", "-opt", "adamw8", "-fw", "delayed", "-fg", "delayed"]),
    (2, 1, ["-p", "bf16", "-opt", "adamw8", "-w", "0"]),
    (1, 2, ["-p", "fp8", "-fw", "delayed", "-w", "0"]),
], ids=["1to2-fp8-adamw8-delayed", "2to1-bf16-adamw8-no-master", "1to2-fp8-delayed-no-master"])
def test_twin_batches_resume_on_another_rank_count_bit_for_bit(workdir, first, second, flags):
    """A checkpoint of `first` ranks resumed on `second` (the optimizer state resharded, 8-bit states and FP8 scaling
    included, the loader replayed) goes on exactly as the uninterrupted run: on twin batches the rank count changes
    no bit, so steps 4..6 and the final model file must be the straight run's"""
    name = f"twin_reshard_{first}_{second}_" + "_".join(flags)
    out_dir = workdir / name
    common = flags + ["-x", 6, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-gc", 0, "-n", 3, "-o", out_dir]
    codes, straight, _ = train_ranks(workdir, first, common + ["-d", first * 4 * 64], name=name + "_a",
                                     data=twin_shard(workdir))
    assert codes == [0] * first, straight[-2000:]
    straight_model = (out_dir / "model_00000006.bin").read_bytes()
    os.remove(out_dir / "DONE_00000006")
    codes, resumed, _ = train_ranks(workdir, second, common + ["-d", second * 4 * 64, "-y", 1], name=name + "_b",
                                    data=twin_shard(workdir))
    assert codes == [0] * second, resumed[-2000:]
    assert f"resumed a checkpoint of {first} rank{'s' if first > 1 else ''}" in resumed, resumed[-2000:]
    a, b = losses(straight), losses(resumed)
    assert sorted(b) == [4, 5, 6] and all(a[s] == b[s] for s in b), (a, b)
    assert (out_dir / "model_00000006.bin").read_bytes() == straight_model, "the resumed run's model file differs"
    # step 6 written again holds only this run's state files: none of the first run's ranks is left over beside them
    assert sorted(f for f in os.listdir(out_dir) if f.startswith("state_00000006_")) == \
        [f"state_00000006_{rank:05d}.bin" for rank in range(second)], os.listdir(out_dir)


def test_resume_on_another_rank_count_replays_the_steps_batches(workdir):
    """On ordinary data (not twins), a 1-rank run of 2 micro-steps a step (-b 8 -d 1024) checkpointed at step 3 and
    resumed on 2 ranks of 2 micro-steps each (-b 4): the loader is replayed by 3 steps of the new run's micro-steps,
    the same tokens the straight run read, so steps 4 and 5 track the straight run as 2 ranks track 1
    (test_two_ranks_split_the_one_rank_batch). A replay by steps alone (3 micro-batches) reads half of step 2's again"""
    out_dir = workdir / "reshard_replay"
    common = ["-p", "bf16", "-d", 1024, "-x", 5, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-n", 3, "-o", out_dir]
    codes, straight, _ = train_ranks(workdir, 1, common + ["-b", 8], name="reshard_replay_1")
    assert codes == [0], straight[-2000:]
    os.remove(out_dir / "DONE_00000005")
    codes, resumed, _ = train_ranks(workdir, 2, common + ["-y", 1], name="reshard_replay_2")
    assert codes == [0, 0], resumed[-2000:]
    assert "resumed a checkpoint of 1 rank:" in resumed, resumed[-2000:]
    a, b = losses(straight), losses(resumed)
    assert sorted(b) == [4, 5] and all(abs(a[s] - b[s]) <= 5e-4 * a[s] for s in b), (a, b)
    # the resumed run's first step is its first: the `comm |` line counts that one's collectives
    assert re.findall(r"^comm \| step (\d+), payload by collective:", resumed, re.M) == ["4"], resumed[-3000:]


# ---- mpirun (-pi mpi, the default under mpirun): the launch llm.c users know ---------------------

def mpi_launch_env():
    """the environment for mpirun's ranks here: the one cudasim GPU shared (NCCL_MULTI_RANK_GPU_ENABLE), mpirun as
    root allowed (CI runs as root) and more ranks than cores. Skips where the sim trainer was built without OpenMPI
    (the Makefile links it where it finds mpi.h) or mpirun is missing; LLM8_REQUIRE_MPI=1 (.ci/run, which installs
    OpenMPI) makes that a failure"""
    linked = os.path.exists(SIM_TRAINER) and "libmpi" in subprocess.run(["ldd", SIM_TRAINER], capture_output=True,
                                                                         text=True).stdout
    missing = None if linked and shutil.which("mpirun") else "mpirun, or the sim trainer built with OpenMPI"
    if missing and os.environ.get("LLM8_REQUIRE_MPI") == "1":
        pytest.fail(f"LLM8_REQUIRE_MPI=1 but {missing} is missing (apt-get install openmpi-bin libopenmpi-dev, rebuild)")
    if missing:
        pytest.skip(f"no {missing}")
    return dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1", CUDA_VISIBLE_DEVICES="0", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


@pytest.mark.parametrize("flags,rank_flags", [
    (["-p", "fp8", "-opt", "adamw8"], []),
    (["-p", "fp8", "-fr", "current"], ["-z", 3]),
], ids=["zero1-fp8-adamw8", "zero3-fp8"])
def test_mpirun_ranks_on_twin_batches_train_the_one_rank_model_bit_for_bit(workdir, flags, rank_flags):
    """scripts/launch_one_node.sh -m mpi -n 2 (mpirun -np 2) starts the trainer with no rank flags: each rank takes its
    rank, the count and its GPU from MPI, and rank 0's NCCL id reaches rank 1 by MPI's broadcast. On twin batches the two
    ranks must train the 1-rank model bit for bit (the twin test above), and the startup line says how they met"""
    env = mpi_launch_env()
    name = "mpirun_twin_" + "_".join(map(str, flags + rank_flags))
    common = flags + ["-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-gc", 0, "-n", 3]
    codes, one, _ = train_ranks(workdir, 1, common + ["-d", 4 * 64, "-o", workdir / (name + "_1")], data=twin_shard(workdir))
    assert codes == [0], one[-2000:]
    cmd = ["bash", os.path.join(ROOT, "scripts", "launch_one_node.sh"), "-m", "mpi", "-n", 2, "--", SIM_TRAINER,
           "-e", "model.bin", "-i", twin_shard(workdir), "-t", 64, "-b", 4] + common + rank_flags + \
          ["-d", 2 * 4 * 64, "-o", workdir / (name + "_2")]
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, cwd=workdir, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert f"ZeRO-{3 if rank_flags else 1} over 2 ranks (-pi mpi)" in result.stdout, result.stdout[:3000]
    a, b = losses(one), losses(result.stdout)
    assert sorted(a) == [1, 2, 3] and a == b, (a, b)
    model_1 = (workdir / (name + "_1") / "model_00000003.bin").read_bytes()
    assert (workdir / (name + "_2") / "model_00000003.bin").read_bytes() == model_1, \
        "the 2 mpirun ranks' model file differs from the 1-rank run's"


@pytest.mark.parametrize("extra,expected", [
    (["-pn", 3], r"error: flag -pn 3: MPI has 2 processes \(-pi mpi takes the count from mpirun -np"),
    (["-i", "missing_*.bin"], r"error: .*missing_\*\.bin"),
], ids=["pn-contradicts-mpirun", "missing-data"])
def test_mpirun_ranks_stop_with_one_line_each(workdir, extra, expected):
    """under mpirun every rank stops with its own one-line error (and mpirun with a non-zero status): a -pn that
    contradicts mpirun's -np (two hand-started copies would each be rank 0 of 1), and data a rank cannot read"""
    env = mpi_launch_env()
    cmd = ["mpirun", "-np", 2, "--bind-to", "none", SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin",
           "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0] + extra
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    assert result.returncode != 0, result.stdout[-2000:]
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all(re.match(expected, e) for e in errors), (result.stdout + result.stderr)[-3000:]


@pytest.mark.parametrize("hung_rank,expected", [
    (0, "error: rank 1: no NCCL id from rank 0 by MPI's broadcast after 2 s (is rank 0 stuck reading its data or "
        "model?)"),
    (1, "error: rank 0"),
])
def test_mpirun_ranks_stop_at_the_timeout_when_a_rank_hangs_before_the_broadcast(workdir, hung_rank, expected):
    """under mpirun, a rank stuck before the broadcast of the NCCL id (here opening a shard that is a FIFO nobody
    writes, as a hung filesystem would hold it): the other stops at -pt 2 with one line saying what it waited for,
    and mpirun ends the job. Rank 0 hung: rank 1 waited in MPI_Bcast as long as rank 0 hung. Rank 1 hung: rank 0's
    part of the broadcast ends where the MPI sends 128 bytes eagerly (OpenMPI), and it stops at the communicator's
    creation; else at the broadcast's deadline"""
    env = mpi_launch_env()
    fifo = workdir / "hung_000000.bin"
    if not fifo.exists():
        os.mkfifo(fifo)
    rank = [SIM_TRAINER, "-e", "model.bin", "-t", 64, "-b", 4, "-x", 1, "-v", 0, "-s", 0, "-pt", 2]
    data = ["hung_*.bin", "s_train_*.bin"] if hung_rank == 0 else ["s_train_*.bin", "hung_*.bin"]
    cmd = ["mpirun", "--bind-to", "none", "-np", 1] + rank + ["-i", data[0], ":", "-np", 1] + rank + ["-i", data[1]]
    started = time.monotonic()
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1 and errors[0].startswith(expected), output[-3000:]
    assert elapsed < 60, f"mpirun ended after {elapsed:.1f} s, -pt 2"
