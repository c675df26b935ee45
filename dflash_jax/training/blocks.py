"""Anchors, block inputs, labels and loss weights (docs/method.md section 5).

For a sequence ``x`` with response mask ``m``: an anchor ``a`` is valid when ``m[a]`` and
``m[a+1]``. Block j is ``[x[a_j], MASK * (bs-1)]`` at positions ``a_j .. a_j+bs-1``; its row k
(k >= 1) is labelled ``x[a_j + k]`` when that position exists and is a response token; row 0
has no loss. Row k weighs ``exp(-(k-1)/gamma)`` (gamma > 0; the paper's by block size unless
given), or 1 with uniform weights (an ablation: every predicted row counts the same).

Anchors are ``random`` (the paper: up to N valid anchors drawn per sequence, new every epoch)
or ``fixed`` (an ablation, the paper's "fixed block boundaries": every response segment cut
into consecutive blocks from its first token, ``s, s+bs, s+2bs, ...``; at most N of them per
sequence, a random subset new every epoch when there are more).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

GAMMA_BY_BLOCK_SIZE = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """The paper's decay: 7 for bs 16, 5 for bs 10, 4 for bs 8 (else bs / 2, an interpolation)."""
    return GAMMA_BY_BLOCK_SIZE.get(block_size, block_size / 2)


def check_gamma(gamma) -> None:
    """Refuses a decay that is not a number > 0 (0 would divide by zero; a negative one would
    weigh the far rows most)."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.integer, np.floating)) or not gamma > 0:
        raise ValueError(f"gamma must be a number > 0, got {gamma!r} (the loss decay exp(-(k-1)/gamma)); "
                         "leave it unset for the paper's value for the block size (7 for 16, 5 for 10, "
                         "4 for 8), or ask for uniform weights (--uniform-weights / uniform_weights=True)")


def loss_weights(block_size: int, gamma: float) -> np.ndarray:
    """float32[bs]: 0 for the anchor row, ``exp(-(k-1)/gamma)`` for row k >= 1."""
    check_gamma(gamma)
    k = np.arange(block_size, dtype=np.float64)
    return np.where(k >= 1, np.exp(-(k - 1) / gamma), 0.0).astype(np.float32)


def uniform_loss_weights(block_size: int) -> np.ndarray:
    """float32[bs]: 0 for the anchor row, 1 for every row k >= 1."""
    return (np.arange(block_size) >= 1).astype(np.float32)


def block_loss_weights(block_size: int, gamma: float | None = None, uniform: bool = False) -> np.ndarray:
    """The training loss weights: uniform, or decayed with ``gamma`` (None: :func:`default_gamma`)."""
    if uniform:
        if gamma is not None:
            raise ValueError(f"uniform weights and gamma={gamma} exclude each other: give one of them")
        return uniform_loss_weights(block_size)
    return loss_weights(block_size, default_gamma(block_size) if gamma is None else gamma)


def sample_anchors(loss_mask: np.ndarray, num_anchors: int, rng: np.random.Generator):
    """Up to ``num_anchors`` distinct valid anchors of one sequence, sorted.

    Returns (anchors int32[num_anchors], valid bool[num_anchors]); padding entries are 0/False.
    """
    m = np.asarray(loss_mask, bool)
    candidates = np.nonzero(m[:-1] & m[1:])[0]
    take = min(num_anchors, candidates.size)
    chosen = np.sort(rng.choice(candidates, size=take, replace=False)) if take else np.zeros(0, int)
    anchors = np.zeros(num_anchors, np.int32)
    anchors[:take] = chosen
    valid = np.arange(num_anchors) < take
    return anchors, valid


ANCHOR_STRATEGIES = ("random", "fixed")


def block_boundaries(loss_mask: np.ndarray, block_size: int) -> np.ndarray:
    """The fixed block starts of one sequence: every maximal run of response tokens cut into
    consecutive blocks of ``block_size`` from its first token; a start is kept when it is a
    valid anchor (it and the next token are response tokens). int64[M], sorted."""
    m = np.asarray(loss_mask, bool)
    padded = np.concatenate([[False], m])
    starts = np.nonzero(padded[1:] & ~padded[:-1])[0]  # first token of each response run
    out = []
    for s in starts:
        end = s + np.argmin(np.append(m[s:], False))  # one past the run
        out.extend(range(s, end, block_size))
    out = np.asarray(out, dtype=np.int64)
    return out[(out + 1 < m.size) & m[np.minimum(out + 1, m.size - 1)]]


def fixed_anchors(loss_mask: np.ndarray, block_size: int, num_anchors: int, rng: np.random.Generator):
    """Like :func:`sample_anchors`, but the anchors are :func:`block_boundaries` (all of them
    when they fit in ``num_anchors``, else a random subset of that many)."""
    candidates = block_boundaries(loss_mask, block_size)
    take = min(num_anchors, candidates.size)
    chosen = candidates if take == candidates.size else np.sort(rng.choice(candidates, size=take, replace=False))
    anchors = np.zeros(num_anchors, np.int32)
    anchors[:take] = chosen
    return anchors, np.arange(num_anchors) < take


def check_anchor_strategy(strategy: str) -> None:
    if strategy not in ANCHOR_STRATEGIES:
        raise ValueError(f"unknown anchor strategy {strategy!r}; choose from {', '.join(ANCHOR_STRATEGIES)} "
                         "(random: the paper's sampled anchors; fixed: consecutive blocks from the "
                         "response start)")


def epoch_anchors(loss_masks: np.ndarray, seq_ids, num_anchors: int, seed: int, epoch: int,
                  strategy: str = "random", block_size: int | None = None):
    """Anchors of a batch, resampled every epoch from an RNG keyed by (seed, epoch, sequence id),
    so the same step always sees the same blocks (exact resume). ``strategy`` "fixed" needs
    ``block_size``."""
    check_anchor_strategy(strategy)
    if strategy == "fixed" and not block_size:
        raise ValueError("fixed anchors need the block size")
    rngs = [np.random.default_rng([seed, epoch, int(sid)]) for sid in seq_ids]
    out = [sample_anchors(loss_masks[i], num_anchors, rng) if strategy == "random"
           else fixed_anchors(loss_masks[i], block_size, num_anchors, rng) for i, rng in enumerate(rngs)]
    return np.stack([a for a, _ in out]), np.stack([v for _, v in out])


def build_blocks(tokens, loss_mask, anchors, valid, block_size: int, mask_token_id: int):
    """Block inputs, positions, labels and label masks for a batch (jittable).

    Args:
      tokens: int32[B, L]; loss_mask: bool[B, L] (response tokens; False on padding).
      anchors: int32[B, N]; valid: bool[B, N].
    Returns:
      inputs int32[B, N, bs], positions int32[B, N, bs], labels int32[B, N, bs],
      label_mask bool[B, N, bs].
    """
    B, L = tokens.shape
    k = jnp.arange(block_size, dtype=jnp.int32)
    positions = anchors[:, :, None] + k
    idx = jnp.minimum(positions, L - 1)
    labels = jnp.take_along_axis(tokens[:, None, :], idx, axis=2)
    in_seq = positions < L
    label_mask = (valid[:, :, None] & (k >= 1) & in_seq
                  & jnp.take_along_axis(loss_mask[:, None, :], idx, axis=2))
    anchor_tok = jnp.take_along_axis(tokens, anchors, axis=1)
    inputs = jnp.where(k == 0, anchor_tok[:, :, None], mask_token_id).astype(jnp.int32)
    return inputs, positions.astype(jnp.int32), labels.astype(jnp.int32), label_mask
