"""Adaptive block size: per iteration, verify only as many block rows as pay off.

The paper verifies the whole block (16 rows) every iteration. When the drafter is unsure, most
of those rows are rejected, yet on a compute-bound device (a CPU) they still cost target
compute. ``generate(..., verify="adaptive")`` drafts the whole block as usual, then picks
the verify length L among a few static lengths (default 4 / 8 / 16) that maximises

    expected tokens emitted at L / measured cost of an iteration at L,

the expected tokens coming from the drafter's own confidence (:func:`choose_verify_length`)
and the cost from a per-device table of iteration times, one per length
(:class:`AdaptiveVerify`). Every length is a branch of one ``lax.switch`` inside the same
on-device loop, so nothing leaves the device. The choice is one per batch (per data shard on a
mesh). It depends only on the drafter's output, never on the target's verdict, so greedy output
still equals autoregressive output and the sampling rules stay lossless (a shorter draft is just
a shorter proposal), provided a sampled draft's confidence does not read the tokens it drew
(``proposers.base.Proposal.logp``: otherwise a row that drew an unlikely token would verify it
less often, which skews the output).

Per row (``verify=Adaptive(per_row=True)``): with ragged acceptance, one length for the whole batch
verifies long blocks for rows whose drafts are weak. A mask over a dense [B, L] verify would
save no compute, so the rows are grouped instead, inside static shapes: two lengths (short,
long; default 4 and the block size), and each iteration verifies the k rows that gain the most
from the long length at the long length and the other B - k at the short one, as two target
passes of [k, long] and [B - k, short] rows. k is one of a few static splits (default 0, B/4,
B/2, 3B/4, B: :func:`row_splits`), chosen by :func:`choose_row_split` from the same expected
tokens and a measured cost per split. A group's rows are gathered out of the decode state
before its pass and scattered back after (``nn.cache.take_rows`` / ``put_rows``): a copy of
those rows' K/V per iteration, the price of the smaller passes. Splits 0 and B are the
batch-wide verify at one length (no copy). The choice again depends only on the drafter's
output, so greedy output equals autoregressive output and sampling stays exact (each group
accepts with the usual rule and its own random key).

This module holds the policy (:class:`AdaptiveVerify`, a ``verification.policy.VerifyPolicy``:
its arithmetic and its step) and its options (the lengths, the splits, a cost table's checks);
``decoding.costs`` measures and caches the tables. A user may pass
``Adaptive(cost_table={L: seconds, ...})`` instead; it must give one positive cost per length.
"""


from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.nn.cache import put_rows, take_rows
from dflash_jax.verification import acceptance
from dflash_jax.verification.policy import Verified, VerifyPolicy, propose_chain, rollback, verify

DEFAULT_LENGTHS = (4, 8, 16)
ADAPTIVE = "adaptive"
PER_ROW_SHORT = 4  # per-row verification's default short length (the long one: the block size)
SPLIT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def block_size_arg(text: str) -> int | str:
    """argparse type of ``--block-size``: a positive integer or ``adaptive``."""
    if text.strip().lower() == ADAPTIVE:
        return ADAPTIVE
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is neither a positive integer nor {ADAPTIVE!r}")
    return value


def verify_lengths(block_size: int, lengths: Sequence[int] | None = None) -> tuple[int, ...]:
    """The checked static verify lengths for a drafter block of ``block_size``: ``lengths``
    (default: 4, 8, 16 below the block size, and the block size itself), ascending."""
    if lengths is None:
        return tuple(sorted({L for L in DEFAULT_LENGTHS if L < block_size} | {block_size}))
    out = []
    for L in lengths:
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or not 1 <= L <= block_size:
            raise ValueError(f"verify_lengths must be integers in 1..{block_size} (the drafter's "
                             f"block size), got {L!r} in {tuple(lengths)}")
        out.append(int(L))
    if not out:
        raise ValueError("verify_lengths is empty: give at least one length, e.g. (4, 8, 16)")
    if len(set(out)) != len(out):
        raise ValueError(f"verify_lengths has a length twice: {tuple(lengths)}")
    return tuple(sorted(out))


def per_row_lengths(block_size: int, lengths: Sequence[int] | None = None) -> tuple[int, int]:
    """Per-row verification's (short, long) lengths: ``lengths`` (checked as
    :func:`verify_lengths`; exactly two) or (4, the block size)."""
    if lengths is None:
        lengths = (min(PER_ROW_SHORT, block_size - 1), block_size)
    out = verify_lengths(block_size, lengths)
    if len(out) != 2:
        raise ValueError(f"per-row verification groups rows into a short and a long verify length: give "
                         f"verify_lengths=(short, long), e.g. (4, {block_size}), not {tuple(lengths)}")
    return out


def row_splits(batch: int, splits: Sequence[int] | None = None) -> tuple[int, ...]:
    """Per-row verification's static splits for ``batch`` rows (one device's rows on a mesh):
    how many rows may verify the long length: ``splits`` (checked: integers in 0..batch,
    distinct), or 0, B/4, B/2, 3B/4 and B rounded, deduplicated; ascending."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if splits is None:
        return tuple(sorted({int(round(f * batch)) for f in SPLIT_FRACTIONS}))
    out = []
    for k in splits:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= batch:
            raise ValueError(f"row_splits must be integers in 0..{batch} (rows per device that may verify "
                             f"the long length), got {k!r} in {tuple(splits)}")
        out.append(int(k))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"row_splits must be distinct and non-empty, got {tuple(splits)}")
    return tuple(sorted(out))


def check_cost_table(table: Mapping, lengths: tuple[int, ...], what: str = "verify length",
                     ) -> tuple[float, ...]:
    """The costs of ``table`` ({verify length: seconds per iteration}) in the order of
    ``lengths``; a missing, extra, non-numeric or non-positive entry is a ``ValueError``.
    Per-row verification's tables are keyed by split (``what="split"``: the number of rows
    verified at the long length)."""
    if not isinstance(table, Mapping):
        raise ValueError(f"cost_table must be a mapping {{{what}: seconds per iteration}}, "
                         f"got {type(table).__name__}")
    try:
        costs = {int(k): v for k, v in table.items()}
    except (TypeError, ValueError):
        raise ValueError(f"cost_table keys must be {what}s (integers), got {list(table)}") from None
    missing = [L for L in lengths if L not in costs]
    extra = sorted(set(costs) - set(lengths))
    if missing or extra:
        raise ValueError(
            f"cost_table has costs for {what}s {sorted(costs)} but the {what}s are "
            f"{list(lengths)}" + (f": missing {missing}" if missing else "")
            + (f"; not {what}s: {extra}" if extra else "")
            + f". Give one cost (seconds per iteration) per {what}, or cost_table=None to "
              "measure them on this device (cached)")
    out = []
    for L in lengths:
        c = costs[L]
        if isinstance(c, bool) or not isinstance(c, (int, float, np.floating, np.integer)) \
                or not math.isfinite(c) or c <= 0:
            raise ValueError(f"cost_table[{L}] = {c!r}: costs must be positive finite numbers "
                             f"(seconds per iteration at that {what})")
        out.append(float(c))
    return tuple(out)


# ---------------------------------------------------------------------------- the request
@dataclasses.dataclass(frozen=True)
class Adaptive:
    """``generate(..., verify=Adaptive(...))``: the adaptive verify length, as a user asks for it
    (``verify="adaptive"`` is ``Adaptive()``); generation turns it into an :class:`AdaptiveVerify`
    with its lengths checked and its costs measured (``decoding.costs``) or given.

    per_row: choose per row instead of per batch (rows grouped into a short and a long length).
    lengths: the static verify lengths (default 4, 8, 16 up to the block size; per row: two,
      default 4 and the block size).
    cost_table: {verify length: seconds per iteration} ({split: seconds} per row); default None:
      measured once on this device and cached.
    splits: per row: how many rows may verify the long length (default 0, B/4, B/2, 3B/4, B of
      one device's B rows).
    """

    per_row: bool = False
    lengths: tuple[int, ...] | None = None
    cost_table: Mapping[int, float] | None = None
    splits: tuple[int, ...] | None = None

    name: ClassVar[str] = "adaptive"

    def __post_init__(self):
        if not isinstance(self.per_row, bool):
            raise ValueError(f"Adaptive.per_row must be True or False, got {self.per_row!r}")
        if self.splits is not None and not self.per_row:
            raise ValueError("Adaptive(splits=...) belongs to per-row verification: pass per_row=True "
                             "with it")

    __hash__ = None  # a cost table is a dict: a request is not a jit key (its policy is)


# ---------------------------------------------------------------------------- the policy
@dataclasses.dataclass(frozen=True)
class AdaptiveVerify(VerifyPolicy):
    """Verify only the first L block rows per iteration (module docstring): L one of
    ``lengths`` (static, ascending, each <= the block size), chosen by :func:`choose_verify_length`
    from the proposer's confidence and ``costs``, the seconds of an iteration at each length
    (same order; measured by ``costs.cost_table`` or given); one compiled verify branch per
    length (``lax.switch``).

    Per row (``splits`` set): ``lengths`` is (short, long) and each
    iteration verifies the k rows whose drafts promise the most from the long length at the
    long length and the others at the short one, k one of ``splits`` (row counts, ascending,
    0 and the batch included) chosen by :func:`choose_row_split`; ``costs`` are then the
    seconds of an iteration at each split (same order); one compiled branch per split."""

    name: ClassVar[str] = "adaptive"
    lengths: tuple[int, ...]
    costs: tuple[float, ...]
    splits: tuple[int, ...] | None = None

    @property
    def per_row(self) -> bool:
        return self.splits is not None

    def check(self, spec) -> None:
        if spec.proposer is None:
            raise ValueError("the adaptive verify length is chosen from a proposer's confidence: "
                             "autoregressive decoding has no drafts")

    def step(self, spec, tparams, vparams, pparams, state, seen, max_new, k_draft,
             k_accept) -> Verified:
        """The proposer's chain with its confidence (``want_logp``), then :func:`_adaptive_verify`."""
        positions = state.tcache.lengths[:, None] + jnp.arange(spec.block_size, dtype=jnp.int32)
        proposal, pstate = propose_chain(spec, tparams, pparams, state, seen, k_draft, want_logp=True)
        block = jnp.concatenate([state.bonus[:, None], proposal.tokens], axis=1)
        accepted, bonus, taps, tcache, verified = _adaptive_verify(
            self, spec, vparams, state, block, positions, proposal, max_new, k_accept)
        return Verified(proposal.tokens, accepted, bonus, tcache, taps, positions, verified, pstate)


def expected_tokens(lengths, draft_logp, state, max_new) -> jax.Array:
    """float32[B, len(lengths)]: the tokens each row is expected to emit when its first L block
    rows are verified, for each L of ``lengths`` (:func:`choose_verify_length`), capped by its
    remaining budget; 0 for a row that is done."""
    lengths = jnp.asarray(lengths, jnp.int32)
    B = draft_logp.shape[0]
    reach = jnp.exp(jnp.cumsum(draft_logp.astype(jnp.float32), axis=1))  # P(drafts 1..k accepted)
    prefix = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), jnp.cumsum(reach, axis=1)], axis=1)
    expected = 1.0 + prefix[:, lengths - 1]  # [B, n_lengths] tokens emitted verifying L rows
    expected = jnp.minimum(expected, (max_new - state.n).astype(jnp.float32)[:, None])
    return jnp.where(state.done[:, None], 0.0, expected)


def choose_verify_length(policy: "AdaptiveVerify", draft_logp, state, max_new) -> jax.Array:
    """The index into ``policy.lengths`` of this iteration's verify length (one for the
    whole batch, or for a data shard's rows on a mesh).

    The drafter's probabilities stand in for acceptance: the chance that its first k draft
    tokens are all accepted is estimated as ``prod_{i<=k} q(d_i)``, so verifying L rows is
    expected to emit ``1 + sum_{k<L} prod_{i<=k} q(d_i)`` tokens, capped by the row's remaining
    budget (a row about to finish gains nothing from a long block). Summed over the live rows
    and divided by the measured iteration cost at L, it is the expected tokens per second;
    the largest wins (ties: the shorter length).

    Args:
      draft_logp: float32[B, bs-1] the proposer's log-probability of each draft token.
      state: the carry (``n``, ``done``); max_new: int32[B] budgets.
    """
    total = jnp.sum(expected_tokens(policy.lengths, draft_logp, state, max_new), axis=0)
    return jnp.argmax(total / jnp.asarray(policy.costs, jnp.float32)).astype(jnp.int32)


def choose_row_split(policy: "AdaptiveVerify", draft_logp, state, max_new):
    """Per-row verification (``policy.splits``): which rows verify the long length.

    Each row's gain from the long length over the short one is its expected tokens at the long
    length less those at the short (:func:`expected_tokens`; 0 for a done row). The rows are
    ordered by gain, largest first (ties: the lower row index); at split k the first k verify
    long, the rest short, and the batch expects ``sum(short) + the k largest gains`` tokens.
    Divided by the measured cost of an iteration at that split, the largest wins (ties: the
    smaller split).

    Returns (index into ``policy.splits`` int32[], order int32[B]: the rows by gain)."""
    e = expected_tokens(policy.lengths, draft_logp, state, max_new)  # [B, 2]
    gain = e[:, 1] - e[:, 0]
    order = jnp.argsort(-gain, stable=True).astype(jnp.int32)
    top = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(gain[order])])  # [B + 1]
    total = jnp.sum(e[:, 0]) + top[jnp.asarray(policy.splits, jnp.int32)]
    return jnp.argmax(total / jnp.asarray(policy.costs, jnp.float32)).astype(jnp.int32), order


def _verify_rows(spec, tparams, block, positions, tcache, draft, q_logp, done, key):
    """Verify + accept + rollback of a block of L rows (``block`` int32[R, L], ``positions``,
    ``draft`` int32[R, L-1], ``q_logp`` or None, ``done`` bool[R]) for R rows whose decode
    state is ``tcache``. Returns (accepted int32[R], bonus int32[R], taps [R, bs, k*D] padded
    to the block with zeros (rows past L are never committed, so never read) or None, the
    rolled-back state)."""
    L = block.shape[1]
    start = tcache.lengths
    logits, taps, tcache = verify(spec, tparams, block, positions, tcache)
    accepted, bonus = acceptance.accept(spec.acceptance, spec.sampling, draft, q_logp, logits, key,
                                        spec.ops)
    tcache = rollback(accepted, tcache, done, start)
    if taps is not None:
        taps = jnp.pad(taps, ((0, 0), (0, spec.block_size - L), (0, 0)))
    return accepted, bonus, taps, tcache


def _adaptive_verify(policy: AdaptiveVerify, spec, tparams, state, block, positions, proposal,
                     max_new, key):
    """Verify + accept + rollback with the verify length chosen per iteration: the first L
    block rows of every row, L chosen by :func:`choose_verify_length` (one ``lax.switch``
    branch per static length), or, per row (``policy.splits``), the rows split into a long
    and a short group by :func:`choose_row_split` (one branch per split; a group's rows are
    taken out of the decode state, verified, and put back: ``nn.cache.take_rows``). Returns
    (accepted, bonus, taps, the rolled-back state, the rows verified: int32[] or int32[B])."""
    if proposal.logp is None:
        raise ValueError("the adaptive verify length is chosen from the proposer's confidence: "
                         "its propose(..., want_logp=True) must return Proposal.logp")
    B = block.shape[0]
    operands = (block, positions, state.tcache, proposal.tokens, proposal.q_logp)

    def group(operands, L, rows=None, k=key):
        block, positions, tcache, draft, q_logp = operands
        done = state.done
        if rows is not None:
            take = lambda x: None if x is None else jnp.take(x, rows, axis=0)
            block, positions, draft, q_logp, done = map(take, (block, positions, draft, q_logp, done))
            tcache = take_rows(tcache, rows, B)
        return _verify_rows(spec, tparams, block[:, :L], positions[:, :L], tcache, draft[:, :L - 1],
                            None if q_logp is None else q_logp[:, :L - 1], done, k)

    if not policy.per_row:
        choice = choose_verify_length(policy, proposal.logp, state, max_new)
        accepted, bonus, taps, tcache = jax.lax.switch(
            choice, [functools.partial(group, L=L) for L in policy.lengths], operands)
        return accepted, bonus, taps, tcache, jnp.asarray(policy.lengths, jnp.int32)[choice]

    short, long = policy.lengths
    choice, order = choose_row_split(policy, proposal.logp, state, max_new)

    def split(k):
        def run(operands):
            if k in (0, B):  # one group: the batch-wide verify at one length
                L = long if k else short
                return (*group(operands, L), jnp.full((B,), L, jnp.int32))
            k_long, k_short = jax.random.split(key)
            rows = (order[:k], order[k:])
            parts = (group(operands, long, rows[0], k_long), group(operands, short, rows[1], k_short))
            merge = lambda i: jnp.zeros((B,) + parts[0][i].shape[1:], parts[0][i].dtype) \
                .at[rows[0]].set(parts[0][i]).at[rows[1]].set(parts[1][i])
            taps = None if parts[0][2] is None else merge(2)
            slots = lambda i, L: jnp.take(operands[1], rows[i], axis=0)[:, :L]  # the K/V slots a group wrote
            tcache = put_rows(put_rows(operands[2], rows[0], parts[0][3], B, slots(0, long)),
                              rows[1], parts[1][3], B, slots(1, short))
            verified = jnp.full((B,), short, jnp.int32).at[rows[0]].set(long)
            return merge(0), merge(1), taps, tcache, verified
        return run

    return jax.lax.switch(choice, [split(k) for k in policy.splits], operands)
