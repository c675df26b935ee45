"""The Qwen3-MoE forward pass (``Qwen3MoeForCausalLM``): Qwen3 attention (the dense family's
``SelfAttention``, q/k norms) and, per layer, either the routed-expert block or the dense SwiGLU
MLP (``mlp_only_layers``, ``decoder_sparse_step``), applied functionally.

Parameter tree (kernels [in, out], the transpose of PyTorch's Linear weights; N layers, of which
Nm are MoE layers and Nd = N - Nm dense ones, each stack in layer order):

  embed_tokens/embedding                      [V, D]
  layers/input_layernorm/weight               [N, D]
  layers/post_attention_layernorm/weight      [N, D]
  layers/self_attn/...                        [N, ...]   as the dense family (q/k norms)
  layers/mlp/{gate,up}_proj/kernel            [Nd, D, F];  layers/mlp/down_proj/kernel [Nd, F, D]
  layers/moe/gate/kernel                      [Nm, D, E]   the router
  layers/moe/experts/{gate,up}_proj           [Nm, E, D, Fm];  layers/moe/experts/down_proj [Nm, E, Fm, D]
  norm/weight                                 [D]
  lm_head/kernel                              [D, V]     (absent when tied)

The layers run as one ``lax.scan`` per run of consecutive layers of one kind (one scan when all
layers are MoE, as in the released models), or, on the split layout of
:func:`split_layer_params` (one tree per layer and block, what the CPU decode loop runs), as
one call per layer.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from dflash_jax.nn import MLP, RMSNorm, moe
from dflash_jax.nn.attention import check_attention_impl
from dflash_jax.nn.head import embed, lm_head
from dflash_jax.targets.dense.model import SelfAttention, check_forward_inputs, collect_taps, rope_and_mask
from dflash_jax.quantization import dequantize_tree

SPLIT_PREFIX = "layers_"
ATTENTION_KEYS = ("input_layernorm", "post_attention_layernorm", "self_attn")


def layer_runs(cfg) -> list[tuple[bool, int, int, int]]:
    """``(is_moe, first layer, end layer, index of the first layer in its kind's stack)`` of
    every maximal run of consecutive layers of one kind, in order."""
    runs: list[tuple[bool, int, int, int]] = []
    count = {True: 0, False: 0}
    for i in range(cfg.num_layers):
        kind = cfg.is_moe_layer(i)
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1], i + 1, runs[-1][3])
        else:
            runs.append((kind, i, i + 1, count[kind]))
        count[kind] += 1
    return runs


def moe_block(cfg, p, x: jax.Array, *, model_axis: str | None = None,
              expert_axis: str | None = None, impl: str = "auto", return_routing: bool = False):
    """One MoE layer's sparse block on x [..., D] with its parameters ``p`` (``gate/kernel``
    [D, E], ``experts/{gate,up}_proj`` [E_local, D, Fm], ``experts/down_proj`` [E_local, Fm, D]).

    Routing: softmax over all E experts (float32), top ``num_experts_per_tok``, renormalised
    when ``norm_topk_prob`` (``nn.moe.route_softmax_topk``). ``expert_axis``: inside
    ``shard_map`` with the experts split over that mesh axis, the local experts are
    ``[axis_index * E_local, ...)``; ``model_axis``: each expert's width Fm is split over it.
    The partial sums are combined by one ``psum`` over both. Returns y [..., D] (and, with
    ``return_routing``, ``weights float32[..., k]``, ``expert_ids int32[..., k]``)."""
    logits = jnp.dot(x, p["gate"]["kernel"].astype(x.dtype), preferred_element_type=jnp.float32)
    weights, ids = moe.route_softmax_topk(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
    e = p["experts"]
    offset = 0 if expert_axis is None else jax.lax.axis_index(expert_axis) * e["down_proj"].shape[0]
    y = moe.moe_ffn(x, weights, ids, gate=e["gate_proj"], up=e["up_proj"], down=e["down_proj"],
                    expert_offset=offset, impl=impl)
    axes = tuple(a for a in (expert_axis, model_axis) if a is not None)
    if axes:
        y = jax.lax.psum(y, axes)
    return (y, weights, ids) if return_routing else y


def _norm(cfg, w, x):
    return RMSNorm(cfg.rms_norm_eps).apply({"params": {"weight": w}}, x)


def _layer(cfg, lp, is_moe: bool, carry, shared, tap_layer_ids, attention_impl, model_axis,
           expert_axis, moe_impl):
    """One decoder layer on carry = (h [B, T, D], cache, taps, layer index)."""
    h, cache, taps, layer = carry
    lp = dequantize_tree(lp, h)  # a quantized layer's matrices, inside its own step (dflash_jax.quantization)
    cos, sin, positions, mask, tree_visible = shared
    attn = SelfAttention(cfg, attention_impl=attention_impl, model_axis=model_axis)
    a, cache = attn.apply({"params": lp["self_attn"]}, _norm(cfg, lp["input_layernorm"]["weight"], h),
                          cos, sin, positions, mask, cache, layer, tree_visible)
    h = h + a
    x = _norm(cfg, lp["post_attention_layernorm"]["weight"], h)
    if is_moe:
        y = moe_block(cfg, lp["moe"], x, model_axis=model_axis, expert_axis=expert_axis,
                      impl=moe_impl)
    else:
        y = MLP(cfg.intermediate_size, axis_name=model_axis).apply({"params": lp["mlp"]}, x)
    h = h + y.astype(h.dtype)
    if tap_layer_ids:
        hit = (jnp.asarray(tap_layer_ids) == layer)[:, None, None, None]
        taps = jnp.where(hit, h[None].astype(taps.dtype), taps)
    return h, cache, taps, layer + 1


def _run_params(layers, is_moe: bool, first: int, end: int, sub: int):
    """The stacked parameters of layers ``first .. end - 1`` (all of one kind)."""
    n = end - first
    take = lambda tree, lo: jax.tree_util.tree_map(lambda x: x if (lo == 0 and x.shape[0] == n)
                                                   else x[lo:lo + n], tree)
    lp = {k: take(layers[k], first) for k in ATTENTION_KEYS}
    kind = "moe" if is_moe else "mlp"
    lp[kind] = take(layers[kind], sub)
    return lp


def split_layer_params(params):
    """``params`` with the stacked ``layers`` replaced by one tree per layer and block, the
    layout the CPU decode loop runs (``dense.model.split_layer_params`` says why):
    ``layers_{i}`` (layer i's attention and norms), ``moe_{m}`` (the m-th MoE block) and
    ``mlp_{j}`` (the j-th dense MLP)."""
    if "layers" not in params:
        return params
    out = {k: v for k, v in params.items() if k != "layers"}
    layers = params["layers"]
    n = layers["input_layernorm"]["weight"].shape[0]
    for i in range(n):
        out[f"{SPLIT_PREFIX}{i}"] = {k: jax.tree_util.tree_map(lambda x, i=i: x[i], layers[k])
                                     for k in ATTENTION_KEYS}
    for kind in ("moe", "mlp"):
        if kind in layers:
            count = jax.tree_util.tree_leaves(layers[kind])[0].shape[0]
            for j in range(count):
                out[f"{kind}_{j}"] = jax.tree_util.tree_map(lambda x, j=j: x[j], layers[kind])
    return out


def run_layers(cfg, params, carry, layer):
    """``carry`` through every decoder layer, ``layer(layer_params, is_moe, carry) -> carry``:
    on the stacked layout one ``lax.scan`` per run of consecutive layers of one kind
    (:func:`layer_runs`), on the split one (:func:`split_layer_params`) one call per layer. The
    layer parameters are its attention and norms (``ATTENTION_KEYS``) and its ``moe`` or ``mlp``
    block; other stacks under ``layers`` are not passed."""
    if "layers" in params:
        for is_moe, first, end, sub in layer_runs(cfg):
            lp = _run_params(params["layers"], is_moe, first, end, sub)
            carry, _ = jax.lax.scan(lambda c, p, is_moe=is_moe: (layer(p, is_moe, c), None), carry, lp)
        return carry
    for i in range(cfg.num_layers):
        carry = layer(_split_layer(params, cfg, i), cfg.is_moe_layer(i), carry)
    return carry


def _split_layer(params, cfg, i: int):
    """Layer i's tree from the split layout (its attention and its block)."""
    is_moe = cfg.is_moe_layer(i)
    stack = cfg.moe_layers if is_moe else cfg.dense_layers
    kind = "moe" if is_moe else "mlp"
    return {**params[f"{SPLIT_PREFIX}{i}"], kind: params[f"{kind}_{stack.index(i)}"]}


def target_forward(cfg, params, tokens, positions, cache=None, *,
                   tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits=True,
                   attention_impl: str = "xla", model_axis: str | None = None,
                   expert_axis: str | None = None, moe_impl: str = "auto", tree=None):
    """One causal pass (``TargetFamily.forward``): tokens, positions int32[B, T]; returns
    ``(logits float32[B, T, V] | [B, 1, V] | None, taps [B, T, k*D] | None, cache)``; taps are
    transformers' ``hidden_states[i + 1]`` (the last layer's after the final norm).
    ``moe_impl``: ``nn.moe.moe_ffn``'s ``impl`` ("auto": gathered active experts for few rows,
    the grouped matmul otherwise); ``tree``: a tree block (``nn.tree_attention``, as the
    dense family's)."""
    check_attention_impl(attention_impl)
    opts = (tap_layer_ids, attention_impl, model_axis, expert_axis, moe_impl)
    return decoder_forward(cfg, params, tokens, positions, cache,
                           lambda p, is_moe, c, shared: _layer(cfg, p, is_moe, c, shared, *opts),
                           lambda x: _norm(cfg, params["norm"]["weight"], x),
                           tap_layer_ids=tap_layer_ids, logit_index=logit_index,
                           compute_logits=compute_logits, model_axis=model_axis, tree=tree)


def decoder_forward(cfg, params, tokens, positions, cache, layer, final_norm, *,
                    tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits=True,
                    model_axis: str | None = None, tree=None):
    """The pass the families whose layers are attention plus a dense or MoE block share
    (``qwen3_moe``, the latent-attention ``targets.mla``), around their own layer:
    ``layer(layer_params, is_moe, carry, shared) -> carry`` with carry = (h [B, T, D], cache,
    taps, layer index) and shared = (cos, sin, positions, mask bool[B, T, S], the tree's visible
    mask or None), run by :func:`run_layers`; ``final_norm(h)`` the model's last norm. The
    inputs are checked, the embedding looked up (split over ``model_axis``), RoPE and the causal
    (or tree) mask built once, the taps collected (the last layer's after the final norm) and the
    logits taken at ``logit_index`` (or every row). Returns ``(logits | None, taps | None, cache)``
    as ``TargetFamily.forward``."""
    tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
    check_forward_inputs(cfg, tokens, positions, tap_layer_ids)
    B, T = tokens.shape
    h = embed(params, tokens, model_axis)
    if cache is not None and cache.batch != B:
        raise ValueError(f"cache batch {cache.batch} != tokens batch {B}")
    cos, sin, mask = rope_and_mask(cfg, positions, cache, tree)
    K = len(tap_layer_ids)
    taps = jnp.zeros((K, B, T, cfg.hidden_size), h.dtype) if K else None
    shared = (cos, sin, positions, mask, None if tree is None else tree.visible)
    h, cache, taps, _ = run_layers(cfg, params, (h, cache, taps, jnp.int32(0)),
                                   lambda p, is_moe, c: layer(p, is_moe, c, shared))
    if cache is not None:
        cache = cache.crop(positions[:, -1] + 1)
    taps = collect_taps(taps, lambda: final_norm(h), tap_layer_ids, cfg.num_layers)
    if not compute_logits:
        return None, taps, cache
    if logit_index is not None:
        h = jnp.take_along_axis(h, logit_index.astype(jnp.int32)[:, None, None], axis=1)
    return lm_head(cfg, params, final_norm(h)), taps, cache
