"""
dev/bench/bench.py reads the trainer's progress lines and ./bench_gemm's output. The first
test takes the progress line's printf format straight from train_gpt2_fp8.cu, fills it in,
and checks that the bench parses every field back, so a change to the line cannot silently
break the benchmark. The -fw current vs delayed comparison reads the optimizer step and the
weight-cast rows of the -kt 1 breakdown (in llmc/profiler.h's format, rows the trainer
marks) and pairs the two runs of each model and optimizer. The others check the per-GEMM side without a GPU: every field the bench
requires of a bench_gemm JSON record is one dev/bench/bench_gemm.cu writes; synthetic JSON
lines (random times and ratios, d48 without the block recipe) give a summary that takes
each model's whole-model fwd+bwd ratios and nothing else, in the markdown next to DESIGN.md's
targets; malformed lines are refused naming the line; and ./bench_gemm's bad flags end with
one "error:" line before any CUDA call.
"""
import json
import os
import random
import re
import subprocess
import tempfile
import time

import pytest

from bench_stubs import breakdown_text, comm_line, predictions_line_format, progress_format, synthetic_gemm_json
from dev_modules import load_dev_bench_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench():
    return load_dev_bench_module("bench")


def test_bench_parses_the_trainer_progress_line():
    bench = load_bench()
    fmt = progress_format()
    lines = [fmt % (step, 12, 10.5 - step * 0.1, 1.25, 6e-4, 140.0 + step, 468000.0 + step, "38.2%", "0h00m05s", 61234.0, "")
             for step in range(1, 13)]
    lines.insert(3, fmt % (4, 12, float("nan"), float("nan"), 6e-4, 150.0, 400000.0, "n/a", "?", 61234.0, " | SKIPPED"))
    steps, breakdown = bench.parse_run("\n".join(lines) + "\nkernel breakdown over 8 steps (ms per step):\n| kernel | ms/step |\n")
    assert len(steps) == 13
    assert steps[0] == {"step": 1, "loss": 10.4, "ms": 141.0, "tok_s": 468001, "mfu": 0.382, "mem_mib": 61234}
    assert steps[3]["mfu"] is None
    assert breakdown.startswith("kernel breakdown")


def test_bench_parses_the_pow2_predictions_line():
    """-fg pow2's last line, in llmc/fp8_model.cuh's format: the share of predicted casts cast again; None without
    the line (every other run) or without a prediction (a one-step run: the first backward predicts nothing)"""
    bench = load_bench()
    line = predictions_line_format() % (480, 36, 7.5)
    assert bench.parse_recast_fraction("step 1/2 | ...\n" + line + "\nkernel breakdown\n") == 36 / 480
    assert bench.parse_recast_fraction("step 1/2 | ...\n") is None
    assert bench.parse_recast_fraction(predictions_line_format() % (0, 0, 0.0)) is None


# -lg's line exactly as llmc/gpu_monitor.h writes it (test_gpu_monitor.c and test_sim_trainer.py pin the same text)
GPU_LINE = "gpu | SM 97% | memory 64% | SM clock {clock}/1980 MHz | power {power}/700 W | {temp} | clock held by: {why}"


def test_bench_reads_the_gpu_state_of_the_timed_steps():
    """-lg 1: the median SM clock and power, the hottest temperature and every reason the clock was held down, over
    the timed steps only (the warm-up's lines are left out); n/a readings are skipped; no lines: None"""
    bench = load_bench()
    fmt = progress_format()
    lines = []
    for step in range(1, 8):
        lines.append(fmt % (step, 7, 10.0, 1.0, 6e-4, 140.0, 468000.0, "38.2%", "0h00m05s", 61234.0, ""))
        warm = step <= bench.WARMUP_STEPS
        lines.append(GPU_LINE.format(clock=900 if warm else 1700 + 10 * step, power="n/a" if step == 7 else 600 + step,
                                     temp="99 C" if warm else f"{60 + step} C",
                                     why="thermal (hardware)" if warm else ("power cap" if step % 2 else "nothing")))
    gpu = bench.parse_gpu("\n".join(lines))
    timed = [s for s in range(1, 8) if s > bench.WARMUP_STEPS]
    assert timed, "the test needs steps past the warm-up"
    clocks = sorted(1700 + 10 * s for s in timed)
    powers = sorted(600 + s for s in timed if s != 7)
    assert gpu["sm_clock_mhz"] == (clocks[(len(clocks) - 1) // 2] + clocks[len(clocks) // 2]) / 2
    assert gpu["power_w"] == (powers[(len(powers) - 1) // 2] + powers[len(powers) // 2]) / 2
    assert gpu["sm_clock_max_mhz"] == 1980 and gpu["power_limit_w"] == 700 and gpu["temperature_c"] == 60 + max(timed)
    assert gpu["clock_held_by"] == ("power cap" if any(s % 2 for s in timed) else "nothing")
    assert set(bench.parse_gpu("\n".join(l for l in lines if not l.startswith("gpu |"))).values()) == {None}
    record = dict(train_record("d12", "adamw", "current", 1000.0, 1.0, 3.0), **gpu, master_weights=True, grad_scaling="-")
    section = bench.gpu_state_markdown([record])
    assert "## GPU state during the timed steps" in section and f"| {gpu['clock_held_by']} |" in section


def test_optimizer_and_weight_cast_time_from_the_breakdown():
    """-fw current vs delayed is judged on the optimizer step plus the weight casts after it: both rows must exist"""
    bench = load_bench()
    source = open(os.path.join(ROOT, "train_gpt2_fp8.cu")).read()
    for row in ("adamw8", "adamw", bench.WEIGHT_CAST_ROW):
        assert f'profiler_mark("{row}")' in source or f'"{row}"' in source, f"the trainer never marks {row!r}"
    breakdown = breakdown_text([("encoder fwd", 0.5), ("adamw8", 1.25), (bench.WEIGHT_CAST_ROW, 0.375), ("adamw", 9.0)])
    assert bench.optimizer_ms(breakdown, "adamw8") == 1.25
    assert bench.optimizer_and_weight_cast_ms(breakdown, "adamw8") == 1.625
    assert bench.optimizer_and_weight_cast_ms(breakdown_text([("adamw", 2.0)]), "adamw") is None  # a bf16 run: no casts


def train_record(model, optimizer, weights, tok_s, cast_ms, loss, recipe="delayed", lm_head="bf16"):
    return {"benchmark": "train", "model": model, "precision": "fp8", "recipe": recipe, "optimizer": optimizer,
            "weight_scaling": weights, "lm_head": lm_head, "tok_per_s": tok_s, "optimizer_weight_cast_ms": cast_ms,
            "final_loss": loss}


def test_weight_cast_comparison_pairs_current_and_delayed_runs():
    bench = load_bench()
    records = [
        train_record("d12", "adamw", "current", 500000.0, 2.0, 7.25),
        {"benchmark": "train", "model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw", "weight_scaling": "-",
         "tok_per_s": 450000.0, "optimizer_weight_cast_ms": None, "final_loss": 7.2},
        train_record("d12", "adamw", "delayed", 510000.0, 1.5, 7.26),
        train_record("d12", "adamw8", "current", 490000.0, None, 7.3),
        train_record("d12", "adamw8", "delayed", 495000.0, 1.25, 7.31),
        train_record("d48", "adamw", "current", 50000.0, 20.0, 7.0),  # its delayed run failed: no pair
        {"benchmark": "train", "model": "d48", "recipe": "delayed", "optimizer": "adamw", "weight_scaling": "delayed", "error": "OOM"},
        train_record("d12", "adamw", "current", 1.0, 1.0, 1.0, recipe="block"),  # unpaired recipe
        train_record("d12", "adamw", "delayed", 2.0, 2.0, 2.0, lm_head="fp8"),  # an FP8 lm_head run is not -fw's pair
        {"benchmark": "gemm", "record": "time"},
    ]
    rows = bench.weight_cast_comparison(records)
    assert [(r["model"], r["optimizer"]) for r in rows] == [("d12", "adamw"), ("d12", "adamw8")]
    assert rows[0]["tok_per_s"] == (500000.0, 510000.0) and abs(rows[0]["speedup"] - 1.02) < 1e-12
    assert rows[0]["optimizer_weight_cast_ms"] == (2.0, 1.5) and rows[0]["cast_ms_saved"] == 0.5
    assert rows[0]["final_loss"] == (7.25, 7.26)
    assert rows[1]["cast_ms_saved"] is None
    markdown = bench.weight_cast_markdown(rows).splitlines()
    assert markdown[0] == "## FP8 weight cast: -fw current vs delayed"
    assert "| d12 | delayed | adamw | 500000 | 510000 | 1.020x | 2.000 | 1.500 | 0.500 | 7.2500 | 7.2600 |" in markdown
    assert "| d12 | delayed | adamw8 | 490000 | 495000 | 1.010x | n/a | 1.250 | n/a | 7.3000 | 7.3100 |" in markdown


def test_bench_runs_both_weight_scalings():
    """the default recipe is timed under both -fw values, with either optimizer"""
    bench = load_bench()
    fp8 = [(recipe, optimizer, weights) for precision, recipe, optimizer, weights, lm_head, grads in bench.RUNS
           if precision == "fp8" and lm_head == "bf16" and grads != "delayed"]
    assert {(optimizer, weights) for recipe, optimizer, weights in fp8 if recipe == "delayed"} == {
        ("adamw", "current"), ("adamw", "delayed"), ("adamw8", "current"), ("adamw8", "delayed")}


def test_bench_runs_the_default_fp8_run_with_an_fp8_lm_head():
    """the lm_head default is decided on a pair: the default FP8 run with lm_head in bf16 and in FP8"""
    bench = load_bench()
    assert ("fp8", "delayed", "adamw", "current", "bf16", "current") in bench.RUNS
    assert ("fp8", "delayed", "adamw", "current", "fp8", "current") in bench.RUNS
    assert all((lm_head == "-") == (precision == "bf16") for precision, _, _, _, lm_head, _ in bench.RUNS)


def test_bench_runs_the_default_fp8_run_with_delayed_and_pow2_gradient_scaling():
    """-fg's default is decided on the default FP8 run with -fg current, delayed and pow2 (pow2 once: not with the
    FP8-lm_head twin, which is made with current and delayed); -fg is "-" exactly where the trainer takes no -fg
    (bf16, and the block recipe, which refuses -fg delayed and pow2)"""
    bench = load_bench()
    assert ("fp8", "delayed", "adamw", "current", "bf16", "delayed") in bench.RUNS
    assert ("fp8", "delayed", "adamw", "current", "fp8", "delayed") in bench.RUNS
    assert [run for run in bench.RUNS if run[5] == "pow2"] == [("fp8", "delayed", "adamw", "current", "bf16", "pow2")]
    assert all((grads == "-") == (precision == "bf16" or recipe == "block")
               for precision, recipe, _, _, _, grads in bench.RUNS + bench.MASTER_FREE_RUNS)
    assert {run[5] for run in bench.RUNS} == {"-"} | set(bench.GRADIENT_SCALINGS)


def test_gradient_scaling_comparison_sets_current_delayed_and_pow2_side_by_side():
    """a row per (model, recipe, optimizer, -fw, lm_head) measured with -fg current and at least one of delayed and
    pow2; a run not made is "-" (the FP8-lm_head twin has no pow2 run), and n/a the block backward ms of a measured
    run without those rows"""
    bench = load_bench()

    def run(model, grads, tok_s, loss, ms, lm_head="bf16", weights="current", recast=None):
        return dict(train_record(model, "adamw", weights, tok_s, 2.0, loss, lm_head=lm_head), grad_scaling=grads,
                    block_backward_ms=ms, recast_fraction=recast)
    records = [
        run("d12", "current", 500000.0, 7.25, 10.0),
        run("d12", "delayed", 530000.0, 7.26, 8.5),
        run("d12", "pow2", 520000.0, 7.255, 9.0, recast=0.125),
        run("d12", "current", 510000.0, 7.26, 9.5, weights="delayed"),  # no -fg delayed or pow2 twin: no row
        run("d12", "current", 600000.0, 7.3, 9.0, lm_head="fp8"),
        run("d12", "delayed", 630000.0, 7.31, 7.5, lm_head="fp8"),  # no pow2 run: "-" there
        run("d48", "current", 50000.0, 7.0, None),
        {"benchmark": "train", "model": "d48", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw",
         "weight_scaling": "current", "lm_head": "bf16", "grad_scaling": "delayed", "error": "OOM"},
        run("d48", "pow2", 51000.0, 7.01, None),
        run("d24", "delayed", 90000.0, 7.1, 5.0),  # no -fg current run to compare with: no row
        run("d24", "pow2", 91000.0, 7.1, 5.0),
        {"benchmark": "train", "model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw", "weight_scaling": "-",
         "lm_head": "-", "grad_scaling": "-", "tok_per_s": 450000.0, "final_loss": 7.2},
    ]
    rows = bench.gradient_scaling_comparison(records)
    assert [(r["model"], r["lm_head"]) for r in rows] == [("d12", "bf16"), ("d12", "fp8"), ("d48", "bf16")]
    assert rows[0]["tok_per_s"] == (500000.0, 530000.0, 520000.0) and rows[0]["speedup"] == pytest.approx((1.06, 1.04))
    assert rows[0]["block_backward_ms"] == (10.0, 8.5, 9.0) and rows[0]["final_loss"] == (7.25, 7.26, 7.255)
    assert rows[1]["tok_per_s"] == (600000.0, 630000.0, None) and rows[1]["speedup"] == pytest.approx((1.05, None))
    assert rows[2]["tok_per_s"] == (50000.0, None, 51000.0)
    markdown = bench.gradient_scaling_markdown(rows).splitlines()
    assert markdown[0] == "## FP8 output-gradient scaling: -fg current vs delayed vs pow2"
    assert markdown[4] == ("| model | recipe | optimizer | -fw | lm_head | tok/s current | delayed | pow2 | delayed / current | "
                           "pow2 / current | block backward ms current | delayed | pow2 | final loss current | delayed | pow2 | "
                           "pow2 cast again |")
    # the last cell: the pow2 run's share of predictions cast again; "-" without a pow2 run, n/a without its line
    assert markdown[6:] == [
        "| d12 | delayed | adamw | current | bf16 | 500000 | 530000 | 520000 | 1.060x | 1.040x | 10.000 | 8.500 | 9.000 | "
        "7.2500 | 7.2600 | 7.2550 | 12.5% |",
        "| d12 | delayed | adamw | current | fp8 | 600000 | 630000 | - | 1.050x | - | 9.000 | 7.500 | - | 7.3000 | 7.3100 | - | "
        "- |",
        "| d48 | delayed | adamw | current | bf16 | 50000 | - | 51000 | - | 1.020x | n/a | - | n/a | 7.0000 | - | 7.0100 | "
        "n/a |"]
    assert all(line.count("|") == markdown[5].count("|") for line in markdown[4:])
    # the -fw and lm_head pairs leave the -fg delayed and pow2 runs out
    assert [r["model"] for r in bench.weight_cast_comparison(records)] == ["d12"]
    assert [r["tok_per_s"] for r in bench.lm_head_comparison(records)] == [(500000.0, 600000.0)]


def test_lm_head_comparison_pairs_bf16_and_fp8_lm_heads():
    bench = load_bench()
    records = [
        train_record("d12", "adamw", "current", 500000.0, 2.0, 7.25),
        train_record("d12", "adamw", "delayed", 510000.0, 1.5, 7.26),  # no FP8 lm_head twin
        train_record("d12", "adamw", "current", 560000.0, 2.0, 7.27, lm_head="fp8"),
        train_record("d48", "adamw", "current", 50000.0, 20.0, 7.0),
        {"benchmark": "train", "model": "d48", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw",
         "weight_scaling": "current", "lm_head": "fp8", "error": "OOM"},
        {"benchmark": "train", "model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw", "weight_scaling": "-",
         "lm_head": "-", "tok_per_s": 450000.0, "final_loss": 7.2},
    ]
    rows = bench.lm_head_comparison(records)
    assert [(r["model"], r["weight_scaling"]) for r in rows] == [("d12", "current")]
    assert rows[0]["tok_per_s"] == (500000.0, 560000.0) and abs(rows[0]["speedup"] - 1.12) < 1e-12
    assert rows[0]["final_loss"] == (7.25, 7.27)
    markdown = bench.lm_head_markdown(rows).splitlines()
    assert markdown[0] == "## FP8 lm_head: bf16 (default -f8) vs FP8 (-f8 all)"
    assert "| d12 | delayed | adamw | current | 500000 | 560000 | 1.120x | 7.2500 | 7.2700 |" in markdown


GEMM_SOURCE = os.path.join(ROOT, "dev", "bench", "bench_gemm.cu")
GEMM_BINARY = os.path.join(ROOT, "bench_gemm")


def test_every_required_gemm_field_is_written_by_bench_gemm():
    bench = load_bench()
    source = open(GEMM_SOURCE).read()
    for kind, fields in bench.GEMM_RECORD_FIELDS.items():
        for field in ("record",) + fields:
            assert f'\\"{field}\\":' in source, f"bench.py requires {field!r} of {kind} records; bench_gemm.cu never writes it"


def test_gemm_summary_takes_the_whole_model_fwd_bwd_ratios():
    bench = load_bench()
    text, expected = synthetic_gemm_json(random.Random(7))
    records = bench.parse_gemm_json(text)
    assert len(records) == len(text.strip().splitlines())
    summary = bench.gemm_summary(records)
    assert [row["model"] for row in summary] == ["d12", "d48"]
    assert [row["B"] for row in summary] == [64, 16]
    for row in summary:
        for v in bench.GEMM_FP8_VARIANTS:
            assert row["ratios"][v] == expected.get((row["model"], v)), (row["model"], v)
    assert summary[1]["ratios"]["block"] is None and summary[1]["ratios"]["fp8+cast"] is not None

    tables = "### d12: fake table\n\n| linear | pass |\n|---|---|\n| qkv | fwd |"
    markdown = bench.gemm_markdown(records, tables, "./bench_gemm --models d12,d48", "Fake GPU", "abc123")
    assert markdown.startswith("## Per-GEMM FP8 vs bf16")
    assert "Fake GPU" in markdown and "`abc123`" in markdown and "`./bench_gemm --models d12,d48`" in markdown
    for model, B in (("d12", 64), ("d48", 16)):
        cells = [f"{expected[(model, v)]:.2f}x" if (model, v) in expected else "n/a" for v in bench.GEMM_FP8_VARIANTS]
        row = f"| {model} | {B} | " + " | ".join(cells) + f" | >= {bench.GEMM_TARGETS[model]:.2f}x |"
        assert row in markdown.splitlines(), row
    assert markdown.rstrip().endswith(tables)


def test_gemm_tables_start_at_the_first_model_heading():
    bench = load_bench()
    stdout = "bench_gemm on Fake GPU, cuBLASLt 1: ...\n\n### d12: L=12\n\n| a | b |\n|---|---|\n\n### d48: L=48\n\nd48: block recipe not measured\n"
    tables = bench.gemm_tables(stdout)
    assert tables.startswith("### d12") and tables.endswith("d48: block recipe not measured")
    assert "bench_gemm on" not in tables
    assert bench.gemm_tables("no tables here\n") == ""


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2"),
    ('{"record": "speed", "model": "d12"}', "'speed' is not one of"),
    ('["time"]', "None is not one of"),
    ('{"record": "ratio", "model": "d12", "linear": "qkv", "B": 64, "T": 1024, "pass": "fwd", "variant": "fp8"}', "lacks ratio"),
])
def test_parse_gemm_json_refuses_malformed_lines(line, message):
    bench = load_bench()
    good = '{"record": "skip", "model": "d48", "variant": "block", "reason": "C=1600"}'
    with pytest.raises(ValueError, match=re.escape(message)):
        bench.parse_gemm_json(good + "\n" + line + "\n")


def run_bench_gemm(args):
    if not os.path.exists(GEMM_BINARY):
        pytest.fail(f"{GEMM_BINARY} is not built (make bench_gemm)")
    return subprocess.run([GEMM_BINARY] + args, capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("args, names", [
    (["--bogus"], "--bogus"),
    (["--iters"], "--iters"),
    (["--iters", "0"], "--iters"),
    (["--warmup", "-1"], "--warmup"),
    (["--algorithms", "17"], "--algorithms"),
    (["--algorithms", "-1"], "--algorithms"),
    (["--models", "d13"], "d13"),
    (["--models", "d12,d12"], "listed twice"),
    (["--json", "/nonexistent-dir/x.jsonl"], "/nonexistent-dir/x.jsonl"),
])
def test_bench_gemm_bad_flags_die_with_one_line(args, names):
    result = run_bench_gemm(args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and names in lines[0], result.stderr


def test_bench_gemm_help_lists_its_flags():
    result = run_bench_gemm(["--help"])
    assert result.returncode == 0
    for flag in ("--models", "--iters", "--warmup", "--algorithms", "--json"):
        assert flag in result.stdout


@pytest.mark.parametrize("reduce_type", ["bf16", "fp32"])
def test_bench_parses_the_trainer_traffic_line(reduce_type):
    bench = load_bench()
    values = [248.9, 0.0001, 10.617, 59.0]
    line, names = comm_line(values, reduce_type)
    parsed = bench.parse_traffic("step 1/8 | loss 1.0\n" + line)
    assert parsed == {name: round(mb * 1e6) for name, mb in zip(names, values)}


def test_ranks_markdown_reports_overhead_against_one_rank():
    bench = load_bench()
    traffic = {"gradient reduce": 248.9e6, "FP8 weight amax all-reduce": 192.0, "FP8 weight gather": 42.5e6, "bf16 weight gather": 79.3e6}
    records = [{"precision": "fp8", "ranks": 1, "ms_per_step": 100.0, "tok_per_s": 300000},
               {"precision": "fp8", "ranks": 2, "zero": 1, "ms_per_step": 112.5, "tok_per_s": 266666, "traffic_bytes": traffic},
               {"precision": "fp8", "ranks": 2, "zero": 3, "ms_per_step": 125.0, "tok_per_s": 240000,
                "traffic_bytes": dict(traffic, **{"FP8 weight gather": 170.0e6})},
               {"precision": "bf16", "ranks": 2, "error": "NCCL has no multi-rank-per-GPU support"}]
    md = bench.ranks_markdown(records)
    row = [l for l in md.splitlines() if l.startswith("| fp8 | 2 | 1 |")][0]
    assert "1.125x" in row and "42.500" in row and "248.900" in row, row
    row = [l for l in md.splitlines() if l.startswith("| fp8 | 2 | 3 |")][0]
    assert "1.250x" in row and "170.000" in row, row
    assert "error: NCCL has no multi-rank-per-GPU support" in md


def test_gpu_session_refuses_an_unknown_stage():
    """dev/gpu_session.sh (make gpucheck in device-call-sized stages) names a bad stage in one line"""
    result = subprocess.run(["bash", os.path.join(ROOT, "dev", "gpu_session.sh"), "gpucheck"], capture_output=True, text=True,
                            env=dict(os.environ, OUT=tempfile.mkdtemp(prefix="llm8_gpu_session_")))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "stage 'gpucheck'" in result.stderr and "first, rerun, build, tests, ranks, bench, parity, profile or sanitize" in result.stderr


def test_gpu_test_runner_needs_a_gpu():
    """make gpucheck-tests / gpucheck-ranks on a machine without a GPU: one line, non-zero exit"""
    if subprocess.run(["bash", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has a GPU")
    for args in ([], ["--ranks"]):
        result = subprocess.run(["bash", os.path.join(ROOT, "test", "run_gpu_tests.sh"), *args], capture_output=True, text=True)
        assert result.returncode == 1 and "needs an NVIDIA GPU" in result.stderr and result.stderr.count("\n") == 1


def test_a_run_past_its_limit_is_killed_and_named(tmp_path):
    """bench.py's programs (a trainer run with all its ranks, ./bench_gemm) are killed at their wall
    limit, children included, and the record says so: a hang costs one record, not the device call"""
    bench = load_bench()
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\necho started\nsleep 60\n")  # the sleep is a child: the whole group must go
    hang.chmod(0o755)
    start = time.monotonic()
    # a rank that failed beside one that hangs (a peer blocked in a collective): the failure keeps its line
    results = bench.run_programs([[str(hang)], ["sh", "-c", "echo 'error: NCCL init failed' >&2; exit 1"]], 1)
    assert time.monotonic() - start < 15
    assert results == [(None, "started\n", ""), (1, "", "error: NCCL init failed\n")]
    assert bench.failure_line(results[0][2], results[0][0], 1) == "ran past 1 s and was killed"
    assert bench.failure_line(results[1][2], results[1][0], 1) == "NCCL init failed"
    # programs that write more than a pipe holds, side by side, both finish
    big = ["python3", "-c", "import sys; sys.stdout.write('x' * 200000)"]
    assert [(code, len(out)) for code, out, _ in bench.run_programs([big, big], 30)] == [(0, 200000), (0, 200000)]
    assert bench.run_programs([["sh", "-c", "echo out; echo 'error: bad flag' >&2; exit 2"]], 10) == [(2, "out\n", "error: bad flag\n")]
    assert bench.failure_line("error: bad flag\n", 2) == "bad flag" and bench.failure_line("", 3) == "exit 3"


def test_the_report_is_written_as_it_goes(tmp_path):
    """bench.py rewrites its .md and .json after every record, marked incomplete until the end, so a
    device call cut off at its limit still returns what was measured"""
    bench = load_bench()
    info = {"date": "2026-11-22", "device": "Fake GPU", "commit": "abc", "quick": True, "T": 1024, "steps": 6}
    record = {"benchmark": "train", "model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw",
              "weight_scaling": "-", "lm_head": "-", "grad_scaling": "-", "master_weights": True, "error": "out of memory"}
    base = str(tmp_path / "report")
    bench.write_report(base, [record], "", info, complete=False)
    markdown = open(base + ".md").read()
    assert "**Incomplete**: this file is rewritten after every run; it stopped after 1 records." in markdown
    # no gelu_fusion, attention_deterministic, fc_writes_codes or fp8_block_linears (a record written before they were
    # measured): -ge 1, -ad 1, -fe 0, the four block linears
    assert "| d12 | bf16 | - | adamw | - | - | - | yes | 1 | 1 | 0 | qkv,attproj,fc,fcproj | | | error: out of memory |" in markdown
    assert json.load(open(base + ".json")) == [record]
    bench.write_report(base, [record], "", info, complete=True)
    assert "Incomplete" not in open(base + ".md").read()
    assert sorted(os.listdir(tmp_path)) == ["report.json", "report.md"]  # no .tmp left behind


def test_floor_of_a_model_the_floor_model_lacks():
    """bench.py --only d6 (a trainer preset floor_model.py has no shape for): the record is kept with
    floor_ms None, and the Floor section leaves it out, instead of a crash after the run"""
    bench = load_bench()
    record = {"benchmark": "train", "model": "d6", "precision": "bf16", "recipe": "-", "optimizer": "adamw",
              "weight_scaling": "-", "lm_head": "-", "grad_scaling": "-", "master_weights": True, "B": 16, "T": 1024,
              "recompute": 1, "ms_per_step": 50.0, "kernel_breakdown": breakdown_text([("encoder fwd", 0.5)])}
    floored = bench.with_floor(record, "NVIDIA H100 80GB HBM3")
    assert floored["floor_ms"] is None and floored["model"] == "d6"
    assert bench.floor_markdown([floored], "NVIDIA H100 80GB HBM3") == ""
    d12 = bench.with_floor(dict(record, model="d12", B=64, recompute=0), "NVIDIA H100 80GB HBM3")
    assert d12["floor_ms"] > 0
    section = bench.floor_markdown([floored, d12], "NVIDIA H100 80GB HBM3")
    assert "| d12 | bf16 | 64 |" in section and "| d6 |" not in section
