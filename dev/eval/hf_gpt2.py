"""
hf_gpt2.py: llm.c's GPT-2 tensors and transformers' GPT2LMHeadModel, one map for both ways,
and the safetensors format, in numpy alone.

Why one module: export_hf.py writes a Hugging Face folder from a model file and import_hf.py
reads one back. The two must agree on every name, transpose and padding rule, so they share
this one table (LAYER_TENSORS). It needs no torch or transformers, so both tools run offline
on any machine with numpy.

The network is the same on both sides: pre-LN blocks, GELU with the tanh approximation
(transformers' "gelu_new", or "gelu_pytorch_tanh", the same function), layernorm eps 1e-5,
attention scaled by 1/sqrt(head size), and an lm_head tied to wte. What differs is layout:
- transformers' GPT-2 linears are Conv1D: weight [in, out], y = x W + b. llm.c stores
  [out, in], so qkvw, attprojw, fcw and fcprojw are transposed. Biases and layernorms are copied.
- c_attn's outputs are q, k, v in that order, as are the rows of llm.c's qkvw.
- wte: llm.c pads it to Vp rows, V rounded up to a multiple of 128, with zero rows; transformers
  keeps V. The lm_head is tied, so a folder need not store it.

safetensors: a little-endian u64 header length, a JSON header ({name: {"dtype", "shape",
"data_offsets": [begin, end]}} plus "__metadata__", padded with spaces to 8 bytes), then the
tensors' row-major bytes, offsets counted from the end of the header.
"""
import json
import math
import mmap
import os

import numpy as np

from model_file import bf16_bits_to_float32, bf16_overflows, float32_to_bf16_bits, param_shapes

# (transformers' per-layer name, llm.c's tensor, transposed: Conv1D keeps [in, out])
LAYER_TENSORS = [
    ("ln_1.weight", "ln1w", False), ("ln_1.bias", "ln1b", False),
    ("attn.c_attn.weight", "qkvw", True), ("attn.c_attn.bias", "qkvb", False),
    ("attn.c_proj.weight", "attprojw", True), ("attn.c_proj.bias", "attprojb", False),
    ("ln_2.weight", "ln2w", False), ("ln_2.bias", "ln2b", False),
    ("mlp.c_fc.weight", "fcw", True), ("mlp.c_fc.bias", "fcb", False),
    ("mlp.c_proj.weight", "fcprojw", True), ("mlp.c_proj.bias", "fcprojb", False),
]
WHOLE_MODEL_TENSORS = [("wte.weight", "wte"), ("wpe.weight", "wpe"), ("ln_f.weight", "lnfw"), ("ln_f.bias", "lnfb")]
PREFIX = "transformer."  # GPT2LMHeadModel's; a bare GPT2Model's names have none
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16"}
VOCAB_PAD = 128


class HfError(Exception):
    """A folder or a tensor that does not fit; str() is the one-line reason."""


def padded_vocab(V):
    return (V + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD


def to_hf(cfg, params):
    """{transformers name: float32 array} of GPT2LMHeadModel from llm.c's tensors (model_file's)"""
    tensors = {}
    for hf_name, llmc_name in WHOLE_MODEL_TENSORS:
        tensors[PREFIX + hf_name] = params[llmc_name]
    tensors[PREFIX + "wte.weight"] = params["wte"][:cfg["V"]]
    for layer in range(cfg["L"]):
        for hf_name, llmc_name, transposed in LAYER_TENSORS:
            value = params[llmc_name][layer]
            tensors[f"{PREFIX}h.{layer}.{hf_name}"] = value.T if transposed else value
    return tensors


def config_to_llmc(config):
    """llm.c's shape (maxT V L NH C Vp) of a transformers GPT-2 config.json, after checking that
    the config describes llm.c's network"""
    if config.get("model_type") != "gpt2":
        raise HfError(f"model_type {config.get('model_type')!r}, expected 'gpt2'")
    try:
        cfg = dict(maxT=int(config["n_positions"]), V=int(config["vocab_size"]), L=int(config["n_layer"]),
                   NH=int(config["n_head"]), C=int(config["n_embd"]))
    except (KeyError, TypeError, ValueError) as e:
        raise HfError(f"no usable {e} in it (GPT-2's n_positions, vocab_size, n_layer, n_head, n_embd)")
    if min(cfg.values()) <= 0 or cfg["C"] % cfg["NH"] != 0:
        raise HfError(f"an invalid shape {cfg}")
    differences = []
    activation = config.get("activation_function", "gelu_new")
    if activation not in TANH_GELUS:
        differences.append(f"activation_function {activation!r} (llm.c's GELU is the tanh one: {' or '.join(TANH_GELUS)})")
    if config.get("n_inner") not in (None, 4 * cfg["C"]):
        differences.append(f"n_inner {config['n_inner']} (llm.c's MLP is 4 n_embd = {4 * cfg['C']} wide)")
    if config.get("layer_norm_epsilon", 1e-5) != 1e-5:
        differences.append(f"layer_norm_epsilon {config['layer_norm_epsilon']} (llm.c's is 1e-5)")
    if not config.get("scale_attn_weights", True) or config.get("scale_attn_by_inverse_layer_idx", False):
        differences.append("attention scores not scaled by 1/sqrt(head size) alone")
    if not config.get("tie_word_embeddings", True):
        differences.append("tie_word_embeddings false (llm.c's lm_head is wte)")
    if differences:
        raise HfError("not llm.c's GPT-2: " + "; ".join(differences))
    cfg["Vp"] = padded_vocab(cfg["V"])
    return cfg


def from_hf(cfg, tensors):
    """llm.c's 16 tensors (float32, wte padded to Vp with zero rows) from a folder's
    {name: float32 array}; names with or without the "transformer." prefix. The attention
    mask buffers old checkpoints carry are ignored; a stored lm_head must equal wte."""
    bare = {}
    for name, value in tensors.items():
        short = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if short.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # the causal mask, a buffer that older transformers versions saved
        bare[short] = value

    def take(name, shape):
        if name not in bare:
            raise HfError(f"tensor {name} is missing")
        value = bare.pop(name)
        if value.shape != shape:
            raise HfError(f"tensor {name} has shape {list(value.shape)}, expected {list(shape)} for {cfg}")
        return value

    L, C, V, Vp, maxT = cfg["L"], cfg["C"], cfg["V"], cfg["Vp"], cfg["maxT"]
    params = {"wte": np.zeros((Vp, C), dtype=np.float32)}
    params["wte"][:V] = take("wte.weight", (V, C))
    params["wpe"] = take("wpe.weight", (maxT, C))
    params["lnfw"], params["lnfb"] = take("ln_f.weight", (C,)), take("ln_f.bias", (C,))
    one_layer = {name: shape[1:] for name, shape in param_shapes(L, C, Vp, maxT).items()}
    for hf_name, llmc_name, transposed in LAYER_TENSORS:
        shape = one_layer[llmc_name][::-1] if transposed else one_layer[llmc_name]
        layers = [take(f"h.{layer}.{hf_name}", shape) for layer in range(L)]
        params[llmc_name] = np.stack([value.T if transposed else value for value in layers])
    lm_head = bare.pop("lm_head.weight", None)
    if lm_head is not None and not np.array_equal(lm_head, params["wte"][:V]):
        raise HfError("lm_head.weight differs from wte.weight: llm.c's GPT-2 ties them")
    if bare:
        extra = sorted(bare)
        raise HfError(f"{len(extra)} tensors llm.c's GPT-2 has no place for, such as {extra[0]} (is it a GPT-2 with {L} layers?)")
    return params


def write_safetensors(path, tensors, dtype):
    """tensors {name: float32 array}, written as dtype ("float32" or "bfloat16", rounded to nearest even)"""
    blobs, header, offset = [], {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        value = tensors[name]
        if dtype == "float32":
            blob = np.ascontiguousarray(value, dtype="<f4").tobytes()
        else:
            bits = float32_to_bf16_bits(value)
            if bf16_overflows(bits):
                raise HfError(f"{name} overflows bfloat16; use float32")
            blob = bits.astype("<u2").tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """{name: float32 array} of a safetensors file holding F32, BF16 or F16 tensors; checks
    that the header is well formed and every tensor's bytes lie inside the file"""
    try:
        with open(path, "rb") as f:  # mapped, not read: gpt2-xl's file is 6.4 GB
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
    except (OSError, ValueError) as e:
        raise HfError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}")
    if len(data) < 8:
        raise HfError(f"{path}: {len(data)} bytes, too short for a safetensors file")
    header_length = int.from_bytes(data[:8], "little")
    if 8 + header_length > len(data):
        raise HfError(f"{path}: its header length {header_length} runs past the file's {len(data)} bytes (truncated?)")
    try:
        header = json.loads(bytes(data[8:8 + header_length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HfError(f"{path}: its header is not JSON ({e})")
    if not isinstance(header, dict):
        raise HfError(f"{path}: its header is not a JSON object")
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + header_length:]
    tensors = {}
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(n) for n in entry["shape"]], entry["data_offsets"]
            begin, end = int(begin), int(end)
            if not isinstance(dtype, str) or min(shape, default=0) < 0:
                raise ValueError(name)
        except (KeyError, TypeError, ValueError):
            raise HfError(f"{path}: tensor {name} has no string dtype, list of sizes as shape and two data_offsets")
        element = {"F32": "<f4", "BF16": "<u2", "F16": "<f2"}.get(dtype)
        if element is None:
            raise HfError(f"{path}: tensor {name} is {dtype}; F32, BF16 and F16 are read")
        count = math.prod(shape)
        if not 0 <= begin <= end <= len(body) or end - begin != count * np.dtype(element).itemsize:
            raise HfError(f"{path}: tensor {name}'s bytes [{begin}, {end}) do not hold {dtype} {shape} inside its "
                          f"{len(body)} bytes of data (truncated?)")
        raw = np.frombuffer(body[begin:end], dtype=element)
        if dtype == "F32":
            values = raw  # a view of the mapped file: a 1.5B model is not copied twice
        else:
            values = bf16_bits_to_float32(raw) if dtype == "BF16" else raw.astype(np.float32)
        tensors[name] = values.reshape(shape)
    return tensors


def hf_config(cfg, dtype, eos_token_id=None):
    """transformers' config.json of llm.c's network; dropout 0, as llm.c trains"""
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "use_cache": True,
        "torch_dtype": dtype,
    }
    if eos_token_id is not None:
        config["bos_token_id"] = config["eos_token_id"] = eos_token_id
    return config
