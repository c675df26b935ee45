"""Exact sampling distributions of a small-vocabulary target, and a goodness-of-fit check with
power, shared by the sampling tests (test_speculative.py, test_generate.py).

The oracle: with a vocabulary of V tokens, every prefix of up to ``depth - 1`` generated tokens
can be enumerated (V^0 + ... + V^(depth-1) of them); one causal target forward over all
V^(depth-1) continuations of the prompt gives the next-token logits after each prefix, and the
exact probability of every sequence of ``depth`` tokens follows by the chain rule. The sampling filters (temperature,
top-k, top-p) are written again here in float64 numpy, independently of
``dflash_jax.verification.sampling``, so a wrong filter in the library cannot hide behind the same
wrong filter in the oracle.

The check: per generated position, Pearson's chi-squared of the observed token counts against
the exact marginal, and one more over the whole sequences (the joint, which also sees wrong
dependencies between positions); cells expected fewer than 5 times are pooled. The test fails
when any p-value is below ``alpha / (number of p-values)`` (Bonferroni), so a correct sampler
fails with probability at most ``alpha`` per check; seeds are fixed, so a result is reproducible.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.targets import target_forward


def filter_probs(logits, temperature: float, top_k: int | None = None, top_p: float | None = None):
    """float64[..., V] probabilities after temperature, top-k (ties with the k-th value kept)
    and top-p (the most likely tokens while the mass before a token is below ``top_p``), and
    the smallest distance of any top-k / top-p decision from its threshold (float32 and
    float64 decide alike only when it is not tiny)."""
    x = np.asarray(logits, np.float64) / temperature
    V = x.shape[-1]
    margin = np.inf
    if top_k is not None and top_k < V:
        desc = -np.sort(-x, axis=-1)
        margin = min(margin, float(np.min(desc[..., top_k - 1] - desc[..., top_k])))
        x = np.where(x >= desc[..., top_k - 1:top_k], x, -np.inf)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sp = np.take_along_axis(p, order, -1)
        before = np.cumsum(sp, -1) - sp
        live = sp > 0
        margin = min(margin, float(np.min(np.abs(before - top_p)[live])))
        keep = np.zeros(p.shape, bool)
        np.put_along_axis(keep, order, (before < top_p) & live, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p, margin


@dataclasses.dataclass
class PrefixLogits:
    """The target's float32 next-token logits after every prefix of ``0 .. depth-1`` generated
    tokens: ``levels[L]`` is [V**L, V], row = the prefix read as a base-V number."""

    vocab: int
    depth: int
    levels: list

    @classmethod
    def compute(cls, target, prompt, depth: int) -> "PrefixLogits":
        """One causal forward over all V**(depth-1) continuations: the logits at prompt
        position P-1+L of a row are the next-token logits after its first L tokens."""
        cfg = target.config
        V, P = cfg.vocab_size, len(prompt)
        rows = np.stack(np.unravel_index(np.arange(V ** (depth - 1)), (V,) * (depth - 1)), -1) \
            if depth > 1 else np.zeros((1, 0), int)
        ids = np.concatenate([np.tile(np.asarray(prompt), (len(rows), 1)), rows], 1)
        pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        forward = jax.jit(target_forward, static_argnums=0)
        logits, _, _ = forward(cfg, target.params, jnp.asarray(ids, jnp.int32), jnp.asarray(pos, jnp.int32))
        logits = np.asarray(logits, np.float64)
        levels = [logits[::V ** (depth - 1 - L), P - 1 + L] for L in range(depth)]
        return cls(V, depth, levels)

    def joint(self, temperature: float, top_k=None, top_p=None):
        """float64[V]*depth exact probability of each sequence of ``depth`` tokens, and the
        filters' smallest decision margin."""
        joint, margin = np.ones(1), np.inf
        for L in range(self.depth):
            p, m = filter_probs(self.levels[L], temperature, top_k, top_p)
            margin = min(margin, m)
            joint = (joint[:, None] * p).reshape(-1)
        return joint.reshape((self.vocab,) * self.depth), margin


def chi2_sf(stat: float, dof: int) -> float:
    """P(chi-squared with ``dof`` degrees of freedom >= stat)."""
    if dof <= 0:
        return 1.0
    return float(jax.scipy.special.gammaincc(dof / 2.0, stat / 2.0))


def pearson(counts, probs, min_expected: float = 5.0):
    """(statistic, dof, p-value) of observed ``counts`` against exact ``probs`` (same shape);
    cells expected fewer than ``min_expected`` times are pooled into one. A count where the
    probability is 0 gives p = 0."""
    counts, probs = np.ravel(counts).astype(np.float64), np.ravel(probs)
    if np.any(counts[probs <= 0] > 0):
        return np.inf, 0, 0.0
    e = counts.sum() * probs
    big = e >= min_expected
    obs, exp = list(counts[big]), list(e[big])
    if e[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(e[~big].sum())
    obs, exp = np.array(obs), np.array(exp)
    stat = float(np.sum((obs - exp) ** 2 / exp))
    return stat, len(obs) - 1, chi2_sf(stat, len(obs) - 1)


@dataclasses.dataclass
class FitReport:
    """Per-position and joint p-values of one sample against the exact distribution."""

    p_values: dict  # name ("pos 0", ..., "joint") -> (statistic, dof, p)
    alpha: float

    @property
    def min_p(self) -> float:
        return min(p for _, _, p in self.p_values.values())

    @property
    def threshold(self) -> float:
        return self.alpha / len(self.p_values)

    @property
    def rejected(self) -> bool:
        return self.min_p < self.threshold

    def __str__(self):
        rows = ", ".join(f"{k}: chi2 {s:.1f} dof {d} p {p:.2g}" for k, (s, d, p) in self.p_values.items())
        return f"min p {self.min_p:.3g} vs Bonferroni threshold {self.threshold:.2g} ({rows})"


def fit(sequences, joint, alpha: float = 1e-4) -> FitReport:
    """Tests the first ``depth`` tokens of every sequence against the exact ``joint``."""
    depth = joint.ndim
    seqs = np.array([s[:depth] for s in sequences])
    assert seqs.shape[1] == depth, "every row must have generated `depth` tokens"
    V = joint.shape[0]
    out = {}
    for t in range(depth):
        marginal = joint.sum(axis=tuple(a for a in range(depth) if a != t))
        out[f"pos {t}"] = pearson(np.bincount(seqs[:, t], minlength=V), marginal)
    flat = np.ravel_multi_index(seqs.T, joint.shape)
    out["joint"] = pearson(np.bincount(flat, minlength=joint.size), joint)
    return FitReport(out, alpha)
