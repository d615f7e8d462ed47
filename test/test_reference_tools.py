"""
dev/reference/ on a machine without PyTorch, as make test runs (it checks the committed fixture, and needs no
PyTorch): gpt2_torch.py's --help works, and a run says in one line what to install, not a traceback; the
README's "Regenerating" steps, pasted whole, stop there and leave test/fixtures/ as committed.

PyTorch is hidden with a torch module on PYTHONPATH that raises ImportError, so these hold on a machine that has
it too.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "dev", "reference", "gpt2_torch.py")
FIXTURES = ("gpt2_tiny_model.bin", "gpt2_tiny_debug_state.bin")


@pytest.fixture
def no_torch_env(tmp_path):
    hide = tmp_path / "hide_torch"
    hide.mkdir()
    (hide / "torch.py").write_text('raise ImportError("No module named \'torch\' (hidden by the test)")\n')
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def run_script(args, env, cwd=ROOT):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=cwd)


def assert_one_error_line(result, *needles):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_gpt2_torch_help_needs_no_torch(flag, no_torch_env):
    result = run_script([flag], no_torch_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:") and "--model" in result.stdout and "--out" in result.stdout
    assert result.stderr == ""


def test_gpt2_torch_without_torch_says_what_to_install(no_torch_env, tmp_path):
    out = tmp_path / "state.bin"
    result = run_script(["--model", os.path.join(ROOT, "test", "fixtures", FIXTURES[0]), "--out", out], no_torch_env)
    assert_one_error_line(result, "PyTorch", "pip install torch numpy", "make test")
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [([], "--model"), (["--model", "m", "--out", "o", "--batch", "x"], "--batch")])
def test_gpt2_torch_bad_flags_say_so_in_one_line(args, needle, no_torch_env):
    assert_one_error_line(run_script(args, no_torch_env), needle)


def regenerating_block():
    text = open(os.path.join(ROOT, "dev", "reference", "README.md")).read()
    section = text.split("## Regenerating", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "no code block under dev/reference/README.md's ## Regenerating"
    return block.group(1)


def test_readme_regenerating_without_torch_leaves_the_fixture_alone(no_torch_env, tmp_path):
    """the README's steps, pasted whole into a shell in a checkout without PyTorch: they fail, with gpt2_torch.py's
    one line, and test/fixtures/ is byte for byte the committed one (once, the model was written over before
    gpt2_torch.py failed, and make test's test_reference_fixture failed until a git checkout). The checkout is
    links to this one, but for test/fixtures/ (a copy) and build/ (empty), which the steps write."""
    tree = tmp_path / "checkout"
    tree.mkdir()
    for name in os.listdir(ROOT):
        if name not in ("test", "build", ".git"):
            os.symlink(os.path.join(ROOT, name), tree / name)
    (tree / "test").mkdir()
    for name in os.listdir(os.path.join(ROOT, "test")):
        if name not in ("fixtures", "__pycache__"):
            os.symlink(os.path.join(ROOT, "test", name), tree / "test" / name)
    shutil.copytree(os.path.join(ROOT, "test", "fixtures"), tree / "test" / "fixtures")
    committed = {name: open(os.path.join(ROOT, "test", "fixtures", name), "rb").read() for name in FIXTURES}

    env = dict(no_torch_env, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    result = subprocess.run(["bash", "-c", regenerating_block()], capture_output=True, text=True, timeout=300,
                            cwd=tree, env=env)
    assert result.returncode != 0, "the steps must fail without PyTorch\n" + result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "pip install torch numpy" in errors[-1], result.stderr
    for name in FIXTURES:
        assert (tree / "test" / "fixtures" / name).read_bytes() == committed[name], f"test/fixtures/{name} was changed"
