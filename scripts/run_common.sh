# Sourced by scripts/run_gpt2_<size>_<precision>.sh: what every run script does the same way.
#   run_gpt2 DEFAULT_OUT_DIR TRAINER_FLAGS... -- EXTRA_USER_FLAGS...
# - OUT_DIR overrides the output dir; NUM_GPUS > 1 starts that many ranks with ZeRO-1 (-z 1,
#   as llm.c; on one GPU -z 0, which is the same thing) through $LLM8_LAUNCHER -n NUM_GPUS --
#   (default scripts/launch_one_node.sh: mpirun where it exists, else -pi fs; Slurm jobs set it
#   to scripts/slurm_gpt2.sbatch);
# - checks that the data is there (-i's shards, and HellaSwag's file with -h 1: check_inputs) and builds
#   train_gpt2_fp8, then runs it (LLM8_TRAINER names another trainer binary, built
#   already: e.g. ./train_gpt2cpu, which shares the flags, as the tests run these scripts);
#   a failed run resumes (-y 1) from its last complete checkpoint, up to 3 attempts, when it
#   wrote to main.log (a step logged; the time stamp, since a run that starts over rewrites the
#   same lines): one that failed before that (a missing shard, a bad flag) would fail alike
#   again, and one stopped by a signal
#   (Ctrl-C: exit status 130, kill: 143) is not retried either. The user's extra flags come
#   last, so they win (a -o among them too: that main.log is the one watched);
# - llm.c's -b fills -d in one micro-step on 8 GPUs: on more (or where B*T*GPUs does not divide
#   -d) the largest -b below it that does, unless the user's flags set -b (fit_micro_batch).
# needs bash 4.4+ (a nameref, and "${launch[@]}" of an empty array under set -u, an error before 4.4)

# fit_micro_batch FLAGS_ARRAY_NAME NUM_GPUS USER_FLAGS...: lowers -b in the named array so that
# B*T*NUM_GPUS divides -d, the total batch staying llm.c's; nothing if it divides already, if the
# user gave -b, or if no -b fits (the trainer then says why in one line)
fit_micro_batch() {
    local -n script_flags="$1"
    local num_gpus="$2"
    shift 2
    local all=("${script_flags[@]}" "$@") b="" t="" d="" arg i
    for (( i = 0; i + 1 < ${#all[@]}; i++ )); do
        case "${all[i]}" in
            -b) b="${all[i + 1]}" ;;
            -t) t="${all[i + 1]}" ;;
            -d) d="${all[i + 1]}" ;;
        esac
    done
    for arg in "$@"; do [[ "$arg" == -b ]] && return 0; done
    [[ "$b" =~ ^[0-9]+$ && "$t" =~ ^[0-9]+$ && "$d" =~ ^[0-9]+$ ]] || return 0
    (( b > 0 && t > 0 && d % (b * t * num_gpus) == 0 )) && return 0
    local fit="$b"
    while (( fit > 1 && d % (fit * t * num_gpus) != 0 )); do fit=$(( fit - 1 )); done
    (( d % (fit * t * num_gpus) == 0 )) || return 0
    echo "run_gpt2: -b $b x -t $t on $num_gpus GPUs does not divide -d $d: -b $fit per GPU (the total batch stays)" >&2
    for (( i = 0; i + 1 < ${#script_flags[@]}; i++ )); do
        [[ "${script_flags[i]}" == -b ]] && script_flags[i + 1]="$fit"
    done
    return 0
}

# check_inputs FLAGS...: what the trainer would refuse at its startup for want of data (no train shard matching
# -i, no HellaSwag file for -h 1), said in one line before the build, which takes minutes in a fresh checkout;
# the line names the command that makes the data (the run script's "# Data:" line). The trainer checks the rest,
# and all of it where LLM8_TRAINER names a trainer (built already: no build to save).
check_inputs() {
    local args=("$@") train="" hellaswag="" i
    for (( i = 0; i + 1 < ${#args[@]}; i++ )); do
        case "${args[i]}" in
            -i) train="${args[i + 1]}" ;;
            -h) hellaswag="${args[i + 1]}" ;;
        esac
    done
    local hint
    hint="$(sed -n 's/^# Data: *//p' "$0" 2>/dev/null | head -n 1)"
    if [[ -n "$train" ]] && ! compgen -G "$train" > /dev/null; then
        echo "error: $(basename "$0"): no train shards match -i '$train'${hint:+; make them first: $hint}" >&2
        return 1
    fi
    if [[ "$hellaswag" == 1 && ! -f dev/data/hellaswag/hellaswag_val.bin ]]; then
        echo "error: $(basename "$0"): -h 1 needs dev/data/hellaswag/hellaswag_val.bin; make it first:" \
             "python3 dev/data/hellaswag.py (or pass -h 0)" >&2
        return 1
    fi
    return 0
}

run_gpt2() {
    local out_dir="${OUT_DIR:-$1}"
    shift
    local flags=()
    while (( $# > 0 )) && [[ "$1" != "--" ]]; do flags+=("$1"); shift; done
    (( $# > 0 )) && shift  # the "--"
    local i
    for (( i = 1; i < $#; i++ )); do  # the user's -o (the last one) is where the trainer writes: the retry watches it
        [[ "${!i}" == -o ]] && { local next=$(( i + 1 )); out_dir="${!next}"; }
    done
    local num_gpus="${NUM_GPUS:-1}"
    local launch=()
    local zero_stage=0
    if (( num_gpus > 1 )); then
        # LLM8_LAUNCH_COMMAND=trainer: the command is the trainer itself, started on every rank, even where its
        # name ends in .sh (a wrapper), which launch_one_node.sh would otherwise take for a run script to start once
        launch=(env LLM8_LAUNCH_COMMAND=trainer bash "${LLM8_LAUNCHER:-scripts/launch_one_node.sh}" -n "$num_gpus" --)
        zero_stage=1
    fi
    fit_micro_batch flags "$num_gpus" "$@"
    local trainer="${LLM8_TRAINER:-./train_gpt2_fp8}"
    if [[ -z "${LLM8_TRAINER:-}" ]]; then
        check_inputs "${flags[@]}" "$@" || return 1
        make -j2 train_gpt2_fp8
    fi
    local status=0 attempt log_before
    for attempt in 1 2 3; do
        status=0
        log_before=$(log_stamp "$out_dir")
        "${launch[@]}" "$trainer" "${flags[@]}" -o "$out_dir" -y 1 -z "$zero_stage" "$@" || status=$?
        (( status == 0 )) && return 0
        if (( status == 130 || status == 143 )); then
            echo "$(basename "$0") (-o $out_dir): stopped by a signal (exit status $status), not retried" >&2
            return "$status"
        fi
        if [[ "$(log_stamp "$out_dir")" == "$log_before" ]]; then
            echo "$(basename "$0") (-o $out_dir): trainer failed with exit status $status before its first step, not retried" >&2
            return "$status"
        fi
        echo "$(basename "$0") (-o $out_dir): trainer failed with exit status $status (attempt $attempt of 3)" >&2
    done
    return "$status"
}

# when a run dir's main.log was last written, to the nanosecond, and its size ("none" without one)
log_stamp() {
    stat -c '%y %s' "$1/main.log" 2>/dev/null || echo none
}
