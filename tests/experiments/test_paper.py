"""The paper's tables and figures (experiments.paper) and the ablations beyond depth and block
size (taps, conditioning, anchors, loss decay, denoising steps, temperature): ``paper all
--preset test`` end to end (the session fixture ``paper_all`` in conftest.py: the smoke preset's
grids, budget and sizes on prompts of one program shape), the numbers
recomputed from the saved measurements, what each ablation's drafters really were, and the
errors for bad input (before any work)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR
from dflash_jax.experiments import ablate_taps, framework, paper, paper_numbers
from dflash_jax.experiments.paper import CONTINUED_METRICS, continued_stages

pytestmark = [pytest.mark.xdist_group("test_experiments"), pytest.mark.slow, pytest.mark.experiments]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET = "test"  # paper_all's
NEW = ("ablate_taps", "ablate_conditioning", "ablate_anchors", "ablate_loss_decay", "ablate_denoise",
       "ablate_temperature")


def _records(work) -> dict:
    """The cached paper measurements: {(dataset, temperature, block size): record}."""
    out = {}
    for d in os.listdir(os.path.join(work, "paper")):
        with open(os.path.join(work, "paper", d, "record.json")) as f:
            r = json.load(f)
        out[(r["key"]["dataset"], r["key"]["temperature"], r["key"]["block_size"])] = r["record"]
    return out


def test_all_writes_every_table_figure_and_ablation(paper_all):
    root, _, results = paper_all
    out = root / "paper"
    for item in paper.ITEMS:
        assert (out / f"{item}.png").stat().st_size > 10_000 and (out / f"{item}.json").exists()
    assert (out / "table1.md").exists() and (out / "block_size_curve.md").exists()
    for a in paper.ABLATIONS:
        for f in ("table.json", "table.md", "plot.png", "README.md"):
            assert (root / "ablations" / a / f).stat().st_size > 0, (a, f)
    readme = (out / "README.md").read_text()
    for item in paper.ITEMS:
        assert f"`python -m experiments.paper {item} --preset {PRESET}`" in readme and f"({item}.png)" in readme
    for a in paper.ABLATIONS:
        assert f"### {a}" in readme and f"../ablations/{a}/README.md" in readme
    assert "against the paper" in readme and ("the paper's direction" in readme or "opposite direction" in readme)
    index = json.loads((out / "paper.json").read_text())
    assert index["preset"] == PRESET and sorted(index["items"]) == sorted(paper.ITEMS)
    # a smoke run says so; its 2 responses per average give no interval, so no finding
    assert readme.startswith(f"# The paper's tables and figures ({PRESET} preset)\n\n**This is a smoke run**")
    assert "do not overlap" not in readme and "agreeing with the paper" not in readme
    for a in paper.ABLATIONS:  # the commands recorded for the ablations of `all` name no absolute path
        command = _table(root, a)["command"]
        assert command.startswith(f"python -m experiments.{a} --preset {PRESET} --out ") and str(root) not in command
    t1 = json.loads((out / "table1.json").read_text())
    assert t1["smoke"] is True and t1["options"]["target"] == "embedded" and list(t1["results"]) == ["embedded"]
    assert "no 95 % interval (2 responses; an interval needs at least 8): not a finding" in t1["findings"][0]
    assert "an ordering, not a finding" in t1["findings"][1]
    curve = json.loads((out / "block_size_curve.json").read_text())["findings"][0]
    assert curve.count("no 95 % interval") == 2, curve


def test_table1_acceptance_and_block_curve_follow_from_the_measurements(paper_all):
    """Oracles: each number recomputed with numpy from the saved per-response measurements;
    greedy DFlash equals AR on every prompt; the items share the measurements they have in
    common (the same record, not a second run)."""
    root, work, _ = paper_all
    recs = _records(work)
    t1 = json.loads((root / "paper" / "table1.json").read_text())["results"]
    (drafter,) = t1
    bs = 16
    sets = ("mbpp", "math500")  # the test preset's
    assert len(recs) == len(sets) * 3  # T 0 and 1 at block 16, T 0 at block 4 (16 is reused)
    for t in ("0", "1"):
        per = t1[drafter][t]["datasets"]
        for n in sets:
            rec = recs[(n, float(t), bs)]
            df = [x["dflash"] for x in rec["samples"]]
            assert per[n]["tau"] == pytest.approx(np.mean([np.mean(x["acceptance_lengths"]) for x in df]))
            if t == "0":
                assert rec["same_output"] == rec["turns"] == 1
        assert t1[drafter][t]["average"]["tau"] == pytest.approx(np.mean([per[n]["tau"] for n in sets]))
    acc = json.loads((root / "paper" / "acceptance.json").read_text())["results"]
    for n in sets:
        lengths = np.concatenate([x["dflash"]["acceptance_lengths"] for x in recs[(n, 0.0, bs)]["samples"]])
        assert acc[n]["histogram"] == [int((lengths == k).sum()) for k in range(1, bs + 1)]
        # P(position k accepted) = P(acceptance length > k)
        np.testing.assert_allclose(acc[n]["position_acceptance"], [(lengths > k).mean() for k in range(1, bs)])
    curve = json.loads((root / "paper" / "block_size_curve.json").read_text())["results"]
    assert sorted(curve) == ["16", "4"]
    assert curve["16"]["average"] == t1[drafter]["0"]["average"]
    for n in sets:
        assert max(len(x) for x in [s["dflash"]["acceptance_lengths"] for s in recs[(n, 0.0, 4)]["samples"]]) > 0
        assert max(max(s["dflash"]["acceptance_lengths"]) for s in recs[(n, 0.0, 4)]["samples"]) <= 4
    tc = json.loads((root / "paper" / "training_curve.json").read_text())["results"]
    shipped = [json.loads(x) for x in open(os.path.join(EMBEDDED_DRAFTER_DIR, "training_metrics.jsonl"))]
    assert tc["embedded drafter: training"]["eval_tau"] == [[r["step"], r["eval_tau"]] for r in shipped
                                                            if r.get("eval_tau") is not None]
    # the continued-training stages follow the fine-tune, in order, on the same step axis
    fine = [json.loads(x) for x in open(os.path.join(EMBEDDED_DRAFTER_DIR, "finetune_metrics.jsonl"))]
    offset = shipped[-1]["step"] + fine[-1]["step"]
    stages = continued_stages(EMBEDDED_DRAFTER_DIR)
    assert stages and stages[0] == ("continued (five-style data)", os.path.join(EMBEDDED_DRAFTER_DIR, CONTINUED_METRICS))
    for label, path in stages:
        more = [json.loads(x) for x in open(path)]
        assert tc[f"embedded drafter: {label}"]["eval_tau"] == [
            [r["step"] + offset, r["eval_tau"]] for r in more if r.get("eval_tau") is not None]
        offset += more[-1]["step"]


def _table(root, name) -> dict:
    return json.loads((root / "ablations" / name / "table.json").read_text())


def _drafter(work, row) -> tuple[dict, dict]:
    """(config.json, run.json) of a row's trained drafter."""
    d = os.path.join(work, "drafters", row["cells"][0])
    with open(os.path.join(d, "drafter", "config.json")) as f, open(os.path.join(d, "run", "run.json")) as g:
        return json.load(f), json.load(g)


def test_each_ablation_trained_and_measured_what_it_says(paper_all):
    root, work, _ = paper_all
    by = lambda t, k: {r["label"][k]: r for r in t["rows"]}
    taps = by(_table(root, "ablate_taps"), "num_taps")
    assert {k: r["label"]["layers"] for k, r in taps.items()} == {1: "2", 3: "1,2,3"}
    for k, want in ((1, [2]), (3, [1, 2, 3])):
        assert _drafter(work, taps[k])[0]["dflash_config"]["target_layer_ids"] == want
    cond = by(_table(root, "ablate_conditioning"), "conditioning")
    assert list(cond) == ["kv", "input", "none"]
    assert "conditioning" not in _drafter(work, cond["kv"])[0]["dflash_config"]  # the released layout
    for c in ("input", "none"):
        assert _drafter(work, cond[c])[0]["dflash_config"]["conditioning"] == c
    assert cond["none"]["drafter_params"] < cond["kv"]["drafter_params"] == cond["input"]["drafter_params"]
    anchors = by(_table(root, "ablate_anchors"), "anchors")
    # fixed boundaries cut the short smoke responses into fewer blocks than the random anchors draw
    budget = _table(root, "ablate_anchors")["budget"]["blocks"]
    assert 0 < anchors["fixed"]["blocks_seen"] < anchors["random"]["blocks_seen"] <= budget
    assert _drafter(work, anchors["fixed"])[1]["train"]["anchors"] == "fixed"
    assert _drafter(work, anchors["random"])[1]["train"]["anchors"] == "random"
    decay = by(_table(root, "ablate_loss_decay"), "loss_weights")
    assert _drafter(work, decay["uniform"])[1]["train"]["uniform_weights"] is True
    assert _drafter(work, decay["decay"])[1]["train"]["uniform_weights"] is False
    # the baselines of every grid are one drafter: kv, random anchors, decayed loss, 3 taps, 1 layer
    depth1 = by(_table(root, "ablate_depth"), "layers")[1]["cells"]
    assert cond["kv"]["cells"] == anchors["random"]["cells"] == decay["decay"]["cells"] == taps[3]["cells"] == depth1
    # inference-only grids: one drafter, measured several ways
    den = by(_table(root, "ablate_denoise"), "denoise_steps")
    assert list(den) == [1, 2] and den[1]["cells"] == den[2]["cells"] == depth1
    temp = _table(root, "ablate_temperature")["rows"]
    assert [(r["label"]["temperature"], r["label"]["draft"]) for r in temp] == [(0.0, "greedy"), (1.0, "greedy"),
                                                                               (1.0, "sampled")]
    assert all(r["cells"] == depth1 for r in temp)
    # the measurements of that drafter (a cell shared by two grids keeps the first one's label)
    evaluations = set()
    for d in os.listdir(os.path.join(work, "cells")):
        c = json.load(open(os.path.join(work, "cells", d, "cell.json")))
        if c["drafter_hash"] == depth1[0]:
            ev = c["settings"]["evaluation"]
            evaluations.add((ev["temperature"], ev.get("sampled_draft", False), ev["num_denoise_steps"], ev["block_size"]))
    assert evaluations == {(0.0, False, 1, 16), (1.0, False, 1, 16), (1.0, True, 1, 16), (0.0, False, 2, 16),
                           (0.0, False, 1, 8)}  # the last: block size's 16 -> 8 cell
    for name in NEW:
        t = _table(root, name)
        assert t["paper"] == _paper_rows(name)


def _paper_rows(name):
    import importlib

    return json.loads(json.dumps(importlib.import_module(f"dflash_jax.experiments.{name}").EXPERIMENT.paper_rows))


def test_taps_follow_the_formula_and_fail_clearly():
    assert [ablate_taps.spread_taps(4, k) for k in (1, 2, 3)] == [(2,), (1, 3), (1, 2, 3)]
    # deep enough for the default tap formula: the released Qwen3-8B taps for 5, the formula's for 3
    assert ablate_taps.spread_taps(36, 5) == (1, 9, 17, 25, 33) and ablate_taps.spread_taps(36, 3) == (1, 17, 33)
    assert ablate_taps.spread_taps(36, 1) == (18,)
    with pytest.raises(ValueError, match="4 taps need k >= 1 and a target of at least 5 layers"):
        ablate_taps.spread_taps(4, 4)


def test_the_papers_numbers_print_where_the_paper_has_them():
    md = paper_numbers.markdown(paper_numbers.CONDITIONING, ["conditioning"])
    assert "| kv | - / 4.20 | - / 4.00 | - / 3.00 | - |" in md and "Qwen3-4B, tau only" in md
    assert "| none | 2.83x / 3.38 | - | - | 3.73x / 4.61 |" in md
    assert "records no numbers" in paper_numbers.markdown(paper_numbers.LOSS_DECAY, ["loss_weights"])


@pytest.mark.parametrize("module, overrides, message", [
    ("ablate_conditioning", {"conditionings": ("kv", "cross")}, "conditioning must be one of 'kv', 'input', 'none', got 'cross'"),
    ("ablate_anchors", {"anchor_strategies": ("aligned",)}, "unknown anchor strategy 'aligned'"),
    ("ablate_loss_decay", {"weightings": ("exp",)}, "unknown loss weighting 'exp'"),
    ("ablate_loss_decay", {"gamma": 3.0}, "exclude each other"),
    ("ablate_taps", {"num_taps": (4,)}, "4 taps need"),
    ("ablate_denoise", {"denoise_steps": (0,)}, "num_denoise_steps must be >= 1"),
    ("ablate_temperature", {"temperatures": (-1.0,)}, "temperature must be >= 0"),
    ("ablate_taps", {"taps": (7,)}, None),  # the axis sets the taps: a --taps is not used, and not an error
])
def test_bad_ablation_settings_fail_before_any_work(tmp_path, module, overrides, message):
    import importlib

    exp = importlib.import_module(f"dflash_jax.experiments.{module}").EXPERIMENT
    if message is None:
        framework.check_experiment(exp, "smoke", overrides)
        return
    with pytest.raises(ValueError, match=message):
        framework.run_experiment(exp, "smoke", out=str(tmp_path / "out"), work=str(tmp_path / "work"), **overrides)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_bad_paper_input_fails_before_any_work(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    with pytest.raises(ValueError, match="unknown item 'table2'"):
        paper.run("table2", "smoke", out=str(out), work=str(work))
    with pytest.raises(ValueError, match="has no option 'block_size'"):
        paper.run("table1", "smoke", out=str(out), work=str(work), block_size=8)
    with pytest.raises(ValueError, match="--drafter is required"):
        paper.run("table1", "smoke", out=str(out), work=str(work), target=str(tmp_path))
    with pytest.raises(ValueError, match="needs --target"):
        paper.run("table1", "gpu", out=str(out), work=str(work))
    with pytest.raises(ValueError, match="block sizes must be >= 2"):
        paper.run("block_size_curve", "smoke", out=str(out), work=str(work), block_sizes=(1, 4))
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        paper.run("training_curve", "smoke", out=str(out), work=str(work), runs=(str(tmp_path),))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    with pytest.raises(ValueError, match="no held-out tau.*--eval-every"):
        paper.run("training_curve", "smoke", out=str(out), work=str(work), runs=(str(run),))
    # a drafter made for another target: refused when loaded, before any measurement
    import dflash_jax as dj

    other = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                            num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
    t = dj.Target.random(other, seed=0)
    d = dj.Drafter.random(t, num_layers=1, block_size=4, seed=1)
    dj.save_drafter(d, str(tmp_path / "wrong"))
    with pytest.raises(ValueError, match="drafter and target do not match"):
        paper.run("table1", "smoke", out=str(out), work=str(work), drafter=str(tmp_path / "wrong"))
    assert not work.exists() and not (out / "table1.json").exists()
    # an --out that holds something else is left alone
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match="without paper.json"):
        paper.run("training_curve", "smoke", out=str(mine), work=str(work))
    assert os.listdir(mine) == ["notes.md"]
    # the command line: one-line error, exit 2
    r = subprocess.run([sys.executable, "-m", "experiments.paper", "table7", "--preset", "smoke"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'table7'" in r.stderr


def test_training_curve_of_a_run_and_a_second_run_reuses_the_measurements(paper_all, tmp_path):
    """training_curve reads a run's metrics (the held-out tau it logged); a second table1 reuses
    every saved measurement (no record is rewritten) and gives the same table."""
    root, work, _ = paper_all
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 4.0 / s, "eval_tau": (1.0 + s / 10) if s % 2 == 0 else None} for s in range(1, 7)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = paper.run("training_curve", PRESET, out=str(tmp_path / "tc"), work=str(work), runs=(str(run),))
    assert r["training_curve"]["results"]["run"]["eval_tau"] == [(2, 1.2), (4, 1.4), (6, 1.6)]
    assert "still rising" in r["training_curve"]["findings"][0]
    before = {d: os.stat(os.path.join(work, "paper", d, "record.json")).st_mtime_ns
              for d in os.listdir(os.path.join(work, "paper"))}
    again = paper.run("table1", PRESET, out=str(tmp_path / "t1"), work=str(work))
    after = {d: os.stat(os.path.join(work, "paper", d, "record.json")).st_mtime_ns
             for d in os.listdir(os.path.join(work, "paper"))}
    assert after == before
    saved = json.loads((root / "paper" / "table1.json").read_text())["results"]
    assert json.loads(json.dumps(again["table1"]["results"])) == saved


def test_two_processes_sharing_a_work_dir_take_turns(tmp_path):
    """files.exclusive: a second holder waits (and says so) until the first releases the lock;
    a killed holder leaves no stale lock."""
    import time

    from dflash_jax.files import exclusive

    lock = tmp_path / "cell" / ".lock"
    code = ("import sys, time; from dflash_jax.files import exclusive\n"
            f"with exclusive({str(lock)!r}):\n    print('held', flush=True); time.sleep(float(sys.argv[1]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "2"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    waited = []
    t0 = time.perf_counter()
    with exclusive(str(lock), lambda: waited.append(time.perf_counter() - t0)):
        got = time.perf_counter() - t0
    assert waited and got >= 1.0 and proc.wait() == 0
    proc = subprocess.Popen([sys.executable, "-c", code, "60"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    waited.clear()
    with exclusive(str(lock), lambda: waited.append(1)):
        pass
    assert not waited


def test_readme_alone_from_saved_outputs_lists_what_is_missing(paper_all, tmp_path):
    """`experiments.paper readme` writes the page from the saved files: the same sections as
    `all` wrote, and with an item and an ablation missing, those two listed with their commands."""
    root, _, _ = paper_all
    shutil.copytree(root / "paper", tmp_path / "paper")
    shutil.copytree(root / "ablations", tmp_path / "ablations")
    heads = lambda text: [x for x in text.splitlines() if x.startswith("#") or x.startswith("|") or x.startswith("- ")]
    paper.run("readme", PRESET, out=str(tmp_path / "paper"), ablations_out=str(tmp_path / "ablations"))
    assert heads((tmp_path / "paper" / "README.md").read_text()) == heads((root / "paper" / "README.md").read_text())
    (tmp_path / "paper" / "acceptance.json").unlink()
    (tmp_path / "ablations" / "ablate_taps" / "table.json").unlink()
    paper.run("readme", PRESET, out=str(tmp_path / "paper"), ablations_out=str(tmp_path / "ablations"))
    text = (tmp_path / "paper" / "README.md").read_text()
    assert "## Not made yet" in text and f"`python -m experiments.paper acceptance --preset {PRESET}`" in text
    assert f"`python -m experiments.ablate_taps --preset {PRESET}`" in text and "### ablate_taps" not in text
    assert "### ablate_conditioning" in text and "## Acceptance lengths" not in text


def test_the_readme_states_the_load_the_measurements_ran_under():
    recorded = {"table1": {"load_average": [1.7, 1.5, 1.4], "results": {"x": [{"load_average_before": [1.1, 1.0, 0.9]}]}},
                "acceptance": {"load_average_before": [3.25, 2.0, 1.0], "other": [4.0], 16: {"tau": 2.0}}}
    assert paper._load_text(recorded) == "1-minute load average 1.1-3.2 before the measurements"
    assert paper._load_text({"table1": {"results": {}}}) == "load average not recorded"
