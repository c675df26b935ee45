"""The dense target family's model: a Qwen3 / Llama-3.x decoder in Flax Linen, used functionally.

``target_forward(cfg, params, tokens, positions, cache, tap_layer_ids=...)`` (the one place
that applies ``TargetModel``) returns ``(logits, taps, cache)``; the logits go through
``nn.head.lm_head``, the LM head the drafters share. Decoder layers are stacked with
``nn.scan`` (parameters carry a leading layer axis), which keeps compile time flat in depth
and lets the KV cache, stacked the same way, be updated in place. The same model also runs on
the split layout of :func:`split_layer_params` (``layers_0`` .. ``layers_{N-1}``, one call per
layer), which the CPU decode loop uses so that XLA reads each layer's weights in place.

Parameter tree (shapes; kernels are [in, out], the transpose of PyTorch's Linear weights):

  embed_tokens/embedding                      [V, D]
  layers/input_layernorm/weight               [N, D]
  layers/self_attn/{q,k,v}_proj/kernel        [N, D, H*Dh] / [N, D, Hkv*Dh]  (+ bias if attention_bias)
  layers/self_attn/o_proj/kernel              [N, H*Dh, D]
  layers/self_attn/{q,k}_norm/weight          [N, Dh]                        (Qwen3 only)
  layers/post_attention_layernorm/weight      [N, D]
  layers/mlp/{gate,up}_proj/kernel            [N, D, F];  layers/mlp/down_proj/kernel [N, F, D]
  norm/weight                                 [D]
  lm_head/kernel                              [D, V]                         (absent when tied)
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.config import TargetConfig
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn import MLP, RMSNorm, apply_rope, dot_product_attention, rope_cos_sin
from dflash_jax.nn.attention import BLOCK_ATTENTION, check_attention_impl
from dflash_jax.nn.head import LMHeadKernel, embed_rows, lm_head
from dflash_jax.nn.layers import out_projection, random_module_params
from dflash_jax.nn import tree_attention
from dflash_jax.nn.tree_attention import TreeAttention
from dflash_jax.quantization import dequantize_tree


class SelfAttention(nn.Module):
    """GQA self-attention over the layer's cache slots (or over the input alone, no cache)."""

    cfg: TargetConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None

    @nn.compact
    def __call__(self, x, cos, sin, positions, mask, cache: KVCache | None, layer, tree_visible=None):
        """``tree_visible``: bool[B, T, T] when the block is a tree (``nn.tree_attention``):
        the kernels then see the committed slots ``< positions[:, 0]`` and the block's own rows
        under that mask; the XLA path's ``mask`` already holds it."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dense = lambda n, name: nn.Dense(n, use_bias=cfg.attention_bias,
                                         param_dtype=self.param_dtype, name=name)
        q = dense(H * Dh, "q_proj")(x).reshape(B, T, H, Dh)
        k = dense(Hkv * Dh, "k_proj")(x).reshape(B, T, Hkv, Dh)
        v = dense(Hkv * Dh, "v_proj")(x).reshape(B, T, Hkv, Dh)
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="k_norm")(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        o_proj = out_projection(cfg.hidden_size, cfg.attention_bias, self.param_dtype,
                                self.model_axis, "o_proj")  # + psum under tensor parallelism
        if cache is not None:
            cache = cache.write(layer, k, v, positions)
            if self.attention_impl in BLOCK_ATTENTION:  # a kernel; positions: start + arange(T)
                out = kernel_attention(self.attention_impl, q, k, v, cache, positions, layer,
                                       tree_visible)
                return o_proj(out.reshape(B, T, H * Dh)), cache
            k, v = cache.k[layer], cache.v[layer]
        out = dot_product_attention(q, k, v, mask)
        return o_proj(out.reshape(B, T, H * Dh)), cache


class DecoderLayer(nn.Module):
    """Pre-norm block; scanned over layers. carry = (h, cache, taps, layer index)."""

    cfg: TargetConfig
    tap_layer_ids: tuple[int, ...] = ()
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None

    @nn.compact
    def __call__(self, carry, shared):
        h, cache, taps, layer = carry
        cos, sin, positions, mask, tree_visible = shared
        cfg = self.cfg
        attn_out, cache = SelfAttention(cfg, self.param_dtype, self.attention_impl, self.model_axis,
                                        name="self_attn")(
            RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="input_layernorm")(h),
            cos, sin, positions, mask, cache, layer, tree_visible)
        h = h + attn_out
        h = h + MLP(cfg.intermediate_size, self.param_dtype, self.model_axis, name="mlp")(
            RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="post_attention_layernorm")(h))
        if self.tap_layer_ids:
            hit = (jnp.asarray(self.tap_layer_ids) == layer)[:, None, None, None]
            taps = jnp.where(hit, h[None].astype(taps.dtype), taps)
        return (h, cache, taps, layer + 1), None


# the layer as the model applies it: a quantized layer's matrices dequantized inside the layer's
# own step (dflash_jax.quantization), one layer at a time; a float layer passes unchanged
_Layer = nn.map_variables(DecoderLayer, "params", trans_in_fn=dequantize_tree, init=True, mutable=True)


class TargetModel(nn.Module):
    """Decoder-only LM returning logits, tapped hidden states and the updated cache.

    ``tap_layer_ids`` are 0-based decoder-layer indices; the tap of layer i is exactly
    transformers' ``hidden_states[i + 1]`` (docs/method.md section 2): layer i's output, and for the
    last layer that output after the model's final norm (as transformers returns it).
    ``attention_impl``: "xla" (dense reference), "pallas" (``kernels.block_attention``) or
    "triton" (``kernels.triton_block_attention``) for attention through the cache; the
    cache-less path always uses XLA.

    ``model_axis``: inside ``shard_map`` with tensor parallelism, the mesh axis that heads, MLP
    width and vocabulary are split over; ``cfg`` is then the shard's config
    (``parallel.local_config``) and the logits are the shard's vocabulary slice.
    """

    cfg: TargetConfig
    tap_layer_ids: tuple[int, ...] = ()
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None
    split_layers: bool = False

    def setup(self):
        cfg = self.cfg
        check_attention_impl(self.attention_impl)
        for i in self.tap_layer_ids:
            if not 0 <= i < cfg.num_layers:
                raise ValueError(
                    f"tap layer id {i} is outside the target's decoder layers 0..{cfg.num_layers - 1}")
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.hidden_size,
                                     param_dtype=self.param_dtype, name="embed_tokens")
        layer_args = (cfg, tuple(self.tap_layer_ids), self.param_dtype, self.attention_impl,
                      self.model_axis)
        if self.split_layers:
            self.layer_list = [_Layer(*layer_args, name=f"{SPLIT_PREFIX}{i}")
                               for i in range(cfg.num_layers)]
        else:
            self.layers = nn.scan(
                _Layer, variable_axes={"params": 0}, split_rngs={"params": True},
                in_axes=nn.broadcast, length=cfg.num_layers,
            )(*layer_args, name="layers")
        self.norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="norm")
        if not cfg.tie_word_embeddings:
            self.lm_head = LMHeadKernel(cfg.hidden_size, cfg.vocab_size, self.param_dtype)

    def __call__(self, tokens: jax.Array, positions: jax.Array, cache: KVCache | None = None,
                 logit_index: jax.Array | None = None, compute_logits: bool = True,
                 tree: TreeAttention | None = None):
        """One forward pass.

        Args:
          tokens: int32[B, T].
          positions: int32[B, T] absolute positions (= cache slots); rows may differ.
          cache: optional KVCache; the block's K/V are written at ``positions`` and queries
            see cache slots ``<= position`` (causal by position). Without a cache, queries see
            the input rows at positions ``<=`` their own.
          logit_index: optional int32[B]: compute logits only at ``tokens[b, logit_index[b]]``
            (e.g. the last real prompt token at prefill); logits are then [B, 1, V].
          compute_logits: False skips the LM head (logits returned as None).
          tree: the block is a tree of drafts (``nn.tree_attention``): ``positions`` are then
            the nodes' cache slots, ``tree.positions`` their RoPE positions, and node t sees
            the committed slots and its ancestors' (``tree.visible``). Needs a cache.

        Returns:
          logits float32[B, T, V] (or [B, 1, V]), taps [B, T, k*D] in tap order (None when no
          taps are requested), and the cache with ``lengths = positions[:, -1] + 1``.
        """
        check_token_array(tokens, "tokens")
        check_token_array(positions, "positions")
        if positions.shape != tokens.shape:
            raise ValueError(f"positions shape {positions.shape} must equal tokens shape {tokens.shape}")
        cfg = self.cfg
        B, T = tokens.shape
        if self.model_axis is None:
            h = self.embed_tokens(tokens)
        else:
            h = embed_rows(self.embed_tokens.embedding, tokens, self.model_axis)
        if cache is not None and cache.batch != B:
            raise ValueError(f"cache batch {cache.batch} != tokens batch {B}")
        cos, sin, mask = rope_and_mask(cfg, positions, cache, tree)
        K = len(self.tap_layer_ids)
        taps = jnp.zeros((K, B, T, cfg.hidden_size), h.dtype) if K else None
        shared = (cos, sin, positions, mask, None if tree is None else tree.visible)
        if self.split_layers:  # one call per layer, its own weight buffers (see split_layer_params)
            carry = (h, cache, taps, 0)
            for layer in self.layer_list:
                carry, _ = layer(carry, shared)
            h, cache, taps, _ = carry
        else:
            (h, cache, taps, _), _ = self.layers((h, cache, taps, jnp.int32(0)), shared)
        if cache is not None:
            cache = cache.crop(positions[:, -1] + 1)
        taps = collect_taps(taps, lambda: self.norm(h), self.tap_layer_ids, cfg.num_layers)
        if not compute_logits:
            return None, taps, cache
        if logit_index is not None:
            h = jnp.take_along_axis(h, logit_index.astype(jnp.int32)[:, None, None], axis=1)
        head = ({"embed_tokens": {"embedding": self.embed_tokens.embedding}}
                if cfg.tie_word_embeddings else {"lm_head": {"kernel": self.lm_head()}})
        return lm_head(cfg, head, self.norm(h)), taps, cache


def rope_and_mask(cfg, positions, cache: KVCache | None, tree: TreeAttention | None = None):
    """(cos, sin, mask bool[B, T, S]) of a block at ``positions`` int32[B, T]: rotated at its
    positions and causal by position over the cache slots (``S = cache.max_len``), or over the
    block alone without a cache; a tree (``nn.tree_attention``) is rotated at
    ``tree.positions`` and sees its ancestors' slots."""
    if tree is None:
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope)
        if cache is None:
            return cos, sin, positions[:, None, :] <= positions[:, :, None]
        slots = jnp.arange(cache.max_len)
        return cos, sin, slots[None, None, :] <= positions[:, :, None]
    if cache is None:
        raise ValueError("a tree block is verified through a decode state (cache): pass one")
    tree.check(positions)
    cos, sin = rope_cos_sin(tree.positions, cfg.head_dim, cfg.rope)
    return cos, sin, tree_attention.cache_mask(positions, tree, cache.max_len)


def kernel_attention(impl: str, q, k, v, cache: KVCache, positions, layer, tree_visible=None):
    """Attention of a block (already written into ``cache`` at ``positions`` = start +
    arange(T)) through a kernel (``nn.attention.BLOCK_ATTENTION``): causal over the cache, or
    for a tree the committed slots ``< start`` plus the block's own rows ``k, v`` [B, T, Hkv,
    Dh] under ``tree_visible`` bool[B, T, T]."""
    if tree_visible is None:
        return BLOCK_ATTENTION[impl](q, cache.k, cache.v, positions[:, 0], causal=True, layer=layer)
    return BLOCK_ATTENTION[impl](q, cache.k, cache.v, positions[:, 0], causal=False, layer=layer,
                                 k_blk=k.astype(cache.k.dtype), v_blk=v.astype(cache.v.dtype),
                                 blk_mask=tree_visible)


def check_token_array(x, name: str) -> None:
    """Token and position arrays must be integer, rank 2 ([batch, time])."""
    if x.ndim != 2:
        raise ValueError(f"{name} must have rank 2 [batch, time], got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")


def collect_taps(taps, final_normed, tap_layer_ids, num_layers: int):
    """The taps a layer stack collected, ``[K, B, T, D]`` in tap order (or None), as a forward
    returns them: ``[B, T, K*D]``, the last layer's entry replaced by ``final_normed()`` (its
    output after the final norm: transformers' ``hidden_states[-1]``, which the reference, vLLM
    and SGLang feed to the drafter; docs/method.md section 2). ``final_normed`` is called only
    when the last layer is tapped."""
    if taps is None:
        return None
    last = num_layers - 1
    if last in tap_layer_ids:
        is_last = (jnp.asarray(tap_layer_ids) == last)[:, None, None, None]
        taps = jnp.where(is_last, final_normed()[None].astype(taps.dtype), taps)
    K, B, T, D = taps.shape
    return jnp.moveaxis(taps, 0, 2).reshape(B, T, K * D)


def check_forward_inputs(cfg, tokens, positions, tap_layer_ids) -> None:
    """What every target family's forward checks first: ``tokens`` and ``positions`` integer
    arrays [batch, time] of one shape, and every tap id a decoder layer of ``cfg``."""
    check_token_array(tokens, "tokens")
    check_token_array(positions, "positions")
    if positions.shape != tokens.shape:
        raise ValueError(f"positions shape {positions.shape} must equal tokens shape {tokens.shape}")
    for i in tap_layer_ids:
        if not 0 <= i < cfg.num_layers:
            raise ValueError(
                f"tap layer id {i} is outside the target's decoder layers 0..{cfg.num_layers - 1}")


def init_target_params(cfg: TargetConfig, key: jax.Array, dtype=jnp.float32,
                       init_scale: float = 0.02):
    """Random parameters (normal(init_scale) matrices, unit norms) in ``dtype``, built under jit
    so that large configs never materialise an fp32 copy."""
    model = TargetModel(cfg, param_dtype=dtype)
    tokens = jnp.zeros((1, 1), jnp.int32)

    return random_module_params(lambda k: model.init(k, tokens, tokens)["params"], key, init_scale, dtype)


SPLIT_PREFIX = "layers_"


def split_layer_params(params):
    """The target's parameters with the stacked ``layers`` tree ([N, ...] leaves) replaced by
    one tree per layer, ``layers_0`` .. ``layers_{N-1}`` (each its own buffers), the layout
    :func:`target_forward` runs as N separate layer calls instead of an ``nn.scan``.

    Why: inside a loop, XLA:CPU copies each layer's weight slice out of the stacked array before
    its matmuls (a ``dynamic-slice`` fusion per weight per step: read, write, read again), which
    made a memory-bound decode step of the embedded target about a fifth slower. The decoding
    engine splits once per ``decode`` call, outside its loop (:func:`engine.decode`)."""
    if "layers" not in params:
        return params
    out = {k: v for k, v in params.items() if k != "layers"}
    n = jax.tree_util.tree_leaves(params["layers"])[0].shape[0]
    for i in range(n):
        out[f"{SPLIT_PREFIX}{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], params["layers"])
    return out


def target_forward(cfg: TargetConfig, params, tokens, positions, cache=None, *,
                   tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits=True,
                   attention_impl: str = "xla", model_axis: str | None = None, tree=None):
    """Functional shorthand for ``TargetModel(cfg, taps).apply({"params": params}, ...)``;
    ``params`` stacked (``layers``) or split per layer (:func:`split_layer_params`)."""
    return TargetModel(cfg, tuple(tap_layer_ids), attention_impl=attention_impl,
                       model_axis=model_axis, split_layers="layers" not in params).apply(
        {"params": params}, tokens, positions, cache, logit_index, compute_logits, tree)
