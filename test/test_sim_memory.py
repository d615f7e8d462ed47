"""
dev/bench/sim_memory.py: its fit of the cudasim trainer's device memory (fixed, per layer, per
token, per layer and token) must predict a shape it was not fitted on, or its extrapolation to
d48 means nothing; and its command line refuses what it cannot pass on.
"""
import os
import subprocess
import sys

import pytest

from dev_modules import ROOT, load_dev_bench_module

sim_memory = load_dev_bench_module("sim_memory")


@pytest.mark.parametrize("flags", [["-p", "bf16", "-r", "0"], ["-p", "fp8", "-r", "1", "-opt", "adamw8"]])
def test_the_fit_predicts_a_fifth_shape(flags, tmp_path):
    if not os.path.exists(sim_memory.SIM_TRAINER):
        pytest.fail(f"{sim_memory.SIM_TRAINER} is not built (make build/sim/train_gpt2_fp8)")
    channels, vocab = 128, 997  # two heads of 64; a vocabulary like 50257, not a multiple of 128
    terms = sim_memory.fit(str(tmp_path), channels, vocab, flags)
    assert all(terms[t] > 0 for t in sim_memory.TERMS), terms
    layers, B = 3, 3
    measured = sim_memory.allocated_bytes(str(tmp_path), layers, channels, vocab, B, sim_memory.FIT_T, flags)
    predicted = sim_memory.predicted_bytes(terms, layers, B * sim_memory.FIT_T)
    assert abs(predicted - measured) <= 4096, (predicted, measured)  # allocation rounding only


def test_cudnns_dp_is_counted_only_where_the_run_uses_it():
    dp = 2 * 16 * 25 * 1024 * 1024  # d48, B=16, T=1024: bf16 B*NH*T*T
    assert sim_memory.attention_workspace_bytes(16, 1024, 1600, ["-p", "fp8"]) == dp
    assert sim_memory.attention_workspace_bytes(16, 1024, 1600, ["-ad", "0"]) == 0
    assert sim_memory.attention_workspace_bytes(16, 1024, 1600, ["-at", "fallback"]) == 0


@pytest.mark.parametrize("flags", [["-b", "4"], ["-p"], ["-e", "d12"]])
def test_flags_it_cannot_pass_on_are_refused_in_one_line(flags):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "bench", "sim_memory.py"), "--model", "d12",
                             "-b", "4", "--"] + flags, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: sim_memory.py: the flags after -- are flag-value pairs, without -b, -t or -e")
