"""The chunked Gated DeltaNet (GDN) form with its two sequential parts as Pallas kernels (Triton
lowering on GPU), with the same arguments and results as ``dflash_jax.nn.gated_delta.chunked``,
its ``jnp`` reference.

What one chunk computes (``nn/gated_delta.py``; G the within-chunk cumulative log decay, S0
the state before the chunk, rows i, j of the chunk)::

    A    = strictly_lower(beta_i e^{G_i - G_j} k_i . k_j)                      [Cs, Cs]
    u    = (I + A)^-1 beta (v - e^{G} S0^T k)                                  [Cs, dv]
    o_t  = e^{G_t} S0^T q_t + sum_{j <= t} e^{G_t - G_j} (q_t . k_j) u_j
    S1   = e^{G_last} S0 + sum_j e^{G_last - G_j} k_j u_j^T                   [dk, dv]

The reference inverts ``I + A`` by forward substitution, Cs - 1 dependent row steps. The
kernel does it blocked (:func:`unit_lower_inverse_blocked`): the diagonal blocks of
``SUB = 16`` rows are inverted together, row r of every block at step r (15 steps, each one
matrix product over the whole chunk), then the block rows below the first by block forward
substitution (``Cs / 16 - 1`` steps, two products each): 18 dependent steps for Cs = 64
instead of 63, each a tensor-core product rather than a row of scalar work. It is exact
algebra, not a series: a Neumann / doubling product ``(I - A)(I + A^2)...`` cancels badly
when neighbouring keys are alike (its terms grow like binomials), this does not.

Layout: two kernels. The first inverts every chunk's ``I + A`` at once (grid ``(B, Hv, N)``:
nothing in it depends on the state) and writes the inverses [B, Hv, N, P, P]. XLA then forms
the rest of what does not depend on the state, as batched products over all chunks
(:func:`chunk_terms`: ``u = U - W S0``, the chunk's own attention, the decayed q and k). The
second kernel walks the chunks in order (grid ``(B, Hv, dv / block_v)``: one program per batch row, value
head and slice of the value dims), keeping its [dk, block_v] slice of the state in
registers, and writes each chunk's outputs and the state after it (the boundary states of
the reference, which the replay rollback of ``nn.gated_delta`` keeps). The state's columns
are independent (each reads only its own columns of v), so slicing the value dims splits the
work without any exchange. One kernel doing both kept too many tiles live and spilled
registers at Qwen3.5's head shapes. Chunks, key dims and value dims are padded to powers of
two of at least 16 (Triton's tile and tensor-core minimums); a padded row has ``g = beta = 0``,
which leaves the state as it is, so the boundary states are the reference's.

Ragged rows: ``lengths`` int32[B] (or None: every row has all T) treats row b's positions
``t >= lengths[b]`` as ``g = beta = 0``: the state stops at the row's last valid position
(and its outputs there are the reference's over the same masked inputs).

All arithmetic is float32. The products are full float32 in the interpreter (as in the
reference) and TF32 tensor-core products on a GPU unless ``precision`` asks otherwise
(:func:`gdn_chunked`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# the launch: warps of (the inverse kernel, the scan kernel) and the scan's value dims per
# program. At Qwen3.5's GDN heads (dk = dv = 128, chunks of 64, TF32) these compile without
# register spills for sm_90a and sm_100a (tests/kernels/test_gdn_kernel.py); the scan spilled
# with 4 warps, or with 64 value dims per program
DEFAULT_WARPS = (4, 8)
DEFAULT_BLOCK_V = 32
SUB = 16  # rows of the diagonal blocks inverted together (Triton's smallest product tile)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _pad_dim(x: int) -> int:
    return max(16, _next_pow2(x))


# the products' precision: "highest" full float32 products (the interpreter, and float32 FMAs on a
# GPU), "tf32x3" three TF32 tensor-core products per product (float32's accuracy to a few ulps),
# "tf32" one (10-bit mantissas)
PRECISIONS = {"highest": jax.lax.Precision.HIGHEST, "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
              "tf32": jax.lax.DotAlgorithmPreset.TF32_TF32_F32}


def _dot(a, b, *, trans_a: bool = False, trans_b: bool = False, precision: str = "highest"):
    """a @ b of 2-D float32 tiles (``trans_a``: a.T @ b; ``trans_b``: a @ b.T) at ``precision``
    (:data:`PRECISIONS`)."""
    if trans_a:
        a = a.T
    return jax.lax.dot_general(a, b, (((1,), (1 if trans_b else 0,)), ((), ())),
                               precision=PRECISIONS[precision], preferred_element_type=jnp.float32)


def unit_lower_inverse_blocked(A: jax.Array, sub: int = SUB, precision: str = "highest") -> jax.Array:
    """``(I + A)^-1`` of a strictly lower-triangular float32 A [n, n] (n a multiple of ``sub``,
    or smaller than it), blocked (module docstring): ``sub - 1`` masked products for the diagonal
    blocks, then ``n / sub - 1`` block rows by block forward substitution. 2-D, no dynamic
    indexing: it runs inside the kernel as it does in ``jnp``."""
    dot = functools.partial(_dot, precision=precision)
    n = A.shape[0]
    sub = min(sub, n)
    rows = jax.lax.broadcasted_iota(jnp.int32, (n, n), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (n, n), 1)
    eye = (rows == cols).astype(jnp.float32)
    same = (rows // sub) == (cols // sub)
    A_diag = jnp.where(same, A, 0.0)
    T = eye
    for r in range(1, sub):  # row r of every diagonal block: e_r - A_r T (rows < r final)
        T = jnp.where(rows % sub == r, eye - dot(A_diag, T), T)
    D = T  # the diagonal blocks' inverses
    A_off = jnp.where(same, 0.0, A)
    for blk in range(1, n // sub):  # block row I: D_II (E_I - sum_{K<I} A_IK T_K)
        T = jnp.where(rows // sub == blk, dot(D, eye - dot(A_off, T)), T)
    return T


def chunk_inverse(k, g, beta, precision: str = "highest"):
    """``(I + A)^-1`` of one chunk (module docstring) on 2-D tiles: k [P, dk], g, beta [P]
    (padding rows: ``g = beta = 0``)."""
    P = k.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (P, P), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (P, P), 1)
    G = jnp.sum(jnp.where(cols <= rows, g[None, :], 0.0), axis=1)  # inclusive cumsum [P]
    lower = cols < rows
    decay = jnp.exp(jnp.where(lower, G[:, None] - G[None, :], 0.0))
    A = jnp.where(lower, beta[:, None] * decay * _dot(k, k, trans_b=True, precision=precision), 0.0)
    return unit_lower_inverse_blocked(A, precision=precision)


def chunk_terms(q, k, v, g, beta, inverse, precision: str = "highest"):
    """The parts of chunks that do not depend on the state before them, batched: q, k
    [..., P, dk], v [..., P, dv], g, beta [..., P] (padding rows: ``g = beta = 0``) and the
    chunks' :func:`chunk_inverse` ``T`` [..., P, P]. With G the cumulative log decay, returns

    * ``W = T (beta e^G k)`` [..., P, dk] and ``U = T (beta v)`` [..., P, dv]: the rows
      written to the state are ``u = U - W S0``;
    * ``att`` [..., P, P]: ``e^{G_t - G_j} q_t . k_j`` for ``j <= t``, else 0;
    * ``qg = e^G q`` and ``kw = e^{G_last - G} k`` [..., P, dk]: then ``o = qg S0 + att u``
      and ``S1 = e^{G_last} S0 + kw^T u`` (:func:`chunk_step`).

    Plain XLA operations in :func:`gdn_chunked` (batched products and elementwise work, which
    XLA does well); in one kernel with the inverse they spilled registers."""
    P = k.shape[-2]
    ein = functools.partial(jnp.einsum, precision=PRECISIONS[precision], preferred_element_type=jnp.float32)
    G = jnp.cumsum(g, axis=-1)
    eG = jnp.exp(G)
    W = ein("...ij,...jd->...id", inverse, (beta * eG)[..., None] * k)
    U = ein("...ij,...jd->...id", inverse, beta[..., None] * v)
    causal = jnp.tril(jnp.ones((P, P), bool))
    att = jnp.where(causal, ein("...id,...jd->...ij", q, k)
                    * jnp.exp(jnp.where(causal, G[..., :, None] - G[..., None, :], 0.0)), 0.0)
    return W, U, att, eG[..., None] * q, jnp.exp(G[..., -1:] - G)[..., None] * k


def chunk_step(W, U, att, qg, kw, g, s0, precision: str = "highest"):
    """One chunk from its :func:`chunk_terms` (U, and the result, a slice of the value dims:
    [P, bv]), its g [P] and the state before it s0 [dk, bv] (the second kernel's body; runs
    in ``jnp`` too). Returns (o [P, bv], s1 [dk, bv])."""
    dot = functools.partial(_dot, precision=precision)
    u = U - dot(W, s0)
    o = dot(qg, s0) + dot(att, u)
    return o, jnp.exp(jnp.sum(g)) * s0 + dot(kw, u, trans_a=True)


def _inverse_kernel(k_ref, g_ref, beta_ref, inv_ref, *, precision):
    b, h, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    inv_ref[b, h, c, :, :] = chunk_inverse(k_ref[b, h, c, :, :], g_ref[b, h, c, :], beta_ref[b, h, c, :], precision)


def _scan_kernel(g_ref, w_ref, u_ref, att_ref, qg_ref, kw_ref, s0_ref, o_ref, bounds_ref, *, num_chunks,
                 block_v, precision):
    b, h, vb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols_v = pl.ds(vb * block_v, block_v)
    s = s0_ref[b, h, :, cols_v]
    bounds_ref[b, h, 0, :, cols_v] = s

    def body(c, s):
        o, s = chunk_step(w_ref[b, h, c, :, :], u_ref[b, h, c, :, cols_v], att_ref[b, h, c, :, :],
                          qg_ref[b, h, c, :, :], kw_ref[b, h, c, :, :], g_ref[b, h, c, :], s, precision)
        o_ref[b, h, c, :, cols_v] = o
        bounds_ref[b, h, c + 1, :, cols_v] = s
        return s

    jax.lax.fori_loop(0, num_chunks, body, s)


def _check(q, k, v, g, beta, state0, lengths):
    if q.ndim != 4 or k.shape != q.shape or v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected prepared q, k [B, T, Hv, dk] and v [B, T, Hv, dv]; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    B, T, Hv, dk = q.shape
    dv = v.shape[3]
    if g.shape != (B, T, Hv) or beta.shape != (B, T, Hv):
        raise ValueError(f"g and beta must have shape {(B, T, Hv)}, got {g.shape} and {beta.shape}")
    if state0.shape != (B, Hv, dk, dv):
        raise ValueError(f"state0 must have shape {(B, Hv, dk, dv)}, got {state0.shape}")
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"lengths must have shape ({B},), got {lengths.shape}")


def gdn_chunked(q, k, v, g, beta, state0, chunk_size: int = 64, *, lengths=None, block_v: int | None = None,
                precision: str | None = None, interpret: bool = False, num_warps: tuple[int, int] | None = None,
                num_stages: int | None = None):
    """The chunked GDN form with its two sequential parts as Pallas kernels: prepared q, k
    [B, T, Hv, dk], v [B, T, Hv, dv], g, beta [B, T, Hv], ``state0`` float32[B, Hv, dk, dv],
    chunks of ``min(chunk_size, T)`` rows (as ``nn.gated_delta.chunked``; ``lengths``: module
    docstring).

    ``precision`` of the products on a GPU (:data:`PRECISIONS`; None: ``"tf32"``, the launch
    that compiles without register spills at Qwen3.5's head shapes; ``docs/performance.md``);
    the interpreter always takes full float32 products. ``block_v``: value dims per program
    of the scan (None: 32, or all of them when fewer); ``num_warps``: (inverse kernel, scan
    kernel), None: (4, 8); ``num_stages`` (None: 1). ``interpret``: run in the Pallas
    interpreter (CPU).

    Returns (o float32[B, T, Hv, dv], boundaries float32[B, N + 1, Hv, dk, dv]), as the
    reference."""
    _check(q, k, v, g, beta, state0, lengths)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    B, T = q.shape[:2]
    if lengths is None:
        lengths = jnp.full((B,), T, jnp.int32)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} or None, got {precision!r}")
    precision = "highest" if interpret else (precision or "tf32")
    return _gdn_chunked(q, k, v, g, beta, state0, jnp.asarray(lengths, jnp.int32), chunk=min(chunk_size, T),
                        block_v=block_v, precision=precision, interpret=interpret, num_warps=num_warps,
                        num_stages=num_stages)


@functools.partial(jax.jit, static_argnames=("chunk", "block_v", "precision", "interpret", "num_warps", "num_stages"))
def _gdn_chunked(q, k, v, g, beta, state0, lengths, *, chunk, block_v, precision, interpret, num_warps,
                 num_stages):
    from jax.experimental.pallas import triton as plgpu

    B, T, Hv, dk = q.shape
    dv = v.shape[3]
    n = -(-T // chunk)
    P, dkp, dvp = _pad_dim(chunk), _pad_dim(dk), _pad_dim(dv)
    block_v = min(dvp, DEFAULT_BLOCK_V) if block_v is None else block_v
    if block_v <= 0 or dvp % block_v or block_v & (block_v - 1) or block_v < 16:
        raise ValueError(f"block_v must be a power of two of at least 16 dividing {dvp} (the value "
                         f"dims, padded), got {block_v}")

    def lay(x, d):  # [B, T, Hv, d?] -> float32 [B, Hv, n, P, d?]: chunks of `chunk` rows padded to P
        x = x.astype(jnp.float32)
        x = jnp.pad(x, [(0, 0), (0, n * chunk - T)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape((B, n, chunk) + x.shape[2:])
        x = jnp.pad(x, [(0, 0), (0, 0), (0, P - chunk)] + [(0, 0)] * (x.ndim - 3))
        if d is not None:
            x = jnp.pad(x, [(0, 0)] * 4 + [(0, d - x.shape[4])])
            return x.transpose(0, 3, 1, 2, 4)
        return x.transpose(0, 3, 1, 2)

    qc, kc, vc = lay(q, dkp), lay(k, dkp), lay(v, dvp)
    gc, bc = lay(g, None), lay(beta, None)
    s0 = jnp.pad(state0.astype(jnp.float32), ((0, 0), (0, 0), (0, dkp - dk), (0, dvp - dv)))
    whole = pl.no_block_spec
    warps = DEFAULT_WARPS if num_warps is None else num_warps
    stages = 1 if num_stages is None else num_stages
    f32 = lambda *shape: jax.ShapeDtypeStruct((B, Hv, n) + shape, jnp.float32)
    # rows past a row's length, like the padding, get g = beta = 0: they leave the state as it is
    live = jnp.arange(n)[:, None] * chunk + jnp.arange(P)[None, :] < lengths[:, None, None]  # [B, n, P]
    gc, bc = (jnp.where(live[:, None], x, 0.0) for x in (gc, bc))
    inverse = pl.pallas_call(  # every chunk's (I + A)^-1, all chunks at once
        functools.partial(_inverse_kernel, precision=precision),
        grid=(B, Hv, n), in_specs=[whole] * 3, out_specs=whole, out_shape=f32(P, P),
        compiler_params=plgpu.CompilerParams(num_warps=warps[0], num_stages=stages), interpret=interpret,
        name="dflash_gdn_chunk_inverse",
    )(kc, gc, bc)
    W, U, att, qg, kw = chunk_terms(qc, kc, vc, gc, bc, inverse, precision)
    o, bounds = pl.pallas_call(  # the chunks in order, the state carried
        functools.partial(_scan_kernel, num_chunks=n, block_v=block_v, precision=precision),
        grid=(B, Hv, dvp // block_v), in_specs=[whole] * 7, out_specs=[whole, whole],
        out_shape=[f32(P, dvp), jax.ShapeDtypeStruct((B, Hv, n + 1, dkp, dvp), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=warps[1], num_stages=stages), interpret=interpret,
        name="dflash_gdn_chunk_scan",
    )(gc, W, U, att, qg, kw, s0)
    o = o[:, :, :, :chunk, :dv].transpose(0, 2, 3, 1, 4).reshape(B, n * chunk, Hv, dv)[:, :T]
    return o, bounds[:, :, :, :dk, :dv].transpose(0, 2, 1, 3, 4)
