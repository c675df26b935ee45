"""The chunked Gated DeltaNet form as Pallas kernels (``kernels/gdn_chunk.py``) against its
``jnp`` reference ``nn.gated_delta.chunked``, in the Pallas interpreter on CPU (compiled on a
GPU, where the GPU suite's ``hybrid`` stage runs it): every chunk length the engine uses
(a verify block's 3 or 4 rows, 16, 32, 64; a last chunk cut short; one chunk longer than
the block), dims padded to the kernel's tiles, several value slices per head, ragged rows;
the blocked inverse against float64 (where the Neumann series fails); the errors; and the two
kernels compiled for sm_90a and sm_100a from the program lowered for CUDA on this host."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax.kernels import gdn_chunk
from dflash_jax.nn import gated_delta as gd
from support import hybrid_targets as ht
from support.tiers import tiered

INTERPRET = jax.default_backend() != "gpu"


def inputs(B, T, Hk, Hv, dk, dv, seed=0):
    """Prepared q, k, v, g, beta and a state, from raw projections through the layer's own
    preparation (L2 norms, key heads tiled onto value heads, the gates), with long memory
    (decays near 1: a state update the kernel gets wrong is read for many rows)."""
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.standard_normal(s), jnp.float32)
    q, k, v = gd.prepare(f(B, T, Hk, dk), f(B, T, Hk, dk), f(B, T, Hv, dv))
    g, beta = gd.gates(f(B, T, Hv), f(B, T, Hv), jnp.full((Hv,), -3.0), jnp.zeros((Hv,)))
    return q, k, v, g, beta, 0.3 * f(B, Hv, dk, dv)


def assert_close(got, want, rel=2e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    err, scale = np.abs(got - want).max(), np.sqrt(np.mean(want ** 2))
    assert err <= rel * scale, f"max error {err:.3g} > {rel} x rms {scale:.3g}"


# (B, T, Hk, Hv, dk, dv, chunk, block_v)
CASES = [
    (2, 7, 1, 2, 8, 8, 3, None),      # the hybrid tests' chunk of 3: P = 16 rows, 13 of them padding
    (2, 40, 1, 2, 8, 12, 16, None),   # the last chunk cut short; dk, dv padded to 16
    (1, 100, 1, 1, 32, 32, 64, None),  # four diagonal blocks joined by block forward substitution
    (2, 16, 2, 2, 16, 32, 32, 16),    # one chunk longer than the block; two value slices
    (1, 96, 1, 2, 16, 16, 32, None),  # three whole chunks of two blocks each
]


@pytest.mark.parametrize("case", tiered(CASES, fast=[CASES[2]]), ids=lambda c: "B{}-T{}-chunk{}".format(c[0], c[1], c[6]))
def test_equals_the_reference(case):
    B, T, Hk, Hv, dk, dv, chunk, block_v = case
    x = inputs(B, T, Hk, Hv, dk, dv)
    o, bounds = gdn_chunk.gdn_chunked(*x, chunk, block_v=block_v, interpret=INTERPRET)
    ref_o, ref_bounds = gd.chunked(*x, chunk)
    assert bounds.shape == ref_bounds.shape == (B, -(-T // min(chunk, T)) + 1, Hv, dk, dv)
    assert_close(o, ref_o)
    assert_close(bounds, ref_bounds)
    # and the per-token recurrence, which shares nothing with either chunked form
    rec_o, states = gd.recurrent(*x)
    assert_close(o, rec_o, 1e-4)
    assert_close(bounds[:, -1], states[:, -1], 1e-4)


def test_ragged_rows_stop_at_their_lengths():
    """Row b's state stops at ``lengths[b]`` (the reference with ``g = beta = 0`` past it),
    lengths inside a chunk, at a chunk's end and at T."""
    B, T, chunk = 3, 70, 32
    q, k, v, g, beta, s0 = inputs(B, T, 1, 2, 16, 16, seed=1)
    lengths = jnp.asarray([T, 5, 64], jnp.int32)
    o, bounds = gdn_chunk.gdn_chunked(q, k, v, g, beta, s0, chunk, lengths=lengths, interpret=INTERPRET)
    live = (jnp.arange(T)[None, :] < lengths[:, None])[..., None]
    ref_o, ref_bounds = gd.chunked(q, k, v, jnp.where(live, g, 0.0), jnp.where(live, beta, 0.0), s0, chunk)
    assert_close(o, ref_o)
    assert_close(bounds, ref_bounds)
    for b, n in enumerate([T, 5, 64]):  # the last state is the row's own after its n positions
        _, states = gd.recurrent(*(x[b:b + 1, :n] for x in (q, k, v, g, beta)), s0[b:b + 1])
        assert_close(bounds[b, -1], states[0, -1], 1e-4)
    # and the rows are not all treated alike: the short row's state differs from the full one's
    assert not np.allclose(bounds[1, -1], gd.chunked(q, k, v, g, beta, s0, chunk)[1][1, -1], atol=1e-3)


def test_blocked_inverse_is_exact_where_the_series_cancels():
    """(I + A)^-1 for 64 rows of nearly equal keys (A close to all-ones below the diagonal):
    the blocked solve and the reference's substitution agree with float64; the power series
    sum (-A)^n, the same polynomial, loses every digit (its terms reach binomial sizes)."""
    n = 64
    r = np.random.default_rng(2)
    k = gd.l2norm(jnp.asarray(1.0 + 0.02 * r.standard_normal((n, 32)), jnp.float32))
    beta = jnp.asarray(r.uniform(0.8, 1.0, n), jnp.float32)
    g = jnp.asarray(-0.001 * r.uniform(size=n), jnp.float32)
    blocked = gdn_chunk.chunk_inverse(k, g, beta)
    G = np.cumsum(np.asarray(g, np.float64))
    A = np.tril(np.asarray(beta, np.float64)[:, None] * np.exp(G[:, None] - G[None, :])
                * (np.asarray(k, np.float64) @ np.asarray(k, np.float64).T), -1)
    exact = np.linalg.inv(np.eye(n) + A)
    scale = np.abs(exact).max()
    assert np.abs(np.asarray(blocked) - exact).max() < 1e-4 * scale
    assert np.abs(np.asarray(gd.unit_lower_inverse(jnp.asarray(A, jnp.float32))) - exact).max() < 1e-4 * scale
    A32, term, series = jnp.asarray(A, jnp.float32), jnp.eye(n), jnp.eye(n)
    for _ in range(n - 1):
        term = -term @ A32
        series = series + term
    assert np.abs(np.asarray(series) - exact).max() > 10 * scale


def test_bad_arguments_are_refused_in_one_line():
    x = inputs(1, 8, 1, 1, 8, 8)
    with pytest.raises(ValueError, match=r"g and beta must have shape \(1, 8, 1\)"):
        gdn_chunk.gdn_chunked(*x[:3], x[3][:, :4], *x[4:], 4, interpret=True)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        gdn_chunk.gdn_chunked(*x, 0, interpret=True)
    with pytest.raises(ValueError, match="precision must be one of highest, tf32x3, tf32"):
        gdn_chunk.gdn_chunked(*x, 4, precision="fp8", interpret=True)
    with pytest.raises(ValueError, match="block_v must be a power of two of at least 16 dividing 16"):
        gdn_chunk.gdn_chunked(*x, 4, block_v=24, interpret=True)
    with pytest.raises(ValueError, match=r"lengths must have shape \(1,\)"):
        gdn_chunk.gdn_chunked(*x, 4, lengths=jnp.zeros((2,), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="GDN impl must be one of xla, pallas"):
        gd.mix(jnp.zeros((1, 4, 24)), jnp.zeros((1, 4, 1)), jnp.zeros((1, 4, 1)), conv_weight=jnp.zeros((4, 24)),
               A_log=jnp.zeros(1), dt_bias=jnp.zeros(1), num_k_heads=1, head_k_dim=8, num_v_heads=1,
               head_v_dim=8, impl="triton")
    with pytest.raises(ValueError, match="gdn_impl must be one of xla, pallas, got 'triton'"):
        ht.hybrid_config("qwen3_5_text", gdn_impl="triton")


@pytest.mark.slow
def test_both_kernels_compile_for_sm_90a_and_sm_100a_without_spills():
    """Qwen3.5's GDN heads (dk = dv = 128, 32 value heads, chunks of 64), a 512-token prefill,
    lowered for CUDA on this host with the default launch: each kernel compiles for H100 and
    B200 to tensor-core products, without register spills or traps."""
    from dflash_jax.tools import gpu_compile as gc

    sd = jax.ShapeDtypeStruct
    B, T, Hv, d = 1, 512, 32, 128
    args = (sd((B, T, Hv, d), jnp.float32),) * 3 + (sd((B, T, Hv), jnp.float32),) * 2 + (
        sd((B, Hv, d, d), jnp.float32),)
    lowered = gc.lower_for_cuda(lambda: jax.jit(lambda *a: gdn_chunk.gdn_chunked(*a, 64)).trace(*args))
    calls = {c.name: c for c in gc.triton_calls(lowered)}
    assert sorted(calls) == ["dflash_gdn_chunk_inverse", "dflash_gdn_chunk_scan"]
    assert calls["dflash_gdn_chunk_inverse"].grid == (B, Hv, T // 64)
    assert calls["dflash_gdn_chunk_scan"].grid == (B, Hv, d // gdn_chunk.DEFAULT_BLOCK_V)
    for gpu in ("h100", "b200"):
        for name, call in calls.items():
            kernel = gc.compile_triton(call.ir, gc.GPUS[gpu], call.num_warps, call.num_stages)
            assert kernel.ptx_target == gc.GPUS[gpu].arch
            assert (kernel.spills, kernel.traps) == (0, 0), (name, gpu, kernel)
            assert kernel.tensor_core_ops, (name, gpu, kernel)


@pytest.mark.slow
def test_the_hybrid_engine_lowered_for_cuda_holds_the_compiled_kernels():
    """``gdn_impl="pallas"``: the tiny hybrid target's DFlash engine (replay rollback) lowered for
    CUDA on this host holds both kernels compiled (not interpreted) in the prefill and in the
    decode loop's verify, and ``gpu-compile`` reports them with their bytes: no spills."""
    from dflash_jax.tools import gpu_compile as gc

    target, drafter = gc.hybrid_engine_configs("tiny", "replay", "pallas")
    calls = gc.engine_calls(gc.engine_programs(target, drafter, batch=2, prompt_len=16, cache_len=64,
                                               dtype=jnp.float32))
    gdn = [(stage, c) for stage, c in calls if c.name.startswith("dflash_gdn_chunk")]
    assert {(stage, c.name) for stage, c in gdn} == {
        (s, f"dflash_gdn_chunk_{k}") for s in ("prefill", "decode") for k in ("inverse", "scan")}
    rows = gc.engine_rows(gdn, [gc.GPUS["h100"]])
    for (stage, call), row in zip(gdn, rows):
        assert row["kernel_name"] == call.name and row["batch"] == 2, row
        assert (row["spill_bytes"], row["traps"]) == (0, 0), row  # (a tiny model leaves SMs idle)
        assert row["v_heads"] == target.linear_num_value_heads and row["rows"] == 16
        P, n, dk = 16, row["chunks"], row["dk"]
        if call.name.endswith("inverse"):
            assert row["written_kib_per_program"] * 1024 == 4 * P * P
        else:
            bv = row["block_v"]
            assert row["written_kib_per_program"] * 1024 == 4 * (n * P * bv + (n + 1) * dk * bv)
