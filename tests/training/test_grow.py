"""A training run started from a drafter of another shape (``methods.dflash.grow``): grown
drafters (more layers whose drafts are unchanged at step 0, bit for bit: the drafter's
confidence in every draft of a decode and the training loss of a batch) and another block size
(the same weights); what may not differ is refused before anything trains."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.dflash.grow import ZEROED, grow_params, start_difference
from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.training.data import TokenDataset, regenerate
from dflash_jax.training.trainer import TrainConfig

from support.drafter_reference import recording

pytestmark = pytest.mark.xdist_group("test_grow")

CFG = dj.TargetConfig("qwen3", vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256)
TRAIN = TrainConfig(steps=3, batch_size=4, learning_rate=1e-2, warmup_fraction=0.0, checkpoint_every=3,
                    num_anchors=4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("grow")
    target = dj.Target.random(CFG, seed=5, init_scale=0.3)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 40, size=int(rng.integers(4, 8))).tolist() for _ in range(8)]
    regenerate(target, prompts, str(root / "data"), max_new_tokens=16, max_len=32, batch_size=8, shard_size=8)
    start = dj.Drafter.random(target, num_layers=1, block_size=6, target_layer_ids=(0, 2), seed=6, init_scale=0.4)
    dj.save_drafter(start, root / "start")
    return root, target, TokenDataset(str(root / "data")), start, prompts


def _grown(start, layers: int) -> dj.Drafter:
    return dj.Drafter(dataclasses.replace(start.config, num_layers=layers), grow_params(start.params, layers))


def _decode(target, drafter, prompts):
    """(sequences, per iteration: (start, anchor, draft tokens, the drafter's log-probability of
    each)) of a greedy decode."""
    proposer = recording(DFlashProposer, logp=True)(drafter.config)
    out = dj.generate(target, prompts, 24, drafter=drafter, proposer=proposer)
    return np.asarray(out.sequences), proposer.records


def test_grown_layers_are_copies_with_zero_residual_writes(setup):
    _, _, _, start, _ = setup
    grown = grow_params(start.params, 3)
    flat = jax.tree_util.tree_flatten_with_path(grown["layers"])[0]
    before = dict(jax.tree_util.tree_flatten_with_path(start.params["layers"])[0])
    for path, x in flat:
        names = tuple(k.key for k in path)
        assert x.shape[0] == 3 and np.array_equal(x[:1], before[path])  # the trained layer unchanged
        zeroed = any(names[i:i + 2] == z for z in ZEROED for i in range(len(names) - 1))
        want = np.zeros_like(x[1:]) if zeroed else np.repeat(np.asarray(before[path])[-1:], 2, 0)
        assert np.array_equal(x[1:], want), names
    assert {k: v for k, v in grown.items() if k != "layers"} == {k: v for k, v in start.params.items() if k != "layers"}
    assert grow_params(start.params, 1) is start.params
    with pytest.raises(ValueError, match="cannot grow a 1-layer drafter to 0"):
        grow_params(start.params, 0)


def test_a_grown_drafter_drafts_exactly_as_the_one_it_grew_from(setup):
    """Every draft of a greedy decode and the drafter's log-probability of it, bit for bit; a
    grown layer that still writes into the residual stream (its MLP's down projection kept)
    changes them."""
    _, target, _, start, prompts = setup
    want, want_drafts = _decode(target, start, prompts[:2])
    got, got_drafts = _decode(target, _grown(start, 3), prompts[:2])
    assert np.array_equal(got, want) and len(got_drafts) == len(want_drafts) > 2
    for a, b in zip(want_drafts, got_drafts):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    leaky = grow_params(start.params, 2)
    down = leaky["layers"]["mlp"]["down_proj"]["kernel"]
    leaky["layers"]["mlp"]["down_proj"]["kernel"] = down.at[1].set(start.params["layers"]["mlp"]["down_proj"]["kernel"][0])
    _, leaky_drafts = _decode(target, dj.Drafter(dataclasses.replace(start.config, num_layers=2), leaky), prompts[:2])
    assert any(not np.array_equal(a[3], b[3]) for a, b in zip(want_drafts, leaky_drafts))


@pytest.mark.slow  # a training run (the drafts' check above is the fast tier's)
def test_a_grown_run_starts_at_the_start_drafters_loss_and_trains_every_layer(setup, tmp_path):
    root, target, data, start, _ = setup
    one = DFlashTrainer(target, start.config, data, str(tmp_path / "one"), TRAIN, init_from=str(root / "start"))
    three_cfg = dataclasses.replace(start.config, num_layers=3)
    three = DFlashTrainer(target, three_cfg, data, str(tmp_path / "three"), TRAIN, init_from=str(root / "start"),
                          grow=True)
    state = three.init_state()
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["params"],
                                     grow_params(one.init_state()["params"], 3)))
    inputs = one.step_inputs(0)
    loss_one = one.loss(one.init_state()["params"], target.params, *one.device_inputs(target.params, *inputs))[0]
    loss_three = three.loss(state["params"], target.params, *three.device_inputs(target.params, *inputs))[0]
    assert float(loss_three) == float(loss_one)
    final = three.run()["params"]["layers"]
    for a, b in ((final["mlp"]["down_proj"]["kernel"], 0.0), (final["self_attn"]["o_proj"]["kernel"], 0.0)):
        assert np.abs(np.asarray(a)[1:] - b).max() > 0  # the new layers' residual writes trained
    assert json.loads((tmp_path / "three" / "run.json").read_text())["grow"] is True
    # a resume must grow too: the run record says so
    with pytest.raises(ValueError, match="grow"):
        DFlashTrainer(target, three_cfg, data, str(tmp_path / "three"), TRAIN, init_from=str(root / "start"))


def test_another_block_size_starts_from_the_same_weights_and_other_shapes_are_refused(setup, tmp_path):
    root, target, data, start, _ = setup
    at4 = dataclasses.replace(start.config, block_size=4)
    trainer = DFlashTrainer(target, at4, data, str(tmp_path / "b4"), TRAIN, init_from=str(root / "start"))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), trainer.init_state()["params"],
                                     jax.tree.map(lambda x: x.astype(jnp.float32), start.params)))
    assert start_difference(start.config, at4, grow=False) is None
    two = dataclasses.replace(start.config, num_layers=2)
    with pytest.raises(ValueError, match=r"num_layers 1 \(the run's 2\)"):
        DFlashTrainer(target, two, data, str(tmp_path / "x"), TRAIN, init_from=str(root / "start"))
    with pytest.raises(ValueError, match="give --init-from DRAFTER too"):
        DFlashTrainer(target, two, data, str(tmp_path / "x"), TRAIN, grow=True)
    assert "fewer than the starting drafter's 2" in start_difference(two, start.config, grow=True)
    other_taps = dataclasses.replace(two, target_layer_ids=(1, 2))
    with pytest.raises(ValueError, match=r"target_layer_ids \(0, 2\) \(the run's \(1, 2\)\)"):
        DFlashTrainer(target, other_taps, data, str(tmp_path / "x"), TRAIN, init_from=str(root / "start"), grow=True)
