"""
End-to-end training benchmark: runs ./train_gpt2_fp8 for each configuration on synthetic
tokens, and writes doc/benchmarks/<date>-<gpu>.md and .json with the same figures (one
record per configuration: model, precision, recipe, optimizer, B, T, tok/s, MFU, peak
memory, the optimizer step's time, device, commit, command) plus the per-kernel breakdown
of each run (-kt 1). FP8 runs are made with both weight scalings (-fw current: a cast pass
after the optimizer step; -fw delayed: the optimizer step writes the codes): a "FP8 weight
cast" section sets their tok/s and their optimizer + weight-cast time (the -kt 1 rows
"adamw"/"adamw8" and "fp8 weight casts") side by side, the figures that pick -fw's default
(DESIGN.md section 3; the design document lies outside this repository). The default FP8 run, and its FP8-lm_head twin, are also made with delayed
output-gradient scaling (-fg delayed), and the default FP8 run with power-of-two current scaling
(-fg pow2: dy cast in one pass with the last use's scale, again where dy's amax crossed a power
of two): an "FP8 output-gradient scaling" section sets their tok/s and the four block linears'
backward time (where the dy passes are charged) beside -fg current's, the figures that pick -fg's
default. The default FP8 run is also made with lm_head in FP8 (-f8 all): an "FP8
lm_head" section sets its tok/s beside the bf16 lm_head's (lm_head's loss parity comes from
scripts/compare_bf16_fp8.sh, dev/gpu_session.sh parity). The default bf16 and FP8 runs are
also made with -ge 2 (GELU's derivative in fcproj's dgrad epilogue): a "GELU backward fusion"
section sets their tok/s and the time of the rows GELU's backward is charged to beside -ge 1's,
the figures that pick -ge's default for both baselines; and with -ad 0 (cuDNN's attention backward
with float atomics, not bitwise repeatable): an "Attention backward" section sets their tok/s and
`attention bwd` time beside the deterministic default's. The default FP8 run is also made with -fe 1 (fc's
GEMM writes fcproj's input codes; where the model runs at -r 0) and with attproj in bf16 (-f8 qkv,fc,fcproj): an
"attproj in FP8 or bf16" section sets its tok/s and attproj's rows (its casts and GEMMs) beside the default's, the
figures that say whether attproj's FP8 GEMMs pay for its casts at each size. At d12 and d48 the bf16 runs of both
optimizers are also made without fp32 master weights (-w 0): a "Memory" section sets the
persistent bytes per parameter and the optimizer state the trainer reports at startup beside
the measured peak, for each optimizer and master-weight mode (DESIGN.md section 4). After a
model's other runs its default bf16 and FP8 runs are made again, FP8 first (records with
"benchmark": "repeat"): a "Repeatability" section sets each beside its first measurement and
the FP8 over bf16 ratio of each pass, the run-to-run noise every comparison carries. Then ./bench_gemm (dev/bench/bench_gemm.cu) times every linear's GEMMs
in bf16 and in FP8, with and without the casts around them, for the same model sizes; its
tables and a summary against DESIGN.md section 7's "FP8 GEMMs incl. casts over bf16 GEMMs"
targets go into a "Per-GEMM FP8 vs bf16" section of the markdown, and its JSON lines into
the JSON (records with "benchmark": "gemm"; the end-to-end ones have "benchmark": "train").
Last, the multi-GPU records ("benchmark": "ranks"): d12 in bf16 and FP8 with 2 ranks on the
one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, -pi fs), ZeRO-1 and ZeRO-3, against 1 rank on the same
global batch: the payload of each collective in the first step (the trainer's `comm |` line:
counted on the calls that ran) and the 2-rank overhead, ms/step with 2 ranks over ms/step
with 1. Two
ranks share the GPU's compute, so the overhead is the collectives, the synchronization and
the sharing itself; doc/scaling.md turns the payloads into times on real interconnects.

tok/s and MFU are medians over the timed steps; the first steps (cuDNN/cuBLAS plan
building, allocator warm-up) are dropped. `make bench` runs the full set, `make gpucheck`
the --quick one.

Usage: python3 dev/bench/bench.py [--quick] [--steps N] [--only d12,d48] [--out doc/benchmarks] [--time-limit S]
(--only: those models' runs, into files named after them; a device call fits one model's --quick set;
--time-limit: the wall seconds it may take, the programs it did not reach counted in the report)
"""
import argparse
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floor_model  # noqa: E402  (the per-region floor: doc/performance.md, "The floor")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(ROOT, "train_gpt2_fp8")
GEMM_BENCH = os.path.join(ROOT, "bench_gemm")

# (model, B, recompute) at T=1024, the sizes DESIGN.md section 7 sets targets for; the large
# models recompute GELU (-r 1), as doc/performance.md's floors assume (at these B they also
# fit in an H100's 80 GB without it, as the run scripts train them)
FULL_CONFIGS = [("d12", 64, 0), ("d24", 32, 0), ("d36", 16, 1), ("d48", 16, 1)]
QUICK_CONFIGS = [("d12", 64, 0), ("d48", 16, 1)]
# (precision, FP8 recipe, optimizer, FP8 weight scaling -fw, lm_head's precision, FP8 output-gradient
# scaling -fg): each is its own record; lm_head "fp8" adds -f8 all (the default -f8 keeps it bf16)
RUNS = [("bf16", "-", "adamw", "-", "-", "-"), ("fp8", "delayed", "adamw", "current", "bf16", "current"),
        ("fp8", "delayed", "adamw", "delayed", "bf16", "current"), ("fp8", "delayed", "adamw", "current", "fp8", "current"),
        ("fp8", "delayed", "adamw", "current", "bf16", "delayed"), ("fp8", "delayed", "adamw", "current", "fp8", "delayed"),
        ("fp8", "delayed", "adamw", "current", "bf16", "pow2"),
        ("fp8", "current", "adamw", "current", "bf16", "current"), ("fp8", "block", "adamw", "-", "bf16", "-"),
        ("bf16", "-", "adamw8", "-", "-", "-"), ("fp8", "delayed", "adamw8", "current", "bf16", "current"),
        ("fp8", "delayed", "adamw8", "delayed", "bf16", "current")]
# the runs also made without fp32 master weights (-w 0), at ADAMW8_MODELS: the memory comparison
MASTER_FREE_RUNS = [("bf16", "-", "adamw", "-", "-", "-"), ("bf16", "-", "adamw8", "-", "-", "-")]
# the default bf16 and FP8 runs, also made at every model with each setting of VARIED_SETTINGS changed, and made
# again after the model's other runs in the reverse order ("benchmark": "repeat"; the "Repeatability" section)
DEFAULT_RUNS = [("bf16", "-", "adamw", "-", "-", "-"), ("fp8", "delayed", "adamw", "current", "bf16", "current")]
# settings of both precisions that the runs keep at their default (records written before a setting was measured
# lack its field: the default) but DEFAULT_RUNS once more with the other value: record field -> (flag, default, other).
# -ge 2: GELU's derivative in fcproj's dgrad epilogue ("GELU backward fusion" picks -ge's default for both);
# -ad 0: cuDNN's attention backward with float atomics ("Attention backward": what giving up bitwise repeats buys)
# -fe 1: fc's forward GEMM writes fcproj's x codes ("FP8 GELU codes from fc's GEMM": what the fusion buys)
# -f8 qkv,fc,fcproj: attproj in bf16 ("attproj in FP8 or bf16": whether its GEMMs' gain pays for its two casts)
VARIED_SETTINGS = {"gelu_fusion": ("-ge", 1, 2), "attention_deterministic": ("-ad", 1, 0), "fc_writes_codes": ("-fe", 0, 1),
                   "fp8_block_linears": ("-f8",) + floor_model.FP8_BLOCK_LINEARS}
# the column heading of a VARIED_SETTINGS setting where it is not the flag: -f8's value here is the block linears in
# FP8 (lm_head has a column of its own; its FP8 runs pass -f8 all)
SETTING_HEADS = {"fp8_block_linears": "FP8 block linears"}
# the DEFAULT_RUNS a VARIED_SETTINGS setting's other value applies to, by (precision, recompute) (the others: all):
# -fe 1 acts on an FP8 run that keeps fcproj's x^T from the forward (-r 0; the trainer refuses it with -r 1 or 2);
# -f8 on an FP8 run
VARIED_APPLIES = {"fc_writes_codes": lambda precision, recompute: precision == "fp8" and recompute == 0,
                  "fp8_block_linears": lambda precision, recompute: precision == "fp8"}
# the -kt 1 rows where GELU's backward is charged: fcproj's dgrad (its epilogue with -ge 2), fc's output-gradient
# pass (FP8) or bias pass, and bf16's GELU backward kernel (absent with -ge 2)
GELU_BACKWARD_ROWS = ("matmul fcproj bwd", "matmul fc bwd", "gelu bwd")
ATTENTION_BACKWARD_ROW = "attention bwd"
# the -kt 1 rows of fc's forward and the GELU that makes fcproj's input: the GEMM and the GELU cast (FP8), or the
# GEMM writing the codes and the byte transpose (-fe 1), or bf16's GELU epilogue or kernel
# the -kt 1 rows of attproj: the attention output's FP8 cast (an FP8 attproj's x and x^T) and its GEMMs, the
# backward's with its output gradient's cast
ATTPROJ_ROWS = ("fp8 cast attention out", "matmul attproj fwd", "matmul attproj bwd")
FC_FORWARD_ROWS = ("matmul fc fwd", "gelu+fp8 cast fwd", "matmul fc+gelu fp8 codes fwd", "fp8 transpose gelu out",
                   "matmul fc+gelu fwd", "gelu fwd")
# the -kt 1 rows that hold the backward of the four block linears, where each output gradient's
# cast is charged (-fg current: an amax pass and a cast pass; delayed: one pass; pow2: one pass, run again where
# dy's amax crossed a power of two)
BLOCK_BACKWARD_ROWS = ("matmul qkv bwd", "matmul attproj bwd", "matmul fc bwd", "matmul fcproj bwd")
# the -kt 1 row of the FP8 weight casts after the optimizer step (with -fw delayed: the scale
# bookkeeping and W^T from the codes the step wrote)
WEIGHT_CAST_ROW = "fp8 weight casts"
# the 8-bit AdamW is measured at the smallest and the largest size (DESIGN.md section 4's memory figures)
ADAMW8_MODELS = {"d12", "d48"}
WARMUP_STEPS = 3
# the sizes ./bench_gemm measures, and DESIGN.md section 7's "FP8 GEMMs incl. casts over bf16 GEMMs" targets
GEMM_TARGETS = {"d12": 1.3, "d24": 1.45, "d36": 1.55, "d48": 1.6}
GEMM_FP8_VARIANTS = ["fp8", "fp8+cast", "block", "block+cast", "fp8+cast-fgd"]
# (iters, warmup) of ./bench_gemm: full and --quick
GEMM_ITERS = {False: (20, 5), True: (5, 2)}
# the fields each kind of ./bench_gemm JSON line must have
GEMM_RECORD_FIELDS = {
    "run": ("device", "iters", "warmup", "repeats", "T"),
    "time": ("model", "linear", "B", "T", "pass", "variant", "derived", "ms", "tflops"),
    "ratio": ("model", "linear", "B", "T", "pass", "variant", "ratio"),
    "skip": ("model", "variant", "reason"),
}

# wall seconds a trainer run (all its ranks) may take, a fixed part (start-up: init, plans, casts)
# plus a part per step, and the ./bench_gemm run, before they are killed and recorded as an error:
# a hang costs one record, not the device call (a --quick d48 run takes well under a minute)
TRAIN_LIMIT_S = (120, 10)
GEMM_LIMIT_S = 480


def train_limit_s(steps):
    return TRAIN_LIMIT_S[0] + TRAIN_LIMIT_S[1] * steps

# --time-limit: the monotonic time by which every program must have ended (None: no limit), so a
# device call with a fixed budget (dev/gpu_session.sh first) ends with a report, its programs killed
# (each runs in a process group of its own, which a timeout around bench.py would not reach); no
# program starts with less than MIN_PROGRAM_S left (a trainer's start-up alone takes seconds)
TIME_END = None
MIN_PROGRAM_S = 20


def program_limit(own_limit_s):
    """(seconds a program may run, whether --time-limit cut its own limit short), or None: too little
    time is left to start it"""
    if TIME_END is None:
        return own_limit_s, False
    left = TIME_END - time.monotonic()
    if left < MIN_PROGRAM_S:
        return None
    return (own_limit_s, False) if own_limit_s <= left else (int(left), True)

# d12's global batch for the rank records: 1 rank x B or 2 ranks x B/2
RANKS_MODEL, RANKS_B = "d12", 32
TRAFFIC_RE = re.compile(r"^comm \| step \d+, payload by collective: (.*) \| total", re.M)
# the trainer's startup line of the persistent bytes per parameter and the optimizer state
# (adamw8 adds the bytes per parameter of the tensors with 8-bit states, and their share)
MEMORY_RE = re.compile(r"^memory \| persistent ([\d.]+) bytes/parameter [^|]*?(?:; ([\d.]+) for the ([\d.]+)% of parameters "
                       r"with 8-bit states[^|]*)?\| optimizer \S+ m\+v ([\d.]+) GiB", re.M)
# -lg 1's line after each step (llmc/gpu_monitor.h): what the GPU ran at
GPU_RE = re.compile(r"^gpu \| SM (\S+) \| memory (\S+) \| SM clock (\S+)/(\S+) MHz \| power (\S+)/(\S+) W \| (n/a|\d+ C) \| "
                    r"clock held by: (.*)$")
STEP_RE = re.compile(r"^step\s+(\d+)/(\d+) \| loss ([-\d.naninf]+) \| .*? \| ([\d.]+) ms \| (\d+) tok/s \| MFU ([\d.]+%|n/a) \| ETA \S+ \| mem (\d+) MiB")


def write_synthetic_shard(path, num_tokens, seed=1234):
    if os.path.exists(path) and os.path.getsize(path) == 1024 + 2 * num_tokens:
        return
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, num_tokens
    tokens = np.random.default_rng(seed).integers(0, 50257, size=num_tokens, dtype=np.uint16)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    os.replace(path + ".tmp", path)


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:  # no nvidia-smi at all
        return "unknown-gpu"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown-gpu"


# -fg pow2's last line (llmc/fp8_model.cuh, fp8_model_print_predictions): its predictions and how many were cast again
PREDICTIONS_RE = re.compile(r"^fp8 \| -fg pow2: (\d+) output gradients cast with a predicted scale, (\d+) cast again")


def parse_recast_fraction(stdout):
    """-fg pow2: the fraction of its predicted output-gradient casts cast again (None: no such line, or no prediction)"""
    for line in stdout.splitlines():
        m = PREDICTIONS_RE.match(line.strip())
        if m and int(m.group(1)) > 0:
            return int(m.group(2)) / int(m.group(1))
    return None


def parse_run(stdout):
    steps = []
    for line in stdout.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            mfu = m.group(6)
            steps.append({"step": int(m.group(1)), "loss": float(m.group(3)), "ms": float(m.group(4)),
                          "tok_s": int(m.group(5)), "mfu": None if mfu == "n/a" else float(mfu[:-1]) / 100.0,
                          "mem_mib": int(m.group(7))})
    breakdown = ""
    if "kernel breakdown" in stdout:
        breakdown = stdout[stdout.index("kernel breakdown"):]
        breakdown = "\n".join(l for l in breakdown.splitlines() if l.startswith("|") or l.startswith("kernel breakdown"))
    return steps, breakdown


def parse_gpu(stdout):
    """-lg 1's lines of the timed steps (> WARMUP_STEPS): the median SM clock and power, the clock's maximum and the power
    limit, the hottest temperature, and every reason the clock was held down ("nothing" when none was); every value
    None without the lines (no NVML) or where the device did not report it"""
    keys = ("sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temperature_c", "clock_held_by")
    step, readings = 0, []
    for line in stdout.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            step = int(m.group(1))
            continue
        m = GPU_RE.match(line.strip())
        if m and step > WARMUP_STEPS:
            readings.append(m.groups())
    if not readings:
        return dict.fromkeys(keys)

    def numbers(index, unit=""):
        return [float(r[index][:len(r[index]) - len(unit)]) for r in readings if r[index] != "n/a"]

    clock, clock_max, power, limit, temperature = numbers(2), numbers(3), numbers(4), numbers(5), numbers(6, " C")
    reasons = sorted({why for r in readings if r[7] not in ("nothing", "n/a") for why in r[7].split(", ")})
    known = any(r[7] != "n/a" for r in readings)
    return {"sm_clock_mhz": statistics.median(clock) if clock else None, "sm_clock_max_mhz": max(clock_max) if clock_max else None,
            "power_w": statistics.median(power) if power else None, "power_limit_w": max(limit) if limit else None,
            "temperature_c": max(temperature) if temperature else None,
            "clock_held_by": (", ".join(reasons) if reasons else "nothing") if known else None}


def figure(value, fmt, unit=""):
    """a record's figure for a markdown table: n/a where it is None"""
    return "n/a" if value is None else format(value, fmt) + unit


def gpu_state_markdown(records):
    """the GPU's state during each train run's timed steps (-lg 1), so a tok/s figure comes with the clock it ran at"""
    rows = [r for r in records if r["benchmark"] == "train" and r.get("sm_clock_mhz") is not None]
    if not rows:
        return ""
    out = ["## GPU state during the timed steps (-lg 1, NVML)", "",
           "A throttled clock (power cap, thermal) lowers tok/s whatever the recipe: compare runs at the same clock.", "",
           f"| model | precision | recipe | optimizer | -fw | -fg | lm_head | master | {SETTINGS_HEADS} | SM clock MHz (median / max) | "
           "power W (median / limit) | hottest C | clock held by |", "|---" * (12 + len(VARIED_SETTINGS)) + "|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['precision']} | {r['recipe']} | {r['optimizer']} | {r['weight_scaling']} | "
                   f"{r.get('grad_scaling', '-')} | {r['lm_head']} | {master_text(r)} | {settings_cells(r)} | "
                   f"{figure(r['sm_clock_mhz'], '.0f')} / "
                   f"{figure(r['sm_clock_max_mhz'], '.0f')} | {figure(r['power_w'], '.0f')} / {figure(r['power_limit_w'], '.0f')} | "
                   f"{figure(r['temperature_c'], '.0f')} | {r['clock_held_by'] or 'n/a'} |")
    return "\n".join(out) + "\n"


def parse_memory(stdout):
    """the startup `memory |` line: {persistent bytes per parameter, those of the tensors with 8-bit
    states and their share in % (None without adamw8), optimizer m+v GiB}; every value None without the line"""
    m = MEMORY_RE.search(stdout)
    keys = ("persistent_bytes_per_param", "eight_bit_bytes_per_param", "eight_bit_share_pct", "optimizer_state_gib")
    if m is None:
        return dict.fromkeys(keys)
    return {k: float(v) if v is not None else None for k, v in zip(keys, m.groups())}


def parse_traffic(stdout):
    """the trainer's `comm |` line: {collective: payload bytes} (MB printed to the byte)"""
    m = TRAFFIC_RE.search(stdout)
    if m is None:
        return {}
    return {name.strip(): round(float(mb) * 1e6) for name, mb in re.findall(r"([A-Za-z0-9 -]+?) ([\d.]+) MB", m.group(1))}


def breakdown_ms(breakdown, row):
    """ms per step of one profiler mark in a -kt 1 breakdown (None: no such row)"""
    for line in breakdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] == row:
            return float(cells[1])
    return None


def optimizer_ms(breakdown, optimizer):
    """ms per step of the optimizer's own profiler mark ("adamw" or "adamw8") in a -kt 1 breakdown"""
    return breakdown_ms(breakdown, optimizer)


def optimizer_and_weight_cast_ms(breakdown, optimizer):
    """the optimizer step plus the FP8 weight casts after it: what -fw delayed folds into one pass"""
    step, cast = optimizer_ms(breakdown, optimizer), breakdown_ms(breakdown, WEIGHT_CAST_ROW)
    return step + cast if step is not None and cast is not None else None


def block_backward_ms(breakdown):
    """ms per step of the four block linears' backward rows together (None: a row is missing)"""
    rows = [breakdown_ms(breakdown, row) for row in BLOCK_BACKWARD_ROWS]
    return None if None in rows else sum(rows)


def gradient_default(r):
    """-fg current: the default, and every record written before -fg existed"""
    return r.get("grad_scaling", "current") in ("current", "-")


def at_defaults(r, except_field=None):
    """whether a record keeps every VARIED_SETTINGS setting but except_field at its default"""
    return all(r.get(field, default) == default for field, (_, default, _) in VARIED_SETTINGS.items() if field != except_field)


def setting_text(r, field):
    """a VARIED_SETTINGS column and heading value: the record's (the default for records written before it was measured)"""
    return str(r.get(field, VARIED_SETTINGS[field][1]))


def settings_cells(r):
    """the record's VARIED_SETTINGS values as table cells, in the order of SETTINGS_HEADS"""
    return " | ".join(setting_text(r, field) for field in VARIED_SETTINGS)


def settings_words(r):
    """the record's VARIED_SETTINGS for headings, as flags where SETTING_HEADS names none: -ge 1 -ad 1"""
    return " ".join(f"{SETTING_HEADS.get(field, flag)} {setting_text(r, field)}" for field, (flag, _, _) in VARIED_SETTINGS.items())


SETTINGS_HEADS = " | ".join(SETTING_HEADS.get(field, flag) for field, (flag, _, _) in VARIED_SETTINGS.items())


def rows_ms(breakdown, rows):
    """ms per step of those of the -kt 1 rows the run has, together (None: it has none of them)"""
    found = [ms for ms in (breakdown_ms(breakdown, row) for row in rows) if ms is not None]
    return sum(found) if found else None


def gelu_backward_ms(breakdown):
    """ms per step of the rows GELU's backward is charged to, together (a missing gelu bwd row counts 0:
    FP8 and -ge 2 runs have none; None: fc's or fcproj's backward row is missing)"""
    rows = [breakdown_ms(breakdown, row) for row in GELU_BACKWARD_ROWS]
    return None if None in rows[:2] else sum(ms for ms in rows if ms is not None)


def command_text(cmd):
    """a command as typed in the repository root, for the records and the markdown: ./<binary> and
    the arguments quoted where a shell needs it (-j '', the empty val pattern, stays an argument)"""
    return shlex.join(["./" + os.path.basename(cmd[0])] + cmd[1:])


# the process groups run_programs has running: each program runs in a group of its own (so its
# children go with it at its limit), which a signal to this script's group does not reach; a
# SIGTERM (timeout around a device call's stage) kills them before the script exits, so no
# trainer is left holding the GPU for the next call
RUNNING_GROUPS = set()


def kill_running_groups_on_sigterm():
    def handler(signum, frame):
        for pid in list(RUNNING_GROUPS):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def run_programs(cmds, limit_s, env=None):
    """runs the commands side by side (one, or the ranks of a run), each in a process group of its own,
    their output into files (pipes read one at a time could fill and block a program); returns
    [(exit code, stdout, stderr)]. At limit_s every group is killed, and a program still running then
    gets exit code None (ran past); one that had exited keeps its code and its error line."""
    with tempfile.TemporaryDirectory(prefix="llm8_bench_run_") as out_dir:
        files = [(open(os.path.join(out_dir, f"{i}.out"), "w+"), open(os.path.join(out_dir, f"{i}.err"), "w+"))
                 for i in range(len(cmds))]
        procs = []
        for c, (out, err) in zip(cmds, files):
            procs.append(subprocess.Popen(c, stdout=out, stderr=err, text=True, cwd=ROOT, env=env, start_new_session=True))
            RUNNING_GROUPS.add(procs[-1].pid)
        deadline = time.monotonic() + limit_s
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        codes = [p.poll() if code is None else code for p, code in zip(procs, codes)]  # exited since
        for p in procs:  # the groups too: a program's children would outlive it
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()
            RUNNING_GROUPS.discard(p.pid)
        results = []
        for code, (out, err) in zip(codes, files):
            out.seek(0)
            err.seek(0)
            results.append((code, out.read(), err.read()))
            out.close()
            err.close()
        return results


def failure_line(stderr, returncode, limit_s=None, by_time_limit=False):
    """why a program failed: its last stderr line (llm8's one-line error) without the "error: " the
    tables put in front, or its exit status when it printed nothing (None: it ran past limit_s, which
    was what --time-limit left it when by_time_limit)"""
    if returncode is None:
        if by_time_limit:
            return f"stopped at --time-limit, after {limit_s} s"
        return f"ran past {limit_s} s and was killed"
    lines = stderr.strip().splitlines()
    if not lines:
        return f"exit {returncode}"
    return lines[-1][len("error: "):] if lines[-1].startswith("error: ") else lines[-1]


def model_runs(model, recompute):
    """the train runs of one model at -r recompute, in order: (precision, recipe, optimizer, -fw, lm_head, -fg, fp32
    master weights, {VARIED_SETTINGS field: value}): RUNS, then MASTER_FREE_RUNS (at ADAMW8_MODELS), then DEFAULT_RUNS
    with each VARIED_SETTINGS setting changed in turn (those VARIED_APPLIES lets it act on)"""
    defaults = {field: default for field, (_, default, _) in VARIED_SETTINGS.items()}
    runs = [run + (True, defaults) for run in RUNS if run[2] != "adamw8" or model in ADAMW8_MODELS]
    runs += [run + (False, defaults) for run in MASTER_FREE_RUNS if model in ADAMW8_MODELS]
    for field, (_, _, other) in VARIED_SETTINGS.items():
        applies = VARIED_APPLIES.get(field, lambda precision, recompute: True)
        runs += [run + (True, dict(defaults, **{field: other})) for run in DEFAULT_RUNS if applies(run[0], recompute)]
    return runs


def run_config(model, B, recompute, T, precision, recipe, optimizer, weights, lm_head, steps, data_path, master=True,
               grads="-", settings=None):
    """one train run's record (an error record if it failed), or None: not started, --time-limit left too little time;
    settings: {VARIED_SETTINGS field: value}, the defaults where absent"""
    settings = {field: (settings or {}).get(field, default) for field, (_, default, _) in VARIED_SETTINGS.items()}
    cmd = [TRAINER, "-e", model, "-b", str(B), "-t", str(T), "-p", precision, "-x", str(steps),
           "-i", data_path, "-j", "", "-v", "0", "-s", "0", "-kt", "1", "-lg", "1", "-r", str(recompute), "-opt", optimizer]
    cmd += [] if master else ["-w", "0"]
    for field, (flag, default, _) in VARIED_SETTINGS.items():
        cmd += [] if settings[field] == default else [flag, str(settings[field])]
    if precision == "fp8":
        cmd += ["-fr", recipe, "-fn", "0"] + (["-fw", weights] if weights != "-" else [])
        cmd += ["-f8", "all"] if lm_head == "fp8" else []
        cmd += ["-fg", grads] if grads != "-" else []
    limit = program_limit(train_limit_s(steps))
    if limit is None:
        return None
    print("running:", shlex.join(cmd), flush=True)
    [(returncode, stdout, stderr)] = run_programs([cmd], limit[0])
    failed = {"model": model, "precision": precision, "recipe": recipe, "optimizer": optimizer, "weight_scaling": weights,
              "lm_head": lm_head, "grad_scaling": grads, "master_weights": master, **settings, "command": command_text(cmd)}
    if returncode != 0:
        print(stdout[-3000:], stderr[-3000:], file=sys.stderr)
        return dict(failed, error=failure_line(stderr, returncode, *limit))
    step_records, breakdown = parse_run(stdout)
    timed = [s for s in step_records if s["step"] > WARMUP_STEPS]
    if not timed:
        return dict(failed, error="no step lines parsed")
    mfus = [s["mfu"] for s in timed if s["mfu"] is not None]
    return {
        "model": model, "precision": precision, "recipe": recipe, "optimizer": optimizer, "weight_scaling": weights,
        "lm_head": lm_head, "grad_scaling": grads, "master_weights": master, **settings,
        "B": B, "T": T, "recompute": recompute, "steps_timed": len(timed),
        "tok_per_s": statistics.median(s["tok_s"] for s in timed),
        "ms_per_step": statistics.median(s["ms"] for s in timed),
        "mfu": statistics.median(mfus) if mfus else None,
        "peak_mem_mib": max(s["mem_mib"] for s in step_records),
        **parse_memory(stdout),
        **parse_gpu(stdout),
        "final_loss": timed[-1]["loss"],
        "optimizer_ms": optimizer_ms(breakdown, optimizer),
        "optimizer_weight_cast_ms": optimizer_and_weight_cast_ms(breakdown, optimizer) if precision == "fp8" else None,
        "block_backward_ms": block_backward_ms(breakdown),
        "gelu_backward_ms": gelu_backward_ms(breakdown),
        "attention_backward_ms": breakdown_ms(breakdown, ATTENTION_BACKWARD_ROW),
        "fc_forward_ms": rows_ms(breakdown, FC_FORWARD_ROWS),
        "attproj_ms": rows_ms(breakdown, ATTPROJ_ROWS),
        "recast_fraction": parse_recast_fraction(stdout),
        "command": command_text(cmd),
        "kernel_breakdown": breakdown,
    }


def with_floor(record, device):
    """a successful train record with "floor_ms": its step's floor on the device's datasheet ceilings
    (None for a run floor_model.py cannot model, e.g. --only d6: the measurement is kept)"""
    if "error" in record:
        return record
    try:
        run = floor_model.run_from_record(record)
        floor_ms = round(floor_model.step_floor_ms(run, floor_model.device_for_gpu(device)), 3)
    except floor_model.CliError as e:
        print(f"no floor for {record['model']} {record['precision']}: {e}", flush=True)
        floor_ms = None
    return dict(record, floor_ms=floor_ms)


def is_default_run(r):
    """the default bf16 run and the default FP8 run (delayed recipe, -fw current, lm_head bf16), AdamW with master weights"""
    if r.get("benchmark") != "train" or "error" in r:
        return False
    default = ("-", "-", "-") if r["precision"] == "bf16" else ("delayed", "current", "bf16")
    return (r["optimizer"] == "adamw" and r["master_weights"] is not False and gradient_default(r)
            and at_defaults(r) and (r["recipe"], r["weight_scaling"], r["lm_head"]) == default)


def floor_markdown(records, device):
    """the "Floor" section: measured ms/step against floor_model's floor for each model's default bf16
    and FP8 runs, and d12's regions measured against their floors"""
    ceilings = floor_model.device_for_gpu(device)
    runs = [r for r in records if is_default_run(r) and r.get("floor_ms") is not None]
    if not runs:
        return ""
    out = ["## Floor: measured vs the model's floor", "",
           f"The floor is dev/bench/floor_model.py's (a model, not a measurement): per kernel the larger of its matrix "
           f"FLOPs at the datasheet rate and its fewest bytes at the datasheet bandwidth, on the {ceilings.name}. "
           f"`python3 dev/bench/floor_model.py --bench FILE.json` prints the region tables of every run.", "",
           "| model | precision | B | measured ms/step | floor ms/step | measured / floor |", "|---|---|---|---|---|---|"]
    for r in runs:
        out.append(f"| {r['model']} | {r['precision']} | {r['B']} | {r['ms_per_step']:.2f} | {r['floor_ms']:.2f} | "
                   f"{r['ms_per_step'] / r['floor_ms']:.2f}x |")
    for r in runs:
        if r["model"] == "d12" and r.get("kernel_breakdown"):
            measured = floor_model.measured_regions(r["kernel_breakdown"])
            out += ["", floor_model.floor_table(floor_model.run_from_record(r), ceilings, measured)]
    return "\n".join(out + [""])


def repeat_rows(records):
    """the "Repeatability" section's rows: (model, {precision: (first record, repeat record)}) for each model
    whose default bf16 or FP8 run was made again (a failed repeat too: its error goes in the table), in the
    order measured"""
    rows = {}
    for r in records:
        if r.get("benchmark") == "repeat":
            first = [f for f in records if is_default_run(f) and (f["model"], f["precision"]) == (r["model"], r["precision"])]
            if first:
                rows.setdefault(r["model"], {})[r["precision"]] = (first[0], r)
    return list(rows.items())


def repeat_markdown(rows):
    out = ["## Repeatability: the default runs made again", "",
           "After each model's other runs, its default bf16 and FP8 runs are made a second time, FP8 first (the reverse "
           "of their first order), so that a clock or a temperature that drifted over the runs shows. The change between "
           "two measurements of one run is the noise every figure in this report carries: a difference between settings "
           "smaller than it is not measured.", "",
           "| model | precision | tok/s first | tok/s repeat | repeat / first | SM clock MHz first | repeat |",
           "|---|---|---|---|---|---|---|"]
    ratios = []
    for model, pairs in rows:
        for precision, (first, again) in sorted(pairs.items()):
            if "error" in again:
                out.append(f"| {model} | {precision} | {first['tok_per_s']:.0f} | error: {again['error']} | | "
                           f"{figure(first.get('sm_clock_mhz'), '.0f')} | |")
                continue
            out.append(f"| {model} | {precision} | {first['tok_per_s']:.0f} | {again['tok_per_s']:.0f} | "
                       f"{again['tok_per_s'] / first['tok_per_s']:.3f}x | {figure(first.get('sm_clock_mhz'), '.0f')} | "
                       f"{figure(again.get('sm_clock_mhz'), '.0f')} |")
        if set(pairs) == {"bf16", "fp8"} and not any("error" in again for _, again in pairs.values()):
            (bf16_first, bf16_again), (fp8_first, fp8_again) = pairs["bf16"], pairs["fp8"]
            ratios.append(f"| {model} | {fp8_first['tok_per_s'] / bf16_first['tok_per_s']:.3f}x | "
                          f"{fp8_again['tok_per_s'] / bf16_again['tok_per_s']:.3f}x |")
    if ratios:
        out += ["", "FP8 over bf16, the default runs, from each pass:", "", "| model | first runs | repeats |", "|---|---|---|"]
        out += ratios
    return "\n".join(out + [""])


def master_text(record):
    """the fp32 master weights column: yes (the default), no (-w 0)"""
    return "no" if record.get("master_weights") is False else "yes"


def memory_rows(records):
    """the "Memory" section's rows: the bf16 runs of the models measured without master weights,
    each optimizer with and without them (what the trainer reports at startup, and the peak)"""
    master_free = {r["model"] for r in records if r.get("benchmark") == "train" and r.get("master_weights") is False}
    return [r for r in records if r.get("benchmark") == "train" and "error" not in r and r["model"] in master_free
            and r["precision"] == "bf16" and at_defaults(r)]


def memory_markdown(rows):
    out = ["## Memory: optimizer and master weights", "",
           "bf16 runs. Persistent bytes per parameter (whole model, and with adamw8 those of the tensors with 8-bit "
           "states: DESIGN.md section 4's 10.03 with fp32 master weights and 6.03 without, against AdamW's 16) and the "
           "optimizer's m+v, as the trainer reports them at startup, and the peak GPU memory the progress line measured.", "",
           "| model | optimizer | fp32 master | bytes/parameter | 8-bit tensors: bytes/parameter | their share | "
           "optimizer m+v GiB | peak mem MiB |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['optimizer']} | {master_text(r)} | {figure(r['persistent_bytes_per_param'], '.3f')} | "
                   f"{figure(r['eight_bit_bytes_per_param'], '.3f')} | {figure(r['eight_bit_share_pct'], '.1f', '%')} | "
                   f"{figure(r['optimizer_state_gib'], '.2f')} | {r['peak_mem_mib']} |")
    return "\n".join(out + [""])


def paired_runs(records, key_fields, variant_field, variants, keep=lambda r: True, required=None):
    """the successful train records that keep() accepts, grouped by key_fields and told apart by
    variant_field: (key dict, {variant: record}) for every key measured in each of the variants (or in
    each of those required, with the others where they were measured), in the order measured. Only
    runs with the VARIED_SETTINGS defaults, but the variant's own, and a pair's runs have the same
    master weights always (the -w 0 runs share every other key
    field with a default run: paired with one, a -ge 2 run was compared with the -w 0 run)"""
    groups = {}
    for r in records:
        if r.get("benchmark") == "train" and "error" not in r and r.get(variant_field) in variants and keep(r) \
                and at_defaults(r, variant_field):
            key = tuple(r[f] for f in key_fields)
            groups.setdefault((key, r.get("master_weights")), {})[r[variant_field]] = r
    need = set(variants if required is None else required)
    return [(dict(zip(key_fields, key)), pair) for (key, _), pair in groups.items() if need <= set(pair)]


def pair_row(key, base, variant):
    """a comparison row: the pair's key, tok/s and final loss of each run, and variant over base"""
    return {**key, "tok_per_s": (base["tok_per_s"], variant["tok_per_s"]), "speedup": variant["tok_per_s"] / base["tok_per_s"],
            "final_loss": (base["final_loss"], variant["final_loss"])}


def pair_cells(row, ms_field):
    """the cells a comparison row ends with: tok/s of each run, the second over the first, the ms of each of the
    -kt 1 rows the comparison is about (ms_field), and the final loss of each"""
    ms = ["n/a" if v is None else f"{v:.3f}" for v in row[ms_field]]
    return (f"{row['tok_per_s'][0]:.0f} | {row['tok_per_s'][1]:.0f} | {row['speedup']:.3f}x | {ms[0]} | {ms[1]} | "
            f"{row['final_loss'][0]:.4f} | {row['final_loss'][1]:.4f} |")


def lm_head_comparison(records):
    """pairs each FP8 run with lm_head in FP8 with the same run with lm_head in bf16 (model, recipe,
    optimizer, -fw): tok/s and final loss of each, and FP8 lm_head over bf16"""
    rows = []
    for key, pair in paired_runs(records, ("model", "recipe", "optimizer", "weight_scaling"), "lm_head", ("bf16", "fp8"),
                                 keep=lambda r: r.get("precision") == "fp8" and gradient_default(r)):
        rows.append(pair_row(key, pair["bf16"], pair["fp8"]))
    return rows


def lm_head_markdown(rows):
    """the "FP8 lm_head" section: lm_head in bf16 (the default -f8) vs in FP8 (-f8 all)"""
    out = ["## FP8 lm_head: bf16 (default -f8) vs FP8 (-f8 all)", "",
           "lm_head is 29% of d12's FLOPs. Make FP8 the default only where it is faster here and its loss matches over "
           "a long run (scripts/compare_bf16_fp8.sh with RECIPES=\"delayed delayed+lm_head\"; dev/gpu_session.sh parity).", "",
           "| model | recipe | optimizer | -fw | tok/s bf16 lm_head | tok/s FP8 lm_head | FP8 / bf16 | final loss bf16 | FP8 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        out.append(f"| {row['model']} | {row['recipe']} | {row['optimizer']} | {row['weight_scaling']} | "
                   f"{row['tok_per_s'][0]:.0f} | {row['tok_per_s'][1]:.0f} | {row['speedup']:.3f}x | "
                   f"{row['final_loss'][0]:.4f} | {row['final_loss'][1]:.4f} |")
    return "\n".join(out + [""])


# the -fg values the "FP8 output-gradient scaling" section sets side by side, the default first
GRADIENT_SCALINGS = ("current", "delayed", "pow2")


def gradient_scaling_comparison(records):
    """sets the -fg current, delayed and pow2 runs of each (model, recipe, optimizer, -fw, lm_head) side by side, for
    every key measured with -fg current and at least one of the others (the FP8-lm_head twin has no pow2 run; records
    written before pow2 existed none): per -fg, tok/s, the block linears' backward ms (where the output-gradient casts
    are charged) and final loss (None where not measured), and each other -fg's tok/s over current's"""
    rows = []
    for key, runs in paired_runs(records, ("model", "recipe", "optimizer", "weight_scaling", "lm_head"), "grad_scaling",
                                 GRADIENT_SCALINGS, required=("current",)):
        if len(runs) < 2:
            continue
        measured = [runs.get(g) for g in GRADIENT_SCALINGS]

        def each(value, among=measured):
            return tuple(None if r is None else value(r) for r in among)
        rows.append({**key, "tok_per_s": each(lambda r: r["tok_per_s"]),
                     "speedup": each(lambda r: r["tok_per_s"] / runs["current"]["tok_per_s"], measured[1:]),
                     "block_backward_ms": each(lambda r: r.get("block_backward_ms")),
                     "final_loss": each(lambda r: r["final_loss"]),
                     "pow2_recast_fraction": runs["pow2"].get("recast_fraction") if "pow2" in runs else None})
    return rows


def gradient_scaling_markdown(rows):
    """the "FP8 output-gradient scaling" section: -fg current (DESIGN.md's) vs -fg delayed vs -fg pow2; "-": the run
    was not made, "n/a": its block backward rows are missing"""
    out = ["## FP8 output-gradient scaling: -fg current vs delayed vs pow2", "",
           "current reads each output gradient twice (an amax pass that also sums the bias, then the cast); delayed casts "
           "it in the bias pass with an amax history's scale; pow2 is current scaling with the scale rounded down to a "
           "power of two, cast in the bias pass with the last use's scale and cast again only where the amax crossed a "
           "power of two (attproj's and fcproj's amax comes from layernorm backward, as current's). Block backward = the -kt 1 rows of the four block "
           "linears' backward together, where those passes are charged; pow2 cast again = the share of its predicted "
           "casts whose scale was wrong, from the run's last line. Make delayed or pow2 the default only where it "
           "is faster here and its loss matches over a long run (scripts/compare_bf16_fp8.sh, "
           "RECIPES=\"delayed delayed+fg_delayed delayed+fg_pow2\"; dev/gpu_session.sh parity fg_delayed). -: not run.", "",
           "| model | recipe | optimizer | -fw | lm_head | tok/s current | delayed | pow2 | delayed / current | "
           "pow2 / current | block backward ms current | delayed | pow2 | final loss current | delayed | pow2 | "
           "pow2 cast again |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        measured = row["tok_per_s"]
        tok = ["-" if v is None else f"{v:.0f}" for v in measured]
        speedup = ["-" if v is None else f"{v:.3f}x" for v in row["speedup"]]
        ms = [("-" if m is None else "n/a") if v is None else f"{v:.3f}" for v, m in zip(row["block_backward_ms"], measured)]
        loss = ["-" if v is None else f"{v:.4f}" for v in row["final_loss"]]
        recast = row.get("pow2_recast_fraction")
        recast_cell = [("-" if measured[2] is None else "n/a") if recast is None else f"{100.0 * recast:.1f}%"]
        out.append(f"| {row['model']} | {row['recipe']} | {row['optimizer']} | {row['weight_scaling']} | {row['lm_head']} | "
                   + " | ".join(tok + speedup + ms + loss + recast_cell) + " |")
    return "\n".join(out + [""])


def setting_comparison(records, field, ms_field):
    """pairs the default and the other value of a VARIED_SETTINGS setting in each configuration: tok/s, the ms
    of the -kt 1 rows the setting is about (the record's ms_field) and final loss of each"""
    _, default, other = VARIED_SETTINGS[field]
    rows = []
    for key, pair in paired_runs(records, ("model", "precision", "recipe", "optimizer", "weight_scaling", "lm_head",
                                           "grad_scaling"), field, (default, other)):
        rows.append(dict(pair_row(key, pair[default], pair[other]),
                         setting_ms=(pair[default].get(ms_field), pair[other].get(ms_field))))
    return rows


def setting_markdown(field, heading, description, ms_label, rows):
    """a VARIED_SETTINGS comparison section: the default vs the other value, bf16 and FP8"""
    flag, default, other = VARIED_SETTINGS[field]
    a, b = f"{flag} {default}", f"{flag} {other}"
    out = [f"## {heading}: {a} vs {b}", "", description, "",
           f"| model | precision | recipe | tok/s {a} | tok/s {b} | {b} / {a} | {ms_label} ms {a} | {b} | final loss {a} | {b} |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        out.append(f"| {row['model']} | {row['precision']} | {row['recipe']} | " + pair_cells(row, "setting_ms"))
    return "\n".join(out + [""])


# (field, heading, description, the ms column's label, the record's ms field) of each VARIED_SETTINGS section
SETTING_SECTIONS = [
    ("gelu_fusion", "GELU backward fusion",
     "-ge 2 multiplies fcproj's dgrad by GELU's derivative in cuBLASLt's DGELU epilogue (reading the pre-activation in "
     "the GEMM) instead of a pass over fc's output gradient. GELU backward = the -kt 1 rows `matmul fcproj bwd`, "
     "`matmul fc bwd` and `gelu bwd` together. Both baselines gain from the faster setting: make it the default (-ge) "
     "where it is faster here for bf16 and FP8 alike, and compare FP8 with bf16 at the same -ge.",
     "GELU backward", "gelu_backward_ms"),
    ("attention_deterministic", "Attention backward",
     "-ad 0 runs cuDNN's flash-attention backward with float atomics instead of its deterministic algorithm, which "
     "writes and reads dP (B*NH*T*T bf16 a layer). Attention bwd = the -kt 1 row `attention bwd`. -ad 1 stays the "
     "default (runs and resumes repeat bit for bit); this says what -ad 0 buys a run that can do without.",
     "attention bwd", "attention_backward_ms"),
    ("fc_writes_codes", "FP8 GELU codes from fc's GEMM",
     "-fe 1 has fc's forward GEMM write fcproj's E4M3 x codes itself (cuBLASLt's GELU_AUX_BIAS epilogue with an E4M3 "
     "output under the delayed scale, the pre-activation as its bf16 aux) and a byte transpose make x^T, where -fe 0 "
     "writes the bf16 pre-activation and a GELU cast pass reads it (2 bytes an element in, 2 out). It needs -r 0, so it "
     "is made where the model runs at -r 0. fc forward = the -kt 1 rows `matmul fc fwd` and `gelu+fp8 cast fwd` (-fe 0), "
     "`matmul fc+gelu fp8 codes fwd` and `fp8 transpose gelu out` (-fe 1). Make it the default where it is faster here "
     "and its loss matches over a long run (dev/gpu_session.sh parity fc_codes).",
     "fc forward", "fc_forward_ms"),
    ("fp8_block_linears", "attproj in FP8 or bf16",
     "-f8 qkv,fc,fcproj runs attproj's three GEMMs in bf16: an FP8 attproj's GEMMs are faster, but its input, the "
     "attention output, takes a cast pass of its own (no kernel next to it writes the codes: cuDNN writes bf16), and its "
     "output gradient another (layernorm backward sums its bias and amax as it writes it, in both). attproj = the -kt 1 "
     "rows `fp8 cast attention out`, `matmul attproj fwd` and `matmul attproj bwd`. Drop attproj from -f8's default "
     "where it is faster here; FP8 pays more with C, whose square the GEMMs grow with and the casts only with C.",
     "attproj", "attproj_ms"),
]


def run_ranks(ranks, precision, steps, data_path, T, zero=1):
    """d12 with `ranks` processes on this GPU (same global batch) at ZeRO stage `zero`: median
    ms/step and the traffic (None: not started, --time-limit left too little time)"""
    B = RANKS_B // ranks
    cmd = [TRAINER, "-e", RANKS_MODEL, "-b", str(B), "-t", str(T), "-p", precision, "-x", str(steps), "-i", data_path,
           "-j", "", "-v", "0", "-s", "0", "-fn", "0", "-d", str(RANKS_B * T), "-z", str(zero)]
    record = {"model": RANKS_MODEL, "precision": precision, "ranks": ranks, "zero": zero, "B": B, "T": T,
              "command": ("NCCL_MULTI_RANK_GPU_ENABLE=1 " if ranks > 1 else "") + command_text(cmd) + (f" -pn {ranks} -pr R -pi fs -pf DIR" if ranks > 1 else "")}
    env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1")
    limit = program_limit(train_limit_s(steps))
    if limit is None:
        return None
    with tempfile.TemporaryDirectory(prefix="llm8_bench_ranks_") as fs_dir:
        rank_cmds = [cmd + (["-pn", str(ranks), "-pr", str(r), "-pi", "fs", "-pf", fs_dir] if ranks > 1 else []) for r in range(ranks)]
        print("running:", record["command"], flush=True)
        results = run_programs(rank_cmds, limit[0], env)
    if any(code != 0 for code, _, _ in results):
        errors = [failure_line(err, code, *limit) for code, _, err in results if code != 0]
        return dict(record, error="; ".join(errors))
    outputs = [(out, err) for _, out, err in results]
    steps_parsed, _ = parse_run(outputs[0][0])
    timed = [s for s in steps_parsed if s["step"] > WARMUP_STEPS]
    if not timed:
        return dict(record, error="no step lines parsed")
    record.update({"ms_per_step": statistics.median(s["ms"] for s in timed), "tok_per_s": statistics.median(s["tok_s"] for s in timed),
                   "traffic_bytes": parse_traffic(outputs[0][0])})
    return record


def ranks_markdown(records):
    """the multi-GPU section: payload per collective and the 2-rank overhead, bf16 vs FP8"""
    out = ["## Multi-GPU: 2 ranks on one GPU vs 1 rank\n",
           f"{RANKS_MODEL}, global batch {RANKS_B} x T. Payload = what the first step handed NCCL, by collective "
           "(the trainer's `comm |` line; ZeRO-3's per-layer gathers included). Overhead = ms/step with 2 ranks / ms/step "
           "with 1 rank.\n",
           "| precision | ranks | ZeRO | ms/step | tok/s | overhead | gradient reduce MB | amax all-reduce MB | FP8 weight gather MB | bf16 weight gather MB |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    one_rank = {r["precision"]: r for r in records if r.get("ranks") == 1 and "error" not in r}
    for r in records:
        zero = r.get("zero", 1)
        if "error" in r:
            out.append(f"| {r['precision']} | {r['ranks']} | {zero} | error: {r['error']} | | | | | | |")
            continue
        base = one_rank.get(r["precision"])
        overhead = f"{r['ms_per_step'] / base['ms_per_step']:.3f}x" if base and r["ranks"] > 1 else ""
        t = r.get("traffic_bytes", {})
        cells = [f"{t[k] / 1e6:.3f}" if k in t else "" for k in
                 ("gradient reduce", "FP8 weight amax all-reduce", "FP8 weight gather", "bf16 weight gather")]
        out.append(f"| {r['precision']} | {r['ranks']} | {zero} | {r['ms_per_step']:.2f} | {r['tok_per_s']:.0f} | {overhead} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def weight_cast_comparison(records):
    """pairs the -fw current and -fw delayed runs of each (model, recipe, optimizer), lm_head bf16, in
    the order measured: tok/s, optimizer + weight-cast ms and final loss of each, and delayed over current"""
    rows = []
    for key, pair in paired_runs(records, ("model", "recipe", "optimizer"), "weight_scaling", ("current", "delayed"),
                                 keep=lambda r: r.get("lm_head") == "bf16" and gradient_default(r)):
        current, delayed = pair["current"], pair["delayed"]
        cast_ms = (current["optimizer_weight_cast_ms"], delayed["optimizer_weight_cast_ms"])
        rows.append(dict(pair_row(key, current, delayed), optimizer_weight_cast_ms=cast_ms,
                         cast_ms_saved=cast_ms[0] - cast_ms[1] if None not in cast_ms else None))
    return rows


def weight_cast_markdown(rows):
    """the "FP8 weight cast" section: -fw current vs delayed, per model and optimizer"""
    out = ["## FP8 weight cast: -fw current vs delayed", "",
           "current: the optimizer step writes each weight's amax, then a cast pass reads the weights again and writes W "
           "and W^T; delayed: the optimizer step writes W's codes with the previous step's scale, and W^T is transposed "
           "from them. optimizer + cast is the -kt 1 rows of the optimizer step and `fp8 weight casts` together. Keep "
           "delayed as the default (-fw) only where it is faster and its loss matches.", "",
           "| model | recipe | optimizer | tok/s current | tok/s delayed | delayed / current | optimizer + cast ms current "
           "| delayed | saved ms | final loss current | delayed |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cast = ["n/a" if ms is None else f"{ms:.3f}" for ms in row["optimizer_weight_cast_ms"]]
        saved = "n/a" if row["cast_ms_saved"] is None else f"{row['cast_ms_saved']:.3f}"
        out.append(f"| {row['model']} | {row['recipe']} | {row['optimizer']} | {row['tok_per_s'][0]:.0f} | "
                   f"{row['tok_per_s'][1]:.0f} | {row['speedup']:.3f}x | {cast[0]} | {cast[1]} | {saved} | "
                   f"{row['final_loss'][0]:.4f} | {row['final_loss'][1]:.4f} |")
    return "\n".join(out + [""])


def parse_gemm_json(text):
    """./bench_gemm --json's lines as dicts; a line that is not one of its records raises ValueError naming it"""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"bench_gemm JSON line {number}: {e}") from None
        kind = record.get("record") if isinstance(record, dict) else None
        if kind not in GEMM_RECORD_FIELDS:
            raise ValueError(f"bench_gemm JSON line {number}: record {kind!r} is not one of {', '.join(GEMM_RECORD_FIELDS)}")
        missing = [k for k in GEMM_RECORD_FIELDS[kind] if k not in record]
        if missing:
            raise ValueError(f"bench_gemm JSON line {number}: {kind} record lacks {', '.join(missing)}")
        records.append(record)
    return records


def gemm_tables(stdout):
    """the per-model markdown tables ./bench_gemm prints, from the first model heading on"""
    lines = stdout.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("### ")), len(lines))
    return "\n".join(lines[first:]).strip()


def gemm_summary(records):
    """per model, in the order measured: B, the whole model's fwd+bwd ratio of each FP8 variant
    (None: not measured) and the DESIGN.md target"""
    rows = {}
    for r in records:
        if r["record"] == "time" and r["model"] not in rows:
            rows[r["model"]] = {"model": r["model"], "B": r["B"], "target": GEMM_TARGETS.get(r["model"]),
                                "ratios": {v: None for v in GEMM_FP8_VARIANTS}}
    for r in records:
        if r["record"] == "ratio" and r["linear"] == "total" and r["pass"] == "fwd+bwd" and r["variant"] in GEMM_FP8_VARIANTS:
            rows[r["model"]]["ratios"][r["variant"]] = r["ratio"]
    return list(rows.values())


def gemm_markdown(records, tables, command, device, commit, error=None):
    """the "Per-GEMM FP8 vs bf16" section of the benchmark's markdown"""
    out = ["## Per-GEMM FP8 vs bf16", "", f"device {device}, commit `{commit}`, command `{command}`"]
    if error is not None:
        return "\n".join(out + ["", f"error: {error}", ""])
    out += ["", "Ratios are bf16 time over FP8 time (above 1: FP8 is faster), for the whole model's linears: "
            "L x (qkv + attproj + fc + fcproj) + lm_head, forward + backward, each side doing the same work: fp8 and "
            "block are the GEMMs alone, against bf16's GEMMs alone (bf16-gemms: its backward without the bias "
            "gradient's pass over dy); the +cast variants, whose dy pass also sums the bias gradient, against bf16's "
            "backward with that pass. fp8 stands for the delayed and current recipes (the same GEMMs); +cast adds a standalone cast-transpose of x before the forward (the "
            "trainer fuses it into layernorm and GELU, except attproj's: an upper bound) and the dy pass (bias gradient, "
            "amax, cast, transpose) before the backward; block is the 1x128 / 128x128 block recipe; fp8+cast-fgd is "
            "fp8+cast with -fg delayed's dy pass (the cast in the bias pass: dy read once, not twice). The per-linear "
            "tables below also give wcast, the weight cast once per optimizer step.", "",
            "| model | B | fp8 | fp8+cast | block | block+cast | fp8+cast-fgd | target incl. casts (DESIGN.md section 7) |",
            "|---|---|---|---|---|---|---|---|"]
    for row in gemm_summary(records):
        cells = [f"{row['ratios'][v]:.2f}x" if row["ratios"][v] is not None else "n/a" for v in GEMM_FP8_VARIANTS]
        target = f">= {row['target']:.2f}x" if row["target"] is not None else "-"
        out.append(f"| {row['model']} | {row['B']} | " + " | ".join(cells) + f" | {target} |")
    return "\n".join(out + ["", tables, ""])


def run_gemm(models, quick, device, commit):
    """runs ./bench_gemm; returns (records, markdown section), or an error record and section, or None
    when --time-limit left too little time to start it"""
    iters, warmup = GEMM_ITERS[quick]
    json_path = os.path.join("build", "bench_gemm.jsonl")  # relative to ROOT, so the command is the one to type
    cmd = [GEMM_BENCH, "--models", ",".join(models), "--iters", str(iters), "--warmup", str(warmup), "--json", json_path]
    command = command_text(cmd)
    if not os.path.exists(GEMM_BENCH):  # the train runs do not need it: they are measured, this is reported
        error = f"./{os.path.basename(GEMM_BENCH)} is not built (make {os.path.basename(GEMM_BENCH)})"
        return [{"benchmark": "gemm", "error": error, "command": command}], gemm_markdown([], "", command, device, commit, error)
    limit = program_limit(GEMM_LIMIT_S)
    if limit is None:
        return None
    print("running:", command, flush=True)
    [(returncode, stdout, stderr)] = run_programs([cmd], limit[0])
    print(stdout, flush=True)
    error = None
    if returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        error = failure_line(stderr, returncode, *limit)
    else:
        try:
            with open(os.path.join(ROOT, json_path)) as f:
                records = parse_gemm_json(f.read())
        except (OSError, ValueError) as e:
            error = str(e)
    if error is not None:
        return [{"benchmark": "gemm", "error": error, "command": command}], gemm_markdown([], "", command, device, commit, error)
    for r in records:
        r.update({"benchmark": "gemm", "command": command})
    return records, gemm_markdown(records, gemm_tables(stdout), command, device, commit)


def write_report(base, records, gemm_section, run_info, complete):
    """base.json and base.md from the records so far. main() rewrites both after every record, so a
    run cut off (a device call's time limit) leaves what it measured, marked incomplete"""
    with open(base + ".json.tmp", "w") as f:
        json.dump(records, f, indent=1)
    os.replace(base + ".json.tmp", base + ".json")
    with open(base + ".md.tmp", "w") as f:
        f.write(f"# Benchmark {run_info['date']} on {run_info['device']}\n\ncommit `{run_info['commit']}`, command "
                f"`python3 dev/bench/bench.py{' --quick' if run_info['quick'] else ''}"
                f"{' --only ' + run_info['only'] if run_info.get('only') else ''}"
                f"{' --time-limit %d' % run_info['time_limit'] if run_info.get('time_limit') else ''}`, synthetic tokens, T={run_info['T']}, "
                f"{run_info['steps']} steps per run, medians over steps > {WARMUP_STEPS}. MFU against the bf16 dense peak, with llm.c's 6 N + 6 L C T FLOPs per token.\n\n")
        if run_info.get("not_run"):
            f.write(f"**Incomplete**: --time-limit {run_info['time_limit']} s was reached: {len(records)} records, "
                    f"{run_info['not_run']} programs not run.\n\n")
        elif not complete:
            f.write(f"**Incomplete**: this file is rewritten after every run; it stopped after {len(records)} records.\n\n")
        f.write(f"| model | precision | recipe | optimizer | -fw | -fg | lm_head | master | {SETTINGS_HEADS} | B | T | tok/s | "
                "ms/step | optimizer ms | MFU | peak mem MiB |\n" + "|---" * (15 + len(VARIED_SETTINGS)) + "|\n")
        for r in records:
            if r["benchmark"] != "train":
                continue
            if "error" in r:
                f.write(f"| {r.get('model', '?')} | {r.get('precision', '?')} | {r.get('recipe', '')} | {r.get('optimizer', '')} | "
                        f"{r.get('weight_scaling', '')} | {r.get('grad_scaling', '-')} | {r.get('lm_head', '')} | {master_text(r)} | "
                        f"{settings_cells(r)} | | | "
                        f"error: {r['error']} | | | | |\n")
                continue
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
            opt_ms = f"{r['optimizer_ms']:.3f}" if r["optimizer_ms"] is not None else "n/a"
            f.write(f"| {r['model']} | {r['precision']} | {r['recipe']} | {r['optimizer']} | {r['weight_scaling']} | "
                    f"{r.get('grad_scaling', '-')} | {r['lm_head']} | {master_text(r)} | {settings_cells(r)} | {r['B']} | "
                    f"{r['T']} | {r['tok_per_s']:.0f} | {r['ms_per_step']:.2f} | {opt_ms} | {mfu} | {r['peak_mem_mib']} |\n")
        comparison = weight_cast_comparison(records)
        if comparison:
            f.write(f"\n{weight_cast_markdown(comparison)}")
        gradient_rows = gradient_scaling_comparison(records)
        if gradient_rows:
            f.write(f"\n{gradient_scaling_markdown(gradient_rows)}")
        for field, heading, description, ms_label, ms_field in SETTING_SECTIONS:
            setting_rows = setting_comparison(records, field, ms_field)
            if setting_rows:
                f.write(f"\n{setting_markdown(field, heading, description, ms_label, setting_rows)}")
        lm_head_rows = lm_head_comparison(records)
        if lm_head_rows:
            f.write(f"\n{lm_head_markdown(lm_head_rows)}")
        if memory_rows(records):
            f.write(f"\n{memory_markdown(memory_rows(records))}")
        gpu_section = gpu_state_markdown(records)
        if gpu_section:
            f.write(f"\n{gpu_section}")
        if repeat_rows(records):
            f.write(f"\n{repeat_markdown(repeat_rows(records))}")
        floor_section = floor_markdown(records, run_info["device"])
        if floor_section:
            f.write(f"\n{floor_section}")
        if gemm_section:
            f.write(f"\n{gemm_section}")
        ranks_records = [r for r in records if r["benchmark"] == "ranks"]
        if ranks_records:
            f.write("\n" + ranks_markdown(ranks_records))
        for r in records:
            if r["benchmark"] == "train" and r.get("kernel_breakdown"):
                f.write(f"\n## {r['model']} {r['precision']} {r['recipe']} {r['optimizer']} -fw {r['weight_scaling']} "
                        f"-fg {r.get('grad_scaling', '-')} lm_head {r['lm_head']} master {master_text(r)} {settings_words(r)} B={r['B']}: "
                        f"per-kernel time\n\n`{r['command']}`\n\n{r['kernel_breakdown']}\n")
    os.replace(base + ".md.tmp", base + ".md")


# the start of the trainer's error on a machine without a GPU (llmc/cuda_common.h, cuda_device_count_or_die)
NO_GPU_ERROR = "no usable NVIDIA GPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="d12 and d48 only, fewer steps and GEMM launches (make gpucheck)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per configuration")
    parser.add_argument("--only", default="", help="comma-separated models to run, e.g. d48 (one device call each: "
                        "the file names carry them)")
    parser.add_argument("--out", default=os.path.join(ROOT, "doc", "benchmarks"))
    parser.add_argument("--time-limit", type=int, default=None, metavar="S",
                        help="wall seconds the whole benchmark may take: a program still running then is killed and "
                        f"recorded as stopped, none starts with under {MIN_PROGRAM_S} s left, and the report says how many "
                        "did not run (dev/gpu_session.sh first: a device call with a fixed budget)")
    args = parser.parse_args()
    kill_running_groups_on_sigterm()
    if args.time_limit is not None and args.time_limit < MIN_PROGRAM_S:
        sys.exit(f"error: --time-limit {args.time_limit}: expected at least {MIN_PROGRAM_S} seconds")
    global TIME_END
    TIME_END = None if args.time_limit is None else time.monotonic() + args.time_limit
    if not os.path.exists(TRAINER):  # a missing ./bench_gemm is reported in its section, after the train runs
        name = os.path.basename(TRAINER)
        sys.exit(f"error: ./{name} is not built; run make {name} first")

    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    if args.only:
        wanted = args.only.split(",")
        known = [model for model, _, _ in FULL_CONFIGS]
        if any(model not in known for model in wanted) or len(set(wanted)) != len(wanted):
            sys.exit(f"error: --only {args.only}: expected a comma list of distinct models from {', '.join(known)}")
        configs = [c for c in FULL_CONFIGS if c[0] in wanted]
    steps = args.steps or (12 if args.quick else 30)
    T = 1024
    max_tokens = max([B * T for _, B, _ in configs] + [RANKS_B * T]) * (steps + 2)
    data_dir = os.path.join(ROOT, "build", "bench_data")
    os.makedirs(data_dir, exist_ok=True)
    data_path = os.path.join(data_dir, "bench_train_000000.bin")
    write_synthetic_shard(data_path, max_tokens + 1)

    device, commit = gpu_name(), git_commit()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    run_info = {"date": date, "device": device, "commit": commit, "quick": args.quick, "only": args.only, "T": T, "steps": steps,
                "time_limit": args.time_limit, "not_run": 0}
    os.makedirs(args.out, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
    models = "-" + "-".join(model for model, _, _ in configs) if args.only else ""
    base = os.path.join(args.out, f"{date}-{slug}{'-quick' if args.quick else ''}{models}")
    records = []
    gemm_section = ""

    def add(new_records):
        for rec in new_records:
            if NO_GPU_ERROR in rec.get("error", ""):  # every run would fail alike: no report of errors only
                sys.exit(f"error: {rec['error']} (bench.py wrote no report)")
            rec.update({"device": device, "commit": commit, "date": date})
        records.extend(new_records)
        write_report(base, records, gemm_section, run_info, complete=False)

    for model, B, recompute in configs:
        for precision, recipe, optimizer, weights, lm_head, grads, master, settings in model_runs(model, recompute):
            rec = run_config(model, B, recompute, T, precision, recipe, optimizer, weights, lm_head, steps, data_path,
                             master, grads, settings)
            if rec is None:
                run_info["not_run"] += 1
                continue
            rec = with_floor(rec, device)
            add([dict(rec, benchmark="train")])
            print(json.dumps({k: v for k, v in rec.items() if k != "kernel_breakdown"}), flush=True)
            if rec.get("optimizer_ms") is not None:
                print(f"{model} {precision} {recipe} {optimizer} -fw {weights} -fg {grads} {settings_words(rec)}: "
                      f"optimizer step {rec['optimizer_ms']:.3f} ms", flush=True)
        for precision, recipe, optimizer, weights, lm_head, grads in reversed(DEFAULT_RUNS):
            rec = run_config(model, B, recompute, T, precision, recipe, optimizer, weights, lm_head, steps, data_path,
                             True, grads)
            if rec is None:
                run_info["not_run"] += 1
                continue
            add([dict(rec, benchmark="repeat")])

    gemm_models = [model for model, _, _ in configs if model in GEMM_TARGETS]
    gemm = run_gemm(gemm_models, args.quick, device, commit) if gemm_models else None
    if gemm is not None:
        gemm_records, gemm_section = gemm
        add(gemm_records)
    elif gemm_models:
        run_info["not_run"] += 1

    for precision in (("bf16", "fp8") if any(model == RANKS_MODEL for model, _, _ in configs) else ()):
        for ranks, zero in ((1, 1), (2, 1), (2, 3)):
            rec = run_ranks(ranks, precision, steps, data_path, T, zero)
            if rec is None:
                run_info["not_run"] += 1
                continue
            add([dict(rec, benchmark="ranks")])
            print(json.dumps(rec), flush=True)

    write_report(base, records, gemm_section, run_info, complete=True)
    print("wrote", base + ".md", "and", base + ".json")
    if run_info["not_run"]:
        print(f"--time-limit {args.time_limit} s reached: {run_info['not_run']} programs not run", flush=True)
    if any("error" in r for r in records) or run_info["not_run"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
