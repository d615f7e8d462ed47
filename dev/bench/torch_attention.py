#!/usr/bin/env python3
"""
torch_attention.py: PyTorch's scaled_dot_product_attention timed at the trainer's attention
shapes, backend by backend, beside llm8's own attention rows. Is the attention's gap to its
floor what the best kernel on this GPU leaves, or a cost of how llm8 calls cuDNN?

Why: on 2026-11-30 (H200, d12, B=64, T=1024) cuDNN's causal attention backward took 14.8 ms
of bf16's 107 ms step, 1.23 ms a layer, 4.7 times its compute floor: the largest gap to a
floor in the step (doc/performance.md); the forward took 4.2 ms, 2.9 times. llm8 hands cuDNN
q, k and v as strided views into the fused qkv buffer (B, T, 3, NH, HS) and asks for its
deterministic backward (-ad 1; -ad 0 took 13.9 ms). Whether another kernel does better at
head size 64 and T=1024 only a GPU can say, and PyTorch, on the device machine already, runs
the same problem through other kernels: FlashAttention-2's (its flash backend), cuDNN's own
graph (its cudnn backend) and its memory-efficient kernels.

What it measures, per model (bench.py's batch for it, T=1024, head size 64), per backend this
PyTorch has, per layout of q, k and v (qkv: strided views into one (B, T, 3, NH, HS) buffer, as
llm8's; bthd: three (B, T, NH, HS) tensors, the same order without the interleaving; bhtd: three
(B, NH, T, HS) tensors, PyTorch's own): the causal forward alone, and its backward
alone (torch.autograd.grad over a kept graph, taken for q, k and v themselves, so neither the
forward nor a copy into a qkv gradient is in it), each the median of --iters launches after
--warmup, in ms a layer (the forward with autograd on, so it is the training kernel, which keeps
the softmax statistics as llm8's does) and in TFLOP/s of floor_model.py's causal FLOPs (2 B T^2 C forward,
5 B T^2 C backward: the same yardstick as the floor's). PyTorch asks for no deterministic
backward (this script leaves torch.use_deterministic_algorithms off), so its rows are closest
to llm8's -ad 0 row, whose dq sums with float atomics. A backend that refuses
a shape says why in its row (its first line). With --bench, a `make bench` JSON's llm8 rows
(the d12 bf16 default run's `attention fwd` and `attention bwd` from -kt 1, divided by L, and
the -ad 0 run's) stand in the same table, named by that file's date and device: the same GPU
model, another day, so differences under a few percent are not findings.

Usage: python3 dev/bench/torch_attention.py [--models d12,d48] [--iters 10] [--warmup 3]
                                            [--bench doc/benchmarks/DATE-GPU.json] [--json OUT.json]
(dev/gpu_session.sh first runs it at d12 and d48, into env.txt.)
"""
import argparse
import json
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's batch per model, and its -kt 1 rows)
import floor_model  # noqa: E402  (the head size)
import scaling_model  # noqa: E402  (the models' L and C)

T = 1024
DEVICE = "cuda"
# PyTorch's SDPBackend members, by the names the table gives them
BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
LAYOUTS = ("qkv", "bthd", "bhtd")
BATCH = {model: B for model, B, _ in bench.FULL_CONFIGS}


CliError = scaling_model.CliError  # one class, so floor_model's and scaling_model's one-line errors are caught too


def attention_flops(model, B, backward):
    """one layer's causal attention matrix FLOPs, floor_model's count (2 B T^2 C forward, 5 B T^2 C backward)"""
    region = "attention bwd" if backward else "attention fwd"
    kernels = floor_model.step_kernels(floor_model.Run(model=model, B=B, T=T))
    return sum(k.flops for k in kernels if k.region == region) / scaling_model.PRESETS[model][0]


def tflops(model, B, backward, ms):
    return attention_flops(model, B, backward) / (ms * 1e-3) / 1e12


def parse_models(text):
    models = [m for m in text.split(",") if m]
    unknown = [m for m in models if m not in BATCH]
    if not models or unknown:
        raise CliError(f"--models {text}: expected a comma list of {', '.join(BATCH)}")
    return models


def llm8_rows(path, models):
    """[(model, B, label, fwd ms, bwd ms)], ms a layer, from a make bench JSON: each model's first bf16 default
    run with -ad 1 and with -ad 0 (a run the file lacks is left out)"""
    try:
        with open(path) as f:
            records = json.load(f)
    except (OSError, ValueError) as e:
        raise CliError(f"--bench {path}: cannot read it as a make bench JSON ({e})")
    if not isinstance(records, list):
        raise CliError(f"--bench {path}: expected a list of records (a make bench JSON)")
    rows = []
    for model in models:
        layers = scaling_model.PRESETS[model][0]
        for deterministic in ("1", "0"):
            for r in records:
                if not (isinstance(r, dict) and r.get("benchmark") == "train" and r.get("model") == model
                        and r.get("precision") == "bf16" and r.get("optimizer") == "adamw" and r.get("kernel_breakdown")
                        and bench.setting_text(r, "attention_deterministic") == deterministic
                        and bench.setting_text(r, "gelu_fusion") == "1"):
                    continue
                fwd = bench.breakdown_ms(r["kernel_breakdown"], "attention fwd")
                bwd = bench.breakdown_ms(r["kernel_breakdown"], bench.ATTENTION_BACKWARD_ROW)
                if fwd is not None and bwd is not None:
                    label = f"llm8 cuDNN -ad {deterministic} ({r.get('date', '?')}, {r.get('device', '?')})"
                    rows.append((model, r["B"], label, fwd / layers, bwd / layers))
                break
    return rows


def table(measured, llm8):
    """markdown: a row per (model, backend, layout) measured and per llm8 row"""
    lines = ["## PyTorch scaled_dot_product_attention against llm8's attention (causal, T=1024, head size 64)", "",
             "| model | B | kernel | layout | fwd ms a layer | fwd TFLOP/s | bwd ms a layer | bwd TFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    for m in measured:
        if m.get("error"):
            lines.append(f"| {m['model']} | {m['B']} | torch {m['backend']} | {m['layout']} | n/a: {m['error']} | | | |")
        else:
            lines.append(f"| {m['model']} | {m['B']} | torch {m['backend']} | {m['layout']} | {m['fwd_ms']:.3f} | "
                         f"{tflops(m['model'], m['B'], False, m['fwd_ms']):.0f} | {m['bwd_ms']:.3f} | "
                         f"{tflops(m['model'], m['B'], True, m['bwd_ms']):.0f} |")
    for model, B, label, fwd, bwd in llm8:
        lines.append(f"| {model} | {B} | {label} | qkv | {fwd:.3f} | {tflops(model, B, False, fwd):.0f} | "
                     f"{bwd:.3f} | {tflops(model, B, True, bwd):.0f} |")
    return "\n".join(lines)


def measure(torch, model, backend, layout, iters, warmup):
    """one row: the forward's and the backward's median ms, or the backend's refusal"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention
    C = scaling_model.PRESETS[model][1]
    B, HS = BATCH[model], floor_model.HEAD_SIZE
    NH = C // HS
    row = {"model": model, "B": B, "T": T, "NH": NH, "HS": HS, "backend": backend, "layout": layout}
    kernel = getattr(SDPBackend, BACKENDS[backend], None)
    if kernel is None:
        row["error"] = f"this PyTorch has no SDPBackend.{BACKENDS[backend]}"
        return row
    generator = torch.Generator(device=DEVICE).manual_seed(1234)

    def normal(*shape):
        return torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16, generator=generator)

    # q, k, v as (B, NH, T, HS), SDPA's order, whatever the memory holds
    if layout == "qkv":
        qkv = normal(B, T, 3, NH, HS).requires_grad_()
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # llm8's strides
    elif layout == "bthd":
        q, k, v = (normal(B, T, NH, HS).requires_grad_().transpose(1, 2) for _ in range(3))
    else:
        q, k, v = (normal(B, NH, T, HS).requires_grad_() for _ in range(3))

    def median_ms(fn):
        for _ in range(warmup):
            fn()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)

    reasons = []
    try:
        with sdpa_kernel([kernel]), warnings.catch_warnings(record=True) as reasons:
            warnings.simplefilter("always")  # PyTorch says why it turns a backend down in a warning
            out = scaled_dot_product_attention(q, k, v, is_causal=True)
            dout = normal(*out.shape)
            # with autograd on, as in training: the kernel that also keeps the softmax statistics
            row["fwd_ms"] = median_ms(lambda: scaled_dot_product_attention(q, k, v, is_causal=True))
            row["bwd_ms"] = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    except RuntimeError as e:  # a backend that refuses the shape, or out of memory
        row["error"] = refusal(backend, [str(w.message) for w in reasons], e)
    return row


# how PyTorch's warnings name each backend before its reasons (sdp_utils.cpp: "Memory efficient kernel not used
# because:", "Flash attention kernel not used because:", "CuDNN attention kernel not used because:")
REFUSAL_HEADERS = {"efficient": "memory efficient kernel", "flash": "flash attention kernel", "cudnn": "cudnn attention kernel"}


def refusal(backend, warning_messages, error):
    """one table cell: why PyTorch turned the backend down. With every other backend off it warns a header per
    backend it checked ("... kernel not used because:"), each followed by that backend's reasons, one warning each,
    every message ending in "(Triggered internally at FILE:LINE.)"; then it raises "No available kernel". The cell
    holds this backend's reasons, then the error's first line."""
    reasons, current = [], None
    for message in warning_messages:
        text = message.split("(Triggered internally at")[0].strip()
        text = (text.splitlines() or [""])[0].strip()
        header = next((name for name, prefix in REFUSAL_HEADERS.items()
                       if text.lower().startswith(prefix) and "not used because" in text.lower()), None)
        if header is not None:
            current, text = header, text.split("because:", 1)[-1].strip()
        if text and current == backend:
            reasons.append(text)
    error_line = (str(error).strip().splitlines() or ["RuntimeError"])[0]
    return "; ".join(reasons + [error_line])[:200].replace("|", "/")


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="d12,d48", help="comma list of models (default d12,d48), each at bench.py's batch")
    parser.add_argument("--iters", type=int, default=10, help="timed launches per figure, 1..1000 (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="launches before the timed ones, 0..100 (default 3)")
    parser.add_argument("--bench", default="", help="a make bench JSON whose llm8 attention rows join the table")
    parser.add_argument("--json", default="", help="also write the measured rows to this file")
    return parser


def run(argv):
    args = build_parser().parse_args(argv)
    models = parse_models(args.models)
    if not 1 <= args.iters <= 1000:
        raise CliError(f"--iters {args.iters}: expected 1..1000")
    if not 0 <= args.warmup <= 100:
        raise CliError(f"--warmup {args.warmup}: expected 0..100")
    llm8 = llm8_rows(args.bench, models) if args.bench else []
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401  (PyTorch 2.3 or later)
    except ImportError as e:
        raise CliError(f"needs PyTorch 2.3 or later with CUDA (import failed: {e})")
    if not torch.cuda.is_available():
        raise CliError(f"needs a CUDA GPU, and PyTorch {torch.__version__} sees none")
    print(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    measured = [measure(torch, model, backend, layout, args.iters, args.warmup)
                for model in models for backend in BACKENDS for layout in LAYOUTS]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(measured, f, indent=1)
    print(table(measured, llm8))


def main(argv=None):
    try:
        run(sys.argv[1:] if argv is None else argv)
    except CliError as e:
        print(f"error: torch_attention.py: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
