"""Block attention against a KV cache: a Pallas kernel (Triton lowering on GPU) and its plain
``jnp`` reference, with the same signature.

One call attends a block of T queries ``q [B, T, H, Dh]`` to a cache
``k, v [B, S_max, Hkv, Dh]`` whose row b holds ``kv_lens[b]`` valid positions, in one of two modes:

* ``causal=True`` (target verify, and decode with T = 1): the block's own K/V have already
  been written into the cache at slots ``kv_lens[b] + t``; query t sees slots
  ``s < kv_lens[b] + t + 1``.
* ``causal=False`` (the DFlash drafter): query t sees the valid context slots
  ``s < kv_lens[b]`` and every row of the block's own ``k_blk, v_blk [B, T, Hkv, Dh]``
  (non-causal; docs/method.md section 3), which are not in the cache.
* ``causal=False`` with ``blk_mask`` bool[B, T, T] (tree verify, docs/trees.md): as the drafter,
  but query t sees block row j only where ``blk_mask[b, t, j]`` (its ancestors and itself in a
  tree of T nodes, ``verification.tree.ancestor_mask``). The kernel folds the mask like the queries
  (row r of a tile is query r // G) and loads it as one int8 tile per program.

Kernel layout. The grid is ``(B, Hkv, num_splits)``. GQA is folded into the rows of one tile:
the T queries of the G = H / Hkv heads that share a KV head become ``T * G`` rows (padded to a
power of two >= 16), so the drafter's 16-row block with G = 4 is one 64-row tensor-core tile and
each K/V tile is read once for all of them. T is not bounded: a block of more than
``MAX_ROWS`` = 64 folded rows (a prefill, or a drafter block with many query heads per KV head)
runs as chunks of ``max(1, 64 // G)`` queries (:func:`in_query_chunks`; the tests check
chunked blocks against the reference in both modes). The cache is split along S into ``num_splits``
chunks processed in parallel (flash-decoding); each chunk loops over ``block_k`` tiles up to
the row's valid length only (so a short row reads a short prefix), keeps an online softmax
(running max m, sum l, unnormalised accumulator), and a small ``jnp`` combine step merges the
chunks. A row that sees nothing returns zeros, never NaN.

Backend note: the Pallas Triton backend is deprecated from jax 0.11 (it still works there); the
kernel sits behind ``attention_impl="pallas"`` so a Mosaic GPU version can replace it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .tuning import choose_launch

NEG = -1e30  # finite "minus infinity": masked scores never produce inf - inf
# query rows (T x query heads per KV head) of one program: the drafter's 16-row block with 4 query
# heads per KV head fills it. A longer causal block (a prefill) is split into query chunks: one
# 2048-row tile asked the H100 for 576 KiB of shared memory (227 KiB is the most a block gets).
MAX_ROWS = 64


# ---------------------------------------------------------------------------- reference
def block_attention_reference(q, k, v, kv_lens, k_blk=None, v_blk=None, *, causal: bool,
                              scale: float | None = None, blk_mask=None, **_unused):
    """Dense ``jnp`` version of :func:`block_attention` (same arguments, same result): the
    scores of every visible key (cache slots, then the block's own rows) under one softmax.
    q [B, T, H, Dh]; k, v [B, S, Hkv, Dh] (one layer); kv_lens int32[B]; k_blk, v_blk
    [B, T, Hkv, Dh] or None; blk_mask bool[B, T, T] or None (query t sees block row j where
    True; None: every row). Returns [B, T, H, Dh] in q's dtype; a row that sees nothing is 0."""
    _check(q, k, v, kv_lens, k_blk, v_blk, causal, blk_mask)
    B, T, H, Dh = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    scale = Dh ** -0.5 if scale is None else scale
    limit_BxT = kv_lens[:, None] + (jnp.arange(T)[None, :] + 1 if causal else jnp.zeros((1, T), int))
    visible_BxTxS = jnp.arange(S)[None, None, :] < limit_BxT[:, :, None]  # slots < limit
    if k_blk is not None:  # every query sees every row of its own block (or blk_mask's rows)
        k, v = jnp.concatenate([k, k_blk], axis=1), jnp.concatenate([v, v_blk], axis=1)
        own = jnp.ones((B, T, T), bool) if blk_mask is None else blk_mask.astype(bool)
        visible_BxTxS = jnp.concatenate([visible_BxTxS, own], axis=-1)
    q_grouped = q.reshape(B, T, Hkv, H // Hkv, Dh)  # the H // Hkv query heads of each KV head
    scores = jnp.einsum("btkgd,bskd->bkgts", q_grouped, k, preferred_element_type=jnp.float32) * scale
    visible = visible_BxTxS[:, None, None]  # [B, 1, 1, T, S']
    row_max = jnp.max(jnp.where(visible, scores, -jnp.inf), axis=-1, keepdims=True)
    probs = jnp.where(visible, jnp.exp(scores - jnp.where(jnp.isfinite(row_max), row_max, 0.0)), 0.0)
    denom = jnp.sum(probs, axis=-1, keepdims=True)
    probs = probs / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, H, Dh).astype(q.dtype)


def _check(q, k, v, kv_lens, k_blk, v_blk, causal, blk_mask=None):
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [B,T,H,Dh] and k, v [B,S,Hkv,Dh]; got {q.shape}, {k.shape}, {v.shape}")
    B, T, H, Dh = q.shape
    if k.shape[0] != B or k.shape[3] != Dh or H % k.shape[2]:
        raise ValueError(f"q {q.shape} and cache {k.shape} disagree (batch, head_dim, or heads not a "
                         "multiple of kv heads)")
    if kv_lens.shape != (B,):
        raise ValueError(f"kv_lens must have shape ({B},), got {kv_lens.shape}")
    if causal and k_blk is not None:
        raise ValueError("causal mode reads the block from the cache: pass k_blk=None")
    if k_blk is not None and (k_blk.shape != (B, T, k.shape[2], Dh) or v_blk is None
                              or v_blk.shape != k_blk.shape):
        raise ValueError(f"k_blk / v_blk must have shape {(B, T, k.shape[2], Dh)}")
    if blk_mask is not None:
        if causal or k_blk is None:
            raise ValueError("blk_mask restricts the block's own rows k_blk, v_blk, which only the "
                             "non-causal mode has: pass causal=False with k_blk, v_blk (tree "
                             "verify), or blk_mask=None")
        if blk_mask.shape != (B, T, T):
            raise ValueError(f"blk_mask must have shape {(B, T, T)} ([batch, query, block row] "
                             f"for T = {T} queries), got {tuple(blk_mask.shape)}")


# ---------------------------------------------------------------------------- kernel
def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _dot(a, b, *, trans_b: bool = False, exact: bool):
    """a @ b (or a @ b.T) of 2-D tiles with float32 accumulation, as the removed ``pl.dot`` did
    (jax 0.12 dropped it; ``lax.dot_general`` lowers to ``tt.dot`` in every version we support).
    ``exact`` asks for full float32 products (no TF32 on the GPU)."""
    return jax.lax.dot_general(
        a, b, dimension_numbers=(((1,), (1 if trans_b else 0,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST if exact else None, preferred_element_type=jnp.float32)


def _kernel(layer_ref, lens_ref, q_ref, k_ref, v_ref, *rest, causal, has_blk, has_mask, scale,
            block_k, tiles_per_split, group, num_queries, num_blk, exact):
    if has_mask:
        kb_ref, vb_ref, mask_ref, o_ref, m_ref, l_ref = rest
    elif has_blk:
        kb_ref, vb_ref, o_ref, m_ref, l_ref = rest
    else:
        o_ref, m_ref, l_ref = rest
    b, g, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows, dh = q_ref.shape
    layer = layer_ref[0]
    kv_len = lens_ref[0]
    q = q_ref[...]
    t = jnp.arange(rows) // group  # query index of each row (rows past T*G are padding)
    limit = kv_len + (t + 1 if causal else jnp.zeros_like(t))  # [rows]: slots < limit are visible
    max_limit = kv_len + (num_queries if causal else 0)
    dot = functools.partial(_dot, trans_b=True, exact=exact)

    def update(scores, mask, vals, carry):
        acc, m, l = carry
        scores = jnp.where(mask, scores * scale, NEG)
        m_new = jnp.maximum(m, jnp.max(scores, axis=1))
        corr = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(scores - m_new[:, None]), 0.0)
        acc = acc * corr[:, None] + _dot(p.astype(vals.dtype), vals, exact=exact)
        return acc, m_new, l * corr + jnp.sum(p, axis=1)

    first = split * tiles_per_split
    needed = (max_limit + block_k - 1) // block_k  # tiles holding any visible slot
    n_tiles = jnp.clip(needed - first, 0, tiles_per_split)

    def body(i, carry):
        start = (first + i) * block_k
        kt = k_ref[layer, b, pl.ds(start, block_k), g, :]  # the full cache stays in place
        vt = v_ref[layer, b, pl.ds(start, block_k), g, :]
        cols = start + jnp.arange(block_k)
        return update(dot(q, kt), cols[None, :] < limit[:, None], vt, carry)

    carry = (jnp.zeros((rows, dh), jnp.float32), jnp.full((rows,), NEG, jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    carry = jax.lax.fori_loop(0, n_tiles, body, carry)
    if has_blk:  # the block's own rows, counted once (by split 0)
        kb, vb = kb_ref[...], vb_ref[...]
        cols = jnp.arange(kb.shape[0])
        mask = (cols[None, :] < num_blk) & (split == 0) & (t[:, None] < num_queries)
        if has_mask:  # folded [rows, Tb] int8: row r is query r // G (padding rows and cols 0)
            mask = mask & (mask_ref[...] != 0)
        carry = update(dot(q, kb), mask, vb, carry)
    acc, m, l = carry
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def block_attention(q, k, v, kv_lens, k_blk=None, v_blk=None, *, causal: bool,
                    blk_mask=None, scale: float | None = None, layer=None, block_k: int | None = None,
                    num_splits: int | None = None, interpret: bool = False,
                    num_warps: int | None = None, num_stages: int | None = None):
    """Pallas block attention (see the module docstring for the masking modes: causal, non-causal, tree).

    Args:
      q: [B, T, H, Dh]; k, v: [B, S, Hkv, Dh] cache, or the stacked cache of all layers
        [L, B, S, Hkv, Dh] with ``layer`` (an int or int32 scalar) choosing one: the kernel
        reads that layer in place, so no per-layer copy of the cache is made.
      kv_lens: int32[B] valid slots per row.
      k_blk, v_blk: [B, T, Hkv, Dh] the block's own K/V (non-causal mode only).
      blk_mask: bool[B, T, T] or None (non-causal mode only): query t sees block row j only where
        ``blk_mask[b, t, j]`` (tree verify: the ancestor mask); None: every block row.
      scale: softmax scale (default Dh ** -0.5).
      block_k: cache tile; num_splits: chunks of S processed in parallel; num_warps,
        num_stages: Triton launch parameters. Each one left None is chosen per shape and device
        by ``kernels.tuning.choose_launch`` (splits that fill the GPU's SMs, tiles that compile
        without register spills).
      interpret: run the kernel in the Pallas interpreter (CPU tests).
    Returns:
      [B, T, H, Dh] in q's dtype.
    """
    if k.ndim == 4:
        k, v, layer = k[None], v[None], 0
    elif layer is None:
        raise ValueError("a stacked [L, B, S, Hkv, Dh] cache needs layer=")
    layer_shape = jax.ShapeDtypeStruct(k.shape[1:], k.dtype)  # one layer's cache, for the checks
    _check(q, layer_shape, jax.ShapeDtypeStruct(v.shape[1:], v.dtype), kv_lens, k_blk, v_blk, causal,
           blk_mask)
    # Under jit so that tracing sees one removable call: jax <= 0.11 never dead-code-eliminates
    # a bare pallas_call, and flax >= 0.12.9 (which needs jax >= 0.11.1) DCEs the body of
    # nn.scan to check its broadcast inputs, so a bare kernel in a scanned layer fails there
    # ("broadcasted variable has a data dependency on the scan body"); a jit call is removable.
    call = functools.partial(_block_attention, k=k, v=v, k_blk=k_blk, v_blk=v_blk, layer=layer,
                             causal=causal, scale=None if scale is None else float(scale),
                             block_k=block_k, num_splits=num_splits, interpret=interpret,
                             num_warps=num_warps, num_stages=num_stages)
    if blk_mask is None:
        return in_query_chunks(lambda q_c, lens_c: call(q_c, kv_lens=lens_c), q, kv_lens,
                               causal=causal, group=q.shape[2] // k.shape[3])
    return in_query_chunks(lambda q_c, lens_c, mask_c: call(q_c, kv_lens=lens_c, blk_mask=mask_c),
                           q, kv_lens, blk_mask, causal=causal, group=q.shape[2] // k.shape[3])


def in_query_chunks(call, q, kv_lens, *per_query, causal: bool, group: int,
                    max_rows: int = MAX_ROWS):
    """``call(q_chunk, kv_lens_chunk, *per_query_chunks)`` over chunks of the T queries of q
    [B, T, H, Dh] that hold at most ``max_rows`` folded rows (queries x ``group`` heads per KV
    head) each, concatenated along T; one call when the whole block fits. For a long block (a
    prefill, or a drafter block with many query heads per KV head). Causal: the chunk starting
    at query t0 is the same problem over a cache whose rows are t0 slots longer. Non-causal:
    every chunk sees the same context (and all rows of the block's own K/V, which ``call``
    holds). ``per_query``: arrays [B, T, ...] cut into the same query chunks along axis 1 (the
    tree's ``blk_mask`` [B, T, T]: a chunk's queries keep their rows of it)."""
    T = q.shape[1]
    if T * group <= max_rows:
        return call(q, kv_lens, *per_query)
    step = max(1, max_rows // group)
    return jnp.concatenate([call(q[:, t0:t0 + step], kv_lens + t0 if causal else kv_lens,
                                 *(x[:, t0:t0 + step] for x in per_query))
                            for t0 in range(0, T, step)], axis=1)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_k", "num_splits", "interpret",
                                             "num_warps", "num_stages"))
def _block_attention(q, k, v, kv_lens, k_blk, v_blk, layer, blk_mask=None, *, causal, scale,
                     block_k, num_splits, interpret, num_warps, num_stages):
    from jax.experimental.pallas import triton as plgpu

    B, T, H, Dh = q.shape
    S, Hkv = k.shape[2], k.shape[3]
    G = H // Hkv
    scale = Dh ** -0.5 if scale is None else float(scale)
    launch = choose_launch(batch=B, seq=S, kv_heads=Hkv, num_queries=T, group=G, head_dim=Dh,
                           itemsize=q.dtype.itemsize, num_sms=_gpu_sm_count(),
                           block_rows=0 if k_blk is None else k_blk.shape[1], block_k=block_k,
                           num_splits=num_splits, num_warps=num_warps, num_stages=num_stages)
    block_k, num_warps, num_stages = launch.block_k, launch.num_warps, launch.num_stages
    if S % block_k:  # rare (caches are bucketed): pad the cache to whole tiles
        pad = block_k - S % block_k
        k = jnp.pad(k, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0)))
        S += pad
    tiles = S // block_k
    num_splits = max(1, min(tiles, launch.num_splits))
    tiles_per_split = -(-tiles // num_splits)
    num_splits = -(-tiles // tiles_per_split)

    # fold the G query heads of each KV head into rows: [B, Hkv, T*G] -> padded R rows
    R = max(16, _next_pow2(T * G))
    qr = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 1, 3, 4).reshape(B, Hkv, T * G, Dh)
    qr = jnp.pad(qr, ((0, 0), (0, 0), (0, R - T * G), (0, 0)))
    lens = kv_lens.astype(jnp.int32)
    has_blk = k_blk is not None
    num_blk = k_blk.shape[1] if has_blk else 0  # the block's own rows (all T, or a query chunk's block)
    Tb = max(16, _next_pow2(num_blk))
    whole = pl.no_block_spec  # the whole array, addressed by pointer arithmetic
    in_specs = [
        pl.BlockSpec((1,), lambda b, g, s: (0,)),
        pl.BlockSpec((1,), lambda b, g, s: (b,)),
        pl.BlockSpec((None, None, R, Dh), lambda b, g, s: (b, g, 0, 0)),
        whole,  # k, v: indexed inside the kernel by (layer, b, tile, g)
        whole,
    ]
    args = [jnp.asarray(layer, jnp.int32).reshape(1), lens, qr, k, v]
    if has_blk:
        padb = ((0, 0), (0, Tb - num_blk), (0, 0), (0, 0))
        args += [jnp.pad(k_blk, padb), jnp.pad(v_blk, padb)]
        in_specs += [pl.BlockSpec((None, Tb, None, Dh), lambda b, g, s: (b, 0, g, 0))] * 2
    has_mask = blk_mask is not None
    if has_mask:  # [B, Tq, num_blk] -> folded like q (row r: query r // G) -> int8 [B, R, Tb]
        folded = jnp.repeat(blk_mask.astype(jnp.int8), G, axis=1)
        args.append(jnp.pad(folded, ((0, 0), (0, R - T * G), (0, Tb - num_blk))))
        in_specs.append(pl.BlockSpec((None, R, Tb), lambda b, g, s: (b, 0, 0)))
    kernel = functools.partial(
        _kernel, causal=causal, has_blk=has_blk, has_mask=has_mask, scale=scale, block_k=block_k,
        tiles_per_split=tiles_per_split, group=G, num_queries=T, num_blk=num_blk, exact=q.dtype == jnp.float32)
    acc, m, l = pl.pallas_call(
        kernel,
        grid=(B, Hkv, num_splits),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, None, R, Dh), lambda b, g, s: (b, g, s, 0, 0)),
                   pl.BlockSpec((None, None, None, R), lambda b, g, s: (b, g, s, 0)),
                   pl.BlockSpec((None, None, None, R), lambda b, g, s: (b, g, s, 0))],
        out_shape=[jax.ShapeDtypeStruct((B, Hkv, num_splits, R, Dh), jnp.float32),
                   jax.ShapeDtypeStruct((B, Hkv, num_splits, R), jnp.float32),
                   jax.ShapeDtypeStruct((B, Hkv, num_splits, R), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="dflash_block_attention",
    )(*args)
    out = combine_splits(acc, m, l)  # [B, Hkv, R, Dh]
    out = out[:, :, :T * G].reshape(B, Hkv, T, G, Dh).transpose(0, 2, 1, 3, 4)
    return out.reshape(B, T, H, Dh).astype(q.dtype)


def _gpu_sm_count() -> int | None:
    """SMs of the default device when it is a GPU; None elsewhere (the tuner then assumes an
    H100's 132, e.g. when lowering for CUDA on a CPU host)."""
    device = jax.devices()[0]
    return getattr(device, "core_count", None) if device.platform == "gpu" else None


def combine_splits(acc, m, l):
    """Merges per-split online-softmax states: acc [..., splits, R, Dh], m, l [..., splits, R]."""
    m_all = jnp.max(m, axis=-2, keepdims=True)
    w = jnp.where(l > 0, jnp.exp(m - m_all), 0.0)
    total = jnp.sum(w * l, axis=-2)
    out = jnp.sum(w[..., None] * acc, axis=-3)
    return out / jnp.where(total > 0, total, 1.0)[..., None]
