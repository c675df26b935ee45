"""Dense (XLA) grouped-query attention with an explicit visibility mask.

This is the reference path that the Pallas kernels (``kernels/``) are compared against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          scale: float | None = None) -> jax.Array:
    """Grouped-query attention.

    Args:
      q: [B, T, H, Dh] queries.
      k, v: [B, S, Hkv, Dh] keys and values; H must be a multiple of Hkv.
      mask: bool[B, T, S], True where query t may see key s.
      scale: softmax scale, default ``Dh ** -0.5``.

    Returns:
      [B, T, H, Dh] in q's dtype. A query that sees nothing gets zeros (never NaN).
    """
    B, T, H, Dh = q.shape
    Hkv = k.shape[2]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    scale = Dh ** -0.5 if scale is None else scale
    qg = q.reshape(B, T, Hkv, H // Hkv, Dh)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    m = mask[:, None, None, :, :]
    scores = jnp.where(m, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    p = jnp.where(m, jnp.exp(scores - row_max), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.reshape(B, T, H, Dh).astype(q.dtype)
