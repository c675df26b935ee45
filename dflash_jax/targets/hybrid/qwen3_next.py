"""The Qwen3-Next target family (``model_type`` ``qwen3_next``: Qwen3-Next-80B-A3B,
Qwen3-Coder-Next; transformers' ``Qwen3NextForCausalLM``), ``docs/targets.md``.

The same maths as Qwen3.5 (``targets.hybrid.model``: Gated DeltaNet and gated full-attention
layers per ``layer_types``, zero-centred RMSNorms, partial plain RoPE), with two differences,
both handled outside the forward:

* the GDN input projections are stored packed per key head (``in_proj_qkvz``, ``in_proj_ba``):
  converted to the Qwen3.5 layout when a checkpoint is read and packed again when one is
  written (``qwen3_next_layout``; :meth:`Qwen3NextFamily.convert_checkpoint_tensors`,
  :meth:`Qwen3NextFamily.export_checkpoint_tensors`);
* the MLP of layer i is the sparse MoE block (``targets.moe.qwen3_5_moe``: softmax router,
  top k renormalised only when ``norm_topk_prob``, a shared expert scaled by
  ``sigmoid(x @ shared_expert_gate)``) when ``num_experts > 0``, i is not in
  ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers' rule), else the
  dense SwiGLU MLP of width ``intermediate_size`` (:meth:`Qwen3NextConfig.mlp_kind`).

Config fields a ``config.json`` leaves out take transformers' ``Qwen3NextConfig`` defaults
(:data:`HF_DEFAULTS`: ``head_dim`` 256, 2 KV heads, 512 experts, ...), as transformers loads
them. The released checkpoints' multi-token-prediction head (``mtp.*``) is ignored by name
(a log line counts it). Checkpoints keep the routed experts per expert
(``mlp.experts.{e}.{gate,up,down}_proj.weight``, the hub's files and what transformers 5's
``save_pretrained`` writes; the fused ``mlp.experts.gate_up_proj`` / ``down_proj`` are read
too) and ``Target.save`` writes the hub's layout (packed projections, per-expert experts).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import numpy as np

from dflash_jax.checkpoints import CheckpointError
from dflash_jax.config import refuse
from dflash_jax.targets.hybrid import qwen3_next_layout as layout
from dflash_jax.targets.hybrid.config import HybridConfig, check_hybrid_config
from dflash_jax.targets.hybrid.qwen3_5 import Qwen3_5Family
from dflash_jax.targets.moe import qwen3_5_moe

log = logging.getLogger(__name__)

MODEL_TYPE = "qwen3_next"
MTP_PREFIX = "mtp."
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True}
"""transformers' ``Qwen3NextConfig`` defaults of the fields this family reads (what
transformers builds when a ``config.json`` leaves one out)."""
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "shared_expert_intermediate_size")
_OWN_ROUTING = ("norm_topk_prob", "mlp_only_layers", "decoder_sparse_step")
"""Routing fields Qwen3.5's block refuses and this family implements."""


@dataclasses.dataclass(frozen=True)
class Qwen3NextConfig(HybridConfig):
    """A Qwen3-Next target's config: :class:`~dflash_jax.targets.hybrid.HybridConfig` (``moe``
    the block's config, with ``norm_topk_prob``, or None without experts) plus which layers
    hold the block: ``decoder_sparse_step`` and ``mlp_only_layers`` (:meth:`mlp_kind`).
    ``intermediate_size`` is the dense layers' MLP width."""

    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def mlp_kind(self, i: int) -> str:
        """``"moe"`` when the config has experts, i is not in ``mlp_only_layers`` and
        ``(i + 1) % decoder_sparse_step == 0`` (transformers' rule), else ``"mlp"``."""
        if self.moe is None or i in self.mlp_only_layers or (i + 1) % self.decoder_sparse_step:
            return "mlp"
        return "moe"


def _int(d: Mapping[str, Any], field: str, what: str) -> int:
    v = d[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise ValueError(f"{what}: {field} must be an integer, got {v!r}")
    return int(v)


class Qwen3NextFamily(Qwen3_5Family):
    """The ``qwen3_next`` family (module docstring): Qwen3.5's forward, tensor names (after
    unpacking), state and size model, with its own config, MLP placement and packed layout."""

    def __init__(self):
        super().__init__(moe=False)
        self.model_types = (MODEL_TYPE,)
        self.name = MODEL_TYPE
        self.architecture = "Qwen3NextForCausalLM"

    # ------------------------------------------------------------------ config
    def text_config(self, d: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
        """A ``qwen3_next`` config.json is text only: (``d``, ``tie_word_embeddings``)."""
        return d, bool(d.get("tie_word_embeddings", False))

    def config_from_hf(self, d: Mapping[str, Any]) -> Qwen3NextConfig:
        """Reads a ``Qwen3NextForCausalLM`` config.json: missing fields take transformers'
        defaults (:data:`HF_DEFAULTS`); the layer pattern, GDN shapes and RoPE are read as for
        Qwen3.5 (``Qwen3_5Family.config_from_hf``: ``layer_types`` or every
        ``full_attention_interval``-th layer full attention, ``partial_rotary_factor`` from
        ``rope_parameters`` or the top level); ``num_experts`` 0 means every MLP is dense.
        Refused, naming the field: what Qwen3.5 refuses, routing options the block does not
        implement (``qwen3_5_moe``'s list, less ``norm_topk_prob``, ``decoder_sparse_step`` and
        ``mlp_only_layers``), a malformed ``mlp_only_layers`` or ``decoder_sparse_step``."""
        what = f"target config.json ({MODEL_TYPE})"
        d = {**HF_DEFAULTS, **{k: v for k, v in d.items() if v is not None or k not in HF_DEFAULTS}}
        d["mlp_only_layers"] = d.get("mlp_only_layers") or []
        refuse(qwen3_5_moe.unsupported_routing_options({k: v for k, v in d.items()
                                                        if k not in _OWN_ROUTING}), what)
        norm = d["norm_topk_prob"]
        if not isinstance(norm, bool):
            raise ValueError(f"{what}: norm_topk_prob must be true or false, got {norm!r}")
        step = _int(d, "decoder_sparse_step", what)
        if step < 1:
            raise ValueError(f"{what}: decoder_sparse_step must be >= 1, got {step}")
        only = d["mlp_only_layers"]
        if not isinstance(only, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in only):
            raise ValueError(f"{what}: mlp_only_layers must be a list of layer indices, got {only!r}")
        moe = None
        if _int(d, "num_experts", what) > 0:
            moe = qwen3_5_moe.MoeBlockConfig(**{k: _int(d, k, what) for k in MOE_FIELDS},
                                             hidden_size=_int(d, "hidden_size", what),
                                             norm_topk_prob=norm)
        base = super().config_from_hf(d)  # a HybridConfig of model_type qwen3_next, dense MLPs
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(HybridConfig)}
        return Qwen3NextConfig(**{**fields, "moe": moe}, decoder_sparse_step=step,
                               mlp_only_layers=tuple(sorted(set(only))))

    def check_config(self, cfg) -> None:
        """:func:`check_hybrid_config`; for a :class:`Qwen3NextConfig` also the MoE fields
        (the plain ``HybridConfig`` that :meth:`config_from_hf` builds on the way passes)."""
        check_hybrid_config(cfg)
        if not isinstance(cfg, Qwen3NextConfig):
            if cfg.moe is not None:
                raise ValueError(f"a {MODEL_TYPE} config with experts needs a Qwen3NextConfig "
                                 "(dflash_jax.targets.hybrid.qwen3_next)")
            return
        if cfg.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {cfg.decoder_sparse_step}")
        bad = [i for i in cfg.mlp_only_layers if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are outside layers 0..{cfg.num_layers - 1}")
        if cfg.moe is not None and cfg.moe.hidden_size != cfg.hidden_size:
            raise ValueError(f"the MoE block's hidden_size ({cfg.moe.hidden_size}) must equal "
                             f"hidden_size ({cfg.hidden_size})")

    def config_to_hf(self, cfg: Qwen3NextConfig) -> dict:
        """The hub's ``Qwen3NextForCausalLM`` layout: Qwen3.5's fields (``layer_types``, the
        ``linear_*`` shapes, ``rope_parameters`` with ``partial_rotary_factor``) plus
        ``intermediate_size``, the MoE fields (``num_experts`` 0 without experts),
        ``norm_topk_prob``, ``decoder_sparse_step``, ``mlp_only_layers``, and the RoPE fields
        at the top level too (``rope_theta``, ``rope_scaling`` null, ``partial_rotary_factor``:
        what transformers 4.x reads)."""
        out = super().config_to_hf(dataclasses.replace(cfg, moe=None))
        moe = cfg.moe
        out.update({"architectures": [self.architecture], "model_type": MODEL_TYPE,
                    "intermediate_size": cfg.intermediate_size,
                    "rope_theta": cfg.rope.theta, "rope_scaling": None,
                    "partial_rotary_factor": cfg.partial_rotary_factor,
                    "num_experts": 0 if moe is None else moe.num_experts,
                    "norm_topk_prob": True if moe is None else moe.norm_topk_prob,
                    "decoder_sparse_step": cfg.decoder_sparse_step,
                    "mlp_only_layers": list(cfg.mlp_only_layers)})
        if moe is not None:
            out.update({"num_experts_per_tok": moe.num_experts_per_tok,
                        "moe_intermediate_size": moe.moe_intermediate_size,
                        "shared_expert_intermediate_size": moe.shared_expert_intermediate_size})
        return out

    # ------------------------------------------------------------------ checkpoints
    def _gdn_dims(self, cfg) -> layout.GdnDims:
        return layout.GdnDims(cfg.linear_num_key_heads, cfg.linear_key_head_dim,
                              cfg.linear_num_value_heads, cfg.linear_value_head_dim)

    def convert_checkpoint_tensors(self, cfg: Qwen3NextConfig, tensors: dict[str, np.ndarray],
                                   what: str = "checkpoint") -> dict[str, np.ndarray]:
        """The tensors as stored -> the :meth:`tensor_specs` names (Qwen3.5's): every GDN
        layer's packed projections unpacked (``qwen3_next_layout.unpack_layer``: a missing or
        mis-shaped packed tensor is a one-line CheckpointError naming it), the MTP head
        (``mtp.*``) dropped with a log line, a MoE layer's fused experts split per expert. The
        other GDN tensors are checked as Qwen3.5's (``check_gdn_tensors``)."""
        out = {n: t for n, t in tensors.items() if not n.startswith(MTP_PREFIX)}
        if len(out) < len(tensors):
            log.warning("%s: ignored %d multi-token-prediction tensors (%s*; not part of the %s "
                        "model)", what, len(tensors) - len(out), MTP_PREFIX, MODEL_TYPE)
        dims = self._gdn_dims(cfg)
        for i in cfg.gdn_layers:
            out = layout.unpack_layer(out, f"model.layers.{i}.linear_attn.", dims, cfg.hidden_size, what)
        self.check_gdn_tensors(cfg, {n: tuple(t.shape) for n, t in out.items()}, what)
        for i in range(cfg.num_layers):
            if cfg.mlp_kind(i) == "moe":
                out = qwen3_5_moe.convert_fused_experts(cfg.moe, out, f"model.layers.{i}.mlp.", what)
            elif any(n.startswith(f"model.layers.{i}.mlp.experts.") for n in out):
                raise CheckpointError(f"{what}: layer {i} stores experts (model.layers.{i}.mlp."
                                      "experts.*) but is a dense layer in this config "
                                      "(num_experts / mlp_only_layers / decoder_sparse_step)")
        return out

    def export_checkpoint_tensors(self, cfg: Qwen3NextConfig, tensors: dict[str, np.ndarray]
                                  ) -> dict[str, np.ndarray]:
        """The :meth:`tensor_specs` tensors -> the stored layout: every GDN layer's projections
        packed (``qwen3_next_layout.pack_layer``); the rest as named."""
        dims = self._gdn_dims(cfg)
        for i in cfg.gdn_layers:
            tensors = layout.pack_layer(tensors, f"model.layers.{i}.linear_attn.", dims)
        return tensors

    # ------------------------------------------------------------------ size model
    def _matrices(self, cfg, mlp: float) -> float:
        """Qwen3.5's count with ``mlp`` (one MoE block's parameters, as the caller asks) in the
        MoE layers only and the dense MLP ``3 D F`` in the others."""
        n_moe = sum(cfg.mlp_kind(i) == "moe" for i in range(cfg.num_layers))
        dense = 3 * cfg.hidden_size * cfg.intermediate_size
        tables = 1 if cfg.tie_word_embeddings else 2
        return (len(cfg.gdn_layers) * self.gdn_matrix_params(cfg)
                + len(cfg.attention_layers) * self.attention_matrix_params(cfg)
                + n_moe * mlp + (cfg.num_layers - n_moe) * dense
                + tables * cfg.vocab_size * cfg.hidden_size)


QWEN3_NEXT = Qwen3NextFamily()
