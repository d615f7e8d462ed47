#!/usr/bin/env bash
# launch_one_node.sh: run an llm8 training command on all (or N) GPUs of this node, one
# process (rank) per GPU.
#
#   scripts/launch_one_node.sh [-n NGPUS] [-m mpi|fs] -- ./train_gpt2_fp8 FLAGS...
#   scripts/launch_one_node.sh [-n NGPUS] [-m mpi|fs] -- bash scripts/run_gpt2_124M_fp8.sh [FLAGS...]
#   NUM_GPUS=8 bash scripts/run_gpt2_124M_fp8.sh       (the same: run_common.sh calls this script)
#   scripts/launch_one_node.sh -h                      (prints this usage)
#
#   -n NGPUS   ranks to start (default: every visible GPU: CUDA_VISIBLE_DEVICES's entries, else
#              nvidia-smi -L). More ranks than GPUs needs NCCL_MULTI_RANK_GPU_ENABLE=1.
#   -m mpi|fs  how ranks start: mpi is `mpirun -np N --bind-to none CMD` (the trainer, built with
#              OpenMPI, takes rank, size and its GPU from MPI); fs starts the N ranks here with
#              `-pi fs -pf DIR -pn N -pr R -pg G`. Default: $LLM8_LAUNCH_METHOD, else mpi when
#              mpirun is on PATH, else fs; fs too, with a note, when the command is a program
#              linked without MPI (no libmpi in its ldd: a trainer built where the Makefile found no
#              OpenMPI, beside another MPI's mpirun, as in NGC containers). As root (GPU
#              containers often are) it sets OMPI_ALLOW_RUN_AS_ROOT=1 and
#              OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, without which OpenMPI's mpirun refuses to start
#              (other MPIs ignore them); values already set are kept. It also lets OpenMPI start
#              more ranks than it counts slots (OMPI_MCA_rmaps_base_oversubscribe=1 for OpenMPI 4,
#              PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe for 5; values already set are
#              kept): inside a Slurm allocation of fewer tasks than GPUs (salloc --gpus=8 has one)
#              it counts the tasks, elsewhere the cores, and would refuse with "not enough slots".
#
# Why it is shaped so:
# - mpirun is the launcher llm.c users know; --bind-to none keeps each rank's threads off a single
#   core. Where there is no MPI, the fs exchange (the one Slurm without PMIx uses) needs nothing but
#   a directory: a fresh one per launch, removed at exit, so a crashed earlier run's NCCL id file can
#   never be read.
# - In fs mode this script is the process manager: Ctrl-C, TERM or HUP sends TERM to every rank (a
#   script's background jobs ignore SIGINT, so it cannot be forwarded as is; a second signal sends
#   KILL). Under nohup, HUP stays ignored, by this script and the ranks alike, as nohup asks (bash
#   cannot trap a signal that was ignored when it started). The first rank that fails is named and
#   the others are stopped at once, instead of waiting out their -pt timeout; the exit status is
#   that rank's.
# - A run script is not started N times (it builds, retries and resumes once for all ranks): a
#   command that is a shell script (*.sh, or bash/sh ...) runs once with NUM_GPUS=N, and
#   scripts/run_common.sh calls this script back (LLM8_LAUNCHER) for the trainer itself, with
#   LLM8_LAUNCH_COMMAND=trainer, so a trainer wrapper named *.sh (LLM8_TRAINER) starts on every rank.
# - The launcher owns -pn -pr -pg -pi -pf -ps; a command that already sets one is refused, since two
#   values for the rank would leave every rank waiting for a peer that never comes.
set -euo pipefail

me="$(basename "$0")"
script_path="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
die() { echo "$me: error: $*" >&2; exit 2; }

num_ranks=""
method="${LLM8_LAUNCH_METHOD:-}"
while (( $# > 0 )); do
    case "$1" in
        -n) (( $# >= 2 )) || die "-n needs a value (the number of GPUs)"; num_ranks="$2"; shift 2
            [[ "$num_ranks" =~ ^[1-9][0-9]*$ ]] || die "-n '$num_ranks' is not a positive whole number of GPUs" ;;
        -m) (( $# >= 2 )) || die "-m needs a value (mpi or fs)"; method="$2"; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^# Why/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$script_path"; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option '$1' (expected -n NGPUS, -m mpi|fs, then -- COMMAND; -h for help)" ;;
        *) break ;;
    esac
done
(( $# > 0 )) || die "no command given (usage: $me [-n NGPUS] [-m mpi|fs] -- ./train_gpt2_fp8 FLAGS...)"
# whether COMMAND is a program linked without MPI: an ELF executable whose libraries (ldd) hold no libmpi. A script
# (a wrapper, the tests' stand-ins) or a machine without ldd cannot say: not taken as one
built_without_mpi() {
    local path
    path="$(command -v "$1" 2>/dev/null)" || return 1
    [[ -f "$path" && "$(head -c 4 "$path" | od -An -c | tr -d ' ')" == 177ELF ]] || return 1
    command -v ldd > /dev/null || return 1
    ! ldd "$path" 2>/dev/null | grep -q libmpi
}
if [[ -z "$method" ]]; then
    method=fs
    if command -v mpirun > /dev/null; then
        if built_without_mpi "$1"; then
            echo "$me: note: mpirun is on PATH, but $1 was built without MPI (it would see a world of 1 under" \
                 "mpirun): starting its ranks with -m fs" >&2
        else
            method=mpi
        fi
    fi
fi
[[ "$method" == mpi || "$method" == fs ]] || die "-m '$method' (or LLM8_LAUNCH_METHOD) is not mpi or fs"

# the GPUs this node lets us use: CUDA_VISIBLE_DEVICES's entries when it is set, else nvidia-smi's list
visible_gpus() {
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        local ids
        IFS=',' read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
        echo "${#ids[@]}"
    elif command -v nvidia-smi > /dev/null; then
        nvidia-smi -L | grep -c '^GPU ' || true
    fi
}
gpus="$(visible_gpus)"
if [[ -n "$gpus" ]] && (( gpus == 0 )); then   # with -n too: else every rank would get -pg 0
    die "no GPU is visible (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES is empty)"
fi
if [[ -z "$num_ranks" ]]; then
    [[ -n "$gpus" ]] || die "cannot count the GPUs (nvidia-smi not found, CUDA_VISIBLE_DEVICES unset); pass -n NGPUS"
    num_ranks="$gpus"
fi
gpus_per_node="$num_ranks"
if [[ -n "$gpus" ]] && (( num_ranks > gpus )); then
    [[ "${NCCL_MULTI_RANK_GPU_ENABLE:-0}" == 1 ]] || \
        die "-n $num_ranks asks for more ranks than the $gpus visible GPU(s) (set NCCL_MULTI_RANK_GPU_ENABLE=1 to share GPUs)"
    gpus_per_node="$gpus"
fi

command_word="$(basename "$1")"
if [[ "${LLM8_LAUNCH_COMMAND:-}" != trainer && ( "$command_word" == *.sh || "$command_word" == bash ||
      "$command_word" == sh ) ]]; then
    NUM_GPUS="$num_ranks" LLM8_LAUNCH_METHOD="$method" LLM8_LAUNCHER="$script_path" exec "$@"
fi
for word in "$@"; do
    case "$word" in
        -pn|-pr|-pg|-pi|-pf|-ps) die "the command sets $word, which this launcher sets for every rank; remove it" ;;
    esac
done

if [[ "$method" == mpi ]]; then
    command -v mpirun > /dev/null || die "-m mpi: mpirun is not on PATH (install OpenMPI, or use -m fs)"
    if (( EUID == 0 )); then
        export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
        export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
    fi
    export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"
    export PRTE_MCA_rmaps_default_mapping_policy="${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}"
    exec mpirun -np "$num_ranks" --bind-to none "$@"
fi

id_dir="$(mktemp -d "${TMPDIR:-/tmp}/llm8_launch.XXXXXX")"
trap 'rm -rf "$id_dir"' EXIT
pids=()
statuses=()
stopped=()       # 1: the launcher sent this rank TERM while it ran
signals_seen=0
exit_signal=""

stop_ranks() {   # $1: TERM or KILL, to every rank still running
    local running
    running=" $(jobs -rp | tr '\n' ' ') "
    for r in "${!pids[@]}"; do
        if [[ -z "${statuses[r]}" && "$running" == *" ${pids[r]} "* ]]; then
            stopped[r]=1
            kill "-$1" "${pids[r]}" 2> /dev/null || true
        fi
    done
}
on_signal() {    # $1: the signal's name
    signals_seen=$(( signals_seen + 1 ))
    exit_signal="$1"
    if (( signals_seen == 1 )); then
        echo "$me: $1: stopping all $num_ranks ranks (again to kill them)" >&2
        stop_ranks TERM
    else
        stop_ranks KILL
    fi
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

for (( r = 0; r < num_ranks; r++ )); do
    [[ -z "$exit_signal" ]] || break
    "$@" -pi fs -pf "$id_dir" -pn "$num_ranks" -pr "$r" -pg "$gpus_per_node" &
    pids[r]=$!
    statuses[r]=""
    stopped[r]=0
done

first_failed=""
remaining="${#pids[@]}"
while (( remaining > 0 )); do
    wait -n || true    # returns when a rank exits, or after a trapped signal's handler ran
    running=" $(jobs -rp | tr '\n' ' ') "
    for r in "${!pids[@]}"; do
        [[ -z "${statuses[r]}" && "$running" != *" ${pids[r]} "* ]] || continue
        status=0
        wait "${pids[r]}" || status=$?
        statuses[r]="$status"
        remaining=$(( remaining - 1 ))
        if (( status != 0 )) && [[ -z "$first_failed" && -z "$exit_signal" && "${stopped[r]}" == 0 ]]; then
            first_failed="$r"
            echo "$me: rank $r of $num_ranks failed (exit status $status); stopping the other ranks" >&2
            stop_ranks TERM
        fi
    done
done

if [[ -n "$exit_signal" ]]; then
    exit $(( 128 + $(kill -l "$exit_signal") ))
fi
if [[ -n "$first_failed" ]]; then
    for r in "${!pids[@]}"; do
        if (( statuses[r] != 0 )) && (( r != first_failed )); then
            how="failed"
            if (( stopped[r] )); then how="stopped by $me"; fi
            echo "$me: rank $r: exit status ${statuses[r]} ($how)" >&2
        fi
    done
    echo "$me: rank $first_failed of $num_ranks failed first (exit status ${statuses[first_failed]})" >&2
    exit "${statuses[first_failed]}"
fi
