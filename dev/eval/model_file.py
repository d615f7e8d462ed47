"""
model_file.py: llm.c's model file (versions 3 and 5) read into numpy, for the Python tools.

Why one reader: the exporter (dev/eval/export_hf.py) and the PyTorch reference
(dev/reference/gpt2_torch.py) both need the 16 tensors in llm.c's order and shapes, with
the same checks, and neither should depend on the other's imports (torch).

The file: an int32[256] header ([0] magic 20240326, [1] version: 3 = float32 weights,
5 = bfloat16, [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp, the vocabulary padded), then
every parameter, little-endian, tensor after tensor in PARAM_NAMES' order. Per-layer
tensors are stacked [L, ...]; matmul weights are [out, in]; wte has Vp rows.
"""
import math
import os

import numpy as np

MODEL_MAGIC = 20240326
MODEL_VERSIONS = {3: "float32", 5: "bfloat16"}
HEADER_INTS = 256
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


class ModelFileError(Exception):
    """The file cannot be read or is not a model file; str() is the one-line reason, after the path."""


def param_shapes(L, C, Vp, maxT):
    return {
        "wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,),
    }


def bf16_bits_to_float32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values):
    """round to nearest, ties to even, as torch's .to(torch.bfloat16) (finite inputs; a result
    that overflows is +-inf)"""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_model(path):
    """(config dict with maxT V L NH C Vp, the weights' type "float32" or "bfloat16",
    {name: float32 array in llm.c's layout}); bfloat16 weights are widened exactly.
    Raises ModelFileError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the model file: {e.strerror}")
    if len(data) < HEADER_INTS * 4:
        raise ModelFileError(f"{path}: {len(data)} bytes, shorter than a model file's 1024-byte header")
    header = np.frombuffer(data[:HEADER_INTS * 4], dtype="<i4")
    if header[0] != MODEL_MAGIC:
        raise ModelFileError(f"{path}: magic {header[0]}, expected {MODEL_MAGIC} (an llm.c model file; "
                             "a state_*.bin holds the optimizer, its model_*.bin the weights)")
    version = int(header[1])
    if version not in MODEL_VERSIONS:
        raise ModelFileError(f"{path}: version {version}, expected 3 (float32) or 5 (bfloat16)")
    cfg = dict(maxT=int(header[2]), V=int(header[3]), L=int(header[4]), NH=int(header[5]),
               C=int(header[6]), Vp=int(header[7]))
    if min(cfg.values()) <= 0 or cfg["C"] % cfg["NH"] != 0 or cfg["Vp"] < cfg["V"]:
        raise ModelFileError(f"{path}: its header gives an invalid shape {cfg}")
    weight_type = MODEL_VERSIONS[version]
    element_bytes = 4 if weight_type == "float32" else 2
    shapes = param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"])
    expected = HEADER_INTS * 4 + element_bytes * sum(math.prod(s) for s in shapes.values())
    if len(data) != expected:
        raise ModelFileError(f"{path}: {len(data)} bytes, but its header {cfg} (version {version}) needs {expected}")
    if weight_type == "float32":
        flat = np.frombuffer(data, dtype="<f4", offset=HEADER_INTS * 4)
    else:
        flat = bf16_bits_to_float32(np.frombuffer(data, dtype="<u2", offset=HEADER_INTS * 4))
    params, offset = {}, 0
    for name in PARAM_NAMES:
        count = math.prod(shapes[name])
        params[name] = flat[offset:offset + count].reshape(shapes[name])
        offset += count
    return cfg, weight_type, params


def bf16_overflows(bits):
    """whether a float32_to_bf16_bits result holds an Inf that its finite input rounded to"""
    return bool(np.count_nonzero(~np.isfinite(bf16_bits_to_float32(bits))))


def non_finite(params):
    """(name, count) of the first tensor, in PARAM_NAMES' order, holding a NaN or an Inf; None if none does"""
    for name in PARAM_NAMES:
        count = int(np.count_nonzero(~np.isfinite(params[name])))
        if count:
            return name, count
    return None


def write_model(path, cfg, params, weight_type):
    """writes a model file of version 3 (weight_type "float32") or 5 ("bfloat16", rounded to
    nearest even) from float32 arrays in llm.c's layout; through a temporary file renamed into
    place, so the path holds a whole file or none. Raises ModelFileError."""
    version = {name: number for number, name in MODEL_VERSIONS.items()}[weight_type]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, version, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    shapes = param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"])
    temp_path = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temp_path, "wb") as f:
            f.write(header.tobytes())
            for name in PARAM_NAMES:
                value = np.asarray(params[name], dtype=np.float32)
                if value.shape != shapes[name]:
                    raise ValueError(f"{name} has shape {value.shape}, expected {shapes[name]}")
                if weight_type == "float32":
                    f.write(value.astype("<f4").tobytes())
                    continue
                bits = float32_to_bf16_bits(value)
                if bf16_overflows(bits):
                    raise ModelFileError(f"{path}: {name} overflows bfloat16; write it as float32")
                f.write(bits.astype("<u2").tobytes())
        os.replace(temp_path, path)
    except OSError as e:
        _remove_quietly(temp_path)
        raise ModelFileError(f"{path}: cannot write the model file: {e.strerror or e}")
    except BaseException:
        _remove_quietly(temp_path)
        raise


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
