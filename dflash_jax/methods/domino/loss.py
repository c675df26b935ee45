"""Domino's training objective (``docs/domino.md``), SpecForge's ``OnlineDominoModel``: DFlash's
blocks (``training.blocks``: ``[x_a, MASK * (b-1)]`` at ``a .. a+b-1``, the sparse mask), the
GRU teacher-forced over the block's true tokens ``x_a, x_{a+1}, ...``, and two cross-entropies
of every labelled row: of the corrected logits (``final``) and of the backbone's (``base``).

Rows and labels (``shift_label``): row k is labelled by the token at ``a + k + 1`` (every row,
0 .. b-1) and corrected from row P on with the GRU's state after ``x_a .. x_{a+k}``; without it,
DFlash's rows: row k by the token at ``a + k`` (rows 1 .. b-1), corrected from row 1 + P on with
the state after ``x_a .. x_{a+k-1}``. A row is labelled when its label lies inside the sequence,
is a response token and its block is real (not cumulative: a hole in the response drops that
row only). Weights w_k = exp(-max(k - o, 0) / gamma) on the labelled rows (o = 0 with
``shift_label``, else 1; 1 without gamma, SpecForge's default):

    loss = (1 - lambda) * sum w ce(final) / sum w + lambda * sum w ce(base) / sum w

``lambda`` (``lambda_base``) is a schedule of the training step (:func:`lambda_base`):
SpecForge's linear decay from 1 to 0 over the first half of the run, so the backbone learns
first and the correction takes over."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from dflash_jax.config import TargetConfig
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.model import DominoModel
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK
from dflash_jax.targets import family_of
from dflash_jax.training.blocks import build_blocks

LAMBDA_START, LAMBDA_DECAY_RATIO = 1.0, 0.5
"""SpecForge's defaults of the base loss's schedule (``lambda_base_start``,
``lambda_base_decay_ratio``)."""


def lambda_base(step, total_steps: int, start: float = LAMBDA_START, decay_ratio: float = LAMBDA_DECAY_RATIO):
    """The base loss's weight at training step ``step`` (0-based: the optimizer steps done) of
    ``total_steps``: ``start`` falling linearly to 0 over the first ``int(total_steps *
    decay_ratio)`` steps (at least 1), then 0; clipped to [0, 1]. Traceable in ``step``."""
    decay_steps = max(1, int(total_steps * decay_ratio))
    progress = jnp.minimum(jnp.asarray(step, jnp.float32) / decay_steps, 1.0)
    return jnp.clip(start * (1.0 - progress), 0.0, 1.0)


def domino_labels(tokens, loss_mask, anchors, valid, block_size: int, shift_label: bool):
    """(labels int32[B, N, b], mask bool[B, N, b]: the labelled rows (module docstring),
    inputs int32[B, N, b]: the GRU's teacher-forced tokens ``x_{a+k}``, clamped to the sequence)."""
    B, L = tokens.shape
    k = jnp.arange(block_size, dtype=jnp.int32)
    at = anchors[:, :, None] + k
    idx = at + (1 if shift_label else 0)
    safe = jnp.where(valid[:, :, None], jnp.minimum(idx, L - 1), 0)
    labels = jnp.take_along_axis(tokens[:, None, :], safe, axis=2)
    mask = (idx < L) & jnp.take_along_axis(loss_mask[:, None, :], safe, axis=2) & valid[:, :, None]
    if not shift_label:
        mask = mask & (k > 0)
    seen = jnp.take_along_axis(tokens[:, None, :], jnp.where(valid[:, :, None], jnp.minimum(at, L - 1), 0), axis=2)
    return labels.astype(jnp.int32), mask, seen.astype(jnp.int32)


def domino_loss(dparams, tparams, tokens, loss_mask, taps, anchors, valid, lam, *, dcfg: DominoConfig,
                tcfg: TargetConfig, gamma: float | None, anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                context_chunk: int = DEFAULT_CONTEXT_CHUNK):
    """The module docstring's loss at base weight ``lam`` (a scalar, traced) and its metrics
    (``accuracy_per_pos`` float32 of the drafting rows' corrected argmax: rows 0 .. b-1 with
    ``shift_label``, else 1 .. b-1; ``final``, ``base`` the two cross-entropies' weighted means,
    ``lambda_base``). taps: [B, L, k*D] the drafter's target features."""
    b, family, shift = dcfg.block_size, family_of(tcfg), dcfg.shift_label
    B, N = anchors.shape
    inputs, positions, _, _ = build_blocks(tokens, loss_mask, anchors, valid, b, dcfg.mask_token_id)
    emb = family.embed(tparams, inputs.reshape(B, N * b))
    model = DominoModel(dcfg, anchor_chunk=anchor_chunk, context_chunk=context_chunk)
    h = model.apply({"params": dparams}, emb, positions.reshape(B, N * b), taps.astype(emb.dtype), anchors, valid,
                    method=DominoModel.train_blocks).reshape(B, N, b, -1)
    base = family.lm_head(tcfg, tparams, h.reshape(B, N * b, -1)).reshape(B, N, b, -1).astype(jnp.float32)
    labels, mask, seen = domino_labels(tokens, loss_mask, anchors, valid, b, shift)
    g = model.apply({"params": dparams}, family.embed(tparams, seen.reshape(B * N, b)),
                    method=DominoModel.gru_block).reshape(B, N, b, -1)
    if not shift:  # row k reads the state after x_a .. x_{a+k-1}
        g = jnp.concatenate([jnp.zeros_like(g[:, :, :1]), g[:, :, :-1]], 2)
    first = dcfg.pure_draft_prefix_len + (0 if shift else 1)
    k = jnp.arange(b)
    corr = model.apply({"params": dparams}, h[:, :, first:], g[:, :, first:], method=DominoModel.correction)
    final = jnp.concatenate([base[:, :, :first], base[:, :, first:] + corr], 2)
    decay = jnp.exp(-jnp.maximum(k - (0 if shift else 1), 0) / gamma) if gamma else jnp.ones((b,))
    w = mask * decay
    den = jnp.maximum(jnp.sum(w), 1e-9)
    ce_final = jnp.sum(w * optax.losses.softmax_cross_entropy_with_integer_labels(final, labels)) / den
    ce_base = jnp.sum(w * optax.losses.softmax_cross_entropy_with_integer_labels(base, labels)) / den
    loss = (1.0 - lam) * ce_final + lam * ce_base
    rows = slice(0, b) if shift else slice(1, b)
    correct = ((jnp.argmax(final, -1) == labels) & mask)[:, :, rows]
    per_pos = jnp.sum(correct, (0, 1)) / jnp.maximum(jnp.sum(mask[:, :, rows], (0, 1)), 1)
    return loss, {"loss": loss, "accuracy_per_pos": per_pos, "final": ce_final, "base": ce_base,
                  "lambda_base": jnp.asarray(lam, jnp.float32), "num_labels": jnp.sum(mask)}
