#!/usr/bin/env bash
# Trains the same model twice, -p bf16 and -p fp8, on the same data with the same seed and
# flags, then draws both loss curves on one PNG (scripts/plot.py) and prints a table of the
# final val loss and the median throughput (tok/s from each run's main.jsonl, steps after the
# first 10) of each. DESIGN.md's loss-parity target: d12, >= 2000 steps, FP8 final val loss
# within 0.5% of bf16.
#
#   bash scripts/compare_bf16_fp8.sh                    # d12, 2000 steps, default data
#   MODEL=d24 STEPS=5000 OUT=log_cmp bash scripts/compare_bf16_fp8.sh -fr current -b 32
#
# Extra arguments go to both runs (e.g. data flags -i/-j, or FP8 flags, which bf16 ignores).
# The runs land in $OUT/bf16 and $OUT/fp8; the PNG is $OUT/loss.png. A run already complete
# there is resumed (-y 1), so the script can be re-run after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-d12}"
STEPS="${STEPS:-2000}"
OUT="${OUT:-log_compare_${MODEL}}"

make train_gpt2_fp8
for precision in bf16 fp8; do
    ./train_gpt2_fp8 -e "$MODEL" -p "$precision" -x "$STEPS" -b 16 -t 1024 -l 0.0006 -u 200 -q 0.0 -c 0.1 \
        -v 100 -s 0 -n 500 -o "$OUT/$precision" -y 1 "$@"
done

python scripts/plot.py "$OUT/bf16" "$OUT/fp8" --labels bf16 fp8 --ema 0.9 --out "$OUT/loss.png" \
    --title "$MODEL: bf16 vs fp8, $STEPS steps"

python - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
rows = []
for precision in ("bf16", "fp8"):
    val, tok = {}, []
    with open(f"{out}/{precision}/main.jsonl") as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "val" and record.get("loss") is not None:
                val[record["step"]] = record["loss"]
            if record.get("type") == "train" and record["step"] > 10 and record.get("tok_per_s") is not None:
                tok.append(record["tok_per_s"])
    last = max(val) if val else None
    rows.append((precision, last, val.get(last), statistics.median(tok) if tok else None))
base_loss, base_tok = rows[0][2], rows[0][3]
print("| precision | step | final val loss | vs bf16 | median tok/s | vs bf16 |")
print("|---|---|---|---|---|---|")
for precision, step, loss, tok in rows:
    loss_gap = f"{100 * (loss / base_loss - 1):+.2f}%" if loss is not None and base_loss else "-"
    speedup = f"{tok / base_tok:.3f}x" if tok and base_tok else "-"
    print(f"| {precision} | {step} | {loss if loss is not None else '-'} | {loss_gap} | {tok if tok else '-'} | {speedup} |")
EOF
echo "wrote $OUT/loss.png"
