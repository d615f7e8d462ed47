#!/usr/bin/env bash
# Runs each test binary given on the command line, shows its output as it comes (so a log
# tee'd from here, e.g. one a device call returns, holds what ran even if the call is cut
# off), and adds up the "name: N passed, N failed" lines into one closing line. Exits
# non-zero if any test binary failed, crashed, ran past its time or was not run. Two limits,
# both unset by default, keep a device call from being lost to one binary:
#   TEST_TIMEOUT_S  seconds each binary may take (the GPU runner sets 300: a hang costs one
#                   binary, not the whole call);
#   TEST_DEADLINE   a time (seconds since the epoch, date +%s) by which all must be done: a
#                   binary is stopped there, and those after it are listed as not run, so a
#                   call with a fixed budget (dev/gpu_session.sh first) still reaches its
#                   next stage with the counts of what ran.
set -u
total_passed=0
total_failed=0
broken=0
not_run=0
output=$(mktemp)
trap 'rm -f "$output"' EXIT
for bin in "$@"; do
    # this binary's limit: TEST_TIMEOUT_S, or what is left before TEST_DEADLINE if that is less
    limit=${TEST_TIMEOUT_S:-}
    limit_name="TEST_TIMEOUT_S=${limit}s"
    if [ -n "${TEST_DEADLINE:-}" ]; then
        left=$((TEST_DEADLINE - $(date +%s)))
        if [ "$left" -lt 1 ]; then
            echo "-- $bin not run: TEST_DEADLINE reached"
            not_run=$((not_run + 1))
            continue
        fi
        if [ -z "$limit" ] || [ "$left" -lt "$limit" ]; then
            limit=$left
            limit_name="TEST_DEADLINE (${left}s left)"
        fi
    fi
    echo "== $bin"
    if [ -n "$limit" ]; then
        timeout --kill-after=10 "$limit" "$bin" 2>&1 | tee "$output"
    else
        "$bin" 2>&1 | tee "$output"
    fi
    rc=${PIPESTATUS[0]}
    if [ -n "$limit" ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
        echo "!! $bin ran past $limit_name and was stopped"
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
summary="${RUNNER_NAME:-cpu tests}: $total_passed passed, $total_failed failed"
[ "$not_run" -eq 0 ] || summary="$summary, $not_run binaries not run (TEST_DEADLINE)"
echo "$summary"
[ "$total_failed" -eq 0 ] && [ "$not_run" -eq 0 ]
