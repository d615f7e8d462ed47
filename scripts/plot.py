"""
Plots train and val loss curves of several runs on one PNG and prints a table of
final val losses with the relative gap to the first run (the baseline).

    python3 scripts/plot.py log_bf16 log_fp8 [--labels bf16 fp8] [--ema 0.9] [--out loss.png]

Each argument is a run's output directory (or a log file in it). Its main.log is
read in llm.c's line format: "s:STEP trl:LOSS ..." (train), "s:STEP tel:LOSS"
(val), "s:STEP eval:ACC" (HellaSwag); other key:value fields are ignored. Without
main.log, main.jsonl is read: one JSON object per line with "step" and "type"
(train/val with "loss", eval with "hellaswag_acc"), as llmc/logger.h writes it. When a
step appears twice (a resumed run) the later line wins.

The table compares runs at the last step for which every run has a val loss,
so runs of different lengths are compared fairly. A non-finite val loss (tel:nan,
main.jsonl's null) counts as one: a run that diverged shows nan there, and after
the table one error line names it and the exit status is 1; --ema smooths the plotted
train curves only (a bias-corrected exponential moving average). --reference
SIZE (124M, 350M, 774M, 1558M) draws on the HellaSwag panel the accuracy of
OpenAI's GPT-2 checkpoint of that size, as llm.c's eval (the same file and
scoring as -h 1) measured it, and of the GPT-3 of about that size, from the
GPT-3 paper: the lines llm.c's dev/vislog.ipynb draws.
"""

import argparse
import json
import math
import os
import sys

try:
    import matplotlib
except ImportError:  # one line, not a traceback: main() says how to install it
    matplotlib = None
else:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)

SERIES_KEYS = {
    "train": ("trl", "train_loss"),
    "val": ("tel", "val_loss"),
    "hellaswag": ("eval", "hellaswag"),
}


# HellaSwag accuracy by GPT-2 size: OpenAI's GPT-2 checkpoints under llm.c's eval, and GPT-3 125M, 350M, 760M
# and 1.3B from the GPT-3 paper (the values of llm.c's dev/vislog.ipynb)
HELLASWAG_REFERENCES = {
    "124M": (0.294463, 0.337),
    "350M": (0.375224, 0.436),
    "774M": (0.431986, 0.510),
    "1558M": (0.488946, 0.547),
}


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def series_name(key):
    for name, keys in SERIES_KEYS.items():
        if key in keys:
            return name
    return None


def parse_main_log(path):
    """{series: {step: value}} from llm.c-format lines."""
    series = {name: {} for name in SERIES_KEYS}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = dict(field.split(":", 1) for field in line.split() if ":" in field)
            if "s" not in fields:
                continue
            try:
                step = int(fields["s"])
                for key, value in fields.items():
                    name = series_name(key)
                    # a skipped step's trl:nan is no point; a val loss's nan is one (the run diverged)
                    if name is not None and (math.isfinite(float(value)) or name == "val"):
                        series[name][step] = float(value)
            except ValueError:
                continue
    return series


# main.jsonl as llmc/logger.h writes it: {"step":N,"type":"train"|"val"|"eval", ...}
JSONL_VALUE_KEY = {"train": ("train", "loss"), "val": ("val", "loss"), "eval": ("hellaswag", "hellaswag_acc")}


def parse_main_jsonl(path):
    """{series: {step: value}} from llm8's main.jsonl."""
    series = {name: {} for name in SERIES_KEYS}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or record.get("type") not in JSONL_VALUE_KEY:
                continue
            name, key = JSONL_VALUE_KEY[record["type"]]
            value = record.get(key)
            if not isinstance(record.get("step"), int):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                series[name][record["step"]] = float(value)
            elif name == "val" and key in record:  # null: a non-finite val loss (JSON has no NaN), the run diverged
                series[name][record["step"]] = math.nan
    return series


def load_run(path):
    """A run's series from a directory (main.log, else main.jsonl) or from a log file itself."""
    if os.path.isdir(path):
        for name, parse in (("main.log", parse_main_log), ("main.jsonl", parse_main_jsonl)):
            log_path = os.path.join(path, name)
            if os.path.isfile(log_path):
                return parse(log_path)
        die(f"{path}: no main.log or main.jsonl in this run directory")
    if os.path.isfile(path):
        return parse_main_jsonl(path) if path.endswith(".jsonl") else parse_main_log(path)
    die(f"{path}: no such run directory or log file")


def ema(values, beta):
    """Bias-corrected exponential moving average (as in Adam's moments)."""
    smoothed, average = [], 0.0
    for i, value in enumerate(values):
        average = beta * average + (1 - beta) * value
        smoothed.append(average / (1 - beta ** (i + 1)))
    return smoothed


def comparison_step(vals):
    """The last step after step 0 with a val loss in every run (vals: each run's {step: val loss}), or None when the
    runs share none (the untrained model's step 0 says nothing about the runs). scripts/compare_summary.py compares
    at this step too."""
    common = set.intersection(*(set(val) for val in vals)) - {0}
    return max(common) if common else None


def print_table(labels, runs):
    """prints the table; returns the labels of the runs whose val loss in it is not finite (diverged)"""
    step = comparison_step([series["val"] for series in runs])
    print(f"val loss at step {step} (the last step every run evaluated)" if step is not None
          else "val loss at each run's last evaluated step (the runs share no val step after step 0)")
    print("| run | step | val loss | gap vs the first run with a val loss |")
    print("|---|---|---|---|")
    baseline, diverged = None, []
    for label, series in zip(labels, runs):
        val = series["val"]
        if not val:
            print(f"| {label} | - | - | - |")
            continue
        run_step = step if step is not None else max(val)
        loss = val[run_step]
        if not math.isfinite(loss):
            diverged.append(label)
            print(f"| {label} | {run_step} | nan | - |")
            continue
        if baseline is None:
            baseline = loss
        gap = 100.0 * (loss - baseline) / baseline
        print(f"| {label} | {run_step} | {loss:.4f} | {gap:+.2f}% |")
    return diverged


def plot_runs(labels, runs, beta, out_path, title, reference=None):
    panels = [name for name in SERIES_KEYS if any(series[name] for series in runs) or (name == "hellaswag" and reference)]
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for axis, name in zip(axes[0], panels):
        for index, (label, series) in enumerate(zip(labels, runs)):
            steps = sorted(step for step, value in series[name].items() if math.isfinite(value))
            values = [series[name][step] for step in steps]
            if not steps:
                continue
            color = f"C{index}"
            if name == "train" and beta is not None:
                axis.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
                axis.plot(steps, ema(values, beta), color=color, label=f"{label} (ema {beta})")
            else:
                axis.plot(steps, values, color=color, label=label, marker="o" if len(steps) < 30 else None)
        if name == "hellaswag" and reference:
            gpt2, gpt3 = HELLASWAG_REFERENCES[reference]
            axis.axhline(gpt2, color="red", linestyle="--", label=f"OpenAI GPT-2 {reference} checkpoint")
            axis.axhline(gpt3, color="green", linestyle="--", label=f"GPT-3 (paper), about {reference}")
        axis.set_xlabel("step")
        axis.set_ylabel("accuracy" if name == "hellaswag" else "loss")
        axis.set_title(f"{name} {'accuracy' if name == 'hellaswag' else 'loss'}")
        axis.grid(alpha=0.3)
        axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out_path, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description="Plot train/val loss of llm8 / llm.c runs and compare final val loss")
    parser.add_argument("runs", nargs="+", help="run output directories (with main.log or main.jsonl) or log files")
    parser.add_argument("--labels", nargs="+", default=None, help="one label per run (default: directory names)")
    parser.add_argument("--ema", type=float, default=None, metavar="BETA", help="smooth train curves, e.g. 0.9")
    parser.add_argument("--out", default="loss.png", help="PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument("--reference", choices=sorted(HELLASWAG_REFERENCES, key=lambda size: float(size[:-1])),
                        default=None, help="draw OpenAI's GPT-2 checkpoint and GPT-3 HellaSwag accuracies of this size")
    args = parser.parse_args()
    if matplotlib is None:
        die(f"scripts/plot.py needs matplotlib, which {sys.executable} cannot import: "
            "bash scripts/setup_python.sh (or pip install matplotlib)")
    if args.labels is not None and len(args.labels) != len(args.runs):
        die(f"--labels has {len(args.labels)} names for {len(args.runs)} runs")
    if args.ema is not None and not 0.0 <= args.ema < 1.0:
        die(f"--ema {args.ema}: expected a smoothing factor in [0, 1)")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        die(f"--out {args.out}: no directory {out_dir} to write it into")
    labels = args.labels or [os.path.basename(os.path.normpath(run)) for run in args.runs]
    runs = [load_run(run) for run in args.runs]
    for run, series in zip(args.runs, runs):
        if not series["train"] and not series["val"]:
            die(f"{run}: no train (trl) or val (tel) loss lines found")
    plot_runs(labels, runs, args.ema, args.out, args.title, args.reference)
    print(f"wrote {args.out}")
    diverged = print_table(labels, runs)
    if args.reference:
        gpt2, gpt3 = HELLASWAG_REFERENCES[args.reference]
        last = [f"{label} {series['hellaswag'][max(series['hellaswag'])]:.4f}" for label, series in zip(labels, runs)
                if series["hellaswag"]]
        print(f"HellaSwag: OpenAI GPT-2 {args.reference} checkpoint {gpt2:.4f}, GPT-3 (paper) {gpt3:.3f}"
              + (f"; last of each run: {', '.join(last)}" if last else ""))
    if diverged:  # the plot and the table are out; no comparison of a diverged run passes
        die(f"the val loss of {', '.join(diverged)} is not finite at the compared step: diverged")


if __name__ == "__main__":
    main()
