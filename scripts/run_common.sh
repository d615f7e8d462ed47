# Sourced by scripts/run_gpt2_<size>_<precision>.sh: what every run script does the same way.
#   run_gpt2 DEFAULT_OUT_DIR TRAINER_FLAGS... -- EXTRA_USER_FLAGS...
# - OUT_DIR overrides the output dir; NUM_GPUS > 1 starts that many ranks with ZeRO-1 (-z 1,
#   as llm.c; on one GPU -z 0, which is the same thing) through $LLM8_LAUNCHER -n NUM_GPUS --
#   (default scripts/launch_one_node.sh: mpirun where it exists and the trainer links MPI, else -pi fs; Slurm jobs set it
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
#   -d) the largest -b below it that does, unless the user's flags set -b (fit_micro_batch);
# - -h or --help among the user's flags (-h without the 0|1 of the trainer's HellaSwag flag) prints the
#   script's usage (print_usage) and DRY_RUN=1 checks the data and prints the trainer's command line,
#   both building and running nothing;
# - a run that fails before writing anything into an output dir it created (the trainer dying at
#   startup leaves only its .llm8.lock) does not leave that dir behind (remove_unused_out_dir);
# - messages name the script the user ran: a wrapper that execs another run script
#   (run_gpt2_<size>_fp8.sh: the bf16 one with -p fp8) names itself in LLM8_RUN_SCRIPT, a path from the
#   checkout's root, whose comment --help prints.
# needs bash 4.4+ (a nameref, and "${launch[@]}" of an empty array under set -u, an error before 4.4)

source "$(dirname "${BASH_SOURCE[0]}")/script_help.sh"  # without_help, print_header_comment
LLM8_RUN_SCRIPT="${LLM8_RUN_SCRIPT:-scripts/$(basename "$0")}"
export -n LLM8_RUN_SCRIPT  # the wrapper's, for this script only: not the trainer's nor a nested run's
run_script_name="$(basename "$LLM8_RUN_SCRIPT")"

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
    local hint  # the run script's "# Data:" line, else the one of the script a wrapper (LLM8_RUN_SCRIPT) execs
    hint="$(sed -n 's/^# Data: *//p' "$LLM8_RUN_SCRIPT" "scripts/$(basename "$0")" "$0" 2>/dev/null | head -n 1 || true)"
    if [[ -n "$train" ]] && ! compgen -G "$train" > /dev/null; then
        echo "error: $run_script_name: no train shards match -i '$train'${hint:+; make them first: $hint}" >&2
        return 1
    fi
    if [[ "$hellaswag" == 1 && ! -f dev/data/hellaswag/hellaswag_val.bin ]]; then
        echo "error: $run_script_name: -h 1 needs dev/data/hellaswag/hellaswag_val.bin; make it first:" \
             "python3 dev/data/hellaswag.py (or pass -h 0)" >&2
        return 1
    fi
    return 0
}

# print_usage COMMAND...: the run script's usage, on stdout: its own comment, the trainer command
# line it runs (COMMAND, quoted), the environment variables it reads
print_usage() {
    echo "usage: [OUT_DIR=DIR] [NUM_GPUS=N] [LLM8_TRAINER=PATH] [DRY_RUN=1] bash $LLM8_RUN_SCRIPT [TRAINER FLAGS...]"
    echo "       bash $LLM8_RUN_SCRIPT -h|--help     (this usage; nothing is built or run)"
    echo
    print_header_comment "$LLM8_RUN_SCRIPT"
    echo
    echo "It builds ./train_gpt2_fp8 (make -j2 train_gpt2_fp8; not with LLM8_TRAINER), then runs, from the checkout's root:"
    echo "  $(quote_command "$@")"
    echo "TRAINER FLAGS, the extra arguments, go to the trainer after the script's flags, so they win (-o moves the"
    echo "output; -h 0|1 is the trainer's HellaSwag flag). The trainer's flags: ./train_gpt2_fp8 --help, or without"
    echo "a GPU build ./train_gpt2cpu --help (the same flags)."
    echo
    echo "Environment:"
    echo "  OUT_DIR=DIR         output dir, the trainer's -o (this run's: $out_dir)"
    echo "  NUM_GPUS=N          ranks, one per GPU (default 1); N > 1 runs ZeRO-1 (-z 1) through LLM8_LAUNCHER, and"
    echo "                      -b shrinks where -b x -t x N does not divide -d"
    echo "  LLM8_LAUNCHER=PATH  what starts the ranks for NUM_GPUS > 1 (default scripts/launch_one_node.sh: mpirun"
    echo "                      where it exists and the trainer links MPI, else -pi fs; LLM8_LAUNCH_METHOD=mpi|fs chooses)"
    echo "  LLM8_TRAINER=PATH   a trainer binary built already, run instead of building ./train_gpt2_fp8 (e.g."
    echo "                      ./train_gpt2cpu, the CPU trainer with the same flags); the trainer then checks the data"
    echo "  DRY_RUN=1           check the data (-i's shards; HellaSwag's file with -h 1), print the trainer's command"
    echo "                      line and exit 0, building and running nothing"
    echo "A run that fails after its first step resumes (-y 1) from its last complete checkpoint, 3 attempts in all;"
    echo "one that fails before it leaves no empty output dir behind."
}

# quote_command WORDS...: the words as one shell command line, each quoted as the shell needs
quote_command() {
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
}

# missing_top DIR: the topmost of DIR and its parents that does not exist ("" when DIR exists): what mkdir -p
# DIR would create first
missing_top() {
    local dir="$1" top=""
    while [[ -n "$dir" && ! -e "$dir" ]]; do
        top="$dir"
        [[ "$dir" == */* ]] || break
        dir="${dir%/*}"
    done
    echo "$top"
}

# remove_unused_out_dir DIR TOP: after a failed run, removes DIR when this run created it (TOP, from missing_top
# before the run, is not "") and the trainer wrote nothing into it but its lock file (.llm8.lock, claimed at
# startup), then the parents it created up to TOP while they are empty; never a dir that existed before
remove_unused_out_dir() {
    local dir="$1" top="$2"
    [[ -n "$top" && -d "$dir" && ! -L "$dir" ]] || return 0
    [[ -z "$(find "$dir" -mindepth 1 -maxdepth 1 ! -name .llm8.lock -print -quit 2>/dev/null || echo unreadable)" ]] \
        || return 0
    rm -f "$dir/.llm8.lock"
    rmdir "$dir" 2>/dev/null || return 0
    echo "$run_script_name: removed -o $dir, which this run created and left empty" >&2
    while [[ "$dir" != "$top" && "$dir" == */* ]]; do
        dir="${dir%/*}"
        rmdir "$dir" 2>/dev/null || return 0
    done
}

run_gpt2() {
    local out_dir="${OUT_DIR:-$1}"
    shift
    local flags=()
    while (( $# > 0 )) && [[ "$1" != "--" ]]; do flags+=("$1"); shift; done
    (( $# > 0 )) && shift  # the "--"
    local user_flags=() want_help=""
    if without_help user_flags "$@"; then
        want_help=1
        set -- "${user_flags[@]}"
    fi
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
    local trainer="${LLM8_TRAINER:-./train_gpt2_fp8}"
    fit_micro_batch flags "$num_gpus" "$@"
    local command=("${launch[@]}" "$trainer" "${flags[@]}" -o "$out_dir" -y 1 -z "$zero_stage" "$@")
    if [[ -n "$want_help" ]]; then
        print_usage "${command[@]}"
        return 0
    fi
    if [[ -n "${DRY_RUN:-}" && "$DRY_RUN" != 0 ]]; then
        check_inputs "${flags[@]}" "$@" || return 1
        local build=""
        [[ -z "${LLM8_TRAINER:-}" ]] && build=" make -j2 train_gpt2_fp8, then"
        echo "# $run_script_name, DRY_RUN=$DRY_RUN: nothing built or run; it would run$build from $PWD:"
        quote_command "${command[@]}"
        return 0
    fi
    if [[ -z "${LLM8_TRAINER:-}" ]]; then
        check_inputs "${flags[@]}" "$@" || return 1
        make -j2 train_gpt2_fp8
    fi
    local status=0 attempt log_before created
    created="$(missing_top "$out_dir")"
    for attempt in 1 2 3; do
        status=0
        log_before=$(log_stamp "$out_dir")
        "${command[@]}" || status=$?
        (( status == 0 )) && return 0
        if (( status == 130 || status == 143 )); then
            echo "$run_script_name (-o $out_dir): stopped by a signal (exit status $status), not retried" >&2
            remove_unused_out_dir "$out_dir" "$created"
            return "$status"
        fi
        if [[ "$(log_stamp "$out_dir")" == "$log_before" ]]; then
            echo "$run_script_name (-o $out_dir): trainer failed with exit status $status before its first step, not retried" >&2
            remove_unused_out_dir "$out_dir" "$created"
            return "$status"
        fi
        echo "$run_script_name (-o $out_dir): trainer failed with exit status $status (attempt $attempt of 3)" >&2
    done
    return "$status"
}

# when a run dir's main.log was last written, to the nanosecond, and its size ("none" without one)
log_stamp() {
    stat -c '%y %s' "$1/main.log" 2>/dev/null || echo none
}
