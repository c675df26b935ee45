"""The Qwen3-MoE target family (``model_type`` ``qwen3_moe``: Qwen3-30B-A3B,
Qwen3-235B-A22B, Qwen3-Coder-30B-A3B; transformers' ``Qwen3MoeForCausalLM``).

A Qwen3 decoder (GQA attention with per-head q/k RMSNorm) whose layers each hold either the
sparse MoE block or the dense SwiGLU MLP: layer i is MoE iff ``num_experts > 0``, i is not in
``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers' rule). The block:
``softmax`` router over all E experts, top k (``num_experts_per_tok``), the k weights
renormalised when ``norm_topk_prob``; no shared expert (``docs/targets.md``). The forward is
``qwen3_moe_model``; the routed experts are ``nn.moe``.

Checkpoint layouts (both read, the first written; :meth:`Qwen3MoeFamily.tensor_specs`,
:meth:`Qwen3MoeFamily.convert_checkpoint_tensors`):

  * per expert (the hub's files and what transformers 5's ``save_pretrained`` writes):
    ``model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight`` [Fm, D],
    ``...experts.{e}.down_proj.weight`` [D, Fm];
  * fused (transformers 5's in-memory layout): ``model.layers.{i}.mlp.experts.gate_up_proj``
    [E, 2 Fm, D] (gate rows, then up) and ``...experts.down_proj`` [E, D, Fm].

The router is ``model.layers.{i}.mlp.gate.weight`` [E, D]; dense layers have the dense family's
``mlp.{gate,up,down}_proj.weight``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.checkpoints import CheckpointError, TensorSpec, layer_tensor_specs
from dflash_jax.config import (TargetConfig, decoder_fields_from_hf, decoder_fields_to_hf, refuse,
                               unsupported_decoder_features)
from dflash_jax.nn import partitioning
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.layers import random_init
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.moe import qwen3_moe_model as model

MODEL_TYPE = "qwen3_moe"


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(TargetConfig):
    """A Qwen3-MoE target's config: :class:`TargetConfig` (``intermediate_size`` = F, the dense
    layers' MLP width) plus the MoE fields. ``num_experts`` = E, ``num_experts_per_tok`` = k,
    ``moe_intermediate_size`` = Fm (one expert's SwiGLU width), ``norm_topk_prob`` (renormalise
    the k routing weights), ``decoder_sparse_step`` and ``mlp_only_layers`` (which layers are
    dense: :meth:`is_moe_layer`)."""

    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_moe_layer(self, i: int) -> bool:
        """transformers' rule: ``i not in mlp_only_layers and num_experts > 0 and (i + 1) %
        decoder_sparse_step == 0``."""
        return (i not in self.mlp_only_layers and self.num_experts > 0
                and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The MoE layers' indices, in order."""
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """The dense-MLP layers' indices, in order."""
        return tuple(i for i in range(self.num_layers) if not self.is_moe_layer(i))


_ONE = lambda v: v is None or (not isinstance(v, bool) and float(v) == 1.0)
_NONE = lambda v: not v
_ROUTING_OPTIONS = (
    # (field, value that is fine, why it is refused otherwise)
    ("scoring_func", lambda v: v in (None, "softmax"), "only the softmax router is implemented"),
    ("topk_method", lambda v: v in (None, "greedy"),
     "only plain top-k routing is implemented (no group-limited or bias-corrected top-k)"),
    ("n_group", lambda v: v in (None, 0, 1), "group-limited routing is not implemented"),
    ("topk_group", lambda v: v in (None, 0, 1), "group-limited routing is not implemented"),
    ("routed_scaling_factor", _ONE, "scaling the routed experts' output is not implemented"),
    ("e_score_correction_bias", _NONE, "bias-corrected routing is not implemented"),
    ("router_bias", _NONE, "a router bias is not implemented (Qwen3-MoE has none)"),
    ("moe_router_type", lambda v: v in (None, "softmax", "topk"), "unknown router type"),
    ("router_type", lambda v: v in (None, "softmax", "topk"), "unknown router type"),
    ("n_shared_experts", _NONE, "shared experts are not implemented in qwen3_moe"),
    ("shared_expert_intermediate_size", _NONE, "shared experts are not implemented in qwen3_moe"),
    ("moe_layer_freq", lambda v: v in (None, 1), "use decoder_sparse_step / mlp_only_layers"),
    ("first_k_dense_replace", _NONE, "use mlp_only_layers"),
)
"""Routing fields (of other MoE configs) that ask for something this family does not compute.
``output_router_logits`` and ``router_aux_loss_coef`` are training-only (the auxiliary
load-balancing loss) and are accepted and ignored."""


def _int(d: Mapping[str, Any], field: str, default=None) -> int:
    v = d.get(field, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise ValueError(f"target config.json ({MODEL_TYPE}): {field} must be an integer, got {v!r}")
    return int(v)


class Qwen3MoeFamily(TargetFamily):
    """The ``qwen3_moe`` family (module docstring)."""

    model_types = (MODEL_TYPE,)
    tree_refusal = None  # verifies trees (nn.tree_attention)
    name = MODEL_TYPE
    architecture = "Qwen3MoeForCausalLM"
    qk_norm = True

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]) -> Qwen3MoeConfig:
        """Reads a ``Qwen3MoeForCausalLM`` config.json. ``num_experts`` may be spelled
        ``num_local_experts`` (what transformers 5 writes); unimplemented routing fields
        (:data:`_ROUTING_OPTIONS`) and attention variants are refused, naming the field."""
        what = f"target config.json ({MODEL_TYPE})"
        fields = decoder_fields_from_hf(d, "config.json")
        problems = unsupported_decoder_features(d, qwen3_attention=True)
        problems += [f"{f}={d[f]!r}: {why}" for f, fine, why in _ROUTING_OPTIONS
                     if f in d and not fine(d[f])]
        refuse(problems, what)
        spellings = {k: d[k] for k in ("num_experts", "num_local_experts") if d.get(k) is not None}
        if len(set(spellings.values())) > 1:
            raise ValueError(f"{what} gives contradictory expert counts "
                             f"({', '.join(f'{k}={v}' for k, v in spellings.items())}): make them equal")
        missing = [k for k in ("num_experts_per_tok", "moe_intermediate_size") if d.get(k) is None]
        if not spellings:
            missing.insert(0, "num_experts")
        if missing:
            raise ValueError(f"{what} is missing the MoE fields: {', '.join(missing)}")
        only = d.get("mlp_only_layers") or []
        if not isinstance(only, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in only):
            raise ValueError(f"{what}: mlp_only_layers must be a list of layer indices, got {only!r}")
        norm = d.get("norm_topk_prob", False)
        if not isinstance(norm, bool):
            raise ValueError(f"{what}: norm_topk_prob must be true or false, got {norm!r}")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return Qwen3MoeConfig(
            model_type=MODEL_TYPE, **fields,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"), eos_token_id=eos_ids,
            num_experts=int(next(iter(spellings.values()))),
            num_experts_per_tok=_int(d, "num_experts_per_tok"),
            moe_intermediate_size=_int(d, "moe_intermediate_size"),
            norm_topk_prob=norm, decoder_sparse_step=_int(d, "decoder_sparse_step", 1),
            mlp_only_layers=tuple(sorted(set(only))))

    def check_config(self, cfg) -> None:
        if not isinstance(cfg, Qwen3MoeConfig):
            raise ValueError("a qwen3_moe target needs a Qwen3MoeConfig (dflash_jax.targets.moe), "
                             "with the MoE fields")
        if cfg.num_experts < 0:
            raise ValueError(f"num_experts must be >= 0, got {cfg.num_experts}")
        if cfg.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {cfg.decoder_sparse_step}")
        bad = [i for i in cfg.mlp_only_layers if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are outside layers 0..{cfg.num_layers - 1}")
        if cfg.moe_layers:
            if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
                raise ValueError(f"num_experts_per_tok must be in 1..num_experts={cfg.num_experts}, "
                                 f"got {cfg.num_experts_per_tok}")
            if cfg.moe_intermediate_size < 1:
                raise ValueError(f"moe_intermediate_size must be positive, got {cfg.moe_intermediate_size}")

    def config_to_hf(self, cfg: Qwen3MoeConfig) -> dict:
        """The hub's ``Qwen3MoeForCausalLM`` layout (``num_experts``, full attention spelled
        out), RoPE in both generations' spellings (``config.decoder_fields_to_hf``)."""
        eos: Any = list(cfg.eos_token_id)
        eos = eos[0] if len(eos) == 1 else (eos or None)
        return {"architectures": [self.architecture], "model_type": MODEL_TYPE,
                **decoder_fields_to_hf(cfg), "tie_word_embeddings": cfg.tie_word_embeddings,
                "attention_bias": cfg.attention_bias, "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": cfg.num_layers,
                "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_intermediate_size,
                "norm_topk_prob": cfg.norm_topk_prob, "decoder_sparse_step": cfg.decoder_sparse_step,
                "mlp_only_layers": list(cfg.mlp_only_layers),
                "bos_token_id": cfg.bos_token_id, "eos_token_id": eos}

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg: Qwen3MoeConfig) -> dict[str, TensorSpec]:
        """All tensors of the per-expert layout (module docstring)."""
        D, V, E, Fm = cfg.hidden_size, cfg.vocab_size, cfg.num_experts, cfg.moe_intermediate_size
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        shared = layer_tensor_specs("model.", cfg.num_layers, D, cfg.num_heads, cfg.num_kv_heads,
                                    cfg.head_dim, cfg.intermediate_size, True, cfg.attention_bias)
        specs.update({n: s for n, s in shared.items() if ".mlp." not in n})
        for j, i in enumerate(cfg.dense_layers):
            for proj, shape in (("gate_proj", (cfg.intermediate_size, D)),
                                ("up_proj", (cfg.intermediate_size, D)),
                                ("down_proj", (D, cfg.intermediate_size))):
                specs[f"model.layers.{i}.mlp.{proj}.weight"] = TensorSpec(
                    ("layers", "mlp", proj, "kernel"), j, True, shape)
        for m, i in enumerate(cfg.moe_layers):
            specs[f"model.layers.{i}.mlp.gate.weight"] = TensorSpec(
                ("layers", "moe", "gate", "kernel"), m, True, (E, D))
            for e in range(E):
                for proj, shape in (("gate_proj", (Fm, D)), ("up_proj", (Fm, D)), ("down_proj", (D, Fm))):
                    specs[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] = TensorSpec(
                        ("layers", "moe", "experts", proj), m, True, shape, expert=e)
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    _FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")

    def convert_checkpoint_tensors(self, cfg: Qwen3MoeConfig, tensors: dict[str, np.ndarray],
                                   what: str = "checkpoint") -> dict[str, np.ndarray]:
        """The fused layout (``mlp.experts.gate_up_proj`` [E, 2 Fm, D], ``mlp.experts.down_proj``
        [E, D, Fm]) split into the per-expert tensors :meth:`tensor_specs` names; other names
        pass through (the set is checked afterwards). A fused tensor of a dense layer, with the
        wrong shape, or beside the same layer's per-expert tensors is a CheckpointError naming it."""
        E, D, Fm = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        out = dict(tensors)
        moe_layers = set(cfg.moe_layers)
        for name in sorted(tensors):
            hit = self._FUSED.match(name)
            if hit is None:
                continue
            i, kind = int(hit.group(1)), hit.group(2)
            arr = out.pop(name)
            if i not in moe_layers:
                raise CheckpointError(f"{what}: {name} is an expert tensor, but layer {i} is a "
                                      "dense layer in this config (mlp_only_layers / decoder_sparse_step)")
            want = (E, 2 * Fm, D) if kind == "gate_up_proj" else (E, D, Fm)
            if tuple(arr.shape) != want:
                raise CheckpointError(f"{what}: {name} has shape {list(arr.shape)}, expected "
                                      f"{list(want)} (num_experts, {'2 * moe_intermediate_size, hidden_size' if kind == 'gate_up_proj' else 'hidden_size, moe_intermediate_size'})")
            parts = ({"gate_proj": arr[:, :Fm], "up_proj": arr[:, Fm:]} if kind == "gate_up_proj"
                     else {"down_proj": arr})
            for proj, stacked in parts.items():
                for e in range(E):
                    per = f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"
                    if per in tensors:
                        raise CheckpointError(f"{what}: layer {i} stores its experts both fused "
                                              f"({name}) and per expert ({per}); keep one layout")
                    out[per] = np.ascontiguousarray(stacked[e])
        return out

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        """Random parameters (``qwen3_moe_model`` tree): matrices normal(``init_scale``), norms 1."""
        D, V, Dh, E, Fm, F = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim, cfg.num_experts,
                              cfg.moe_intermediate_size, cfg.intermediate_size)
        N, Nm, Nd = cfg.num_layers, len(cfg.moe_layers), len(cfg.dense_layers)
        H, Hkv = cfg.num_heads * Dh, cfg.num_kv_heads * Dh
        attn = {"q_proj": {"kernel": (N, D, H)}, "k_proj": {"kernel": (N, D, Hkv)},
                "v_proj": {"kernel": (N, D, Hkv)}, "o_proj": {"kernel": (N, H, D)},
                "q_norm": {"weight": (N, Dh)}, "k_norm": {"weight": (N, Dh)}}
        if cfg.attention_bias:
            for name, w in (("q_proj", H), ("k_proj", Hkv), ("v_proj", Hkv), ("o_proj", D)):
                attn[name]["bias"] = (N, w)
        layers: dict[str, Any] = {"input_layernorm": {"weight": (N, D)},
                                  "post_attention_layernorm": {"weight": (N, D)}, "self_attn": attn}
        if Nd:
            layers["mlp"] = {"gate_proj": {"kernel": (Nd, D, F)}, "up_proj": {"kernel": (Nd, D, F)},
                             "down_proj": {"kernel": (Nd, F, D)}}
        if Nm:
            layers["moe"] = {"gate": {"kernel": (Nm, D, E)},
                             "experts": {"gate_proj": (Nm, E, D, Fm), "up_proj": (Nm, E, D, Fm),
                                         "down_proj": (Nm, E, Fm, D)}}
        shapes: dict[str, Any] = {"embed_tokens": {"embedding": (V, D)}, "layers": layers,
                                  "norm": {"weight": (D,)}}
        if not cfg.tie_word_embeddings:
            shapes["lm_head"] = {"kernel": (D, V)}
        is_shape = lambda x: isinstance(x, tuple)

        def init(k):
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s, dtype), shapes, is_leaf=is_shape)
            return random_init(zeros, k, init_scale, dtype)

        return jax.jit(init)(key)

    def init_state(self, cfg, batch: int, max_len: int, dtype) -> KVCache:
        return KVCache.for_config(cfg, batch, max_len, dtype)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None,
                expert_axis=None, moe_impl="auto", tree=None):
        """``qwen3_moe_model.target_forward``; ``expert_axis``: the mesh axis the experts are
        split over (expert parallelism); ``moe_impl``: ``nn.moe.moe_ffn``'s ``impl``."""
        return model.target_forward(cfg, params, tokens, positions, state,
                                    tap_layer_ids=tap_layer_ids, logit_index=logit_index,
                                    compute_logits=compute_logits, attention_impl=attention_impl,
                                    model_axis=model_axis, expert_axis=expert_axis, moe_impl=moe_impl,
                                    tree=tree)

    split_layers = staticmethod(model.split_layer_params)  # TargetFamily.loop_params, on CPU

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        """The decoder table plus the MoE block: the router [D, E] replicated (every shard
        routes its rows over all experts), the experts' stacked weights with the logical
        ``expert`` axis on E (expert parallelism) and ``mlp`` on each expert's width Fm (tensor
        parallelism inside the experts, as the dense MLP's width: a psum after down_proj)."""
        return {**partitioning.PARAM_AXES,
                ("gate", "kernel"): ("embed", "router"),
                ("experts", "gate_proj"): ("expert", "embed", "mlp"),
                ("experts", "up_proj"): ("expert", "embed", "mlp"),
                ("experts", "down_proj"): ("expert", "mlp", "embed")}

    def state_axes(self, cfg) -> KVCache:
        return KVCache(k=partitioning.CACHE_AXES, v=partitioning.CACHE_AXES, lengths=("batch",))

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        dims = [("num_key_value_heads", cfg.num_kv_heads, "KV heads (a GQA group is never split)"),
                ("num_attention_heads", cfg.num_heads, "query heads")]
        if cfg.dense_layers:
            dims.append(("intermediate_size", cfg.intermediate_size, "dense layers' MLP width"))
        if cfg.moe_layers:
            dims.append(("moe_intermediate_size", cfg.moe_intermediate_size, "each expert's MLP width"))
        dims.append(("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)"))
        return dims

    def local_config(self, cfg, model: int):
        return dataclasses.replace(
            cfg, num_heads=cfg.num_heads // model, num_kv_heads=cfg.num_kv_heads // model,
            intermediate_size=(cfg.intermediate_size // model if cfg.dense_layers
                               else cfg.intermediate_size),
            moe_intermediate_size=(cfg.moe_intermediate_size // model if cfg.moe_layers
                                   else cfg.moe_intermediate_size),
            vocab_size=cfg.vocab_size // model)

    def expert_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("num_experts", cfg.num_experts, "routed experts")] if cfg.moe_layers else []

    def expert_local_config(self, cfg, expert: int):
        """Unchanged: the router scores all ``num_experts`` experts on every shard, and the
        forward takes the local expert count from the expert weights' leading dimension."""
        return cfg

    # ------------------------------------------------------------------ size model
    def attention_matrix_params(self, cfg) -> int:
        """One layer's q, k, v, o matrices."""
        return cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)

    def expert_params(self, cfg) -> int:
        """One routed expert's matrices: ``3 * D * Fm``."""
        return 3 * cfg.hidden_size * cfg.moe_intermediate_size

    def layer_vector_params(self, cfg) -> int:
        D, Dh = cfg.hidden_size, cfg.head_dim
        bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh + D if cfg.attention_bias else 0
        return 2 * D + 2 * Dh + bias

    def _matrices(self, cfg, experts_per_moe_layer: float) -> float:
        D = cfg.hidden_size
        Nm, Nd = len(cfg.moe_layers), len(cfg.dense_layers)
        tables = 1 if cfg.tie_word_embeddings else 2
        return (cfg.num_layers * self.attention_matrix_params(cfg)
                + Nd * 3 * D * cfg.intermediate_size
                + Nm * (D * cfg.num_experts + experts_per_moe_layer * self.expert_params(cfg))
                + tables * cfg.vocab_size * D)

    def num_params(self, cfg) -> int:
        return int(self.matrix_params(cfg) + cfg.num_layers * self.layer_vector_params(cfg)
                   + cfg.hidden_size)

    def matrix_params(self, cfg) -> int:
        """Embedding, head, attention, dense MLPs, routers and every expert."""
        return int(self._matrices(cfg, cfg.num_experts))

    def matrix_params_read(self, cfg, rows: int) -> float:
        """The shared matrices plus, per MoE layer, the experts ``rows`` tokens route to under
        uniform routing: ``E * (1 - (1 - k/E) ** rows)`` (k for one row, at most E)."""
        E, k = cfg.num_experts, cfg.num_experts_per_tok
        active = E * (1 - (1 - k / E) ** rows) if E else 0.0
        return float(self._matrices(cfg, active))

    def matrix_params_per_token(self, cfg) -> int:
        """Shared matrices, routers and the k routed experts of each MoE layer."""
        return int(self._matrices(cfg, cfg.num_experts_per_tok))

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """K and V of every layer: ``2 * L * Hkv * Dh * itemsize``."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


QWEN3_MOE = Qwen3MoeFamily()
