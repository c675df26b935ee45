"""``experiments.compare_methods`` end to end at the test preset's size (two methods, one
temperature, a few steps): a D-PACE, a DSpark and a Domino cell fine-tuned from the shipped
drafter on the same data and steps, each measured against AR; the DSpark cell's drafter is a
DSpark drafter on the shipped drafter's backbone with the same verify width, the Domino cell's a
Domino drafter on it with DFlash's rows, the D-PACE run records its loss; the EAGLE-3 baseline's
cell measures the shipped EAGLE-3 drafter as it is at its own block; the table, plot and README
are written; bad grids are refused before anything runs."""

from __future__ import annotations

import json
import os

import pytest

from dflash_jax.experiments import compare_methods, framework

pytestmark = [pytest.mark.xdist_group("test_compare_methods"), pytest.mark.slow, pytest.mark.experiments]


def test_dpace_dspark_and_domino_cells_train_and_measure(tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "work")
    table = compare_methods.run("test", methods=("dpace", "dspark", "domino", "eagle3"), temperatures=(1.0,),
                                steps=4, max_samples=1, max_new_tokens=8, out=out, work=work)
    rows = {r["label"]["method"]: r for r in table.rows}
    assert set(rows) == {"dpace", "dspark", "domino", "eagle3"}
    assert all(r["label"]["temperature"] == 1.0 for r in rows.values())
    eagle3 = rows.pop("eagle3")  # the baseline: the shipped EAGLE-3 drafter as it is, a chain of 7
    assert eagle3["training"][0]["steps"] == 0 and eagle3["training"][0]["init_from"]["init_from"] == "embedded-eagle3"
    assert eagle3["datasets"]["mbpp"]["block_size"] == compare_methods.EAGLE3_BLOCK == 8
    assert eagle3["average"]["tau"] >= 1.0 and eagle3["blocks_seen"] == 0
    for r in rows.values():
        assert r["average"]["tau"] >= 1.0 and r["blocks_seen"] > 0
        assert r["training"][0]["init_from"]["init_from"] == "embedded"
    # the DSpark cell: SpecForge's layout, the backbone's block one row shorter, the same verify width
    dspark_dir = os.path.join(work, "cells")
    drafters = [os.path.join(work, "drafters", h, "drafter") for h in os.listdir(os.path.join(work, "drafters"))]
    configs = [json.load(open(os.path.join(d, "config.json"))) for d in drafters if os.path.isdir(d)]
    assert sum(c["architectures"] == ["LlamaForCausalLMEagle3"] for c in configs) == 1
    dspark = [c for c in configs if c["architectures"] == ["DSparkDraftModel"]]
    assert len(dspark) == 1 and dspark[0]["block_size"] == 15 and os.path.isdir(dspark_dir)
    assert rows["dspark"]["datasets"]["mbpp"]["block_size"] == 16  # verify width: the bonus and 15 drafts
    domino = [c for c in configs if c["architectures"] == ["DominoDraftModel"]]
    assert len(domino) == 1 and domino[0]["block_size"] == 16 and not domino[0]["dflash_config"]["shift_label"]
    assert rows["domino"]["datasets"]["mbpp"]["block_size"] == 16
    runs = [json.load(open(os.path.join(work, "drafters", h, "run", "run.json")))
            for h in os.listdir(os.path.join(work, "drafters"))
            if os.path.exists(os.path.join(work, "drafters", h, "run"))]  # the trained ones (not EAGLE-3's)
    assert {r.get("method", "dflash") for r in runs} == {"dflash", "dspark", "domino"}
    assert [r["loss"] for r in runs if "loss" in r] == [{"type": "dpace", "dpace_alpha": 0.5}]
    for name in ("table.json", "table.md", "plot.png", "README.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    text = open(os.path.join(out, "README.md")).read()
    assert "1 of the cells measure a drafter of their own as it is, trained elsewhere: `embedded-eagle3`" in text


def test_bad_grids_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown methods \\['medusa'\\]"):
        framework.check_experiment(compare_methods.EXPERIMENT, "test", {"methods": ("dflash", "medusa")})
    with pytest.raises(ValueError, match="a Domino drafter is conditioned by kv injection"):
        framework.check_experiment(compare_methods.EXPERIMENT, "test",
                                   {"methods": ("domino",), "offline_features": True})
    with pytest.raises(ValueError, match="DSpark trains with online target features"):
        framework.check_experiment(compare_methods.EXPERIMENT, "test",
                                   {"methods": ("dspark",), "offline_features": True})
    # a source cell (a drafter measured as it is) trains nothing and names its verify width
    spec = {"label": {"method": "x"}, "drafter": {"source": "embedded-eagle3"}, "train": {"steps": 3},
            "eval_block_size": 8}
    settings, train, _ = framework.resolve(compare_methods.EXPERIMENT, "test", {})
    with pytest.raises(ValueError, match="a source drafter is measured as it is: its train needs steps 0"):
        framework.source_cell(compare_methods.EXPERIMENT, settings, spec, "embedded-eagle3", train, 0)
    with pytest.raises(ValueError, match="a source drafter needs its eval_block_size"):
        framework.source_cell(compare_methods.EXPERIMENT, settings, {**spec, "train": {"steps": 0}, "eval_block_size": None},
                              "embedded-eagle3", train, 0)
    with pytest.raises(FileNotFoundError, match="source drafter .*: no drafter there"):
        framework.source_cell(compare_methods.EXPERIMENT, settings, spec, str(tmp_path / "none"), train, 0)
