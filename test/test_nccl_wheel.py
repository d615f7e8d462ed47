"""
NCCL for the device machine (dev/nccl_wheel.sh, dev/nccl_sm90.py), offline:
- dev/nccl_sm90.py, on a stand-in library that nvcc builds like NCCL's (relocatable device code
  for sm_80 and sm_90 with PTX for compute_90 and compute_100, so both __nv_relfatbin and
  .nv_fatbin, one file for sm_80 alone, host debug information): every fatbin keeps exactly the
  images an sm_90 device loads (or stays whole where it has none), as cuobjdump reads each one,
  the sm_90 cubins byte for byte; every byte outside the fatbins and the debug sections is kept;
  the wheel pip-installs with a RECORD true to its files; a malformed fatbin, or a library with
  no sm_90 cubin, stops it with one line and writes no wheel;
- dev/nccl_wheel.sh install puts the cut wheel into the environment;
- dev/nccl_wheel.sh join: the pieces of a wheel cut as `split` cuts them join back to the wheel
  its SHA256 names and pip installs it (a tiny stand-in nvidia-nccl-cu13 wheel, into a scratch
  directory); a missing piece stops it with one line naming the sha256 mismatch, and nothing is
  installed.
"""
import base64
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest

from test_kernel_resources import find_cuobjdump

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "nvidia_nccl_cu13-9.9.9-py3-none-any.whl"
LIBRARY = "nvidia/nccl/lib/libnccl.so.2"
DEVICE_LTO = "nvidia/nccl/lib/libnccl_device.ltoir"
FATBIN_MAGIC = 0xBA55ED50


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(path, library=None):
    files = {
        LIBRARY: library if library is not None else os.urandom(300_000),  # incompressible: several pieces
        DEVICE_LTO: b"stands for NCCL's device API",
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
    """a directory laid out like the repo's root: dev/nccl_wheel.sh, .nccl/ with the pieces and SHA256"""
    os.makedirs(tmp_path / "dev")
    shutil.copy(os.path.join(ROOT, "dev", "nccl_wheel.sh"), tmp_path / "dev")
    pieces = tmp_path / ".nccl"
    os.makedirs(pieces / "whole")
    wheel = pieces / "whole" / NAME
    write_wheel(wheel)
    subprocess.run(["split", "-b", "100K", "-d", "-a", "2", str(wheel), str(pieces / "part_")], check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (pieces / "SHA256").write_text(f"{digest}  {NAME}\n")
    shutil.rmtree(pieces / "whole")  # on the device only the pieces arrive
    return tmp_path


def run_wheel_script(checkout, tmp_path, stage):
    """runs dev/nccl_wheel.sh STAGE with this Python, installing into a fresh directory
    (PIP_TARGET) that stands for the device's torch venv; returns the result and that directory"""
    site = tmp_path / "site"
    env = dict(os.environ, PYTHON=sys.executable, PIP_TARGET=str(site), PYTHONPATH=str(site))
    result = subprocess.run(["bash", str(checkout / "dev" / "nccl_wheel.sh"), stage], capture_output=True, text=True,
                            env=env, timeout=120)
    return result, str(site)


def join(checkout, tmp_path):
    return run_wheel_script(checkout, tmp_path, "join")


def test_join_installs_the_wheel(checkout, tmp_path):
    assert len(list((checkout / ".nccl").glob("part_*"))) >= 3
    result, site = join(checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "installed nvidia-nccl-cu13 9.9.9" in result.stdout
    assert os.path.exists(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2"))


def test_split_leaves_the_cut_wheel_in_place(tmp_path):
    """split after sm90 (or the reverse) replaces only its own form in .nccl/: the cut wheel a ranks call carries
    stays (fetching the wheel removed all of .nccl/, so the two deleted each other); pip's download is a stand-in"""
    root = tmp_path / "repo"
    os.makedirs(root / "dev")
    shutil.copy(os.path.join(ROOT, "dev", "nccl_wheel.sh"), root / "dev")
    (root / ".gitignore").write_text("/.nccl/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    os.makedirs(root / ".nccl" / "sm90")
    (root / ".nccl" / "sm90" / NAME).write_bytes(b"the cut wheel")
    wheel = tmp_path / NAME
    write_wheel(wheel)
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nif [ "$1 $2 $3" = "-m pip download" ]; then\n'
                      f'  while [ "$1" != "-d" ]; do shift; done\n  cp {wheel} "$2/"\n  exit 0\nfi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = subprocess.run(["bash", str(root / "dev" / "nccl_wheel.sh"), "split"], capture_output=True, text=True,
                            env=dict(os.environ, PYTHON=str(python), PIECE_MIB="1"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert (root / ".nccl" / "sm90" / NAME).read_bytes() == b"the cut wheel"
    assert sorted(p.name for p in (root / ".nccl").iterdir() if p.name.startswith("part_")) == ["part_00"]
    assert (root / ".nccl" / "SHA256").read_text().endswith(f"  {NAME}\n")


def test_a_missing_piece_stops_join(checkout, tmp_path):
    os.remove(checkout / ".nccl" / "part_01")
    result, site = join(checkout, tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dev/nccl_wheel.sh: the pieces in .nccl/"), result.stderr
    assert "a piece is missing" in lines[0] and NAME in lines[0]
    assert not os.path.exists(os.path.join(site, "nvidia"))


# ----------------------------------------------------------------------------
# dev/nccl_sm90.py

# a kernel calling a device function of another file (relocatable device code, as NCCL is built)
STAND_IN_SOURCES = {
    "launch.cu": "__device__ float offset_of(int i);\n"
                 "__global__ void add_offsets(float* x) { x[threadIdx.x] += offset_of(threadIdx.x); }\n"
                 "extern \"C\" void launch_add_offsets(float* x) { add_offsets<<<1, 32>>>(x); }\n",
    "offsets.cu": "__device__ float offset_of(int i) { return 0.5f * i; }\n",
    "sm80_only.cu": "__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n"
                    "extern \"C\" void launch_twice(float* x) { twice<<<1, 32>>>(x); }\n",
}
TARGETS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_90,code=compute_90", "-gencode", "arch=compute_100,code=compute_100"]


def find_nvcc():
    for candidate in [shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no nvcc on PATH or in CUDA_HOME/bin (/usr/local/cuda/bin)")


@pytest.fixture(scope="module")
def stand_in_library(tmp_path_factory):
    """the bytes of a shared library with NCCL's kinds of device code, built by nvcc"""
    build = tmp_path_factory.mktemp("stand_in")
    nvcc = find_nvcc()
    for name, text in STAND_IN_SOURCES.items():
        (build / name).write_text(text)
    compile_flags = ["-g", "-Xcompiler", "-fPIC"]
    steps = [[nvcc, *compile_flags, "-rdc=true", *TARGETS, "-c", "launch.cu", "-o", "launch.o"],
             [nvcc, *compile_flags, "-rdc=true", *TARGETS, "-c", "offsets.cu", "-o", "offsets.o"],
             [nvcc, *compile_flags, "-gencode", "arch=compute_80,code=sm_80", "-c", "sm80_only.cu", "-o", "sm80_only.o"],
             [nvcc, "-shared", *TARGETS, "launch.o", "offsets.o", "sm80_only.o", "-o", "libstand_in.so"]]
    for step in steps:
        result = subprocess.run(step, cwd=build, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, "%s\n%s" % (" ".join(step), result.stderr)
    return (build / "libstand_in.so").read_bytes()


def sections(image, scratch):
    """{name: (offset, size, allocated)} of an ELF image, as readelf reads it"""
    path = scratch / "image.so"
    path.write_bytes(image)
    result = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = {}
    for line in result.stdout.splitlines():
        # [Nr] Name Type Address Off Size ES Flg Lk Inf Al (Flg empty in sections not loaded)
        fields = line.replace("[ ", "[").split()
        if len(fields) >= 10 and fields[0].startswith("[") and fields[0][1:-1].isdigit():
            found[fields[1]] = (int(fields[4], 16), int(fields[5], 16), len(fields) == 11 and "A" in fields[7])
    return found


def fatbins(image, section, scratch):
    """[(offset, bytes)] of each fatbin in the section: a header magic at an 8-byte boundary, the
    fatbin's size from its header"""
    offset, size, _ = sections(image, scratch)[section]
    found, at = [], offset
    while at < offset + size:
        magic, _version, header_size, entries_size = struct.unpack_from("<IHHQ", image, at)
        if magic == FATBIN_MAGIC:
            found.append((at, image[at:at + header_size + entries_size]))
            at = (at + header_size + entries_size + 7) // 8 * 8
        else:
            at += 8
    return found


def images_in(fatbin, scratch):
    """{"sm_90 cubin": bytes, "sm_90 ptx": None, ...}: cuobjdump's reading of one fatbin, each cubin's bytes"""
    scratch.mkdir(exist_ok=True)
    path = scratch / "one.fatbin"
    path.write_bytes(fatbin)
    cuobjdump = find_cuobjdump()
    listing = subprocess.run([cuobjdump, "-lelf", "-lptx", str(path)], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    found = {}
    for line in listing.stdout.splitlines():
        name = line.split(":")[-1].strip()  # one.N.sm_90.cubin or one.N.sm_100.ptx
        arch, kind = name.split(".")[-2:]
        found["%s %s" % (arch, kind)] = None
    extract = subprocess.run([cuobjdump, "-xelf", "all", str(path)], cwd=scratch, capture_output=True, text=True, timeout=60)
    assert extract.returncode == 0, extract.stderr
    for cubin in scratch.glob("one.*.cubin"):
        found["%s cubin" % cubin.name.split(".")[-2]] = cubin.read_bytes()
        cubin.unlink()
    return found


def sm90_loads(image_name):
    arch, kind = image_name.split()
    number = int(arch.split("_")[1])
    return number == 90 if kind == "cubin" else number <= 90


def cut(tmp_path, library, *args):
    """runs dev/nccl_sm90.py on a stand-in wheel of the library; returns the result and the wheel it wrote"""
    source = tmp_path / "in" / NAME
    source.parent.mkdir()
    write_wheel(source, library)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "nccl_sm90.py"), str(source), str(tmp_path / "out"), *args],
                            capture_output=True, text=True, timeout=120)
    return result, tmp_path / "out" / NAME


def cut_library(tmp_path, library):
    result, wheel = cut(tmp_path, library)
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(wheel) as z:
        return z.read(LIBRARY)


def test_every_fatbin_keeps_what_sm90_loads(stand_in_library, tmp_path):
    library = cut_library(tmp_path, stand_in_library)
    removed = 0
    for section in ["__nv_relfatbin", ".nv_fatbin"]:
        before, after = fatbins(stand_in_library, section, tmp_path), fatbins(library, section, tmp_path)
        assert [offset for offset, _ in after] == [offset for offset, _ in before], section
        for (offset, old), (_, new) in zip(before, after):
            old_images, new_images = images_in(old, tmp_path / "old"), images_in(new, tmp_path / "new")
            loadable = {name: data for name, data in old_images.items() if sm90_loads(name)}
            assert new_images == (loadable or old_images), "%s fatbin at %#x" % (section, offset)
            removed += len(old_images) - len(new_images)
            if loadable:
                assert len(new) < len(old)
    # what went: in __nv_relfatbin each of the two files' sm_80 cubin and compute_100 PTX, in
    # .nv_fatbin the linked sm_80 cubin (sm80_only.cu's fatbin, with nothing sm_90 loads, stays whole)
    assert removed == 5


def test_every_other_byte_is_kept(stand_in_library, tmp_path):
    library = cut_library(tmp_path, stand_in_library)
    assert len(library) == len(stand_in_library)
    table = sections(stand_in_library, tmp_path)
    changeable = [(offset, offset + size) for name, (offset, size, alloc) in table.items()
                  if name in ("__nv_relfatbin", ".nv_fatbin") or (name.startswith(".debug_") and not alloc)]
    debug = [name for name in table if name.startswith(".debug_")]
    assert debug, "the stand-in has no debug sections: nothing tests that they are zeroed"
    for name in debug:
        offset, size, _ = table[name]
        assert library[offset:offset + size] == bytes(size), name
    at = 0
    for start, end in sorted(changeable):
        assert library[at:start] == stand_in_library[at:start], "bytes %#x to %#x changed" % (at, start)
        at = max(at, end)
    assert library[at:] == stand_in_library[at:]


def test_the_cut_wheel_installs_with_a_true_record(stand_in_library, tmp_path):
    result, wheel = cut(tmp_path, stand_in_library)
    assert result.returncode == 0, result.stderr
    assert "sm_90" in result.stdout and "compute_100" not in result.stdout
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        cut_library_bytes = z.read(LIBRARY)
        record = z.read("nvidia_nccl_cu13-9.9.9.dist-info/RECORD").decode().splitlines()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            if path.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            assert line == record_line(path, z.read(path))
    assert DEVICE_LTO not in names and len(record) == len(names)
    # dev/nccl_wheel.sh install, from a checkout holding the cut wheel in .nccl/sm90/
    checkout = tmp_path / "checkout"
    os.makedirs(checkout / "dev")
    shutil.copy(os.path.join(ROOT, "dev", "nccl_wheel.sh"), checkout / "dev")
    os.makedirs(checkout / ".nccl" / "sm90")
    shutil.copy(wheel, checkout / ".nccl" / "sm90")
    result, site = run_wheel_script(checkout, tmp_path, "install")
    assert result.returncode == 0, result.stderr
    assert "installed nvidia-nccl-cu13 9.9.9" in result.stdout
    with open(os.path.join(site, LIBRARY), "rb") as f:
        assert f.read() == cut_library_bytes


def test_install_without_the_cut_wheel_stops(tmp_path):
    checkout = tmp_path / "checkout"
    os.makedirs(checkout / "dev")
    shutil.copy(os.path.join(ROOT, "dev", "nccl_wheel.sh"), checkout / "dev")
    result, site = run_wheel_script(checkout, tmp_path, "install")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: dev/nccl_wheel.sh: no wheel in .nccl/sm90/: make it here with 'bash dev/nccl_wheel.sh sm90' and carry .nccl/sm90"]
    assert not os.path.exists(os.path.join(site, "nvidia"))


def test_a_malformed_fatbin_stops_the_cut(stand_in_library, tmp_path):
    offset, fatbin = fatbins(stand_in_library, ".nv_fatbin", tmp_path)[0]
    header_size = struct.unpack_from("<H", fatbin, 6)[0]
    broken = bytearray(stand_in_library)
    struct.pack_into("<Q", broken, offset + header_size + 8, 1 << 40)  # the first entry's payload size
    result, wheel = cut(tmp_path, bytes(broken))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dev/nccl_sm90.py: ") and NAME in lines[0], result.stderr
    assert "malformed fatbin entry at offset %#x" % (offset + header_size) in lines[0]
    assert not wheel.exists()


def test_a_library_without_the_target_cubin_stops_the_cut(stand_in_library, tmp_path):
    result, wheel = cut(tmp_path, stand_in_library, "--arch", "75")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["error: dev/nccl_sm90.py: %s: no sm_75 cubin in it" % (tmp_path / "in" / NAME)]
    assert not wheel.exists()


# ----------------------------------------------------------------------------
# dev/gpu_session.sh ranks: the call that uses the carried wheel

def ranks_stage(tmp_path, with_wheel, ranks_status=0, multi_gpu_status=0, gpu=True):
    """runs dev/gpu_session.sh ranks in a checkout whose make, nvidia-smi (a GPU, or none) and test/run_gpu_tests.sh
    are stubs that log their calls (with .nccl/sm90 holding a stand-in wheel or not); returns the result, the calls
    in order and the directory standing for the venv"""
    checkout = tmp_path / "checkout"
    for name in ("dev/gpu_session.sh", "dev/nccl_wheel.sh"):
        os.makedirs(checkout / os.path.dirname(name), exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), checkout / name)
    calls = tmp_path / "calls"
    os.makedirs(checkout / "test")
    (checkout / "test" / "run_gpu_tests.sh").write_text(
        f'echo "run_gpu_tests $*" >> {calls}\ncase "$1" in --ranks) exit {ranks_status};; esac\nexit {multi_gpu_status}\n')
    stubs = tmp_path / "stubs"
    os.makedirs(stubs)
    (stubs / "make").write_text(f'#!/bin/sh\necho "make $*" >> {calls}\n')
    (stubs / "nvidia-smi").write_text("#!/bin/sh\n" + ('echo "GPU 0: NVIDIA H200"' if gpu else "exit 9") + "\n")
    for stub in ("make", "nvidia-smi"):
        (stubs / stub).chmod(0o755)
    if with_wheel:
        os.makedirs(checkout / ".nccl" / "sm90")
        write_wheel(checkout / ".nccl" / "sm90" / NAME, b"the cut library")
    site = tmp_path / "site"
    env = dict(os.environ, PYTHON=sys.executable, PIP_TARGET=str(site), PYTHONPATH=str(site), OUT=str(tmp_path / "out"),
               PATH=f"{stubs}:{os.environ['PATH']}")
    result = subprocess.run(["bash", str(checkout / "dev" / "gpu_session.sh"), "ranks", "twins"], capture_output=True,
                            text=True, env=env, timeout=120)
    return result, calls.read_text().splitlines() if calls.exists() else [], site


def runs_both_tests(calls):
    """the build, then test_multi_gpu, then the ranks tests of the sections named"""
    return (any(c.startswith("make -k") for c in calls[:-2]) and calls[-2] == "run_gpu_tests build/test_multi_gpu"
            and calls[-1] == "run_gpu_tests --ranks twins")


def test_the_ranks_stage_installs_the_carried_wheel_then_runs_both_tests(tmp_path):
    result, calls, site = ranks_stage(tmp_path, with_wheel=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installed nvidia-nccl-cu13 9.9.9" in (tmp_path / "out" / "nccl_install.log").read_text()
    with open(os.path.join(site, LIBRARY), "rb") as f:
        assert f.read() == b"the cut library"
    assert runs_both_tests(calls), calls


def test_the_ranks_stage_installs_nothing_on_a_machine_without_a_gpu(tmp_path):
    """the carried wheel goes into the device's venv only: on a machine without a GPU (this one, a dry run) it
    would go into that machine's own Python, under every build there after"""
    result, calls, site = ranks_stage(tmp_path, with_wheel=True, gpu=False)
    assert not (tmp_path / "out" / "nccl_install.log").exists() and not os.path.exists(site)
    assert any(c.startswith("make -k") for c in calls), calls


def test_the_ranks_stage_without_a_carried_wheel_installs_nothing(tmp_path):
    result, calls, site = ranks_stage(tmp_path, with_wheel=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "out" / "nccl_install.log").exists() and not os.path.exists(site)
    assert runs_both_tests(calls), calls


def test_the_ranks_stage_fails_when_either_test_fails(tmp_path):
    result, calls, _ = ranks_stage(tmp_path / "multi", with_wheel=False, multi_gpu_status=1)
    assert result.returncode != 0 and runs_both_tests(calls), calls  # the ranks tests still run
    result, _, _ = ranks_stage(tmp_path / "ranks", with_wheel=False, ranks_status=2)
    assert result.returncode != 0


def test_a_truncated_library_stops_the_cut(stand_in_library, tmp_path):
    result, wheel = cut(tmp_path, stand_in_library[:len(stand_in_library) // 2])  # the section table is at the end
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: dev/nccl_sm90.py: {tmp_path / 'in' / NAME}: a truncated or malformed ELF file")
    assert not wheel.exists()
