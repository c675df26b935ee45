"""The Gemma 4 forward pass (transformers' ``Gemma4ForCausalLM``, and the text model of
``Gemma4ForConditionalGeneration``), applied functionally (``docs/targets.md``, Gemma 4).

A layer (``lp`` = ``params["layers_{i}"]``; every norm is ``x / rms(x) * w`` in float32, w as
stored, no ``1 + w``):

  attention   q = q_norm(x q_proj), k = k_norm(x k_proj), v = v_norm(x v_proj) (v_norm has no
              weight; with ``attention_k_eq_v`` a full layer has no v_proj and v is the k
              projection before k_norm), RoPE on q and k (its own per layer type), softmax scale
              1, a sliding layer sees the last ``sliding_window`` positions (``kv > q - W``);
              the output o_proj'd and normed (``post_attention_layernorm``) before the residual
  MLP         ``down(gelu_tanh(gate(x)) * up(x))`` between ``pre_feedforward_layernorm`` and
              ``post_feedforward_layernorm``; width 2F on KV-shared layers with
              ``use_double_wide_mlp``
  MoE         (``enable_moe_block``) beside the MLP: the MLP's output normed
              (``post_feedforward_layernorm_1``) plus the routed experts' on
              ``pre_feedforward_layernorm_2(residual)`` normed (``_2``), both before
              ``post_feedforward_layernorm``. Router: ``norm(residual) * scale * D^-0.5 @ W``,
              softmax over all experts, top k renormalised, times ``per_expert_scale[e]``
  per-layer input  (``hidden_size_per_layer_input`` = P > 0) after the MLP:
              ``h + post_norm(proj(gelu_tanh(gate(h)) * e_i))`` with e_i the layer's slice of
              ``(norm(x0 W_ple / sqrt(D)) + sqrt(P) E_ple[token]) / sqrt(2)``
  then        h times the layer's ``layer_scalar``

The embedding is scaled by ``sqrt(D)`` (cast to the table's dtype first, as transformers does),
and the logits are soft-capped, ``c tanh(l / c)`` with ``c`` = ``final_logit_softcapping``.
``embed`` and ``lm_head`` of the family are the raw table and head, what drafters read (the
reference scales a drafter's block embedding and caps its logits by the drafter's own fields).

KV-shared layers (the last ``num_kv_shared_layers``) have no K/V of their own: they attend over
the cache of the last earlier layer of their type that has one. The decode state
(:class:`Gemma4State`) holds one ``KVCache`` per layer type, with a layer for each layer of that
type that has its own K/V (full-length caches: a sliding layer reads only its window of it).

Parameters: one tree per layer, ``layers_{i}`` (layers differ in shape: sliding and full
attention have their own head dims and KV heads, KV-shared layers have no K/V projections), plus
``embed_tokens/embedding`` [V, D], ``norm/weight`` [D], ``lm_head/kernel`` [D, V] when untied,
and with per-layer inputs ``embed_tokens_per_layer/embedding`` [Vp, N P],
``per_layer_model_projection/kernel`` [D, N P], ``per_layer_projection_norm/weight`` [P].
The layers run as one unrolled sequence of calls.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.nn import moe, tree_attention
from dflash_jax.nn.attention import causal_mask, dot_product_attention
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.head import embed, embed_rows, lm_head
from dflash_jax.nn.layers import apply_rope
from dflash_jax.targets.dense.model import check_forward_inputs, collect_taps
from dflash_jax.quantization import dequantize_tree

SLIDING, FULL = "sliding_attention", "full_attention"


# ---------------------------------------------------------------------------- the decode state
@flax.struct.dataclass
class Gemma4State:
    """Gemma 4's decode state: ``sliding`` (KVCache [Ls, B, S, Hkv, Dh]) and ``full`` (KVCache
    [Lf, B, S, Hkv_full, Dh_full]), a layer each for the sliding and full layers that have K/V
    of their own; ``lengths`` int32[B] the positions held (the two caches agree)."""

    sliding: KVCache
    full: KVCache

    @property
    def lengths(self) -> jax.Array:
        return self.sliding.lengths

    @property
    def batch(self) -> int:
        return self.sliding.batch

    @property
    def max_len(self) -> int:
        return self.sliding.max_len

    def crop(self, lengths) -> "Gemma4State":
        return self.replace(sliding=self.sliding.crop(lengths), full=self.full.crop(lengths))

    def rollback(self, lengths) -> "Gemma4State":
        return self.crop(lengths)

    def compact(self, start, source) -> "Gemma4State":
        """The accepted tree path's K/V moved to contiguous slots in both caches
        (``KVCache.compact``)."""
        return self.replace(sliding=self.sliding.compact(start, source), full=self.full.compact(start, source))

    def cache(self, kind: str) -> KVCache:
        return self.sliding if kind == SLIDING else self.full

    def with_cache(self, kind: str, cache: KVCache) -> "Gemma4State":
        return self.replace(sliding=cache) if kind == SLIDING else self.replace(full=cache)


def init_state(cfg, batch: int, max_len: int, dtype) -> Gemma4State:
    """An empty state (lengths 0) for ``batch`` rows of up to ``max_len`` positions."""
    n_sliding = sum(1 for i in cfg.kv_layers if cfg.layer_types[i] == SLIDING)
    n_full = len(cfg.kv_layers) - n_sliding
    return Gemma4State(
        sliding=KVCache.init(n_sliding, batch, max_len, cfg.num_kv_heads, cfg.head_dim, dtype),
        full=KVCache.init(n_full, batch, max_len, cfg.full_kv_heads, cfg.full_head_dim, dtype))


# ---------------------------------------------------------------------------- building blocks
def rms_norm(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps)`` over the last axis in float32, times ``w`` (None: no
    weight, the v norm and the router's norm), in x's dtype (transformers' ``Gemma4RMSNorm``)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(jnp.float32)
    return y.astype(x.dtype)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU with the tanh approximation (transformers' ``gelu_pytorch_tanh``)."""
    return jax.nn.gelu(x, approximate=True)


def rope_inv_freq(head_dim: int, rope_type: str, theta: float, partial: float = 1.0,
                  factor: float = 1.0) -> np.ndarray:
    """float32[head_dim // 2] inverse frequencies of one layer type: ``"default"`` (every pair
    rotates, ``theta ** (-2i / head_dim)``) or ``"proportional"`` (the first ``int(partial *
    head_dim // 2)`` pairs rotate at the frequencies of the whole head dim, the others not at all,
    all divided by ``factor``; transformers' ``_compute_proportional_rope_parameters``)."""
    if rope_type == "default":
        return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)).astype(np.float32)
    angles = int(partial * head_dim // 2)
    rotated = 1.0 / theta ** (np.arange(0, 2 * angles, 2, dtype=np.float32) / head_dim)
    inv = np.concatenate([rotated, np.zeros(head_dim // 2 - angles, np.float32)])
    return (inv / factor).astype(np.float32)


def cos_sin(positions: jax.Array, inv_freq: np.ndarray):
    """cos, sin float32[..., 2 len(inv_freq)] of integer positions (halves repeated)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _mm(x, p):
    return jnp.dot(x, p["kernel"].astype(x.dtype))


def _mlp(p, x):
    return _mm(gelu_tanh(_mm(x, p["gate_proj"])) * _mm(x, p["up_proj"]), p["down_proj"])


def _psum(y, axes):
    axes = tuple(a for a in axes if a is not None)
    return jax.lax.psum(y, axes) if axes else y


# ---------------------------------------------------------------------------- the MoE block
def route(cfg, p, x: jax.Array):
    """Gemma 4's router on x [..., D] (the layer's residual stream): ``(weights float32[..., k],
    expert ids int32[..., k])``."""
    lead = x.shape[:-1]
    h = rms_norm(x.reshape(-1, x.shape[-1]), None, cfg.rms_norm_eps)
    h = h * p["scale"].astype(h.dtype) * jnp.asarray(cfg.hidden_size ** -0.5, h.dtype)
    logits = jnp.dot(h, p["proj"]["kernel"].astype(h.dtype), preferred_element_type=jnp.float32)
    w, ids = moe.route_softmax_topk(logits, cfg.top_k_experts, normalize=True)
    w = w * jnp.take(p["per_expert_scale"].astype(jnp.float32), ids)
    k = cfg.top_k_experts
    return w.reshape(*lead, k), ids.reshape(*lead, k)


def experts(cfg, lp, residual: jax.Array, *, model_axis=None, expert_axis=None, impl: str = "auto"):
    """The routed experts of one layer on its residual stream [B, T, D]: routed on the residual,
    run on ``pre_feedforward_layernorm_2(residual)``; the partial sums over ``expert_axis`` /
    ``model_axis`` summed (one psum)."""
    weights, ids = route(cfg, lp["router"], residual)
    x = rms_norm(residual, lp["pre_feedforward_layernorm_2"]["weight"], cfg.rms_norm_eps)
    e = lp["experts"]
    offset = 0 if expert_axis is None else jax.lax.axis_index(expert_axis) * e["down_proj"].shape[0]
    y = moe.moe_ffn(x, weights, ids, gate=e["gate_proj"], up=e["up_proj"], down=e["down_proj"],
                    activation=lambda h: gelu_tanh(h[..., :h.shape[-1] // 2]) * h[..., h.shape[-1] // 2:],
                    expert_offset=offset, impl=impl)
    return _psum(y, (expert_axis, model_axis))


# ---------------------------------------------------------------------------- the forward pass
def per_layer_inputs(cfg, params, tokens, h0, model_axis=None):
    """The per-layer inputs [B, T, N, P] of tokens int32[B, T] whose scaled embedding is h0."""
    N, P = cfg.num_layers, cfg.hidden_size_per_layer_input
    table = params["embed_tokens_per_layer"]["embedding"]
    ids = jnp.take(table, tokens, axis=0) if model_axis is None else embed_rows(table, tokens, model_axis)
    ids = ids * jnp.asarray(P ** 0.5, table.dtype).astype(ids.dtype)
    proj = _mm(h0, params["per_layer_model_projection"]) * jnp.asarray(cfg.hidden_size ** -0.5, h0.dtype)
    proj = rms_norm(proj.reshape(*h0.shape[:-1], N, P), params["per_layer_projection_norm"]["weight"],
                    cfg.rms_norm_eps)
    return (proj + ids.reshape(proj.shape).astype(proj.dtype)) * jnp.asarray(2.0 ** -0.5, proj.dtype)


def _attention(cfg, i: int, p, x, rope, masks, positions, state, block_kv, model_axis):
    """Layer i's attention on x [B, T, D] (normed). ``state``: the decode state or None (then
    ``block_kv`` holds the block's K/V of the layers others share). Returns (out, state)."""
    kind = cfg.layer_types[i]
    B, T, _ = x.shape
    Dh = cfg.layer_head_dim(i)
    cos, sin = rope[kind]
    q = rms_norm(_mm(x, p["q_proj"]).reshape(B, T, -1, Dh), p["q_norm"]["weight"], cfg.rms_norm_eps)
    q = apply_rope(q, cos, sin)
    source = cfg.kv_source(i)
    if source == i:
        k_raw = _mm(x, p["k_proj"]).reshape(B, T, -1, Dh)
        v = k_raw if "v_proj" not in p else _mm(x, p["v_proj"]).reshape(B, T, -1, Dh)
        k = apply_rope(rms_norm(k_raw, p["k_norm"]["weight"], cfg.rms_norm_eps), cos, sin)
        v = rms_norm(v, None, cfg.rms_norm_eps)
        if state is not None:
            slot = cfg.kv_slot(i)
            cache = state.cache(kind).write(slot, k, v, positions)
            state = state.with_cache(kind, cache)
        elif i in cfg.kv_producers:
            block_kv[i] = (k, v)
    if state is not None:
        cache = state.cache(kind)
        slot = cfg.kv_slot(source)
        k, v = cache.k[slot], cache.v[slot]
    elif source != i:
        k, v = block_kv[source]
    out = dot_product_attention(q, k, v, masks[kind], scale=1.0).reshape(B, T, -1)
    return _psum(_mm(out, p["o_proj"]), (model_axis,)), state


def _layer(cfg, i: int, lp, h, ple, rope, masks, positions, state, block_kv, model_axis, expert_axis, moe_impl):
    lp = dequantize_tree(lp, h)  # a quantized layer's matrices, inside its own step (dflash_jax.quantization)
    eps = cfg.rms_norm_eps
    a, state = _attention(cfg, i, lp["self_attn"], rms_norm(h, lp["input_layernorm"]["weight"], eps),
                          rope, masks, positions, state, block_kv, model_axis)
    h = h + rms_norm(a, lp["post_attention_layernorm"]["weight"], eps)
    residual = h
    y = _psum(_mlp(lp["mlp"], rms_norm(h, lp["pre_feedforward_layernorm"]["weight"], eps)), (model_axis,))
    if cfg.enable_moe_block:
        y = rms_norm(y, lp["post_feedforward_layernorm_1"]["weight"], eps)
        y2 = experts(cfg, lp, residual, model_axis=model_axis, expert_axis=expert_axis, impl=moe_impl)
        y = y + rms_norm(y2, lp["post_feedforward_layernorm_2"]["weight"], eps)
    h = residual + rms_norm(y, lp["post_feedforward_layernorm"]["weight"], eps)
    if ple is not None:
        g = gelu_tanh(_mm(h, lp["per_layer_input_gate"])) * ple[:, :, i].astype(h.dtype)
        h = h + rms_norm(_mm(g, lp["per_layer_projection"]), lp["post_per_layer_input_norm"]["weight"], eps)
    return h * lp["layer_scalar"]["weight"].astype(h.dtype), state


def target_forward(cfg, params, tokens, positions, state: Gemma4State | None = None, *,
                   tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits=True,
                   attention_impl: str = "xla", model_axis: str | None = None,
                   expert_axis: str | None = None, moe_impl: str = "auto", tree=None):
    """One causal pass (``TargetFamily.forward``): tokens, positions int32[B, T]; returns
    ``(logits float32[B, T, V] | [B, 1, V] | None, taps [B, T, k*D] | None, state)``; taps are
    transformers' ``hidden_states[i + 1]`` (the last layer's after the final norm), logits
    soft-capped. ``tree``: a tree block (``nn.tree_attention``), rotated at its RoPE positions,
    a sliding layer's window measured in them."""
    if attention_impl != "xla":
        raise ValueError(f"the gemma4 target runs attention_impl='xla' only (got {attention_impl!r}): "
                         "the block-attention kernels implement neither sliding windows nor "
                         "per-layer head dims")
    tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
    check_forward_inputs(cfg, tokens, positions, tap_layer_ids)
    B, T = tokens.shape
    if state is not None and state.batch != B:
        raise ValueError(f"state batch {state.batch} != tokens batch {B}")
    raw = embed(params, tokens, model_axis)
    h = raw * jnp.asarray(cfg.hidden_size ** 0.5, raw.dtype)
    ple = per_layer_inputs(cfg, params, tokens, h, model_axis) if cfg.hidden_size_per_layer_input else None
    rope_pos = positions if tree is None else tree.positions
    rope = {kind: cos_sin(rope_pos, cfg.inv_freq(kind)) for kind in set(cfg.layer_types)}
    if tree is None:
        keys = jnp.arange(state.max_len) if state is not None else positions
        full = causal_mask(positions, keys)
        sliding = causal_mask(positions, keys, cfg.sliding_window) if SLIDING in cfg.layer_types else full
    else:
        if state is None:
            raise ValueError("a tree block is verified through a decode state: pass one")
        tree.check(positions)
        full = tree_attention.cache_mask(positions, tree, state.max_len)
        keys = tree_attention.slot_positions(positions, tree, state.max_len)
        sliding = full & (keys[:, None, :] > tree.positions[:, :, None] - cfg.sliding_window)
    masks = {FULL: full, SLIDING: sliding}
    taps = {}
    block_kv: dict = {}
    for i in range(cfg.num_layers):
        h, state = _layer(cfg, i, params[f"layers_{i}"], h, ple, rope, masks, positions, state, block_kv,
                          model_axis, expert_axis, moe_impl)
        if i in tap_layer_ids:
            taps[i] = h
    if state is not None:
        state = state.crop(positions[:, -1] + 1)
    final = lambda x: rms_norm(x, params["norm"]["weight"], cfg.rms_norm_eps)
    if tap_layer_ids:
        stacked = jnp.stack([taps[i] for i in tap_layer_ids])
        taps = collect_taps(stacked, lambda: final(h), tap_layer_ids, cfg.num_layers)
    else:
        taps = None
    if not compute_logits:
        return None, taps, state
    if logit_index is not None:
        h = jnp.take_along_axis(h, logit_index.astype(jnp.int32)[:, None, None], axis=1)
    return softcap(lm_head(cfg, params, final(h)), cfg.final_logit_softcapping), taps, state


def softcap(logits: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(logits / cap)`` (None or 0: the logits as they are)."""
    if not cap:
        return logits
    return jnp.tanh(logits / cap) * cap
