"""
GPT-2 BPE for llm8's data tools, built without the network.

Why this module exists: tiktoken.get_encoding("gpt2") downloads vocab.bpe and
encoder.json on first use, so on an offline machine every data script would die
with a network traceback. The GPT-2 merge ranks are a single 836 KB file that
is also shipped (as gpt2.tiktoken, byte-identical to tiktoken's
r50k_base.tiktoken) inside the openai-whisper package. So we look for the rank
file in a fixed order and build the tiktoken Encoding from it directly:

  (a) tiktoken's own cache (TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else
      <tmp>/data-gym-cache). tiktoken names a cached file by the sha1 of the URL
      it came from, so we look for the r50k_base.tiktoken URL's key, and for the
      pair of keys of the gpt2 vocab.bpe and encoder.json URLs;
  (b) a path the user gives: --bpe-file, or the environment variable
      LLM8_GPT2_BPE;
  (c) the openai-whisper package: whisper/assets/gpt2.tiktoken of an installed
      package, or the copy that scripts/setup_python.sh extracts from
      whisper's sdist into dev/data/cache/gpt2.tiktoken (installing whisper
      itself would pull in torch).

Every rank file is checked against the known sha256, so all sources give the
same tokens. This module also writes the decode tokenizer file that the
trainer reads to print samples (llm.c's gpt2_tokenizer.bin format).

Run it directly to see which rank file is used:
  python3 dev/data/gpt2_bpe.py [--bpe-file PATH] [--write-tokenizer PATH]
"""

import argparse
import base64
import hashlib
import importlib.util
import os
import sys
import tempfile

import numpy as np

EOT_TOKEN = 50256
VOCAB_SIZE = 50257
EOT_TEXT = "<|endoftext|>"
# GPT-2's pre-tokenization regex, as tiktoken writes it (possessive quantifiers).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

# sha256 of gpt2.tiktoken == r50k_base.tiktoken (50256 lines "base64(token) rank").
RANK_FILE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
GPT2_VOCAB_BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

BPE_ENV_VAR = "LLM8_GPT2_BPE"
PROJECT_CACHE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache", "gpt2.tiktoken")

TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2

MISSING_RANK_FILE_MESSAGE = (
    "error: GPT-2 BPE rank file (gpt2.tiktoken) not found. Get it in one of these ways: "
    "(1) run scripts/setup_python.sh, which extracts it from the openai-whisper sdist on PyPI "
    "into dev/data/cache/gpt2.tiktoken; "
    "(2) pass --bpe-file PATH or set LLM8_GPT2_BPE=PATH to a gpt2.tiktoken / r50k_base.tiktoken you have; "
    "(3) run tiktoken.get_encoding('gpt2') once on a machine with internet so it lands in tiktoken's cache "
    "(TIKTOKEN_CACHE_DIR, default <tmp>/data-gym-cache)."
)


class RankFileError(Exception):
    """A rank file could not be found or is not the GPT-2 one; str() is the one-line message."""


def tiktoken_cache_dir():
    """The directory tiktoken caches downloads in, or None when caching is disabled ("")."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return cache_dir if cache_dir else None


def tiktoken_cache_path(cache_dir, url):
    return os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def whisper_rank_file():
    """gpt2.tiktoken of an installed openai-whisper, found without importing it (that imports torch)."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        path = os.path.join(package_dir, "assets", "gpt2.tiktoken")
        if os.path.isfile(path):
            return path
    return None


def find_rank_source(bpe_file=None):
    """
    Returns (kind, paths, description): kind "tiktoken" with one rank file, or
    "data_gym" with the cached (vocab.bpe, encoder.json) pair. Raises
    RankFileError when nothing is found, or when a path the user gave is missing.
    """
    user_path = bpe_file or os.environ.get(BPE_ENV_VAR) or None
    if user_path is not None and not os.path.isfile(user_path):
        origin = "--bpe-file" if bpe_file else BPE_ENV_VAR
        raise RankFileError(f"error: {origin}={user_path}: no such file (expected GPT-2's gpt2.tiktoken rank file)")

    cache_dir = tiktoken_cache_dir()
    if cache_dir is not None:
        cached_ranks = tiktoken_cache_path(cache_dir, R50K_URL)
        if os.path.isfile(cached_ranks) and file_sha256(cached_ranks) == RANK_FILE_SHA256:
            return "tiktoken", (cached_ranks,), f"tiktoken cache {cached_ranks} (r50k_base.tiktoken)"
        cached_vocab = tiktoken_cache_path(cache_dir, GPT2_VOCAB_BPE_URL)
        cached_encoder = tiktoken_cache_path(cache_dir, GPT2_ENCODER_JSON_URL)
        if (os.path.isfile(cached_vocab) and os.path.isfile(cached_encoder)
                and file_sha256(cached_vocab) == GPT2_VOCAB_BPE_SHA256
                and file_sha256(cached_encoder) == GPT2_ENCODER_JSON_SHA256):
            return "data_gym", (cached_vocab, cached_encoder), f"tiktoken cache {cache_dir} (gpt2 vocab.bpe + encoder.json)"

    if user_path is not None:
        return "tiktoken", (user_path,), f"user-given {user_path}"

    installed = whisper_rank_file()
    if installed is not None:
        return "tiktoken", (installed,), f"openai-whisper package {installed}"
    if os.path.isfile(PROJECT_CACHE_PATH):
        return "tiktoken", (PROJECT_CACHE_PATH,), f"openai-whisper sdist copy {PROJECT_CACHE_PATH}"

    raise RankFileError(MISSING_RANK_FILE_MESSAGE)


def read_tiktoken_ranks(path):
    """Parses a .tiktoken file ("base64(token) rank" per line) after checking it is GPT-2's."""
    with open(path, "rb") as f:
        contents = f.read()
    digest = hashlib.sha256(contents).hexdigest()
    if digest != RANK_FILE_SHA256:
        raise RankFileError(f"error: {path}: sha256 {digest} is not GPT-2's rank file "
                            f"(expected gpt2.tiktoken / r50k_base.tiktoken, sha256 {RANK_FILE_SHA256})")
    ranks = {}
    for line in contents.splitlines():
        token_b64, rank = line.split()
        ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def read_data_gym_ranks(vocab_bpe_path, encoder_json_path):
    """Ranks from tiktoken's cached gpt2 vocab.bpe/encoder.json, converted by tiktoken itself.
    Passing the original URLs with their hashes makes tiktoken read its (already verified) cache."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    return data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=GPT2_VOCAB_BPE_URL,
        encoder_json_file=GPT2_ENCODER_JSON_URL,
        vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256,
        encoder_json_hash=GPT2_ENCODER_JSON_SHA256,
    )


def load_gpt2_encoding(bpe_file=None):
    """The GPT-2 tiktoken.Encoding built from a local rank file; its llm8_source attribute says
    which file. Raises RankFileError."""
    import tiktoken
    kind, paths, description = find_rank_source(bpe_file)
    ranks = read_tiktoken_ranks(paths[0]) if kind == "tiktoken" else read_data_gym_ranks(*paths)
    encoding = tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: EOT_TOKEN},
        explicit_n_vocab=VOCAB_SIZE,
    )
    encoding.llm8_source = description
    return encoding


def add_bpe_argument(parser):
    parser.add_argument("--bpe-file", default=None,
                        help=f"GPT-2 rank file gpt2.tiktoken; looked for in this order: tiktoken's cache, this file "
                             f"(else ${BPE_ENV_VAR}), openai-whisper (installed, or dev/data/cache/gpt2.tiktoken); "
                             "all are checked to be the same file")


def encoding_or_exit(bpe_file=None):
    """load_gpt2_encoding for command-line scripts: prints the one-line reason and exits 1 on failure."""
    try:
        encoding = load_gpt2_encoding(bpe_file)
    except RankFileError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    print(f"GPT-2 BPE ranks from {encoding.llm8_source}")
    return encoding


def write_tokenizer_file(encoding, path):
    """
    llm.c's decode tokenizer file: a 256-int32 header (magic 20240328, version 2,
    vocab size, EOT id), then for each token id a uint8 byte length and the raw bytes.
    """
    header = np.zeros(256, dtype=np.int32)
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = encoding.n_vocab
    header[3] = EOT_TOKEN
    parts = [header.tobytes()]
    for token in range(encoding.n_vocab):
        token_bytes = encoding.decode_single_token_bytes(token)
        if not 0 < len(token_bytes) < 256:
            raise ValueError(f"token {token} has {len(token_bytes)} bytes; the tokenizer file stores 1..255")
        parts.append(bytes([len(token_bytes)]))
        parts.append(token_bytes)
    temp_path = path + ".tmp"
    with open(temp_path, "wb") as f:
        f.write(b"".join(parts))
    os.replace(temp_path, path)


def read_tokenizer_file(path):
    """Reads a tokenizer file back into a list of token byte strings (used by the tests and --check)."""
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:1024], dtype=np.int32)
    if len(data) < 1024 or header[0] != TOKENIZER_MAGIC or header[1] not in (1, TOKENIZER_VERSION):
        raise ValueError(f"{path}: not a tokenizer file of version 1 or {TOKENIZER_VERSION} (magic {TOKENIZER_MAGIC})")
    tokens = []
    offset = 1024
    for _ in range(int(header[2])):
        length = data[offset]
        tokens.append(data[offset + 1: offset + 1 + length])
        offset += 1 + length
    if offset != len(data):
        raise ValueError(f"{path}: {len(data) - offset} bytes left after {header[2]} tokens")
    return tokens


def main():
    parser = argparse.ArgumentParser(description="Find the GPT-2 BPE rank file, check it, optionally write gpt2_tokenizer.bin")
    add_bpe_argument(parser)
    parser.add_argument("--write-tokenizer", default=None, metavar="PATH", help="write llm.c's decode tokenizer file here")
    args = parser.parse_args()
    encoding = encoding_or_exit(args.bpe_file)
    if encoding.encode("Hello world") != [15496, 995]:
        print("error: the GPT-2 encoding does not give 'Hello world' -> [15496, 995]", file=sys.stderr)
        sys.exit(1)
    if args.write_tokenizer:
        write_tokenizer_file(encoding, args.write_tokenizer)
        print(f"wrote {args.write_tokenizer}")


if __name__ == "__main__":
    main()
