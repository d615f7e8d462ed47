# Sourced by the run and compare scripts: their -h and --help. The trainer has a -h of its own
# (HellaSwag, -h 0|1), which a user's extra flags may carry, so -h asks for help only where no
# value follows it.

# without_help ARRAY_NAME USER_FLAGS...: the flags less -h/--help into the named array; 0 when there was one.
# -h followed by a value (not a flag) is the trainer's HellaSwag flag (-h 0|1) and stays.
without_help() {
    local -n kept="$1"
    shift
    local args=("$@") i found=1
    kept=()
    for (( i = 0; i < ${#args[@]}; i++ )); do
        if [[ "${args[i]}" == --help || ( "${args[i]}" == -h && ( $(( i + 1 )) -eq ${#args[@]} || "${args[i + 1]}" == -* ) ) ]]; then
            found=0
        else
            kept+=("${args[i]}")
        fi
    done
    return "$found"
}

# print_header_comment SCRIPT: the comment that opens SCRIPT (after its #! line), without the #s
print_header_comment() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1" 2>/dev/null || true
}
