"""The embedded drafter's model card: a continued-training stage is read from its run and
data directories (held-out tau against steps, the mean training loss before each point,
minutes), and the shipped card is what ``cards.drafter_card`` writes from the shipped
recipe and the committed bench report (a card edited by hand, or a recipe changed without
its card, fails)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dflash_jax.embedded import cards
from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def test_a_training_stage_is_read_from_its_run_and_data(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    run.mkdir(), data.mkdir()
    _write(run / "run.json", {"train": {"steps": 120, "batch_size": 8, "num_anchors": 32, "learning_rate": 3e-4,
                                        "warmup_fraction": 0.04, "weight_decay": 0.0, "gamma": 7.0}})
    _write(data / "metadata.json", {"sequences": 480, "response_tokens": 51234, "complete": True})
    rng = np.random.default_rng(0)
    loss, secs = rng.uniform(1, 3, 120), rng.uniform(2, 4, 120)
    evals = {40: 2.5, 80: 2.75, 120: 3.0}
    with open(run / "metrics.jsonl", "w") as f:
        for i in range(120):
            row = {"step": i + 1, "loss": float(loss[i]), "time_s": float(secs[i])}
            if i + 1 in evals:
                row["eval_tau"] = evals[i + 1]
            f.write(json.dumps(row) + "\n")
    st = cards.training_stage(str(run), str(data), date="d", why="w.", prompts="p", commands="c",
                              eval_prompts=4, eval_max_new_tokens=64, eval_tau_before=2.0)
    assert [c["step"] for c in st["curve"]] == [40, 80, 120]
    assert [c["eval_tau"] for c in st["curve"]] == [2.5, 2.75, 3.0]
    for c in st["curve"]:  # the mean of the 50 steps up to the point (fewer at the start)
        assert c["train_loss_last_50"] == pytest.approx(loss[max(0, c["step"] - 50):c["step"]].mean(), abs=1e-4)
    assert st["minutes"] == pytest.approx(secs.sum() / 60, abs=0.05)
    assert (st["sequences"], st["response_tokens"], st["steps"]) == (480, 51234, 120)
    text = cards.continued_text(st)
    assert "| 0 | 2.00 | |" in text and "| 120 | 3.00 |" in text and "2.0 epochs" in text


def test_the_shipped_card_is_the_one_the_recipe_and_the_bench_report_give():
    with open(os.path.join(EMBEDDED_DRAFTER_DIR, "recipe.json")) as f:
        recipe = json.load(f)
    with open(os.path.join(ROOT, "results", "bench", "bench.json")) as f:
        bench = json.load(f)
    with open(os.path.join(EMBEDDED_DRAFTER_DIR, "README.md")) as f:
        shipped = f.read()
    assert shipped == cards.drafter_card(EMBEDDED_DRAFTER_DIR, recipe, bench)
    for st in recipe.get("continued", []):  # the held-out curve is in the card
        for c in st["curve"]:
            assert f"| {c['step']} | {c['eval_tau']:.2f} |" in shipped


def test_continued_stages_are_read_in_order_and_each_names_its_metrics(tmp_path):
    from dflash_jax.experiments.paper import CONTINUED_METRICS, continued_stages

    assert continued_stages(str(tmp_path)) == []  # no recipe: no stages
    # an older recipe: the first stage names no file (the shipped default), a later one must
    _write(tmp_path / "recipe.json", {"continued": [{"date": "a"}, {"date": "b"}]})
    with pytest.raises(ValueError, match="stage 2 names no metrics file"):
        continued_stages(str(tmp_path))
    _write(tmp_path / "recipe.json", {"continued": [{"date": "a"}, {"metrics": "m2.jsonl", "label": "second"}]})
    assert continued_stages(str(tmp_path)) == [("continued (five-style data)", str(tmp_path / CONTINUED_METRICS)),
                                               ("second", str(tmp_path / "m2.jsonl"))]
