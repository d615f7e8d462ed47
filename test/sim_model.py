"""
The small GPT-2 that the trainer runs under cudasim use (test/test_sim_trainer.py, and
test/gpu_trainer_ranks.py under make simcheck): llm.c's version-3 model file (fp32) with
GPT-2's init, and token shards and a HellaSwag file whose ids fit its vocabulary. 2 layers,
C = 128 (two heads of 64, what the attention kernels serve; one 128-wide block for the FP8
block recipe) and 997 tokens (like 50257, not a multiple of 8 or 128): a step of a few
hundred tokens takes about a second on the CPU.
"""
import os
import re
import struct
import subprocess

import numpy as np

LAYERS, HEADS, CHANNELS, VOCAB = 2, 2, 128, 997
STEP_RE = re.compile(r"^step\s+(\d+)/\d+ \| loss ([-\d.naninf]+) \|", re.M)  # a trainer's progress line


def step_losses(stdout):
    """{step: loss} from a trainer's progress lines"""
    return {int(s): float(l) for s, l in STEP_RE.findall(stdout)}


SIM_TRAINER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "sim", "train_gpt2_fp8")


def train(workdir, args, model="model.bin", timeout=900, data="s_train_*.bin", val="s_val_*.bin", env_extra=None):
    """one run of the cudasim trainer (build/sim/train_gpt2_fp8) in workdir, on this small model's
    files there (write_run_files), at T=64 B=4; args go after these flags, env_extra into its environment"""
    if not os.path.exists(SIM_TRAINER):
        import pytest  # only the pytest tests call this (gpu_trainer_ranks.py runs without pytest)
        pytest.fail(f"{SIM_TRAINER} is not built (make build/sim/train_gpt2_fp8)")
    cmd = [SIM_TRAINER, "-e", model, "-i", data, "-j", val, "-t", 64, "-b", 4] + list(args)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          env=dict(os.environ, **(env_extra or {})))


def write_model(path, layers=LAYERS, heads=HEADS, channels=CHANNELS, vocab=VOCAB, max_t=1024, seed=5,
                first_qkv_weight=None, padded_vocab=None):
    """first_qkv_weight: a value for layer 0's qkv weight [0][0] (3e38 makes every forward overflow);
    padded_vocab: Vp, if not vocab rounded up to a multiple of 128 as llm.c writes it"""
    L, C, padded = layers, channels, padded_vocab or (vocab + 127) // 128 * 128
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, max_t, vocab, L, heads, C, padded]
    rng = np.random.default_rng(seed)
    normal, ones, zeros = (lambda n: rng.normal(0, 0.02, n)), np.ones, np.zeros
    tensors = [normal(padded * C), normal(max_t * C), ones(L * C), zeros(L * C), normal(L * 3 * C * C), zeros(L * 3 * C),
               normal(L * C * C), zeros(L * C), ones(L * C), zeros(L * C), normal(L * 4 * C * C), zeros(L * 4 * C),
               normal(L * 4 * C * C), zeros(L * C), ones(C), zeros(C)]
    if first_qkv_weight is not None:
        tensors[4][0] = first_qkv_weight
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(np.asarray(t, dtype=np.float32).tobytes())


def write_shard(path, num_tokens, seed, vocab=VOCAB, learnable=False, period=None, change_at=None):
    """uniform random tokens, or (learnable) a random walk over 64 of them, which a model
    learns within a few steps; period: the first `period` tokens repeated, so every
    sample of B*T = period tokens (and each rank's part of one) is the same; change_at: from
    this token on, uniform random tokens (data the model has not learned: a loss spike)"""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, num_tokens
    rng = np.random.default_rng(seed)
    if learnable:
        tokens = (np.cumsum(rng.integers(1, 3, size=num_tokens)) % 64).astype(np.uint16)
    else:
        tokens = rng.integers(0, vocab, size=num_tokens, dtype=np.uint16)
    if period is not None:
        tokens = np.resize(tokens[:period], num_tokens)
    if change_at is not None:
        tokens[change_at:] = rng.integers(0, vocab, size=num_tokens - change_at, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def write_run_files(d, train_tokens):
    """what a training run of the trainer reads, in directory d: model.bin and learnable
    train and val shards (s_train_000001.bin, s_val_000000.bin)"""
    write_model(d / "model.bin")
    write_shard(d / "s_train_000001.bin", train_tokens, 1, learnable=True)
    write_shard(d / "s_val_000000.bin", 5_000, 2, learnable=True)


def write_hellaswag(path, num_examples=8, vocab=VOCAB, seed=3):
    """llm.c's eval file (dev/data/hellaswag.py write_evalfile): per example a 65535 delimiter,
    its byte length, index, label, 4 completions, the context, then each ending"""
    rng = np.random.default_rng(seed)
    stream, longest = [], 0
    for idx in range(num_examples):
        context = rng.integers(0, vocab, size=3 + idx % 5).tolist()
        example = [2 ** 16 - 1, 0, idx, int(rng.integers(0, 4)), 4, len(context)] + context
        for _ in range(4):
            ending = rng.integers(0, vocab, size=1 + int(rng.integers(0, 4))).tolist()
            example += [len(ending)] + ending
        example[1] = len(example) * 2
        longest = max(longest, example[1])
        stream += example
    header = np.zeros(256, dtype=np.int32)
    header[:4] = [20240522, 1, num_examples, longest]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(stream, dtype=np.uint16).tobytes())


def state_section(path, tag):
    """the bytes of a state file's tagged section (llmc/checkpoint.h: a 16-byte tag, a uint64 size, the bytes)"""
    blob = path.read_bytes()
    at = blob.index(tag.encode() + b"\0")
    size = struct.unpack_from("<Q", blob, at + 16)[0]
    return blob[at + 24: at + 24 + size]


# Fp8TensorScaling (llmc/fp8_scaling.h) as state files hold it: amax_history[1024] floats, then the floats scale,
# scale_inv, fp8_max, last_amax, then the int32s recipe, history_len, margin, position, recorded, nonfinite_count
SCALING_FIELD_OFFSETS = {"scale": 4096, "position": 4096 + 16 + 12}
SCALING_BYTES = 4096 + 16 + 24
# Fp8CastRecord (llmc/fp8_scaling.cuh): the floats scale_inv and scale, the uint32s amax_bits, interval_amax_bits,
# interval_min_scale_bits and padding, then the uint64 counts elements, saturated and flushed
RECORD_FIELD_OFFSETS = {"scale_inv": 0, "scale": 4, "amax_bits": 8, "elements": 24, "saturated": 32}
RECORD_BYTES = 48


def read_model(path):
    """an llm.c model file (version 3: fp32, 5: bf16) as (L, NH, C, V, its tensors in float64, llm.c's order), the
    weights as the trainer holds them: bf16 (an fp32 file's rounded to the nearest, ties to even)"""
    header = np.fromfile(path, dtype=np.int32, count=256)
    version, max_t, V, L, NH, C, Vp = (int(v) for v in header[1:8])
    if version == 5:
        flat = (np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.uint32) << 16).view(np.float32)
    else:
        assert version == 3, (path, version)
        bits = np.fromfile(path, dtype=np.uint32, offset=1024)
        flat = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).view(np.float32)  # no NaN or Inf in these files
    sizes = [Vp * C, max_t * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C, L * 4 * C * C,
             L * 4 * C, L * 4 * C * C, L * C, C, C]
    assert flat.size == sum(sizes), (path, flat.size, sum(sizes))
    tensors = np.split(flat.astype(np.float64), np.cumsum(sizes)[:-1])
    return L, NH, C, V, tensors


def forward_logits(model, tokens):
    """GPT-2's forward (llm.c's: layernorm eps 1e-5, causal attention, tanh GELU, the lm_head tied to wte) of one
    sequence in float64: the logits [len(tokens)][V]"""
    L, NH, C, V, (wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw,
                  lnfb) = model
    T, hs = len(tokens), C // NH
    wte = wte.reshape(-1, C)

    def layernorm(x, w, b):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b

    x = wte[tokens] + wpe.reshape(-1, C)[:T]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        qkv = layernorm(x, ln1w.reshape(L, C)[l], ln1b.reshape(L, C)[l]) @ qkvw.reshape(L, 3 * C, C)[l].T + \
            qkvb.reshape(L, 3 * C)[l]
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, NH, hs).transpose(1, 0, 2) for i in range(3))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hs) + causal
        att = np.exp(scores - scores.max(-1, keepdims=True))
        y = ((att / att.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ attprojw.reshape(L, C, C)[l].T + attprojb.reshape(L, C)[l]
        h = layernorm(x, ln2w.reshape(L, C)[l], ln2b.reshape(L, C)[l]) @ fcw.reshape(L, 4 * C, C)[l].T + \
            fcb.reshape(L, 4 * C)[l]
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ fcprojw.reshape(L, C, 4 * C)[l].T + fcprojb.reshape(L, C)[l]
    return layernorm(x, lnfw, lnfb) @ wte[:V].T


def llmc_coins(n):
    """llm.c's n sampling coins: xorshift* seeded 1337, the top 24 of the upper 32 bits of the product over 2^24"""
    state, mask, coins = 1337, (1 << 64) - 1, []
    for _ in range(n):
        state ^= state >> 12
        state = (state ^ (state << 25)) & mask
        state ^= state >> 27
        coins.append(((((state * 0x2545F4914F6CDD1D) & mask) >> 32) >> 8) / 16777216.0)
    return coins


def hellaswag_reference(model, path):
    """llm.c's HellaSwag on an eval file (write_hellaswag's) with forward_logits: per example the completion whose
    ending tokens have the least mean loss (the first of equals), against the label. Returns (correct, the smallest
    gap between an example's best mean loss and its next best: how close the closest call was)"""
    header = np.fromfile(path, dtype=np.int32, count=256)
    stream = np.fromfile(path, dtype=np.uint16, offset=1024).tolist()
    correct, closest, at = 0, np.inf, 0
    for _ in range(int(header[2])):
        label, completions, context_length = stream[at + 3], stream[at + 4], stream[at + 5]
        context = stream[at + 6: at + 6 + context_length]
        at += 6 + context_length
        means = []
        for _ in range(completions):
            ending = stream[at + 1: at + 1 + stream[at]]
            at += 1 + len(ending)
            tokens = context + ending
            logits = forward_logits(model, tokens)[:-1]
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            means.append(-np.mean([logp[t, tokens[t + 1]] for t in range(context_length - 1, len(tokens) - 1)]))
        ranked = sorted(means)
        correct += int(np.argmin(means)) == label
        closest = min(closest, ranked[1] - ranked[0])
    return correct, closest
