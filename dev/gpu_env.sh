#!/usr/bin/env bash
# Prints what the GPU machine has that the build and tests use: GPU and driver, nvcc,
# NVML, cuDNN (system and pip), the cuDNN frontend headers, NCCL, MPI, Python packages.
# `make env` runs it; paste its output into doc/gpu-environment.md when it changes.
set -u
PY=${PYTHON:-python3}  # the build's Python (dev/gpu_session.sh: the machine's torch venv)
section() { printf '\n## %s\n' "$1"; }
section "Machine (a kernel that reports 4.4.0 is gVisor's: no compute-sanitizer, no ncu counters there)"
uname -r
section "GPU and driver"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -5
else
    echo "nvidia-smi: not on PATH (no NVIDIA driver on this machine)"
fi
section "NVML (-lg)"
ldconfig -p 2>/dev/null | grep -m1 'libnvidia-ml.so.1' || echo "libnvidia-ml.so.1: not in the loader's cache"
section "nvcc"
command -v nvcc && nvcc --version | tail -2
echo "CUDA_HOME in the environment: ${CUDA_HOME:-(not set)}"
# the toolkit, cuDNN and frontend the Makefile picked (PATH's nvcc first; an exported CUDA_HOME where PATH has none)
echo "the build's: ${LLM8_TOOLKIT:-run this through make env to see it}"
section "CUDA libraries"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do ls "$d" 2>/dev/null | grep -E 'cublasLt|cudnn\.so|nccl' | sed "s|^|$d/|"; done
section "Python"
echo "$PY"
"$PY" --version
"$PY" - <<'PY'
import importlib, os, sysconfig
site = sysconfig.get_paths()["purelib"]
print("site-packages:", site)
for name in ["torch", "numpy", "tiktoken", "nvidia.cudnn", "nvidia.nccl", "cudnn", "matplotlib", "pytest"]:
    try:
        m = importlib.import_module(name)
        where = getattr(m, "__file__", None) or list(getattr(m, "__path__", []))
        print(f"{name}: {getattr(m, '__version__', '?')} at {where}")
    except Exception as e:
        print(f"{name}: not importable ({type(e).__name__})")
try:
    import torch
    print("torch cuda:", torch.version.cuda, "cudnn:", torch.backends.cudnn.version(), "nccl:", torch.cuda.nccl.version())
except Exception as e:
    print("torch details unavailable:", e)
for sub in ["nvidia/cudnn/include/cudnn_version.h", "include/cudnn_frontend.h", "nvidia/nccl/include/nccl.h"]:
    p = os.path.join(site, sub)
    print(sub, "->", p if os.path.exists(p) else "missing")
# the frontend headers dev/gpu_session.sh unpacks from the carried wheel (.whl/), where the Makefile also looks
p = os.path.join("build", "site", "include", "cudnn_frontend.h")
print("build/site/include/cudnn_frontend.h ->", os.path.abspath(p) if os.path.exists(p) else "missing (not unpacked yet)")
PY
section "cuDNN version header"
for h in /usr/local/cuda/include/cudnn_version.h $("$PY" -c "import sysconfig;print(sysconfig.get_paths()['purelib'])")/nvidia/cudnn/include/cudnn_version.h; do
  [ -f "$h" ] && { echo "$h:"; grep -E '#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' "$h"; }
done
section "NCCL and MPI"
ls /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -E '^libnccl' | head -3
# the NCCL the build picks, the newest of the toolkit's, pip's and the system's, as the Makefile found it (2.30+ runs two ranks on one GPU)
echo "NCCL the build uses: ${LLM8_NCCL:-run this through make env to see it}"
command -v mpirun && mpirun --version 2>&1 | head -1
command -v nsys ncu compute-sanitizer 2>/dev/null || true  # informational: a missing one is no error
