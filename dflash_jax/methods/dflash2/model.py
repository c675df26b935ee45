"""The DFlash2 drafter (``docs/dflash2.md``): DFlash's drafter (``methods/dflash/model.py``) whose
every layer wraps its attention and its MLP in a grouped dynamic causal convolution over the
block rows, and a candidate selector over the block's logits.

Convolution (around the attention, and again around the MLP; reference: ``dflash==0.1.0``
``GroupedDynamicCausalConv``). Parameters ``base_kernel`` [2, K, D] and ``kernel_projection``
[D, 2*K*G] (G = D / group_size groups). On the normed rows ``x`` of one block:

    dyn = x @ kernel_projection  -> [T, 2, K, G]
    conv(x, dyn_i, base_i)[t, c] = sum_{o < K} (base_i[o, c] + dyn_i[t, o, group(c)]) * x[t - o, c]

(``x[t - o] = 0`` before the block's first row: causal within the block, blocks never mix),
``prepare`` gives ``conv(x, dyn_0, base_0)`` (what the attention, or the MLP, reads) and keeps
``dyn_1``; ``finish`` applies ``conv(y, dyn_1, base_1)`` to the attention's (the MLP's) output y
before the residual. The context rows (the target's projected features) are not convolved.

Candidate selector (reference ``CandidateSelector``). Parameters ``predecessor_codebook`` and
``successor_codebook`` [V, r], ``hidden_projection`` [D, r]. At block row t (1..bs-1) with
logits l_t and hidden state h_t, the candidates are l_t's top-k tokens c_{t,1..k}; given the
token chosen before it (the anchor for row 1), ``prev``:

    score_t(j) = l_t(c_{t,j}) + < pred[prev] * (h_t @ hidden_projection), succ[c_{t,j}] >

The draft picks argmax_j score_t(j) (greedy), or draws j from softmax(score_t / T) (sampled, T
the sampling temperature), row by row.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.model import DrafterLayer, DrafterModel, init_drafter_params
from dflash_jax.methods.dflash2.config import DFlash2Config


def grouped_causal_conv(x_BxLxD: jax.Array, dyn_BxLxKxG: jax.Array, base_KxD: jax.Array,
                        blocks: int) -> jax.Array:
    """``sum_o (base[o] + dyn[:, :, o, group]) * x shifted by o rows`` within each of the
    ``blocks`` blocks of ``x`` (module docstring). Returns [B, L, D] in ``x``'s dtype."""
    B, L, D = x_BxLxD.shape
    K, G = dyn_BxLxKxG.shape[-2:]
    T = L // blocks
    xb = x_BxLxD.reshape(B, blocks, T, G, D // G)
    dyn = dyn_BxLxKxG.reshape(B, blocks, T, K, G, 1).astype(x_BxLxD.dtype)
    base = base_KxD.reshape(K, G, D // G).astype(x_BxLxD.dtype)
    out = jnp.zeros_like(xb)
    for o in range(min(K, T)):  # offsets past the block's length see only zeros
        shifted = xb if o == 0 else jnp.pad(xb[:, :, :T - o], ((0, 0), (0, 0), (o, 0), (0, 0), (0, 0)))
        out = out + (base[o] + dyn[:, :, :, o]) * shifted
    return out.reshape(B, L, D)


class GroupedDynamicConv(nn.Module):
    """One convolution pair (module docstring): ``prepare`` before the wrapped block, ``finish``
    after it."""

    cfg: DFlash2Config
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg = self.cfg
        K, D = cfg.conv_kernel_size, cfg.hidden_size
        self.base_kernel = self.param("base_kernel", nn.initializers.zeros, (2, K, D), self.param_dtype)
        self.kernel_projection = nn.Dense(2 * K * cfg.conv_groups, use_bias=False, param_dtype=self.param_dtype)

    def prepare(self, x_BxLxD: jax.Array, blocks: int) -> tuple[jax.Array, jax.Array]:
        """(the convolved rows, the second kernel's input-dependent taps [B, L, K, G])."""
        cfg = self.cfg
        dyn = self.kernel_projection(x_BxLxD).reshape(*x_BxLxD.shape[:-1], 2, cfg.conv_kernel_size,
                                                      cfg.conv_groups)
        return grouped_causal_conv(x_BxLxD, dyn[..., 0, :, :], self.base_kernel[0], blocks), dyn[..., 1, :, :]

    def finish(self, y_BxLxD: jax.Array, dyn_BxLxKxG: jax.Array, blocks: int) -> jax.Array:
        return grouped_causal_conv(y_BxLxD, dyn_BxLxKxG, self.base_kernel[1], blocks)


class DFlash2Layer(DrafterLayer):
    """DFlash's layer with a convolution pair around the attention and one around the MLP (on
    the block rows; the context rows' projections are DFlash's)."""

    def setup(self):
        super().setup()
        self.attention_conv = GroupedDynamicConv(self.cfg, self.param_dtype)
        self.mlp_conv = GroupedDynamicConv(self.cfg, self.param_dtype)

    def _residual(self, h: jax.Array, attention, blocks: int = 1) -> jax.Array:
        x, dyn = self.attention_conv.prepare(self.input_layernorm(h), blocks)
        h = h + self.attention_conv.finish(attention(x), dyn, blocks)
        x, dyn = self.mlp_conv.prepare(self.post_attention_layernorm(h), blocks)
        return h + self.mlp_conv.finish(self.mlp(x), dyn, blocks)


class CandidateSelector(nn.Module):
    """The selector's parameters and its scores (module docstring)."""

    cfg: DFlash2Config
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg = self.cfg
        shape = (cfg.vocab_size, cfg.selector_rank)
        init = nn.initializers.normal(0.02)
        self.predecessor_codebook = self.param("predecessor_codebook", init, shape, self.param_dtype)
        self.successor_codebook = self.param("successor_codebook", init, shape, self.param_dtype)
        self.hidden_projection = nn.Dense(cfg.selector_rank, use_bias=False, param_dtype=self.param_dtype)

    def candidates(self, hidden_BxTxD: jax.Array, logits_BxTxV: jax.Array):
        """(unary float32[B, T, k]: the candidates' logits, candidates int32[B, T, k]: the top-k
        tokens, their successor codes float32[B, T, k, r], the rows' projections float32[B, T, r])."""
        unary, cand = jax.lax.top_k(logits_BxTxV.astype(jnp.float32), self.cfg.selector_top_k)
        succ = jnp.take(self.successor_codebook, cand, axis=0).astype(jnp.float32)
        return unary, cand.astype(jnp.int32), succ, self.hidden_projection(hidden_BxTxD).astype(jnp.float32)

    def predecessor(self, prev_B: jax.Array) -> jax.Array:
        """The predecessor codes float32[B, r] of the tokens ``prev``."""
        return jnp.take(self.predecessor_codebook, prev_B, axis=0).astype(jnp.float32)


def step_scores(unary_BxK, succ_BxKxR, proj_BxR, pred_BxR) -> jax.Array:
    """One block row's candidate scores float32[B, k] given the predecessor's code."""
    return unary_BxK + jnp.einsum("br,bkr->bk", pred_BxR * proj_BxR, succ_BxKxR)


class DFlash2Model(DrafterModel):
    """DFlash's drafter (every use of :class:`DrafterModel`) with :class:`DFlash2Layer` layers
    and the candidate selector (``candidates`` / ``predecessor``)."""

    cfg: DFlash2Config
    layer_class = DFlash2Layer

    def setup(self):
        super().setup()
        self.candidate_selector = CandidateSelector(self.cfg, self.param_dtype)

    def candidates(self, hidden_BxTxD, logits_BxTxV):
        return self.candidate_selector.candidates(hidden_BxTxD, logits_BxTxV)

    def predecessor(self, prev_B):
        return self.candidate_selector.predecessor(prev_B)

    def init_everything(self, block_embeds, block_positions, taps, anchors, valid):
        """Touches every parameter (for ``init``): the training blocks and the selector."""
        h = super().init_everything(block_embeds, block_positions, taps, anchors, valid)
        logits = jnp.zeros((*h.shape[:2], self.cfg.vocab_size), h.dtype)
        self.candidates(h, logits)
        return self.predecessor(jnp.zeros(h.shape[:1], jnp.int32))


def init_dflash2_params(cfg: DFlash2Config, key: jax.Array, dtype=jnp.float32, init_scale: float = 0.02):
    """Random DFlash2 parameters (normal(init_scale) kernels and codebooks, unit norms)."""
    return init_drafter_params(cfg, key, dtype, init_scale, model_class=DFlash2Model)
