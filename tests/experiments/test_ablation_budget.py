"""The ablation framework's larger-budget machinery (the cpu-full preset's): offline target
features computed once per data and taps and shared by every drafter, checked against
transformers' hidden states; training from them following training with the target online;
and the held-out tau curve, checked against an independent evaluation of the exported drafter
on the held-out prompts. One run of ablate_anchors (random and fixed anchors: two drafters of
one config, so their programs compile once) at the test preset's size serves them, and its work
directory (copied) the temperature and --init-from tests: their greedy-data and from-scratch
drafters are its random-anchor drafter, reused, not trained again."""

from __future__ import annotations

import glob
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax.experiments import ablate_anchors, ablate_depth, framework
from dflash_jax.models.handles import EMBEDDED_TARGET_DIR, load_drafter, load_target
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.features import FeatureStore

pytestmark = [pytest.mark.xdist_group("test_ablation_budget"), pytest.mark.slow, pytest.mark.experiments, pytest.mark.torch]
PRESET = "test"  # the smoke grids and budget on short sequences; two MBPP prompts per cell
HELD_OUT = 4
SMALL = dict(curve_prompts=HELD_OUT, curve_every=4, timing_repeats=0)
OFFLINE = dict(SMALL, offline_features=True)  # the fixture's settings


def _copy(work, to) -> str:
    """A copy of a work directory without the trained drafters' Orbax checkpoints (reusing a
    finished drafter reads only its train.json and exported drafter/)."""
    shutil.copytree(work, to, ignore=shutil.ignore_patterns("checkpoints"))
    return str(to)


def _random_anchors(key: dict) -> bool:
    """Whether a drafter key.json is of a 1-layer drafter trained at random anchors (the
    default, left out of the key)."""
    return key["drafter"]["layers"] == 1 and key["train"].get("anchors", "random") == "random"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    work, out = str(root / "work"), str(root / "out")
    table = ablate_anchors.run(PRESET, work=work, out=out, **OFFLINE)
    return table, work, out


def test_features_are_transformers_hidden_states_and_one_cache_serves_every_drafter(run):
    """The cache holds, per training sequence, transformers' hidden_states[i + 1] of each tap i
    (the last layer's after the final norm), rounded to bfloat16; the off-by-one convention
    (hidden_states[i]) does not match it. Both drafters (random and fixed anchors, the same
    taps) read the one cache."""
    import torch
    from transformers import AutoModelForCausalLM

    table, work, _ = run
    caches = glob.glob(os.path.join(work, "features", "*", "features.json"))
    assert len(caches) == 1, caches
    store = FeatureStore(os.path.dirname(caches[0]), (1, 2, 3))
    data = TokenDataset(glob.glob(os.path.join(work, "data", "*", "metadata.json"))[0].rsplit(os.sep, 1)[0])
    assert len(store) == len(data) == 16 and store.meta["dtype"] == "bfloat16"
    assert all(t["offline_features"] == "bfloat16" for r in table.rows for t in r["training"])
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET_DIR, torch_dtype=torch.float32).eval()
    for i in (0, 7, 15):
        n = int(data.lengths[i])
        with torch.no_grad():
            hs = model(torch.tensor(data.tokens[i:i + 1, :n]), output_hidden_states=True).hidden_states
        want = np.concatenate([hs[t + 1][0].numpy() for t in (1, 2, 3)], -1)
        wrong = np.concatenate([hs[t][0].numpy() for t in (1, 2, 3)], -1)
        got = store.take([i])[0, :n].astype(np.float32)
        scale = np.abs(want).max(-1, keepdims=True)
        assert np.abs(got - want).max() <= (2 ** -7 * scale).max(), i  # bfloat16 rounding
        assert np.abs(got - wrong).max() > 10 * (2 ** -7 * scale).max(), i


def test_training_from_the_cache_follows_training_with_the_target_online(run, tmp_path):
    """The random-anchor drafter trained again with the target run in every step (its own data
    copy): the losses of the two runs agree to bfloat16 rounding of the features, step by step
    (the held-out rows are left out of both, so the batches are the same)."""
    _, work, _ = run
    online_work = tmp_path / "work"
    shutil.copytree(os.path.join(work, "data"), online_work / "data")
    # the same held-out rows, without their curve (what is compared is the training's losses)
    ablate_anchors.run(PRESET, offline_features=False, work=str(online_work), out=str(tmp_path / "out"),
                       anchor_strategies=("random",), **dict(SMALL, curve_every=0))
    def losses(w):
        (d,) = [d for d in glob.glob(os.path.join(w, "drafters", "*"))
                if _random_anchors(json.load(open(os.path.join(d, "key.json"))))]
        rows = [json.loads(x) for x in open(os.path.join(d, "run", "metrics.jsonl"))]
        return np.array([r["loss"] for r in rows]), json.load(open(os.path.join(d, "key.json")))
    offline, off_key = losses(work)
    online, on_key = losses(str(online_work))
    assert off_key.get("features") == "bfloat16" and "features" not in on_key  # two drafters, not one reused
    assert len(offline) == len(online) == 8
    np.testing.assert_allclose(offline, online, rtol=2e-2)
    assert not np.array_equal(offline, online)  # the cache really was read (rounded features)


def test_the_curve_is_the_held_out_tau_of_the_drafter_and_the_readme_shows_it(run):
    """train.json's curve has a point every curve_every steps; its last is the tau of the
    exported drafter on the data's last curve_prompts prompts (greedy, 64 tokens, measured here
    again with generate), which the training never saw."""
    from dflash_jax.api import generate

    table, work, out = run
    target = load_target(EMBEDDED_TARGET_DIR, dtype=jnp.float32)  # as the run's (float32 on CPU)
    data = TokenDataset(glob.glob(os.path.join(work, "data", "*", "metadata.json"))[0].rsplit(os.sep, 1)[0])
    held = [data.prompt(i) for i in range(len(data) - HELD_OUT, len(data))]
    for row in table.rows:
        (t,) = row["training"]
        assert [p["step"] for p in t["curve"]] == [0, 4, 8] and t["training_sequences"] == 16 - HELD_OUT
        assert t["curve"][0]["loss"] is None  # the starting drafter: no training loss yet
        d = os.path.join(work, "drafters", row["cells"][0], "drafter")
        r = generate(target, held, 64, drafter=load_drafter(d, target, dtype=target.dtype))
        assert t["curve"][-1]["tau"] == pytest.approx(r.tau, rel=1e-6), row["label"]
        assert t["curve"][-1]["loss"] is not None
    text = open(os.path.join(out, "README.md")).read()
    assert "## Training curves" in text and "| 0 | " in text and "| 4 | " in text and "| 8 | " in text
    assert "target features: offline" in text and os.path.getsize(os.path.join(out, "curves.png")) > 0
    assert framework.curves_markdown(table.rows).count("\n") == 4  # header, rule, steps 0, 4 and 8


def test_the_full_cpu_preset_has_the_cpu_grids_a_larger_budget_and_checks_its_curve():
    for module in (ablate_depth,):
        s, train, axes = framework.resolve(module.EXPERIMENT, "cpu-full", {})
        _, _, cpu_axes = framework.resolve(module.EXPERIMENT, "cpu", {})
        assert axes == cpu_axes and s.offline_features and s.curve_prompts and s.curve_every
        assert train["steps"] * train["batch_size"] > 10 * 400 * 4  # ten times the cpu preset's sequences
    with pytest.raises(ValueError, match="curve_every 4 needs held-out prompts"):
        ablate_depth.run("smoke", curve_every=4, work="/nonexistent/w", out="/nonexistent/o")
    with pytest.raises(ValueError, match="curve_prompts 16 must be fewer than num_prompts 16"):
        ablate_depth.run("smoke", curve_prompts=16, work="/nonexistent/w", out="/nonexistent/o")


def test_remeasure_evaluates_every_cell_again_and_trains_nothing(run, tmp_path):
    """--remeasure: every cell.json is written again (greedy, so the same tau), no drafter is
    touched; each measurement records the load average around it and the README states it."""
    table, work, _ = run

    def stamps(name):
        return {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(work, "*", "*", name))}
    cells, trained = stamps("cell.json"), stamps("train.json")
    checkpoints = stamps(os.path.join("run", "metrics.jsonl"))
    again = ablate_anchors.run(PRESET, work=work, out=str(tmp_path / "out"), remeasure=True, **OFFLINE)
    after = stamps("cell.json")
    assert after.keys() == cells.keys() and all(after[p] != cells[p] for p in cells)
    assert stamps("train.json") == trained and stamps(os.path.join("run", "metrics.jsonl")) == checkpoints
    assert [r["average"]["tau"] for r in again.rows] == [r["average"]["tau"] for r in table.rows]
    assert all(len(pair) == 2 and min(pair) >= 0 for r in again.rows for pair in r["load_average"])
    assert "load averages of" in open(tmp_path / "out" / "README.md").read()


def test_temperature_ablation_trains_on_sampled_answers_and_measures_the_ceiling(run, tmp_path):
    """--train-temperatures 0 1: a second data set, the target's answers sampled at T = 1 (not
    its greedy ones), and a drafter on it; every T > 0 row carries the greedy-draft ceiling of
    its temperature, measured once for both drafts, and the findings state it beside tau. In a
    copy of the fixture's work directory with its settings: the greedy data, their drafter and
    its T = 0 cell are the fixture's random-anchor ones."""
    from dflash_jax.experiments import ablate_temperature

    fixture, fixture_work, _ = run
    work, out = tmp_path / "work", tmp_path / "out"
    _copy(fixture_work, work)
    table = ablate_temperature.run(PRESET, train_temperatures=(0.0, 1.0), work=str(work), out=str(out), **OFFLINE)
    metas = {}
    for d in glob.glob(str(work / "data" / "*")):
        if os.path.isdir(d):
            metas[json.load(open(os.path.join(d, "metadata.json")))["settings"]["temperature"]] = TokenDataset(d)
    assert sorted(metas) == [0.0, 1.0]
    greedy, sampled = metas[0.0], metas[1.0]
    assert np.array_equal(greedy.tokens[:, :8], sampled.tokens[:, :8])  # the same prompts ...
    differ = [not np.array_equal(greedy.tokens[i], sampled.tokens[i]) for i in range(len(greedy))]
    assert sum(differ) >= len(differ) - 2  # ... answered otherwise
    assert {r["label"]["train_T"] for r in table.rows} == {0.0, 1.0} and len(table.rows) == 6
    assert len({h for r in table.rows for h in r["cells"]}) == 2  # one drafter per data set
    assert {h for r in table.rows if r["label"]["train_T"] == 0.0 for h in r["cells"]} == set(fixture.rows[0]["cells"])
    hot = [r for r in table.rows if r["label"]["temperature"] > 0]
    cold = [r for r in table.rows if r["label"]["temperature"] == 0]
    assert all("extra" not in r for r in cold)
    ceilings = [r["extra"][0] for r in hot]
    # the target's alone: one measurement for all (compared as JSON: intervals of 2 responses are nan)
    assert all(json.dumps(c) == json.dumps(ceilings[0]) for c in ceilings)
    assert ceilings[0]["responses"] == 2 and 1 <= ceilings[0]["ceiling"] <= 16
    assert 0 < ceilings[0]["mean_max_prob"] <= 1
    assert len(glob.glob(str(work / "measures" / "*.json"))) == 1
    text = open(out / "README.md").read()
    assert text.count("against a ceiling of") == 4 and "training data at T=0 -> T=1" in text


def test_init_from_steps_0_measures_the_shipped_drafter_itself_without_data(tmp_path):
    """--init-from embedded --steps 0: every cell's drafter is the shipped one, byte for byte,
    no training data is made, and its key does not depend on the data settings (another
    --num-prompts reuses it)."""
    from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR

    work = tmp_path / "work"
    kw = dict(init_from="embedded", steps=0, depths=(1,), timing_repeats=0, work=str(work))
    table = ablate_depth.run(PRESET, out=str(tmp_path / "out"), **kw)
    assert not (work / "data").exists()
    (drafter,) = glob.glob(str(work / "drafters" / "*" / "drafter"))
    for name in ("config.json", "model.safetensors"):
        assert open(os.path.join(drafter, name), "rb").read() == open(os.path.join(EMBEDDED_DRAFTER_DIR, name), "rb").read()
    (training,) = table.rows[0]["training"]
    assert training["steps"] == 0 and training["init_from"]["init_from"] == "embedded"
    assert table.rows[0]["average"]["tau"] > 2  # the trained drafter (a random one stays near 1)
    ablate_depth.run(PRESET, out=str(tmp_path / "out2"), num_prompts=32, **kw)
    assert len(glob.glob(str(work / "drafters" / "*"))) == 1
    assert "drafter is `embedded`, as it is" in open(tmp_path / "out" / "README.md").read()


def test_init_from_fine_tunes_the_given_weights_grows_them_and_refuses_another_drafter(run, tmp_path):
    """With --steps N the trainer starts from the --init-from weights: the first step's loss is
    the trained drafter's (a random start is near ln(vocab)); the start is in the drafter's key.
    With --grow the 2-layer cell starts from the shipped drafter grown: its held-out tau before
    the first step is the shipped drafter's and its first loss the 1-layer fine-tune's, its key
    says `grown`, the 1-layer cell is the plain fine-tune (one drafter whether or not --grow is
    given), and the README says what the cells are. A drafter of another shape, a missing one,
    and steps 0 without one are refused up front. In a copy of the fixture's work directory with
    its settings: the drafter trained from random weights is the fixture's random-anchor one."""
    fixture, fixture_work, _ = run
    work = _copy(fixture_work, tmp_path / "w")
    tuned = ablate_depth.run(PRESET, init_from="embedded", grow=True, work=work, out=str(tmp_path / "o"),
                             **dict(OFFLINE, depths=(1, 2)))
    kw = dict(OFFLINE, depths=(1,))
    fresh = ablate_depth.run(PRESET, work=work, out=str(tmp_path / "o2"), **kw)

    losses, keys = {}, {}  # the first step's loss of each 1-layer run, by whether it started from the shipped weights
    for root in glob.glob(os.path.join(work, "drafters", "*")):
        key = json.load(open(os.path.join(root, "key.json")))
        first = json.loads(open(os.path.join(root, "run", "metrics.jsonl")).readline())
        if "init_from" in key:
            keys[key["drafter"]["layers"]] = (key, first["loss"])
        if not _random_anchors(key):  # the fixture's fixed-anchor drafter, the grown one
            continue
        assert ("init_from" in key) not in losses  # one drafter of each start
        losses["init_from" in key] = first["loss"]
    assert sorted(losses) == [False, True] and sorted(keys) == [1, 2]
    assert keys[2][0].get("grown") is True and "grown" not in keys[1][0]
    assert keys[2][1] == pytest.approx(keys[1][1], rel=1e-5)
    assert "a deeper cell's drafter is it grown" in open(tmp_path / "o" / "README.md").read()
    assert losses[True] < 3.0 < np.log(8192) - 1 < losses[False], losses
    # the fine-tune's curve starts at the shipped drafter's own held-out tau (measured here again)
    from dflash_jax.api import generate
    from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR

    target = load_target(EMBEDDED_TARGET_DIR, dtype=jnp.float32)
    data = TokenDataset(glob.glob(os.path.join(work, "data", "*", "metadata.json"))[0].rsplit(os.sep, 1)[0])
    held = [data.prompt(i) for i in range(len(data) - HELD_OUT, len(data))]
    shipped = generate(target, held, 64, drafter=load_drafter(EMBEDDED_DRAFTER_DIR, target, dtype=target.dtype))
    (start,) = [t["curve"][0] for t in tuned.rows[0]["training"]]
    assert start["step"] == 0 and start["loss"] is None and start["tau"] == pytest.approx(shipped.tau, rel=1e-6)
    (grown,) = [t["curve"][0] for t in tuned.rows[1]["training"]]
    assert grown["step"] == 0 and grown["tau"] == start["tau"]
    plain = ablate_depth.run(PRESET, init_from="embedded", work=work, out=str(tmp_path / "o3"), **kw)
    assert plain.rows[0]["cells"] == tuned.rows[0]["cells"]  # reused: the same fine-tune either way
    assert len(glob.glob(os.path.join(work, "drafters", "*"))) == 4  # the fixture's two, the fine-tune, the grown one
    assert fresh.rows[0]["average"]["tau"] < tuned.rows[0]["average"]["tau"]
    assert fresh.rows[0]["cells"] == fixture.rows[0]["cells"] != tuned.rows[0]["cells"]
    with pytest.raises(ValueError, match=r"num_layers 1 \(the run's 2\).*more --layers with --grow"):
        ablate_depth.run("smoke", init_from="embedded", depths=(2,), work="/nonexistent/w", out="/nonexistent/o")
    with pytest.raises(ValueError, match="--grow adds layers to a trained drafter: give --init-from"):
        ablate_depth.run("smoke", grow=True, depths=(2,), work="/nonexistent/w", out="/nonexistent/o")
    with pytest.raises(ValueError, match=r"trains nothing \(steps 0\).*1 layer\(s\), trained at block 16"):
        ablate_depth.run("smoke", init_from="embedded", grow=True, steps=0, depths=(2,), work="/nonexistent/w",
                         out="/nonexistent/o")
    with pytest.raises(FileNotFoundError, match="no drafter there"):
        ablate_depth.run("smoke", init_from=str(tmp_path / "none"), work="/nonexistent/w", out="/nonexistent/o")
    with pytest.raises(ValueError, match="steps 0 trains nothing"):
        ablate_depth.run("smoke", steps=0, work="/nonexistent/w", out="/nonexistent/o")
