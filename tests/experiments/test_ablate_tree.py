"""experiments.ablate_tree (tree budget x block size, inference only): the smoke preset end to end on
the embedded pair (AR, the chain and a tree of 8 nodes at block 8; on two MBPP prompts instead of
GSM8K's, see SET), its outputs checked against oracles (every greedy output equals autoregressive
decoding; tau, speedup and the acceptance counts recomputed with numpy from the saved responses),
the findings' logic on made-up rows, and the refusals."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from dflash_jax.experiments import ablate_tree as at

pytestmark = [pytest.mark.xdist_group("test_ablate_tree"), pytest.mark.slow, pytest.mark.experiments]


# The smoke preset on the prompts of the experiments' test preset (tests/experiments' other
# modules): two MBPP prompts of at most 48 tokens (seed 1), so the runs share one (prompt width,
# cache) shape with those modules', (48, 128): the AR program and the shipped drafter's chain are
# programs they compile too (one persistent compilation cache per test run)
SET, SEED = "mbpp", 1


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate_tree") / "out"
    table = at.run(preset="smoke", out=str(out), datasets=(SET,), seed=SEED)
    return out, table


def test_smoke_writes_its_files_and_draws_no_finding(smoke):
    out, table = smoke
    for f in ("table.md", "table.json", "plot.png", "README.md"):
        assert (out / f).stat().st_size > 0, f
    saved = json.loads((out / "table.json").read_text())
    assert saved["experiment"] == "ablate_tree" and saved["smoke"] is True
    assert [r["label"] for r in saved["rows"]] == [{"nodes": "chain", "block_size": 8}, {"nodes": 8, "block_size": 8}]
    assert [r["verify_rows"] for r in saved["rows"]] == [8, 8]
    readme = (out / "README.md").read_text()
    assert "**This is a smoke run**" in readme and "not the paper's numbers" in readme
    assert "sgl-project/sglang/pull/31069" in readme
    findings = readme.split("## What the data shows")[1]
    assert "no 95 % interval (2 responses; an interval needs at least 8)" in findings
    assert "do not overlap" not in findings
    for row in saved["rows"]:  # 2 responses: no interval
        assert row["responses"] == 2 and all(np.isnan(row["average"]["tau_ci"]))
    # a second run into the same --out is refused unless --overwrite
    with pytest.raises(ValueError, match="already holds ablate_tree results"):
        at.run(preset="smoke", out=str(out))


def test_outputs_equal_autoregressive_and_metrics_follow_from_the_responses(smoke):
    """Oracles: at T = 0 every cell's output equals AR's (counted in the run against the AR
    tokens); tau = mean over responses of the mean acceptance length, the decode speedup = mean
    AR time per token / mean DFlash time per token, recomputed here from the saved responses;
    the acceptance lengths cover the tokens made (the last iteration may overshoot the budget)
    and never exceed the block (a tree's depth is at most block - 1, plus the bonus)."""
    _, table = smoke
    rec = table["responses"][SET]
    tpot = lambda rs: np.mean([r["decode_s"] / (r["new_tokens"] - 1) for r in rs])
    for i, row in enumerate(table["rows"]):
        assert row["same_output"] == row["responses"] == len(rec["ar"]) == 2
        responses = rec["cells"][i]
        assert row["datasets"][SET]["tau"] == pytest.approx(
            np.mean([np.mean(r["acceptance_lengths"]) for r in responses]))
        assert row["average"]["tau"] == pytest.approx(row["datasets"][SET]["tau"])  # one set
        assert row["datasets"][SET]["speedup"] == pytest.approx(tpot(rec["ar"]) / tpot(responses))
        for r in responses:
            a = r["acceptance_lengths"]
            assert sum(a[:-1]) < r["new_tokens"] - 1 <= sum(a) and max(a) <= row["label"]["block_size"]
    for r in rec["ar"]:
        assert r["acceptance_lengths"] == [1] * (r["new_tokens"] - 1)
    md = at.markdown(table)
    assert md.count("\n") == 3 and "| chain | 8 | 8 |" in md and "2 / 2" in md


def row(nodes, bs, tau, ci, speedup=1.0, n=40):
    av = {"tau": tau, "tau_ci": list(ci), "speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1],
          "responses": n, "iteration_cost_ar_steps": 2.0}
    return {"label": {"nodes": nodes, "block_size": bs}, "verify_rows": bs if nodes == "chain" else nodes,
            "average": av, "datasets": {}, "same_output": n, "responses": n}


def test_findings_compare_through_the_intervals():
    """A tree whose tau interval lies above the chain's is a finding; one that overlaps is not;
    the gain in percent is the ratio of the averages."""
    table = {"settings": {"block_sizes": [16], "nodes": ["chain", 16, 32]},
             "rows": [row("chain", 16, 4.0, (3.8, 4.2)), row(16, 16, 4.1, (3.9, 4.3)), row(32, 16, 5.0, (4.7, 5.3))]}
    out = at.findings(table)
    assert "block 16, tau: chain 4.00 -> tree 16 4.10 (+2.5 %; within the 95 % intervals: not a finding" in out[0]
    assert "block 16, tau: chain 4.00 -> tree 32 5.00 (+25.0 %; the intervals do not overlap)" in out[2]
    assert any("every DFlash output equals the autoregressive output" in x for x in out)
    table["rows"][1]["same_output"] = 39
    assert any("some outputs differ" in x for x in at.findings(table))


@pytest.mark.parametrize("overrides, match", [
    ({"nodes": ("chain", 1)}, "a tree needs at least 2 nodes"),
    ({"block_sizes": (1,)}, "a block needs the anchor"),
    ({"nodes": (16, 16)}, "must not repeat"),
    ({"tree_topk": 0}, "at least 1 child"),
    ({"datasets": ("gsm9k",)}, "unknown prompt set gsm9k"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be >= 1"),
    ({"layers": 2}, "ablate_tree has no setting 'layers'"),
])
def test_bad_settings_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        at.resolve("smoke", overrides)


def test_bad_preset_out_and_node_values_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'gpu'"):
        at.resolve("gpu", {})
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-empty directory without a table.json"):
        at.run(preset="smoke", out=str(tmp_path / "x"))
    with pytest.raises(argparse.ArgumentTypeError, match="neither 'chain' nor a node budget"):
        at.node_budget("wide")
    assert at.parser().parse_args(["--nodes", "chain", "32", "--block-sizes", "8"]).nodes == ["chain", 32]
    assert at.resolve("cpu", {}).nodes == ("chain", 16, 32, 64)
