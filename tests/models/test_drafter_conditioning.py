"""``DrafterConfig.conditioning``: how the target's features enter the drafter.

"kv" (the paper's method, tests/models/test_drafter.py), "input" (input fusion: the projected features
are the first layer's input rows before the block, an ordinary causal prefix through the layers)
and "none" (no target features). Each is compared with an independent dense float64 numpy
forward over the whole sequence ``[context; block]`` with explicit masks, through the inference
cache (in chunks, ragged, with uncommitted rows later overwritten) and in training; negative
controls show the comparisons can fail; checkpoints record the conditioning and refuse another;
greedy speculative decoding stays lossless and a training step runs with each.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.dflash.checkpoint import load_drafter_params
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import DrafterModel, init_drafter_params
from dflash_jax.training.features import target_features

TARGET = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=4,
                         num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
MODES = ("kv", "input", "none")
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def drafters():
    """One random target; kv, input and none drafters with the same weights (input has exactly
    kv's parameter tree, none the same without fc and hidden_norm: checked against init in
    test_parameter_trees), random norm weights included. Compiling costs more than running
    here, so the whole module shares these."""
    target = dj.Target.random(TARGET, seed=0, init_scale=0.35)
    kv_cfg = DrafterConfig.for_target(TARGET, 2, 5, 31, (0, 2, 3))
    rng = np.random.default_rng(1)
    leaf = lambda path, s: jnp.asarray(
        (1.0 + 0.1 * rng.normal(size=s.shape)) if "weight" in jax.tree_util.keystr(path)
        else 0.2 * rng.normal(size=s.shape), jnp.float32)
    kv_params = jax.tree_util.tree_map_with_path(
        leaf, jax.eval_shape(lambda: init_drafter_params(kv_cfg, jax.random.key(0))))
    with_mode = lambda m: dataclasses.replace(kv_cfg, conditioning=m)
    none_params = {k: v for k, v in kv_params.items() if k not in ("fc", "hidden_norm")}
    return target, {"kv": dj.Drafter(kv_cfg, kv_params), "input": dj.Drafter(with_mode("input"), kv_params),
                    "none": dj.Drafter(with_mode("none"), none_params)}


# ---------------------------------------------------------------------------- numpy reference
def rms(x, w, eps=1e-6):
    return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def rope(x, pos, theta):
    """x [T, heads, Dh] at integer positions pos [T] (rotate-half convention)."""
    Dh = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, Dh, 2) / Dh)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def reference(cfg, params, mode, ctx_taps, block_emb, start, *, ctx_causal=True):
    """One block of one sequence, dense, float64, no cache.

    ``ctx_taps`` [n, k*D]: the taps of the VISIBLE context (positions 0..n-1); the block
    ``block_emb`` [T, D] sits at positions ``start..start+T-1``.

      kv:    rows = the block; layer j's keys/values are its projections of [c ; x_block]
             (c = hidden_norm(fc(taps)) injected raw into every layer);
      input: rows = [c ; block], an ordinary pre-norm transformer with a mask: context row i
             sees context rows <= i (all of them with ctx_causal=False, a wrong variant), block
             rows see every row;
      none:  rows = the block, which sees only itself.
    """
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    L, H, Hkv, Dh, theta = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope.theta
    n, T = ctx_taps.shape[0], block_emb.shape[0]
    blk = np.asarray(block_emb, np.float64)
    blk_pos = start + np.arange(T)
    c = None if mode == "none" else rms(np.asarray(ctx_taps, np.float64) @ p["fc"]["kernel"],
                                        p["hidden_norm"]["weight"])
    if mode == "input":
        h, pos = np.concatenate([c, blk]), np.concatenate([np.arange(n), blk_pos])
        mask = np.ones((n + T, n + T), bool)
        mask[:n, n:] = False  # context rows never see the block
        if ctx_causal:
            mask[:n, :n] = np.tril(np.ones((n, n), bool))
    else:
        h, pos = blk, blk_pos
        mask = np.ones((T, (n if mode == "kv" else 0) + T), bool)
    for j in range(L):
        lp = jax.tree.map(lambda a: a[j], p["layers"])
        a, m = lp["self_attn"], lp["mlp"]
        R = h.shape[0]
        x = rms(h, lp["input_layernorm"]["weight"])
        kv_in, kv_pos = (np.concatenate([c, x]), np.concatenate([np.arange(n), pos])) if mode == "kv" else (x, pos)
        q = rope(rms((x @ a["q_proj"]["kernel"]).reshape(R, H, Dh), a["q_norm"]["weight"]), pos, theta)
        k = rope(rms((kv_in @ a["k_proj"]["kernel"]).reshape(-1, Hkv, Dh), a["k_norm"]["weight"]), kv_pos, theta)
        v = (kv_in @ a["v_proj"]["kernel"]).reshape(-1, Hkv, Dh)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        s = np.where(mask[None], np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh), -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        h = h + np.einsum("hts,shd->thd", w, v).reshape(R, H * Dh) @ a["o_proj"]["kernel"]
        y = rms(h, lp["post_attention_layernorm"]["weight"])
        g = y @ m["gate_proj"]["kernel"]
        h = h + ((g / (1 + np.exp(-g))) * (y @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    return rms(h[-T:], p["norm"]["weight"])


# ---------------------------------------------------------------------------- model helpers
@functools.partial(jax.jit, static_argnames=("cfg", "method"))
def _apply(cfg, method, params, *args):
    return DrafterModel(cfg).apply({"params": params}, *args, method=getattr(DrafterModel, method))


def methods(d):
    """(project_context, draft, train_blocks) of drafter ``d``, jitted (one compile per config
    and shapes for the whole module)."""
    return tuple(functools.partial(_apply, d.config, m, d.params)
                 for m in ("project_context", "draft", "train_blocks"))


def draft_after(d, chunks, emb, B, S=24):
    """The drafts of blocks ``emb`` [B, T, D] at ``start = ctx_len`` after projecting the context
    in ``chunks``: [(taps [B, C, k*D], positions [B, C], ctx_len [B]), ...]; returns the draft
    hidden states after every chunk."""
    project, draft, _ = methods(d)
    cfg = d.config
    cache = KVCache.init(cfg.num_layers, B, S, cfg.num_kv_heads, cfg.head_dim)
    outs = []
    for taps, pos, ctx_len in chunks:
        cache = project(jnp.asarray(taps), jnp.asarray(pos, jnp.int32), cache, jnp.asarray(ctx_len, jnp.int32))
        assert cache.lengths.tolist() == list(ctx_len)
        start = np.asarray(ctx_len)[:, None] + np.arange(emb.shape[1])
        outs.append(np.asarray(draft(jnp.asarray(emb), jnp.asarray(start, jnp.int32), cache)))
    return outs


def engine_like_chunks(rng, cfg, B=2, S=24):
    """Context updates as the engine makes them, for 2 rows: a ragged prefill (row 0's prompt is
    4 long, row 1's 6: the padding rows 4, 5 of row 0 get garbage taps), an update with nothing
    pending (positions S: dropped), a verified block at 4..8 / 6..10 of which row 0 commits 2
    rows (6..8 rejected: garbage taps) and row 1 all 5, then the next verified block, which
    overwrites row 0's rejected slots. Returns (true taps [B, 16, k*D], chunks)."""
    kD = cfg.num_taps * cfg.hidden_size
    true = rng.normal(size=(B, 16, kD)).astype(np.float32)
    garbage = lambda shape: (3.0 * rng.normal(size=shape)).astype(np.float32)
    prefill = true[:, :6].copy()
    prefill[0, 4:] = garbage((2, kD))
    pos1 = np.stack([np.arange(4, 9), np.arange(6, 11)])
    block1 = np.stack([true[0, 4:9], true[1, 6:11]])
    block1[0, 2:] = garbage((3, kD))
    pos2 = np.stack([np.arange(6, 11), np.arange(11, 16)])
    block2 = np.stack([true[0, 6:11], true[1, 11:16]])
    block2[1, 4] = garbage((kD,))  # row 1's last row is rejected
    chunks = [(prefill, np.broadcast_to(np.arange(6), (B, 6)), [4, 6]),
              (garbage((B, 5, kD)), np.full((B, 5), S), [4, 6]),
              (block1, pos1, [6, 11]),
              (block2, pos2, [10, 15])]
    return true, chunks


# ---------------------------------------------------------------------------- config
def test_config_field_validation_and_hf_round_trip(drafters):
    _, ds = drafters
    with pytest.raises(ValueError, match="conditioning must be one of 'kv', 'input', 'none', got 'kvv'"):
        DrafterConfig.for_target(TARGET, 2, 5, 31, conditioning="kvv")
    kv = ds["kv"].config.to_hf_dict()
    assert "conditioning" not in kv["dflash_config"] and "conditioning" not in kv
    assert kv["dflash_config"] == {"target_layer_ids": [0, 2, 3], "mask_token_id": 31}
    assert DrafterConfig.from_hf_dict(kv).conditioning == "kv"
    # "input" is trained end to end by experiments.paper all --preset smoke (tests/experiments/test_paper.py)
    for m in ("none",):
        d = ds[m].config.to_hf_dict()
        assert d["dflash_config"]["conditioning"] == m
        assert {k: v for k, v in d.items() if k != "dflash_config"} == \
            {k: v for k, v in kv.items() if k != "dflash_config"}
        assert DrafterConfig.from_hf_dict(d) == ds[m].config
    bad = {**kv, "dflash_config": {**kv["dflash_config"], "conditioning": "cross"}}
    with pytest.raises(ValueError, match=r"dflash_config.conditioning must be one of 'kv', 'input', 'none', got 'cross'"):
        DrafterConfig.from_hf_dict(bad)


def test_parameter_trees(drafters):
    """Initialised with the same key, input has kv's parameters (shapes and values: the same
    random leaves); none has kv's without fc and hidden_norm."""
    _, ds = drafters
    shapes = {m: jax.eval_shape(lambda: init_drafter_params(ds[m].config, jax.random.key(1))) for m in MODES}
    assert shapes["input"] == shapes["kv"]
    assert shapes["none"] == {k: v for k, v in shapes["kv"].items() if k not in ("fc", "hidden_norm")}
    assert set(shapes["kv"]) == {"fc", "hidden_norm", "layers", "norm"}
    for m in MODES:  # the fixture's drafters have the init's trees
        assert jax.eval_shape(lambda: ds[m].params) == shapes[m]
    assert ds["none"].dtype == jnp.float32


# ---------------------------------------------------------------------------- against numpy
@pytest.mark.parametrize("mode", ["input", "none"])  # kv: tests/models/test_drafter.py and below
def test_draft_through_cache_matches_reference(drafters, mode):
    """Context in one update (ragged: row 0 has 4 invisible rows) and in engine-like chunks
    (padding rows, dropped writes, rejected rows later overwritten): each draft equals the dense
    reference over the committed context."""
    _, ds = drafters
    d = ds[mode]
    cfg = d.config
    rng = np.random.default_rng(0)
    B, T = 2, cfg.block_size
    emb = rng.normal(size=(B, T, cfg.hidden_size)).astype(np.float32)
    taps = rng.normal(size=(B, 11, cfg.num_taps * cfg.hidden_size)).astype(np.float32)
    ctx_len = [7, 11]
    pos = np.broadcast_to(np.arange(11), (B, 11))
    one, = draft_after(d, [(taps, pos, ctx_len)], emb, B)
    two = draft_after(d, [(taps[:, :6], pos[:, :6], [6, 6]), (taps[:, 6:], pos[:, 6:], ctx_len)], emb, B)
    for b in range(B):
        ref = reference(cfg, d.params, mode, taps[b, :ctx_len[b]], emb[b], ctx_len[b])
        np.testing.assert_allclose(one[b], ref, **TOL)
        np.testing.assert_allclose(two[1][b], ref, **TOL)
        np.testing.assert_allclose(two[0][b], reference(cfg, d.params, mode, taps[b, :6], emb[b], 6), **TOL)
    true, chunks = engine_like_chunks(rng, cfg)
    outs = draft_after(d, chunks, emb, B)
    for (_, _, lens), out in zip(chunks, outs):
        for b in range(B):
            ref = reference(cfg, d.params, mode, true[b, :lens[b]], emb[b], lens[b])
            np.testing.assert_allclose(out[b], ref, **TOL)


@pytest.mark.parametrize("mode", ["input", "none"])  # kv: tests/training/test_training.py
def test_train_blocks_match_reference(drafters, mode):
    """Several anchors per sequence (one at 0: no context) and a padding block."""
    _, ds = drafters
    d = ds[mode]
    cfg = d.config
    _, _, train = methods(d)
    rng = np.random.default_rng(1)
    B, S, T, D = 2, 14, cfg.block_size, cfg.hidden_size
    anchors = np.array([[0, 4, 9, 12], [3, 5, 11, 0]])
    valid = np.array([[True, True, True, True], [True, True, True, False]])
    taps = rng.normal(size=(B, S, cfg.num_taps * D)).astype(np.float32)
    emb = rng.normal(size=(B, 4 * T, D)).astype(np.float32)
    positions = (anchors[:, :, None] + np.arange(T)).reshape(B, 4 * T)
    h = np.asarray(train(jnp.asarray(emb), jnp.asarray(positions, jnp.int32), jnp.asarray(taps),
                         jnp.asarray(anchors, jnp.int32), jnp.asarray(valid))).reshape(B, 4, T, D)
    assert np.all(np.isfinite(h))
    for b in range(B):
        for j in range(4):
            if valid[b, j]:
                a = anchors[b, j]
                ref = reference(cfg, d.params, mode, taps[b, :a], emb[b, j * T:(j + 1) * T], a)
                np.testing.assert_allclose(h[b, j], ref, **TOL)


# ---------------------------------------------------------------------------- negative controls
def test_input_reference_is_not_kv_injection(drafters):
    """The input drafter disagrees with references that inject the raw features into every
    layer (kv), or let context rows see later context rows; the kv drafter (same parameters)
    agrees with the kv reference and not with the input one."""
    _, ds = drafters
    cfg = ds["input"].config
    rng = np.random.default_rng(2)
    taps = rng.normal(size=(2, 11, cfg.num_taps * cfg.hidden_size)).astype(np.float32)
    emb = rng.normal(size=(2, cfg.block_size, cfg.hidden_size)).astype(np.float32)
    chunk = [(taps, np.broadcast_to(np.arange(11), (2, 11)), [9, 9])]
    out = {m: draft_after(ds[m], chunk, emb, 2)[0][0] for m in ("kv", "input")}
    ref = lambda mode, **kw: reference(cfg, ds["input"].params, mode, taps[0, :9], emb[0], 9, **kw)
    np.testing.assert_allclose(out["input"], ref("input"), **TOL)
    np.testing.assert_allclose(out["kv"], ref("kv"), **TOL)
    assert np.abs(out["input"] - ref("kv")).max() > 0.05
    assert np.abs(out["input"] - ref("input", ctx_causal=False)).max() > 0.05
    assert np.abs(out["kv"] - ref("input")).max() > 0.05


def test_none_ignores_the_taps_and_kv_does_not(drafters):
    _, ds = drafters
    cfg = ds["none"].config
    rng = np.random.default_rng(3)
    B, T, D = 2, cfg.block_size, cfg.hidden_size
    taps = rng.normal(size=(B, 14, cfg.num_taps * D)).astype(np.float32)
    other = taps + rng.normal(size=taps.shape).astype(np.float32)
    emb = rng.normal(size=(B, 4 * T, D)).astype(np.float32)
    anchors = np.array([[3, 6, 9, 12], [2, 4, 6, 8]])
    valid = jnp.ones((B, 4), bool)
    positions = jnp.asarray((anchors[:, :, None] + np.arange(T)).reshape(B, 4 * T), jnp.int32)
    pos = np.broadcast_to(np.arange(11), (B, 11))
    for mode, same in (("none", True), ("kv", False), ("input", False)):
        d = ds[mode]
        _, _, train = methods(d)
        drafts = [draft_after(d, [(t[:, :11], pos, [6, 9])], emb[:, :T], B)[0] for t in (taps, other)]
        trains = [np.asarray(train(jnp.asarray(emb), positions, jnp.asarray(t), jnp.asarray(anchors, jnp.int32),
                                   valid)) for t in (taps, other)]
        for x, y in (drafts, trains):
            if same:
                np.testing.assert_array_equal(x, y)
            else:
                assert np.abs(x - y).max() > 1e-2, mode
    # and a none drafter's cache is never written
    project, _, _ = methods(ds["none"])
    cache = KVCache.init(cfg.num_layers, B, 24, cfg.num_kv_heads, cfg.head_dim)
    cache = project(jnp.asarray(taps[:, :11]), jnp.asarray(pos), cache, jnp.array([6, 9]))
    assert cache.lengths.tolist() == [6, 9] and not np.any(np.asarray(cache.k)) and not np.any(np.asarray(cache.v))


# ---------------------------------------------------------------------------- checkpoints
def test_save_load_round_trip_and_refusals(drafters, tmp_path):
    from safetensors.numpy import load_file

    target, ds = drafters
    for m in MODES:
        dj.save_drafter(ds[m], tmp_path / m)
        saved = json.loads((tmp_path / m / "config.json").read_text())["dflash_config"]
        assert saved.get("conditioning") == (None if m == "kv" else m)
        names = set(load_file(tmp_path / m / "model.safetensors"))
        assert ("fc.weight" in names and "hidden_norm.weight" in names) == (m != "none")
        assert "layers.1.self_attn.k_proj.weight" in names
        again = dj.load_drafter(tmp_path / m, target)
        assert again.config == ds[m].config
        assert jax.tree.structure(again.params) == jax.tree.structure(ds[m].params)
        for a, b in zip(jax.tree.leaves(ds[m].params), jax.tree.leaves(again.params)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for saved, asked in (("input", "kv"), ("kv", "input"), ("none", "kv"), ("kv", "none"), ("input", "none")):
        with pytest.raises(ValueError, match=f"the checkpoint at {tmp_path / saved} was trained with "
                                             f"conditioning '{saved}'; this config asks for '{asked}'"):
            load_drafter_params(tmp_path / saved, ds[asked].config)
    # an unknown conditioning in config.json
    cfg = json.loads((tmp_path / "input" / "config.json").read_text())
    cfg["dflash_config"]["conditioning"] = "cross-attention"
    (tmp_path / "input" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="dflash_config.conditioning must be one of 'kv', 'input', 'none'"):
        dj.load_drafter(tmp_path / "input", target)
    with pytest.raises(ValueError, match="dflash_config.conditioning"):
        load_drafter_params(tmp_path / "input", ds["input"].config)


# ---------------------------------------------------------------------------- end to end
PROMPTS = [[1, 2, 3], [5, 9, 2, 7, 7, 1, 4, 8, 3], [6, 0, 2, 2, 5, 1]]
MAX_NEW, BLOCK = 20, 4


@pytest.fixture(scope="module")
def autoregressive(drafters):
    target, _ = drafters
    return dj.generate(target, PROMPTS, MAX_NEW).sequences


def test_greedy_speculative_equals_autoregressive_none(drafters, autoregressive):
    target, ds = drafters
    sp = dj.generate(target, PROMPTS, MAX_NEW, drafter=ds["none"], block_size=BLOCK)
    assert sp.sequences == autoregressive


@pytest.mark.slow
def test_greedy_speculative_equals_autoregressive_input_and_its_cache(drafters, autoregressive):
    """generate's engine with the input drafter (ragged prompts; the random drafter's blocks are
    mostly rejected, so every verified block has uncommitted rows) emits the autoregressive
    tokens, and its drafter cache holds, at every slot below its length, what projecting the
    committed sequence's taps at once gives."""
    target, ds = drafters
    d = ds["input"]
    cfg = d.config
    pre = prepare_decode(target, PROMPTS, MAX_NEW, drafter=d, block_size=BLOCK)
    state = engine.decode(target.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                          jnp.int32(1000), spec=pre.spec)
    out, n, acc = jax.device_get((state.out, state.n, state.accept_lens))
    assert [out[b, :n[b]].tolist() for b in range(3)] == autoregressive
    assert set(acc[acc > 0].tolist()) & {1, 2, 3}  # blocks with rejected rows
    seqs = [p + out[b, :n[b]].tolist() for b, p in enumerate(PROMPTS)]
    L = max(map(len, seqs))
    tokens = jnp.asarray([s + [0] * (L - len(s)) for s in seqs], jnp.int32)  # causal: padding after
    # a budget cut inside a block commits tokens it does not emit: compare the emitted ones
    lengths = np.minimum(np.asarray(state.proposer.cache.lengths), [len(s) for s in seqs])
    assert all(lengths > np.array([len(p) for p in PROMPTS]) + BLOCK)
    taps = target_features(TARGET, target.params, tokens, cfg.target_layer_ids)
    fresh = KVCache.init(cfg.num_layers, 3, state.proposer.cache.max_len, cfg.num_kv_heads, cfg.head_dim)
    fresh = DrafterModel(cfg).apply({"params": d.params}, taps, jnp.broadcast_to(jnp.arange(L), (3, L)),
                                    fresh, jnp.asarray(lengths), method=DrafterModel.project_context)
    for b, k in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(state.proposer.cache.k)[:, b, :k], np.asarray(fresh.k)[:, b, :k], **TOL)
        np.testing.assert_allclose(np.asarray(state.proposer.cache.v)[:, b, :k], np.asarray(fresh.v)[:, b, :k], **TOL)


@pytest.mark.slow
def test_one_training_step_per_conditioning(drafters, tmp_path):
    from dflash_jax.training.data import TokenDataset
    from dflash_jax.methods.dflash.training import DFlashTrainer
    from dflash_jax.training.trainer import TrainConfig, export_run

    target, _ = drafters
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 31, size=(4, 16)).astype(np.int32)
    mask = np.zeros((4, 16), bool)
    mask[:, 4:14] = True
    np.savez(tmp_path / "shard-00000.npz", tokens=tokens, loss_mask=mask, lengths=np.full(4, 14, np.int32))
    data = TokenDataset(str(tmp_path))
    cfg = TrainConfig(steps=1, batch_size=2, num_anchors=4, checkpoint_every=1, keep_checkpoints=1)
    # "input" is trained end to end by experiments.paper all --preset smoke (tests/experiments/test_paper.py)
    for m in ("none",):
        dcfg = DrafterConfig.for_target(TARGET, 1, 4, 31, conditioning=m)
        trainer = DFlashTrainer(target, dcfg, data, str(tmp_path / m), cfg)
        state = trainer.run()
        row = json.loads((tmp_path / m / "metrics.jsonl").read_text().splitlines()[-1])
        assert row["step"] == 1 and row["loss"] > 0 and np.isfinite(row["loss"]) and np.isfinite(row["grad_norm"])
        assert set(state["params"]) == ({"layers", "norm"} if m == "none" else {"fc", "hidden_norm", "layers", "norm"})
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state["params"]))
        # the run's checkpoint exports in the released layout, with its conditioning
        export_run(str(tmp_path / m), str(tmp_path / f"{m}-export"))
        assert dj.load_drafter(tmp_path / f"{m}-export", target).config.conditioning == m
    # the run directory records the conditioning: resuming it with another is refused
    kv = DrafterConfig.for_target(TARGET, 1, 4, 31)
    with pytest.raises(ValueError, match="other settings.*conditioning"):
        DFlashTrainer(target, kv, data, str(tmp_path / "none"), cfg)
