"""MXFP4 expert weights (gpt-oss's released checkpoints) dequantized on load.

A quantized matrix ``W`` [..., out, in] is stored as two uint8 tensors:

  ``<name>_blocks`` [..., out, G, 16]: ``in = 32 G`` e2m1 (FP4) codes, two per byte, the low
    nibble first (value ``2 i`` of a block in the low 4 bits of byte ``i``, value ``2 i + 1`` in
    the high 4 bits); a code is a sign bit and one of 0, 0.5, 1, 1.5, 2, 3, 4, 6;
  ``<name>_scales`` [..., out, G]: one shared exponent per block of 32 values, the value
    ``2 ** (u8 - 127)``.

Stored out-major ([E, out, in], PyTorch's Linear layout per expert), the dequantized weight is
returned as the model holds it, ``[..., in, out]`` (transformers' ``convert_moe_packed_tensors``:
the last two axes swapped). Every value is ``code * 2 ** (u8 - 127)``, computed in float32 (exact
while it neither overflows nor underflows) and then cast to the requested dtype.
"""

from __future__ import annotations

import functools

import numpy as np

from dflash_jax.checkpoints import CheckpointError

FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
"""The 16 e2m1 codes' values (bit 3: sign, bits 0-2: magnitude index)."""

BLOCK_BYTES = 16
"""Bytes per MXFP4 block: 32 FP4 values share one scale."""
BLOCK_VALUES = 2 * BLOCK_BYTES
SCALE_BIAS = 127


def check_mxfp4(name: str, blocks: np.ndarray, scales: np.ndarray,
                shape: tuple[int, ...] | None = None) -> None:
    """Raises a one-line CheckpointError naming ``name`` (the weight, e.g.
    ``model.layers.0.mlp.experts.down_proj``) when its ``_blocks`` / ``_scales`` pair is not
    MXFP4 of the dequantized ``shape`` [..., in, out] (None: any shape): dtypes other than
    uint8, blocks of another size than 16 bytes, scales not one per block."""
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise CheckpointError(
            f"{name}_blocks / {name}_scales must be uint8 (MXFP4), found {blocks.dtype} / "
            f"{scales.dtype}")
    if blocks.ndim < 3 or blocks.shape[-1] != BLOCK_BYTES:
        raise CheckpointError(
            f"{name}_blocks has shape {list(blocks.shape)}: MXFP4 blocks are [..., out, groups, "
            f"{BLOCK_BYTES}] ({BLOCK_VALUES} FP4 values in {BLOCK_BYTES} bytes per block)")
    if scales.shape != blocks.shape[:-1]:
        raise CheckpointError(
            f"{name}_scales has shape {list(scales.shape)}, but {name}_blocks "
            f"{list(blocks.shape)} needs one scale per block: {list(blocks.shape[:-1])}")
    if shape is not None:
        *lead, out, groups, _ = blocks.shape
        got = (*lead, groups * BLOCK_VALUES, out)
        if tuple(got) != tuple(shape):
            raise CheckpointError(
                f"{name}_blocks {list(blocks.shape)} dequantizes to {list(got)}, expected "
                f"{list(shape)} ([..., in, out]; in = {BLOCK_VALUES} x groups)")


@functools.lru_cache(maxsize=1)
def _bfloat16_pair_table() -> np.ndarray:
    """uint32[256 scales, 256 bytes]: the bfloat16 bits of a byte's two values times the scale
    ``2 ** (u8 - 127)``, the low nibble's in the low half (a uint32 array of looked-up entries
    viewed as uint16 is the values in order, on a little-endian machine). The scale is added to
    each nonzero value's exponent field, exact for scales in :data:`_BF16_EXPONENT_ROOM` (the
    only rows used)."""
    import ml_dtypes

    bits = FP4_VALUES.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int32)  # [16]
    shift = (np.arange(256, dtype=np.int32) - SCALE_BIAS) << 7  # [256 scales]
    scaled = np.where(bits[None] & 0x7FFF, bits[None] + shift[:, None], bits[None]) & 0xFFFF
    scaled = scaled.astype(np.uint32)  # [256 scales, 16 codes]
    byte = np.arange(256)
    return scaled[:, byte & 0x0F] | (scaled[:, byte >> 4] << 16)


_BF16_EXPONENT_ROOM = (2, 252)
"""Scales (u8) for which every code times the scale is a normal bfloat16: the codes' exponent
fields are 126..129 (0.5 .. 6), the scaled one must stay in 1..254."""


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype=np.float32,
                     name: str = "weight", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The weight [..., in, out] in ``dtype`` (a numpy dtype, ``ml_dtypes.bfloat16`` included)
    of MXFP4 ``blocks`` uint8[..., out, G, 16] and ``scales`` uint8[..., out, G] (module
    docstring); :func:`check_mxfp4` first. Computed one leading index at a time, so the
    temporaries stay one expert's size.

    bfloat16 (what the loader asks for) takes a fast exact path when every scale is in
    2..252: one table lookup per byte gives its two values, scaled, as bfloat16 bits
    (:func:`_bfloat16_pair_table`); otherwise, and for other dtypes, the values are computed
    in float32 (``ldexp``) and cast."""
    import ml_dtypes

    check_mxfp4(name, blocks, scales, shape)
    *lead, out_dim, groups, _ = blocks.shape
    dtype = np.dtype(dtype)
    result = np.empty((*lead, groups * BLOCK_VALUES, out_dim), dtype)
    flat_blocks = blocks.reshape(-1, out_dim, groups, BLOCK_BYTES)
    flat_scales = scales.reshape(-1, out_dim, groups)
    flat_out = result.reshape(-1, groups * BLOCK_VALUES, out_dim)
    fast = (dtype == np.dtype(ml_dtypes.bfloat16) and np.little_endian and scales.size
            and _BF16_EXPONENT_ROOM[0] <= scales.min() and scales.max() <= _BF16_EXPONENT_ROOM[1])
    table = _bfloat16_pair_table() if fast else None
    for i in range(flat_blocks.shape[0]):
        b = flat_blocks[i]
        if fast:  # one table lookup per byte: [scale, byte] -> two scaled bfloat16 values
            index = (flat_scales[i].astype(np.int32) << 8)[..., None] | b
            values = table.reshape(-1)[index].view(ml_dtypes.bfloat16)
        else:
            values = np.empty((out_dim, groups, BLOCK_VALUES), np.float32)
            values[..., 0::2] = FP4_VALUES[b & 0x0F]
            values[..., 1::2] = FP4_VALUES[b >> 4]
            exponent = flat_scales[i].astype(np.int32) - SCALE_BIAS
            values = np.ldexp(values, exponent[..., None])
        flat_out[i] = values.reshape(out_dim, groups * BLOCK_VALUES).T.astype(dtype, copy=False)
    return result


def quantize_mxfp4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(blocks, scales)`` of a weight [..., in, out] whose values are already MXFP4 numbers
    (each block of 32 consecutive ``in`` values of one ``out`` column is a code of
    :data:`FP4_VALUES` times one power of two): the exact inverse of :func:`dequantize_mxfp4`
    for such weights (tests build MXFP4 checkpoints with it). Other values are a ValueError."""
    w = np.asarray(weight, np.float32)
    *lead, in_dim, out_dim = w.shape
    if in_dim % BLOCK_VALUES:
        raise ValueError(f"the input dimension {in_dim} is not a multiple of {BLOCK_VALUES}")
    groups = in_dim // BLOCK_VALUES
    v = np.swapaxes(w, -1, -2).reshape(*lead, out_dim, groups, BLOCK_VALUES)
    peak = np.max(np.abs(v), axis=-1)
    # the smallest exponent that brings the block's largest magnitude into [0, 6]
    exponent = np.where(peak > 0, np.ceil(np.log2(np.where(peak > 0, peak, 1.0) / 6.0)), 0)
    exponent = exponent.astype(np.int32)
    scaled = np.ldexp(v, -exponent[..., None])
    codes = np.abs(np.abs(scaled)[..., None] - FP4_VALUES[:8]).argmin(-1).astype(np.uint8)
    codes = codes | np.where(np.signbit(scaled), 8, 0).astype(np.uint8)
    if not np.array_equal(FP4_VALUES[codes], scaled):
        raise ValueError("the weight is not exactly representable in MXFP4")
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    scales = (exponent + SCALE_BIAS).astype(np.uint8)
    return blocks, scales
