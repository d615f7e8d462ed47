"""
Tokenize a folder (or a list of files) of text into llm.c token shards.

Why it is shaped so: every dataset script of llm8 (offline corpus,
tinyshakespeare, FineWeb) reduces to "a stream of documents -> GPT-2 tokens ->
train/val shards", so that stream lives here once, in tokenize_documents().

- Shard format (llm.c): 256 int32 header (magic 20240520, version 1,
  [2] = token count), then the tokens as uint16.
- Each document is prefixed with the EOT token 50256, as llm.c's scripts do,
  and encoded with encode_ordinary (a literal "<|endoftext|>" in a text is text).
- Two ways to split val from train (--split):
  - document (the default here): the val split is held out BY DOCUMENT: sha256 of
    the document id (the path relative to the input folder) decides, so no
    document is in both splits, and the split does not depend on where the folder
    lives or on the file order (tokenize_folder.py moves one document where the
    hash would leave a split empty: split_overrides());
  - stream (llm.c's way, the default of fineweb.py and tinyshakespeare.py): the
    first --val-tokens tokens of the whole stream are val and every token after
    them is train, the document at the boundary cut in two. With --val-tokens equal
    to --shard-size this is exactly llm.c's FineWeb layout (val is the stream's
    first shard), so the same documents in the same order give llm.c's bytes and
    val losses that compare with llm.c's runs.
- Shards of one split are exactly --shard-size tokens except the last one.
  Names: <prefix>_val_000000.bin (val first, as llm.c's fineweb does), then
  <prefix>_train_000001.bin, ... They are written into a staging folder
  (.<prefix>.partial in --out-dir) and replace the old shards with the same prefix
  only once complete and checked: a smaller rerun leaves no stale shards behind,
  and a run that fails (an empty split, an interruption) leaves the old dataset.
- Deterministic: documents go in a fixed order through an order-preserving
  thread pool (tiktoken releases the GIL while encoding), so two runs write
  identical bytes whatever --workers is.

Usage:
  python3 dev/data/tokenize_folder.py INPUT [INPUT...] --out-dir DIR --prefix NAME
"""

import argparse
import glob
import gzip
import hashlib
import itertools
import os
import shutil
import sys
import zlib
from multiprocessing.pool import ThreadPool

import numpy as np

from gpt2_bpe import EOT_TOKEN, add_bpe_argument, encoding_or_exit, write_tokenizer_file

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
DEFAULT_SHARD_SIZE = 100_000_000
DEFAULT_VAL_FRACTION = 0.05
SPLITS = ("document", "stream")
TOKENIZER_FILENAME = "gpt2_tokenizer.bin"
# Absolute, as offline_corpus.py's and tinyshakespeare.py's defaults are: the same folder whatever
# directory the script is run from.
DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenized")
SKIPPED_SHOWN = 5  # the summary names this many skipped documents, so the user can look at them


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def write_shard(path, tokens):
    """Writes one token shard (header + uint16 tokens) through a temp file and a rename."""
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = len(tokens)
    temp_path = path + ".tmp"
    with open(temp_path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
    os.replace(temp_path, path)


def read_shard(path):
    """Reads a token shard back, checking magic, version and length."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_INTS * 4:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the 1024-byte header")
    header = np.frombuffer(data[:HEADER_INTS * 4], dtype=np.int32)
    if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: magic/version {header[0]}/{header[1]}, expected {SHARD_MAGIC}/{SHARD_VERSION}")
    tokens = np.frombuffer(data[HEADER_INTS * 4:], dtype=np.uint16)
    if len(tokens) != header[2]:
        raise ValueError(f"{path}: header says {header[2]} tokens, file holds {len(tokens)}")
    return tokens


def shard_path(out_dir, prefix, split, index):
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


def document_hash(doc_id):
    """The first 8 bytes of sha256(doc_id) as an integer in [0, 2^64)."""
    digest = hashlib.sha256(doc_id.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


def is_val_document(doc_id, val_fraction):
    """Deterministic by-document split: document_hash as a fraction of 2^64, below val_fraction."""
    return document_hash(doc_id) < val_fraction * 2.0**64


def split_overrides(documents, val_fraction):
    """
    For the by-document split of a list of documents: {doc_id: split} for the one document that
    must move so that neither split is empty, or None when no document has any text.
    Each document is val with probability val_fraction, so a folder of a few documents often has
    none in val, and the trainer's -j 'OUT/data_val_*.bin' would then match nothing. When no
    document with text would be val, the one with the lowest hash (the nearest to val) is val;
    when every one would be val, the one with the highest hash is train; a lone document is train
    (run_tokenize warns that there is no val). Every other document keeps its hash's split.
    Only the texts at both ends of the hash order are read, until one with text is found at each
    end: usually two reads; get_text must keep no state (offline_corpus.py's de-duplicates).
    val_fraction 0 asks for no val, and gets none.
    """
    by_hash = sorted(documents, key=lambda document: document_hash(document[0]))

    def first_with_text(indices):
        return next((i for i in indices if by_hash[i][1]()), None)

    low = first_with_text(range(len(by_hash)))
    if low is None:
        return None
    high = first_with_text(range(len(by_hash) - 1, low - 1, -1))  # finds low itself at the latest
    lowest, highest = by_hash[low][0], by_hash[high][0]
    if high == low:  # one document with text
        return {lowest: "train"}
    if val_fraction > 0 and not is_val_document(lowest, val_fraction):
        return {lowest: "val"}
    if is_val_document(highest, val_fraction):
        return {highest: "train"}
    return {}


def read_text_file(path):
    """A file's text, decompressing .gz; None for binaries (NUL bytes) and non-UTF-8 files."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def list_text_files(inputs):
    """(doc_id, path) for every file under the inputs, sorted; doc_id is the path relative to
    its input folder (the basename for a file given directly). Dies on a missing input."""
    files = []
    for input_path in inputs:
        if os.path.isfile(input_path):
            files.append((os.path.basename(input_path), input_path))
        elif os.path.isdir(input_path):
            for root, dirs, names in os.walk(input_path):
                dirs.sort()
                for name in sorted(names):
                    path = os.path.join(root, name)
                    if os.path.isfile(path):
                        files.append((os.path.relpath(path, input_path), path))
        else:
            die(f"input {input_path} does not exist (expected a folder or a file of text)")
    return files


class ShardWriter:
    """Collects one split's tokens into fixed-size shards; stops accepting at max_tokens."""

    def __init__(self, out_dir, prefix, split, first_index, shard_size, max_tokens):
        self.out_dir = out_dir
        self.prefix = prefix
        self.split = split
        self.next_index = first_index
        self.shard_size = shard_size
        self.max_tokens = max_tokens
        self.buffer = None
        self.filled = 0
        self.num_tokens = 0
        self.num_documents = 0
        self.paths = []

    def is_full(self):
        return self.max_tokens is not None and self.num_tokens >= self.max_tokens

    def add(self, tokens):
        """Appends one document's tokens, cut at max_tokens; returns the cut-off rest."""
        rest = []
        if self.max_tokens is not None:
            room = self.max_tokens - self.num_tokens
            tokens, rest = tokens[:room], tokens[room:]
        self.num_documents += 1
        self.num_tokens += len(tokens)
        position = 0
        while position < len(tokens):
            if self.buffer is None:
                self.buffer = np.empty(self.shard_size, dtype=np.uint16)
            count = min(len(tokens) - position, self.shard_size - self.filled)
            self.buffer[self.filled:self.filled + count] = tokens[position:position + count]
            self.filled += count
            position += count
            if self.filled == self.shard_size:
                self.flush()
        return rest

    def flush(self):
        if self.filled == 0:
            return
        path = shard_path(self.out_dir, self.prefix, self.split, self.next_index)
        write_shard(path, self.buffer[:self.filled])
        print(f"wrote {self.filled:,} tokens ({os.path.basename(path)})")
        self.paths.append(path)
        self.next_index += 1
        self.filled = 0


def old_shards(out_dir, prefix):
    """The shards of prefix in out_dir: <prefix>_<split>_NNNNNN.bin and the one-file <prefix>_<split>.bin of
    both splits (six digits exactly, so another prefix that starts with this one keeps its files)."""
    paths = []
    for split in ("train", "val"):
        pattern = os.path.join(glob.escape(out_dir), f"{glob.escape(prefix)}_{split}")
        paths += glob.glob(pattern + "_" + "[0-9]" * 6 + ".bin") + glob.glob(pattern + ".bin")
    return sorted(paths)


def staging_dir(out_dir, prefix):
    """Where run_tokenize writes the new shards until they are complete and checked."""
    return os.path.join(out_dir, f".{prefix}.partial")


def publish_shards(result, out_dir, prefix, one_file_names=False):
    """Replaces the old shards of prefix in out_dir with the staged ones: the new ones are moved in first
    (over old ones of the same name), then the old ones left over are removed, so no moment has neither
    dataset; then forgets the staging folder. one_file_names: a split of one shard is named
    <prefix>_<split>.bin, as llm.c names TinyShakespeare's."""
    old = old_shards(out_dir, prefix)
    for writer in (result["val"], result["train"]):
        published = [os.path.join(out_dir, f"{prefix}_{writer.split}.bin" if one_file_names and len(writer.paths) == 1
                                  else os.path.basename(path)) for path in writer.paths]
        for staged, path in zip(writer.paths, published):
            os.replace(staged, path)
        writer.paths = published
    new = set(result["val"].paths + result["train"].paths)
    for path in old:
        if path not in new:
            os.remove(path)
            print(f"removed old shard {path}")
    os.rmdir(staging_dir(out_dir, prefix))


def tokenize_documents(documents, encoding, out_dir, prefix, shard_size=DEFAULT_SHARD_SIZE,
                       val_fraction=DEFAULT_VAL_FRACTION, max_train_tokens=None, max_val_tokens=None,
                       workers=1, val_tokens=None, overrides=None):
    """
    documents: iterable of (doc_id, get_text) in a fixed order; get_text() returns the
    document's text, or None to skip it (binary, not UTF-8). An empty text is skipped too in
    the by-document split; in the stream split it is a document of one EOT, as llm.c writes it.
    val_tokens None: the by-document split (val_fraction of the documents, capped at
    max_val_tokens); a count: the stream split, the first val_tokens tokens are val
    (val_fraction and max_val_tokens unused). overrides: {doc_id: split} that the by-document split
    takes over the hash's (split_overrides()).
    Writes <prefix>_val_000000.bin, ... and <prefix>_train_000001.bin, ... into out_dir (run_tokenize
    gives a staging folder) and returns {"val": ShardWriter, "train": ShardWriter, "skipped":
    number of skipped documents, "skipped_ids": the first SKIPPED_SHOWN of them, "texts": number of
    documents with any text}.
    """
    os.makedirs(out_dir, exist_ok=True)
    by_stream = val_tokens is not None
    overrides = overrides or {}
    writers = {
        "val": ShardWriter(out_dir, prefix, "val", 0, shard_size, val_tokens if by_stream else max_val_tokens),
        "train": ShardWriter(out_dir, prefix, "train", 1, shard_size, max_train_tokens),
    }

    def split_of(doc_id):
        if by_stream:  # decided when the tokens are added: val until it is full
            return "train" if writers["val"].is_full() else "val"
        if doc_id in overrides:
            return overrides[doc_id]
        return "val" if is_val_document(doc_id, val_fraction) else "train"

    def encode_text(text):
        tokens = encoding.encode_ordinary(text)
        tokens.insert(0, EOT_TOKEN)
        return tokens

    # Texts are read in this thread, in order (get_text may keep state, e.g. de-duplication);
    # only the encoding runs in the pool. One batch at a time bounds memory for streamed datasets.
    skipped = 0
    skipped_ids = []
    texts = 0  # documents with any text (the stream split keeps empty ones as a lone EOT)
    document_iterator = iter(documents)
    with ThreadPool(workers) as pool:
        while not (writers["val"].is_full() and writers["train"].is_full()):
            batch = []
            slice_of_documents = list(itertools.islice(document_iterator, 64 * workers))
            if not slice_of_documents:
                break
            for doc_id, get_text in slice_of_documents:
                split = split_of(doc_id)
                if writers[split].is_full():
                    continue
                text = get_text()
                if text or (by_stream and text is not None):
                    batch.append((split, text))
                    texts += bool(text)
                else:
                    skipped += 1
                    if len(skipped_ids) < SKIPPED_SHOWN:
                        skipped_ids.append(doc_id)
            for (split, _), tokens in zip(batch, pool.map(encode_text, [text for _, text in batch])):
                if by_stream:  # val until it is full; the boundary document's rest, and all after it, train
                    if not writers["val"].is_full():
                        tokens = writers["val"].add(tokens)
                    split = "train"
                if tokens and not writers[split].is_full():
                    writers[split].add(tokens)
    for writer in writers.values():
        writer.flush()
    return {"val": writers["val"], "train": writers["train"], "skipped": skipped, "skipped_ids": skipped_ids,
            "texts": texts}


def print_summary(result):
    for split in ("train", "val"):
        writer = result[split]
        print(f"{split}: {writer.num_tokens:,} tokens from {writer.num_documents:,} documents in {len(writer.paths)} shard(s)")
    line = f"skipped {result['skipped']:,} documents (binary, not UTF-8, empty or duplicate)"
    shown = result["skipped_ids"]
    if shown:  # the first few by name, so a file skipped by mistake can be found
        line += ": " + ", ".join(shown)
        if result["skipped"] > len(shown):
            line += f" and {result['skipped'] - len(shown):,} more"
    print(line)


def add_tokenize_arguments(parser, default_prefix, default_out_dir, split="document",
                           val_fraction=DEFAULT_VAL_FRACTION, max_train_tokens=0, max_val_tokens=0, val_tokens=None):
    """The flags every dataset script shares, with that script's defaults. The flags of one split
    (--val-fraction, --max-val-tokens: document; --val-tokens: stream) parse as None when not
    given, so check_tokenize_arguments can refuse one given with the other split; it fills in the
    defaults (a script may change split_defaults before, as fineweb.py does per --version)."""
    parser.set_defaults(split_defaults={"val_fraction": val_fraction, "max_val_tokens": max_val_tokens,
                                        "val_tokens": val_tokens})
    parser.add_argument("--out-dir", default=default_out_dir,
                        help=f"where the shards and gpt2_tokenizer.bin go (default {default_out_dir or 'per dataset'})")
    parser.add_argument("--prefix", default=default_prefix, help="shard name prefix: PREFIX_val_000000.bin, PREFIX_train_000001.bin "
                             f"(default {default_prefix or 'per dataset'})")
    parser.add_argument("-s", "--shard-size", "--shard_size", dest="shard_size", type=int, default=DEFAULT_SHARD_SIZE,
                        help="tokens per shard (default 100M, as llm.c; -s and --shard_size are llm.c's spellings)")
    parser.add_argument("--split", choices=SPLITS, default=split,
                        help="document: hold out --val-fraction of the documents, chosen by a hash of the document id; "
                             "stream: the first --val-tokens tokens of the stream are val, the rest train, as llm.c "
                             f"splits (default {split})")
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="--split document: the fraction of documents held out for val "
                             f"(default {'per --version' if val_fraction is None else val_fraction})")
    parser.add_argument("--max-val-tokens", type=int, default=None,
                        help="--split document: stop the val split at this many tokens "
                             f"(0 = no cap; default {'one shard' if max_val_tokens is None else max_val_tokens})")
    parser.add_argument("--val-tokens", type=int, default=None,
                        help="--split stream: how many tokens at the start of the stream are val "
                             f"(default {'one shard, --shard-size, as llm.c' if val_tokens is None else val_tokens})")
    parser.add_argument("--max-train-tokens", type=int, default=max_train_tokens,
                        help=f"stop the train split at this many tokens (0 = no cap; default {max_train_tokens})")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer threads (default: the CPU count, %(default)s)")
    add_bpe_argument(parser)


def check_tokenize_arguments(args):
    """Checks the shared flags and fills in the split's defaults (add_tokenize_arguments)."""
    if not 1 <= args.shard_size <= 2**31 - 1:
        die(f"--shard-size {args.shard_size}: expected a positive number of tokens, at most 2^31 - 1 (the header's int32)")
    defaults = args.split_defaults
    if args.split == "document":
        if args.val_tokens is not None:
            die(f"--val-tokens {args.val_tokens}: only with --split stream "
                "(--split document holds out --val-fraction of the documents)")
        args.val_fraction = defaults["val_fraction"] if args.val_fraction is None else args.val_fraction
        args.max_val_tokens = defaults["max_val_tokens"] if args.max_val_tokens is None else args.max_val_tokens
        if not 0.0 <= args.val_fraction < 1.0:
            die(f"--val-fraction {args.val_fraction}: expected a fraction in [0, 1)")
    else:
        for flag, value in (("--val-fraction", args.val_fraction), ("--max-val-tokens", args.max_val_tokens)):
            if value is not None:
                die(f"{flag} {value}: only with --split document (--split stream takes the first --val-tokens "
                    "tokens of the stream as val)")
        args.val_tokens = (defaults["val_tokens"] or args.shard_size) if args.val_tokens is None else args.val_tokens
        if args.val_tokens < 1:
            die(f"--val-tokens {args.val_tokens}: expected a positive number of tokens")
    for flag, value in (("--max-train-tokens", args.max_train_tokens), ("--max-val-tokens", args.max_val_tokens)):
        if value is not None and value < 0:
            die(f"{flag} {value}: expected a token count >= 0 (0 = no cap)")
    if args.workers < 1:
        die(f"--workers {args.workers}: expected at least 1")
    if not args.prefix or os.sep in args.prefix:
        die(f"--prefix '{args.prefix}': expected a non-empty name without '{os.sep}'")


def run_tokenize(args, documents, empty_error, require_val=False, one_file_names=False, overrides=None):
    """The shared tail of the dataset scripts: encoding, shards, tokenizer file, summary. The new shards
    are written into a staging folder and replace the old ones only once complete, with a train split
    (and a val split, require_val): otherwise the old dataset stays and the run stops with one line,
    empty_error where there was no text at all. one_file_names: publish_shards'; overrides:
    tokenize_documents'."""
    encoding = encoding_or_exit(args.bpe_file)
    staging = staging_dir(args.out_dir, args.prefix)
    shutil.rmtree(staging, ignore_errors=True)  # a run cut off before
    try:  # creates --out-dir too; a path through a file, or where no folder can be made, is the user's to fix
        os.makedirs(staging, exist_ok=True)
    except OSError as e:
        die(f"--out-dir {args.out_dir}: cannot create the folder ({e.strerror}); expected a folder that exists "
            "or can be created")
    result = tokenize_documents(documents, encoding, staging, args.prefix, args.shard_size, args.val_fraction,
                                args.max_train_tokens or None, args.max_val_tokens or None, args.workers,
                                args.val_tokens if args.split == "stream" else None, overrides)
    problem = None
    if result["texts"] == 0:
        problem = empty_error
    elif args.split == "stream" and result["val"].num_tokens > 0 and result["train"].num_tokens == 0:
        problem = (f"the stream ended within its first {args.val_tokens:,} tokens (--val-tokens), which are all val: "
                   "the train split is empty; lower --val-tokens or add documents")
    elif result["train"].num_tokens == 0 or (require_val and result["val"].num_tokens == 0):
        problem = empty_error
    if problem is not None:
        shutil.rmtree(staging, ignore_errors=True)
        die(problem + (f" (the shards in {args.out_dir} are as they were)" if old_shards(args.out_dir, args.prefix) else ""))
    # Warned only here, after the errors: an input with no text at all gets the error alone.
    if args.split == "document" and result["val"].num_tokens == 0:
        if result["texts"] == 1:
            print("warning: only one document has text: it went to train and no val shard was written; add documents "
                  "for a val split, or train without val: pass -j \"\" to the trainer", file=sys.stderr)
        else:
            print(f"warning: no document fell into the val split (val fraction {args.val_fraction}); raise "
                  "--val-fraction or add documents, or train without val: pass -j \"\" to the trainer", file=sys.stderr)
    publish_shards(result, args.out_dir, args.prefix, one_file_names)
    write_tokenizer_file(encoding, os.path.join(args.out_dir, TOKENIZER_FILENAME))
    print(f"wrote {os.path.join(args.out_dir, TOKENIZER_FILENAME)}")
    print_summary(result)
    return result


def main():
    parser = argparse.ArgumentParser(description="Tokenize folders/files of text into llm.c GPT-2 token shards")
    parser.add_argument("inputs", nargs="+", help="folders (walked recursively) and/or text files; one file = one document")
    add_tokenize_arguments(parser, default_prefix="data", default_out_dir=DEFAULT_OUT_DIR)
    args = parser.parse_args()
    check_tokenize_arguments(args)
    files = list_text_files(args.inputs)
    if not files:
        die(f"no files found under {' '.join(args.inputs)}")
    documents = [(doc_id, lambda path=path: read_text_file(path)) for doc_id, path in files]
    empty_error = f"no text found in {' '.join(args.inputs)} (every file was binary, not UTF-8, or empty)"
    # Before any tokenizing: a folder with no text at all stops here, and a folder of a few documents
    # still gets a val split (the trainer's -j needs one); the stream split uses only the first.
    overrides = split_overrides(documents, args.val_fraction if args.split == "document" else 0.0)
    if overrides is None:
        die(empty_error)
    run_tokenize(args, documents, empty_error, overrides=overrides if args.split == "document" else None)


if __name__ == "__main__":
    main()
