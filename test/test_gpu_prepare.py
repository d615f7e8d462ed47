"""
dev/gpu_prepare.sh (here, before a GPU session's first device call) in a stand-in checkout: pip,
dev/nccl_wheel.sh, scripts/setup_python.sh and dev/data/prepare_default.sh are stubs that log their
calls and write what the real ones would, so the test checks what is made when, what is left alone, and each device
call's carry size against the tool's 64 MiB.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL = "nvidia_cudnn_frontend-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl"
MIB = 1 << 20


def checkout_with_stubs(tmp_path, corpus_mib=1, pip_fails=False, ignore_whl=True, frontend_installed=True):
    """a git checkout holding dev/gpu_prepare.sh and stub helpers (the frontend installed here: version 9.9.9); returns
    (checkout, calls log, env)"""
    checkout = tmp_path / "checkout"
    calls = tmp_path / "calls"
    os.makedirs(checkout / "dev" / "data")
    os.makedirs(checkout / "scripts")
    shutil.copy(os.path.join(ROOT, "dev", "gpu_prepare.sh"), checkout / "dev" / "gpu_prepare.sh")
    (checkout / ".gitignore").write_text(("/.whl/\n" if ignore_whl else "") + "/.nccl/\n/dev/data/offline/\n")
    (checkout / "dev" / "nccl_wheel.sh").write_text(
        f'echo "nccl_wheel $*" >> {calls}\nmkdir -p .nccl/sm90\n'
        f'truncate -s {35 * MIB} .nccl/sm90/nvidia_nccl_cu13-2.32.3-py3-none-manylinux_2_27_x86_64.whl\n')
    (checkout / "dev" / "data" / "prepare_default.sh").write_text(
        f'echo "prepare_default $*" >> {calls}\nmkdir -p dev/data/offline\n'
        f'[ -f dev/data/offline/offline_train_000001.bin ] || truncate -s {corpus_mib * MIB} dev/data/offline/offline_train_000001.bin\n')
    # the corpus's BPE rank file (git-ignored): setup_python.sh fetches it
    (checkout / "scripts" / "setup_python.sh").write_text(
        f'echo "setup_python $*" >> {calls}\nmkdir -p dev/data/cache && echo ranks > dev/data/cache/gpt2.tiktoken\n')
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    subprocess.run(["git", "add", "."], cwd=checkout, check=True)
    # pip download writes a stand-in wheel (or fails); every other use is the real Python
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nif [ "$1 $2 $3" = "-m pip show" ]; then\n'
                      + ('  echo "Name: nvidia-cudnn-frontend"; echo "Version: 9.9.9"; exit 0\n' if frontend_installed
                         else '  exit 1\n')
                      + f'fi\nif [ "$1 $2 $3" = "-m pip download" ]; then\n'
                      f'  echo "pip $*" >> {calls}\n'
                      + ('  exit 1\n' if pip_fails else
                         '  while [ "$1" != "-d" ]; do shift; done\n'
                         f'  mkdir -p "$2" && truncate -s {11 * MIB} "$2/{WHEEL}"\n  exit 0\n')
                      + f'fi\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return checkout, calls, dict(os.environ, PYTHON=str(python))


def prepare(checkout, env, *parts):
    return subprocess.run(["bash", str(checkout / "dev" / "gpu_prepare.sh")] + list(parts), capture_output=True,
                          text=True, cwd=checkout, env=env, timeout=60)


def carry_lines(stdout):
    return [line for line in stdout.splitlines() if ": carry [" in line]


def test_a_bare_checkout_gets_all_three_and_a_second_run_fetches_nothing(tmp_path):
    checkout, calls, env = checkout_with_stubs(tmp_path)
    result = prepare(checkout, env)
    assert result.returncode == 0, result.stdout + result.stderr
    made = calls.read_text().splitlines()
    assert len(made) == 4 and made[0].startswith("pip -m pip download") and "--python-version 3.12" in made[0]
    # the frontend of the version installed here (what CI compiles cudnn_att.cpp against); the BPE rank file first
    assert made[0].endswith("nvidia-cudnn-frontend==9.9.9") and made[1:] == ["nccl_wheel sm90", "setup_python ", "prepare_default "]
    assert (checkout / ".whl" / WHEEL).exists()
    lines = carry_lines(result.stdout)
    assert [line.split(": carry ")[0] for line in lines] == ["first, rerun, build, tests, bench, profile, sanitize", "ranks", "parity"]
    assert lines[0].split(": carry ")[1].startswith('[".whl"]: 11.0 MiB with the tree, fits'), lines
    assert lines[1].split(": carry ")[1].startswith('[".whl", ".nccl/sm90"]: 46.0 MiB with the tree, fits'), lines
    assert lines[2].split(": carry ")[1].startswith('[".whl", "dev/data/offline"]: 12.0 MiB with the tree, fits'), lines
    # the prepare script is idempotent itself; the wheels are not fetched again
    again = prepare(checkout, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert calls.read_text().splitlines()[4:] == ["prepare_default "]
    assert f"whl: .whl/{WHEEL} is there" in again.stdout and carry_lines(again.stdout) == lines


def test_a_carry_over_the_device_tools_limit_fails_naming_the_call(tmp_path):
    checkout, _, env = checkout_with_stubs(tmp_path, corpus_mib=60)
    result = prepare(checkout, env)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = carry_lines(result.stdout)
    assert re.fullmatch(r'parity: carry \[".whl", "dev/data/offline"\]: 71\.\d MiB with the tree, '
                        r"OVER the device tool's 64 MiB", lines[2]), lines
    assert lines[0].endswith("fits") and lines[1].endswith("fits")


def test_the_parts_named_only_and_the_rest_reported_missing_without_failing(tmp_path):
    checkout, calls, env = checkout_with_stubs(tmp_path)
    result = prepare(checkout, env, "whl")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(calls.read_text().splitlines()) == 1
    lines = carry_lines(result.stdout)
    assert lines[0].endswith("fits")
    assert lines[1] == 'ranks: carry [".whl", ".nccl/sm90"]: .nccl/sm90 missing (bash dev/gpu_prepare.sh nccl makes it)'
    assert lines[2] == ('parity: carry [".whl", "dev/data/offline"]: dev/data/offline missing '
                        '(bash dev/gpu_prepare.sh data makes it)')


def test_bad_parts_a_failed_download_and_an_unignored_wheel_folder_fail_it_in_a_line_each(tmp_path):
    """an unknown part stops it before anything is made; a part that fails says why in one line, the others are still
    made (each serves other calls) and the carry report printed, and a last line names the part: exit 1"""
    checkout, calls, env = checkout_with_stubs(tmp_path / "a")
    result = prepare(checkout, env, "whl", "cudnn")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: dev/gpu_prepare.sh: unknown part 'cudnn' (expected some of: whl nccl data)"]
    assert not calls.exists()

    checkout, calls, env = checkout_with_stubs(tmp_path / "b", pip_fails=True)
    result = prepare(checkout, env)
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: dev/gpu_prepare.sh: could not download nvidia-cudnn-frontend 9.9.9 into .whl/",
        "error: dev/gpu_prepare.sh: whl failed (above); the other parts were made"]
    assert calls.read_text().splitlines()[1:] == ["nccl_wheel sm90", "setup_python ", "prepare_default "]
    assert (checkout / ".nccl" / "sm90").is_dir() and (checkout / "dev" / "data" / "offline").is_dir()
    assert [line.split(": carry ")[1].split(":")[1].strip() for line in carry_lines(result.stdout)] == [
        ".whl missing (bash dev/gpu_prepare.sh whl makes it)"] * 3, result.stdout

    checkout, calls, env = checkout_with_stubs(tmp_path / "d", frontend_installed=False)
    result = prepare(checkout, env, "whl")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: dev/gpu_prepare.sh: nvidia-cudnn-frontend is not installed here (bash scripts/setup_python.sh): its version is the one to carry",
        "error: dev/gpu_prepare.sh: whl failed (above); the other parts were made"]
    assert not calls.exists()

    checkout, calls, env = checkout_with_stubs(tmp_path / "c", ignore_whl=False)
    result = prepare(checkout, env)
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: dev/gpu_prepare.sh: .whl/ is not ignored by git (.gitignore): it would travel with every call",
        "error: dev/gpu_prepare.sh: whl failed (above); the other parts were made"]
    assert calls.read_text().splitlines() == ["nccl_wheel sm90", "setup_python ", "prepare_default "]


def test_a_failed_nccl_fetch_leaves_the_corpus_made(tmp_path):
    """the NCCL download (291 MiB) failing first stopped the script before the offline corpus: the parity call then
    failed at once on the device"""
    checkout, calls, env = checkout_with_stubs(tmp_path)
    (checkout / "dev" / "nccl_wheel.sh").write_text(f'echo "nccl_wheel $*" >> {calls}\necho "download failed" >&2\nexit 3\n')
    result = prepare(checkout, env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == "error: dev/gpu_prepare.sh: nccl failed (above); the other parts were made"
    assert (checkout / "dev" / "data" / "offline").is_dir() and (checkout / ".whl" / WHEEL).exists()
    lines = carry_lines(result.stdout)
    assert lines[1].endswith(".nccl/sm90 missing (bash dev/gpu_prepare.sh nccl makes it)") and lines[2].endswith("fits")
