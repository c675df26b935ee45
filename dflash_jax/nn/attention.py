"""Dense (XLA) grouped-query attention with explicit visibility masks.

This is the reference path that the Pallas kernels (``kernels/``) are compared against. Keys
may come in several segments (the drafter's cached context and its own block rows) that share
one softmax, so no segment is ever concatenated with the (large) cache.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def segmented_attention(q: jax.Array, segments: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
                        scale: float | None = None) -> jax.Array:
    """Grouped-query attention over key/value segments joined under one softmax.

    Args:
      q: [B, T, H, Dh] queries.
      segments: (k, v, mask) triples; k, v: [B, S_i, Hkv, Dh]; mask: bool broadcastable to
        [B, T, S_i], True where query t may see key s. H must be a multiple of Hkv.
      scale: softmax scale, default ``Dh ** -0.5``.

    Returns:
      [B, T, H, Dh] in q's dtype. A query that sees nothing gets zeros (never NaN).
    """
    B, T, H, Dh = q.shape
    Hkv = segments[0][0].shape[2]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    scale = Dh ** -0.5 if scale is None else scale
    qg = q.reshape(B, T, Hkv, H // Hkv, Dh)
    scores, masks = [], []
    for k, v, mask in segments:
        s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
        m = jnp.broadcast_to(mask, (B, T, k.shape[1]))[:, None, None, :, :]
        scores.append(jnp.where(m, s, -jnp.inf))
        masks.append(m)
    row_max = jnp.max(jnp.concatenate([jnp.max(s, -1, keepdims=True) for s in scores], -1), -1,
                      keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = [jnp.where(m, jnp.exp(s - row_max), 0.0) for s, m in zip(scores, masks)]
    denom = sum(jnp.sum(p, axis=-1, keepdims=True) for p in probs)
    denom = jnp.where(denom > 0, denom, 1.0)
    out = sum(jnp.einsum("bkgts,bskd->btkgd", (p / denom).astype(v.dtype), v,
                         preferred_element_type=jnp.float32)
              for p, (_, v, _) in zip(probs, segments))
    return out.reshape(B, T, H, Dh).astype(q.dtype)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          scale: float | None = None) -> jax.Array:
    """Single-segment :func:`segmented_attention`: q [B,T,H,Dh], k/v [B,S,Hkv,Dh], mask [B,T,S]."""
    return segmented_attention(q, [(k, v, mask)], scale)
