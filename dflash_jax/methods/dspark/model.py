"""The DSpark drafter (``docs/dspark.md``): DFlash's drafter (``methods/dflash/model.py``), whose
block rows all draft (the anchor's too), with a low-rank Markov head on its logits and a
confidence head.

Markov head (SpecForge ``specforge/modeling/draft/dspark.py``; parameters ``markov_w1`` [V, r],
an embedding, and ``markov_w2`` [r, V]). Block row t has the drafter's hidden state h_t (after
the final norm), its logits l_t = lm_head(h_t), and the token before it, ``prev_t`` (the anchor
for row 0, then the token drafted at row t-1); e = w1[prev_t]:

    vanilla:  logits_t = l_t + e @ w2
    gated:    g = sigmoid([h_t ; e] @ gate_proj + b);          logits_t = l_t + (g * e) @ w2
    rnn:      [a, c, o] = [s ; e ; h_t] @ joint_proj + b   (three r-wide parts)
              logits_t = l_t + tanh(o) @ w2;   s <- sigmoid(a) * s + (1 - sigmoid(a)) * tanh(c)
              (s = 0 at row 0 of every block)

Confidence head (``confidence_head.proj``, [D (+ r), 1] with a bias): c_t = [h_t (; e)] @ proj,
sigmoid(c_t) the predicted chance that the target accepts row t's draft (SpecForge trains it
against 1 - TV(draft, target) at that row).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.model import DrafterModel, init_drafter_params
from dflash_jax.methods.dspark.config import DSparkConfig


class MarkovHead(nn.Module):
    """The Markov head's parameters and one row's bias (module docstring)."""

    cfg: DSparkConfig
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg = self.cfg
        r = cfg.markov_rank
        self.markov_w1 = self.param("markov_w1", nn.initializers.normal(0.02), (cfg.vocab_size, r), self.param_dtype)
        self.markov_w2 = nn.Dense(cfg.vocab_size, use_bias=False, param_dtype=self.param_dtype)
        if cfg.markov_head_type == "gated":
            self.gate_proj = nn.Dense(r, param_dtype=self.param_dtype)
        elif cfg.markov_head_type == "rnn":
            self.joint_proj = nn.Dense(3 * r, param_dtype=self.param_dtype)

    def embed(self, prev_B: jax.Array) -> jax.Array:
        """e = w1[prev] float32[..., r]."""
        return jnp.take(self.markov_w1, prev_B, axis=0).astype(jnp.float32)

    def step(self, state_BxR: jax.Array, prev_B: jax.Array, h_BxD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One row: (the state after it, the bias float32[B, V] added to the row's logits)."""
        e, h = self.embed(prev_B), h_BxD.astype(jnp.float32)
        kind = self.cfg.markov_head_type
        if kind == "gated":
            e = jax.nn.sigmoid(self.gate_proj(jnp.concatenate([h, e], -1))) * e
        elif kind == "rnn":
            a, c, o = jnp.split(self.joint_proj(jnp.concatenate([state_BxR, e, h], -1)), 3, axis=-1)
            g = jax.nn.sigmoid(a)
            return g * state_BxR + (1.0 - g) * jnp.tanh(c), self.markov_w2(jnp.tanh(o)).astype(jnp.float32)
        return state_BxR, self.markov_w2(e).astype(jnp.float32)


class DSparkModel(DrafterModel):
    """DFlash's drafter (every use of :class:`DrafterModel`) with the Markov head
    (``markov_init`` / ``markov_step``, and ``markov_block`` for teacher-forced blocks) and the
    confidence head (``confidence``)."""

    cfg: DSparkConfig

    def setup(self):
        super().setup()
        self.markov_head = MarkovHead(self.cfg, self.param_dtype)
        if self.cfg.enable_confidence_head:
            self.confidence_head = nn.Dense(1, param_dtype=self.param_dtype)

    def markov_init(self, batch: int) -> jax.Array:
        """The Markov state at a block's row 0 (zeros [B, r]; only the rnn head reads it)."""
        return jnp.zeros((batch, self.cfg.markov_rank), jnp.float32)

    def markov_step(self, state_BxR, prev_B, h_BxD):
        return self.markov_head.step(state_BxR, prev_B, h_BxD)

    def markov_block(self, logits_BxTxV: jax.Array, hidden_BxTxD: jax.Array, prev_BxT: jax.Array) -> jax.Array:
        """The corrected logits float32[B, T, V] of whole blocks whose tokens before each row are
        known (``prev``: teacher forcing; T the block's rows, the rnn state restarting at row 0)."""
        state = self.markov_init(prev_BxT.shape[0])
        out = []
        for t in range(prev_BxT.shape[1]):
            state, bias = self.markov_step(state, prev_BxT[:, t], hidden_BxTxD[:, t])
            out.append(logits_BxTxV[:, t].astype(jnp.float32) + bias)
        return jnp.stack(out, 1)

    def confidence(self, hidden_BxTxD: jax.Array, prev_BxT: jax.Array) -> jax.Array:
        """The confidence logits float32[B, T] (module docstring; needs the confidence head)."""
        x = hidden_BxTxD.astype(jnp.float32)
        if self.cfg.confidence_head_with_markov:
            x = jnp.concatenate([x, self.markov_head.embed(prev_BxT)], -1)
        return self.confidence_head(x)[..., 0].astype(jnp.float32)

    def init_everything(self, block_embeds, block_positions, taps, anchors, valid):
        """Touches every parameter (for ``init``): the training blocks and both heads."""
        h = super().init_everything(block_embeds, block_positions, taps, anchors, valid)
        prev = jnp.zeros(h.shape[:2], jnp.int32)
        out = self.markov_block(jnp.zeros((*h.shape[:2], self.cfg.vocab_size), h.dtype), h, prev)
        if self.cfg.enable_confidence_head:
            out = out.sum() + self.confidence(h, prev).sum()
        return out


def init_dspark_params(cfg: DSparkConfig, key: jax.Array, dtype=jnp.float32, init_scale: float = 0.02):
    """Random DSpark parameters (normal(init_scale) kernels and embeddings, zero biases, unit norms)."""
    return init_drafter_params(cfg, key, dtype, init_scale, model_class=DSparkModel)
