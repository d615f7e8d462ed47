#!/usr/bin/env bash
# Prepares the default training data, online or offline, and prints the trainer flags for it.
#
#   bash dev/data/prepare_default.sh                  # offline corpus (Python stdlib + /usr/share/doc)
#   bash dev/data/prepare_default.sh --tinyshakespeare # TinyShakespeare (needs the internet)
#
# The default is the offline corpus, because it needs no network and gives the same
# shards on every run on a machine. It is idempotent: when the shards and the
# tokenizer file (written last) are there, it does nothing. Extra arguments after the
# dataset choice go to the dataset script (e.g. --max-train-tokens 5000000).
set -euo pipefail

cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"

dataset="offline"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,10s/^# \{0,1\}//p' "$0"  # the comment above
    exit 0
fi
if [[ "${1:-}" == "--tinyshakespeare" ]]; then
    dataset="tinyshakespeare"
    shift
fi

case "$dataset" in
    offline)
        data_dir="dev/data/offline"; prefix="offline"; script="dev/data/offline_corpus.py" ;;
    tinyshakespeare)
        data_dir="dev/data/tinyshakespeare"; prefix="tiny_shakespeare"; script="dev/data/tinyshakespeare.py" ;;
esac

shopt -s nullglob
train_shards=("$data_dir/${prefix}"_train*.bin)  # numbered shards, or llm.c's one file (TinyShakespeare)
val_shards=("$data_dir/${prefix}"_val*.bin)
if (( ${#train_shards[@]} > 0 && ${#val_shards[@]} > 0 )) && [[ -f "$data_dir/gpt2_tokenizer.bin" ]]; then
    echo "$dataset data already prepared in $data_dir (delete it to rebuild)"
else
    "$PYTHON" "$script" "$@"
fi

echo "train with: -i '$data_dir/${prefix}_train*.bin' -j '$data_dir/${prefix}_val*.bin'"
echo "tokenizer:  $data_dir/gpt2_tokenizer.bin"
