"""
Downloads llm.c's starter pack (GPT-2 124M's weights, its tokenizer, TinyShakespeare's shards
and the HellaSwag eval file) into the places llm.c's dev/download_starter_pack.sh puts them, so
llm.c's quick start runs as it is:

    python3 dev/data/starter_pack.py
    ./train_gpt2_fp8 -e gpt2_124M_bf16.bin -i dev/data/tinyshakespeare/tiny_shakespeare_train.bin \\
        -j dev/data/tinyshakespeare/tiny_shakespeare_val.bin

Why not llm.c's script: it writes whatever the server answers (an HTML error page, half a file
when cut off) under the file's name. Here each file goes to a temp name (download.py), its
header is checked against the format llm.c gives it (magic, version, and a token shard's
length), and only then is it renamed into place. A file already there is checked the same way
and kept, so a rerun downloads only what is missing or was refused.

Needs the internet (Hugging Face); --base-url names a mirror (any URL urllib reads, file://
too), under which the files have the same names.
"""

import argparse
import os
import struct

from download import download_file
from gpt2_bpe import TOKENIZER_MAGIC
from hellaswag import EVAL_MAGIC, EVAL_VERSION
from tokenize_folder import HEADER_INTS, SHARD_MAGIC, SHARD_VERSION, TOKENIZER_FILENAME, die

BASE_URL = "https://huggingface.co/datasets/karpathy/llmc-starter-pack/resolve/main/"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER_BYTES = HEADER_INTS * 4
MODEL_MAGIC, DEBUG_STATE_MAGIC = 20240326, 20240327  # llm.c's model file and debug state

# name: (folder under the root, magic, the versions llm.c writes, what it is); the formats are llm.c's
FILES = {
    "gpt2_124M.bin": ("", MODEL_MAGIC, (3,), "GPT-2 124M, fp32 model file"),
    "gpt2_124M_bf16.bin": ("", MODEL_MAGIC, (5,), "GPT-2 124M, bf16 model file"),
    "gpt2_124M_debug_state.bin": ("", DEBUG_STATE_MAGIC, (2,), "llm.c's debug state of GPT-2 124M"),
    TOKENIZER_FILENAME: ("", TOKENIZER_MAGIC, (1, 2), "GPT-2 decode tokenizer"),
    "tiny_shakespeare_train.bin": ("dev/data/tinyshakespeare", SHARD_MAGIC, (SHARD_VERSION,), "TinyShakespeare train shard"),
    "tiny_shakespeare_val.bin": ("dev/data/tinyshakespeare", SHARD_MAGIC, (SHARD_VERSION,), "TinyShakespeare val shard"),
    "hellaswag_val.bin": ("dev/data/hellaswag", EVAL_MAGIC, (EVAL_VERSION,), "HellaSwag eval file"),
}
OFFLINE_HINT = ("without internet, copy these files from a machine that has them, or use the offline corpus: "
                "bash dev/data/prepare_default.sh")


def header_problem(path, name):
    """None when the file at path has the header llm.c gives `name`, else what is wrong with it"""
    _, magic, versions, what = FILES[name]
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        return f"{size} bytes, shorter than a {HEADER_BYTES}-byte header (expected a {what})"
    with open(path, "rb") as f:
        header = struct.unpack("<4i", f.read(16))
    if header[0] != magic:
        return f"magic {header[0]}, expected {magic} (not a {what}: an error page or another file?)"
    if header[1] not in versions:
        return f"version {header[1]}, expected {' or '.join(map(str, versions))} ({what})"
    if magic == SHARD_MAGIC and size != HEADER_BYTES + 2 * header[2]:
        return f"{size} bytes, but its header says {header[2]} tokens ({HEADER_BYTES + 2 * header[2]} bytes): truncated"
    return None


def fetch(name, base_url, root):
    folder = os.path.join(root, FILES[name][0])
    path = os.path.join(folder, name)
    if os.path.exists(path):
        problem = header_problem(path, name)
        if problem:
            die(f"{path} is already there but is not llm.c's {name}: {problem}; delete it and run again")
        print(f"{path} already there, checked")
        return path
    staged = path + ".download"  # download.py writes staged + ".part", then renames it to staged
    if os.path.exists(staged):
        os.remove(staged)
    download_file(base_url + name, staged, OFFLINE_HINT)
    problem = header_problem(staged, name)
    if problem:
        os.remove(staged)
        die(f"{base_url + name} did not give llm.c's {name}: {problem}")
    os.replace(staged, path)
    return path


def main():
    parser = argparse.ArgumentParser(description="Download llm.c's starter pack into the places llm.c puts it.")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help=f"which files (default: all of them): {', '.join(FILES)}")
    parser.add_argument("--base-url", default=BASE_URL, help=f"where the files are (default {BASE_URL})")
    parser.add_argument("--root", default=REPO, help="the llm8 checkout to put them in (default: this one)")
    args = parser.parse_args()
    for name in args.files:
        if name not in FILES:
            die(f"'{name}' is not a starter-pack file (expected some of: {', '.join(FILES)})")
    base_url = args.base_url if args.base_url.endswith("/") else args.base_url + "/"
    for name in args.files or list(FILES):
        fetch(name, base_url, args.root)
    print("fine-tune GPT-2 124M on TinyShakespeare as llm.c's quick start does:\n"
          "  ./train_gpt2_fp8 -e gpt2_124M_bf16.bin -i dev/data/tinyshakespeare/tiny_shakespeare_train.bin "
          "-j dev/data/tinyshakespeare/tiny_shakespeare_val.bin")


if __name__ == "__main__":
    main()
