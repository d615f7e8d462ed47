"""
Draws an FP8 run's numerics log (numerics.jsonl, written by train_gpt2_fp8 -p fp8 every -fn
steps) as one PNG, so the tensor in trouble stands out, and prints the worst tensors.

    python3 scripts/plot_numerics.py RUN_DIR [--out numerics.png] [--top 5]

Each line of numerics.jsonl is one FP8 tensor at one logged step: "tensor" (e.g. L3.fc.x:
layer 3, the fc linear, its input x; operands x, dy, w; lm_head.* for the lm_head), "amax",
"scale", "frac_saturated", "frac_flushed" (null where not finite). The PNG has three heat
maps sharing their axes, tensors down (in layer order) and logged steps across:
the fraction saturated, the fraction flushed to zero (both on a log colour scale, so 1e-6
and 1e-2 are told apart), and log10 of amax. A row lit up in either fraction is the tensor
that loses information; a null amax (non-finite) shows as a white gap. When a step appears
twice (a resumed run), the later line wins. A line that is not a record (cut short by a kill,
which a resumed run leaves in the middle of the file, or the last line of a run still
writing) is left out with a note; a log with no record at all is one error line.
"""

import argparse
import json
import math
import os
import sys

try:
    import matplotlib
except ImportError:  # one line, not a traceback: main() says how to install it
    matplotlib = None
else:
    matplotlib.use("Agg")
    import matplotlib.colors as mcolors  # noqa: E402 (the backend must be chosen first)
    import matplotlib.pyplot as plt  # noqa: E402

OPERAND_ORDER = {"x": 0, "w": 1, "dy": 2}
LINEAR_ORDER = {"qkv": 0, "attproj": 1, "fc": 2, "fcproj": 3, "lm_head": 4}
FRACTION_FLOOR = 1e-7  # a zero fraction is drawn as this on the log scale


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def tensor_sort_key(name):
    """L3.fc.x -> (3, fc, x); lm_head.x after every layer"""
    parts = name.split(".")
    if len(parts) == 3 and parts[0].startswith("L") and parts[0][1:].isdigit():
        layer, linear, operand = int(parts[0][1:]), parts[1], parts[2]
    elif len(parts) == 2:
        layer, linear, operand = 1 << 30, parts[0], parts[1]
    else:
        return (1 << 31, 0, 0, name)
    return (layer, LINEAR_ORDER.get(linear, 99), OPERAND_ORDER.get(operand, 99), name)


def load_numerics(path):
    """{tensor: {step: record}} from numerics.jsonl (path: the file or its run dir)"""
    if os.path.isdir(path):
        path = os.path.join(path, "numerics.jsonl")
    if not os.path.exists(path):
        die(f"{path} does not exist (train_gpt2_fp8 writes it with -p fp8, -o DIR and -fn N > 0; train_gpt2cpu does not)")
    table, skipped = {}, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                tensor, step = record["tensor"], int(record["step"])
            except (ValueError, KeyError, TypeError) as e:
                skipped.append((number, e))  # a line cut off mid-write (a killed run, or one still writing)
                continue
            table.setdefault(tensor, {})[step] = record
    if not table:
        detail = f" (line {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        die(f"{path} has no numerics records{detail}")
    if skipped:
        print(f"note: {path}: {len(skipped)} line(s) are not numerics records and are left out (first: line "
              f"{skipped[0][0]}, {skipped[0][1]}): a run killed or still writing cuts its last line short")
    return table


def value_grid(table, tensors, steps, key, transform):
    grid = []
    for tensor in tensors:
        row = []
        for step in steps:
            value = table[tensor].get(step, {}).get(key)
            row.append(transform(value) if value is not None else math.nan)
        grid.append(row)
    return grid


def worst_tensors(table, key, top):
    """the tensors with the largest value of key over all steps, largest first, each with the first step at its peak"""
    peaks = []
    for tensor, by_step in table.items():
        known = [(r[key], step) for step, r in by_step.items() if r.get(key) is not None]
        if known:
            peak, step = max(known, key=lambda p: (p[0], -p[1]))  # the first step at the peak
            peaks.append((peak, tensor, step))
    peaks.sort(key=lambda p: (-p[0], tensor_sort_key(p[1])))
    return [p for p in peaks[:top] if p[0] > 0]


def plot(table, out_path, title):
    tensors = sorted(table, key=tensor_sort_key)
    steps = sorted({s for by_step in table.values() for s in by_step})
    panels = [
        ("fraction saturated", value_grid(table, tensors, steps, "frac_saturated", lambda v: max(v, FRACTION_FLOOR)),
         mcolors.LogNorm(vmin=FRACTION_FLOOR, vmax=1.0), "magma"),
        ("fraction flushed to zero", value_grid(table, tensors, steps, "frac_flushed", lambda v: max(v, FRACTION_FLOOR)),
         mcolors.LogNorm(vmin=FRACTION_FLOOR, vmax=1.0), "magma"),
        ("log10 amax", value_grid(table, tensors, steps, "amax", lambda v: math.log10(max(v, 1e-30))), None, "viridis"),
    ]
    height = max(4.0, 0.12 * len(tensors) + 1.5)
    fig, axes = plt.subplots(1, 3, figsize=(18, height), sharey=True)
    for ax, (name, grid, norm, cmap) in zip(axes, panels):
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", norm=norm, cmap=cmap)
        ax.set_title(name)
        ax.set_xlabel("step")
        ticks = list(range(0, len(steps), max(1, len(steps) // 8)))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(steps[i]) for i in ticks])
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    axes[0].set_yticks(range(len(tensors)))
    axes[0].set_yticklabels(tensors, fontsize=max(4, min(9, int(600 / max(len(tensors), 1)))))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description="Plot an FP8 run's numerics log (numerics.jsonl)")
    parser.add_argument("run", help="run output dir (with numerics.jsonl) or the file itself")
    parser.add_argument("--out", default=None, help="PNG to write (default: numerics.png beside the log)")
    parser.add_argument("--top", type=int, default=5, help="how many worst tensors to print per quantity")
    args = parser.parse_args()
    if matplotlib is None:
        die(f"scripts/plot_numerics.py needs matplotlib, which {sys.executable} cannot import: "
            "bash scripts/setup_python.sh (or pip install matplotlib)")
    table = load_numerics(args.run)
    out = args.out or os.path.join(args.run if os.path.isdir(args.run) else os.path.dirname(args.run) or ".", "numerics.png")
    plot(table, out, f"FP8 numerics: {args.run}")
    for key in ("frac_saturated", "frac_flushed"):
        worst = worst_tensors(table, key, args.top)
        print(f"worst {key}: " + (", ".join(f"{t} {v:.3g} (step {s})" for v, t, s in worst) if worst else "none"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
