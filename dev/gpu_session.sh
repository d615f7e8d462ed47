#!/usr/bin/env bash
# make gpucheck in stages that each fit one call of the device tool (10 minutes at most a
# call, 30 minutes a session; the machine goes back 30 s after a call, and a fresh one starts
# bare, so run the stages back to back). Each stage first brings the build up to date (make
# is incremental: a no-op on a warm machine, the whole build on a fresh one), then logs to
# $LOG_DIR ($OUT when the device tool runs it, so the logs come back; else build/gpu-logs).
#
#   bash dev/gpu_session.sh build   # make env, the cuDNN frontend from .whl/, every GPU target
#   bash dev/gpu_session.sh tests   # the GPU test binaries (test/run_gpu_tests.sh without the ranks)
#   bash dev/gpu_session.sh ranks [SECTIONS]  # test/gpu_trainer_ranks.py: 2 ranks on the one GPU (all
#                                   # sections, or those named: trajectories resume reshard twins killed)
#   bash dev/gpu_session.sh bench [MODELS]  # dev/bench/bench.py --quick (--only MODELS, e.g. d12 then d48
#                                   # in two calls), its .md and .json written into the logs
#   bash dev/gpu_session.sh parity  # loss parity on the offline corpus (carry dev/data/offline):
#                                   # d12, PARITY_STEPS (2000) steps each of bf16, bf16 + adamw8,
#                                   # FP8 delayed, FP8 delayed + adamw8, then FP8 delayed with an
#                                   # FP8 lm_head, then FP8 delayed with -fg delayed
#                                   # (scripts/compare_bf16_fp8.sh, three times: summary_*.md);
#                                   # runs resume from their checkpoints, so a call that runs out
#                                   # of time goes on in the next one on the same (warm) machine
#   bash dev/gpu_session.sh sanitize  # compute-sanitizer memcheck over the kernel test binaries
#                                     # (out-of-bounds and misaligned device accesses; a spare call)
#
# The cuDNN frontend headers: if the machine has none, carry the nvidia-cudnn-frontend wheel in
# .whl/ (doc/gpu-environment.md says how to fetch it); it is unpacked into build/site, where the
# Makefile looks. Python: the machine's torch venv when it has one (the Makefile finds pip's
# cuDNN and NCCL through its site-packages).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
LOG_DIR=${OUT:-build/gpu-logs}
mkdir -p "$LOG_DIR" build
PYTHON=${PYTHON:-python3}
[ -x /opt/torch/.venv/bin/python3 ] && PYTHON=/opt/torch/.venv/bin/python3
export PYTHON PYTHONUNBUFFERED=1
JOBS=$(nproc)

# the carried wheels (the cuDNN frontend headers) into build/site, once, before anything builds
install_wheels() {
    if compgen -G ".whl/*.whl" >/dev/null && [ ! -f build/site/include/cudnn_frontend.h ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target build/site .whl/*.whl \
            || { echo "error: dev/gpu_session.sh: could not install the wheels in .whl/ into build/site" >&2; exit 1; }
    fi
}

build_all() {
    install_wheels
    make -j"$JOBS" PYTHON="$PYTHON" train_gpt2_fp8 bench_gemm gpu-tests 2>&1 | tee -a "$LOG_DIR/build.log" | tail -5
}

case "$stage" in
    build)
        install_wheels
        make env PYTHON="$PYTHON" 2>&1 | tee "$LOG_DIR/env.txt"
        time build_all
        ;;
    tests)
        build_all && time make PYTHON="$PYTHON" gpucheck-tests 2>&1 | tee "$LOG_DIR/gpu_tests.log"
        ;;
    ranks)
        shift
        build_all && time make PYTHON="$PYTHON" gpucheck-ranks RANKS_SECTIONS="$*" 2>&1 | tee "$LOG_DIR/gpu_trainer_ranks${1:+_$1}.log"
        ;;
    bench)
        # straight into the logs: bench.py rewrites its .md and .json after every run, so a call cut
        # off at its limit still returns what was measured (commit them under doc/benchmarks/)
        only=${2:+--only $2}
        build_all && time make PYTHON="$PYTHON" bench BENCH_ARGS="--quick $only --out $LOG_DIR" 2>&1 | tee "$LOG_DIR/bench${2:+_$2}.log"
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
        [ -n "${PARITY_TRAINER:-}" ] || build_all || exit 1
        read -r -a extra <<< "${PARITY_ARGS:-}"
        # (set, RECIPES, OPTIMIZERS): the later sets resume the first's finished bf16 and FP8 runs and
        # add one run each; -fg delayed (a candidate default, not yet measured) comes last, so a
        # session cut off short of it has still finished the sets before it, summaries written
        status=0
        for set in "optimizers|delayed|adamw adamw8" "lm_head|delayed delayed+lm_head|adamw" \
                   "fg_delayed|delayed delayed+fg_delayed|adamw"; do
            IFS='|' read -r name recipes optimizers <<< "$set"
            time env OUT="$out" MODEL="${PARITY_MODEL:-d12}" STEPS="${PARITY_STEPS:-2000}" RECIPES="$recipes" \
                OPTIMIZERS="$optimizers" LLM8_TRAINER="$trainer" PYTHON="$PYTHON" \
                bash scripts/compare_bf16_fp8.sh -i "$train" -j "$val" "${extra[@]}" 2>&1 | tee -a "$LOG_DIR/parity.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; break; }
            cp "$out/summary.md" "$LOG_DIR/summary_$name.md"
            cp "$out/loss.png" "$LOG_DIR/loss_$name.png"
        done
        for run in "$out"/*/; do cp "$run/main.log" "$LOG_DIR/parity_$(basename "$run").log" 2>/dev/null; done
        exit "$status"
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
        echo "error: dev/gpu_session.sh: stage '$stage' (expected build, tests, ranks, bench, parity or sanitize)" >&2
        exit 2
        ;;
esac
