"""experiments.ablate_budget (the drafting budget of EAGLE-3 and DFlash against the draft's cost,
inference only): the smoke preset end to end on the embedded target (AR, an EAGLE-3 chain of 2
steps and a tree of 5 nodes with a random-weight EAGLE-3 drafter, the shipped DFlash drafter at
block 4; on two MBPP prompts instead of GSM8K's, see SET), its outputs checked against oracles
(every greedy output equals autoregressive decoding; tau, speedup and the acceptance counts
recomputed with numpy from the saved responses; no acceptance past the block), the findings'
logic on made-up rows, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_jax.experiments import ablate_budget as ab

pytestmark = [pytest.mark.xdist_group("test_ablate_budget"), pytest.mark.slow, pytest.mark.experiments]


# The smoke preset on the prompts of the experiments' test preset (tests/experiments' other
# modules): two MBPP prompts of at most 48 tokens (seed 1), so the runs share one (prompt width,
# cache) shape with those modules', (48, 128): the AR program and the shipped drafter's chain are
# programs they compile too (one persistent compilation cache per test run)
SET, SEED = "mbpp", 1


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate_budget") / "out"
    table = ab.run(preset="smoke", out=str(out), datasets=(SET,), seed=SEED)
    return out, table


def test_smoke_writes_its_files_and_draws_no_finding(smoke):
    out, table = smoke
    for f in ("table.md", "table.json", "plot.png", "README.md"):
        assert (out / f).stat().st_size > 0, f
    saved = json.loads((out / "table.json").read_text())
    assert saved["experiment"] == "ablate_budget" and saved["smoke"] is True
    assert [r["label"] for r in saved["rows"]] == [
        {"method": "eagle3", "block_size": 3, "nodes": None, "topk": None},
        {"method": "eagle3", "block_size": 3, "nodes": 5, "topk": 2},
        {"method": "dflash", "block_size": 4, "nodes": None, "topk": None}]
    assert [r["family"] for r in saved["rows"]] == ["EAGLE-3 chain", "EAGLE-3 tree", "DFlash chain"]
    assert [r["verify_rows"] for r in saved["rows"]] == [3, 5, 4]
    assert all(r["draft_ms"] > 0 for r in saved["rows"])
    readme = (out / "README.md").read_text()
    assert "**This is a smoke run**" in readme and "1.76x / tau 2.96" in readme
    findings = readme.split("## What the data shows")[1]
    assert "no 95 % interval (2 responses; an interval needs at least 8)" in findings
    assert "do not overlap" not in findings
    with pytest.raises(ValueError, match="already holds ablate_budget results"):
        ab.run(preset="smoke", out=str(out))


def test_outputs_equal_autoregressive_and_metrics_follow_from_the_responses(smoke):
    """Oracles: at T = 0 every cell's output equals AR's (counted in the run against the AR
    tokens), for EAGLE-3's chain and tree as for DFlash; tau = mean over responses of the mean
    acceptance length, the decode speedup = mean AR time per token / mean time per token of the
    cell, recomputed here; the acceptance lengths cover the tokens made and never exceed the
    block (an EAGLE-3 tree's depth is its steps, plus the bonus)."""
    _, table = smoke
    rec = table["responses"][SET]
    tpot = lambda rs: np.mean([r["decode_s"] / (r["new_tokens"] - 1) for r in rs])
    for i, row in enumerate(table["rows"]):
        assert row["same_output"] == row["responses"] == len(rec["ar"]) == 2
        responses = rec["cells"][i]
        assert row["datasets"][SET]["tau"] == pytest.approx(
            np.mean([np.mean(r["acceptance_lengths"]) for r in responses]))
        assert row["average"]["tau"] == pytest.approx(row["datasets"][SET]["tau"])
        assert row["datasets"][SET]["speedup"] == pytest.approx(tpot(rec["ar"]) / tpot(responses))
        for r in responses:
            a = r["acceptance_lengths"]
            assert sum(a[:-1]) < r["new_tokens"] - 1 <= sum(a) and max(a) <= row["label"]["block_size"]
    md = ab.markdown(table)
    assert md.count("\n") == 4 and "| EAGLE-3 chain, k = 2 | 3 |" in md and "2 / 2" in md


def row(method, bs, draft, tau, ci, nodes=None, speedup=1.0, n=40):
    cell = {"method": method, "block_size": bs, "nodes": nodes, "topk": 4 if nodes else None}
    av = {"tau": tau, "tau_ci": list(ci), "speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1],
          "responses": n, "iteration_cost_ar_steps": 2.0}
    return {"label": cell, "name": ab.cell_name(cell), "family": ab.family(cell), "draft_ms": draft,
            "verify_rows": nodes or bs, "average": av, "datasets": {}, "same_output": n, "responses": n}


def test_findings_compare_through_the_intervals_and_fit_the_step_cost():
    """Across a family's budgets and between the two largest chains, tau and speedup are
    compared only through their intervals; the EAGLE-3 draft cost per step is the least-squares
    slope over k (here exactly 2 ms per step)."""
    rows = [row("eagle3", k + 1, 1.0 + 2.0 * k, 1.5 + 0.1 * k, (1.4 + 0.1 * k, 1.6 + 0.1 * k)) for k in (1, 3, 7)]
    rows += [row("dflash", 4, 5.0, 2.5, (2.4, 2.6)), row("dflash", 16, 6.0, 3.0, (2.0, 4.0))]
    out = ab.findings({"rows": rows})
    assert out[0].startswith("EAGLE-3 chain: k=1 -> k=7: draft 3.00 -> 15.00 ms per iteration (x5.00); tau 1.60 -> "
                             "2.20 (the intervals do not overlap)")
    assert "DFlash chain: b=4 -> b=16: draft 5.00 -> 6.00 ms" in out[1] and "within the 95 % intervals" in out[1]
    assert out[2].startswith("the largest chains, EAGLE-3 chain, k = 7 against DFlash chain, block 16: draft "
                             "15.00 vs 6.00 ms (7 sequential steps vs one pass over 16 rows)")
    assert "EAGLE-3's draft cost per extra step (least squares over k = 1, 3, 7): 2.000 ms" in out[3]
    assert out[-1] == "every output equals the autoregressive output (T = 0)"
    rows[0]["same_output"] = 39
    assert "some outputs differ" in ab.findings({"rows": rows})[-1]


@pytest.mark.parametrize("overrides, match", [
    ({"eagle3_steps": (0,)}, "drafting steps k >= 1"),
    ({"dflash_blocks": (1,)}, "a block needs the anchor"),
    ({"eagle3_steps": (2, 2)}, "must not repeat"),
    ({"eagle3_trees": ("16",)}, "give N:TOPK"),
    ({"dflash_trees": ("1:4",)}, "N >= 2 nodes"),
    ({"eagle3_steps": (), "eagle3_trees": ()}, "each method needs at least one budget"),
    ({"datasets": ("gsm9k",)}, "unknown prompt set gsm9k"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be >= 1"),
    ({"layers": 2}, "ablate_budget has no setting 'layers'"),
])
def test_bad_settings_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        ab.resolve("smoke", overrides)


def test_bad_preset_out_and_eagle3_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'gpu'"):
        ab.resolve("gpu", {})
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-empty directory without a table.json"):
        ab.run(preset="smoke", out=str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError, match="not a directory; give 'embedded-eagle3'"):
        ab.run(preset="smoke", out=str(tmp_path / "y"), eagle3=str(tmp_path / "missing"))
    args = ab.parser().parse_args(["--eagle3-steps", "1", "7", "--eagle3-trees", "16:4", "--dflash-trees"])
    assert args.eagle3_steps == [1, 7] and args.eagle3_trees == ["16:4"] and args.dflash_trees == []
    s = ab.resolve("cpu", {})
    assert s.eagle3 == "embedded-eagle3" and s.eagle3_steps == (1, 2, 3, 5, 7)
    assert [ab.cell_name(c) for c in ab.cells(s)][4:7] == [
        "EAGLE-3 chain, k = 7", "EAGLE-3 tree 16 (top-4, 7 steps)", "EAGLE-3 tree 60 (top-10, 7 steps)"]
