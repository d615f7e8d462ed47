"""
What the compiler made of the CUDA kernels, read from the sm_90a machine code without a GPU
(cuobjdump -res-usage; the toolkit image has no cuobjdump, so scripts/setup_python.sh installs
NVIDIA's nvidia-cuda-cuobjdump wheel):
- no kernel of the trainer or of bench_gemm keeps a stack frame. A frame means registers
  spilled to local memory (or an array indexed at run time), which costs memory traffic in
  kernels meant to be bound by their own loads and stores. It came from a register cap
  tighter than the code: the tile cast with 8 loads in flight under its 64-register cap
  spilled 136 bytes;
- the FP8 tile cast (llmc/fp8_cast.cuh) fits 80 registers and 3 KB of static shared memory in
  every instantiation, so 3 of its 256-thread blocks share an SM with their staging buffers
  (FP8_TILE_BLOCKS_PER_SM, whose static_assert counts on the 3 KB): the grid it launches;
- layernorm backward stays within the 80 registers it had before it took the residual
  gradient's sums and amax;
- a kernel above 64 registers declares __launch_bounds__. A block's threads share the SM's
  65536 registers: without a bound, nothing stops a launch of up to 1024 threads from asking
  for more, which a GPU refuses at the launch ("too many resources requested") and cudasim
  cannot see; with one, ptxas keeps the registers within it and cudasim refuses a wider launch.
- the trainer carries PTX beside its sm_90a code (nvcc's -arch shorthand: a newer GPU's driver
  compiles it), the GPU tests and benchmarks machine code alone (the Makefile's NVCC_DEV_FLAGS:
  the PTX was a quarter of each of their compiles in make test).
"""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
import sass_path  # noqa: E402  (dev/bench/sass_path.py: finds cuobjdump)

BINARIES = ["train_gpt2_fp8", "bench_gemm"]
KERNEL_SOURCES = ["train_gpt2_fp8.cu", "dev/bench/bench_gemm.cu"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "llmc", "*.cu*")))
REGISTERS_PER_SM = 65536
MAX_THREADS_PER_BLOCK = 1024


def find_cuobjdump():
    found = sass_path.find_cuobjdump()
    if found is None:
        pytest.fail("no cuobjdump on PATH, in CUDA_HOME/bin or from the nvidia-cuda-cuobjdump wheel: "
                    "run scripts/setup_python.sh")
    return found


def embedded_images(binary, kind):
    """the names cuobjdump lists for a binary's embedded images of one kind ("elf" or "ptx")"""
    path = os.path.join(ROOT, binary)
    assert os.path.exists(path), "%s is not built (make %s)" % (path, binary)
    result = subprocess.run([find_cuobjdump(), "--list-" + kind, path], capture_output=True, text=True, timeout=300)
    return re.findall(r"^(?:ELF|PTX) file\s+\d+: (\S+)$", result.stdout, re.M)


@pytest.mark.parametrize("binary, has_ptx", [("train_gpt2_fp8", True), ("build/test_gpt2", False),
                                             ("bench_gemm", False), ("build/adamw8_sass_probe.cubin", False)])
def test_only_the_trainer_carries_ptx(binary, has_ptx):
    elves = embedded_images(binary, "elf")
    assert elves and all(name.endswith(".sm_90a.cubin") for name in elves), elves
    ptx = embedded_images(binary, "ptx")
    assert bool(ptx) == has_ptx, ptx


def kernel_resources(binary):
    """{mangled kernel name: {"REG": n, "STACK": n, ...}} of a binary's sm_90a code"""
    path = os.path.join(ROOT, binary)
    assert os.path.exists(path), "%s is not built (make %s)" % (path, binary)
    result = subprocess.run([find_cuobjdump(), "-res-usage", path], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    kernels = {}
    name = None
    for line in result.stdout.splitlines():
        match = re.search(r"Function (\S+):", line)
        if match:
            name = match.group(1)
            continue
        if name is not None and "REG:" in line:
            kernels[name] = {key: int(value) for key, value in re.findall(r"([A-Z]+):(\d+)", line)}
            name = None
    assert kernels, "cuobjdump listed no kernels in %s:\n%s" % (binary, result.stdout[:2000])
    return kernels


@pytest.mark.parametrize("binary", BINARIES)
def test_no_kernel_spills(binary):
    frames = {name: usage["STACK"] for name, usage in kernel_resources(binary).items() if usage.get("STACK", 0) > 0}
    assert frames == {}, "kernels with a stack frame (spilled registers or a local array), in bytes: %s" % frames


def test_tile_cast_fits_three_blocks_per_sm():
    casts = {name: usage for name, usage in kernel_resources("train_gpt2_fp8").items()
             if "fp8_cast_transpose_kernel" in name}
    # bf16 staging with the identity, GELU, GELU backward and layernorm transforms; fp32 master weights
    assert len(casts) >= 5, "expected the tile cast's instantiations, found %s" % sorted(casts)
    blocks_per_sm = 3
    register_cap = REGISTERS_PER_SM // (blocks_per_sm * 256) // 8 * 8  # 80: allocated 8 a thread at a time
    over = {name: usage["REG"] for name, usage in casts.items() if usage["REG"] > register_cap}
    assert over == {}, "tile cast instantiations above %d registers (fewer than 3 blocks per SM): %s" % (register_cap, over)
    static_over = {name: usage["SHARED"] for name, usage in casts.items() if usage.get("SHARED", 0) > 3072}
    assert static_over == {}, ("tile cast instantiations with more than the 3 KB of static shared memory that "
                               "Fp8TileStaging's static_assert counts on: %s" % static_over)


def test_layernorm_backward_registers():
    """at most 80 registers (6 blocks of 4 warps per SM), what it had before it also summed the residual
    gradient it writes: a run-time test of its amax record inside the unrolled loop took it to 140 (3 blocks)"""
    kernels = {name: usage["REG"] for name, usage in kernel_resources("train_gpt2_fp8").items()
               if plain_name(name) == "layernorm_backward_kernel"}
    assert len(kernels) == 2, "expected layernorm_backward_kernel with and without the residual gradient's sums: %s" % kernels
    over = {name: registers for name, registers in kernels.items() if registers > 80}
    assert over == {}, "layernorm_backward_kernel above 80 registers: %s" % over


def kernels_with_launch_bounds():
    """the names of the kernels whose source declares __launch_bounds__"""
    names = set()
    for source in KERNEL_SOURCES:
        with open(os.path.join(ROOT, source)) as f:
            names.update(re.findall(r"__launch_bounds__\([^)]*\)\s*(\w+)\s*\(", f.read()))
    return names


def plain_name(mangled):
    """a kernel's name from its Itanium-mangled one (_Z<length><name>...)"""
    match = re.match(r"_Z(\d+)", mangled)
    return mangled[match.end():match.end() + int(match.group(1))] if match else mangled


@pytest.mark.parametrize("binary", BINARIES)
def test_kernels_any_launch_fits_the_register_file(binary):
    bounded = kernels_with_launch_bounds()
    assert "layernorm_backward_kernel" in bounded, "the __launch_bounds__ parse found %s" % sorted(bounded)
    limit = REGISTERS_PER_SM // MAX_THREADS_PER_BLOCK
    unbounded = {name: usage["REG"] for name, usage in kernel_resources(binary).items()
                 if usage["REG"] > limit and plain_name(name) not in bounded}
    assert unbounded == {}, ("kernels above %d registers without __launch_bounds__ (a launch of 1024 threads would be "
                             "refused on a GPU): %s" % (limit, unbounded))
