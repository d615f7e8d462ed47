#!/usr/bin/env bash
# GPU tests (make gpucheck): checks that a GPU is visible, runs each test binary through
# run_cpu_tests.sh's summing logic, then the multi-rank trainer tests (test/gpu_trainer_ranks.py).
set -u
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "error: make gpucheck needs an NVIDIA GPU (nvidia-smi found none); CPU tests are 'make test'" >&2
    exit 1
fi
status=0
RUNNER_NAME="gpu tests" bash "$(dirname "$0")/run_cpu_tests.sh" "$@" || status=1
"${PYTHON:-python3}" "$(dirname "$0")/gpu_trainer_ranks.py" || status=1
exit $status
