"""
FineWeb (or FineWeb-Edu) 10B / 100B-token samples as llm.c GPT-2 token shards.

Needs the internet and the `datasets` package (pip install datasets). The
sample is streamed from the Hugging Face hub (HF_ENDPOINT is honored), so no
28 GB parquet cache is kept; documents keep the dataset's order, each prefixed
with the EOT token.

Shard names and contents are llm.c's (fineweb_val_000000.bin,
fineweb_train_000001.bin, ..., in dev/data/fineweb10B/ etc.), so llm.c's run
commands find them and val losses compare with llm.c's runs: val is the first
--shard-size tokens of the stream (100M), train every token after them, in
shards of --shard-size, the document at each boundary cut in two. That is what
llm.c's fineweb.py writes from the same documents in the same order (it loads the
sample whole, this script streams it: the datasets library reads the sample's
files in the same order either way; not checked against llm.c's files here, which
has no internet). --split document holds val out by document instead (a hash of
the FineWeb document id picks about 1% of the 10B sample, 0.1% of the 100B one,
capped at one shard), so no document is in both splits.

Usage: python3 dev/data/fineweb.py --version 10B [--type edu] [--shard-size N] [--split document]
(llm.c's spellings work too: python3 dev/data/fineweb.py -t edu -v 100B -s N)
"""

import argparse
import os
import sys

from download import check_reachable
from tokenize_folder import add_tokenize_arguments, check_tokenize_arguments, run_tokenize

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
HUB_REPOS = {"classic": "HuggingFaceFW/fineweb", "edu": "HuggingFaceFW/fineweb-edu"}
SAMPLE_NAMES = {"10B": "sample-10BT", "100B": "sample-100BT"}
VAL_FRACTIONS = {"10B": 0.01, "100B": 0.001}
NAME_PREFIXES = {"classic": "fineweb", "edu": "edu_fineweb"}


def fineweb_documents(rows):
    """(doc_id, get_text) from dataset rows with "id" and "text" fields."""
    for row in rows:
        yield row["id"], lambda text=row["text"]: text


def main():
    parser = argparse.ArgumentParser(description="Download and tokenize a FineWeb sample (needs the internet)")
    parser.add_argument("-t", "--type", choices=sorted(HUB_REPOS), default="classic",
                        help="classic FineWeb or FineWeb-Edu (default %(default)s)")
    parser.add_argument("-v", "--version", choices=sorted(SAMPLE_NAMES), default="10B",
                        help="sample size in tokens (default %(default)s)")
    add_tokenize_arguments(parser, default_prefix=None, default_out_dir=None, split="stream",
                           val_fraction=None, max_val_tokens=None)
    args = parser.parse_args()
    args.prefix = args.prefix or NAME_PREFIXES[args.type]
    args.out_dir = args.out_dir or os.path.join(DATA_DIR, f"{NAME_PREFIXES[args.type]}{args.version}")
    args.split_defaults.update(val_fraction=VAL_FRACTIONS[args.version], max_val_tokens=args.shard_size)
    check_tokenize_arguments(args)

    # The package first: offline, a missing package is the first thing to fix, and the network error
    # alone would hide that it is missing.
    try:
        import datasets
    except ImportError:
        print("error: fineweb.py needs the `datasets` package: pip install datasets", file=sys.stderr)
        sys.exit(1)
    check_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    rows = datasets.load_dataset(HUB_REPOS[args.type], name=SAMPLE_NAMES[args.version], split="train", streaming=True)
    run_tokenize(args, fineweb_documents(rows), f"the FineWeb sample {SAMPLE_NAMES[args.version]} gave no text")


if __name__ == "__main__":
    main()
