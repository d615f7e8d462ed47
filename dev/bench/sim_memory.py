"""
sim_memory.py: the device memory a training configuration allocates, found without a GPU.

Which run fits which GPU (d48 at B=16 on an H100's 80 GB, in bf16 and in FP8, with either
optimizer) is a question a user asks before renting one, and one the trainer answers only on
that GPU. Its buffers are sums of four kinds of terms: fixed (wte, wpe, workspaces), per layer
(the weights and what goes with them: gradients, master weights, optimizer state, FP8 weight
codes), per token (logits, embeddings, scratch) and per layer and token (the activations). So
this runs the cudasim trainer (build/sim/train_gpt2_fp8) for one step at four small shapes of
the model's width, 2 and 4 layers at 64 and 128 tokens (T=64, B=1 and 2), reads the most device
memory it allocated at once (CUDASIM_MEMORY_REPORT=1), solves

    allocated = fixed + per_layer L + per_token B T + per_layer_token L B T

and evaluates it at the full model. The fit is exact but for allocation rounding: a fifth
shape lands within a few KiB of its prediction (test/test_sim_memory.py checks it).

What a GPU adds on top is not allocated by the trainer's own calls: the CUDA context and
libraries, and cuDNN's attention workspace (with -ad 1, the default, its deterministic backward
keeps dP, B*NH*T*T bf16). On the H200 (2026-11-26 report) the d12 B=64 -r 0 runs peaked at
29567 MiB (bf16) and 28003 MiB (FP8): this fit gives 27616 and 26052 MiB allocated, 1951 MiB
less in both, of which dP is 1536 MiB. The estimate adds dP and the other 415 MiB.

The runs take seconds to minutes of CPU each (cudasim runs the kernels on the CPU); the
largest shape of d48 holds about 3.6 GB of host memory.

Usage: python3 dev/bench/sim_memory.py --model d48 -b 16 -- -p fp8 -r 1
       (flags after -- go to the trainer: precision, recipe, optimizer, -r, -w, ...; not -b, -t, -e)
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "test"))
import scaling_model  # noqa: E402  (the model sizes, gpt2_config.h's)
import sim_model  # noqa: E402  (llm.c's model and shard files, as the cudasim tests write them)

SIM_TRAINER = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
HEAD_SIZE = 64
FIT_LAYERS = (2, 4)
FIT_BATCHES = (1, 2)
FIT_T = 64
# measured on the H200 against this fit (the top comment): all but cuDNN's dP of what the GPU held beyond the allocations
GPU_OVERHEAD_MIB = 415
TERMS = ("fixed", "per_layer", "per_token", "per_layer_token")


def allocated_bytes(workdir, layers, channels, vocab, B, T, trainer_flags):
    """the most device memory the cudasim trainer allocated at once in one step of this shape"""
    model = os.path.join(workdir, f"model_L{layers}_C{channels}_V{vocab}.bin")
    if not os.path.exists(model):
        sim_model.write_model(model, layers=layers, heads=channels // HEAD_SIZE, channels=channels, vocab=vocab)
    shard = os.path.join(workdir, f"fit_V{vocab}_train_000001.bin")
    if not os.path.exists(shard):
        sim_model.write_shard(shard, 4 * max(FIT_BATCHES) * FIT_T + 1, seed=1, vocab=vocab)
    cmd = [SIM_TRAINER, "-e", model, "-i", shard, "-j", "", "-b", str(B), "-t", str(T), "-x", "1", "-v", "0", "-s", "0",
           *trainer_flags]
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDASIM_MEMORY_REPORT="1"))
    found = re.search(r"^cudasim: at most (\d+) bytes of device memory allocated at once$", result.stderr, re.M)
    if result.returncode != 0 or found is None:
        lines = (result.stderr or result.stdout).strip().splitlines()
        sys.exit(f"error: sim_memory.py: the cudasim trainer failed at L={layers} B={B} T={T}: "
                 f"{lines[-1] if lines else 'exit %d' % result.returncode}")
    return int(found.group(1))


def fit(workdir, channels, vocab, trainer_flags):
    """the four terms, in bytes, from the cudasim trainer at the fit's four shapes"""
    rows, measured = [], []
    for layers, B in itertools.product(FIT_LAYERS, FIT_BATCHES):
        tokens = B * FIT_T
        rows.append([1, layers, tokens, layers * tokens])
        measured.append(allocated_bytes(workdir, layers, channels, vocab, B, FIT_T, trainer_flags))
    return dict(zip(TERMS, np.linalg.solve(np.array(rows, float), np.array(measured, float))))


def predicted_bytes(terms, layers, tokens):
    return terms["fixed"] + terms["per_layer"] * layers + terms["per_token"] * tokens + terms["per_layer_token"] * layers * tokens


def attention_workspace_bytes(B, T, channels, trainer_flags):
    """cuDNN's deterministic backward's dP (bf16 B*NH*T*T), where the run uses it: -at cudnn and -ad 1, the defaults"""
    settings = dict(zip(trainer_flags[::2], trainer_flags[1::2]))
    if settings.get("-at", "cudnn") != "cudnn" or settings.get("-ad", "1") != "1":
        return 0
    return 2 * B * (channels // HEAD_SIZE) * T * T


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=sorted(scaling_model.PRESETS))
    parser.add_argument("-b", type=int, required=True, help="micro-batch size (sequences)")
    parser.add_argument("-t", type=int, default=1024, help="sequence length")
    parser.add_argument("trainer_flags", nargs="*", help="after --: the trainer's flags (not -b, -t, -e)")
    args = parser.parse_args()
    if len(args.trainer_flags) % 2 or any(f in ("-b", "-t", "-e") for f in args.trainer_flags[::2]):
        sys.exit("error: sim_memory.py: the flags after -- are flag-value pairs, without -b, -t or -e "
                 f"(got: {' '.join(args.trainer_flags)})")
    if not os.path.exists(SIM_TRAINER):
        sys.exit(f"error: sim_memory.py: {SIM_TRAINER} is not built (make build/sim/train_gpt2_fp8)")
    layers, channels = scaling_model.PRESETS[args.model]
    with tempfile.TemporaryDirectory(prefix="llm8_sim_memory_") as workdir:
        terms = fit(workdir, channels, scaling_model.VOCAB, args.trainer_flags)
    tokens = args.b * args.t
    allocated = predicted_bytes(terms, layers, tokens)
    workspace = attention_workspace_bytes(args.b, args.t, channels, args.trainer_flags)
    mib = 1 << 20
    flags = " ".join(args.trainer_flags)
    print(f"{args.model} B={args.b} T={args.t} {flags}: fixed {terms['fixed'] / mib:.1f} MiB, per layer "
          f"{terms['per_layer'] / mib:.2f} MiB, per token {terms['per_token'] / 1024:.2f} KiB, per layer and token "
          f"{terms['per_layer_token'] / 1024:.3f} KiB")
    print(f"allocated by the trainer: {allocated / mib:.0f} MiB; with cuDNN's dP ({workspace / mib:.0f} MiB) and the "
          f"context ({GPU_OVERHEAD_MIB} MiB): about {allocated / mib + workspace / mib + GPU_OVERHEAD_MIB:.0f} MiB on a GPU")


if __name__ == "__main__":
    main()
