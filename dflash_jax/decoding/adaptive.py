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
a shorter proposal).

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


def check_cost_table(table: Mapping, lengths: tuple[int, ...]) -> tuple[float, ...]:
    """The costs of ``table`` ({verify length: seconds per iteration}) in the order of
    ``lengths``; a missing, extra, non-numeric or non-positive entry is a ``ValueError``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"cost_table must be a mapping {{verify length: seconds per iteration}}, "
                         f"got {type(table).__name__}")
    try:
        costs = {int(k): v for k, v in table.items()}
    except (TypeError, ValueError):
        raise ValueError(f"cost_table keys must be verify lengths (integers), got {list(table)}") from None
    missing = [L for L in lengths if L not in costs]
    extra = sorted(set(costs) - set(lengths))
    if missing or extra:
        raise ValueError(
            f"cost_table has costs for lengths {sorted(costs)} but the verify lengths are "
            f"{list(lengths)}" + (f": missing {missing}" if missing else "")
            + (f"; not verify lengths: {extra}" if extra else "")
            + ". Give one cost (seconds per iteration) per verify length, or cost_table=None to "
              "measure them on this device (cached)")
    out = []
    for L in lengths:
        c = costs[L]
        if isinstance(c, bool) or not isinstance(c, (int, float, np.floating, np.integer)) \
                or not math.isfinite(c) or c <= 0:
            raise ValueError(f"cost_table[{L}] = {c!r}: costs must be positive finite numbers "
                             "(seconds per iteration at that verify length)")
        out.append(float(c))
    return tuple(out)
