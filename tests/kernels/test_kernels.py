"""The Pallas block-attention kernel (interpret mode on CPU, compiled on a GPU) against its jnp
reference, and the models with attention_impl="pallas" against the XLA path."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.kernels import block_attention, block_attention_reference
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets import target_forward
from support.model_parity import drafter_outputs
from support.tiers import tiered

# on a GPU the same tests run the compiled kernel (python -m dflash_jax.tools.gpu_suite runs them)
INTERPRET = jax.default_backend() != "gpu"

# Largest error of a batch row relative to that row's rms output, against the float32 reference
# of the same (rounded) inputs. A row that attends over S = 2048 slots has outputs of rms ~0.04,
# so an absolute bf16 tolerance (2e-2 was used) let a kernel that skipped a whole KV tile pass;
# relative to the row it fails by ~15x (skipping one tile: 0.55..3 of the row's rms; bf16
# rounding: <= 0.015).
REL_TOL = {jnp.float32: 1e-4, jnp.bfloat16: 4e-2}


def assert_close_per_row(out, ref, rel_tol):
    """max |out - ref| of every batch row <= rel_tol * rms of that row of ref (float32)."""
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    for b in range(ref.shape[0]):
        err = float(np.abs(out[b] - ref[b]).max())
        scale = float(np.sqrt(np.mean(ref[b] ** 2)))
        assert err <= rel_tol * scale, f"row {b}: max error {err:.3g} > {rel_tol} * row rms {scale:.3g}"

# (T, S, Hkv, G, Dh, dtype): T in {1, 8, 16}, S up to 2k, GQA 1/4/8, head dims 64/128
CASES = [
    (1, 2048, 2, 4, 128, jnp.bfloat16),
    (1, 320, 4, 1, 64, jnp.float32),
    (8, 1024, 1, 8, 64, jnp.float32),
    (16, 512, 2, 4, 128, jnp.float32),
    (16, 2048, 1, 8, 64, jnp.bfloat16),
    (8, 200, 2, 1, 128, jnp.bfloat16),  # S not a multiple of the tile: padded
]
# the fast tier: a multi-row float32 block and the padded bfloat16 one (the whole suite: all six)
FAST_CASES = [CASES[3], CASES[5]]



def case_id(c):
    return f"T{c[0]}-S{c[1]}-kv{c[2]}-g{c[3]}-d{c[4]}-{jnp.dtype(c[5]).name}"

def _inputs(T, S, Hkv, G, Dh, dtype, seed=0):
    rng = np.random.default_rng(seed)
    B = 3
    mk = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
    q, k, v = mk(B, T, Hkv * G, Dh), mk(B, S, Hkv, Dh), mk(B, S, Hkv, Dh)
    kb, vb = mk(B, T, Hkv, Dh), mk(B, T, Hkv, Dh)
    lens = jnp.array([0, S // 3 + 1, S - T], jnp.int32)  # empty, ragged, nearly full
    return q, k, v, kb, vb, lens


@pytest.mark.parametrize("case", tiered(CASES, FAST_CASES, ids=case_id))
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_matches_reference(case, causal):
    q, k, v, kb, vb, lens = _inputs(*case)
    kw = {} if causal else dict(k_blk=kb, v_blk=vb)
    out = block_attention(q, k, v, lens, causal=causal, interpret=INTERPRET, num_splits=3, **kw)
    f32 = lambda x: x.astype(jnp.float32)
    ref = block_attention_reference(f32(q), f32(k), f32(v), lens, causal=causal,
                                    **{name: f32(x) for name, x in kw.items()})
    assert out.dtype == q.dtype and not jnp.isnan(out).any()
    assert_close_per_row(out, ref, REL_TOL[case[5]])


def test_splits_tiles_scale_and_empty_rows():
    q, k, v, kb, vb, lens = _inputs(4, 256, 2, 2, 64, jnp.float32, seed=1)
    ref = block_attention_reference(q, k, v, lens, causal=False, scale=0.3)
    for splits, bk in itertools.product([1, 2, 5], [16, 64]):
        out = block_attention(q, k, v, lens, causal=False, scale=0.3, num_splits=splits, block_k=bk,
                              interpret=INTERPRET)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=2e-5)
    # row 0 has no context and no block rows: it sees nothing and gets zeros
    assert float(jnp.abs(out[0]).max()) == 0.0


def test_stacked_cache_layer_index():
    q, k, v, kb, vb, lens = _inputs(8, 128, 2, 4, 64, jnp.float32, seed=2)
    stacked_k = jnp.stack([k * 0.5, k, -k])
    stacked_v = jnp.stack([v, v * 2, v])
    out = block_attention(q, stacked_k, stacked_v, lens, causal=True, layer=jnp.int32(1), interpret=INTERPRET)
    ref = block_attention_reference(q, k, v * 2, lens, causal=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=2e-5)


def test_bad_arguments():
    q, k, v, kb, vb, lens = _inputs(4, 64, 2, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match="k_blk=None"):
        block_attention(q, k, v, lens, kb, vb, causal=True, interpret=INTERPRET)
    with pytest.raises(ValueError, match="kv_lens must have shape"):
        block_attention_reference(q, k, v, lens[:2], causal=True)
    with pytest.raises(ValueError, match="layer="):
        block_attention(q, k[None], v[None], lens, causal=True, interpret=INTERPRET)
    with pytest.raises(ValueError, match="attention_impl"):
        dj.generate(dj.Target.random(CFG), [[1]], 2, attention_impl="cuda")


def test_an_unused_kernel_call_is_dead_code():
    """flax >= 0.12.9 checks nn.scan's broadcast inputs by dead-code elimination of the scanned
    body, and jax <= 0.11 never removes a bare pallas_call: the kernel must be removable as a
    whole, or every scanned model with attention_impl="pallas" fails on jax 0.11 with new flax.
    (Tested here on every jax; the models' test below is the same check on jax 0.11.)"""
    import jax
    from jax.interpreters import partial_eval as pe

    q, k, v, kb, vb, lens = _inputs(4, 64, 2, 2, 16, jnp.float32)

    def unused(q, k, v, kb, vb, lens):
        block_attention(q, k, v, lens, kb, vb, causal=False, interpret=INTERPRET)
        block_attention(q, k, v, lens, causal=True, interpret=INTERPRET)
        return jnp.zeros(())

    jaxpr = jax.make_jaxpr(unused)(q, k, v, kb, vb, lens).jaxpr
    assert "pallas_call" in str(jaxpr)
    dced, used_inputs = pe.dce_jaxpr(jaxpr, [True])
    assert not any(used_inputs) and "pallas_call" not in str(dced)


CFG = dj.TargetConfig("qwen3", vocab_size=40, hidden_size=64, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128)


@pytest.mark.slow
def test_models_give_the_same_outputs_with_either_impl():
    target = dj.Target.random(CFG, seed=0, init_scale=0.3)
    drafter = dj.Drafter.random(target, num_layers=2, block_size=4, seed=1, init_scale=0.3,
                                target_layer_ids=(0, 1))
    rng = np.random.default_rng(0)
    # target: prefill then a block through the cache, rows at different positions
    outs = {}
    for impl in ("xla", "pallas"):
        cache = KVCache.for_config(CFG, 2, 64)
        ids = jnp.asarray(rng.integers(0, 40, size=(2, 10)))
        l1, t1, cache = target_forward(CFG, target.params, ids, jnp.broadcast_to(jnp.arange(10), (2, 10)),
                                       cache, tap_layer_ids=(0, 1), attention_impl=impl)
        cache = cache.crop(jnp.array([6, 10]))
        blk = jnp.asarray(rng.integers(0, 40, size=(2, 4)))
        pos = jnp.array([6, 10])[:, None] + jnp.arange(4)
        l2, t2, _ = target_forward(CFG, target.params, blk, pos, cache, tap_layer_ids=(0, 1),
                                   attention_impl=impl)
        outs[impl] = (l1, t1, l2, t2)
        rng = np.random.default_rng(0)
    for a, b in zip(outs["xla"], outs["pallas"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=5e-5)
    # drafter: context through the cache + a non-causal block
    res = drafter_outputs(drafter, ("xla", "pallas"), rng)
    np.testing.assert_allclose(res[0], res[1], atol=5e-5, rtol=5e-5)
    # and the whole engine: greedy speculative decoding with the kernel == AR with XLA
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    ar = dj.generate(target, prompts, 12)
    sp = dj.generate(target, prompts, 12, drafter=drafter, attention_impl="pallas")
    assert sp.sequences == ar.sequences


@pytest.mark.parametrize("causal", tiered([True, False], fast=[True]))
def test_long_blocks_run_as_query_chunks(causal):
    """More than MAX_ROWS query rows per KV head (a 40-token prefill with 4 query heads per KV
    head; a drafter block with 16): the kernel runs query chunks, which must see exactly what
    the whole block would (a chunk that forgot its offset t0 in the causal mask fails here)."""
    from dflash_jax.kernels.block_attention import MAX_ROWS

    T, G = (40, 4) if causal else (16, 8)
    assert T * G > MAX_ROWS
    q, k, v, kb, vb, lens = _inputs(T, 128, 2, G, 32, jnp.float32, seed=3)
    kw = {} if causal else dict(k_blk=kb, v_blk=vb)
    out = block_attention(q, k, v, lens, causal=causal, interpret=INTERPRET, **kw)
    ref = block_attention_reference(q, k, v, lens, causal=causal, **kw)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_reference_equals_the_models_xla_attention(causal):
    """The kernel package's own jnp reference and the models' XLA path (``nn.segmented_attention``,
    the cache and the block as two segments under one softmax) are independent code: they agree."""
    from dflash_jax.nn.attention import segmented_attention

    T, S = 5, 40
    q, k, v, kb, vb, lens = _inputs(T, S, 2, 3, 16, jnp.float32, seed=4)
    limit = lens[:, None, None] + (jnp.arange(T)[None, :, None] + 1 if causal else 0)
    segments = [(k, v, jnp.arange(S)[None, None, :] < limit)]
    if not causal:
        segments.append((kb, vb, jnp.ones((1, 1, T), bool)))
    kw = {} if causal else dict(k_blk=kb, v_blk=vb)
    np.testing.assert_allclose(np.asarray(block_attention_reference(q, k, v, lens, causal=causal, **kw)),
                               np.asarray(segmented_attention(q, segments)), atol=1e-6, rtol=1e-5)


def test_kernels_import_nothing_of_dflash_jax():
    """``kernels`` sits below ``dflash_jax`` in the layer order: importing it (and running its
    reference) loads no module of ``dflash_jax``."""
    import subprocess
    import sys

    code = ("import sys, jax.numpy as jnp, kernels, kernels.block_attention, kernels.tuning\n"
            "q = jnp.ones((1, 2, 2, 8)); k = jnp.ones((1, 4, 1, 8))\n"
            "kernels.block_attention_reference(q, k, k, jnp.array([2]), causal=True)\n"
            "try:\n    import kernels.triton_block_attention\nexcept ImportError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dflash_jax'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert out.stdout.strip() == "[]", out.stdout
