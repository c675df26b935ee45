"""The Domino drafter (``docs/domino.md``): DFlash's drafter (``methods/dflash/model.py``) and a
logit correction from a GRU over the block's tokens (SpecForge ``specforge/modeling/draft/domino.py``).

Draft t (0-based; block token t + 1) is read from block row r(t) = t (``shift_label``: the row
before the token) or t + 1 (DFlash's rows). With e_i the target's embedding of block token i
(the anchor, then the drafts) and g_t the GRU's state after e_0 .. e_t (zero before e_0):

    logits_t = lm_head(h_r(t)) + [t >= P] * W2 silu(W1 [h_r(t) ; g_t])

(P = ``pure_draft_prefix_len``, W1 [D + H, E], W2 [E, V], no biases). The GRU is PyTorch's
without biases: r = sigmoid(x W_ir + g W_hr), z = sigmoid(x W_iz + g W_hz),
n = tanh(x W_in + r * (g W_hn)), g' = (1 - z) * n + z * g (``weight_ih`` / ``weight_hh`` hold
the r, z, n parts in that order)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.model import DrafterModel, init_drafter_params
from dflash_jax.methods.domino.config import DominoConfig


def gru_step(x_BxD, g_BxH, w_ih_Dx3H, w_hh_Hx3H) -> jax.Array:
    """One step of PyTorch's bias-free GRU (module docstring), float32."""
    xi = x_BxD.astype(jnp.float32) @ w_ih_Dx3H.astype(jnp.float32)
    hh = g_BxH @ w_hh_Hx3H.astype(jnp.float32)
    xr, xz, xn = jnp.split(xi, 3, axis=-1)
    hr, hz, hn = jnp.split(hh, 3, axis=-1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    return (1.0 - z) * n + z * g_BxH


class DominoModel(DrafterModel):
    """DFlash's drafter (every use of :class:`DrafterModel`) with the GRU (``gru``) and the
    correction (``correction``)."""

    cfg: DominoConfig

    def setup(self):
        super().setup()
        cfg = self.cfg
        H = cfg.gru_hidden_dim
        init = nn.initializers.normal(0.02)
        self.gru_w_ih = self.param("gru_w_ih", init, (cfg.hidden_size, 3 * H), self.param_dtype)
        self.gru_w_hh = self.param("gru_w_hh", init, (H, 3 * H), self.param_dtype)
        self.embed_proj_in = nn.Dense(cfg.emb_dim, use_bias=False, param_dtype=self.param_dtype)
        self.embed_proj_out = nn.Dense(cfg.vocab_size, use_bias=False, param_dtype=self.param_dtype)

    def gru(self, x_BxD: jax.Array, g_BxH: jax.Array) -> jax.Array:
        """The GRU's state after one more token's embedding ``x``."""
        return gru_step(x_BxD, g_BxH, self.gru_w_ih, self.gru_w_hh)

    def gru_block(self, x_BxTxD: jax.Array) -> jax.Array:
        """The GRU's states float32[B, T, H] after each of the T tokens' embeddings ``x`` (state t:
        after x_0 .. x_t), from zero: the teacher-forced states of training."""
        def step(g, x):
            g = self.gru(x, g)
            return g, g

        g0 = jnp.zeros((x_BxTxD.shape[0], self.cfg.gru_hidden_dim), jnp.float32)
        return jax.lax.scan(step, g0, jnp.swapaxes(x_BxTxD, 0, 1))[1].swapaxes(0, 1)

    def correction(self, h_BxD: jax.Array, g_BxH: jax.Array) -> jax.Array:
        """W2 silu(W1 [h ; g]) float32[..., V] (any leading axes)."""
        x = jnp.concatenate([h_BxD.astype(jnp.float32), g_BxH], -1)
        return self.embed_proj_out(jax.nn.silu(self.embed_proj_in(x))).astype(jnp.float32)

    def init_everything(self, block_embeds, block_positions, taps, anchors, valid):
        h = super().init_everything(block_embeds, block_positions, taps, anchors, valid)
        g = self.gru(h[:, 0], jnp.zeros((h.shape[0], self.cfg.gru_hidden_dim), jnp.float32))
        return self.correction(h[:, 0], g)


def init_domino_params(cfg: DominoConfig, key: jax.Array, dtype=jnp.float32, init_scale: float = 0.02):
    return init_drafter_params(cfg, key, dtype, init_scale, model_class=DominoModel)
