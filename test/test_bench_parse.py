"""
dev/bench/bench.py reads the trainer's progress lines. This test takes the progress line's
printf format straight from train_gpt2_fp8.cu, fills it in, and checks that the bench
parses every field back, so a change to the line cannot silently break the benchmark.
"""
import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "dev", "bench", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def progress_format():
    source = open(os.path.join(ROOT, "train_gpt2_fp8.cu")).read()
    match = re.search(r'printf\("(step %5d/%d \| loss[^"]*)\\n"', source)
    assert match, "progress line printf not found in train_gpt2_fp8.cu"
    return match.group(1)


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
