"""
How many instructions one pass of a kernel's loop executes on its common path, counted from
the sm_90a machine code without a GPU.

Why: a memory-bound kernel stays memory-bound only while its instructions fit the time its
bytes take. On an H100/H200 (132 SMs, 4 warp instructions a cycle each, 1.98 GHz: 3.3e13
thread instructions a second, against 4.8 TB/s) that is about 7 instructions a byte moved;
adamw8's pass at 16 bytes an element has about 110 an element. This count is what
doc/adamw8.md's instruction budget is measured with; the GPU's own counters (Nsight Compute)
remain the authority where a GPU is at hand.

The walk: from the loop's head to its back edge (the backward branch that spans the most
code: the outermost loop), instruction by instruction. A conditional forward branch over at
most 6 instructions that include a CALL is taken: it jumps over the call to a slow path (IEEE
division and square root, whose fast path tests its operands first); an unconditional
forward branch is taken; any other conditional branch falls through, which is the common path
when the kernel is built for it (adamw8_sass_probe.cu: no FP8 outputs, an fp32 master). So
what it counts is an estimate of the common path, good for comparing versions of one kernel.

    nvcc -O3 -std=c++17 -arch=sm_90a -I. --expt-relaxed-constexpr -cubin \
        -o build/adamw8_sass_probe.cubin dev/bench/adamw8_sass_probe.cu
    python3 dev/bench/sass_path.py build/adamw8_sass_probe.cubin adamw8_sass_probe --per 8
"""
import argparse
import glob
import os
import re
import shutil
import site
import subprocess
import sys

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b(?:\s+!?U?P[T0-9],)?\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")
SLOW_PATH_SKIP = 6  # a fast path's branch over its slow-path call: at most this many instructions


def find_cuobjdump():
    """cuobjdump on PATH, in CUDA_HOME/bin or from the nvidia-cuda-cuobjdump wheel; None if none"""
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    for packages in site.getsitepackages() + [site.getusersitepackages()]:
        candidates += glob.glob(os.path.join(packages, "nvidia", "cu*", "bin", "cuobjdump"))
    return next((candidate for candidate in candidates if os.access(candidate, os.X_OK)), None)


def function_sass(listing, name_part):
    """{address: instruction text} of the one function whose mangled name contains name_part"""
    functions, current = {}, None
    for line in listing.splitlines():
        match = re.search(r"Function : (\S+)", line)
        if match:
            current = match.group(1)
            functions[current] = {}
            continue
        match = INSTRUCTION.match(line)
        if match and current is not None:
            functions[current][int(match.group(1), 16)] = match.group(2)
    chosen = [name for name in functions if name_part in name]
    if len(chosen) != 1:
        sys.exit("error: %d functions match '%s' (of %s)" % (len(chosen), name_part, ", ".join(sorted(functions))))
    return functions[chosen[0]]


def opcode(text):
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def branch_target(text):
    if not opcode(text).startswith("BRA"):
        return None
    match = BRANCH_TARGET.search(text)
    return int(match.group(1), 16) if match and match.group(1) else None


def outermost_loop(code):
    """(head, back edge) of the backward branch spanning the most code"""
    loops = [(target, address) for address, text in code.items()
             for target in [branch_target(text)] if target is not None and target <= address]
    if not loops:
        sys.exit("error: the function has no loop")
    return max(loops, key=lambda loop: loop[1] - loop[0])


def walk(code, head, back_edge):
    """instructions executed from head to back_edge (inclusive) on the common path, and per opcode"""
    addresses = sorted(code)
    executed, per_opcode, address = 0, {}, head
    while address <= back_edge:
        text = code[address]
        executed += 1
        name = opcode(text).split(".")[0]
        per_opcode[name] = per_opcode.get(name, 0) + 1
        target = branch_target(text)
        if target is not None and address < target <= back_edge + 16:
            skipped = [code[a] for a in addresses if address < a < target]
            over_slow_path = len(skipped) <= SLOW_PATH_SKIP and any(opcode(s).startswith("CALL") for s in skipped)
            if not text.startswith("@") or over_slow_path:
                address = target
                continue
        following = [a for a in addresses if a > address]
        if not following:
            break
        address = following[0]
    return executed, per_opcode


def common_path(binary, function):
    """(head, back edge, instructions a pass, {opcode: count}) of the function's outermost loop in binary"""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        sys.exit("error: no cuobjdump on PATH, in CUDA_HOME/bin or from the nvidia-cuda-cuobjdump wheel "
                 "(scripts/setup_python.sh installs it)")
    if not os.path.exists(binary):
        sys.exit("error: %s does not exist" % binary)
    # cuobjdump -sass runs nvdisasm, found on PATH or NVDISASM_PATH: the wheels (nvidia-cuda-nvdisasm beside
    # nvidia-cuda-cuobjdump, 13.5 on) put it in cuobjdump's own folder, which is not on PATH
    env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit("error: cuobjdump -sass %s: %s" % (binary, result.stderr.strip()))
    code = function_sass(result.stdout, function)
    head, back_edge = outermost_loop(code)
    executed, per_opcode = walk(code, head, back_edge)
    return head, back_edge, executed, per_opcode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", help="a cubin or an executable with sm_90a code")
    parser.add_argument("function", help="a part of the kernel's mangled name, matching one function")
    parser.add_argument("--per", type=int, default=1, help="elements a thread handles in one pass (for the per-element figure)")
    args = parser.parse_args()
    head, back_edge, executed, per_opcode = common_path(args.binary, args.function)
    top = ", ".join("%s %d" % item for item in sorted(per_opcode.items(), key=lambda item: -item[1])[:12])
    print("loop 0x%x..0x%x: %d instructions a pass, %.1f an element (%d a pass); %s"
          % (head, back_edge, executed, executed / args.per, args.per, top))


if __name__ == "__main__":
    main()
