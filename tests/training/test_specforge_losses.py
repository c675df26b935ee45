"""The DFlash family's training objectives against SpecForge's own (``tools/specforge_loss_reference.py``
ran its ``OnlineDFlashModel`` and ``OnlineDSparkModel`` at a6b6b023 on one fixed batch with
fixed anchors into ``tests/fixtures/specforge_losses.json``): DFlash's weighted cross-entropy,
D-PACE's three weightings (``methods/dflash/loss.py``) and DSpark's cross-entropy + L1 +
confidence objective (``methods/dspark/loss.py``), each loss and the norm of its gradient in
every drafter tensor, on the tiny pair of ``tools/dspark_reference.py``; and Domino's
(``methods/domino/loss.py``) against its ``OnlineDominoModel`` on the same batch
(``tools/domino_reference.py``, ``tests/fixtures/domino_reference.json``)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.checkpoints import params_to_tensors
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs
from dflash_jax.methods.dflash.loss import drafter_loss
from dflash_jax.methods.dspark.checkpoint import dspark_tensor_specs
from dflash_jax.methods.domino.checkpoint import domino_tensor_specs
from dflash_jax.methods.domino.loss import domino_loss, lambda_base
from dflash_jax.methods.dspark.loss import dspark_loss
from dflash_jax.tools import domino_reference as domino_ref
from dflash_jax.tools import dspark_reference as pair
from dflash_jax.tools import specforge_loss_reference as ref
from dflash_jax.training.blocks import block_loss_weights
from dflash_jax.training.features import target_features

pytestmark = pytest.mark.xdist_group("test_specforge_losses")

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "specforge_losses.json")
DOMINO_FIXTURE = os.path.join(os.path.dirname(FIXTURE), "domino_reference.json")


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target_dir, drafters = pair.write_pair(str(tmp_path_factory.mktemp("losses")))
    target = dj.load_target(target_dir, dtype=jnp.float32)
    drafter = dj.load_drafter(drafters["vanilla"], target)
    tokens = jnp.asarray(ref.TOKENS, jnp.int32)
    ids = drafter.config.target_layer_ids + (target.config.num_layers - 1,)
    feats = target_features(target.config, target.params, tokens, ids)
    D = target.config.hidden_size
    batch = dict(tokens=tokens, loss_mask=jnp.asarray(ref.LOSS_MASK, bool), taps=feats[..., :-D],
                 anchors=jnp.asarray(ref.ANCHORS, jnp.int32), valid=jnp.asarray(ref.VALID, bool))
    return target, drafter, batch, feats[..., -D:]


def _norms(grads, specs) -> dict:
    return {n: float(np.linalg.norm(t)) for n, t in params_to_tensors(grads, specs).items()}


def test_the_fixture_is_of_this_batch(fixture):
    assert fixture["reference"] == f"sgl-project/SpecForge@{pair.SPECFORGE_COMMIT}" and fixture["seed"] == pair.SEED
    assert (fixture["tokens"], fixture["anchors"], fixture["valid"]) == (ref.TOKENS, ref.ANCHORS, ref.VALID)
    assert (fixture["dflash_gamma"], fixture["dpace_alpha"]) == (ref.DFLASH_GAMMA, ref.DPACE_ALPHA)


@pytest.mark.parametrize("loss_type", ["dflash", "dpace", "dpace-cumulative-confidence-only",
                                       "dpace-continuation-value-only"])
def test_dflash_and_dpace_losses_equal_specforge(setup, fixture, loss_type):
    target, drafter, batch, _ = setup
    cfg = drafter.config.backbone
    params = {k: v for k, v in drafter.params.items() if k not in ("markov_head", "confidence_head")}
    weights = jnp.asarray(block_loss_weights(cfg.block_size, ref.DFLASH_GAMMA))

    def loss(p):
        return drafter_loss(p, target.params, batch["tokens"], batch["loss_mask"], batch["taps"], batch["anchors"],
                            batch["valid"], weights, dcfg=cfg, tcfg=target.config, loss_type=loss_type,
                            dpace_alpha=ref.DPACE_ALPHA)[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    theirs = fixture["dflash"][loss_type]
    np.testing.assert_allclose(float(value), theirs["loss"], rtol=2e-5)
    ours = _norms(grads, drafter_tensor_specs(cfg))
    assert set(ours) == set(theirs["grad_norms"])
    for name, norm in theirs["grad_norms"].items():
        np.testing.assert_allclose(ours[name], norm, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", [0, 1], ids=["defaults", "gamma-and-alphas"])
def test_dspark_loss_equals_specforge(setup, fixture, case):
    target, drafter, batch, last = setup
    theirs = fixture["dspark"][case]
    s = theirs["settings"]
    kw = {"gamma": s["loss_decay_gamma"], "ce_alpha": s.get("dspark_ce_loss_alpha", 0.1),
          "l1_alpha": s.get("dspark_l1_loss_alpha", 0.9), "confidence_alpha": s.get("dspark_confidence_head_alpha", 1.0)}

    def loss(p):
        return dspark_loss(p, target.params, batch["tokens"], batch["loss_mask"], batch["taps"], last,
                           batch["anchors"], batch["valid"], dcfg=drafter.config, tcfg=target.config, **kw)

    (value, metrics), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(drafter.params)
    np.testing.assert_allclose(float(value), theirs["loss"], rtol=2e-5)
    for ours, name in (("ce", "ce_loss"), ("l1", "l1_loss"), ("confidence", "confidence_loss")):
        np.testing.assert_allclose(float(metrics[ours]), theirs["parts"][name], rtol=2e-5, err_msg=name)
    ours = _norms(grads, dspark_tensor_specs(drafter.config))
    assert set(ours) == set(theirs["grad_norms"])
    for name, norm in theirs["grad_norms"].items():
        np.testing.assert_allclose(ours[name], norm, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def domino(tmp_path_factory):
    with open(DOMINO_FIXTURE) as f:
        fixture = json.load(f)
    target_dir, drafters = domino_ref.write_pair(str(tmp_path_factory.mktemp("domino-losses")))
    target = dj.load_target(target_dir, dtype=jnp.float32)
    return fixture, target, {kind: dj.load_drafter(path, target) for kind, path in drafters.items()}


@pytest.mark.parametrize("kind", ["shifted", "unshifted"])
@pytest.mark.parametrize("case", [0, 1], ids=["defaults", "gamma-and-lambda"])
def test_domino_loss_equals_specforge(domino, kind, case):
    """SpecForge's OnlineDominoModel on the released rows (shift_label, one uncorrected draft)
    and DFlash's (none uncorrected), without and with the decay, at two base-loss weights."""
    fixture, target, drafters = domino
    assert fixture["loss_batch"] == {"tokens": ref.TOKENS, "loss_mask": ref.LOSS_MASK, "anchors": ref.ANCHORS,
                                     "valid": ref.VALID}
    drafter, theirs = drafters[kind], fixture["losses"][kind][case]
    s = theirs["settings"]
    tokens = jnp.asarray(ref.TOKENS, jnp.int32)
    taps = target_features(target.config, target.params, tokens, drafter.config.target_layer_ids)

    def loss(p):
        return domino_loss(p, target.params, tokens, jnp.asarray(ref.LOSS_MASK, bool), taps,
                           jnp.asarray(ref.ANCHORS, jnp.int32), jnp.asarray(ref.VALID, bool), s["lambda_base"],
                           dcfg=drafter.config, tcfg=target.config, gamma=s["loss_decay_gamma"])

    (value, metrics), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(drafter.params)
    np.testing.assert_allclose(float(value), theirs["loss"], rtol=2e-5)
    np.testing.assert_allclose([float(metrics["final"]), float(metrics["base"])], [theirs["final"], theirs["base"]],
                               rtol=2e-5)
    ours = _norms(grads, domino_tensor_specs(drafter.config))
    assert set(ours) == set(theirs["grad_norms"])
    for name, norm in theirs["grad_norms"].items():
        np.testing.assert_allclose(ours[name], norm, rtol=1e-4, atol=1e-6, err_msg=name)


def test_lambda_base_is_specforges_schedule():
    """linear_lambda_base of SpecForge's training strategies: 1 -> 0 over the first half, then 0."""
    got = [float(lambda_base(s, 10)) for s in (0, 1, 4, 5, 9)]
    np.testing.assert_allclose(got, [1.0, 0.8, 0.2, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(float(lambda_base(3, 7, start=0.5, decay_ratio=1.0)), 0.5 * (1 - 3 / 7), rtol=1e-6)
    assert float(lambda_base(0, 1)) == 1.0 and float(lambda_base(1, 1)) == 0.0
