"""
scripts/compare_summary.py, the table scripts/compare_bf16_fp8.sh writes (summary.md), on synthetic
main.jsonl files in the trainer's format (README.md: {"step":..,"type":"train","loss":..,"tok_per_s":..} per
step, {"step":..,"type":"val","loss":..} per val loss): the runs are compared at the last val step they all
share, the median tok/s leaves out steps 0-9 and keeps the later line of a step logged twice (a resumed run),
the speedup is the ratio of the medians, the header names the B and T (and -d) they were measured at, and a
run too short to time says why. No training: each test takes milliseconds.
"""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare_summary  # noqa: E402 (scripts/ is not a package)


def write_run(out, name, val, tok, extra_lines=()):
    """OUT/name/main.jsonl: val {step: loss}, tok {step: tok/s} as train records (loss 5.0), then extra_lines"""
    run = out / name
    run.mkdir(parents=True, exist_ok=True)
    records = [{"step": s, "type": "train", "loss": 5.0, "lr": 6e-4, "norm": 1.0, "ms": 10.0, "tok_per_s": t,
                "mfu": 0, "skipped": 0} for s, t in sorted(tok.items())]
    records += [{"step": s, "type": "val", "loss": v} for s, v in sorted(val.items())]
    with open(run / "main.jsonl", "w") as f:
        for record in list(records) + list(extra_lines):
            f.write((json.dumps(record) if isinstance(record, dict) else record) + "\n")


def rows(table):
    """{run: [cells]} of the table's rows"""
    return {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| run "))}


def test_median_tok_per_s_and_speedup(tmp_path):
    """median of steps >= 10 only (steps 0-9 are startup: huge and tiny values there must not count); the later
    line of a resumed step wins; the speedup is the ratio of the medians"""
    bf16_tok = {s: 1e9 if s < 10 else 1000.0 + 10 * (s - 10) for s in range(0, 15)}   # 1000..1040: median 1020
    fp8_tok = {s: 1.0 if s < 10 else 1500.0 + 100 * (s - 10) for s in range(0, 16)}   # 1500..2000: median 1750
    write_run(tmp_path, "bf16", {0: 6.0, 16: 4.0}, bf16_tok)
    # fp8 resumed at step 12: its steps 12-15 logged again, faster (the later lines count, not the earlier)
    again = [json.dumps({"step": s, "type": "train", "loss": 5.0, "tok_per_s": 1500.0 + 200 * (s - 10)})
             for s in range(12, 16)]  # steps 10..15: 1500 1600 1900 2100 2300 2500: median 2000
    write_run(tmp_path, "fp8_delayed", {0: 6.0, 16: 4.04}, fp8_tok, again)
    table = compare_summary.summarize(str(tmp_path), ["bf16", "fp8_delayed"], batch=2, seq=64)
    got = rows(table)
    assert got["bf16"][4:] == ["1020", "1.000x"], table
    assert got["fp8_delayed"][4:] == ["2000", f"{2000 / 1020:.3f}x"], table
    assert got["fp8_delayed"][:3] == ["16", "4.04", "+1.00%"], table
    assert "(1)" not in table, table


def test_compares_at_the_last_val_step_every_run_shares(tmp_path):
    """a run cut off at step 4 (val every 2) beside one that reached step 8: both rows at step 4, the header says
    so; the adamw8 row's second gap is against its precision's fp32 AdamW run at that step too"""
    write_run(tmp_path, "bf16", {0: 6.0, 2: 5.0, 4: 4.0, 6: 3.5, 8: 3.0}, {})
    write_run(tmp_path, "bf16_adamw8", {0: 6.0, 2: 5.0, 4: 4.2}, {})
    table = compare_summary.summarize(str(tmp_path), ["bf16", "bf16_adamw8"])
    assert table.splitlines()[0].startswith("val loss at step 4, the last val step all 2 runs share"), table
    got = rows(table)
    assert got["bf16"][:4] == ["4", "4.0", "+0.00%", "-"], table
    assert got["bf16_adamw8"][:4] == ["4", "4.2", "+5.00%", "+5.00%"], table


def test_runs_sharing_no_val_step_after_0_are_an_error(tmp_path):
    write_run(tmp_path, "bf16", {0: 6.0, 8: 3.0}, {})
    write_run(tmp_path, "fp8_delayed", {0: 6.0, 4: 4.0}, {})
    with pytest.raises(compare_summary.SummaryError, match="share no val step after step 0"):
        compare_summary.summarize(str(tmp_path), ["bf16", "fp8_delayed"])
    # from the command line: one error line, exit 1, nothing written
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_summary.py"), str(tmp_path), "bf16",
                             "fp8_delayed", "--write", str(tmp_path / "summary.md")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and not (tmp_path / "summary.md").exists()
    assert result.stderr.splitlines() == [
        f"error: {tmp_path}: the runs share no val step after step 0, so no val loss to compare (val steps of each "
        "run: bf16: 0 8; fp8_delayed: 0 4)"]


def test_a_run_whose_val_loss_went_nan_is_never_at_parity(tmp_path):
    """fp8_delayed's val loss is null (non-finite, as the trainer logs it) from step 1500 of 2000: compared at step
    2000 its row says nan with no gap, and from the command line the table is written, then one error line names
    the run and the exit status is 1 (the null lines were dropped before, and step 1400 showed +0.00%)"""
    val = {s: 3.36 for s in range(0, 2001, 100)}
    write_run(tmp_path, "bf16", val, {})
    write_run(tmp_path, "fp8_delayed", {s: v for s, v in val.items() if s < 1500}, {},
              [json.dumps({"step": s, "type": "val", "loss": None}) for s in range(1500, 2001, 100)])
    table, diverged = compare_summary.compare(str(tmp_path), ["bf16", "fp8_delayed"])
    assert diverged == ["fp8_delayed"] and table.startswith("val loss at step 2000,"), table
    assert rows(table)["fp8_delayed"][:3] == ["2000", "nan", "-"], table
    assert rows(table)["bf16"][:3] == ["2000", "3.36", "+0.00%"], table
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_summary.py"), str(tmp_path), "bf16",
                             "fp8_delayed", "--write", str(tmp_path / "summary.md")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and (tmp_path / "summary.md").read_text() == table, result.stderr
    assert result.stderr.splitlines() == [f"error: {tmp_path}: the val loss of fp8_delayed is not finite at the "
                                          "compared step: diverged, so no val loss to compare"]
    # the baseline (the first run, with no bf16) diverged: no other row has a gap against it
    write_run(tmp_path, "fp8_current", val, {})
    table, diverged = compare_summary.compare(str(tmp_path), ["fp8_delayed", "fp8_current"])
    assert diverged == ["fp8_delayed"] and rows(table)["fp8_current"][2] == "-", table


def test_header_names_the_batch_and_a_short_run_says_why_it_has_no_tok_per_s(tmp_path):
    """STEPS <= 10: no train step from step 10 on, so no tok/s: the cell points to a footnote saying why"""
    write_run(tmp_path, "bf16", {0: 6.0, 4: 4.0}, {s: 1000.0 for s in range(4)})
    write_run(tmp_path, "fp8_delayed", {0: 6.0, 4: 4.1}, {s: 1500.0 for s in range(4)})
    table = compare_summary.summarize(str(tmp_path), ["bf16", "fp8_delayed"], batch=2, seq=64, total_batch=256)
    assert re.search(r"tok/s: the median over train steps 10 and later, at B=2 T=64 -d 256$", table.splitlines()[0]), table
    assert rows(table)["fp8_delayed"][4:] == ["- (1)", "- (1)"], table
    assert table.splitlines()[-1].startswith("(1) no tok/s: that run's main.jsonl has no train step from step 10 on"), table
    plain = compare_summary.summarize(str(tmp_path), ["bf16", "fp8_delayed"])
    assert plain.splitlines()[0].endswith("at B=16 T=1024"), plain
