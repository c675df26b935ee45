"""Drafters whose attention shapes differ from the target's, and sliding-window drafter layers.

Released drafters for MoE and hybrid targets have their own heads / KV heads / head_dim
(SpecForge's ``configs/qwen3.5-35b-a3b-dflash.json``: 32 / 4 / 128 on a 16 / 2 / 256 target),
and some have sliding-window layers (its ``configs/qwen3.6-27b-dflash.json``: ``layer_types``
four ``"sliding_attention"`` then one ``"full_attention"``, ``sliding_window`` 2048).

The sliding mask is SpecForge's DFlash training mask (``create_dflash_sdpa_mask`` /
``create_dflash_block_mask`` with ``sliding_window`` = W), restated here from its description
and written independently as dense references: the block row at offset o of a block anchored
at a (position ``p = a + o``) sees the context positions ``p - (W - 1) <= t < a`` and the rows
of its own block at offsets ``<= o`` (causal in the block, not windowed); a full layer sees
every context position ``t < a`` and its whole block.

  * a tiny target with 2 heads / 1 KV head / head_dim 32, and two drafters with 4 / 2 / 16 and
    their own MLP width: one all full attention, one (sliding W = 3, full) with W below the
    block size (so both the per-row context window and the causal block matter); each is saved
    with ``save_drafter``, read back by transformers' ``Qwen3Config`` (the layout as the
    reference and SpecForge read it) and by ``load_drafter`` (bit-exact), and decodes: greedy
    DFlash == AR, and every iteration's proposal equals a dense ``jnp`` re-implementation
    (reusing tests/proposers/test_drafter_proposals.py's target taps and primitives, with the mask above);
  * the training attention (dense and chunked) with a window against a dense attention under
    an explicit element-by-element mask, including SpecForge's documented example, W = 1 and a
    per-layer traced W (0 = full); the drafter's ``train_blocks`` equals its ``draft`` over a
    context cache for the same blocks (training and inference share the mask);
  * configs: SpecForge's released layouts read (own shapes accepted by ``check_target``, which
    still refuses what must match), the window fields' refusals and acceptances, the written
    layout read back the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformers import AutoConfig

import dflash_jax as dj
from dflash_jax.config import RopeConfig, TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.model import DrafterModel, init_drafter_params
from dflash_jax.targets import init_target_params
from dflash_jax.nn.attention import (block_sparse_attention, chunked_block_sparse_attention,
                                     training_block_attention)
from dflash_jax.nn.cache import KVCache
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from support.drafter_reference import (MARGIN, RecordingProposer, attention,
                                    layer_params, lm_head_kernel, rms_norm, swiglu, target_taps,
                                    top2_margin)

# torch: transformers' RoPE init functions (the oracle of the drafter's scaled RoPE) return torch tensors
pytestmark = [pytest.mark.xdist_group("test_drafter_shapes"), pytest.mark.torch]

TARGET = TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                      num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=256)
BS, MAX_NEW, WINDOW = 8, 16, 3
OWN_SHAPES = dict(num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=40)
_SHAPED = dataclasses.replace(DrafterConfig.for_target(TARGET, 2, BS, 63, (1, 3)), **OWN_SHAPES)
YARN = RopeConfig(theta=1e6, rope_type="yarn", factor=4.0, original_max_position_embeddings=64)
DRAFTERS = {"own-shapes": dataclasses.replace(_SHAPED, rope=YARN),  # and its own RoPE: YaRN
            "sliding": dataclasses.replace(_SHAPED, sliding_window=WINDOW,
                                           layer_types=("sliding_attention", "full_attention"))}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (target, drafter loaded back from its save_drafter directory, (inverse
    frequencies, cos/sin scale) of its RoPE as transformers computes them from that directory's
    config.json, the directory)."""
    target = dj.Target(TARGET, random_params(lambda: init_target_params(TARGET, jax.random.key(0)), 10))
    out = {}
    for i, (name, cfg) in enumerate(DRAFTERS.items()):
        cfg.check_target(TARGET)  # own attention shapes are fine
        params = random_params(lambda: init_drafter_params(cfg, jax.random.key(0)), 20 + i)
        path = str(tmp_path_factory.mktemp(name))
        dj.save_drafter(dj.Drafter(cfg, params), path)
        loaded = dj.load_drafter(path, target)
        assert loaded.config == cfg
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                               loaded.params, params)
        out[name] = (target, loaded, transformers_rope(path), path)
    return out


def random_params(init, seed: int):
    """The parameter tree ``init()`` builds (shapes only, nothing compiled), filled from numpy:
    kernels and embeddings N(0, 0.35^2), every RMSNorm weight 1 + N(0, 0.2^2) (unit weights
    would hide a swapped or missing norm)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, s: jnp.asarray((1.0 + 0.2 * rng.normal(size=s.shape))
                                    if "weight" in jax.tree_util.keystr(path)
                                    else 0.35 * rng.normal(size=s.shape), jnp.float32),
        jax.eval_shape(init))


def transformers_rope(path):
    """(inv_freq float32[Dh/2], scaling) of the drafter config.json at ``path`` as read by
    transformers' Qwen3Config: ``ROPE_INIT_FUNCTIONS`` for scaled RoPE, theta^(-2i/Dh) else."""
    c = AutoConfig.from_pretrained(path)
    kind = c.rope_parameters.get("rope_type", "default")
    if kind == "default":
        dh = c.head_dim
        return jnp.asarray(1.0 / c.rope_parameters["rope_theta"] ** (np.arange(0, dh, 2) / dh), jnp.float32), 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](c)
    return jnp.asarray(inv_freq.numpy(), jnp.float32), float(scaling)


def rope(x, positions, inv_freq, scaling):
    """Rotate-half RoPE of x [T, heads, Dh] at positions [T], cos/sin times ``scaling``."""
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    cos = scaling * jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = scaling * jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


# ---------------------------------------------------------------------------- the reference
def windows_of(dcfg) -> tuple[int, ...]:
    """Per layer W, 0 for full attention (from the config's own fields)."""
    types = dcfg.layer_types or ("full_attention",) * dcfg.num_layers
    return tuple(dcfg.sliding_window if t == "sliding_attention" else 0 for t in types)


@functools.partial(jax.jit, static_argnames=("dcfg", "scaling"))
def draft_logits(dcfg, tparams, dparams, taps, start, block, inv_freq, scaling):
    """float32[bs-1, V]: the drafter's logits at block rows 1..bs-1 (block int32[bs] at
    positions start..start+bs-1, context rows 0..start-1 of taps [S, k*D]), with the layer's
    mask: full, or sliding (context ``pos - (W-1) <= t < start``, block rows ``<= own``)."""
    eps = dcfg.rms_norm_eps
    H, Hkv, Dh = dcfg.num_heads, dcfg.num_kv_heads, dcfg.head_dim
    S, bs = taps.shape[0], block.shape[0]
    c = rms_norm(taps @ dparams["fc"]["kernel"], dparams["hidden_norm"]["weight"], eps)
    ctx_pos, blk_pos = jnp.arange(S), start + jnp.arange(bs)
    h = tparams["embed_tokens"]["embedding"][block]
    for j, w in enumerate(windows_of(dcfg)):
        ctx_vis = jnp.broadcast_to(ctx_pos[None, :] < start, (bs, S))
        blk_vis = jnp.ones((bs, bs), bool)
        if w:
            ctx_vis = ctx_vis & (ctx_pos[None, :] >= blk_pos[:, None] - (w - 1))
            blk_vis = jnp.arange(bs)[None, :] <= jnp.arange(bs)[:, None]
        p = layer_params(dparams, j)
        a = p["self_attn"]
        x = rms_norm(h, p["input_layernorm"]["weight"], eps)
        q = rms_norm((x @ a["q_proj"]["kernel"]).reshape(bs, H, Dh), a["q_norm"]["weight"], eps)
        rows = jnp.concatenate([c, x])
        k = rms_norm((rows @ a["k_proj"]["kernel"]).reshape(S + bs, Hkv, Dh), a["k_norm"]["weight"], eps)
        v = (rows @ a["v_proj"]["kernel"]).reshape(S + bs, Hkv, Dh)
        q = rope(q, blk_pos, inv_freq, scaling)
        k = rope(k, jnp.concatenate([ctx_pos, blk_pos]), inv_freq, scaling)
        visible = jnp.concatenate([ctx_vis, blk_vis], axis=1)
        h = h + attention(q, k, v, visible).reshape(bs, H * Dh) @ a["o_proj"]["kernel"]
        h = h + swiglu(p["mlp"], rms_norm(h, p["post_attention_layernorm"]["weight"], eps))
    return (rms_norm(h, dparams["norm"]["weight"], eps) @ lm_head_kernel(tparams))[1:]


# ---------------------------------------------------------------------------- decoding
def test_decoding_is_lossless_and_drafts_equal_reference(pairs):
    """The sliding drafter (4 / 2 / 16 on the 2 / 1 / 32 target) on a ragged batch: greedy
    DFlash == AR (every generated token is the argmax of the reference target's logits at the
    position before: teacher forcing on the output is greedy AR), and every iteration's proposal
    equals the reference's argmax."""
    target, drafter, rope_tables, _ = pairs["sliding"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, TARGET.vocab_size - 1, size=n).tolist() for n in (5, 11)]
    recorder = RecordingProposer(drafter.config)
    res = dj.generate(target, prompts, MAX_NEW, drafter=drafter, block_size=BS, proposer=recorder)
    D = TARGET.hidden_size
    rows = clear = 0
    for b, (prompt, seq, acc) in enumerate(zip(prompts, res.sequences, res.acceptance_lengths)):
        full = prompt + seq
        tokens = jnp.asarray(np.pad(full, (0, 64 - len(full))), jnp.int32)
        taps = target_taps(target.config, target.params, tokens, drafter.config.target_layer_ids)
        # tap 3 is the last layer's output after the final norm: the target's logits
        ar_logits = np.asarray(taps[len(prompt) - 1:len(full) - 1, D:] @ lm_head_kernel(target.params))
        sure = top2_margin(ar_logits) > MARGIN
        assert len(seq) == MAX_NEW and sure.mean() >= 0.9
        np.testing.assert_array_equal(np.asarray(seq)[sure], ar_logits.argmax(-1)[sure], err_msg=str(b))
        assert len(acc) >= 4
        for i in range(len(acc)):
            start = len(prompt) + sum(acc[:i])
            rec_start, rec_anchor, rec_draft = (r[b] for r in recorder.records[i])
            assert (int(rec_start), int(rec_anchor)) == (start, full[start])
            block = jnp.asarray([full[start]] + [drafter.config.mask_token_id] * (BS - 1), jnp.int32)
            logits = np.asarray(draft_logits(drafter.config, target.params, drafter.params, taps,
                                             jnp.int32(start), block, *rope_tables))
            ok = top2_margin(logits) > MARGIN
            rows, clear = rows + ok.size, clear + int(ok.sum())
            np.testing.assert_array_equal(rec_draft[ok], logits.argmax(-1)[ok], err_msg=f"{b}, {i}")
    assert clear >= 0.9 * rows, (clear, rows)


@functools.partial(jax.jit, static_argnames=("cfg",))
def engine_draft_logits(cfg, tparams, dparams, taps, start, block):
    """The drafter's own draft (``project_context`` of taps [1, S, k*D] with context length
    ``start``, then ``draft`` of block int32[1, bs]) through the target's LM head: [bs-1, V]."""
    model, S, bs = DrafterModel(cfg), taps.shape[1], block.shape[1]
    cache = KVCache.init(cfg.num_layers, 1, S + bs, cfg.num_kv_heads, cfg.head_dim)
    cache = model.apply({"params": dparams}, taps, jnp.arange(S)[None], cache, start[None],
                        method=DrafterModel.project_context)
    emb = tparams["embed_tokens"]["embedding"][block]
    h = model.apply({"params": dparams}, emb, start + jnp.arange(bs)[None], cache,
                    method=DrafterModel.draft)
    return (h @ lm_head_kernel(tparams))[0, 1:]


def test_full_drafter_with_own_shapes_drafts_as_reference(pairs):
    """The all-full 4 / 2 / 16 drafter (the released MoE layout) with its own YaRN RoPE, loaded
    back: its draft over a context cache equals the reference's logits (RoPE tables from
    transformers' reading of its config.json) at several block starts."""
    target, drafter, rope_tables, path = pairs["own-shapes"]
    assert AutoConfig.from_pretrained(path).rope_parameters["rope_type"] == "yarn"
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 63, size=64), jnp.int32)
    taps = target_taps(target.config, target.params, tokens, drafter.config.target_layer_ids)
    for start in (1, 9, 20):
        block = jnp.asarray([int(tokens[start])] + [63] * (BS - 1), jnp.int32)
        want = draft_logits(drafter.config, target.params, drafter.params, taps, jnp.int32(start),
                            block, *rope_tables)
        got = engine_draft_logits(drafter.config, target.params, drafter.params, taps[None],
                                  jnp.int32(start), block[None])
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-4, rtol=1e-4)


def test_reference_window_changes_drafts(pairs):
    """Negative control: the same sliding drafter's reference without its window (all layers
    full) proposes other tokens at some block rows, so the comparison above can fail."""
    target, drafter, rope_tables, _ = pairs["sliding"]
    full_cfg = dataclasses.replace(drafter.config, layer_types=None)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 63, size=64), jnp.int32)
    taps = target_taps(target.config, target.params, tokens, drafter.config.target_layer_ids)
    block = jnp.asarray([5] + [63] * (BS - 1), jnp.int32)
    a, b = (np.asarray(draft_logits(c, target.params, drafter.params, taps, jnp.int32(20), block,
                                    *rope_tables))
            for c in (drafter.config, full_cfg))
    assert (a.argmax(-1) != b.argmax(-1)).any()


# ---------------------------------------------------------------------------- checkpoints
def test_saved_layout_reads_the_same_in_transformers(pairs):
    """config.json as transformers' Qwen3Config (what the reference's and SpecForge's
    DFlashDraftModel build on) reads it: the drafter's own shapes and, for the sliding one,
    layer_types and the window (SpecForge: use_sliding_window true)."""
    for name, (_, drafter, _, path) in pairs.items():
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
        c = AutoConfig.from_pretrained(path)
        assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (4, 2, 16, 40)
        if name == "sliding":
            assert raw["use_sliding_window"] is True and raw["sliding_window"] == WINDOW
            assert raw["max_window_layers"] == 2  # sliding layers are not the trailing ones
            assert list(c.layer_types) == ["sliding_attention", "full_attention"]
            assert c.sliding_window == WINDOW
        else:
            assert list(c.layer_types) == ["full_attention"] * 2 and c.sliding_window is None


# ---------------------------------------------------------------------------- training mask
def reference_mask(anchors, valid, S, T, W):
    """bool[B, N*T, S + N*T], element by element: context column t, block columns after."""
    B, N = anchors.shape
    m = np.zeros((B, N * T, S + N * T), bool)
    for b in range(B):
        for n in range(N):
            if not valid[b, n]:
                continue
            a = int(anchors[b, n])
            for o in range(T):
                row = n * T + o
                for t in range(S):
                    m[b, row, t] = t < a and (W is None or t >= a + o - (W - 1))
                for o2 in range(T):
                    m[b, row, S + n * T + o2] = W is None or o2 <= o
    return m


def dense_attention(q, k_ctx, v_ctx, k_blk, v_blk, mask):
    """Plain masked GQA softmax over [context; all blocks]; rows that see nothing: zeros."""
    B, N, T, H, Dh = q.shape
    Hkv = k_ctx.shape[2]
    k = np.concatenate([k_ctx, k_blk.reshape(B, N * T, Hkv, Dh)], 1).repeat(H // Hkv, 2)
    v = np.concatenate([v_ctx, v_blk.reshape(B, N * T, Hkv, Dh)], 1).repeat(H // Hkv, 2)
    s = np.einsum("bqhd,bkhd->bhqk", q.reshape(B, N * T, H, Dh), k) / np.sqrt(Dh)
    s = np.where(mask[:, None], s, -np.inf)
    mx = np.max(s, -1, keepdims=True)
    p = np.where(mask[:, None], np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, N, T, H, Dh)


def test_reference_mask_is_specforges_documented_example():
    """SpecForge's own example (anchor 6, S = 12, block 4, W = 4): query rows see keys
    [3, 4, 5, 12], [4, 5, 12, 13], [5, 12, 13, 14], [12, 13, 14, 15]."""
    m = reference_mask(np.array([[6]]), np.array([[True]]), 12, 4, 4)
    assert [list(np.flatnonzero(r)) for r in m[0]] == [[3, 4, 5, 12], [4, 5, 12, 13],
                                                        [5, 12, 13, 14], [12, 13, 14, 15]]


def test_training_attention_with_window_equals_dense_mask():
    """Dense and chunked training attention with W = 1, 3 (below the block), 40 (beyond the
    sequence) and 0 (a full layer, as a traced per-layer value gives it) against the dense
    attention under the element-by-element mask; the window-less call too."""
    B, N, T, H, Hkv, Dh, S = 2, 5, 4, 4, 2, 8, 17
    rng = np.random.default_rng(0)
    arr = lambda *s: rng.normal(size=s)
    q, kc, vc, kb, vb = arr(B, N, T, H, Dh), arr(B, S, Hkv, Dh), arr(B, S, Hkv, Dh), arr(B, N, T, Hkv, Dh), arr(B, N, T, Hkv, Dh)
    anchors = np.array([[0, 2, 6, 9, 16], [3, 5, 11, 0, 0]])
    valid = np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)
    args = [jnp.asarray(x, jnp.float32) for x in (q, kc, vc, kb, vb)] + [jnp.asarray(anchors, jnp.int32),
                                                                          jnp.asarray(valid)]
    dense = jax.jit(lambda w: block_sparse_attention(*args, window=w))
    chunked = jax.jit(lambda w: chunked_block_sparse_attention(*args, anchor_chunk=2, context_chunk=5,
                                                               window=w))
    full = dense_attention(q, kc, vc, kb, vb, reference_mask(anchors, valid, S, T, None))
    np.testing.assert_allclose(np.asarray(training_block_attention(*args)), full, atol=2e-5, rtol=1e-4)
    for W in (1, 3, 40, 0):
        want = full if W == 0 else dense_attention(q, kc, vc, kb, vb, reference_mask(anchors, valid, S, T, W))
        for fn in (dense, chunked):
            np.testing.assert_allclose(np.asarray(fn(jnp.int32(W))), want, atol=2e-5, rtol=1e-4,
                                       err_msg=f"W={W}")
    assert not np.allclose(dense_attention(q, kc, vc, kb, vb, reference_mask(anchors, valid, S, T, 3)),
                           full, atol=1e-3)  # the window matters here


def test_train_blocks_equal_draft_over_the_cache(pairs):
    """The sliding drafter's training pass (blocks anchored at 0, 5, 13 of one sequence) equals
    its inference pass over a context cache holding the taps of positions < anchor, row by row."""
    _, drafter, _, _ = pairs["sliding"]
    cfg, model = drafter.config, DrafterModel(drafter.config)
    S, anchors = 24, (1, 13)
    rng = np.random.default_rng(5)
    taps = jnp.asarray(rng.normal(size=(1, S, cfg.num_taps * cfg.hidden_size)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(1, len(anchors) * BS, cfg.hidden_size)), jnp.float32)
    pos = jnp.asarray([a + o for a in anchors for o in range(BS)], jnp.int32)[None]
    train = jax.jit(functools.partial(model.apply, method=DrafterModel.train_blocks))(
        {"params": drafter.params}, emb, pos, taps, jnp.asarray([anchors], jnp.int32),
        jnp.ones((1, len(anchors)), bool))

    @jax.jit
    def infer(a, emb_block, pos_block):
        cache = KVCache.init(cfg.num_layers, 1, S + BS, cfg.num_kv_heads, cfg.head_dim)
        cache = model.apply({"params": drafter.params}, taps, jnp.arange(S)[None], cache, a[None],
                            method=DrafterModel.project_context)
        return model.apply({"params": drafter.params}, emb_block, pos_block, cache,
                           method=DrafterModel.draft)

    for n, a in enumerate(anchors):
        rows = slice(n * BS, (n + 1) * BS)
        np.testing.assert_allclose(np.asarray(infer(jnp.int32(a), emb[:, rows], pos[:, rows])),
                                   np.asarray(train[:, rows]), atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------- configs
QWEN36_27B = {  # SpecForge configs/qwen3.6-27b-dflash.json (the fields that matter here)
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 17408,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "max_position_embeddings": 262144,
    "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 64, "rms_norm_eps": 1e-06, "sliding_window": 2048,
    "tie_word_embeddings": False, "use_sliding_window": True, "vocab_size": 248320,
    "rope_theta": 10000000, "rope_scaling": None,
}
QWEN35_35B_A3B = {  # SpecForge configs/qwen3.5-35b-a3b-dflash.json
    **QWEN36_27B, "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 10, 19, 28, 37]},
    "hidden_size": 2048, "intermediate_size": 6144, "layer_types": ["full_attention"] * 8,
    "max_window_layers": 8, "num_hidden_layers": 8, "num_key_value_heads": 4, "num_target_layers": 40,
    "sliding_window": None, "use_sliding_window": False,
}


def test_released_layouts_read():
    c = DrafterConfig.from_hf_dict(QWEN36_27B)
    assert c.layer_types == ("sliding_attention",) * 4 + ("full_attention",)
    assert c.sliding_window == 2048 and c.layer_windows == (2048,) * 4 + (0,)
    assert DrafterConfig.from_hf_dict(c.to_hf_dict()) == c
    moe = DrafterConfig.from_hf_dict(QWEN35_35B_A3B)
    assert (moe.num_heads, moe.num_kv_heads, moe.head_dim, moe.layer_types) == (32, 4, 128, None)
    target = TargetConfig("qwen3", vocab_size=248320, hidden_size=2048, intermediate_size=512,
                          num_layers=40, num_heads=16, num_kv_heads=2, head_dim=256)
    moe.check_target(target)  # 32 / 4 / 128 on 16 / 2 / 256: fine
    with pytest.raises(ValueError) as e:
        dataclasses.replace(moe, hidden_size=1024, vocab_size=1000, mask_token_id=300000,
                            target_layer_ids=(1, 40)).check_target(target)
    for part in ("hidden_size: drafter 1024, target 2048", "vocab_size: drafter 1000",
                 "mask_token_id 300000 is not a row", "target_layer_ids [40]"):
        assert part in str(e.value)
    with pytest.raises(ValueError, match="num_target_layers vs the target's num_hidden_layers"):
        dataclasses.replace(moe, num_target_layers=36).check_target(target)


def test_written_layouts_read_back_and_in_transformers(tmp_path):
    """Trailing sliding layers also get max_window_layers (the rule readers without layer_types
    apply); both layouts read back as written, in our reader and in transformers."""
    base = DRAFTERS["own-shapes"]
    for types, first in ((("sliding_attention", "full_attention"), 2),
                         (("full_attention", "sliding_attention"), 1)):
        cfg = dataclasses.replace(base, layer_types=types, sliding_window=5)
        raw = cfg.to_hf_dict()
        assert raw["max_window_layers"] == first and raw["layer_types"] == list(types)
        assert DrafterConfig.from_hf_dict(raw) == cfg
        no_types = {k: v for k, v in raw.items() if k != "layer_types"}
        if first == 1:  # suffix layout: the max_window_layers rule alone gives the same
            assert DrafterConfig.from_hf_dict(no_types) == cfg
        (tmp_path / "config.json").write_text(json.dumps(raw))
        c = AutoConfig.from_pretrained(tmp_path)
        assert tuple(c.layer_types) == types and c.sliding_window == 5


@pytest.mark.parametrize("edit, match", [
    ({"use_sliding_window": False}, r"layer_types contains 'sliding_attention' but the config sets "
                                    r"no window \(use_sliding_window=false, sliding_window=2048\)"),
    ({"sliding_window": None}, r"sets no window"),
    ({"sliding_window": 0}, r"sliding_window=0: a sliding window must be an integer >= 1"),
    ({"layer_types": ["sliding_attention"] * 4 + ["chunked_attention"]},
     r"layer_types contains 'chunked_attention'"),
    ({"layer_types": ["sliding_attention"] * 4}, r"layer_types has 4 entries for 5 layers"),
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "swa_window_size": 1024}},
     r"dflash_config.swa_window_size=1024 differs from sliding_window=2048"),
    ({"is_causal": False}, r"is_causal=false with sliding_attention layers"),
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "causal": False}},
     r"dflash_config.causal=false with sliding_attention layers"),
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "use_swa": True}}, r"dflash_config.use_swa=true"),
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "shift_label": True}},
     r"dflash_config.shift_label=true"),
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "pure_draft_prefix_len": 2}},
     r"dflash_config.pure_draft_prefix_len=2"),
])
def test_refused_window_fields(edit, match):
    with pytest.raises(ValueError, match=match):
        DrafterConfig.from_hf_dict({**QWEN36_27B, **edit})


@pytest.mark.parametrize("edit, types", [
    ({"dflash_config": {**QWEN36_27B["dflash_config"], "swa_window_size": 2048}},
     ("sliding_attention",) * 4 + ("full_attention",)),
    ({"layer_types": None, "max_window_layers": 3}, ("full_attention",) * 3 + ("sliding_attention",) * 2),
    ({"layer_types": ["full_attention"] * 5}, None),                 # explicit layer_types win
    ({"layer_types": None, "max_window_layers": 28}, None),          # transformers' default rule
    ({**QWEN35_35B_A3B, "is_causal": False, "sliding_window": 4096}, None),  # full, non-causal
])
def test_accepted_window_fields(edit, types):
    d = {k: v for k, v in {**QWEN36_27B, **edit}.items() if v is not None or k == "sliding_window"}
    c = DrafterConfig.from_hf_dict(d)
    assert c.layer_types == types
    assert c.sliding_window == (None if types is None else 2048)


def test_config_refuses_bad_layouts():
    base = DRAFTERS["own-shapes"]
    with pytest.raises(ValueError, match="sliding_window >= 1"):
        dataclasses.replace(base, layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(ValueError, match="for each of the 2 layers"):
        dataclasses.replace(base, layer_types=("sliding_attention",), sliding_window=4)
    with pytest.raises(ValueError, match="conditioning 'kv'"):
        dataclasses.replace(base, layer_types=("sliding_attention",) * 2, sliding_window=4,
                            conditioning="input")
    # an all-full layout is stored as None: equal drafters compare equal
    assert dataclasses.replace(base, layer_types=("full_attention",) * 2, sliding_window=9) == base
