"""The ablation framework (experiments/): the test preset (the smoke grids and budget at the test
suite's size) end to end on the embedded target (real regeneration, training, export and
evaluation; the session fixture ``smoke`` in conftest.py runs ``experiments.paper all --preset
test``), reuse of finished cells, exact resume of a killed cell, the settings hash, and the
errors for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dflash_jax.models.handles import EMBEDDED_TARGET_DIR
from dflash_jax.experiments import ablate_block_size, ablate_depth, framework
from support.processes import kill_after_lines

pytestmark = [pytest.mark.xdist_group("test_experiments"), pytest.mark.slow, pytest.mark.experiments]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _files(root: str, name: str) -> dict:
    """{path: (mtime_ns, bytes)} of every ``name`` file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        if name in files:
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                out[p] = (os.stat(p).st_mtime_ns, f.read())
    return out


def test_smoke_presets_write_tables_with_the_papers_numbers(smoke):
    root, work, depth, block = smoke
    for name, table, n in (("ablate_depth", depth, 2), ("ablate_block_size", block, 4)):
        out = root / "ablations" / name
        for f in ("table.md", "table.json", "plot.png", "README.md"):
            assert (out / f).stat().st_size > 0, f
        saved = json.loads((out / "table.json").read_text())
        assert saved["experiment"] == table.experiment.name and len(saved["rows"]) == n
        assert saved["paper"] == table.experiment.paper_rows and saved["budget"]["steps"] == 8
        md = (out / "table.md").read_text()
        assert "The paper, same ablation" in md and "Qwen3-8B" in md
        readme = (out / "README.md").read_text()
        assert "8 steps x 4 sequences x 8 anchors" in readme and "What the data shows" in readme
        # a smoke run says so, and its 2 prompts give no interval and so no finding
        assert saved["smoke"] is True and "**This is a smoke run**" in readme
        findings = readme.split("## What the data shows")[1]
        assert "no finding from any row: no 95 % interval (2 responses; an interval needs at least 8)" in findings
        assert "do not overlap" not in findings and "agreeing with the paper" not in findings
        assert "not a finding" in findings
        for row in saved["rows"]:
            av = row["average"]
            assert av["responses"] == 2 and all(np.isnan(av["tau_ci"])) and all(np.isnan(av["speedup_ci"]))
            assert av["speedup"] > 0 and f"{av['tau']:.2f} |" in (out / "table.md").read_text()
            assert row["draft_ms"] > 0 and row["verify_ms"] > 0 and row["drafter_params"] > 0
    assert [r["label"]["layers"] for r in depth.rows] == [1, 2]
    assert depth.rows[1]["drafter_params"] > depth.rows[0]["drafter_params"]
    labels = [(r["label"]["train_block_size"], r["label"]["eval_block_size"]) for r in block.rows]
    assert labels == [(8, 8), (8, 16), (16, 8), (16, 16)]
    # the grid shares drafters: each training block size is trained once, and the 1-layer
    # block-16 drafter of the depth grid is the block-16 drafter here (same data, same settings)
    assert len({h for r in depth.rows + block.rows for h in r["cells"]}) == 3
    assert block.rows[2]["cells"] == block.rows[3]["cells"] == depth.rows[0]["cells"]
    assert block.rows[0]["cells"] == block.rows[1]["cells"] != block.rows[2]["cells"]


def test_cells_are_lossless_and_their_metrics_follow_from_the_responses(smoke):
    """Oracles: at T = 0 every DFlash response equals the autoregressive one, and each cell's
    tau, histogram and decode speedup recomputed with plain numpy from its saved responses."""
    _, work, depth, block = smoke
    cells = [json.load(open(p)) for p in _files(os.path.join(work, "cells"), "cell.json")]
    ours = {json.dumps(r["label"]) for r in depth.rows + block.rows}
    # depth's (1 layer, block 16) cell is block size's (16 -> 16) cell: 5 of the two grids, and
    # every ablation of `paper all` adds its own (checked here too: the same oracles)
    assert len([c for c in cells if json.dumps({k: v for k, v in c["label"].items() if k != "seed"}) in ours]) >= 5
    # + taps 1 (its 3-tap cell is depth's 1-layer one), conditioning 2, anchors 1, loss decay 1,
    # denoise 1 (its 1-pass cell is that one too), temperature 2 (T = 0 greedy: the same)
    assert len(cells) == 5 + 1 + 2 + 1 + 1 + 1 + 2
    for c in cells:
        bs = c["settings"]["evaluation"]["block_size"]
        greedy = c["settings"]["evaluation"]["temperature"] == 0
        for r in c["datasets"].values():
            assert r["turns"] == len(r["samples"]) == 2
            assert r["same_output"] == (r["turns"] if greedy else r["same_output"])
            df = [x["dflash"] for x in r["samples"]]
            ar = [x["ar"] for x in r["samples"]]
            assert r["tau"] == pytest.approx(np.mean([np.mean(x["acceptance_lengths"]) for x in df]))
            lengths = np.concatenate([x["acceptance_lengths"] for x in df])
            assert r["histogram"] == [int((lengths == k).sum()) for k in range(1, bs + 1)]
            tpot = lambda xs: np.mean([x["decode_s"] / (x["new_tokens"] - 1) for x in xs])
            assert r["speedup"] == pytest.approx(tpot(ar) / tpot(df))
            assert all(x["new_tokens"] == y["new_tokens"] for x, y in zip(ar, df))


def test_a_second_run_reuses_every_cell(smoke):
    root, work, depth, block = smoke
    before = {n: _files(work, n) for n in ("cell.json", "train.json", "metrics.jsonl")}
    again = ablate_depth.run("test", out=str(root / "ablations" / "ablate_depth"), work=work)
    again_block = ablate_block_size.run("test", out=str(root / "ablations" / "ablate_block_size"), work=work)
    for n, files in before.items():
        assert _files(work, n) == files, f"a {n} was rewritten: a finished cell was recomputed"
    plain = lambda rows: json.loads(json.dumps(rows))
    assert plain(again.rows) == plain(depth.rows) and plain(again_block.rows) == plain(block.rows)


def test_the_adaptive_inference_block_size_is_a_cell_of_the_block_size_ablation(smoke, tmp_path):
    """'adaptive' beside the fixed sizes: the trained drafter is reused (no training), the
    greedy output still equals AR, every iteration's verify length is recorded and bounds
    its acceptance, and the option parses from the command line."""
    root, work, _, block = smoke
    copy = tmp_path / "work"
    # the trained drafters' Orbax checkpoints (about 1 GB, nine tenths of the work directory)
    # are not copied: reusing a finished drafter reads only its train.json and exported drafter/
    shutil.copytree(work, copy, ignore=shutil.ignore_patterns("checkpoints"))
    drafters = sorted(os.listdir(copy / "drafters"))
    table = ablate_block_size.run("test", out=str(tmp_path / "out"), work=str(copy), train_block_sizes=(16,),
                                  eval_block_sizes=(16, "adaptive"))
    assert sorted(os.listdir(copy / "drafters")) == drafters  # nothing trained
    fixed, adaptive = table.rows
    assert fixed["label"] == {"train_block_size": 16, "eval_block_size": 16}
    assert adaptive["label"] == {"train_block_size": 16, "eval_block_size": "adaptive"}
    assert fixed["cells"] == adaptive["cells"] == block.rows[3]["cells"]
    cell = next(json.load(open(p)) for p in _files(str(copy / "cells"), "cell.json")
                if json.load(open(p))["label"].get("eval_block_size") == "adaptive")
    for name, r in cell["datasets"].items():
        assert r["same_output"] == r["turns"] == len(r["samples"])
        chosen = []
        for x in r["samples"]:
            lengths, acc = x["dflash"]["verify_lengths"], x["dflash"]["acceptance_lengths"]
            assert len(lengths) == len(acc) and set(lengths) <= {4, 8, 16}
            assert all(1 <= a <= v for a, v in zip(acc, lengths)), (acc, lengths)
            chosen += lengths
        assert r["mean_verify_length"] == pytest.approx(np.mean(chosen))
        assert adaptive["datasets"][name]["mean_verify_length"] == pytest.approx(np.mean(chosen))
    assert any("adaptive verify length (trained at 16" in f for f in ablate_block_size.findings(table))
    assert (tmp_path / "out" / "plot.png").stat().st_size > 0
    args = framework.parser(ablate_block_size.EXPERIMENT).parse_args(["--eval-block-sizes", "8", "Adaptive"])
    assert args.eval_block_sizes == [8, "adaptive"]
    with pytest.raises(SystemExit):
        framework.parser(ablate_block_size.EXPERIMENT).parse_args(["--eval-block-sizes", "adaptve"])


def test_a_killed_cell_resumes_to_the_uninterrupted_drafter(smoke, tmp_path):
    """SIGKILL during a cell's training (the command in a process of its own), rerun (the same
    command, in this process): the exported drafter equals the one the uninterrupted run
    trained (the trainer resumes from its Orbax checkpoint)."""
    _, work, depth, _ = smoke
    killed = tmp_path / "work"
    shutil.copytree(os.path.join(work, "data"), killed / "data")  # the same data: skip regenerating
    # and the cells' measurements: what is tested is the training; the rerun still trains (its
    # drafter has no train.json) and then reuses the cell instead of measuring it again
    shutil.copytree(os.path.join(work, "cells"), killed / "cells")
    # (the test preset saves at its last step only; a checkpoint every 2 steps, which is not part of
    # a cell's identity, gives the killed run one to resume from)
    argv = ["--preset", "test", "--depths", "1", "--checkpoint-every", "2", "--work", str(killed),
            "--out", str(tmp_path / "out")]
    proc = subprocess.Popen([sys.executable, "-m", "experiments.ablate_depth", *argv], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    drafter = depth.rows[0]["cells"][0]
    metrics = killed / "drafters" / drafter / "run" / "metrics.jsonl"
    lines = kill_after_lines(proc, metrics, 3)
    assert 3 <= lines < 8 and not (killed / "drafters" / drafter / "train.json").exists(), \
        "the run was not killed during training"
    # the rerun needs no process of its own: what resumes is the trainer, from the killed
    # process's checkpoint (a failed run exits: SystemExit fails the test)
    ablate_depth.main(argv)
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    ref = os.path.join(work, "drafters", drafter, "drafter", "model.safetensors")
    got = killed / "drafters" / drafter / "drafter" / "model.safetensors"
    assert got.read_bytes() == open(ref, "rb").read()


def _cells(experiment, **overrides):
    from dflash_jax.config import TargetConfig

    s, train, axes = framework.resolve(experiment, "smoke", overrides)
    s = framework.dataclasses.replace(s, mask_token_id=1)
    work = framework.Work("/nonexistent", s, None)
    cells = framework.check_settings(experiment, s, train, axes, TargetConfig.from_pretrained(EMBEDDED_TARGET_DIR))
    return [(framework.stable_hash(work.drafter_key(c)), framework.stable_hash(work.cell_key(c))) for c in cells]


def test_settings_added_later_keep_the_committed_cells_reusable():
    """The committed cpu-preset tables name the drafters they measured by hash; settings added
    since (conditioning, anchors, sampled drafts) must not change those hashes at their
    defaults, or every committed cell would be retrained."""
    from transformers import AutoTokenizer

    from dflash_jax.config import TargetConfig

    mask = AutoTokenizer.from_pretrained(EMBEDDED_TARGET_DIR).mask_token_id
    for name, module in (("ablate_depth", ablate_depth), ("ablate_block_size", ablate_block_size)):
        s, train, axes = framework.resolve(module.EXPERIMENT, "cpu", {})
        s = framework.dataclasses.replace(s, mask_token_id=mask)
        work = framework.Work("/nonexistent", s, None)
        cells = framework.check_settings(module.EXPERIMENT, s, train, axes,
                                         TargetConfig.from_pretrained(EMBEDDED_TARGET_DIR))
        with open(os.path.join(ROOT, "results", "ablations", name, "table.json")) as f:
            committed = json.load(f)
        want = {json.dumps(r["label"], sort_keys=True): r["cells"][0] for r in committed["rows"]}
        got = {json.dumps({k: v for k, v in c.label.items() if k != "seed"}, sort_keys=True):
               framework.stable_hash(work.drafter_key(c)) for c in cells}
        # every committed cell keeps its drafter; a cell added since (the inference block size
        # 'adaptive') is only measured, on a drafter the committed table already trained
        assert {k: got.get(k) for k in want} == want, name
        added = {k: v for k, v in got.items() if k not in want}
        assert set(added.values()) <= set(want.values()), (name, added)


def test_the_hash_changes_when_and_only_when_a_setting_changes():
    base = _cells(ablate_depth.EXPERIMENT)
    assert _cells(ablate_depth.EXPERIMENT) == base and len(set(base)) == 2
    # settings that do not change the drafter or the measurement: the same hashes
    assert _cells(ablate_depth.EXPERIMENT, checkpoint_every=1) == base
    # a training setting: every drafter and every cell change
    for change in ({"learning_rate": 5e-4}, {"steps": 9}, {"num_anchors": 4}, {"taps": (1, 2)},
                   {"num_prompts": 15}, {"gamma": 3.0}, {"seed": 1}, {"anchors": "fixed"},
                   {"uniform_weights": True}):
        new = _cells(ablate_depth.EXPERIMENT, **change)
        assert all(n[0] != b[0] and n[1] != b[1] for n, b in zip(new, base)), change
    # an evaluation setting: the same drafters, other cells
    for change in ({"max_samples": 3}, {"max_new_tokens": 17}, {"temperature": 1.0}, {"eval_block_size": 8},
                   {"datasets": ("mbpp",)}, {"num_denoise_steps": 2}):
        new = _cells(ablate_depth.EXPERIMENT, **change)
        assert all(n[0] == b[0] and n[1] != b[1] for n, b in zip(new, base)), change
    # the varied setting changes only its own cell
    assert _cells(ablate_depth.EXPERIMENT, depths=(1, 3)) == [base[0], _cells(ablate_depth.EXPERIMENT, depths=(3,))[0]]
    # two seeds: the first seed's cells are the one-seed cells
    assert _cells(ablate_depth.EXPERIMENT, seeds=2)[:2] == base


@pytest.mark.parametrize("overrides, message", [
    ({"no_such_setting": 1}, "has no setting 'no_such_setting'"),
    ({"train_block_sizes": (1, 8)}, "block size >= 2"),
    ({"eval_block_sizes": (1,)}, "inference block size 1"),
    ({"eval_block_sizes": (8, "adaptve")}, "inference block size 'adaptve'"),
    ({"depths": (1, 9)}, "9-layer drafter"),
    ({"datasets": ("gsm8k", "nope")}, "unknown prompt set nope"),
    ({"steps": 0}, "steps 0 trains nothing: give --init-from"),
    ({"steps": -1}, "steps must be an integer >= 1"),
    ({"num_prompts": 0}, "num_prompts must be >= 1"),
    ({"prompt_source": "elsewhere"}, "prompt_source must be one of"),
])
def test_bad_settings_are_refused_before_anything_runs(tmp_path, overrides, message):
    experiment = ablate_block_size if "train_block_sizes" in overrides or "eval_block_sizes" in overrides else ablate_depth
    if "depths" in overrides and experiment is not ablate_depth:
        experiment = ablate_depth
    with pytest.raises(ValueError, match=message):
        experiment.run("smoke", out=str(tmp_path / "out"), work=str(tmp_path / "work"), **overrides)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_bad_targets_presets_and_outputs_are_refused(tmp_path, capsys):
    work = tmp_path / "work"
    no_tok = tmp_path / "target"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(EMBEDDED_TARGET_DIR, f), no_tok / f)
    with pytest.raises(ValueError, match="has no tokenizer"):
        ablate_depth.run("smoke", target=str(no_tok), out=str(tmp_path / "o1"), work=str(work))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ablate_depth.run("smoke", target=str(tmp_path / "missing"), out=str(tmp_path / "o1"), work=str(work))
    with pytest.raises(ValueError, match="unknown preset"):
        ablate_depth.run("laptop", out=str(tmp_path / "o1"), work=str(work))
    with pytest.raises(ValueError, match="needs --target"):
        ablate_depth.run("gpu", out=str(tmp_path / "o1"), work=str(work))
    # an --out of another experiment, or a directory that is not an experiment's: untouched
    other = tmp_path / "other"
    other.mkdir()
    (other / "table.json").write_text(json.dumps({"experiment": "ablate_block_size"}))
    with pytest.raises(ValueError, match="holds the results of experiment 'ablate_block_size'"):
        ablate_depth.run("smoke", out=str(other), work=str(work))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match="without a table.json"):
        ablate_depth.run("smoke", out=str(mine), work=str(work))
    assert (mine / "README.md").read_text() == "my notes"
    assert json.loads((other / "table.json").read_text()) == {"experiment": "ablate_block_size"}
    assert not work.exists()
    # the command line (its main, as `python -m experiments.ablate_depth` runs it; that entry
    # point runs as a process of its own in test_a_killed_cell_resumes_to_the_uninterrupted_drafter):
    # a clear one-line error, exit code 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        ablate_depth.main(["--preset", "smoke", "--depths", "0", "--work", str(work), "--out", str(tmp_path / "o2")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "error:" in err and "0-layer drafter" in err, err
    assert not work.exists()
    with pytest.raises(SystemExit) as exit_:
        ablate_depth.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert exit_.value.code == 0 and "--depths" in text
    assert "(defaults: smoke 1 2, test 1 2, cpu 1 2 3, cpu-full 1 2 3, gpu 3 5 8)" in text


def test_an_out_of_other_settings_needs_overwrite(smoke, tmp_path):
    root, work, _, _ = smoke
    with pytest.raises(ValueError, match="other settings"):
        ablate_depth.run("test", out=str(root / "ablations" / "ablate_depth"), work=work, depths=(1,))
    before = (root / "ablations" / "ablate_depth" / "table.json").read_text()
    t = ablate_depth.run("test", out=str(tmp_path / "one"), work=work, depths=(1,))  # reused cell
    assert len(t.rows) == 1 and (root / "ablations" / "ablate_depth" / "table.json").read_text() == before


def test_seeds_are_aggregated_into_one_row_with_their_spread(monkeypatch):
    """Two seeds of one cell: the row's tau and speedup are the means over the seeds (per set,
    then over sets), each seed is listed, and the intervals come from the pooled strata (with
    the rule's threshold lowered to the 4 responses here; at the real one, no interval)."""
    from dflash_jax import metrics
    from dflash_jax.metrics import Response

    def record(seed, lengths, ar_s, df_s):
        resp = lambda n, acc, s: Response(n, tuple(acc), 0.01, s).to_dict()
        rows = [{"ar": resp(9, [1] * 8, a), "dflash": resp(9, acc, d)} for acc, a, d in zip(lengths, ar_s, df_s)]
        return {"datasets": {"gsm8k": {"samples": rows, "histogram": [0] * 4, "position_acceptance": [0.0] * 3,
                                       "same_output": 2, "turns": 2}},
                "average": {"tau": float(np.mean([np.mean(x) for x in lengths])),
                            "speedup": float(np.mean(ar_s) / np.mean(df_s))},
                "draft_ms": 1.0 + seed, "verify_ms": 2.0, "training": {"drafter_params": 10, "minutes": 1.5},
                "drafter_hash": f"d{seed}"}

    cells = [framework.Cell({"layers": 1, "seed": s}, {}, {}, {}) for s in (0, 1)]
    recs = [record(0, [[4, 4], [2, 2, 2, 2]], [0.8, 0.8], [0.4, 0.2]),   # tau (4 + 2) / 2 = 3, speedup 0.8 / 0.3
            record(1, [[2, 2, 2, 2], [2, 2, 2, 2]], [0.8, 0.8], [0.4, 0.4])]  # tau 2, speedup 2
    (unsupported,) = framework.aggregate(cells, recs)
    assert unsupported["average"]["responses"] == 4 and np.isnan(unsupported["average"]["tau_ci"]).all()
    assert not framework.has_interval(unsupported)
    monkeypatch.setattr(metrics, "MIN_DISTINCT_SAMPLES", 4)
    (row,) = framework.aggregate(cells, recs)
    assert row["average"]["tau"] == unsupported["average"]["tau"] and framework.has_interval(row)
    assert row["label"] == {"layers": 1}
    assert row["average"]["tau"] == pytest.approx((3 + 2) / 2)
    assert row["average"]["speedup"] == pytest.approx((0.8 / 0.3 + 2.0) / 2)
    assert [s["tau"] for s in row["seeds"]] == [3.0, 2.0] and row["cells"] == ["d0", "d1"]
    assert row["draft_ms"] == 1.5 and row["train_minutes"] == 3.0
    lo, hi = row["average"]["tau_ci"]
    assert 2.0 <= lo <= 2.5 <= hi <= 3.0


def _row(tau, ci, responses):
    return {"label": {"layers": 1}, "average": {"tau": tau, "tau_ci": list(ci), "speedup": 1.0,
                                                "speedup_ci": [0.9, 1.1], "responses": responses}}


def test_findings_rest_only_on_intervals_of_enough_responses(monkeypatch):
    """The one rule (dflash_jax.metrics.interval_supported) in every sentence a report writes:
    clearly separated intervals are a finding only when each rests on at least
    MIN_DISTINCT_SAMPLES responses; a missing (nan) interval is never one."""
    from dflash_jax import metrics

    name = lambda r: "x"
    apart = [_row(1.0, (0.9, 1.1), 30), _row(2.0, (1.9, 2.1), 30)]
    few = [_row(1.0, (0.9, 1.1), 2), _row(2.0, (1.9, 2.1), 2)]  # intervals of 2 responses (older code gave them)
    nan = [_row(1.0, (float("nan"),) * 2, 30), _row(2.0, (1.9, 2.1), 30)]
    assert framework.separated(*apart) and "do not overlap" in framework.compare(apart, name)[0]
    for rows in (few, nan):
        assert not framework.separated(*rows)
        sentence = framework.compare(rows, name)[0]
        assert "no 95 % interval" in sentence and "not a finding" in sentence and "do not overlap" not in sentence
        assert "neither confirms nor contradicts" in framework.paper_direction(rows[1], rows[0], name, "p")
    assert "(2 responses; an interval needs at least 8)" in framework.compare(few, name)[0]
    overlap = [_row(1.0, (0.5, 1.5), 30), _row(1.2, (0.7, 1.7), 30)]
    assert "within the 95 % intervals: not a finding" in framework.compare(overlap, name)[0]
    # the threshold is the metrics module's, read where the rule is applied
    monkeypatch.setattr(metrics, "MIN_DISTINCT_SAMPLES", 2)
    assert framework.separated(*few) and "do not overlap" in framework.compare(few, name)[0]
    # the depth ablation's own sentence follows the same rule
    table = framework.Table(ablate_depth.EXPERIMENT, "smoke", {}, {}, [dict(r, draft_ms=None) for r in few],
                            "cmd", {"device": "cpu"}, 0.0)
    monkeypatch.setattr(metrics, "MIN_DISTINCT_SAMPLES", 8)
    last = ablate_depth.findings(table)[-1]
    assert "no 95 % interval" in last and "agreeing" not in last
