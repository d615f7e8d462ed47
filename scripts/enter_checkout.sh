# Sourced by the run and compare scripts, first: they run the trainer from the checkout's root (its
# -h 1 reads dev/data/hellaswag/ from there, as llm.c's does from its root, and the scripts' default
# data and output paths are the checkout's), wherever they are started from. What the user gives
# in the environment as a relative path means the directory the script was started from, so it
# is made absolute before the cd: OUT_DIR, OUT (the output), LLM8_TRAINER (a binary given with a
# folder, ./train_gpt2cpu; a bare name is looked up on PATH) and LLM8_LAUNCHER. The flags' own
# paths (-i, -j, -o, -e, ...) go to the trainer as they are, so they are read from the root. An
# LLM8_TRAINER that names no executable stops the script here, with one line.
#   source "$(dirname "$0")/enter_checkout.sh"
for variable in OUT_DIR OUT LLM8_TRAINER LLM8_LAUNCHER; do
    value="${!variable:-}"
    if [[ -n "$value" && "$value" != /* && ( "$variable" == OUT* || "$value" == */* ) ]]; then
        printf -v "$variable" '%s' "$PWD/$value"
        export "${variable?}"
    fi
done
unset variable value
if [[ -n "${LLM8_TRAINER:-}" ]] && ! command -v "$LLM8_TRAINER" > /dev/null; then
    echo "error: $(basename "$0"): LLM8_TRAINER=$LLM8_TRAINER is not an executable file (build it first; a relative" \
         "path is taken from the directory the script starts in)" >&2
    exit 1
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
