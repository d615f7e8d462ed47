#!/usr/bin/env bash
# NCCL 2.30 or later for the device machine. Its image has NCCL 2.28, which cannot put two
# ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1 needs 2.30), so issue 5's multi-rank GPU tests
# cannot run there; and the machine cannot download. The nvidia-nccl-cu13 wheel (2.32.3: 291 MiB)
# is over one device call's 64 MiB. Cut to the device code Hopper runs (dev/nccl_sm90.py) it is
# 35 MiB and travels in the call that uses it; whole, it travels in pieces, one per call, back
# to back on a warm machine (the ignored files a call carried stay there for the next while the
# machine is held, 30 s after a call): the way to take if the cut library fails on the GPU.
#
#   bash dev/nccl_wheel.sh sm90      # here: fetch the wheel into .nccl/whole/, cut it into
#                                    # .nccl/sm90/ and print the device call that carries it
#   bash dev/nccl_wheel.sh install   # there: pip-install the wheel in .nccl/sm90/ into $PYTHON's
#                                    # environment (the torch venv when the machine has one), where
#                                    # the Makefile finds pip's NCCL and the built binaries' rpath
#                                    # points; prints the NCCL version it installed
#   bash dev/nccl_wheel.sh split     # here: fetch the wheel, cut the whole of it into .nccl/part_NN
#                                    # of PIECE_MIB (56) MiB and .nccl/SHA256, and print the calls
#   bash dev/nccl_wheel.sh join      # there, once every part is in .nccl/ (the last call): check the
#                                    # pieces against SHA256, then pip-install the whole wheel
#
# The calls (doc/gpu-environment.md): `RANKS_S=... bash dev/gpu_session.sh ranks` carrying .nccl/sm90
# and .whl (the stage runs install first); or `true` with carry [".nccl/part_00",
# ".nccl/SHA256"], then `true` with each next part, then `bash dev/nccl_wheel.sh join && ...`
# with the last part and .whl.
set -euo pipefail
cd "$(dirname "$0")/.."
PIECES_DIR=.nccl
PIECE_MIB=${PIECE_MIB:-56}
REQUIREMENT=${NCCL_REQUIREMENT:-nvidia-nccl-cu13>=2.30}
PYTHON=${PYTHON:-python3}
[ -x /opt/torch/.venv/bin/python3 ] && PYTHON=/opt/torch/.venv/bin/python3

die() { echo "error: dev/nccl_wheel.sh: $*" >&2; exit 1; }

# the wheel for the device machine's Python (3.12, x86-64) into .nccl/whole/; prints its path. The
# other forms in .nccl/ stay: sm90 and split each replace only their own
fetch_wheel() {
    git check-ignore -q "$PIECES_DIR/part_00" || die "$PIECES_DIR/ is not ignored by git (.gitignore): what it holds would travel with every call"
    rm -rf "$PIECES_DIR/whole"
    mkdir -p "$PIECES_DIR/whole"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$PIECES_DIR/whole" "$REQUIREMENT" >&2 \
        || die "could not download $REQUIREMENT"
    ls "$PIECES_DIR"/whole/*.whl
}

install_wheel() {
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --upgrade "$1" \
        || die "pip could not install $(basename "$1") into $PYTHON's environment"
    "$PYTHON" -c 'import importlib.metadata as m; print("installed nvidia-nccl-cu13", m.version("nvidia-nccl-cu13"))'
}

cut_to_sm90() {
    local wheel
    wheel=$(fetch_wheel)
    rm -rf "$PIECES_DIR/sm90"
    "$PYTHON" dev/nccl_sm90.py "$wheel" "$PIECES_DIR/sm90" || exit 1
    rm -rf "$PIECES_DIR/whole"
    echo "one device call: carry [\"$PIECES_DIR/sm90\", \".whl\"], command: RANKS_S=... bash dev/gpu_session.sh ranks (it installs the wheel first)"
}

split_wheel() {
    local wheel
    wheel=$(fetch_wheel)
    rm -f "$PIECES_DIR"/part_* "$PIECES_DIR/SHA256"
    split -b "${PIECE_MIB}M" -d -a 2 "$wheel" "$PIECES_DIR/part_"
    (cd "$PIECES_DIR/whole" && sha256sum "$(basename "$wheel")") > "$PIECES_DIR/SHA256"
    local parts=("$PIECES_DIR"/part_*)
    echo "$(basename "$wheel"): ${#parts[@]} pieces of at most $PIECE_MIB MiB; one device call each, back to back:"
    for i in "${!parts[@]}"; do
        local carry="\"${parts[$i]}\""
        [ "$i" -eq 0 ] && carry="$carry, \"$PIECES_DIR/SHA256\""
        if [ "$i" -eq $((${#parts[@]} - 1)) ]; then
            echo "  call $((i + 1)): carry [$carry, \".whl\"], command: bash dev/nccl_wheel.sh join && ..."
        else
            echo "  call $((i + 1)): carry [$carry], command: true"
        fi
    done
}

join_wheel() {
    [ -f "$PIECES_DIR/SHA256" ] || die "$PIECES_DIR/SHA256 is missing: carry it with the first piece"
    local name expected actual
    read -r expected name < "$PIECES_DIR/SHA256"
    compgen -G "$PIECES_DIR/part_*" >/dev/null || die "no pieces in $PIECES_DIR/"
    mkdir -p "$PIECES_DIR/whole"
    cat "$PIECES_DIR"/part_* > "$PIECES_DIR/whole/$name"
    actual=$(sha256sum "$PIECES_DIR/whole/$name" | cut -d' ' -f1)
    if [ "$actual" != "$expected" ]; then
        die "the pieces in $PIECES_DIR/ ($(ls "$PIECES_DIR" | grep -c '^part_') of them) join to sha256 $actual, expected $expected for $name: a piece is missing (the machine was given back between calls?) or truncated"
    fi
    install_wheel "$PIECES_DIR/whole/$name"
}

install_cut_wheel() {
    local wheels=("$PIECES_DIR"/sm90/*.whl)
    [ -f "${wheels[0]}" ] || die "no wheel in $PIECES_DIR/sm90/: make it here with 'bash dev/nccl_wheel.sh sm90' and carry $PIECES_DIR/sm90"
    [ "${#wheels[@]}" -eq 1 ] || die "${#wheels[@]} wheels in $PIECES_DIR/sm90/, expected one"
    install_wheel "${wheels[0]}"
}

case "${1:-}" in
    sm90) cut_to_sm90 ;;
    install) install_cut_wheel ;;
    split) split_wheel ;;
    join) join_wheel ;;
    *) die "usage: bash dev/nccl_wheel.sh sm90|install|split|join" ;;
esac
