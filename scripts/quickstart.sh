#!/usr/bin/env bash
# The README's first command: sets up Python tools, prepares the default data (the offline
# corpus: no network needed), then trains.
#   - with an NVIDIA GPU: builds train_gpt2_fp8 and trains GPT-2 d12 (124M) in bf16;
#   - without one: says so, builds train_gpt2cpu and trains a tiny model on the CPU.
# Extra arguments go to the trainer (e.g. -x 100 to stop after 100 steps). Run again, either
# run resumes from its newest checkpoint (-y 1) in log_d12_bf16 or log_tiny_cpu, its main.log
# continued.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_python.sh
bash dev/data/prepare_default.sh
data=(-i "dev/data/offline/offline_train_*.bin" -j "dev/data/offline/offline_val_*.bin")
if nvidia-smi -L >/dev/null 2>&1; then
    make -j2 train_gpt2_fp8
    exec ./train_gpt2_fp8 "${data[@]}" -e d12 -p bf16 -b 64 -t 1024 -d 524288 -l 0.0006 -u 700 -q 0.0 -c 0.1 \
        -x 2000 -v 250 -s 500 -n 1000 -o log_d12_bf16 -y 1 "$@"
else
    echo "no NVIDIA GPU found (nvidia-smi lists none): training a tiny model on the CPU with train_gpt2cpu instead"
    make train_gpt2cpu
    exec ./train_gpt2cpu "${data[@]}" -e tiny -b 4 -t 64 -l 0.001 -q 0.0 -x 200 -v 50 -m 4 -n 100 -o log_tiny_cpu -y 1 "$@"
fi
