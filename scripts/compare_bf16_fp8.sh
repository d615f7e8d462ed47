#!/usr/bin/env bash
# Trains the same model in bf16 and in FP8 (once per FP8 scaling recipe asked for), on the
# same data with the same seed and flags, then draws every loss curve on one PNG
# (scripts/plot.py) and prints a table of each run's final val loss and median throughput
# (tok/s from its main.jsonl, steps after the first 10), each against bf16. With
# OPTIMIZERS="adamw adamw8" every one of those runs is made with both optimizers, and each
# adamw8 run is also set against its precision's fp32 AdamW run. DESIGN.md's loss-parity
# targets: d12, >= 2000 steps, final val loss within 0.5% of bf16 for each FP8 recipe, and of
# fp32 AdamW for adamw8.
#
#   bash scripts/compare_bf16_fp8.sh                                   # d12, 2000 steps, delayed
#   RECIPES="delayed current block" bash scripts/compare_bf16_fp8.sh   # every recipe, one PNG
#   RECIPES="delayed delayed+lm_head" bash scripts/compare_bf16_fp8.sh # +lm_head: lm_head in FP8 too (-f8 all)
#   RECIPES="delayed delayed+fg_delayed" bash scripts/compare_bf16_fp8.sh  # +fg_delayed: -fg delayed (not with block)
#   RECIPES="delayed delayed+fg_pow2" bash scripts/compare_bf16_fp8.sh     # +fg_pow2: -fg pow2 (not with block)
#   OPTIMIZERS="adamw adamw8" bash scripts/compare_bf16_fp8.sh         # bf16 and FP8, each optimizer
#   MODEL=d24 STEPS=5000 OUT=log_cmp bash scripts/compare_bf16_fp8.sh -b 32
#
# Extra arguments go to every run after the script's flags (later flags win): data flags
# -i/-j, or FP8 flags, which bf16 ignores. A RECIPES item is a recipe followed by any of the
# options +lm_head, +fg_delayed and +fg_pow2, in any order, each at most once; +fg_delayed and
# +fg_pow2 both set -fg, so not both in one item (refused), and block+fg_delayed and
# block+fg_pow2 are refused, as the trainer refuses -fg delayed and -fg pow2 with -fr block. The
# runs land in $OUT/bf16 and $OUT/fp8_<recipe>, plus _lm_head then _fg_delayed or _fg_pow2 for
# the options given, in that order whatever order they were written (adamw8: $OUT/bf16_adamw8,
# $OUT/fp8_<recipe>_adamw8); the PNG is $OUT/loss.png, the table (also printed) $OUT/summary.md.
# A run already complete there is resumed (-y 1), so the script can be re-run after an
# interruption. WARMUP sets -u (200 steps, or a tenth of STEPS when that is less). LLM8_TRAINER
# names another trainer binary, built already (e.g. ./train_gpt2cpu, which shares the flags: the
# tests run this script with it).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-d12}"
STEPS="${STEPS:-2000}"
WARMUP="${WARMUP:-$(( STEPS / 10 < 200 ? STEPS / 10 : 200 ))}"  # 200 steps, or a tenth of a shorter run
OUT="${OUT:-log_compare_${MODEL}}"
RECIPES="${RECIPES:-delayed}"
OPTIMIZERS="${OPTIMIZERS:-adamw}"
TRAINER="${LLM8_TRAINER:-./train_gpt2_fp8}"
PYTHON="${PYTHON:-python3}"

# each precision: its run name (directory and plot label) and its flags
names=(bf16)
flags=("-p bf16")
# a RECIPES item's options, in run-name order, and the flags each adds
OPTIONS=(lm_head fg_delayed fg_pow2)
OPTION_FLAGS=("-f8 all" "-fg delayed" "-fg pow2")
ACCEPTED="+lm_head, and +fg_delayed or +fg_pow2, in any order, each at most once"
for item in $RECIPES; do
    recipe="${item%%+*}"
    case "$recipe" in
        delayed|current|block) ;;
        *) echo "error: RECIPES: '$item' is not an FP8 recipe (expected delayed, current or block, optionally followed by $ACCEPTED)" >&2
           exit 2 ;;
    esac
    # the options after the recipe, each +<option>: the ones given, as " name name "
    given=" "
    rest="${item#"$recipe"}"
    while [[ -n "$rest" ]]; do
        rest="${rest#+}"
        option="${rest%%+*}"
        rest="${rest#"$option"}"
        if [[ " ${OPTIONS[*]} " != *" $option "* ]]; then
            echo "error: RECIPES: '$item': unknown option '+$option' (accepted: $ACCEPTED)" >&2; exit 2
        fi
        if [[ "$given" == *" $option "* ]]; then
            echo "error: RECIPES: '$item': option '+$option' given twice (accepted: $ACCEPTED)" >&2; exit 2
        fi
        given+="$option "
    done
    if [[ "$given" == *" fg_delayed "* && "$given" == *" fg_pow2 "* ]]; then
        echo "error: RECIPES: '$item': +fg_delayed and +fg_pow2 both set -fg (one -fg per run): give one of them" >&2
        exit 2
    fi
    for option in fg_delayed fg_pow2; do
        if [[ "$recipe" == block && "$given" == *" $option "* ]]; then
            echo "error: RECIPES: '$item': the trainer refuses -fg ${option#fg_} with -fr block (its 1x128 gradient tiles are cast in one pass already); use +$option with delayed or current" >&2
            exit 2
        fi
    done
    name="fp8_$recipe"
    flag="-p fp8 -fr $recipe"
    for i in "${!OPTIONS[@]}"; do
        [[ "$given" == *" ${OPTIONS[$i]} "* ]] || continue
        name+="_${OPTIONS[$i]}"
        flag+=" ${OPTION_FLAGS[$i]}"
    done
    names+=("$name"); flags+=("$flag")
done
for optimizer in $OPTIMIZERS; do
    case "$optimizer" in
        adamw|adamw8) ;;
        *) echo "error: OPTIMIZERS: '$optimizer' is not an optimizer (expected adamw or adamw8)" >&2; exit 2 ;;
    esac
done
# the checks above come before the build: a mistyped RECIPES or OPTIMIZERS costs no make
[[ -n "${LLM8_TRAINER:-}" ]] || make train_gpt2_fp8
# every precision with every optimizer: fp32 AdamW keeps the plain name, adamw8 adds _adamw8
runs=()
run_flags=()
for i in "${!names[@]}"; do
    for optimizer in $OPTIMIZERS; do
        suffix=""
        [[ "$optimizer" == adamw ]] || suffix="_$optimizer"
        runs+=("${names[$i]}$suffix")
        run_flags+=("${flags[$i]} -opt $optimizer")
    done
done
for i in "${!runs[@]}"; do
    read -r -a precision <<< "${run_flags[$i]}"
    "$TRAINER" -e "$MODEL" "${precision[@]}" -x "$STEPS" -b 16 -t 1024 -l 0.0006 -u "$WARMUP" -q 0.0 -c 0.1 -v 100 -s 0 \
        -n 500 -o "$OUT/${runs[$i]}" -y 1 "$@"
done

dirs=()
for run in "${runs[@]}"; do dirs+=("$OUT/$run"); done
"$PYTHON" scripts/plot.py "${dirs[@]}" --labels "${runs[@]}" --ema 0.9 --out "$OUT/loss.png" \
    --title "$MODEL: bf16 vs fp8, $STEPS steps"

"$PYTHON" - "$OUT" "${runs[@]}" <<'EOF' | tee "$OUT/summary.md"
import json, statistics, sys
out, runs = sys.argv[1], sys.argv[2:]
rows = []
for run in runs:
    val, tok = {}, []
    with open(f"{out}/{run}/main.jsonl") as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "val" and record.get("loss") is not None:
                val[record["step"]] = record["loss"]
            if record.get("type") == "train" and record["step"] >= 10 and record.get("tok_per_s") is not None:
                tok.append(record["tok_per_s"])
    last = max(val) if val else None
    rows.append((run, last, val.get(last), statistics.median(tok) if tok else None))
final = {run: loss for run, _, loss, _ in rows}
# the baseline: bf16 with fp32 AdamW when it ran, else the first run
base = "bf16" if "bf16" in final else rows[0][0]
base_loss, base_tok = final[base], next(tok for run, _, _, tok in rows if run == base)

def gap(loss, reference):
    return f"{100 * (loss / reference - 1):+.2f}%" if loss is not None and reference else "-"

print(f"| run | step | final val loss | vs {base} | vs fp32 AdamW | median tok/s | vs {base} |")
print("|---|---|---|---|---|---|---|")
for run, step, loss, tok in rows:
    adamw_run = run[:-len("_adamw8")] if run.endswith("_adamw8") else None
    speedup = f"{tok / base_tok:.3f}x" if tok and base_tok else "-"
    print(f"| {run} | {step if step is not None else '-'} | {loss if loss is not None else '-'} | {gap(loss, base_loss)} | "
          f"{gap(loss, final.get(adamw_run)) if adamw_run else '-'} | {f'{tok:.0f}' if tok else '-'} | {speedup} |")
EOF
echo "wrote $OUT/loss.png and $OUT/summary.md"
