"""The target's split-layer layout (``split_layer_params``): the same model as the stacked
``nn.scan`` one, and the CPU decode loop reads the weights in place (no per-step copy of a
layer's slice out of the stack)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets import base as targets_base
from dflash_jax.targets import dense, target_forward
from dflash_jax.targets.dense.model import split_layer_params

# dimensions no other array of the program shares, so a copied weight slice is recognisable
CFG = dj.TargetConfig("qwen3", vocab_size=72, hidden_size=40, intermediate_size=56, num_layers=3,
                      num_heads=2, num_kv_heads=1, head_dim=20, max_position_embeddings=128)


@pytest.fixture(scope="module")
def target():
    return dj.Target.random(CFG, seed=3, init_scale=0.2)


def test_split_params_layout(target):
    split = split_layer_params(target.params)
    assert "layers" not in split and sorted(k for k in split if k.startswith("layers_")) == \
        ["layers_0", "layers_1", "layers_2"]
    for i in range(CFG.num_layers):
        flat = jax.tree_util.tree_leaves_with_path(split[f"layers_{i}"])
        stacked = dict(jax.tree_util.tree_leaves_with_path(target.params["layers"]))
        for path, leaf in flat:
            np.testing.assert_array_equal(leaf, stacked[path][i])
    assert split_layer_params(split) is split  # already split: unchanged


@pytest.mark.slow
def test_split_forward_equals_stacked(target):
    """Prefill then a 5-row block through the cache, taps of every layer: logits, taps and the
    written cache agree with the scanned model's."""
    rng = np.random.default_rng(0)
    B, P = 2, 9
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, P)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    block = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, 5)), jnp.int32)
    bpos = P + jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (B, 5))
    outs = []
    for params in (target.params, split_layer_params(target.params)):
        cache = KVCache.for_config(CFG, B, 32)
        l1, t1, cache = target_forward(CFG, params, tokens, pos, cache, tap_layer_ids=(0, 1, 2))
        l2, t2, cache = target_forward(CFG, params, block, bpos, cache, tap_layer_ids=(0, 2))
        outs.append((l1, t1, l2, t2, cache.k, cache.v, cache.lengths))
    for a, b in zip(*outs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert float(jnp.std(outs[0][2])) > 0.1  # the comparison is of non-trivial logits


def copied_weight_slices(hlo: str, params) -> list[str]:
    """The (dynamic-)slice instructions inside a compiled program's loop body whose result has
    the shape of one layer's slice of a stacked weight ([N, a, b] -> [a, b]): a copy of that
    weight per iteration (slices before the loop, made once per call, are not counted)."""
    shapes = {tuple(x.shape[1:]) for x in jax.tree_util.tree_leaves(params["layers"]) if x.ndim == 3}
    found = []
    for line in hlo.splitlines():
        m = re.search(r"= f32\[([\d,]+)\]\{[^}]*\} (dynamic-slice|slice|fusion)\(", line)
        if not m or "/while/body/" not in line or (
                "slice" not in m.group(2) and "slice" not in line.split("=")[0]):
            continue
        dims = tuple(int(d) for d in m.group(1).split(","))
        if dims in shapes or (len(dims) == 3 and dims[0] == 1 and dims[1:] in shapes):
            found.append(line.strip()[:160])
    return found


def test_decode_loop_reads_the_weights_in_place(target):
    """The compiled CPU decode loop copies no layer weight slice; the same detector finds the
    copies in a loop over the stacked (scanned) layout, so it can see them."""
    pre = prepare_decode(target, [[5, 6, 7, 8]], 12)
    hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new,
                              pre.stop_ids, np.int32(11), spec=pre.spec).compile().as_text()
    assert copied_weight_slices(hlo, target.params) == []

    def stacked_loop(params, tokens):  # the scanned model inside a loop, as decode ran it before
        def body(i, acc):
            logits, _, _ = target_forward(CFG, params, (tokens + i) % CFG.vocab_size,
                                          jnp.zeros_like(tokens))
            return acc + jnp.sum(logits)
        return jax.lax.fori_loop(0, 4, body, jnp.float32(0))

    tokens = jnp.ones((1, 1), jnp.int32)
    control = jax.jit(stacked_loop).lower(target.params, tokens).compile().as_text()
    assert copied_weight_slices(control, target.params), "the detector finds no copy in the control"


def test_targets_over_the_size_cap_stay_stacked(target, monkeypatch):
    """Above ``SPLIT_MAX_BYTES`` of layer weights the loop keeps the stacked layout (no second
    copy of the weights), and still decodes the same tokens."""
    ref = dj.generate(target, [[5, 6, 7, 8]], 6).sequences
    monkeypatch.setattr(targets_base, "SPLIT_MAX_BYTES", 0)
    jax.clear_caches()  # the layout is chosen when decode is traced
    try:
        assert dense.QWEN3.loop_params(target.params) is target.params
        pre = prepare_decode(target, [[5, 6, 7, 8]], 12)
        hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new,
                                  pre.stop_ids, np.int32(11), spec=pre.spec).compile().as_text()
        assert copied_weight_slices(hlo, target.params)
        assert dj.generate(target, [[5, 6, 7, 8]], 6).sequences == ref
    finally:
        monkeypatch.undo()
        jax.clear_caches()


@pytest.mark.slow
def test_greedy_decode_unchanged_by_the_split(target):
    """The engine (split inside decode) gives the tokens of a step-by-step greedy loop over the
    stacked model's full forward (the independent oracle: no cache, no engine)."""
    prompt = [3, 14, 15, 9, 26]
    got = dj.generate(target, [prompt], 10).sequences[0]
    seq = list(prompt)
    for _ in range(10):
        toks = jnp.asarray([seq], jnp.int32)
        logits, _, _ = target_forward(CFG, target.params, toks,
                                      jnp.arange(len(seq), dtype=jnp.int32)[None])
        seq.append(int(jnp.argmax(logits[0, -1])))
    assert list(got) == seq[len(prompt):]
