"""Integer weights packed into int32 words, the ``compressed-tensors`` ``pack-quantized`` format
(Kimi-K2.5's released INT4 experts), dequantized on load.

A quantized Linear weight [out, in] is stored as three tensors:

  ``<name>.weight_packed``  int32 [out, ceil(in * B / 32)]: the B-bit integers ``q + 2^(B-1)``
                            (q in [-2^(B-1), 2^(B-1) - 1], shifted to unsigned) laid densely, row
                            by row, element j of a row at bits ``j B .. j B + B - 1`` of the row's
                            little-endian bit stream (so with B = 4, eight per word, element j in
                            word ``j // 8`` at bit ``4 (j % 8)``);
  ``<name>.weight_scale``   [out, in / G] (group strategy, G = ``group_size``) or [out, 1]
                            (channel strategy): one scale per row and group;
  ``<name>.weight_shape``   int [2]: [out, in].

The weight is ``q * scale`` (symmetric: no zero point). :func:`read_scheme` reads the
``quantization_config`` (one weight scheme: ``type`` int, ``symmetric``, ``strategy`` group or
channel, weight-only) and refuses anything else naming the field; :func:`dequantize` unpacks one
weight. The oracle is the ``compressed-tensors`` package's own packing
(``tests/fixtures/packed_int_reference.json``, ``tools/packed_int_reference.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from dflash_jax.checkpoints import CheckpointError

SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape")
BITS = tuple(range(1, 9))


@dataclasses.dataclass(frozen=True)
class PackedScheme:
    """``num_bits`` B and ``group_size`` G (0: one scale per output channel)."""

    num_bits: int
    group_size: int


def read_scheme(q: Mapping[str, Any], what: str) -> PackedScheme:
    """The weight scheme of a ``compressed-tensors`` ``quantization_config``; anything this
    reader does not implement is a one-line ValueError naming the field."""
    fmt = q.get("format")
    if fmt != "pack-quantized":
        raise ValueError(f"{what}: quantization_config format={fmt!r}: only compressed-tensors' "
                         "'pack-quantized' integer weights are read")
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ValueError(f"{what}: quantization_config has no config_groups")
    schemes = set()
    for gname, g in groups.items():
        w = (g or {}).get("weights") or {}
        where = f"quantization_config.config_groups.{gname}"
        for field, fine, why in (
                ("type", lambda v: v == "int", "only integer weights"),
                ("symmetric", lambda v: v is True, "only symmetric weights (no zero point)"),
                ("strategy", lambda v: v in ("group", "channel"), "only the group and channel strategies"),
                ("num_bits", lambda v: v in BITS, "only 1- to 8-bit weights"),
                ("dynamic", lambda v: not v, "only static weight scales"),
                ("actorder", lambda v: v in (None, False), "activation-ordered groups are not read")):
            if not fine(w.get(field)):
                raise ValueError(f"{what}: {where}.weights.{field}={w.get(field)!r}: {why} are read")
        if (g or {}).get("input_activations"):
            raise ValueError(f"{what}: {where}.input_activations is set: only weight-only quantization is read")
        size = int(w.get("group_size") or 0) if w["strategy"] == "group" else 0
        if w["strategy"] == "group" and size < 1:
            raise ValueError(f"{what}: {where}.weights.group_size={w.get('group_size')!r}: a group strategy "
                             "needs a positive group size")
        schemes.add(PackedScheme(int(w["num_bits"]), size))
    if len(schemes) != 1:
        raise ValueError(f"{what}: quantization_config has {len(schemes)} different weight schemes "
                         f"({sorted(schemes, key=str)}): one is read")
    return schemes.pop()


def dequantize(packed: np.ndarray, scale: np.ndarray, shape: np.ndarray, scheme: PackedScheme,
               name: str, what: str) -> np.ndarray:
    """float32 [out, in] of one packed weight (module docstring); tensors of the wrong dtype or
    shape are a CheckpointError naming them."""
    B = scheme.num_bits
    dims = [int(x) for x in np.asarray(shape).reshape(-1)]
    if len(dims) != 2 or min(dims) < 1:
        raise CheckpointError(f"{what}: {name}.weight_shape is {dims}, not [out, in]")
    out_dim, in_dim = dims
    words = -(-in_dim * B // 32)
    if packed.dtype != np.int32 or tuple(packed.shape) != (out_dim, words):
        raise CheckpointError(f"{what}: {name}.weight_packed is {packed.dtype} {list(packed.shape)}, but "
                              f"{B}-bit weights of {dims} pack into int32 [{out_dim}, {words}]")
    groups = 1 if scheme.group_size == 0 else -(-in_dim // scheme.group_size)
    if tuple(scale.shape) != (out_dim, groups):
        raise CheckpointError(f"{what}: {name}.weight_scale has shape {list(scale.shape)}, but "
                              f"{'groups of ' + str(scheme.group_size) if scheme.group_size else 'channels'} "
                              f"over {dims} need [{out_dim}, {groups}]")
    stream = packed.astype("<i4").view(np.uint8)  # little-endian bytes, row by row
    bits = np.unpackbits(stream, axis=1, bitorder="little")[:, :in_dim * B]  # [out, in * B]
    q = bits.reshape(out_dim, in_dim, B).astype(np.int32) @ (1 << np.arange(B, dtype=np.int32))
    q = q - (1 << (B - 1))
    s = scale.astype(np.float32)
    if scheme.group_size:
        s = np.repeat(s, scheme.group_size, axis=1)[:, :in_dim]
    return q.astype(np.float32) * s


def dequantize_tensors(tensors: dict, scheme: PackedScheme, what: str) -> dict:
    """``tensors`` with every packed weight (its three tensors) replaced by ``<name>.weight``
    (float32); a packed weight missing one of its tensors is a CheckpointError naming it."""
    bases = {n[:-len(s)] for n in tensors for s in SUFFIXES if n.endswith(s)}
    out = {n: a for n, a in tensors.items() if not any(n.endswith(s) for s in SUFFIXES)}
    for base in sorted(bases):
        missing = [base + s for s in SUFFIXES if base + s not in tensors]
        if missing:
            raise CheckpointError(f"{what}: {missing[0]} is missing (a packed weight stores "
                                  f"{', '.join(base + s for s in SUFFIXES)})")
        if base + ".weight" in out:
            raise CheckpointError(f"{what}: {base}.weight is stored both packed and unpacked: keep one")
        out[base + ".weight"] = dequantize(tensors[base + ".weight_packed"], tensors[base + ".weight_scale"],
                                           tensors[base + ".weight_shape"], scheme, base, what)
    return out
