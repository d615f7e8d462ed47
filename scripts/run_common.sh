# Sourced by scripts/run_gpt2_<size>_<precision>.sh: what every run script does the same way.
#   run_gpt2 DEFAULT_OUT_DIR TRAINER_FLAGS... -- EXTRA_USER_FLAGS...
# - OUT_DIR overrides the output dir; NUM_GPUS > 1 starts that many ranks with ZeRO-1 (-z 1,
#   as llm.c; on one GPU -z 0, which is the same thing) through $LLM8_LAUNCHER -n NUM_GPUS --
#   (default scripts/launch_one_node.sh: mpirun where it exists, else -pi fs; Slurm jobs set it
#   to scripts/slurm_gpt2.sbatch);
# - builds train_gpt2_fp8, then runs it (LLM8_TRAINER names another trainer binary, built
#   already: e.g. ./train_gpt2cpu, which shares the flags, as the tests run these scripts);
#   a failed run resumes (-y 1) from its last complete checkpoint, up to 3 attempts. The
#   user's extra flags come last, so they win.
run_gpt2() {
    local out_dir="${OUT_DIR:-$1}"
    shift
    local flags=()
    while (( $# > 0 )) && [[ "$1" != "--" ]]; do flags+=("$1"); shift; done
    (( $# > 0 )) && shift  # the "--"
    local num_gpus="${NUM_GPUS:-1}"
    local launch=()
    local zero_stage=0
    if (( num_gpus > 1 )); then
        launch=(bash "${LLM8_LAUNCHER:-scripts/launch_one_node.sh}" -n "$num_gpus" --)
        zero_stage=1
    fi
    local trainer="${LLM8_TRAINER:-./train_gpt2_fp8}"
    [[ -n "${LLM8_TRAINER:-}" ]] || make train_gpt2_fp8
    for attempt in 1 2 3; do
        "${launch[@]}" "$trainer" "${flags[@]}" -o "$out_dir" -y 1 -z "$zero_stage" "$@" && return 0
        echo "$(basename "$0"): trainer failed (attempt $attempt of 3)" >&2
    done
    return 1
}
