#!/usr/bin/env python3
"""translate.py: rewrites CUDA sources into C++ that compiles against cudasim.h.

Four rewrites, nothing else (the kernels must run as written):
  kernel<T><<<grid, block, shared, stream>>>(args)
      -> cudasim::launch(cudasim::LaunchConfig(grid, block, shared, stream), kernel<T>, "kernel<T>")(args)
     and, for a kernel declared __launch_bounds__(N, ...) in any of the files translated together,
     LaunchConfig(...).bounded(N): a launch with more threads per block fails, as on a GPU
  extern __shared__ [__align__(n)] T name[];
      -> T* name = reinterpret_cast<T*>(cudasim::dynamic_shared_memory());
  reinterpret_cast<To>(x)
      -> cudasim::checked_reinterpret_cast<To>(x)   (a misaligned vector access faults, cudasim.h)
  __shared__ T name[...];   (static shared memory, a declaration of one line)
      -> __shared__ T name[...]; CUDASIM_FRESH_SHARED(name);   (garbage at each block's start)

Usage: translate.py OUT_DIR FILE...   (each FILE is written to OUT_DIR/FILE, same relative
path, so #include "llmc/x.cuh" finds the translated copy when OUT_DIR is first on -I)
"""
import os
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
REINTERPRET_CAST = re.compile(r"\breinterpret_cast\s*<")
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:<>]+(?:\s+[\w:<>]+)*?)\s+(\w+)\s*\[\s*\]\s*;")


STATIC_SHARED = re.compile(r"^([ \t]*__shared__\s+[^;{}()]*?\b(\w+)\s*(?:\[[^\];]*\]\s*)*;)", re.M)


LAUNCH_BOUNDS = re.compile(r"^[ \t]*(?:template\s*<[^>]*>\s*)?__global__\s+(?:void\s+)?__launch_bounds__\s*\(", re.M)
KERNEL_NAME = re.compile(r"(?:\s|//[^\n]*|/\*.*?\*/)*(?:void\s+)?(\w+)\s*\(", re.S)  # comments may come between


def closing_paren(text, open_index):
    """the index of the ')' that closes the '(' at open_index"""
    depth = 0
    for i in range(open_index, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise SystemExit("translate.py: unbalanced parentheses after __launch_bounds__")


def first_argument(arguments):
    depth = 0
    for i, ch in enumerate(arguments):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return arguments[:i].strip()
    return arguments.strip()


def launch_bounds(text):
    """{kernel name: its __launch_bounds__ max threads expression} of the kernels declared in text"""
    bounds = {}
    for m in LAUNCH_BOUNDS.finditer(text):
        close = closing_paren(text, m.end() - 1)
        name = KERNEL_NAME.match(text, close + 1)
        if name is None:
            line = text.count("\n", 0, m.start()) + 1
            raise SystemExit(f"translate.py: no kernel name after the __launch_bounds__ of line {line}: {text[m.start():close + 1].strip()}")
        bounds[name.group(1)] = first_argument(text[m.end():close])
    return bounds


def translate(text, bounds=None):
    bounds = bounds if bounds is not None else launch_bounds(text)

    def launch(m):
        config = f"cudasim::LaunchConfig({m.group(2)})"
        kernel = re.match(r"\w+", m.group(1)).group(0)
        if kernel in bounds:
            config += f".bounded({bounds[kernel]})"
        return f'cudasim::launch({config}, {m.group(1)}, "{m.group(1)}")('

    text = LAUNCH.sub(launch, text)
    text = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(cudasim::dynamic_shared_memory());",
        text)
    text = STATIC_SHARED.sub(lambda m: f"{m.group(1)} CUDASIM_FRESH_SHARED({m.group(2)});", text)
    if re.search(r"^[ \t]*__shared__\b(?!.*CUDASIM_FRESH_SHARED)", text, re.M):
        raise SystemExit("translate.py: a static __shared__ declaration the rewrite does not recognise is left")
    text = REINTERPRET_CAST.sub("cudasim::checked_reinterpret_cast<", text)
    if "<<<" in text:
        raise SystemExit("translate.py: a kernel launch the rewrite does not recognise is left")
    return text


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: translate.py OUT_DIR FILE...")
    out_dir = sys.argv[1]
    texts = {}
    bounds = {}
    for path in sys.argv[2:]:
        with open(path) as f:
            texts[path] = f.read()
        bounds.update(launch_bounds(texts[path]))
    for path, text in texts.items():
        try:
            translated = translate(text, bounds)
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
