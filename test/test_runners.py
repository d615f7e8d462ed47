"""
test/run_cpu_tests.sh, the runner of every test binary (make test, and make gpucheck through
run_gpu_tests.sh): its closing line must add up the binaries' own summary lines, count a
binary that crashed or printed no summary as failed, and, with TEST_TIMEOUT_S, stop a binary
that hangs and go on with the next (a device call is 10 minutes; one hang must not take it
all). Fake test binaries stand in for the real ones.
"""
import os
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(ROOT, "test", "run_cpu_tests.sh")


def fake_binary(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def run(binaries, **env):
    return subprocess.run(["bash", RUNNER] + binaries, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def test_summary_lines_add_up(tmp_path):
    a = fake_binary(tmp_path, "a", 'echo "a: 3 passed, 0 failed"')
    b = fake_binary(tmp_path, "b", 'echo "b: 4 passed, 0 failed"')
    result = run([a, b])
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1] == "cpu tests: 7 passed, 0 failed"


def test_failures_crashes_and_missing_summaries_count(tmp_path):
    failing = fake_binary(tmp_path, "failing", 'echo "failing: 2 passed, 1 failed"; exit 1')
    crashed = fake_binary(tmp_path, "crashed", 'echo "crashed: 5 passed, 0 failed"; exit 134')
    silent = fake_binary(tmp_path, "silent", "echo no summary")
    result = run([failing, crashed, silent], RUNNER_NAME="gpu tests")
    assert result.returncode != 0
    assert f"!! {crashed} exited with 134" in result.stdout
    assert f"!! {silent} printed no summary line (exit code 0)" in result.stdout
    assert result.stdout.splitlines()[-1] == "gpu tests: 7 passed, 3 failed"


def test_a_hanging_binary_is_stopped_and_the_next_one_runs(tmp_path):
    hangs = fake_binary(tmp_path, "hangs", 'echo "started"; sleep 30; echo "hangs: 1 passed, 0 failed"')
    after = fake_binary(tmp_path, "after", 'echo "after: 2 passed, 0 failed"')
    start = time.monotonic()
    result = run([hangs, after], TEST_TIMEOUT_S="1")
    assert time.monotonic() - start < 15
    assert result.returncode != 0
    lines = result.stdout.splitlines()
    # its output so far is shown before the verdict, then the next binary runs
    assert lines[:3] == [f"== {hangs}", "started", f"!! {hangs} ran past TEST_TIMEOUT_S=1s and was stopped"]
    assert lines[-1] == "cpu tests: 2 passed, 1 failed"


def test_a_deadline_stops_the_binary_running_and_lists_the_rest_as_not_run(tmp_path):
    """TEST_DEADLINE (dev/gpu_session.sh first: a device call with a fixed budget): the binary running at the
    deadline is stopped with its lines kept, those after it are listed as not run, and the closing line counts
    what ran and says how many did not, so the call goes on to its next stage with the counts"""
    quick = fake_binary(tmp_path, "quick", 'echo "quick: 2 passed, 0 failed"')
    slow = fake_binary(tmp_path, "slow", 'echo "started"; sleep 30; echo "slow: 1 passed, 0 failed"')
    never = fake_binary(tmp_path, "never", 'echo "never: 1 passed, 0 failed"')
    start = time.monotonic()
    result = run([quick, slow, never], TEST_DEADLINE=str(int(time.time()) + 2), TEST_TIMEOUT_S="300")
    assert time.monotonic() - start < 15
    assert result.returncode != 0
    lines = result.stdout.splitlines()
    stopped = [line for line in lines if line.startswith(f"!! {slow} ran past TEST_DEADLINE (")]
    assert len(stopped) == 1 and stopped[0].endswith("s left) and was stopped"), result.stdout
    assert "started" in lines and f"-- {never} not run: TEST_DEADLINE reached" in lines
    assert lines[-1] == "cpu tests: 2 passed, 1 failed, 1 binaries not run (TEST_DEADLINE)"


def test_a_deadline_after_every_binary_changes_nothing(tmp_path):
    a = fake_binary(tmp_path, "a", 'echo "a: 3 passed, 0 failed"')
    result = run([a], TEST_DEADLINE=str(int(time.time()) + 60), TEST_TIMEOUT_S="1")
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "cpu tests: 3 passed, 0 failed"


def test_without_a_timeout_a_slow_binary_finishes(tmp_path):
    slow = fake_binary(tmp_path, "slow", 'sleep 2; echo "slow: 1 passed, 0 failed"')
    result = run([slow])
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "cpu tests: 1 passed, 0 failed"


def test_lanes_run_binaries_at_once_and_show_each_output_whole(tmp_path):
    """TEST_JOBS=2 (make test): two lanes, each binary started in the order given as one frees, its output shown
    whole (its == line, then its lines) when it ends, and the closing line adds up every binary, whatever order
    they ended in"""
    slow = fake_binary(tmp_path, "slow", 'echo "slow starts"; sleep 3; echo "slow ends"; echo "slow: 1 passed, 0 failed"')
    quick = [fake_binary(tmp_path, f"quick{i}", f'echo "quick{i} starts"; sleep 1; echo "quick{i}: 2 passed, 0 failed"')
             for i in range(2)]
    start = time.monotonic()
    result = run([slow] + quick, TEST_JOBS="2")
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stdout
    assert elapsed < 4.5, elapsed  # one after another: 5 s
    assert result.stdout.splitlines() == [f"== {quick[0]}", "quick0 starts", "quick0: 2 passed, 0 failed",
                                          f"== {quick[1]}", "quick1 starts", "quick1: 2 passed, 0 failed",
                                          f"== {slow}", "slow starts", "slow ends", "slow: 1 passed, 0 failed",
                                          "cpu tests: 5 passed, 0 failed"]


def test_lanes_count_failures_crashes_and_hangs(tmp_path):
    failing = fake_binary(tmp_path, "failing", 'echo "failing: 2 passed, 1 failed"; exit 1')
    crashed = fake_binary(tmp_path, "crashed", 'echo "crashed: 5 passed, 0 failed"; exit 134')
    hangs = fake_binary(tmp_path, "hangs", 'echo "started"; sleep 30; echo "hangs: 1 passed, 0 failed"')
    fine = fake_binary(tmp_path, "fine", 'echo "fine: 4 passed, 0 failed"')
    start = time.monotonic()
    result = run([hangs, failing, crashed, fine], TEST_JOBS="2", TEST_TIMEOUT_S="2")
    assert time.monotonic() - start < 15
    assert result.returncode != 0
    lines = result.stdout.splitlines()
    assert f"!! {crashed} exited with 134" in lines
    # the hang's lines so far, then the verdict
    assert lines[lines.index(f"== {hangs}"):][:3] == [f"== {hangs}", "started", f"!! {hangs} ran past TEST_TIMEOUT_S=2s and was stopped"]
    assert lines[-1] == "cpu tests: 11 passed, 3 failed"


@pytest.mark.parametrize("jobs", ["0", "two", "-1"])
def test_lanes_refuse_a_count_that_is_not_a_whole_number(tmp_path, jobs):
    a = fake_binary(tmp_path, "a", 'echo "a: 3 passed, 0 failed"')
    result = run([a], TEST_JOBS=jobs)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: test/run_cpu_tests.sh: TEST_JOBS={jobs} (expected a whole number of "
                                          "binaries at once, 1 or more)"]


def test_a_hanging_multi_rank_run_is_killed(tmp_path, monkeypatch):
    """test/gpu_trainer_ranks.py (make gpucheck-ranks) kills a run's ranks after RUN_LIMIT_S and
    records the failure, so a hang outside a collective (-pt does not see it) cannot take the call"""
    import importlib
    import sys
    sleeper = fake_binary(tmp_path, "train_gpt2_fp8", "sleep 60")
    monkeypatch.setenv("LLM8_TRAINER", sleeper)
    sys.path.insert(0, os.path.join(ROOT, "test"))
    try:
        ranks = importlib.import_module("gpu_trainer_ranks")
        ranks = importlib.reload(ranks)  # TRAINER is read at import
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(ranks, "RUN_LIMIT_S", 1)
    monkeypatch.setattr(ranks, "FAILURES", [])
    start = time.monotonic()
    codes, _ = ranks.run(2, ["-x", 1], str(tmp_path))
    assert time.monotonic() - start < 15
    assert all(code != 0 for code in codes)
    assert len(ranks.FAILURES) == 1 and "still running after 1 s, killed" in ranks.FAILURES[0]


def test_multi_rank_runs_refuse_an_unknown_section():
    """gpu_trainer_ranks.py runs the sections it is given (dev/gpu_session.sh ranks twins killed: the rest of a
    call cut off at its limit); a misspelt one must stop it at once with one line, before any run"""
    result = subprocess.run(["python3", os.path.join(ROOT, "test", "gpu_trainer_ranks.py"), "twins", "twin"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown section 'twin'" in lines[0] and "trajectories resume reshard twins mpirun killed" in lines[0]


def test_a_stopped_test_binary_keeps_the_lines_it_printed(tmp_path):
    """test/test_harness.h makes stdout line-buffered: through the runner's pipe a C binary's output
    would otherwise sit in a buffer, and a binary stopped at its timeout would lose its FAIL lines"""
    source = tmp_path / "hang.c"
    source.write_text('#include <unistd.h>\n#include "test/test_harness.h"\n'
                      'int main(void) { CHECK(0, "boom"); sleep(30); return test_summary("hang"); }\n')
    binary = str(tmp_path / "hang")
    subprocess.run(["cc", "-O1", "-I", ROOT, str(source), "-o", binary], check=True, timeout=60)
    result = run([binary], TEST_TIMEOUT_S="1")
    assert any(line.startswith("FAIL ") and line.endswith(": boom") for line in result.stdout.splitlines()), result.stdout


def test_an_nccl_too_old_for_two_ranks_fails_gpucheck_unless_allowed():
    """make gpucheck's 2-rank tests need NCCL 2.30+ (two ranks on one GPU): with an older NCCL the 2-rank test of
    test_multi_gpu and gpu_trainer_ranks.py fail, so a green run includes them, unless LLM8_ALLOW_NO_TWO_RANKS=1 lets
    them pass with a SKIP line (dev/gpu_session.sh's first and tests stages, which never install a newer NCCL).
    test_multi_gpu runs under cudasim, told to report NCCL 2.28.9"""
    import importlib
    import sys
    binary = os.path.join(ROOT, "build", "sim", "test_multi_gpu")
    assert os.path.exists(binary), f"{binary} is not built (make build/sim/test_multi_gpu)"
    env = {k: v for k, v in os.environ.items() if k != "LLM8_ALLOW_NO_TWO_RANKS"}
    env["CUDASIM_NCCL_VERSION"] = "22809"
    strict = subprocess.run([binary], capture_output=True, text=True, timeout=300, env=env)
    assert strict.returncode != 0 and "NCCL 22809 is older than 2.30" in strict.stdout, strict.stdout[-2000:]
    assert "test_multi_gpu: " in strict.stdout and ", 1 failed" in strict.stdout, strict.stdout[-2000:]
    allowed = subprocess.run([binary], capture_output=True, text=True, timeout=300,
                             env=dict(env, LLM8_ALLOW_NO_TWO_RANKS="1"))
    assert allowed.returncode == 0 and "SKIP two ranks on one GPU: NCCL 22809" in allowed.stdout, allowed.stdout[-2000:]

    sys.path.insert(0, os.path.join(ROOT, "test"))
    try:
        ranks = importlib.import_module("gpu_trainer_ranks")
    finally:
        sys.path.pop(0)
    assert ranks.old_nccl_verdict(22809, "/x/libnccl.so.2", {}) == 1
    assert ranks.old_nccl_verdict(22809, "/x/libnccl.so.2", {"LLM8_ALLOW_NO_TWO_RANKS": "1"}) == 0
