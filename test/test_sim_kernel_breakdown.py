"""
The trainer's -kt 1 kernel breakdown (llmc/profiler.h), run under cudasim (build/sim/train_gpt2_fp8),
against what reads it on a GPU: dev/bench/bench.py keeps the table from "kernel breakdown" on, and
dev/bench/floor_model.py (measured_regions) sets each row beside the floor of the region of that
name. For each configuration the floor model distinguishes (-p, -fr, -fw, -fg, an FP8 lm_head,
attproj in bf16, -opt, -w, -r, -ge), the regions the trainer prints are exactly the regions the floor model charges for
the same flags: a mark the model lacks would show as "no floor here", one the trainer lacks as a
floor with no measurement. test_floor_model.py checks the names statically (the union of the
profiler_mark calls); this checks them per run. The table itself: its header, a row per region
with calls per step, a total row that is the rows' sum and shares that add up to 100%.
Timings under cudasim are the CPU's and mean nothing; only the table's shape is checked.
"""
import re

import pytest

import sim_model
from dev_modules import load_dev_bench_module

fm = load_dev_bench_module("floor_model")
STEPS = 3  # the first step is left out of the breakdown (one-time setup): 2 are timed

# (trainer flags, the floor model's Run fields for the same flags); -r is given everywhere since
# the trainer's default (1) is not the model's (0)
CONFIGS = [
    (["-r", 0], dict()),
    (["-r", 1], dict(recompute=1)),
    (["-r", 2], dict(recompute=2)),
    (["-r", 0, "-ge", 0], dict(gelu_fusion=0)),
    (["-r", 0, "-ge", 2], dict(gelu_fusion=2)),
    (["-r", 0, "-opt", "adamw8"], dict(optimizer="adamw8")),
    (["-r", 0, "-w", 0], dict(master=False)),
    (["-r", 0, "-p", "fp8"], dict(precision="fp8")),
    (["-r", 2, "-p", "fp8"], dict(precision="fp8", recompute=2)),
    (["-r", 0, "-p", "fp8", "-fr", "current"], dict(precision="fp8", recipe="current")),
    (["-r", 0, "-p", "fp8", "-fr", "block"], dict(precision="fp8", recipe="block")),
    (["-r", 0, "-p", "fp8", "-fw", "delayed"], dict(precision="fp8", weight_scaling="delayed")),
    (["-r", 0, "-p", "fp8", "-fg", "delayed"], dict(precision="fp8", grad_scaling="delayed")),
    (["-r", 0, "-p", "fp8", "-fg", "pow2"], dict(precision="fp8", grad_scaling="pow2")),
    (["-r", 0, "-p", "fp8", "-fr", "current", "-fg", "pow2", "-f8", "all"],
     dict(precision="fp8", recipe="current", grad_scaling="pow2", lm_head="fp8")),
    (["-r", 0, "-p", "fp8", "-f8", "all"], dict(precision="fp8", lm_head="fp8")),
    (["-r", 0, "-p", "fp8", "-ge", 2], dict(precision="fp8", gelu_fusion=2)),
    (["-r", 0, "-p", "fp8", "-fr", "current", "-ge", 2, "-fg", "delayed"],
     dict(precision="fp8", recipe="current", gelu_fusion=2, grad_scaling="delayed")),
    (["-r", 0, "-p", "fp8", "-opt", "adamw8", "-fw", "delayed", "-w", 0],
     dict(precision="fp8", optimizer="adamw8", weight_scaling="delayed", master=False)),
    (["-r", 0, "-p", "fp8", "-fr", "block", "-opt", "adamw8", "-f8", "all"],
     dict(precision="fp8", recipe="block", optimizer="adamw8", lm_head="fp8")),
    (["-r", 2, "-p", "fp8", "-f8", "qkv,fc,fcproj"], dict(precision="fp8", recompute=2, fp8_block_linears="qkv,fc,fcproj")),
    (["-r", 0, "-p", "fp8", "-fr", "block", "-f8", "qkv,fc,fcproj"],
     dict(precision="fp8", recipe="block", fp8_block_linears="qkv,fc,fcproj")),
]
ROW = re.compile(r"^\| (.+?) \| (\d+\.\d{3}) \| (\d+\.\d)% \| (\d+) \|$")
TOTAL = re.compile(r"^\| total \| (\d+\.\d{3}) \| 100% \| \|$")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim_breakdown")
    sim_model.write_run_files(d, 20_000)
    return d


def breakdown_of(workdir, flags):
    """the trainer's stdout from "kernel breakdown" on, as bench.py keeps it"""
    result = sim_model.train(workdir, ["-x", STEPS, "-s", 0, "-kt", 1] + flags, val="", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("kernel breakdown") == 1, result.stdout
    return result.stdout[result.stdout.index("kernel breakdown"):]


@pytest.mark.parametrize("flags, run_fields", CONFIGS, ids=[" ".join(map(str, f)) for f, _ in CONFIGS])
def test_the_breakdown_has_the_floor_models_regions(workdir, flags, run_fields):
    text = breakdown_of(workdir, flags)
    lines = text.splitlines()
    assert lines[:3] == [f"kernel breakdown over {STEPS - 1} steps (ms per step):",
                         "| kernel | ms/step | share | calls/step |", "|---|---|---|---|"], lines[:3]
    rows = [ROW.match(line) for line in lines[3:-1]]
    assert all(rows), [line for line, row in zip(lines[3:-1], rows) if not row]
    total = TOTAL.match(lines[-1])
    assert total, lines[-1]

    ms = [float(r.group(2)) for r in rows]
    assert ms == sorted(ms, reverse=True)
    assert abs(sum(ms) - float(total.group(1))) <= 0.0005 * len(ms) + 1e-9
    assert abs(sum(float(r.group(3)) for r in rows) - 100.0) <= 0.05 * len(rows)
    assert all(int(r.group(4)) >= 1 for r in rows)

    measured = fm.measured_regions(text)
    assert list(measured) == [r.group(1) for r in rows]  # what the floor tables read: every row, no total
    floor_regions = set(fm.region_floors(fm.step_kernels(fm.Run(**run_fields)), fm.DEVICES["h100"]))
    assert set(measured) == floor_regions, (f"printed, not modeled: {sorted(set(measured) - floor_regions)}; "
                                            f"modeled, not printed: {sorted(floor_regions - set(measured))}")


def test_without_kt_no_breakdown_is_printed(workdir):
    result = sim_model.train(workdir, ["-x", 2, "-s", 0], val="", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "kernel breakdown" not in result.stdout
