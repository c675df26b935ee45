"""Launch parameters of the block-attention kernel, chosen per shape (pure Python, no jax).

The kernel (``kernels.block_attention``) runs a grid of ``B * Hkv * num_splits`` programs; each
reads ``tiles_per_split`` tiles of ``block_k`` cache rows (K and V) for one KV head, holds the
``rows = max(16, pow2(T * G))`` folded query rows, and writes a float32 partial result
(``rows x (Dh + 2)``: accumulator, running max, running sum) that a ``jnp`` step combines.

Splits (the main lever). A decode-time call reads each K/V byte once, so it is bound by memory
bandwidth, but only if every SM is busy: with ``B * Hkv`` = 8 programs per split, one split
leaves 124 of an H100's 132 SMs idle. :func:`modeled_cost` is the model the choice minimises:
each SM draws at most its share (``1 / num_sms``) of the HBM bandwidth, so a call takes as long
as its busiest SM, which runs ``waves = ceil(programs / num_sms)`` programs of
``bytes_per_program`` each; the partials the combine step reads back are spread over all SMs.
More splits fill the device but add partial bytes (per split, ``rows * (Dh + 2) * 4``), so the
best count is where a wave is full and no fuller. Counts within 5 % of the best are ties; ties go
to a grid with two programs per SM (two resident programs keep more loads in flight, which the
bandwidth-share model does not see), then to fewer splits.

Tiles, warps, stages. :func:`tile_params` gives ``block_k``, ``num_warps`` and ``num_stages``
per folded row count and dtype, from ``python -m dflash_jax.tools.gpu_compile --search``, which
compiles every candidate for sm_90a and sm_100a (Triton's compiler and its ptxas) and reports
which have no register spills and fit the shared memory (``results/gpu_compile/``).
``block_k`` falls back to a smaller tile that divides S, so the kernel never pads (copies)
the cache.

Nothing here imports jax or dflash_jax: the kernel package calls it at trace time.
"""

from __future__ import annotations

import dataclasses

DEFAULT_NUM_SMS = 132
"""SMs assumed when the device is not a GPU (lowering for CUDA on a CPU host): H100 SXM and
H200 both have 132."""

BLOCK_K_CHOICES = (128, 64, 32, 16)
COST_TOLERANCE = 0.05
"""Split counts whose modeled cost is this close to the lowest count as equal: the model leaves
out the launch and the combine step's own overheads, so smaller differences mean nothing."""
RESIDENT_PER_SM = 2
"""Among equal-cost split counts, grids with this many programs per SM are preferred: a second
resident program keeps more loads in flight, and the tuned tiles leave room for two
(``tile_params``)."""
FULL = 0.85
"""A grid of at least this fraction of the slots counts as filling them (128 programs on 132 or
148 SMs: 8 KV heads x 16 splits)."""


@dataclasses.dataclass(frozen=True)
class LaunchParams:
    """One launch of the kernel: cache tile rows, S-splits, warps per program, pipeline stages."""

    block_k: int
    num_splits: int
    num_warps: int
    num_stages: int


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def folded_rows(num_queries: int, group: int) -> int:
    """Rows of the query tile: the T queries of the G heads sharing a KV head, padded to a power
    of two >= 16 (the tensor-core minimum)."""
    return max(16, next_pow2(num_queries * group))


def tile_params(rows: int, head_dim: int, itemsize: int) -> tuple[int, int, int]:
    """(block_k, num_warps, num_stages) for a query tile of ``rows`` x ``head_dim``.

    From the compile search (Qwen3-8B / Llama-3.1-8B shapes, head dim 128, sm_90a and sm_100a;
    ``results/gpu_compile/``): up to 64 rows in 16-bit types, 64-row cache tiles with 4 warps
    and 2 stages use 180-245 registers, 38-80 KiB of shared memory, no spills, and leave room
    for 2 resident programs per SM on both architectures (128-row tiles with 4 warps spill on
    sm_100a). Larger tiles (128 rows, reachable only without the kernel's query chunking)
    spill with 4 warps and not with 8 warps and 32-row cache tiles. float32 (the exact mode the
    tests use) needs twice the registers: 32-row cache tiles. Which of the spill-free
    candidates is fastest is a timing question the compile search cannot answer; these keep the
    launch the kernel was validated with wherever it compiles cleanly."""
    del head_dim  # the search covered head dim 128; smaller heads only lower the pressure
    if itemsize >= 4:
        return 32, 4, 2
    if rows <= 64:
        return 64, 4, 2
    return 32, 8, 2


def fitting_block_k(seq: int, preferred: int) -> int:
    """``preferred`` if it divides ``seq``, else the largest smaller choice that does (the kernel
    then needs no padding); ``preferred`` when none does."""
    for b in BLOCK_K_CHOICES:
        if b <= preferred and seq % b == 0:
            return b
    return preferred


def split_layout(seq: int, block_k: int, num_splits: int) -> tuple[int, int]:
    """(num_splits, tiles_per_split) as the kernel runs them: at least 1 and at most one split
    per tile, and no empty trailing split."""
    tiles = -(-seq // block_k)
    num_splits = max(1, min(tiles, num_splits))
    per = -(-tiles // num_splits)
    return -(-tiles // per), per


def program_bytes(*, rows: int, head_dim: int, itemsize: int, block_k: int, tiles_per_split: int,
                  block_rows: int = 0) -> dict:
    """Bytes one program moves at most: ``read`` = its K/V tiles + its query tile (+ the block's
    own K/V rows in drafter mode, ``block_rows`` > 0), ``written`` = its float32 partial."""
    kv = 2 * tiles_per_split * block_k * head_dim * itemsize
    read = kv + rows * head_dim * itemsize + 2 * block_rows * head_dim * itemsize
    return {"kv": kv, "read": read, "written": rows * (head_dim + 2) * 4}


def modeled_cost(*, batch: int, kv_heads: int, seq: int, rows: int, head_dim: int, itemsize: int,
                 block_k: int, num_splits: int, num_sms: int, block_rows: int = 0) -> float:
    """Modeled time of one call in bytes per SM share of bandwidth (divide by
    ``hbm_bandwidth / num_sms`` for seconds): the busiest SM's programs, plus the combine
    step's read of every partial spread over all SMs (module docstring)."""
    splits, per = split_layout(seq, block_k, num_splits)
    programs = batch * kv_heads * splits
    moved = program_bytes(rows=rows, head_dim=head_dim, itemsize=itemsize, block_k=block_k,
                          tiles_per_split=per, block_rows=block_rows)
    waves = -(-programs // num_sms)
    return waves * (moved["read"] + moved["written"]) + programs * moved["written"] / num_sms


def choose_num_splits(*, batch: int, kv_heads: int, seq: int, rows: int, head_dim: int,
                      itemsize: int, block_k: int, num_sms: int, block_rows: int = 0) -> int:
    """The split count with the lowest :func:`modeled_cost`; counts within
    :data:`COST_TOLERANCE` of it are equal, and among those the fewest splits that give
    :data:`RESIDENT_PER_SM` programs per SM (at least :data:`FULL` of them) win, else the
    fewest splits."""
    tiles = -(-seq // block_k)
    costs = {}
    for s in range(1, tiles + 1):
        s_real, _ = split_layout(seq, block_k, s)
        if s_real == s:  # other counts give the same layout as a smaller one
            costs[s] = modeled_cost(batch=batch, kv_heads=kv_heads, seq=seq, rows=rows,
                                    head_dim=head_dim, itemsize=itemsize, block_k=block_k,
                                    num_splits=s, num_sms=num_sms, block_rows=block_rows)
    best = min(costs.values())
    near = [s for s, c in costs.items() if c <= best * (1 + COST_TOLERANCE)]
    busy = lambda s: batch * kv_heads * s >= FULL * RESIDENT_PER_SM * num_sms
    return min(near, key=lambda s: (not busy(s), s))


def choose_launch(*, batch: int, seq: int, kv_heads: int, num_queries: int, group: int,
                  head_dim: int, itemsize: int, block_rows: int = 0,
                  num_sms: int | None = None, block_k: int | None = None,
                  num_splits: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None) -> LaunchParams:
    """Launch parameters for one call: q [batch, num_queries, kv_heads * group, head_dim] against
    a cache of ``seq`` slots (and, drafter mode, ``block_rows`` > 0 rows of the block's own K/V,
    which every program loads padded to a power of two >= 16). Arguments given
    (not None) are kept; the others are chosen as the module docstring says, for a device with
    ``num_sms`` SMs (default :data:`DEFAULT_NUM_SMS`)."""
    for name, value in (("batch", batch), ("seq", seq), ("kv_heads", kv_heads),
                        ("num_queries", num_queries), ("group", group), ("head_dim", head_dim),
                        ("itemsize", itemsize)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rows = folded_rows(num_queries, group)
    bk, warps, stages = tile_params(rows, head_dim, itemsize)
    block_k = fitting_block_k(seq, bk) if block_k is None else block_k
    if num_splits is None:
        num_splits = choose_num_splits(
            batch=batch, kv_heads=kv_heads, seq=seq, rows=rows, head_dim=head_dim,
            itemsize=itemsize, block_k=block_k, num_sms=num_sms or DEFAULT_NUM_SMS,
            block_rows=max(16, next_pow2(block_rows)) if block_rows else 0)
    return LaunchParams(block_k=block_k, num_splits=num_splits,
                        num_warps=warps if num_warps is None else num_warps,
                        num_stages=stages if num_stages is None else num_stages)
