"""
floor_model.py: the floor of one GPU's training step, region by region of the trainer's -kt 1
kernel breakdown (DESIGN.md section 7: "the notes say what the floor is").

For every kernel a step launches, it counts the arithmetic the kernel must do (the GEMMs'
and attention's matrix FLOPs, at the bf16 or the FP8 tensor-core rate) and the fewest bytes
it must move through device memory (each input read once, each output written once, as the
kernel is written: a two-pass cast reads its input twice, because it must). A kernel takes
at least max(FLOPs / rate, bytes / bandwidth); the step at least the sum over its kernels.
No version of the same kernels runs much faster, so measured time over the floor says how
far each region is from what its own design allows, and which term bounds it.

Why it is shaped so:
- The regions are the trainer's profiler_mark names (train_gpt2_fp8.cu), so a floor row sits
  beside a measured -kt 1 row; test/test_floor_model.py checks that every name here is one
  the trainer marks, and that every mark of a one-GPU step is modeled.
- The kernels and their bytes follow the code paths of train_gpt2_fp8.cu for one run
  configuration (Run): precision, FP8 recipe, -fw, lm_head's precision, optimizer, -w,
  recompute, GELU fusion. Where a run takes a path, the bytes are that path's; for example
  current scaling's casts read their input twice (an amax pass, then the cast), the block
  recipe's output-gradient cast once, the delayed recipe's activation casts ride on the
  kernel that produces the tensor.
- Attention counts causal work only (half of the T x T scores): 2 B T^2 C FLOPs forward and
  2.5 times that backward (flash attention recomputes the scores: five matrix products to the
  forward's two). The trainer's MFU counts PaLM's 12 L C T per token instead (non-causal,
  forward and backward), so MFU and this floor are different yardsticks.
- Ceilings default to the datasheet (dense bf16 989 TFLOP/s, FP8 twice that; 3.35 TB/s
  HBM3 on the H100 SXM, 4.8 TB/s HBM3e on the H200), the least any kernel can take. Measured
  ceilings are lower (doc/gpu-environment.md): pass them with --bf16-tflops, --fp8-tflops,
  --bandwidth to see the floor the hardware actually allows.
- Not in the floor: launch gaps, the scaling state's tiny kernels, host waits, and the
  first step's extra work (plans, a delayed recipe's seeding pass).

Usage: python dev/bench/floor_model.py --model d12 -b 64 --precision bf16 fp8
       python dev/bench/floor_model.py --model d48 -b 16 -r 1 --precision fp8 --recipe block --device h200
       python dev/bench/floor_model.py --bench doc/benchmarks/DATE-GPU.json
"""
import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_model  # noqa: E402  (the parameter layout: gpt2_config.h's, checked against it there)

VOCAB = scaling_model.VOCAB
HEAD_SIZE = 64  # gpt2_config.h: heads = C / 64
BF16, FP8, FP32 = 2, 1, 4  # bytes per element
RECIPES = ("delayed", "current", "block")
WEIGHT_SCALINGS = ("current", "delayed")
OPTIMIZERS = ("adamw", "adamw8")
ADAMW8_MIN_8BIT_ELEMENTS = 4096  # quant8.h: per-layer slices this small keep 32-bit states
QUANT8_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    bf16_flops: float  # dense, per second
    fp8_flops: float
    bandwidth: float   # bytes per second


DEVICES = {
    "h100": Device("H100 SXM (datasheet)", 989e12, 1979e12, 3.35e12),
    "h200": Device("H200 SXM (datasheet)", 989e12, 1979e12, 4.8e12),
}


@dataclasses.dataclass(frozen=True)
class Run:
    """one trainer configuration: the flags that change which kernels run and what they move"""
    model: str = "d12"
    B: int = 64
    T: int = 1024
    recompute: int = 0          # -r
    precision: str = "bf16"     # -p
    recipe: str = "delayed"     # -fr (FP8 only)
    weight_scaling: str = "current"  # -fw (FP8 only; the block recipe casts its 128x128 blocks after the update)
    lm_head: str = "bf16"       # bf16, or fp8 (-f8 all)
    optimizer: str = "adamw"    # -opt
    master: bool = True         # -w
    gelu_fusion: bool = True    # -ge

    @property
    def fp8(self):
        return self.precision == "fp8"


@dataclasses.dataclass(frozen=True)
class Kernel:
    region: str   # the profiler mark its time is charged to
    what: str
    flops: float  # matrix FLOPs
    rate: str     # "bf16" or "fp8": whose tensor-core rate the FLOPs run at ("" for none)
    bytes: float

    def floor_s(self, device):
        compute = self.flops / (device.fp8_flops if self.rate == "fp8" else device.bf16_flops) if self.flops else 0.0
        return max(compute, self.bytes / device.bandwidth)

    def bound(self, device):
        compute = self.flops / (device.fp8_flops if self.rate == "fp8" else device.bf16_flops) if self.flops else 0.0
        return "compute" if compute >= self.bytes / device.bandwidth else "memory"


class CliError(Exception):
    """a bad argument or input file: main prints it as one line and exits 2"""


def check_run(run):
    if run.model not in scaling_model.PRESETS:
        raise CliError(f"model {run.model!r}: expected one of {', '.join(scaling_model.PRESETS)}")
    for name, value, allowed in (("precision", run.precision, scaling_model.PRECISIONS), ("recipe", run.recipe, RECIPES),
                                 ("weight scaling", run.weight_scaling, WEIGHT_SCALINGS),
                                 ("lm_head", run.lm_head, scaling_model.PRECISIONS), ("optimizer", run.optimizer, OPTIMIZERS)):
        if value not in allowed:
            raise CliError(f"{name} {value!r}: expected one of {', '.join(allowed)}")
    if run.B <= 0 or run.T <= 0 or run.T > scaling_model.MAX_SEQ_LEN:
        raise CliError(f"B={run.B}, T={run.T}: expected B > 0 and 0 < T <= {scaling_model.MAX_SEQ_LEN}")
    if run.recompute not in (0, 1, 2):
        raise CliError(f"recompute {run.recompute}: expected 0, 1 or 2")


def step_kernels(run):
    """every kernel of one training step (one micro-step, no gradient accumulation) as Kernel rows"""
    check_run(run)
    shape = scaling_model.model_shape(run.model)
    L, C, Vp = shape.num_layers, shape.channels, shape.padded_vocab
    N, NH = run.B * run.T, shape.channels // HEAD_SIZE
    fp8_blocks = run.fp8
    fp8_lm_head = run.fp8 and run.lm_head == "fp8"
    two_pass_x = run.recipe in ("current", "block")  # the cast must know the tensor's (tile's) amax first
    amax_pass = run.recipe == "current"
    rows = []

    def add(region, what, bytes_, flops=0.0, rate=""):
        rows.append(Kernel(region, what, float(flops), rate, float(bytes_)))

    def gemm(region, what, m, n, k, a_bytes, b_bytes, out_bytes, accumulate=False):
        """out [m][n] = a [m][k] b [k][n]: both operands read once, the output written (and read, when accumulated)"""
        rate = "fp8" if a_bytes == FP8 and b_bytes == FP8 else "bf16"
        moved = m * k * a_bytes + k * n * b_bytes + m * n * out_bytes * (2 if accumulate else 1)
        add(region, what, moved, 2.0 * m * n * k, rate)

    def cast(region, what, elements, in_bytes, code_arrays, extra_read=0, two_pass=False):
        """an FP8 cast writing code_arrays arrays of codes (x and/or x^T): one read of the input, two
        when the scale must be known before the first code (current scaling, a two-pass layernorm)"""
        reads = (2 if two_pass else 1) * in_bytes + extra_read
        add(region, what, elements * (reads + code_arrays * FP8))

    def layernorm_forward(region, layer_name, fused, fp8_out):
        """layernorm of N x C (fused: residual_out = inp1 + inp2 first); fp8_out: the next linear takes FP8
        x and x^T (its forward and wgrad in FP8) instead of the bf16 output"""
        inputs = 2 if fused else 1
        stats = N * 2 * FP32
        if not fp8_out:
            add(region, f"{layer_name} (bf16 out)", N * C * (inputs * BF16 + (BF16 if fused else 0) + BF16) + stats)
        elif not two_pass_x:
            add(region, f"{layer_name} (FP8 x, x^T in the same pass)", N * C * (inputs * BF16 + (BF16 if fused else 0) + 2 * FP8) + stats)
        else:
            add(region, f"{layer_name} statistics{' and amax' if amax_pass else ''}", N * C * (inputs * BF16 + (BF16 if fused else 0)) + stats)
            add(region, f"{layer_name} cast (the output recomputed from the input)", N * C * (BF16 + 2 * FP8) + stats)

    def activation_cast(region, what, elements):
        """a cast of a bf16 activation to x and x^T (attention output, GELU): delayed and block in one
        pass, current after an amax pass"""
        cast(region, what, elements, BF16, 2, two_pass=amax_pass)

    def linear_forward(region, name, K, OC, fp8, gelu_out=False):
        x, w = (FP8, FP8) if fp8 else (BF16, BF16)
        out = BF16 * (2 if gelu_out else 1)  # cuBLASLt's GELU_AUX epilogue also writes the pre-activation
        gemm(region, f"{name} forward GEMM", N, OC, K, x, w, out)

    def linear_backward(region, name, K, OC, fp8, bias=True, gelu=False):
        """dgrad, wgrad (accumulated into the bf16 gradient) and the bias gradient of one linear; gelu:
        dout is first multiplied by gelu'(pre_gelu) (fc)"""
        n = N * OC
        if fp8:
            gelu_bytes = 2 * BF16 + BF16 if gelu else 0  # read pre_gelu and dout, write the product
            if run.recipe == "block":
                add(region, f"{name} dy: {'GELU bwd + ' if gelu else ''}{'bias + ' if bias else ''}1x128 cast, one pass",
                    n * ((gelu_bytes or BF16) + 2 * FP8))
            else:
                add(region, f"{name} dy: {'GELU bwd + ' if gelu else ''}{'bias + ' if bias else ''}amax", n * (gelu_bytes or BF16))
                add(region, f"{name} dy: cast (E5M2 dy, dy^T)", n * (BF16 + 2 * FP8))
            gemm(region, f"{name} dgrad GEMM", N, K, OC, FP8, FP8, BF16)
            gemm(region, f"{name} wgrad GEMM", OC, K, N, FP8, FP8, BF16, accumulate=True)
        else:
            if gelu:
                add("gelu bwd", f"{name} GELU backward", n * 3 * BF16)
            if bias:
                add(region, f"{name} bias gradient", n * BF16)
            gemm(region, f"{name} dgrad GEMM", N, K, OC, BF16, BF16, BF16)
            gemm(region, f"{name} wgrad GEMM", OC, K, N, BF16, BF16, BF16, accumulate=True)

    # ---- forward
    add("encoder fwd", "wte rows + wpe -> encoded", N * C * 2 * BF16 + run.T * C * BF16 + N * 4)
    layernorm_forward("layernorm fwd", "ln1 of layer 0", fused=False, fp8_out=fp8_blocks)
    for l in range(L):
        linear_forward("matmul qkv fwd", "qkv", C, 3 * C, fp8_blocks)
        add("attention fwd", "causal flash attention", N * 3 * C * BF16 + N * C * BF16 + N * NH * FP32,
            flops=2.0 * run.B * run.T * run.T * C, rate="bf16")
        if fp8_blocks:
            activation_cast("fp8 cast attention out", "attention output -> x, x^T", N * C)
        linear_forward("matmul attproj fwd", "attproj", C, C, fp8_blocks)
        layernorm_forward("residual+layernorm fwd", "residual + ln2", fused=True, fp8_out=fp8_blocks)
        if fp8_blocks:  # GELU is the element transform of fcproj's input cast
            linear_forward("matmul fc fwd", "fc", C, 4 * C, True)
            activation_cast("gelu+fp8 cast fwd", "GELU -> x, x^T of fcproj", N * 4 * C)
        elif run.gelu_fusion:
            linear_forward("matmul fc+gelu fwd", "fc", C, 4 * C, False, gelu_out=True)
        else:
            linear_forward("matmul fc fwd", "fc", C, 4 * C, False)
            add("gelu fwd", "GELU", N * 4 * C * 2 * BF16)
        linear_forward("matmul fcproj fwd", "fcproj", 4 * C, C, fp8_blocks)
        last = l == L - 1
        layernorm_forward("residual+layernorm fwd", "residual + lnf" if last else "residual + next ln1",
                          fused=True, fp8_out=fp8_lm_head if last else fp8_blocks)
    linear_forward("matmul lm_head fwd", "lm_head", C, Vp, fp8_lm_head)
    add("classifier", "softmax + loss + dlogits in place", N * VOCAB * 2 * BF16 + N * 2 * 4)

    # ---- backward
    linear_backward("matmul lm_head bwd", "lm_head", C, Vp, fp8_lm_head, bias=False)
    add("layernorm bwd", "dresidual zeroed", N * C * BF16)
    layernorm_bytes = N * C * (2 * BF16 + 2 * BF16) + N * 2 * FP32  # dout, inp read; dinp read and written
    add("layernorm bwd", "lnf backward", layernorm_bytes)
    for l in range(L):
        if run.recompute >= 1 and not fp8_blocks:
            add("gelu recompute", "GELU", N * 4 * C * 2 * BF16)
        linear_backward("matmul fcproj bwd", "fcproj", 4 * C, C, fp8_blocks)
        if run.recompute >= 2 and not fp8_blocks:
            add("layernorm recompute", "ln2", N * C * 2 * BF16 + N * 2 * FP32)
        linear_backward("matmul fc bwd", "fc", C, 4 * C, fp8_blocks, gelu=True)
        add("layernorm bwd", "ln2 backward", layernorm_bytes)
        linear_backward("matmul attproj bwd", "attproj", C, C, fp8_blocks)
        add("attention bwd", "causal flash attention backward",
            N * 3 * C * BF16 + 2 * N * C * BF16 + N * NH * FP32 + N * 3 * C * BF16,
            flops=5.0 * run.B * run.T * run.T * C, rate="bf16")
        if run.recompute >= 2 and not fp8_blocks:
            add("layernorm recompute", "ln1", N * C * 2 * BF16 + N * 2 * FP32)
        linear_backward("matmul qkv bwd", "qkv", C, 3 * C, fp8_blocks)
        add("layernorm bwd", "ln1 backward", layernorm_bytes)
    add("encoder bwd", "dwte rows, dwpe += dresidual", N * C * BF16 + N * C * 2 * BF16 + run.T * C * 2 * BF16)

    # ---- update
    P = shape.num_parameters
    add("grad norm", "sum of squares of the gradients", P * BF16)
    fp8_weights = list(scaling_model.MATMUL_TENSORS) if fp8_blocks else []
    if fp8_lm_head:
        fp8_weights.append("wte")
    optimizer_bytes = 0.0
    for tensor, n in shape.tensor_sizes.items():
        per_layer = n // L if tensor not in scaling_model.WHOLE_MODEL_TENSORS else n
        eight_bit = (run.optimizer == "adamw8" and tensor not in ("wte", "wpe")
                     and per_layer >= ADAMW8_MIN_8BIT_ELEMENTS)
        moments = 2 * 2 * (FP8 + 2 * FP32 / QUANT8_BLOCK) if eight_bit else 2 * 2 * FP32  # m, v read and written
        weights = 2 * FP32 + BF16 if run.master else 2 * BF16  # master read and written + bf16 written, or bf16 read and written
        codes = FP8 if tensor in fp8_weights and run.weight_scaling == "delayed" and run.recipe != "block" else 0
        optimizer_bytes += n * (BF16 + moments + weights + codes)
    add(run.optimizer, "the update (gradient, moments, weights)", optimizer_bytes)
    for tensor in fp8_weights:
        n = shape.tensor_sizes[tensor]
        if run.weight_scaling == "delayed" and run.recipe != "block":
            add("fp8 weight casts", f"{tensor}: W^T from the codes the update wrote", n * 2 * FP8)
        else:
            add("fp8 weight casts", f"{tensor} -> W, W^T", n * ((FP32 if run.master else BF16) + 2 * FP8))
    add("zero grads", "gradients zeroed", P * BF16)
    return rows


def region_floors(kernels, device):
    """{region: (floor ms, matrix TFLOP, GB moved, bound of the kernel that dominates it)} in first-seen order"""
    regions = {}
    for k in kernels:
        ms, tflop, gb, worst = regions.get(k.region, (0.0, 0.0, 0.0, (0.0, "")))
        floor = k.floor_s(device) * 1e3
        regions[k.region] = (ms + floor, tflop + k.flops / 1e12, gb + k.bytes / 1e9,
                             max(worst, (floor, k.bound(device))))
    return {r: (ms, tflop, gb, worst[1]) for r, (ms, tflop, gb, worst) in regions.items()}


def step_floor_ms(run, device):
    return sum(k.floor_s(device) for k in step_kernels(run)) * 1e3


def run_label(run):
    if not run.fp8:
        return f"{run.model} bf16 {run.optimizer}"
    head = ", lm_head fp8" if run.lm_head == "fp8" else ""
    fw = "" if run.recipe == "block" else f" -fw {run.weight_scaling}"
    return f"{run.model} fp8 {run.recipe}{fw}{head} {run.optimizer}"


def floor_table(run, device, measured=None):
    """markdown: one row per region (floor, and the measured ms per step beside it when given)"""
    regions = region_floors(step_kernels(run), device)
    total = sum(ms for ms, _, _, _ in regions.values())
    tokens = run.B * run.T
    lines = [f"**{run_label(run)}**, B={run.B} T={run.T} -r {run.recompute}: floor {total:.2f} ms per step "
             f"({tokens / total * 1e3:,.0f} tok/s at most) on the {device.name}", ""]
    if measured is None:
        lines += ["| region | matrix TFLOP | GB moved | bound by | floor ms | share |", "|---|---|---|---|---|---|"]
    else:
        lines += ["| region | matrix TFLOP | GB moved | bound by | floor ms | measured ms | measured / floor |",
                  "|---|---|---|---|---|---|---|"]
    for region, (ms, tflop, gb, bound) in sorted(regions.items(), key=lambda item: -item[1][0]):
        cells = [region, f"{tflop:.2f}", f"{gb:.2f}", bound, f"{ms:.3f}"]
        if measured is None:
            cells.append(f"{ms / total:.1%}")
        else:
            got = measured.get(region)
            cells += [f"{got:.3f}" if got is not None else "-", f"{got / ms:.2f}x" if got is not None and ms > 0 else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if measured is not None:
        others = {r: v for r, v in measured.items() if r not in regions}
        if others:
            lines.append("")
            lines.append("Measured rows with no floor here: " + ", ".join(f"{r} {v:.3f} ms" for r, v in others.items()))
    return "\n".join(lines)


def comparison_table(runs, device):
    """markdown: each run's floor, tok/s ceiling and speed-up ceiling over the first (bf16) run"""
    lines = ["| run | B | floor ms | tok/s at most | GEMM floor ms | rest floor ms | ceiling over the first |",
             "|---|---|---|---|---|---|---|"]
    base = None
    for run in runs:
        kernels = step_kernels(run)
        total = sum(k.floor_s(device) for k in kernels) * 1e3
        gemm = sum(k.floor_s(device) for k in kernels if k.flops) * 1e3
        base = base or total
        lines.append(f"| {run_label(run)} | {run.B} | {total:.2f} | {run.B * run.T / total * 1e3:,.0f} | {gemm:.2f} | "
                     f"{total - gemm:.2f} | {base / total:.3f}x |")
    return "\n".join(lines)


def run_from_record(record):
    """the Run of a dev/bench/bench.py train record"""
    fp8 = record["precision"] == "fp8"
    return Run(model=record["model"], B=record["B"], T=record["T"], recompute=record.get("recompute", 0),
               precision=record["precision"], recipe=record["recipe"] if fp8 else "delayed",
               weight_scaling=record["weight_scaling"] if fp8 and record["weight_scaling"] != "-" else "current",
               lm_head=record.get("lm_head", "bf16") if fp8 else "bf16", optimizer=record["optimizer"],
               master=record.get("master_weights", True) is not False)


def measured_regions(breakdown):
    """{region: ms per step} of a -kt 1 breakdown table"""
    regions = {}
    for line in breakdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and not line.startswith("kernel breakdown"):
            try:
                regions[cells[0]] = float(cells[1])
            except ValueError:
                continue  # the header and separator rows
    return regions


def bench_tables(path, device):
    """markdown: measured vs floor for every successful train record of a bench.py JSON"""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CliError(f"--bench {path}: cannot read a bench.py JSON ({e})")
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise CliError(f"--bench {path}: expected a JSON object with a 'records' list (dev/bench/bench.py's output)")
    tables = []
    for record in records:
        if record.get("benchmark", "train") != "train" or "error" in record or not record.get("kernel_breakdown"):
            continue
        try:
            run = run_from_record(record)
        except KeyError as e:
            raise CliError(f"--bench {path}: a train record lacks {e}")
        tables.append(floor_table(run, device, measured_regions(record["kernel_breakdown"])))
    if not tables:
        raise CliError(f"--bench {path}: no train record with a kernel breakdown")
    return "\n\n".join(tables)


def build_parser():
    p = argparse.ArgumentParser(description="the floor of one GPU's training step, by -kt 1 region")
    p.add_argument("--model", default="d12", help="d12, d24, d36 or d48")
    p.add_argument("-b", type=int, default=64, help="micro-batch B")
    p.add_argument("-t", type=int, default=1024, help="sequence length T")
    p.add_argument("-r", type=int, default=0, help="recompute (the trainer's -r)")
    p.add_argument("--precision", nargs="+", default=["bf16", "fp8"], help="bf16 and/or fp8: one table each, compared")
    p.add_argument("--recipe", default="delayed", help="FP8 recipe: delayed, current, block")
    p.add_argument("--weight-scaling", default="current", help="-fw: current or delayed")
    p.add_argument("--lm-head", default="bf16", help="lm_head's precision in FP8 runs: bf16 or fp8")
    p.add_argument("--optimizer", default="adamw", help="adamw or adamw8")
    p.add_argument("--no-master", action="store_true", help="-w 0: no fp32 master weights")
    p.add_argument("--device", default="h100", help="datasheet ceilings: h100 or h200")
    p.add_argument("--bf16-tflops", type=float, help="override the bf16 matrix rate (TFLOP/s)")
    p.add_argument("--fp8-tflops", type=float, help="override the FP8 matrix rate (TFLOP/s)")
    p.add_argument("--bandwidth", type=float, help="override the memory bandwidth (TB/s)")
    p.add_argument("--bench", help="a dev/bench/bench.py JSON: measured vs floor for each train record")
    return p


def run(argv):
    args = build_parser().parse_args(argv)
    if args.device not in DEVICES:
        raise CliError(f"--device {args.device!r}: expected one of {', '.join(DEVICES)}")
    device = DEVICES[args.device]
    overrides = {"bf16_flops": args.bf16_tflops, "fp8_flops": args.fp8_tflops, "bandwidth": args.bandwidth}
    for name, value in overrides.items():
        if value is not None and not value > 0:
            raise CliError(f"--{name.replace('_flops', '-tflops').replace('_', '-')} {value}: expected a positive number")
    if any(v is not None for v in overrides.values()):
        scale = {"bf16_flops": 1e12, "fp8_flops": 1e12, "bandwidth": 1e12}
        device = dataclasses.replace(device, name=device.name.replace("datasheet", "given ceilings"),
                                     **{k: v * scale[k] for k, v in overrides.items() if v is not None})
    if args.bench:
        return bench_tables(args.bench, device)
    runs = [Run(model=args.model, B=args.b, T=args.t, recompute=args.r, precision=p, recipe=args.recipe,
                weight_scaling=args.weight_scaling, lm_head=args.lm_head, optimizer=args.optimizer,
                master=not args.no_master) for p in args.precision]
    tables = [floor_table(r, device) for r in runs]
    if len(runs) > 1:
        tables.append(comparison_table(runs, device))
    return "\n\n".join(tables)


def main(argv=None):
    try:
        print(run(sys.argv[1:] if argv is None else argv))
    except CliError as e:
        print(f"floor_model.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
