"""
floor_model.py: the floor of one GPU's training step, region by region of the trainer's -kt 1
kernel breakdown (DESIGN.md section 7: "the notes say what the floor is").

For every kernel a step launches, it counts the arithmetic the kernel must do (the GEMMs'
and attention's matrix FLOPs, at the bf16 or the FP8 tensor-core rate) and the fewest bytes
it must move through device memory as the kernel is written: each input read once and each
output written once, except where the kernel must read twice (current scaling's amax pass
before a cast, the two-pass layernorm casts, the per-tensor output-gradient pass, the encoder
backward's two kernels). A kernel takes at least max(FLOPs / rate, bytes / bandwidth); the
step at least the sum over its kernels. Measured time over the floor says how far each
region is from what its own design allows, and which term bounds it.

Why it is shaped so:
- The regions are the trainer's profiler_mark names (train_gpt2_fp8.cu), so a floor row sits
  beside a measured -kt 1 row; test/test_floor_model.py checks that every name here is one
  the trainer marks, and that every mark of a one-GPU step is modeled.
- The kernels and their bytes follow the code paths of train_gpt2_fp8.cu for one run
  configuration (Run): precision, FP8 recipe, -fw, -fg, lm_head's precision, optimizer, -w, -r,
  -ge, the block linears in FP8 (all four, -f8's default, or all but attproj), with the default
  -f8p (every pass of an FP8 linear in FP8, so no bf16 copy of an FP8 linear's input is written;
  -r in an FP8 block casts the wgrads' x^T again in the backward instead, and the forward's
  casts write no x^T of those linears).
- Attention counts causal work only (half of the T x T scores): 2 B T^2 C FLOPs forward and
  2.5 times that backward (flash attention recomputes the scores: five matrix products to the
  forward's two). The trainer's MFU counts llm.c's 6 L C T per token for attention instead
  (gpt2_estimate_mfu), so MFU and this floor are different yardsticks.
- Ceilings default to the datasheet (dense bf16 989 TFLOP/s, FP8 twice that; 3.35 TB/s
  HBM3 on the H100 SXM, 4.8 TB/s HBM3e on the H200), the least any kernel can take. Measured
  ceilings are lower (doc/gpu-environment.md): pass them with --bf16-tflops, --fp8-tflops,
  --bandwidth to see the floor the hardware actually allows.
- Not in the floor (doc/performance.md, "The floor"): launch gaps and host waits, the scaling
  state's tiny kernels, bias and layernorm-weight reads, the weights' 128x128 block scales,
  the first step's extra work (plans, a delayed recipe's seeding pass, -fg delayed's and -fg
  pow2's first backward, which casts dy with current's two passes), -fg pow2's recasts (at
  most one recast per dy cast, where dy's amax crossed a power of two: not modeled, a floor
  assumes the prediction holds), multi-GPU regions.

Usage: python3 dev/bench/floor_model.py --model d12 -b 64 --precision bf16 fp8 [--kernels 10]
       python3 dev/bench/floor_model.py --model d48 -b 16 -r 1 --precision fp8 --recipe block --device h200
       python3 dev/bench/floor_model.py --bench doc/benchmarks/DATE-GPU.json
"""
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_model  # noqa: E402  (the parameter layout: gpt2_config.h's, checked against it there)

VOCAB = scaling_model.VOCAB
HEAD_SIZE = 64  # gpt2_config.h: heads = C / 64
BF16, FP8, FP32, INT32 = 2, 1, 4, 4  # bytes per element
RECIPES = ("delayed", "current", "block")
WEIGHT_SCALINGS = ("current", "delayed")
GRAD_SCALINGS = ("current", "delayed", "pow2")
# the block linears in FP8 the model follows (-f8 without lm_head, which Run.lm_head says): all four, or attproj in
# bf16 (its input's cast and its output gradient's go, nothing else changes); other subsets change which kernel
# writes GELU's and the layernorms' outputs, which is not modeled
FP8_BLOCK_LINEARS = (scaling_model.ALL_BLOCK_LINEARS, "qkv,fc,fcproj")
OPTIMIZERS = ("adamw", "adamw8")
ADAMW8_MIN_8BIT_ELEMENTS = 4096  # quant8.h: per-layer slices this small keep 32-bit states
QUANT8_BLOCK = 256               # quant8.h: one fp32 absmax per 256 elements per state
FP8_TILE = 128                   # fp8_cast.cuh: the block recipe's 1x128 tiles; the bias partials' 128-row chunks
# the block recipe's activation and gradient codes carry one fp32 scale per 128 (fp8_block_scale_floats);
# the weights' 128x128 block scales (4 bytes per 16384 codes) are left out
BLOCK_CODE = FP8 + FP32 / FP8_TILE
CliError = scaling_model.CliError  # one class, so scaling_model's one-line parser errors are caught too


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    bf16_flops: float  # dense, per second
    fp8_flops: float
    bandwidth: float   # bytes per second


DEVICES = {
    "h100": Device("H100 SXM (datasheet)", 989e12, 1979e12, 3.35e12),
    "h200": Device("H200 SXM (datasheet)", 989e12, 1979e12, 4.8e12),
    # the same dense peaks as llmc/cuda_common.h's table (half the product pages' sparse figures)
    "h100-pcie": Device("H100 PCIe (datasheet)", 756e12, 1513e12, 2.0e12),
    "h100-nvl": Device("H100 NVL (datasheet)", 835e12, 1671e12, 3.9e12),
    "h200-nvl": Device("H200 NVL (datasheet)", 835e12, 1671e12, 4.8e12),
}


def device_for_gpu(gpu_name):
    """the datasheet ceilings of an nvidia-smi GPU name: the PCIe and NVL cards by name (the more specific names
    first, as the trainer's peak table), then any other H200 as the SXM one, else the H100 SXM"""
    name = gpu_name.upper()
    for key, marks in (("h100-pcie", ("H100", "PCIE")), ("h100-nvl", ("H100", "NVL")), ("h200-nvl", ("H200", "NVL"))):
        if all(mark in name for mark in marks):
            return DEVICES[key]
    return DEVICES["h200" if "H200" in name else "h100"]


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
    grad_scaling: str = "current"    # -fg (FP8 per-tensor recipes): delayed casts dy in the bias pass, pow2 too
                                     # where no layernorm backward took dy's amax (qkv, fc)
    lm_head: str = "bf16"       # bf16, or fp8 (-f8 all)
    optimizer: str = "adamw"    # -opt
    master: bool = True         # -w
    gelu_fusion: int = 1        # -ge: 1 GELU in bf16 fc's forward epilogue, 2 also DGELU in fcproj's dgrad
    fc_writes_codes: int = 0    # -fe 1 (FP8, -fr delayed, -r 0): fc's GEMM writes fcproj's x codes, a byte transpose x^T
    fp8_block_linears: str = FP8_BLOCK_LINEARS[0]  # -f8's block linears (FP8 only): one of FP8_BLOCK_LINEARS

    @property
    def fp8(self):
        return self.precision == "fp8"


@dataclasses.dataclass(frozen=True)
class Kernel:
    region: str   # the profiler mark its time is charged to
    what: str
    kind: str     # "gemm", "attention" (both have matrix FLOPs) or "memory"
    flops: float  # matrix FLOPs
    rate: str     # "bf16" or "fp8": whose tensor-core rate the FLOPs run at ("" for none)
    bytes: float

    def compute_s(self, device):
        return self.flops / (device.fp8_flops if self.rate == "fp8" else device.bf16_flops)

    def floor_s(self, device):
        return max(self.compute_s(device), self.bytes / device.bandwidth)

    def bound(self, device):
        return "compute" if self.compute_s(device) >= self.bytes / device.bandwidth else "memory"


def check_run(run):
    if run.model not in scaling_model.PRESETS:
        raise CliError(f"model {run.model!r}: expected one of {', '.join(scaling_model.PRESETS)}")
    for name, value, allowed in (("precision", run.precision, scaling_model.PRECISIONS), ("recipe", run.recipe, RECIPES),
                                 ("weight scaling", run.weight_scaling, WEIGHT_SCALINGS),
                                 ("gradient scaling", run.grad_scaling, GRAD_SCALINGS),
                                 ("lm_head", run.lm_head, scaling_model.PRECISIONS), ("optimizer", run.optimizer, OPTIMIZERS)):
        if value not in allowed:
            raise CliError(f"{name} {value!r}: expected one of {', '.join(allowed)}")
    if run.recipe == "block" and run.grad_scaling in ("delayed", "pow2"):
        raise CliError(f"gradient scaling {run.grad_scaling!r} needs a per-tensor recipe (the trainer refuses "
                       f"-fg {run.grad_scaling} with -fr block)")
    if run.B <= 0 or run.T <= 0 or run.T > scaling_model.MAX_SEQ_LEN:
        raise CliError(f"B={run.B}, T={run.T}: expected B > 0 and 0 < T <= {scaling_model.MAX_SEQ_LEN}")
    if run.recompute not in (0, 1, 2):
        raise CliError(f"recompute {run.recompute}: expected 0, 1 or 2")
    if run.gelu_fusion not in (0, 1, 2):
        raise CliError(f"gelu fusion {run.gelu_fusion}: expected 0, 1 or 2")
    if run.fc_writes_codes and not (run.fp8 and run.recipe == "delayed" and run.recompute == 0):
        raise CliError("fc writes codes (-fe 1): needs FP8, the delayed recipe and -r 0 (the trainer refuses it otherwise)")
    if run.fp8_block_linears not in FP8_BLOCK_LINEARS:
        raise CliError(f"FP8 block linears {run.fp8_block_linears!r}: the model follows {' or '.join(FP8_BLOCK_LINEARS)}")


def distinct_tokens(n):
    """the expected number of distinct tokens among n drawn uniformly from the vocabulary, as in
    bench.py's synthetic shard (text repeats more, so it has fewer)"""
    return VOCAB * (1.0 - (1.0 - 1.0 / VOCAB) ** n)


def step_kernels(run):
    """every kernel of one training step (one micro-step, no gradient accumulation) as Kernel rows,
    in the order the trainer launches them"""
    check_run(run)
    shape = scaling_model.model_shape(run.model)
    L, C, Vp = shape.num_layers, shape.channels, shape.padded_vocab
    N, NH = run.B * run.T, shape.channels // HEAD_SIZE
    fp8_blocks = run.fp8  # qkv, fc, fcproj in FP8 in all three passes (-f8p's default), and attproj unless fp8_attproj says
    fp8_attproj = run.fp8 and "attproj" in run.fp8_block_linears.split(",")
    fp8_lm_head = run.fp8 and run.lm_head == "fp8"
    block = run.fp8 and run.recipe == "block"
    code = BLOCK_CODE if block else FP8  # bytes per activation or gradient code
    # current scaling reads a tensor once for its amax before the cast can read it again; delayed
    # knows its scale beforehand, the block recipe finds each tile's in the tile
    amax_pass = run.recipe == "current"
    # a layernorm into FP8 takes two passes (statistics, then a tile cast that normalizes from them)
    # unless the delayed recipe's known per-tensor scale lets the layernorm kernel cast its own output;
    # the block recipe's 128x1 tiles of x^T span more rows than a layernorm block holds
    two_pass_layernorm = run.recipe in ("current", "block")
    partials = FP32 / FP8_TILE  # a bias pass writes fp32 column sums per 128-row chunk: bytes per element
    rows = []

    def add(region, what, bytes_, flops=0.0, kind="memory", rate=""):
        rows.append(Kernel(region, what, kind, float(flops), rate, float(bytes_)))

    def gemm(region, what, m, n, k, a_bytes, b_bytes, out_bytes, fp8, accumulate=False, aux_in_bytes=0):
        """out [m][n] = a [m][k] b [k][n]: both operands read once, the output written (and read, when
        accumulated); aux_in_bytes per output element: an epilogue input (DGELU's pre-activation)"""
        moved = m * k * a_bytes + k * n * b_bytes + m * n * (out_bytes * (2 if accumulate else 1) + aux_in_bytes)
        add(region, what, moved, 2.0 * m * n * k, "gemm", "fp8" if fp8 else "bf16")

    def recast(kind):
        """whether -r casts this block linear's x^T again in the backward (linear_input_recompute_level):
        fcproj's from -r 1, qkv's, attproj's and fc's from -r 2 (an FP8 one's); lm_head's never"""
        fp8 = fp8_attproj if kind == "attproj" else fp8_blocks
        return fp8 and kind != "lm_head" and run.recompute >= (1 if kind == "fcproj" else 2)

    def cast_outputs(kind):
        """(names, count) of the code arrays the forward's cast of the linear's input writes: x and x^T, or x
        alone where x^T is recast"""
        return ("x", 1) if recast(kind) else ("x, x^T", 2)

    def layernorm_forward(region, what, fused, fp8_out, kind=None):
        """layernorm of N x C (fused: of residual_out = inp1 + inp2, which it also writes). fp8_out: the
        next linear (kind) takes x and x^T codes (its forward and wgrad in FP8) and no bf16 copy is written"""
        io = N * C * BF16 * (3 if fused else 1) + N * 2 * FP32  # inputs read (and residual written), mean and rstd written
        outputs, arrays = cast_outputs(kind)
        codes = N * C * arrays * code
        if not fp8_out:
            add(region, f"{what} (bf16 out)", io + N * C * BF16)
        elif not two_pass_layernorm:
            add(region, f"{what} ({outputs} codes in the same pass)", io + codes)
        else:
            add(region, f"{what}: statistics{' and amax' if amax_pass else ''}", io)
            add(region, f"{what}: tile cast to {outputs} (the output recomputed from the stored input, mean and rstd)",
                N * C * BF16 + N * 2 * FP32 + codes)

    def activation_cast(region, what, elements, kind):
        """a bf16 tensor (attention output; pre-GELU, cast as GELU of it) to x and x^T codes (x alone where
        x^T is recast): one read, two with current scaling's amax pass"""
        outputs, arrays = cast_outputs(kind)
        add(region, f"{what} -> {outputs} of {kind}", elements * ((2 if amax_pass else 1) * BF16 + arrays * code))

    def replay_x_t(region, what, elements, extra_bytes=0):
        """-r: a replay of the forward's cast, x^T only, from what it was cast from (a bf16 tensor of the
        given elements, and extra_bytes: a layernorm's mean and rstd), with the scale the forward used"""
        add(region, f"{what} -> x^T again", elements * (BF16 + code) + extra_bytes)

    def linear_forward(region, name, K, OC, fp8, gelu_aux=False):
        if fp8:
            gemm(region, f"{name} forward GEMM", N, OC, K, code, FP8, BF16, True)
        else:  # cuBLASLt's GELU_AUX epilogue writes the pre-activation beside GELU's output
            gemm(region, f"{name} forward GEMM", N, OC, K, BF16, BF16, BF16 * (2 if gelu_aux else 1), False)

    def linear_backward(region, name, K, OC, fp8, bias=True, gelu=False, dgrad_gelu=False, codes_from_producer=False,
                        dy_from_layernorm=False):
        """dgrad, wgrad (accumulated into the bf16 gradient) and the bias gradient of one linear;
        gelu: dout is first multiplied by gelu'(pre_gelu) (fc): pre_gelu read, and the product written
        back into dout where a later pass reads it (not by the one-pass cast: both GEMMs read codes);
        dgrad_gelu: the dgrad GEMM's DGELU epilogue multiplies dinp by gelu'(pre_gelu) (fcproj, -ge 2);
        codes_from_producer: per tensor, dout's producer wrote its codes (the classifier's, with the scale
        of the gradients' bound), so only their transpose is left;
        dy_from_layernorm: dout is the residual gradient a layernorm backward wrote (attproj, fcproj), which
        summed the bias and, for current scaling (-fg current, and -fg pow2, whose cast then needs no
        prediction), took the amax as it wrote it (LayernormDinpUses): no pass of its own for them"""
        n = N * OC
        gelu_bytes = 2 * BF16 if gelu else 0
        if fp8 and codes_from_producer and not block:  # fp8_transpose_codes: a byte read and written per element
            add(region, f"{name} dy^T: transpose of the codes the classifier wrote", n * 2 * FP8)
        elif fp8 and (block or run.grad_scaling == "delayed" or (run.grad_scaling == "pow2" and not dy_from_layernorm)):
            # a known scale: one tile pass (matmul_backward_fp8_dout); -fg pow2's is the last use's, a prediction
            # (FP8_DOUT_SCALE_PREDICTED), taken to hold: its recast where dy's amax crossed a power of two is not modeled
            cast = "1x128" if block else "pow2 (predicted scale)" if run.grad_scaling == "pow2" else "delayed"
            add(region, f"{name} dy: {'GELU bwd, ' if gelu else ''}{'bias, ' if bias else ''}{cast} cast",
                n * (BF16 + (BF16 if gelu else 0) + 2 * code + (partials if bias else 0)))
        elif fp8 and dy_from_layernorm:  # per tensor, current scaling (-fg current, pow2): the amax and the bias came with dy
            add(region, f"{name} dy: cast to dy, dy^T (amax and bias from layernorm backward)", n * (BF16 + 2 * FP8))
        elif fp8:  # per tensor, current scaling (E5M2): the partials kernel runs even without a bias, for the amax
            add(region, f"{name} dy: {'GELU bwd, ' if gelu else ''}bias partials, amax", n * (BF16 + gelu_bytes + partials))
            add(region, f"{name} dy: cast to dy, dy^T (reads dy again)", n * (BF16 + 2 * FP8))
        else:
            if gelu:
                add("gelu bwd", f"{name} GELU backward", n * (BF16 + gelu_bytes))
            if bias and not dy_from_layernorm:
                add(region, f"{name} bias gradient", n * (BF16 + partials))
        x, dy = (code, code) if fp8 else (BF16, BF16)
        gemm(region, f"{name} dgrad GEMM{' (DGELU: pre-GELU read)' if dgrad_gelu else ''}", N, K, OC, dy,
             FP8 if fp8 else BF16, BF16, fp8, aux_in_bytes=BF16 if dgrad_gelu else 0)
        gemm(region, f"{name} wgrad GEMM", OC, K, N, dy, x, BF16, fp8, accumulate=True)

    P = shape.num_parameters
    add("zero grads", "gradients and losses zeroed", P * BF16 + N * FP32)

    # ---- forward
    add("encoder fwd", "wte rows + wpe -> encoded", N * C * 2 * BF16 + run.T * C * BF16 + N * INT32)
    layernorm_forward("layernorm fwd", "ln1 of layer 0", fused=False, fp8_out=fp8_blocks, kind="qkv")
    for l in range(L):
        linear_forward("matmul qkv fwd", "qkv", C, 3 * C, fp8_blocks)
        # causal: half of the T x T scores, two products (Q K^T, P V); qkv read, out and the row statistics written
        add("attention fwd", "causal flash attention", N * 4 * C * BF16 + N * NH * FP32,
            flops=2.0 * run.B * run.T * run.T * C, kind="attention", rate="bf16")
        if fp8_attproj:
            activation_cast("fp8 cast attention out", "attention output", N * C, "attproj")
        linear_forward("matmul attproj fwd", "attproj", C, C, fp8_attproj)
        layernorm_forward("residual+layernorm fwd", "residual + ln2", fused=True, fp8_out=fp8_blocks, kind="fc")
        if run.fc_writes_codes:  # the E4M3 D of GELU_AUX_BIAS beside the bf16 pre-activation; x^T from the codes
            gemm("matmul fc+gelu fp8 codes fwd", "fc forward GEMM (GELU codes and pre-activation)", N, 4 * C, C, code, FP8,
                 BF16 + code, True)
            add("fp8 transpose gelu out", "fcproj x^T: transpose of the codes fc's GEMM wrote", N * 4 * C * 2 * code)
        elif fp8_blocks:  # GELU is the element transform of fcproj's input cast; no bf16 GELU output
            linear_forward("matmul fc fwd", "fc", C, 4 * C, True)
            activation_cast("gelu+fp8 cast fwd", "GELU(pre-GELU)", N * 4 * C, "fcproj")
        elif run.gelu_fusion >= 1:
            linear_forward("matmul fc+gelu fwd", "fc", C, 4 * C, False, gelu_aux=True)
        else:
            linear_forward("matmul fc fwd", "fc", C, 4 * C, False)
            add("gelu fwd", "GELU", N * 4 * C * 2 * BF16)
        linear_forward("matmul fcproj fwd", "fcproj", 4 * C, C, fp8_blocks)
        last = l == L - 1
        layernorm_forward("residual+layernorm fwd", "residual + lnf" if last else "residual + next ln1",
                          fused=True, fp8_out=fp8_lm_head if last else fp8_blocks, kind="lm_head" if last else "qkv")
    linear_forward("matmul lm_head fwd", "lm_head", C, Vp, fp8_lm_head)
    # logits read, dlogits written in place (all Vp columns); the kernel reads a row twice (statistics,
    # then the gradient), the second time from L2 (a row is 2 Vp bytes); targets read, losses +=.
    # An FP8 lm_head per tensor: the gradients' E5M2 codes written instead, with the bound's scale
    if fp8_lm_head and not block:
        add("classifier", "softmax + loss + dy codes (the bound's scale)", N * Vp * (BF16 + FP8) + N * (INT32 + 2 * FP32))
    else:
        add("classifier", "softmax + loss + dlogits in place", N * Vp * 2 * BF16 + N * (INT32 + 2 * FP32))

    # ---- backward
    linear_backward("matmul lm_head bwd", "lm_head", C, Vp, fp8_lm_head, bias=False, codes_from_producer=True)
    add("layernorm bwd", "dresidual zeroed", N * C * BF16)
    # dout and the input read, dinp read and written (+=), mean and rstd read (and, for the linear whose
    # dy dinp is, its bias sums and amax taken on the way: no bytes of their own)
    layernorm_backward_bytes = N * C * 4 * BF16 + N * 2 * FP32
    add("layernorm bwd", "lnf backward", layernorm_backward_bytes)
    # the bf16 recomputes where a bf16 wgrad reads the GELU or layernorm output; in an FP8 block the
    # replays of its x^T casts (recast), read where the forward read: mean and rstd are not written again
    recompute_gelu, recompute_layernorm = run.recompute >= 1 and not fp8_blocks, run.recompute >= 2 and not fp8_blocks
    stats = N * 2 * FP32
    for l in range(L):
        if recompute_gelu:
            add("gelu recompute", "GELU", N * 4 * C * 2 * BF16)
        if recast("fcproj"):
            replay_x_t("gelu recompute", "GELU(pre-GELU) of fcproj", N * 4 * C)
        dgelu_epilogue = run.gelu_fusion >= 2  # GELU's derivative in fcproj's dgrad, not on fc's dout
        linear_backward("matmul fcproj bwd", "fcproj", 4 * C, C, fp8_blocks, dgrad_gelu=dgelu_epilogue, dy_from_layernorm=True)
        if recompute_layernorm:
            add("layernorm recompute", "ln2", N * C * 2 * BF16)
        if recast("fc"):
            replay_x_t("layernorm recompute", "ln2 of the stored residual", N * C, stats)
        linear_backward("matmul fc bwd", "fc", C, 4 * C, fp8_blocks, gelu=not dgelu_epilogue)
        add("layernorm bwd", "ln2 backward", layernorm_backward_bytes)
        if recast("attproj"):
            replay_x_t("fp8 cast attention out recompute", "attention output", N * C)
        linear_backward("matmul attproj bwd", "attproj", C, C, fp8_attproj, dy_from_layernorm=True)
        # five causal products (the scores again, dV, dP, dQ, dK); qkv, out, dout, the statistics read, dqkv written
        add("attention bwd", "causal flash attention backward", N * 8 * C * BF16 + N * NH * FP32,
            flops=5.0 * run.B * run.T * run.T * C, kind="attention", rate="bf16")
        if recompute_layernorm:
            add("layernorm recompute", "ln1", N * C * 2 * BF16)
        if recast("qkv"):
            replay_x_t("layernorm recompute", "ln1 of the layer's input", N * C, stats)
        linear_backward("matmul qkv bwd", "qkv", C, 3 * C, fp8_blocks)
        add("layernorm bwd", "ln1 backward", layernorm_backward_bytes)
    # two kernels, each reading all of dresidual: dwte += per distinct token (its row read and written), dwpe +=
    add("encoder bwd", "dwte rows, dwpe += dresidual",
        2 * N * C * BF16 + distinct_tokens(N) * C * 2 * BF16 + run.T * C * 2 * BF16 + N * INT32)

    # ---- update
    add("grad norm", "sum of squares of the gradients", P * BF16)
    fp8_weights = [t for t in scaling_model.MATMUL_TENSORS if fp8_attproj or t != "attprojw"] if fp8_blocks else []
    if fp8_lm_head:
        fp8_weights.append("wte")
    # -fw delayed: the update writes the block linears' W codes, and the cast after it only transposes them;
    # lm_head's W is cast after the update from the bf16 wte, as several ranks cast it (fp8_weight_cast_in_update)
    codes_in_update = run.weight_scaling == "delayed" and run.recipe != "block"
    optimizer_bytes = 0.0
    for tensor, n in shape.tensor_sizes.items():
        per_layer = n if tensor in scaling_model.WHOLE_MODEL_TENSORS else n // L
        eight_bit = (run.optimizer == "adamw8" and tensor not in ("wte", "wpe")
                     and per_layer >= ADAMW8_MIN_8BIT_ELEMENTS)
        # m and v read and written: a byte each and their block's absmax, or fp32
        moments = 2 * 2 * (FP8 + FP32 / QUANT8_BLOCK if eight_bit else FP32)
        # fp32 master read and written and the bf16 weight written (stochastic rounding), or the bf16 weight read and written
        weights = 2 * FP32 + BF16 if run.master else 2 * BF16
        codes = FP8 if tensor in fp8_weights and tensor != "wte" and codes_in_update else 0
        optimizer_bytes += n * (BF16 + moments + weights + codes)  # + the gradient read
    add(run.optimizer, "the update (gradient, moments, weights)", optimizer_bytes)
    for tensor in fp8_weights:
        n = shape.tensor_sizes[tensor]
        if tensor == "wte":  # per tensor an amax pass, then the cast; the block recipe's tiles take their amax as they cast
            reads = 1 if run.recipe == "block" else 2
            add("fp8 weight casts", f"wte -> lm_head's W, W^T from bf16 ({reads} read{'s' if reads > 1 else ''})",
                n * (reads * BF16 + 2 * FP8))
        elif codes_in_update:
            add("fp8 weight casts", f"{tensor}: W^T from the codes the update wrote", n * 2 * FP8)
        else:  # the update wrote the amax (per tensor): one read of the master (or bf16 weight), W and W^T written
            add("fp8 weight casts", f"{tensor} -> W, W^T", n * ((FP32 if run.master else BF16) + 2 * FP8))
    return rows


def region_floors(kernels, device):
    """{region: (floor ms, matrix TFLOP, GB moved, bound of the kernels that dominate it)} in first-seen order"""
    regions = {}
    for k in kernels:
        ms, tflop, gb, by_bound = regions.get(k.region, (0.0, 0.0, 0.0, {}))
        floor = k.floor_s(device) * 1e3
        by_bound = dict(by_bound, **{k.bound(device): by_bound.get(k.bound(device), 0.0) + floor})
        regions[k.region] = (ms + floor, tflop + k.flops / 1e12, gb + k.bytes / 1e9, by_bound)
    return {r: (ms, tflop, gb, max(by_bound, key=by_bound.get)) for r, (ms, tflop, gb, by_bound) in regions.items()}


def step_floor_ms(run, device):
    return sum(k.floor_s(device) for k in step_kernels(run)) * 1e3


def run_label(run):
    master = ("" if run.master else " -w 0") + ("" if run.gelu_fusion == 1 else f" -ge {run.gelu_fusion}") \
        + (" -fe 1" if run.fc_writes_codes else "")
    if not run.fp8:
        return f"{run.model} bf16 {run.optimizer}{master}"
    head = (", lm_head fp8" if run.lm_head == "fp8" else "") \
        + ("" if run.fp8_block_linears == FP8_BLOCK_LINEARS[0] else f", -f8 {run.fp8_block_linears}")
    fw = "" if run.recipe == "block" else f" -fw {run.weight_scaling}" + (f" -fg {run.grad_scaling}" if run.grad_scaling != "current" else "")
    return f"{run.model} fp8 {run.recipe}{fw}{head} {run.optimizer}{master}"


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

    def versus(floor, got):
        return [f"{got:.3f}" if got is not None else "-", f"{got / floor:.2f}x" if got is not None and floor > 0 else "-"]

    for region, (ms, tflop, gb, bound) in sorted(regions.items(), key=lambda item: -item[1][0]):
        cells = [region, f"{tflop:.2f}", f"{gb:.2f}", bound, f"{ms:.3f}"]
        cells += [f"{ms / total:.1%}"] if measured is None else versus(ms, measured.get(region))
        lines.append("| " + " | ".join(cells) + " |")
    if measured is not None:
        got = sum(v for r, v in measured.items() if r in regions)
        lines.append("| modeled regions | | | | " + " | ".join([f"{total:.3f}"] + versus(total, got)) + " |")
        others = {r: v for r, v in measured.items() if r not in regions}
        if others:
            lines += ["", "Measured rows with no floor here: " + ", ".join(f"{r} {v:.3f} ms" for r, v in others.items())]
    return "\n".join(lines)


def comparison_table(runs, device):
    """markdown: each run's floor, split into the GEMMs', attention's and the memory-bound rest's, its
    tok/s ceiling and its speed-up ceiling over the first (bf16) run"""
    lines = ["| run | B | floor ms | tok/s at most | GEMMs ms | attention ms | rest ms | ceiling over the first |",
             "|---|---|---|---|---|---|---|---|"]
    base = None
    for run in runs:
        ms = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
        for k in step_kernels(run):
            ms[k.kind] += k.floor_s(device) * 1e3
        total = sum(ms.values())
        base = base or total
        lines.append(f"| {run_label(run)} | {run.B} | {total:.2f} | {run.B * run.T / total * 1e3:,.0f} | {ms['gemm']:.2f} | "
                     f"{ms['attention']:.2f} | {ms['memory']:.2f} | {base / total:.3f}x |")
    return "\n".join(lines)


def kernel_table(run, device, top):
    """markdown: the top kernels by floor, each summed over the layers (same region and description)"""
    summed = {}
    for k in step_kernels(run):
        ms, gb, calls = summed.get((k.region, k.what), (0.0, 0.0, 0))
        summed[(k.region, k.what)] = (ms + k.floor_s(device) * 1e3, gb + k.bytes / 1e9, calls + 1)
    total = sum(ms for ms, _, _ in summed.values())
    lines = [f"Largest kernels of **{run_label(run)}** (summed over layers):", "",
             "| region | kernel | calls | GB moved | floor ms | share |", "|---|---|---|---|---|---|"]
    for (region, what), (ms, gb, calls) in sorted(summed.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"| {region} | {what} | {calls} | {gb:.2f} | {ms:.3f} | {ms / total:.1%} |")
    return "\n".join(lines)


def run_from_record(record):
    """the Run of a dev/bench/bench.py train record"""
    fp8 = record["precision"] == "fp8"
    return Run(model=record["model"], B=record["B"], T=record["T"], recompute=record.get("recompute", 0),
               precision=record["precision"], recipe=record["recipe"] if fp8 else "delayed",
               weight_scaling=record["weight_scaling"] if fp8 and record["weight_scaling"] != "-" else "current",
               grad_scaling=record.get("grad_scaling", "current") if fp8 and record.get("grad_scaling") != "-" else "current",
               lm_head=record.get("lm_head", "bf16") if fp8 else "bf16", optimizer=record["optimizer"],
               master=record.get("master_weights", True) is not False, gelu_fusion=record.get("gelu_fusion", 1),
               fc_writes_codes=record.get("fc_writes_codes", 0),
               fp8_block_linears=record.get("fp8_block_linears", FP8_BLOCK_LINEARS[0]) if fp8 else FP8_BLOCK_LINEARS[0])


def measured_regions(breakdown):
    """{region: ms per step} of a -kt 1 breakdown table (llmc/profiler.h's profiler_print), its total row left out"""
    regions = {}
    for line in breakdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0] != "total":
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
    records = data.get("records") if isinstance(data, dict) else data  # bench.py writes a list of records
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise CliError(f"--bench {path}: expected a list of records (dev/bench/bench.py's JSON)")
    tables = []
    for record in records:
        if record.get("benchmark", "train") != "train" or "error" in record or not record.get("kernel_breakdown"):
            continue
        try:
            run = run_from_record(record)
        except KeyError as e:
            raise CliError(f"--bench {path}: a train record lacks {e}")
        measured = measured_regions(record["kernel_breakdown"])
        tables.append(floor_table(run, device, measured) + f"\n\nmeasured {record.get('ms_per_step', float('nan')):.2f} "
                      f"ms per step in all (`{record.get('command', '?')}`)")
    if not tables:
        raise CliError(f"--bench {path}: no train record with a kernel breakdown")
    return "\n\n".join(tables)


def build_parser():
    positive_int, positive_float = scaling_model.positive(int), scaling_model.positive(float)
    p = scaling_model.OneLineParser(description="the floor of one GPU's training step, by -kt 1 region")
    p.add_argument("--model", default="d12", help="d12, d24, d36 or d48")
    p.add_argument("-b", type=positive_int, default=64, help="micro-batch B")
    p.add_argument("-t", type=positive_int, default=1024, help="sequence length T")
    p.add_argument("-r", type=int, default=0, help="recompute (the trainer's -r)")
    p.add_argument("--precision", nargs="+", default=["bf16", "fp8"], help="bf16 and/or fp8: one table each, compared")
    p.add_argument("--recipe", default="delayed", help="FP8 recipe: delayed, current, block")
    p.add_argument("--weight-scaling", default="current", help="-fw: current or delayed")
    p.add_argument("--grad-scaling", default="current",
                   help="-fg: current, delayed or pow2 (per-tensor recipes). pow2 is modeled as delayed's one pass where "
                   "no layernorm backward took dy's amax (qkv, fc) and as current's cast where one did (attproj, fcproj); "
                   "its recasts (at most one recast per cast, where dy's amax crossed a power of two) are not modeled: "
                   "a floor assumes the prediction holds")
    p.add_argument("--lm-head", default="bf16", help="lm_head's precision in FP8 runs: bf16 or fp8")
    p.add_argument("--optimizer", default="adamw", help="adamw or adamw8")
    p.add_argument("--no-master", action="store_true", help="-w 0: no fp32 master weights")
    p.add_argument("--gelu-fusion", type=int, default=1,
                   help="-ge: 0 bf16 GELU as a kernel of its own, 1 in bf16 fc's forward epilogue, 2 also DGELU in fcproj's dgrad")
    p.add_argument("--fc-writes-codes", type=int, choices=(0, 1), default=0,
                   help="-fe: 1 fc's FP8 forward GEMM writes fcproj's x codes, a byte transpose makes x^T (FP8 delayed, -r 0)")
    p.add_argument("--fp8-block-linears", default=FP8_BLOCK_LINEARS[0], choices=FP8_BLOCK_LINEARS, metavar="LINEARS",
                   help="-f8 without lm_head: the block linears in FP8, one of: " + " or ".join(FP8_BLOCK_LINEARS)
                   + " (all four, or all but attproj)")
    p.add_argument("--device", default="h100", help="datasheet ceilings: " + ", ".join(DEVICES))
    p.add_argument("--bf16-tflops", type=positive_float, help="override the bf16 matrix rate (TFLOP/s)")
    p.add_argument("--fp8-tflops", type=positive_float, help="override the FP8 matrix rate (TFLOP/s)")
    p.add_argument("--bandwidth", type=positive_float, help="override the memory bandwidth (TB/s)")
    p.add_argument("--kernels", type=positive_int, help="also list the largest N kernels of each run")
    p.add_argument("--bench", help="a dev/bench/bench.py JSON: measured vs floor for each train record")
    return p


def run(argv):
    args = build_parser().parse_args(argv)
    if args.device not in DEVICES:
        raise CliError(f"--device {args.device!r}: expected one of {', '.join(DEVICES)}")
    device = DEVICES[args.device]
    overrides = {"bf16_flops": args.bf16_tflops, "fp8_flops": args.fp8_tflops, "bandwidth": args.bandwidth}
    if any(v is not None for v in overrides.values()):  # all three in units of 1e12 (TFLOP/s, TB/s)
        device = dataclasses.replace(device, name=device.name.replace("datasheet", "given ceilings"),
                                     **{k: v * 1e12 for k, v in overrides.items() if v is not None})
    if args.bench:
        return bench_tables(args.bench, device)
    runs = [Run(model=args.model, B=args.b, T=args.t, recompute=args.r, precision=p, recipe=args.recipe,
                weight_scaling=args.weight_scaling, grad_scaling=args.grad_scaling, lm_head=args.lm_head, optimizer=args.optimizer,
                master=not args.no_master, gelu_fusion=args.gelu_fusion,
                fc_writes_codes=args.fc_writes_codes if p == "fp8" else 0,
                fp8_block_linears=args.fp8_block_linears if p == "fp8" else FP8_BLOCK_LINEARS[0]) for p in args.precision]
    tables = [floor_table(r, device) for r in runs]
    if args.kernels:
        tables += [kernel_table(r, device, args.kernels) for r in runs]
    if len(runs) > 1:
        tables.append(comparison_table(runs, device))
    return "\n\n".join(tables)


def main(argv=None):
    try:
        print(run(sys.argv[1:] if argv is None else argv))
    except CliError as e:
        print(f"floor_model.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
