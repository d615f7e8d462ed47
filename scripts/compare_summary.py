"""
The table scripts/compare_bf16_fp8.sh writes ($OUT/summary.md) and prints: each run's val loss
and median throughput, each against the baseline (bf16 with fp32 AdamW where it ran, else the
first run), and each adamw8 run's val loss against its precision's fp32 AdamW run.

    python3 scripts/compare_summary.py OUT RUN [RUN...] [--batch 16] [--seq 1024] [--total-batch D] [--gpus N] [--write PATH]

Each RUN is a directory under OUT holding the trainer's main.jsonl (README.md: one JSON object a
line, {"step":..,"type":"train","loss":..,"tok_per_s":..,...} per step and
{"step":..,"type":"val","loss":..} per val loss; when a step appears twice, a resumed run, the
later line wins). The runs are compared at the last val step after step 0 that every run has (as
scripts/plot.py compares them), so runs that end at different steps are not compared as if
equal; when they share none, one error line says so and the exit status is 1 (nothing written).
A non-finite val loss (main.jsonl's null) is a value, NaN, not a missing one: a run that diverged
is compared at its steps like any other, its row says nan, and after the table one error line
names it and the exit status is 1 (a diverged run never passes as at parity).
Throughput is the median tok/s of the train steps from step 10 on (the first 10 include startup
and warmup); the header says the B and T (and -d, and the GPUs when more than one) it was measured
at, and a run with no step that
late gets '-' with a footnote saying why. --write PATH also writes the table there.
"""

import argparse
import json
import math
import os
import statistics
import sys

from plot import comparison_step  # the step scripts/plot.py compares the runs at

FIRST_TIMED_STEP = 10  # tok/s: the train steps from this one on (the first ones include startup and warmup)
NO_TOK_NOTE = "(1)"


class SummaryError(Exception):
    """one line saying what is wrong with the runs, for an error: line"""


def read_run(path):
    """({step: val loss}, {step: tok/s}) from a run's main.jsonl; the later line of a step wins"""
    val, tok = {}, {}
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise SummaryError(f"{path}: cannot read the run's log ({e.strerror})")
    with f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line a killed run cut short
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            step, kind = record["step"], record.get("type")
            if kind == "val" and "loss" in record:  # null: a non-finite loss (JSON has no NaN), kept as NaN
                loss = record["loss"]
                val[step] = float(loss) if isinstance(loss, (int, float)) else math.nan
            elif kind == "train":
                value = record.get("tok_per_s")
                if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
                    tok[step] = float(value)
                else:
                    tok.pop(step, None)  # a later line of this step without a throughput
    return val, tok


def median_tok_per_s(tok):
    """the median tok/s of the steps from FIRST_TIMED_STEP on, or None when there are none"""
    timed = [value for step, value in tok.items() if step >= FIRST_TIMED_STEP]
    return statistics.median(timed) if timed else None


def finite(value):
    return value is not None and math.isfinite(value)


def gap(loss, reference):
    return f"{100 * (loss / reference - 1):+.2f}%" if finite(loss) and finite(reference) and reference else "-"


def summarize(out, runs, batch=16, seq=1024, total_batch=None, gpus=1):
    """the table of compare()"""
    return compare(out, runs, batch, seq, total_batch, gpus)[0]


def compare(out, runs, batch=16, seq=1024, total_batch=None, gpus=1):
    """(the table: markdown, a string ending in a newline, for the runs under out; the runs whose val loss at the
    compared step is not finite, which diverged: their rows say nan); SummaryError when they cannot be compared"""
    if not runs:
        raise SummaryError("no runs to compare")
    logs = {run: read_run(os.path.join(out, run, "main.jsonl")) for run in runs}
    step = comparison_step([val for val, _ in logs.values()])
    if step is None:
        steps = "; ".join(f"{run}: {' '.join(map(str, sorted(val))) or 'none'}" for run, (val, _) in logs.items())
        raise SummaryError(f"{out}: the runs share no val step after step 0, so no val loss to compare "
                           f"(val steps of each run: {steps})")
    loss = {run: logs[run][0][step] for run in runs}
    tok = {run: median_tok_per_s(logs[run][1]) for run in runs}
    base = "bf16" if "bf16" in runs else runs[0]

    measured = f"B={batch} T={seq}" + (f" -d {total_batch}" if total_batch is not None else "") + \
        (f" on {gpus} GPUs (tok/s: all of them)" if gpus > 1 else "")
    lines = [f"val loss at step {step}, the last val step all {len(runs)} runs share; "
             f"tok/s: the median over train steps {FIRST_TIMED_STEP} and later, at {measured}", "",
             f"| run | step | val loss | vs {base} | vs fp32 AdamW | median tok/s | vs {base} |",
             "|---|---|---|---|---|---|---|"]
    untimed = False
    for run in runs:
        adamw_run = run[:-len("_adamw8")] if run.endswith("_adamw8") else None
        versus_adamw = gap(loss[run], loss.get(adamw_run)) if adamw_run else "-"
        if tok[run] and tok[base]:
            median, speedup = f"{tok[run]:.0f}", f"{tok[run] / tok[base]:.3f}x"
        else:
            untimed = True
            median = f"{tok[run]:.0f}" if tok[run] else f"- {NO_TOK_NOTE}"
            speedup = f"- {NO_TOK_NOTE}"
        shown = loss[run] if finite(loss[run]) else "nan"
        lines.append(f"| {run} | {step} | {shown} | {gap(loss[run], loss[base])} | {versus_adamw} | {median} | "
                     f"{speedup} |")
    if untimed:
        lines += ["", f"{NO_TOK_NOTE} no tok/s: that run's main.jsonl has no train step from step {FIRST_TIMED_STEP} "
                      f"on (the median leaves out steps 0 to {FIRST_TIMED_STEP - 1}, which include startup); "
                      f"a run of more than {FIRST_TIMED_STEP} steps measures it"]
    return "\n".join(lines) + "\n", [run for run in runs if not finite(loss[run])]


def main():
    parser = argparse.ArgumentParser(description="compare_bf16_fp8.sh's table of val loss and tok/s")
    parser.add_argument("out", help="the compare's OUT directory")
    parser.add_argument("runs", nargs="+", help="run directories under OUT; bf16 (else the first) is the baseline")
    parser.add_argument("--batch", type=int, default=16, help="the runs' -b, for the header")
    parser.add_argument("--seq", type=int, default=1024, help="the runs' -t, for the header")
    parser.add_argument("--total-batch", type=int, default=None, help="the runs' -d, when given")
    parser.add_argument("--gpus", type=int, default=1, help="the GPUs each run trained on (NUM_GPUS), for the header")
    parser.add_argument("--write", default=None, metavar="PATH", help="also write the table there")
    args = parser.parse_args()
    try:
        table, diverged = compare(args.out, args.runs, args.batch, args.seq, args.total_batch, args.gpus)
    except SummaryError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(table)
    sys.stdout.write(table)
    if diverged:  # the table is written (it says nan), but no comparison of these runs passes
        print(f"error: {args.out}: the val loss of {', '.join(diverged)} is not finite at the compared step: "
              "diverged, so no val loss to compare", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
