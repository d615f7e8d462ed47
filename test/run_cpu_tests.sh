#!/usr/bin/env bash
# Runs each CPU test binary given on the command line, shows its output, and adds up the
# "name: N passed, N failed" lines into one closing line. Exits non-zero if any test
# binary failed or crashed.
set -u
total_passed=0
total_failed=0
broken=0
for bin in "$@"; do
    echo "== $bin"
    out=$("$bin" 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
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
