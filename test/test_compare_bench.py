"""
dev/bench/compare_bench.py, two benchmark JSON files side by side: runs pair by their settings (a
VARIED_SETTINGS field the older records lack counts at its default, so an old record pairs with the
new default run and not with its -fe 1 twin), a run made twice counts as its mean tok/s and its
first breakdown, kernel rows come largest change first with a row one side lacks shown as '-', and
bad input ends in one line. The committed 2026-11-26 and 2026-11-30 H200 benchmarks compare too.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "dev", "bench", "compare_bench.py")
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
import compare_bench  # noqa: E402  (dev/bench is not a package)


def breakdown(rows):
    lines = ["kernel breakdown over 11 steps (ms per step):", "| kernel | ms/step | share | calls/step |", "|---|---|---|---|"]
    lines += ["| %s | %.3f | 1.0%% | 12 |" % (name, ms) for name, ms in rows.items()]
    lines.append("| total | %.3f | 100%% | |" % sum(rows.values()))
    return "\n".join(lines)


def run(tok, rows, benchmark="train", **settings):
    r = {"model": "d12", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw", "weight_scaling": "current",
         "lm_head": "bf16", "grad_scaling": "current", "master_weights": True, "gelu_fusion": 1,
         "attention_deterministic": 1, "B": 64, "T": 1024, "recompute": 0, "tok_per_s": tok,
         "kernel_breakdown": breakdown(rows), "benchmark": benchmark, "device": "NVIDIA H200", "commit": "abc",
         "date": "2026-12-02"}
    r.update(settings)
    return r


def sections(markdown):
    """{heading: its lines} of the comparison"""
    out, current = {}, None
    for line in markdown.splitlines():
        if line.startswith("## "):
            current = line[3:]
            out[current] = []
        elif current is not None and line:
            out[current].append(line)
    return out


def table(lines):
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ") and "---" not in line][1:]


def test_pairs_by_settings_with_old_records_at_defaults():
    old = [run(600000, {"fp8 cast attention out": 1.2, "gelu+fp8 cast fwd": 4.25, "attention bwd": 14.5})]
    for r in old:
        r.pop("fc_writes_codes", None)  # written before -fe existed
    new = [run(660000, {"fp8 cast attention out": 0.6, "gelu+fp8 cast fwd": 3.0, "attention bwd": 14.4}, fc_writes_codes=0),
           run(670000, {"fp8 cast attention out": 0.6}, fc_writes_codes=1),
           run(500000, {"adamw": 1.0}, precision="bf16")]
    found = sections(compare_bench.compare_markdown(old, new))
    assert len(found) == 1, found.keys()
    (head, lines), = found.items()
    assert "-fe 0" in head and head.startswith("d12 fp8 delayed")
    assert lines[0] == "tok/s 600000 -> 660000 (1.100x)"
    assert table(lines) == [["gelu+fp8 cast fwd", "4.250", "3.000", "0.706x"],
                            ["fp8 cast attention out", "1.200", "0.600", "0.500x"],
                            ["attention bwd", "14.500", "14.400", "0.993x"]]


def test_repeats_average_and_missing_rows_show():
    before = [run(600000, {"a": 1.0, "b": 2.0})]
    after = [run(640000, {"a": 1.5, "c": 0.5}), run(660000, {"a": 9.0}, benchmark="repeat")]
    (lines,) = sections(compare_bench.compare_markdown(before, after, rows=2)).values()
    assert lines[0] == "tok/s 600000 -> 650000 (1.083x)"  # the mean of the run and its repeat
    assert table(lines) == [["b", "2.000", "-", "-"], ["a", "1.000", "1.500", "1.500x"]]  # the first breakdown, 2 rows


def test_no_common_run():
    assert compare_bench.compare_markdown([run(1, {})], [run(1, {}, B=32)]).startswith("no training run")


def test_committed_benchmarks_compare():
    before = os.path.join(ROOT, "doc", "benchmarks", "2026-11-26-nvidia-h200-quick-d12.json")
    after = os.path.join(ROOT, "doc", "benchmarks", "2026-11-30-nvidia-h200-quick-d12.json")
    result = subprocess.run([sys.executable, SCRIPT, before, after, "--rows", "40"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = sections(result.stdout)
    default_fp8 = found["d12 fp8 delayed -fw current -fg current lm_head bf16 adamw master -ge 1 -ad 1 -fe 0 "
                        "FP8 block linears qkv,attproj,fc,fcproj B=64 -r 0"]
    assert default_fp8[0] == "tok/s 590758 -> 666446 (1.128x)"  # 2026-11-30 made it twice: 668261 and 664632
    assert ["fp8 cast attention out", "1.221", "1.213", "0.993x"] in table(default_fp8)


@pytest.mark.parametrize("content, expected", [("{}", "expected a list of benchmark records"),
                                               ("not json", "expected a bench.py JSON file")])
def test_bad_input_one_line(tmp_path, content, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = os.path.join(ROOT, "doc", "benchmarks", "2026-11-30-nvidia-h200-quick-d12.json")
    result = subprocess.run([sys.executable, SCRIPT, good, str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr and str(bad) in result.stderr


def test_rows_must_be_positive():
    good = os.path.join(ROOT, "doc", "benchmarks", "2026-11-30-nvidia-h200-quick-d12.json")
    result = subprocess.run([sys.executable, SCRIPT, good, good, "--rows", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--rows 0: expected at least 1" in result.stderr
