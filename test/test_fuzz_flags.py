"""
Fixed seeds of test/fuzz_flags.py's random flag combinations and model shapes, run by make test
against the cudasim trainer: each trains, resumes and matches its twin-batch rank runs bit for bit,
or is refused at startup with one line, the same on every rank. The whole fuzz (any number of
seeds) runs with python3 test/fuzz_flags.py --count N.
"""
import os
import tempfile

import pytest

import fuzz_flags


@pytest.mark.parametrize("seed,expected", [
    (1, "OK"),       # FP8 current recipe, -fg delayed, -r 2, adamw8 -qs none, no master weights, 2 micro-steps; ZeRO-3
    (5, "REFUSED"),  # L=3, C=384 and adamw8 over 3 ranks: attprojw's 8-bit states would be cut inside a block
])
def test_fuzz_flags_seed(seed, expected):
    for binary in (fuzz_flags.SIM, fuzz_flags.CPU):
        if not os.path.exists(binary):
            pytest.fail(f"{binary} is not built (make build/sim/train_gpt2_fp8 train_gpt2cpu)")
    with tempfile.TemporaryDirectory(prefix="llm8_fuzz_flags_") as workdir:
        case = fuzz_flags.Case(seed, workdir)
        verdict, what = fuzz_flags.check(case)
        assert verdict == expected, f"{case.describe()}: {verdict} {what}"
