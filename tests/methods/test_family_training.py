"""DSpark's, Domino's and D-PACE's training in the shared trainer (their losses equal SpecForge's:
``training/test_specforge_losses.py``): a DSpark or Domino run from a DFlash drafter starts on its
backbone and its loss falls, its held-out tau runs the method's drafter, the `train` command
takes ``--method dspark|domino`` and D-PACE's ``--loss`` and refuses what does not go with them
before anything loads; a D-PACE run records its loss and refuses a resume with another."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.methods.domino import handle as domino_handle
from dflash_jax.methods.domino.training import DominoTrainer
from dflash_jax.methods.dspark.handle import from_dflash
from dflash_jax.methods.dspark.training import DSparkTrainer
from dflash_jax.training.cli import train
from dflash_jax.training.data import TokenDataset, regenerate
from dflash_jax.training.trainer import TrainConfig

pytestmark = pytest.mark.xdist_group("test_family_training")

CFG = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark-training")
    target = dj.Target.random(CFG, seed=3, init_scale=0.3)
    target.save(str(root / "target"))
    target = dj.load_target(str(root / "target"))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 20, size=int(rng.integers(3, 7))).tolist() for _ in range(24)]
    regenerate(target, prompts, str(root / "data"), max_new_tokens=12, max_len=24, batch_size=8, shard_size=24)
    dflash = dj.Drafter.random(target, num_layers=1, block_size=5, target_layer_ids=(0, 2), seed=4, init_scale=0.3)
    dj.save_drafter(dflash, root / "dflash")
    return root, target, TokenDataset(str(root / "data")), dflash, prompts


CFG_TRAIN = TrainConfig(steps=12, batch_size=8, learning_rate=2e-2, warmup_fraction=0.0, checkpoint_every=6,
                        eval_every=12, eval_max_new_tokens=8, num_anchors=4)


def test_a_dspark_run_from_a_dflash_drafter(setup):
    root, target, data, dflash, prompts = setup
    start = from_dflash(dflash, markov_rank=8)
    trainer = DSparkTrainer(target, start.config, data, str(root / "dspark"), CFG_TRAIN, eval_prompts=prompts[:2],
                            init_from=str(root / "dflash"))
    first = trainer.init_state()["params"]
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
                                     first["layers"], dflash.params["layers"]))
    np.testing.assert_array_equal(np.asarray(first["markov_head"]["markov_w2"]["kernel"]), 0.0)
    trainer.run()
    rows = [json.loads(line) for line in (root / "dspark" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows[-1]["loss"] < rows[0]["loss"] - 0.1, [r["loss"] for r in rows]
    assert len(rows[0]["accuracy_per_pos"]) == start.config.block_size  # every row drafts
    assert 1.0 <= rows[-1]["eval_tau"] <= start.config.block_size + 1
    record = json.loads((root / "dspark" / "run.json").read_text())
    assert record["method"] == "dspark" and record["dspark_loss"] == {"ce_alpha": 0.1, "l1_alpha": 0.9,
                                                                      "confidence_alpha": 1.0}
    # a DFlash drafter whose backbone is not the DSpark drafter's (its block one row longer) is refused
    with pytest.raises(ValueError, match="whose DSpark start"):
        DSparkTrainer(target, from_dflash(dflash, block_size=3).config, data, str(root / "other"), CFG_TRAIN,
                      init_from=str(root / "dflash"))


@pytest.mark.slow
def test_a_domino_run_from_a_dflash_drafter(setup):
    """Its start drafts exactly what the DFlash drafter drafts (DFlash's rows, the correction
    zero); the base loss's weight falls 1 -> 0 over the first half of the run (SpecForge's
    schedule, read at each step's optimizer count); a resume continues the schedule."""
    root, target, data, dflash, prompts = setup
    start = domino_handle.from_dflash(dflash, gru_hidden_dim=6, emb_dim=5)
    assert not start.config.shift_label and start.config.block_size == dflash.config.block_size
    prompt = prompts[0]
    assert (dj.generate(target, [prompt], 16, drafter=start).acceptance_lengths
            == dj.generate(target, [prompt], 16, drafter=dflash).acceptance_lengths)
    run = str(root / "domino")
    trainer = DominoTrainer(target, start.config, data, run, CFG_TRAIN, eval_prompts=prompts[:2],
                            init_from=str(root / "dflash"))
    first = trainer.init_state()["params"]
    np.testing.assert_array_equal(np.asarray(first["embed_proj_out"]["kernel"]), 0.0)
    trainer.run(stop_after=5)
    DominoTrainer(target, start.config, data, run, CFG_TRAIN, eval_prompts=prompts[:2],
                  init_from=str(root / "dflash")).run()
    rows = [json.loads(line) for line in (root / "domino" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows[-1]["loss"] < rows[0]["loss"] - 0.1, [r["loss"] for r in rows]
    np.testing.assert_allclose([r["lambda_base"] for r in rows], [max(0.0, 1 - s / 6) for s in range(12)], atol=1e-6)
    assert len(rows[0]["accuracy_per_pos"]) == start.config.block_size - 1
    assert 1.0 <= rows[-1]["eval_tau"] <= start.config.block_size
    record = json.loads((root / "domino" / "run.json").read_text())
    assert record["method"] == "domino" and record["domino_loss"] == {"lambda_base_start": 1.0,
                                                                      "lambda_base_decay_ratio": 0.5}
    # a DFlash drafter whose backbone is not the Domino drafter's (its block longer) is refused
    other = dataclasses.replace(start.config, block_size=3)
    with pytest.raises(ValueError, match="whose Domino start"):
        DominoTrainer(target, other, data, str(root / "other"), CFG_TRAIN, init_from=str(root / "dflash"))


def test_a_dpace_run_records_its_loss(setup):
    root, target, data, dflash, _ = setup
    cfg = TrainConfig(steps=4, batch_size=8, learning_rate=2e-2, warmup_fraction=0.0, checkpoint_every=4,
                      num_anchors=4)
    DFlashTrainer(target, dflash.config, data, str(root / "dpace"), cfg, loss="dpace", dpace_alpha=0.3).run()
    record = json.loads((root / "dpace" / "run.json").read_text())
    assert record["loss"] == {"type": "dpace", "dpace_alpha": 0.3}
    rows = [json.loads(line) for line in (root / "dpace" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(np.isfinite(r["loss"]) for r in rows)
    with pytest.raises(ValueError, match="loss"):
        DFlashTrainer(target, dflash.config, data, str(root / "dpace"), cfg)  # resumed as plain DFlash
    with pytest.raises(ValueError, match="loss 'focal' is not one of dflash, dpace"):
        DFlashTrainer(target, dflash.config, data, str(root / "x"), cfg, loss="focal")


@pytest.mark.parametrize("argv,match", [
    (["--method", "dspark", "--loss", "dpace"], "--loss is DFlash-only"),
    (["--method", "dspark", "--uniform-weights"], "--uniform-weights is"),
    (["--dpace-alpha", "0.3"], "--dpace-alpha weights D-PACE's loss"),
    (["--loss", "dpace", "--dpace-alpha", "1.5"], "dpace_alpha 1.5 must be in"),
    (["--method", "dspark", "--markov-rank", "0"], "--markov-rank 0"),
    (["--markov-rank", "8"], "--markov-rank is DSpark-only"),
    (["--method", "domino", "--gru-hidden-dim", "0"], "--gru-hidden-dim 0"),
    (["--method", "domino", "--lambda-base-start", "1.5"], "lambda_base_start must be in [0, 1]"),
    (["--method", "domino", "--lambda-base-decay-ratio", "-1"], "lambda_base_decay_ratio must be >= 0"),
    (["--shift-label", "true"], "--shift-label is Domino-only"),
    (["--method", "domino", "--markov-rank", "8"], "--markov-rank is DSpark-only"),
])
def test_the_train_command_refuses_before_loading(argv, match, tmp_path):
    """(``train.main`` raises; the command line prints the message in one line, exit 2.) The
    target and data named do not exist: each refusal comes before anything is read."""
    with pytest.raises(ValueError) as e:
        train.main(["--target", str(tmp_path / "no-target"), "--data", str(tmp_path / "no-data"),
                    "--run", str(tmp_path / "run")] + argv)
    assert match in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("method,fields", [
    ("dspark", ["--markov-rank", "8"]),
    ("domino", ["--gru-hidden-dim", "6", "--emb-dim", "5"]),
])
def test_the_train_command_starts_on_a_dflash_drafter_and_from_scratch(setup, tmp_path, method, fields):
    """``train --method M``: --init-from a DFlash drafter gives the method's drafter on its backbone
    (DSpark one row shorter; Domino with DFlash's rows), without it the released shape (DSpark
    block 7; Domino block 16, shifted rows), each run recording its method and drafter."""
    root, target, data, dflash, _ = setup
    common = ["--target", str(root / "target"), "--data", str(root / "data"), "--steps", "1", "--batch-size", "4",
              "--num-anchors", "2", "--checkpoint-every", "1", "--method", method] + fields
    train.main(common + ["--run", str(tmp_path / "on"), "--init-from", str(root / "dflash")])
    train.main(common + ["--run", str(tmp_path / "fresh"), "--drafter-layers", "1", "--mask-token-id", "63"])
    on, fresh = (json.loads((tmp_path / r / "run.json").read_text()) for r in ("on", "fresh"))
    assert on["method"] == fresh["method"] == method
    assert on["init_from"] and "init_from" not in fresh
    if method == "dspark":
        assert (on["drafter"]["block_size"], fresh["drafter"]["block_size"]) == (4, 7)
        assert on["drafter"]["dflash_config"]["markov_rank"] == 8
    else:
        assert (on["drafter"]["block_size"], fresh["drafter"]["block_size"]) == (5, 16)
        assert [r["drafter"]["dflash_config"]["shift_label"] for r in (on, fresh)] == [False, True]
        assert on["drafter"]["dflash_config"]["gru_hidden_dim"] == 6
