"""The reference numbers for packed integer weights: the ``compressed-tensors`` package's own
``pack-quantized`` compressor (the format of Kimi-K2.5's released INT4 experts) run on seeded
weights, written to a committed fixture that ``tests/targets/test_packed_int.py`` checks
``dflash_jax.targets.packed_int`` against.

Per case (bits, strategy, group size, shape): the float weight's per-group scales (absmax /
2^(B-1), chosen here), then the package's ``PackedQuantizationCompressor.compress`` (its
``quantize`` and ``pack_to_int32``: the stored ``weight_packed``, ``weight_scale``,
``weight_shape``) and ``decompress`` (its ``unpack_from_int32`` and ``dequantize``: the weight
a reader must get back). Cases: 4-bit groups of 32 (Kimi-K2.5's), 8-bit channels, and 3-bit
groups of 16 over an input width that splits elements across words.

Regenerate (needs torch and the reference package; install it alone, it pins nothing this
project uses)::

    pip install --no-deps compressed-tensors==0.20.1 loguru
    python -m dflash_jax.tools.packed_int_reference --out tests/fixtures/packed_int_reference.json
"""

from __future__ import annotations

import argparse

import numpy as np

from dflash_jax.files import write_json

SEED = 1129
CASES = ((4, "group", 32, (6, 96)), (8, "channel", 0, (5, 40)), (3, "group", 16, (4, 80)))


def reference_case(bits: int, strategy: str, group: int, shape, rng) -> dict:
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=bits, type="int", symmetric=True, strategy=strategy,
                            group_size=group or None)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    cols = group or shape[1]
    absmax = w.abs().reshape(shape[0], -1, cols).amax(-1)
    scale = (absmax / 2 ** (bits - 1)).clamp_min(1e-6)
    stored = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    back = PackedQuantizationCompressor.decompress(dict(stored), scheme)["weight"]
    return {"num_bits": bits, "strategy": strategy, "group_size": group, "shape": list(shape),
            "weight_packed": stored["weight_packed"].tolist(), "weight_scale": stored["weight_scale"].tolist(),
            "weight_shape": stored["weight_shape"].tolist(), "dequantized": back.tolist()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="tests/fixtures/packed_int_reference.json", help="the fixture to write")
    args = p.parse_args(argv)
    from importlib.metadata import version

    rng = np.random.default_rng(SEED)
    fixture = {"reference": f"compressed-tensors=={version('compressed-tensors')}", "seed": SEED,
               "cases": [reference_case(*c, rng) for c in CASES]}
    write_json(args.out, fixture)
    print(f"wrote {args.out}: {len(fixture['cases'])} cases")
    return fixture


if __name__ == "__main__":
    main()
