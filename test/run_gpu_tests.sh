#!/usr/bin/env bash
# GPU tests (make gpucheck): checks that a GPU is visible, then either runs each test binary
# given through run_cpu_tests.sh's summing logic (make gpucheck-tests) or, with --ranks, the
# multi-rank trainer tests (test/gpu_trainer_ranks.py, make gpucheck-ranks).
set -u
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "error: make gpucheck needs an NVIDIA GPU (nvidia-smi found none); CPU tests are 'make test'" >&2
    exit 1
fi
if [ "${1:-}" = "--ranks" ]; then
    shift
    exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_trainer_ranks.py" "$@"
fi
# a binary that hangs on the GPU is stopped after TEST_TIMEOUT_S (default 300) seconds
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-300} RUNNER_NAME="gpu tests" exec bash "$(dirname "$0")/run_cpu_tests.sh" "$@"
