#!/usr/bin/env python3
"""
Two `make bench` JSON files (doc/benchmarks/) side by side, run by run and kernel by kernel.

Why: a kernel change made without a GPU is judged by the next benchmark against the last one.
For each training run the two files both have with the same settings (a setting the older
records predate counts at its default, as bench.py reads them), this prints tok/s before and
after, then the `-kt 1` breakdown's rows, ms per step before and after, the largest changes
first. A run made twice in a file (bench.py's repeats) counts as the mean of its tok/s, and its
first breakdown. The 2026-11 H200 benchmarks held the SM clock at their power cap, and their
repeats differed by up to 0.6%: read changes of that size as noise.

Usage: python3 dev/bench/compare_bench.py BEFORE.json AFTER.json [--rows N] [--model d12]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (dev/bench/bench.py: the settings and the breakdown's rows)

# what makes two training runs the same configuration (the rest of a record is measured)
SETTING_FIELDS = ("model", "precision", "recipe", "optimizer", "weight_scaling", "lm_head", "grad_scaling",
                  "master_weights", "B", "T", "recompute")


def settings_key(r):
    """a training record's configuration, with bench.py's VARIED_SETTINGS at their defaults where absent"""
    return tuple(r.get(field) for field in SETTING_FIELDS) + tuple(bench.setting_text(r, f) for f in bench.VARIED_SETTINGS)


def heading(r):
    parts = [r["model"], r["precision"]]
    if r["precision"] != "bf16":
        parts += [r["recipe"], "-fw " + r["weight_scaling"], "-fg " + r["grad_scaling"], "lm_head " + r["lm_head"]]
    parts += [r["optimizer"], "master" if r.get("master_weights", True) else "-w 0", bench.settings_words(r),
              "B=%d" % r["B"], "-r %d" % r["recompute"]]
    return " ".join(parts)


def training_runs(records):
    """{settings key: (mean tok/s, the first record)} of a benchmark's train and repeat records"""
    runs = {}
    for r in records:
        if r.get("benchmark") not in ("train", "repeat") or not r.get("tok_per_s"):
            continue
        rates, first = runs.get(settings_key(r), ([], r))
        runs[settings_key(r)] = (rates + [r["tok_per_s"]], first)
    return {key: (sum(rates) / len(rates), first) for key, (rates, first) in runs.items()}


def breakdown_rows(breakdown):
    """{row: ms per step} of a -kt 1 breakdown (its total left out)"""
    rows = {}
    for line in (breakdown or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] not in ("kernel", "total") and not cells[0].startswith("---"):
            try:
                rows[cells[0]] = float(cells[1])
            except ValueError:
                continue
    return rows


def ratio_text(before, after):
    return "%.3fx" % (after / before) if before and after is not None else "-"


def compare_markdown(before_records, after_records, rows=12, model=None):
    before, after = training_runs(before_records), training_runs(after_records)
    common = [key for key in after if key in before and (model is None or key[0] == model)]
    if not common:
        return "no training run with the same settings in both files\n"
    first_after = next(iter(after.values()))[1]
    first_before = next(iter(before.values()))[1]
    out = ["# %s at %s (%s) against %s at %s (%s)" % (first_after.get("date"), first_after.get("commit"),
                                                      first_after.get("device"), first_before.get("date"),
                                                      first_before.get("commit"), first_before.get("device")), ""]
    for key in common:
        (rate_before, r_before), (rate_after, r_after) = before[key], after[key]
        out += ["## " + heading(r_after), "",
                "tok/s %.0f -> %.0f (%s)" % (rate_before, rate_after, ratio_text(rate_before, rate_after)), ""]
        kernels_before, kernels_after = breakdown_rows(r_before.get("kernel_breakdown")), breakdown_rows(r_after.get("kernel_breakdown"))
        names = set(kernels_before) | set(kernels_after)
        change = {n: abs(kernels_after.get(n, 0.0) - kernels_before.get(n, 0.0)) for n in names}
        if names:
            out += ["| kernel | before ms | after ms | after / before |", "|---|---|---|---|"]
            for n in sorted(names, key=lambda n: (-change[n], n))[:rows]:
                b, a = kernels_before.get(n), kernels_after.get(n)
                out.append("| %s | %s | %s | %s |" % (n, "-" if b is None else "%.3f" % b, "-" if a is None else "%.3f" % a,
                                                      ratio_text(b, a)))
            out.append("")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="the older benchmark's JSON")
    parser.add_argument("after", help="the newer benchmark's JSON")
    parser.add_argument("--rows", type=int, default=12, help="kernel rows a run, the largest changes first (default 12)")
    parser.add_argument("--model", default=None, help="only this model's runs, e.g. d12")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows %d: expected at least 1" % args.rows)
    records = []
    for path in (args.before, args.after):
        try:
            with open(path) as f:
                loaded = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("compare_bench.py: %s: %s (expected a bench.py JSON file)" % (path, e))
        if not isinstance(loaded, list):
            sys.exit("compare_bench.py: %s: expected a list of benchmark records (bench.py's JSON)" % path)
        records.append(loaded)
    sys.stdout.write(compare_markdown(records[0], records[1], args.rows, args.model))


if __name__ == "__main__":
    main()
