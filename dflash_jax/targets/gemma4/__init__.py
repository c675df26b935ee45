"""The Gemma 4 target family (``model_type`` ``gemma4_text``, transformers' ``Gemma4ForCausalLM``;
and ``gemma4``, ``Gemma4ForConditionalGeneration``, whose text model is loaded and whose vision
and audio towers are ignored by name). The forward pass and the decode state: ``gemma4.model``;
``docs/targets.md`` says what each config field does.

Everything the released text models use is implemented: sliding and full attention layers with
their own head dims, KV heads and RoPE (proportional RoPE with a partial factor on the full
layers), ``attention_k_eq_v``, q / k / v norms, attention scale 1, the sandwich norms and
``layer_scalar``, the GELU-tanh MLP (double width on KV-shared layers with
``use_double_wide_mlp``), the MoE block beside the MLP (26B-A4B), per-layer input embeddings and
KV-shared layers (E2B / E4B), ``final_logit_softcapping``. Refused by name: attention biases,
``use_bidirectional_attention: "all"``, other activations or RoPE types, a ``per_layer_config``
that varies within a layer type.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import logging
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax import sizes
from dflash_jax.checkpoints import CheckpointError, TensorSpec, text_model_tensors
from dflash_jax.config import RopeConfig, TargetConfig, refuse
from dflash_jax.nn import partitioning
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.layers import random_params_of_shapes
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.gemma4 import model
from dflash_jax.targets.gemma4.model import FULL, SLIDING

TEXT_TYPE, MULTIMODAL_TYPE = "gemma4_text", "gemma4"
ARCHITECTURE = "Gemma4ForCausalLM"
log = logging.getLogger(__name__)

DEFAULTS = dict(head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, sliding_window=512,
                final_logit_softcapping=None, use_bidirectional_attention=None,
                vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256, attention_k_eq_v=False,
                num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False,
                global_head_dim=512, pad_token_id=0, eos_token_id=1, bos_token_id=2)
"""transformers' ``Gemma4TextConfig`` defaults for the fields a config.json may leave out (note
that per-layer inputs are on by default: ``hidden_size_per_layer_input`` 256)."""
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
TEXT_PREFIXES = {"model.language_model.": "model."}
IGNORED_PREFIXES = {"model.vision_tower.": "vision-tower", "model.embed_vision.": "vision-embedding",
                    "model.audio_tower.": "audio-tower", "model.embed_audio.": "audio-embedding"}
"""The multimodal layout's text prefix -> the text model's, and its other towers (ignored by name)."""


@dataclasses.dataclass(frozen=True)
class LayerRope:
    """One layer type's RoPE: ``rope_type`` "default" or "proportional", ``theta``, the
    proportional type's ``partial_rotary_factor`` and ``factor``."""

    rope_type: str = "default"
    theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    factor: float = 1.0

    def to_hf(self) -> dict:
        out = {"rope_type": self.rope_type, "rope_theta": self.theta}
        if self.rope_type == "proportional":
            out["partial_rotary_factor"] = self.partial_rotary_factor
            if self.factor != 1.0:
                out["factor"] = self.factor
        return out


@dataclasses.dataclass(frozen=True)
class Gemma4Config(TargetConfig):
    """A Gemma 4 text model: :class:`TargetConfig` (``num_kv_heads`` / ``head_dim`` are the
    sliding layers'; ``intermediate_size`` = F the MLP width; ``rope`` unused, see
    ``layer_ropes``) plus ``layer_types`` and ``sliding_window``; the full layers'
    ``full_head_dim`` and ``full_kv_heads``; ``attention_k_eq_v`` (full layers: values are the
    keys); ``sliding_rope`` / ``full_rope``; ``final_logit_softcapping`` (None: none); per-layer
    inputs ``hidden_size_per_layer_input`` = P (0: none) over ``vocab_size_per_layer_input``;
    ``num_kv_shared_layers``; ``use_double_wide_mlp``; the MoE block (``enable_moe_block``,
    ``num_experts`` = E, ``top_k_experts`` = k, ``moe_intermediate_size`` = Fm); ``expert_shards``
    (the experts' split, :meth:`Gemma4Family.expert_local_config`); ``pad_token_id`` and the
    multimodal ``use_bidirectional_attention: "vision"`` (text is causal) kept for config.json."""

    layer_types: tuple[str, ...] = ()
    sliding_window: int = 512
    full_head_dim: int = 512
    full_kv_heads: int = 0
    attention_k_eq_v: bool = False
    sliding_rope: LayerRope = LayerRope()
    full_rope: LayerRope = LayerRope()
    final_logit_softcapping: float | None = None
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    enable_moe_block: bool = False
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    expert_shards: int = 1
    pad_token_id: int | None = None
    bidirectional_vision: bool = False

    # --------------------------------------------------------------- layer structure
    @property
    def first_shared_layer(self) -> int:
        return self.num_layers - self.num_kv_shared_layers

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers with K/V of their own (not KV-shared), in order."""
        return tuple(range(self.first_shared_layer))

    @property
    def kv_producers(self) -> tuple[int, ...]:
        """Per layer type, the last layer with its own K/V, whose K/V the shared layers read."""
        if not self.num_kv_shared_layers:
            return ()
        return tuple(max(i for i in self.kv_layers if self.layer_types[i] == t) for t in sorted(set(self.layer_types)))

    def kv_source(self, i: int) -> int:
        """The layer whose K/V layer i attends over (itself, or its type's producer)."""
        if i < self.first_shared_layer:
            return i
        t = self.layer_types[i]
        return max(j for j in self.kv_layers if self.layer_types[j] == t)

    def kv_slot(self, i: int) -> int:
        """Layer i's index in its type's cache (i has K/V of its own)."""
        t = self.layer_types[i]
        return sum(1 for j in self.kv_layers[:i] if self.layer_types[j] == t)

    def layer_head_dim(self, i: int) -> int:
        return self.full_head_dim if self.layer_types[i] == FULL else self.head_dim

    def layer_kv_heads(self, i: int) -> int:
        return self.full_kv_heads if self.layer_types[i] == FULL else self.num_kv_heads

    def layer_has_v_proj(self, i: int) -> bool:
        return i in self.kv_layers and not (self.attention_k_eq_v and self.layer_types[i] == FULL)

    def layer_mlp_width(self, i: int) -> int:
        wide = self.use_double_wide_mlp and i >= self.first_shared_layer
        return self.intermediate_size * (2 if wide else 1)

    def inv_freq(self, kind: str) -> np.ndarray:
        r = self.sliding_rope if kind == SLIDING else self.full_rope
        dim = self.head_dim if kind == SLIDING else self.full_head_dim
        return model.rope_inv_freq(dim, r.rope_type, r.theta, r.partial_rotary_factor, r.factor)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.expert_shards


ROPE_TYPES = ("default", "proportional")


def _layer_rope(d: Mapping[str, Any], kind: str, problems: list[str]) -> LayerRope:
    params = d.get("rope_parameters")
    if not isinstance(params, Mapping) or kind not in params:
        problems.append(f"rope_parameters has no {kind!r} entry: Gemma 4 configs give one RoPE per "
                        f"layer type ({SLIDING!r}, {FULL!r})")
        return LayerRope()
    r = params[kind] or {}
    rope_type = r.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        problems.append(f"rope_parameters.{kind}.rope_type={rope_type!r}: only {', '.join(map(repr, ROPE_TYPES))} "
                        "are implemented for Gemma 4")
    if rope_type == "default" and float(r.get("partial_rotary_factor", 1.0)) != 1.0:
        problems.append(f"rope_parameters.{kind}.partial_rotary_factor={r['partial_rotary_factor']} with "
                        "rope_type 'default': a partial rotation is read only as 'proportional'")
    if "rope_theta" not in r:
        problems.append(f"rope_parameters.{kind} has no rope_theta")
    return LayerRope(rope_type=str(rope_type), theta=float(r.get("rope_theta", 10000.0)),
                     partial_rotary_factor=float(r.get("partial_rotary_factor", 1.0)),
                     factor=float(r.get("factor", 1.0)))


def _full_layer_shapes(d: Mapping[str, Any], types, problems: list[str]) -> tuple[int, int]:
    """(head dim, KV heads) of the full layers, as transformers derives them: an explicit
    ``per_layer_config`` (layer index -> overrides), else ``global_head_dim`` and, with
    ``attention_k_eq_v``, ``num_global_key_value_heads``."""
    kv = int(d.get("num_key_value_heads") or d["num_attention_heads"])
    per_layer = d.get("per_layer_config")
    if per_layer:
        found = set()
        for key, over in per_layer.items():
            i = int(key) if str(key).isdigit() else None
            if i is None or not 0 <= i < len(types) or types[i] != FULL:
                problems.append(f"per_layer_config[{key!r}] overrides a layer that is not a full-attention "
                                "layer: only full layers may have their own head_dim / KV heads")
                continue
            other = set(over) - {"head_dim", "num_key_value_heads"}
            if other:
                problems.append(f"per_layer_config[{key!r}] sets {sorted(other)}: only head_dim and "
                                "num_key_value_heads are implemented per layer")
            found.add((int(over.get("head_dim", d.get("head_dim", DEFAULTS["head_dim"]))),
                       int(over.get("num_key_value_heads", kv))))
        missing = [i for i, t in enumerate(types) if t == FULL and str(i) not in {str(k) for k in per_layer}]
        if len(found) > 1 or (found and missing):
            problems.append(f"per_layer_config gives the full layers different shapes ({sorted(found)}"
                            f"{', layers without an entry ' + str(missing) if missing else ''}): one shape "
                            "per layer type is implemented")
        if found:
            return next(iter(found))
        return int(d.get("head_dim", DEFAULTS["head_dim"])), kv
    head_dim = int(d.get("global_head_dim") or DEFAULTS["global_head_dim"])
    glob = d.get("num_global_key_value_heads")
    if glob is not None and d.get("attention_k_eq_v", DEFAULTS["attention_k_eq_v"]):
        kv = int(glob)
    return head_dim, kv


class Gemma4Family(TargetFamily):
    """Gemma 4: sliding / full attention with per-type shapes and RoPE, sandwich norms, GELU-tanh
    MLP, optional MoE block, per-layer inputs and KV-shared layers, soft-capped logits."""

    model_types = (TEXT_TYPE, MULTIMODAL_TYPE)
    name = TEXT_TYPE
    tree_refusal = None  # verifies trees (nn.tree_attention; windows in RoPE positions)

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]) -> Gemma4Config:
        """Reads a ``Gemma4TextConfig`` config.json (or a ``gemma4`` one's ``text_config``) with
        transformers' defaults (:data:`DEFAULTS`, :data:`DEFAULT_ROPE`, the 5:1 layer pattern
        with the last layer full). Refused, naming the field: module docstring."""
        what = "target config.json (gemma4_text)"
        if d.get("model_type") == MULTIMODAL_TYPE:
            tc = d.get("text_config")
            if not isinstance(tc, Mapping):
                raise ValueError(f"target config.json ({MULTIMODAL_TYPE}) has no text_config: a multimodal "
                                 "Gemma 4 checkpoint keeps its text model's fields there")
            d = {"tie_word_embeddings": d.get("tie_word_embeddings", True), **tc}
            what = "target config.json (gemma4 text_config)"
        d = {**DEFAULTS, **d}
        if d.get("rope_parameters") is None:
            d["rope_parameters"] = DEFAULT_ROPE
        problems = []
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if d.get(k) is None]
        if missing:
            raise ValueError(f"{what} is missing required fields: {', '.join(missing)}")
        n = int(d["num_hidden_layers"])
        types = d.get("layer_types")
        if types is None:
            types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
        types = [str(t) for t in types]
        other = sorted(set(types) - {SLIDING, FULL})
        if other:
            problems.append(f"layer_types contains {', '.join(map(repr, other))}: only {SLIDING!r} and {FULL!r}")
        elif len(types) != n:
            problems.append(f"layer_types has {len(types)} entries for {n} layers")
        elif types[-1] != FULL:
            types[-1] = FULL  # transformers forces the last layer to full attention (with a warning)
            log.warning("%s: the last layer must be full attention; read as such (as transformers does)", what)
        if d["hidden_activation"] != "gelu_pytorch_tanh":
            problems.append(f"hidden_activation={d['hidden_activation']!r}: only 'gelu_pytorch_tanh' (Gemma 4's) "
                            "is implemented")
        if d["attention_bias"]:
            problems.append("attention_bias=true: attention biases are not implemented (no released Gemma 4 has them)")
        if d["use_bidirectional_attention"] not in (None, "vision"):
            problems.append(f"use_bidirectional_attention={d['use_bidirectional_attention']!r}: only causal text "
                            "attention is implemented ('vision' is read: text tokens stay causal)")
        if d.get("quantization_config"):
            q = d["quantization_config"]
            problems.append(f"quantization_config.quant_method={(q.get('quant_method') if isinstance(q, Mapping) else q)!r}: "
                            "quantized Gemma 4 weights are not read (load the unquantized checkpoint)")
        if d.get("attn_logit_softcapping"):
            problems.append(f"attn_logit_softcapping={d['attn_logit_softcapping']}: attention soft-capping is "
                            "not implemented (Gemma 4 has none)")
        sliding_rope = _layer_rope(d, SLIDING, problems) if SLIDING in types else LayerRope()
        full_rope = _layer_rope(d, FULL, problems)
        full_dim, full_kv = _full_layer_shapes(d, types, problems)
        shared = int(d["num_kv_shared_layers"] or 0)
        if not 0 <= shared < n:
            problems.append(f"num_kv_shared_layers={shared} must be in 0..{n - 1} (some layer must compute K/V)")
        elif shared and set(types[n - shared:]) - set(types[:n - shared]):
            problems.append(f"num_kv_shared_layers={shared}: a shared layer's type has no earlier layer "
                            "with its own K/V to share")
        moe = bool(d["enable_moe_block"])
        if moe:
            for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
                if not d.get(key):
                    problems.append(f"enable_moe_block=true but {key}={json.dumps(d.get(key))}: give it")
        if SLIDING in types and (not isinstance(d["sliding_window"], int) or d["sliding_window"] < 1):
            problems.append(f"sliding_window={json.dumps(d['sliding_window'])}: must be a positive integer")
        refuse(problems, what)
        heads = int(d["num_attention_heads"])
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        ple = int(d["hidden_size_per_layer_input"] or 0)
        return Gemma4Config(
            model_type=TEXT_TYPE, vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]), num_layers=n, num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads), head_dim=int(d["head_dim"]),
            rms_norm_eps=float(d["rms_norm_eps"]), rope=RopeConfig(theta=sliding_rope.theta),
            max_position_embeddings=int(d["max_position_embeddings"]),
            tie_word_embeddings=bool(d["tie_word_embeddings"]), bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_ids, layer_types=tuple(types), sliding_window=int(d["sliding_window"]),
            full_head_dim=full_dim, full_kv_heads=full_kv, attention_k_eq_v=bool(d["attention_k_eq_v"]),
            sliding_rope=sliding_rope, full_rope=full_rope,
            final_logit_softcapping=(None if not d["final_logit_softcapping"] else float(d["final_logit_softcapping"])),
            hidden_size_per_layer_input=ple,
            vocab_size_per_layer_input=int(d["vocab_size_per_layer_input"]) if ple else 0,
            num_kv_shared_layers=shared, use_double_wide_mlp=bool(d["use_double_wide_mlp"]),
            enable_moe_block=moe, num_experts=int(d.get("num_experts") or 0) if moe else 0,
            top_k_experts=int(d.get("top_k_experts") or 0) if moe else 0,
            moe_intermediate_size=int(d.get("moe_intermediate_size") or 0) if moe else 0,
            pad_token_id=d.get("pad_token_id"), bidirectional_vision=d["use_bidirectional_attention"] == "vision")

    def config_to_hf(self, cfg: Gemma4Config) -> dict:
        """The ``gemma4_text`` config.json transformers loads as the same ``Gemma4ForCausalLM``
        (the full layers' shapes as ``global_head_dim`` / ``num_global_key_value_heads`` and as
        ``per_layer_config``, which transformers 5.24 reads first)."""
        eos: Any = list(cfg.eos_token_id)
        eos = eos[0] if len(eos) == 1 else (eos or None)
        full = [i for i, t in enumerate(cfg.layer_types) if t == FULL]
        return {
            "architectures": [ARCHITECTURE], "model_type": TEXT_TYPE, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "global_head_dim": cfg.full_head_dim, "num_global_key_value_heads": cfg.full_kv_heads,
            "per_layer_config": {str(i): {"head_dim": cfg.full_head_dim, "num_key_value_heads": cfg.full_kv_heads}
                                 for i in full},
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": cfg.rms_norm_eps,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_parameters": {SLIDING: cfg.sliding_rope.to_hf(), FULL: cfg.full_rope.to_hf()},
            "layer_types": list(cfg.layer_types), "sliding_window": cfg.sliding_window,
            "attention_bias": False, "attention_k_eq_v": cfg.attention_k_eq_v,
            "final_logit_softcapping": cfg.final_logit_softcapping,
            "use_bidirectional_attention": "vision" if cfg.bidirectional_vision else None,
            "hidden_size_per_layer_input": cfg.hidden_size_per_layer_input,
            "vocab_size_per_layer_input": cfg.vocab_size_per_layer_input or cfg.vocab_size,
            "num_kv_shared_layers": cfg.num_kv_shared_layers, "use_double_wide_mlp": cfg.use_double_wide_mlp,
            "enable_moe_block": cfg.enable_moe_block, "num_experts": cfg.num_experts or None,
            "top_k_experts": cfg.top_k_experts or None, "moe_intermediate_size": cfg.moe_intermediate_size or None,
            "tie_word_embeddings": cfg.tie_word_embeddings, "bos_token_id": cfg.bos_token_id,
            "eos_token_id": eos, "pad_token_id": cfg.pad_token_id}

    def check_config(self, cfg) -> None:
        if not isinstance(cfg, Gemma4Config):
            raise ValueError("a gemma4_text target needs a Gemma4Config (dflash_jax.targets.gemma4), e.g. "
                             "TargetConfig.from_hf_dict(config.json)")
        if len(cfg.layer_types) != cfg.num_layers or set(cfg.layer_types) - {SLIDING, FULL}:
            raise ValueError(f"layer_types must give {SLIDING!r} or {FULL!r} for each of the {cfg.num_layers} "
                             f"layers, got {cfg.layer_types}")
        if cfg.full_kv_heads < 1 or cfg.num_heads % cfg.full_kv_heads:
            raise ValueError(f"the full layers' KV heads ({cfg.full_kv_heads}) must divide the query heads "
                             f"({cfg.num_heads})")
        if cfg.full_head_dim % 2:
            raise ValueError(f"the full layers' head dim must be even, got {cfg.full_head_dim}")
        if cfg.enable_moe_block and not 1 <= cfg.top_k_experts <= cfg.num_experts:
            raise ValueError(f"top_k_experts must be in 1..{cfg.num_experts} (the experts), got {cfg.top_k_experts}")
        if cfg.expert_shards < 1 or (cfg.enable_moe_block and cfg.num_experts % cfg.expert_shards):
            raise ValueError(f"num_experts={cfg.num_experts} is not divisible by {cfg.expert_shards} expert shards")

    # ------------------------------------------------------------------ checkpoints
    def _layer_specs(self, cfg: Gemma4Config, i: int) -> list[tuple[str, tuple[str, ...], bool, tuple[int, ...]]]:
        D, H = cfg.hidden_size, cfg.num_heads
        Dh, Hkv, F = cfg.layer_head_dim(i), cfg.layer_kv_heads(i), cfg.layer_mlp_width(i)
        out = [("layer_scalar", ("layer_scalar", "weight"), False, (1,)),
               ("self_attn.q_proj.weight", ("self_attn", "q_proj", "kernel"), True, (H * Dh, D)),
               ("self_attn.q_norm.weight", ("self_attn", "q_norm", "weight"), False, (Dh,)),
               ("self_attn.o_proj.weight", ("self_attn", "o_proj", "kernel"), True, (D, H * Dh))]
        if i in cfg.kv_layers:
            out += [("self_attn.k_proj.weight", ("self_attn", "k_proj", "kernel"), True, (Hkv * Dh, D)),
                    ("self_attn.k_norm.weight", ("self_attn", "k_norm", "weight"), False, (Dh,))]
            if cfg.layer_has_v_proj(i):
                out.append(("self_attn.v_proj.weight", ("self_attn", "v_proj", "kernel"), True, (Hkv * Dh, D)))
        for proj, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            out.append((f"mlp.{proj}.weight", ("mlp", proj, "kernel"), True, shape))
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        if cfg.enable_moe_block:
            E = cfg.num_experts
            norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]
            out += [("router.proj.weight", ("router", "proj", "kernel"), True, (E, D)),
                    ("router.scale", ("router", "scale"), False, (D,)),
                    ("router.per_expert_scale", ("router", "per_expert_scale"), False, (E,))]
        if cfg.hidden_size_per_layer_input:
            P = cfg.hidden_size_per_layer_input
            norms.append("post_per_layer_input_norm")
            out += [("per_layer_input_gate.weight", ("per_layer_input_gate", "kernel"), True, (P, D)),
                    ("per_layer_projection.weight", ("per_layer_projection", "kernel"), True, (D, P))]
        out += [(f"{n}.weight", (n, "weight"), False, (D,)) for n in norms]
        return out

    def tensor_specs(self, cfg: Gemma4Config) -> dict[str, TensorSpec]:
        """Every tensor of a ``Gemma4ForCausalLM`` checkpoint, the experts per expert
        (``model.layers.{i}.experts.{e}.{gate,up,down}_proj.weight``, a layout of this project's:
        transformers stores them fused, :meth:`convert_checkpoint_tensors` /
        :meth:`export_checkpoint_tensors`)."""
        D, V = cfg.hidden_size, cfg.vocab_size
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        for i in range(cfg.num_layers):
            for name, path, transpose, shape in self._layer_specs(cfg, i):
                specs[f"model.layers.{i}.{name}"] = TensorSpec((f"layers_{i}",) + path, None, transpose, shape)
            if cfg.enable_moe_block:
                Fm = cfg.moe_intermediate_size
                for e in range(cfg.num_experts):
                    for proj, shape in (("gate_proj", (Fm, D)), ("up_proj", (Fm, D)), ("down_proj", (D, Fm))):
                        specs[f"model.layers.{i}.experts.{e}.{proj}.weight"] = TensorSpec(
                            (f"layers_{i}", "experts", proj), None, True, shape, expert=e)
        if cfg.hidden_size_per_layer_input:
            NP, P = cfg.num_layers * cfg.hidden_size_per_layer_input, cfg.hidden_size_per_layer_input
            specs["model.embed_tokens_per_layer.weight"] = TensorSpec(
                ("embed_tokens_per_layer", "embedding"), None, False, (cfg.vocab_size_per_layer_input, NP))
            specs["model.per_layer_model_projection.weight"] = TensorSpec(
                ("per_layer_model_projection", "kernel"), None, True, (NP, D))
            specs["model.per_layer_projection_norm.weight"] = TensorSpec(
                ("per_layer_projection_norm", "weight"), None, False, (P,))
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    _FUSED = re.compile(r"model\.layers\.(\d+)\.experts\.(gate_up_proj|down_proj)$")
    _SHARED_KV = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.weight$")

    def convert_checkpoint_tensors(self, cfg: Gemma4Config, tensors: dict, what: str = "checkpoint") -> dict:
        """The tensors as read -> the :meth:`tensor_specs` names: the multimodal layout's text
        prefix renamed and its vision / audio tensors dropped (one log line); K/V projections
        stored for KV-shared layers (which do not use them; transformers ignores them too)
        dropped (one log line); the fused experts (``experts.gate_up_proj`` [E, 2 Fm, D], gate
        rows first, and ``experts.down_proj`` [E, D, Fm]) split per expert. A fused tensor of the
        wrong shape, or a name stored twice, is a CheckpointError naming it."""
        renamed = text_model_tensors(tensors, TEXT_PREFIXES, IGNORED_PREFIXES, what, "Gemma 4")
        out, shared = {}, set()
        E, D, Fm = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        for name, arr in renamed.items():
            hit = self._SHARED_KV.match(name)
            if hit and int(hit.group(1)) >= cfg.first_shared_layer:
                shared.add(int(hit.group(1)))
                continue
            hit = self._FUSED.match(name)
            if hit is None:
                if name.endswith("self_attn.v_norm.weight"):
                    raise CheckpointError(f"{what}: {name} is a weight of the v norm, which has none in Gemma 4")
                out[name] = arr
                continue
            i, kind = int(hit.group(1)), hit.group(2)
            want = (E, 2 * Fm, D) if kind == "gate_up_proj" else (E, D, Fm)
            if not cfg.enable_moe_block or tuple(arr.shape) != want:
                raise CheckpointError(f"{what}: {name} has shape {list(arr.shape)}, expected {list(want)}"
                                      + ("" if cfg.enable_moe_block else " (and enable_moe_block is false)"))
            for e in range(E):
                if kind == "gate_up_proj":
                    out[f"model.layers.{i}.experts.{e}.gate_proj.weight"] = arr[e, :Fm]
                    out[f"model.layers.{i}.experts.{e}.up_proj.weight"] = arr[e, Fm:]
                else:
                    out[f"model.layers.{i}.experts.{e}.down_proj.weight"] = arr[e]
        if shared:
            log.warning("%s: ignored the K/V projections stored for the KV-shared layers %s (they read an "
                        "earlier layer's K/V)", what, sorted(shared))
        return out

    def export_checkpoint_tensors(self, cfg: Gemma4Config, tensors: dict) -> dict:
        """The per-expert names fused back into transformers' ``experts.gate_up_proj`` /
        ``experts.down_proj`` (the inverse of :meth:`convert_checkpoint_tensors`)."""
        if not cfg.enable_moe_block:
            return tensors
        out = {n: a for n, a in tensors.items() if ".experts." not in n}
        for i in range(cfg.num_layers):
            get = lambda e, p: tensors[f"model.layers.{i}.experts.{e}.{p}.weight"]
            E = range(cfg.num_experts)
            out[f"model.layers.{i}.experts.gate_up_proj"] = np.ascontiguousarray(
                np.stack([np.concatenate([get(e, "gate_proj"), get(e, "up_proj")]) for e in E]))
            out[f"model.layers.{i}.experts.down_proj"] = np.ascontiguousarray(np.stack([get(e, "down_proj") for e in E]))
        return out

    # ------------------------------------------------------------------ the model
    def param_shapes(self, cfg: Gemma4Config) -> dict:
        """The parameter tree with each leaf's shape (a tuple), in the tree's [in, out] layout."""
        tree: dict = {}
        for name, spec in self.tensor_specs(cfg).items():
            if spec.expert not in (None, 0):
                continue
            shape = tuple(reversed(spec.shape)) if spec.transpose else spec.shape
            if spec.expert is not None:
                shape = (cfg.local_experts,) + shape
            node = tree
            for k in spec.path[:-1]:
                node = node.setdefault(k, {})
            node[spec.path[-1]] = shape
        return tree

    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        """Random parameters (``nn.layers.random_init``): normal(init_scale) matrices and
        embeddings; norms, layer scalars and the router's scales 1."""
        params = random_params_of_shapes(self.param_shapes(cfg), key, init_scale, dtype)
        ones = ("scale", "per_expert_scale")
        return jax.tree_util.tree_map_with_path(
            lambda path, x: jnp.ones_like(x) if path[-1].key in ones and path[-2].key == "router" else x, params)

    def init_state(self, cfg, batch: int, max_len: int, dtype):
        return model.init_state(cfg, batch, max_len, dtype)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(), logit_index=None,
                compute_logits=True, attention_impl="xla", model_axis=None, expert_axis=None, tree=None,
                moe_impl: str = "auto"):
        return model.target_forward(cfg, params, tokens, positions, state, tap_layer_ids=tap_layer_ids,
                                    logit_index=logit_index, compute_logits=compute_logits,
                                    attention_impl=attention_impl, model_axis=model_axis,
                                    expert_axis=expert_axis, moe_impl=moe_impl, tree=tree)

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        return PARAM_AXES

    def state_axes(self, cfg) -> model.Gemma4State:
        kv = KVCache(k=partitioning.CACHE_AXES, v=partitioning.CACHE_AXES, lengths=("batch",))
        return model.Gemma4State(sliding=kv, full=kv)

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        dims = [("num_key_value_heads", cfg.num_kv_heads, "the sliding layers' KV heads (a GQA group is never split)"),
                ("num_global_key_value_heads", cfg.full_kv_heads, "the full layers' KV heads"),
                ("num_attention_heads", cfg.num_heads, "query heads"),
                ("intermediate_size", cfg.intermediate_size, "the MLP width"),
                ("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)")]
        if cfg.enable_moe_block:
            dims.append(("moe_intermediate_size", cfg.moe_intermediate_size, "each expert's width"))
        if cfg.hidden_size_per_layer_input:
            dims.append(("vocab_size_per_layer_input", cfg.vocab_size_per_layer_input,
                         "the per-layer input embedding's vocabulary"))
        return dims

    def local_config(self, cfg, model_shards: int):
        m = model_shards
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // m, num_kv_heads=cfg.num_kv_heads // m,
                                   full_kv_heads=cfg.full_kv_heads // m,
                                   intermediate_size=cfg.intermediate_size // m, vocab_size=cfg.vocab_size // m,
                                   moe_intermediate_size=cfg.moe_intermediate_size // m,
                                   vocab_size_per_layer_input=cfg.vocab_size_per_layer_input // m)

    def expert_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("num_experts", cfg.num_experts, "routed experts")] if cfg.enable_moe_block else []

    def expert_local_config(self, cfg, expert: int):
        return dataclasses.replace(cfg, expert_shards=cfg.expert_shards * expert)

    # ------------------------------------------------------------------ size model
    def expert_params(self, cfg) -> int:
        """One expert's matrices: gate, up [D, Fm] and down [Fm, D]."""
        return 3 * cfg.hidden_size * cfg.moe_intermediate_size

    def num_params(self, cfg) -> int:
        return sum(_counts(self, cfg))

    def matrix_params(self, cfg) -> int:
        return _counts(self, cfg)[0]

    def matrix_params_read(self, cfg, rows: int) -> float:
        """All matrices but the per-layer embedding table (rows are looked up, like the embedding's)
        and the experts no row routes to (``E * (1 - (1 - k/E) ** rows)`` read per MoE layer)."""
        read = float(self.matrix_params(cfg) - self._ple_table(cfg))
        if cfg.enable_moe_block:
            E = cfg.num_experts
            active = sizes.expected_experts(E, cfg.top_k_experts, rows)
            read -= cfg.num_layers * (E - active) * self.expert_params(cfg)
        return read

    def matrix_params_per_token(self, cfg) -> int:
        out = self.matrix_params(cfg) - self._ple_table(cfg)
        if cfg.enable_moe_block:
            out -= cfg.num_layers * (cfg.num_experts - cfg.top_k_experts) * self.expert_params(cfg)
        return out

    def _ple_table(self, cfg) -> int:
        return cfg.vocab_size_per_layer_input * cfg.num_layers * cfg.hidden_size_per_layer_input

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """K and V of every layer with its own K/V (sliding layers keep a full-length cache; the
        KV-shared layers none): ``2 sum_i Hkv_i Dh_i itemsize``."""
        return float(2 * itemsize * sum(cfg.layer_kv_heads(i) * cfg.layer_head_dim(i) for i in cfg.kv_layers))


PARAM_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    **{k: v for k, v in partitioning.PARAM_AXES.items()
       if k[0] in ("embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",
                   "gate_proj", "up_proj", "down_proj", "input_layernorm", "post_attention_layernorm", "norm")},
    ("layer_scalar", "weight"): ("scalar",),
    ("pre_feedforward_layernorm", "weight"): ("embed",),
    ("post_feedforward_layernorm", "weight"): ("embed",),
    ("pre_feedforward_layernorm_2", "weight"): ("embed",),
    ("post_feedforward_layernorm_1", "weight"): ("embed",),
    ("post_feedforward_layernorm_2", "weight"): ("embed",),
    ("post_per_layer_input_norm", "weight"): ("embed",),
    ("per_layer_input_gate", "kernel"): ("embed", "ple"),
    ("per_layer_projection", "kernel"): ("ple", "embed"),
    ("embed_tokens_per_layer", "embedding"): ("vocab", "ple"),
    ("per_layer_model_projection", "kernel"): ("embed", "ple"),
    ("per_layer_projection_norm", "weight"): ("ple",),
    ("proj", "kernel"): ("embed", "router"),
    ("router", "scale"): ("embed",),
    ("router", "per_expert_scale"): ("router",),
    ("experts", "gate_proj"): ("expert", "embed", "mlp"),
    ("experts", "up_proj"): ("expert", "embed", "mlp"),
    ("experts", "down_proj"): ("expert", "mlp", "embed"),
}
"""(module, parameter) -> logical axes (``parallel.rules``): attention and MLP as the dense
decoder's (heads and width over ``model``), the per-layer-input embedding by vocabulary like the
token embedding and the rest of the per-layer inputs replicated, the router replicated, experts
over ``expert`` and each expert's width over ``model``."""

@functools.lru_cache(maxsize=32)
def _counts(family: Gemma4Family, cfg: Gemma4Config) -> tuple[int, int]:
    """(matrix parameters, vector parameters) of ``cfg``, counted from the family's
    ``tensor_specs`` (cached per config: the rooflines ask many times)."""
    matrix = vector = 0
    for spec in family.tensor_specs(cfg).values():
        if len(spec.shape) >= 2:
            matrix += math.prod(spec.shape)
        else:
            vector += math.prod(spec.shape)
    return matrix, vector


GEMMA4 = Gemma4Family()
