#!/usr/bin/env bash
# make gpucheck in stages that each fit one call of the device tool (10 minutes at most a
# call, 15 minutes of device time a session, the machine's start and idle time included; the
# machine goes back 30 s after a call, and a fresh one starts bare). Each stage first brings
# the build up to date (make is incremental: a no-op on a warm machine, the whole build on a
# fresh one), then logs to $LOG_DIR ($OUT when the device tool runs it, so the logs come back;
# else build/gpu-logs).
#
#   bash dev/gpu_session.sh first   # a session's first call: env, the build (and the tables of probe_epilogues,
#                                   # bench_casts, bench_gemm --algorithms and dev/bench/torch_attention.py
#                                   # in env.txt), every GPU test binary,
#                                   # then d12's quick benchmark, all within FIRST_S (420) seconds
#                                   # (the tests until FIRST_BENCH_S (120) before the end, the
#                                   # benchmark the rest); summary.txt says what ran and what not
#   bash dev/gpu_session.sh rerun NAME  # a second call after build/NAME failed in first: the build brought
#                                   # up to date, then that test binary alone (rerun_NAME.log; TEST_TIMEOUT_S,
#                                   # TEST_GPT2_FIRST_SECTION as test/run_gpu_tests.sh and test_gpt2 read them)
#                                   # (BUILD_S=N: the build of rerun, tests and ranks stops after N seconds)
#   bash dev/gpu_session.sh build   # make env, the cuDNN frontend from .whl/, every GPU target
#   bash dev/gpu_session.sh tests   # the GPU test binaries (test/run_gpu_tests.sh without the ranks)
#   bash dev/gpu_session.sh ranks [SECTIONS]  # NCCL 2.30+ from .nccl/sm90 when carried (dev/nccl_wheel.sh
#                                   # install), test_multi_gpu (its 2-rank test), then test/gpu_trainer_ranks.py:
#                                   # 2 ranks on the one GPU (all sections, or those named: trajectories resume
#                                   # reshard twins mpirun killed); RANKS_S=N stops them after N seconds, trainers too
#   bash dev/gpu_session.sh bench [MODELS]  # dev/bench/bench.py --quick (--only MODELS, e.g. d12 then d48
#                                   # in two calls), its .md and .json written into the logs; BENCH_S=N: all
#                                   # within N seconds (the build at most half of them)
#   bash dev/gpu_session.sh parity [SETS]  # loss parity on the offline corpus (carry dev/data/offline):
#                                   # d12, PARITY_STEPS (2000) steps a run; the sets (all, or those
#                                   # named): optimizers (bf16, bf16 + adamw8, FP8 delayed, FP8 delayed
#                                   # + adamw8), lm_head (bf16, FP8 delayed, FP8 delayed with an FP8
#                                   # lm_head), fg_delayed (bf16, FP8 delayed, FP8 delayed with
#                                   # -fg delayed, FP8 delayed with -fg pow2), fastest (bf16, FP8
#                                   # delayed, FP8 delayed with -fg delayed and an FP8 lm_head: the
#                                   # fastest d12 setting, both candidate defaults at once), fc_codes
#                                   # (bf16, FP8 delayed, FP8 delayed with -fe 1 -r 0):
#                                   # scripts/compare_bf16_fp8.sh once a set
#                                   # (summary_SET.md; loss_SET.png in the main.log archive); a run a set shares with an
#                                   # earlier one is resumed, not trained again, and so is a run cut
#                                   # off (checkpoints every 500 steps) on the same warm machine;
#                                   # PARITY_S=N: stopped after N seconds, the logs of what ran returned
#   bash dev/gpu_session.sh profile [ARGS]  # Nsight Compute's counters (DRAM, L2, issue, occupancy) of llm8's own
#                                   # kernels in d12's step, FP8 default and bf16 (dev/bench/ncu_profile.py ARGS):
#                                   # profile.md and each run's CSV; PROFILE_S=N: all within N seconds
#   bash dev/gpu_session.sh sanitize  # compute-sanitizer memcheck over the kernel test binaries
#                                     # (out-of-bounds and misaligned device accesses; a spare call)
#
# The cuDNN frontend headers: if the machine has none, carry the nvidia-cudnn-frontend wheel in
# .whl/ (doc/gpu-environment.md says how to fetch it); it is unpacked into build/site, where the
# Makefile looks. Python: the machine's torch venv when it has one (the Makefile finds pip's
# cuDNN and NCCL through its site-packages). After the build, the stages run the test runners
# and bench.py themselves, not make's gpucheck-tests, gpucheck-ranks or bench: make would first
# compile again a target that failed in the build (make -k went on past it), fail, and run nothing.
# A device call returns at most 8 files: each stage writes fewer.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
LOG_DIR=${OUT:-build/gpu-logs}
mkdir -p "$LOG_DIR" build
LOG_DIR=$(cd "$LOG_DIR" && pwd)  # absolute: some stages cd elsewhere before they write into it
PYTHON=${PYTHON:-python3}
[ -x /opt/torch/.venv/bin/python3 ] && PYTHON=/opt/torch/.venv/bin/python3
export PYTHON PYTHONUNBUFFERED=1
JOBS=$(nproc)

# the ranks stage's NCCL_DEBUG_FILE logs, the non-empty ones, into one file of the call's logs
collect_nccl_warnings() {
    local log="$LOG_DIR/nccl_warnings.log" f
    for f in build/nccl-debug/*; do
        [ -s "$f" ] && { echo "== $f"; cat "$f"; }
    done > "$log"
    [ -s "$log" ] || rm -f "$log"
}

# the carried wheels' headers (the cuDNN frontend's include/, all the build takes from them) into
# build/site, once, before anything builds. Unzipped, not pip-installed: the frontend wheel is built
# per CPython version, and pip refuses one of another version than the machine's. A failure is
# logged and leaves the build to NO_CUDNN=1 (build_all), not the call without logs
install_wheels() {
    compgen -G ".whl/*.whl" >/dev/null && [ ! -f build/site/include/cudnn_frontend.h ] || return 0
    "$PYTHON" - .whl/*.whl <<'PY' 2>&1 | tee -a "$LOG_DIR/build.log"
import sys, zipfile
for wheel in sys.argv[1:]:
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall("build/site", [n for n in z.namelist() if n.startswith("include/")])
    except (OSError, zipfile.BadZipFile) as e:
        print(f"build: could not unpack the headers of {wheel}: {e}")
PY
}

# make env, bounded: a machine where nvidia-smi or the torch import hangs still builds and tests
write_env() { timeout 60 make env PYTHON="$PYTHON" >"$LOG_DIR/env.txt" 2>&1 || echo "(make env: exit $?)" >>"$LOG_DIR/env.txt"; }

# [SECONDS]: stop the build after that long; -k: a target that fails leaves the others built,
# so their tests still run. Without cuDNN or its frontend headers (.whl not carried) everything
# is built with NO_CUDNN=1 (attention by llm8's own kernels), so the rest is still tested, and
# build.log says so in its first line. NO_CUDNN=1 then stays exported for the call, and a
# cudnn_att.o that did not compile leaves build/no_cudnn, so that a later call on the warm
# machine does not spend minutes compiling it again (rm build/no_cudnn to try cuDNN again)
build_all() {
    install_wheels
    local deadline=${1:+$(($(date +%s) + $1))}
    # the seconds left before the deadline as a timeout prefix (none without a deadline; at least 1)
    limit() { [ -z "$deadline" ] && return 0; local left=$((deadline - $(date +%s))); echo "timeout $((left > 1 ? left : 1))"; }
    if [ -n "$deadline" ] && [ "$1" -le 0 ]; then
        echo "build: not run, no time left (${1} s)" | tee -a "$LOG_DIR/build.log"
        return 1
    fi
    local no_cudnn= status failed_objects=() name
    if [ "${NO_CUDNN:-}" = 1 ] || [ -f build/no_cudnn ]; then
        no_cudnn=NO_CUDNN=1
        echo "build: NO_CUDNN=1, no cuDNN attention tested ($([ -f build/no_cudnn ] && echo "build/no_cudnn: an earlier call's cudnn_att.o did not build" || echo "NO_CUDNN=1 given"))" \
            | tee -a "$LOG_DIR/build.log"
    elif ! make -s PYTHON="$PYTHON" check-cudnn >/dev/null 2>&1; then
        no_cudnn=NO_CUDNN=1
        echo "build: NO_CUDNN=1, no cuDNN attention tested ($(make -s PYTHON="$PYTHON" check-cudnn 2>&1 | head -n 1))" \
            | tee -a "$LOG_DIR/build.log"
    else
        # every binary links cudnn_att.o: headers that do not build with this cuDNN would fail them
        # all. It compiles (minutes) beside everything that does not link it, on the other cores
        $(limit) make -s PYTHON="$PYTHON" build/cudnn_att.o >build/cudnn_att.log 2>&1 &
        local cudnn_att=$!
        $(limit) make -k -j"$((JOBS > 1 ? JOBS - 1 : 1))" PYTHON="$PYTHON" cuda-objects >>"$LOG_DIR/build.log" 2>&1
        wait "$cudnn_att"
        status=$?
        cat build/cudnn_att.log >>"$LOG_DIR/build.log"
        # an object that did not compile is not compiled again for the link (make -o): its failure is in
        # build.log already, and a second try would cost its whole compile time again
        for name in train_gpt2_fp8 $(cd test && compgen -G "test_*.cu"); do
            name=${name%.cu}
            [ "$status" -ne 0 ] || [ -f "build/obj/$name.o" ] || failed_objects+=(-o "build/obj/$name.o")
        done
        if [ "$status" -eq 124 ]; then
            echo "build: stopped at its deadline (${1:-} s), in build/cudnn_att.o" | tee -a "$LOG_DIR/build.log"
            return 0
        elif [ "$status" -ne 0 ]; then
            no_cudnn=NO_CUDNN=1
            touch build/no_cudnn
            echo "build: NO_CUDNN=1, no cuDNN attention tested (build/cudnn_att.o did not build: above)" | tee -a "$LOG_DIR/build.log"
        fi
    fi
    [ -z "$no_cudnn" ] || export NO_CUDNN=1
    $(limit) make -k -j"$JOBS" PYTHON="$PYTHON" $no_cudnn "${failed_objects[@]}" train_gpt2_fp8 bench_gemm probe_epilogues bench_casts gpu-tests 2>&1 \
        | tee -a "$LOG_DIR/build.log" | tail -5
    # a target that failed leaves the others to test (make -k): the stages go on, build.log says which
    [ "${PIPESTATUS[0]}" -eq 124 ] && echo "build: stopped at its deadline (${1:-} s)" | tee -a "$LOG_DIR/build.log"
    return 0
}

# the failed make targets build.log holds (make -k went on past them)
build_errors() { grep -c -E '^make(\[[0-9]+\])?: \*\*\*' "$LOG_DIR/build.log" 2>/dev/null; }

# the env.txt section a line matching the regex $1 heads, up to the next line opening with # (the next
# program's heading): its heading and its lines matching the regex $2
env_section() {
    awk -v heading="$1" -v keep="$2" 'on && /^#/ {exit} $0 ~ heading {on = 1; print; next} on && $0 ~ keep' "$LOG_DIR/env.txt" \
        | grep .
}

# first's summary.txt: the GPU, the build's errors, the test counts and every FAIL line, probe_epilogues',
# bench_casts' and torch_attention.py's tables, the benchmark's main table
first_summary() {
    echo "== first: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"
    echo "build: $([ "$make_errors" -eq 0 ] && echo ok || echo "$make_errors make errors (build.log)")"
    grep -h -E '^build: (NO_CUDNN=1|stopped|not run|could not)' "$LOG_DIR/build.log"
    tail -n 1 "$LOG_DIR/gpu_tests.log"
    # every binary stopped, not run or skipped, then the first 20 FAIL lines and their count (a binary
    # with many FAILs must not push the stopped and not-run lines out)
    grep -E '^(!!|-- |SKIP)' "$LOG_DIR/gpu_tests.log"
    grep -E '^FAIL' "$LOG_DIR/gpu_tests.log" | head -n 20
    local fails
    fails=$(grep -c -E '^FAIL' "$LOG_DIR/gpu_tests.log")
    [ "$fails" -le 20 ] || echo "FAIL lines: $fails in all, the first 20 above (gpu_tests.log)"
    # probe_epilogues' table (env.txt), or why there is none
    env_section '^## cuBLASLt FP8 GEMMs through GELU epilogues' '^(\\| |error)' \
        || echo "probe_epilogues: no table ($(grep -h -E '^\(probe_epilogues' "$LOG_DIR/env.txt"))"
    # bench_casts' table (env.txt), or why there is none
    env_section '^## FP8 tile cast bandwidth' '^\\| ' \
        || echo "bench_casts: no table ($(grep -h -E '^\(bench_casts' "$LOG_DIR/env.txt"))"
    # PyTorch's attention kernels against llm8's (env.txt), or why there are none
    env_section '^## PyTorch scaled_dot_product_attention' '^\\| d' | tail -n +2 | sed 's/^/attention: /' | grep . \
        || echo "torch_attention.py: no table ($(grep -h -E '^(error: torch_attention|\(torch_attention)' "$LOG_DIR/env.txt" | head -n 1))"
    # the whole model's GEMMs with cuBLASLt's first algorithm against the fastest listed (env.txt)
    grep -h -E '^\| total \| all \|' "$LOG_DIR/env.txt" | sed 's/^/algorithms (precision | first ms | fastest ms): /' \
        || echo "bench_gemm --algorithms: no total rows"
    # the report's main table (one row per train run): its header up to the first blank line
    awk '/^\| model \| precision \|/ {on = 1} on && /^$/ {exit} on' "$LOG_DIR"/*-quick-d12.md 2>/dev/null
    # the FP8 over bf16 ratio of the default runs and of their repeats: the noise on every ratio above
    grep -h -E '^\| d[0-9]+ \| [0-9.]+x \| [0-9.]+x \|$' "$LOG_DIR"/*-quick-d12.md 2>/dev/null \
        | sed 's/^/FP8 over bf16 (default runs | first | repeat): /'
    grep -h -E '^\*\*Incomplete' "$LOG_DIR"/*-quick-d12.md 2>/dev/null
    echo "bench: ${bench_note:-$(tail -n 1 "$LOG_DIR/bench_d12.log")}"
    echo "seconds used: $((${FIRST_S:-420} - end + $(date +%s))) of FIRST_S=${FIRST_S:-420}"
}

# the GPU test binaries, the quick and basic ones first, so a budget cut leaves the largest
# (test_gpt2: the whole model against the CPU reference) last; any other test/test_*.cu after them
gpu_test_binaries() {
    local first=(test_cublaslt_rules test_kernels test_matmul_attention test_fp8_kernels test_adamw8_gpu
                 test_sparse_buffer test_multi_gpu test_gpt2)
    local name
    for name in "${first[@]}"; do echo "build/$name"; done
    for name in test/test_*.cu; do
        name=$(basename "$name" .cu)
        [[ " ${first[*]} " == *" $name "* ]] || echo "build/$name"
    done
}

case "$stage" in
    first)
        # one call, since a session's 15 minutes of device time hold one long call and a short one:
        # everything is cut at FIRST_S, and summary.txt (printed last) says what was and was not reached
        end=$(($(date +%s) + ${FIRST_S:-420}))
        tests_end=$((end - ${FIRST_BENCH_S:-120}))
        install_wheels
        write_env
        build_all $((tests_end - $(date +%s)))
        make_errors=$(build_errors)
        # the probes below each get their own limit, cut to what is left before the tests' deadline (a
        # build that took its whole time leaves them none: they are skipped, and the tests keep theirs)
        probe_limit() {
            local left=$((tests_end - $(date +%s)))
            [ "$left" -ge 3 ] || { echo 0; return; }
            echo $(($1 < left ? $1 : left))
        }
        # `probe SECONDS NAME COMMAND...`: COMMAND's output into env.txt, or why it did not run or finished badly
        probe() {
            local seconds name=$2
            seconds=$(probe_limit "$1")
            shift 2
            echo >>"$LOG_DIR/env.txt"
            if [ "$seconds" -eq 0 ]; then
                echo "($name: not run, under 3 s left before the tests' deadline)" >>"$LOG_DIR/env.txt"
                return
            fi
            timeout --kill-after=5 "$seconds" "$@" >>"$LOG_DIR/env.txt" 2>&1 || echo "($name: exit $?)" >>"$LOG_DIR/env.txt"
        }
        # which FP8 GELU epilogues (FP8 outputs, bf16 with amax) cuBLASLt has (a second or two): into env.txt, the machine's facts
        probe 30 probe_epilogues ./probe_epilogues
        # the tile cast's parts timed apart at d12's shapes (a few seconds): what bounds the FP8 casts
        probe 60 bench_casts ./bench_casts
        # how far cuBLASLt's first algorithm, training's, is from the fastest it lists for d12's GEMMs (about 10 s):
        # bench_gemm's --algorithms table only, into env.txt
        seconds=$(probe_limit 90)
        if [ "$seconds" -eq 0 ]; then
            echo "(bench_gemm --algorithms: not run, under 3 s left before the tests' deadline)" >>"$LOG_DIR/env.txt"
        else
            timeout --kill-after=5 "$seconds" ./bench_gemm --models d12 --iters 3 --warmup 1 --algorithms 8 \
                >build/bench_gemm_algorithms.txt 2>&1 \
                || tail -n 3 build/bench_gemm_algorithms.txt | sed "s/^/(bench_gemm --algorithms: exit $?) /" >>"$LOG_DIR/env.txt"
            { echo; awk '/^#### /{on = 1} on' build/bench_gemm_algorithms.txt; } >>"$LOG_DIR/env.txt"
        fi
        # PyTorch's attention kernels at d12's and d48's shapes beside llm8's rows of the newest committed d12
        # benchmark (seconds): is cuDNN's backward, the step's largest gap to its floor, the best this GPU has
        probe 60 torch_attention.py "$PYTHON" dev/bench/torch_attention.py --models d12,d48 \
            --bench "$(compgen -G 'doc/benchmarks/*-quick-d12.json' | sort | tail -n 1)"
        mapfile -t tests < <(gpu_test_binaries)
        # the 2-rank test needs NCCL 2.30+, which only the ranks stage installs: here its SKIP line shows in summary.txt
        LLM8_ALLOW_NO_TWO_RANKS=1 TEST_DEADLINE=$tests_end PYTHON="$PYTHON" bash test/run_gpu_tests.sh "${tests[@]}" 2>&1 \
            | tee "$LOG_DIR/gpu_tests.log"
        # bench_d12.log only once the benchmark runs: a device call returns at most 8 files, and the
        # summary says why when it did not
        bench_note="not run yet: the benchmark comes after the tests"
        first_summary >"$LOG_DIR/summary.txt"  # a call cut off in the benchmark still says how the tests went
        left=$((end - $(date +%s)))
        [ "$left" -lt 0 ] && left=0  # an overrun leaves nothing, not a negative time
        if [ "$left" -ge 20 ]; then
            bench_note=
            "$PYTHON" dev/bench/bench.py --quick --only d12 --time-limit "$left" --out "$LOG_DIR" 2>&1 | tee "$LOG_DIR/bench_d12.log"
        else
            bench_note="not run: ${left} s left of FIRST_S"
        fi
        first_summary | tee "$LOG_DIR/summary.txt"
        ;;
    rerun)
        # a session's second call after a test binary failed in first: the build brought up to date
        # (a no-op on the warm machine, the whole build on a fresh one), then that binary alone, its
        # whole output in rerun_NAME.log; TEST_TIMEOUT_S bounds it (set it under what status has left)
        name=${2:?usage: dev/gpu_session.sh rerun NAME (a test binary, e.g. test_gpt2)}
        name=${name#build/}
        build_all ${BUILD_S:-} || true  # a failed target leaves the others: this one may still be built
        # a target that did not rebuild leaves its old binary: say so before its results
        errors=$(build_errors)
        [ "${errors:-0}" -eq 0 ] || echo "build: ${errors} make errors (build.log): build/$name may be older than the sources"
        [ -x "build/$name" ] || { echo "error: dev/gpu_session.sh: build/$name was not built (build.log)" | tee "$LOG_DIR/rerun_$name.log" >&2; exit 1; }
        LLM8_ALLOW_NO_TWO_RANKS=1 PYTHON="$PYTHON" bash test/run_gpu_tests.sh "build/$name" >"$LOG_DIR/rerun_$name.log" 2>&1
        status=$?
        grep -E "^($name|FAIL|!!|SKIP)" "$LOG_DIR/rerun_$name.log" | tail -n 40
        exit "$status"
        ;;
    build)
        install_wheels
        write_env
        cat "$LOG_DIR/env.txt"
        time build_all
        ;;
    tests)
        # the runner, not make gpucheck-tests: make would compile a target that failed in the build
        # again, fail again, and run no test at all
        build_all ${BUILD_S:-} || exit 1
        mapfile -t tests < <(gpu_test_binaries)
        time LLM8_ALLOW_NO_TWO_RANKS=1 PYTHON="$PYTHON" bash test/run_gpu_tests.sh "${tests[@]}" 2>&1 | tee "$LOG_DIR/gpu_tests.log"
        ;;
    ranks)
        # the cut NCCL only here, never in first: the binaries first built load it from the venv without a relink
        shift
        # (on a machine with a GPU only: elsewhere it would go into that machine's own Python)
        if compgen -G ".nccl/sm90/*.whl" >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
            bash dev/nccl_wheel.sh install 2>&1 | tee "$LOG_DIR/nccl_install.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
        fi
        build_all ${BUILD_S:-} || exit 1
        # NCCL's warnings from every rank: the trainer sends the stdout of ranks above 0 to /dev/null, where NCCL
        # would log; one file a process here, joined into nccl_warnings.log when the stage ends (none: no file)
        rm -rf build/nccl-debug && mkdir -p build/nccl-debug
        export NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_DEBUG_FILE="$PWD/build/nccl-debug/nccl.%h.%p"
        trap 'collect_nccl_warnings' EXIT
        ranks_end=${RANKS_S:+$(($(date +%s) + RANKS_S))}
        TEST_DEADLINE=$ranks_end PYTHON="$PYTHON" bash test/run_gpu_tests.sh build/test_multi_gpu 2>&1 | tee "$LOG_DIR/test_multi_gpu.log"
        multi_gpu_status=${PIPESTATUS[0]}
        left=${ranks_end:+$((ranks_end - $(date +%s)))}
        if [ -n "$left" ] && [ "$left" -le 0 ]; then
            echo "not run: test/gpu_trainer_ranks.py (RANKS_S=$RANKS_S reached)" | tee "$LOG_DIR/gpu_trainer_ranks${1:+_$1}.log"
            exit 1
        fi
        # the runner, not make gpucheck-ranks (which would first compile a target that failed in the build)
        time ${left:+timeout "$left"} env PYTHON="$PYTHON" bash test/run_gpu_tests.sh --ranks "$@" 2>&1 \
            | tee "$LOG_DIR/gpu_trainer_ranks${1:+_$1}.log"
        ranks_status=${PIPESTATUS[0]}
        [ "$multi_gpu_status" -eq 0 ] && [ "$ranks_status" -eq 0 ]
        ;;
    bench)
        # straight into the logs: bench.py rewrites its .md and .json after every run, so a call cut
        # off at its limit still returns what was measured (commit them under doc/benchmarks/)
        # (bench.py itself, not make bench, which would first compile a target that failed in the
        # build); BENCH_S bounds it, the build included, so that it ends inside the call
        # the models: words or a comma list (bench d12 d48, bench d12,d48), one --only list; the log's name
        # joins them with _ (the device tool returns no file whose name holds a comma)
        models=$(IFS=,; echo "${*:2}")
        only=${models:+--only $models}
        bench_end=${BENCH_S:+$(($(date +%s) + BENCH_S))}
        build_all ${BENCH_S:+$((BENCH_S / 2))} || exit 1
        left=${bench_end:+$((bench_end - $(date +%s)))}
        time "$PYTHON" dev/bench/bench.py --quick $only --out "$LOG_DIR" ${left:+--time-limit "$left"} 2>&1 \
            | tee "$LOG_DIR/bench${models:+_${models//,/_}}.log"
        ;;
    parity)
        # PARITY_* override the run for a dry run without a GPU (test/test_scripts.py: the CPU trainer)
        trainer=${PARITY_TRAINER:-./train_gpt2_fp8}
        train=${PARITY_TRAIN:-dev/data/offline/offline_train_*.bin}
        val=${PARITY_VAL:-dev/data/offline/offline_val_*.bin}
        out=${PARITY_OUT:-build/parity}
        if ! compgen -G "$train" >/dev/null || ! compgen -G "$val" >/dev/null; then
            echo "error: dev/gpu_session.sh: parity needs the offline corpus ($train, $val): carry dev/data/offline (bash dev/data/prepare_default.sh makes it)" >&2
            exit 1
        fi
        # (set, RECIPES, OPTIMIZERS): each set trains bf16 and FP8 delayed (resumed when an earlier set
        # trained them) and adds its own runs; -fg delayed and -fg pow2 (candidate defaults, not yet
        # measured) come last, so a call cut off short of them has still finished the sets before them,
        # summaries written. fastest asks in one set of three runs what lm_head and fg_delayed ask in
        # two of five: whether the two candidate defaults together keep bf16's loss
        sets=("optimizers|delayed|adamw adamw8" "lm_head|delayed delayed+lm_head|adamw"
              "fg_delayed|delayed delayed+fg_delayed delayed+fg_pow2|adamw" "fastest|delayed delayed+lm_head+fg_delayed|adamw"
              "fc_codes|delayed delayed+fc_codes|adamw")
        set_names=" optimizers lm_head fg_delayed fastest fc_codes "
        shift
        for name in "$@"; do
            [[ "$set_names" == *" $name "* ]] \
                || { echo "error: dev/gpu_session.sh: parity set '$name' (expected some of:${set_names% })" >&2; exit 2; }
        done
        # PARITY_S bounds the stage, the build included: the set running then is stopped (its runs
        # resume from their last checkpoint in a later call on the warm machine), and the logs of
        # what ran still come back
        parity_end=${PARITY_S:+$(($(date +%s) + PARITY_S))}
        [ -n "${PARITY_TRAINER:-}" ] || build_all ${PARITY_S:+$((PARITY_S / 2))} || exit 1
        read -r -a extra <<< "${PARITY_ARGS:-}"
        status=0
        for set in "${sets[@]}"; do
            IFS='|' read -r name recipes optimizers <<< "$set"
            [ "$#" -eq 0 ] || [[ " $* " == *" $name "* ]] || continue
            left=${parity_end:+$((parity_end - $(date +%s)))}
            if [ -n "$left" ] && [ "$left" -le 0 ]; then
                echo "parity: set $name not run (PARITY_S=$PARITY_S reached)" | tee -a "$LOG_DIR/parity.log"
                status=1
                break
            fi
            time ${left:+timeout "$left"} env OUT="$out" MODEL="${PARITY_MODEL:-d12}" STEPS="${PARITY_STEPS:-2000}" \
                RECIPES="$recipes" OPTIMIZERS="$optimizers" LLM8_TRAINER="$trainer" PYTHON="$PYTHON" \
                bash scripts/compare_bf16_fp8.sh -i "$train" -j "$val" "${extra[@]}" 2>&1 | tee -a "$LOG_DIR/parity.log"
            rc=${PIPESTATUS[0]}
            [ "$rc" -ne 124 ] || echo "parity: set $name stopped at PARITY_S=$PARITY_S" | tee -a "$LOG_DIR/parity.log"
            [ "$rc" -eq 0 ] || { status=1; break; }
            cp "$out/summary.md" "$LOG_DIR/summary_$name.md"
            cp "$out/loss.png" "$out/loss_$name.png" 2>/dev/null
        done
        # every run's main.log and every set's plot in one file: a device call returns at most 8 files
        (cd "$out" && compgen -G "*/main.log" >/dev/null && tar -czf "$LOG_DIR/parity_main_logs.tar.gz" ./*/main.log \
            $(compgen -G "./loss_*.png"))
        exit "$status"
        ;;
    profile)
        # Nsight Compute's counters of llm8's own kernels in d12's step, the FP8 default run and bf16's
        # (dev/bench/ncu_profile.py: profile.md, ncu_<run>.csv.gz); PROFILE_S bounds it, the build included
        profile_end=${PROFILE_S:+$(($(date +%s) + PROFILE_S))}
        build_all ${PROFILE_S:+$((PROFILE_S / 2))} || exit 1
        left=${profile_end:+$((profile_end - $(date +%s)))}
        if [ -n "$left" ] && [ "$left" -lt 10 ]; then
            echo "profile: not run, ${left} s left of PROFILE_S=$PROFILE_S after the build" | tee "$LOG_DIR/profile.log"
            exit 1
        fi
        time "$PYTHON" dev/bench/ncu_profile.py --out "$LOG_DIR" ${left:+--time-limit "$left"} "${@:2}" 2>&1 \
            | tee "$LOG_DIR/profile.log"
        ;;
    sanitize)
        # memcheck slows kernels 10-100x: each binary gets at most SANITIZE_S seconds (a timeout
        # shows as exit 124 in the log, not as a failure of the code)
        sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        [ -x "$sanitizer" ] || { echo "error: dev/gpu_session.sh: compute-sanitizer not found" >&2; exit 1; }
        build_all || exit 1
        status=0
        for t in build/test_kernels build/test_fp8_kernels build/test_adamw8_gpu build/test_matmul_attention; do
            echo "== $sanitizer --tool memcheck $t" | tee -a "$LOG_DIR/sanitize.log"
            timeout "${SANITIZE_S:-140}" "$sanitizer" --tool memcheck --error-exitcode 99 "$t" >>"$LOG_DIR/sanitize.log" 2>&1
            rc=$?
            echo "$t: exit $rc" | tee -a "$LOG_DIR/sanitize.log"
            [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status=1
        done
        exit $status
        ;;
    *)
        echo "error: dev/gpu_session.sh: stage '$stage' (expected first, rerun, build, tests, ranks, bench, parity, profile or sanitize)" >&2
        exit 2
        ;;
esac
