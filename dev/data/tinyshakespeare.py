"""
TinyShakespeare (1 MB of Shakespeare's plays) as llm.c GPT-2 token shards.

Needs the internet (the text comes from GitHub). As in llm.c, every speech
(text between blank lines) is a document with the EOT token in front, and the
first 32,768 tokens are val, the rest train: llm.c's files (for the text at
DEFAULT_URL, llm.c's script reports 32,768 val and 305,260 train tokens). --split document holds out about 10% of the speeches instead (chosen by
a hash of the speech number), so no speech is cut in two.

Writes dev/data/tinyshakespeare/tiny_shakespeare_val.bin, tiny_shakespeare_train.bin
(llm.c's names; a split of several shards, with a small --shard-size, gets numbered
ones) and gpt2_tokenizer.bin.

Usage: python3 dev/data/tinyshakespeare.py [--url URL]
"""

import argparse
import os

from download import download_file
from tokenize_folder import add_tokenize_arguments, check_tokenize_arguments, run_tokenize

DEFAULT_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tinyshakespeare")
LLMC_VAL_TOKENS = 32768  # llm.c's val split: the first 32,768 tokens


def speeches(text):
    """Splits the play text at blank lines; each piece keeps its trailing blank line."""
    parts = text.split("\n\n")
    return [part + "\n\n" for part in parts[:-1]] + [parts[-1]]


def main():
    parser = argparse.ArgumentParser(description="Download and tokenize TinyShakespeare (needs the internet)")
    parser.add_argument("--url", default=DEFAULT_URL, help="where to download input.txt from")
    add_tokenize_arguments(parser, default_prefix="tiny_shakespeare", default_out_dir=DATA_DIR, split="stream",
                           val_fraction=0.1, val_tokens=LLMC_VAL_TOKENS)
    args = parser.parse_args()
    check_tokenize_arguments(args)
    text_path = os.path.join(args.out_dir, "tiny_shakespeare.txt")
    download_file(args.url, text_path)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    documents = [(f"speech{index:06d}", lambda speech=speech: speech) for index, speech in enumerate(speeches(text))]
    run_tokenize(args, documents, f"{text_path} holds no text", one_file_names=True)


if __name__ == "__main__":
    main()
