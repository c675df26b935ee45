"""The Triton block-attention kernel (kernels/triton_block_attention.py): run in Triton's
interpreter against the jnp reference over the shape grid of the Pallas tests, compiled for
sm_90a / sm_100a without a GPU (through dflash_jax.tools.gpu_compile), and the models with attention_impl="triton" against XLA.

The interpreter runs in a helper process started with TRITON_INTERPRET=1 (Triton reads it as
``@triton.jit`` decorates, its own library functions included, i.e. at import), so this process
keeps the compilable kernel for the GPU compile tests. On a GPU machine run with
JAX_PLATFORMS=cuda (conftest defaults to cpu) for the jax-triton path."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.tools import gpu_compile as gc
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets import target_forward
from support.model_parity import drafter_outputs
from dflash_jax.kernels import block_attention_reference, tuning
from dflash_jax.kernels.triton_block_attention import block_attention_triton, plan_launch
from support.tiers import tiered

pytestmark = pytest.mark.triton

# max |out - ref| allowed, as a fraction of max |ref| (bf16: a few output roundings)
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 1.5e-2}

# (T, S, Hkv, G, Dh, dtype): the grid of tests/kernels/test_kernels.py
CASES = [
    (1, 2048, 2, 4, 128, jnp.bfloat16),
    (1, 320, 4, 1, 64, jnp.float32),
    (8, 1024, 1, 8, 64, jnp.float32),
    (16, 512, 2, 4, 128, jnp.float32),
    (16, 2048, 1, 8, 64, jnp.bfloat16),
    (8, 200, 2, 1, 128, jnp.bfloat16),  # S not a multiple of the tile: the last tile is masked
]
FAST_CASES = [CASES[5]]  # the fast tier's (the whole suite: all six)



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


def assert_close(out, ref, tol):
    """|out - ref| <= tol * max |ref| everywhere: relative to the output's magnitude, so a
    dropped tile or a shifted mask (errors of a few percent of it) fails in bf16 too."""
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    err, size = np.abs(out - ref).max(), np.abs(ref).max()
    assert size > 0 and err <= tol * size, f"max error {err:.3g} > {tol} * max |ref| {size:.3g}"


@pytest.mark.parametrize("case", tiered(CASES, FAST_CASES, ids=case_id))
@pytest.mark.parametrize("causal", [True, False])
def test_interpreted_kernel_matches_reference(case, causal):
    q, k, v, kb, vb, lens = _inputs(*case)
    kw = {} if causal else dict(k_blk=kb, v_blk=vb)
    out = block_attention_triton(q, k, v, lens, causal=causal, interpret=True, num_splits=3, **kw)
    ref = block_attention_reference(q, k, v, lens, causal=causal, **kw)
    assert out.shape == ref.shape and out.dtype == q.dtype and not jnp.isnan(out).any()
    assert_close(out, ref, TOL[case[5]])


@pytest.mark.slow
def test_splits_tiles_scale_and_empty_rows():
    q, k, v, kb, vb, lens = _inputs(4, 256, 2, 2, 64, jnp.float32, seed=1)
    ref = block_attention_reference(q, k, v, lens, causal=False, scale=0.3)
    for splits, bk in [(1, 16), (2, 64), (5, 16)]:  # one chunk; 2 x 2 tiles; 4 x 4 (5 -> 4)
        out = block_attention_triton(q, k, v, lens, causal=False, scale=0.3, num_splits=splits,
                                     block_k=bk, interpret=True)
        assert_close(out, ref, TOL[jnp.float32])
    # row 0 has no context and no block rows: it sees nothing and gets zeros, not NaN
    assert float(jnp.abs(out[0]).max()) == 0.0
    # with the block rows it sees exactly those
    out = block_attention_triton(q, k, v, lens, kb, vb, causal=False, interpret=True)
    assert_close(out, block_attention_reference(q, k, v, lens, kb, vb, causal=False), TOL[jnp.float32])


def test_stacked_cache_layer_index():
    q, k, v, kb, vb, lens = _inputs(8, 128, 2, 4, 64, jnp.float32, seed=2)
    stacked_k = jnp.stack([k * 0.5, k, -k])
    stacked_v = jnp.stack([v, v * 2, v])
    out = block_attention_triton(q, stacked_k, stacked_v, lens, causal=True, layer=jnp.int32(1),
                                 interpret=True)
    assert_close(out, block_attention_reference(q, k, v * 2, lens, causal=True), TOL[jnp.float32])


def test_bad_arguments():
    q, k, v, kb, vb, lens = _inputs(4, 64, 2, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match="k_blk=None"):
        block_attention_triton(q, k, v, lens, kb, vb, causal=True, interpret=True)
    with pytest.raises(ValueError, match="layer="):
        block_attention_triton(q, k[None], v[None], lens, causal=True, interpret=True)
    with pytest.raises(ValueError, match="power of two"):
        block_attention_triton(q, k, v, lens, causal=True, block_k=48, interpret=True)


def test_gpu_path_on_this_machine():
    """On a GPU the jax-triton call must match the reference; without one, jax-triton does not
    import (it needs a CUDA or ROCm jaxlib) and the error says to use the interpreter."""
    q, k, v, kb, vb, lens = _inputs(16, 512, 2, 4, 128, jnp.bfloat16)
    run = lambda: block_attention_triton(q, k, v, lens, kb, vb, causal=False)
    if jax.default_backend() == "gpu":
        assert_close(run(), block_attention_reference(q, k, v, lens, kb, vb, causal=False),
                     TOL[jnp.bfloat16])
    else:
        with pytest.raises(RuntimeError, match="interpret=True"):
            run()


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_compiles_for_hopper_and_blackwell(gpu):
    """Qwen3-8B heads (32 q / 8 kv, Dh 128) in bf16, through gpu_compile's Triton path: the
    verify and draft blocks (T = 16) over a 4k cache and an 8-row decode over 32k, with the
    tuned launch. The kernel compiles for the arch, its dots are bf16 tensor-core instructions
    (64-row tiles: wgmma on Hopper, tcgen05 on Blackwell; decode's 16 rows, under wgmma's
    64-row minimum: the warp-level mma.sync), nothing spills or exceeds the shared memory, two
    programs fit on an SM, and the grid is the plan's (one more program for the block rows)."""
    gpu = gc.GPUS[gpu]
    wide = {90: r"wgmma\.mma_async.*\.bf16\.bf16", 100: r"tcgen05\.mma.*kind::f16"}[gpu.capability]
    for cfg in (gc.KernelConfig("verify", 1, 4096, 16, 32, 8, 128, 36),
                gc.KernelConfig("draft", 1, 4096, 16, 32, 8, 128, 5),
                gc.KernelConfig("decode", 8, 32768, 1, 32, 8, 128, 36)):
        launch = gc.tuned_launch(cfg, gpu, "triton")
        row = gc.compile_config(cfg, launch, gpu, "triton")
        kernel = gc.compile_triton_plan(gc.triton_plan(cfg, launch, gpu), gpu, cfg.dtype)
        assert kernel.ptx_target == gpu.arch
        mma = wide if cfg.rows >= 64 else r"mma\.sync.*\.bf16\.bf16"
        assert any(re.match(mma, op) for op in kernel.tensor_core_ops), kernel.tensor_core_ops
        assert row["spill_bytes"] == 0 and row["traps"] == 0, row
        assert 0 < row["shared_kib"] <= row["shared_limit_kib"] and row["blocks_per_sm"] >= 2, row
        assert row["flags"] == [], (cfg.label, row["flags"])
        assert row["grid"] == [cfg.batch, 8, row["num_splits"] + (not cfg.causal)]


def test_launch_defaults_come_from_the_tuner():
    """plan_launch's unset parameters are kernels/tuning.py's choice for the device's SMs (the
    132 it assumes off a GPU), with the block rows left out of the cache programs; the legacy
    ~S / 512 split rule is gone, and given values are kept."""
    q_shape, k_shape = (1, 16, 32, 128), (36, 1, 4096, 8, 128)
    for num_sms in (None, 148):
        plan = plan_launch(q_shape, k_shape, jnp.bfloat16, causal=False, has_blk=True,
                           num_sms=num_sms)
        assert plan.launch == tuning.choose_launch(
            batch=1, seq=4096, kv_heads=8, num_queries=16, group=4, head_dim=128, itemsize=2,
            block_rows=0, num_sms=num_sms)
        assert plan.launch.num_splits == 16 and plan.grid == (1, 8, 17)  # not 4096 / 512 = 8
    plan = plan_launch(q_shape, k_shape, jnp.float32, causal=True, has_blk=False, block_k=16,
                       num_splits=3, num_warps=8, num_stages=1)
    assert plan.launch == tuning.LaunchParams(16, 3, 8, 1) and plan.grid == (1, 8, 3)
    assert plan_launch(q_shape, k_shape, jnp.float32, causal=True,
                       has_blk=False).launch.block_k == 32  # float32 tiles


CFG = dj.TargetConfig("qwen3", vocab_size=40, hidden_size=64, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128)


@pytest.mark.slow
def test_models_give_the_same_outputs_with_the_triton_impl():
    """attention_impl="triton" (the interpreter on CPU) == "xla": the target's block through a
    cache whose rows are at different positions (random K/V in every slot, so a slot seen past a
    row's length changes the result) and the drafter's non-causal block."""
    target = dj.Target.random(CFG, seed=0, init_scale=0.3)
    drafter = dj.Drafter.random(target, num_layers=2, block_size=4, seed=1, init_scale=0.3,
                                target_layer_ids=(0, 1))
    rng = np.random.default_rng(0)
    kv = lambda: jnp.asarray(rng.normal(size=(2, 2, 64, 2, 16)), jnp.float32)  # [L, B, S, Hkv, Dh]
    cache = KVCache(k=kv(), v=kv(), lengths=jnp.array([6, 10], jnp.int32))
    blk = jnp.asarray(rng.integers(0, 40, size=(2, 4)))
    pos = jnp.array([6, 10])[:, None] + jnp.arange(4)
    outs = [target_forward(CFG, target.params, blk, pos, cache, tap_layer_ids=(0, 1),
                           attention_impl=impl)[:2] for impl in ("xla", "triton")]
    for a, b in zip(*outs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=5e-5)
    res = drafter_outputs(drafter, ("xla", "triton"), rng)
    np.testing.assert_allclose(res[0], res[1], atol=5e-5, rtol=5e-5)
