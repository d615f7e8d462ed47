#!/usr/bin/env bash
# GPT-2 774M in FP8: the FP8 side of run_gpt2_774M_bf16.sh, with the same binary, data,
# seed and hyperparameters; only -p differs (the default delayed recipe; the FP8 numerics log,
# numerics.jsonl, is written every 100 steps). Output goes to log_gpt2_774M_fp8 (OUT_DIR
# overrides). Extra arguments go to the trainer after these flags (later flags win), e.g. -fr current.
set -euo pipefail
source "$(dirname "$0")/enter_checkout.sh"
LLM8_RUN_SCRIPT="scripts/$(basename "$0")" OUT_DIR="${OUT_DIR:-log_gpt2_774M_fp8}" exec bash scripts/run_gpt2_774M_bf16.sh -p fp8 "$@"
