#!/usr/bin/env bash
# Installs what llm8's Python tools need, from PyPI only, and gets the GPT-2 BPE rank file.
#
#   bash scripts/setup_python.sh
#
# 1. pip installs numpy, tiktoken (data tools), matplotlib (scripts/plot.py), pytest and
#    pytest-xdist (tests; make test runs them on every core),
#    the cuDNN frontend headers the CUDA build needs (nvidia-cudnn-frontend, no deps), and
#    cuobjdump and nvdisasm (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm, no deps) for the
#    kernel-resource and SASS-path tests.
# 2. If no GPT-2 rank file can be found (see dev/data/gpt2_bpe.py for the search order), it
#    downloads the openai-whisper *source* distribution with pip (no install: installing
#    whisper would pull in torch), takes whisper/assets/gpt2.tiktoken out of it, checks its
#    sha256 and keeps it as dev/data/cache/gpt2.tiktoken (git-ignored).
# Safe to rerun: each step is skipped when its result is already there.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHISPER_VERSION="20250625"
RANK_FILE="dev/data/cache/gpt2.tiktoken"
RANK_FILE_SHA256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

# a distribution's own Python (Debian 12, Ubuntu 24.04) refuses pip installs outside a venv (PEP 668:
# an EXTERNALLY-MANAGED file beside its standard library); say how to go on instead of pip's page
if "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    echo "error: $PYTHON is the system's Python, which refuses pip installs (PEP 668): make a venv and run this again in it:" \
         "python3 -m venv .venv && . .venv/bin/activate && bash $0" >&2
    exit 1
fi

"$PYTHON" -m pip install --quiet --disable-pip-version-check \
    "numpy>=1.24" "tiktoken>=0.8" "matplotlib>=3.7" "pytest>=7" "pytest-xdist>=3.2"
# the cuDNN frontend headers (header-only C++) that llmc/cudnn_att.cpp compiles against;
# --no-deps: its Python extras pull in large packages the build does not use
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-cudnn-frontend>=1.8"
# cuobjdump, which the toolkit image lacks: test/test_kernel_resources.py reads the kernels'
# registers and stack frames from the sm_90a code with it (no GPU needed), and test/test_sass_path.py
# their SASS, for which cuobjdump -sass runs nvdisasm (a wheel of its own since 13.5)
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-cuda-cuobjdump>=13.0,<14" \
    "nvidia-cuda-nvdisasm>=13.0,<14"

if "$PYTHON" dev/data/gpt2_bpe.py >/dev/null 2>&1; then
    "$PYTHON" dev/data/gpt2_bpe.py
    exit 0
fi

work_dir="$(mktemp -d)"
trap 'rm -rf "$work_dir"' EXIT
echo "fetching the openai-whisper==$WHISPER_VERSION sdist (not installing it) for gpt2.tiktoken"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$work_dir" "openai-whisper==$WHISPER_VERSION"
sdist="$(ls "$work_dir"/openai[-_]whisper-*.tar.gz)"
tar -xzf "$sdist" -C "$work_dir" --wildcards '*/whisper/assets/gpt2.tiktoken'
extracted="$(ls "$work_dir"/openai[-_]whisper-*/whisper/assets/gpt2.tiktoken)"
actual_sha256="$(sha256sum "$extracted" | cut -d' ' -f1)"
if [[ "$actual_sha256" != "$RANK_FILE_SHA256" ]]; then
    echo "error: $extracted from $sdist has sha256 $actual_sha256, expected $RANK_FILE_SHA256" >&2
    exit 1
fi
mkdir -p "$(dirname "$RANK_FILE")"
cp "$extracted" "$RANK_FILE.tmp"
mv "$RANK_FILE.tmp" "$RANK_FILE"
"$PYTHON" dev/data/gpt2_bpe.py
