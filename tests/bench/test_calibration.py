"""``bench.calibration``: the confidence the adaptive verify reads against the acceptance the
target then gives, recorded on real decoding. The recorded pairs are checked against the
decode's own acceptance lengths (what the DSpark head's confidence is, against SpecForge's, is
``methods/test_dspark.py``'s); the summary's Brier score and reliability bins against a hand
computation; the paired comparison of a DSpark drafter's head with the heuristic on the same
rows; the command's report and plot."""

from __future__ import annotations

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.bench import calibration
from dflash_jax.tools import dspark_reference as pair

pytestmark = pytest.mark.xdist_group("test_calibration")


def test_summary_by_hand():
    p = np.array([0.9, 0.2, 0.55, 0.05])
    y = np.array([1.0, 0.0, 0.0, 1.0])
    s = calibration.summary(p, y, np.array([0, 1, 0, 1]))
    assert s["brier"] == pytest.approx(np.mean([0.01, 0.04, 0.3025, 0.9025]))
    assert s["brier_base_rate"] == pytest.approx(0.25) and s["acceptance_rate"] == 0.5
    assert [(b["rows"], b["accepted"]) for b in s["reliability"]] == [(1, 1.0), (1, 0.0), (1, 0.0), (1, 1.0)]
    assert [r["brier"] for r in s["per_row"]] == pytest.approx([(0.01 + 0.3025) / 2, (0.04 + 0.9025) / 2])
    with pytest.raises(ValueError, match="no drafted row was reached"):
        calibration.summary(np.array([]), np.array([]), np.array([], int))


def test_records_follow_the_decode(tmp_path):
    target_dir, drafters = pair.write_pair(str(tmp_path))
    target = dj.load_target(target_dir)
    drafter = dj.load_drafter(drafters["vanilla"], target)
    prompts = [list(x) for x in pair.PROMPTS]
    p, y, row, prompt = calibration.record(target, drafter, prompts, 16)
    res = dj.generate(target, prompts, 16, drafter=drafter)
    reached = sum(min(a, drafter.config.block_size) for lengths in res.acceptance_lengths for a in lengths[:-1])
    accepted = sum(min(a - 1, drafter.config.block_size) for lengths in res.acceptance_lengths for a in lengths[:-1])
    assert len(p) == reached and y.sum() == accepted and row.max() < drafter.config.block_size
    assert ((p > 0) & (p < 1)).all()  # sigmoids of the confidence head's logits
    s = calibration.summary(p, y, row, prompt)
    assert 0.0 <= s["brier"] <= 1.0 and s["rows"] == reached and s["prompts"] == len(prompts)
    assert s["brier_ci"][0] <= s["brier"] <= s["brier_ci"][1]
    # the heuristic on the same drafts: the same rows and outcomes, other predictions (the
    # draft's probability under the Markov-corrected logits)
    h = calibration.record(target, drafter, prompts, 16, use_confidence_head=False)
    assert all(np.array_equal(a, b) for a, b in zip((y, row, prompt), h[1:])) and not np.allclose(p, h[0])
    d = calibration.paired((p, y, row, prompt), h)
    assert d["brier_difference"] == pytest.approx(np.mean((p - y) ** 2) - np.mean((h[0] - y) ** 2))
    assert d["ci"][0] <= d["brier_difference"] <= d["ci"][1]
    with pytest.raises(ValueError, match="not of the same rows"):
        calibration.paired((p, y, row, prompt), (p[1:], y[1:], row[1:], prompt[1:]))
    with pytest.raises(TypeError, match="no fields"):
        calibration.record(target, drafter, prompts, 4, confidence="head")


def test_intervals_resample_prompts():
    """A prompt's rows move together: two prompts, one all right, one all wrong, give an
    interval that spans both (a row-level bootstrap would give a narrow one)."""
    p = np.full(20, 0.5)
    y = np.array([1.0] * 10 + [0.0] * 10)
    prompt = np.array([0] * 10 + [1] * 10)
    s = calibration.summary(p, y, np.zeros(20, int), prompt)
    assert s["brier"] == pytest.approx(0.25) and s["brier_ci"] == pytest.approx([0.25, 0.25])
    s = calibration.summary(np.where(prompt == 0, 0.9, 0.2), y, np.zeros(20, int), prompt)
    assert s["brier_ci"][0] == pytest.approx(0.01) and s["brier_ci"][1] == pytest.approx(0.04)


@pytest.mark.slow
def test_the_command_compares_drafters_and_pairs_the_head(tmp_path):
    """``python -m dflash_jax.bench.calibration``: labelled drafters, a DSpark drafter measured
    with its head and with the heuristic on the same rows, the report and its plot; a label
    given twice is refused before anything loads."""
    from dflash_jax.methods.dspark.handle import from_dflash

    target = dj.load_target("embedded")
    dspark = tmp_path / "dspark"
    dj.save_drafter(from_dflash(dj.load_drafter("embedded", target)), dspark)
    out = tmp_path / "out"
    report = calibration.main(["--drafter", "dflash=embedded", "--drafter", f"dspark={dspark}", "--max-samples", "2",
                               "--max-new-tokens", "12", "--out", str(out)])
    assert set(report["drafters"]) == {"dflash", "dspark", "dspark (heuristic)"}
    assert report["drafters"]["dflash"]["checkpoint"] == "embedded" and report["machine"]["cpu"]
    # from_dflash's confidence head is zero: it says 1/2 for every row
    assert report["drafters"]["dspark"]["mean_p"] == pytest.approx(0.5)
    assert report["drafters"]["dspark"]["rows"] == report["drafters"]["dspark (heuristic)"]["rows"]
    assert set(report["paired"]) == {"dspark - dspark (heuristic)"}
    assert (out / "calibration.json").stat().st_size > 0 and (out / "calibration.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="the same label"):
        calibration.main(["--drafter", "embedded", "--drafter", "embedded", "--out", str(tmp_path / "x")])
