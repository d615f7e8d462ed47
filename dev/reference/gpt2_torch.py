"""
gpt2_torch.py: an independent PyTorch model of llm8's network, used to write golden tensors.

Why: test/gpt2_ref.h is the oracle for every GPU kernel, so it needs an oracle of its own
written another way. This file is that: autograd instead of hand-written backwards,
torch.optim.AdamW instead of adamw_element_update. It reads an llm.c model file (through
dev/eval/model_file.py; the fixture's is version 3, fp32), runs one fixed batch, and writes
a debug state that test/test_reference_fixture.c checks the C reference against.

The network (same as llm.c's GPT-2): pre-LN blocks x += attproj(attn(ln1(x))),
x += fcproj(gelu_tanh(fc(ln2(x)))); causal attention with scale 1/sqrt(HS); final
layernorm; logits = lnf(x) @ wte^T over the padded vocab Vp (tied lm_head); cross-entropy
over the first V columns. Layernorm eps 1e-5. The parameters are held exactly as the file
lays them out (16 tensors in llm.c order, per-layer tensors stacked [L, ...]), so the
gradients are written in that order with no reshuffling.

Training steps: AdamW with llm.c's settings: betas (0.9, 0.95), eps 1e-8, weight decay
only on the tensors gpt2_param_is_decayed marks (wte, wpe, qkvw, attprojw, fcw, fcprojw),
and llm.c's clipping (gradients scaled by grad_clip / norm when the global norm exceeds
grad_clip; torch's clip_grad_norm_ adds 1e-6 to the norm, so it is done by hand). The
defaults (lr 1e-3, weight decay 0.1, clip 1.0) move a tiny model visibly in 10 steps and
exercise the decay mask and the clipping; they are stored in the debug state's header so the
C test uses exactly the values written here.

Debug state (llm.c's gpt2_124M_debug_state.bin, version 2, extended as version 3), all
little-endian:
  int32[256] header: [0] 20240327, [1] 3, [2] B, [3] T, [4] number of steps S,
                     [5..10] float32 bit patterns of lr, beta1, beta2, eps, weight_decay,
                     grad_clip; the rest 0
  int32[B*T]  x (inputs)
  int32[B*T]  y (targets)
  f32[B*T*V]  logits at the initial weights, the first V columns of each row (as llm.c)
  f32         mean loss at the initial weights
  f32[P]      gradients of that loss, all P parameters in llm.c order (Vp-padded wte)
  f32[S]      version 3 only: the mean loss before each of S AdamW steps on the same batch
              (entry 0 equals the loss above)

usage: python3 dev/reference/gpt2_torch.py --model build/reference/gpt2_tiny_model.bin \
           --out build/reference/gpt2_tiny_debug_state.bin [--batch 4 --seq 16 --device cpu]
(dev/reference/README.md's "Regenerating": the new pair is checked in build/reference/ before it
replaces test/fixtures/'s). Runs on the CPU (the fixture's source of truth) or on a GPU with
TF32 disabled. Needs PyTorch and NumPy (pip install torch numpy; without them it says so in one
line, --help aside); make test does not: it checks the committed fixture.
"""
import argparse
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eval"))

# imported by import_libraries(), after the arguments are parsed: --help, and a bad flag's message, need no PyTorch
np = torch = F = model_file = HEADER_INTS = PARAM_NAMES = None

DEBUG_STATE_MAGIC = 20240327
DEBUG_STATE_VERSION = 3
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}  # gpt2_param_is_decayed
LAYERNORM_EPS = 1e-5


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def import_libraries():
    """PyTorch and NumPy (and dev/eval/model_file.py, which needs NumPy), or one line saying what to install:
    only regenerating the fixture needs them (make test checks the committed one without PyTorch)"""
    global np, torch, F, model_file, HEADER_INTS, PARAM_NAMES
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
        import model_file
    except ImportError as e:
        die(f"gpt2_torch.py needs PyTorch and NumPy ({e}): pip install torch numpy (CPU is enough). "
            f"make test does not need them: it checks the committed fixture in test/fixtures/")
    HEADER_INTS, PARAM_NAMES = model_file.HEADER_INTS, model_file.PARAM_NAMES


def read_model(path):
    """(config dict, {name: float32 numpy array}) of an llm.c model file (model_file.read_model)"""
    try:
        cfg, _, arrays = model_file.read_model(path)
    except model_file.ModelFileError as e:
        die(f"--model {e}")
    return cfg, arrays


def forward(p, cfg, x):
    """logits [B, T, Vp] of inputs x [B, T]; p maps names to tensors in the file's layout"""
    B, T = x.shape
    L, NH, C = cfg["L"], cfg["NH"], cfg["C"]
    HS = C // NH
    h = p["wte"][x] + p["wpe"][:T]
    for l in range(L):
        a = F.layer_norm(h, (C,), p["ln1w"][l], p["ln1b"][l], LAYERNORM_EPS)
        qkv = F.linear(a, p["qkvw"][l], p["qkvb"][l])
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        h = h + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        m = F.layer_norm(h, (C,), p["ln2w"][l], p["ln2b"][l], LAYERNORM_EPS)
        m = F.gelu(F.linear(m, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        h = h + F.linear(m, p["fcprojw"][l], p["fcprojb"][l])
    h = F.layer_norm(h, (C,), p["lnfw"], p["lnfb"], LAYERNORM_EPS)
    return h @ p["wte"].T


def mean_loss(logits, y, V):
    return F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1))


def clip_like_llmc(params, grad_clip):
    norm = torch.sqrt(sum((t.grad.double() ** 2).sum() for t in params))
    if grad_clip > 0 and norm > grad_clip:
        for t in params:
            t.grad.mul_(grad_clip / norm.float())


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as die's, instead of argparse's usage and message
        die(f"{message} (see --help)")


def parse_args(argv=None):
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="llm.c model file (version 3, float32; a version 5 file is widened from bfloat16)")
    ap.add_argument("--out", required=True, help="debug state to write")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337, help="seed of the random batch")
    ap.add_argument("--device", default="cpu")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    import_libraries()
    beta1, beta2, eps = 0.9, 0.95, 1e-8

    cfg, arrays = read_model(args.model)
    B, T = args.batch, args.seq
    if not (1 <= B and 1 <= T <= cfg["maxT"]):
        die(f"--batch {B} --seq {T}: expected B >= 1 and 1 <= T <= maxT={cfg['maxT']}")
    if args.steps < 1:
        die(f"--steps {args.steps}: expected >= 1")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    params = {n: torch.tensor(a, dtype=torch.float32, device=device, requires_grad=True) for n, a in arrays.items()}
    ordered = [params[n] for n in PARAM_NAMES]

    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, cfg["V"], (B * T + 1,), generator=gen, dtype=torch.int64)
    x = tokens[:-1].view(B, T).to(device)
    y = tokens[1:].view(B, T).to(device)

    optimizer = torch.optim.AdamW(
        [{"params": [params[n] for n in PARAM_NAMES if n in DECAYED], "weight_decay": args.weight_decay},
         {"params": [params[n] for n in PARAM_NAMES if n not in DECAYED], "weight_decay": 0.0}],
        lr=args.lr, betas=(beta1, beta2), eps=eps, foreach=False, fused=False)
    losses = []
    for step in range(args.steps):
        logits = forward(params, cfg, x)
        loss = mean_loss(logits, y, cfg["V"])
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            first_logits = logits[..., :cfg["V"]].detach().cpu().numpy().astype("<f4")
            first_loss = loss.item()
            first_grads = np.concatenate([t.grad.detach().cpu().numpy().ravel() for t in ordered]).astype("<f4")
        clip_like_llmc(ordered, args.grad_clip)
        optimizer.step()
        print(f"step {step}: loss {losses[-1]:.6f}")

    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2], header[3], header[4] = DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION, B, T, args.steps
    hyper = struct.pack("<6f", args.lr, beta1, beta2, eps, args.weight_decay, args.grad_clip)
    header[5:11] = np.frombuffer(hyper, dtype="<i4")
    tmp = args.out + ".tmp"  # renamed over --out once whole: a failed write leaves the old file as it was
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(x.cpu().numpy().astype("<i4").tobytes())
        f.write(y.cpu().numpy().astype("<i4").tobytes())
        f.write(first_logits.tobytes())
        f.write(np.array([first_loss], dtype="<f4").tobytes())
        f.write(first_grads.tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: B={B} T={T}, loss {first_loss:.6f}, {first_grads.size} gradients, {args.steps} steps")


if __name__ == "__main__":
    main()
