#!/usr/bin/env bash
# GPT-2 124M (d12) in BF16: 124M parameters on the FineWeb 10B-token sample (one epoch).
# The BF16 baseline that the FP8 run of the same size is measured against: same binary,
# data and seed, only -p differs.
#
# Hyperparameters are llm.c's published ones, from
#   llm.c scripts/run_gpt2_124M.sh: -b 64 -t 1024 -d 524288 -l 0.0006 -q 0.0 -u 700 -c 0.1 -z 1 -r 0
#   -v 250 -s 20000 -g 144 -h 1 -n 5000 -y 1 -e d12 on fineweb10B; llm.c sets no -x there and
#   runs one epoch of the 10B sample, which is the 18,865 steps of its DONE_00018865 marker.
#
# Data: python3 dev/data/fineweb.py --version 10B   (writes dev/data/fineweb10B/)
#       python3 dev/data/hellaswag.py                  (for -h 1)
# GPUs: NUM_GPUS=8 bash scripts/run_gpt2_124M_bf16.sh runs it on 8 GPUs (scripts/launch_one_node.sh: mpirun, else -pi fs); the total batch
#       (-d) stays the same: gradient accumulation adapts to the number of GPUs, and where -b x -t x GPUs
#       would not divide -d (above 8 GPUs) -b shrinks to fit (scripts/run_common.sh).
# Extra arguments are passed to the trainer after these flags (later flags win).
# A failed run resumes (-y 1) from its last complete checkpoint (3 attempts in all, scripts/run_common.sh).
set -euo pipefail
source "$(dirname "$0")/enter_checkout.sh"
source scripts/run_common.sh

run_gpt2 log_gpt2_124M_bf16 \
    -p bf16 \
    -e d12 \
    -i "dev/data/fineweb10B/fineweb_train_*.bin" \
    -j "dev/data/fineweb10B/fineweb_val_*.bin" \
    -b 64 -t 1024 -d 524288 \
    -l 0.0006 -q 0.0 -u 700 -c 0.1 \
    -x 18865 \
    -v 250 -s 20000 -g 144 -h 1 \
    -n 5000 \
    -r 0 \
    -- "$@"
