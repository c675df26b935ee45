"""The memory-efficient (chunked, online-softmax, rematerialised) training attention against the
dense reference ``block_sparse_attention``: outputs and gradients, ragged anchors, padding
blocks, chunks that do not divide N or S, GQA, a negative control, the dense/chunked switch, the
drafter's loss with small chunks, and the compiled memory of the backward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.dflash.model import DrafterModel
from dflash_jax.nn.attention import (DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK,
                                     block_sparse_attention, chunked_block_sparse_attention,
                                     training_block_attention)
from dflash_jax.training.blocks import epoch_anchors, loss_weights
from dflash_jax.methods.dflash.loss import drafter_loss
from dflash_jax.training.features import target_features
from dflash_jax.training.trainer import TrainConfig

B, N, T, H, HKV, DH, S = 2, 7, 4, 4, 2, 8, 19
# (anchor_chunk, context_chunk): dividing neither N nor S, single rows, exact covers, one chunk
# bigger than everything (the chunked algorithm itself, not the switch), mixed
CHUNKS = [(3, 5), (1, 1), (7, 19), (64, 1024), (7, 3)]
GRAD_ARGS = ("q", "k_ctx", "v_ctx", "k_blk", "v_blk")


def inputs(dtype=jnp.float32, seed=0):
    """Random q, k_ctx, v_ctx, k_blk, v_blk (GQA: 4 query heads on 2 kv heads) and ragged
    anchors: row 0 has blocks at 0 (no context), 1, S - 1 (all context); row 1 has three real
    blocks then four padding blocks."""
    rng = np.random.default_rng(seed)
    arr = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
    anchors = jnp.asarray([[0, 1, 3, 5, 9, 15, S - 1], [2, 4, 6, 0, 0, 0, 0]], jnp.int32)
    valid = jnp.asarray([[1] * 7, [1, 1, 1, 0, 0, 0, 0]], bool)
    return (arr(B, N, T, H, DH), arr(B, S, HKV, DH), arr(B, S, HKV, DH), arr(B, N, T, HKV, DH),
            arr(B, N, T, HKV, DH), anchors, valid)


def chunked(ca, cc):
    return jax.jit(lambda *a: chunked_block_sparse_attention(*a, anchor_chunk=ca, context_chunk=cc))


def grads(fn, args):
    """Gradients of sum(sin(out) * fixed weights) w.r.t. the five float inputs."""
    w = jnp.asarray(np.random.default_rng(9).normal(size=args[0].shape), args[0].dtype)
    loss = lambda *f, a, v: jnp.sum(jnp.sin(fn(*f, a, v)) * w)
    return jax.jit(jax.grad(loss, argnums=tuple(range(5))))(*args[:5], a=args[5], v=args[6])


@pytest.mark.parametrize("ca, cc", CHUNKS)
def test_chunked_equals_dense_float32(ca, cc):
    args = inputs()
    ref = np.asarray(block_sparse_attention(*args))
    out = np.asarray(chunked(ca, cc)(*args))
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    assert np.all(out[1, 3:] == 0)  # padding blocks: exact zeros


@pytest.mark.parametrize("ca, cc", [(3, 5), pytest.param(2, 7, marks=pytest.mark.slow)])
def test_chunked_gradients_equal_dense(ca, cc):
    args = inputs()
    ref = grads(block_sparse_attention, args)
    got = grads(chunked(ca, cc), args)
    for name, r, g in zip(GRAD_ARGS, ref, got):
        g = np.asarray(g)
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, np.asarray(r), atol=5e-6, rtol=1e-5, err_msg=name)
    assert np.all(np.asarray(got[0])[1, 3:] == 0)  # no gradient reaches a padding block's queries
    # nothing of a context position at or past every anchor is used: zero gradient there
    assert np.all(np.asarray(got[1])[:, S - 1] == 0) and np.all(np.asarray(got[2])[1, 6:] == 0)


@pytest.mark.slow
def test_chunked_equals_dense_float64():
    with jax.enable_x64(True):
        args = inputs(jnp.float64)
        out = chunked(3, 5)(*args)
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), np.asarray(block_sparse_attention(*args)),
                                   atol=1e-13, rtol=1e-12)
        for r, g in zip(grads(block_sparse_attention, args), grads(chunked(3, 5), args)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-13, rtol=1e-12)


def test_all_padding_is_zero_and_finite():
    q, kc, vc, kb, vb, anchors, _ = inputs()
    none = jnp.zeros((B, N), bool)
    args = (q, kc, vc, kb, vb, anchors, none)
    assert np.all(np.asarray(chunked(3, 5)(*args)) == 0)
    for g in grads(chunked(3, 5), args):
        assert np.all(np.asarray(g) == 0)


def test_negative_control_off_by_one_visibility_is_detected():
    """The comparison above catches a leak of one position: a chunked attention that lets block
    j see position a_j too (``t <= a_j``, i.e. the anchors shifted by one) is far from the
    dense reference, in the output and in the gradients."""
    q, kc, vc, kb, vb, anchors, valid = inputs()
    leaky = (q, kc, vc, kb, vb, anchors + valid.astype(jnp.int32), valid)
    ref = np.asarray(block_sparse_attention(q, kc, vc, kb, vb, anchors, valid))
    out = np.asarray(chunked(3, 5)(*leaky))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    assert np.abs(out - ref).max() > 1e-2
    ref_g = grads(block_sparse_attention, (q, kc, vc, kb, vb, anchors, valid))
    leak_g = grads(chunked(3, 5), leaky)
    assert np.abs(np.asarray(leak_g[1]) - np.asarray(ref_g[1])).max() > 1e-2


def test_the_switch_is_dense_when_one_chunk_covers_everything():
    args = inputs()
    dense = jax.jit(block_sparse_attention)(*args)
    switched = jax.jit(lambda *a: training_block_attention(*a, anchor_chunk=N, context_chunk=S))(*args)
    np.testing.assert_array_equal(np.asarray(switched), np.asarray(dense))  # bitwise: the same program

    def loops(ca, cc):
        jaxpr = str(jax.make_jaxpr(lambda *a: training_block_attention(*a, anchor_chunk=ca,
                                                                      context_chunk=cc))(*args))
        return "scan" in jaxpr or "while" in jaxpr

    assert not loops(N, S) and not loops(DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK)
    assert loops(N - 1, S) and loops(N, S - 1)
    np.testing.assert_allclose(np.asarray(training_block_attention(*args, anchor_chunk=2, context_chunk=5)),
                               np.asarray(dense), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "64", None])
def test_bad_chunk_sizes_are_refused(bad):
    args = inputs()
    for kw in ({"anchor_chunk": bad}, {"context_chunk": bad}):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=name):
            chunked_block_sparse_attention(*args, **kw)
        with pytest.raises(ValueError, match=name):
            training_block_attention(*args, **kw)
        with pytest.raises(ValueError, match=name):
            TrainConfig(**kw)


def test_train_config_chunks():
    cfg = TrainConfig()
    assert (cfg.anchor_chunk, cfg.context_chunk) == (DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK) == (64, 1024)
    assert TrainConfig(anchor_chunk=np.int64(8), context_chunk=128).anchor_chunk == 8


# ---------------------------------------------------------------------------- the drafter
TCFG = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)


@pytest.fixture(scope="module")
def target():
    return dj.Target.random(TCFG, seed=0, init_scale=0.35)


@pytest.mark.slow
@pytest.mark.parametrize("conditioning", ["kv", "input"])
def test_drafter_loss_with_small_chunks_equals_the_dense_default(target, conditioning):
    """The drafter's loss, its metrics and the loss's gradient w.r.t. every drafter parameter
    are the same with chunks (3 anchors, 7 positions: neither divides 6 anchors or length 24)
    as on the default (here dense) path."""
    drafter = dj.Drafter.random(target, num_layers=2, block_size=4, seed=1, init_scale=0.2,
                                conditioning=conditioning)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 30, size=(2, 24)), jnp.int32)
    mask = np.zeros((2, 24), bool)
    mask[:, 5:22] = True
    anchors, valid = epoch_anchors(mask, [0, 1], 6, seed=0, epoch=0)
    valid[1, -2:] = False  # padding blocks
    taps = jax.jit(target_features, static_argnums=(0, 3))(TCFG, target.params, tokens,
                                                          tuple(drafter.config.target_layer_ids))
    batch = (tokens, jnp.asarray(mask), taps, jnp.asarray(anchors), jnp.asarray(valid))
    w = jnp.asarray(loss_weights(4, 2.0))

    def run(**chunks):
        """((loss, metrics), gradient) in one compiled program."""
        loss = lambda p, tp, *b: drafter_loss(p, tp, *b, w, dcfg=drafter.config, tcfg=TCFG, **chunks)
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(drafter.params, target.params, *batch)

    ((l_ref, m_ref), g_ref), ((l_chk, m_chk), g_chk) = run(), run(anchor_chunk=3, context_chunk=7)
    np.testing.assert_allclose(float(l_chk), float(l_ref), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(m_chk["accuracy_per_pos"]), np.asarray(m_ref["accuracy_per_pos"]))
    for r, c in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_chk)):
        assert np.all(np.isfinite(np.asarray(c)))
        np.testing.assert_allclose(np.asarray(c), np.asarray(r), atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="anchor_chunk"):
        DrafterModel(drafter.config, anchor_chunk=0).apply(
            {"params": drafter.params}, jnp.zeros((1, 4, 32)), jnp.zeros((1, 4), jnp.int32),
            taps[:1], jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool), method=DrafterModel.train_blocks)


# ---------------------------------------------------------------------------- memory
@pytest.mark.slow
def test_chunked_backward_needs_far_less_memory():
    """Compiled temp bytes of the jitted gradient (XLA's buffer assignment, CPU) at 128 blocks
    of 16 rows, 8 heads on 4 kv heads, 1024 context positions: the dense backward holds several
    [B, H, N*T, S] float32 score arrays (64 MiB each; about 400 MB in all), the chunked one
    (32 blocks x 256 positions) one chunk's (2 MiB each; about 37 MB in all): about 11x less."""
    Bm, Nm, Tm, Hm, Hkvm, Dhm, Sm = 1, 128, 16, 8, 4, 32, 1024
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    shapes = (f32(Bm, Nm, Tm, Hm, Dhm), f32(Bm, Sm, Hkvm, Dhm), f32(Bm, Sm, Hkvm, Dhm),
              f32(Bm, Nm, Tm, Hkvm, Dhm), f32(Bm, Nm, Tm, Hkvm, Dhm),
              jax.ShapeDtypeStruct((Bm, Nm), jnp.int32), jax.ShapeDtypeStruct((Bm, Nm), bool))

    def temp_bytes(fn):
        loss = lambda q, kc, vc, kb, vb, a, v: jnp.sum(fn(q, kc, vc, kb, vb, a, v) ** 2)
        grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
        return jax.jit(grad).lower(*shapes).compile().memory_analysis().temp_size_in_bytes

    dense, small = temp_bytes(block_sparse_attention), temp_bytes(chunked(32, 256))
    scores = Bm * Hm * Nm * Tm * Sm * 4
    assert dense >= 2 * scores  # the dense backward keeps the scores (and more)
    assert small < scores / 1.5 and small < dense / 6, (dense, small)


def test_train_memory_formulas_at_the_paper_recipe(tmp_path):
    """The computed side of ``bench.train_memory`` (no compilation): at the paper's recipe the
    dense attention holds b * H/m * R * S score elements at (16 * layers + 10) bytes, 3.2 GB of
    float32 scores per layer and sequence, and chunking lowers every layout's peak."""
    from dflash_jax.tools import train_memory as tm

    target = tm.qwen3_8b()
    drafter = tm.paper_drafter(target)
    kw = dict(batch=8, num_anchors=512, seq_len=3072, fsdp=False)
    dense = tm.step_memory(target, drafter, data=8, model=1, attention="dense", **kw)
    chunked = tm.step_memory(target, drafter, data=8, model=1, attention="chunked", **kw)
    scores = 32 * 512 * 16 * 3072
    assert scores * 4 == pytest.approx(3.22e9, rel=1e-2)
    assert dense["components"]["attention"] == scores * (16 * 5 + 10)
    assert chunked["components"]["attention"] < dense["components"]["attention"] / 20
    assert chunked["peak"] < dense["peak"]
    assert chunked["components"]["target_weights"] == pytest.approx(2 * target.num_params(), rel=1e-6)
    split = tm.step_memory(target, drafter, data=2, model=4, attention="chunked", **kw)
    assert split["components"]["target_weights"] < chunked["components"]["target_weights"] / 3.9
    with pytest.raises(ValueError, match="batch"):
        tm.step_memory(target, drafter, data=3, model=1, attention="dense", **kw)
    report = tm.main(["--skip-measure", "--batch", "8", "--out", str(tmp_path)])
    assert {r["data"] for r in report["computed"]["rows"]} == {1, 2, 4, 8}
    assert (tmp_path / "train_memory.json").exists() and "| (8, 1) |" in (tmp_path / "train_memory.md").read_text()
    with pytest.raises(ValueError, match="anchor-chunk"):
        tm.main(["--skip-measure", "--anchor-chunk", "0", "--out", str(tmp_path)])
