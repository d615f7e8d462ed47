"""
The run scripts' own interface (scripts/run_gpt2_<size>_<precision>.sh through scripts/run_common.sh), beside
test_scripts.py's end-to-end runs and test_launch_scripts.py's launcher and retry tests:
- -h / --help prints the script's usage (its comment, the trainer command line it runs, the environment it
  reads) and exits 0 without data, without building and without running the trainer; -h with a value is the
  trainer's HellaSwag flag and goes to the trainer;
- DRY_RUN=1 checks the data (as a real run does before building) and prints the trainer's command line, one
  line that a shell splits into the words the trainer would get, building and running nothing;
- an FP8 script (a wrapper that execs the bf16 one with -p fp8) names itself in its messages;
- a run whose trainer dies at startup leaves no output dir behind that it created and left empty (the trainer
  claims -o with a lock file first), and never removes a dir that existed before.
make is a stub on PATH that logs its arguments and fails, so "nothing built" is checked, not assumed.
"""
import glob
import os
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = os.path.join(ROOT, "train_gpt2cpu")
RUN_SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "scripts", "run_gpt2_*_*.sh")))
FP8_SCRIPTS = [s for s in RUN_SCRIPTS if s.endswith("_fp8.sh")]
ENV_VARS = ("OUT_DIR", "NUM_GPUS", "LLM8_TRAINER", "LLM8_LAUNCHER", "DRY_RUN")


@pytest.fixture
def stubs(tmp_path):
    """a directory for PATH with a make that logs its arguments to make.log and fails, and a trainer stand-in
    (trainer.sh) that logs that it ran and exits 0"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text('#!/bin/sh\necho "$@" >> "%s"\nexit 1\n' % (tmp_path / "make.log"))
    (bin_dir / "trainer.sh").write_text('#!/bin/sh\necho "$@" >> "%s"\nexit 0\n' % (tmp_path / "trainer.log"))
    for tool in ("make", "trainer.sh"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def fake_shards(tmp_path):
    """files that match the -i glob: check_inputs only looks for a match"""
    shards = tmp_path / "shards"
    shards.mkdir(exist_ok=True)
    (shards / "d_train_000001.bin").write_bytes(b"\0" * 1024)
    (shards / "d_val_000000.bin").write_bytes(b"\0" * 1024)
    return str(shards / "d_train_*.bin"), str(shards / "d_val_*.bin")


def run(script, args, tmp_path, stubs, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(PATH=f"{stubs}:{os.environ['PATH']}", OUT_DIR=str(tmp_path / "run"))
    env.update({k: str(v) for k, v in env_extra.items() if v is not None})
    for k, v in env_extra.items():
        if v is None:
            env.pop(k, None)
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path), env=env)


def built_or_ran(tmp_path):
    return [name for name in ("make.log", "trainer.log") if (tmp_path / name).exists()]


@pytest.mark.parametrize("script", RUN_SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_scripts_usage_without_data_or_build(script, flag, tmp_path, stubs):
    result = run(script, [flag], tmp_path, stubs)
    assert result.returncode == 0, result.stderr
    assert "error:" not in result.stderr, result.stderr
    out = result.stdout
    assert out.startswith("usage:") and f"scripts/{script}" in out.splitlines()[0], out[:300]
    for variable in ENV_VARS:
        assert variable in out, f"{variable} not in the usage:\n{out}"
    assert "extra arguments" in out.lower(), out
    command = [line for line in out.splitlines() if line.startswith("  ./train_gpt2_fp8 ")]
    assert len(command) == 1, out
    words = shlex.split(command[0])
    assert words[-2:] == (["-p", "fp8"] if script.endswith("_fp8.sh") else ["-z", "0"]), command[0]
    assert "--help" not in words and words.count("-h") == 1, "only the script's -h 1 (HellaSwag): " + command[0]
    assert not (tmp_path / "run").exists()
    assert built_or_ran(tmp_path) == []


@pytest.mark.parametrize("script", ["run_gpt2_124M_bf16.sh", "run_gpt2_124M_fp8.sh"])
def test_help_with_data_and_a_trainer_runs_nothing(script, tmp_path, stubs):
    """with the data there and LLM8_TRAINER set, --help (among other flags) still only prints the usage: the
    trainer's own help was what it printed before, after building"""
    train, val = fake_shards(tmp_path)
    result = run(script, ["-i", train, "-j", val, "-x", 5, "--help"], tmp_path, stubs, LLM8_TRAINER=stubs / "trainer.sh")
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stdout + result.stderr
    assert f"{stubs / 'trainer.sh'} -p bf16" in result.stdout
    assert built_or_ran(tmp_path) == []


@pytest.mark.parametrize("script", ["run_gpt2_124M_bf16.sh", "run_gpt2_774M_fp8.sh"])
def test_dry_run_prints_the_trainer_command_line(script, tmp_path, stubs):
    train, val = fake_shards(tmp_path)
    user = ["-i", train, "-j", val, "-h", "0", "-x", "5", "-l", "a b*"]
    result = run(script, user, tmp_path, stubs, DRY_RUN=1)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"# {script}, DRY_RUN=1") and "make -j2 train_gpt2_fp8" in lines[0], lines
    words = shlex.split(lines[-1])
    assert words[0] == "./train_gpt2_fp8"
    assert words[-len(user):] == user, "the user's flags come last, as given (-h 0 the trainer's)"
    fp8 = script.endswith("_fp8.sh")
    assert words[-len(user) - 2:-len(user)] == (["-p", "fp8"] if fp8 else ["-z", "0"]), words
    assert words[words.index("-o") + 1] == str(tmp_path / "run"), "OUT_DIR is -o"
    assert built_or_ran(tmp_path) == []
    assert not (tmp_path / "run").exists()

    # LLM8_TRAINER: its path, no build to mention; NUM_GPUS > 1: the launcher in front, ZeRO-1
    result = run(script, user, tmp_path, stubs, DRY_RUN=1, LLM8_TRAINER=stubs / "trainer.sh", NUM_GPUS=2)
    assert result.returncode == 0, result.stderr
    assert "make" not in result.stdout.splitlines()[0]
    words = shlex.split(result.stdout.splitlines()[-1])
    assert words[:7] == ["env", "LLM8_LAUNCH_COMMAND=trainer", "bash", "scripts/launch_one_node.sh", "-n", "2", "--"]
    assert words[7] == str(stubs / "trainer.sh") and words[words.index("-z") + 1] == "1"
    assert built_or_ran(tmp_path) == []


@pytest.mark.parametrize("trainer", [None, "stub"])
def test_dry_run_checks_the_data(trainer, tmp_path, stubs):
    """the missing shards stop a dry run with the same one line a real run gives, LLM8_TRAINER or not (a real run
    with one leaves the check to the trainer; a dry run runs none)"""
    result = run("run_gpt2_350M_fp8.sh", ["-i", tmp_path / "none_*.bin"], tmp_path, stubs, DRY_RUN=1,
                 LLM8_TRAINER=stubs / "trainer.sh" if trainer else None)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert errors[0].startswith("error: run_gpt2_350M_fp8.sh: no train shards match -i"), errors[0]
    assert result.stdout == "" and built_or_ran(tmp_path) == []


@pytest.mark.parametrize("script", FP8_SCRIPTS)
def test_an_fp8_scripts_errors_name_it(script, tmp_path, stubs):
    """the FP8 scripts exec the bf16 ones: the messages still name the script the user ran, and the data hint is the
    bf16 script's (the same data)"""
    result = run(script, [], tmp_path, stubs, LLM8_TRAINER=None)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert errors[0].startswith(f"error: {script}: no train shards match -i"), errors[0]
    assert "make them first: python3 dev/data/fineweb.py" in errors[0], errors[0]
    assert "bf16" not in result.stderr


@pytest.fixture
def cpu_trainer():
    if not os.path.exists(CPU):
        pytest.fail(f"{CPU} is not built (make train_gpt2cpu)")
    return CPU


def test_a_failure_at_startup_leaves_no_empty_out_dir(tmp_path, stubs, cpu_trainer):
    """train_gpt2cpu claims -o (mkdir -p, .llm8.lock) and then finds no shards: the run fails before its first step.
    The dir it created, and the parents created for it, go; one that existed before stays, empty or not"""
    args = ["-e", "tiny", "-i", tmp_path / "none_*.bin", "-h", "0"]
    fresh = tmp_path / "new" / "deeper" / "run"
    result = run("run_gpt2_124M_fp8.sh", args, tmp_path, stubs, LLM8_TRAINER=cpu_trainer, OUT_DIR=fresh)
    assert result.returncode == 1, result.stderr
    assert "before its first step, not retried" in result.stderr
    assert not (tmp_path / "new").exists(), os.listdir(tmp_path / "new")
    assert "run_gpt2_124M_fp8.sh: removed -o" in result.stderr

    # the user's -o, relative to the checkout's root, wins over OUT_DIR and is the one cleaned up
    rel = os.path.relpath(tmp_path / "user_o", ROOT)
    result = run("run_gpt2_124M_bf16.sh", args + ["-o", rel], tmp_path, stubs, LLM8_TRAINER=cpu_trainer)
    assert result.returncode == 1 and not (tmp_path / "user_o").exists() and not (tmp_path / "run").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("run_gpt2_124M_bf16.sh", args, tmp_path, stubs, LLM8_TRAINER=cpu_trainer, OUT_DIR=empty)
    assert result.returncode == 1 and empty.is_dir(), "an empty dir that was there before stays"

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    result = run("run_gpt2_124M_bf16.sh", args, tmp_path, stubs, LLM8_TRAINER=cpu_trainer, OUT_DIR=kept)
    assert result.returncode == 1 and (kept / "notes.txt").read_text() == "mine\n"


def test_a_failed_run_that_wrote_into_its_new_dir_keeps_it(tmp_path, stubs):
    """a trainer that wrote anything besides its lock (a log, a checkpoint) before failing: the dir stays"""
    trainer = stubs / "writes_then_fails.sh"
    trainer.write_text('#!/bin/bash\nwhile [ "$1" != -o ]; do shift; done\nmkdir -p "$2"\n: > "$2/.llm8.lock"\n'
                       'echo "partial" > "$2/model_00000000.bin"\nexit 1\n')
    trainer.chmod(0o755)
    result = run("run_gpt2_124M_bf16.sh", [], tmp_path, stubs, LLM8_TRAINER=trainer)
    assert result.returncode == 1, result.stderr
    assert (tmp_path / "run" / "model_00000000.bin").exists() and (tmp_path / "run" / ".llm8.lock").exists()
