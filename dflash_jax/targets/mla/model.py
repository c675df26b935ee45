"""The DeepSeek-V3 forward pass (``DeepseekV3ForCausalLM``; Kimi-K2.x is the same decoder):
multi-head latent attention (MLA) and DeepSeek's mixture of experts, applied functionally.

MLA, per layer (H heads; ``dn`` / ``dr`` the no-rope / rope query-key dims, ``dv`` the value
dim, ``r`` = ``kv_lora_rank``):

  q = q_b(norm(q_a(x)))  (or q_proj(x) without ``q_lora_rank``)   -> [H, dn + dr]
  [c_raw | k_rope] = kv_a_proj_with_mqa(x)                         -> r + dr, one "head"
  c = kv_a_layernorm(c_raw)                                        the latent, [r]
  k_nope_h = c W_uk[h], v_h = c W_uv[h]    (kv_b_proj = [W_uk | W_uv] per head)
  score_h(t, s) = (q_nope_h(t) . k_nope_h(s) + q_rope_h(t) . k_rope(s)) * scale

The decode state keeps what MLA is for: per token and layer the latent ``c`` and the rotated
``k_rope`` (``r + dr`` numbers, 576 for DeepSeek-V3), never the per-head keys and values. Two
forms compute the same attention (``docs/targets.md``):

  * ``absorbed`` (decode and verify; the default through a decode state): the query is
    multiplied into the latent space, ``q_lat_h = q_nope_h W_uk[h]^T`` [r], so the scores read the
    cached latents directly, and the output ``(sum_s p(s) c(s)) W_uv[h]`` is expanded once per
    query row, never per cached position;
  * ``expanded`` (transformers' form): every cached latent is expanded into the heads' keys and
    values first. Cheaper for a long prefill (no ``H x r`` query), and the parity oracle.

The latents are the ``KVCache``'s ``k`` ([layers, B, S, 1, r]) and the rope keys its ``v``
([layers, B, S, 1, dr]): rollback, trees (``compact``) and the slot layout are the dense
family's.

The q / kv latent norms use eps 1e-6 whatever ``rms_norm_eps`` is (transformers'
``DeepseekV3RMSNorm(rank)``). With ``rope_interleave`` (the released checkpoints) the rope dims
are stored as interleaved pairs; they are de-interleaved before the rotate-half RoPE (the same
rotation, transformers' ``apply_rotary_pos_emb_interleave``).

Parameter tree (kernels [in, out]; N layers, Nm MoE and Nd = N - Nm dense, each stack in layer
order; Fs = ``n_shared_experts * moe_intermediate_size``):

  embed_tokens/embedding                                   [V, D]
  layers/{input,post_attention}_layernorm/weight           [N, D]
  layers/self_attn/q_proj/kernel                           [N, D, H (dn + dr)]  (no q_lora_rank)
  layers/self_attn/q_a_proj/kernel, q_a_layernorm/weight   [N, D, rq], [N, rq]
  layers/self_attn/q_b_proj/kernel                         [N, rq, H (dn + dr)]
  layers/self_attn/kv_a_proj_with_mqa/kernel               [N, D, r + dr]
  layers/self_attn/kv_a_layernorm/weight                   [N, r]
  layers/self_attn/kv_b_proj/kernel                        [N, r, H (dn + dv)]
  layers/self_attn/o_proj/kernel                           [N, H dv, D]
  layers/mlp/{gate,up}_proj/kernel, down_proj/kernel       [Nd, D, F], [Nd, F, D]
  layers/moe/gate/kernel, gate/e_score_correction_bias     [Nm, D, E], [Nm, E]
  layers/moe/experts/{gate,up}_proj, down_proj             [Nm, E, D, Fm], [Nm, E, Fm, D]
  layers/moe/shared/{gate,up}_proj/kernel, down_proj/kernel [Nm, D, Fs], [Nm, Fs, D]
  norm/weight                                              [D]
  lm_head/kernel                                           [D, V]  (absent when tied)
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.nn import moe
from dflash_jax.nn.attention import check_attention_impl
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.layers import apply_rope
from dflash_jax.targets.moe.qwen3_moe_model import decoder_forward, split_layer_params
from dflash_jax.quantization import dequantize_tree

LATENT_NORM_EPS = 1e-6
"""eps of the q and kv latent norms (transformers' ``DeepseekV3RMSNorm(rank)`` default)."""

MLA_FORMS = ("absorbed", "expanded")

__all__ = ["target_forward", "mla_attention", "moe_block", "split_layer_params", "init_state"]


def rms_norm(w, x, eps: float):
    """``w * x / sqrt(mean(x^2) + eps)`` over the last axis, normalised in float32."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * xf.astype(x.dtype)


def deinterleave(x):
    """[..., d] stored as pairs (x0, x1), (x2, x3), ... -> [x0, x2, ... | x1, x3, ...]: the layout
    the rotate-half RoPE rotates pair by pair (``rope_interleave``)."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def init_state(cfg, batch: int, max_len: int, dtype) -> KVCache:
    """An empty MLA decode state: latents ``k`` [N, B, S, 1, r] and rope keys ``v`` [N, B, S, 1, dr]."""
    N, r, dr = cfg.num_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    return KVCache(k=jnp.zeros((N, batch, max_len, 1, r), dtype),
                   v=jnp.zeros((N, batch, max_len, 1, dr), dtype),
                   lengths=jnp.zeros((batch,), jnp.int32))


def mla_attention(cfg, p, x, cos, sin, positions, mask, cache: KVCache | None, layer,
                  form: str = "absorbed", model_axis: str | None = None):
    """One layer's MLA on x [B, T, D] (already normed) with its parameters ``p``
    (``self_attn``); ``mask`` bool[B, T, S] over the state's slots (or the block's rows without a
    state). Writes the block's latents and rope keys at ``positions`` and attends over the
    state. Returns (out [B, T, D], state).

    ``model_axis``: inside ``shard_map`` with the heads split over that axis (``cfg`` the shard's:
    H / m heads; the latent path, replicated, runs on every shard): one psum after o_proj."""
    B, T, _ = x.shape
    H, dn, dr, dv, r = (cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                        cfg.v_head_dim, cfg.kv_lora_rank)
    f32 = jnp.float32
    if "q_proj" in p:
        q = x @ p["q_proj"]["kernel"].astype(x.dtype)
    else:
        qa = rms_norm(p["q_a_layernorm"]["weight"], x @ p["q_a_proj"]["kernel"].astype(x.dtype),
                      LATENT_NORM_EPS)
        q = qa @ p["q_b_proj"]["kernel"].astype(x.dtype)
    q = q.reshape(B, T, H, dn + dr)
    q_nope, q_rope = q[..., :dn], q[..., dn:]
    kv = x @ p["kv_a_proj_with_mqa"]["kernel"].astype(x.dtype)
    c = rms_norm(p["kv_a_layernorm"]["weight"], kv[..., :r], LATENT_NORM_EPS)  # [B, T, r]
    k_rope = kv[..., r:][:, :, None, :]  # [B, T, 1, dr]
    if cfg.rope_interleave:
        q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
    q_rope, k_rope = apply_rope(q_rope, cos, sin), apply_rope(k_rope, cos, sin)
    if cache is not None:
        cache = cache.write(layer, c[:, :, None, :], k_rope, positions)
        c_all, kr_all = cache.k[layer][:, :, 0], cache.v[layer][:, :, 0]  # [B, S, r], [B, S, dr]
    else:
        c_all, kr_all = c, k_rope[:, :, 0]
    c_all, kr_all = c_all.astype(f32), kr_all.astype(f32)
    w_kv = p["kv_b_proj"]["kernel"].astype(f32).reshape(r, H, dn + dv)
    w_uk, w_uv = w_kv[..., :dn], w_kv[..., dn:]
    q_nope, q_rope = q_nope.astype(f32), q_rope.astype(f32)
    rope_scores = jnp.einsum("bthd,bsd->bhts", q_rope, kr_all)
    if form == "absorbed":
        q_lat = jnp.einsum("bthn,rhn->bthr", q_nope, w_uk)
        scores = jnp.einsum("bthr,bsr->bhts", q_lat, c_all) + rope_scores
    elif form == "expanded":
        k_nope = jnp.einsum("bsr,rhn->bshn", c_all, w_uk)
        scores = jnp.einsum("bthn,bshn->bhts", q_nope, k_nope) + rope_scores
    else:
        raise ValueError(f"mla form must be one of {MLA_FORMS}, not {form!r}")
    scores = jnp.where(mask[:, None], scores * cfg.attention_scale, -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    if form == "absorbed":
        out_lat = jnp.einsum("bhts,bsr->bthr", probs, c_all)
        out = jnp.einsum("bthr,rhv->bthv", out_lat, w_uv)
    else:
        v = jnp.einsum("bsr,rhv->bshv", c_all, w_uv)
        out = jnp.einsum("bhts,bshv->bthv", probs, v)
    out = out.reshape(B, T, H * dv).astype(x.dtype) @ p["o_proj"]["kernel"].astype(x.dtype)
    return (out if model_axis is None else jax.lax.psum(out, model_axis)), cache


def _swiglu_mlp(p, x):
    """``down(silu(gate(x)) * up(x))`` with kernels [in, out]."""
    h = jax.nn.silu(x @ p["gate_proj"]["kernel"].astype(x.dtype)) * (x @ p["up_proj"]["kernel"].astype(x.dtype))
    return h @ p["down_proj"]["kernel"].astype(x.dtype)


def route(cfg, p, x):
    """The router of one MoE layer on x [..., D]: ``(weights float32[..., k], ids int32[..., k])``
    (``nn.moe.route_sigmoid_group_topk``)."""
    lead = x.shape[:-1]
    logits = jnp.dot(x.reshape(-1, x.shape[-1]).astype(jnp.float32), p["gate"]["kernel"].astype(jnp.float32))
    w, ids = moe.route_sigmoid_group_topk(logits, p["gate"]["e_score_correction_bias"], cfg.num_experts_per_tok,
                                          cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
                                          cfg.routed_scaling_factor)
    k = cfg.num_experts_per_tok
    return w.reshape(*lead, k), ids.reshape(*lead, k)


def moe_block(cfg, p, x, *, impl: str = "auto", return_routing: bool = False,
              model_axis: str | None = None, expert_axis: str | None = None):
    """One MoE layer on x [..., D]: the routed experts (:func:`route`, ``nn.moe.moe_ffn``) plus
    the shared experts (one SwiGLU MLP of width ``n_shared_experts * moe_intermediate_size``).

    Under ``shard_map``: ``expert_axis`` splits the routed experts (local ids from
    ``axis_index * E_local``), ``model_axis`` every expert's and the shared experts' width. The
    shared experts' partial sum is added on expert shard 0 only, so ONE psum over both axes
    gives the layer's output (the shared experts counted once)."""
    weights, ids = route(cfg, p, x)
    e = p["experts"]
    offset = 0 if expert_axis is None else jax.lax.axis_index(expert_axis) * e["down_proj"].shape[0]
    y = moe.moe_ffn(x, weights, ids, gate=e["gate_proj"], up=e["up_proj"], down=e["down_proj"],
                    expert_offset=offset, impl=impl)
    shared = _swiglu_mlp(p["shared"], x).astype(y.dtype)
    if expert_axis is not None:
        shared = jnp.where(jax.lax.axis_index(expert_axis) == 0, shared, jnp.zeros_like(shared))
    y = y + shared
    axes = tuple(a for a in (expert_axis, model_axis) if a is not None)
    if axes:
        y = jax.lax.psum(y, axes)
    return (y, weights, ids) if return_routing else y


def _layer(cfg, lp, is_moe: bool, carry, shared, tap_layer_ids, mla_form, moe_impl, model_axis, expert_axis):
    """One decoder layer on carry = (h [B, T, D], state, taps, layer index)."""
    h, cache, taps, layer = carry
    lp = dequantize_tree(lp, h)  # a quantized layer's matrices, inside its own step (dflash_jax.quantization)
    cos, sin, positions, mask, _ = shared  # a tree's visibility is in the mask already
    a, cache = mla_attention(cfg, lp["self_attn"], rms_norm(lp["input_layernorm"]["weight"], h, cfg.rms_norm_eps),
                             cos, sin, positions, mask, cache, layer, mla_form, model_axis)
    h = h + a
    x = rms_norm(lp["post_attention_layernorm"]["weight"], h, cfg.rms_norm_eps)
    if is_moe:
        y = moe_block(cfg, lp["moe"], x, impl=moe_impl, model_axis=model_axis, expert_axis=expert_axis)
    else:
        y = _swiglu_mlp(lp["mlp"], x)
        y = y if model_axis is None else jax.lax.psum(y, model_axis)
    h = h + y.astype(h.dtype)
    if tap_layer_ids:
        hit = (jnp.asarray(tap_layer_ids) == layer)[:, None, None, None]
        taps = jnp.where(hit, h[None].astype(taps.dtype), taps)
    return h, cache, taps, layer + 1


def target_forward(cfg, params, tokens, positions, cache=None, *, tap_layer_ids: Sequence[int] = (),
                   logit_index=None, compute_logits=True, attention_impl: str = "xla",
                   mla_form: str | None = None, moe_impl: str = "auto", tree=None,
                   model_axis: str | None = None, expert_axis: str | None = None):
    """One causal pass (``TargetFamily.forward``): tokens, positions int32[B, T]; returns
    ``(logits float32[B, T, V] | [B, 1, V] | None, taps [B, T, k*D] | None, state)``; taps are
    transformers' ``hidden_states[i + 1]`` (the last layer's after the final norm).
    ``mla_form``: ``"absorbed"`` or ``"expanded"`` (module docstring); None: absorbed through a
    decode state, expanded without one. ``tree``: a tree block (``nn.tree_attention``).
    ``model_axis`` / ``expert_axis``: inside ``shard_map``, the mesh axes of tensor parallelism
    (heads, MLP widths, vocabulary; ``cfg`` the shard's) and of expert parallelism."""
    check_attention_impl(attention_impl)
    if attention_impl != "xla":
        raise ValueError(f"the {cfg.model_type} target runs MLA with attention_impl='xla' only "
                         f"(no MLA kernel yet), not {attention_impl!r}")
    form = mla_form or ("absorbed" if cache is not None else "expanded")
    if form not in MLA_FORMS:
        raise ValueError(f"mla_form must be one of {MLA_FORMS}, not {form!r}")
    opts = (tap_layer_ids, form, moe_impl, model_axis, expert_axis)
    return decoder_forward(cfg, params, tokens, positions, cache,
                           lambda p, is_moe, c, shared: _layer(cfg, p, is_moe, c, shared, *opts),
                           lambda x: rms_norm(params["norm"]["weight"], x, cfg.rms_norm_eps),
                           tap_layer_ids=tap_layer_ids, logit_index=logit_index,
                           compute_logits=compute_logits, model_axis=model_axis, tree=tree)


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN attention-scale term: ``0.1 * mscale * ln(factor) + 1`` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * float(np.log(factor)) + 1.0
