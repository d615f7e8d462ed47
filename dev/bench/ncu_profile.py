#!/usr/bin/env python3
"""
ncu_profile.py: Nsight Compute's hardware counters for llm8's own kernels in d12's training
step (B=64, T=1024, -r 0, the FP8 default run and the bf16 one, as make bench runs them), a
table row per kernel: how near it runs to DRAM bandwidth and to the SMs' instruction issue,
what L2 gives it, and at what occupancy.

Why: the memory-bound kernels run at 1.1 to 1.9 times their floors (doc/performance.md), and
what bounds the slow ones was argued from the machine code and from timing variants, never
read: the FP8 tile cast at about 2 TB/s (bytes or instruction issue or latency?), layernorm's
backward (shared-memory bank conflicts, fixed since without a measurement), the classifier's
second read of a row (from L2, as its design assumes?), adamw8's pass (153 instructions an
element: issue-bound as predicted?). The device tool's Firecracker machines run ncu with
hardware counters (--clock-control none, so the clocks stay as found); one call of this script
answers all four and any kernel after them.

What it does: runs the trainer for STEPS (2) steps under ncu, profiling every launch of the
kernels llmc/*.cuh defines (their names read from the sources, less the FP8 scaling state's
bookkeeping kernels, which move a few bytes), with the sections SpeedOfLight,
MemoryWorkloadAnalysis, Occupancy, LaunchStats and SchedulerStats; then reads the report as
CSV. A kernel's row takes its launches in the last step (the last 1/STEPS of them: the first
step of a delayed FP8 run casts with current scaling's two passes) and gives their median
duration, their sum (ms per step), and the medians of the counters. Writes, into --out,
profile.md (a table per run) and each run's whole CSV gzipped (ncu_<run>.csv.gz), so that a
counter the table leaves out can be read later without the GPU.

Usage: python3 dev/bench/ncu_profile.py [--runs fp8,bf16] [--steps 2] [--time-limit S] [--out DIR]
(dev/gpu_session.sh profile runs it; ncu from PATH, /usr/local/cuda/bin or /opt/nvidia/nsight-compute.)
"""
import argparse
import csv
import glob
import gzip
import io
import os
import re
import shlex
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the trainer, its synthetic data, and running a program within a limit)

ROOT = bench.ROOT
MODEL, B, T = "d12", 64, 1024
RUNS = {"fp8": ["-p", "fp8", "-fn", "0"], "bf16": ["-p", "bf16"]}  # each at its defaults, as make bench's default runs
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats", "SchedulerStats")
KERNEL_DEFINITION = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
BOOKKEEPING = re.compile(r"^fp8_scaling_|records_clear|codes_begin")  # a few bytes a launch: not worth a replay
MAX_LAUNCHES = 5000  # a bound on ncu's work should the filter match more than a short run launches

# the table's counters: (heading, the ncu metric's display name, its unit kind); "Memory Throughput" is
# named so in SpeedOfLight (% of peak) and in MemoryWorkloadAnalysis (bytes a second): the unit tells
COUNTERS = (("DRAM % of peak", "DRAM Throughput", "percent"),
            ("memory GB/s", "Memory Throughput", "rate"),
            ("L2 hit %", "L2 Hit Rate", "percent"),
            ("SM % of peak", "Compute (SM) Throughput", "percent"),
            ("issue % (a warp eligible)", "One or More Eligible", "percent"),
            ("achieved occupancy %", "Achieved Occupancy", "percent"),
            ("registers", "Registers Per Thread", "count"))
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
RATE_UNITS = {"byte/second": 1e-9, "Kbyte/second": 1e-6, "Mbyte/second": 1e-3, "Gbyte/second": 1.0,
              "Tbyte/second": 1e3, "byte/s": 1e-9}


class CliError(Exception):
    pass


def kernel_names(root=ROOT):
    """the kernels llmc/*.cuh defines, less the scaling state's bookkeeping"""
    names = set()
    for path in glob.glob(os.path.join(root, "llmc", "*.cuh")):
        with open(path) as f:
            names.update(KERNEL_DEFINITION.findall(f.read()))
    return sorted(name for name in names if not BOOKKEEPING.search(name))


def find_ncu():
    found = shutil.which("ncu")
    candidates = [found] if found else []
    candidates += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ncu")]
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def short_name(kernel):
    """a demangled kernel name without 'void ' and its parameter list (its template arguments stay: they tell the
    tile cast's transforms apart)"""
    name = kernel[5:] if kernel.startswith("void ") else kernel
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def number(text):
    return float(text.replace(",", ""))


def parse_details(text):
    """ncu --csv --page details: [(launch id, kernel, {metric name: [(unit, value)]})] in launch order"""
    rows = list(csv.reader(io.StringIO(text)))
    header_at = next((i for i, row in enumerate(rows) if {"ID", "Kernel Name", "Metric Name", "Metric Value"} <= set(row)),
                     None)
    if header_at is None:
        raise CliError("ncu's CSV has no header with ID, Kernel Name, Metric Name and Metric Value")
    header = rows[header_at]
    column = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
              if name in header}
    launches = {}
    for row in rows[header_at + 1:]:
        if len(row) != len(header):
            continue
        try:
            launch = int(row[column["ID"]])
            value = number(row[column["Metric Value"]])
        except ValueError:
            continue
        unit = row[column["Metric Unit"]] if "Metric Unit" in column else ""
        kernel, metrics = launches.setdefault(launch, (row[column["Kernel Name"]], {}))
        metrics.setdefault(row[column["Metric Name"]], []).append((unit, value))
    return [(launch, kernel, metrics) for launch, (kernel, metrics) in sorted(launches.items())]


def metric(metrics, name, kind):
    """one launch's value of a counter in the table's units (us, GB/s, % or a count), or None"""
    for unit, value in metrics.get(name, []):
        if kind == "time" and unit in TIME_UNITS:
            return value * TIME_UNITS[unit]
        if kind == "rate" and unit in RATE_UNITS:
            return value * RATE_UNITS[unit]
        if kind == "percent" and unit == "%":
            return value
        if kind == "count" and unit not in TIME_UNITS and unit not in RATE_UNITS and unit != "%":
            return value
    return None


def kernel_rows(launches, steps):
    """a row per kernel: its launches of the last step (the last 1/steps of its launches), their median duration
    in us and sum in ms, and each counter's median over them; the most ms first"""
    by_kernel = {}
    for _, kernel, metrics in launches:
        by_kernel.setdefault(short_name(kernel), []).append(metrics)
    rows = []
    for name, all_metrics in by_kernel.items():
        last_step = all_metrics[len(all_metrics) - max(1, len(all_metrics) // steps):]
        durations = [d for d in (metric(m, "Duration", "time") for m in last_step) if d is not None]
        row = {"kernel": name, "launches": len(last_step), "median_us": statistics.median(durations) if durations else None,
               "ms_per_step": sum(durations) / 1e3 if durations else None}
        for heading, metric_name, kind in COUNTERS:
            values = [v for v in (metric(m, metric_name, kind) for m in last_step) if v is not None]
            row[heading] = statistics.median(values) if values else None
        rows.append(row)
    return sorted(rows, key=lambda r: -(r["ms_per_step"] or 0.0))


def table(rows, title):
    heads = ["kernel", "launches a step", "median us", "ms a step"] + [heading for heading, _, _ in COUNTERS]
    lines = [f"### {title}", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        cells = [f"`{r['kernel']}`", str(r["launches"])]
        cells += ["-" if r[key] is None else f"{r[key]:.{digits}f}" for key, digits in (("median_us", 1), ("ms_per_step", 3))]
        cells += ["-" if r[heading] is None else f"{r[heading]:.0f}" for heading, _, _ in COUNTERS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_run(ncu, run, steps, data_path, out, limit_s):
    """one run under ncu; returns (its table's markdown, or an error line)"""
    trainer = [bench.TRAINER, "-e", MODEL, "-b", str(B), "-t", str(T), "-x", str(steps), "-i", data_path, "-j", "",
               "-v", "0", "-s", "0", "-r", "0"] + RUNS[run]
    report = os.path.join(ROOT, "build", "profile", f"ncu_{run}")  # the whole report stays on the machine
    names = kernel_names()
    command = [ncu, "--clock-control", "none", "--kernel-name-base", "function",
               "--kernel-name", "regex:^(?:" + "|".join(names) + r")\b", "--launch-count", str(MAX_LAUNCHES),
               "--export", report, "--force-overwrite"]
    for section in SECTIONS:
        command += ["--section", section]
    print("running:", shlex.join(command[:4]), "... (llmc's kernels, the sections)", bench.command_text(trainer), flush=True)
    started = time.monotonic()
    [(code, stdout, stderr)] = bench.run_programs([command + trainer], limit_s)
    if code != 0:
        print(stdout[-3000:], stderr[-3000:], file=sys.stderr)
        return f"{run}: ncu failed ({bench.failure_line(stderr or stdout, code, limit_s)})"
    [(code, details, stderr)] = bench.run_programs([[ncu, "--import", report + ".ncu-rep", "--csv", "--page", "details",
                                                     "--print-units", "base", "--print-kernel-base", "demangled"]], 300)
    if code != 0:
        return f"{run}: ncu --import failed ({bench.failure_line(stderr or details, code)})"
    with gzip.open(os.path.join(out, f"ncu_{run}.csv.gz"), "wt") as f:
        f.write(details)
    try:
        launches = parse_details(details)
    except CliError as e:  # another ncu's CSV layout: the CSV came back, for a parser fix without the GPU
        return f"{run}: {e} (ncu_{run}.csv.gz holds what ncu printed)"
    title = (f"d12 {run}, B={B} T={T} -r 0, the last of {steps} steps ({len(launches)} launches profiled in "
             f"{time.monotonic() - started:.0f} s)")
    return table(kernel_rows(launches, steps), title)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="fp8,bf16", help="comma list of fp8 and bf16 (default fp8,bf16), in that order")
    parser.add_argument("--steps", type=int, default=2, help="training steps a run, 1..10 (default 2); the last is tabled")
    parser.add_argument("--time-limit", type=float, default=0, help="seconds for all the runs (0: none)")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "profile"), help="directory for profile.md and the CSVs "
                        "(the ncu reports go to build/profile)")
    return parser


def run(argv):
    args = build_parser().parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    if not runs or any(r not in RUNS for r in runs):
        raise CliError(f"--runs {args.runs}: expected a comma list of {', '.join(RUNS)}")
    if not 1 <= args.steps <= 10:
        raise CliError(f"--steps {args.steps}: expected 1..10")
    if args.time_limit < 0:
        raise CliError(f"--time-limit {args.time_limit}: expected seconds, or 0 for none")
    ncu = find_ncu()
    if ncu is None:
        raise CliError("ncu (Nsight Compute) not found on PATH, in $CUDA_HOME/bin or under /opt/nvidia/nsight-compute")
    if not os.access(bench.TRAINER, os.X_OK):
        raise CliError(f"{bench.TRAINER} is not built (make train_gpt2_fp8)")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "build", "profile"), exist_ok=True)
    data_path = os.path.join(ROOT, "build", "bench_data", "profile_train_000000.bin")
    os.makedirs(os.path.dirname(data_path), exist_ok=True)
    bench.write_synthetic_shard(data_path, B * T * (args.steps + 1) + 1)
    bench.kill_running_groups_on_sigterm()
    end = time.monotonic() + args.time_limit if args.time_limit else None
    sections = []
    for r in runs:
        left = end - time.monotonic() if end else 3600.0
        sections.append(profile_run(ncu, r, args.steps, data_path, args.out, left) if left >= 10 else
                        f"{r}: not run (--time-limit reached)")
        with open(os.path.join(args.out, "profile.md"), "w") as f:  # rewritten after every run: a cut call keeps what ran
            f.write(f"## Nsight Compute counters of llm8's kernels ({ncu})\n\n" + "\n\n".join(sections) + "\n")
        print(sections[-1], flush=True)


def main(argv=None):
    try:
        run(sys.argv[1:] if argv is None else argv)
    except CliError as e:
        print(f"error: ncu_profile.py: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
