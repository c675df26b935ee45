"""The DFlash drafter against a naive dense reference, and its released checkpoint layout."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.config import default_target_layer_ids
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import DrafterModel

TARGET = dj.TargetConfig("qwen3", vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=6,
                         num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)


def rms(x, w, eps=1e-6):
    return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def rope(x, pos, theta):
    """x [T, heads, Dh] at integer positions pos [T] (rotate-half convention)."""
    Dh = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, Dh, 2) / Dh)
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def reference_block(cfg: DrafterConfig, p, ctx_taps, ctx_len, block_emb, start):
    """One sequence, written from docs/method.md section 3: concatenate context and block rows, mask
    invalid context, softmax, no cache. ctx_taps [C, k*D]; block_emb [T, D]."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    L, H, Hkv, Dh = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    C, T = ctx_taps.shape[0], block_emb.shape[0]
    c = rms(ctx_taps @ p["fc"]["kernel"], p["hidden_norm"]["weight"])
    h = np.asarray(block_emb, np.float64)
    pos = np.concatenate([np.arange(C), start + np.arange(T)])
    visible = np.concatenate([np.arange(C) < ctx_len, np.ones(T, bool)])
    for j in range(L):
        lp = jax.tree.map(lambda a: a[j], p["layers"])
        a = lp["self_attn"]
        x = rms(h, lp["input_layernorm"]["weight"])
        q = rms((x @ a["q_proj"]["kernel"]).reshape(T, H, Dh), a["q_norm"]["weight"])
        q = rope(q, pos[C:], cfg.rope.theta)
        kv_in = np.concatenate([c, x])
        k = rms((kv_in @ a["k_proj"]["kernel"]).reshape(C + T, Hkv, Dh), a["k_norm"]["weight"])
        k = rope(k, pos, cfg.rope.theta)
        v = (kv_in @ a["v_proj"]["kernel"]).reshape(C + T, Hkv, Dh)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh)
        s = np.where(visible[None, None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out = np.einsum("hts,shd->thd", w, v).reshape(T, H * Dh)
        h = h + out @ a["o_proj"]["kernel"]
        m = lp["mlp"]
        y = rms(h, lp["post_attention_layernorm"]["weight"])
        g = y @ m["gate_proj"]["kernel"]
        h = h + ((g / (1 + np.exp(-g))) * (y @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    return rms(h, p["norm"]["weight"])


@pytest.fixture(scope="module")
def drafter():
    target = dj.Target.random(TARGET, seed=0, init_scale=0.2)
    return target, dj.Drafter.random(target, num_layers=2, block_size=5, seed=1, init_scale=0.2,
                                     target_layer_ids=(1, 3, 4))


def test_forward_matches_dense_reference_with_and_without_cache(drafter):
    target, d = drafter
    cfg = d.config
    rng = np.random.default_rng(0)
    B, C, T, S = 2, 11, cfg.block_size, 24
    taps = rng.normal(size=(B, C, cfg.num_taps * cfg.hidden_size)).astype(np.float32)
    emb = rng.normal(size=(B, T, cfg.hidden_size)).astype(np.float32)
    ctx_len = np.array([7, 11])  # row 0 has 4 padded context rows that must stay invisible
    start = ctx_len
    model = DrafterModel(cfg)
    blk_pos = jnp.asarray(start[:, None] + np.arange(T))
    ctx_pos = jnp.broadcast_to(jnp.arange(C), (B, C))
    cache = KVCache.init(cfg.num_layers, B, S, cfg.num_kv_heads, cfg.head_dim)

    project = functools.partial(model.apply, {"params": d.params}, method=DrafterModel.project_context)
    draft = functools.partial(model.apply, {"params": d.params}, method=DrafterModel.draft)
    # all context in one update, then the block
    c1 = project(jnp.asarray(taps), ctx_pos, cache, jnp.asarray(ctx_len))
    h1 = draft(jnp.asarray(emb), blk_pos, c1)
    # context in two chunks through the cache (prefill, then a verified block), then the block
    c2 = project(jnp.asarray(taps[:, :5]), ctx_pos[:, :5], cache, jnp.array([5, 5]))
    c2 = project(jnp.asarray(taps[:, 5:]), ctx_pos[:, 5:], c2, jnp.asarray(ctx_len))
    h2 = draft(jnp.asarray(emb), blk_pos, c2)
    for b in range(B):
        ref = reference_block(cfg, d.params, taps[b], ctx_len[b], emb[b], start[b])
        np.testing.assert_allclose(np.asarray(h1[b]), ref, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(h2[b]), ref, atol=2e-5, rtol=1e-5)
    assert c1.lengths.tolist() == c2.lengths.tolist() == ctx_len.tolist()
    # the block's own K/V never enter the cache: slots past the context stay empty
    assert not np.any(np.asarray(c1.k)[:, 1, C:])


def test_invisible_context_does_not_matter(drafter):
    """Changing context rows at positions >= ctx_len leaves the draft unchanged; changing a
    visible one changes it."""
    target, d = drafter
    cfg = d.config
    rng = np.random.default_rng(1)
    taps = rng.normal(size=(1, 8, cfg.num_taps * cfg.hidden_size)).astype(np.float32)
    emb = jnp.asarray(rng.normal(size=(1, cfg.block_size, cfg.hidden_size)), jnp.float32)
    model = DrafterModel(cfg)
    cache = KVCache.init(cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim)
    pos = jnp.arange(8)[None]
    blk = 6 + jnp.arange(cfg.block_size)[None]

    def run(t):
        ctx = model.apply({"params": d.params}, jnp.asarray(t), pos, cache, jnp.array([6]),
                          method=DrafterModel.project_context)
        return np.asarray(model.apply({"params": d.params}, emb, blk, ctx, method=DrafterModel.draft))

    base = run(taps)
    hidden = taps.copy()
    hidden[:, 6:] += 5.0
    np.testing.assert_array_equal(run(hidden), base)
    seen = taps.copy()
    seen[:, 5] += 5.0
    assert np.abs(run(seen) - base).max() > 1e-3


def test_default_taps():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(36, 1) == (18,)
    assert DrafterConfig.for_target(TARGET, 3, 16, 39).target_layer_ids == (1, 2, 3)


def test_save_load_released_layout_bit_exact(drafter, tmp_path):
    target, d = drafter
    dj.save_drafter(d, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["block_size"] == 5 and cfg["num_target_layers"] == 6
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 3, 4], "mask_token_id": 39}
    from safetensors.numpy import load_file

    names = set(load_file(tmp_path / "model.safetensors"))
    assert "fc.weight" in names and "layers.1.self_attn.k_norm.weight" in names
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert load_file(tmp_path / "model.safetensors")["fc.weight"].shape == (32, 96)
    again = dj.load_drafter(tmp_path, target)
    assert again.config == d.config
    for a, b in zip(jax.tree.leaves(d.params), jax.tree.leaves(again.params)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_config_without_taps_uses_the_formula(drafter, tmp_path):
    target, d = drafter
    dj.save_drafter(d, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    assert DrafterConfig.from_hf_dict(cfg).target_layer_ids == default_target_layer_ids(6, 2) == (1, 3)


def test_mismatched_pairs_fail_clearly(drafter, tmp_path):
    target, d = drafter
    dj.save_drafter(d, tmp_path / "d")
    other = dj.Target.random(dj.TargetConfig("qwen3", vocab_size=30, hidden_size=48, intermediate_size=48,
                                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8))
    with pytest.raises(ValueError) as e:
        dj.load_drafter(tmp_path / "d", other)
    msg = str(e.value)
    for part in ("hidden_size: drafter 32, target 48", "vocab_size: drafter 40, target 30",
                 "num_target_layers", "mask_token_id 39", "target_layer_ids [4]"):
        assert part in msg, msg
    with pytest.raises(ValueError, match="drafter and target do not match"):
        dj.generate(other, [[1, 2]], 3, drafter=d)


def test_missing_drafter_tensor_and_fields(drafter, tmp_path):
    target, d = drafter
    dj.save_drafter(d, tmp_path)
    from safetensors.numpy import load_file, save_file

    t = load_file(tmp_path / "model.safetensors")
    del t["hidden_norm.weight"]
    save_file(t, tmp_path / "model.safetensors")
    with pytest.raises(dj.CheckpointError, match="missing tensors \\(1\\):\n    hidden_norm.weight"):
        dj.load_drafter(tmp_path, target)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    with pytest.raises(ValueError, match="mask_token_id"):
        DrafterConfig.from_hf_dict(cfg)
    del cfg["num_target_layers"]
    with pytest.raises(ValueError, match="num_target_layers"):
        DrafterConfig.from_hf_dict(cfg)
