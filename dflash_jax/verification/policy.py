"""Verify policies: what one iteration of the engine's loop drafts and verifies, behind one
interface (``docs/methods.md``, "Verify policies").

A policy's :meth:`VerifyPolicy.step` runs the first half of an iteration: ask the proposer
for drafts (a chain or a tree), run the target over them (:func:`verify`, ``verify_tree``),
apply the acceptance rule (``verification.acceptance``) and roll the target's decode state
back to what each row keeps (:func:`rollback`). It returns a :class:`Verified`: the accepted
path as a chain (its drafts, how many were accepted, the bonus token, the taps of its rows),
which the engine commits and shows the proposer, the same way for every policy. The engine
holds the policy in its static spec and knows none of them concretely.

The policies:
  * :class:`FixedVerify` (here): the whole block every iteration, as the paper;
  * ``verification.adaptive.AdaptiveVerify``: the first L rows, L per iteration (per batch or
    per row) from the proposer's confidence and measured costs;
  * ``verification.tree.TreeVerify``: a tree of N drafts from the proposer's top-k tokens.

A policy names itself (:attr:`VerifyPolicy.name`: ``"fixed"``, ``"adaptive"``, ``"tree"``);
a drafting method declares the names it does not support (``methods.base.DraftingMethod.
unsupported``), and :meth:`VerifyPolicy.check` refuses what the target or the proposer cannot
do, both before anything compiles.

This package sits below the proposers and the engine: it reads the engine's static spec and
loop state by their fields (``decoding.engine.EngineSpec``, ``DecodeState``) and imports
neither.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from dflash_jax.verification import acceptance


class Verified(NamedTuple):
    """What a policy's step leaves for the engine to commit, for B rows.

    draft: int32[B, bs-1] the drafted tokens along the kept path (a chain's block rows 1..; a
      tree's accepted path, then anything: only the first ``accepted`` are emitted).
    accepted: int32[B] accepted draft tokens; bonus: int32[B] the target's token after them.
    tcache: the target's decode state rolled back to what each row keeps.
    taps: [B, bs, k*D] the target's taps at the path's rows (anchor first), None without a
      drafter; positions: int32[B, bs] their positions (``observe`` gets both).
    verified: the rows the target verified (int, int32[] or int32[B]; recorded per iteration).
    proposer: the proposer's state after proposing (None without a proposer).
    """

    draft: jax.Array
    accepted: jax.Array
    bonus: jax.Array
    tcache: Any
    taps: jax.Array | None
    positions: jax.Array
    verified: Any
    proposer: Any


class VerifyPolicy:
    """The interface of a verify policy: a frozen, hashable dataclass (part of the engine's
    static spec, so a jit cache key)."""

    name: ClassVar[str]
    """The policy's name in refusals and in ``DraftingMethod.unsupported``."""

    def check(self, spec) -> None:
        """Raises ValueError, with the reason, when ``spec`` (the engine's static spec: the
        target, the proposer, the acceptance rule) cannot run this policy. Called when the
        spec is built, before anything compiles."""

    def slots(self, block_size: int) -> int:
        """Cache slots one verify writes past the committed ones (the cache is sized for
        them)."""
        return block_size

    def step(self, spec, tparams, vparams, pparams, state, seen, max_new, k_draft,
             k_accept) -> Verified:
        """Propose, verify, accept and roll back for every row of ``state`` (the loop carry).

        tparams: the target's parameters as given (the proposer gets these); vparams: the same
        in the layout verify runs (the family's ``loop_params``); pparams: the proposer's
        parameters; seen: what the proposer is told of the sequence (``proposers.base.
        Committed``); max_new: int32[B] budgets; k_draft / k_accept: PRNG keys."""
        raise NotImplementedError


class _NoProposal(NamedTuple):
    """Autoregressive decoding's proposal: no drafts."""

    tokens: jax.Array
    q_logp: None = None
    logp: None = None


def propose_chain(spec, tparams, pparams, state, seen, key, want_logp: bool = False):
    """The proposer's chain of ``block_size - 1`` drafts after the bonus (``proposers.base.
    Proposal``), or none for autoregressive decoding. Returns (proposal, proposer state)."""
    if spec.proposer is None:
        return _NoProposal(jnp.zeros((state.bonus.shape[0], 0), jnp.int32)), state.proposer
    return spec.proposer.propose(spec, tparams, pparams, state.proposer, seen, key, want_logp=want_logp)


def verify(spec, tparams, block: jax.Array, positions: jax.Array, tcache, tree=None):
    """The target over the block ``[bonus, draft...]`` (tokens int32[B, T]) at positions
    int32[B, T] = ``tcache.lengths + arange(T)``, one causal pass through its decode state
    (``tree``: a ``nn.tree_attention.TreeAttention`` instead of the causal mask; the tree
    policy's ``verify_tree``).

    Returns (logits float32[B, T, V]: row i predicts the token after ``block[:, i]``;
    taps [B, T, k*D] of the block rows, None without a drafter; the state holding the whole
    block, ``lengths = positions[:, -1] + 1``, rolled back by :func:`rollback`).
    """
    return spec.family.forward(spec.target, tparams, block, positions, tcache,
                               tap_layer_ids=spec.tap_layer_ids, attention_impl=spec.attention_impl,
                               **({} if tree is None else {"tree": tree}), **spec.target_axes)


def rollback(accepted: jax.Array, tcache, done: jax.Array, start: jax.Array):
    """The target's decode state after verify (``tcache``, holding the whole block) rolled back
    to what each row keeps: ``start + accepted + 1`` positions (the anchor and the accepted
    drafts; the bonus, not yet seen by the target, is the next block's anchor), or ``start``
    for a row that was already done (``done`` bool[R], ``start`` int32[R]: the rows' committed
    lengths before verify). A KV cache sets its length; a recurrent state restores the state
    after the last kept row (``nn.cache``)."""
    return tcache.rollback(jnp.where(done, start, start + accepted + 1))


@dataclasses.dataclass(frozen=True)
class FixedVerify(VerifyPolicy):
    """Verify the whole block every iteration (the paper)."""

    name: ClassVar[str] = "fixed"

    def step(self, spec, tparams, vparams, pparams, state, seen, max_new, k_draft,
             k_accept) -> Verified:
        bs = spec.block_size
        start = state.tcache.lengths
        positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
        proposal, pstate = propose_chain(spec, tparams, pparams, state, seen, k_draft)
        draft = proposal.tokens
        block = jnp.concatenate([state.bonus[:, None], draft], axis=1)
        logits, taps, tcache = verify(spec, vparams, block, positions, state.tcache)
        accepted, bonus = acceptance.accept(spec.acceptance, spec.sampling, draft, proposal.q_logp,
                                            logits, k_accept, spec.ops)
        tcache = rollback(accepted, tcache, state.done, start)
        return Verified(draft, accepted, bonus, tcache, taps, positions, bs, pstate)
