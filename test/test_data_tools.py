"""
Tests of the Python data tools (dev/data/) and scripts/plot.py. No internet needed.

Run: python -m pytest -q test/test_data_tools.py
The GPT-2 rank file comes from scripts/setup_python.sh (or any source gpt2_bpe.py
searches). Without one the BPE-dependent tests are skipped, unless LLM8_REQUIRE_BPE=1
(CI), where they fail.
"""

import base64
import gzip
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(REPO, "dev", "data")
sys.path.insert(0, DATA_DIR)

import gpt2_bpe  # noqa: E402
import hellaswag  # noqa: E402
import tokenize_folder  # noqa: E402

EOT = 50256


@pytest.fixture(scope="module")
def rank_file_bytes(encoding):
    """The gpt2.tiktoken bytes, rebuilt from the encoding through its public API."""
    lines = [base64.b64encode(encoding.decode_single_token_bytes(rank)) + b" %d\n" % rank for rank in range(EOT)]
    return b"".join(lines)


def run_script(args, env=None, cwd=REPO):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.strip()]


def help_text(script, cwd=REPO):
    """a script's --help with all whitespace taken out: argparse wraps lines, at spaces and hyphens"""
    result = run_script([script, "--help"], cwd=cwd)
    assert result.returncode == 0, result.stderr
    return "".join(result.stdout.split())


def unwrapped(text):
    return "".join(text.split())


def make_documents(folder, count):
    """count small text files with distinct contents; returns {relative path: text}."""
    texts = {}
    for i in range(count):
        relpath = os.path.join(f"part{i % 3}", f"doc_{i:03d}.txt")
        text = f"Document number {i}. " + " ".join(f"word{(i * 7 + j) % 50}" for j in range(5 + i % 11)) + " café ☕\n"
        os.makedirs(os.path.join(folder, os.path.dirname(relpath)), exist_ok=True)
        with open(os.path.join(folder, relpath), "w", encoding="utf-8") as f:
            f.write(text)
        texts[relpath] = text
    return texts


def split_shards(out_dir, prefix, split):
    """a split's shard files: numbered, or llm.c's one file <prefix>_<split>.bin"""
    names = sorted(name for name in os.listdir(out_dir)
                   if name.startswith(f"{prefix}_{split}_") or name == f"{prefix}_{split}.bin")
    return [os.path.join(out_dir, name) for name in names]


def documents_of(encoding, paths):
    """Decodes the concatenated shards and splits at EOT: the list of document texts."""
    tokens = np.concatenate([tokenize_folder.read_shard(path) for path in paths]).tolist()
    assert tokens[0] == EOT, "every document starts with EOT"
    documents, current = [], []
    for token in tokens[1:] + [EOT]:
        if token == EOT:
            documents.append(encoding.decode(current))
            current = []
        else:
            current.append(token)
    return documents


def stream_of(encoding, texts):
    """llm.c's token stream of documents in order: each one EOT, then its encode_ordinary tokens."""
    return [token for text in texts for token in [EOT] + encoding.encode_ordinary(text)]


def assert_stream_split(out_dir, prefix, stream, val_tokens, shard_size, one_file_names=False):
    """The layout of llm.c's scripts, rebuilt here from the stream: val is its first val_tokens
    tokens, train every token after them; each split in shards of shard_size tokens but its last
    (val counting from 000000, train from 000001; one_file_names: a split of one shard is
    <prefix>_<split>.bin, as llm.c names TinyShakespeare's files)."""
    for split, tokens, first_index in (("val", stream[:val_tokens], 0), ("train", stream[val_tokens:], 1)):
        paths = split_shards(out_dir, prefix, split)
        expected = [tokens[i:i + shard_size] for i in range(0, len(tokens), shard_size)]
        names = ([f"{prefix}_{split}.bin"] if one_file_names and len(expected) == 1 else
                 [f"{prefix}_{split}_{first_index + i:06d}.bin" for i in range(len(expected))])
        assert [os.path.basename(p) for p in paths] == names, split
        assert [tokenize_folder.read_shard(p).tolist() for p in paths] == expected, split


# --- GPT-2 BPE ----------------------------------------------------------------------------

def test_known_encodings(encoding):
    assert encoding.n_vocab == 50257
    assert encoding.eot_token == EOT
    assert encoding.encode("Hello world") == [15496, 995]
    assert encoding.encode(" the") == [262]
    assert encoding.encode("The") == [464]
    assert encoding.encode("\n") == [198]
    assert encoding.encode("!") == [0]
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [EOT]
    assert EOT not in encoding.encode_ordinary("<|endoftext|>")
    sample = "Naïve café — 東京 🙂 x = f(y)**2\n\n  tabs\tand   spaces "
    assert encoding.decode(encoding.encode(sample)) == sample


def test_rank_file_search_order(encoding, rank_file_bytes, tmp_path, monkeypatch):
    assert hashlib.sha256(rank_file_bytes).hexdigest() == gpt2_bpe.RANK_FILE_SHA256
    user_file = tmp_path / "my_gpt2.tiktoken"
    user_file.write_bytes(rank_file_bytes)
    cache_dir = tmp_path / "tiktoken_cache"
    cache_dir.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))

    # (b) a user-given path, by flag or by environment variable
    monkeypatch.delenv(gpt2_bpe.BPE_ENV_VAR, raising=False)
    assert gpt2_bpe.find_rank_source(str(user_file))[1] == (str(user_file),)
    monkeypatch.setenv(gpt2_bpe.BPE_ENV_VAR, str(user_file))
    assert gpt2_bpe.find_rank_source()[1] == (str(user_file),)
    assert gpt2_bpe.load_gpt2_encoding().encode("Hello world") == [15496, 995]

    # (a) tiktoken's cache comes first: the file named by the sha1 of the r50k_base URL
    cached = cache_dir / hashlib.sha1(gpt2_bpe.R50K_URL.encode()).hexdigest()
    cached.write_bytes(rank_file_bytes)
    kind, paths, description = gpt2_bpe.find_rank_source()
    assert (kind, paths) == ("tiktoken", (str(cached),)) and "tiktoken cache" in description

    # a user path that does not exist is an error even when the cache has the file
    with pytest.raises(gpt2_bpe.RankFileError, match="no such file"):
        gpt2_bpe.find_rank_source(str(tmp_path / "missing.tiktoken"))

    # a file that is not GPT-2's rank file is refused, and a corrupt cache entry is passed over
    wrong = tmp_path / "wrong.tiktoken"
    wrong.write_bytes(rank_file_bytes.replace(b" 0\n", b" 1\n", 1))
    with pytest.raises(gpt2_bpe.RankFileError, match="sha256"):
        gpt2_bpe.read_tiktoken_ranks(str(wrong))
    cached.write_bytes(wrong.read_bytes())
    assert gpt2_bpe.find_rank_source()[1] == (str(user_file),)


def test_missing_rank_file_is_one_clear_line(tmp_path):
    """Scripts copied away from the repo (no dev/data/cache), empty tiktoken cache, no user path."""
    if gpt2_bpe.whisper_rank_file() is not None:
        pytest.skip("openai-whisper is installed here, so a rank file is always found")
    for name in ("gpt2_bpe.py", "tokenize_folder.py"):
        shutil.copy(os.path.join(DATA_DIR, name), tmp_path / name)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some text")
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty_cache"), gpt2_bpe.BPE_ENV_VAR: ""}
    result = run_script([str(tmp_path / "tokenize_folder.py"), str(tmp_path / "in"), "--out-dir", str(tmp_path / "out")],
                        env=env, cwd=tmp_path)
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert "gpt2.tiktoken" in lines[0] and "setup_python.sh" in lines[0] and "--bpe-file" in lines[0]
    assert "tiktoken" in lines[0] and "Traceback" not in result.stderr

    result = run_script([str(tmp_path / "gpt2_bpe.py"), "--bpe-file", str(tmp_path / "nope.tiktoken")],
                        env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert error_lines(result) == [f"error: --bpe-file={tmp_path / 'nope.tiktoken'}: no such file "
                                   "(expected GPT-2's gpt2.tiktoken rank file)"]


def test_bpe_file_help_states_the_search_order():
    """--bpe-file's help names the sources in find_rank_source's order (test_rank_file_search_order): tiktoken's
    cache first, then the file given (or $LLM8_GPT2_BPE), then openai-whisper's"""
    for script in ("dev/data/gpt2_bpe.py", "dev/data/tokenize_folder.py", "dev/data/hellaswag.py",
                   "dev/data/fineweb.py"):
        text = help_text(script)
        bpe_help = text[text.index("--bpe-fileBPE_FILE"):]
        order = [bpe_help.find(unwrapped(name)) for name in ("tiktoken's cache", "$LLM8_GPT2_BPE", "openai-whisper")]
        assert -1 not in order and order == sorted(order), (script, bpe_help)


# --- formats ------------------------------------------------------------------------------

def test_shard_layout_is_exact(tmp_path):
    tokens = [EOT, 0, 1, 65535, 15496, 995, 50255]
    path = str(tmp_path / "x_train_000001.bin")
    tokenize_folder.write_shard(path, tokens)
    data = open(path, "rb").read()
    assert len(data) == 1024 + 2 * len(tokens)
    header = struct.unpack("<256i", data[:1024])
    assert header[:3] == (20240520, 1, len(tokens))
    assert all(value == 0 for value in header[3:])
    assert list(struct.unpack(f"<{len(tokens)}H", data[1024:])) == tokens
    assert tokenize_folder.read_shard(path).tolist() == tokens

    with open(path, "r+b") as f:
        f.truncate(len(data) - 2)
    with pytest.raises(ValueError, match="header says 7 tokens"):
        tokenize_folder.read_shard(path)
    with open(path, "r+b") as f:
        f.write(struct.pack("<i", 20240521))
    with pytest.raises(ValueError, match="magic"):
        tokenize_folder.read_shard(path)


def test_tokenizer_file_layout_and_decode(encoding, tmp_path):
    path = str(tmp_path / "gpt2_tokenizer.bin")
    gpt2_bpe.write_tokenizer_file(encoding, path)
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:4] == (20240328, 2, 50257, EOT) and not any(header[4:])
    # walk the records by hand: uint8 length, then that many bytes, for all 50257 tokens
    table, offset = [], 1024
    while offset < len(data):
        length = data[offset]
        assert length > 0
        table.append(data[offset + 1: offset + 1 + length])
        offset += 1 + length
    assert offset == len(data) and len(table) == 50257
    assert table[EOT] == b"<|endoftext|>"
    assert table[15496] == b"Hello" and table[995] == b" world"
    assert gpt2_bpe.read_tokenizer_file(path) == table
    sample = "The tokenizer file decodes: naïve café, 東京, emoji 🙂.\n"
    assert b"".join(table[token] for token in encoding.encode(sample)) == sample.encode("utf-8")


def read_eval_file(path):
    """An independent reader of llm.c's eval file: (header, [(index, label, ctx, [endings])])."""
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    stream = list(struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:]))
    examples, position = [], 0
    while position < len(stream):
        assert stream[position] == 65535
        nbytes, index, label, num_completions, context_length = stream[position + 1: position + 6]
        cursor = position + 6
        context = stream[cursor: cursor + context_length]
        cursor += context_length
        endings = []
        for _ in range(num_completions):
            length = stream[cursor]
            endings.append(stream[cursor + 1: cursor + 1 + length])
            cursor += 1 + length
        assert nbytes == 2 * (cursor - position)
        examples.append((index, label, context, endings))
        position = cursor
    return header, examples


def test_hellaswag_eval_file_layout(encoding, tmp_path):
    raw = [
        {"ind": 5, "ctx": "A man is sitting on a roof. he", "label": 3,
         "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                     "is holding a rubik's cube.", "starts pulling up roofing on a roof."]},
        {"ind": 9, "ctx": "Cooking: Put the pasta in water", "label": 0,
         "endings": ["and boil it.", "x", "and then a much longer ending that goes on for a while, " * 3, "."]},
    ]
    examples = [hellaswag.tokenize_example(encoding, example) for example in raw]
    for example, (label, context, endings) in zip(raw, examples):
        assert label == example["label"]
        assert context == encoding.encode(example["ctx"])
        assert endings == [encoding.encode(" " + ending) for ending in example["endings"]]
    path = str(tmp_path / "hellaswag_val.bin")
    hellaswag.write_eval_file(path, examples)
    header, read_back = read_eval_file(path)
    assert header[:3] == (20240522, 1, 2) and not any(header[4:])
    lengths = [2 * (6 + len(context) + sum(1 + len(e) for e in endings)) for _, context, endings in examples]
    assert header[3] == max(lengths)
    for index, ((label, context, endings), got) in enumerate(zip(examples, read_back)):
        assert got == (index, label, context, endings)
    with pytest.raises(ValueError, match="endings"):
        hellaswag.tokenize_example(encoding, dict(raw[0], endings=["a", "b"]))


HELLASWAG_GOOD = {"ind": 1, "ctx": "A man is sitting on a roof. he", "label": 2, "endings": ["a.", "b.", "c.", "d."]}


@pytest.mark.parametrize("line,message", [
    (json.dumps(dict(HELLASWAG_GOOD, label=7)), "label 7: expected 0..3"),
    (json.dumps(dict(HELLASWAG_GOOD, label=-1)), "label -1: expected 0..3"),
    (json.dumps(dict(HELLASWAG_GOOD, ctx="")), "ctx '': expected a non-empty string"),
    (json.dumps(dict(HELLASWAG_GOOD, endings=["a", "b", "c"])), "expected a list of 4 strings"),
    (json.dumps(dict(HELLASWAG_GOOD, endings=["a", "b", "c", 4])), "expected a list of 4 strings"),
    ('{"ctx": "cut off', "line 1 column 17"),  # json's position of the string's end
    ("[1, 2]", "a json list, expected an object"),
], ids=["label-7", "label-negative", "empty-ctx", "3-endings", "ending-not-text", "not-json", "a-list"])
def test_hellaswag_bad_example_refused_in_one_line(tmp_path, line, message):
    """a hellaswag_val.jsonl (already there, so nothing is downloaded) whose second example the trainer's loader
    would refuse, or that is not an example at all: one line names the file, the line and what is wrong, and no
    eval file is written (a label of 7 or an empty context used to be written, and refused only by the trainer)"""
    jsonl = tmp_path / "hellaswag_val.jsonl"
    jsonl.write_text(json.dumps(HELLASWAG_GOOD) + "\n" + line + "\n")
    result = run_script(["dev/data/hellaswag.py", "--out-dir", str(tmp_path)])
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {jsonl} line 2: ") and message in lines[0], result.stderr
    assert not (tmp_path / "hellaswag_val.bin").exists()


def test_hellaswag_from_a_local_jsonl(encoding, tmp_path):
    """the script on a hellaswag_val.jsonl already in --out-dir writes the eval file of its examples (a label given
    as a digit string taken as its number)"""
    examples = [HELLASWAG_GOOD, dict(HELLASWAG_GOOD, ind=2, label="0", ctx="Cooking: boil water")]
    (tmp_path / "hellaswag_val.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    result = run_script(["dev/data/hellaswag.py", "--out-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    header, read_back = read_eval_file(str(tmp_path / "hellaswag_val.bin"))
    assert header[2] == 2 and [(index, label) for index, label, _, _ in read_back] == [(0, 2), (1, 0)]
    assert read_back[1][2] == encoding.encode("Cooking: boil water")


def test_hellaswag_out_dir_help_says_where_the_trainer_looks():
    text = help_text("dev/data/hellaswag.py")
    assert unwrapped(f"(default {hellaswag.DATA_DIR})") in text, text
    assert unwrapped("the trainer's -h 1 reads only dev/data/hellaswag/hellaswag_val.bin") in text, text


# --- tokenize_folder ----------------------------------------------------------------------

def test_tokenize_folder_splits_by_document_and_is_deterministic(encoding, tmp_path):
    texts = make_documents(tmp_path / "in", 60)
    (tmp_path / "in" / "binary.dat").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "in" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    args = ["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--shard-size", "50",
            "--val-fraction", "0.3"]
    first = run_script(args + ["--out-dir", str(tmp_path / "out1"), "--workers", "1"])
    assert first.returncode == 0, first.stderr
    second = run_script(args + ["--out-dir", str(tmp_path / "out2"), "--workers", "3"])
    assert second.returncode == 0, second.stderr
    assert "skipped 2 documents" in first.stdout

    names = sorted(os.listdir(tmp_path / "out1"))
    assert names == sorted(os.listdir(tmp_path / "out2"))
    for name in names:  # two runs (even with different thread counts) write identical bytes
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes(), name

    out = str(tmp_path / "out1")
    val_paths, train_paths = split_shards(out, "t", "val"), split_shards(out, "t", "train")
    assert os.path.basename(val_paths[0]) == "t_val_000000.bin"
    assert os.path.basename(train_paths[0]) == "t_train_000001.bin"
    assert [os.path.basename(p) for p in train_paths] == [f"t_train_{i:06d}.bin" for i in range(1, len(train_paths) + 1)]
    for paths in (val_paths, train_paths):  # every shard but the last is exactly --shard-size tokens
        sizes = [len(tokenize_folder.read_shard(p)) for p in paths]
        assert all(size == 50 for size in sizes[:-1]) and 0 < sizes[-1] <= 50

    val_docs, train_docs = documents_of(encoding, val_paths), documents_of(encoding, train_paths)
    assert val_docs and train_docs
    assert not set(val_docs) & set(train_docs), "a document is in both splits"
    assert sorted(val_docs + train_docs) == sorted(texts.values()), "every text document exactly once"
    assert 0.1 < len(val_docs) / len(texts) < 0.5
    # within a split, documents keep the sorted path order
    order = [texts[relpath] for relpath in sorted(texts)]
    assert train_docs == [text for text in order if text in set(train_docs)]

    # the split depends on relative paths only: the same folder elsewhere splits the same way
    shutil.copytree(tmp_path / "in", tmp_path / "moved" / "deeper")
    moved = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "moved" / "deeper"), "--prefix", "t",
                        "--shard-size", "50", "--val-fraction", "0.3", "--out-dir", str(tmp_path / "out3")])
    assert moved.returncode == 0, moved.stderr
    assert documents_of(encoding, split_shards(str(tmp_path / "out3"), "t", "val")) == val_docs

    assert (tmp_path / "out1" / "gpt2_tokenizer.bin").is_file()


def test_tokenize_folder_stream_split_is_llmc_layout(encoding, tmp_path):
    """--split stream: the first --val-tokens tokens of the stream (the documents in path order, each
    EOT-prefixed) are val and all after them train, the boundary document cut in two, a document longer
    than a shard running over several; --max-train-tokens still caps train"""
    texts = make_documents(tmp_path / "in", 40)
    texts[os.path.join("part2", "zz_long.txt")] = "a long document " * 60
    (tmp_path / "in" / "part2" / "zz_long.txt").write_text(texts[os.path.join("part2", "zz_long.txt")], encoding="utf-8")
    stream = stream_of(encoding, [texts[relpath] for relpath in sorted(texts)])  # the walk's order here
    starts = [i for i, token in enumerate(stream) if token == EOT]
    assert len(stream) - starts[-1] > 2 * 37, "the long document spans more than two shards"
    for val_tokens in (100, starts[7], starts[7] + 1, 37):  # mid-document, on a boundary, one past, under a shard
        out = str(tmp_path / f"out{val_tokens}")
        result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir", out,
                             "--shard-size", "37", "--split", "stream", "--val-tokens", str(val_tokens)])
        assert result.returncode == 0, result.stderr
        assert_stream_split(out, "t", stream, val_tokens, 37)
    # one shard of val (the default --val-tokens), capped train
    out = str(tmp_path / "capped")
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir", out,
                         "--shard-size", "37", "--split", "stream", "--max-train-tokens", "80"])
    assert result.returncode == 0, result.stderr
    assert_stream_split(out, "t", stream[:37 + 80], 37, 37)
    # a stream shorter than its val part (the default, one shard of 100M tokens): no train split, one clear line
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir",
                         str(tmp_path / "short"), "--split", "stream"])
    assert result.returncode == 1
    assert error_lines(result) == ["error: the stream ended within its first 100,000,000 tokens (--val-tokens), "
                                   "which are all val: the train split is empty; lower --val-tokens or add documents"]
    # ... and where a dataset was already, it stays as it was: the new shards are staged until they pass
    before = {name: (tmp_path / "capped" / name).read_bytes() for name in os.listdir(tmp_path / "capped")}
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir",
                         str(tmp_path / "capped"), "--split", "stream"])
    assert result.returncode == 1
    assert error_lines(result)[0].endswith(f"(the shards in {tmp_path / 'capped'} are as they were)"), result.stderr
    assert {name: (tmp_path / "capped" / name).read_bytes() for name in os.listdir(tmp_path / "capped")} == before


def test_rerun_replaces_only_its_own_shards(encoding, tmp_path):
    """a rerun clears a staging folder an interrupted run left, and removes only its prefix's shards (six-digit
    numbers or the one-file name), not those of another prefix that starts with it"""
    make_documents(tmp_path / "in", 30)
    out = tmp_path / "out"
    (out / ".t.partial").mkdir(parents=True)
    (out / ".t.partial" / "t_train_000009.bin").write_bytes(b"left by an interrupted run")
    others = ["t_train_val_000000.bin", "t_val_extra_000001.bin", "t_train_x.bin"]
    for name in others:
        (out / name).write_bytes(b"another prefix's shard")
    (out / "t_train.bin").write_bytes(b"this prefix's one-file shard")
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir", str(out)])
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == sorted(others + ["gpt2_tokenizer.bin", "t_train_000001.bin", "t_val_000000.bin"])


def test_stream_of_empty_documents_is_no_text(tmp_path):
    """the stream split keeps an empty document as a lone EOT, but input with no text at all is still refused"""
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"empty{i}.txt").write_text("")
    for flags in ([], ["--val-tokens", "1"]):
        result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--out-dir", str(tmp_path / "out"),
                             "--split", "stream", *flags])
        assert result.returncode == 1, flags
        assert error_lines(result) == [f"error: no text found in {tmp_path / 'in'} (every file was binary, not UTF-8, "
                                       "or empty)"], flags


def test_rerun_removes_stale_shards(encoding, tmp_path):
    make_documents(tmp_path / "in", 30)
    out = str(tmp_path / "out")
    base = ["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--prefix", "t", "--out-dir", out]
    assert run_script(base + ["--shard-size", "20"]).returncode == 0
    many = len(split_shards(out, "t", "train"))
    assert run_script(base + ["--shard-size", "100000"]).returncode == 0
    assert many > 1 and [os.path.basename(p) for p in split_shards(out, "t", "train")] == ["t_train_000001.bin"]


def test_tokenize_folder_bad_inputs(tmp_path):
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "no_such_folder"), "--out-dir", str(tmp_path)])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: input {tmp_path / 'no_such_folder'} does not exist "
                                   "(expected a folder or a file of text)"]
    (tmp_path / "in").mkdir()
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--val-fraction", "1.5"])
    assert result.returncode == 1
    assert error_lines(result) == ["error: --val-fraction 1.5: expected a fraction in [0, 1)"]
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--shard-size", str(2**31)])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: --shard-size {2**31}: expected a positive number of tokens, at most 2^31 - 1 "
                                   "(the header's int32)"]
    # a flag of the other split is refused, not ignored
    for flags, message in (
            (["--split", "stream", "--val-fraction", "0.3"],
             "error: --val-fraction 0.3: only with --split document (--split stream takes the first --val-tokens "
             "tokens of the stream as val)"),
            (["--split", "stream", "--max-val-tokens", "10"],
             "error: --max-val-tokens 10: only with --split document (--split stream takes the first --val-tokens "
             "tokens of the stream as val)"),
            (["--val-tokens", "100"],
             "error: --val-tokens 100: only with --split stream (--split document holds out --val-fraction of the "
             "documents)"),
            (["--split", "stream", "--val-tokens", "0"], "error: --val-tokens 0: expected a positive number of tokens")):
        result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), *flags])
        assert result.returncode == 1, flags
        assert error_lines(result) == [message], flags
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--split", "halves"])
    assert result.returncode == 2 and "invalid choice: 'halves'" in result.stderr


def test_tokenize_folder_out_dir_that_cannot_be_created(encoding, tmp_path):
    """an --out-dir through a file, or where no folder can be made, is one error line naming --out-dir"""
    make_documents(tmp_path / "in", 3)
    (tmp_path / "afile").write_text("a file, not a folder")
    for out_dir in [str(tmp_path / "afile"), str(tmp_path / "afile" / "below")] + (
            ["/proc/nope"] if os.path.isdir("/proc/self") else []):
        result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--out-dir", out_dir])
        assert result.returncode == 1, (out_dir, result.stderr)
        lines = error_lines(result)
        assert len(lines) == 1 and lines[0].startswith(f"error: --out-dir {out_dir}: cannot create the folder ("), lines
        assert lines[0].endswith("expected a folder that exists or can be created"), lines
    assert (tmp_path / "afile").read_text() == "a file, not a folder"


def names_by_hash(count, keep):
    """count file names doc_NNN.txt that pass keep(name), sorted by the hash that splits by document (the first 8
    bytes of the sha256 of the document id, here the name)"""
    names = (f"doc_{i:03d}.txt" for i in range(10_000))
    chosen = [name for name in names if keep(name)][:count]
    assert len(chosen) == count
    return sorted(chosen, key=lambda name: hashlib.sha256(name.encode()).digest()[:8])


def test_tokenize_folder_few_documents_still_get_a_val_split(encoding, tmp_path):
    """the hash alone often puts none of a few documents into val (and the trainer's -j would match nothing): the
    document with text whose hash is lowest is then val, the others keep the hash's split; a lone document is train,
    with a warning saying how to train without val"""
    def run(folder, *flags):
        result = run_script(["dev/data/tokenize_folder.py", str(folder), "--prefix", "t", "--out-dir",
                             str(tmp_path / "out" / folder.name), *flags])
        assert result.returncode == 0, result.stderr
        out = str(tmp_path / "out" / folder.name)
        return (result, documents_of(encoding, split_shards(out, "t", "val")) if split_shards(out, "t", "val") else [],
                documents_of(encoding, split_shards(out, "t", "train")))

    # two documents, neither val by its hash at the default fraction: the lower hash is val
    two = tmp_path / "two"
    two.mkdir()
    lower, higher = names_by_hash(2, lambda name: not tokenize_folder.is_val_document(name, 0.05))
    for name in (lower, higher):
        (two / name).write_text(f"the text of {name}\n")
    result, val, train = run(two)
    assert (val, train) == ([f"the text of {lower}\n"], [f"the text of {higher}\n"])
    assert error_lines(result) == [], result.stderr

    # the lowest hash is a binary file: the lowest with text is val, the other two stay train
    four = tmp_path / "four"
    four.mkdir()
    binary, *texts = names_by_hash(4, lambda name: not tokenize_folder.is_val_document(name, 0.05))
    (four / binary).write_bytes(b"\x00binary")
    for name in texts:
        (four / name).write_text(f"the text of {name}\n")
    result, val, train = run(four)
    assert val == [f"the text of {texts[0]}\n"]
    assert train == [f"the text of {name}\n" for name in sorted(texts[1:])]

    # two documents both val by their hash: the higher hash is train
    both = tmp_path / "both"
    both.mkdir()
    lower, higher = names_by_hash(2, lambda name: tokenize_folder.is_val_document(name, 0.5))
    for name in (lower, higher):
        (both / name).write_text(f"the text of {name}\n")
    result, val, train = run(both, "--val-fraction", "0.5")
    assert (val, train) == ([f"the text of {lower}\n"], [f"the text of {higher}\n"])

    # one document (here one that its hash would put in val) is train; the warning says how to train without val
    one = tmp_path / "one"
    one.mkdir()
    (name,) = names_by_hash(1, lambda name: tokenize_folder.is_val_document(name, 0.5))
    (one / name).write_text("the only text\n")
    (one / "image.bin").write_bytes(b"\x00binary")
    result, val, train = run(one, "--val-fraction", "0.5")
    assert (val, train) == ([], ["the only text\n"])
    assert error_lines(result) == ['warning: only one document has text: it went to train and no val shard was '
                                   'written; add documents for a val split, or train without val: pass -j "" to the '
                                   'trainer'], result.stderr


def test_tokenize_folder_default_out_dir_is_in_the_checkout(tmp_path):
    """as offline_corpus.py's and tinyshakespeare.py's: dev/data/tokenized of the checkout, wherever it is run from"""
    assert unwrapped(f"(default {os.path.join(DATA_DIR, 'tokenized')})") in help_text(
        os.path.join(DATA_DIR, "tokenize_folder.py"), cwd=tmp_path)


def test_tokenize_folder_no_text_and_skipped_names(encoding, tmp_path):
    """a folder of binaries is the no-text error alone (no val-split warning before it); the summary names the first
    five skipped documents"""
    (tmp_path / "in").mkdir()
    for i in range(7):
        (tmp_path / "in" / f"blob{i}.bin").write_bytes(b"\x00\x01binary")
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--out-dir", str(tmp_path / "out")])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: no text found in {tmp_path / 'in'} (every file was binary, not UTF-8, "
                                   "or empty)"]
    make_documents(tmp_path / "in", 20)
    result = run_script(["dev/data/tokenize_folder.py", str(tmp_path / "in"), "--out-dir", str(tmp_path / "out")])
    assert result.returncode == 0, result.stderr
    assert ("skipped 7 documents (binary, not UTF-8, empty or duplicate): blob0.bin, blob1.bin, blob2.bin, "
            "blob3.bin, blob4.bin and 2 more") in result.stdout.splitlines()


def test_offline_corpus_on_a_small_folder(encoding, tmp_path):
    source = tmp_path / "docs"
    texts = make_documents(source, 40)
    (source / "pkg").mkdir()
    gz_text = "A changelog that was gzipped.\n * fixed things\n"
    (source / "pkg" / "changelog.gz").write_bytes(gzip.compress(gz_text.encode()))
    (source / "pkg" / "copy_of_doc_000.txt").write_text(texts[os.path.join("part0", "doc_000.txt")], encoding="utf-8")
    (source / "pkg" / "page.html").write_text("<html>markup is left out</html>")
    (source / "pkg" / "manual.ps.gz").write_bytes(gzip.compress(b"%!PS-Adobe postscript is left out"))
    (source / "pkg" / "image.bin").write_bytes(bytes(range(256)))
    (source / "pkg" / "latin1").write_bytes("na\xefve".encode("latin-1"))
    out = str(tmp_path / "out")
    result = run_script(["dev/data/offline_corpus.py", "--source", str(source), "--out-dir", out,
                         "--val-fraction", "0.25", "--max-train-tokens", "0", "--max-val-tokens", "0"])
    assert result.returncode == 0, result.stderr
    assert "source0" in result.stdout and "epochs" in result.stdout
    val_docs = documents_of(encoding, split_shards(out, "offline", "val"))
    train_docs = documents_of(encoding, split_shards(out, "offline", "train"))
    everything = val_docs + train_docs
    assert sorted(everything) == sorted(list(texts.values()) + [gz_text]), "text files once each, .gz decompressed"
    assert not set(val_docs) & set(train_docs)
    assert os.path.isfile(os.path.join(out, "gpt2_tokenizer.bin"))

    # a run whose val split comes out empty stops, and the corpus stays as it was
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    empty_val = run_script(["dev/data/offline_corpus.py", "--source", str(source), "--out-dir", out,
                            "--val-fraction", "0", "--max-train-tokens", "0", "--max-val-tokens", "0"])
    assert empty_val.returncode == 1
    assert error_lines(empty_val)[-1] == ("error: the offline corpus came out empty in train or val; pass --source DIR "
                                          f"with text files (the shards in {out} are as they were)"), empty_val.stderr
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before

    # the cap cuts the train split at exactly that many tokens; a rerun gives the same bytes
    capped = run_script(["dev/data/offline_corpus.py", "--source", str(source), "--out-dir", out,
                         "--val-fraction", "0.25", "--max-train-tokens", "300", "--max-val-tokens", "0"])
    assert capped.returncode == 0, capped.stderr
    (train_path,) = split_shards(out, "offline", "train")
    assert len(tokenize_folder.read_shard(train_path)) == 300
    first_bytes = open(train_path, "rb").read()
    again = run_script(["dev/data/offline_corpus.py", "--source", str(source), "--out-dir", out,
                        "--val-fraction", "0.25", "--max-train-tokens", "300", "--max-val-tokens", "0"])
    assert again.returncode == 0 and open(train_path, "rb").read() == first_bytes


def test_offline_corpus_missing_source(tmp_path):
    result = run_script(["dev/data/offline_corpus.py", "--source", str(tmp_path / "nothing"), "--out-dir", str(tmp_path)])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: --source {tmp_path / 'nothing'}: no such folder"]


def test_tinyshakespeare_from_a_local_url(encoding, tmp_path):
    """llm.c's tokens: each speech (text up to and with its blank line) one EOT-prefixed document, the first
    32,768 tokens val and the rest train; --split document holds out whole speeches instead"""
    # the text ends in a blank line, so its last speech is empty: llm.c writes it as a lone EOT, and so does the
    # stream split (the by-document split skips empty documents)
    speeches = [f"SPEAKER{i}:\nLine {i} of the play, spoken aloud.\n\n" for i in range(3000)] + ["THE END.\n\n", ""]
    (tmp_path / "input.txt").write_text("".join(speeches), encoding="utf-8")
    url = (tmp_path / "input.txt").as_uri()
    out = str(tmp_path / "ts")
    result = run_script(["dev/data/tinyshakespeare.py", "--url", url, "--out-dir", out])
    assert result.returncode == 0, result.stderr
    stream = stream_of(encoding, speeches)
    assert len(stream) > 32768 + 1000
    assert_stream_split(out, "tiny_shakespeare", stream, 32768, 100_000_000, one_file_names=True)  # llm.c's files
    # a small --shard-size: numbered shards, and a rerun replaces llm.c's one-file names
    result = run_script(["dev/data/tinyshakespeare.py", "--url", url, "--out-dir", out, "-s", "20000"])
    assert result.returncode == 0, result.stderr
    assert_stream_split(out, "tiny_shakespeare", stream, 32768, 20000, one_file_names=True)
    assert not os.path.exists(os.path.join(out, "tiny_shakespeare_train.bin"))

    out = str(tmp_path / "ts_by_speech")
    result = run_script(["dev/data/tinyshakespeare.py", "--url", url, "--out-dir", out, "--split", "document"])
    assert result.returncode == 0, result.stderr
    val_docs = documents_of(encoding, split_shards(out, "tiny_shakespeare", "val"))
    train_docs = documents_of(encoding, split_shards(out, "tiny_shakespeare", "train"))
    assert val_docs and train_docs and not set(val_docs) & set(train_docs)
    assert sorted(val_docs + train_docs) == sorted(speeches[:-1]), "each speech is one document, the empty one none"
    assert 0.05 < len(val_docs) / len(speeches) < 0.15, "about 10% of the speeches"


def test_unreachable_network_is_one_clear_line(encoding, tmp_path):
    closed = "http://127.0.0.1:9"  # nothing listens on the discard port
    fake = tmp_path / "fake_packages"  # fineweb.py checks for the `datasets` package before the network
    fake.mkdir()
    (fake / "datasets.py").write_text("")
    checks = [
        (["dev/data/hellaswag.py", "--url", closed + "/hellaswag_val.jsonl", "--out-dir", str(tmp_path / "hs")], {}),
        (["dev/data/tinyshakespeare.py", "--url", closed + "/input.txt", "--out-dir", str(tmp_path / "ts")], {}),
        (["dev/data/fineweb.py", "--out-dir", str(tmp_path / "fw")], {"HF_ENDPOINT": closed, "PYTHONPATH": str(fake)}),
    ]
    for args, env in checks:
        result = run_script(args, env=env)
        assert result.returncode == 1, (args, result.stderr)
        lines = error_lines(result)
        assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach {closed}"), (args, result.stderr)
        # what to do instead: HellaSwag has no offline stand-in, the training corpora have the offline one
        assert ("-h 0" in lines[0]) if "hellaswag" in args[0] else ("offline_corpus.py" in lines[0]), lines[0]
    # nothing left behind: no part file, and no output folder the script made for it
    assert not (tmp_path / "hs").exists() and not (tmp_path / "ts").exists() and not (tmp_path / "fw").exists()
    kept = tmp_path / "kept"  # a folder that was there before stays
    kept.mkdir()
    result = run_script(["dev/data/tinyshakespeare.py", "--url", closed + "/input.txt", "--out-dir", str(kept / "a" / "b")])
    assert result.returncode == 1 and os.listdir(kept) == [], (result.stderr, os.listdir(kept))
    assert kept.is_dir()


def test_fineweb_help_and_missing_datasets_package(tmp_path):
    """--help shows the defaults of -t and -v; without the `datasets` package (here one that fails to import) and
    without the network, the missing package is the one line, as it is the first thing to fix"""
    text = help_text("dev/data/fineweb.py")
    assert "FineWeb-Edu(defaultclassic)" in text and "sizeintokens(default10B)" in text, text
    fake = tmp_path / "fake_packages"
    fake.mkdir()
    (fake / "datasets.py").write_text("raise ImportError('datasets is not installed')\n")
    result = run_script(["dev/data/fineweb.py", "--out-dir", str(tmp_path / "fw")],
                        env={"HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(fake)})
    assert result.returncode == 1
    assert error_lines(result) == ["error: fineweb.py needs the `datasets` package: pip install datasets"]


def test_fineweb_streams_documents_into_shards(encoding, tmp_path):
    """fineweb.py without the internet: a local HTTP server stands in for the hub (its reachability check) and a
    `datasets` module of our own for the package, whose streamed rows (id, text) must come out as llm.c's shards
    under the FineWeb names: the stream of EOT-prefixed documents in order, its first shard val and the rest train
    (llm.c's layout); with --split document, each document once, whole, val held out by document"""
    import http.server
    import threading
    docs = {f"<urn:uuid:{i:04d}>": f"Document {i}: " + "fine web text " * (i % 7 + 1) for i in range(300)}
    docs["<urn:uuid:0150>"] = ""  # an empty row: in llm.c's layout one EOT, as llm.c's fineweb.py writes it
    fake = tmp_path / "fake_packages"
    fake.mkdir()
    (fake / "datasets.py").write_text(
        "import json, os\n"
        "def load_dataset(repo, name, split, streaming):\n"
        "    assert (repo, name, split, streaming) == ('HuggingFaceFW/fineweb', 'sample-10BT', 'train', True)\n"
        "    with open(os.environ['FAKE_FINEWEB_ROWS']) as f:\n"
        "        yield from (json.loads(line) for line in f)\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in docs.items()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "PYTHONPATH": str(fake),
           "FAKE_FINEWEB_ROWS": str(rows)}
    try:
        llmc_layout = tmp_path / "fw_stream"
        result = run_script(["dev/data/fineweb.py", "-v", "10B", "--out-dir", str(llmc_layout), "-s", "2000"],
                            env=env)  # llm.c's spellings of --version and --shard-size
        assert result.returncode == 0, result.stderr
        out = tmp_path / "fw"
        result = run_script(["dev/data/fineweb.py", "--version", "10B", "--out-dir", str(out), "--shard-size", "2000",
                             "--split", "document"], env=env)
    finally:
        server.shutdown()
    stream = stream_of(encoding, list(docs.values()))
    assert len(stream) > 2 * 2000, "val and at least two train shards"
    assert_stream_split(str(llmc_layout), "fineweb", stream, 2000, 2000)

    assert result.returncode == 0, result.stderr
    train = documents_of(encoding, split_shards(out, "fineweb", "train"))
    val = documents_of(encoding, split_shards(out, "fineweb", "val"))
    assert os.path.basename(split_shards(out, "fineweb", "val")[0]) == "fineweb_val_000000.bin"
    assert len(split_shards(out, "fineweb", "train")) > 1, "several train shards of 2000 tokens"
    assert val and not set(val) & set(train)
    assert sorted(train + val) == sorted(text for text in docs.values() if text), "the empty row is skipped"
    order = list(docs.values())
    assert train == sorted(train, key=order.index), "train documents in the stream's order"


# --- dev/data/starter_pack.py -----------------------------------------------------------------

STARTER_PACK = {  # name: (where llm.c's download_starter_pack.sh puts it, magic, version)
    "gpt2_124M.bin": ("", 20240326, 3), "gpt2_124M_bf16.bin": ("", 20240326, 5),
    "gpt2_124M_debug_state.bin": ("", 20240327, 2), "gpt2_tokenizer.bin": ("", 20240328, 2),
    "tiny_shakespeare_train.bin": ("dev/data/tinyshakespeare", 20240520, 1),
    "tiny_shakespeare_val.bin": ("dev/data/tinyshakespeare", 20240520, 1),
    "hellaswag_val.bin": ("dev/data/hellaswag", 20240522, 1),
}


def fake_starter_pack(folder):
    """a mirror of the pack: each file with its llm.c header (a shard's length as its token count says)"""
    folder.mkdir()
    for i, (name, (_, magic, version)) in enumerate(STARTER_PACK.items()):
        tokens = 100 + i
        header = struct.pack("<256i", magic, version, tokens, *([0] * 253))
        (folder / name).write_bytes(header + bytes(range(256)) * (2 * tokens // 256) + bytes(2 * tokens % 256))
    return f"file://{folder}/"


def test_starter_pack_lands_where_llmc_puts_it(tmp_path):
    """every file at llm.c's place, byte for byte, nothing staged left; a rerun checks them and downloads nothing"""
    base_url, root = fake_starter_pack(tmp_path / "pack"), tmp_path / "checkout"
    result = run_script(["dev/data/starter_pack.py", "--base-url", base_url, "--root", str(root)])
    assert result.returncode == 0, result.stderr
    for name, (folder, _, _) in STARTER_PACK.items():
        assert (root / folder / name).read_bytes() == (tmp_path / "pack" / name).read_bytes(), name
    assert not [p for p in root.rglob("*") if p.is_file() and p.name not in STARTER_PACK]
    assert "./train_gpt2_fp8 -e gpt2_124M_bf16.bin -i dev/data/tinyshakespeare/tiny_shakespeare_train.bin" in result.stdout
    result = run_script(["dev/data/starter_pack.py", "--base-url", "file:///nowhere/", "--root", str(root)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("already there, checked") == len(STARTER_PACK)


def test_starter_pack_refuses_what_is_not_llmc_format(tmp_path):
    """an error page served under a file's name, a truncated shard already in place, an unreachable file and an unknown
    name: each one line naming the file, exit 1, and no refused or partial file left under the file's name"""
    base_url, root = fake_starter_pack(tmp_path / "pack"), tmp_path / "checkout"
    (tmp_path / "pack" / "hellaswag_val.bin").write_text("<!DOCTYPE html><html>Not Found</html>" * 40)
    result = run_script(["dev/data/starter_pack.py", "--base-url", base_url, "--root", str(root), "gpt2_tokenizer.bin",
                         "hellaswag_val.bin"])
    assert result.returncode == 1
    assert len(error_lines(result)) == 1 and "hellaswag_val.bin" in error_lines(result)[0], result.stderr
    assert "magic" in error_lines(result)[0] and "expected 20240522" in error_lines(result)[0]
    assert (root / "gpt2_tokenizer.bin").exists(), "the files before the refused one are kept"
    assert not list((root / "dev" / "data" / "hellaswag").iterdir())

    shard = root / "dev" / "data" / "tinyshakespeare" / "tiny_shakespeare_val.bin"
    shard.parent.mkdir(parents=True)
    shard.write_bytes((tmp_path / "pack" / "tiny_shakespeare_val.bin").read_bytes()[:-2])  # cut off by a kill
    result = run_script(["dev/data/starter_pack.py", "--base-url", base_url, "--root", str(root),
                         "tiny_shakespeare_val.bin"])
    assert result.returncode == 1
    assert len(error_lines(result)) == 1 and str(shard) in error_lines(result)[0] and "truncated" in result.stderr

    result = run_script(["dev/data/starter_pack.py", "--base-url", f"file://{tmp_path}/empty/", "--root", str(root),
                         "gpt2_124M.bin"])
    assert result.returncode == 1
    assert len(error_lines(result)) == 1 and "gpt2_124M.bin" in error_lines(result)[0], result.stderr
    assert not [p for p in root.iterdir() if p.name.startswith("gpt2_124M.bin")]

    result = run_script(["dev/data/starter_pack.py", "--root", str(root), "gpt2_350M.bin"])
    assert result.returncode == 1 and error_lines(result) == [
        "error: 'gpt2_350M.bin' is not a starter-pack file (expected some of: " + ", ".join(STARTER_PACK) + ")"]


# --- scripts/plot.py ----------------------------------------------------------------------

def test_plot_writes_png_and_gap_table(tmp_path):
    for name, offset in (("bf16", 0.0), ("fp8", 0.05)):
        run = tmp_path / name
        run.mkdir()
        lines = []
        for step in range(0, 101):
            lines.append(f"s:{step} trl:{5.0 - step / 100 + offset:.4f} lr:0.000600 norm:1.0000")
            if step % 20 == 0:
                lines.append(f"s:{step} tel:{5.5 - step / 100 + offset:.4f}")
        if name == "fp8":  # a resumed run repeats steps; the later line wins
            lines.append(f"s:100 tel:{4.5 + 0.045:.4f}")
        (run / "main.log").write_text("\n".join(lines) + "\n")
    png = tmp_path / "loss.png"
    result = run_script(["scripts/plot.py", str(tmp_path / "bf16"), str(tmp_path / "fp8"),
                         "--labels", "base", "eight", "--ema", "0.9", "--out", str(png)])
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "| base | 100 | 4.5000 | +0.00% |" in result.stdout
    assert "| eight | 100 | 4.5450 | +1.00% |" in result.stdout

    result = run_script(["scripts/plot.py", str(tmp_path / "no_run")])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: {tmp_path / 'no_run'}: no such run directory or log file"]
    result = run_script(["scripts/plot.py", str(tmp_path / "bf16"), "--out", str(tmp_path / "no_dir" / "x.png")])
    assert result.returncode == 1
    assert error_lines(result) == [f"error: --out {tmp_path / 'no_dir' / 'x.png'}: no directory {tmp_path / 'no_dir'} to "
                                   "write it into"]

    # runs of other lengths and val intervals share only the untrained step 0: each is compared at its own last step
    short = tmp_path / "short"
    short.mkdir()
    (short / "main.log").write_text("".join(f"s:{s} trl:5.0 lr:0.0006 norm:1.0\n" for s in range(30)) +
                                    "s:0 tel:5.5000\ns:10 tel:5.2000\ns:30 tel:5.0000\n")
    result = run_script(["scripts/plot.py", str(tmp_path / "bf16"), str(short), "--out", str(tmp_path / "two.png")])
    assert result.returncode == 0, result.stderr
    assert "val loss at each run's last evaluated step (the runs share no val step after step 0)" in result.stdout
    assert "| bf16 | 100 | 4.5000 | +0.00% |" in result.stdout and "| short | 30 | 5.0000 | +11.11% |" in result.stdout


def test_plot_without_matplotlib_is_one_error_line(tmp_path):
    """a Python without matplotlib (an `import matplotlib` that fails, first on PYTHONPATH): one error line naming how
    to install it, not a traceback (scripts/compare_bf16_fp8.sh shows that line as its warning)"""
    run = tmp_path / "run"
    run.mkdir()
    (run / "main.log").write_text("s:0 trl:5.0000 lr:0.0006 norm:1.00\ns:0 tel:5.1000\n")
    (tmp_path / "no_matplotlib").mkdir()
    (tmp_path / "no_matplotlib" / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    result = run_script(["scripts/plot.py", str(run), "--out", str(tmp_path / "loss.png")],
                        env={"PYTHONPATH": str(tmp_path / "no_matplotlib")})
    assert result.returncode == 1 and not (tmp_path / "loss.png").exists()
    assert error_lines(result) == [f"error: scripts/plot.py needs matplotlib, which {sys.executable} cannot import: "
                                   "bash scripts/setup_python.sh (or pip install matplotlib)"]


def test_plot_hellaswag_references(tmp_path):
    """--reference 124M: the HellaSwag panel gets OpenAI's GPT-2 124M checkpoint and GPT-3 125M accuracies (llm.c's
    vislog values), printed beside each run's last accuracy; an unknown size is refused"""
    run = tmp_path / "run"
    run.mkdir()
    (run / "main.log").write_text("s:0 trl:5.0000 lr:0.0006 norm:1.00\ns:0 tel:5.1000\ns:10 trl:4.0000 lr:0.0006 "
                                  "norm:1.00\ns:10 tel:4.1000\ns:10 eval:0.2712\n")
    result = run_script(["scripts/plot.py", str(run), "--reference", "124M", "--out", str(tmp_path / "ref.png")])
    assert result.returncode == 0, result.stderr
    assert "HellaSwag: OpenAI GPT-2 124M checkpoint 0.2945, GPT-3 (paper) 0.337; last of each run: run 0.2712" in result.stdout
    plain = run_script(["scripts/plot.py", str(run), "--out", str(tmp_path / "plain.png")])
    assert plain.returncode == 0 and "HellaSwag:" not in plain.stdout
    assert (tmp_path / "ref.png").read_bytes() != (tmp_path / "plain.png").read_bytes(), "the reference lines are drawn"
    result = run_script(["scripts/plot.py", str(run), "--reference", "125M"])
    assert result.returncode == 2 and "invalid choice: '125M'" in result.stderr


def test_plot_reads_main_jsonl(tmp_path):
    run = tmp_path / "jsonl_run"
    run.mkdir()
    # the records exactly as llmc/logger.h writes them
    records = [{"step": step, "type": "train", "loss": 6.0 - step / 10, "lr": 1e-3, "norm": 1.0, "ms": 5.0,
                "tok_per_s": 1.0e5, "mfu": 0.3, "skipped": 0} for step in range(10)]
    records += [{"step": 0, "type": "val", "loss": 6.5}, {"step": 9, "type": "val", "loss": 5.25},
                {"step": 9, "type": "eval", "hellaswag_acc": 0.25}]
    (run / "main.jsonl").write_text("\n".join(json.dumps(record) for record in records) + "\nnot json\n")
    result = run_script(["scripts/plot.py", str(run), "--out", str(tmp_path / "one.png")])
    assert result.returncode == 0, result.stderr
    assert "| jsonl_run | 9 | 5.2500 | +0.00% |" in result.stdout
    assert (tmp_path / "one.png").stat().st_size > 10_000


def test_plot_drops_a_skipped_steps_nonfinite_loss(tmp_path):
    """a skipped step logs trl:nan (main.log) or a NaN loss: the point is dropped, so the smoothed curve after it stays
    finite (it fed the moving average, and every later smoothed point was NaN)"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("plot", os.path.join(REPO, "scripts", "plot.py"))
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    log = tmp_path / "main.log"
    log.write_text("".join(f"s:{s} trl:{'nan' if s == 5 else 6.0 - s / 10} lr:0.001 norm:1.0\n" for s in range(10)))
    train = plot.parse_main_log(str(log))["train"]
    assert sorted(train) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert all(math.isfinite(v) for v in plot.ema([train[s] for s in sorted(train)], 0.9))
    jsonl = tmp_path / "main.jsonl"
    jsonl.write_text("".join(json.dumps({"step": s, "type": "train", "loss": float("inf") if s == 5 else 6.0 - s / 10})
                             + "\n" for s in range(10)))
    assert sorted(plot.parse_main_jsonl(str(jsonl))["train"]) == [0, 1, 2, 3, 4, 6, 7, 8, 9]


@pytest.mark.parametrize("log", ["main.log", "main.jsonl"])
def test_plot_a_diverged_run_is_nan_and_an_error(tmp_path, log):
    """run b's val loss is nan from step 200 (main.log's tel:nan, main.jsonl's null): the table compares at step 300
    and says nan for b, and after the PNG and the table one error line names b, exit 1 (the nan lines were dropped
    before, and step 100 showed +0.00%)"""
    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        losses = {s: 3.9 - s / 1000 for s in range(0, 301, 100)}
        if name == "b":
            losses.update({200: math.nan, 300: math.nan})
        if log == "main.log":
            text = "".join(f"s:{s} trl:4.0 lr:0.0006 norm:1.0\ns:{s} tel:{v:.4f}\n" for s, v in losses.items())
        else:
            text = "".join(json.dumps({"step": s, "type": "train", "loss": 4.0}) + "\n" +
                           json.dumps({"step": s, "type": "val", "loss": None if math.isnan(v) else v}) + "\n"
                           for s, v in losses.items())
        (run / log).write_text(text)
    png = tmp_path / "loss.png"
    result = run_script(["scripts/plot.py", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(png)])
    assert result.returncode == 1 and png.exists(), result.stderr
    assert "val loss at step 300 (the last step every run evaluated)" in result.stdout, result.stdout
    assert "| a | 300 | 3.6000 | +0.00% |" in result.stdout and "| b | 300 | nan | - |" in result.stdout, result.stdout
    assert error_lines(result) == ["error: the val loss of b is not finite at the compared step: diverged"]


def test_setup_python_refuses_a_system_python_that_refuses_pip(tmp_path):
    """scripts/setup_python.sh with a Python whose check says 'externally managed' (PEP 668, a stand-in that answers
    the check and fails anything else, so no pip runs): one line saying to make a venv; this machine's own Python is
    not such a one (the check itself exits 1 here)"""
    stand_in = tmp_path / "python_externally_managed"
    stand_in.write_text('#!/usr/bin/env bash\n[[ "$1" == -c && "$2" == *EXTERNALLY-MANAGED* ]] && exit 0\n'
                        'echo "unexpected call: $*" >&2\nexit 3\n')
    stand_in.chmod(0o755)
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup_python.sh")], env=dict(os.environ, PYTHON=str(stand_in)),
                            capture_output=True, text=True, timeout=60)
    lines = error_lines(result)
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "PEP 668" in lines[0] and "python3 -m venv .venv" in lines[0], lines
    script = open(os.path.join(REPO, "scripts", "setup_python.sh")).read()
    check = script.split("-c '", 1)[1].split("'", 1)[0]
    assert subprocess.run([sys.executable, "-c", check]).returncode == 1


def test_prepare_default_help_prints_usage_and_prepares_nothing(tmp_path):
    """--help prints the script's usage and exits 0 before looking at (or making) any data"""
    script = os.path.join(REPO, "dev", "data", "prepare_default.sh")
    env = dict(os.environ, PYTHON=str(tmp_path / "no-python"))  # a data build would fail on it
    for flag in ("--help", "-h"):
        run = subprocess.run(["bash", script, flag], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        assert "bash dev/data/prepare_default.sh --tinyshakespeare" in run.stdout
        assert "train with" not in run.stdout and run.stderr == ""
