"""Dense (XLA) grouped-query attention with explicit visibility masks.

This is the reference path that the Pallas kernels (``kernels/``) are compared against. Keys
may come in several segments (the drafter's cached context and its own block rows) that share
one softmax, so no segment is ever concatenated with the (large) cache.

The drafter's training attention has two implementations with one meaning:
:func:`block_sparse_attention` (dense, the reference: every block's scores against every
context position at once) and :func:`chunked_block_sparse_attention` (chunks of blocks and of
context positions, online softmax, rematerialised: memory independent of N * S);
:func:`training_block_attention` picks the dense one when a single chunk covers everything.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


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
                        scale: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query attention over key/value segments joined under one softmax.

    Args:
      q: [B, T, H, Dh] queries.
      segments: (k, v, mask) triples; k, v: [B, S_i, Hkv, Dh]; mask: bool broadcastable to
        [B, T, S_i], True where query t may see key s. H must be a multiple of Hkv.
      scale: softmax scale, default ``Dh ** -0.5``.
      sinks: optional float[H], one learned logit per query head (gpt-oss's attention sinks):
        an extra column of every row's softmax with no value, dropped after it, so the row's
        probabilities over the keys sum to less than 1. None: no sink (the plain softmax).

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
    if sinks is not None:
        if sinks.shape != (H,):
            raise ValueError(f"sinks must have shape [{H}] (one per query head), got {sinks.shape}")
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, Hkv, H // Hkv, 1, 1),
                                (B, Hkv, H // Hkv, T, 1))
        scores.append(sink)
        masks.append(jnp.ones((1, 1, 1, 1, 1), bool))
    probs = joint_softmax(scores, masks)
    out = sum(jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v,
                         preferred_element_type=jnp.float32)
              for p, (_, v, _) in zip(probs, segments))  # a sink's column has no value: dropped
    return out.reshape(B, T, H, Dh).astype(q.dtype)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          scale: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """Single-segment :func:`segmented_attention`: q [B,T,H,Dh], k/v [B,S,Hkv,Dh], mask [B,T,S],
    optional ``sinks`` float[H]."""
    return segmented_attention(q, [(k, v, mask)], scale, sinks)


def causal_mask(query_positions: jax.Array, key_positions: jax.Array,
                window: int | None = None) -> jax.Array:
    """bool[B, T, S]: query t (at ``query_positions`` int[B, T]) sees key s (at
    ``key_positions`` int[B, S] or int[S], e.g. cache slots) when ``key <= query`` and, with a
    ``window``, ``key > query - window``: the ``window`` positions up to and including its own
    (transformers 5's sliding-window mask, ``kv_idx > q_idx - sliding_window``). None: causal
    only."""
    keys = key_positions if key_positions.ndim == 2 else key_positions[None]
    q = query_positions[:, :, None]
    k = keys[:, None, :]
    visible = k <= q
    if window is not None:
        visible = visible & (k > q - window)
    return visible


def sliding_masks(window, anchors: jax.Array, T: int, ctx_positions: jax.Array):
    """The extra visibility of a sliding drafter layer (SpecForge's DFlash mask with
    ``sliding_window`` = W): block row o of the block anchored at ``a`` (position ``a + o``)
    sees context positions ``t >= a + o - (W - 1)`` and the block rows at offsets ``<= o``.

    ``window``: W (int or int32 scalar, may be traced); W <= 0 is a full-attention layer
    (everything True). ``anchors`` int32[B, N]; ``ctx_positions`` int32[K]. Returns
    (ctx bool[B, N, T, K], blk bool[T, T]), to be and-ed with the full layer's masks."""
    window = jnp.asarray(window, jnp.int32)
    full = window <= 0
    offsets = jnp.arange(T, dtype=jnp.int32)
    low = anchors[:, :, None] + offsets[None, None, :] - (window - 1)  # [B, N, T]
    ctx = full | (ctx_positions[None, None, None, :] >= low[..., None])
    blk = full | (offsets[None, :] <= offsets[:, None])  # [query row, key row]
    return ctx, blk


def block_sparse_attention(q: jax.Array, k_ctx: jax.Array, v_ctx: jax.Array, k_blk: jax.Array,
                           v_blk: jax.Array, anchors: jax.Array, valid: jax.Array,
                           scale: float | None = None, window=None) -> jax.Array:
    """Training attention of many drafter blocks of one sequence (docs/method.md section 5).

    Block j (anchor ``a_j``) sees context rows at positions ``t < a_j`` (strictly) and every row
    of its own block, nothing of other blocks; a padding block (``valid`` False) sees nothing
    and returns zeros. Visibility is derived from ``anchors`` inside the attention: no
    [N*bs, S + N*bs] mask is built. ``window`` (None: full attention): a sliding layer's W,
    which further restricts row o to context positions ``>= a_j + o - (W - 1)`` and to its
    block's rows ``<= o`` (:func:`sliding_masks`; W <= 0 means full, so a traced per-layer
    value may select either).

    Args:
      q: [B, N, T, H, Dh] block queries (N blocks of T rows).
      k_ctx, v_ctx: [B, S, Hkv, Dh] context keys/values at positions 0..S-1.
      k_blk, v_blk: [B, N, T, Hkv, Dh] the blocks' own keys/values.
      anchors: int32[B, N]; valid: bool[B, N].
    Returns:
      [B, N, T, H, Dh] in q's dtype (scores, softmax and sums in float32, float64 for float64
      inputs).
    """
    B, N, T, H, Dh = q.shape
    S, Hkv = k_ctx.shape[1], k_ctx.shape[2]
    scale = Dh ** -0.5 if scale is None else scale
    acc = jnp.promote_types(q.dtype, jnp.float32)
    qg = q.reshape(B, N, T, Hkv, H // Hkv, Dh)
    s_ctx = jnp.einsum("bntkgd,bskd->bkgnts", qg, k_ctx, preferred_element_type=acc) * scale
    s_blk = jnp.einsum("bntkgd,bnskd->bkgnts", qg, k_blk, preferred_element_type=acc) * scale
    m_ctx = ((jnp.arange(S)[None, None, :] < anchors[:, :, None]) & valid[:, :, None])
    m_ctx = m_ctx[:, None, None, :, None, :]  # [B, 1, 1, N, 1, S]
    m_blk = valid[:, None, None, :, None, None]  # [B, 1, 1, N, 1, 1]
    if window is not None:
        w_ctx, w_blk = sliding_masks(window, anchors, T, jnp.arange(S, dtype=jnp.int32))
        m_ctx = m_ctx & w_ctx[:, None, None]  # [B, 1, 1, N, T, S]
        m_blk = m_blk & w_blk  # [B, 1, 1, N, T, T]
    p_ctx, p_blk = joint_softmax([jnp.where(m_ctx, s_ctx, -jnp.inf), jnp.where(m_blk, s_blk, -jnp.inf)],
                                 [m_ctx, m_blk])
    out = (jnp.einsum("bkgnts,bskd->bntkgd", p_ctx.astype(v_ctx.dtype), v_ctx,
                      preferred_element_type=acc)
           + jnp.einsum("bkgnts,bnskd->bntkgd", p_blk.astype(v_blk.dtype), v_blk,
                        preferred_element_type=acc))
    return out.reshape(B, N, T, H, Dh).astype(q.dtype)


DEFAULT_ANCHOR_CHUNK = 64
"""Blocks per anchor chunk of the memory-efficient training attention: 64 blocks of 16 rows
are 1024 query rows per head, a full-size matmul tile on a GPU, and at the paper's 512 anchors
only 8 anchor chunks (little loop overhead). Every CPU-scale setting of this project (<= 32
anchors) stays on the dense path."""
DEFAULT_CONTEXT_CHUNK = 1024
"""Context positions per context chunk: with 64 x 16 query rows one chunk's scores are
H * 1024 * 1024 float32 (134 MB for Qwen3-8B's 32 heads, one sequence) instead of
H * N * T * S (3.2 GB at 512 anchors and length 3072); the paper's length 3072 takes 3 chunks.
Every CPU-scale setting (length <= 1024) stays on the dense path."""


def check_chunk(name: str, value) -> int:
    """``value`` as a chunk size: an integer >= 1 (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """``x`` padded with ``value`` at the end of ``axis`` to length ``size``."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


def _online_update(state, s, mask, v, spec: str):
    """One segment of an online (flash-style) softmax: ``state`` = (running max m, running sum l
    [B, Hkv, g, n, T], running output acc [B, Hkv, g, n, T, Dh], all float32, or float64 for
    float64 inputs), scores ``s`` [B, Hkv, g, n, T, K] (the same dtype), ``mask`` broadcastable
    to ``s``, values ``v`` joined to the probabilities by the einsum ``spec``. The max is a
    stabiliser only (the result does not depend on it), so no gradient flows through it."""
    m, l, acc = state
    s = jnp.where(mask, s, -jnp.inf)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(s, -1)))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # a row that saw nothing yet: any finite
    alpha = jnp.exp(m - m_safe)  # m = -inf (nothing seen before): 0
    p = jnp.where(mask, jnp.exp(s - m_safe[..., None]), 0.0)
    l = alpha * l + jnp.sum(p, -1)
    acc = alpha[..., None] * acc + jnp.einsum(spec, p.astype(v.dtype), v,
                                              preferred_element_type=acc.dtype)
    return m_new, l, acc


def chunked_block_sparse_attention(q: jax.Array, k_ctx: jax.Array, v_ctx: jax.Array,
                                   k_blk: jax.Array, v_blk: jax.Array, anchors: jax.Array,
                                   valid: jax.Array, scale: float | None = None, *,
                                   anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                                   context_chunk: int = DEFAULT_CONTEXT_CHUNK,
                                   window=None) -> jax.Array:
    """:func:`block_sparse_attention` without its [B, H, N, T, S] scores: the same visibility
    (``window`` included) and result (up to float rounding), in memory that does not grow with
    N * S.

    The N blocks are cut into chunks of ``anchor_chunk`` blocks (``lax.map``); each chunk first
    attends to its own blocks' rows, then walks the context in chunks of ``context_chunk``
    positions (``lax.scan``) with an online softmax: running max, running sum and running output
    in float32, the output divided by the sum at the end. Both loop bodies are rematerialised
    (``jax.checkpoint``), so the backward pass keeps only the running state of one anchor chunk
    at a time (one [B, Hkv, g, anchor_chunk, T, Dh] float32 output per context chunk) and
    recomputes the scores of one (anchor chunk, context chunk) pair at a time: peak scores
    ``B * H * anchor_chunk * T * context_chunk`` float32. A context chunk that starts at or past
    every valid anchor of the anchor chunk (in every sequence of the batch) is skipped
    (``lax.cond``; it would be wholly masked): with sorted anchors, about half of the pairs.
    N and S need not be multiples of the chunks: padding blocks (invalid) and padding
    positions (invisible) fill the last chunk and are cut off again.

    Args:
      q, k_ctx, v_ctx, k_blk, v_blk, anchors, valid, scale: as :func:`block_sparse_attention`
        (q [B, N, T, H, Dh], k_ctx/v_ctx [B, S, Hkv, Dh], k_blk/v_blk [B, N, T, Hkv, Dh],
        anchors int32[B, N], valid bool[B, N]).
      anchor_chunk: blocks per anchor chunk (>= 1).
      context_chunk: context positions per context chunk (>= 1).
    Returns:
      [B, N, T, H, Dh] in q's dtype; a padding block gets zeros (its gradients too, never NaN).
    """
    ca = check_chunk("anchor_chunk", anchor_chunk)
    cc = check_chunk("context_chunk", context_chunk)
    B, N, T, H, Dh = q.shape
    S, Hkv = k_ctx.shape[1], k_ctx.shape[2]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    g = H // Hkv
    scale = Dh ** -0.5 if scale is None else scale
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)  # float32 (float64 for float64 inputs)
    nA, nC = -(-N // ca), -(-S // cc)
    Np, Sp = nA * ca, nC * cc

    def by_anchor_chunk(x):  # [B, N, ...] -> [nA, B, ca, ...] (padded)
        x = _pad_axis(x, 1, Np)
        return jnp.moveaxis(x.reshape(B, nA, ca, *x.shape[2:]), 1, 0)

    def by_context_chunk(x):  # [B, S, ...] -> [nC, B, cc, ...] (padded)
        x = _pad_axis(x, 1, Sp)
        return jnp.moveaxis(x.reshape(B, nC, cc, *x.shape[2:]), 1, 0)

    anchors = jnp.asarray(anchors, jnp.int32)
    valid = jnp.asarray(valid, bool)
    xs = (by_anchor_chunk(q.reshape(B, N, T, Hkv, g, Dh)), by_anchor_chunk(k_blk),
          by_anchor_chunk(v_blk), by_anchor_chunk(anchors), by_anchor_chunk(valid))
    ctx = (by_context_chunk(k_ctx), by_context_chunk(v_ctx), jnp.arange(nC, dtype=jnp.int32) * cc)

    def context_step(state, chunk, qg, anchors_c, valid_c):
        """One context chunk (positions start .. start+cc-1) into the running state."""
        k, v, start = chunk

        def attend(state):
            s = jnp.einsum("bntkgd,bskd->bkgnts", qg, k, preferred_element_type=acc_dtype) * scale
            pos = start + jnp.arange(cc, dtype=jnp.int32)
            m = ((pos[None, None, :] < anchors_c[:, :, None]) & (pos < S)[None, None, :]
                 & valid_c[:, :, None])[:, None, None, :, None, :]  # [B, 1, 1, ca, 1, cc]
            if window is not None:  # [B, 1, 1, ca, T, cc]
                m = m & sliding_masks(window, anchors_c, T, pos)[0][:, None, None]
            return _online_update(state, s, m, v, "bkgnts,bskd->bkgntd")

        # a chunk starting at or past every valid anchor of the anchor chunk is wholly masked
        seen = start < jnp.max(jnp.where(valid_c, anchors_c, 0))
        return jax.lax.cond(seen, attend, lambda st: st, state), None

    context_step = jax.checkpoint(context_step, prevent_cse=False)

    def anchor_chunk_fn(chunk):
        """The ``ca`` blocks of one anchor chunk: [B, ca, T, H, Dh] (``acc_dtype``)."""
        qg, kb, vb, anchors_c, valid_c = chunk
        shape = (B, Hkv, g, ca, T)
        state = (jnp.full(shape, -jnp.inf, acc_dtype), jnp.zeros(shape, acc_dtype),
                 jnp.zeros((*shape, Dh), acc_dtype))
        s = jnp.einsum("bntkgd,bnskd->bkgnts", qg, kb, preferred_element_type=acc_dtype) * scale
        m_blk = valid_c[:, None, None, :, None, None]
        if window is not None:  # causal in the block
            m_blk = m_blk & sliding_masks(window, anchors_c, T, jnp.zeros((0,), jnp.int32))[1]
        state = _online_update(state, s, m_blk, vb, "bkgnts,bnskd->bkgntd")
        (_, l, acc), _ = jax.lax.scan(
            lambda st, c: context_step(st, c, qg, anchors_c, valid_c), state, ctx)
        out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # a padding block: 0 / 1
        return jnp.einsum("bkgntd->bntkgd", out).reshape(B, ca, T, H, Dh)

    out = jax.lax.map(jax.checkpoint(anchor_chunk_fn, prevent_cse=False), xs)  # [nA, B, ca, T, H, Dh]
    out = jnp.moveaxis(out, 0, 1).reshape(B, Np, T, H, Dh)[:, :N]
    return out.astype(q.dtype)


def training_block_attention(q: jax.Array, k_ctx: jax.Array, v_ctx: jax.Array, k_blk: jax.Array,
                             v_blk: jax.Array, anchors: jax.Array, valid: jax.Array,
                             scale: float | None = None, *,
                             anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                             context_chunk: int = DEFAULT_CONTEXT_CHUNK,
                             window=None) -> jax.Array:
    """The drafter's training attention (arguments as :func:`chunked_block_sparse_attention`):
    the dense :func:`block_sparse_attention` when one chunk covers everything (N <=
    ``anchor_chunk`` and S <= ``context_chunk``: the same program, bitwise, as before the
    chunked path existed), else :func:`chunked_block_sparse_attention`. ``window``: None for
    full attention, else a sliding layer's W (:func:`block_sparse_attention`)."""
    anchor_chunk = check_chunk("anchor_chunk", anchor_chunk)
    context_chunk = check_chunk("context_chunk", context_chunk)
    if q.shape[1] <= anchor_chunk and k_ctx.shape[1] <= context_chunk:
        return block_sparse_attention(q, k_ctx, v_ctx, k_blk, v_blk, anchors, valid, scale,
                                      window=window)
    return chunked_block_sparse_attention(q, k_ctx, v_ctx, k_blk, v_blk, anchors, valid, scale,
                                          anchor_chunk=anchor_chunk, context_chunk=context_chunk,
                                          window=window)


ATTENTION_IMPLS = ("xla", "pallas", "triton")


def check_attention_impl(impl: str) -> str:
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    return impl


def pallas_block_attention(q, k_cache, v_cache, kv_lens, *, causal: bool, layer=None, k_blk=None,
                           v_blk=None, blk_mask=None):
    """The Pallas kernel of ``kernels.block_attention``: compiled (Triton) where the program is
    lowered for a GPU, interpreted elsewhere. The choice is made per lowering platform, so a
    program traced on a CPU host and lowered for CUDA holds the compiled kernel.

    q [B, T, H, Dh]; k_cache, v_cache: the stacked cache [L, B, S, Hkv, Dh], read in place at
    ``layer``; kv_lens int32[B]; k_blk, v_blk [B, T, Hkv, Dh] (non-causal only); blk_mask
    bool[B, T, T] or None (non-causal only: query t sees block row j where True; tree verify's
    ancestor mask). Returns [B, T, H, Dh]."""
    from dflash_jax.kernels.block_attention import block_attention

    def kernel(interpret: bool):
        return lambda q, k, v, lens, kb, vb, layer, mask: block_attention(
            q, k, v, lens, kb, vb, causal=causal, blk_mask=mask, layer=layer, interpret=interpret)

    return jax.lax.platform_dependent(q, k_cache, v_cache, kv_lens, k_blk, v_blk, layer, blk_mask,
                                      cuda=kernel(False), rocm=kernel(False), default=kernel(True))


def triton_block_attention(q, k_cache, v_cache, kv_lens, *, causal: bool, layer=None, k_blk=None,
                           v_blk=None, blk_mask=None):
    """The Triton kernel of ``kernels.triton_block_attention`` through jax-triton on a GPU; off a
    GPU, the same kernel in Triton's interpreter (slow; needs torch). Same arguments and result
    as :func:`pallas_block_attention`."""
    from dflash_jax.kernels.triton_block_attention import block_attention_triton

    return block_attention_triton(q, k_cache, v_cache, kv_lens, k_blk, v_blk, causal=causal,
                                  blk_mask=blk_mask, layer=layer,
                                  interpret=jax.default_backend() != "gpu")


BLOCK_ATTENTION = {"pallas": pallas_block_attention, "triton": triton_block_attention}
"""attention_impl -> the kernel the models call for block attention over their cache"""
