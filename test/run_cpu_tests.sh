#!/usr/bin/env bash
# Runs each test binary given on the command line, shows its output as it comes (so a log
# tee'd from here, e.g. one a device call returns, holds what ran even if the call is cut
# off), and adds up the "name: N passed, N failed" lines into one closing line. Exits
# non-zero if any test binary failed, crashed, or ran past TEST_TIMEOUT_S seconds (unset:
# no limit; the GPU runner sets one, so a hang costs one binary, not the whole device call).
set -u
total_passed=0
total_failed=0
broken=0
output=$(mktemp)
trap 'rm -f "$output"' EXIT
for bin in "$@"; do
    echo "== $bin"
    if [ -n "${TEST_TIMEOUT_S:-}" ]; then
        timeout --kill-after=10 "$TEST_TIMEOUT_S" "$bin" 2>&1 | tee "$output"
    else
        "$bin" 2>&1 | tee "$output"
    fi
    rc=${PIPESTATUS[0]}
    if [ -n "${TEST_TIMEOUT_S:-}" ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
        echo "!! $bin ran past TEST_TIMEOUT_S=${TEST_TIMEOUT_S}s and was stopped"
        broken=$((broken + 1))
        continue
    fi
    line=$(grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed$' "$output" | tail -n 1)
    if [ -z "$line" ]; then
        echo "!! $bin printed no summary line (exit code $rc)"
        broken=$((broken + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!! $bin exited with $rc"
        broken=$((broken + 1))
    fi
done
total_failed=$((total_failed + broken))
echo "${RUNNER_NAME:-cpu tests}: $total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
