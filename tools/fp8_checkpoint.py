"""Writes a float target checkpoint in the layout of the released block-FP8 checkpoints
(Qwen/Qwen3-8B-FP8, deepseek-ai/DeepSeek-V3): every linear layer's weight [out, in] as
``float8_e4m3fn`` with a float32 ``weight_scale_inv`` [ceil(out / b_out), ceil(in / b_in)] per
block (``scale = max |block| / 448``, the weight divided by its block's scale and cast), the other
tensors as they were, and ``config.json`` given the released ``quantization_config``
(``quant_method`` "fp8", ``fmt`` "e4m3", ``activation_scheme`` "dynamic", ``weight_block_size``).
Which weights are quantized is ``dflash_jax.quantization.quantizable`` (embeddings, the LM head,
norms, routers and gates kept, as the released files keep them).

  python -m dflash_jax.tools.fp8_checkpoint SRC OUT [--block 128 128]

Used by the tests to make tiny random models in that layout (docs/quantization.md)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct

import ml_dtypes
import numpy as np

from dflash_jax import quantization
from dflash_jax.checkpoints import read_tensors, target_tensor_specs
from dflash_jax.config import TargetConfig, read_config_json
from dflash_jax.files import atomic_path

SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float8_e4m3fn": "F8_E4M3",
                      "int32": "I32", "int64": "I64", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def quantize_block_fp8(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn [out, in], float32 scales [ceil(out / b0), ceil(in / b1)]) of ``w``."""
    out_dim, in_dim = w.shape
    nb0, nb1 = -(-out_dim // block[0]), -(-in_dim // block[1])
    padded = np.zeros((nb0 * block[0], nb1 * block[1]), np.float32)
    padded[:out_dim, :in_dim] = w
    amax = np.abs(padded.reshape(nb0, block[0], nb1, block[1])).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
    full = np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:out_dim, :in_dim]
    return (w.astype(np.float32) / full).astype(ml_dtypes.float8_e4m3fn), scale


def write_safetensors_raw(tensors: dict[str, np.ndarray], file: str) -> None:
    """A safetensors file written from its format (the numpy writer has no FP8 dtype)."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        data = a.tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with atomic_path(file) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


def convert(src: str, out: str, block: tuple[int, int] = (128, 128)) -> list[str]:
    """Writes ``src`` (a float target checkpoint) to ``out`` in the block-FP8 layout; returns the
    names of the quantized weights."""
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists: give a new directory")
    cfg = TargetConfig.from_pretrained(src)
    specs = target_tensor_specs(cfg)
    tensors = read_tensors(src)
    quantized, written = [], {}
    for name, a in tensors.items():
        spec = specs.get(name)
        if spec is not None and a.ndim == 2 and quantization.quantizable(spec.path, a):
            q, s = quantize_block_fp8(np.asarray(a, np.float32), block)
            written[name], written[name + quantization.SCALE_INV] = q, s
            quantized.append(name)
        else:
            written[name] = a
    os.makedirs(out)
    write_safetensors_raw(written, os.path.join(out, "model.safetensors"))
    config = read_config_json(src)
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": [int(block[0]), int(block[1])]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(src):  # the tokenizer and generation files, when there are any
        if name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab", "merges")):
            shutil.copy(os.path.join(src, name), out)
    return sorted(quantized)


def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(prog="python -m dflash_jax.tools.fp8_checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="a float target checkpoint directory")
    p.add_argument("out", help="a new directory for the block-FP8 copy")
    p.add_argument("--block", type=int, nargs=2, default=[128, 128], metavar=("OUT", "IN"),
                   help="weight_block_size [out, in] (default 128 128, the released files')")
    args = p.parse_args(argv)
    if min(args.block) < 1:
        p.error(f"--block must be two positive integers, got {args.block}")
    names = convert(args.src, args.out, tuple(args.block))
    print(f"{args.out}: {len(names)} weights in block FP8 {args.block}")
    return names


if __name__ == "__main__":
    main()
