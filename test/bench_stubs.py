"""
What dev/bench/bench.py reads from ./train_gpt2_fp8 and ./bench_gemm, in the formats those
print: each format is taken from its producer's source (the trainer's progress printf,
llmc/profiler.h's breakdown, llmc/zero_comm.cuh's `comm |` line, bench_gemm.cu's headings and
model sizes), so a change there shows up in the bench tests, not on a GPU. And stand-ins for the
two executables built on them (`python3 test/bench_stubs.py trainer|bench_gemm ARGS`; install()
writes them as executables), for test/test_bench_main.py: the stub trainer checks its flags
against the trainer's flag table, prints figures that follow from its flags (progress(),
breakdown_rows(), traffic_mb(); the tests derive what bench.py must report from the same
functions) and fails the runs trainer_failure() names.

No pytest and no numpy here: the stubs start once per benchmark run.
"""
import hashlib
import json
import os
import random
import re
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER_SOURCE = os.path.join(ROOT, "train_gpt2_fp8.cu")
FP8_MODEL_SOURCE = os.path.join(ROOT, "llmc", "fp8_model.cuh")
# the stub's -fg pow2 runs: of every 40 predicted output-gradient casts, 7 cast again
STUB_PREDICTIONS, STUB_RECASTS = 40, 7
GEMM_SOURCE = os.path.join(ROOT, "dev", "bench", "bench_gemm.cu")
LINEARS = ["qkv", "attproj", "fc", "fcproj", "lm_head", "total"]


def read(path):
    with open(path) as f:
        return f.read()


# ---- formats, from the producers' sources ----------------------------------------------

def progress_format():
    match = re.search(r'printf\("(step %5d/%d \| loss[^"]*)\\n"', read(TRAINER_SOURCE))
    assert match, "progress line printf not found in train_gpt2_fp8.cu"
    return match.group(1)


def memory_line_format():
    """the trainer's startup `memory |` printf format (persistent bytes per parameter, optimizer state)"""
    match = re.search(r'printf\("(memory \| persistent [^"]*)\\n"', read(TRAINER_SOURCE))
    assert match, "the memory line printf not found in train_gpt2_fp8.cu"
    return match.group(1)


def predictions_line_format():
    """-fg pow2's last line (llmc/fp8_model.cuh's fp8_model_print_predictions), as a Python % format"""
    match = re.search(r'printf\("(fp8 \| -fg pow2: [^"]*)\\n"', read(FP8_MODEL_SOURCE))
    assert match, "the -fg pow2 predictions printf not found in llmc/fp8_model.cuh"
    return match.group(1).replace("%llu", "%d")


def breakdown_text(rows):
    """a -kt 1 breakdown in llmc/profiler.h's format (its fprintf formats, filled in)"""
    source = read(os.path.join(ROOT, "llmc", "profiler.h"))
    row_format = re.search(r'fprintf\(out, "(\| %s \| %\.3f \| %\.1f%% \| %ld \|)\\n"', source)
    assert row_format, "the breakdown's row fprintf not found in llmc/profiler.h"
    lines = ["kernel breakdown over 8 steps (ms per step):", "| kernel | ms/step | share | calls/step |", "|---|---|---|---|"]
    lines += [row_format.group(1) % (name, ms, 10.0, 1) for name, ms in rows]
    return "\n".join(lines)


def comm_line(values_mb, reduce_type):
    """the trainer's `comm |` line, built from zero_comm_print_traffic's own formats and names"""
    source = read(os.path.join(ROOT, "llmc", "zero_comm.cuh"))
    body = source[source.index("static void zero_comm_print_traffic"):]
    body = body[:body.index("\n}\n")]
    names = re.findall(r'"([^"]+)"', re.search(r"ZERO_TRAFFIC_NAMES\[ZERO_TRAFFIC_KINDS\] = \{([^}]*)\}", source, re.S).group(1))
    head, item, reduce_note, tail = re.findall(r'printf\("((?:[^"\\]|\\.)*)"', body)
    assert len(names) == len(values_mb) == 4, names
    line = head % 1
    for k, (name, mb) in enumerate(zip(names, values_mb)):
        line += item % ("" if k == 0 else ",", name, mb)
        if k == 0:
            line += reduce_note % reduce_type
    return line + tail.replace("\\n", "\n") % sum(values_mb), names


def gemm_models():
    """{model: B} of ./bench_gemm, in its order (BENCH_MODEL_NAMES, BENCH_MODEL_BATCH)"""
    source = read(GEMM_SOURCE)
    names = re.findall(r'"(\w+)"', re.search(r"BENCH_MODEL_NAMES\[BENCH_NUM_MODELS\] = \{([^}]*)\}", source).group(1))
    batches = re.search(r"BENCH_MODEL_BATCH\[BENCH_NUM_MODELS\] = \{([^}]*)\}", source).group(1).split(",")
    return dict(zip(names, (int(b) for b in batches)))


def gemm_heading_format():
    match = re.search(r'printf\("\\n(### %s: [^"]*)\\n\\n"', read(GEMM_SOURCE))
    assert match, "the per-model heading printf not found in bench_gemm.cu"
    return match.group(1)


def synthetic_gemm_json(rng, models=(("d12", 64, True), ("d48", 16, False))):
    """bench_gemm-shaped JSON lines with random figures for (model, B, block recipe measured), and
    the whole-model fwd+bwd ratios in them"""
    lines = [{"record": "run", "device": "Fake GPU", "cublaslt_version": 1, "iters": 5, "warmup": 2, "repeats": 5, "T": 1024}]
    expected = {}
    for model, B, has_block in models:
        variants = ["bf16", "bf16-gemms", "fp8", "fp8+cast"] + (["block", "block+cast"] if has_block else []) + ["fp8+cast-fgd"]
        for linear in LINEARS:
            for p in ("fwd", "bwd", "fwd+bwd"):
                for v in variants:
                    lines.append({"record": "time", "model": model, "linear": linear, "B": B, "T": 1024, "pass": p,
                                  "variant": v, "derived": linear == "total", "ms": rng.uniform(0.1, 5.0),
                                  "tflops": rng.uniform(100, 1500)})
                for v in variants[2:]:  # ratios of the FP8 variants (bench_baseline: bf16-gemms or bf16)
                    ratio = rng.uniform(0.5, 2.5)
                    lines.append({"record": "ratio", "model": model, "linear": linear, "B": B, "T": 1024, "pass": p,
                                  "variant": v, "ratio": ratio})
                    if linear == "total" and p == "fwd+bwd":
                        expected[(model, v)] = ratio
        if not has_block:
            lines.append({"record": "skip", "model": model, "variant": "block", "reason": "block recipe not measured: this cuBLASLt has no block-scaled algorithm for qkv's forward"})
    return "\n".join(json.dumps(line) for line in lines) + "\n", expected


def train_flags():
    """the trainer's flag table (llmc/train_config.h's TRAIN_FLAGS): {flag: its choices, or None}"""
    source = read(os.path.join(ROOT, "llmc", "train_config.h"))
    table = source[source.index("TRAIN_FLAGS[] = {"):]
    table = table[:table.index("\n};")]
    flags = {name: choices.strip('"').split() if choices != "NULL" else None for name, choices in
             re.findall(r'\{"(-\w+)", FLAG_\w+, TC_OFF\(\w+\), [^,]+, [^,]+, (NULL|"[^"]*")', table)}
    assert len(flags) == table.count('{"-'), "a TRAIN_FLAGS entry the pattern does not read"
    return flags


# ---- the stub trainer's figures --------------------------------------------------------

MODEL_MS = {"d12": 120.0, "d24": 210.0, "d36": 400.0, "d48": 640.0}
# the -fg values whose output-gradient cast is one pass (pow2: with a predicted scale, a recast where it was wrong):
# the stub runs them alike, a little faster than -fg current
ONE_PASS_GRAD_SCALINGS = ("delayed", "pow2")
WARMUP = 3  # the steps the stub makes slow (bench.py's WARMUP_STEPS drops them)


def fp8_attproj(flags):
    """whether the run's attproj is FP8: an FP8 run whose -f8 (default: the four block linears) names it or is all"""
    linears = flags.get("-f8", "qkv,attproj,fc,fcproj").split(",")
    return flags["-p"] == "fp8" and ("attproj" in linears or "all" in linears)


def trainer_failure(flags):
    """the error line of a run the stub fails (None: it runs): d48 with the block recipe, and
    rank 1 of FP8 ZeRO-3"""
    if flags["-e"] == "d48" and flags.get("-fr") == "block":
        return "error: out of memory: the block recipe's scales (stub)"
    if flags["-p"] == "fp8" and flags.get("-z") == "3" and flags.get("-pr") == "1":
        return "error: rank 1: the weight gather timed out (stub)"
    return None


# a run made again with the same flags in the same directory is this much slower for each time before (a GPU
# that warmed up over the benchmark): bench.py's "Repeatability" section must show it
REPEAT_SLOWDOWN = 1.02


def earlier_runs(args):
    """how many times the stub trainer ran these arguments before in its working directory (counted in a file there)"""
    os.makedirs(".stub_runs", exist_ok=True)
    path = os.path.join(".stub_runs", hashlib.sha256(shlex.join(args).encode()).hexdigest())
    count = int(read(path)) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(count + 1))
    return count


def progress(flags, step, repeat=0):
    """the figures of one progress line, as printed (ms, tok/s, MFU text, mem MiB, loss): each flag
    that bench.py varies changes them, the warmup steps are slow, ms grows with the step, and with
    each repeat of the same run (REPEAT_SLOWDOWN)"""
    fp8, ranks = flags["-p"] == "fp8", int(flags["-pn"])
    batch = int(flags["-d"]) if flags["-d"] != "-1" else int(flags["-b"]) * int(flags["-t"]) * ranks
    factor = (0.8 if fp8 else 1.0) * {"current": 1.03, "block": 1.1}.get(flags.get("-fr"), 1.0)
    factor *= (0.98 if flags.get("-fw") == "delayed" else 1.0) * (0.95 if flags.get("-f8") == "all" else 1.0)
    factor *= 0.97 if flags.get("-fg") in ONE_PASS_GRAD_SCALINGS else 1.0
    factor *= 0.98 if flags.get("-ge") == "2" else 1.0
    factor *= 0.96 if flags.get("-ad") == "0" else 1.0
    factor *= 0.99 if flags.get("-fe") == "1" else 1.0
    factor *= 1.0 if fp8_attproj(flags) or not fp8 else 0.995
    factor *= 1.02 if flags.get("-w") == "0" else 1.0
    factor *= (1.01 if flags["-opt"] == "adamw8" else 1.0) * (1.1 if ranks > 1 else 1.0) * (1.05 if flags["-z"] == "3" else 1.0)
    factor *= REPEAT_SLOWDOWN ** repeat
    ms = round(MODEL_MS[flags["-e"]] * factor * batch / 65536 * (1 + step / 100) * (3 if step <= WARMUP else 1), 2)
    # n/a: as on a GPU whose peak the trainer does not know
    mfu = "n/a" if (flags["-e"], flags["-opt"]) == ("d48", "adamw8") else "%.1f%%" % (4000 / ms)
    return {"ms": ms, "tok_s": int("%.0f" % (batch / (ms / 1000))), "mfu": mfu,
            "mem_mib": 9000 * (int(flags["-e"][1:]) // 12) + (1000 if fp8 else 0) - (500 if flags.get("-w") == "0" else 0) + step,
            "loss": round(11.0 - 0.125 * step, 6)}


def memory_figures(flags):
    """what the stub's `memory |` line reports, as bench.py's parse_memory names it: the whole model's
    persistent bytes per parameter, those of the 8-bit tensors and their share (adamw8), the m+v GiB"""
    master = flags.get("-w", "1") == "1"
    eight_bit = flags["-opt"] == "adamw8"
    return {"persistent_bytes_per_param": (11.5 if master else 7.5) if eight_bit else (16.0 if master else 12.0),
            "eight_bit_bytes_per_param": (10.031 if master else 6.031) if eight_bit else None,
            "eight_bit_share_pct": 68.3 if eight_bit else None,
            "optimizer_state_gib": round(int(flags["-e"][1:]) * (0.12 if eight_bit else 0.46), 2)}


def breakdown_rows(flags):
    """the -kt 1 rows: the four block linears' backward (where -fg changes the output-gradient passes, and -ge 2
    fc's), FP8's fc forward and GELU cast (-fe 1: the GEMM writing the codes and the transpose, less time), bf16's GELU
    backward (not with -ge 2), the attention backward (faster with -ad 0), the optimizer step's, the FP8 weight
    casts' (after it) in an FP8 run, and an FP8 attproj's input cast"""
    scale = int(flags["-e"][1:]) / 12
    backward = (1.5 if flags["-p"] == "bf16" else 1.0 if flags.get("-fg") in ONE_PASS_GRAD_SCALINGS else 1.125) * scale
    rows = [("encoder fwd", 0.25)] + [(f"matmul {linear} bwd", backward) for linear in ("qkv", "attproj", "fcproj")]
    if flags["-p"] == "fp8":  # fc's forward and the GELU that makes fcproj's input (-fe 1: the GEMM writes the codes)
        rows += [("matmul fc+gelu fp8 codes fwd", 0.25 * scale), ("fp8 transpose gelu out", 0.125 * scale)] \
            if flags.get("-fe") == "1" else [("matmul fc fwd", 0.25 * scale), ("gelu+fp8 cast fwd", 0.375 * scale)]
    rows.insert(3, ("matmul fc bwd", backward * (0.9 if flags.get("-ge") == "2" else 1.0)))  # -ge 2: no GELU in fc's dy pass
    if flags["-p"] == "bf16" and flags.get("-ge") != "2":  # GELU's backward kernel: -ge 2 puts it in fcproj's dgrad
        rows.append(("gelu bwd", 0.5 * scale))
    rows.append(("attention bwd", (0.625 if flags.get("-ad") == "0" else 1.25) * scale))
    rows += [(flags["-opt"], (2.5 if flags["-opt"] == "adamw" else 1.75) * scale)]
    if flags["-p"] == "fp8":
        rows.append(("fp8 weight casts", (0.25 if flags.get("-fw") == "delayed" else 0.875) * scale))
    if fp8_attproj(flags):
        rows.append(("fp8 cast attention out", 0.125 * scale))
    return rows


def traffic_mb(flags):
    """the payload of each collective in the `comm |` line of a multi-rank run, in MB"""
    fp8, zero3 = flags["-p"] == "fp8", flags["-z"] == "3"
    return [248.9, 0.000192 if fp8 else 0.0, 42.5 if fp8 and zero3 else 0.0, 79.25 if zero3 and not fp8 else 0.0]


# ---- the stubs -------------------------------------------------------------------------

def die(message):
    print(message, file=sys.stderr)
    return 1


def trainer_flags(args):
    """the flags of a trainer command line (after the program), checked as the trainer checks them
    (ValueError: the trainer's error line), over the defaults the stub's figures read"""
    table = train_flags()
    if len(args) % 2:
        raise ValueError(f"error: flag {args[-1]} needs a value (see --help)")
    flags = {"-d": "-1", "-z": "1", "-opt": "adamw", "-kt": "0", "-pn": "1", "-pr": "0"}
    for name, value in zip(args[::2], args[1::2]):
        if name not in table:
            raise ValueError(f"error: unknown flag '{name}' (see --help for the list)")
        if table[name] is not None and value not in table[name]:
            raise ValueError(f"error: flag {name}: '{value}' is not one of: {' '.join(table[name])}")
        flags[name] = value
    return flags


def trainer(args):
    """./train_gpt2_fp8: flags and data checked, then the output of -x steps"""
    try:
        flags = trainer_flags(args)
    except ValueError as e:
        return die(str(e))
    if not os.path.isfile(flags.get("-i", "")):
        return die(f"error: no train data shard '{flags.get('-i', '')}'")
    with open(flags["-i"], "rb") as f:
        if int.from_bytes(f.read(4), "little") != 20240520:
            return die(f"error: {flags['-i']}: not a token shard")
    if flags["-pn"] != "1" and not os.path.isdir(flags.get("-pf", "")):
        return die("error: -pi fs needs the directory -pf while every rank runs")
    failure = trainer_failure(flags)
    if failure is not None:
        return die(failure)
    repeat = earlier_runs(args)
    if repeat and os.environ.get("LLM8_STUB_FAIL_REPEATS") == "1":  # a GPU that fails later in the benchmark
        return die("error: CUDA error: an illegal memory access was encountered (stub)")
    if os.environ.get("LLM8_STUB_NO_GPU") == "1":  # a machine without a GPU (bench.py's test)
        return die("error: no usable NVIDIA GPU here (the CUDA runtime says: stub): llm8 needs a GPU")
    # a run that hangs (bench.py --time-limit's test): LLM8_STUB_HANG="FLAG VALUE" names the runs
    hang = os.environ.get("LLM8_STUB_HANG", "").split()
    if hang and flags.get(hang[0]) == hang[1]:
        time.sleep(600)
    if flags["-pr"] != "0":  # the other ranks print only their errors
        return 0
    memory = memory_figures(flags)
    eight_bit = "" if memory["eight_bit_bytes_per_param"] is None else \
        f"; {memory['eight_bit_bytes_per_param']:.3f} for the {memory['eight_bit_share_pct']:.1f}% of parameters with 8-bit states, -qs default"
    print(memory_line_format() % (memory["persistent_bytes_per_param"], ", fp32 master" if flags.get("-w", "1") == "1" else "",
                                  "8-bit" if flags["-opt"] == "adamw8" else "fp32", eight_bit, flags["-opt"],
                                  memory["optimizer_state_gib"], "", 1234.0))
    fmt, steps = progress_format(), int(flags["-x"])
    for step in range(1, steps + 1):
        if step == 1 and flags["-pn"] != "1":
            print(comm_line(traffic_mb(flags), "bf16")[0], end="")
        p = progress(flags, step, repeat)
        print(fmt % (step, steps, p["loss"], 1.5, 6e-4, p["ms"], p["tok_s"], p["mfu"], "0h00m01s", p["mem_mib"], ""))
    if flags.get("-fg") == "pow2":  # before the breakdown, as the trainer prints it
        print(predictions_line_format() % (STUB_PREDICTIONS, STUB_RECASTS, 100.0 * STUB_RECASTS / STUB_PREDICTIONS))
    if flags["-kt"] == "1":
        print(breakdown_text(breakdown_rows(flags)))
    return 0


GEMM_SEED = 7
MODEL_SHAPES = {"d12": (12, 768), "d24": (24, 1024), "d36": (36, 1280), "d48": (48, 1600)}


def gemm_json(models):
    """the stub ./bench_gemm's JSON lines for `models` and their whole-model fwd+bwd ratios (d48
    without the block recipe, as when cuBLASLt has no algorithm for it)"""
    batch = gemm_models()
    return synthetic_gemm_json(random.Random(GEMM_SEED), [(m, batch[m], m != "d48") for m in models])


def gemm_table(model):
    """the stub's markdown for one model: bench_gemm.cu's heading, then a table"""
    L, C = MODEL_SHAPES[model]
    B = gemm_models()[model]
    return "\n".join(["", gemm_heading_format() % (model, L, C, B, 1024, B * 1024), "",
                      "| linear | K | OC | pass | bf16 ms | TFLOP/s |", "|---|---|---|---|---|---|",
                      f"| qkv | {C} | {3 * C} | fwd | 1.0000 | 500 |"])


def bench_gemm(args):
    """./bench_gemm --models LIST --iters N --warmup N --algorithms N --json PATH (--algorithms: no table here)"""
    options = dict(zip(args[::2], args[1::2]))
    if len(args) % 2 or set(options) - {"--models", "--iters", "--warmup", "--algorithms", "--json"}:
        return die(f"error: bad arguments {args}")
    models = options.get("--models", ",".join(gemm_models())).split(",")
    if set(models) - set(gemm_models()) or int(options.get("--iters", 1)) < 1 or int(options.get("--warmup", 0)) < 0:
        return die(f"error: bad arguments {args}")
    print("bench_gemm on Fake GPU, cuBLASLt 1: ms per launch (stub)")
    for model in models:
        print(gemm_table(model))
        if int(options.get("--algorithms", 0)) > 0:  # bench_gemm.cu's bench_print_algorithms, in short
            print(f"\n#### {model}: cuBLASLt's first algorithm (training's) against the fastest of the first "
                  f"{options['--algorithms']} it lists\n\n| linear | GEMM | precision | listed | first ms | fastest ms | "
                  "fastest rank | first / fastest |\n|---|---|---|---|---|---|---|---|\n"
                  "| qkv | fwd | fp8 | 3 | 0.2000 | 0.1800 | 2 | 1.111x |\n| total | all | fp8 | - | 10.0000 | 9.0000 | - | 1.111x |")
    if "--json" in options:
        with open(options["--json"], "w") as f:
            f.write(gemm_json(models)[0])
    return 0


def install(directory):
    """writes ./train_gpt2_fp8 and ./bench_gemm stubs into `directory`; returns their paths"""
    paths = []
    for name, kind in (("train_gpt2_fp8", "trainer"), ("bench_gemm", "bench_gemm")):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} {kind} \"$@\"\n")
        os.chmod(path, 0o755)
        paths.append(path)
    return paths


if __name__ == "__main__":
    sys.exit({"trainer": trainer, "bench_gemm": bench_gemm}[sys.argv[1]](sys.argv[2:]))
