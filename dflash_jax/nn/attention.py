"""Dense (XLA) grouped-query attention with explicit visibility masks.

This is the reference path that the Pallas kernels (``kernels/``) are compared against. Keys
may come in several segments (the drafter's cached context and its own block rows) that share
one softmax, so no segment is ever concatenated with the (large) cache.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def joint_softmax(scores: Sequence[jax.Array], masks: Sequence[jax.Array]) -> list[jax.Array]:
    """Softmax over the last axis of several masked score arrays taken together.

    ``scores[i]`` [..., S_i] (already -inf where masked) with ``masks[i]`` broadcastable to it.
    Rows that see nothing in any segment get all-zero probabilities instead of NaN."""
    row_max = jnp.max(jnp.concatenate([jnp.max(s, -1, keepdims=True) for s in scores], -1), -1,
                      keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = [jnp.where(m, jnp.exp(s - row_max), 0.0) for s, m in zip(scores, masks)]
    denom = sum(jnp.sum(p, axis=-1, keepdims=True) for p in probs)
    denom = jnp.where(denom > 0, denom, 1.0)
    return [p / denom for p in probs]


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
    probs = joint_softmax(scores, masks)
    out = sum(jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v,
                         preferred_element_type=jnp.float32)
              for p, (_, v, _) in zip(probs, segments))
    return out.reshape(B, T, H, Dh).astype(q.dtype)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          scale: float | None = None) -> jax.Array:
    """Single-segment :func:`segmented_attention`: q [B,T,H,Dh], k/v [B,S,Hkv,Dh], mask [B,T,S]."""
    return segmented_attention(q, [(k, v, mask)], scale)


def block_sparse_attention(q: jax.Array, k_ctx: jax.Array, v_ctx: jax.Array, k_blk: jax.Array,
                           v_blk: jax.Array, anchors: jax.Array, valid: jax.Array,
                           scale: float | None = None) -> jax.Array:
    """Training attention of many drafter blocks of one sequence (SPEC section 5).

    Block j (anchor ``a_j``) sees context rows at positions ``t < a_j`` (strictly) and every row
    of its own block, nothing of other blocks; a padding block (``valid`` False) sees nothing
    and returns zeros. Visibility is derived from ``anchors`` inside the attention: no
    [N*bs, S + N*bs] mask is built.

    Args:
      q: [B, N, T, H, Dh] block queries (N blocks of T rows).
      k_ctx, v_ctx: [B, S, Hkv, Dh] context keys/values at positions 0..S-1.
      k_blk, v_blk: [B, N, T, Hkv, Dh] the blocks' own keys/values.
      anchors: int32[B, N]; valid: bool[B, N].
    Returns:
      [B, N, T, H, Dh] in q's dtype.
    """
    B, N, T, H, Dh = q.shape
    S, Hkv = k_ctx.shape[1], k_ctx.shape[2]
    scale = Dh ** -0.5 if scale is None else scale
    qg = q.reshape(B, N, T, Hkv, H // Hkv, Dh)
    s_ctx = jnp.einsum("bntkgd,bskd->bkgnts", qg, k_ctx, preferred_element_type=jnp.float32) * scale
    s_blk = jnp.einsum("bntkgd,bnskd->bkgnts", qg, k_blk, preferred_element_type=jnp.float32) * scale
    m_ctx = ((jnp.arange(S)[None, None, :] < anchors[:, :, None]) & valid[:, :, None])
    m_ctx = m_ctx[:, None, None, :, None, :]  # [B, 1, 1, N, 1, S]
    m_blk = valid[:, None, None, :, None, None]  # [B, 1, 1, N, 1, 1]
    p_ctx, p_blk = joint_softmax([jnp.where(m_ctx, s_ctx, -jnp.inf), jnp.where(m_blk, s_blk, -jnp.inf)],
                                 [m_ctx, m_blk])
    out = (jnp.einsum("bkgnts,bskd->bntkgd", p_ctx.astype(v_ctx.dtype), v_ctx,
                      preferred_element_type=jnp.float32)
           + jnp.einsum("bkgnts,bnskd->bntkgd", p_blk.astype(v_blk.dtype), v_blk,
                        preferred_element_type=jnp.float32))
    return out.reshape(B, N, T, H, Dh).astype(q.dtype)


ATTENTION_IMPLS = ("xla", "pallas", "triton")


def check_attention_impl(impl: str) -> str:
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    return impl


def pallas_block_attention(q, k_cache, v_cache, kv_lens, *, causal: bool, layer=None, k_blk=None,
                           v_blk=None):
    """The Pallas kernel of ``kernels.block_attention``: compiled (Triton) where the program is
    lowered for a GPU, interpreted elsewhere. The choice is made per lowering platform, so a
    program traced on a CPU host and lowered for CUDA holds the compiled kernel.

    q [B, T, H, Dh]; k_cache, v_cache: the stacked cache [L, B, S, Hkv, Dh], read in place at
    ``layer``; kv_lens int32[B]; k_blk, v_blk [B, T, Hkv, Dh] (non-causal only). Returns
    [B, T, H, Dh]."""
    from kernels.block_attention import block_attention

    def kernel(interpret: bool):
        return lambda q, k, v, lens, kb, vb, layer: block_attention(
            q, k, v, lens, kb, vb, causal=causal, layer=layer, interpret=interpret)

    return jax.lax.platform_dependent(q, k_cache, v_cache, kv_lens, k_blk, v_blk, layer,
                                      cuda=kernel(False), rocm=kernel(False), default=kernel(True))


def triton_block_attention(q, k_cache, v_cache, kv_lens, *, causal: bool, layer=None, k_blk=None,
                           v_blk=None):
    """The Triton kernel of ``kernels.triton_block_attention`` through jax-triton on a GPU; off a
    GPU, the same kernel in Triton's interpreter (slow; needs torch). Same arguments and result
    as :func:`pallas_block_attention`."""
    from kernels.triton_block_attention import block_attention_triton

    return block_attention_triton(q, k_cache, v_cache, kv_lens, k_blk, v_blk, causal=causal,
                                  layer=layer, interpret=jax.default_backend() != "gpu")


BLOCK_ATTENTION = {"pallas": pallas_block_attention, "triton": triton_block_attention}
"""attention_impl -> the kernel the models call for block attention over their cache"""
