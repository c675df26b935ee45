"""Test-only proposers (``dflash_jax.proposers.Proposer``) whose proposals the tests control,
to study the engine: a new proposer is one module, and these are the second and third.

* :class:`OracleProposer` rolls the target itself forward from the committed state (a real
  computation through the same decode state, any target family): its greedy continuation, so
  whole blocks are accepted; ``corrupt`` replaces that fraction of tokens at random, which
  produces every acceptance length in between; ``q_temperature`` samples the tokens from the
  target's distribution at another temperature instead (a sampled proposal, q returned);
  ``confidences`` claims, per iteration, one of those per-token probabilities (what the
  adaptive verify length reads).
* :class:`TableProposer` proposes from the target's exact next-token distribution after the
  row's generated prefix (``exact_sampling.PrefixLogits``).
* :class:`ReferenceProposer` proposes a known continuation, wrong at chosen draft positions.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.verification.sampling import process_logits
from dflash_jax.proposers import Proposal, Proposer


def randomise_norms(params, key):
    """Every RMSNorm ``weight`` leaf drawn from 1 + 0.2 N(0, 1) (random_init sets them to 1),
    so that a proposal test sees the norms' weights used (tests of the DFlash and EAGLE-3
    proposers against their references)."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(key, len(leaves))
    out = [(1.0 + 0.2 * jax.random.normal(k, leaf.shape, jnp.float32)).astype(leaf.dtype)
           if "weight" in jax.tree_util.keystr(path) else leaf
           for (path, leaf), k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(tree, out)


def first_row_confidence(q_logp):
    """float32[B, bs-1]: ``log sum_v q_1(v)^2`` of the first draft row, for every row. An
    autoregressive sampled proposer's later rows' q depend on its earlier draws, which the
    adaptive verify length may not read (``Proposal.logp``); the first row's q depends only on
    the committed prefix."""
    first = jnp.log(jnp.sum(jnp.exp(2.0 * q_logp[:, 0]), axis=-1))
    return jnp.broadcast_to(first[:, None], q_logp.shape[:2])


@dataclasses.dataclass(frozen=True)
class OracleProposer(Proposer):
    corrupt: float = 0.0
    q_temperature: float | None = None
    confidences: tuple[float, ...] | None = None
    confidence_per_row: bool = False  # draw the claimed confidence per row, not per batch

    @property
    def sampled(self) -> bool:
        return self.q_temperature is not None

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        family = spec.family

        def step(carry, key):
            cache, tok = carry
            k_tok, k_bad, k_flip = jax.random.split(key, 3)
            logits, _, cache = family.forward(spec.target, tparams, tok[:, None],
                                              cache.lengths[:, None], cache)
            cache = cache.rollback(cache.lengths)  # keep the row (a recurrent state drops its snapshots)
            logits = logits[:, 0]
            if self.q_temperature is None:
                q, tok = None, jnp.argmax(logits, -1).astype(jnp.int32)
            else:
                q = process_logits(logits * spec.sampling.temperature / self.q_temperature, spec.sampling)
                tok = jax.random.categorical(k_tok, q).astype(jnp.int32)
            if self.corrupt:
                bad = jax.random.uniform(k_flip, tok.shape) < self.corrupt
                tok = jnp.where(bad, jax.random.randint(k_bad, tok.shape, 0, spec.target.vocab_size), tok)
            return (cache, tok), (tok, q)

        _, (drafts, qs) = jax.lax.scan(step, (committed.target_state, committed.bonus),
                                       jax.random.split(key, spec.block_size - 1))
        drafts, q_logp = drafts.T, (None if qs is None else jnp.swapaxes(qs, 0, 1))
        logp = None
        if want_logp and self.confidences is not None:
            levels = jnp.asarray(self.confidences)
            shape = drafts.shape[:1] if self.confidence_per_row else ()
            level = levels[jax.random.randint(jax.random.fold_in(key, 1), shape, 0, len(self.confidences))]
            logp = jnp.broadcast_to(jnp.log(level)[..., None], drafts.shape)
        elif want_logp and q_logp is not None:  # sampled: a confidence that reads no drawn token
            logp = first_row_confidence(q_logp)
        return Proposal(drafts, q_logp, logp), state


ORACLE = OracleProposer()
ORACLE_NOISY = OracleProposer(corrupt=0.25)


@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: it holds a table
class TableProposer(Proposer):
    """The target's exact next-token logits after the row's generated prefix (looked up in
    ``prefix_logits``; uniform past its depth), as an argmax (greedy proposal) or a sample at
    ``q_temperature`` with the sampling filters (sampled, q returned): q close to p, so whole
    blocks are accepted, but not equal to it."""

    prefix_logits: object
    q_temperature: float | None = None
    peek: bool = False  # sampled: the confidence reads the drawn tokens (a bug, for negative controls)
    peek_from_row: int = 0  # with peek: the rows from this one on peek, those before it do not

    @property
    def sampled(self) -> bool:
        return self.q_temperature is not None

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        V, depth = self.prefix_logits.vocab, self.prefix_logits.depth
        table = jnp.asarray(np.concatenate(self.prefix_logits.levels), jnp.float32)  # [sum V^L, V]
        offsets = jnp.asarray(np.cumsum([0] + [V ** L for L in range(depth)]), jnp.int32)
        out, n = committed.generated, committed.num_generated  # the prefix is out[:, :n]
        j = jnp.arange(out.shape[1])
        power = jnp.where(j < n[:, None], V ** jnp.clip(n[:, None] - 1 - j, 0, depth), 0)
        value = jnp.sum(jnp.maximum(out, 0) * power, axis=1)  # the prefix read in base V
        drafts, qs = [], []
        for i, k in enumerate(jax.random.split(key, spec.block_size - 1)):
            length = n + i
            inside = length < depth
            logits = jnp.where(inside[:, None], table[offsets[jnp.minimum(length, depth - 1)] + value], 0.0)
            if self.q_temperature is None:
                tok = jnp.argmax(logits, -1).astype(jnp.int32)
            else:
                q = process_logits(logits * spec.sampling.temperature / self.q_temperature, spec.sampling)
                qs.append(q)
                tok = jax.random.categorical(k, q).astype(jnp.int32)
            drafts.append(tok)
            value = jnp.where(length + 1 < depth, value * V + tok, 0)
        drafts = jnp.stack(drafts, 1)
        q_logp = jnp.stack(qs, 1) if qs else None
        logp = None
        if want_logp and qs:
            logp = first_row_confidence(q_logp)
            if self.peek:
                drawn = jnp.take_along_axis(q_logp, drafts[..., None], -1)[..., 0]
                peeks = (jnp.arange(drafts.shape[0]) >= self.peek_from_row)[:, None]
                logp = jnp.where(peeks, drawn, logp)
        return Proposal(drafts, q_logp, logp), state


@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: it holds arrays
class ReferenceProposer(Proposer):
    """Proposes ``rows[b, start+1 : start+bs]`` (a known continuation: prompt + reference
    output per row), wrong (token + 1) at draft index ``wrong_at(start)`` (bs - 1: nowhere)."""

    rows: object  # int32[B, width]
    wrong_at: object  # int32[B] start -> int32[B] draft index

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        bs, rows = spec.block_size, jnp.asarray(self.rows)
        start = committed.start
        idx = start[:, None] + 1 + jnp.arange(bs - 1)
        truth = jnp.take_along_axis(rows, jnp.minimum(idx, rows.shape[1] - 1), axis=1)
        bad = jnp.arange(bs - 1)[None] == self.wrong_at(start)[:, None]
        return Proposal(jnp.where(bad, (truth + 1) % spec.target.vocab_size, truth)), state


def every_length_wrong_at(bs: int):
    """The draft index a :class:`ReferenceProposer` gets wrong in the iteration starting at
    ``start``: ``(start // 3) % bs`` (bs - 1: none), so every acceptance length 1..bs occurs on
    prompts of a few dozen tokens."""
    return lambda start: (start // 3) % bs


def dflash_at_every_accepted_length(target, prompts, max_new: int, reference, bs: int, seed: int = 6):
    """Greedy DFlash on ``target`` with a :class:`ReferenceProposer` over ``reference`` (the AR
    outputs), wrong at :func:`every_length_wrong_at`: asserts the output equals ``reference``,
    every iteration (but a last one cut by the budget) accepts exactly up to the wrong draft, and
    every acceptance length 1..bs occurs. Returns the result."""
    import numpy as np

    import dflash_jax as dj

    wrong_at = every_length_wrong_at(bs)
    width = max(len(p) + len(r) for p, r in zip(prompts, reference)) + bs
    rows = np.zeros((len(prompts), width), np.int32)
    for b, (p, r) in enumerate(zip(prompts, reference)):
        rows[b, :len(p) + len(r)] = p + r
    drafter = dj.Drafter.random(target, num_layers=1, block_size=bs, seed=seed)
    r = dj.generate(target, prompts, max_new, drafter=drafter, proposer=ReferenceProposer(rows, wrong_at))
    assert r.sequences == reference
    seen = set()
    for prompt, lens in zip(prompts, r.acceptance_lengths):
        start = len(prompt)
        for a in lens[:-1]:  # the last iteration may be cut by the budget
            assert a == wrong_at(start) + 1, (start, a)
            seen.add(a)
            start += a
    assert seen == set(range(1, bs + 1)), f"acceptance lengths seen: {sorted(seen)}"
    return r
