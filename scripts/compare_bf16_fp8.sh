#!/usr/bin/env bash
# Trains the same model in bf16 and in FP8 (once per FP8 scaling recipe asked for), on the
# same data with the same seed and flags, then writes a table ($OUT/summary.md, also printed)
# of each run's val loss at the last val step every run shares, and its median throughput
# (tok/s from its main.jsonl, train steps 10 and later, at the B and T the header names), each
# against bf16 (scripts/compare_summary.py), then draws every loss curve on one PNG
# (scripts/plot.py; without matplotlib that is a warning, the table written). With
# OPTIMIZERS="adamw adamw8" every one of those runs is made with both optimizers, and each
# adamw8 run is also set against its precision's fp32 AdamW run. DESIGN.md's loss-parity
# targets: d12, >= 2000 steps, final val loss within 0.5% of bf16 for each FP8 recipe, and of
# fp32 AdamW for adamw8.
#
#   scripts/compare_bf16_fp8.sh                                        # d12, 2000 steps, delayed
#   RECIPES="delayed current block" scripts/compare_bf16_fp8.sh        # every recipe, one PNG
#   RECIPES="delayed delayed+lm_head" scripts/compare_bf16_fp8.sh      # +lm_head: lm_head in FP8 too (-f8 all)
#   RECIPES="delayed delayed+fg_delayed" scripts/compare_bf16_fp8.sh   # +fg_delayed: -fg delayed (not with block)
#   RECIPES="delayed delayed+fg_pow2" scripts/compare_bf16_fp8.sh      # +fg_pow2: -fg pow2 (not with block)
#   RECIPES="delayed delayed+fc_codes" scripts/compare_bf16_fp8.sh     # +fc_codes: -fe 1 -r 0 (delayed only)
#   OPTIMIZERS="adamw adamw8" scripts/compare_bf16_fp8.sh              # bf16 and FP8, each optimizer
#   MODEL=d24 STEPS=5000 OUT=log_cmp scripts/compare_bf16_fp8.sh -b 32
#   MODEL=tiny STEPS=20 LLM8_TRAINER=./train_gpt2cpu scripts/compare_bf16_fp8.sh -b 2 -t 64  # CPU, a minute
#
# Extra arguments go to every run after the script's flags, so they override its defaults:
# -b, -t, -d, -l, -q, -c, -v, -s, -n, -nk, data flags -i/-j, or FP8 flags such as -fm, which bf16
# ignores. Those that would override what the script sets from its variables are refused, in one
# line naming what to use instead: -p, -fr, -f8, -fg (the run names say the recipe and its
# options: RECIPES), -fw (FP8 runs keep -fw current: no run name says another), -opt
# (OPTIMIZERS), -e (MODEL), -x (STEPS), -u (WARMUP), -o (OUT) and -y (each run resumes already).
# A RECIPES item is a recipe followed by any of the
# options +lm_head, +fg_delayed, +fg_pow2 and +fc_codes, in any order, each at most once; +fg_delayed
# and +fg_pow2 both set -fg, so not both in one item (refused), and block+fg_delayed and
# block+fg_pow2 are refused, as the trainer refuses -fg delayed and -fg pow2 with -fr block;
# +fc_codes (fc's GEMM writes fcproj's input codes: -fe 1, with the -r 0 it needs, which changes
# memory, not results) only with delayed, as the trainer refuses -fe 1 with another recipe. The
# runs land in $OUT/bf16 and $OUT/fp8_<recipe>, plus _lm_head, then _fg_delayed or _fg_pow2, then
# _fc_codes for the options given, in that order whatever order they were written (adamw8: $OUT/bf16_adamw8,
# $OUT/fp8_<recipe>_adamw8); the PNG is $OUT/loss.png, the table $OUT/summary.md (when the runs
# share no val step after step 0, one error line says so and the exit status is 1).
# Each run directory records the run's settings (compare_settings.txt: its trainer flags, the
# extra arguments included, but -o, -y, -n and -nk), and a run already there with the same
# settings is resumed (-y 1) from its newest checkpoint (-n 500 -nk 1: every 500 steps and the
# last, only the newest kept), so the script can be re-run after an interruption, and a set of
# RECIPES can add runs to an OUT that holds others; one made with other settings (another
# STEPS, WARMUP or extra argument) is refused before any run trains, in one line naming the run
# directory, its settings and the new ones: give a new OUT or remove it. OUT defaults to
# log_compare_$MODEL. WARMUP sets -u (200 steps, or a tenth of STEPS when that is less).
# LLM8_TRAINER names another trainer binary, built already (e.g. ./train_gpt2cpu, which shares
# the flags: the tests run this script with it). NUM_GPUS=N (default 1) runs every run on N GPUs
# through LLM8_LAUNCHER (default scripts/launch_one_node.sh), as the run scripts do: -b is per GPU,
# so without a -d each step is N times the tokens; the run directories record N with their
# settings, so a rerun with another N is refused. -h or --help among the arguments (-h without
# the 0|1 of the trainer's HellaSwag flag) prints this comment and runs nothing.
set -euo pipefail
source "$(dirname "$0")/enter_checkout.sh"
source scripts/script_help.sh
if without_help trainer_flags "$@"; then
    echo "usage: [MODEL=d12] [STEPS=2000] [RECIPES=delayed] [OPTIMIZERS=adamw] [OUT=DIR] [WARMUP=N] [NUM_GPUS=N]"
    echo "       [LLM8_TRAINER=PATH] bash scripts/compare_bf16_fp8.sh [TRAINER FLAGS...]"
    echo "       bash scripts/compare_bf16_fp8.sh -h|--help     (this usage; nothing is run)"
    echo
    print_header_comment scripts/compare_bf16_fp8.sh
    exit 0
fi
MODEL="${MODEL:-d12}"
STEPS="${STEPS:-2000}"
WARMUP="${WARMUP:-$(( STEPS / 10 < 200 ? STEPS / 10 : 200 ))}"  # 200 steps, or a tenth of a shorter run
OUT="${OUT:-log_compare_${MODEL}}"
RECIPES="${RECIPES:-delayed}"
OPTIMIZERS="${OPTIMIZERS:-adamw}"
TRAINER="${LLM8_TRAINER:-./train_gpt2_fp8}"
PYTHON="${PYTHON:-python3}"
NUM_GPUS="${NUM_GPUS:-1}"
if [[ ! "$NUM_GPUS" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: scripts/compare_bf16_fp8.sh: NUM_GPUS='$NUM_GPUS': expected a number of GPUs, 1 or more" >&2
    exit 2
fi
launch=()  # several GPUs: every rank started by the one-node launcher (the trainer itself, even a wrapper .sh)
if (( NUM_GPUS > 1 )); then
    launch=(env LLM8_LAUNCH_COMMAND=trainer bash "${LLM8_LAUNCHER:-scripts/launch_one_node.sh}" -n "$NUM_GPUS" --)
fi

# each precision: its run name (directory and plot label) and its flags
names=(bf16)
flags=("-p bf16")
# a RECIPES item's options, in run-name order, and the flags each adds
OPTIONS=(lm_head fg_delayed fg_pow2 fc_codes)
OPTION_FLAGS=("-f8 all" "-fg delayed" "-fg pow2" "-fe 1 -r 0")
ACCEPTED="+lm_head, +fg_delayed or +fg_pow2, and +fc_codes, in any order, each at most once"
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
    if [[ "$recipe" != delayed && "$given" == *" fc_codes "* ]]; then
        echo "error: RECIPES: '$item': the trainer refuses -fe 1 with -fr $recipe (fc's GEMM writes the codes under a scale known before it runs, the delayed recipe's); use +fc_codes with delayed" >&2
        exit 2
    fi
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
# extra arguments go to every run after the script's flags, so they would win over them: refuse those that set
# what the script sets, per run (from RECIPES and OPTIMIZERS, which the run names say) or for every run (MODEL,
# STEPS, WARMUP, OUT, the resume), each pointing to the variable that sets it. The others (-b, -t, -d, -l, -v, -n,
# data and FP8 tuning flags, ...) may override the script's defaults; -b, -t and -d are noted for the tok/s header.
batch=16 seq=1024 total_batch=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i += 2)); do
    flag="${args[$i]}" value="${args[$((i + 1))]:-}"
    case "$flag" in
        -p) scope="per run (bf16, then -p fp8 for each RECIPES item)"; instead="set RECIPES instead (e.g. RECIPES=\"delayed current\")" ;;
        -fr) scope="per run, from RECIPES (the run names say it)"; instead="set RECIPES instead (e.g. RECIPES=\"delayed current block\")" ;;
        -f8) scope="per run (-f8 all for a RECIPES item with +lm_head, which the run name says)"; instead="add +lm_head to a RECIPES item instead (e.g. RECIPES=\"delayed delayed+lm_head\")" ;;
        -fg) scope="per run (from a RECIPES item's +fg_delayed or +fg_pow2, which the run name says)"; instead="add +fg_delayed or +fg_pow2 to a RECIPES item instead (e.g. RECIPES=\"delayed delayed+fg_pow2\")" ;;
        -fw) scope="for its FP8 runs (the trainer's -fw current: the run names have no place for another)"; instead="compare -fw delayed with two runs of the trainer instead" ;;
        -opt) scope="per run, from OPTIMIZERS (the run names say it)"; instead="set OPTIMIZERS instead (e.g. OPTIMIZERS=\"adamw adamw8\")" ;;
        -e) scope="for every run, from MODEL (OUT and the title name it)"; instead="set MODEL=$value instead" ;;
        -x) scope="for every run, from STEPS (the title and the warmup follow it)"; instead="set STEPS=$value instead" ;;
        -u) scope="for every run, from WARMUP"; instead="set WARMUP=$value instead" ;;
        -o) scope="for every run (OUT/<run name>, where the table is read from)"; instead="set OUT=$value instead" ;;
        -y) scope="for every run (-y 1: a run already in OUT resumes)"; instead="give a new OUT to start afresh instead" ;;
        -b) batch="$value"; continue ;;
        -t) seq="$value"; continue ;;
        -d) total_batch="$value"; continue ;;
        -v)
            if [[ "$value" == 0 ]]; then  # refused before any run trains, not after every run has
                echo "error: scripts/compare_bf16_fp8.sh: extra argument '-v 0': the table compares the runs' val losses," \
                     "and -v 0 evaluates none; give -v N > 0 (the script's default: -v 100)" >&2
                exit 2
            fi
            continue ;;
        *) continue ;;
    esac
    echo "error: scripts/compare_bf16_fp8.sh: extra argument '$flag${value:+ $value}': the script sets $flag $scope, and a flag after its own would override it silently: $instead (its variables: MODEL STEPS WARMUP OUT RECIPES OPTIMIZERS)" >&2
    exit 2
done
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
# what defines each run: the trainer's flags but those of its output (-o, -y) and checkpoints (-n, -nk), the
# extra arguments included. A run directory records them (compare_settings.txt) when its run starts; one that
# holds a run made with other settings is refused, every run checked before any trains, since -y 1 would go on
# with the new settings from the old run's checkpoint (the learning-rate schedule jumping) under a new title
SETTINGS_FILE=compare_settings.txt
# set_run_args I: run_args, the script's trainer flags that define run I (the extra arguments come after them)
set_run_args() {
    local precision
    read -r -a precision <<< "${run_flags[$1]}"
    run_args=(-e "$MODEL" "${precision[@]}" -x "$STEPS" -b 16 -t 1024 -l 0.0006 -u "$WARMUP" -q 0.0 -c 0.1 -v 100 -s 0)
}
# the extra arguments that define the runs: all but -n and -nk (how often a checkpoint is kept)
defining_extras=()
for ((i = 0; i < ${#args[@]}; i += 2)); do
    [[ "${args[$i]}" == -n || "${args[$i]}" == -nk ]] || defining_extras+=("${args[@]:$i:2}")
done
settings=()
differ=() first_error=""
for i in "${!runs[@]}"; do
    set_run_args "$i"
    settings[$i]="$(printf '%q ' "${run_args[@]}" "${defining_extras[@]}")"
    settings[$i]="${settings[$i]% }"
    (( NUM_GPUS == 1 )) || settings[$i]+=" NUM_GPUS=$NUM_GPUS"  # one GPU: as the settings read before NUM_GPUS
    dir="$OUT/${runs[$i]}"
    [[ -e "$dir/main.log" || -e "$dir/main.jsonl" ]] || compgen -G "$dir/DONE_*" >/dev/null || continue
    if [[ ! -f "$dir/$SETTINGS_FILE" ]]; then
        differ+=("$dir")
        [[ -n "$first_error" ]] || first_error="$dir holds a run but no $SETTINGS_FILE saying its settings, so it may not be this compare's ('${settings[$i]}'; if it is, write that into $dir/$SETTINGS_FILE)"
    elif [[ "$(< "$dir/$SETTINGS_FILE")" != "${settings[$i]}" ]]; then
        differ+=("$dir")
        [[ -n "$first_error" ]] || first_error="$dir holds a run with other settings: '$(< "$dir/$SETTINGS_FILE")' there, '${settings[$i]}' now (resuming it would go on with the new ones)"
    fi
done
if [[ ${#differ[@]} -gt 0 ]]; then
    them=them; [[ ${#differ[@]} -gt 1 ]] || them=it
    echo "error: scripts/compare_bf16_fp8.sh: $first_error; give a new OUT, or remove ${differ[*]} to train $them afresh" >&2
    exit 2
fi
# the checks above come before the build: a mistyped RECIPES, OPTIMIZERS or argument costs no make
[[ -n "${LLM8_TRAINER:-}" ]] || make -j2 train_gpt2_fp8
for i in "${!runs[@]}"; do
    set_run_args "$i"
    dir="$OUT/${runs[$i]}"
    mkdir -p "$dir"
    printf '%s\n' "${settings[$i]}" > "$dir/$SETTINGS_FILE"
    # -n 500 -nk 1: a checkpoint every 500 steps and at the last, only the newest kept (about 1.7 GB at d12), so a
    # rerun resumes a run cut off or finished; the extra arguments last (they may set -n or -nk)
    "${launch[@]}" "$TRAINER" "${run_args[@]}" -n 500 -nk 1 -o "$dir" -y 1 "$@"
done

dirs=()
for run in "${runs[@]}"; do dirs+=("$OUT/$run"); done
# the table first (an error when the runs share no val step after step 0: nothing more), then the PNG: a plot that
# fails (no matplotlib) is a warning, the table written already. A run whose val loss is not finite (diverged) has
# nan in the table, which compare_summary.py writes and then fails on: the PNG is still drawn, to show where, and
# the script exits 1
rm -f "$OUT/summary.md" "$OUT/loss.png"
summary_status=0
"$PYTHON" scripts/compare_summary.py "$OUT" "${runs[@]}" --batch "$batch" --seq "$seq" --gpus "$NUM_GPUS" \
    ${total_batch:+--total-batch "$total_batch"} --write "$OUT/summary.md" || summary_status=$?
[[ -f "$OUT/summary.md" ]] || exit "$summary_status"
plot_status=0
plot_error="$("$PYTHON" scripts/plot.py "${dirs[@]}" --labels "${runs[@]}" --ema 0.9 --out "$OUT/loss.png" \
    --title "$MODEL: bf16 vs fp8, $STEPS steps" 2>&1 >/dev/null)" || plot_status=$?
if [[ ! -f "$OUT/loss.png" ]]; then
    echo "warning: scripts/compare_bf16_fp8.sh: no $OUT/loss.png, scripts/plot.py failed (exit $plot_status): ${plot_error##*$'\n'}" >&2
    echo "wrote $OUT/summary.md"
else
    echo "wrote $OUT/summary.md and $OUT/loss.png"
fi
exit "$summary_status"
