"""The EAGLE-3 drafter (``docs/eagle3.md``), in Flax Linen, used functionally.

EAGLE-3 drafts autoregressively with ONE decoder layer (``midlayer``). Its sequence has one
entry per position j; entry j reads a feature ``f_j`` [D] and the embedding of the NEXT token
``x_{j+1}``, and its output hidden state ``h_j`` predicts the token after that, ``x_{j+2}``:

  x2_j = [input_layernorm(embed(x_{j+1})) ; hidden_norm(f_j)]      [2D]
  a_j  = o_proj(attention(q_proj(x2_j), k_proj(x2), v_proj(x2)))     causal, RoPE at position j
  u_j  = f_j + a_j ;  h_j = u_j + mlp(post_attention_layernorm(u_j))
  logits_j = lm_head(norm(h_j))                                      [Vd] (draft vocabulary)

For a committed position the feature is the target's: ``f_j = fc(taps_j)``, taps_j the
concatenated outputs of three target layers [3 * Dt]. Drafting past the committed tokens, the
entry for a drafted token x feeds back the drafter's own hidden state: ``f = h_parent``, the
output of the entry that predicted x (training-time test, "TTT", trains exactly this).

``Eagle3Model`` methods (``apply(..., method=...)``):

  project(taps [B, T, 3*Dt]) -> features [B, T, D]                        (``fc``)
  decode(embeds [B, T, D], features [B, T, D], positions int32[B, T], slots int32[B, T],
         cache, mask bool[B, T, S]) -> (hidden [B, T, D], cache)
      writes the rows' K/V at cache ``slots`` (RoPE at ``positions``), then each row attends
      to the cache slots ``mask`` allows (its own slot included by the caller); inference;
  logits(hidden [..., D]) -> [..., Vd]
  unroll(embeds [B, L, D], taps [B, L, 3*Dt], valid bool[B, L], steps, rows) -> hidden [steps, B, W, D]
      training-time test over whole sequences, outputs at positions ``rows`` int32[B, W] (below).

The cache is a one-layer :class:`~dflash_jax.nn.cache.KVCache`.

Training-time test (``unroll``): step s = 0 .. steps-1 runs the layer at every position j as
the entry drafted s tokens past the committed position j: token ``x_{j+1+s}``, RoPE position
``j + s``, feature ``fc(taps_j)`` at s = 0 and step s-1's output at position j after. Its query
sees step 0's keys at positions ``j' <= j`` (the committed entries) and its own chain's keys
of steps 1..s at position j (the entries it drafted), exactly what :meth:`decode` sees when it
drafts s tokens past position j. Step s's output at j predicts ``x_{j+2+s}``.

Parameter tree (kernels [in, out]; Hugging Face names in ``methods.eagle3.checkpoint``):

  fc/kernel                                   [3*Dt, D]
  midlayer/hidden_norm/weight                 [D]
  midlayer/input_layernorm/weight             [D]
  midlayer/self_attn/{q,k,v}_proj/kernel      [2D, H*Dh] / [2D, Hkv*Dh] / [2D, Hkv*Dh]
  midlayer/self_attn/o_proj/kernel            [H*Dh, D]
  midlayer/post_attention_layernorm/weight    [D]
  midlayer/mlp/{gate,up}_proj/kernel          [D, F];  midlayer/mlp/down_proj/kernel [F, D]
  norm/weight                                 [D]
  lm_head/kernel                              [D, Vd]

The draft-to-target map ``d2t`` (int32[Vd], target id = draft id + d2t[draft id]) is not a
parameter (it does not train): it travels beside them (``methods.eagle3.handle.Eagle3Drafter``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.nn import MLP, RMSNorm, apply_rope, rope_cos_sin, segmented_attention
from dflash_jax.nn.attention import joint_softmax
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.layers import random_module_params


class Eagle3Attention(nn.Module):
    """q/k/v projections from the 2D-wide layer input, o_proj back to D; no q/k norms (Llama)."""

    cfg: Eagle3Config
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg = self.cfg
        dense = lambda n: nn.Dense(n, use_bias=False, param_dtype=self.param_dtype)
        self.q_proj = dense(cfg.num_heads * cfg.head_dim)
        self.k_proj = dense(cfg.num_kv_heads * cfg.head_dim)
        self.v_proj = dense(cfg.num_kv_heads * cfg.head_dim)
        self.o_proj = dense(cfg.hidden_size)

    def qkv(self, x2, positions):
        """Rotated queries [B, T, H, Dh], rotated keys and values [B, T, Hkv, Dh] of rows
        x2 [B, T, 2D] at RoPE ``positions`` int32[B, T]."""
        cfg = self.cfg
        B, T, _ = x2.shape
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope)
        q = apply_rope(self.q_proj(x2).reshape(B, T, cfg.num_heads, cfg.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x2).reshape(B, T, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        return q, k, self.v_proj(x2).reshape(B, T, cfg.num_kv_heads, cfg.head_dim)

    def out(self, attn):
        """o_proj of attention outputs [B, T, H, Dh] -> [B, T, D]."""
        B, T = attn.shape[:2]
        return self.o_proj(attn.reshape(B, T, -1))


class Eagle3Layer(nn.Module):
    """The decoder layer ``midlayer`` (module docstring)."""

    cfg: Eagle3Config
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg, dt = self.cfg, self.param_dtype
        self.hidden_norm = RMSNorm(cfg.rms_norm_eps, dt)
        self.input_layernorm = RMSNorm(cfg.rms_norm_eps, dt)
        self.self_attn = Eagle3Attention(cfg, dt)
        self.post_attention_layernorm = RMSNorm(cfg.rms_norm_eps, dt)
        self.mlp = MLP(cfg.intermediate_size, dt)

    def inputs(self, embeds, features):
        """[input_layernorm(embeds) ; hidden_norm(features)]: [B, T, 2D]."""
        return jnp.concatenate([self.input_layernorm(embeds), self.hidden_norm(features)], -1)

    def finish(self, features, attn):
        """The residual stream after attention outputs ``attn`` [B, T, H, Dh]: [B, T, D]."""
        u = features + self.self_attn.out(attn).astype(features.dtype)
        return u + self.mlp(self.post_attention_layernorm(u))


class Eagle3Model(nn.Module):
    cfg: Eagle3Config
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        cfg = self.cfg
        self.fc = nn.Dense(cfg.hidden_size, use_bias=False, param_dtype=self.param_dtype)
        self.midlayer = Eagle3Layer(cfg, self.param_dtype)
        self.norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
        self.lm_head = nn.Dense(cfg.draft_vocab_size, use_bias=False, param_dtype=self.param_dtype)

    def project(self, taps):
        """fc of the concatenated target features [B, T, 3*Dt] -> [B, T, D]."""
        if taps.shape[-1] != self.cfg.feature_size:
            raise ValueError(f"EAGLE-3 features must be {self.cfg.feature_size} wide (3 target "
                             f"layers of {self.cfg.target_hidden_size}), got {taps.shape[-1]}")
        return self.fc(taps)

    def logits(self, hidden):
        """Draft-vocabulary logits [..., Vd] of output hidden states [..., D]."""
        return self.lm_head(self.norm(hidden) if self.cfg.norm_output else hidden)

    def decode(self, embeds, features, positions, slots, cache: KVCache, mask):
        """Inference rows (module docstring): K/V written at ``slots``, attention over the cache
        under ``mask`` bool[B, T, S]. Returns (hidden [B, T, D], cache)."""
        lay = self.midlayer
        q, k, v = lay.self_attn.qkv(lay.inputs(embeds, features), positions)
        cache = cache.write(0, k, v, slots)
        attn = segmented_attention(q, [(cache.k[0], cache.v[0], mask)])
        return lay.finish(features, attn), cache

    def unroll(self, embeds, taps, valid, steps: int, rows=None):
        """Training-time test (module docstring).

        Args:
          embeds: [B, L, D] the target's embedding of the tokens x_0 .. x_{L-1}.
          taps: [B, L, 3*Dt] the target's features at positions 0 .. L-1.
          valid: bool[B, L] real positions (False: padding; never seen as a key).
          steps: k, the drafting steps unrolled.
          rows: int32[B, W] the positions j whose outputs are wanted (default all L, in
            order). Every position's step-0 keys and values are computed (they are the
            context), but the attention, MLP and later steps run only at ``rows``: a loss that
            counts only the response's predictions needs only the positions from k + 1 before
            the response on, a fraction of the sequence after a long prompt.
        Returns hidden [k, B, W, D]: step s at position ``rows[b, w]`` predicts x_{j+2+s}.
        """
        cfg, lay = self.cfg, self.midlayer
        B, L, _ = embeds.shape
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        G = H // Hkv
        pos = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
        rows = pos if rows is None else rows.astype(jnp.int32)
        W = rows.shape[1]
        at_rows = lambda x: jnp.take_along_axis(x, rows.reshape(B, W, *([1] * (x.ndim - 2))), axis=1)
        causal = (pos[:, None, :] <= rows[:, :, None]) & valid[:, None, :]  # [B, W, L]
        causal = causal[:, None, None]  # [B, 1, 1, W, L]
        features_all = self.project(taps)
        tok0 = jnp.pad(embeds[:, 1:], ((0, 0), (0, 1), (0, 0)))  # x_{j+1}
        q_all, k0, v0 = lay.self_attn.qkv(lay.inputs(tok0, features_all), pos)
        features = at_rows(features_all)
        scale = Dh ** -0.5
        own_k, own_v, outs = [], [], []
        for s in range(int(steps)):
            if s == 0:
                q = at_rows(q_all)
            else:
                nxt = rows + 1 + s  # x_{j+1+s}; zeros past the sequence, as step 0's padding
                tok = jnp.where((nxt < L)[..., None],
                                jnp.take_along_axis(embeds, jnp.minimum(nxt, L - 1)[..., None], axis=1), 0)
                q, k, v = lay.self_attn.qkv(lay.inputs(tok.astype(embeds.dtype), features), rows + s)
                own_k.append(k)
                own_v.append(v)
            qg = q.reshape(B, W, Hkv, G, Dh)
            s0 = jnp.einsum("btkgd,bskd->bkgts", qg, k0, preferred_element_type=jnp.float32) * scale
            scores, masks = [jnp.where(causal, s0, -jnp.inf)], [causal]
            for ki in own_k:  # its own chain's entries: the same position, later steps
                si = jnp.einsum("btkgd,btkd->bkgt", qg, ki, preferred_element_type=jnp.float32)
                scores.append((si * scale)[..., None])
                masks.append(jnp.ones((1, 1, 1, 1, 1), bool))
            probs = joint_softmax(scores, masks)
            out = jnp.einsum("bkgts,bskd->btkgd", probs[0].astype(v0.dtype), v0,
                             preferred_element_type=jnp.float32)
            for p, vi in zip(probs[1:], own_v):
                out = out + jnp.einsum("bkgt,btkd->btkgd", p[..., 0].astype(vi.dtype), vi,
                                       preferred_element_type=jnp.float32)
            features = lay.finish(features, out.reshape(B, W, H, Dh).astype(q.dtype))
            outs.append(features)
        return jnp.stack(outs)

    def init_all(self, embeds, taps, valid):
        """Touches every parameter (initialisation only)."""
        return self.logits(self.unroll(embeds, taps, valid, 1))


def init_eagle3_params(cfg: Eagle3Config, key: jax.Array, dtype=jnp.float32, init_scale: float = 0.02):
    """Random EAGLE-3 parameters (normal(init_scale) kernels, unit norms), built under jit."""
    model = Eagle3Model(cfg, param_dtype=dtype)
    emb = jnp.zeros((1, 2, cfg.hidden_size), dtype)
    taps = jnp.zeros((1, 2, cfg.feature_size), dtype)
    valid = jnp.ones((1, 2), bool)

    return random_module_params(
        lambda k: model.init(k, emb, taps, valid, method=Eagle3Model.init_all)["params"], key, init_scale, dtype)
