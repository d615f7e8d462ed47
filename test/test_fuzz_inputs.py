"""
A fixed-seed sample of test/fuzz_inputs.py's corrupted inputs (every file kind the trainers
read), run by make test: each must end in one error line naming the file, or run on where the
corruption is harmless. The whole fuzz (about a thousand cases, a few minutes) runs with
python3 test/fuzz_inputs.py.
"""
import os

import pytest

import fuzz_inputs


def test_fuzz_inputs_subset():
    """60 of train_gpt2cpu's cases and 4 under cudasim, seed 1: no BUG"""
    for binary in (fuzz_inputs.CPU, fuzz_inputs.SIM):
        if not os.path.exists(binary):
            pytest.fail(f"{binary} is not built (make train_gpt2cpu build/sim/train_gpt2_fp8)")
    results = fuzz_inputs.run_fuzz(seed=1, limit=60, sim=4)
    assert len(results) == 64
    bugs = [f"{c['trainer']} {c['file']}: {c['name']}: {detail}" for c, verdict, detail in results if verdict == "BUG"]
    assert not bugs, "\n".join(bugs)
