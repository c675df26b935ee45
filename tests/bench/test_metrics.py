"""dflash_jax.metrics (docs/method.md section 6) against hand-computed examples.

Every expected number below is a literal worked out by hand in the comment beside it, not
computed by the code under test. Pure numpy, no model."""

import math

import numpy as np
import pytest

from dflash_jax import metrics
from dflash_jax.decoding.generation import GenerateResult
from dflash_jax.metrics import Response


def R(new_tokens, lengths, prefill_s, decode_s):
    return Response(new_tokens, tuple(lengths), prefill_s, decode_s)


# ------------------------------------------------------------------------- tau
# two responses of different lengths: a short, well-drafted one and a long, poorly drafted one
SHORT = [4, 2]          # its tau: (4 + 2) / 2 = 3.0
LONG = [1, 1, 1, 3]     # its tau: (1 + 1 + 1 + 3) / 4 = 1.5


def test_tau_is_per_response_then_over_responses_and_differs_from_pooled():
    # per response then over responses: (3.0 + 1.5) / 2 = 2.25
    assert metrics.tau([SHORT, LONG]) == pytest.approx(2.25)
    # pooled: (4 + 2 + 1 + 1 + 1 + 3) / 6 = 12 / 6 = 2.0
    assert metrics.pooled_tau([SHORT, LONG]) == pytest.approx(2.0)
    # negative control: on this example the two definitions really differ
    assert abs(metrics.tau([SHORT, LONG]) - metrics.pooled_tau([SHORT, LONG])) > 0.2
    # Responses work as well as plain lists; a response without iterations (its first token
    # was its last) has no tau and is left out of the mean, not counted as 0
    rs = [R(7, SHORT, 0.1, 0.2), R(7, LONG, 0.1, 0.4), R(1, [], 0.1, 0.0)]
    assert metrics.tau(rs) == pytest.approx(2.25)
    assert metrics.pooled_tau(rs) == pytest.approx(2.0)
    assert rs[0].tau == pytest.approx(3.0) and rs[1].tau == pytest.approx(1.5) and math.isnan(rs[2].tau)
    # nothing to average: nan, not 0
    assert math.isnan(metrics.tau([[], []])) and math.isnan(metrics.pooled_tau([]))


# ------------------------------------------------------------------------- speed
# AR and DFlash on the same three prompts; prefill 0.5 s everywhere (heavy, on purpose)
AR = [R(11, [1] * 10, 0.5, 1.0),   # decode TPOT 1.0 / (11 - 1) = 0.1
      R(5, [1] * 4, 0.5, 0.2),     # decode TPOT 0.2 / (5 - 1) = 0.05
      R(3, [1] * 2, 0.5, 9.0)]     # 4.5 s/token; its pair below made one token: left out
DF = [R(11, [4, 4, 2], 0.5, 0.5),  # 0.5 / 10 = 0.05
      R(5, [3, 1], 0.5, 0.05),     # 0.05 / 4 = 0.0125
      R(1, [], 0.5, 0.0)]          # one token (from the prefill): no decode TPOT


def test_response_time_per_token():
    assert AR[0].decode_tpot_s == pytest.approx(0.1)         # 1.0 s / 10 tokens (the first excluded)
    assert AR[0].tpot_s == pytest.approx(1.5 / 11)           # (0.5 + 1.0) s / 11 tokens
    assert math.isnan(DF[2].decode_tpot_s)                   # no decode token
    assert DF[2].tpot_s == pytest.approx(0.5)                # 0.5 s / 1 token
    assert Response.from_dict(DF[0].to_dict()) == DF[0]
    assert DF[0].to_dict() == {"new_tokens": 11, "acceptance_lengths": [4, 4, 2], "prefill_s": 0.5,
                               "decode_s": 0.5}


def test_decode_speedup_is_a_ratio_of_mean_decode_tpots():
    # pairs 1 and 2 only (pair 3's DFlash response has no decode token, so both are left out):
    # AR mean (0.1 + 0.05) / 2 = 0.075; DFlash mean (0.05 + 0.0125) / 2 = 0.03125;
    # 0.075 / 0.03125 = 2.4
    assert metrics.decode_speedup(AR, DF) == pytest.approx(2.4)
    assert metrics.decode_speedup(AR[:2], DF[:2]) == pytest.approx(2.4)
    # negative controls, each a plausible mistake that gives another number on this example:
    # - the mean of per-response ratios: (0.1 / 0.05 + 0.05 / 0.0125) / 2 = (2 + 4) / 2 = 3.0
    # - counting the first token as a decode token: AR (1.0/11 + 0.2/5) / 2 = 0.0654545...,
    #   DFlash (0.5/11 + 0.05/5) / 2 = 0.0277272..., ratio 2.3606...
    # - keeping pair 3's AR response: AR mean (0.1 + 0.05 + 4.5) / 3 = 1.55, ratio 49.6
    for wrong in (3.0, (1.0 / 11 + 0.2 / 5) / (0.5 / 11 + 0.05 / 5), 1.55 / 0.03125):
        assert metrics.decode_speedup(AR, DF) != pytest.approx(wrong, rel=1e-3)


def test_end_to_end_speedup_includes_the_prefill():
    # pairs 1 and 2: AR (1.5/11 + 0.7/5) / 2 = (7.5 + 7.7) / 110 = 15.2 / 110
    #                DFlash (1.0/11 + 0.55/5) / 2 = (5 + 6.05) / 110 = 11.05 / 110
    assert metrics.end_to_end_speedup(AR[:2], DF[:2]) == pytest.approx(15.2 / 11.05)  # 1.3756
    # negative control: with a 0.5 s prefill the end-to-end number is far from decode-only 2.4
    assert metrics.end_to_end_speedup(AR[:2], DF[:2]) < 1.5 < metrics.decode_speedup(AR[:2], DF[:2])
    # every response has an end-to-end TPOT (pair 3 is kept): AR adds 9.5 / 3, DFlash 0.5 / 1
    # AR mean (15.2/55 + 9.5/3) / 3, DFlash mean (11.05/55 + 0.5) / 3
    assert metrics.end_to_end_speedup(AR, DF) == pytest.approx((15.2 / 55 + 9.5 / 3) / (11.05 / 55 + 0.5))


def test_speedups_need_paired_responses():
    with pytest.raises(ValueError, match="pairs"):
        metrics.decode_speedup(AR, DF[:2])
    with pytest.raises(ValueError, match="pairs"):
        metrics.end_to_end_speedup(AR[:1], DF)
    # no pair with a decode token on both sides: nan, not a number from nothing
    assert math.isnan(metrics.decode_speedup(AR[2:], DF[2:]))


# ------------------------------------------------------------------------- acceptance
def test_histogram_and_position_acceptance():
    lengths = [[1, 3, 4], [2, 4, 4, 1]]
    # lengths 1, 2, 3, 4 occur 2, 1, 1, 3 times (7 iterations)
    assert metrics.acceptance_histogram(lengths, 4).tolist() == [2, 1, 1, 3]
    # P(length > k): k = 1: (1 + 1 + 3) / 7 = 5/7; k = 2: (1 + 3) / 7 = 4/7; k = 3: 3/7
    np.testing.assert_allclose(metrics.position_acceptance(lengths, 4), [5 / 7, 4 / 7, 3 / 7])
    # a larger block size only adds empty bins and never-accepted positions
    assert metrics.acceptance_histogram(lengths, 6).tolist() == [2, 1, 1, 3, 0, 0]
    np.testing.assert_allclose(metrics.position_acceptance(lengths, 6), [5 / 7, 4 / 7, 3 / 7, 0, 0])
    # Responses are accepted too; no iterations at all: zeros
    assert metrics.acceptance_histogram([R(4, [1, 3], 0, 0)], 4).tolist() == [1, 0, 1, 0]
    assert metrics.acceptance_histogram([[], []], 4).tolist() == [0, 0, 0, 0]
    assert metrics.position_acceptance([], 4).tolist() == [0, 0, 0]


@pytest.mark.parametrize("bad", [[[0, 2]], [[2, 5]], [[1], [-1]]])
def test_acceptance_lengths_outside_one_to_block_size_are_rejected(bad):
    with pytest.raises(ValueError, match=r"1\.\.4"):
        metrics.acceptance_histogram(bad, 4)
    with pytest.raises(ValueError, match=r"1\.\.4"):
        metrics.position_acceptance(bad, 4)


def _result(sequences, lengths, block_size=4):
    return GenerateResult(sequences=sequences, finish_reasons=["length"] * len(sequences),
                          prompt_lengths=[3] * len(sequences), acceptance_lengths=lengths,
                          block_size=block_size, prefill_time_s=0.25, decode_time_s=0.75,
                          num_steps=max(len(x) for x in lengths))


def test_generate_result_metrics_agree_with_hand_values():
    res = _result([list(range(7)), list(range(7))], [SHORT, LONG])
    assert res.tau == pytest.approx(2.25)  # per row (3.0, 1.5), then over rows; pooled would be 2.0
    # lengths 1, 2, 3, 4 occur 3, 1, 1, 1 times (6 iterations)
    assert res.acceptance_histogram.tolist() == [3, 1, 1, 1]
    # P(length > 1) = 3/6, P(length > 2) = 2/6, P(length > 3) = 1/6
    np.testing.assert_allclose(res.position_acceptance_rate, [0.5, 1 / 3, 1 / 6])
    s = res.summary()
    assert s["tau"] == pytest.approx(2.25) and s["histogram"] == [3, 1, 1, 1]


def test_response_takes_a_batch_of_one_and_refuses_two():
    one = metrics.response(_result([[5, 6, 7, 8, 9, 10, 11]], [SHORT]))
    assert one == Response(7, (4, 2), 0.25, 0.75)
    assert one.decode_tpot_s == pytest.approx(0.125)  # 0.75 s / (7 - 1) tokens
    with pytest.raises(ValueError, match="batch of one"):
        metrics.response(_result([[1, 2, 3], [4, 5, 6]], [[2], [2]]))
    with pytest.raises(ValueError, match="batch of one"):
        metrics.response(_result([[1, 2, 3], [4, 5, 6]], [[2], [2]]), row=1)


# ------------------------------------------------------------------------- bootstrap
def _taus(n, seed):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, 9, size=rng.integers(3, 12))) for _ in range(n)]


def test_bootstrap_is_deterministic_given_the_seed_and_contains_the_estimate():
    data = _taus(30, 1)
    stat = lambda d: metrics.tau(d[0])
    a = metrics.bootstrap_interval(stat, [(data,)], samples=500, seed=0)
    b = metrics.bootstrap_interval(stat, [(data,)], samples=500, seed=0)
    c = metrics.bootstrap_interval(stat, [(data,)], samples=500, seed=1)
    assert a == b
    assert a != c  # negative control: the seed matters
    point = metrics.tau(data)
    assert a[0] < point < a[1] and c[0] < point < c[1]
    assert 0 < a[1] - a[0] < 2  # a real interval, not a degenerate or absurd one


def test_bootstrap_percentiles():
    # a statistic that returns 0, 1, 2, ... on successive replicates: the interval is the
    # 2.5 % and 97.5 % quantiles of 0..1999 with numpy's linear interpolation,
    # 0.025 * 1999 = 49.975 and 0.975 * 1999 = 1949.025
    calls = iter(range(10_000))
    lo, hi = metrics.bootstrap_interval(lambda d: float(next(calls)), [(list(range(8)),)], samples=2000)
    assert (lo, hi) == pytest.approx((49.975, 1949.025))
    # 80 %: 0.1 * 1999 = 199.9, 0.9 * 1999 = 1799.1
    calls = iter(range(10_000))
    lo, hi = metrics.bootstrap_interval(lambda d: float(next(calls)), [(list(range(8)),)], samples=2000,
                                        confidence=0.8)
    assert (lo, hi) == pytest.approx((199.9, 1799.1))
    with pytest.raises(ValueError, match="confidence"):
        metrics.bootstrap_interval(lambda d: 0.0, [([1],)], confidence=1.0)


def test_bootstrap_keeps_pairs_together():
    # AR is exactly twice as slow per decode token as DFlash on every prompt, while the
    # prompts' speeds differ 100-fold: resampling pairs together, every replicate's speedup is
    # exactly 2 (interval [2, 2]); resampling AR and DFlash independently would spread it widely
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.01, 1.0, 20)
    ar = [R(11, [1] * 10, 0.1, 20 * s) for s in scale]   # decode TPOT 2 s
    df = [R(11, [4, 4, 2], 0.1, 10 * s) for s in scale]  # decode TPOT s
    assert metrics.decode_speedup(ar, df) == pytest.approx(2.0)
    lo, hi = metrics.bootstrap_interval(lambda a, d: metrics.decode_speedup(a[0], d[0]), [(ar, df)],
                                        samples=300)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    # negative control: one replicate drawn the wrong way, AR and DFlash indices independent
    pick = np.random.default_rng(1)
    i, j = pick.integers(0, 20, 20), pick.integers(0, 20, 20)
    assert metrics.decode_speedup([ar[k] for k in i], [df[k] for k in j]) != pytest.approx(2.0, rel=1e-2)


def test_bootstrap_is_stratified_by_prompt_set():
    # set X: three responses of tau 1; set Y: seven of tau 5. Resampled within each set, every
    # replicate keeps 3 responses of X and 7 of Y, so the mean of per-set taus is always
    # (1 + 5) / 2 = 3 and the pooled-over-sets tau always (3 * 1 + 7 * 5) / 10 = 3.8
    x, y = [[1, 1]] * 3, [[5]] * 7  # 10 responses in all: above MIN_DISTINCT_SAMPLES
    seen = []

    def stat(d):
        seen.append((len(d[0]), len(d[1]), {a for r in d[0] for a in r}, {a for r in d[1] for a in r}))
        return float(np.mean([metrics.tau(s) for s in d]))

    assert metrics.bootstrap_interval(stat, [(x,), (y,)], samples=200) == pytest.approx((3.0, 3.0))
    assert len(seen) == 200 and all(s == (3, 7, {1}, {5}) for s in seen)
    pooled = lambda d: metrics.tau(d[0] + d[1])
    assert metrics.bootstrap_interval(pooled, [(x,), (y,)], samples=200) == pytest.approx((3.8, 3.8))


def test_bootstrap_needs_two_finite_replicates():
    assert all(math.isnan(v) for v in metrics.bootstrap_interval(lambda d: float("nan"), [(list(range(8)),)],
                                                                 samples=50))
    # exactly one finite replicate: still (nan, nan); two: an interval
    for finite, expect_nan in ((1, True), (2, False)):
        calls = iter(range(100))
        stat = lambda d: 1.0 if next(calls) < finite else float("inf")
        lo, hi = metrics.bootstrap_interval(stat, [(list(range(8)),)], samples=50)
        assert math.isnan(lo) == math.isnan(hi) == expect_nan
        if not expect_nan:
            assert (lo, hi) == (1.0, 1.0)


# ------------------------------------------------------------------------- summaries
def test_summarize_one_set(monkeypatch):
    monkeypatch.setattr(metrics, "MIN_DISTINCT_SAMPLES", 1)  # exact intervals of 2 responses
    s = metrics.summarize(AR[:2], DF[:2], 4, samples=200)
    assert s["responses"] == 2
    assert s["tau"] == pytest.approx((10 / 3 + 2) / 2)    # per response (4+4+2)/3, (3+1)/2 -> 2.6667
    assert s["tau_pooled"] == pytest.approx(14 / 5)       # (4+4+2+3+1) / 5 = 2.8
    assert s["speedup"] == pytest.approx(2.4)
    assert s["end_to_end_speedup"] == pytest.approx(15.2 / 11.05)
    assert s["ar_decode_ms_per_token"] == pytest.approx(75.0)      # 1e3 * (0.1 + 0.05) / 2
    assert s["dflash_decode_ms_per_token"] == pytest.approx(31.25)  # 1e3 * (0.05 + 0.0125) / 2
    assert s["histogram"] == [1, 1, 1, 2]                           # lengths 1, 2, 3, 4: 1, 1, 1, 2
    np.testing.assert_allclose(s["position_acceptance"], [4 / 5, 3 / 5, 2 / 5])
    # two responses: the replicates are the all-first, mixed and all-second resamples, so the
    # interval runs from one response's value to the other's: tau 2 .. 10/3; speedup
    # 0.05/0.0125 = 4 (second pair alone) .. 0.1/0.05 = 2 (first pair alone)
    assert s["tau_ci"] == pytest.approx((2.0, 10 / 3))
    assert s["speedup_ci"] == pytest.approx((2.0, 4.0))
    monkeypatch.undo()  # under the rule, two responses give no interval
    s = metrics.summarize(AR[:2], DF[:2], 4, samples=200)
    assert np.isnan(s["tau_ci"]).all() and np.isnan(s["speedup_ci"]).all()


def test_average_over_sets_is_the_mean_of_per_set_numbers(monkeypatch):
    monkeypatch.setattr(metrics, "MIN_DISTINCT_SAMPLES", 1)  # exact intervals of 3 responses
    # set A: the pairs above (tau 8/3, speedup 2.4); set B: one pair, tau 2, decode TPOTs
    # 0.4 / (5 - 1) = 0.1 (AR) and 0.1 / (5 - 1) = 0.025 (DFlash): speedup 4
    b = ([R(5, [1] * 4, 0.5, 0.4)], [R(5, [2, 2], 0.5, 0.1)])
    av = metrics.average({"a": (AR[:2], DF[:2]), "b": b}, samples=200)
    # the mean of the set taus (8/3 + 2) / 2 = 7/3, not the mean over all three responses
    # (10/3 + 2 + 2) / 3 = 22/9
    assert av["tau"] == pytest.approx(7 / 3) and av["tau"] != pytest.approx(22 / 9)
    assert av["speedup"] == pytest.approx((2.4 + 4) / 2)  # 3.2
    assert av["tau_pooled"] == pytest.approx((2.8 + 2) / 2)
    # set B has a single response: every replicate's set-B numbers are fixed, so the interval
    # bounds are set A's bounds averaged with B's value
    assert av["tau_ci"] == pytest.approx(((2.0 + 2) / 2, (10 / 3 + 2) / 2))
    assert av["speedup_ci"] == pytest.approx(((2.0 + 4) / 2, (4.0 + 4) / 2))


def test_interval_text():
    assert metrics.interval_text(3.587, (3.41, 3.771)) == "3.59 [3.41, 3.77]"
    assert metrics.interval_text(3.587, (float("nan"), float("nan"))) == "3.59"
    assert metrics.interval_text(3.587, None, digits=1) == "3.6"


def test_no_interval_below_the_minimum_number_of_distinct_samples():
    # the one rule every report uses: fewer than MIN_DISTINCT_SAMPLES responses (summed over
    # the strata) give no interval; the statistic is never even evaluated
    n = metrics.MIN_DISTINCT_SAMPLES
    assert n == 8 and not metrics.interval_supported(n - 1) and metrics.interval_supported(n)
    calls = []
    stat = lambda d: calls.append(1) or metrics.tau(d[0])
    few = _taus(n - 1, 3)
    assert all(math.isnan(v) for v in metrics.bootstrap_interval(stat, [(few,)], samples=100))
    assert not calls
    lo, hi = metrics.bootstrap_interval(stat, [(_taus(n, 3),)], samples=100)
    assert lo < hi and len(calls) == 100
    # stratified: 4 + 4 responses are enough, 4 + 3 are not
    both = lambda d: float(np.mean([metrics.tau(s) for s in d]))
    assert np.isfinite(metrics.bootstrap_interval(both, [(_taus(4, 1),), (_taus(4, 2),)], samples=50)).all()
    assert np.isnan(metrics.bootstrap_interval(both, [(_taus(4, 1),), (_taus(3, 2),)], samples=50)).all()
    assert metrics.interval_text(3.0, (float("nan"), float("nan"))) == "3.00"
