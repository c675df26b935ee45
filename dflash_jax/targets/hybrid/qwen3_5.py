"""The Qwen3.5 / Qwen3.6 target families: ``qwen3_5_text`` (dense MLP: Qwen3.5-4B / 9B / 27B,
Qwen3.6-27B; transformers' ``Qwen3_5ForCausalLM``) and ``qwen3_5_moe_text`` (every layer's MLP
the sparse MoE block with a shared expert: the Qwen3.5 / 3.6 MoE models;
``Qwen3_5MoeForCausalLM``). The maths is ``targets.hybrid.model``; this module reads and writes
their config.json, names their tensors and sizes them (``docs/targets.md``).

Both read the text-only layout (``model_type`` ``qwen3_5_text`` / ``qwen3_5_moe_text``,
``model.layers.{i}...``) and the released multimodal one (``qwen3_5`` / ``qwen3_5_moe``,
``Qwen3_5ForConditionalGeneration``): the text config under ``text_config`` (the top-level
``tie_word_embeddings`` decides the tying, as transformers does), the weights under
``model.language_model.`` and ``lm_head.weight``. The vision tower (``model.visual.*``) and the
multi-token-prediction head (``mtp.*``) are not used and are ignored by name, with a log line
counting them. What is loaded is the text model: it is saved back in the text-only layout.

Tensor names of layer i (on disk; ``model.language_model.`` instead of ``model.`` in the
multimodal layout): ``input_layernorm.weight``, ``post_attention_layernorm.weight``; a GDN layer
``linear_attn.{in_proj_qkv,in_proj_z,in_proj_a,in_proj_b,out_proj}.weight``,
``linear_attn.conv1d.weight`` [C, 1, K], ``linear_attn.{A_log,dt_bias}`` [Hv],
``linear_attn.norm.weight`` [dv]; an attention layer ``self_attn.{q,k,v,o}_proj.weight``
(q of 2 H Dh rows: query and gate per head), ``self_attn.{q,k}_norm.weight``; the MLP
``mlp.{gate,up,down}_proj.weight`` or the MoE block's tensors (``qwen3_5_moe``: fused or per
expert).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import jax
import numpy as np

from dflash_jax.checkpoints import CheckpointError, TensorSpec
from dflash_jax.config import decoder_fields_from_hf, refuse
from dflash_jax.nn import gated_delta, partitioning
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.hybrid import model
from dflash_jax.targets.moe import qwen3_5_moe as block
from dflash_jax.targets.moe.qwen3_5_moe import (block_config_from_hf, block_config_to_hf, convert_fused_experts,
                                               mlp_tensor_specs)
from dflash_jax.targets.hybrid.config import (FULL, LAYER_TYPES, LINEAR, HybridConfig,
                                              check_hybrid_config)

log = logging.getLogger(__name__)

TEXT, MOE_TEXT = "qwen3_5_text", "qwen3_5_moe_text"
MULTIMODAL = {TEXT: "qwen3_5", MOE_TEXT: "qwen3_5_moe"}
"""The multimodal ``model_type`` whose ``text_config`` is each text model."""
IGNORED_PREFIXES = {"model.visual.": "vision-tower", "mtp.": "multi-token-prediction"}
"""Tensors of a checkpoint that the text target does not use, ignored by name."""
MULTIMODAL_PREFIX = "model.language_model."
DEFAULT_PARTIAL_ROTARY = 0.25
"""transformers' default when a Qwen3.5 config names no ``partial_rotary_factor``."""
ROPE_EXTRA_FIELDS = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")
"""``rope_parameters`` fields beside theta and type: the rotated fraction, and the multimodal
RoPE's sections (with text only, every section sees the same position: plain RoPE)."""


def _int(d: Mapping[str, Any], field: str, what: str, default=None) -> int:
    v = d.get(field, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise ValueError(f"{what}: {field} must be an integer, got {v!r}")
    return int(v)


class Qwen3_5Family(TargetFamily):
    """``qwen3_5_text`` (``moe=False``) or ``qwen3_5_moe_text`` (``moe=True``); module docstring."""

    state_class = model.HybridState
    """The decode state's class (a test may register a family with a subclass)."""

    tree_refusal = None  # verifies trees: each node's GDN state is its root path's (nn.gated_delta.tree_delta)

    def __init__(self, moe: bool):
        self.moe = moe
        text = MOE_TEXT if moe else TEXT
        self.model_types = (text, MULTIMODAL[text])
        self.name = text
        self.architecture = "Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"

    # ------------------------------------------------------------------ config
    def text_config(self, d: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
        """(the text model's fields, tie_word_embeddings) of a text-only or multimodal
        config.json dict; a multimodal one without ``text_config`` is a one-line ValueError."""
        if d.get("model_type") == self.model_types[1]:
            tc = d.get("text_config")
            if not isinstance(tc, Mapping):
                raise ValueError(
                    f"config.json ({self.model_types[1]}) has no text_config: a multimodal "
                    f"{self.model_types[1]} checkpoint keeps the text model's fields there (or give "
                    f"a text-only config with model_type {self.name!r})")
            tie = d.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))
            merged = dict(tc)
            for k in ("eos_token_id", "bos_token_id"):
                if merged.get(k) is None and d.get(k) is not None:
                    merged[k] = d[k]
            return merged, bool(tie)
        return d, bool(d.get("tie_word_embeddings", False))

    def config_from_hf(self, d: Mapping[str, Any]) -> HybridConfig:
        """Reads a ``Qwen3_5(Moe)ForCausalLM`` or ``Qwen3_5(Moe)ForConditionalGeneration``
        config.json. ``layer_types`` defaults as transformers builds it (every
        ``full_attention_interval``-th layer, default 4, full attention);
        ``partial_rotary_factor`` from ``rope_parameters`` or the top level (default 0.25).
        Refused, naming the field: a layer type other than ``linear_attention`` /
        ``full_attention``, ``layer_types`` of another length than ``num_hidden_layers``,
        value heads not a multiple of key heads, a rope type other than the plain one, an
        activation other than silu, MoE routing options the block does not implement."""
        tc, tie = self.text_config(d)
        what = f"target config.json ({self.name})"
        src = dict(tc)
        moe_cfg = None
        if self.moe:
            moe_cfg = block_config_from_hf(tc, what)
            src.setdefault("intermediate_size", moe_cfg.shared_expert_intermediate_size)
        fields = decoder_fields_from_hf(src, what)
        problems = []
        act = tc.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            problems.append(f"hidden_act={act!r}: only silu is implemented")
        if tc.get("mlp_bias"):
            problems.append("mlp_bias=true: MLP biases are not implemented")
        refuse(problems, what)
        n = fields["num_layers"]
        types = tc.get("layer_types")
        if types is None:
            interval = _int(tc, "full_attention_interval", what, 4)
            types = [LINEAR if (i + 1) % interval else FULL for i in range(n)]
        if not isinstance(types, (list, tuple)):
            raise ValueError(f"{what}: layer_types must be a list of {' / '.join(LAYER_TYPES)}, got {types!r}")
        for i, t in enumerate(types):
            if t not in LAYER_TYPES:
                raise ValueError(f"{what}: layer_types[{i}]={t!r} is not a known layer type "
                                 f"(known: {', '.join(LAYER_TYPES)})")
        if len(types) != n:
            raise ValueError(f"{what}: layer_types has {len(types)} entries but num_hidden_layers is "
                             f"{n}: give one type per layer")
        hk = _int(tc, "linear_num_key_heads", what, 16)
        hv = _int(tc, "linear_num_value_heads", what, 32)
        if hk <= 0 or hv % hk:
            raise ValueError(f"{what}: linear_num_value_heads ({hv}) must be a multiple of "
                             f"linear_num_key_heads ({hk})")
        rp = tc.get("rope_parameters") if isinstance(tc.get("rope_parameters"), Mapping) else {}
        factors = {w: float(s["partial_rotary_factor"]) for w, s in
                   (("partial_rotary_factor", tc), ("rope_parameters.partial_rotary_factor", rp))
                   if s.get("partial_rotary_factor") is not None}
        if len(set(factors.values())) > 1:
            raise ValueError(f"{what} gives contradictory partial rotary factors ("
                             + ", ".join(f"{k}={v}" for k, v in factors.items()) + "): make them equal")
        if fields["rope"].rope_type != "default":
            raise ValueError(f"{what}: rope type {fields['rope'].rope_type!r} is not implemented for "
                             f"{self.name} (rope_parameters.rope_type must be 'default'; "
                             f"{', '.join(ROPE_EXTRA_FIELDS)} are read)")
        eos = tc.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return HybridConfig(
            model_type=self.name, **fields, tie_word_embeddings=tie,
            attention_bias=bool(tc.get("attention_bias", False)),
            bos_token_id=tc.get("bos_token_id"), eos_token_id=eos_ids,
            layer_types=tuple(types), linear_num_key_heads=hk, linear_num_value_heads=hv,
            linear_key_head_dim=_int(tc, "linear_key_head_dim", what, 128),
            linear_value_head_dim=_int(tc, "linear_value_head_dim", what, 128),
            linear_conv_kernel_dim=_int(tc, "linear_conv_kernel_dim", what, 4),
            partial_rotary_factor=next(iter(factors.values()), DEFAULT_PARTIAL_ROTARY),
            moe=moe_cfg)

    def check_config(self, cfg) -> None:
        check_hybrid_config(cfg)
        if self.moe and cfg.moe is None:
            raise ValueError(f"a {self.name} config needs the MoE block's fields (moe=MoeBlockConfig)")
        if not self.moe and cfg.moe is not None:
            raise ValueError(f"a {self.name} config has a dense MLP; use {MOE_TEXT} for the MoE block")
        if cfg.moe is not None and cfg.moe.hidden_size != cfg.hidden_size:
            raise ValueError(f"the MoE block's hidden_size ({cfg.moe.hidden_size}) must equal "
                             f"hidden_size ({cfg.hidden_size})")

    def config_to_hf(self, cfg: HybridConfig) -> dict:
        """The text-only layout transformers loads as ``Qwen3_5(Moe)ForCausalLM``: the decoder
        shapes, ``layer_types``, the ``linear_*`` fields, RoPE as ``rope_parameters`` (with
        ``partial_rotary_factor``), the MoE block's fields (no ``intermediate_size`` then).
        ``gdn_rollback`` / ``gdn_chunk`` / ``gdn_impl`` are run options and are not written."""
        eos: Any = list(cfg.eos_token_id)
        eos = eos[0] if len(eos) == 1 else (eos or None)
        out = {"architectures": [self.architecture], "model_type": self.name,
               "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
               "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
               "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
               "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
               "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope.theta,
                                   "partial_rotary_factor": cfg.partial_rotary_factor},
               "max_position_embeddings": cfg.max_position_embeddings,
               "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
               "layer_types": list(cfg.layer_types),
               "linear_num_key_heads": cfg.linear_num_key_heads,
               "linear_num_value_heads": cfg.linear_num_value_heads,
               "linear_key_head_dim": cfg.linear_key_head_dim,
               "linear_value_head_dim": cfg.linear_value_head_dim,
               "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
               "bos_token_id": cfg.bos_token_id, "eos_token_id": eos}
        if cfg.moe is not None:
            out.update(block_config_to_hf(cfg.moe))
        else:
            out["intermediate_size"] = cfg.intermediate_size
        return out

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg: HybridConfig) -> dict[str, TensorSpec]:
        """Every tensor of the text-only layout (module docstring); the MoE block's experts per
        expert (the fused layout is converted: :meth:`convert_checkpoint_tensors`)."""
        D, V, H, Hkv, Dh = cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        Hv, dv, C, K = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.conv_channels,
                        cfg.linear_conv_kernel_dim)
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        gdn = [("in_proj_qkv.weight", ("in_proj_qkv", "kernel"), True, (C, D)),
               ("in_proj_z.weight", ("in_proj_z", "kernel"), True, (Hv * dv, D)),
               ("in_proj_a.weight", ("in_proj_a", "kernel"), True, (Hv, D)),
               ("in_proj_b.weight", ("in_proj_b", "kernel"), True, (Hv, D)),
               ("conv1d.weight", ("conv1d", "kernel"), True, (C, 1, K)),
               ("A_log", ("A_log",), False, (Hv,)), ("dt_bias", ("dt_bias",), False, (Hv,)),
               ("norm.weight", ("norm", "weight"), False, (dv,)),
               ("out_proj.weight", ("out_proj", "kernel"), True, (D, Hv * dv))]
        attn = [("q_proj.weight", ("q_proj", "kernel"), True, (2 * H * Dh, D)),
                ("k_proj.weight", ("k_proj", "kernel"), True, (Hkv * Dh, D)),
                ("v_proj.weight", ("v_proj", "kernel"), True, (Hkv * Dh, D)),
                ("o_proj.weight", ("o_proj", "kernel"), True, (D, H * Dh)),
                ("q_norm.weight", ("q_norm", "weight"), False, (Dh,)),
                ("k_norm.weight", ("k_norm", "weight"), False, (Dh,))]
        if cfg.attention_bias:
            attn += [(f"{n}.bias", (n, "bias"), False, (w,)) for n, w in
                     (("q_proj", 2 * H * Dh), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh), ("o_proj", D))]
        grouped = gated_delta.group_order(cfg.linear_num_key_heads, cfg.linear_key_head_dim, Hv, dv)
        F = cfg.intermediate_size
        dense = [("gate_proj.weight", ("gate_proj", "kernel"), True, (F, D)),
                 ("up_proj.weight", ("up_proj", "kernel"), True, (F, D)),
                 ("down_proj.weight", ("down_proj", "kernel"), True, (D, F))]
        for i in range(cfg.num_layers):
            mixer, mlp_kind = cfg.layer_kinds(i)
            j, m = cfg.stack_index(i)
            p = f"model.layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                specs[f"{p}{norm}.weight"] = TensorSpec((mixer, norm, "weight"), j, False, (D,))
            sub, table = ("linear_attn", gdn) if mixer == "gdn" else ("self_attn", attn)
            for name, path, transpose, shape in table:
                order = grouped if name in self._GROUPED else None
                specs[f"{p}{sub}.{name}"] = TensorSpec((mixer, sub) + path, j, transpose, shape, order=order)
            if mlp_kind == "moe":
                specs.update(mlp_tensor_specs(cfg.moe, f"{p}mlp.", ("moe",), m))
            else:
                for name, path, transpose, shape in dense:
                    specs[f"{p}mlp.{name}"] = TensorSpec(("mlp",) + path, m, transpose, shape)
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    _GROUPED = ("in_proj_qkv.weight", "conv1d.weight")
    """The GDN tensors whose channels the parameters keep grouped by key head (stored: q, k, v;
    ``nn.gated_delta.group_order``), so that a split by heads keeps whole groups."""

    _GDN_TENSORS = ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight", "in_proj_b.weight",
                    "conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight")

    def convert_checkpoint_tensors(self, cfg: HybridConfig, tensors: dict[str, np.ndarray],
                                   what: str = "checkpoint") -> dict[str, np.ndarray]:
        """The tensors as read -> the :meth:`tensor_specs` names: the multimodal layout's
        ``model.language_model.`` prefix becomes ``model.``; the vision tower
        (``model.visual.*``) and the MTP head (``mtp.*``) are dropped, with one log line
        counting them; the MoE block's fused experts are split per expert. A GDN tensor that is
        missing or a conv1d whose kernel size is not ``linear_conv_kernel_dim`` is a one-line
        CheckpointError naming the tensor."""
        out: dict[str, np.ndarray] = {}
        ignored = {kind: 0 for kind in IGNORED_PREFIXES.values()}
        for name, arr in tensors.items():
            kind = next((k for p, k in IGNORED_PREFIXES.items() if name.startswith(p)), None)
            if kind is not None:
                ignored[kind] += 1
                continue
            if name.startswith(MULTIMODAL_PREFIX):
                new = "model." + name[len(MULTIMODAL_PREFIX):]
                if new in tensors:
                    raise CheckpointError(f"{what}: {name} and {new} are both stored: keep one layout")
                name = new
            out[name] = arr
        if any(ignored.values()):
            log.warning("%s: ignored %s (not part of the %s text model)", what,
                        " and ".join(f"{n} {k} tensors ({p}*)" for (p, k), n in
                                     zip(IGNORED_PREFIXES.items(), ignored.values()) if n), self.name)
        self.check_gdn_tensors(cfg, {n: tuple(t.shape) for n, t in out.items()}, what)
        if cfg.moe is not None:
            for i in range(cfg.num_layers):
                out = convert_fused_experts(cfg.moe, out, f"model.layers.{i}.mlp.", what)
        return out

    def check_checkpoint_tensors(self, cfg: HybridConfig, shapes: Mapping[str, tuple[int, ...]],
                                 what: str = "checkpoint") -> None:
        """The loader's pre-check of a text-only checkpoint (``TargetFamily``):
        :meth:`check_gdn_tensors`."""
        self.check_gdn_tensors(cfg, shapes, what)

    def check_gdn_tensors(self, cfg: HybridConfig, shapes: Mapping[str, tuple[int, ...]],
                          what: str = "checkpoint") -> None:
        """One-line CheckpointErrors for the GDN layers' tensors among ``shapes`` ({name:
        shape}, text-only names): the first missing one, or a conv1d of another kernel size
        or channel count than the config's."""
        C, K = cfg.conv_channels, cfg.linear_conv_kernel_dim
        for i in cfg.gdn_layers:
            p = f"model.layers.{i}.linear_attn."
            for t in self._GDN_TENSORS:
                if p + t not in shapes:
                    raise CheckpointError(f"{what}: GDN tensor {p + t} is missing (layer {i} is a "
                                          "linear_attention layer in layer_types)")
            conv = tuple(shapes[p + "conv1d.weight"])
            if len(conv) == 3 and conv[0] == C and conv[1] == 1 and conv[2] != K:
                raise CheckpointError(f"{what}: {p}conv1d.weight has kernel size {conv[2]} "
                                      f"({list(conv)}) but linear_conv_kernel_dim is {K} in config.json")
            if conv != (C, 1, K):
                raise CheckpointError(f"{what}: {p}conv1d.weight has shape {list(conv)}, expected "
                                      f"[{C}, 1, {K}] (2 * linear_num_key_heads * linear_key_head_dim + "
                                      "linear_num_value_heads * linear_value_head_dim, 1, "
                                      "linear_conv_kernel_dim)")

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        return model.init_params(cfg, key, dtype, init_scale)

    def init_state(self, cfg, batch: int, max_len: int, dtype):
        return model.init_state(cfg, batch, max_len, dtype, self.state_class)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None,
                expert_axis=None, moe_impl="auto", tree=None):
        return model.forward(cfg, params, tokens, positions, state, tap_layer_ids=tap_layer_ids,
                             logit_index=logit_index, compute_logits=compute_logits,
                             attention_impl=attention_impl, model_axis=model_axis,
                             expert_axis=expert_axis, moe_impl=moe_impl, tree=tree)

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg: HybridConfig) -> dict:
        """Every parameter's logical axes (``parallel.rules``), keyed by its whole path (the
        stacks ``gdn``, ``attn``, ``mlp`` and ``moe`` carry their ``layers`` axis first): the
        gated attention and the dense MLP as the dense decoder's (its q_proj's query-and-gate
        pairs stay with their head); a GDN layer split by key heads over ``model``
        (``gdn_heads``): in_proj_qkv's and the conv's channels (grouped by key head,
        ``nn.gated_delta.group_order``), in_proj_z / a / b, A_log, dt_bias and out_proj's rows
        by the value heads of those key heads, the output norm [dv] replicated; the MoE block's
        experts over ``expert`` (``qwen3_5_moe.PARAM_AXES``)."""
        gdn = {("in_proj_qkv", "kernel"): ("embed", "gdn_heads"), ("in_proj_z", "kernel"): ("embed", "gdn_heads"),
               ("in_proj_a", "kernel"): ("embed", "gdn_heads"), ("in_proj_b", "kernel"): ("embed", "gdn_heads"),
               ("conv1d", "kernel"): ("time", "scalar", "gdn_heads"), ("A_log",): ("gdn_heads",),
               ("dt_bias",): ("gdn_heads",), ("norm", "weight"): ("head_dim",),
               ("out_proj", "kernel"): ("gdn_heads", "embed")}
        dense = {**partitioning.PARAM_AXES, **block.PARAM_AXES}
        table: dict = {}

        def add(path, leaf):
            keys = tuple(k.key for k in path)
            if keys[0] not in model.STACKS:
                table[keys] = partitioning.PARAM_AXES[keys[-2:]]
            elif keys[1] == "linear_attn":
                table[keys] = ("layers",) + gdn[keys[2:]]
            else:
                table[keys] = ("layers",) + dense[keys[-2:]]

        jax.tree_util.tree_map_with_path(add, model.param_shapes(cfg), is_leaf=lambda v: isinstance(v, tuple))
        return table

    def state_axes(self, cfg: HybridConfig) -> model.HybridState:
        """The attention layers' KV cache as the dense decoder's; the GDN layers' conv windows
        by channel and recurrent states by value head over ``model`` (the loop carries rolled
        back states: no record)."""
        kv = KVCache(k=partitioning.CACHE_AXES, v=partitioning.CACHE_AXES, lengths=("batch",))
        gdn = gated_delta.GatedDeltaState(conv=("layers", "batch", "time", "gdn_heads"),
                                          ssm=("layers", "batch", "gdn_heads", "head_dim", "head_dim"),
                                          start=("batch",), lengths=("batch",))
        return self.state_class(kv=kv, gdn=gdn)

    def split_dims(self, cfg: HybridConfig) -> list[tuple[str, int, str]]:
        dims = [("linear_num_key_heads", cfg.linear_num_key_heads,
                 "GDN key heads, each with its value heads (a group is never split)"),
                ("num_key_value_heads", cfg.num_kv_heads, "KV heads (a GQA group is never split)"),
                ("num_attention_heads", cfg.num_heads, "query heads")]
        if any(cfg.mlp_kind(i) == "mlp" for i in range(cfg.num_layers)):
            dims.append(("intermediate_size", cfg.intermediate_size, "dense layers' MLP width"))
        if cfg.moe is not None:
            dims += [("moe_intermediate_size", cfg.moe.moe_intermediate_size, "each expert's MLP width"),
                     ("shared_expert_intermediate_size", cfg.moe.shared_expert_intermediate_size,
                      "the shared expert's MLP width")]
        dims.append(("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)"))
        return dims

    def local_config(self, cfg: HybridConfig, model_shards: int):
        m = model_shards
        dense = any(cfg.mlp_kind(i) == "mlp" for i in range(cfg.num_layers))
        return dataclasses.replace(
            cfg, num_heads=cfg.num_heads // m, num_kv_heads=cfg.num_kv_heads // m,
            linear_num_key_heads=cfg.linear_num_key_heads // m,
            linear_num_value_heads=cfg.linear_num_value_heads // m,
            intermediate_size=cfg.intermediate_size // m if dense else cfg.intermediate_size,
            moe=None if cfg.moe is None else block.block_local_config(cfg.moe, m),
            vocab_size=cfg.vocab_size // m)

    def expert_dims(self, cfg: HybridConfig) -> list[tuple[str, int, str]]:
        return [] if cfg.moe is None else block.expert_dims(cfg.moe)

    def expert_local_config(self, cfg: HybridConfig, expert: int):
        """Unchanged: the router scores every expert on every shard, and the block takes its
        local expert count from its weights."""
        return cfg

    # ------------------------------------------------------------------ size model
    def gdn_matrix_params(self, cfg) -> int:
        """One GDN layer's matrices: in_proj_qkv ``D C``, in_proj_z ``D Hv dv``, in_proj_a/b
        ``2 D Hv``, out_proj ``Hv dv D``."""
        D, Hv = cfg.hidden_size, cfg.linear_num_value_heads
        return D * cfg.conv_channels + 2 * D * cfg.gdn_value_dim + 2 * D * Hv

    def gdn_vector_params(self, cfg) -> int:
        """One GDN layer's other parameters: the conv filters ``K C``, A_log and dt_bias
        ``2 Hv``, the output norm ``dv`` and the two layer norms ``2 D``."""
        return (cfg.linear_conv_kernel_dim * cfg.conv_channels + 2 * cfg.linear_num_value_heads
                + cfg.linear_value_head_dim + 2 * cfg.hidden_size)

    def attention_matrix_params(self, cfg) -> int:
        """One attention layer's q (doubled: query and gate), k, v, o matrices."""
        D, H, Hkv, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        return D * Dh * (3 * H + 2 * Hkv)

    def attention_vector_params(self, cfg) -> int:
        D, H, Hkv, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = (2 * H + 2 * Hkv) * Dh + D if cfg.attention_bias else 0
        return 2 * Dh + 2 * D + bias

    def _mlp_params(self, cfg, read_rows: int | None = None, per_token: bool = False) -> float:
        if cfg.moe is None:
            return 3 * cfg.hidden_size * cfg.intermediate_size
        if per_token:
            return block.block_matrix_params_per_token(cfg.moe)
        if read_rows is not None:
            return block.block_matrix_params_read(cfg.moe, read_rows)
        return block.block_matrix_params(cfg.moe)

    def _matrices(self, cfg, mlp: float) -> float:
        tables = 1 if cfg.tie_word_embeddings else 2
        return (len(cfg.gdn_layers) * self.gdn_matrix_params(cfg)
                + len(cfg.attention_layers) * self.attention_matrix_params(cfg)
                + cfg.num_layers * mlp + tables * cfg.vocab_size * cfg.hidden_size)

    def num_params(self, cfg) -> int:
        return int(self.matrix_params(cfg) + len(cfg.gdn_layers) * self.gdn_vector_params(cfg)
                   + len(cfg.attention_layers) * self.attention_vector_params(cfg) + cfg.hidden_size)

    def matrix_params(self, cfg) -> int:
        """Embedding, head, every layer's mixer and MLP matrices (all experts)."""
        return int(self._matrices(cfg, self._mlp_params(cfg)))

    def matrix_params_read(self, cfg, rows: int) -> float:
        """As :meth:`matrix_params`, with the MoE block's experts that ``rows`` tokens reach
        under uniform routing (``qwen3_5_moe.block_matrix_params_read``)."""
        return float(self._matrices(cfg, self._mlp_params(cfg, read_rows=rows)))

    def matrix_params_per_token(self, cfg) -> int:
        return int(self._matrices(cfg, self._mlp_params(cfg, per_token=True)))

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """K and V of the attention layers only: ``2 La Hkv Dh itemsize`` (the GDN layers'
        state does not grow: :meth:`fixed_state_bytes`)."""
        return 2 * len(cfg.attention_layers) * cfg.num_kv_heads * cfg.head_dim * itemsize

    def fixed_state_bytes(self, cfg, batch: int, itemsize: int = 2) -> int:
        """The GDN layers' decode state, whatever the length: per layer and row the conv window
        ``(K-1) C itemsize`` and the float32 recurrent state ``Hv dk dv 4``."""
        per_row = ((cfg.linear_conv_kernel_dim - 1) * cfg.conv_channels * itemsize
                   + cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4)
        return len(cfg.gdn_layers) * batch * per_row


    def tree_record_bytes(self, cfg, nodes: int, batch: int, itemsize: int = 2) -> dict:
        """What verifying a tree of ``nodes`` nodes keeps for the GDN layers
        (``nn.gated_delta.mix(tree=...)``), by ``cfg.gdn_rollback``: per node and GDN layer,
        the node's conv input ``C itemsize`` and, with ``"replay"``, its prepared k, v, g, beta
        (``Hv (dk + dv + 2) 4`` bytes: the accepted path's state is recomputed at the
        rollback), with ``"snapshot"`` its state after its root path (``Hv dk dv 4``); and per
        GDN layer while it runs, the tree's ``(I + A)`` system, its inverse and the node-to-node
        attention (``3 Hv N^2 4`` bytes a row). Returns {"per_node_per_layer", "record",
        "transient", "total"} in bytes for ``batch`` rows, and for a refusal's message "what"
        keeps them, the "setting" that sized them and a "smaller" one (or None)."""
        Hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kept = Hv * dk * dv * 4 if cfg.gdn_rollback == "snapshot" else Hv * (dk + dv + 2) * 4
        per_node = cfg.conv_channels * itemsize + kept
        record = len(cfg.gdn_layers) * batch * nodes * per_node
        transient = batch * 3 * Hv * nodes * nodes * 4
        return {"per_node_per_layer": per_node, "record": record, "transient": transient,
                "total": record + transient, "what": "Gated DeltaNet layers",
                "setting": f"gdn_rollback={cfg.gdn_rollback!r}",
                "smaller": "gdn_rollback='replay'" if cfg.gdn_rollback == "snapshot" else None}


QWEN3_5 = Qwen3_5Family(moe=False)
QWEN3_5_MOE = Qwen3_5Family(moe=True)
