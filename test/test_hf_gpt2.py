"""
Tests of dev/eval/export_hf.py and import_hf.py: an llm.c model file as a Hugging Face GPT-2
folder, and back.

The exported weights are checked by running them: a numpy GPT-2 written here, in
transformers' conventions (Conv1D weights [in, out], q k v in c_attn's order, gelu_new, the
lm_head tied to wte), must give the PyTorch fixture's logits (test/fixtures, made by
dev/reference/gpt2_torch.py from llm.c's layout). A wrong transpose, split order, name or
vocabulary cut fails it. The tokenizer files are checked against tiktoken's GPT-2 encoding.
An export imported back is the model file byte for byte; folders laid out as other writers
lay them out (no name prefix, mask buffers, a stored lm_head, F16, shards) import to the same
tensors; each folder that is not llm.c's GPT-2 is refused in one line, and so is each of a
fixed sample of seeded corruptions where it fails. Where transformers and torch are
installed, the last four tests run transformers itself, the last also the CPU trainer on an
import (CI has neither: they skip there).

Run: python -m pytest -q test/test_hf_gpt2.py
"""
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "test"))

import sim_model  # noqa: E402

EXPORTER = os.path.join(REPO, "dev", "eval", "export_hf.py")
IMPORTER = os.path.join(REPO, "dev", "eval", "import_hf.py")
FIXTURE_MODEL = os.path.join(REPO, "test", "fixtures", "gpt2_tiny_model.bin")
FIXTURE_STATE = os.path.join(REPO, "test", "fixtures", "gpt2_tiny_debug_state.bin")
LAYER_TENSORS = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias"]
TOKENIZER_FILES = {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}


def run_export(*args):
    return subprocess.run([sys.executable, EXPORTER, *map(str, args)], capture_output=True, text=True, timeout=300)


def run_import(*args):
    return subprocess.run([sys.executable, IMPORTER, *map(str, args)], capture_output=True, text=True, timeout=300)


def export_ok(*args):
    result = run_export(*args)
    assert result.returncode == 0, result.stderr
    return result


def import_ok(*args):
    result = run_import(*args)
    assert result.returncode == 0, result.stderr
    return result


def one_error_line(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


SAFETENSORS_TYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_safetensors(path, metadata={"format": "pt"}):
    """{name: (dtype, float64 array)}, checking the layout: an 8-byte length, a JSON header
    (padded to 8 bytes where metadata is the exporter's; None: a file with no metadata),
    then the tensors back to back, covering the data exactly"""
    data = open(path, "rb").read()
    header_length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_length])
    assert header.pop("__metadata__", None) == metadata
    if metadata is not None:
        assert header_length % 8 == 0
    body = data[8 + header_length:]
    spans = sorted(entry["data_offsets"] for entry in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(body)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        values = np.frombuffer(body[begin:end], dtype=SAFETENSORS_TYPES[entry["dtype"]])
        if entry["dtype"] == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        assert values.size == math.prod(entry["shape"])
        tensors[name] = (entry["dtype"], values.reshape(entry["shape"]).astype(np.float64))
    return tensors


def layernorm(x, weight, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def hf_gpt2_logits(tensors, config, x):
    """GPT2LMHeadModel's forward as transformers defines it, in float64"""
    w = {name: value for name, (_, value) in tensors.items()}
    B, T = x.shape
    C, NH = config["n_embd"], config["n_head"]
    HS = C // NH
    h = w["transformer.wte.weight"][x] + w["transformer.wpe.weight"][:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for layer in range(config["n_layer"]):
        p = lambda name: w[f"transformer.h.{layer}.{name}"]  # noqa: E731
        a = layernorm(h, p("ln_1.weight"), p("ln_1.bias")) @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (t.reshape(B, T, NH, HS).transpose(0, 2, 1, 3) for t in np.split(a, 3, axis=-1))
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        m = gelu_new(layernorm(h, p("ln_2.weight"), p("ln_2.bias")) @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
        h = h + m @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    h = layernorm(h, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    return h @ w["transformer.wte.weight"].T


@pytest.fixture(scope="module")
def fixture_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "tiny_f32"
    export_ok("-i", FIXTURE_MODEL, "-o", out, "-d", "float32")
    return out


def fixture_inputs_and_logits(V):
    data = open(FIXTURE_STATE, "rb").read()
    header = np.frombuffer(data[:1024], dtype="<i4")
    assert header[0] == 20240327 and header[1] == 3
    B, T = int(header[2]), int(header[3])
    x = np.frombuffer(data, dtype="<i4", count=B * T, offset=1024).reshape(B, T)
    logits = np.frombuffer(data, dtype="<f4", count=B * T * V, offset=1024 + 8 * B * T).reshape(B, T, V)
    return x, logits


def test_exported_weights_give_the_pytorch_fixture_logits(fixture_export):
    config = json.load(open(fixture_export / "config.json"))
    assert (config["vocab_size"], config["n_positions"], config["n_embd"], config["n_layer"], config["n_head"]) == (97, 32, 64, 2, 4)
    assert config["activation_function"] == "gelu_new" and config["layer_norm_epsilon"] == 1e-5
    assert config["tie_word_embeddings"] is True and config["model_type"] == "gpt2"
    assert config["torch_dtype"] == "float32" and "eos_token_id" not in config  # no GPT-2 vocabulary here
    tensors = read_safetensors(fixture_export / "model.safetensors")
    expected_names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    expected_names |= {f"transformer.h.{layer}.{name}" for layer in range(2) for name in LAYER_TENSORS}
    assert set(tensors) == expected_names  # the tied lm_head is not stored
    assert tensors["transformer.wte.weight"][1].shape == (97, 64)  # the first V of Vp = 128 rows
    assert tensors["transformer.h.1.mlp.c_fc.weight"][1].shape == (64, 256)  # Conv1D: [in, out]
    assert set(os.listdir(fixture_export)) == {"config.json", "model.safetensors"}
    x, expected = fixture_inputs_and_logits(97)
    logits = hf_gpt2_logits(tensors, config, x)
    scale = np.abs(expected).max()
    assert np.abs(logits - expected).max() <= 2e-6 * scale, np.abs(logits - expected).max()


def nearest_bf16_property(f32, bf16):
    """bf16 is a bfloat16 value nearest to f32, ties to an even mantissa"""
    f32 = f32.astype(np.float32)
    down = (f32.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)  # truncated toward 0
    up_bits = (f32.view(np.uint32) & 0xFFFF0000) + 0x10000
    up = up_bits.view(np.float32).astype(np.float64)  # the next bfloat16 away from 0
    exact = f32.astype(np.float64)
    d_down, d_up = np.abs(exact - down), np.abs(up - exact)
    expected = np.where(d_down < d_up, down, np.where(d_up < d_down, up,
                        np.where(((f32.view(np.uint32) >> 16) & 1) == 0, down, up)))
    return np.array_equal(bf16, expected)


def test_bfloat16_export_rounds_to_nearest_even(fixture_export, tmp_path):
    out = tmp_path / "tiny_bf16"
    result = export_ok("-i", FIXTURE_MODEL, "-o", out)  # bfloat16 is the default, as llm.c's exporter
    assert "as bfloat16" in result.stdout
    f32 = read_safetensors(fixture_export / "model.safetensors")
    bf16 = read_safetensors(out / "model.safetensors")
    assert json.load(open(out / "config.json"))["torch_dtype"] == "bfloat16"
    assert set(f32) == set(bf16)
    for name in f32:
        assert bf16[name][0] == "BF16"
        assert nearest_bf16_property(f32[name][1].ravel(), bf16[name][1].ravel()), name


def test_a_bfloat16_model_file_is_copied_exactly(tmp_path):
    """llm.c's version-5 file (test/make_llmc_files.py lays it out as llm.c writes it):
    its bfloat16 weights pass through unchanged, and widen exactly under -d float32"""
    subprocess.run([sys.executable, os.path.join(REPO, "test", "make_llmc_files.py"), tmp_path], check=True, capture_output=True)
    expected = np.fromfile(tmp_path / "expected_params_bf16.bin", dtype=np.float32)
    L, C, V, maxT, Vp = 2, 16, 60, 8, 128
    wte = expected[:Vp * C].reshape(Vp, C)
    qkvw = expected[Vp * C + maxT * C + 2 * L * C:][:L * 3 * C * C].reshape(L, 3 * C, C)
    for dtype in ("bfloat16", "float32"):
        out = tmp_path / f"v5_{dtype}"
        export_ok("-i", tmp_path / "model_v5.bin", "-o", out, "-d", dtype)
        tensors = read_safetensors(out / "model.safetensors")
        assert np.array_equal(tensors["transformer.wte.weight"][1], wte[:V])
        assert np.array_equal(tensors["transformer.h.1.attn.c_attn.weight"][1], qkvw[1].T)
        assert tensors["transformer.wpe.weight"][0] == {"bfloat16": "BF16", "float32": "F32"}[dtype]


@pytest.fixture(scope="module")
def gpt2_vocab_export(tmp_path_factory, encoding):
    """a 1-layer model with GPT-2's 50257-token vocabulary, exported with its tokenizer"""
    folder = tmp_path_factory.mktemp("gpt2_vocab")
    model = folder / "model.bin"
    sim_model.write_model(model, layers=1, heads=2, channels=16, vocab=50257, max_t=64)
    result = export_ok("-i", model, "-o", folder / "hf")
    assert "wrote the GPT-2 tokenizer" in result.stdout
    return folder / "hf"


def bpe_with_merges(piece, vocab, merge_rank):
    """transformers' GPT-2 BPE of one pre-token: the lowest-ranked adjacent pair merges first"""
    parts = list(piece)
    while len(parts) > 1:
        pairs = [(merge_rank.get((a, b)), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        pairs = [(rank, i) for rank, i in pairs if rank is not None]
        if not pairs:
            break
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [vocab[part] for part in parts]


def test_tokenizer_files_encode_as_tiktoken(gpt2_vocab_export, encoding):
    folder = gpt2_vocab_export
    assert TOKENIZER_FILES <= set(os.listdir(folder))
    config = json.load(open(folder / "config.json"))
    assert config["vocab_size"] == 50257 and config["bos_token_id"] == config["eos_token_id"] == 50256
    vocab = json.load(open(folder / "vocab.json", encoding="utf-8"))
    assert len(vocab) == 50257 and sorted(vocab.values()) == list(range(50257))
    assert vocab["<|endoftext|>"] == 50256
    lines = open(folder / "merges.txt", encoding="utf-8").read().splitlines()
    assert lines[0] == "#version: 0.2" and len(lines) == 1 + 50000
    merges = [tuple(line.split(" ")) for line in lines[1:]]
    assert all(len(m) == 2 and vocab[m[0] + m[1]] == 256 + k for k, m in enumerate(merges))
    # the byte alphabet: each single byte's symbol decodes, through tiktoken, to that byte
    id_to_text = {i: t for t, i in vocab.items()}
    single = {encoding.decode_single_token_bytes(i): id_to_text[i] for i in range(50256) if len(encoding.decode_single_token_bytes(i)) == 1}
    assert len(single) == 256 and len(set(single.values())) == 256
    byte_symbol = {b[0]: s for b, s in single.items()}
    merge_rank = {m: k for k, m in enumerate(merges)}
    pieces = ["Hello", " world", " tokenization", " antidisestablishmentarianism", "1234567", " \u00e9t\u00e9",
              " \u4f60\u597d\u4e16\u754c", "!!!???", "\n\n", " \U0001F600", " llm8's", " FP8-E4M3"]
    for piece in pieces:
        symbols = "".join(byte_symbol[b] for b in piece.encode("utf-8"))
        assert bpe_with_merges(symbols, vocab, merge_rank) == encoding.encode_ordinary(piece), piece
    special = json.load(open(folder / "special_tokens_map.json"))
    assert special == {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    tokenizer_config = json.load(open(folder / "tokenizer_config.json"))
    assert tokenizer_config["model_max_length"] == 64 and tokenizer_config["tokenizer_class"] == "GPT2Tokenizer"


def test_no_tokenizer_flag(tmp_path, encoding):
    model = tmp_path / "model.bin"
    sim_model.write_model(model, layers=1, heads=2, channels=16, vocab=50257, max_t=64)
    result = export_ok("-i", model, "-o", tmp_path / "hf", "--no-tokenizer")
    assert "no tokenizer files (--no-tokenizer)" in result.stdout
    assert set(os.listdir(tmp_path / "hf")) == {"config.json", "model.safetensors"}


def write_bad_model(path, kind):
    sim_model.write_model(path, layers=1, heads=2, channels=16, vocab=50, max_t=8)
    data = bytearray(open(path, "rb").read())
    if kind == "magic":
        data[0:4] = struct.pack("<i", 20240327)
    elif kind == "version":
        data[4:8] = struct.pack("<i", 4)
    elif kind == "truncated":
        data = data[:-4]
    elif kind == "shape":
        data[5 * 4:6 * 4] = struct.pack("<i", 3)  # NH = 3 does not divide C = 16
    elif kind == "nan":
        data[1024 + 4 * 100:1024 + 4 * 101] = struct.pack("<f", float("nan"))
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("kind,message", [
    ("missing", "cannot read the model file"),
    ("magic", "magic 20240327, expected 20240326"),
    ("version", "version 4, expected 3 (float32) or 5 (bfloat16)"),
    ("truncated", "but its header"),
    ("shape", "invalid shape"),
    ("nan", "wte holds 1 non-finite values"),
])
def test_a_bad_model_file_is_refused_in_one_line(tmp_path, kind, message):
    model = tmp_path / "model.bin"
    if kind != "missing":
        write_bad_model(model, kind)
    result = run_export("-i", model, "-o", tmp_path / "hf")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: -i {model}"), result.stderr
    assert message in lines[0]
    assert os.listdir(tmp_path) == (["model.bin"] if kind != "missing" else [])  # nothing written, no temp folder


def test_an_existing_or_unreachable_output_is_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    result = run_export("-i", FIXTURE_MODEL, "-o", tmp_path / "hf")
    assert result.returncode == 1 and result.stderr.strip() == f"error: -o {tmp_path / 'hf'}: already exists; give a new folder (an export is never merged into old files)"
    result = run_export("-i", FIXTURE_MODEL, "-o", tmp_path / "no" / "hf")
    assert result.returncode == 1 and "its parent folder" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == ["hf"] and os.listdir(tmp_path / "hf") == []


def read_model_file(path):
    """(header ints, float32 values) of a model file, read here without dev/eval"""
    data = open(path, "rb").read()
    header = np.frombuffer(data[:1024], dtype="<i4")
    if header[1] == 3:
        return header, np.frombuffer(data[1024:], dtype="<f4")
    return header, (np.frombuffer(data[1024:], dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def test_an_export_imports_back_byte_for_byte(fixture_export, tmp_path):
    result = import_ok("-i", fixture_export, "-o", tmp_path / "model.bin")
    assert "version 3" in result.stdout
    assert (tmp_path / "model.bin").read_bytes() == open(FIXTURE_MODEL, "rb").read()
    # bfloat16 out: version 5, each weight the nearest bfloat16 of the fixture's
    import_ok("-i", fixture_export, "-o", tmp_path / "model_bf16.bin", "-d", "bfloat16")
    header, values = read_model_file(tmp_path / "model_bf16.bin")
    original_header, original = read_model_file(FIXTURE_MODEL)
    assert header[1] == 5 and list(header[2:8]) == list(original_header[2:8])
    assert nearest_bf16_property(original, values.astype(np.float64))


def write_safetensors_here(path, tensors):
    """a safetensors file written here, each tensor as its numpy dtype says (<f4 or <f2), the
    header unpadded: other writers' layouts, for the importer"""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        blob = value.tobytes()
        dtype = {value: name for name, value in SAFETENSORS_TYPES.items()}[value.dtype.str]
        header[name] = {"dtype": dtype, "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def other_writers_folder(fixture_export, folder, shards=1, dtype="<f2", extra=None, config_changes=None):
    """the fixture's export rewritten: names without "transformer.", the old mask buffers,
    a stored lm_head, tensors in dtype, in `shards` files (an index beside them when more than one)"""
    folder.mkdir()
    config = json.load(open(fixture_export / "config.json"))
    config.update(config_changes or {})
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {name.removeprefix("transformer."): value.astype(dtype) for name, (_, value) in
               read_safetensors(fixture_export / "model.safetensors").items()}
    tensors["lm_head.weight"] = tensors["wte.weight"]
    for layer in range(2):
        tensors[f"h.{layer}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32))).astype(dtype)
        tensors[f"h.{layer}.attn.masked_bias"] = np.array(-1e4, dtype=dtype)
    tensors.update(extra or {})
    names = sorted(tensors)
    if shards == 1:
        write_safetensors_here(folder / "model.safetensors", tensors)
        return tensors
    weight_map = {}
    for shard in range(shards):
        file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::shards]}
        write_safetensors_here(folder / file_name, part)
        weight_map.update({name: file_name for name in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


@pytest.mark.parametrize("shards", [1, 3])
def test_other_writers_layouts_import_to_the_same_tensors(fixture_export, tmp_path, shards):
    tensors = other_writers_folder(fixture_export, tmp_path / "hf", shards=shards)
    import_ok("-i", tmp_path / "hf", "-o", tmp_path / "model.bin")
    header, values = read_model_file(tmp_path / "model.bin")
    _, original = read_model_file(FIXTURE_MODEL)
    assert list(header[:8]) == [20240326, 3, 32, 97, 2, 4, 64, 128]
    # every weight is the fixture's in float16 (wte's padded rows stay zero)
    assert np.array_equal(values, original.astype(np.float16).astype(np.float32))
    assert len(tensors) == 4 + 12 * 2 + 1 + 2 * 2


def read_stored(path):
    """{name: array in its stored type} of a file write_safetensors_here wrote"""
    return {name: value.astype(SAFETENSORS_TYPES[dtype]) for name, (dtype, value) in read_safetensors(path, None).items()}


def fixture_tensor(fixture_export, name):
    return read_safetensors(fixture_export / "model.safetensors")[name][1].astype(np.float32)


@pytest.mark.parametrize("case,message", [
    ("no folder", "not a folder"),
    ("no config", "cannot read config.json"),
    ("not gpt2", "model_type 'llama', expected 'gpt2'"),
    ("erf gelu", "not llm.c's GPT-2: activation_function 'gelu'"),
    ("n_inner", "n_inner 128 (llm.c's MLP is 4 n_embd = 256 wide)"),
    ("layernorm eps", "layer_norm_epsilon 1e-06"),
    ("untied", "tie_word_embeddings false"),
    ("lm_head differs", "lm_head.weight differs from wte.weight"),
    ("missing tensor", "tensor h.1.mlp.c_proj.bias is missing"),
    ("wrong shape", "tensor h.0.attn.c_attn.weight has shape [192, 64], expected [64, 192]"),
    ("extra layer", "1 tensors llm.c's GPT-2 has no place for, such as h.2.ln_1.weight"),
    ("pickle only", "only pytorch_model.bin"),
    ("truncated", "do not hold F16"),
    ("int64", "is I64; F32, BF16 and F16 are read"),
    ("dtype not a string", "has no string dtype, list of sizes as shape and two data_offsets"),
    ("config not utf-8", "config.json: not JSON"),
    ("nan", "wpe holds 1 non-finite values"),
])
def test_a_folder_that_is_not_llmc_gpt2_is_refused_in_one_line(fixture_export, tmp_path, case, message):
    folder = tmp_path / "hf"
    config_changes = {"no folder": None, "not gpt2": {"model_type": "llama"}, "erf gelu": {"activation_function": "gelu"},
                      "n_inner": {"n_inner": 128}, "layernorm eps": {"layer_norm_epsilon": 1e-6},
                      "untied": {"tie_word_embeddings": False}}.get(case)
    extra = {}
    if case == "lm_head differs":
        extra["lm_head.weight"] = (fixture_tensor(fixture_export, "transformer.wte.weight") * 2).astype("<f2")
    if case == "wrong shape":
        extra["h.0.attn.c_attn.weight"] = fixture_tensor(fixture_export, "transformer.h.0.attn.c_attn.weight").T.astype("<f2")
    if case == "extra layer":
        extra["h.2.ln_1.weight"] = np.ones(64, dtype="<f2")
    if case == "nan":
        wpe = fixture_tensor(fixture_export, "transformer.wpe.weight").astype("<f2")
        wpe[3, 5] = np.nan
        extra["wpe.weight"] = wpe
    if case != "no folder":
        other_writers_folder(fixture_export, folder, extra=extra, config_changes=config_changes)
    if case == "no config":
        (folder / "config.json").unlink()
    if case == "missing tensor":
        tensors = {name: value for name, value in read_stored(folder / "model.safetensors").items() if name != "h.1.mlp.c_proj.bias"}
        write_safetensors_here(folder / "model.safetensors", tensors)
    if case == "pickle only":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    if case == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:-2])
    if case in ("int64", "dtype not a string"):
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data.replace(b'"F16"', b'"I64"' if case == "int64" else b'["F"]', 1))
    if case == "config not utf-8":
        (folder / "config.json").write_bytes(b'{"model_type": "gpt2\xff"}')
    line = one_error_line(run_import("-i", folder, "-o", tmp_path / "model.bin"))
    assert message in line and line.startswith(f"error: -i {folder}"), line
    assert not [name for name in os.listdir(tmp_path) if name.startswith("model.bin")]  # nothing written, no temp file


def test_an_existing_or_unreachable_model_file_is_refused(fixture_export, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"keep")
    line = one_error_line(run_import("-i", fixture_export, "-o", tmp_path / "model.bin"))
    assert line == f"error: -o {tmp_path / 'model.bin'}: already exists; give a new file name"
    assert (tmp_path / "model.bin").read_bytes() == b"keep"
    line = one_error_line(run_import("-i", fixture_export, "-o", tmp_path / "no" / "model.bin"))
    assert "its folder" in line


def test_a_weight_beyond_bfloat16_is_refused_only_as_bfloat16(fixture_export, tmp_path):
    """3.4e38 is a float32 that rounds to Inf in bfloat16: -d bfloat16 refuses it in one line and
    writes nothing; -d float32 keeps it"""
    wpe = fixture_tensor(fixture_export, "transformer.wpe.weight")
    wpe[0, 0] = 3.4e38
    other_writers_folder(fixture_export, tmp_path / "hf", dtype="<f4", extra={"wpe.weight": wpe})
    line = one_error_line(run_import("-i", tmp_path / "hf", "-o", tmp_path / "model.bin", "-d", "bfloat16"))
    assert line == f"error: -o {tmp_path / 'model.bin'}: wpe overflows bfloat16; write it as float32"
    assert not [name for name in os.listdir(tmp_path) if name.startswith("model.bin")]
    import_ok("-i", tmp_path / "hf", "-o", tmp_path / "model.bin")
    assert read_model_file(tmp_path / "model.bin")[1][128 * 64] == np.float32(3.4e38)  # wpe's first element, after wte


def corrupt_folder(folder, rng):
    """one seeded corruption of an export: bytes of config.json or of model.safetensors' header
    and data changed, the file cut short, or a config value or a tensor's header entry replaced"""
    target = folder / rng.choice(["config.json", "model.safetensors", "model.safetensors"])
    data = bytearray(target.read_bytes())
    kind = rng.choice(["bytes", "cut", "value"])
    if kind == "bytes":
        for _ in range(rng.randint(1, 5)):
            data[rng.randrange(min(len(data), 4000)) if rng.random() < 0.8 else rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "cut":
        data = data[:rng.randrange(len(data))]
    elif target.name == "config.json":
        config = json.loads(data)
        config[rng.choice(sorted(config))] = rng.choice([None, -1, 0, "x", [1], {"a": 1}, 1e30, True])
        data = bytearray(json.dumps(config).encode())
    else:
        length = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + length])
        entry = header[rng.choice(sorted(name for name in header if name != "__metadata__"))]
        entry[rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice([None, "F64", [], [1, 2, 3], [-1, 5], "x", 7])
        text = json.dumps(header).encode()
        data = bytearray(struct.pack("<Q", len(text)) + text + data[8 + length:])
    target.write_bytes(bytes(data))
    return f"{target.name} {kind}"


def test_corrupted_folders_import_or_fail_in_one_line(fixture_export, tmp_path):
    """a fixed sample of seeded corruptions (a local run of 660 found the two tracebacks now
    tested above): each import succeeds or exits 1 with one error line, writing nothing then"""
    rng = random.Random(62)
    for case in range(30):
        folder = tmp_path / f"hf{case}"
        shutil.copytree(fixture_export, folder)
        what = corrupt_folder(folder, rng)
        result = run_import("-i", folder, "-o", tmp_path / f"model{case}.bin")
        lines = result.stderr.strip().splitlines()
        if result.returncode == 0:
            assert lines == [], (case, what, result.stderr)
        else:
            assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: -"), (case, what, result.stderr)
            assert not (tmp_path / f"model{case}.bin").exists()


def transformers_or_skip():
    try:
        import torch
        import transformers
    except ImportError:
        pytest.skip("transformers and torch are not installed (they are not part of CI)")
    return torch, transformers


def test_transformers_loads_the_export_and_gives_the_fixture_logits(fixture_export):
    torch, transformers = transformers_or_skip()
    model = transformers.GPT2LMHeadModel.from_pretrained(fixture_export).eval()
    x, expected = fixture_inputs_and_logits(97)
    with torch.no_grad():
        logits = model(torch.tensor(x, dtype=torch.long)).logits.numpy()
    assert np.abs(logits - expected).max() <= 2e-6 * np.abs(expected).max()


def test_transformers_tokenizer_matches_tiktoken(gpt2_vocab_export, encoding):
    _, transformers = transformers_or_skip()
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    for tokenizer_class in (transformers.GPT2Tokenizer, transformers.GPT2TokenizerFast):
        tokenizer = tokenizer_class.from_pretrained(gpt2_vocab_export)
        assert tokenizer.encode(text) == encoding.encode_ordinary(text), tokenizer_class.__name__
        assert tokenizer.eos_token_id == 50256


def saved_and_imported(torch, transformers, folder, positions, layers, seed):
    """a random GPT-2 (V = 301, C = 64, two heads) that transformers saves in folder/saved,
    imported as folder/model.bin; returns the transformers model"""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=301, n_positions=positions, n_embd=64, n_layer=layers, n_head=2,
                                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)  # layernorms and biases off 1 and 0
    model.save_pretrained(folder / "saved")
    import_ok("-i", folder / "saved", "-o", folder / "model.bin")
    return model


def test_transformers_folder_imports_and_exports_to_the_same_logits(tmp_path):
    """a GPT-2 that transformers itself saved (its names, its safetensors) through import_hf and
    export_hf again, in float32: transformers gives the same logits, bit for bit"""
    torch, transformers = transformers_or_skip()
    original = saved_and_imported(torch, transformers, tmp_path, positions=48, layers=3, seed=0)
    header, _ = read_model_file(tmp_path / "model.bin")
    assert list(header[:8]) == [20240326, 3, 48, 301, 3, 2, 64, 384]
    export_ok("-i", tmp_path / "model.bin", "-o", tmp_path / "exported", "-d", "float32")
    exported = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "exported").eval()
    tokens = torch.randint(0, 301, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(original(tokens).logits, exported(tokens).logits)


def test_the_cpu_trainer_evaluates_an_import_as_transformers_does(tmp_path):
    """OpenAI's GPT-2 measured by llm8 (-x 0 on an import) is what transformers measures: a
    GPT-2 that transformers saved, imported, gives the CPU trainer's val loss on one batch
    within fp32 rounding of transformers' loss on the same tokens"""
    torch, transformers = transformers_or_skip()
    trainer = os.path.join(REPO, "train_gpt2cpu")
    if not os.path.exists(trainer):
        pytest.fail(f"{trainer} is not built (make train_gpt2cpu)")
    model = saved_and_imported(torch, transformers, tmp_path, positions=64, layers=2, seed=2)
    B, T = 2, 32
    for split, seed in (("train", 1), ("val", 2)):
        sim_model.write_shard(tmp_path / f"s_{split}_000000.bin", 4 * B * T + 1, seed, vocab=301)
    run = subprocess.run([trainer, "-e", "model.bin", "-i", "s_train_*.bin", "-j", "s_val_*.bin", "-b", str(B), "-t", str(T),
                          "-x", "0", "-m", "1", "-s", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    val_losses = [float(v) for v in re.findall(r"^val loss (\S+)$", run.stdout, re.M)]
    tokens = np.fromfile(tmp_path / "s_val_000000.bin", dtype=np.uint16, offset=1024)[:B * T + 1].astype(np.int64)
    with torch.no_grad():
        logits = model(torch.tensor(tokens[:-1]).view(B, T)).logits
        expected = torch.nn.functional.cross_entropy(logits.view(-1, 301), torch.tensor(tokens[1:])).item()
    assert len(val_losses) == 1 and abs(val_losses[0] - expected) <= 1e-5 * expected, (val_losses, expected)
