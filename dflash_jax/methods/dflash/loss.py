"""DFlash's training objective (``docs/method.md`` section 5): all blocks of a batch in one pass
(``training.blocks``), weighted cross-entropy; or D-PACE's weights on the same cross-entropy
(``docs/dpace.md``)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.model import DrafterModel, block_embedding, draft_logits
from dflash_jax.targets import family_of
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK
from dflash_jax.training.blocks import build_blocks


def block_logits(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, tokens, loss_mask,
                 taps, anchors, valid, *, anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                 context_chunk: int = DEFAULT_CONTEXT_CHUNK):
    """Drafter logits at every block row: (logits float32[B, N, bs, V], labels, label_mask).

    ``anchor_chunk`` / ``context_chunk``: the chunks of the drafter's training attention
    (``DrafterModel``; dense when N <= anchor_chunk and L <= context_chunk)."""
    bs = dcfg.block_size
    B, N = anchors.shape
    inputs, positions, labels, label_mask = build_blocks(tokens, loss_mask, anchors, valid, bs,
                                                         dcfg.mask_token_id)
    emb = block_embedding(dcfg, family_of(tcfg), tparams, inputs.reshape(B, N * bs))
    model = DrafterModel(dcfg, anchor_chunk=anchor_chunk, context_chunk=context_chunk)
    h = model.apply({"params": dparams}, emb, positions.reshape(B, N * bs), taps.astype(emb.dtype),
                    anchors, valid, method=DrafterModel.train_blocks)  # [B, N*bs, D]
    logits = draft_logits(dcfg, family_of(tcfg), tcfg, tparams, h).reshape(B, N, bs, -1)
    return logits, labels, label_mask


LOSS_TYPES = ("dflash", "dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only")
"""The block losses: DFlash's weighted mean, and D-PACE's three weightings (``docs/dpace.md``)."""


def check_loss_type(loss_type: str, dpace_alpha: float) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    if not 0.0 <= dpace_alpha <= 1.0:
        raise ValueError(f"dpace_alpha {dpace_alpha} must be in [0, 1]")


def dpace_weights(prob, mask, alpha: float, loss_type: str) -> jax.Array:
    """D-PACE's per-row weights [B, N, bs] (``docs/dpace.md``; not differentiated): with the
    smoothed probabilities s_k = (1 - alpha) q_k(label) + alpha at labelled rows (1 elsewhere),
    the prefix P_k = prod_{i <= k} s_i (the chance the block is still accepted through row k),
    ``dpace`` the suffix sum_{j >= k} mask_j P_j, ``dpace-cumulative-confidence-only`` P_k,
    ``dpace-continuation-value-only`` the suffix over P_k."""
    smooth = jnp.where(mask, (1.0 - alpha) * prob + alpha, 1.0)
    prefix = jnp.cumprod(smooth, axis=-1)
    if loss_type == "dpace-cumulative-confidence-only":
        return prefix
    suffix = jnp.flip(jnp.cumsum(jnp.flip(prefix * mask, -1), -1), -1)
    if loss_type == "dpace":
        return suffix
    return suffix / jnp.maximum(prefix, jnp.finfo(prefix.dtype).tiny)


def drafter_loss(dparams, tparams, tokens, loss_mask, taps, anchors, valid, weights, *,
                 dcfg: DrafterConfig, tcfg: TargetConfig, anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                 context_chunk: int = DEFAULT_CONTEXT_CHUNK, loss_type: str = "dflash",
                 dpace_alpha: float = 0.5):
    """Weighted mean cross-entropy over labelled block rows, and metrics; or (``loss_type`` one
    of D-PACE's) the cross-entropy weighted by :func:`dpace_weights` (``dpace_alpha``) summed and
    divided by the batch's rows, as SpecForge's D-PACE loss is (``weights`` unread).

    weights: float32[bs] (row 0 is 0); anchor_chunk / context_chunk: as :func:`block_logits`.
    Returns (loss, metrics) with per-position accuracy
    ``accuracy_per_pos`` float32[bs-1] (top-1 accuracy of rows 1..bs-1) and the label count."""
    logits, labels, label_mask = block_logits(dcfg, tcfg, dparams, tparams, tokens, loss_mask,
                                              taps, anchors, valid, anchor_chunk=anchor_chunk,
                                              context_chunk=context_chunk)
    ce = optax.losses.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    if loss_type == "dflash":
        w = weights[None, None, :] * label_mask
        loss = jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1e-9)
    else:
        w = jax.lax.stop_gradient(dpace_weights(jnp.exp(-ce), label_mask, dpace_alpha, loss_type))
        loss = jnp.sum(ce * label_mask * w) / tokens.shape[0]
    correct = (jnp.argmax(logits, -1) == labels) & label_mask
    per_pos = jnp.sum(correct, (0, 1)) / jnp.maximum(jnp.sum(label_mask, (0, 1)), 1)
    return loss, {"loss": loss, "accuracy_per_pos": per_pos[1:], "num_labels": jnp.sum(label_mask)}


@functools.partial(jax.jit, static_argnames=("dcfg", "tcfg", "anchor_chunk", "context_chunk", "loss_type",
                                             "dpace_alpha"))
def eval_loss(dparams, tparams, tokens, loss_mask, taps, anchors, valid, weights, *, dcfg, tcfg,
              anchor_chunk: int = DEFAULT_ANCHOR_CHUNK, context_chunk: int = DEFAULT_CONTEXT_CHUNK,
              loss_type: str = "dflash", dpace_alpha: float = 0.5):
    """Jitted :func:`drafter_loss` (used by tests and evaluation)."""
    return drafter_loss(dparams, tparams, tokens, loss_mask, taps, anchors, valid, weights,
                        dcfg=dcfg, tcfg=tcfg, anchor_chunk=anchor_chunk, context_chunk=context_chunk,
                        loss_type=loss_type, dpace_alpha=dpace_alpha)
