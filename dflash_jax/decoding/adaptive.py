"""Adaptive block size: per iteration, verify only as many block rows as pay off.

The paper verifies the whole block (16 rows) every iteration. When the drafter is unsure, most
of those rows are rejected, yet on a compute-bound device (a CPU) they still cost target
compute. ``generate(..., block_size="adaptive")`` drafts the whole block as usual, then picks
the verify length L among a few static lengths (default 4 / 8 / 16) that maximises

    expected tokens emitted at L / measured cost of an iteration at L,

the expected tokens coming from the drafter's own confidence (``engine.choose_verify_length``)
and the cost from a per-device table of iteration times, one per length
(``engine.AdaptiveVerify``). Every length is a branch of one ``lax.switch`` inside the same
on-device loop, so nothing leaves the device. The choice is one per batch (per data shard on a
mesh). It depends only on the drafter's output, never on the target's verdict, so greedy output
still equals autoregressive output and the sampling rules stay lossless (a shorter draft is just
a shorter proposal), provided a sampled draft's confidence does not read the tokens it drew
(``proposers.base.Proposal.logp``: otherwise a row that drew an unlikely token would verify it
less often, which skews the output).

Per row (``verify_per_row=True``): with ragged acceptance, one length for the whole batch
verifies long blocks for rows whose drafts are weak. A mask over a dense [B, L] verify would
save no compute, so the rows are grouped instead, inside static shapes: two lengths (short,
long; default 4 and the block size), and each iteration verifies the k rows that gain the most
from the long length at the long length and the other B - k at the short one, as two target
passes of [k, long] and [B - k, short] rows. k is one of a few static splits (default 0, B/4,
B/2, 3B/4, B: :func:`row_splits`), chosen by ``engine.choose_row_split`` from the same expected
tokens and a measured cost per split. A group's rows are gathered out of the decode state
before its pass and scattered back after (``nn.cache.take_rows`` / ``put_rows``): a copy of
those rows' K/V per iteration, the price of the smaller passes. Splits 0 and B are the
batch-wide verify at one length (no copy). The choice again depends only on the drafter's
output, so greedy output equals autoregressive output and sampling stays exact (each group
accepts with the usual rule and its own random key).

This module holds the options (the lengths, a cost table's checks); ``decoding.costs``
measures and caches the tables. A user may pass ``cost_table={L: seconds, ...}`` instead; it
must give one positive cost per length.
"""


from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

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
