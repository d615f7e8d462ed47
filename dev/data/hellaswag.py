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

Usage: python3 dev/data/hellaswag.py [--url URL]
"""

import argparse
import json
import os
import sys

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
    """(label, context tokens, [tokens of each completion]) for one HellaSwag json object; ValueError names what
    the trainer's loader (llmc/eval_loader.h) would refuse in the file written from it"""
    if not isinstance(example, dict):
        raise ValueError(f"a json {type(example).__name__}, expected an object with ctx, endings and label")
    endings, context, label = example.get("endings"), example.get("ctx"), example.get("label")
    if not isinstance(endings, list) or len(endings) != NUM_COMPLETIONS or not all(isinstance(e, str) for e in endings):
        raise ValueError(f"endings {str(endings)[:80]}: expected a list of {NUM_COMPLETIONS} strings")
    if not isinstance(context, str) or not context:
        raise ValueError(f"ctx {str(context)[:80]!r}: expected a non-empty string")
    if isinstance(label, str) and label.isdigit():
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < NUM_COMPLETIONS:
        raise ValueError(f"label {label!r}: expected 0..{NUM_COMPLETIONS - 1}")
    context_tokens = encoding.encode_ordinary(context)
    ending_tokens = [encoding.encode_ordinary(" " + ending) for ending in endings]
    return label, context_tokens, ending_tokens


def read_examples(encoding, jsonl_path):
    """every example of a HellaSwag jsonl file, tokenized; exits with one line naming the file and line of the first
    that is not json or not an example"""
    examples = []
    with open(jsonl_path, encoding="utf-8", errors="strict") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    examples.append(tokenize_example(encoding, json.loads(line)))
                except ValueError as e:  # json.JSONDecodeError is one
                    sys.exit(f"error: {jsonl_path} line {number}: {e}")
        except UnicodeDecodeError as e:
            sys.exit(f"error: {jsonl_path}: not UTF-8 ({e.reason} at byte {e.start} of a chunk)")
    return examples


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
    parser.add_argument("--out-dir", default=DATA_DIR,
                        help="where hellaswag_val.jsonl is downloaded and hellaswag_val.bin written (default "
                             "%(default)s); the trainer's -h 1 reads only dev/data/hellaswag/hellaswag_val.bin, "
                             "relative to the directory it runs in, so a file written elsewhere must be copied there")
    add_bpe_argument(parser)
    args = parser.parse_args()
    encoding = encoding_or_exit(args.bpe_file)
    jsonl_path = os.path.join(args.out_dir, "hellaswag_val.jsonl")
    download_file(args.url, jsonl_path, f"without internet, copy hellaswag_val.jsonl from a machine that has it into "
                  f"{args.out_dir} and run this again, or train with -h 0")
    examples = read_examples(encoding, jsonl_path)
    out_path = os.path.join(args.out_dir, "hellaswag_val.bin")
    try:
        write_eval_file(out_path, examples)
    except ValueError as e:
        sys.exit(f"error: {jsonl_path}: {e}")
    print(f"wrote {len(examples):,} examples to {out_path}")


if __name__ == "__main__":
    main()
