"""The gpt-oss target family (gpt-oss-20b / 120b; transformers' ``GptOssForCausalLM``,
``model_type`` ``gpt_oss``).

A pre-norm decoder whose layers are GQA attention + a mixture of experts
(``docs/targets.md``, section gpt-oss):

  attention   q/k/v/o projections with biases; YaRN RoPE (``RopeConfig`` rope type "yarn",
              cos/sin times its attention scaling); one learned sink logit per query head, an
              extra softmax column with no value (``nn.attention.segmented_attention``'s
              ``sinks``); layers alternate per ``layer_types`` between a sliding window
              (a query at position p sees keys at p - W + 1 .. p, W = ``sliding_window``, as
              transformers 5's mask ``kv > q - W``) and full causal attention.
  experts     router ``x @ W_r + b_r`` over E experts; the top k logits, softmaxed over those k
              (``nn.moe.route_topk_softmax``); expert e: ``h = x @ gate_up_e + b_e`` [2F] with
              gate = ``h[0::2]`` and up = ``h[1::2]`` (interleaved), gate clamped to <= limit,
              up to [-limit, limit], ``(up + 1) * gate * sigmoid(alpha * gate)`` [F], then
              ``@ down_e + b'_e`` (``nn.moe.moe_ffn`` with :func:`gpt_oss_glu`).

Parameter tree (kernels [in, out]; ``layers/`` leaves carry a leading layer axis N):

  embed_tokens/embedding                      [V, D]
  layers/input_layernorm/weight               [N, D]
  layers/self_attn/{q,k,v}_proj/{kernel,bias} [N, D, H*Dh] / [N, D, Hkv*Dh]  (+ [N, width])
  layers/self_attn/o_proj/{kernel,bias}       [N, H*Dh, D], [N, D]
  layers/self_attn/sinks                      [N, H]
  layers/post_attention_layernorm/weight      [N, D]
  layers/mlp/router/{kernel,bias}             [N, D, E], [N, E]
  layers/mlp/experts/gate_up_proj             [N, E, D, 2F]   (gate / up columns interleaved)
  layers/mlp/experts/gate_up_proj_bias        [N, E, 2F]
  layers/mlp/experts/down_proj                [N, E, F, D]
  layers/mlp/experts/down_proj_bias           [N, E, D]
  norm/weight                                 [D]
  lm_head/kernel                              [D, V]         (absent when tied)

Checkpoints: the dequantized layout transformers' ``save_pretrained`` writes (the experts as
``model.layers.{i}.mlp.experts.gate_up_proj`` [E, D, 2F] etc., already [in, out]) and the
released MXFP4 layout (``..._blocks`` / ``..._scales`` for ``gate_up_proj`` and ``down_proj``,
dequantized on load by :mod:`dflash_jax.targets.moe.mxfp4`). ``Target.save`` writes the
dequantized layout.

The decode state is a ``KVCache`` of every layer at full length (a sliding layer reads only
its window of it; rollback sets the lengths, so a verify block's rows each see exactly their
own window, whatever was rejected before).
"""

from __future__ import annotations

import dataclasses
import json
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp

from dflash_jax import sizes
from dflash_jax.checkpoints import CheckpointError, TensorSpec
from dflash_jax.config import (TargetConfig, decoder_fields_from_hf, decoder_fields_to_hf,
                               has_rope_theta, refuse, unsupported_decoder_features)
from dflash_jax.nn import moe, partitioning
from dflash_jax.nn.attention import causal_mask, dot_product_attention
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.head import embed as embed_tokens, lm_head
from dflash_jax.nn.layers import apply_rope, random_params_of_shapes, rope_cos_sin
from dflash_jax.nn import tree_attention
from dflash_jax.parallel import experts as experts_mesh
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.dense.model import check_forward_inputs, collect_taps
from dflash_jax.targets.moe import mxfp4
from dflash_jax.quantization import dequantize_tree

MODEL_TYPE = "gpt_oss"
ARCHITECTURE = "GptOssForCausalLM"
SLIDING, FULL = "sliding_attention", "full_attention"

DEFAULTS = dict(num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                max_position_embeddings=131072, sliding_window=128, attention_bias=True,
                swiglu_alpha=1.702, swiglu_limit=7.0)
"""transformers' ``GptOssConfig`` defaults for the fields a config.json may leave out."""
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
"""``GptOssConfig``'s RoPE when a config.json has neither ``rope_parameters`` nor
``rope_scaling`` (its theta: :data:`DEFAULT_THETA`)."""
DEFAULT_THETA = 150000.0


# ---------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class GptOssConfig(TargetConfig):
    """A gpt-oss target: :class:`~dflash_jax.config.TargetConfig` (``intermediate_size`` = F,
    one expert's width) plus ``num_experts`` = E, ``num_experts_per_tok`` = k,
    ``sliding_window`` = W, ``layer_types`` (one of ``"sliding_attention"`` /
    ``"full_attention"`` per layer), the experts' ``swiglu_alpha`` and ``swiglu_limit``, and
    ``pad_token_id`` (kept for config.json). ``expert_shards``: 1, or the number of shards the
    experts are split over (a shard's config, ``expert_local_config``: it holds ``E /
    expert_shards`` of them; the router still scores all E)."""

    num_experts: int = 0
    num_experts_per_tok: int = 0
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    pad_token_id: int | None = None
    expert_shards: int = 1

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(t == SLIDING for t in self.layer_types)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.expert_shards


def gpt_oss_glu(h: jax.Array, alpha: float = 1.702, limit: float = 7.0) -> jax.Array:
    """gpt-oss's clamped gated activation of ``h[..., 2F]`` (gate and up interleaved:
    ``h[..., 0::2]``, ``h[..., 1::2]``) -> [..., F]: ``(clip(up, -limit, limit) + 1) *
    g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``."""
    gate = jnp.minimum(h[..., 0::2], limit)
    up = jnp.clip(h[..., 1::2], -limit, limit)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


# ---------------------------------------------------------------------------- the model
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``weight * x / sqrt(mean(x^2) + eps)`` normalised in float32, then cast to x's dtype
    (gpt-oss's order: the weight multiplies the float32 value)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf).astype(x.dtype)


def _dense(x, p, bias: bool = True):
    y = x @ p["kernel"].astype(x.dtype)
    return y + p["bias"].astype(y.dtype) if bias and "bias" in p else y


def attention(cfg: GptOssConfig, p, x, cos, sin, positions, mask, cache, layer,
              model_axis: str | None = None):
    """One layer's attention over its cache slots (or the block alone): [B, T, D], the cache."""
    B, T, _ = x.shape
    H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = apply_rope(_dense(x, p["q_proj"]).reshape(B, T, H, Dh), cos, sin)
    k = apply_rope(_dense(x, p["k_proj"]).reshape(B, T, Hkv, Dh), cos, sin)
    v = _dense(x, p["v_proj"]).reshape(B, T, Hkv, Dh)
    if cache is not None:
        cache = cache.write(layer, k, v, positions)
        k, v = cache.k[layer], cache.v[layer]
    out = dot_product_attention(q, k, v, mask, sinks=p["sinks"]).reshape(B, T, H * Dh)
    y = out @ p["o_proj"]["kernel"].astype(out.dtype)
    if model_axis is not None:
        y = jax.lax.psum(y, model_axis)
    if "bias" in p["o_proj"]:
        y = y + p["o_proj"]["bias"].astype(y.dtype)
    return y, cache


def route(cfg: GptOssConfig, p, x: jax.Array):
    """The router of one layer: ``(weights float32[..., k], expert_ids int32[..., k])`` of x
    [..., D] (the top k of ``x @ W_r + b_r``, softmaxed over those k)."""
    logits = _dense(x, p["router"]).astype(jnp.float32)
    w, ids = moe.route_topk_softmax(logits.reshape(-1, logits.shape[-1]), cfg.num_experts_per_tok)
    lead = x.shape[:-1]
    return w.reshape(*lead, -1), ids.reshape(*lead, -1)


def experts(cfg: GptOssConfig, p, x: jax.Array, *, model_axis: str | None = None,
            expert_axis: str | None = None, impl: str = "auto") -> jax.Array:
    """One layer's mixture of experts on x [B, T, D] -> [B, T, D]. Under ``shard_map``: the
    local experts' slice (``expert_axis``: experts ``[i E/e, (i+1) E/e)`` on shard i) of each
    expert's width (``model_axis``), one psum over both; the down-projection bias is added on
    model shard 0 only (it is not split)."""
    weights, ids = route(cfg, p, x)
    e = p["experts"]
    act = functools.partial(gpt_oss_glu, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)
    y = moe.moe_ffn(x, weights, ids, gate_up=e["gate_up_proj"], gate_up_bias=e["gate_up_proj_bias"],
                    down=e["down_proj"], down_bias=experts_mesh.once_over(e["down_proj_bias"], model_axis),
                    activation=act, expert_offset=experts_mesh.expert_offset(cfg.local_experts, expert_axis),
                    impl=impl)
    return experts_mesh.combine(y, expert_axis, model_axis)


def target_forward(cfg: GptOssConfig, params, tokens, positions, cache: KVCache | None = None, *,
                   tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits=True,
                   attention_impl: str = "xla", model_axis: str | None = None,
                   expert_axis: str | None = None, moe_impl: str = "auto", tree=None):
    """One causal pass (``TargetFamily.forward``): tokens, positions int32[B, T] -> (logits
    float32[B, T, V] or [B, 1, V] at ``logit_index``, taps [B, T, k*D] or None, cache).

    With a cache, the block's K/V are written at ``positions`` and query p sees slots ``<= p``
    (a sliding layer: ``> p - W`` too); without one, the block's own rows the same way.
    ``attention_impl``: only "xla" (the block-attention kernels have no sinks or window).
    ``moe_impl``: ``nn.moe.moe_ffn``'s ``impl``. ``tree``: a tree block (``nn.tree_attention``):
    rotated at ``tree.positions``, each node seeing the committed slots and its ancestors', a
    sliding layer's window measured in those positions."""
    if attention_impl != "xla":
        raise ValueError(f"the gpt_oss target runs attention_impl='xla' only (got "
                         f"{attention_impl!r}): the block-attention kernels implement neither "
                         "attention sinks nor sliding windows")
    check_forward_inputs(cfg, tokens, positions, tap_layer_ids)
    B, T = tokens.shape
    h = embed_tokens(params, tokens, model_axis)
    if cache is not None and cache.batch != B:
        raise ValueError(f"cache batch {cache.batch} != tokens batch {B}")
    if tree is None:
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope)
        keys = jnp.arange(cache.max_len) if cache is not None else positions
        full = causal_mask(positions, keys)
        sliding = causal_mask(positions, keys, cfg.sliding_window) if any(cfg.sliding_layers) else full
    else:
        if cache is None:
            raise ValueError("a tree block is verified through a decode state (cache): pass one")
        tree.check(positions)
        cos, sin = rope_cos_sin(tree.positions, cfg.head_dim, cfg.rope)
        full = tree_attention.cache_mask(positions, tree, cache.max_len)
        keys = tree_attention.slot_positions(positions, tree, cache.max_len)  # [B, S]
        sliding = (full & (keys[:, None, :] > tree.positions[:, :, None] - cfg.sliding_window)
                   if any(cfg.sliding_layers) else full)
    tap_ids = tuple(tap_layer_ids)
    K = len(tap_ids)
    taps = jnp.zeros((K, B, T, cfg.hidden_size), h.dtype) if K else None

    def layer_fn(carry, xs):
        h, cache, taps = carry
        p, layer, slides = xs
        p = dequantize_tree(p, h)  # a quantized layer's matrices, inside its own step (dflash_jax.quantization)
        mask = jnp.where(slides, sliding, full)
        a, cache = attention(cfg, p["self_attn"], rms_norm(h, p["input_layernorm"]["weight"],
                                                           cfg.rms_norm_eps),
                             cos, sin, positions, mask, cache, layer, model_axis)
        h = h + a
        h = h + experts(cfg, p["mlp"], rms_norm(h, p["post_attention_layernorm"]["weight"],
                                                cfg.rms_norm_eps),
                        model_axis=model_axis, expert_axis=expert_axis, impl=moe_impl)
        if K:
            hit = (jnp.asarray(tap_ids) == layer)[:, None, None, None]
            taps = jnp.where(hit, h[None].astype(taps.dtype), taps)
        return (h, cache, taps), None

    xs = (params["layers"], jnp.arange(cfg.num_layers, dtype=jnp.int32),
          jnp.asarray(cfg.sliding_layers, bool))
    (h, cache, taps), _ = jax.lax.scan(layer_fn, (h, cache, taps), xs)
    if cache is not None:
        cache = cache.crop(positions[:, -1] + 1)
    h_normed = rms_norm(h, params["norm"]["weight"], cfg.rms_norm_eps)
    taps = collect_taps(taps, lambda: h_normed, tap_ids, cfg.num_layers)
    if not compute_logits:
        return None, taps, cache
    if logit_index is not None:
        h_normed = jnp.take_along_axis(h_normed, logit_index.astype(jnp.int32)[:, None, None], axis=1)
    return lm_head(cfg, params, h_normed), taps, cache


def init_target_params(cfg: GptOssConfig, key: jax.Array, dtype=jnp.float32,
                       init_scale: float = 0.02):
    """Random parameters: normal(init_scale) matrices, embedding, router and sinks; zero biases;
    unit norms (``nn.layers.random_init``, built under jit)."""
    return random_params_of_shapes(param_shapes(cfg), key, init_scale, dtype)


def param_shapes(cfg: GptOssConfig) -> dict:
    """The parameter tree with each leaf's shape (a tuple)."""
    D, V, N = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    H, Hkv, Dh, E, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.local_experts, cfg.intermediate_size

    def proj(i, o):
        out = {"kernel": (N, i, o)}
        if cfg.attention_bias:
            out["bias"] = (N, o)
        return out

    layers = {
        "input_layernorm": {"weight": (N, D)},
        "post_attention_layernorm": {"weight": (N, D)},
        "self_attn": {"q_proj": proj(D, H * Dh), "k_proj": proj(D, Hkv * Dh),
                      "v_proj": proj(D, Hkv * Dh), "o_proj": proj(H * Dh, D), "sinks": (N, H)},
        "mlp": {"router": {"kernel": (N, D, cfg.num_experts), "bias": (N, cfg.num_experts)},
                "experts": {"gate_up_proj": (N, E, D, 2 * F), "gate_up_proj_bias": (N, E, 2 * F),
                            "down_proj": (N, E, F, D), "down_proj_bias": (N, E, D)}},
    }
    tree = {"embed_tokens": {"embedding": (V, D)}, "layers": layers, "norm": {"weight": (D,)}}
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = {"kernel": (D, V)}
    return tree


# ---------------------------------------------------------------------------- the family
PARAM_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    **{k: v for k, v in partitioning.PARAM_AXES.items()
       if k[0] in ("embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj", "o_proj",
                   "input_layernorm", "post_attention_layernorm", "norm")},
    ("self_attn", "sinks"): ("heads",),
    ("router", "kernel"): ("embed", "router"),
    ("router", "bias"): ("router",),
    ("experts", "gate_up_proj"): ("expert", "embed", "mlp"),
    ("experts", "gate_up_proj_bias"): ("expert", "mlp"),
    ("experts", "down_proj"): ("expert", "mlp", "embed"),
    ("experts", "down_proj_bias"): ("expert", "embed"),
}
"""(module, parameter) -> logical axes (``parallel.rules``): attention as the dense decoder's
(heads over ``model``; the sinks with their heads), the router replicated, experts over
``expert`` and each expert's width over ``model`` (gate/up pairs are adjacent columns, so a
contiguous split keeps them together)."""


class GptOssFamily(TargetFamily):
    """gpt-oss: attention with sinks, YaRN and alternating sliding windows + top-k-softmax MoE."""

    model_types = (MODEL_TYPE,)
    tree_refusal = None  # verifies trees (nn.tree_attention; windows in RoPE positions)
    name = MODEL_TYPE

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]) -> GptOssConfig:
        """Reads a ``GptOssConfig`` config.json (the hub's or transformers 5's), filling in
        ``GptOssConfig``'s defaults (:data:`DEFAULTS`, YaRN :data:`DEFAULT_ROPE` when no RoPE
        is given, theta 150000). Refused, naming the field: a quantization other than MXFP4
        (which is dequantized on load), layer types other than sliding / full attention, a
        sliding layer without a window, ``experts_per_token`` disagreeing with
        ``num_experts_per_tok``, and the decoder features no family implements."""
        d = dict(d)
        if "num_local_experts" not in d and "num_experts" in d:  # GptOssConfig's attribute_map
            d["num_local_experts"] = d["num_experts"]
        for key, value in DEFAULTS.items():
            if key not in d:
                d[key] = value
        if "rope_parameters" not in d and "rope_scaling" not in d:
            d["rope_parameters"] = dict(DEFAULT_ROPE)
        if not has_rope_theta(d):
            d["rope_theta"] = DEFAULT_THETA
        problems = unsupported_decoder_features(d, qwen3_attention=False)
        problems = [p for p in problems if not p.startswith("hidden_act")]  # unused by gpt-oss
        quant = d.get("quantization_config")
        if quant and (not isinstance(quant, Mapping) or quant.get("quant_method") != "mxfp4"):
            method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
            problems.append(f"quantization_config.quant_method={method!r}: only MXFP4 (dequantized "
                            "on load) is implemented")
        n = int(d.get("num_hidden_layers") or 0)
        types = d.get("layer_types")
        if types is None:
            types = [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
        other = sorted({str(t) for t in types if t not in (SLIDING, FULL)})
        if other:
            problems.append(f"layer_types contains {', '.join(map(repr, other))}: only "
                            f"{SLIDING!r} and {FULL!r} layers are implemented")
        elif len(types) != n:
            problems.append(f"layer_types has {len(types)} entries for {n} layers")
        if SLIDING in types and d.get("sliding_window") is None:
            problems.append("sliding_window=null with sliding_attention layers: give the window")
        for key in ("swiglu_alpha", "swiglu_limit"):
            if not isinstance(d.get(key), (int, float)) or isinstance(d.get(key), bool):
                problems.append(f"{key}={json.dumps(d.get(key))}: must be a number (gpt-oss: "
                                f"{DEFAULTS[key]}; absent means that default)")
        for key in ("num_local_experts", "num_experts_per_tok"):
            if d.get(key) is None and not (key == "num_experts_per_tok" and d.get("experts_per_token")):
                problems.append(f"{key} is missing")
        k_alias = d.get("experts_per_token")
        if k_alias is not None and d.get("num_experts_per_tok") is not None and int(k_alias) != int(
                d["num_experts_per_tok"]):
            problems.append(f"experts_per_token={k_alias} differs from num_experts_per_tok="
                            f"{d['num_experts_per_tok']}: make them equal")
        refuse(problems, f"target config.json ({MODEL_TYPE})")
        fields = decoder_fields_from_hf(d, "config.json")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        k = d.get("num_experts_per_tok") or d.get("experts_per_token")
        return GptOssConfig(
            model_type=MODEL_TYPE, **fields,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d["attention_bias"]), bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_ids, num_experts=int(d["num_local_experts"]),
            num_experts_per_tok=int(k),
            sliding_window=None if d.get("sliding_window") is None else int(d["sliding_window"]),
            layer_types=tuple(str(t) for t in types), swiglu_alpha=float(d["swiglu_alpha"]),
            swiglu_limit=float(d["swiglu_limit"]), pad_token_id=d.get("pad_token_id"))

    def config_to_hf(self, cfg: GptOssConfig) -> dict:
        """The config.json transformers 5 loads as the same ``GptOssForCausalLM`` (RoPE in both
        spellings, ``layer_types`` and ``sliding_window`` explicit, no quantization_config: the
        weights are written dequantized)."""
        eos: Any = list(cfg.eos_token_id)
        eos = eos[0] if len(eos) == 1 else (eos or None)
        return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
                **decoder_fields_to_hf(cfg), "tie_word_embeddings": cfg.tie_word_embeddings,
                "attention_bias": cfg.attention_bias, "num_local_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.num_experts_per_tok,
                "sliding_window": cfg.sliding_window, "layer_types": list(cfg.layer_types),
                "swiglu_alpha": cfg.swiglu_alpha, "swiglu_limit": cfg.swiglu_limit,
                "bos_token_id": cfg.bos_token_id, "eos_token_id": eos,
                "pad_token_id": cfg.pad_token_id}

    def check_config(self, cfg) -> None:
        if not isinstance(cfg, GptOssConfig):
            raise ValueError("a gpt_oss target needs a GptOssConfig (dflash_jax.targets.moe."
                             "gpt_oss), e.g. TargetConfig.from_hf_dict(config.json)")
        if cfg.num_experts < 1:
            raise ValueError(f"num_local_experts must be >= 1, got {cfg.num_experts}")
        if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{cfg.num_experts} (the experts), "
                             f"got {cfg.num_experts_per_tok}")
        if len(cfg.layer_types) != cfg.num_layers or any(t not in (SLIDING, FULL) for t in cfg.layer_types):
            raise ValueError(f"layer_types must give {SLIDING!r} or {FULL!r} for each of the "
                             f"{cfg.num_layers} layers, got {cfg.layer_types}")
        if any(cfg.sliding_layers) and (cfg.sliding_window is None or cfg.sliding_window < 1):
            raise ValueError(f"sliding_window must be >= 1 with sliding layers, got {cfg.sliding_window}")
        if cfg.expert_shards < 1 or cfg.num_experts % cfg.expert_shards:
            raise ValueError(f"num_local_experts={cfg.num_experts} is not divisible by "
                             f"{cfg.expert_shards} expert shards")

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg: GptOssConfig) -> dict[str, TensorSpec]:
        """Every tensor of a ``GptOssForCausalLM`` checkpoint in the dequantized layout (what
        transformers' ``save_pretrained`` writes from a float model)."""
        D, V = cfg.hidden_size, cfg.vocab_size
        H, Hkv, Dh, E, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_experts, cfg.intermediate_size
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        per_layer = [
            ("input_layernorm.weight", ("input_layernorm", "weight"), False, (D,)),
            ("post_attention_layernorm.weight", ("post_attention_layernorm", "weight"), False, (D,)),
            ("self_attn.q_proj.weight", ("self_attn", "q_proj", "kernel"), True, (H * Dh, D)),
            ("self_attn.k_proj.weight", ("self_attn", "k_proj", "kernel"), True, (Hkv * Dh, D)),
            ("self_attn.v_proj.weight", ("self_attn", "v_proj", "kernel"), True, (Hkv * Dh, D)),
            ("self_attn.o_proj.weight", ("self_attn", "o_proj", "kernel"), True, (D, H * Dh)),
            ("self_attn.sinks", ("self_attn", "sinks"), False, (H,)),
            ("mlp.router.weight", ("mlp", "router", "kernel"), True, (E, D)),
            ("mlp.router.bias", ("mlp", "router", "bias"), False, (E,)),
            ("mlp.experts.gate_up_proj", ("mlp", "experts", "gate_up_proj"), False, (E, D, 2 * F)),
            ("mlp.experts.gate_up_proj_bias", ("mlp", "experts", "gate_up_proj_bias"), False, (E, 2 * F)),
            ("mlp.experts.down_proj", ("mlp", "experts", "down_proj"), False, (E, F, D)),
            ("mlp.experts.down_proj_bias", ("mlp", "experts", "down_proj_bias"), False, (E, D)),
        ]
        if cfg.attention_bias:
            for name, width in (("q_proj", H * Dh), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh),
                                ("o_proj", D)):
                per_layer.append((f"self_attn.{name}.bias", ("self_attn", name, "bias"), False, (width,)))
        for i in range(cfg.num_layers):
            for name, path, transpose, shape in per_layer:
                specs[f"model.layers.{i}.{name}"] = TensorSpec(("layers",) + path, i, transpose, shape)
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    def convert_checkpoint_tensors(self, cfg: GptOssConfig, tensors: dict, what: str) -> dict:
        """The released MXFP4 layout -> the dequantized one: each expert weight stored as
        ``<name>_blocks`` + ``<name>_scales`` (``mxfp4``) becomes ``<name>`` [E, in, out] in
        bfloat16 (exact: every MXFP4 value is a bfloat16; the loader then casts to the
        requested dtype). A weight with only one of the pair, or stored both ways, or
        malformed blocks / scales: a one-line CheckpointError naming it. Other names pass
        through (the loader checks the resulting set against :meth:`tensor_specs`)."""
        import ml_dtypes

        specs = self.tensor_specs(cfg)
        out = dict(tensors)
        for i in range(cfg.num_layers):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{i}.mlp.experts.{proj}"
                blocks, scales = out.pop(f"{name}_blocks", None), out.pop(f"{name}_scales", None)
                if blocks is None and scales is None:
                    continue
                if blocks is None or scales is None:
                    raise CheckpointError(f"{what}: {name}_{'blocks' if blocks is None else 'scales'} "
                                          f"is missing (MXFP4 stores both {name}_blocks and _scales)")
                if name in out:
                    raise CheckpointError(f"{what}: {name} is stored both dequantized and as MXFP4 "
                                          "blocks / scales: keep one")
                try:
                    out[name] = mxfp4.dequantize_mxfp4(blocks, scales, ml_dtypes.bfloat16, name,
                                                       specs[name].shape)
                except CheckpointError as e:
                    raise CheckpointError(f"{what}: {e}") from None
        return out

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        return init_target_params(cfg, key, dtype, init_scale)

    def init_state(self, cfg, batch: int, max_len: int, dtype) -> KVCache:
        return KVCache.for_config(cfg, batch, max_len, dtype)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None,
                expert_axis=None, tree=None):
        return target_forward(cfg, params, tokens, positions, state, tap_layer_ids=tap_layer_ids,
                              logit_index=logit_index, compute_logits=compute_logits,
                              attention_impl=attention_impl, model_axis=model_axis,
                              expert_axis=expert_axis, tree=tree)

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        return PARAM_AXES

    def state_axes(self, cfg) -> KVCache:
        return KVCache(k=partitioning.CACHE_AXES, v=partitioning.CACHE_AXES, lengths=("batch",))

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("num_key_value_heads", cfg.num_kv_heads, "KV heads (a GQA group is never split)"),
                ("num_attention_heads", cfg.num_heads, "query heads (and their sinks)"),
                ("intermediate_size", cfg.intermediate_size, "each expert's width"),
                ("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)")]

    def local_config(self, cfg, model: int):
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // model,
                                   num_kv_heads=cfg.num_kv_heads // model,
                                   intermediate_size=cfg.intermediate_size // model,
                                   vocab_size=cfg.vocab_size // model)

    def expert_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("num_local_experts", cfg.num_experts, "routed experts")]

    def expert_local_config(self, cfg, expert: int):
        return dataclasses.replace(cfg, expert_shards=cfg.expert_shards * expert)

    # ------------------------------------------------------------------ size model
    def attention_matrix_params(self, cfg) -> int:
        D, Dh = cfg.hidden_size, cfg.head_dim
        return D * Dh * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)

    def expert_matrix_params(self, cfg) -> int:
        """One expert's matrices: gate_up [D, 2F] and down [F, D]."""
        return 3 * cfg.hidden_size * cfg.intermediate_size

    def layer_vector_params(self, cfg) -> int:
        """One layer's norms, sinks, attention and router biases and the experts' biases."""
        D, Dh, E, F = cfg.hidden_size, cfg.head_dim, cfg.num_experts, cfg.intermediate_size
        bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh + D if cfg.attention_bias else 0
        return 2 * D + cfg.num_heads + bias + E + E * (2 * F + D)

    def num_params(self, cfg) -> int:
        return self.matrix_params(cfg) + cfg.num_layers * self.layer_vector_params(cfg) + cfg.hidden_size

    def matrix_params(self, cfg) -> int:
        tables = 1 if cfg.tie_word_embeddings else 2
        per_layer = (self.attention_matrix_params(cfg) + cfg.hidden_size * cfg.num_experts
                     + cfg.num_experts * self.expert_matrix_params(cfg))
        return cfg.num_layers * per_layer + tables * cfg.vocab_size * cfg.hidden_size

    def matrix_params_read(self, cfg, rows: int) -> float:
        """All matrices but the experts no row routes to: each layer reads the expected
        ``E * (1 - (1 - k/E) ** rows)`` distinct experts (uniform routing, capped at
        ``min(E, rows * k)``)."""
        E = cfg.num_experts
        active = sizes.expected_experts(E, cfg.num_experts_per_tok, rows)
        idle = cfg.num_layers * (E - active) * self.expert_matrix_params(cfg)
        return float(self.matrix_params(cfg)) - idle

    def matrix_params_per_token(self, cfg) -> int:
        E, k = cfg.num_experts, cfg.num_experts_per_tok
        return self.matrix_params(cfg) - cfg.num_layers * (E - k) * self.expert_matrix_params(cfg)

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """K and V of every layer, ``2 * L * Hkv * Dh * itemsize`` (sliding layers keep a
        full-length cache too: a window-sized ring buffer is not implemented)."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


GPT_OSS = GptOssFamily()
