"""``tools/quantized_report.py`` on the committed bench runs (results/quantized): the paired tau
differences against a recomputation from the responses' acceptance lengths, the refusal of runs
that answered other prompts, the report redrawn from its JSON."""

import copy
import json
import os

import numpy as np
import pytest

from dflash_jax import metrics
from dflash_jax.tools import quantized_report

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RUNS = {n: os.path.join(ROOT, "results", "quantized", f"bench-{q}") for n, q in
        (("float32", "none"), ("int8", "int8"), ("fp8", "fp8"))}


def _bench(name):
    with open(os.path.join(RUNS[name], "bench.json")) as f:
        return json.load(f)


def test_paired_differences_are_the_responses_own():
    runs = {n: _bench(n) for n in RUNS}
    table = quantized_report.compare(runs)
    per_set = []
    for s in runs["float32"]["datasets"]:
        taus = {n: {(x["id"], x["turn"]): np.mean(x["dflash"]["acceptance_lengths"])
                    for x in runs[n]["datasets"][s]["samples"]} for n in runs}
        diffs = [taus["fp8"][k] - taus["float32"][k] for k in sorted(taus["float32"])]
        got = table["sets"][s]["fp8"]
        assert got["tau_diff"] == pytest.approx(np.mean(diffs))
        lo, hi = got["tau_diff_ci"]
        assert lo <= got["tau_diff"] <= hi
        # the interval resamples the pairs together (this test's own pairing, in (id, turn) order)
        assert [lo, hi] == list(metrics.bootstrap_interval(lambda d: float(np.mean(d[0])), [(diffs,)]))
        assert table["sets"][s]["fp8"]["tau"] == runs["fp8"]["datasets"][s]["tau"]
        per_set.append(np.mean(diffs))
    assert table["average"]["fp8"]["tau_diff"] == pytest.approx(np.mean(per_set))


def test_runs_of_other_prompts_are_refused():
    base = _bench("float32")
    other = copy.deepcopy(_bench("int8"))
    other["datasets"]["gsm8k"]["samples"][0]["id"] = "gsm8k/not-the-same"
    with pytest.raises(ValueError, match="did not answer the same prompts of gsm8k"):
        quantized_report.compare({"float32": base, "int8": other})


def test_the_report_is_written_and_redrawn_from_its_json(tmp_path):
    from dflash_jax.tools import replot

    quantized_report.main(["--runs", *(f"{n}={d}" for n, d in RUNS.items()), "--out", str(tmp_path)])
    text = (tmp_path / "README.md").read_text()
    assert "| **average** | 5.41 [4.79, 6.12] | 5.21 [4.56, 5.92] | 5.27 [4.68, 5.92] | -0.20 [-0.43, 0.00] | " \
        "-0.14 [-0.48, 0.18] |" in text
    [(png, fig)] = replot.figures_of(str(tmp_path / "quantized.json"))
    assert png == str(tmp_path / "quantized.png") and fig.axes
    with pytest.raises(SystemExit):
        quantized_report.main(["--out", str(tmp_path)])
