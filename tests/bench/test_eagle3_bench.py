"""The benchmarks with an EAGLE-3 drafter: ``bench --drafter EAGLE3_DIR --tree N`` (the EAGLE-3
column, labelled as such, every greedy output equal to autoregressive decoding), table1's EAGLE-3
columns (``experiments.paper``, ``--repeats``: the speedup recomputed with numpy from the runs'
decode times averaged per response), the iteration profile per method, and ``methods.eagle3.named``'s
refusals. The EAGLE-3 drafter has random weights (acceptance ~1): these check the plumbing and
the arithmetic, not EAGLE-3's acceptance."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.eagle3 import named as bd
from dflash_jax.bench import harness, iteration_profile
from dflash_jax.experiments import paper
from dflash_jax.models.handles import save_eagle3

pytestmark = [pytest.mark.xdist_group("test_eagle3_bench"), pytest.mark.slow]


@pytest.fixture(scope="module")
def pair():
    import jax.numpy as jnp

    target, drafter = dj.load_embedded(dtype=jnp.float32)
    return target, drafter, bd.random_eagle3(target, dtype=jnp.float32)


def test_random_eagle3_and_refusals(pair, tmp_path):
    target, _, e3 = pair
    assert e3.config.target_layer_ids == (0, 1, 2)  # the embedded target has 4 layers: no default
    assert list(e3.draft_vocab[:3]) == [0, 4, 8] and e3.config.draft_vocab_size == target.config.vocab_size // 4
    with pytest.raises(FileNotFoundError, match="not a directory; give 'embedded-eagle3'"):
        bd.load_eagle3_drafter(str(tmp_path / "missing"), target)
    save_eagle3(e3, tmp_path / "e3")
    again = bd.load_eagle3_drafter(str(tmp_path / "e3"), target)
    assert (again.d2t == e3.d2t).all()


def test_bench_with_an_eagle3_tree(pair, tmp_path):
    """``bench --drafter DIR --tree 5 --tree-topk 2`` with an EAGLE-3 directory: the report says
    EAGLE-3 (method, label, block 8), has no adaptive table, and every output equals AR's."""
    target, _, e3 = pair
    save_eagle3(e3, tmp_path / "e3")
    report = harness.main(["--drafter", str(tmp_path / "e3"), "--datasets", "gsm8k", "--max-samples", "1",
                           "--max-new-tokens", "8", "--tree", "5", "--tree-topk", "2", "--out", str(tmp_path / "o")])
    st = report["settings"]
    assert st["method"] == "eagle3" and st["block_size"] == 8 and st["tree"] == 5 and st["tree_topk"] == 2
    assert harness.method_label(report) == "EAGLE-3 tree 5, top-2" and "average_adaptive" not in report
    rec = report["datasets"]["gsm8k"]
    assert rec["same_output"] == rec["turns"] == 1
    lengths = rec["samples"][0]["dflash"]["acceptance_lengths"]
    assert max(lengths) <= 8 and sum(lengths) >= 7
    md = (tmp_path / "o" / "bench.md").read_text()
    assert "EAGLE-3 tree 5, top-2 ms/token" in md and "one EAGLE-3 iteration (draft + verify)" in md
    assert "Where an iteration costs" not in md  # the H100 reference cost is DFlash's


def test_table1_eagle3_columns_and_repeats(tmp_path):
    """table1 with a random EAGLE-3 drafter (its chain; no tree, to keep it short), 2 runs each: the
    EAGLE-3 columns' tau and speedup recomputed from the cached per-run records (the speedup
    from each response's decode times averaged over the runs), greedy outputs equal to AR, the
    paper's EAGLE-3 numbers beside, one finding per column and metric."""
    work, out = tmp_path / "work", tmp_path / "out"
    r = paper.run("table1", "smoke", out=str(out), work=str(work), datasets=("gsm8k",), temperatures=(0.0,),
                  eagle3="random", eagle3_trees=(), repeats=2)["table1"]
    e3 = r["eagle3"]
    assert list(e3) == ["chain"] and e3["chain"]["block_size"] == 8 and e3["chain"]["tree"] is None
    records = []
    for d in os.listdir(work / "paper"):
        records.append(json.loads((work / "paper" / d / "record.json").read_text()))
    assert len(records) == 2 * 2  # DFlash and the EAGLE-3 chain, 2 runs each
    tpot = lambda rs: np.mean([x["decode_s"] / (x["new_tokens"] - 1) for x in rs])
    for name, col in e3.items():
        tree = col["tree"]
        runs = sorted((x for x in records if x["key"]["drafter"] == {"random": 0} and x["key"].get("tree") == tree),
                      key=lambda x: x["key"].get("run", 0))
        assert len(runs) == 2
        samples = [x["record"]["samples"] for x in runs]
        assert all(s[0]["same_output"] for s in samples)
        got = col["datasets"]["gsm8k"]
        assert got["tau"] == pytest.approx(np.mean(samples[0][0]["dflash"]["acceptance_lengths"]))
        avg = lambda m: [{"decode_s": np.mean([s[0][m]["decode_s"] for s in samples]),
                          "new_tokens": samples[0][0][m]["new_tokens"]}]
        assert got["speedup"] == pytest.approx(tpot(avg("ar")) / tpot(avg("dflash")))
        assert [x["speedup"] for x in got["runs"]] == pytest.approx(
            [tpot([s[0]["ar"]]) / tpot([s[0]["dflash"]]) for s in samples])
    md = (out / "table1.md").read_text()
    assert "EAGLE-3 (random weights: not a result) on the same prompts, T = 0" in md
    assert "| **average** |" in md and "1.76x / 2.96" in md and "2.02x / -" in md
    assert "Speed per run (2 runs" in md and "| EAGLE-3 chain |" in md
    found = [f for f in r["findings"] if "EAGLE-3" in f]
    assert len(found) == 2 and found[0].startswith("T = 0, tau: DFlash ") and "the paper" not in found[0]


def test_table1_eagle3_findings_through_the_intervals():
    """DFlash against each EAGLE-3 column: a finding only where the intervals do not overlap;
    the paper's ratios beside the tree-16 and tree-60 columns."""
    av = lambda tau, lo, hi, sp: {"tau": tau, "tau_ci": [lo, hi], "speedup": sp, "speedup_ci": [sp - 0.05, sp + 0.05],
                                  "responses": 40}
    dflash = av(4.0, 3.8, 4.2, 1.5)
    e3 = {"chain": {"average": av(2.0, 1.9, 2.1, 1.0)}, "tree 16": {"average": av(3.9, 3.7, 4.1, 1.2)},
          "tree 60": {"average": av(2.5, 2.4, 2.6, 1.48)}}
    out = paper.eagle3_findings(dflash, e3)
    assert out[0] == "T = 0, tau: DFlash 4.00 vs EAGLE-3 chain 2.00 (x2.00; the intervals do not overlap)"
    assert out[2].startswith("T = 0, tau: DFlash 4.00 vs EAGLE-3 tree 16 3.90 (x1.03; within the 95 % intervals")
    assert out[2].endswith("; the paper: 6.49 vs 2.96, x2.19)")
    assert out[3].endswith("the intervals do not overlap; the paper: 4.86 vs 1.76, x2.76)")
    assert "the paper" not in out[4] and out[5].endswith("; the paper: 4.86x vs 2.02x, x2.41)")
    assert "within the 95 % intervals" in out[5]
    assert paper.eagle3_findings(None, e3) == []


def test_iteration_profile_per_method(pair):
    """The per-method profile: draft and verify (each jitted alone) and the decode loop's
    iteration per method, the ratios following from them; a method whose drafter is not given
    (here DFlash's) is left out."""
    target, _, e3 = pair
    methods = (("DFlash chain", "dflash", {"block_size": 4}), ("EAGLE-3 chain, 2 steps", "eagle3", {"block_size": 3}))
    m = iteration_profile.method_profile(target, {"eagle3": e3}, 16, 1, 2, methods)
    assert [r["method"] for r in m["rows"]] == ["EAGLE-3 chain, 2 steps"]
    for r in m["rows"]:
        assert r["draft_ms"] > 0 and r["verify_ms"] > 0 and r["iteration_ms"] > 0
        assert r["iteration_over_ar_step"] == pytest.approx(r["iteration_ms"] / m["ar_step_ms"])
        assert r["draft_share"] == pytest.approx(r["draft_ms"] / (r["draft_ms"] + r["verify_ms"]))
    assert [r["verify_rows"] for r in m["rows"]] == [3]
    assert iteration_profile.methods_markdown(m).count("| EAGLE-3 chain, 2 steps | 3 | 3 |") == 1
    with pytest.raises(ValueError, match="--methods-only goes with --eagle3-drafter"):
        iteration_profile.main(["--methods-only"])
    # --depths varies a DFlash drafter's layers; an EAGLE-3 drafter (one layer) is refused
    # before anything is measured
    with pytest.raises(ValueError, match="^--depths varies the drafter's layers: EAGLE-3 drafters have no depth"):
        iteration_profile.check_depths(e3, [1, 2])
    with pytest.raises(ValueError, match="--depths must be >= 1"):
        iteration_profile.check_depths(e3, [0])
