"""Checks of a ``bench`` report against its own saved per-response records, recomputed here
with plain numpy (docs/method.md section 6), not with ``dflash_jax.metrics``."""

import numpy as np
import pytest


def _decode_tpot(d):
    """Decode-phase seconds per token: the loop made every token but the first."""
    return d["decode_s"] / (d["new_tokens"] - 1)


def check_set(r: dict, block_size: int) -> None:
    """One prompt set's record: its metrics follow from its ``samples``."""
    ar = [x["ar"] for x in r["samples"]]
    df = [x["dflash"] for x in r["samples"]]
    assert r["responses"] == len(df) == r["turns"]
    assert r["same_output"] == sum(bool(x["same_output"]) for x in r["samples"])
    for a, d in zip(ar, df):
        # AR: one token per loop iteration after the prefill's token
        assert a["acceptance_lengths"] == [1] * (a["new_tokens"] - 1)
        assert all(1 <= n <= block_size for n in d["acceptance_lengths"])
        assert min(a["prefill_s"], a["decode_s"], d["prefill_s"], d["decode_s"]) >= 0
    # tau: per response the mean acceptance length, then the mean over responses
    per = [np.mean(d["acceptance_lengths"]) for d in df if d["acceptance_lengths"]]
    assert r["tau"] == pytest.approx(np.mean(per))
    flat = np.array([n for d in df for n in d["acceptance_lengths"]])
    assert r["tau_pooled"] == pytest.approx(flat.mean())
    # speedup: mean AR decode time per token / mean DFlash decode time per token, over the
    # pairs whose loops both made a token (prefill and first token excluded)
    keep = [i for i in range(len(df)) if ar[i]["new_tokens"] > 1 and df[i]["new_tokens"] > 1]
    assert r["speedup"] == pytest.approx(np.mean([_decode_tpot(ar[i]) for i in keep])
                                         / np.mean([_decode_tpot(df[i]) for i in keep]))
    e2e = lambda rows: np.mean([(d["prefill_s"] + d["decode_s"]) / d["new_tokens"] for d in rows])
    assert r["end_to_end_speedup"] == pytest.approx(e2e(ar) / e2e(df))
    for name, rows in (("ar", ar), ("dflash", df)):
        ms = 1e3 * np.mean([_decode_tpot(d) for d in rows if d["new_tokens"] > 1])
        assert r[f"{name}_decode_ms_per_token"] == pytest.approx(ms)
    assert r["histogram"] == [int((flat == n).sum()) for n in range(1, block_size + 1)]
    np.testing.assert_allclose(r["position_acceptance"], [(flat > k).mean() for k in range(1, block_size)])
    # 95 % intervals: around the estimate with 8 or more responses (metrics.MIN_DISTINCT_SAMPLES),
    # none with fewer
    for key in ("tau", "speedup"):
        _check_interval(r[key], r[f"{key}_ci"], len(df))
    # one iteration in AR steps: DFlash decode seconds per iteration / AR decode seconds per
    # step, each pooled over the set's responses that ran the loop; the speedups it implies
    pooled = lambda rows: (sum(x["decode_s"] for x in rows if x["acceptance_lengths"])
                           / sum(len(x["acceptance_lengths"]) for x in rows))
    per_iteration, per_step = pooled(df), pooled(ar)
    assert r["iteration_cost_ar_steps"] == pytest.approx(per_iteration / per_step)
    assert r["speedup_from_cost"] == pytest.approx(flat.mean() * per_step / per_iteration)
    assert r["speedup_at_reference_cost"] == pytest.approx(flat.mean() / 1.305)


def _check_interval(value, ci, responses: int) -> None:
    lo, hi = ci
    if responses >= 8:
        assert lo - 1e-9 <= value <= hi + 1e-9, (value, lo, hi)
    else:
        assert np.isnan(lo) and np.isnan(hi), (responses, lo, hi)


def check_report(report: dict) -> None:
    """Every set of a report, and the average: the mean of the per-set numbers."""
    bs = report["settings"]["block_size"]
    sets = report["datasets"].values()
    for r in sets:
        check_set(r, bs)
    av = report["average"]
    for key in ("tau", "speedup", "tau_pooled", "end_to_end_speedup", "iteration_cost_ar_steps"):
        assert av[key] == pytest.approx(np.mean([r[key] for r in sets])), key
    assert av["speedup_from_cost"] == pytest.approx(av["tau_pooled"] / av["iteration_cost_ar_steps"])
    for key in ("tau", "speedup"):  # the average's interval rests on every set's responses
        _check_interval(av[key], av[f"{key}_ci"], sum(r["responses"] for r in sets))
