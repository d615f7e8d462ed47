#!/usr/bin/env bash
# GPU tests (make gpucheck): checks that a GPU is visible, then runs each test binary
# through run_cpu_tests.sh's summing logic.
set -u
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "error: make gpucheck needs an NVIDIA GPU (nvidia-smi found none); CPU tests are 'make test'" >&2
    exit 1
fi
RUNNER_NAME="gpu tests" exec bash "$(dirname "$0")/run_cpu_tests.sh" "$@"
