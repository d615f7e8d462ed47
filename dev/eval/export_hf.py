"""
export_hf.py: an llm8 (or llm.c) model file as a Hugging Face GPT-2 model directory.

Why: a GPT-2 reproduction is judged beyond its val loss with Hugging Face tools:
lm-evaluation-harness (HellaSwag, ARC, MMLU, ...) and transformers' generate. llm.c has
dev/eval/export_hf.py for that; llm8's model files are llm.c's (versions 3 and 5), so its
habit carries over: `python3 dev/eval/export_hf.py -i log124M/model_00019560.bin -o OUT`.
This one works offline. It needs only numpy: no torch, no transformers, no network. It
writes the safetensors file itself, and the GPT-2 tokenizer files from the local rank file
that dev/data/gpt2_bpe.py finds, instead of downloading them.

OUT gets config.json and model.safetensors. For GPT-2's 50257-token vocabulary it also gets
vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json (not with
--no-tokenizer). Another vocabulary has no tokenizer to write, and the script says so. OUT is
written in a temporary folder beside it and renamed into place, so it is complete or absent.
An OUT that exists is refused.

The mapping (names, transposes, the padded vocabulary) is hf_gpt2.py's, shared with
import_hf.py, which reads such a folder back. The config sets dropout to 0: llm.c and llm8
train without it, so fine-tuning from the export goes on as trained (transformers' GPT-2
default is 0.1).

The weights are written as bfloat16 (the default, as llm.c's exporter) or float32 (-d).
bfloat16 from a float32 file rounds to nearest even, as torch's .to(torch.bfloat16) does;
from a bfloat16 (version 5) file it is a copy. A file holding a non-finite weight is refused.

usage: python3 dev/eval/export_hf.py -i MODEL.bin -o OUT_DIR [-d bfloat16|float32]
           [--no-tokenizer] [--bpe-file gpt2.tiktoken]
"""
import argparse
import json
import os
import shutil
import sys

EVAL_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [EVAL_DIR, os.path.join(os.path.dirname(EVAL_DIR), "data")]
import gpt2_bpe  # noqa: E402
import hf_gpt2  # noqa: E402
import model_file  # noqa: E402


class ExportError(Exception):
    """A problem with the input or the output; str() is the one-line message."""


def read_finite_model(path):
    """model_file.read_model, refusing a non-finite weight (an exported NaN would load silently)"""
    try:
        cfg, weight_type, params = model_file.read_model(path)
    except model_file.ModelFileError as e:
        raise ExportError(f"-i {e}")
    bad = model_file.non_finite(params)
    if bad is not None:
        raise ExportError(f"-i {path}: {bad[0]} holds {bad[1]} non-finite values (NaN or Inf); refusing to export them")
    return cfg, weight_type, params


def byte_to_unicode():
    """GPT-2's byte-level alphabet: the 188 printable bytes stand for themselves, the other 68
    for the code points from 256 up, in byte order (the table transformers' GPT-2 tokenizer uses)"""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def merge_of(token, ranks):
    """the two tokens whose merge makes token: BPE on its bytes with only the merges ranked
    below it leaves exactly those two"""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < limit and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ExportError(f"the rank file's token {token!r} (rank {limit}) is not a merge of two lower-ranked tokens")
    return parts


def write_tokenizer_files(out_dir, encoding, max_length):
    """vocab.json and merges.txt (the GPT-2 files transformers' GPT2Tokenizer reads) from
    tiktoken's mergeable ranks, which are GPT-2's token ids; merge k makes token 256 + k"""
    ranks = {encoding.decode_single_token_bytes(rank): rank for rank in range(gpt2_bpe.EOT_TOKEN)}
    alphabet = byte_to_unicode()
    as_text = lambda token: "".join(alphabet[b] for b in token)  # noqa: E731
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    vocab[gpt2_bpe.EOT_TEXT] = gpt2_bpe.EOT_TOKEN
    merged = sorted((rank, token) for token, rank in ranks.items() if len(token) > 1)
    if [rank for rank, _ in merged] != list(range(256, gpt2_bpe.EOT_TOKEN)):
        raise ExportError("the rank file's multi-byte tokens are not ranks 256..50255, one each")
    merges = ["#version: 0.2"] + [" ".join(as_text(part) for part in merge_of(token, ranks)) for _, token in merged]
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(merges) + "\n")
    special = {"bos_token": gpt2_bpe.EOT_TEXT, "eos_token": gpt2_bpe.EOT_TEXT, "unk_token": gpt2_bpe.EOT_TEXT}
    tokenizer_config = dict(special, tokenizer_class="GPT2Tokenizer", model_max_length=max_length,
                            add_prefix_space=False, add_bos_token=False)
    for name, contents in (("tokenizer_config.json", tokenizer_config), ("special_tokens_map.json", special)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(contents, f, indent=2)


def export(model_path, out_dir, dtype, with_tokenizer, bpe_file=None):
    """writes out_dir whole or not at all; returns the lines to print"""
    if os.path.lexists(out_dir):
        raise ExportError(f"-o {out_dir}: already exists; give a new folder (an export is never merged into old files)")
    parent = os.path.dirname(os.path.abspath(out_dir))
    if not os.path.isdir(parent):
        raise ExportError(f"-o {out_dir}: its parent folder {parent} does not exist")
    cfg, source_dtype, params = read_finite_model(model_path)
    encoding = None
    if with_tokenizer and cfg["V"] == gpt2_bpe.VOCAB_SIZE:
        try:
            encoding = gpt2_bpe.load_gpt2_encoding(bpe_file)
        except gpt2_bpe.RankFileError as e:
            raise ExportError(f"{str(e).removeprefix('error: ')} (or pass --no-tokenizer)")
    temp_dir = f"{out_dir.rstrip(os.sep)}.tmp-{os.getpid()}"
    try:
        os.mkdir(temp_dir)
    except OSError as e:
        raise ExportError(f"-o {out_dir}: cannot create {temp_dir}: {e.strerror}")
    try:
        tensors = hf_gpt2.to_hf(cfg, params)
        hf_gpt2.write_safetensors(os.path.join(temp_dir, "model.safetensors"), tensors, dtype)
        eos = gpt2_bpe.EOT_TOKEN if cfg["V"] == gpt2_bpe.VOCAB_SIZE else None
        with open(os.path.join(temp_dir, "config.json"), "w") as f:
            json.dump(hf_gpt2.hf_config(cfg, dtype, eos), f, indent=2)
        if encoding is not None:
            write_tokenizer_files(temp_dir, encoding, cfg["maxT"])
        os.rename(temp_dir, out_dir)
    except OSError as e:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise ExportError(f"-o {out_dir}: writing failed: {e.strerror or e}")
    except hf_gpt2.HfError as e:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise ExportError(str(e))
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    count = sum(value.size for value in tensors.values())
    lines = [f"read {model_path}: L={cfg['L']} NH={cfg['NH']} C={cfg['C']} maxT={cfg['maxT']} "
             f"V={cfg['V']} (Vp={cfg['Vp']}), {source_dtype}",
             f"wrote {out_dir}: {count:,} parameters as {dtype} in model.safetensors, config.json"]
    if encoding is not None:
        lines.append(f"wrote the GPT-2 tokenizer (vocab.json, merges.txt) from {encoding.llm8_source}")
    elif not with_tokenizer:
        lines.append("no tokenizer files (--no-tokenizer)")
    else:
        lines.append(f"no tokenizer files: V={cfg['V']} is not GPT-2's {gpt2_bpe.VOCAB_SIZE}-token vocabulary")
    return lines


def main():
    parser = argparse.ArgumentParser(
        description="Export an llm8 / llm.c model file (version 3 or 5) as a Hugging Face GPT-2 model folder, offline")
    parser.add_argument("-i", "--input", required=True, help="model_*.bin (llm.c's format, version 3 or 5)")
    parser.add_argument("-o", "--output", required=True, help="the folder to write (must not exist)")
    parser.add_argument("-d", "--dtype", default="bfloat16", choices=sorted(hf_gpt2.SAFETENSORS_DTYPES),
                        help="the weights' type in model.safetensors (default bfloat16)")
    parser.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    gpt2_bpe.add_bpe_argument(parser)
    args = parser.parse_args()
    try:
        lines = export(args.input, args.output, args.dtype, not args.no_tokenizer, args.bpe_file)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
