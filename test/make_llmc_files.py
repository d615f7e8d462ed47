"""
make_llmc_files.py: writes small files laid out exactly as llm.c writes them, so the C
readers are tested against llm.c's layout rather than against our own writers.

Usage: python3 test/make_llmc_files.py OUT_DIR

Written with numpy and struct only, following llm.c's writers (train_gpt2.py write_model /
write_tokenizer, dev/data/data_common.py write_datafile, dev/data/hellaswag.py
write_evalfile, train_gpt2.cu save_state). The contents follow simple formulas that
test/test_formats.c and test/test_dataloader.c recompute; where a value cannot be recomputed
independently in C (random params, bf16 rounding), the expected values are written beside
the file as raw float32.

Files:
  model_v3.bin, model_v5.bin        tiny GPT-2 (L=2 NH=2 C=16 maxT=8 V=60 Vp=128)
  expected_params_f32.bin           raw float32 params of model_v3.bin
  expected_params_bf16.bin          raw float32 values of model_v5.bin's bf16 params
  data_train_000000.bin, data_train_000001.bin   token shards (1000 and 777 tokens)
  tokenizer.bin                     256 byte tokens + 4 multi-byte tokens, eot = 259
  hellaswag.bin                     10 examples
  state_v1.bin                      rank 0 of 1, master weights, no shuffle
  state_v1_shuffle.bin              rank 0 of 1, no master weights, shuffle trailer
  llmc_z1_n2/, llmc_z1_n4/          checkpoint 5 of llm.c's 2 and 4 ranks under -z 1 (its
                                    ZeRO-1 cut: rank q holds the q-th 1/N of every layer's
                                    slice of every tensor), master weights, no shuffle:
                                    state_00000005_0000q.bin
  llmc_z0_n2/                       the same under -z 0: every rank holds all of it
  llmc_ranks_expected.bin           the whole m, v and master those cut (float32, in turn)
"""
import os
import struct
import sys

import numpy as np

L, NH, C, MAXT, V, VP = 2, 2, 16, 8, 60, 128
SHARD_SIZES = [1000, 777]
STATE_NUM_PARAMS = 100
STATE_B, STATE_T = 2, 8


def header(*values):
    h = np.zeros(256, dtype=np.int32)
    h[: len(values)] = values
    return h


def param_sizes():
    return [VP * C, MAXT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]


def num_params():
    return sum(param_sizes())


def to_bf16_bits(x):
    # round to nearest even, as torch's .to(torch.bfloat16) for finite values
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_models(out):
    rng = np.random.default_rng(1234)
    params = (rng.standard_normal(num_params()) * 0.1).astype(np.float32)
    # exact bf16 ties: 1 + 2^-8 rounds down to even 1.0, 1 + 3*2^-8 rounds up
    params[:4] = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8), 2.0 ** -130]
    with open(os.path.join(out, "model_v3.bin"), "wb") as f:
        f.write(header(20240326, 3, MAXT, V, L, NH, C, VP).tobytes())
        f.write(params.tobytes())
    bits = to_bf16_bits(params)
    with open(os.path.join(out, "model_v5.bin"), "wb") as f:
        f.write(header(20240326, 5, MAXT, V, L, NH, C, VP).tobytes())
        f.write(bits.tobytes())
    params.tofile(os.path.join(out, "expected_params_f32.bin"))
    (bits.astype(np.uint32) << 16).view(np.float32).tofile(os.path.join(out, "expected_params_bf16.bin"))


def shard_token(shard, i):
    return (i * 31 + shard * 1000 + 7) % 50000


def write_shards(out):
    for shard, n in enumerate(SHARD_SIZES):
        toks = np.array([shard_token(shard, i) for i in range(n)], dtype=np.uint16)
        with open(os.path.join(out, "data_train_%06d.bin" % shard), "wb") as f:
            f.write(header(20240520, 1, n).tobytes())
            f.write(toks.tobytes())


def write_tokenizer(out):
    pieces = [bytes([i]) for i in range(256)] + [b"hello", b" world", b"\xe2\x82", b"<|endoftext|>"]
    with open(os.path.join(out, "tokenizer.bin"), "wb") as f:
        f.write(header(20240328, 2, len(pieces), len(pieces) - 1).tobytes())
        for p in pieces:
            f.write(struct.pack("<B", len(p)))
            f.write(p)


def write_hellaswag(out):
    stream = []
    longest = 0
    num_examples = 10
    for idx in range(num_examples):
        ex = [2 ** 16 - 1, 0, idx, (idx * 3) % 4, 4]
        ctx = [100 + idx * 10 + j for j in range(2 + idx % 4)]
        ex.append(len(ctx))
        ex.extend(ctx)
        for c in range(4):
            end = [5000 + idx * 100 + c * 10 + j for j in range(1 + (idx + c) % 3)]
            ex.append(len(end))
            ex.extend(end)
        ex[1] = len(ex) * 2
        longest = max(longest, ex[1])
        stream.extend(ex)
    with open(os.path.join(out, "hellaswag.bin"), "wb") as f:
        f.write(header(20240522, 1, num_examples, longest).tobytes())
        f.write(np.array(stream, dtype=np.uint16).tobytes())


def mt19937_seeded_words(seed):
    state = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        prev = state[-1]
        state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    return state


def state_header(use_master, shuffle, shard_idx, sample_idx):
    h = header(20240527, 1, 1, 0, use_master, shuffle)
    h[10] = 123
    raw = bytearray(h.tobytes())
    struct.pack_into("<QQ", raw, 20 * 4, 0x1122334455667788, 987654321)
    struct.pack_into("<QQ", raw, 30 * 4, shard_idx, sample_idx)
    return bytes(raw)


def state_arrays():
    i = np.arange(STATE_NUM_PARAMS, dtype=np.float32)
    return i * 0.5, i * 0.25 + 1.0, -i / 8.0


def write_states(out):
    m, v, master = state_arrays()
    with open(os.path.join(out, "state_v1.bin"), "wb") as f:
        f.write(state_header(1, 0, 1, 2))
        for a in (m, v, master):
            f.write(a.astype(np.float32).tobytes())
    # shuffled: shard order [1, 0]; we are in epoch shard 0 (= file 1), sample 5 of its permutation
    shard_samples = (SHARD_SIZES[1] - 1) // (STATE_B * STATE_T)
    with open(os.path.join(out, "state_v1_shuffle.bin"), "wb") as f:
        f.write(state_header(0, 1, 0, 5))
        for a in (m, v):
            f.write(a.astype(np.float32).tobytes())
        f.write(struct.pack("<Q", len(SHARD_SIZES)))
        f.write(np.array([1, 0], dtype=np.int32).tobytes())
        f.write(struct.pack("<Q", shard_samples))
        f.write(np.arange(shard_samples - 1, -1, -1, dtype=np.int32).tobytes())
        # llm.c's mt19937_state: seed_, left_, next_, state_[624], MATRIX_A[2]: the words of
        # manual_seed(42), positioned at word 7 (left_ = 625 - next_ between twists)
        f.write(struct.pack("<QiI", 0, 625 - 7, 7))
        f.write(np.array(mt19937_seeded_words(42), dtype=np.uint32).tobytes())
        f.write(struct.pack("<II", 0, 0x9908B0DF))


def llmc_zero1_indices(num_ranks, rank):
    """the flat parameters llm.c's ZeRO-1 rank holds, in its optimizer arrays' order: for each
    tensor, for each of its layers (wte, wpe, lnfw, lnfb have one), the rank-th 1/N of that
    layer's slice (train_gpt2.cu gpt2_update: multi_gpu_get_shard_offset of the slice, and the
    optimizer state at the tensor's offset / N plus layer x shard size)"""
    pieces, offset = [], 0
    for tensor, size in enumerate(param_sizes()):
        layers = L if 2 <= tensor <= 13 else 1
        layer_size = size // layers
        part = layer_size // num_ranks
        for layer in range(layers):
            begin = offset + layer * layer_size + rank * part
            pieces.append(np.arange(begin, begin + part))
        offset += size
    return np.concatenate(pieces)


def write_llmc_rank_states(out):
    n = num_params()
    i = np.arange(n, dtype=np.float32)
    m, v, master = i * 0.5, i * 0.25 + 1.0, -i / 8.0
    with open(os.path.join(out, "llmc_ranks_expected.bin"), "wb") as f:
        for a in (m, v, master):
            f.write(a.astype(np.float32).tobytes())
    for name, num_ranks, zero_stage in (("llmc_z1_n2", 2, 1), ("llmc_z1_n4", 4, 1), ("llmc_z0_n2", 2, 0)):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for rank in range(num_ranks):
            held = llmc_zero1_indices(num_ranks, rank) if zero_stage == 1 else np.arange(n)
            h = header(20240527, 1, num_ranks, rank, 1, 0)
            h[10] = 5
            with open(os.path.join(out, name, "state_00000005_%05d.bin" % rank), "wb") as f:
                f.write(h.tobytes())
                for a in (m, v, master):
                    f.write(a[held].astype(np.float32).tobytes())


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 test/make_llmc_files.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write_models(out)
    write_shards(out)
    write_tokenizer(out)
    write_hellaswag(out)
    write_states(out)
    write_llmc_rank_states(out)


if __name__ == "__main__":
    main()
