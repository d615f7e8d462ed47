"""
HellaSwag validation set as llm.c's eval file, for the trainer's -h 1.

Needs the internet (the jsonl comes from the HellaSwag GitHub repository).

Eval file format (llm.c's, read by llmc/eval_loader.h): a 256-int32 header
(magic 20240522, version 1, [2] = number of examples, [3] = the longest
example in bytes), then each example as a stream of uint16:
  65535 (start marker), the example's length in bytes (this whole stream),
  the example index, the label (index of the right completion),
  the number of completions (4), the context length, the context tokens,
  then for each completion its length and its tokens.
Each completion is encoded with a space in front (" " + ending), as GPT-2 sees
a continuation; the context is encoded alone, as llm.c's hellaswag.py does.

Writes dev/data/hellaswag/hellaswag_val.bin.

Usage: python dev/data/hellaswag.py [--url URL]
"""

import argparse
import json
import os

import numpy as np

from download import download_file
from gpt2_bpe import add_bpe_argument, encoding_or_exit

EVAL_MAGIC = 20240522
EVAL_VERSION = 1
START_MARKER = 65535
NUM_COMPLETIONS = 4
DEFAULT_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag")


def tokenize_example(encoding, example):
    """(label, context tokens, [tokens of each completion]) for one HellaSwag json object."""
    endings = example["endings"]
    if len(endings) != NUM_COMPLETIONS:
        raise ValueError(f"example {example.get('ind')}: {len(endings)} endings, expected {NUM_COMPLETIONS}")
    context_tokens = encoding.encode_ordinary(example["ctx"])
    ending_tokens = [encoding.encode_ordinary(" " + ending) for ending in endings]
    return int(example["label"]), context_tokens, ending_tokens


def example_stream(index, label, context_tokens, ending_tokens):
    """One example's uint16 stream, its byte length filled in."""
    stream = [START_MARKER, 0, index, label, len(ending_tokens), len(context_tokens), *context_tokens]
    for tokens in ending_tokens:
        stream.append(len(tokens))
        stream.extend(tokens)
    stream[1] = 2 * len(stream)
    if stream[1] >= 2**16:
        raise ValueError(f"example {index}: {stream[1]} bytes, the format allows < 65536")
    return stream


def write_eval_file(path, examples):
    """examples: list of (label, context tokens, [completion tokens]); writes llm.c's eval file."""
    if not 0 < len(examples) < 2**16:
        raise ValueError(f"{len(examples)} examples, the format allows 1..65535")
    streams = [example_stream(index, *example) for index, example in enumerate(examples)]
    header = np.zeros(256, dtype=np.int32)
    header[0] = EVAL_MAGIC
    header[1] = EVAL_VERSION
    header[2] = len(examples)
    header[3] = max(stream[1] for stream in streams)
    body = np.array([value for stream in streams for value in stream], dtype=np.uint16)
    temp_path = path + ".tmp"
    with open(temp_path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())
    os.replace(temp_path, path)


def main():
    parser = argparse.ArgumentParser(description="Download HellaSwag val and write llm.c's eval file (needs the internet)")
    parser.add_argument("--url", default=DEFAULT_URL, help="where to download hellaswag_val.jsonl from")
    parser.add_argument("--out-dir", default=DATA_DIR)
    add_bpe_argument(parser)
    args = parser.parse_args()
    encoding = encoding_or_exit(args.bpe_file)
    jsonl_path = os.path.join(args.out_dir, "hellaswag_val.jsonl")
    download_file(args.url, jsonl_path, f"without internet, copy hellaswag_val.jsonl from a machine that has it into "
                  f"{args.out_dir} and run this again, or train with -h 0")
    with open(jsonl_path, encoding="utf-8") as f:
        examples = [tokenize_example(encoding, json.loads(line)) for line in f if line.strip()]
    out_path = os.path.join(args.out_dir, "hellaswag_val.bin")
    write_eval_file(out_path, examples)
    print(f"wrote {len(examples):,} examples to {out_path}")


if __name__ == "__main__":
    main()
