#!/usr/bin/env bash
# Here, before a GPU session's first device call: makes ready the ignored paths that the calls
# of dev/gpu_session.sh carry, since the device machine cannot download, and checks that each
# call's carry fits the device tool's 64 MiB. These paths are not in git, and the machine
# without the GPU can come back without them (it did on 2026-11-29): a call that carries a
# missing path runs without it, and `first` then builds with NO_CUDNN=1 and benchmarks the
# wrong attention.
#
#   bash dev/gpu_prepare.sh             # all three, each only when missing
#   bash dev/gpu_prepare.sh whl data    # some of them: whl, nccl, data
# A part that fails is named in a last error line (exit 1) after the others are made and the
# carry report printed.
#
#   .whl/              the nvidia-cudnn-frontend wheel: cuDNN attention's headers (every call)
#   .nccl/sm90/        NCCL 2.30 or later cut to sm_90 (dev/nccl_wheel.sh sm90; the ranks stage)
#   dev/data/offline/  the offline corpus (dev/data/prepare_default.sh; the parity stage)
#
# Last it prints each call's carry list with its size: the working tree that travels (git's
# tracked and untracked-not-ignored files) plus the carried paths; over 64 MiB it exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CARRY_LIMIT_MIB=64

die() { echo "error: dev/gpu_prepare.sh: $*" >&2; exit 1; }

# the device machine's Python is 3.12 (doc/gpu-environment.md); the frontend wheel is per version.
# The version is the one installed here, which this machine's build (CI's) compiles llmc/cudnn_att.cpp
# against: a newer release out since would first be compiled on the device, and its failure costs
# the call's cuDNN attention (NO_CUDNN=1)
fetch_cudnn_frontend() {
    if compgen -G ".whl/nvidia_cudnn_frontend-*.whl" >/dev/null; then
        echo "whl: $(ls .whl/nvidia_cudnn_frontend-*.whl) is there"
        return
    fi
    git check-ignore -q .whl/x.whl || die ".whl/ is not ignored by git (.gitignore): it would travel with every call"
    local version
    version=$({ "$PYTHON" -m pip show nvidia-cudnn-frontend 2>/dev/null || true; } | awk '/^Version:/ {print $2}')
    [ -n "$version" ] || die "nvidia-cudnn-frontend is not installed here (bash scripts/setup_python.sh): its version is the one to carry"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        -d .whl "nvidia-cudnn-frontend==$version" || die "could not download nvidia-cudnn-frontend $version into .whl/"
    compgen -G ".whl/nvidia_cudnn_frontend-*.whl" >/dev/null || die "pip left no nvidia_cudnn_frontend wheel in .whl/"
    echo "whl: fetched $(ls .whl/nvidia_cudnn_frontend-*.whl)"
}

prepare_nccl() {
    if compgen -G ".nccl/sm90/*.whl" >/dev/null; then
        echo "nccl: $(ls .nccl/sm90/*.whl) is there"
        return
    fi
    bash dev/nccl_wheel.sh sm90
}

# the corpus is tokenized with GPT-2's BPE, whose rank file setup_python.sh fetches (git-ignored too)
prepare_data() {
    [ -f dev/data/cache/gpt2.tiktoken ] || bash scripts/setup_python.sh
    bash dev/data/prepare_default.sh
}

parts=("$@")
[ "${#parts[@]}" -gt 0 ] || parts=(whl nccl data)
for part in "${parts[@]}"; do
    case "$part" in
        whl|nccl|data) ;;
        *) die "unknown part '$part' (expected some of: whl nccl data)" ;;
    esac
done
# each part in a subshell of its own (errexit on inside it): one that fails (a download cut off) is named
# and the others are still made, since each serves other calls, and the carry report still comes
failed=()
for part in "${parts[@]}"; do
    set +e
    (
        set -e
        case "$part" in
            whl) fetch_cudnn_frontend ;;
            nccl) prepare_nccl ;;
            data) prepare_data ;;
        esac
    )
    status=$?
    set -e
    [ "$status" -eq 0 ] || failed+=("$part")
done

# each call's carry and what travels with it, in bytes as the files are (a path of a part asked
# for that is still missing: an error)
report_status=0
"$PYTHON" - "$CARRY_LIMIT_MIB" "${parts[@]}" <<'PY' || report_status=$?
import os, subprocess, sys
limit_mib, asked = int(sys.argv[1]), set(sys.argv[2:])
tree = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                      check=True, capture_output=True).stdout.split(b"\0")
tree_bytes = sum(os.path.getsize(p) for p in tree if p and os.path.isfile(p))

def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)

part_of = {".whl": "whl", ".nccl/sm90": "nccl", "dev/data/offline": "data"}
calls = [("first, rerun, build, tests, bench, profile, sanitize", [".whl"]),
         ("ranks", [".whl", ".nccl/sm90"]),
         ("parity", [".whl", "dev/data/offline"])]
mib = 1 << 20
print(f"the working tree: {tree_bytes / mib:.1f} MiB")
status = 0
for stages, carry in calls:
    missing = [p for p in carry if not os.path.exists(p)]
    carry_list = "[" + ", ".join(f'"{p}"' for p in carry) + "]"
    if missing:
        # a path of a part not asked for is not an error: that call is just not ready yet
        print(f"{stages}: carry {carry_list}: {', '.join(missing)} missing "
              f"(bash dev/gpu_prepare.sh {' '.join(part_of[p] for p in missing)} makes it)")
        status |= any(part_of[p] in asked for p in missing)
        continue
    total = tree_bytes + sum(size(p) for p in carry)
    verdict = "fits" if total <= limit_mib * mib else f"OVER the device tool's {limit_mib} MiB"
    print(f"{stages}: carry {carry_list}: {total / mib:.1f} MiB with the tree, {verdict}")
    if total > limit_mib * mib:
        status = 1
sys.exit(status)
PY
[ "${#failed[@]}" -eq 0 ] || die "${failed[*]} failed (above); the other parts were made"
exit "$report_status"
