"""
The GPU trainer's main program end to end, under cudasim (build/sim/train_gpt2_fp8, made by
make test): the paths the kernel and model tests (test/test_*.cu) do not reach, on the CPU.
- bf16 and FP8 (+ adamw8) runs with validation, text samples, HellaSwag, the FP8 numerics
  log and checkpoints: exit 0, loss finite and falling, main.log in llm.c's line format,
  main.jsonl, numerics.jsonl rows for every FP8 tensor, DONE markers;
- -y 1 resumes bitwise: the resumed steps print the losses of the uninterrupted run;
- a run whose every forward overflows (a weight of 3e38): its non-finite steps are counted
  and skipped, the run ends cleanly, and the model file it writes holds no Inf or NaN;
- the block recipe at C = 192 (tiles along K that end short, as d48's): trains, resumes
  bitwise, and a cuBLASLt without such kernels gives one line naming the remedy;
- 2 ranks (ZeRO-1, FP8) give the same losses when cudasim runs the streams' work newest first
  (CUDASIM_STREAM_ORDER): the forward waits for each stage of the weight gather it reads.
test/sim_model.py's small model keeps a step near a second. The same program on a GPU is
make gpucheck's (test/test_gpt2.cu, test/gpu_trainer_ranks.py).
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import sim_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM_TRAINER = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
STEP_RE = re.compile(r"^step\s+(\d+)/\d+ \| loss ([-\d.naninf]+) \|", re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """a model file, train/val shards, and the HellaSwag file where the trainer looks for it"""
    d = tmp_path_factory.mktemp("sim_trainer")
    sim_model.write_run_files(d, 60_000)
    os.makedirs(d / "dev" / "data" / "hellaswag")
    sim_model.write_hellaswag(d / "dev" / "data" / "hellaswag" / "hellaswag_val.bin")
    return d


def train(workdir, args, model="model.bin", timeout=900):
    if not os.path.exists(SIM_TRAINER):
        pytest.fail(f"{SIM_TRAINER} is not built (make build/sim/train_gpt2_fp8)")
    cmd = [SIM_TRAINER, "-e", model, "-i", "s_train_*.bin", "-j", "s_val_*.bin", "-t", 64, "-b", 4] + list(args)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=workdir)


def losses(stdout):
    return {int(s): float(l) for s, l in STEP_RE.findall(stdout)}


@pytest.mark.parametrize("flags", [["-p", "bf16"], ["-p", "fp8", "-opt", "adamw8", "-fn", 2]], ids=["bf16", "fp8-adamw8"])
def test_training_run_with_eval_samples_logs_and_checkpoints(workdir, flags):
    out = workdir / ("run_" + flags[1])
    r = train(workdir, flags + ["-x", 6, "-l", 3e-3, "-v", 3, "-s", 3, "-g", 8, "-h", 1, "-n", 3, "-o", out])
    assert r.returncode == 0, r.stderr[-2000:]
    steps = losses(r.stdout)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and all(np.isfinite(list(steps.values())))
    assert steps[6] < steps[1], steps
    assert len(re.findall(r"^val loss \d+\.\d+$", r.stdout, re.M)) >= 2
    assert "generating:\n---\n" in r.stdout
    log = open(out / "main.log").read().splitlines()
    assert any(re.fullmatch(r"s:6 trl:\d+\.\d+ lr:\S+ norm:\S+", line) for line in log), log
    assert any(re.fullmatch(r"s:\d+ tel:\d+\.\d+", line) for line in log), log
    eval_lines = [line for line in log if re.fullmatch(r"s:\d+ eval:[\d.]+", line)]
    assert eval_lines and all(0.0 <= float(line.split("eval:")[1]) <= 1.0 for line in eval_lines), log
    events = [json.loads(line) for line in open(out / "main.jsonl")]
    assert [e["step"] for e in events if e["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    for step in (3, 6):
        assert (out / f"DONE_{step:08d}").exists() and (out / f"model_{step:08d}.bin").exists()
    if "fp8" in flags:
        rows = [json.loads(line) for line in open(out / "numerics.jsonl")]
        tensors = {row["tensor"] for row in rows}
        for layer in range(sim_model.LAYERS):  # x, W and dy of every block linear
            for linear in ("qkv", "attproj", "fc", "fcproj"):
                for operand in ("x", "w", "dy"):
                    assert f"L{layer}.{linear}.{operand}" in tensors, sorted(tensors)
        assert all(row["amax"] > 0 and row["scale"] > 0 and 0 <= row["frac_saturated"] <= 1 for row in rows)


@pytest.mark.parametrize("flags", [["-p", "bf16"], ["-p", "fp8", "-opt", "adamw8", "-fw", "delayed", "-fg", "delayed"]],
                         ids=["bf16", "fp8-delayed-weights-gradients-adamw8"])
def test_resume_is_bitwise(workdir, flags):
    out = workdir / ("resume_" + "_".join(str(f) for f in flags))
    common = flags + ["-x", 6, "-l", 3e-3, "-v", 0, "-s", 0, "-n", 3, "-o", out]
    straight = train(workdir, common)
    assert straight.returncode == 0, straight.stderr[-2000:]
    os.remove(out / "DONE_00000006")
    resumed = train(workdir, common + ["-y", 1])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = losses(straight.stdout), losses(resumed.stdout)
    assert sorted(b) == [4, 5, 6]
    assert all(a[s] == b[s] for s in (4, 5, 6)), (a, b)


def test_delayed_gradient_scaling_is_honoured(workdir):
    """-fg delayed: the first backward seeds each dy history with the current path (the same first step),
    then the one-pass cast with the history's scale trains other bits than -fg current"""
    runs = {}
    for grads in ("current", "delayed"):
        out = workdir / f"grads_{grads}"
        r = train(workdir, ["-p", "fp8", "-fg", grads, "-x", 3, "-v", 0, "-s", 0, "-n", 3, "-o", out])
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"gradients {grads})" in r.stdout, r.stdout[:2000]
        runs[grads] = (losses(r.stdout), open(out / "model_00000003.bin", "rb").read())
    assert runs["current"][0][1] == runs["delayed"][0][1]
    assert runs["current"][1] != runs["delayed"][1], "-fg delayed trained like -fg current"


def test_nonfinite_steps_are_skipped_and_never_reach_the_weights(workdir):
    out = workdir / "overflow"
    sim_model.write_model(workdir / "overflow.bin", first_qkv_weight=3e38)  # every forward overflows
    r = train(workdir, ["-p", "fp8", "-x", 3, "-v", 0, "-s", 0, "-n", 3, "-o", out], model="overflow.bin")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "update skipped" in r.stdout, r.stdout[-2000:]
    skipped = re.search(r"^(\d+) updates were skipped for non-finite loss or gradient norm$", r.stdout, re.M)
    assert skipped and int(skipped.group(1)) == 3, r.stdout[-2000:]
    with open(out / "model_00000003.bin", "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240326 and header[1] == 5  # bf16 weights
        bits = np.frombuffer(f.read(), dtype=np.uint16)
    assert not np.any((bits & 0x7F80) == 0x7F80), "Inf or NaN reached the weights"


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


def train_two_ranks(workdir, args, stream_order):
    """2 ranks of the sim trainer (ZeRO-1, -pi fs) with CUDASIM_STREAM_ORDER=stream_order ("": random); returns
    (exit codes, rank 0's stdout)"""
    fs_dir = workdir / f"ranks_{stream_order or 'random'}"
    os.makedirs(fs_dir, exist_ok=True)
    env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1", CUDASIM_STREAM_ORDER=stream_order)
    procs = []
    for rank in range(2):
        cmd = [SIM_TRAINER, "-e", "model.bin", "-i", "s_train_*.bin", "-t", 64, "-b", 4] + list(args) + \
              ["-pn", 2, "-pr", rank, "-pg", 1, "-pi", "fs", "-pf", fs_dir, "-pt", 300]
        procs.append(subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=workdir, env=env))
    outputs = [p.communicate(timeout=900) for p in procs]
    return [p.returncode for p in procs], outputs[0][0] + outputs[0][1]


def test_two_ranks_give_the_same_bits_in_any_stream_order(workdir):
    """ZeRO-1 over 2 ranks, FP8 (codes gathered) with 2 micro-steps: the forward waits for each stage of the weight
    gather where it reads it, so running the streams' work newest first (each stage as late as those waits allow;
    a read that does not wait gets the previous step's weights) gives the losses of cudasim's random order"""
    args = ["-p", "fp8", "-d", 2 * 2 * 4 * 64, "-x", 3, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0]
    codes, default = train_two_ranks(workdir, args, "")
    assert codes == [0, 0], default[-2000:]
    codes, newest_first = train_two_ranks(workdir, args, "newest-first")
    assert codes == [0, 0], newest_first[-2000:]
    a, b = losses(default), losses(newest_first)
    assert sorted(a) == [1, 2, 3] and a == b, (a, b)
