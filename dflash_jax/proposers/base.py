"""The proposer interface: what the decoding engine asks of a drafter (``docs/proposers.md``).

A proposer proposes the ``bs - 1`` tokens after each iteration's anchor (the last committed
token); the target verifies them. It is a frozen, hashable dataclass (part of the engine's
static spec) whose methods are pure functions of their arguments, called inside the jitted
loop:

  init(spec, params, taps, positions, lengths, cache_len, dtype, *, tokens, tparams) -> state
      from the prompt: the target's taps [B, P, k*D] at positions int32[B, P] (right padded;
      ``lengths`` int32[B] real tokens per row), the prompt's tokens int32[B, P] and the
      target's parameters (its embedding, for a proposer that embeds tokens);
  propose(spec, tparams, params, state, committed, key) -> (Proposal, state)
      a proposal for the block after ``committed.bonus`` (at position ``committed.start``);
  observe(spec, params, state, taps, positions) -> state
      the verified block's taps [B, T, k*D] at positions int32[B, T]; of those rows the
      committed ones are the positions below the next ``committed.start`` (the rest are
      rejected rows, which a proposer must not read);
  propose_tree(spec, tparams, params, state, committed, key, policy) -> (Tree, state)
      optional: a tree of drafts (``verification.tree``) for tree verification; ``observe`` then
      gets the accepted root path's taps in order.

The state is the proposer's own pytree; the engine carries it without looking inside. Speculative
decoding is lossless whatever a proposer proposes, so a proposer's bugs show only in the
acceptance length: every proposer is tested for WHAT it proposes against an independent
reference (``tests/proposers/test_drafter_proposals.py`` for DFlash).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class Committed(NamedTuple):
    """What the engine tells a proposer about the sequence so far."""

    bonus: jax.Array  # int32[B] the last committed token: the block's anchor (row 0)
    start: jax.Array  # int32[B] its position (= committed tokens before it)
    target_state: Any  # the target's decode state (read-only; holds positions < start)
    generated: jax.Array  # int32[B, out_len] the tokens generated so far (the bonus last), -1 after
    num_generated: jax.Array  # int32[B] how many


class Proposal(NamedTuple):
    """One block's proposal.

    tokens: int32[B, bs-1] the proposed tokens of block rows 1..bs-1.
    q_logp: float32[B, bs-1, V] the distribution each token was sampled from (a sampled
      proposal, verified by rejection sampling); None for a greedy proposal.
    logp: float32[B, bs-1] the proposer's confidence in each block row, as a log-probability
      that a draft there is accepted (what the adaptive verify length reads), or None when not
      asked for (``want_logp``). A greedy proposal gives its tokens' log-probabilities. A
      sampled one must not read the sampled tokens: the verify length would then depend on the
      draft it truncates, and rejection sampling is exact only for a draft drawn from q whatever
      is verified of it (a row that drew an unlikely token would verify it less often, which
      skews the output; ``docs/api.md``, the adaptive options). DFlash gives ``log sum_v q(v)^2``, the chance
      that two draws from q agree, which its one parallel pass computes before any token is drawn.
    """

    tokens: jax.Array
    q_logp: jax.Array | None = None
    logp: jax.Array | None = None


class Proposer:
    """Base class of proposers (subclasses are frozen dataclasses)."""

    @property
    def sampled(self) -> bool:
        """Whether :meth:`propose` samples its tokens (and returns ``q_logp``): the engine then
        verifies by rejection sampling; otherwise by matching target samples."""
        return False

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose outputs the proposer reads (its taps); () for none."""
        return ()

    def init(self, spec, params, taps, positions, lengths, cache_len: int, dtype, *, tokens=None,
             tparams=None) -> Any:
        return None

    def propose(self, spec, tparams, params, state, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not define propose()")

    def propose_tree(self, spec, tparams, params, state, committed: Committed, key,
                     policy) -> tuple[Any, Any]:
        """A tree of ``policy.nodes`` nodes (``verification.tree.TreeVerify``) rooted at
        ``committed.bonus``: ``(verification.tree.Tree, state)``, for tree verification. Its
        :meth:`observe` then gets the taps of the accepted root path, in order."""
        raise NotImplementedError(f"{type(self).__name__} does not draft trees (no propose_tree()): "
                                  "verify its drafts as a chain")

    def observe(self, spec, params, state, taps, positions) -> Any:
        return state

    def state_axes(self) -> Any:
        """The state's pytree with a tuple of logical axis names (``parallel.rules``) at every
        leaf, for running on a mesh."""
        raise NotImplementedError(f"{type(self).__name__} does not run on a mesh (no state_axes())")

    def local(self, model: int) -> "Proposer":
        """The proposer one of ``model`` tensor-parallel shards runs (shard configs)."""
        if model == 1:
            return self
        raise NotImplementedError(f"{type(self).__name__} does not run tensor-parallel (no local())")
