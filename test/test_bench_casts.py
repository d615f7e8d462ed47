"""
dev/bench/bench_casts.cu's harness under cudasim (build/sim/bench_casts, small shapes): for each
width its six rows in order (copy, cast, codes, transposed, gelu cast, transpose) with the bytes
each moves, positive times, GB/s that are those bytes over that time, and the copy as its own
reference; a bad flag ends in one line naming it. The GPU's figures are dev/gpu_session.sh
first's to take (env.txt); here nothing is timed that means anything.
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "build", "sim", "bench_casts")
KINDS = [("copy", 4), ("cast", 4), ("codes", 3), ("transposed", 3), ("gelu cast", 4), ("transpose", 2)]


def run(*args):
    assert os.path.exists(BINARY), "%s is not built (make build/sim/bench_casts)" % BINARY
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_table_rows_per_width():
    result = run("--rows", "256", "--cols", "128,384", "--iters", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## FP8 tile cast bandwidth (dev/bench/bench_casts.cu) on cudasim (CPU)")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if re.match(r"^\| \d+ x \d+ \|", line)]
    assert [(r[0], r[1], int(r[2])) for r in rows] == [("256 x %d" % cols, kind, nbytes) for cols in (128, 384)
                                                        for kind, nbytes in KINDS]
    for r in rows:
        ms, gbs, of_copy = float(r[3]), float(r[4]), float(r[5])
        assert ms > 0
        elements = 256 * int(r[0].split(" x ")[1])
        # GB/s printed to the unit, from the time the ms printed to 4 decimals rounds
        moved = elements * int(r[2])
        assert moved / ((ms + 5e-5) * 1e6) - 0.5 <= gbs <= moved / (max(ms - 5e-5, 1e-9) * 1e6) + 0.5, r
        if r[1] == "copy":
            assert of_copy == 1.0


@pytest.mark.parametrize("args, named", [(["--rows", "100"], "--rows 100"), (["--cols", "16,x"], "--cols x"),
                                          (["--iters", "0"], "--iters must be 1 to 10000, got 0"),
                                          (["--bogus", "1"], "unknown flag --bogus"), (["--rows"], "a value is missing after --rows")])
def test_bad_flags_one_line(args, named):
    result = run(*args)
    assert result.returncode != 0 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr, result.stderr
