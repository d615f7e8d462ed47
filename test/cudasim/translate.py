#!/usr/bin/env python3
"""translate.py: rewrites CUDA sources into C++ that compiles against cudasim.h.

Three rewrites, nothing else (the kernels must run as written):
  kernel<T><<<grid, block, shared, stream>>>(args)
      -> cudasim::launch(cudasim::LaunchConfig(grid, block, shared, stream), kernel<T>, "kernel<T>")(args)
  extern __shared__ [__align__(n)] T name[];
      -> T* name = reinterpret_cast<T*>(cudasim::dynamic_shared_memory());
  reinterpret_cast<To>(x)
      -> cudasim::checked_reinterpret_cast<To>(x)   (a misaligned vector access faults, cudasim.h)

Usage: translate.py OUT_DIR FILE...   (each FILE is written to OUT_DIR/FILE, same relative
path, so #include "llmc/x.cuh" finds the translated copy when OUT_DIR is first on -I)
"""
import os
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
REINTERPRET_CAST = re.compile(r"\breinterpret_cast\s*<")
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:<>]+(?:\s+[\w:<>]+)*?)\s+(\w+)\s*\[\s*\]\s*;")


def translate(text):
    text = LAUNCH.sub(lambda m: f'cudasim::launch(cudasim::LaunchConfig({m.group(2)}), {m.group(1)}, "{m.group(1)}")(', text)
    text = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(cudasim::dynamic_shared_memory());",
        text)
    text = REINTERPRET_CAST.sub("cudasim::checked_reinterpret_cast<", text)
    if "<<<" in text:
        raise SystemExit("translate.py: a kernel launch the rewrite does not recognise is left")
    return text


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: translate.py OUT_DIR FILE...")
    out_dir = sys.argv[1]
    for path in sys.argv[2:]:
        with open(path) as f:
            text = f.read()
        try:
            translated = translate(text)
        except SystemExit as e:
            raise SystemExit(f"{path}: {e}")
        target = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        old = None
        if os.path.exists(target):
            with open(target) as f:
                old = f.read()
        if old != translated:  # keep timestamps of unchanged files, so make rebuilds less
            with open(target, "w") as f:
                f.write(translated)


if __name__ == "__main__":
    main()
