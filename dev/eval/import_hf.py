"""
import_hf.py: a Hugging Face GPT-2 folder as an llm.c model file, for llm8 to train or evaluate.

Why: llm.c makes gpt2_124M.bin with train_gpt2.py, which needs torch, transformers and the
network. This does the same offline with numpy alone, from any GPT-2 folder a user has: the
four OpenAI checkpoints (gpt2, gpt2-medium, gpt2-large, gpt2-xl are d12, d24, d36 and d48),
or one export_hf.py wrote. So `./train_gpt2_fp8 -e gpt2_774M.bin -x 0` measures OpenAI's
774M on the user's val split, as a baseline beside a reproduction, and `-e` without `-x 0`
fine-tunes it.

It reads config.json and the weights: model.safetensors, or the shards that
model.safetensors.index.json lists, with F32, BF16 or F16 tensors. A pytorch_model.bin
(Python pickle) alone is refused: reading one needs torch, which can save it as safetensors.
The config must describe llm.c's network (hf_gpt2.config_to_llmc says what differs). The
mapping is hf_gpt2.py's, shared with export_hf.py: Conv1D weights transposed, wte padded to
Vp = V rounded up to 128 with zero rows, a stored lm_head checked equal to wte.

The file is version 3 (float32, as llm.c's gpt2_124M.bin; the default) or 5 (bfloat16,
rounded to nearest even: -d bfloat16). It is written to a temporary name and renamed, and an
existing file is refused.

usage: python3 dev/eval/import_hf.py -i HF_FOLDER -o MODEL.bin [-d float32|bfloat16]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402
import model_file  # noqa: E402


class ImportFolderError(Exception):
    """A problem with the folder or the output; str() is the one-line message."""


def read_folder(folder):
    """(config dict, {name: float32 array}) of a transformers model folder"""
    if not os.path.isdir(folder):
        raise ImportFolderError(f"-i {folder}: not a folder (expected a Hugging Face model folder with config.json)")
    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path, "rb") as f:
            config = json.loads(f.read())
    except OSError as e:
        raise ImportFolderError(f"-i {folder}: cannot read config.json: {e.strerror}")
    except ValueError as e:  # not UTF-8, or not JSON
        raise ImportFolderError(f"-i {config_path}: not JSON ({e})")
    if not isinstance(config, dict):
        raise ImportFolderError(f"-i {config_path}: not a JSON object")
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted({os.path.join(folder, name) for name in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ImportFolderError(f"-i {index}: not a safetensors index with a weight_map ({e})")
    elif os.path.isfile(os.path.join(folder, "pytorch_model.bin")):
        raise ImportFolderError(f"-i {folder}: only pytorch_model.bin (a pickle, which needs torch); save the model as "
                                "safetensors first (transformers: model.save_pretrained(folder), safe_serialization is its default)")
    else:
        raise ImportFolderError(f"-i {folder}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for path in files:
        try:
            part = hf_gpt2.read_safetensors(path)
        except hf_gpt2.HfError as e:
            raise ImportFolderError(f"-i {e}")
        repeated = set(part) & set(tensors)
        if repeated:
            raise ImportFolderError(f"-i {path}: tensor {sorted(repeated)[0]} is also in another shard")
        tensors.update(part)
    return config, tensors


def import_folder(folder, model_path, weight_type):
    """writes model_path whole or not at all; returns the lines to print"""
    if os.path.lexists(model_path):
        raise ImportFolderError(f"-o {model_path}: already exists; give a new file name")
    parent = os.path.dirname(os.path.abspath(model_path))
    if not os.path.isdir(parent):
        raise ImportFolderError(f"-o {model_path}: its folder {parent} does not exist")
    config, tensors = read_folder(folder)
    try:
        cfg = hf_gpt2.config_to_llmc(config)
    except hf_gpt2.HfError as e:
        raise ImportFolderError(f"-i {os.path.join(folder, 'config.json')}: {e}")
    try:
        params = hf_gpt2.from_hf(cfg, tensors)
    except hf_gpt2.HfError as e:
        raise ImportFolderError(f"-i {folder}: {e}")
    bad = model_file.non_finite(params)
    if bad is not None:
        raise ImportFolderError(f"-i {folder}: {bad[0]} holds {bad[1]} non-finite values (NaN or Inf); refusing to import them")
    try:
        model_file.write_model(model_path, cfg, params, weight_type)
    except model_file.ModelFileError as e:
        raise ImportFolderError(f"-o {e}")
    count = sum(value.size for value in params.values())
    return [f"read {folder}: L={cfg['L']} NH={cfg['NH']} C={cfg['C']} maxT={cfg['maxT']} V={cfg['V']}",
            f"wrote {model_path}: {count:,} parameters (wte padded to Vp={cfg['Vp']}) as {weight_type}, "
            f"version {3 if weight_type == 'float32' else 5}"]


def main():
    parser = argparse.ArgumentParser(description="Write a Hugging Face GPT-2 folder as an llm.c model file, offline")
    parser.add_argument("-i", "--input", required=True, help="the folder: config.json and model.safetensors (or its index and shards)")
    parser.add_argument("-o", "--output", required=True, help="the model file to write (must not exist)")
    parser.add_argument("-d", "--dtype", default="float32", choices=sorted(hf_gpt2.SAFETENSORS_DTYPES),
                        help="float32 (version 3, the default) or bfloat16 (version 5)")
    args = parser.parse_args()
    try:
        lines = import_folder(args.input, args.output, args.dtype)
    except ImportFolderError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
