#!/usr/bin/env bash
# Runs each test binary given on the command line and adds up their "name: N passed, N failed"
# lines into one closing line. Exits non-zero if any test binary failed, crashed, ran past its
# time or was not run. One binary at a time by default, its output shown as it comes (so a log
# tee'd from here, e.g. one a device call returns, holds what ran even if the call is cut off).
#   TEST_JOBS       binaries run at once (default 1), each started in the order given as a
#                   lane frees, and its output shown whole when it ends: make test runs its
#                   CPU and cudasim binaries in one lane a core, the longest given first so
#                   the others fill the other lanes around it.
# Two limits, both unset by default, keep a device call from being lost to one binary:
#   TEST_TIMEOUT_S  seconds each binary may take (the GPU runner sets 300: a hang costs one
#                   binary, not the whole call);
#   TEST_DEADLINE   a time (seconds since the epoch, date +%s) by which all must be done: a
#                   binary is stopped there, and those not started by then are listed as not
#                   run, so a call with a fixed budget (dev/gpu_session.sh first) still reaches
#                   its next stage with the counts of what ran.
set -u
jobs=${TEST_JOBS:-1}
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: test/run_cpu_tests.sh: TEST_JOBS=$jobs (expected a whole number of binaries at once, 1 or more)" >&2
    exit 2
fi
total_passed=0
total_failed=0
broken=0
not_run=0
outputs=$(mktemp -d)
trap 'rm -rf "$outputs"' EXIT

# this binary's limit: TEST_TIMEOUT_S, or what is left before TEST_DEADLINE if that is less;
# sets limit and limit_name, and fails once TEST_DEADLINE is reached
binary_limit() {
    limit=${TEST_TIMEOUT_S:-}
    limit_name="TEST_TIMEOUT_S=${limit}s"
    if [ -n "${TEST_DEADLINE:-}" ]; then
        local left=$((TEST_DEADLINE - $(date +%s)))
        [ "$left" -ge 1 ] || return 1
        if [ -z "$limit" ] || [ "$left" -lt "$limit" ]; then
            limit=$left
            limit_name="TEST_DEADLINE (${left}s left)"
        fi
    fi
}

# runs binary $1 under $limit, its stderr into its stdout
run_binary() {
    if [ -n "$limit" ]; then
        timeout --kill-after=10 "$limit" "$1" 2>&1
    else
        "$1" 2>&1
    fi
}

tallied=0
# adds what binary $1 (exit code $2, output in file $3, run under limit $4 named $5) reported
tally() {
    tallied=$((tallied + 1))
    local bin=$1 rc=$2 output=$3 limit=$4 limit_name=$5
    if [ -n "$limit" ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
        echo "!! $bin ran past $limit_name and was stopped"
        broken=$((broken + 1))
        return
    fi
    local line
    line=$(grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed$' "$output" | tail -n 1)
    if [ -z "$line" ]; then
        echo "!! $bin printed no summary line (exit code $rc)"
        broken=$((broken + 1))
        return
    fi
    local p f
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!! $bin exited with $rc"
        broken=$((broken + 1))
    fi
}

declare -A lane_binary=() lane_output=() lane_limit=() lane_limit_name=()  # by the pid of a running lane
# waits for one running lane to end, then shows its binary's output and tallies it
finish_a_lane() {
    local pid
    wait -n -p pid
    local output=${lane_output[$pid]}
    echo "== ${lane_binary[$pid]}"
    cat "$output"
    tally "${lane_binary[$pid]}" "$(cat "$output.rc")" "$output" "${lane_limit[$pid]}" "${lane_limit_name[$pid]}"
    unset "lane_binary[$pid]" "lane_output[$pid]" "lane_limit[$pid]" "lane_limit_name[$pid]"
}

index=0
for bin in "$@"; do
    index=$((index + 1))
    output="$outputs/$index"
    while [ "${#lane_binary[@]}" -ge "$jobs" ]; do finish_a_lane; done
    if ! binary_limit; then
        echo "-- $bin not run: TEST_DEADLINE reached"
        not_run=$((not_run + 1))
        continue
    fi
    if [ "$jobs" -eq 1 ]; then
        echo "== $bin"
        run_binary "$bin" | tee "$output"
        tally "$bin" "${PIPESTATUS[0]}" "$output" "$limit" "$limit_name"
        continue
    fi
    (
        run_binary "$bin" > "$output"
        echo $? > "$output.rc"
    ) &
    lane_binary[$!]=$bin
    lane_output[$!]=$output
    lane_limit[$!]=$limit
    lane_limit_name[$!]=$limit_name
done
while [ "${#lane_binary[@]}" -gt 0 ]; do finish_a_lane; done
if [ $((tallied + not_run)) -ne $# ]; then  # a binary neither reported on nor listed as not run: this script broke
    echo "!! test/run_cpu_tests.sh accounted for $((tallied + not_run)) of the $# binaries given"
    broken=$((broken + 1))
fi
total_failed=$((total_failed + broken))
summary="${RUNNER_NAME:-cpu tests}: $total_passed passed, $total_failed failed"
[ "$not_run" -eq 0 ] || summary="$summary, $not_run binaries not run (TEST_DEADLINE)"
echo "$summary"
[ "$total_failed" -eq 0 ] && [ "$not_run" -eq 0 ]
