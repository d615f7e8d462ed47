"""
scaling_model.py: the analytic multi-GPU scaling model behind doc/scaling.md. Given a model
size, N GPUs, the precision, the ZeRO stage, one GPU's measured (or target) time per step
and the link bandwidths, it prints the expected step time as a markdown table: compute
(the same per-GPU batch as on one GPU) plus the communication that compute does not hide,
with the bytes each collective moves per optimizer step.

Why it is shaped so:
- The parameter layout is re-derived here exactly as llmc/gpt2_config.h and llmc/zero.h do
  it (the 16 tensors, Vp = 50257 rounded up to a multiple of 128, shards of S elements, S a
  multiple of 256, per-layer gradient chunks), and test/test_scaling_model.py checks it
  against zero.h compiled, so the byte counts are the trainer's, not a textbook's.
- Each collective is priced alpha + bytes x factor / bus bandwidth, the nccl-tests
  convention, and factor is derived from the layout, not assumed: every piece goes to
  (gradients: ncclReduce) or comes from (weights: ncclBroadcast, ncclAllGather) its owner,
  so each rank sends or receives the whole buffer but its own bytes, and the busiest rank
  carries 1 - the smallest share of the bytes any rank owns. A whole shard per rank gives
  the ring's (N-1)/N; a buffer that some rank owns none of (a layer's slices at large N,
  wte + wpe + lnf) gives 1.
- ZeRO-1 gathers the weights in L + 1 stages on the NCCL stream (llmc/zero_comm.cuh): stage 0
  is wte and wpe in bf16, issued as soon as the optimizer (which updates the 16 tensors in
  order, wte and wpe first) has updated them, so it overlaps the rest of the update; stage
  1 + l is layer l's slices (the matmul weights as FP8 codes in an FP8 run), the last one with
  lnfw and lnfb, issued after the whole update and queued behind stage 0. The next step's
  first forward waits for stage 0 before the encoder and for stage 1 + l before layer l, so
  what stage 0 does not hide behind the update is exposed, and so are the stages that arrive
  after compute reaches their layer. ZeRO-3 gathers its matmul weights per layer instead, and
  its small bf16 rest in one stage after the update, before the encoder.
- Overlap is decided by simulating one stream of compute and one NCCL stream in program
  order, with the compute time split over layers by FLOPs: a collective starts when its
  data is ready and the NCCL stream is free; compute waits for the weight stages (first
  micro-step) and ZeRO-3's layer gathers. So "the last gradient chunk is exposed", "a
  weight stage arrives late" and "the NCCL stream falls behind" all come out of one rule
  instead of special cases.
- Multi-node bandwidth: NCCL builds one ring per NIC (rail-optimized H100 nodes have one
  400 Gb/s NIC per GPU) and each ring leaves the node through a different NIC, so a ring's
  bus bandwidth across nodes is min(NVLink bus bandwidth, NICs per node x NIC bandwidth).
  --nics-per-node 1 gives the pessimistic "slowest link" reading.
- One GPU's time comes from one of: the DESIGN.md section 7 targets (--targets), a
  dev/bench/bench.py JSON (--bench), or figures given on the command line (--compute).
  Bad arguments end the program with one line naming the argument and what was expected.

Usage: python3 dev/bench/scaling_model.py --targets --models d12 d48 --gpus 1 8 64
       python3 dev/bench/scaling_model.py --bench doc/benchmarks/DATE-GPU.json --gpus 8 64
       python3 dev/bench/scaling_model.py --compute d12:bf16:65536:139.4 --gpus 8
"""
import argparse
import collections
import dataclasses
import json
import os
import sys

VOCAB = 50257
VOCAB_PAD_MULTIPLE = 128
MAX_SEQ_LEN = 1024
ZERO_ALIGN = 256  # QUANT8_BLOCK: shard boundaries are multiples of this many elements
PRESETS = {"d12": (12, 768), "d24": (24, 1024), "d36": (36, 1280), "d48": (48, 1600)}  # L, C (gpt2_config.h)
WHOLE_MODEL_TENSORS = ("wte", "wpe", "lnfw", "lnfb")  # the last gradient chunk; the rest are per layer
EARLY_STAGE_TENSORS = ("wte", "wpe")  # ZeRO-1's stage 0: updated first, gathered while the rest are updated
FINAL_LAYERNORM_TENSORS = ("lnfw", "lnfb")  # read after the last layer: in ZeRO-1's last layer's stage
# -f8's default block linears (the trainer's; lm_head is off): the FP8 runs this model reads from a bench JSON
ALL_BLOCK_LINEARS = "qkv,attproj,fc,fcproj"
MATMUL_TENSORS = ("qkvw", "attprojw", "fcw", "fcprojw")  # cast to FP8 per layer; wte stays bf16 (encoder, lm_head)
PRECISIONS = ("bf16", "fp8")
ZERO_STAGES = (1, 3)
FP8_CODE_GATHERS = ("whole", "matmul")
MB = 1e6

# DESIGN.md section 7, one H100, T=1024: TARGETS, not measurements. (micro-batch B, bf16 tok/s,
# FP8 end-to-end speed-up over bf16)
DESIGN_TARGETS = {"d12": (64, 470_000, 1.15), "d48": (16, 50_000, 1.45)}


class CliError(Exception):
    """a bad argument or input file: main prints it as one line and exits 2"""


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    num_layers: int
    channels: int
    padded_vocab: int
    tensor_sizes: dict  # name -> elements, all layers included, in llm.c's order (gpt2_param_sizes)

    @property
    def num_parameters(self):
        return sum(self.tensor_sizes.values())

    def slice_range(self, tensor, layer=None):
        """flat [begin, end) of one layer's slice of a tensor (layer None: all of it), as zero_slice_range"""
        names = list(self.tensor_sizes)
        begin = sum(self.tensor_sizes[name] for name in names[:names.index(tensor)])
        n = self.tensor_sizes[tensor]
        if layer is not None:
            n //= self.num_layers
            begin += layer * n
        return begin, begin + n

    @property
    def layer_chunk_elements(self):
        """one layer's twelve slices: gradient chunk l < L"""
        per_layer = sum(n for name, n in self.tensor_sizes.items() if name not in WHOLE_MODEL_TENSORS)
        return per_layer // self.num_layers

    @property
    def last_chunk_elements(self):
        """wte + wpe + lnfw + lnfb: gradient chunk L, complete at the end of backward"""
        return sum(self.tensor_sizes[name] for name in WHOLE_MODEL_TENSORS)

    @property
    def matmul_elements(self):
        """the 4 L FP8 weight slices (qkvw, attprojw, fcw, fcprojw of every layer)"""
        return sum(self.tensor_sizes[name] for name in MATMUL_TENSORS)

    @property
    def layer_matmul_elements(self):
        return self.matmul_elements // self.num_layers

    @property
    def bf16_rest_elements(self):
        """what is not FP8-cast and must still reach every rank in bf16: wte (the encoder reads
        its rows; lm_head is bf16 by default), wpe, layernorms, biases"""
        return self.num_parameters - self.matmul_elements


def model_shape(name):
    if name not in PRESETS:
        raise CliError(f"model '{name}' is unknown (expected one of {', '.join(PRESETS)})")
    L, C = PRESETS[name]
    Vp = (VOCAB + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE
    sizes = {
        "wte": Vp * C, "wpe": MAX_SEQ_LEN * C, "ln1w": L * C, "ln1b": L * C,
        "qkvw": L * 3 * C * C, "qkvb": L * 3 * C, "attprojw": L * C * C, "attprojb": L * C,
        "ln2w": L * C, "ln2b": L * C, "fcw": L * 4 * C * C, "fcb": L * 4 * C,
        "fcprojw": L * C * 4 * C, "fcprojb": L * C, "lnfw": C, "lnfb": C,
    }
    return Shape(name, L, C, Vp, sizes)


def shard_size(num_parameters, num_ranks):
    """zero_layout_init's S: the smallest multiple of ZERO_ALIGN with num_ranks x S >= P"""
    unit = num_ranks * ZERO_ALIGN
    return (num_parameters + unit - 1) // unit * ZERO_ALIGN


@dataclasses.dataclass(frozen=True)
class Network:
    gpus_per_node: int = 8
    intra_bw_gbs: float = 450.0     # NVLink all-gather / reduce-scatter bus bandwidth, H100 SXM
    nic_bw_gbs: float = 50.0        # one 400 Gb/s InfiniBand NIC
    nics_per_node: int = 8          # rail-optimized: one NIC per GPU
    intra_latency_us: float = 10.0  # one NCCL collective (or group) on one node
    inter_latency_us: float = 20.0  # the same across nodes

    def bus_bandwidth(self, num_gpus):
        """bytes/s a ring achieves: NVLink on one node; across nodes each ring leaves a node
        through its own NIC, so the node's NICs together, capped by NVLink"""
        if num_gpus <= self.gpus_per_node:
            return self.intra_bw_gbs * 1e9
        return min(self.intra_bw_gbs, self.nics_per_node * self.nic_bw_gbs) * 1e9

    def latency_s(self, num_gpus):
        return (self.intra_latency_us if num_gpus <= self.gpus_per_node else self.inter_latency_us) * 1e-6


def busiest_rank_factor(shape, num_gpus, pieces):
    """
    The share of a collective's bytes (the flat ranges of `pieces`, (begin, end, bytes per
    element) each, together) that the busiest rank sends or receives when every piece goes to
    or comes from its owner (zero_owner): each rank moves all of it but the bytes it owns
    itself, so 1 - the smallest share one rank owns. The bytes, not the elements: a weight
    stage mixes 1-byte FP8 codes with 2-byte bf16 slices.
    """
    S = shard_size(shape.num_parameters, num_gpus)
    owned = [0] * num_gpus
    total = 0
    for begin, end, element_bytes in pieces:
        total += (end - begin) * element_bytes
        at = begin
        while at < end:
            rank = at // S
            stop = min(end, (rank + 1) * S)
            owned[rank] += (stop - at) * element_bytes
            at = stop
    return 1.0 - min(owned) / total


def all_reduce_factor(num_gpus):
    """a ring all-reduce: a reduce-scatter and an all-gather"""
    return 2 * (num_gpus - 1) / num_gpus


def collective_ms(net, num_gpus, nbytes, factor):
    """one collective (or NCCL group) among num_gpus > 1 ranks: alpha + nbytes x factor / bus bandwidth"""
    return 1e3 * (net.latency_s(num_gpus) + nbytes * factor / net.bus_bandwidth(num_gpus))


@dataclasses.dataclass(frozen=True)
class Compute:
    """one GPU's step: tokens (B x T) and ms per step, of which optimizer_ms is the update"""
    tokens: int
    ms_per_step: float
    optimizer_ms: float = 0.0
    seq_len: int = MAX_SEQ_LEN
    source: str = ""

    @property
    def micro_ms(self):
        return self.ms_per_step - self.optimizer_ms


def compute_split(shape, compute):
    """(forward ms of one layer, backward ms of one layer, lm_head forward + backward ms) of one
    micro-step: the time split by forward FLOPs per token (a layer: 2 x 12 C^2 for its matmuls
    + 4 T C for attention; lm_head: 2 Vp C), backward twice forward"""
    C = shape.channels
    layer_flops = 24 * C * C + 4 * compute.seq_len * C
    head_flops = 2 * shape.padded_vocab * C
    ms_per_flop = compute.micro_ms / (3 * (shape.num_layers * layer_flops + head_flops))
    return layer_flops * ms_per_flop, 2 * layer_flops * ms_per_flop, 3 * head_flops * ms_per_flop


class NcclStream:
    """collectives run one at a time in the order they are issued, each once its data is ready"""

    def __init__(self, free_at=0.0):
        self.free_at = free_at

    def run(self, ready, duration):
        self.free_at = max(ready, self.free_at) + duration
        return self.free_at


def simulate_micro_step(shape, split, stage_ms, layer_gather_ms, chunk_reduce_ms, stage0_lead_ms=0.0):
    """
    One micro-step on one compute stream and one NCCL stream; t = 0 is the end of the last
    update. stage_ms: the weight stages gathered after it (None: not the first micro-step, the
    weights are all there), on the NCCL stream back to back: stage 0 from -stage0_lead_ms (ZeRO-1
    issues it during the update), the others from 0 or once stage 0 is done; the encoder (no
    time of its own) waits for stage 0 and layer l's forward for stage 1 + l, where there is
    one. layer_gather_ms: ZeRO-3's gather of each layer's matmul weights (None: weights are whole), in forward and again in
    backward, one layer ahead into a double buffer, queued behind the stages: the next layer's
    gather runs while a layer computes, and the one after starts when that layer is done with
    its buffer. chunk_reduce_ms: ([each layer's chunk], last chunk) gradient reduces issued as
    backward completes them (None: not the last micro-step).
    Returns (ms compute waited for gathers, ms the NCCL stream runs past the end of compute).
    """
    fwd_ms, bwd_ms, head_ms = split
    L = shape.num_layers
    nccl = NcclStream(-stage0_lead_ms if stage_ms else 0.0)
    t, stall = 0.0, 0.0

    def compute(ready, duration):
        nonlocal t, stall
        stall += max(0.0, ready - t)
        t = max(t, ready) + duration

    stage_arrived = [nccl.run(-stage0_lead_ms if stage == 0 else t, ms) for stage, ms in enumerate(stage_ms or ())]
    stage_arrived += [0.0] * (L + 1 - len(stage_arrived))  # --fp8-codes whole: one stage, before the encoder
    gathered = {}
    if layer_gather_ms is not None:
        for layer in range(min(2, L)):
            gathered[layer] = nccl.run(t, layer_gather_ms[layer])
    compute(stage_arrived[0], 0.0)  # the encoder
    for layer in range(L):
        compute(max(stage_arrived[1 + layer], gathered.get(layer, t)), fwd_ms)
        if layer_gather_ms is not None and layer + 2 < L:
            gathered[layer + 2] = nccl.run(t, layer_gather_ms[layer + 2])
    gathered = {}
    if layer_gather_ms is not None:
        for layer in range(L - 1, max(L - 3, -1), -1):
            gathered[layer] = nccl.run(t, layer_gather_ms[layer])
    t += head_ms
    for layer in range(L - 1, -1, -1):
        compute(gathered.get(layer, t), bwd_ms)
        if layer_gather_ms is not None and layer - 2 >= 0:
            gathered[layer - 2] = nccl.run(t, layer_gather_ms[layer - 2])
        if chunk_reduce_ms is not None:
            nccl.run(t, chunk_reduce_ms[0][layer])
    if chunk_reduce_ms is not None:
        nccl.run(t, chunk_reduce_ms[1])
    return stall, max(0.0, nccl.free_at - t)


@dataclasses.dataclass(frozen=True)
class Estimate:
    num_gpus: int
    tokens_per_step: int
    compute_ms: float          # A micro-steps + the optimizer on 1/N of the parameters
    grad_bytes: int            # reduced per optimizer step
    gather_bytes: int          # weights gathered per optimizer step (ZeRO-3: the per-layer gathers included)
    exposed_grad_ms: float     # gradient reduces not hidden behind backward
    exposed_gather_ms: float   # weight gathers compute waited for: the weight stages, ZeRO-3's layer gathers
    small_all_reduce_ms: float  # loss, gradient norm, FP8 amax
    step_ms: float
    single_gpu_step_ms: float  # the same micro-steps on one GPU

    @property
    def tok_per_s(self):
        return self.tokens_per_step / self.step_ms * 1e3

    @property
    def vs_linear(self):
        """tok/s over N x one GPU's tok/s at the same per-GPU batch"""
        return self.single_gpu_step_ms / self.step_ms


@dataclasses.dataclass(frozen=True)
class Collective:
    nbytes: int
    factor: float  # the share of nbytes the busiest rank sends or receives


@dataclasses.dataclass(frozen=True)
class Collectives:
    """the collectives of one optimizer step on N GPUs"""
    grad_layers: tuple       # per layer: its gradients to their owners, during the last backward
    grad_last: Collective    # wte + wpe + lnf's gradients, at the end of backward
    weight_stages: tuple     # back to back: each stage a tuple of collectives; the first forward waits
                             # for stage 0 before the encoder and for stage 1 + l before layer l
    stage0_waits_for_elements: int  # the parameters the optimizer updates before stage 0 is issued (updated
                                    # in llm.c's tensor order): P, or ZeRO-1's wte + wpe
    zero3_layers: tuple      # ZeRO-3, per layer: its matmul weights, in forward and again in backward
    amax_all_reduce: int     # FP8: one float per block linear's weight slice (4 L; lm_head is cast from the bf16 wte); bf16: none

    @property
    def weight_stage_bytes(self):
        """the weights gathered after the update, every stage together"""
        return sum(one.nbytes for stage in self.weight_stages for one in stage)


def collectives(shape, precision, zero_stage, num_gpus, grad_fp32=False, fp8_codes="matmul"):
    """
    What each collective moves, by doc/multi-gpu.md and llmc/zero_comm.cuh: gradients in bf16
    (fp32 as an option), one group per layer chunk. ZeRO-1's weights go in L + 1 stages, each
    one NCCL group of broadcasts from the owners: stage 0 wte and wpe in bf16 (the encoder reads
    wte's rows; lm_head is bf16 by default), issued once the optimizer has updated them; stage
    1 + l layer l's slices, its matmul weights as FP8 codes in an FP8 run (bf16 in a bf16 one)
    and its layernorms and biases in bf16, the last layer's with lnfw and lnfb (bf16), issued
    after the whole update. ZeRO-3 gathers the matmul weights per layer in their GEMM
    format instead, and the bf16 rest after the update in one stage. Building W^T from a
    stage's codes (on the NCCL stream, memory-bound) is not priced, as ZeRO-3's is not. fp8_codes "whole" prices DESIGN.md's step 3 instead (ZeRO-1 FP8 only):
    one ncclAllGather of every rank's S bytes of codes and one group of the rest in bf16, both
    waited for before the encoder.
    """
    L = shape.num_layers

    def collective(pieces):
        """pieces: (begin, end, bytes per element) of the flat parameters"""
        return Collective(sum((end - begin) * element_bytes for begin, end, element_bytes in pieces),
                          busiest_rank_factor(shape, num_gpus, pieces))

    def slices(tensors, layer, element_bytes):
        return [(*shape.slice_range(t, layer), element_bytes) for t in tensors]

    grad_bytes = 4 if grad_fp32 else 2
    weight_bytes = 1 if precision == "fp8" else 2
    layer_tensors = [t for t in shape.tensor_sizes if t not in WHOLE_MODEL_TENSORS]
    layer_rest = [t for t in layer_tensors if t not in MATMUL_TENSORS]
    whole_rest = collective(slices([t for t in shape.tensor_sizes if t not in MATMUL_TENSORS], None, 2))
    stage0_waits_for_elements = shape.num_parameters
    if zero_stage == 3:
        weight_stages = ((whole_rest,),)
    elif precision == "fp8" and fp8_codes == "whole":
        codes = collective([(0, num_gpus * shard_size(shape.num_parameters, num_gpus), 1)])
        weight_stages = ((codes, whole_rest),)
    else:
        stage0_waits_for_elements = sum(shape.tensor_sizes[t] for t in EARLY_STAGE_TENSORS)
        final_layernorm = [slices(FINAL_LAYERNORM_TENSORS, None, 2) if l == L - 1 else [] for l in range(L)]
        weight_stages = ((collective(slices(EARLY_STAGE_TENSORS, None, 2)),),) + tuple(
            (collective(slices(MATMUL_TENSORS, l, weight_bytes) + slices(layer_rest, l, 2) + final_layernorm[l]),)
            for l in range(L))
    zero3_layers = ()
    if zero_stage == 3:
        zero3_layers = tuple(collective(slices(MATMUL_TENSORS, l, weight_bytes)) for l in range(L))
    return Collectives(
        grad_layers=tuple(collective(slices(layer_tensors, l, grad_bytes)) for l in range(L)),
        grad_last=collective(slices(WHOLE_MODEL_TENSORS, None, grad_bytes)),
        weight_stages=weight_stages,
        stage0_waits_for_elements=stage0_waits_for_elements,
        zero3_layers=zero3_layers,
        amax_all_reduce=4 * 4 * L if precision == "fp8" else 0,
    )


def estimate_step(shape, precision, zero_stage, num_gpus, compute, net, grad_accum=1, grad_fp32=False,
                  fp8_codes="matmul"):
    """the expected optimizer step on num_gpus GPUs, each running compute's micro-batch grad_accum times:
    the first micro-step waits for the weight stages, the last one reduces the gradients. The update
    (compute.optimizer_ms / N, spread over the parameters by count) hides what stage 0 gathers while it
    updates the parameters after those stage 0 waits for"""
    compute_ms = grad_accum * compute.micro_ms + compute.optimizer_ms / num_gpus
    single_gpu_step_ms = grad_accum * compute.micro_ms + compute.optimizer_ms
    if num_gpus == 1:  # no NCCL at all
        return Estimate(1, grad_accum * compute.tokens, compute_ms, 0, 0, 0.0, 0.0, 0.0, compute_ms, single_gpu_step_ms)
    c = collectives(shape, precision, zero_stage, num_gpus, grad_fp32, fp8_codes)

    def ms(collective):
        return collective_ms(net, num_gpus, collective.nbytes, collective.factor)

    stage_ms = [sum(ms(one) for one in stage) for stage in c.weight_stages]
    layer_gather_ms = [ms(layer) for layer in c.zero3_layers] or None
    chunk_reduce_ms = ([ms(layer) for layer in c.grad_layers], ms(c.grad_last))
    split = compute_split(shape, compute)
    stage0_lead_ms = compute.optimizer_ms / num_gpus * (1 - c.stage0_waits_for_elements / shape.num_parameters)
    exposed_grad_ms, exposed_gather_ms = 0.0, 0.0
    micro_steps = collections.Counter((i == 0, i == grad_accum - 1) for i in range(grad_accum))
    for (first, last), count in micro_steps.items():
        stall, tail = simulate_micro_step(shape, split, stage_ms if first else None, layer_gather_ms,
                                          chunk_reduce_ms if last else None, stage0_lead_ms)
        exposed_gather_ms += count * stall
        if last:
            exposed_grad_ms = tail
        else:
            exposed_gather_ms += count * tail
    small_ms = 2 * collective_ms(net, num_gpus, 4, all_reduce_factor(num_gpus))  # loss and gradient norm
    if c.amax_all_reduce:
        small_ms += collective_ms(net, num_gpus, c.amax_all_reduce, all_reduce_factor(num_gpus))
    per_layer_gathers = 2 * grad_accum * sum(layer.nbytes for layer in c.zero3_layers)
    return Estimate(
        num_gpus=num_gpus,
        tokens_per_step=num_gpus * grad_accum * compute.tokens,
        compute_ms=compute_ms,
        grad_bytes=sum(layer.nbytes for layer in c.grad_layers) + c.grad_last.nbytes,
        gather_bytes=c.weight_stage_bytes + per_layer_gathers,
        exposed_grad_ms=exposed_grad_ms,
        exposed_gather_ms=exposed_gather_ms,
        small_all_reduce_ms=small_ms,
        step_ms=compute_ms + exposed_grad_ms + exposed_gather_ms + small_ms,
        single_gpu_step_ms=single_gpu_step_ms,
    )


# ----------------------------------------------------------------------------
# one GPU's time per step: targets, a bench JSON, or the command line

def compute_from_targets(seq_len):
    table = {}
    for model, (batch, bf16_tok_s, fp8_speedup) in DESIGN_TARGETS.items():
        tokens = batch * seq_len
        for precision, tok_s in (("bf16", bf16_tok_s), ("fp8", bf16_tok_s * fp8_speedup)):
            table[(model, precision)] = Compute(tokens, tokens / tok_s * 1e3, 0.0, seq_len,
                                                f"DESIGN.md section 7 target: B={batch}, {tok_s:,.0f} tok/s")
    return table


def compute_from_bench(path, recipe, optimizer, weight_scaling="current", lm_head="bf16"):
    """one GPU's time per (model, precision) from bench.py's train records with fp32 master weights
    (the default): bf16 with `optimizer`, FP8 with `recipe`, `optimizer`, -fw `weight_scaling`,
    lm_head in `lm_head` and -fg current, all with -ge 1 (bench.py times several variants of a model; exactly one may
    match)"""
    try:
        with open(path) as f:
            records = json.load(f)
    except OSError as e:
        raise CliError(f"--bench {path}: cannot read it ({e.strerror})")
    except json.JSONDecodeError as e:
        raise CliError(f"--bench {path}: not JSON ({e.msg} at line {e.lineno})")
    if not isinstance(records, list):
        raise CliError(f"--bench {path}: expected a list of records as dev/bench/bench.py writes")
    table = {}
    for rec in records:
        if not isinstance(rec, dict) or "error" in rec or rec.get("optimizer") != optimizer:
            continue
        if rec.get("benchmark", "train") != "train" or rec.get("master_weights") is False or rec.get("gelu_fusion", 1) != 1 \
                or rec.get("attention_deterministic", 1) != 1 or rec.get("fc_writes_codes", 0) != 0 \
                or rec.get("fp8_block_linears", ALL_BLOCK_LINEARS) != ALL_BLOCK_LINEARS:
            # bench.py's runs at its VARIED_SETTINGS defaults
            continue
        if rec.get("precision") == "fp8" and (rec.get("recipe") != recipe or rec.get("lm_head", lm_head) != lm_head
                                              or rec.get("weight_scaling", weight_scaling) not in (weight_scaling, "-")
                                              or rec.get("grad_scaling", "current") not in ("current", "-")):
            continue
        try:
            tokens, ms = int(rec["B"]) * int(rec["T"]), float(rec["ms_per_step"])
            opt_ms = float(rec["optimizer_ms"]) if rec.get("optimizer_ms") is not None else 0.0
            key = (rec["model"], rec["precision"])
        except (KeyError, TypeError, ValueError):
            raise CliError(f"--bench {path}: a record lacks B, T, ms_per_step, model or precision: {str(rec)[:120]}")
        if key in table:
            raise CliError(f"--bench {path}: two records for {key[0]} {key[1]} with recipe {recipe}, optimizer {optimizer}, "
                           f"-fw {weight_scaling}, lm_head {lm_head}: keep one")
        table[key] = Compute(tokens, ms, opt_ms, int(rec["T"]),
                             f"{os.path.basename(path)}: {rec.get('device', '?')}, B={rec['B']}, {rec.get('tok_per_s', 0):,.0f} tok/s")
    return table


def parse_compute_spec(spec, seq_len):
    """MODEL:PRECISION:TOKENS:MS[:OPTIMIZER_MS]"""
    parts = spec.split(":")
    expected = "expected MODEL:PRECISION:TOKENS_PER_STEP:MS_PER_STEP[:OPTIMIZER_MS], e.g. d12:bf16:65536:139.4"
    if len(parts) not in (4, 5):
        raise CliError(f"--compute {spec}: {expected}")
    model, precision = parts[0], parts[1]
    model_shape(model)
    if precision not in PRECISIONS:
        raise CliError(f"--compute {spec}: precision '{precision}' (expected bf16 or fp8)")
    try:
        tokens, ms = int(parts[2]), float(parts[3])
        opt_ms = float(parts[4]) if len(parts) == 5 else 0.0
    except ValueError:
        raise CliError(f"--compute {spec}: {expected}")
    if tokens <= 0 or not ms > 0 or not 0 <= opt_ms < ms:
        raise CliError(f"--compute {spec}: need TOKENS > 0, MS > 0 and 0 <= OPTIMIZER_MS < MS")
    return (model, precision), Compute(tokens, ms, opt_ms, seq_len, f"--compute {spec}")


# ----------------------------------------------------------------------------
# the table

def format_table(rows):
    header = ("| model | precision | ZeRO | GPUs | bus GB/s | grads reduced MB | weights gathered MB | compute ms "
              "| exposed grads ms | exposed gathers ms | small all-reduces ms | step ms | tok/s | vs linear |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for model, precision, zero_stage, net, est in rows:
        bus = f"{net.bus_bandwidth(est.num_gpus) / 1e9:.0f}" if est.num_gpus > 1 else "-"
        lines.append(f"| {model} | {precision} | {zero_stage} | {est.num_gpus} | {bus} | {est.grad_bytes / MB:.1f} "
                     f"| {est.gather_bytes / MB:.1f} | {est.compute_ms:.2f} | {est.exposed_grad_ms:.2f} "
                     f"| {est.exposed_gather_ms:.2f} | {est.small_all_reduce_ms:.3f} | {est.step_ms:.2f} "
                     f"| {est.tok_per_s:,.0f} | {100 * est.vs_linear:.1f}% |")
    return "\n".join(lines)


def format_collective(group):
    """'MB xfactor' of one collective, or of per-layer ones (equal bytes, a range of factors)"""
    group = group if isinstance(group, tuple) else (group,)
    if not group:
        return "-"
    low, high = min(c.factor for c in group), max(c.factor for c in group)
    factor = f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"
    mb = group[0].nbytes / MB
    return f"{mb:.1f} x{factor}" if mb >= 1 else f"{mb:.3f} x{factor}"


def format_bytes_table(rows):
    """rows: (model, precision, ZeRO stage, Collectives); stage 0 with --fp8-codes whole: its two collectives"""
    lines = ["| model | precision | ZeRO | grads: each layer's chunk (L per step) | grads: last chunk "
             "| weights: stage 0 | weights: each layer's stage (L per step; the last + lnf) "
             "| ZeRO-3: each layer's gather (2 L per micro-step) | FP8 amax all-reduce bytes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, precision, zero_stage, c in rows:
        stage0 = " + ".join(format_collective(one) for one in c.weight_stages[0])
        layer_stages = tuple(one for stage in c.weight_stages[1:] for one in stage)
        cells = [format_collective(c.grad_layers), format_collective(c.grad_last), stage0,
                 format_collective(layer_stages), format_collective(c.zero3_layers)]
        lines.append(f"| {model} | {precision} | {zero_stage} | " + " | ".join(cells) + f" | {c.amax_all_reduce} |")
    return "\n".join(lines)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise CliError(message)


def positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a {'whole ' if kind is int else ''}number")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"'{text}' must be > 0")
        return value
    return parse


def non_negative(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be >= 0")
    return value


def build_parser():
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--targets", action="store_true", help="one GPU's time from DESIGN.md section 7's targets")
    source.add_argument("--bench", metavar="JSON", help="one GPU's time from a dev/bench/bench.py JSON")
    source.add_argument("--compute", metavar="SPEC", action="append",
                        help="MODEL:PRECISION:TOKENS_PER_STEP:MS_PER_STEP[:OPTIMIZER_MS], repeatable")
    p.add_argument("--bench-recipe", default="delayed", help="FP8 recipe of the bench records to use (default delayed)")
    p.add_argument("--bench-optimizer", default="adamw", help="optimizer of the bench records to use (default adamw)")
    p.add_argument("--bench-fw", default="current", help="-fw of the FP8 bench records to use (default current, the trainer's)")
    p.add_argument("--bench-lm-head", default="bf16", choices=("bf16", "fp8"),
                   help="lm_head precision of the FP8 bench records to use (default bf16, the trainer's)")
    p.add_argument("--models", nargs="+", default=None, help="default: every model the time source has")
    p.add_argument("--gpus", nargs="+", type=positive(int), default=[1, 8, 64])
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--zero", nargs="+", type=int, choices=ZERO_STAGES, default=list(ZERO_STAGES))
    p.add_argument("--grad-accum", type=positive(int), default=1, help="micro-steps per optimizer step (default 1)")
    p.add_argument("--grad-fp32", action="store_true", help="reduce gradients in fp32 (4 bytes) instead of bf16")
    p.add_argument("--fp8-codes", choices=FP8_CODE_GATHERS, default="matmul",
                   help="ZeRO-1 FP8 gather: the matmul weights' codes from their owners in each layer's stage, "
                        "which the next forward waits for layer by layer (matmul, llmc/zero_comm.cuh), or one "
                        "ncclAllGather of every rank's whole shard of codes and the rest in bf16, all waited for "
                        "before the forward (whole, DESIGN.md's step 3)")
    p.add_argument("--seq-len", type=positive(int), default=MAX_SEQ_LEN, help="T, for --targets and --compute")
    p.add_argument("--gpus-per-node", type=positive(int), default=Network.gpus_per_node)
    p.add_argument("--intra-bw", type=positive(float), default=Network.intra_bw_gbs, help="NVLink bus GB/s")
    p.add_argument("--nic-bw", type=positive(float), default=Network.nic_bw_gbs, help="GB/s of one NIC")
    p.add_argument("--nics-per-node", type=positive(int), default=Network.nics_per_node)
    p.add_argument("--intra-latency-us", type=non_negative, default=Network.intra_latency_us)
    p.add_argument("--inter-latency-us", type=non_negative, default=Network.inter_latency_us)
    return p


def run(argv):
    args = build_parser().parse_args(argv)
    if args.targets:
        table = compute_from_targets(args.seq_len)
    elif args.bench:
        table = compute_from_bench(args.bench, args.bench_recipe, args.bench_optimizer, args.bench_fw, args.bench_lm_head)
    else:
        table = dict(parse_compute_spec(spec, args.seq_len) for spec in args.compute)
    models = args.models or sorted({m for m, _ in table if m in PRESETS}, key=lambda m: PRESETS[m][1])
    for n in args.gpus:
        if n > args.gpus_per_node and n % args.gpus_per_node:
            raise CliError(f"--gpus {n}: more than one node must be whole nodes (a multiple of --gpus-per-node {args.gpus_per_node})")
    net = Network(args.gpus_per_node, args.intra_bw, args.nic_bw, args.nics_per_node,
                  args.intra_latency_us, args.inter_latency_us)
    rows, byte_rows, sources = [], [], []
    for model in models:
        shape = model_shape(model)
        for precision in args.precisions:
            if (model, precision) not in table:
                raise CliError(f"no single-GPU time for {model} {precision} in the chosen source "
                               f"(have: {', '.join(f'{m} {p}' for m, p in sorted(table)) or 'none'})")
            compute = table[(model, precision)]
            sources.append(f"- {model} {precision}: {compute.ms_per_step:.2f} ms per step of {compute.tokens} tokens "
                           f"(optimizer {compute.optimizer_ms:.2f} ms) from {compute.source}")
            for zero_stage in args.zero:
                byte_rows.append((model, precision, zero_stage, collectives(shape, precision, zero_stage, max(args.gpus), args.grad_fp32, args.fp8_codes)))
                for n in args.gpus:
                    est = estimate_step(shape, precision, zero_stage, n, compute, net, args.grad_accum,
                                        args.grad_fp32, args.fp8_codes)
                    rows.append((model, precision, zero_stage, net, est))
    print("One GPU's time per step:")
    print("\n".join(sources))
    print(f"\nNetwork: NVLink bus {net.intra_bw_gbs:g} GB/s, {net.nics_per_node} x {net.nic_bw_gbs:g} GB/s NICs per "
          f"{net.gpus_per_node}-GPU node, latency {net.intra_latency_us:g} us (one node) / {net.inter_latency_us:g} us "
          f"(across nodes); {args.grad_accum} micro-step(s) per optimizer step; gradients in "
          f"{'fp32' if args.grad_fp32 else 'bf16'}; FP8 codes gathered: {args.fp8_codes}.\n")
    print(format_table(rows))
    print(f"\nBytes per collective, MB x the share the busiest rank sends or receives, for N = {max(args.gpus)} "
          f"(latency-bound, not listed: the loss and gradient-norm all-reduces, 4 bytes each):\n")
    print(format_bytes_table(byte_rows))


def main(argv=None):
    try:
        run(sys.argv[1:] if argv is None else argv)
    except CliError as e:
        print(f"scaling_model.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
