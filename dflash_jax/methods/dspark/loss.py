"""DSpark's training objective (``docs/dspark.md``), SpecForge's ``OnlineDSparkModel``: DFlash's
blocks (``training.blocks``: ``[x_a, MASK * (b-1)]`` at ``a .. a+b-1``, the sparse mask) with
every row k labelled by the token at ``a + k + 1``; the Markov head teacher-forced (the token
before row k is the label of row k-1, the anchor's for row 0); per labelled row, with weights
w_k = exp(-k / gamma) (1 without gamma) over the rows up to the block's first unlabelled one:

    cross-entropy of the corrected logits against the label                 (ce)
    L1 = sum_v |q(v) - p(v)|, q the corrected softmax, p the target's        (l1)
    the confidence head's logit against 1 - L1 / 2 (binary cross-entropy)    (confidence)

    loss = (ce_alpha * sum w ce + l1_alpha * sum w L1 + confidence_alpha * sum w bce) / sum w

p is the target's distribution for the row's label (its logits one position before it, from
the teacher-forced pass), not differentiated; so is the confidence's target 1 - L1 / 2."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.model import DSparkModel
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK
from dflash_jax.targets import family_of
from dflash_jax.training.blocks import build_blocks

DEFAULT_ALPHAS = {"ce_alpha": 0.1, "l1_alpha": 0.9, "confidence_alpha": 1.0}
"""SpecForge's defaults for the three terms' weights."""


def dspark_labels(tokens, loss_mask, anchors, valid, block_size: int):
    """(labels int32[B, N, b]: the token at a + k + 1; mask bool[B, N, b]: labelled rows, up to
    the block's first unlabelled one; index int32[B, N, b]: the labels' positions, clamped)."""
    B, L = tokens.shape
    k = jnp.arange(block_size, dtype=jnp.int32)
    idx = anchors[:, :, None] + k + 1
    safe = jnp.where(valid[:, :, None], jnp.minimum(idx, L - 1), 0)
    labels = jnp.take_along_axis(tokens[:, None, :], safe, axis=2)
    ok = (idx < L) & jnp.take_along_axis(loss_mask[:, None, :], safe, axis=2) & valid[:, :, None]
    return labels.astype(jnp.int32), jnp.cumprod(ok.astype(jnp.int32), axis=-1).astype(bool), safe


def dspark_loss(dparams, tparams, tokens, loss_mask, taps, last_hidden, anchors, valid, *, dcfg: DSparkConfig,
                tcfg: TargetConfig, gamma: float | None, ce_alpha: float = 0.1, l1_alpha: float = 0.9,
                confidence_alpha: float = 1.0, anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                context_chunk: int = DEFAULT_CONTEXT_CHUNK):
    """The module docstring's loss and metrics (``accuracy_per_pos`` float32[b], every row
    drafting; the three terms' weighted means ``ce``, ``l1``, ``confidence``).

    taps: [B, L, k*D] the drafter's target features; last_hidden: [B, L, D] the target's last
    hidden state after its final norm (what its LM head reads)."""
    b, family = dcfg.block_size, family_of(tcfg)
    B, N = anchors.shape
    inputs, positions, _, _ = build_blocks(tokens, loss_mask, anchors, valid, b, dcfg.mask_token_id)
    emb = family.embed(tparams, inputs.reshape(B, N * b))
    model = DSparkModel(dcfg, anchor_chunk=anchor_chunk, context_chunk=context_chunk)
    h = model.apply({"params": dparams}, emb, positions.reshape(B, N * b), taps.astype(emb.dtype), anchors, valid,
                    method=DSparkModel.train_blocks)
    base = family.lm_head(tcfg, tparams, h)
    labels, mask, safe = dspark_labels(tokens, loss_mask, anchors, valid, b)
    prev = jnp.concatenate([inputs[:, :, :1], labels[:, :, :-1]], -1).reshape(B * N, b)
    hb = h.reshape(B * N, b, -1)
    logits = model.apply({"params": dparams}, base.reshape(B * N, b, -1), hb, prev,
                         method=DSparkModel.markov_block).reshape(B, N, b, -1)
    k = jnp.arange(b, dtype=jnp.float32)
    w = mask * (jnp.exp(-k / gamma) if gamma else 1.0)
    den = jnp.maximum(jnp.sum(w), 1e-9)
    ce = optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels)
    terms = {"ce": jnp.sum(w * ce) / den}
    if l1_alpha > 0 or (confidence_alpha > 0 and dcfg.enable_confidence_head):
        at = jnp.take_along_axis(last_hidden, jnp.maximum(safe - 1, 0).reshape(B, N * b, 1), axis=1)
        p = jax.lax.stop_gradient(jax.nn.softmax(family.lm_head(tcfg, tparams, at).reshape(logits.shape), -1))
        l1 = jnp.sum(jnp.abs(jax.nn.softmax(logits, -1) - p), -1)
        terms["l1"] = jnp.sum(w * l1) / den
        if dcfg.enable_confidence_head and confidence_alpha > 0:
            accept = jax.lax.stop_gradient(jnp.clip(1.0 - 0.5 * l1, 0.0, 1.0))
            c = model.apply({"params": dparams}, hb, prev, method=DSparkModel.confidence).reshape(B, N, b)
            bce = optax.losses.sigmoid_binary_cross_entropy(c, accept)
            terms["confidence"] = jnp.sum(w * bce) / den
    alphas = {"ce": ce_alpha, "l1": l1_alpha, "confidence": confidence_alpha}
    loss = sum(alphas[name] * value for name, value in terms.items())
    correct = (jnp.argmax(logits, -1) == labels) & mask
    per_pos = jnp.sum(correct, (0, 1)) / jnp.maximum(jnp.sum(mask, (0, 1)), 1)
    return loss, {"loss": loss, "accuracy_per_pos": per_pos, "num_labels": jnp.sum(mask), **terms}
