"""
make_llmc_files.py: writes small files laid out exactly as llm.c writes them, so the C
readers are tested against llm.c's layout rather than against our own writers.

Usage: python3 test/make_llmc_files.py OUT_DIR

Written with numpy and struct only, following llm.c's writers (train_gpt2.py write_model /
write_tokenizer, dev/data/data_common.py write_datafile, dev/data/hellaswag.py
write_evalfile, train_gpt2.cu save_state). The contents follow simple formulas that
test/test_formats.c, test/test_dataloader.c and test/test_reshard.c recompute; where a value
cannot be recomputed independently in C (random params, bf16 rounding), the expected values
are written beside the file as raw float32.

The state files' data loader fields (header [5] should_shuffle, [30] and [32] the shard and
sample position; when shuffling, the trailer after the arrays: shard count, shard order,
sample count, sample order, MT19937 state) are those of llm.c's training loader after the
run's batches, from a model of it written here (LlmcDataLoader, LlmcMT19937, after llm.c
master's llmc/dataloader.h, whose position counts the samples read, as since its PR #613,
and llmc/rand.h). llm.c's training loader always shuffles (all but -a 1), each rank's
generator seeded 42 + rank. The trailer's seed_ field, which llm.c never sets, is 0.

Files:
  model_v3.bin, model_v5.bin        tiny GPT-2 (L=2 NH=2 C=16 maxT=8 V=60 Vp=128)
  expected_params_f32.bin           raw float32 params of model_v3.bin
  expected_params_bf16.bin          raw float32 values of model_v5.bin's bf16 params
  data_train_000000.bin, data_train_000001.bin   token shards (1000 and 777 tokens)
  tokenizer.bin                     256 byte tokens + 4 multi-byte tokens, eot = 259
  hellaswag.bin                     10 examples
  state_v1.bin                      rank 0 of 1, 100 parameters, master weights, no shuffle,
                                    at shard 1 sample 2, step 123
  state_v1_shuffle.bin              rank 0 of 1, 100 parameters, no master weights, shuffled:
                                    step 123 of 6 micro-batches (B=2 T=8 over the shards), so
                                    the loader after 738 batches (past the generator's second
                                    twist), and its trailer
  state_v1_shuffle_next.bin         the 17 tokens (uint16) llm.c's loader reads next from that
                                    state: inputs the first 16, targets the last 16
  llmc_z1_n2/, llmc_z1_n4/          checkpoint 5 of llm.c's 2 and 4 ranks under -z 1 (its
                                    ZeRO-1 cut: rank q holds the q-th 1/N of every layer's
                                    slice of every tensor), master weights, no shuffle, B=2
                                    T=8, at the position of 5 batches a rank (llm.c's trainer
                                    writes no such file: it shuffles but with -a 1, which
                                    rereads one batch; these are its layout without a trailer):
                                    state_00000005_0000q.bin
  llmc_z0_n2/                       the same under -z 0: every rank holds all of it
  llmc_z0_n2_no_master/             llmc_z0_n2 of a run without master weights (llm.c's -w 0):
                                    m and v only, a body of 2 arrays, not 3
  llmc_z1_n2_shuffle/, llmc_z1_n4_shuffle/, llmc_z0_n2_shuffle/
                                    the same cuts and arrays at checkpoint 70, shuffled as
                                    llm.c trains (B=2 T=8, 70 batches a rank, across epochs),
                                    each rank's trailer from its own loader:
                                    state_00000070_0000q.bin
  llmc_z1_n8_mixed/                 checkpoint 5 of 8 ranks under -z 1 whose rank 7's file, of a run
                                    without master weights, is not of the others' checkpoint
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
STATE_STEP, STATE_GRAD_ACCUM = 123, 6     # state_v1_shuffle.bin: after 738 micro-batches
RANKS_B, RANKS_T = 2, 8                   # the llm.c runs of several ranks
RANKS_STEP, RANKS_SHUFFLE_STEP = 5, 70    # one micro-batch a step


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


# ----------------------------------------------------------------------------
# llm.c's training data loader (llmc/dataloader.h, llmc/rand.h), as far as its state file shows it

MT_N, MT_M = 624, 397
MT_MATRIX_A = 0x9908B0DF
MT_UPPER, MT_LOWER = 0x80000000, 0x7FFFFFFF


class LlmcMT19937:
    """llm.c's mt19937_state (PyTorch's generator): manual_seed fills the 624 words and leaves
    left_ = 1, next_ = 0, so the first draw twists; a draw decrements left_, twists when it
    reaches 0 (which sets left_ = 624, next_ = 0), then tempers word next_ and moves next_ on.
    seed_ is never assigned (llm.c seeds a stack copy and copies it whole into the loader), so its
    8 bytes in llm.c's files are whatever the stack held; these files write 0, as llm8 does."""

    def __init__(self, seed):
        words = [seed & 0xFFFFFFFF]
        for i in range(1, MT_N):
            prev = words[-1]
            words.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.words, self.left, self.next = words, 1, 0

    def twist(self):
        w = self.words
        for i in range(MT_N):
            y = (w[i] & MT_UPPER) | (w[(i + 1) % MT_N] & MT_LOWER)
            w[i] = w[(i + MT_M) % MT_N] ^ (y >> 1) ^ (MT_MATRIX_A if y & 1 else 0)
        self.left, self.next = MT_N, 0

    def draw(self):
        self.left -= 1
        if self.left <= 0:
            self.twist()
        y = self.words[self.next]
        self.next += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF

    def packed(self):
        """the struct as llm.c fwrites it: uint64 seed_, int32 left_, uint32 next_, 624 uint32
        words, uint32 MATRIX_A[2] = {0, 0x9908b0df} (2520 bytes, no padding)"""
        return (struct.pack("<QiI", 0, self.left, self.next) +
                np.array(self.words, dtype=np.uint32).tobytes() + struct.pack("<II", 0, MT_MATRIX_A))


def llmc_random_permutation(values, rng):
    """llm.c's random_permutation, in place: Fisher-Yates from the last index down, swapping
    index i with draw % (i + 1)"""
    for i in range(len(values) - 1, 0, -1):
        j = rng.draw() % (i + 1)
        values[i], values[j] = values[j], values[i]


class LlmcDataLoader:
    """llm.c's DataLoader over shards of the given token counts (glob order), as rank `rank` of
    `num_processes` with micro-batch B x T. A sample is num_processes*B*T tokens; a shard holds
    (tokens - 1) // (num_processes*B*T) of them. Shuffling: the generator is seeded 42 + rank,
    the shard order starts as the identity and each epoch (reset) shuffles the previous one in
    place, then each shard loaded (reset, advance) gets the identity shuffled as its sample order.
    The position is the next sample: next_batch moves to the next shard (after the last, a new
    epoch) only when the current one is used up, reads, then counts the sample."""

    def __init__(self, shard_tokens, B, T, rank, num_processes, shuffle):
        self.shard_tokens, self.rank, self.num_processes = shard_tokens, rank, num_processes
        self.B, self.T, self.shuffle = B, T, shuffle
        self.sample_tokens = num_processes * B * T
        if shuffle:
            self.rng = LlmcMT19937(42 + rank)
            self.shard_indices = list(range(len(shard_tokens)))
            self.intra_shard_indices = None
        # (init then opens every shard to check it: no draws, and nothing left that reset does not set)
        self.reset()

    def load_shard(self, shard_idx):
        self.file = self.shard_indices[shard_idx] if self.shuffle else shard_idx
        self.shard_num_samples = (self.shard_tokens[self.file] - 1) // self.sample_tokens

    def prepare_intra_shard_indices(self):
        self.intra_shard_indices = list(range(self.shard_num_samples))
        llmc_random_permutation(self.intra_shard_indices, self.rng)

    def reset(self):
        self.current_shard_idx, self.current_sample_idx = 0, 0
        if self.shuffle:
            llmc_random_permutation(self.shard_indices, self.rng)
        self.load_shard(0)
        if self.shuffle:
            self.prepare_intra_shard_indices()

    def advance(self):
        if self.current_shard_idx == len(self.shard_tokens) - 1:
            self.reset()
            return
        self.current_shard_idx += 1
        self.current_sample_idx = 0
        self.load_shard(self.current_shard_idx)
        if self.shuffle:
            self.prepare_intra_shard_indices()

    def next_batch(self):
        """the batch read: (file index, first token of this rank's B*T + 1 tokens in it)"""
        if self.current_sample_idx >= self.shard_num_samples:
            self.advance()
        sample = self.current_sample_idx
        if self.shuffle:
            sample = self.intra_shard_indices[sample]
        self.current_sample_idx += 1
        return self.file, sample * self.sample_tokens + self.rank * self.B * self.T

    def trailer(self):
        """what save_state writes after the arrays when shuffling: size_t shard count, int
        shard_indices[], size_t shard_num_samples, int intra_shard_indices[], the generator"""
        if not self.shuffle:
            return b""
        return (struct.pack("<Q", len(self.shard_tokens)) +
                np.array(self.shard_indices, dtype=np.int32).tobytes() +
                struct.pack("<Q", self.shard_num_samples) +
                np.array(self.intra_shard_indices, dtype=np.int32).tobytes() + self.rng.packed())


def llmc_loader_after(num_batches, B, T, rank, num_processes, shuffle):
    loader = LlmcDataLoader(SHARD_SIZES, B, T, rank, num_processes, shuffle)
    for _ in range(num_batches):
        loader.next_batch()
    return loader


def state_header(use_master, loader, num_processes=1, rank=0, step=STATE_STEP,
                 rng_fields=(0x1122334455667788, 987654321)):
    """save_state's header: [5] should_shuffle, [10] step, uint64 [20] rng_state and [22]
    rng_state_last_update, size_t [30] current_shard_idx and [32] current_sample_idx"""
    h = header(20240527, 1, num_processes, rank, use_master, loader.shuffle)
    h[10] = step
    raw = bytearray(h.tobytes())
    struct.pack_into("<QQ", raw, 20 * 4, *rng_fields)
    struct.pack_into("<QQ", raw, 30 * 4, loader.current_shard_idx, loader.current_sample_idx)
    return bytes(raw)


def state_arrays():
    i = np.arange(STATE_NUM_PARAMS, dtype=np.float32)
    return i * 0.5, i * 0.25 + 1.0, -i / 8.0


def write_states(out):
    m, v, master = state_arrays()
    # unshuffled, at shard 1 sample 2 (a position of its own, not STATE_STEP's)
    plain = LlmcDataLoader(SHARD_SIZES, STATE_B, STATE_T, 0, 1, 0)
    plain.current_shard_idx, plain.current_sample_idx = 1, 2
    plain.load_shard(1)
    with open(os.path.join(out, "state_v1.bin"), "wb") as f:
        f.write(state_header(1, plain))
        for a in (m, v, master):
            f.write(a.astype(np.float32).tobytes())
    # shuffled: where llm.c's loader is after STATE_STEP steps of STATE_GRAD_ACCUM micro-batches
    loader = llmc_loader_after(STATE_STEP * STATE_GRAD_ACCUM, STATE_B, STATE_T, 0, 1, 1)
    with open(os.path.join(out, "state_v1_shuffle.bin"), "wb") as f:
        f.write(state_header(0, loader))
        for a in (m, v):
            f.write(a.astype(np.float32).tobytes())
        f.write(loader.trailer())
    # the B*T + 1 tokens its next batch reads (inputs: the first B*T, targets: the last B*T)
    shard, start = loader.next_batch()
    next_tokens = [shard_token(shard, start + i) for i in range(STATE_B * STATE_T + 1)]
    np.array(next_tokens, dtype=np.uint16).tofile(os.path.join(out, "state_v1_shuffle_next.bin"))


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
    runs = [  # name, ranks, llm.c's -z, shuffling, step, master weights
        ("llmc_z1_n2", 2, 1, 0, RANKS_STEP, 1), ("llmc_z1_n4", 4, 1, 0, RANKS_STEP, 1),
        ("llmc_z0_n2", 2, 0, 0, RANKS_STEP, 1), ("llmc_z1_n2_shuffle", 2, 1, 1, RANKS_SHUFFLE_STEP, 1),
        ("llmc_z1_n4_shuffle", 4, 1, 1, RANKS_SHUFFLE_STEP, 1), ("llmc_z0_n2_shuffle", 2, 0, 1, RANKS_SHUFFLE_STEP, 1),
        ("llmc_z0_n2_no_master", 2, 0, 0, RANKS_STEP, 0), ("llmc_z1_n8_mixed", 8, 1, 0, RANKS_STEP, 1)]
    for name, num_ranks, zero_stage, shuffle, step, use_master in runs:
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for rank in range(num_ranks):
            held = llmc_zero1_indices(num_ranks, rank) if zero_stage == 1 else np.arange(n)
            loader = llmc_loader_after(step, RANKS_B, RANKS_T, rank, num_ranks, shuffle)
            with open(os.path.join(out, name, "state_%08d_%05d.bin" % (step, rank)), "wb") as f:
                master_here = use_master and not (name == "llmc_z1_n8_mixed" and rank == 7)
                f.write(state_header(master_here, loader, num_ranks, rank, step, (0, 0)))
                for a in (m, v, master)[:2 + master_here]:
                    f.write(a[held].astype(np.float32).tobytes())
                f.write(loader.trailer())


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
