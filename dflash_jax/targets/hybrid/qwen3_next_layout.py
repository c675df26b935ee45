"""Qwen3-Next's packed Gated DeltaNet projections <-> the Qwen3.5 layout (``docs/targets.md``).

A ``qwen3_next`` checkpoint (transformers' ``Qwen3NextGatedDeltaNet``) stores a GDN layer's
input projections packed per key head; Qwen3.5 (and this project's hybrid forward) keeps them
apart. With Hk key heads of dk dims, Hv value heads of dv dims and ``r = Hv // Hk`` value heads
per key head (value head ``h * r + j`` reads key head h), PyTorch ``[out, in]`` weights:

  packed (Qwen3-Next)                               unpacked (Qwen3.5)
  in_proj_qkvz.weight [Hk * (2 dk + 2 r dv), D]     in_proj_qkv.weight [2 Hk dk + Hv dv, D]
    key head h's rows: q_h (dk), k_h (dk),            q (all heads), k (all heads), v (all heads)
    v_h (r dv: value heads h r .. h r + r - 1),     in_proj_z.weight   [Hv dv, D]
    z_h (r dv)
  in_proj_ba.weight   [Hk * 2 r, D]                 in_proj_b.weight   [Hv, D]
    key head h's rows: b_h (r), a_h (r)             in_proj_a.weight   [Hv, D]

(transformers' ``fix_query_key_value_ordering``). The conv1d weight's channels are
``[q, k, v]`` of all heads in both (Qwen3-Next concatenates the unpacked q, k, v before its
conv), so it is not converted. Both directions are row permutations: exact.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from dflash_jax.checkpoints import CheckpointError

PACKED = ("in_proj_qkvz", "in_proj_ba")
UNPACKED = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


class GdnDims(NamedTuple):
    """A GDN layer's head layout: Hk key heads of dk dims, Hv value heads of dv dims."""

    num_k_heads: int
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int

    @property
    def ratio(self) -> int:
        """r = Hv // Hk, value heads per key head."""
        return self.num_v_heads // self.num_k_heads

    def packed_shapes(self, hidden: int) -> dict[str, tuple[int, int]]:
        """{packed projection: [out, in] shape} of a layer with hidden size ``hidden``."""
        Hk, dk, r, dv = self.num_k_heads, self.head_k_dim, self.ratio, self.head_v_dim
        return {"in_proj_qkvz": (Hk * (2 * dk + 2 * r * dv), hidden), "in_proj_ba": (Hk * 2 * r, hidden)}

    def describe(self) -> str:
        return (f"linear_num_key_heads={self.num_k_heads}, linear_key_head_dim={self.head_k_dim}, "
                f"linear_num_value_heads={self.num_v_heads}, linear_value_head_dim={self.head_v_dim}")


def unpack_qkvz(w: np.ndarray, dims: GdnDims) -> tuple[np.ndarray, np.ndarray]:
    """``in_proj_qkvz.weight`` [Hk (2 dk + 2 r dv), D] -> (``in_proj_qkv.weight``
    [2 Hk dk + Hv dv, D], ``in_proj_z.weight`` [Hv dv, D]) (module docstring)."""
    Hk, dk, r, dv = dims.num_k_heads, dims.head_k_dim, dims.ratio, dims.head_v_dim
    D = w.shape[-1]
    per = w.reshape(Hk, 2 * dk + 2 * r * dv, D)
    q, k = per[:, :dk], per[:, dk:2 * dk]
    v, z = per[:, 2 * dk:2 * dk + r * dv], per[:, 2 * dk + r * dv:]
    qkv = np.concatenate([q.reshape(Hk * dk, D), k.reshape(Hk * dk, D), v.reshape(Hk * r * dv, D)])
    return np.ascontiguousarray(qkv), np.ascontiguousarray(z.reshape(Hk * r * dv, D))


def pack_qkvz(qkv: np.ndarray, z: np.ndarray, dims: GdnDims) -> np.ndarray:
    """Inverse of :func:`unpack_qkvz`."""
    Hk, dk, r, dv = dims.num_k_heads, dims.head_k_dim, dims.ratio, dims.head_v_dim
    D = qkv.shape[-1]
    kd = Hk * dk
    q = qkv[:kd].reshape(Hk, dk, D)
    k = qkv[kd:2 * kd].reshape(Hk, dk, D)
    v = qkv[2 * kd:].reshape(Hk, r * dv, D)
    per = np.concatenate([q, k, v, z.reshape(Hk, r * dv, D)], axis=1)
    return np.ascontiguousarray(per.reshape(-1, D))


def unpack_ba(w: np.ndarray, dims: GdnDims) -> tuple[np.ndarray, np.ndarray]:
    """``in_proj_ba.weight`` [Hk 2 r, D] -> (``in_proj_b.weight`` [Hv, D],
    ``in_proj_a.weight`` [Hv, D])."""
    Hk, r = dims.num_k_heads, dims.ratio
    per = w.reshape(Hk, 2 * r, w.shape[-1])
    return (np.ascontiguousarray(per[:, :r].reshape(Hk * r, -1)),
            np.ascontiguousarray(per[:, r:].reshape(Hk * r, -1)))


def pack_ba(b: np.ndarray, a: np.ndarray, dims: GdnDims) -> np.ndarray:
    """Inverse of :func:`unpack_ba`."""
    Hk, r = dims.num_k_heads, dims.ratio
    D = b.shape[-1]
    per = np.concatenate([b.reshape(Hk, r, D), a.reshape(Hk, r, D)], axis=1)
    return np.ascontiguousarray(per.reshape(-1, D))


def unpack_layer(tensors: Mapping[str, np.ndarray], prefix: str, dims: GdnDims, hidden: int,
                 what: str = "checkpoint") -> dict[str, np.ndarray]:
    """``tensors`` with GDN layer ``prefix``'s (``"model.layers.0.linear_attn."``) packed
    projections replaced by the unpacked ones; every other tensor passes through. A missing or
    mis-shaped packed tensor, or one stored beside its unpacked form, is a one-line
    CheckpointError naming it."""
    out = dict(tensors)
    for name, shape in dims.packed_shapes(hidden).items():
        full = f"{prefix}{name}.weight"
        if full not in out:
            raise CheckpointError(f"{what}: tensor {full} is missing (a qwen3_next GDN layer "
                                  f"stores its input projections packed: {', '.join(PACKED)})")
        if tuple(out[full].shape) != shape:
            raise CheckpointError(f"{what}: tensor {full} has shape {list(out[full].shape)}, "
                                  f"expected {list(shape)} (hidden_size={hidden}, {dims.describe()} "
                                  f"in config.json)")
    both = [f"{prefix}{n}.weight" for n in UNPACKED if f"{prefix}{n}.weight" in out]
    if both:
        raise CheckpointError(f"{what}: {both[0]} is stored beside {prefix}in_proj_qkvz.weight: a "
                              "qwen3_next layer stores its projections packed only")
    qkv, z = unpack_qkvz(out.pop(f"{prefix}in_proj_qkvz.weight"), dims)
    b, a = unpack_ba(out.pop(f"{prefix}in_proj_ba.weight"), dims)
    out.update({f"{prefix}in_proj_qkv.weight": qkv, f"{prefix}in_proj_z.weight": z,
                f"{prefix}in_proj_b.weight": b, f"{prefix}in_proj_a.weight": a})
    return out


def pack_layer(tensors: Mapping[str, np.ndarray], prefix: str, dims: GdnDims) -> dict[str, np.ndarray]:
    """Inverse of :func:`unpack_layer` (the tensors a ``qwen3_next`` checkpoint stores); the
    packed tensors take the unpacked ones' place in the order."""
    take = {n: tensors[f"{prefix}{n}.weight"] for n in UNPACKED}
    packed = {f"{prefix}in_proj_qkvz.weight": pack_qkvz(take["in_proj_qkv"], take["in_proj_z"], dims),
              f"{prefix}in_proj_ba.weight": pack_ba(take["in_proj_b"], take["in_proj_a"], dims)}
    out = {}
    for name, t in tensors.items():
        if name == f"{prefix}in_proj_qkv.weight":
            out.update(packed)
        elif not (name.startswith(prefix) and name[len(prefix):-len(".weight")] in UNPACKED):
            out[name] = t
    return out
