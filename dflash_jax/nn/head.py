"""The target's token embedding and LM head, as functions of its parameters: every target
family has them in this layout (``embed_tokens/embedding`` [V, D]; ``lm_head/kernel`` [D, V], or
tied to the embedding), and the drafters share them (they have neither of their own)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class LMHeadKernel(nn.Module):
    """The untied LM head's parameter ``lm_head/kernel`` [D, V]; :func:`lm_head` applies it."""

    hidden_size: int
    vocab_size: int
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.param("kernel", nn.initializers.lecun_normal(),
                          (self.hidden_size, self.vocab_size), self.param_dtype)


def embed(params, tokens: jax.Array, model_axis: str | None = None) -> jax.Array:
    """The target's token embedding: [..., D] rows of ``embed_tokens`` (shared with drafters);
    ``model_axis``: the table's vocabulary is split over that mesh axis (:func:`embed_rows`)."""
    if model_axis is None:
        return jnp.take(params["embed_tokens"]["embedding"], tokens, axis=0)
    return embed_rows(params["embed_tokens"]["embedding"], tokens, model_axis)


def embed_rows(table: jax.Array, tokens: jax.Array, model_axis: str) -> jax.Array:
    """Lookup in a vocabulary-split table (inside ``shard_map``): shard i holds rows
    ``[i V/m, (i+1) V/m)``; each shard gathers the ids it holds, zeros elsewhere, one psum."""
    Vl = table.shape[0]
    local = tokens - jax.lax.axis_index(model_axis) * Vl
    mine = (local >= 0) & (local < Vl)
    rows = jnp.take(table, jnp.clip(local, 0, Vl - 1), axis=0)
    return jax.lax.psum(jnp.where(mine[..., None], rows, jnp.zeros((), rows.dtype)), model_axis)


def lm_head(cfg, params, h: jax.Array) -> jax.Array:
    """The target's LM head on already-normed hidden states h [..., D] -> float32 logits [..., V]
    (the one implementation: ``TargetModel`` and the drafters call it). ``params`` needs only
    ``embed_tokens/embedding`` [V, D] (tied) or ``lm_head/kernel`` [D, V]."""
    if cfg.tie_word_embeddings:
        # one dot_general: flax's attend, jnp.dot(h, E.T), becomes a loop fusion that XLA:CPU
        # of jaxlib >= 0.11 leaves unvectorized (a decode step 1.7x slower)
        w = params["embed_tokens"]["embedding"]
        logits = jnp.einsum("...d,vd->...v", h, w.astype(h.dtype))
    else:
        logits = h @ params["lm_head"]["kernel"].astype(h.dtype)
    return logits.astype(jnp.float32)
