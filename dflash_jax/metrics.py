"""The paper's metrics (docs/method.md section 6), one implementation for ``bench``, the experiments
and the notebooks.

A *response* is one generated answer (one prompt, or one turn of a multi-turn prompt) at
batch 1: :func:`response` takes it from a :class:`~dflash_jax.decoding.generation.GenerateResult`.

- tau (:func:`tau`): the mean acceptance length (accepted drafts + the bonus) of each
  response's iterations, then the mean over responses. :func:`pooled_tau` (every iteration of
  every response in one mean) weighs long responses more; it is reported as a second number,
  named as such.
- speedup (:func:`decode_speedup`): the mean over responses of autoregressive time per
  output token divided by the mean over responses of DFlash time per output token, decode
  phase only (the prefill and the first token, which it produces, excluded).
  :func:`end_to_end_speedup` is the same with the prefill included.
- the acceptance histogram over lengths 1..bs (:func:`acceptance_histogram`, every
  iteration pooled) and the per-position acceptance rate (:func:`position_acceptance`: the
  probability that draft position k = 1..bs-1 is accepted, i.e. that the acceptance length
  exceeds k).
- 95 % intervals (:func:`bootstrap_interval`): percentile bootstrap over responses with a
  fixed seed, resampled within each prompt set when several sets are averaged.
- the one rule for intervals and findings (:data:`MIN_DISTINCT_SAMPLES`,
  :func:`interval_supported`): an interval that rests on fewer than 8 distinct responses is
  not given (``(nan, nan)``), and a report draws no finding from it. Why 8: the percentile
  bootstrap cannot reach past the range of its sample, so for small n it undercovers. Drawn
  from a skewed distribution (gamma, shape 4: the shape of per-response tau), a nominal 95 %
  interval of the mean covers the true mean 51 % of the time at n = 2, 81 % at n = 4, 84 % at
  n = 6, 88 % at n = 8 and 90 % at n = 12 (1,000 trials each). 8 is where coverage is within
  10 points of nominal; it is also the bench's default prompts per set.

Everything here is plain numpy on host values.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_DISTINCT_SAMPLES = 8  # fewer distinct responses: no interval, no finding (module doc)


@dataclasses.dataclass(frozen=True)
class Response:
    """One generated answer at batch 1.

    new_tokens: tokens generated (the first comes from the prefill).
    acceptance_lengths: one entry per loop iteration, 1..block size (all 1 for AR).
    prefill_s / decode_s: wall time of the prefill and of the decode loop.
    """

    new_tokens: int
    acceptance_lengths: tuple[int, ...]
    prefill_s: float
    decode_s: float

    @property
    def tau(self) -> float:
        """Mean acceptance length of this response's iterations (nan without any)."""
        return float(np.mean(self.acceptance_lengths)) if self.acceptance_lengths else float("nan")

    @property
    def decode_tpot_s(self) -> float:
        """Decode-phase time per output token: the loop's time over the tokens it made (all
        but the first); nan when the loop made none."""
        return self.decode_s / (self.new_tokens - 1) if self.new_tokens > 1 else float("nan")

    @property
    def tpot_s(self) -> float:
        """End-to-end time per output token (prefill included)."""
        return (self.prefill_s + self.decode_s) / self.new_tokens if self.new_tokens else float("nan")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"acceptance_lengths": list(self.acceptance_lengths)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Response":
        return cls(int(d["new_tokens"]), tuple(int(a) for a in d["acceptance_lengths"]),
                   float(d["prefill_s"]), float(d["decode_s"]))


def response(result, row: int = 0) -> Response:
    """Row ``row`` of a ``GenerateResult`` as a :class:`Response`. The timings are the whole
    call's: meaningful per response only for a batch of one (the benchmark protocol)."""
    if len(result.sequences) != 1:
        raise ValueError(f"a response's timings need a batch of one prompt; this result has "
                         f"{len(result.sequences)} rows (generate one prompt per call)")
    return Response(len(result.sequences[row]), tuple(int(a) for a in result.acceptance_lengths[row]),
                    float(result.prefill_time_s), float(result.decode_time_s))


# ------------------------------------------------------------------------- acceptance
def _lengths(responses) -> list[np.ndarray]:
    """Per response, its acceptance lengths as an int array (Responses or plain lists)."""
    return [np.asarray(getattr(r, "acceptance_lengths", r), int) for r in responses]


def tau(responses) -> float:
    """docs/method.md section 6: per response the mean acceptance length, then the mean over responses
    (a response without iterations, whose first token was its last, has no tau and is left
    out); nan when no response has one. ``responses``: Responses or acceptance-length lists."""
    per = [a.mean() for a in _lengths(responses) if a.size]
    return float(np.mean(per)) if per else float("nan")


def pooled_tau(responses) -> float:
    """The mean acceptance length over every iteration of every response (not the paper's)."""
    flat = np.concatenate(_lengths(responses) + [np.zeros(0, int)])
    return float(flat.mean()) if flat.size else float("nan")


def acceptance_histogram(responses, block_size: int) -> np.ndarray:
    """int[block_size]: iterations with acceptance length 1..block_size (index 0 = length 1)."""
    flat = np.concatenate(_lengths(responses) + [np.zeros(0, int)])
    if flat.size and (flat.min() < 1 or flat.max() > block_size):
        raise ValueError(f"acceptance lengths must lie in 1..{block_size} (the block size), "
                         f"got {flat.min()}..{flat.max()}")
    return np.bincount(flat - 1, minlength=block_size).astype(int) if flat.size else np.zeros(block_size, int)


def position_acceptance(responses, block_size: int) -> np.ndarray:
    """float[block_size - 1]: for draft position k = 1..bs-1, the fraction of iterations (all
    responses pooled) whose draft token k was accepted, i.e. acceptance length > k. Zeros
    without iterations."""
    hist = acceptance_histogram(responses, block_size)
    total = hist.sum()
    if not total:
        return np.zeros(block_size - 1)
    at_least = hist[::-1].cumsum()[::-1]  # at_least[j] = iterations with length >= j + 1
    return at_least[1:] / total


# ------------------------------------------------------------------------- speed
def _mean_tpot(responses, attr: str) -> float:
    vals = [getattr(r, attr) for r in responses]
    vals = [v for v in vals if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def _paired(ar, dflash) -> tuple[list, list]:
    if len(ar) != len(dflash):
        raise ValueError(f"the speedup pairs responses: {len(ar)} autoregressive vs {len(dflash)} DFlash")
    return list(ar), list(dflash)


def decode_speedup(ar: Sequence[Response], dflash: Sequence[Response]) -> float:
    """docs/method.md section 6: mean over responses of AR decode time per output token / the same mean
    for DFlash (prefill excluded). Responses whose loop made no token in either method are
    left out of both means."""
    ar, dflash = _paired(ar, dflash)
    keep = [i for i in range(len(ar)) if np.isfinite(ar[i].decode_tpot_s) and np.isfinite(dflash[i].decode_tpot_s)]
    num, den = _mean_tpot([ar[i] for i in keep], "decode_tpot_s"), _mean_tpot([dflash[i] for i in keep], "decode_tpot_s")
    return num / den if keep and den > 0 else float("nan")


def end_to_end_speedup(ar: Sequence[Response], dflash: Sequence[Response]) -> float:
    """As :func:`decode_speedup` with the prefill included (time per output token of the call)."""
    ar, dflash = _paired(ar, dflash)
    den = _mean_tpot(dflash, "tpot_s")
    return _mean_tpot(ar, "tpot_s") / den if den > 0 else float("nan")


# ------------------------------------------------------------------------- intervals
def interval_supported(distinct_samples: int) -> bool:
    """Whether an interval resting on ``distinct_samples`` independent responses (prompts,
    seeds) may be reported and a finding drawn from it: at least :data:`MIN_DISTINCT_SAMPLES`
    (module doc: why 8). Every report (bench, experiments, paper figures) asks this."""
    return int(distinct_samples) >= MIN_DISTINCT_SAMPLES


def bootstrap_interval(statistic: Callable[..., float], groups: Sequence[Sequence[Sequence]],
                       samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic``.

    ``groups``: one entry per stratum (prompt set); each is a tuple of parallel sequences
    indexed by response (e.g. ``(ar_responses, dflash_responses)``). Every replicate
    resamples each stratum's responses with replacement, keeping the pairs together, and
    calls ``statistic(*resampled)`` where each argument is a list over strata of the
    resampled sequences. Deterministic given ``seed``. Returns (nan, nan) when fewer than
    2 finite replicates exist, or when the strata hold fewer than :data:`MIN_DISTINCT_SAMPLES`
    responses in all (:func:`interval_supported`).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    sizes = [len(g[0]) for g in groups]
    if not interval_supported(sum(sizes)):
        return float("nan"), float("nan")
    stats = []
    for _ in range(samples):
        picks = [rng.integers(0, n, n) if n else np.zeros(0, int) for n in sizes]
        args = [[[g[j][i] for i in p] for g, p in zip(groups, picks)] for j in range(len(groups[0]))]
        stats.append(statistic(*args))
    stats = np.asarray(stats, float)
    stats = stats[np.isfinite(stats)]
    if stats.size < 2:
        return float("nan"), float("nan")
    lo, hi = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


# ------------------------------------------------------------------------- summaries
def summarize(ar: Sequence[Response], dflash: Sequence[Response], block_size: int,
              seed: int = BOOTSTRAP_SEED, samples: int = BOOTSTRAP_SAMPLES) -> dict:
    """Every metric of one prompt set from paired responses (same prompts, same order)."""
    ar, dflash = _paired(ar, dflash)
    one = lambda f: (lambda a, d: f(a[0], d[0]))
    group = [(ar, dflash)]
    return {
        "responses": len(dflash),
        "tau": tau(dflash),
        "tau_ci": bootstrap_interval(one(lambda a, d: tau(d)), group, samples, seed),
        "tau_pooled": pooled_tau(dflash),
        "speedup": decode_speedup(ar, dflash),
        "speedup_ci": bootstrap_interval(one(decode_speedup), group, samples, seed),
        "end_to_end_speedup": end_to_end_speedup(ar, dflash),
        "ar_decode_ms_per_token": 1e3 * _mean_tpot(ar, "decode_tpot_s"),
        "dflash_decode_ms_per_token": 1e3 * _mean_tpot(dflash, "decode_tpot_s"),
        "histogram": acceptance_histogram(dflash, block_size).tolist(),
        "position_acceptance": position_acceptance(dflash, block_size).tolist(),
    }


def average(per_set: Mapping[str, tuple[Sequence[Response], Sequence[Response]]],
            seed: int = BOOTSTRAP_SEED, samples: int = BOOTSTRAP_SAMPLES) -> dict:
    """The average over prompt sets (the paper's "average" column: the mean of the per-set
    tau and of the per-set speedups), with intervals from a bootstrap stratified by set.
    ``per_set``: name -> (ar responses, dflash responses)."""
    groups = list(per_set.values())
    mean_tau = lambda a, d: float(np.mean([tau(x) for x in d]))
    mean_speedup = lambda a, d: float(np.mean([decode_speedup(x, y) for x, y in zip(a, d)]))
    ars, dfs = [g[0] for g in groups], [g[1] for g in groups]
    return {
        "tau": mean_tau(ars, dfs),
        "tau_ci": bootstrap_interval(mean_tau, groups, samples, seed),
        "speedup": mean_speedup(ars, dfs),
        "speedup_ci": bootstrap_interval(mean_speedup, groups, samples, seed),
        "end_to_end_speedup": float(np.mean([end_to_end_speedup(a, d) for a, d in groups])),
        "tau_pooled": float(np.mean([pooled_tau(d) for d in dfs])),
    }


def response_taus(bench: Mapping, name: str) -> dict[tuple, float]:
    """(sample id, turn) -> that response's tau, in prompt set ``name`` of a saved bench report
    (``bench.json``)."""
    return {(s["id"], s["turn"]): float(np.mean(s["dflash"]["acceptance_lengths"]))
            for s in bench["datasets"][name]["samples"]}


def mean_of_set_means(strata) -> float:
    """The mean over prompt sets of each set's mean (as bench averages tau); ``strata``: one
    sequence per set."""
    return float(np.mean([np.mean(x) for x in strata]))


def paired_tau_change(base: Mapping, other: Mapping) -> dict:
    """``other``'s tau minus ``base``'s, response by response over the same prompts, for two saved
    bench reports: ``{"sets": {name: (mean, interval)}, "average": (mean over the sets of each
    set's mean, interval)}``, percentile bootstrap intervals over the responses (the sets are the
    strata). ValueError, naming the set, when the runs did not answer the same prompts."""
    extra = sorted(set(other["datasets"]) - set(base["datasets"]))
    if extra:
        raise ValueError(f"the runs did not answer the same prompts of {', '.join(extra)}")
    strata, sets = [], {}
    for name in base["datasets"]:
        ref = response_taus(base, name)
        got = response_taus(other, name) if name in other["datasets"] else {}
        if sorted(got) != sorted(ref):
            raise ValueError(f"the runs did not answer the same prompts of {name}")
        diffs = [got[k] - ref[k] for k in sorted(ref)]
        strata.append((diffs,))
        sets[name] = (float(np.mean(diffs)), list(bootstrap_interval(mean_of_set_means, [(diffs,)])))
    average = (mean_of_set_means([d[0] for d in strata]), list(bootstrap_interval(mean_of_set_means, strata)))
    return {"sets": sets, "average": average}


def interval_text(value: float, ci: Sequence[float], digits: int = 2) -> str:
    """``"3.59 [3.41, 3.77]"``; the value alone when the interval is missing."""
    if ci is None or not all(np.isfinite(ci)):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
