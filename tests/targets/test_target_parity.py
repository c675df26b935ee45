"""The JAX target against transformers' PyTorch Qwen3 / Llama models (fp32, random weights)."""

import jax.numpy as jnp
import numpy as np

import dflash_jax as dj
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets import target_forward

from support.model_parity import torch_forward
import pytest

pytestmark = pytest.mark.torch

TOL = 1e-4


def test_full_forward_logits_and_taps(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    cfg = target.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 40))
    ref_logits, ref_hidden = torch_forward(model, ids)
    taps_ids = (0, cfg.num_layers - 1, 1)
    pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
    logits, taps, _ = target_forward(cfg, target.params, jnp.asarray(ids), pos, tap_layer_ids=taps_ids)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0)
    D = cfg.hidden_size
    for j, i in enumerate(taps_ids):
        # tap of layer i == hidden_states[i + 1] (hidden_states[0] is the embedding output),
        # the last layer included: there transformers returns the output after the final norm
        np.testing.assert_allclose(np.asarray(taps[..., j * D:(j + 1) * D]), ref_hidden[i + 1],
                                   atol=TOL, rtol=0)


def test_last_layer_tap_is_transformers_post_norm_hidden_state(hf_checkpoint):
    """The last layer's tap is hidden_states[-1] (final norm applied), not the raw layer output
    (the convention this project used before, which the reference and serving engines reject),
    on the cached path the engine uses too, and whatever the order of the requested taps."""
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    cfg = target.config
    N, D = cfg.num_layers, cfg.hidden_size
    ids = (np.arange(12)[None] * 7 + 3) % cfg.vocab_size
    captured = {}

    def hook(module, inputs, output):
        captured["raw"] = (output[0] if isinstance(output, tuple) else output).detach().numpy()

    handle = model.model.layers[-1].register_forward_hook(hook)
    _, ref_hidden = torch_forward(model, ids)
    handle.remove()
    assert np.abs(captured["raw"] - ref_hidden[N]).max() > 10 * TOL  # the two conventions differ here
    cache = KVCache.for_config(cfg, 1, 32)
    taps_ids = (N - 1, N // 2, N - 1)
    got = []
    for lo, hi in [(0, 7), (7, 12)]:  # a prompt chunk, then a block, through the cache
        pos = jnp.arange(lo, hi)[None]
        _, taps, cache = target_forward(cfg, target.params, jnp.asarray(ids[:, lo:hi]), pos, cache,
                                        tap_layer_ids=taps_ids)
        got.append(np.asarray(taps))
    taps = np.concatenate(got, axis=1)
    for j, i in enumerate(taps_ids):
        np.testing.assert_allclose(taps[..., j * D:(j + 1) * D], ref_hidden[i + 1], atol=TOL, rtol=0)


def test_token_by_token_through_cache(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    cfg = target.config
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, size=(1, 24))
    ref_logits, ref_hidden = torch_forward(model, ids)
    cache = KVCache.for_config(cfg, 1, 64)
    # a prompt chunk, then single tokens, then a 5-token block: the three ways the engine calls it
    chunks = [(0, 10)] + [(t, t + 1) for t in range(10, 19)] + [(19, 24)]
    for lo, hi in chunks:
        tok = jnp.asarray(ids[:, lo:hi])
        pos = jnp.arange(lo, hi)[None]
        logits, taps, cache = target_forward(cfg, target.params, tok, pos, cache, tap_layer_ids=(1,))
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(taps), ref_hidden[2][:, lo:hi], atol=TOL, rtol=0)
        assert int(cache.lengths[0]) == hi


def test_ragged_rows_at_different_positions(hf_checkpoint):
    """Rows of one batch decode at different positions through a shared cache."""
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    cfg = target.config
    rng = np.random.default_rng(2)
    a = rng.integers(0, cfg.vocab_size, size=9)
    b = rng.integers(0, cfg.vocab_size, size=14)
    ref_a, _ = torch_forward(model, a[None])
    ref_b, _ = torch_forward(model, b[None])
    cache = KVCache.for_config(cfg, 2, 32)
    prompt = np.zeros((2, 12), np.int64)
    prompt[0, :7], prompt[1, :12] = a[:7], b[:12]
    _, _, cache = target_forward(cfg, target.params, jnp.asarray(prompt),
                                 jnp.broadcast_to(jnp.arange(12), (2, 12)), cache)
    cache = cache.crop(jnp.array([7, 12]))
    # next: row 0 feeds a[7:9] at positions 7, 8; row 1 feeds b[12:14] at 12, 13
    tok = jnp.asarray(np.stack([a[7:9], b[12:14]]))
    pos = jnp.array([[7, 8], [12, 13]])
    logits, _, cache = target_forward(cfg, target.params, tok, pos, cache)
    np.testing.assert_allclose(np.asarray(logits[0]), ref_a[0, 7:9], atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(logits[1]), ref_b[0, 12:14], atol=TOL, rtol=0)
    assert cache.lengths.tolist() == [9, 14]


def test_logit_index_selects_one_position(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    cfg = target.config
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 10))
    ref, _ = torch_forward(model, ids)
    idx = jnp.array([4, 9])
    logits, _, _ = target_forward(cfg, target.params, jnp.asarray(ids),
                                  jnp.broadcast_to(jnp.arange(10), (2, 10)), logit_index=idx)
    assert logits.shape == (2, 1, cfg.vocab_size)
    np.testing.assert_allclose(np.asarray(logits[:, 0]), ref[[0, 1], [4, 9]], atol=TOL, rtol=0)
