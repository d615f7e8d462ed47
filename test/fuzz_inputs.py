"""
fuzz_inputs.py: corrupts every kind of file the trainers read and checks how they fail.

Why: the tests beside the readers (test_formats.c, test_dataloader.c, test_trainer_cli.py)
hold one hand-made bad file per check. This driver looks for the checks nobody wrote: it
takes valid files (test/sim_model.py's small model in versions 3 and 5, token shards, the
tokenizer and HellaSwag files, and the checkpoints the CPU trainer writes: fp32 AdamW with
and without the shuffle trailer, adamw8 sections, FP8 scaling sections, DONE markers),
corrupts them (header fields set to 0, -1, INT_MAX, INT_MIN, off by one; the state files'
trailer counts and section sizes likewise; truncation at many offsets; appended bytes;
flipped bits in the header), runs a trainer on each under a timeout, and classifies it:
- OK: a non-zero exit with exactly one stderr line, "error: ..." naming the file;
- PASSED: exit 0, which is right only where the corruption changes nothing the run uses
  (a case marked "any": a payload bit flip, a header slot no reader looks at);
- BUG: a signal, a timeout, more or fewer than one error line, an error that does not name
  the file, or exit 0 on a case that must fail.
train_gpt2cpu runs every case; build/sim/train_gpt2_fp8 (cudasim, slower) the files only it
reads (tokenizer, HellaSwag) and a sample of the rest.

Usage: python3 test/fuzz_inputs.py [--seed N] [--limit N] [--sim N] [--jobs N] [-v]
test/test_fuzz_inputs.py runs a small fixed-seed subset under pytest (make test).
"""
import argparse
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = os.path.join(ROOT, "train_gpt2cpu")
SIM = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
INT_MAX, INT_MIN = 2**31 - 1, -(2**31)
B, T = 4, 64
RNG_LAYOUT_BYTES = 8 + 4 + 4 + 624 * 4 + 8  # dataloader.h's LlmcRngLayout
CHECKPOINTS = {  # name: the CPU trainer's flags that write it (and must resume it)
    "ck_adamw": [],
    "ck_adamw_noshuffle": ["-sh", 0],
    "ck_adamw8": ["-opt", "adamw8"],
    "ck_fp8": ["-p", "fp8", "-opt", "adamw8"],
}
CK_STEP = 2
RANKS_FLAGS = ["-opt", "adamw8", "-d", 2 * B * T]  # the 2-rank checkpoint (cudasim), resumed on one rank


# ----------------------------------------------------------------------------
# the valid files


def write_tokenizer(path, vocab=sim_model.VOCAB, eot=None):
    """llm.c's decode table: 256 int32 header ([0] 20240328, [1] 2, [2] vocab, [3] eot), then per
    token a length byte and its bytes"""
    header = np.zeros(256, dtype=np.int32)
    header[:4] = [20240328, 2, vocab, vocab - 1 if eot is None else eot]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for i in range(vocab):
            piece = bytes([i]) if i < 256 else ("t%d" % i).encode()
            f.write(bytes([len(piece)]) + piece)


def make_workdir(d):
    """model files, shards, tokenizer, HellaSwag file, and one checkpoint per CHECKPOINTS entry"""
    sim_model.write_model(os.path.join(d, "model.bin"))
    raw = open(os.path.join(d, "model.bin"), "rb").read()
    header = np.frombuffer(raw[:1024], dtype=np.int32).copy()
    header[1] = 5
    params = np.frombuffer(raw[1024:], dtype=np.float32)
    bits = ((params.view(np.uint32).astype(np.uint64) + 0x7FFF + ((params.view(np.uint32) >> 16) & 1)) >> 16)
    with open(os.path.join(d, "model_v5.bin"), "wb") as f:
        f.write(header.tobytes() + bits.astype(np.uint16).tobytes())
    sim_model.write_shard(os.path.join(d, "s_train_000001.bin"), 20_000, 1, learnable=True)
    sim_model.write_shard(os.path.join(d, "s_val_000000.bin"), 5_000, 2, learnable=True)
    write_tokenizer(os.path.join(d, "tokenizer.bin"))
    os.makedirs(os.path.join(d, "dev", "data", "hellaswag"))
    sim_model.write_hellaswag(os.path.join(d, "dev", "data", "hellaswag", "hellaswag_val.bin"))
    for name, flags in CHECKPOINTS.items():
        argv = cpu_args(d, flags + ["-x", CK_STEP, "-n", CK_STEP, "-o", os.path.join(d, name)])
        r = subprocess.run([str(a) for a in argv],
                           capture_output=True, text=True, timeout=120, cwd=d)
        if r.returncode != 0:
            raise RuntimeError(f"writing checkpoint {name} failed: {r.stderr}")
    if os.path.exists(SIM):  # a checkpoint of 2 ranks (one state file each), under cudasim
        argv = sim_args(d, RANKS_FLAGS + ["-x", CK_STEP, "-n", CK_STEP, "-o", os.path.join(d, "ck_2ranks")])
        ranks = [subprocess.Popen([str(a) for a in argv + ["-pn", 2, "-pr", r, "-pg", 1, "-pi", "fs", "-pf", d, "-pt", 120]],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=d,
                                  env=dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1")) for r in range(2)]
        errors = [p.communicate(timeout=300)[1] for p in ranks]
        if any(p.returncode != 0 for p in ranks):
            raise RuntimeError(f"writing the 2-rank checkpoint failed: {errors}")


def cpu_args(d, extra, model="model.bin"):
    return [CPU, "-e", os.path.join(d, model), "-i", os.path.join(d, "s_train_*.bin"), "-j",
            os.path.join(d, "s_val_*.bin"), "-b", B, "-t", T, "-v", 1, "-m", 2, "-s", 0] + list(extra)


def sim_args(d, extra, model="model.bin"):
    return [SIM, "-e", os.path.join(d, model), "-i", os.path.join(d, "s_train_*.bin"), "-j",
            os.path.join(d, "s_val_*.bin"), "-b", B, "-t", T, "-v", 1, "-m", 1, "-s", 0, "-at", "fallback"] + list(extra)


# ----------------------------------------------------------------------------
# where the fields of each file lie: (offset, size, name)


def header_fields(slots):
    return [(4 * i, 4, f"header[{i}]") for i in slots]


def state_fields(data, num_params):
    """the state file's header fields, the shuffle trailer's counts and each section's tag and size
    (num_params None: the header's only)"""
    h = np.frombuffer(data[:1024], dtype=np.int32)
    fields = header_fields([1, 2, 3, 4, 5, 6, 10, 40]) + [(80, 8, "rng_state"), (120, 8, "shard_idx"),
                                                          (128, 8, "sample_idx")]
    if num_params is None:
        return fields
    fp32_moments = h[1] == 1 or h[6] == 0
    at = 1024 + ((2 if fp32_moments else 0) + (1 if h[4] else 0)) * num_params * 4
    if h[5]:
        n_shards = struct.unpack_from("<Q", data, at)[0]
        fields.append((at, 8, "trailer.num_shards"))
        fields.append((at + 8, 4, "trailer.shard_indices[0]"))
        at += 8 + 4 * n_shards
        n_samples = struct.unpack_from("<Q", data, at)[0]
        fields.append((at, 8, "trailer.num_samples"))
        fields.append((at + 8, 4, "trailer.sample_indices[0]"))
        at += 8 + 4 * n_samples
        fields.append((at + 8, 4, "trailer.rng.left"))
        fields.append((at + 12, 4, "trailer.rng.next"))
        fields.append((at + RNG_LAYOUT_BYTES - 4, 4, "trailer.rng.matrix_a[1]"))
        at += RNG_LAYOUT_BYTES
    if h[1] == 2:
        for i in range(h[40]):
            tag = data[at:at + 16].rstrip(b"\0").decode()
            size = struct.unpack_from("<Q", data, at + 16)[0]
            fields.append((at, 16, f"section[{tag}].tag"))
            fields.append((at + 16, 8, f"section[{tag}].bytes"))
            if tag == "adamw8.bits":
                fields.append((at + 24, 4, f"section[{tag}][0]"))
            at += 24 + size
    return fields


def hellaswag_fields(data):
    """header fields and the first example's fields"""
    fields = header_fields([1, 2, 3])
    names = ["delimiter", "bytes", "index", "label", "completions", "context_length", "context[0]"]
    fields += [(1024 + 2 * i, 2, "example0." + n) for i, n in enumerate(names)]
    return fields


# ----------------------------------------------------------------------------
# corruptions: each a (name, bytes, expect) with expect "fail" or "any"


def int_values(old, size):
    if size == 2:
        return sorted({0, 1, old - 1 & 0xFFFF, old + 1 & 0xFFFF, 0x7FFF, 0xFFFF} - {old})
    if size == 8:
        return sorted({0, 1, (old - 1) % 2**64, old + 1, 2**31, 2**63 - 1, 2**64 - 1} - {old})
    return sorted({0, -1, 1, old - 1, old + 1, INT_MAX, INT_MIN, 2**30} - {old})


def set_field(data, offset, size, value):
    fmt = {2: "<H", 4: "<i", 8: "<Q"}[size]
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def corruptions(data, fields, rng, harmless=()):
    """every field set to each value of int_values; truncations; appended bytes; header bit
    flips (harmless: field names where a change may pass, e.g. a position inside a valid range, or
    {name: predicate} where only the values the predicate accepts may pass)"""
    out = []
    for offset, size, name in fields:
        if size == 16:  # a section tag: another tag, and one with no NUL
            for tag in (b"bogus", b"X" * 16):
                out.append((f"{name}={tag[:6].decode()}", data[:offset] + tag.ljust(16, b"\0") + data[offset + 16:],
                            "fail"))
            continue
        old = struct.unpack_from({2: "<H", 4: "<i", 8: "<Q"}[size], data, offset)[0]
        for v in int_values(old, size):
            ok = name in harmless and (not isinstance(harmless, dict) or harmless[name] is None or harmless[name](v))
            out.append((f"{name}={v}", set_field(data, offset, size, v), "any" if ok else "fail"))
    cuts = {0, 1, 4, 1023, 1024, 1025, len(data) - 1, len(data) - 2, len(data) - 4}
    cuts |= {rng.randrange(1025, len(data)) for _ in range(6)}
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        out.append((f"truncate@{cut}", data[:cut], "fail"))
    for extra in (b"\0", b"\0\0", b"\xff" * 4, bytes(rng.randrange(256) for _ in range(100))):
        out.append((f"append{len(extra)}", data + extra, "fail"))
    for _ in range(4):  # bit flips anywhere in the header: may be a slot nobody reads
        bit = rng.randrange(1024 * 8)
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        out.append((f"flip_bit{bit}", bytes(flipped), "any"))
    return out


# ----------------------------------------------------------------------------
# cases: (trainer, file kind, case name, file to replace, its new bytes, expect, argv builder)


def build_cases(d, rng):
    cases = []
    num_params = os.path.getsize(os.path.join(d, "model.bin")) // 4 - 256

    def add(kind, trainer, relpath, items, argv, sim_share=0, names_for=None):
        """names_for: {field: names}, where an error naming one of the names is also right"""
        def case(trainer, name, blob, expect):
            names = (names_for or {}).get(name.split("=")[0], ()) + (os.path.basename(relpath),)
            return dict(kind=kind, trainer=trainer, file=relpath, name=name, data=blob, expect=expect, argv=argv,
                        names=names)
        cases.extend(case(trainer, *item) for item in items)
        if sim_share:
            cases.extend(case("sim", *item) for item in rng.sample(items, min(sim_share, len(items))))

    def read(relpath):
        return open(os.path.join(d, relpath), "rb").read()

    def run_model(w, trainer, model):
        return (cpu_args if trainer == "cpu" else sim_args)(w, ["-x", 1], model=model)

    for model in ("model.bin", "model_v5.bin"):
        data = read(model)
        # another V below Vp or NH dividing C is another valid model: it may train (V = 1 fails on the
        # shard's first token id, naming the shard)
        items = corruptions(data, header_fields([0, 1, 2, 3, 4, 5, 6, 7]), rng, harmless={"header[3]", "header[5]"})
        add("model", "cpu", model, items, lambda w, tr, m=model: run_model(w, tr, m), sim_share=4,
            names_for={"header[3]": ("s_train_000001.bin",)})

    for shard in ("s_train_000001.bin", "s_val_000000.bin"):
        data = read(shard)
        items = corruptions(data, header_fields([0, 1, 2]), rng)
        for i in (0, 5, len(data) // 2 - 600):  # token ids at and past the vocabulary
            for v in (sim_model.VOCAB, 0xFFFF):
                off = 1024 + 2 * i
                items.append((f"token[{i}]={v}", set_field(data, off, 2, v), "fail"))
        add("shard", "cpu", shard, items, lambda w, tr: run_model(w, tr, "model.bin"), sim_share=3)

    for ck, flags in CHECKPOINTS.items():
        def resume(w, trainer, f=flags, c=ck):
            if trainer == "cpu":
                return cpu_args(w, f + ["-x", CK_STEP + 1, "-y", 1, "-o", os.path.join(w, c)])
            return sim_args(w, f + ["-w", 0, "-x", CK_STEP + 1, "-y", 1, "-o", os.path.join(w, c)])
        state = f"{ck}/state_{CK_STEP:08d}_00000.bin"
        data = read(state)
        # rng_state and the position inside the shard: another valid value is a valid file; a version 1
        # file (llm.c's) has no slots 6 and 40, and is a valid version 2 file with no sections
        harmless = {"rng_state", "sample_idx", "trailer.rng.left", "trailer.rng.next"}
        if data[4] == 1:
            harmless |= {"header[1]", "header[6]", "header[40]"}
        items = corruptions(data, state_fields(data, num_params), rng, harmless=harmless)
        add("state", "cpu", state, items, resume, sim_share=3 if ck == "ck_adamw8" else 0)
        mfile = f"{ck}/model_{CK_STEP:08d}.bin"
        add("ckpt_model", "cpu", mfile, corruptions(read(mfile), header_fields([1, 3, 4, 6, 7]), rng,
                                                     harmless={"header[3]"})[::3], resume,
            names_for={"header[3]": ("s_train_000001.bin",)})
        done = f"{ck}/DONE_{CK_STEP:08d}"
        add("done", "cpu", done, [("DONE_with_bytes", b"garbage\n", "any")], resume)
        # a marker with no files behind it, and files missing behind a marker
        for missing in (state, mfile):
            cases.append(dict(kind="done", trainer="cpu", file=missing, name="missing", data=None, expect="fail",
                              argv=resume))
        cases.append(dict(kind="done", trainer="cpu", file=f"{ck}/DONE_{CK_STEP + 5:08d}", name="marker_without_files",
                          data=b"", expect="fail", argv=resume, names=(f"{CK_STEP + 5:08d}",)))

    if os.path.isdir(os.path.join(d, "ck_2ranks")):  # resharded onto one rank: the position is replayed from the step
        def resume_ranks(w, trainer):
            return sim_args(w, RANKS_FLAGS + ["-x", CK_STEP + 1, "-y", 1, "-o", os.path.join(w, "ck_2ranks")])
        for rank in (0, 1):
            state = f"ck_2ranks/state_{CK_STEP:08d}_{rank:05d}.bin"
            data = read(state)
            items = corruptions(data, state_fields(data, None), rng, harmless={"rng_state", "shard_idx", "sample_idx"})
            add("state_2ranks", "sim", state, items, resume_ranks)

    data = read("tokenizer.bin")
    fields = header_fields([0, 1, 2, 3]) + [(1024, 1, "token0.len")]
    items = corruptions(data, fields[:4], rng, harmless={"header[3]"})  # another end-of-text token in range
    items += [(f"token0.len={v}", data[:1024] + bytes([v]) + data[1025:], "fail") for v in (0, 2, 255)]
    def tok_argv(w, trainer):
        return sim_args(w, ["-x", 1, "-s", 1, "-g", 4, "-tk", os.path.join(w, "tokenizer.bin"), "-v", 0])

    add("tokenizer", "sim", "tokenizer.bin", items, tok_argv)

    hs = "dev/data/hellaswag/hellaswag_val.bin"
    data = read(hs)
    # another label or context token in range is another valid example
    in_vocab = lambda v: v < sim_model.VOCAB  # noqa: E731
    items = corruptions(data, hellaswag_fields(data), rng,
                        harmless={"example0.label": lambda v: v < 4, "example0.context[0]": in_vocab})
    for v in (sim_model.VOCAB, 50000, 0xFFFE):  # token ids past the model's vocabulary
        items.append((f"example0.context[0]={v}", set_field(data, 1024 + 12, 2, v), "fail"))
        items.append((f"example0.ending0[0]={v}", set_field(data, 1024 + 2 * (6 + data[1034] + 1), 2, v), "fail"))
    add("hellaswag", "sim", hs, items, lambda w, tr: sim_args(w, ["-x", 1, "-h", 1, "-v", 1]))
    return cases


# ----------------------------------------------------------------------------
# running and classifying


def classify(case, r, timed_out):
    """(verdict, detail): OK, PASSED or BUG"""
    if timed_out:
        return "BUG", "timeout"
    if r.returncode < 0:
        return "BUG", f"signal {-r.returncode}"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    if r.returncode == 0:
        if case["expect"] == "fail":
            return "BUG", "exit 0 on a corrupt file" + (f" (stderr: {lines[0][:150]})" if lines else "")
        return "PASSED", ""
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return "BUG", f"{len(lines)} stderr lines: {r.stderr[-300:]!r}"
    wanted = case.get("names", (os.path.basename(case["file"]),))
    if not any(name in lines[0] for name in wanted):
        return "BUG", f"error does not name {' or '.join(wanted)}: {lines[0][:200]}"
    return "OK", lines[0][:200]


def run_case(d, case, timeout):
    """copies the work dir's run files (cheap: small) into a fresh dir, corrupts one, runs"""
    w = tempfile.mkdtemp(prefix="case_", dir=d)
    try:
        for name in os.listdir(d):
            src = os.path.join(d, name)
            if name.startswith("case_"):
                continue
            (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(w, name))
        path = os.path.join(w, case["file"])
        if case["data"] is None:
            os.remove(path)
        else:
            with open(path, "wb") as f:
                f.write(case["data"])
        argv = [str(a) for a in case["argv"](w, case["trainer"])]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=w,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            return classify(case, r, False)
        except subprocess.TimeoutExpired:
            return classify(case, None, True)
    finally:
        shutil.rmtree(w, ignore_errors=True)


def run_fuzz(seed=0, limit=None, sim=None, jobs=2, verbose=False, cpu_timeout=30, sim_timeout=120, kinds=None):
    """returns the list of (case, verdict, detail); limit/sim: at most that many cpu/sim cases"""
    rng = random.Random(seed)
    d = tempfile.mkdtemp(prefix="llm8_fuzz_")
    try:
        make_workdir(d)
        cases = [c for c in build_cases(d, rng) if kinds is None or c["kind"] in kinds]
        cpu_cases = [c for c in cases if c["trainer"] == "cpu"]
        sim_cases = [c for c in cases if c["trainer"] == "sim"]
        if limit is not None and limit < len(cpu_cases):
            cpu_cases = rng.sample(cpu_cases, limit)
        if sim is not None and sim < len(sim_cases):
            sim_cases = rng.sample(sim_cases, sim)
        if not os.path.exists(SIM):
            sim_cases = []
        chosen = cpu_cases + sim_cases

        def one(case):
            verdict, detail = run_case(d, case, cpu_timeout if case["trainer"] == "cpu" else sim_timeout)
            if verbose or verdict == "BUG":
                print(f"{verdict:6} {case['trainer']:3} {case['file']}: {case['name']}: {detail}", flush=True)
            return case, verdict, detail

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, chosen))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def summarize(results):
    table = {}
    for case, verdict, _ in results:
        key = (case["trainer"], case["kind"])
        table.setdefault(key, {"OK": 0, "PASSED": 0, "BUG": 0})[verdict] += 1
    for (trainer, kind), counts in sorted(table.items()):
        print(f"{trainer:3} {kind:10} cases {sum(counts.values()):4}  ok {counts['OK']:4}  passed {counts['PASSED']:3}  "
              f"bugs {counts['BUG']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="at most this many train_gpt2cpu cases")
    parser.add_argument("--sim", type=int, default=None, help="at most this many cudasim cases")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--kinds", default=None, help="comma list: model,shard,state,state_2ranks,ckpt_model,done,tokenizer,hellaswag")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    results = run_fuzz(args.seed, args.limit, args.sim, args.jobs, args.verbose,
                       kinds=args.kinds.split(",") if args.kinds else None)
    summarize(results)
    return 1 if any(v == "BUG" for _, v, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
