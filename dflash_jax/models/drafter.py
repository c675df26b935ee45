"""The DFlash drafter (SPEC.md section 3), in Flax Linen, used functionally.

One forward pass fills a block ``[anchor, MASK, ..., MASK]`` at positions ``start ..
start+T-1``. The target's tapped features are projected once per context position
(``c = hidden_norm(fc(taps))``) and injected into every layer's keys and values: layer j
projects the context rows ``c`` and its own normed block rows ``x`` with the SAME k/v
projections, and the block queries attend, non-causally, to every valid context row and every
block row. The per-layer K/V of context rows live in a KVCache (``lengths`` = number of valid
context positions); the block's own K/V are never stored.

Parameter tree (kernels [in, out]):

  fc/kernel                          [k*D, D]
  hidden_norm/weight                 [D]
  layers/...                         like the target's decoder layers, stacked on axis 0,
                                     with q_norm / k_norm (Qwen3 structure), no biases
  norm/weight                        [D]

The embedding and LM head are the target's (``models.target.embed`` / ``lm_head``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.config import DrafterConfig
from dflash_jax.models.cache import KVCache
from dflash_jax.nn import (MLP, RMSNorm, apply_rope, block_sparse_attention, rope_cos_sin,
                          segmented_attention)
from dflash_jax.nn.attention import BLOCK_ATTENTION, check_attention_impl
from dflash_jax.nn.layers import random_init


class DrafterAttention(nn.Module):
    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"

    @nn.compact
    def __call__(self, x, blk_rope, ctx, ctx_rope, ctx_pos, ctx_visible, cache: KVCache, layer,
                 train_blocks=None):
        cfg = self.cfg
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dense = lambda n, name: nn.Dense(n, use_bias=False, param_dtype=self.param_dtype, name=name)
        q_proj, k_proj = dense(H * Dh, "q_proj"), dense(Hkv * Dh, "k_proj")
        v_proj, o_proj = dense(Hkv * Dh, "v_proj"), dense(cfg.hidden_size, "o_proj")
        q_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="q_norm")
        k_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="k_norm")

        def keys_values(rows, rope):
            B, T, _ = rows.shape
            k = apply_rope(k_norm(k_proj(rows).reshape(B, T, Hkv, Dh)), *rope)
            return k, v_proj(rows).reshape(B, T, Hkv, Dh)

        if train_blocks is not None:  # training: all blocks of whole sequences, no cache
            anchors, valid = train_blocks
            B, NT, _ = x.shape
            N = anchors.shape[1]
            q = apply_rope(q_norm(q_proj(x).reshape(B, NT, H, Dh)), *blk_rope)
            kb, vb = keys_values(x, blk_rope)
            kc, vc = keys_values(ctx, ctx_rope)
            blocks = lambda a: a.reshape(B, N, NT // N, *a.shape[2:])
            out = block_sparse_attention(blocks(q), kc, vc, blocks(kb), blocks(vb), anchors, valid)
            return o_proj(out.reshape(B, NT, H * Dh)), cache
        if ctx is not None:  # project the new context rows into this layer's cache
            kc, vc = keys_values(ctx, ctx_rope)
            cache = cache.write(layer, kc, vc, ctx_pos)
        if x is None:
            return None, cache
        B, T, _ = x.shape
        q = apply_rope(q_norm(q_proj(x).reshape(B, T, H, Dh)), *blk_rope)
        kb, vb = keys_values(x, blk_rope)
        if self.attention_impl in BLOCK_ATTENTION:  # a kernel ("pallas" or "triton")
            out = BLOCK_ATTENTION[self.attention_impl](q, cache.k, cache.v, cache.lengths,
                                                       causal=False, layer=layer, k_blk=kb, v_blk=vb)
        else:
            out = segmented_attention(q, [(cache.k[layer], cache.v[layer], ctx_visible),
                                          (kb, vb, jnp.ones((1, 1, T), bool))])
        return o_proj(out.reshape(B, T, H * Dh)), cache


class DrafterLayer(nn.Module):
    """carry = (h or None, cache, layer index); shared = rope tables, context rows, masks."""

    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"

    @nn.compact
    def __call__(self, carry, shared):
        h, cache, layer = carry
        blk_rope, ctx, ctx_rope, ctx_pos, ctx_visible, train_blocks = shared
        cfg = self.cfg
        x = None if h is None else RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="input_layernorm")(h)
        attn_out, cache = DrafterAttention(cfg, self.param_dtype, self.attention_impl, name="self_attn")(
            x, blk_rope, ctx, ctx_rope, ctx_pos, ctx_visible, cache, layer, train_blocks)
        if h is not None:
            h = h + attn_out
            h = h + MLP(cfg.intermediate_size, self.param_dtype, name="mlp")(
                RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="post_attention_layernorm")(h))
        return (h, cache, layer + 1), None


class DrafterModel(nn.Module):
    """``attention_impl``: "xla", "pallas" or "triton" for the block attention over the context
    cache (training always uses the XLA block-sparse path)."""

    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"

    def setup(self):
        cfg = self.cfg
        check_attention_impl(self.attention_impl)
        self.fc = nn.Dense(cfg.hidden_size, use_bias=False, param_dtype=self.param_dtype, name="fc")
        self.hidden_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="hidden_norm")
        self.layers = nn.scan(DrafterLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                              in_axes=nn.broadcast, length=cfg.num_layers,
                              )(cfg, self.param_dtype, self.attention_impl, name="layers")
        self.norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="norm")

    def __call__(self, block_embeds, block_positions, cache: KVCache, ctx_taps=None,
                 ctx_positions=None, ctx_len=None):
        """Projects new context rows into the cache and/or drafts one block.

        Args:
          block_embeds: [B, T, D] target embeddings of ``[anchor, MASK, ...]`` (or of partly
            filled blocks when denoising in several steps); None = context update only.
          block_positions: int32[B, T] absolute positions of the block rows.
          cache: the drafter's context KVCache (k, v [n, B, S, Hkv, Dh]).
          ctx_taps: [B, C, k*D] target taps of new context rows (None: nothing new); rows at
            positions outside the cache (e.g. ``S``) are dropped.
          ctx_positions: int32[B, C] positions (= cache slots) of those rows.
          ctx_len: int32[B] number of valid context positions after this update (the block
            sees slots ``< ctx_len``); default: the cache's current lengths.

        Returns:
          (hidden [B, T, D] after the final norm, or None; cache with lengths = ctx_len).
        """
        cfg = self.cfg
        if ctx_taps is not None and ctx_taps.shape[-1] != cfg.num_taps * cfg.hidden_size:
            raise ValueError(f"ctx_taps last dim {ctx_taps.shape[-1]} != {cfg.num_taps} taps x "
                             f"hidden {cfg.hidden_size}")
        ctx_len = cache.lengths if ctx_len is None else ctx_len
        ctx = ctx_rope = None
        if ctx_taps is not None:
            ctx = self.hidden_norm(self.fc(ctx_taps))
            ctx_rope = rope_cos_sin(ctx_positions, cfg.head_dim, cfg.rope)
        blk_rope = visible = None
        if block_embeds is not None:
            blk_rope = rope_cos_sin(block_positions, cfg.head_dim, cfg.rope)
            visible = (jnp.arange(cache.max_len)[None, :] < ctx_len[:, None])[:, None, :]
        cache = cache.crop(ctx_len)  # writes ignore lengths; the Pallas path reads them
        (h, cache, _), _ = self.layers((block_embeds, cache, jnp.int32(0)),
                                       (blk_rope, ctx, ctx_rope, ctx_positions, visible, None))
        return (None if h is None else self.norm(h)), cache

    def train_blocks(self, block_embeds, block_positions, taps, anchors, valid):
        """All training blocks of whole sequences in one pass (SPEC section 5).

        Args:
          block_embeds: [B, N*bs, D] target embeddings of the N blocks ``[x_a, MASK, ...]``.
          block_positions: int32[B, N*bs] = ``a_j + k``.
          taps: [B, S, k*D] target features of every position of the clean sequences.
          anchors: int32[B, N] anchor positions; valid: bool[B, N] (False = padding block).
        Returns:
          hidden [B, N*bs, D] after the final norm.
        """
        cfg = self.cfg
        S = taps.shape[1]
        ctx = self.hidden_norm(self.fc(taps))
        ctx_rope = rope_cos_sin(jnp.broadcast_to(jnp.arange(S), taps.shape[:2]), cfg.head_dim, cfg.rope)
        blk_rope = rope_cos_sin(block_positions, cfg.head_dim, cfg.rope)
        (h, _, _), _ = self.layers((block_embeds, None, jnp.int32(0)),
                                   (blk_rope, ctx, ctx_rope, None, None, (anchors, valid)))
        return self.norm(h)


def init_drafter_params(cfg: DrafterConfig, key: jax.Array, dtype=jnp.float32,
                        init_scale: float = 0.02):
    """Random drafter parameters (normal(init_scale) kernels, unit norms), built under jit."""
    model = DrafterModel(cfg, param_dtype=dtype)
    B, T = 1, 2
    cache = KVCache.init(cfg.num_layers, B, 4, cfg.num_kv_heads, cfg.head_dim, dtype)
    emb = jnp.zeros((B, T, cfg.hidden_size), dtype)
    pos = jnp.zeros((B, T), jnp.int32)
    taps = jnp.zeros((B, T, cfg.num_taps * cfg.hidden_size), dtype)

    def init(k):
        params = model.init(k, emb, pos, cache, taps, pos, jnp.zeros((B,), jnp.int32))["params"]
        return random_init(params, k, init_scale, dtype)

    return jax.jit(init)(key)
