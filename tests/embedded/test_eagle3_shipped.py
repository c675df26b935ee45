"""The EAGLE-3 drafter shipped for the embedded target (``dflash_jax/assets/eagle3``, name
``embedded-eagle3``): it loads by name in the released layout; greedy speculative output with it
equals autoregressive decoding (chain and tree) on prompts of the benchmark styles, with
acceptance a trained drafter gives and random weights do not (the oracle: a random-weight
EAGLE-3 drafter of the same shapes on the same prompts); and its model card's numbers follow
from the files beside it (parameters from the safetensors header, steps, minutes and the tau
curve from its training metrics)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.eagle3 import named as bd
from dflash_jax.embedded import cards
from dflash_jax.methods.eagle3.card import eagle3_card
from dflash_jax.methods.eagle3.handle import EMBEDDED_EAGLE3_DIR

pytestmark = [pytest.mark.xdist_group("test_eagle3_shipped"), pytest.mark.torch, pytest.mark.slow]

PROMPTS = ["Question: A baker made 24 muffins and sold 15 of them. How many muffins are left?\nAnswer:",
           "def is_palindrome(s):\n    \"\"\"Return True if s reads the same forwards and backwards.\"\"\"\n"]
MAX_NEW = 48


@pytest.fixture(scope="module")
def pair():
    import jax.numpy as jnp

    target, _ = dj.load_embedded(dtype=jnp.float32)
    e3 = bd.load_eagle3_drafter(bd.EMBEDDED_EAGLE3, target, dtype=jnp.float32)
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    return target, e3, ids, dj.generate(target, ids, MAX_NEW)


def _mean_accept(result) -> float:
    return float(np.mean([np.mean(a) for a in result.acceptance_lengths]))


def test_loads_by_name_in_the_released_layout(pair):
    target, e3, _, _ = pair
    with open(os.path.join(EMBEDDED_EAGLE3_DIR, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert e3.config.target_layer_ids == tuple(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == (0, 1, 2)
    assert e3.config.draft_vocab_size == config["draft_vocab_size"] < target.config.vocab_size
    t = np.arange(e3.config.draft_vocab_size) + np.asarray(e3.d2t)  # target id = draft id + d2t
    assert len(set(t.tolist())) == len(t) and t.min() >= 0 and t.max() < target.config.vocab_size
    # dj.load_drafter reads it by name, as the bench's --drafter does, and the deprecated
    # load_eagle3 by "embedded": the same drafter
    from dflash_jax.models.handles import load_eagle3

    by_name = dj.load_drafter("embedded-eagle3", target, dtype=target.dtype)
    with pytest.warns(DeprecationWarning):
        old = load_eagle3("embedded", target, dtype=target.dtype)
    for d in (by_name, old):
        assert type(d) is type(e3) and d.config == e3.config and d.path == e3.path
        np.testing.assert_array_equal(d.d2t, e3.d2t)
        np.testing.assert_array_equal(np.asarray(d.params["fc"]["kernel"]), np.asarray(e3.params["fc"]["kernel"]))


@pytest.mark.parametrize("tree", [None, (16, 4)], ids=["chain", "tree16"])
def test_greedy_equals_ar_with_a_trained_drafter_acceptance(pair, tree):
    """Output == AR; the mean acceptance length is well above a random drafter's on the same
    prompts (a drafter that proposes nothing the target would say accepts ~1)."""
    target, e3, ids, ar = pair
    opts = {} if tree is None else {"tree": tree[0], "tree_topk": tree[1]}
    r = dj.generate(target, ids, MAX_NEW, drafter=e3, **opts)
    assert r.sequences == ar.sequences
    rand = dj.generate(target, ids, MAX_NEW, drafter=bd.random_eagle3(target, dtype=target.dtype), **opts)
    assert rand.sequences == ar.sequences
    trained, random = _mean_accept(r), _mean_accept(rand)
    assert random < 1.5 and trained > 2.0, (trained, random)


def test_model_card_follows_from_the_files():
    with open(os.path.join(EMBEDDED_EAGLE3_DIR, "recipe.json")) as f:
        recipe = json.load(f)
    params = cards.safetensors_params(os.path.join(EMBEDDED_EAGLE3_DIR, "model.safetensors"), skip=("d2t", "t2d"))
    assert recipe["parameters"] == params > 0
    with open(os.path.join(EMBEDDED_EAGLE3_DIR, "training_metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, len(rows) + 1)) and recipe["steps"] == steps[-1]
    assert recipe["sequences_seen"] == recipe["steps"] * recipe["batch_size"]
    assert abs(recipe["minutes"] - sum(r["time_s"] for r in rows) / 60) < 0.1
    assert [c["step"] for c in recipe["curve"]] == [r["step"] for r in rows if "eval_tau" in r]
    card = open(os.path.join(EMBEDDED_EAGLE3_DIR, "README.md")).read()
    assert f"| {recipe['steps']} |" in card and f"{params / 1e6:.2f}M" in card
    assert card == eagle3_card(EMBEDDED_EAGLE3_DIR, recipe)  # the card its writer makes
    # the DFlash drafter's budget beside it follows from that drafter's own recipe
    with open(os.path.join(dj.EMBEDDED_DRAFTER_DIR, "recipe.json")) as f:
        assert recipe["dflash_budget"] == cards.dflash_budget(json.load(f))
