"""
dev/bench/bench.py runs on a GPU only in scarce, time-limited device sessions, and writes its
markdown and JSON only after minutes of measurements: a crash there (a KeyError in a table, a
bad path) would throw the whole session away, and no session before had a GPU to find one. So
this runs its main() end to end on the CPU, `--quick`, against stub ./train_gpt2_fp8 and
./bench_gemm executables (test/bench_stubs.py: their output in the real programs' formats,
taken from the sources, with figures that follow from the flags; the d48 block-recipe run and
rank 1 of FP8 ZeRO-3 fail), and checks that what it writes is complete and carries the stubs'
figures through: one JSON record per run (train, gemm, ranks), the main table with a row per
train run (failed ones included), the -fw, lm_head, per-GEMM and multi-GPU sections, and a
per-kernel section per successful run. Every recorded command must be one to type again.
"""
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import zipfile

import pytest

import bench_stubs
from bench_stubs import breakdown_rows, breakdown_text, comm_line, gemm_json, gemm_table, progress, traffic_mb
from dev_modules import load_dev_bench_module
from test_ncu_profile import stand_in_ncu
from test_torch_attention import fake_torch

STEPS = 6
floor_model = load_dev_bench_module("floor_model")
DEVICE, COMMIT = "NVIDIA H100 80GB HBM3", "0123456789ab"


def run_main(tmp_path_factory, *args, bench=None, without_gemm_bench=False):
    """main() with these arguments, ROOT (the data and bench_gemm's JSON) in a temporary directory,
    the stub programs (without_gemm_bench: no ./bench_gemm); returns (bench module, exit code, output directory)"""
    bench = bench or load_dev_bench_module("bench")
    root, out = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "ROOT", str(root))
        trainer, gemm_bench = bench_stubs.install(str(root))
        if without_gemm_bench:
            os.remove(gemm_bench)
        mp.setattr(bench, "TRAINER", trainer)
        mp.setattr(bench, "GEMM_BENCH", gemm_bench)
        mp.setattr(bench, "gpu_name", lambda: DEVICE)
        mp.setattr(bench, "git_commit", lambda: COMMIT)
        mp.setattr(sys, "argv", ["bench.py", "--quick", "--steps", str(STEPS), "--out", str(out)] + list(args))
        with pytest.raises(SystemExit) as exit_info:
            bench.main()
    return bench, exit_info.value.code, out


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """main() once; returns (bench module, exit code, JSON records, markdown, markdown file name)"""
    bench, code, out = run_main(tmp_path_factory)
    [md_path] = glob.glob(os.path.join(out, "*.md"))
    assert sorted(os.listdir(out)) == sorted([os.path.basename(md_path), os.path.basename(md_path)[:-3] + ".json"])
    with open(md_path[:-3] + ".json") as f:
        records = json.load(f)
    with open(md_path) as f:
        markdown = f.read()
    return bench, code, records, markdown, os.path.basename(md_path)


def command_flags(command):
    """the trainer flags of a recorded command, which must be one to type: [VAR=1] ./train_gpt2_fp8 FLAGS
    (the rank and the directory of a multi-rank command are placeholders)"""
    args = shlex.split(command)
    if re.fullmatch(r"\w+=\S*", args[0]):
        args = args[1:]
    assert args[0] == "./train_gpt2_fp8", command
    return bench_stubs.trainer_flags(args[1:])


def expected_figures(bench, flags, repeat=0):
    """what bench.py must make of the stub trainer's output for these flags (the repeat-th rerun of them)"""
    timed = [progress(flags, step, repeat) for step in range(bench.WARMUP_STEPS + 1, STEPS + 1)]
    mfus = [float(p["mfu"][:-1]) / 100 for p in timed if p["mfu"] != "n/a"]
    rows = {name: float("%.3f" % ms) for name, ms in breakdown_rows(flags)}
    cast = rows[flags["-opt"]] + rows["fp8 weight casts"] if flags["-p"] == "fp8" else None
    block_backward = sum(rows[f"matmul {linear} bwd"] for linear in ("qkv", "attproj", "fc", "fcproj"))
    return {"tok_per_s": statistics.median(p["tok_s"] for p in timed), "ms_per_step": statistics.median(p["ms"] for p in timed),
            "mfu": statistics.median(mfus) if mfus else None,
            "peak_mem_mib": max(progress(flags, step, repeat)["mem_mib"] for step in range(1, STEPS + 1)),
            "final_loss": timed[-1]["loss"], "optimizer_ms": rows[flags["-opt"]], "optimizer_weight_cast_ms": cast,
            "block_backward_ms": block_backward,
            "gelu_backward_ms": sum(rows.get(row, 0.0) for row in ("matmul fcproj bwd", "matmul fc bwd", "gelu bwd")),
            "attention_backward_ms": rows["attention bwd"],
            "attproj_ms": sum(rows.get(row, 0.0) for row in ("fp8 cast attention out", "matmul attproj fwd", "matmul attproj bwd"))}


ALL_BLOCK_LINEARS = "qkv,attproj,fc,fcproj"  # -f8's default block linears, bench.py's fp8_block_linears default


def expected_train_runs(bench):
    """(model, B, (precision, recipe, optimizer, -fw, lm_head, -fg, fp32 master, -ge, -ad, -fe, FP8 block linears)) of
    every train record --quick makes, in order: RUNS (adamw8 only at ADAMW8_MODELS) with master weights, then
    MASTER_FREE_RUNS there, then DEFAULT_RUNS with -ge 2, then DEFAULT_RUNS with -ad 0, then the FP8 one of DEFAULT_RUNS
    with -fe 1 where the model runs at -r 0 (d12), then that one with attproj in bf16"""
    runs = []
    for model, B, recompute in bench.QUICK_CONFIGS:
        runs += [(model, B, run + (True, 1, 1, 0, ALL_BLOCK_LINEARS)) for run in bench.RUNS
                 if run[2] != "adamw8" or model in bench.ADAMW8_MODELS]
        runs += [(model, B, run + (False, 1, 1, 0, ALL_BLOCK_LINEARS)) for run in bench.MASTER_FREE_RUNS
                 if model in bench.ADAMW8_MODELS]
        runs += [(model, B, run + (True, 2, 1, 0, ALL_BLOCK_LINEARS)) for run in bench.DEFAULT_RUNS]
        runs += [(model, B, run + (True, 1, 0, 0, ALL_BLOCK_LINEARS)) for run in bench.DEFAULT_RUNS]
        runs += [(model, B, run + (True, 1, 1, 1, ALL_BLOCK_LINEARS)) for run in bench.DEFAULT_RUNS
                 if run[0] == "fp8" and recompute == 0]
        runs += [(model, B, run + (True, 1, 1, 0, "qkv,fc,fcproj")) for run in bench.DEFAULT_RUNS if run[0] == "fp8"]
    return runs


def quick_runs(bench, model):
    """how many train runs --quick makes of model"""
    [recompute] = [r for m, _, r in bench.QUICK_CONFIGS if m == model]
    return len(bench.model_runs(model, recompute))


def failed(flags):
    return bench_stubs.trainer_failure(flags) is not None


def train_key(r):
    return (r["model"], r["precision"], r["recipe"], r["optimizer"], r["weight_scaling"], r["lm_head"], r["grad_scaling"],
            r["master_weights"], r["gelu_fusion"], r["attention_deterministic"], r["fc_writes_codes"], r["fp8_block_linears"])


def key_cells(r):
    """the main table's first cells of a train record (-fg after -fw)"""
    model, precision, recipe, optimizer, weights, lm_head, grads, master, gelu_fusion, attention, fc_codes, linears = train_key(r)
    return " | ".join((model, precision, recipe, optimizer, weights, grads, lm_head, "yes" if master else "no",
                       str(gelu_fusion), str(attention), str(fc_codes), linears)) + " | "


def markdown_sections(markdown):
    """{heading: body} of the "## " sections (the text before the first under "")"""
    parts = re.split(r"^## (.*)\n", markdown, flags=re.M)
    return dict(zip([""] + parts[1::2], parts[0::2]))


def test_main_writes_both_files_and_exits_1_for_the_failed_runs(bench_run):
    bench, code, records, markdown, md_name = bench_run
    assert code == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-nvidia-h100-80gb-hbm3-quick\.md", md_name), md_name
    assert {r["benchmark"] for r in records} == {"train", "repeat", "gemm", "ranks"}
    assert all(r["device"] == DEVICE and r["commit"] == COMMIT and md_name.startswith(r["date"]) for r in records)
    assert [r for r in records if "error" in r] == [
        r for r in records if r["benchmark"] == "train" and r["model"] == "d48" and r["recipe"] == "block"
    ] + [r for r in records if r["benchmark"] == "ranks" and r["precision"] == "fp8" and r["zero"] == 3]
    assert markdown.startswith(f"# Benchmark {md_name[:10]} on {DEVICE}\n") and markdown.endswith("\n")
    assert "error: error:" not in markdown  # the trainer's own "error: " prefix is not doubled
    assert "Incomplete" not in markdown  # the last rewrite is the complete report


def test_train_records_carry_the_trainer_figures(bench_run):
    bench, _, records, _, _ = bench_run
    assert bench_stubs.WARMUP == bench.WARMUP_STEPS  # the stub's slow steps are the ones bench.py drops
    train = [r for r in records if r["benchmark"] == "train"]
    assert [train_key(r) for r in train] == [(model,) + run for model, _, run in expected_train_runs(bench)]
    for r, (model, B, _) in zip(train, expected_train_runs(bench)):
        flags = command_flags(r["command"])
        assert (flags["-e"], flags["-b"], flags["-j"], flags["-kt"]) == (model, str(B), "", "1"), r["command"]
        if failed(flags):
            assert r["error"] == bench_stubs.trainer_failure(flags).removeprefix("error: ")  # the tables add "error: "
            continue
        assert "error" not in r, r
        assert {k: r[k] for k in expected_figures(bench, flags)} == expected_figures(bench, flags), r["command"]
        assert r["kernel_breakdown"] == breakdown_text(breakdown_rows(flags))
        assert {k: r[k] for k in bench_stubs.memory_figures(flags)} == bench_stubs.memory_figures(flags)
        assert flags.get("-w", "1") == ("1" if r["master_weights"] else "0"), r["command"]
        assert flags.get("-ge", "1") == str(r["gelu_fusion"]), r["command"]
        assert flags.get("-ad", "1") == str(r["attention_deterministic"]), r["command"]
        assert flags.get("-fe", "0") == str(r["fc_writes_codes"]), r["command"]
        assert flags.get("-f8", ALL_BLOCK_LINEARS) in (r["fp8_block_linears"], "all"), r["command"]
        assert flags.get("-fg", "-") == r["grad_scaling"], r["command"]  # -fg current, delayed, pow2 given as such
        floor = floor_model.step_floor_ms(floor_model.run_from_record(r), floor_model.DEVICES["h100"])  # DEVICE: an H100
        assert r["floor_ms"] == round(floor, 3) and r["floor_ms"] > 0, r["command"]
    assert not any("floor_ms" in r for r in train if "error" in r)
    assert any(r.get("mfu") is None and "error" not in r for r in train) and any(r.get("mfu") for r in train)
    assert {(r["model"], r["optimizer"]) for r in train if r["master_weights"] is False} == \
        {(m, o) for m in bench.ADAMW8_MODELS for o in ("adamw", "adamw8")}


def test_gemm_and_ranks_records(bench_run):
    bench, _, records, _, _ = bench_run
    gemm = [r for r in records if r["benchmark"] == "gemm"]
    text, _ = gemm_json(["d12", "d48"])
    added = ("benchmark", "command", "device", "commit", "date")  # bench.py's; its device is the run's (gpu_name())
    assert [{k: v for k, v in r.items() if k not in added} for r in gemm] == \
        [{k: v for k, v in json.loads(line).items() if k not in added} for line in text.splitlines()]
    assert shlex.split(gemm[0]["command"])[:3] == ["./bench_gemm", "--models", "d12,d48"]

    ranks = [r for r in records if r["benchmark"] == "ranks"]
    assert [(r["precision"], r["ranks"], r["zero"]) for r in ranks] == [
        (p, n, z) for p in ("bf16", "fp8") for n, z in ((1, 1), (2, 1), (2, 3))]
    for r in ranks:
        flags = command_flags(r["command"])
        assert (flags["-p"], flags["-pn"], flags["-z"], flags["-b"]) == (r["precision"], str(r["ranks"]), str(r["zero"]), str(r["B"]))
        if r["ranks"] == 2 and r["precision"] == "fp8" and r["zero"] == 3:
            assert r["error"] == bench_stubs.trainer_failure(dict(flags, **{"-pr": "1"})).removeprefix("error: ")
            continue
        figures = expected_figures(bench, flags)
        assert (r["ms_per_step"], r["tok_per_s"]) == (figures["ms_per_step"], figures["tok_per_s"])
        values = traffic_mb(flags)
        names = comm_line(values, "bf16")[1]
        assert r["traffic_bytes"] == ({n: round(mb * 1e6) for n, mb in zip(names, values)} if r["ranks"] == 2 else {})


def test_markdown_main_table_has_a_row_per_train_run(bench_run):
    bench, _, records, markdown, _ = bench_run
    head = markdown_sections(markdown)[""].split("\n\n")
    table = next(part for part in head if part.startswith("| model | precision |")).splitlines()[2:]
    train = [r for r in records if r["benchmark"] == "train"]
    assert len(table) == len(train) == len(expected_train_runs(bench))
    for row, r in zip(table, train):
        flags = command_flags(r["command"])
        cells = key_cells(r)
        if failed(flags):
            assert row == f"| {cells}| | error: {bench_stubs.trainer_failure(flags).removeprefix('error: ')} | | | | |"
            continue
        e = expected_figures(bench, flags)
        mfu = "n/a" if e["mfu"] is None else f"{100 * e['mfu']:.1f}%"
        assert row == (f"| {cells}{flags['-b']} | 1024 | {e['tok_per_s']} | {e['ms_per_step']:.2f} | {e['optimizer_ms']:.3f} | "
                       f"{mfu} | {e['peak_mem_mib']} |")


def test_the_default_runs_are_made_again_after_each_models_runs_and_set_beside_their_first(bench_run):
    """each model's default FP8 and bf16 runs once more, in that order, right after the model's train runs: records
    with "benchmark": "repeat" and the rerun's figures (the stub runs a repeat REPEAT_SLOWDOWN slower), left out of
    every other section, and the "Repeatability" table of each run's two measurements and of both FP8/bf16 ratios"""
    bench, _, records, markdown, _ = bench_run
    kinds = [(r["benchmark"], r.get("model")) for r in records if r["benchmark"] in ("train", "repeat")]
    d12_runs, d48_runs = quick_runs(bench, "d12"), quick_runs(bench, "d48")
    assert kinds == [("train", "d12")] * d12_runs + [("repeat", "d12")] * 2 + [("train", "d48")] * d48_runs \
        + [("repeat", "d48")] * 2
    repeats = [r for r in records if r["benchmark"] == "repeat"]
    assert [(r["model"], r["precision"]) for r in repeats] == [("d12", "fp8"), ("d12", "bf16"), ("d48", "fp8"), ("d48", "bf16")]
    first = {(r["model"], r["precision"]): r for r in records if bench.is_default_run(r)}
    assert len(first) == 4
    for r in repeats:
        flags = command_flags(r["command"])
        assert r["command"] == first[(r["model"], r["precision"])]["command"]
        assert {k: r[k] for k in expected_figures(bench, flags, 1)} == expected_figures(bench, flags, 1), r["command"]
    table = markdown_sections(markdown)["Repeatability: the default runs made again"]
    rows = [line for line in table.splitlines() if re.match(r"\| d\d+ ", line)]
    for (model, precision), line in zip([("d12", "bf16"), ("d12", "fp8"), ("d48", "bf16"), ("d48", "fp8")], rows[:4]):
        once, again = first[(model, precision)], next(r for r in repeats if (r["model"], r["precision"]) == (model, precision))
        assert again["tok_per_s"] < once["tok_per_s"]  # the stub's slowdown reached the record
        assert line == (f"| {model} | {precision} | {once['tok_per_s']:.0f} | {again['tok_per_s']:.0f} | "
                        f"{again['tok_per_s'] / once['tok_per_s']:.3f}x | n/a | n/a |"), line
    for model, line in zip(("d12", "d48"), rows[4:]):
        bf16 = [r for r in repeats if (r["model"], r["precision"]) == (model, "bf16")][0]
        fp8 = [r for r in repeats if (r["model"], r["precision"]) == (model, "fp8")][0]
        ratio_first = first[(model, "fp8")]["tok_per_s"] / first[(model, "bf16")]["tok_per_s"]
        assert line == f"| {model} | {ratio_first:.3f}x | {fp8['tok_per_s'] / bf16['tok_per_s']:.3f}x |", line
    assert len(rows) == 6
    # the reruns are no train records: no second per-kernel section, and the other sections pair first runs only
    assert markdown.count("## d12 bf16 - adamw -fw - -fg - lm_head - master yes -ge 1 -ad 1 -fe 0 FP8 block linears qkv,attproj,fc,fcproj "
                           "B=64: per-kernel time") == 1


def test_a_failed_repeat_shows_its_error_and_no_ratio(tmp_path_factory, monkeypatch):
    """a repeat that fails (the stub fails every rerun) is a row with its error, not a ratio from half the runs"""
    monkeypatch.setenv("LLM8_STUB_FAIL_REPEATS", "1")
    bench, code, out = run_main(tmp_path_factory, "--only", "d12")
    assert code == 1
    [md_path] = glob.glob(os.path.join(out, "*.md"))
    table = markdown_sections(open(md_path).read())["Repeatability: the default runs made again"]
    rows = [line for line in table.splitlines() if line.startswith("| d12 ")]
    assert [line.split(" | ")[1] for line in rows] == ["bf16", "fp8"], rows
    assert all(" | error: CUDA error: an illegal memory access was encountered (stub) | " in line for line in rows), rows
    assert "FP8 over bf16, the default runs, from each pass" not in table


def test_markdown_sections(bench_run):
    bench, _, records, markdown, _ = bench_run
    sections = markdown_sections(markdown)
    ok_train = [r for r in records if r["benchmark"] == "train" and "error" not in r]
    kernel_headings = [f"{r['model']} {r['precision']} {r['recipe']} {r['optimizer']} -fw {r['weight_scaling']} "
                       f"-fg {r['grad_scaling']} lm_head {r['lm_head']} master {'yes' if r['master_weights'] else 'no'} -ge {r['gelu_fusion']} "
                       f"-ad {r['attention_deterministic']} -fe {r['fc_writes_codes']} FP8 block linears {r['fp8_block_linears']} "
                       f"B={r['B']}: per-kernel time"
                       for r in ok_train]
    assert list(sections) == ["", "FP8 weight cast: -fw current vs delayed",
                              "FP8 output-gradient scaling: -fg current vs delayed vs pow2",
                              "GELU backward fusion: -ge 1 vs -ge 2", "Attention backward: -ad 1 vs -ad 0",
                              "FP8 GELU codes from fc's GEMM: -fe 0 vs -fe 1",
                              f"attproj in FP8 or bf16: -f8 {ALL_BLOCK_LINEARS} vs -f8 qkv,fc,fcproj",
                              "FP8 lm_head: bf16 (default -f8) vs FP8 (-f8 all)",
                              "Memory: optimizer and master weights", "Repeatability: the default runs made again",
                              "Floor: measured vs the model's floor",
                              "Per-GEMM FP8 vs bf16",
                              "Multi-GPU: 2 ranks on one GPU vs 1 rank"] + kernel_headings

    by_key = {train_key(r): r for r in ok_train}
    rows = [l for l in sections["FP8 weight cast: -fw current vs delayed"].splitlines() if re.match(r"\| d\d+ ", l)]
    assert [l.split(" | ")[:3] for l in rows] == [["| d12", "delayed", "adamw"], ["| d12", "delayed", "adamw8"],
                                                 ["| d48", "delayed", "adamw"], ["| d48", "delayed", "adamw8"]]
    current = by_key[("d12", "fp8", "delayed", "adamw", "current", "bf16", "current", True, 1, 1, 0, ALL_BLOCK_LINEARS)]
    delayed = by_key[("d12", "fp8", "delayed", "adamw", "delayed", "bf16", "current", True, 1, 1, 0, ALL_BLOCK_LINEARS)]
    assert f"| {current['tok_per_s']:.0f} | {delayed['tok_per_s']:.0f} | {delayed['tok_per_s'] / current['tok_per_s']:.3f}x | " \
           f"{current['optimizer_weight_cast_ms']:.3f} | {delayed['optimizer_weight_cast_ms']:.3f} |" in rows[0]

    # -fg current, delayed and pow2 of the default FP8 run; the FP8-lm_head twin is made without pow2
    rows = [l for l in sections["FP8 output-gradient scaling: -fg current vs delayed vs pow2"].splitlines()
            if re.match(r"\| d\d+ ", l)]
    assert [l.split(" | ")[:5] for l in rows] == [["| d12", "delayed", "adamw", "current", "bf16"],
                                                 ["| d12", "delayed", "adamw", "current", "fp8"],
                                                 ["| d48", "delayed", "adamw", "current", "bf16"],
                                                 ["| d48", "delayed", "adamw", "current", "fp8"]]
    for row in rows:
        model, lm_head = row.split(" | ")[0][2:], row.split(" | ")[4]
        runs = [by_key.get((model, "fp8", "delayed", "adamw", "current", lm_head, grads, True, 1, 1, 0, ALL_BLOCK_LINEARS))
                for grads in ("current", "delayed", "pow2")]
        assert (runs[2] is None) == (lm_head == "fp8"), row
        base = runs[0]
        cells = [f"{r['tok_per_s']:.0f}" if r else "-" for r in runs]
        cells += [f"{r['tok_per_s'] / base['tok_per_s']:.3f}x" if r else "-" for r in runs[1:]]
        cells += [f"{r['block_backward_ms']:.3f}" if r else "-" for r in runs]
        cells += [f"{r['final_loss']:.4f}" if r else "-" for r in runs]
        cells += [f"{100.0 * runs[2]['recast_fraction']:.1f}%" if runs[2] else "-"]  # from the trainer's last line
        assert runs[2] is None or runs[2]["recast_fraction"] == bench_stubs.STUB_RECASTS / bench_stubs.STUB_PREDICTIONS
        assert row.endswith(" | " + " | ".join(cells) + " |"), row
        assert all(r["block_backward_ms"] < base["block_backward_ms"] for r in runs[1:] if r), row

    rows = [l for l in sections["FP8 lm_head: bf16 (default -f8) vs FP8 (-f8 all)"].splitlines() if re.match(r"\| d\d+ ", l)]
    assert len(rows) == 2
    fp8_head = by_key[("d12", "fp8", "delayed", "adamw", "current", "fp8", "current", True, 1, 1, 0, ALL_BLOCK_LINEARS)]
    assert rows[0].startswith(f"| d12 | delayed | adamw | current | {current['tok_per_s']:.0f} | {fp8_head['tok_per_s']:.0f} | "
                              f"{fp8_head['tok_per_s'] / current['tok_per_s']:.3f}x |")

    # the VARIED_SETTINGS sections: the default bf16 and FP8 runs with the setting's default and its other value
    # (the key's last four fields: -ge, -ad, -fe and the FP8 block linears), the rows the setting is about faster with
    # the other value (-fe 1 only where it acts: the FP8 run at -r 0, d12's; attproj in bf16 in the FP8 runs)
    default_rows = [["| d12", "bf16", "-"], ["| d12", "fp8", "delayed"], ["| d48", "bf16", "-"], ["| d48", "fp8", "delayed"]]
    ALL = ALL_BLOCK_LINEARS
    for heading, settings, ms_field, expected_rows in (
            ("GELU backward fusion: -ge 1 vs -ge 2", ((1, 1, 0, ALL), (2, 1, 0, ALL)), "gelu_backward_ms", default_rows),
            ("Attention backward: -ad 1 vs -ad 0", ((1, 1, 0, ALL), (1, 0, 0, ALL)), "attention_backward_ms", default_rows),
            ("FP8 GELU codes from fc's GEMM: -fe 0 vs -fe 1", ((1, 1, 0, ALL), (1, 1, 1, ALL)), "fc_forward_ms",
             default_rows[1:2]),
            (f"attproj in FP8 or bf16: -f8 {ALL} vs -f8 qkv,fc,fcproj", ((1, 1, 0, ALL), (1, 1, 0, "qkv,fc,fcproj")),
             "attproj_ms", default_rows[1::2])):
        rows = [l for l in sections[heading].splitlines() if re.match(r"\| d\d+ ", l)]
        assert [l.split(" | ")[:3] for l in rows] == expected_rows, heading
        run_keys = {"bf16": ("bf16", "-", "-", "-", "-"), "fp8": ("fp8", "delayed", "current", "bf16", "current")}
        for row, (precision, recipe, weights, lm_head, grads) in zip(rows, [run_keys[r[1]] for r in expected_rows]):
            model = row.split(" | ")[0][2:]
            base, other = (by_key[(model, precision, recipe, "adamw", weights, lm_head, grads, True) + values] for values in settings)
            assert row == (f"| {model} | {precision} | {recipe} | {base['tok_per_s']:.0f} | {other['tok_per_s']:.0f} | "
                           f"{other['tok_per_s'] / base['tok_per_s']:.3f}x | {base[ms_field]:.3f} | {other[ms_field]:.3f} | "
                           f"{base['final_loss']:.4f} | {other['final_loss']:.4f} |"), heading
            assert other[ms_field] < base[ms_field], heading

    rows = [l for l in sections["Memory: optimizer and master weights"].splitlines() if re.match(r"\| d\d+ ", l)]
    memory = [r for r in ok_train if r["precision"] == "bf16" and r["model"] in bench.ADAMW8_MODELS and r["gelu_fusion"] == 1
              and r["attention_deterministic"] == 1]
    assert len(rows) == len(memory) == 8  # d12 and d48, each optimizer with and without master weights
    for row, r in zip(rows, memory):
        m = bench_stubs.memory_figures(command_flags(r["command"]))
        eight_bit = ("n/a", "n/a") if m["eight_bit_bytes_per_param"] is None else \
            (f"{m['eight_bit_bytes_per_param']:.3f}", f"{m['eight_bit_share_pct']:.1f}%")
        assert row == (f"| {r['model']} | {r['optimizer']} | {'yes' if r['master_weights'] else 'no'} | "
                       f"{m['persistent_bytes_per_param']:.3f} | {eight_bit[0]} | {eight_bit[1]} | {m['optimizer_state_gib']:.2f} | "
                       f"{r['peak_mem_mib']} |")

    floor = sections["Floor: measured vs the model's floor"]
    rows = [l for l in floor.splitlines() if re.match(r"\| d\d+ \| (bf16|fp8) \| \d+ \|", l)]
    defaults = [by_key[(m, "bf16", "-", "adamw", "-", "-", "-", True, 1, 1, 0, ALL_BLOCK_LINEARS)] for m in ("d12", "d48")] + \
        [by_key[(m, "fp8", "delayed", "adamw", "current", "bf16", "current", True, 1, 1, 0, ALL_BLOCK_LINEARS)] for m in ("d12", "d48")]
    defaults.sort(key=lambda r: records.index(r))  # in the order measured
    assert rows == [f"| {r['model']} | {r['precision']} | {r['B']} | {r['ms_per_step']:.2f} | {r['floor_ms']:.2f} | "
                    f"{r['ms_per_step'] / r['floor_ms']:.2f}x |" for r in defaults]
    assert "H100 SXM (datasheet)" in floor
    for r in defaults[:2]:  # d12's: the region tables, the stub's measured rows beside their floors
        run = floor_model.run_from_record(r)
        assert f"**{floor_model.run_label(run)}**, B={r['B']} T=1024 -r 0: floor {r['floor_ms']:.2f} ms per step" in floor
        optimizer = dict(breakdown_rows(command_flags(r["command"])))["adamw"]
        assert re.search(rf"^\| adamw \| [^\n]* \| {optimizer:.3f} \| [\d.]+x \|$", floor, re.M)
    assert floor.count("| region | matrix TFLOP |") == 2

    gemm = sections["Per-GEMM FP8 vs bf16"]
    _, ratios = gemm_json(["d12", "d48"])
    for model in ("d12", "d48"):
        cells = [f"{ratios[(model, v)]:.2f}x" if (model, v) in ratios else "n/a" for v in bench.GEMM_FP8_VARIANTS]
        assert f"| {model} | {bench_stubs.gemm_models()[model]} | " + " | ".join(cells) + \
            f" | >= {bench.GEMM_TARGETS[model]:.2f}x |" in gemm.splitlines()
        assert gemm_table(model).strip() in gemm

    rows = [l for l in sections["Multi-GPU: 2 ranks on one GPU vs 1 rank"].splitlines() if re.match(r"\| (bf16|fp8) ", l)]
    ranks = {(r["precision"], r["ranks"], r["zero"]): r for r in records if r["benchmark"] == "ranks"}
    assert [tuple(l.split(" | ")[:3]) for l in rows] == [(f"| {p}", str(n), str(z)) for p, n, z in ranks]
    one, two = ranks[("bf16", 1, 1)], ranks[("bf16", 2, 1)]
    assert f"| {two['ms_per_step']:.2f} | {two['tok_per_s']:.0f} | {two['ms_per_step'] / one['ms_per_step']:.3f}x | 248.900 |" in rows[1]
    assert f"error: {ranks[('fp8', 2, 3)]['error']}" in rows[5]

    for r, heading in zip(ok_train, kernel_headings):
        assert sections[heading].strip() == f"`{r['command']}`\n\n{breakdown_text(breakdown_rows(command_flags(r['command'])))}"


def test_scaling_model_reads_the_default_runs_of_the_json(bench_run, tmp_path):
    """doc/scaling.md's model takes one GPU's time from this JSON: the trainer's default FP8 run
    (-fw current, lm_head bf16), not whichever FP8 variant bench.py timed last"""
    bench, _, records, _, _ = bench_run
    scaling_model = load_dev_bench_module("scaling_model")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    table = scaling_model.compute_from_bench(str(path), "delayed", "adamw")
    default = [r for r in records if r.get("benchmark") == "train" and "error" not in r and r["model"] == "d12"
               and r["precision"] == "fp8" and r["recipe"] == "delayed" and r["optimizer"] == "adamw"
               and r["weight_scaling"] == "current" and r["lm_head"] == "bf16" and r["grad_scaling"] == "current"
               and r["gelu_fusion"] == 1 and r["attention_deterministic"] == 1 and r["fc_writes_codes"] == 0
               and r["fp8_block_linears"] == ALL_BLOCK_LINEARS]
    assert len(default) == 1
    assert table[("d12", "fp8")].ms_per_step == default[0]["ms_per_step"]


def test_only_one_model_per_device_call(tmp_path_factory):
    """--only d48 (dev/gpu_session.sh bench d48: one device call) runs d48's train runs and GEMMs and
    nothing else, into files whose names and heading carry the model, so d12's call keeps its own"""
    bench, code, out = run_main(tmp_path_factory, "--only", "d48")
    [md_path] = glob.glob(os.path.join(out, "*.md"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-nvidia-h100-80gb-hbm3-quick-d48\.md", os.path.basename(md_path)), md_path
    records = json.load(open(md_path[:-3] + ".json"))
    assert {r["model"] for r in records if r["benchmark"] == "train"} == {"d48"}
    assert {r["benchmark"] for r in records} == {"train", "repeat", "gemm"}  # the multi-GPU runs are d12's
    assert code == 1  # the stub's d48 block run fails
    assert "`python3 dev/bench/bench.py --quick --only d48`" in open(md_path).read()


def test_a_missing_bench_gemm_still_measures_the_train_runs(tmp_path_factory):
    """./bench_gemm not built (its link failed in a device build that went on with make -k): the train runs are
    measured all the same, and the per-GEMM section and record say what is missing, instead of bench.py stopping
    before its first run"""
    bench, code, out = run_main(tmp_path_factory, "--only", "d48", without_gemm_bench=True)
    [md_path] = glob.glob(os.path.join(out, "*.md"))
    records = json.load(open(md_path[:-3] + ".json"))
    assert len([r for r in records if r["benchmark"] == "train"]) == quick_runs(bench, "d48")
    [gemm] = [r for r in records if r["benchmark"] == "gemm"]
    assert gemm["error"] == "./bench_gemm is not built (make bench_gemm)", gemm
    assert "error: ./bench_gemm is not built (make bench_gemm)" in open(md_path).read()
    assert code == 1


def test_no_gpu_stops_the_benchmark_before_any_report(tmp_path_factory, monkeypatch):
    """without a GPU every trainer run fails alike: bench.py stops at the first, with the trainer's line, and writes no
    report of errors (make bench on a machine without a GPU wrote one into doc/benchmarks/)"""
    with open(os.path.join(bench_stubs.ROOT, "llmc", "cuda_common.h")) as f:
        bench = load_dev_bench_module("bench")
        assert f'"{bench.NO_GPU_ERROR} here' in f.read(), "the trainer's no-GPU error no longer starts so"
    monkeypatch.setenv("LLM8_STUB_NO_GPU", "1")
    bench, code, out = run_main(tmp_path_factory)
    assert code == "error: no usable NVIDIA GPU here (the CUDA runtime says: stub): llm8 needs a GPU (bench.py wrote no report)"
    assert os.listdir(out) == []


def test_a_time_limit_stops_the_run_going_and_counts_what_did_not_run(tmp_path_factory, monkeypatch):
    """--time-limit (dev/gpu_session.sh first: one device call with a fixed budget): the trainer run going
    when the time is up is killed, its process group with it, and recorded as stopped; no program
    starts after it; the report says how many did not run and main() exits non-zero. Here d12's third
    run (-fw delayed) hangs"""
    bench = load_dev_bench_module("bench")
    monkeypatch.setattr(bench, "MIN_PROGRAM_S", 2)
    monkeypatch.setenv("LLM8_STUB_HANG", "-fw delayed")
    started = time.monotonic()
    bench, code, out = run_main(tmp_path_factory, "--only", "d12", "--time-limit", "8", bench=bench)
    assert time.monotonic() - started < 20
    assert code == 1
    [md_path] = glob.glob(os.path.join(out, "*.md"))
    records = json.load(open(md_path[:-3] + ".json"))
    assert [r.get("weight_scaling") for r in records] == ["-", "current", "delayed"]
    assert "error" not in records[0] and "error" not in records[1]
    assert re.fullmatch(r"stopped at --time-limit, after \d+ s", records[2]["error"]), records[2]["error"]
    # d12's other train runs, its 2 repeats, its GEMMs and the 6 multi-rank runs
    not_run = quick_runs(bench, "d12") - 3 + 2 + 1 + 6
    markdown = open(md_path).read()
    assert f"**Incomplete**: --time-limit 8 s was reached: 3 records, {not_run} programs not run." in markdown
    assert "`python3 dev/bench/bench.py --quick --only d12 --time-limit 8`" in markdown


@pytest.mark.parametrize("only", ["d13", "d12,d12", "d12,"])
def test_only_names_known_models(tmp_path_factory, only):
    bench = load_dev_bench_module("bench")
    with pytest.MonkeyPatch.context() as mp:
        trainer, gemm_bench = bench_stubs.install(str(tmp_path_factory.mktemp("root")))
        mp.setattr(bench, "TRAINER", trainer)
        mp.setattr(bench, "GEMM_BENCH", gemm_bench)
        mp.setattr(sys, "argv", ["bench.py", "--quick", "--only", only])
        with pytest.raises(SystemExit) as exit_info:
            bench.main()
    assert exit_info.value.code == f"error: --only {only}: expected a comma list of distinct models from d12, d24, d36, d48"


def copy_of_the_scripts(tmp_path):
    """a directory with the device-call scripts (dev/gpu_session.sh, dev/bench/, the test runners) and the stub
    trainer and bench_gemm where bench.py looks for the real ones; returns it"""
    root = tmp_path / "repo"
    scripts = ["dev/gpu_session.sh", "test/run_gpu_tests.sh", "test/run_cpu_tests.sh"]
    for path in scripts + [os.path.relpath(p, bench_stubs.ROOT) for p in glob.glob(os.path.join(bench_stubs.ROOT, "dev/bench/*.py"))]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(open(os.path.join(bench_stubs.ROOT, path)).read())
    bench_stubs.install(str(root))
    return root


def test_sigterm_kills_the_running_trainer(tmp_path):
    """each trainer run is a process group of its own, which a timeout around bench.py (or gpu_trainer_ranks.py,
    through the same run_programs) does not reach: on SIGTERM bench.py kills it before it exits, so no
    trainer is left holding the GPU for the device call after. Here the first run hangs"""
    root = copy_of_the_scripts(tmp_path)
    env = dict(os.environ, LLM8_STUB_HANG="-p bf16")
    bench = subprocess.Popen([sys.executable, str(root / "dev" / "bench" / "bench.py"), "--quick", "--only", "d12",
                              "--out", str(tmp_path / "out")], env=env, stdout=subprocess.PIPE, text=True)
    def trainers():
        found = subprocess.run(["pgrep", "-f", f"{root}/build/bench_data"], capture_output=True, text=True).stdout.split()
        return [pid for pid in found if int(pid) != os.getpid()]
    deadline = time.monotonic() + 30
    while not trainers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert trainers(), "the stub trainer never started"
    bench.terminate()
    assert bench.wait(timeout=30) == 128 + 15
    time.sleep(0.5)
    assert trainers() == []


def first_stage_fakes(tmp_path):
    """the scripts' copy, and stand-ins on a PATH directory: make (no cuDNN frontend headers, so check-cudnn fails
    and the build gets NO_CUDNN=1; one target fails), nvidia-smi, a test binary per test/test_*.cu printing 10
    passes (test_fp8_kernels one failure, test_gpt2 hangs), and ./probe_epilogues and ./bench_casts printing a one-row
    table each; returns
    (root, PATH directory, OUT, test names)"""
    root, fakes, out = copy_of_the_scripts(tmp_path), tmp_path / "bin", tmp_path / "out"
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(bench_stubs.ROOT, "test", "test_*.cu")))
    (root / "build").mkdir()
    for name in names:
        (root / "test" / f"{name}.cu").write_text("")
        body = {"test_gpt2": "echo started; sleep 300", "test_fp8_kernels": f'echo "{name}: 5 passed, 1 failed"; exit 1'}
        path = root / "build" / name
        path.write_text("#!/bin/sh\n" + body.get(name, f'echo "{name}: 10 passed, 0 failed"') + "\n")
        path.chmod(0o755)
    probe = root / "probe_epilogues"
    probe.write_text('#!/bin/sh\necho "## cuBLASLt FP8 GEMMs through GELU epilogues: FP8 outputs, bf16 with amax (Fake H100)"\n'
                     'echo; echo "| case | heuristic | run | amax D written |"; echo "| fc fwd: E4M3 D | yes | yes | - |"\n')
    probe.chmod(0o755)
    casts = root / "bench_casts"
    casts.write_text('#!/bin/sh\necho "## FP8 tile cast bandwidth (dev/bench/bench_casts.cu) on Fake H100"\n'
                     'echo; echo "| rows x cols | what | bytes/element | ms | GB/s | of copy |"; '
                     'echo "| 65536 x 768 | copy | 4 | 0.0700 | 2876 | 1.00 |"\n')
    casts.chmod(0o755)
    fakes.mkdir()
    make = ('case "$*" in env*) echo "the machine";; '
            '*check-cudnn*) echo "error: cuDNN frontend headers (cudnn_frontend.h) not found" >&2; exit 2;; '
            '*) echo "make $*"; echo "make: *** [Makefile:9: build/test_sparse_buffer] Error 1"; exit 2;; esac')
    for name, body in [("make", make),
                       ("nvidia-smi", 'case "$*" in *driver_version*) echo "Fake H100, 580.1";; *) echo "NVIDIA H100 80GB HBM3";; esac')]:
        (fakes / name).write_text("#!/bin/sh\n" + body + "\n")
        (fakes / name).chmod(0o755)
    return root, fakes, out, names


def test_gpu_session_first_stage_dry_run(tmp_path):
    """dev/gpu_session.sh first (a session's first device call: env, build, the GPU tests, d12's quick benchmark,
    within FIRST_S) in a copy of its scripts, with stand-ins for make, nvidia-smi, the test binaries (one fails,
    test_gpt2 hangs) and the trainer: the hang is stopped at the tests' deadline, the benchmark still runs in the
    time left, the call ends within FIRST_S, and what comes back is at most 8 files (the device tool's limit)
    with summary.txt naming the GPU, the build's errors, the test counts and the benchmark's rows"""
    root, fakes, out, names = first_stage_fakes(tmp_path)
    # the benchmark's window: bench.py starts no program with under MIN_PROGRAM_S (20) left, so 34 leaves the
    # 15 fake runs and the 2 repeats 14 s, which a busy 2-core machine needs (the 15 runs alone with 2 s left:
    # a loaded run lost its last one; with 10 s they were all made)
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable,
               FIRST_S="44", FIRST_BENCH_S="34", PYTHONPATH=fake_torch(tmp_path))
    started = time.monotonic()
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "first"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert time.monotonic() - started < 44 + 5, result.stdout[-3000:]
    files = sorted(os.listdir(out))
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert {"env.txt", "build.log", "gpu_tests.log", "bench_d12.log", "summary.txt"} <= set(files), files
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[:3] == ["== first: Fake H100, 580.1", "build: 1 make errors (build.log)",
                           "build: NO_CUDNN=1, no cuDNN attention tested (error: cuDNN frontend headers (cudnn_frontend.h) not found)"]
    assert re.search(r"^make -k -j\d+ PYTHON=\S+ NO_CUDNN=1 train_gpt2_fp8 bench_gemm probe_epilogues bench_casts gpu-tests$",
                     (out / "build.log").read_text(), re.M)
    # test_gpt2 runs last and is cut at the tests' deadline; the others ran, in the stage's order
    assert summary[3] == f"gpu tests: {10 * (len(names) - 2) + 5} passed, 2 failed", summary
    assert "!! build/test_gpt2 ran past TEST_DEADLINE (" in summary[4], summary
    # probe_epilogues' table: in env.txt after the build, in the summary after the tests
    assert "## cuBLASLt FP8 GEMMs through GELU epilogues: FP8 outputs, bf16 with amax (Fake H100)" in (out / "env.txt").read_text()
    probe_at = summary.index("## cuBLASLt FP8 GEMMs through GELU epilogues: FP8 outputs, bf16 with amax (Fake H100)")
    assert summary[probe_at + 1:probe_at + 3] == ["| case | heuristic | run | amax D written |",
                                                  "| fc fwd: E4M3 D | yes | yes | - |"], summary
    assert probe_at > 4 and probe_at < summary.index("bench: " + (out / "bench_d12.log").read_text().splitlines()[-1]), summary
    # bench_casts' table likewise, after probe_epilogues'
    casts_at = summary.index("## FP8 tile cast bandwidth (dev/bench/bench_casts.cu) on Fake H100")
    assert summary[casts_at + 1:casts_at + 3] == ["| rows x cols | what | bytes/element | ms | GB/s | of copy |",
                                                  "| 65536 x 768 | copy | 4 | 0.0700 | 2876 | 1.00 |"], summary
    assert casts_at > probe_at, summary
    # bench_gemm --algorithms' table in env.txt, its whole-model rows in the summary
    assert "#### d12: cuBLASLt's first algorithm (training's) against the fastest of the first 8 it lists" in \
        (out / "env.txt").read_text()
    assert "algorithms (precision | first ms | fastest ms): | total | all | fp8 | - | 10.0000 | 9.0000 | - | 1.111x |" in summary
    # dev/bench/torch_attention.py against test_torch_attention.py's stand-in torch: its table in env.txt, its rows in
    # the summary (each kernel's figures: there)
    assert "## PyTorch scaled_dot_product_attention against llm8's attention" in (out / "env.txt").read_text()
    attention = [line for line in summary if line.startswith("attention: | ")]
    assert [line.split(" | ")[:4] for line in attention] == [
        ["attention:", model, B, f"torch {backend}"] for model, B in (("d12", "64"), ("d48", "16"))
        for backend in ("flash", "cudnn", "efficient") for _ in ("qkv", "bthd", "bhtd")], summary
    ran = re.findall(r"^== build/(\w+)$", (out / "gpu_tests.log").read_text(), re.M)
    assert ran[:3] == ["test_cublaslt_rules", "test_kernels", "test_matmul_attention"] and ran[-1] == "test_gpt2", ran
    assert sorted(ran) == names
    # the benchmark, in the time left: every d12 run, its rows in the summary
    [md] = [f for f in files if f.endswith("-quick-d12.md")]
    assert md[:-3] + ".json" in files
    rows = [line for line in summary if line.startswith("| d12 |")]
    assert len(rows) == quick_runs(load_dev_bench_module("bench"), "d12"), summary
    # and the FP8 over bf16 ratio of the default runs' first measurements and of their repeats
    [ratios] = [line for line in summary if line.startswith("FP8 over bf16 (default runs | first | repeat): ")]
    assert re.fullmatch(r"FP8 over bf16 \(default runs \| first \| repeat\): \| d12 \| [\d.]+x \| [\d.]+x \|", ratios), ratios
    assert re.fullmatch(r"seconds used: \d+ of FIRST_S=44", summary[-1]) and int(summary[-1].split()[2]) <= 45, summary


def test_gpu_session_first_stage_probes_keep_to_the_tests_deadline(tmp_path):
    """a probe that hangs (here bench_casts) is cut at the time left before the tests' deadline, not at its own 60 s,
    so the call ends within FIRST_S and summary.txt comes back (the probes' fixed limits, 240 s in all, came on top
    of a build that may take the whole window); a test binary with 25 FAIL lines pushes neither the stopped
    test_gpt2's line nor the count out of the summary"""
    root, fakes, out, names = first_stage_fakes(tmp_path)
    (root / "bench_casts").write_text("#!/bin/sh\nsleep 45\n")
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable,
               FIRST_S="20", FIRST_BENCH_S="10", PYTHONPATH=fake_torch(tmp_path))
    started = time.monotonic()
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "first"], capture_output=True, text=True, timeout=120,
                   env=env)
    assert time.monotonic() - started < 20 + 10, "the call ran past FIRST_S"
    assert "(bench_casts: exit 124)" in (out / "env.txt").read_text()
    assert (out / "summary.txt").exists()

    root, fakes, out, names = first_stage_fakes(tmp_path / "fails")
    (root / "build" / "test_kernels").write_text(
        "#!/bin/sh\n" + "".join(f'echo "FAIL test/test_kernels.cu:{i}: a check"\n' for i in range(25))
        + 'echo "test_kernels: 5 passed, 25 failed"; exit 1\n')
    env = dict(env, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}")
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "first"], capture_output=True, text=True, timeout=120,
                   env=env)
    summary = (out / "summary.txt").read_text().splitlines()
    assert len([line for line in summary if line.startswith("FAIL test/")]) == 20, summary
    [count] = [line for line in summary if line.startswith("FAIL lines: ")]
    assert re.fullmatch(r"FAIL lines: (\d+) in all, the first 20 above \(gpu_tests\.log\)", count), count
    assert int(count.split()[2]) >= 25, count
    assert [line for line in summary if line.startswith("!! build/test_gpt2") or line.startswith("-- build/test_gpt2")], summary


def test_gpu_session_bench_stage_takes_several_models(tmp_path):
    """bench d12 d24 and bench d12,d24 both measure both models (the second word was dropped), and the log's name has
    no comma (the device tool returns no such file)"""
    root, fakes, out, _ = first_stage_fakes(tmp_path)
    for args, log in ((["d12", "d24"], "bench_d12_d24.log"), (["d12,d24"], "bench_d12_d24.log")):
        for f in os.listdir(out) if out.exists() else []:
            os.remove(out / f)
        env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable, BENCH_S="60")
        result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "bench"] + args, capture_output=True,
                                text=True, timeout=120, env=env)
        assert log in os.listdir(out), (args, os.listdir(out), result.stdout[-2000:])
        assert "--only d12,d24" in (out / log).read_text() or any(f.endswith("-quick-d12-d24.md") for f in os.listdir(out)), \
            (args, os.listdir(out))


def test_gpu_session_ranks_stage_stops_at_ranks_s(tmp_path):
    """RANKS_S=N bash dev/gpu_session.sh ranks: the multi-rank tests are stopped after N seconds (a session's second,
    short call), here with multi-rank trainer tests that hang. What NCCL wrote to NCCL_DEBUG_FILE before (a rank
    above 0 has no stdout) comes back in one log. The stage runs the tests itself, not through make, which would
    first compile a target that failed in the build (here every make fails) and run nothing"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    fake_tool(fakes, "make", "exit 2")
    fake_tool(fakes, "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3"')
    (root / "test" / "gpu_trainer_ranks.py").write_text(
        'import os, sys, time\nprint("ranks started", *sys.argv[1:], flush=True)\n'
        'open(os.environ["NCCL_DEBUG_FILE"].replace("%h", "host").replace("%p", "42"), "w").write("NCCL WARN rank 1 lost\\n")\n'
        'time.sleep(60)\n')
    env = dict(os.environ, OUT=str(tmp_path / "out"), PATH=f"{fakes}:{os.environ['PATH']}", RANKS_S="2", PYTHON=sys.executable)
    started = time.monotonic()
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "ranks", "twins"], capture_output=True,
                            text=True, timeout=60, env=env)
    assert time.monotonic() - started < 15
    assert result.returncode != 0, "a ranks stage cut off by RANKS_S must not report success"
    assert (tmp_path / "out" / "gpu_trainer_ranks_twins.log").read_text() == "ranks started twins\n"
    assert (tmp_path / "out" / "nccl_warnings.log").read_text().splitlines()[-1] == "NCCL WARN rank 1 lost"


def test_gpu_session_first_stage_without_a_benchmark(tmp_path):
    """FIRST_BENCH_S=0 (env, build and tests only, the rest of a call for another stage): the tests take the whole
    FIRST_S and the summary says the benchmark did not run; with ./probe_epilogues not built, and PyTorch missing
    for dev/bench/torch_attention.py, the summary says why each has no table"""
    root, fakes, out, names = first_stage_fakes(tmp_path)
    (root / "probe_epilogues").unlink()
    (tmp_path / "no_torch").mkdir()
    (tmp_path / "no_torch" / "torch.py").write_text("raise ImportError('No module named torch (stand-in)')\n")
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable,
               FIRST_S="6", FIRST_BENCH_S="0", PYTHONPATH=str(tmp_path / "no_torch"))
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "first"], capture_output=True, text=True, timeout=60, env=env)
    summary = (out / "summary.txt").read_text().splitlines()
    # no benchmark file at all: a device call returns at most 8 files, and this call has another stage's to return
    assert not [f for f in os.listdir(out) if f.endswith(".md") or f.startswith("bench")], os.listdir(out)
    assert re.fullmatch(r"bench: not run: \d s left of FIRST_S", summary[-2]), summary
    assert "probe_epilogues: no table ((probe_epilogues: exit 127))" in summary, summary
    assert ("torch_attention.py: no table (error: torch_attention.py: needs PyTorch 2.3 or later with CUDA (import "
            "failed: No module named torch (stand-in)))") in summary, summary


def test_gpu_session_profile_stage_dry_run(tmp_path):
    """dev/gpu_session.sh profile: the build (stand-in make), then dev/bench/ncu_profile.py into the logs with the time
    PROFILE_S leaves (test_ncu_profile.py's stand-in ncu): profile.md with a table per run, each run's CSV, profile.log;
    with too little time left after the build, one line says so and nothing is profiled"""
    root, fakes, out, _ = first_stage_fakes(tmp_path)
    ncu_dir = stand_in_ncu(tmp_path)
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{ncu_dir}:{os.environ['PATH']}", PYTHON=sys.executable,
               PROFILE_S="100")
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "profile", "--runs", "fp8"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert {"build.log", "profile.log", "profile.md", "ncu_fp8.csv.gz"} <= set(os.listdir(out)), os.listdir(out)
    md = (out / "profile.md").read_text()
    assert md.count("### d12 fp8, B=64 T=1024 -r 0, the last of 2 steps") == 1 and "| `fused_classifier_kernel` |" in md
    out2 = tmp_path / "out2"
    env = dict(env, OUT=str(out2), PROFILE_S="5")
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "profile"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 1 and not (out2 / "profile.md").exists()
    assert re.fullmatch(r"profile: not run, -?\d s left of PROFILE_S=5 after the build\n", (out2 / "profile.log").read_text())


def fake_tool(directory, name, body):
    (directory / name).write_text("#!/bin/sh\n" + body + "\n")
    (directory / name).chmod(0o755)


def test_gpu_session_unpacks_the_frontend_headers_of_any_python(tmp_path):
    """the cuDNN frontend wheel is built per CPython version, and pip refuses one of another version than the
    machine's (which ended the call with no logs at all): the build takes only its include/ headers, so they are
    unzipped into build/site whatever the wheel's tag, and env.txt says where they are"""
    root, fakes, out, _ = first_stage_fakes(tmp_path)
    (root / ".whl").mkdir()
    with zipfile.ZipFile(root / ".whl" / "nvidia_cudnn_frontend-1.0.0-cp399-cp399-manylinux_2_28_x86_64.whl", "w") as z:
        z.writestr("include/cudnn_frontend.h", "// the frontend\n")
        z.writestr("cudnn/__init__.py", "")
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable,
               FIRST_S="6", FIRST_BENCH_S="0")
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "first"], capture_output=True, text=True, timeout=60, env=env)
    assert (root / "build" / "site" / "include" / "cudnn_frontend.h").read_text() == "// the frontend\n"
    assert not (root / "build" / "site" / "cudnn").exists(), "only the headers are unpacked"
    assert (out / "summary.txt").exists()


def test_gpu_session_builds_without_cudnn_when_its_attention_does_not_compile(tmp_path):
    """headers found (check-cudnn passes) but build/cudnn_att.o fails, which every binary links: the build goes on
    with NO_CUDNN=1 and says so, instead of failing every target"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    fake_tool(fakes, "make", 'case "$*" in *check-cudnn*) exit 0;; *cudnn_att.o*) echo "cudnn_att.cpp: error"; exit 2;; '
                             '*) echo "make $*";; esac')
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable)
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "build"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    log = (out / "build.log").read_text()
    assert "build: NO_CUDNN=1, no cuDNN attention tested (build/cudnn_att.o did not build: above)" in log, log
    # what does not link cudnn_att.o was compiled while it was
    assert re.search(r"^make -k -j\d+ PYTHON=\S+ cuda-objects$", log, re.M), log
    assert re.search(r"^make -k -j\d+ PYTHON=\S+ NO_CUDNN=1 train_gpt2_fp8 bench_gemm probe_epilogues bench_casts gpu-tests$", log, re.M), log


def test_gpu_session_does_not_compile_a_failed_object_twice(tmp_path):
    """with cuDNN, the objects compile beside cudnn_att.o (make cuda-objects, make -k); one that failed there is not
    compiled again for the link (make -o: its binary's link fails at once), which on the device would cost its
    whole compile time a second time"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    for name in ("test_kernels", "test_gpt2"):
        (root / "test" / f"{name}.cu").write_text("")
    fake_tool(fakes, "make", 'echo "make $*" >> "$OUT/make_calls"; case "$*" in *cuda-objects*) mkdir -p build/obj; '
                             'touch build/obj/train_gpt2_fp8.o build/obj/test_gpt2.o; exit 2;; esac')
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable)
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "build"], capture_output=True, text=True,
                            timeout=60, env=env, cwd=root)
    assert result.returncode == 0, result.stderr
    calls = (out / "make_calls").read_text().splitlines()
    assert any(re.fullmatch(r"make -k -j\d+ PYTHON=\S+ cuda-objects", c) for c in calls), calls
    assert re.fullmatch(r"make -k -j\d+ PYTHON=\S+ -o build/obj/test_kernels.o train_gpt2_fp8 bench_gemm probe_epilogues "
                        r"bench_casts gpu-tests", calls[-1]), calls


def test_gpu_session_keeps_no_cudnn_for_the_next_call_and_tests_past_a_failed_target(tmp_path):
    """after cudnn_att.o failed, the next call on the warm machine (here the tests stage) builds with NO_CUDNN=1 at
    once, without compiling cudnn_att.o again (minutes on the device), and runs the test binaries that were built
    although a target failed (make gpucheck-tests would have compiled that target again and run nothing)"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    fake_tool(fakes, "make", 'echo "make $*" >> "$OUT/make_calls"; case "$*" in *check-cudnn*) exit 0;; '
                             '*cudnn_att.o*) exit 2;; *gpucheck*) echo "no: make gpucheck-*"; exit 2;; '
                             '*gpu-tests*) echo "make: *** [Makefile:9: build/test_sparse_buffer] Error 1"; exit 2;; esac')
    fake_tool(fakes, "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3"')
    (root / "build").mkdir()
    fake_tool(root / "build", "test_kernels", 'echo "test_kernels: 7 passed, 0 failed"')
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable)
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "build"], capture_output=True, text=True, timeout=60, env=env)
    assert (root / "build" / "no_cudnn").exists()
    (out / "make_calls").unlink()
    subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "tests"], capture_output=True, text=True, timeout=60, env=env)
    calls = (out / "make_calls").read_text()
    assert "cudnn" not in calls.replace("NO_CUDNN=1", ""), calls
    assert re.fullmatch(r"make -k -j\d+ PYTHON=\S+ NO_CUDNN=1 train_gpt2_fp8 bench_gemm probe_epilogues bench_casts gpu-tests\n", calls), calls
    tests_log = (out / "gpu_tests.log").read_text()
    assert "test_kernels: 7 passed, 0 failed" in tests_log and "no: make gpucheck" not in tests_log, tests_log


def test_gpu_session_rerun_runs_one_binary_after_the_build(tmp_path):
    """rerun NAME (a session's second call after NAME failed in first; the machine may have started afresh): the
    build brought up to date first, then that binary alone, its whole output in rerun_NAME.log, its failure the
    stage's exit status"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    fake_tool(fakes, "make", 'echo "make $*" >> "$OUT/make_calls"')
    fake_tool(fakes, "nvidia-smi", 'echo "NVIDIA H100 80GB HBM3"')
    (root / "build").mkdir()
    fake_tool(root / "build", "test_fp8_kernels", 'echo "a line of detail"; echo "FAIL x"; echo "test_fp8_kernels: 5 passed, 1 failed"; exit 1')
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable)
    result = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "rerun", "build/test_fp8_kernels"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0
    assert "gpu-tests" in (out / "make_calls").read_text(), "the build is brought up to date first"
    log = (out / "rerun_test_fp8_kernels.log").read_text()
    assert "a line of detail" in log and "test_fp8_kernels: 5 passed, 1 failed" in log, log
    assert "FAIL x" in result.stdout and "test_fp8_kernels: 5 passed, 1 failed" in result.stdout, result.stdout
    missing = subprocess.run(["bash", str(root / "dev" / "gpu_session.sh"), "rerun", "test_nothing"], capture_output=True,
                             text=True, timeout=60, env=env)
    assert missing.returncode != 0 and "build/test_nothing was not built" in missing.stderr, missing.stderr


def test_gpu_session_sanitize_stage_tells_a_timeout_from_an_error(tmp_path):
    """sanitize (compute-sanitizer memcheck over the kernel tests, each at most SANITIZE_S): every binary runs and
    logs its exit; one that runs out of time (124) is no failure, one with memcheck errors (its --error-exitcode 99)
    fails the stage, and without compute-sanitizer it stops in one line before building"""
    root, fakes = copy_of_the_scripts(tmp_path), tmp_path / "bin"
    fakes.mkdir()
    fake_tool(fakes, "make", 'echo "make $*" >> "$OUT/make_calls"')
    # the binary's name picks what memcheck does with it: clean, a timeout, or errors
    fake_tool(fakes, "compute-sanitizer", 'case "$5" in *test_fp8_kernels) sleep 30;; '
                                          '*test_matmul_attention) echo "========= ERROR SUMMARY: 1 error"; exit 99;; '
                                          '*) echo "========= ERROR SUMMARY: 0 errors";; esac')
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PATH=f"{fakes}:{os.environ['PATH']}", PYTHON=sys.executable, SANITIZE_S="1")
    session = ["bash", str(root / "dev" / "gpu_session.sh"), "sanitize"]
    result = subprocess.run(session, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "gpu-tests" in (out / "make_calls").read_text(), "the build is brought up to date first"
    exits = re.findall(r"^build/(\w+): exit (\d+)$", (out / "sanitize.log").read_text(), re.M)
    assert exits == [("test_kernels", "0"), ("test_fp8_kernels", "124"), ("test_adamw8_gpu", "0"),
                     ("test_matmul_attention", "99")], exits
    # the same timeout with no errors anywhere: the stage passes
    fake_tool(fakes, "compute-sanitizer", 'case "$5" in *test_fp8_kernels) sleep 30;; esac')
    timed_out = subprocess.run(session, capture_output=True, text=True, timeout=60, env=env)
    assert timed_out.returncode == 0 and "build/test_fp8_kernels: exit 124" in timed_out.stdout, timed_out.stdout
    if not os.path.exists("/usr/local/cuda/bin/compute-sanitizer"):  # the stage's fallback, off PATH
        os.remove(fakes / "compute-sanitizer")
        env["PATH"] = f"{fakes}:/usr/bin:/bin"
        missing = subprocess.run(session, capture_output=True, text=True, timeout=60, env=env)
        assert missing.returncode == 1 and missing.stderr == "error: dev/gpu_session.sh: compute-sanitizer not found\n", \
            missing.stderr
