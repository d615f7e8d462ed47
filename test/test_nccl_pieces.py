"""
dev/nccl_pieces.sh join, offline: the pieces of a wheel cut as `split` cuts them join back to
the wheel its SHA256 names and pip installs it (here a tiny stand-in nvidia-nccl-cu13 wheel,
into a scratch directory); a missing piece stops it with one line naming the sha256 mismatch, and
nothing is installed.
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "nvidia_nccl_cu13-9.9.9-py3-none-any.whl"


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(path):
    files = {
        "nvidia/nccl/lib/libnccl.so.2": os.urandom(300_000),  # incompressible: several pieces
        "nvidia_nccl_cu13-9.9.9.dist-info/METADATA": b"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 9.9.9\n",
        "nvidia_nccl_cu13-9.9.9.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join(record_line(p, d) for p, d in files.items()) + "\nnvidia_nccl_cu13-9.9.9.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr("nvidia_nccl_cu13-9.9.9.dist-info/RECORD", record)


@pytest.fixture()
def checkout(tmp_path):
    """a directory laid out like the repo's root: dev/nccl_pieces.sh, .nccl/ with the pieces and SHA256"""
    os.makedirs(tmp_path / "dev")
    shutil.copy(os.path.join(ROOT, "dev", "nccl_pieces.sh"), tmp_path / "dev")
    pieces = tmp_path / ".nccl"
    os.makedirs(pieces / "whole")
    wheel = pieces / "whole" / NAME
    write_wheel(wheel)
    subprocess.run(["split", "-b", "100K", "-d", "-a", "2", str(wheel), str(pieces / "part_")], check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (pieces / "SHA256").write_text(f"{digest}  {NAME}\n")
    shutil.rmtree(pieces / "whole")  # on the device only the pieces arrive
    return tmp_path


def join(checkout, tmp_path):
    """runs join with this Python, installing into a fresh directory (PIP_TARGET) that stands for
    the device's torch venv; returns the result and that directory"""
    site = tmp_path / "site"
    env = dict(os.environ, PYTHON=sys.executable, PIP_TARGET=str(site), PYTHONPATH=str(site))
    result = subprocess.run(["bash", str(checkout / "dev" / "nccl_pieces.sh"), "join"], capture_output=True, text=True,
                            env=env, timeout=120)
    return result, str(site)


def test_join_installs_the_wheel(checkout, tmp_path):
    assert len(list((checkout / ".nccl").glob("part_*"))) >= 3
    result, site = join(checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "installed nvidia-nccl-cu13 9.9.9" in result.stdout
    assert os.path.exists(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2"))


def test_a_missing_piece_stops_join(checkout, tmp_path):
    os.remove(checkout / ".nccl" / "part_01")
    result, site = join(checkout, tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dev/nccl_pieces.sh: the pieces in .nccl/"), result.stderr
    assert "a piece is missing" in lines[0] and NAME in lines[0]
    assert not os.path.exists(os.path.join(site, "nvidia"))
