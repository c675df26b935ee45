"""The DeepSeek-V3 target family (``model_type`` ``deepseek_v3``: DeepSeek-V3 / R1, and the
decoder of Kimi-K2.x; transformers' ``DeepseekV3ForCausalLM``).

Multi-head latent attention in every layer (``mla.model``), a dense SwiGLU MLP in the first
``first_k_dense_replace`` layers and DeepSeek's MoE block in the others: sigmoid router with a
selection-only bias, group-limited top-k, renormalised and scaled weights
(``nn.moe.route_sigmoid_group_topk``), plus shared experts. YaRN RoPE on the rope dims, with
DeepSeek's ``mscale_all_dim`` attention scale (:attr:`DeepseekV3Config.attention_scale`).

Checkpoints: transformers' ``save_pretrained`` layout (experts per expert,
``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight``, shared experts
``mlp.shared_experts.*``, the router ``mlp.gate.weight`` and ``mlp.gate.e_score_correction_bias``),
and transformers' fused in-memory layout (``mlp.experts.gate_up_proj`` / ``down_proj``). The
released checkpoints' multi-token-prediction layers (``model.layers.{N}...``, counted by
``num_nextn_predict_layers``) are ignored by name with one log line. FP8 block-quantized
weights (``quantization_config`` ``{"quant_method": "fp8", "weight_block_size": [b0, b1]}``, the
released DeepSeek-V3 / R1 files: ``float8_e4m3fn`` weights and a float32 ``weight_scale_inv`` per
``b0 x b1`` block, edge blocks partial) are dequantized on load, ``w * scale_inv`` per block.

Kimi-K2.x: a text config with ``model_type`` ``kimi_k2`` is read as ``deepseek_v3``; the
multimodal ``kimi_k25`` (``Kimi_K25ForConditionalGeneration``) has its text model read from
``text_config`` and ``language_model.model.layers.*`` (the released files; transformers'
``save_pretrained`` writes ``language_model.model.blocks.*``) and ``language_model.lm_head``;
the vision tower and projector are ignored by name with one log line. What is loaded is the
text model, saved back in the ``deepseek_v3`` layout. Kimi-K2.5's released routed experts are
INT4 in compressed-tensors' ``pack-quantized`` format (``quantization_config`` ``quant_method``
``compressed-tensors``): dequantized on load (``targets.packed_int``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.checkpoints import CheckpointError, TensorSpec, text_model_tensors
from dflash_jax.config import decoder_fields_from_hf, decoder_fields_to_hf, refuse, unsupported_decoder_features
from dflash_jax.config import TargetConfig
from dflash_jax.nn import partitioning
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.layers import random_init
from dflash_jax.quantization import dequantize_block_fp8, split_block_fp8, weight_block_size
from dflash_jax.targets import packed_int
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.mla import model
from dflash_jax.targets.moe import qwen3_moe

MODEL_TYPE = "deepseek_v3"
KIMI_TEXT, KIMI_MULTIMODAL = "kimi_k2", "kimi_k25"
log = logging.getLogger(__name__)

TEXT_PREFIXES = {"language_model.model.layers.": "model.layers.",
                 "language_model.model.blocks.": "model.layers.",
                 "language_model.model.": "model.", "language_model.lm_head.": "lm_head.",
                 "model.language_model.": "model."}
"""The multimodal (``kimi_k25``) layouts' text-model prefixes -> the ``deepseek_v3`` names."""
IGNORED_PREFIXES = {"vision_tower.": "vision-tower", "mm_projector.": "projector",
                    "model.vision_tower.": "vision-tower", "model.mm_projector.": "projector"}
"""Tensors of a multimodal checkpoint that the text target does not use, ignored by name."""


@dataclasses.dataclass(frozen=True)
class DeepseekV3Config(TargetConfig):
    """A DeepSeek-V3 target's config: :class:`TargetConfig` (``head_dim`` = the rope dim dr,
    ``num_kv_heads`` = ``num_heads``, ``intermediate_size`` = the dense layers' MLP width) plus
    MLA's and the MoE's fields.

    MLA: ``q_lora_rank`` (0: a plain ``q_proj``), ``kv_lora_rank`` = r (the cached latent),
    ``qk_nope_head_dim`` = dn, ``qk_rope_head_dim`` = dr, ``v_head_dim`` = dv,
    ``rope_interleave`` (rope dims stored as interleaved pairs).
    MoE: ``num_experts`` = E routed experts (``n_routed_experts``), ``num_experts_per_tok`` = k,
    ``moe_intermediate_size`` = Fm, ``n_shared_experts``, ``n_group`` / ``topk_group``
    (group-limited routing), ``norm_topk_prob``, ``routed_scaling_factor``,
    ``first_k_dense_replace`` (the first layers are dense).
    ``num_nextn_predict_layers``: the checkpoint's multi-token-prediction layers (not run; kept
    for the round trip)."""

    q_lora_rank: int = 0
    kv_lora_rank: int = 1
    qk_nope_head_dim: int = 1
    qk_rope_head_dim: int = 2
    v_head_dim: int = 1
    rope_interleave: bool = True
    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    num_nextn_predict_layers: int = 0
    fp8_weight_block_size: tuple[int, int] | None = dataclasses.field(default=None, compare=False)
    """The stored weights' FP8 block size (``quantization_config``), used to dequantize them on
    load; not part of the model (a dequantized copy is the same model), so not compared."""
    packed_int_scheme: packed_int.PackedScheme | None = dataclasses.field(default=None, compare=False)
    """The stored weights' packed-integer scheme (``compressed-tensors``, Kimi-K2.5's INT4
    experts; ``targets.packed_int``), dequantized on load; not compared, as above."""

    def is_moe_layer(self, i: int) -> bool:
        """transformers' rule: layer i is MoE iff ``i >= first_k_dense_replace``."""
        return i >= self.first_k_dense_replace

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def dense_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if not self.is_moe_layer(i))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attention_scale(self) -> float:
        """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN with
        ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``; DeepSeek-V3: 1.707**2 at factor 40)."""
        scale = self.qk_head_dim ** -0.5
        rope = self.rope
        if rope.rope_type != "default" and rope.mscale_all_dim:
            m = model.yarn_mscale(float(rope.factor), float(rope.mscale_all_dim))
            scale *= m * m
        return scale


_NONE = lambda v: not v
_OPTIONS = (
    # (field, value that is fine, why it is refused otherwise)
    ("scoring_func", lambda v: v in (None, "sigmoid"), "only DeepSeek-V3's sigmoid router is implemented"),
    ("topk_method", lambda v: v in (None, "noaux_tc"),
     "only DeepSeek-V3's bias-corrected group-limited top-k (noaux_tc) is implemented"),
    ("moe_layer_freq", lambda v: v in (None, 1), "MoE in every layer from first_k_dense_replace on only"),
    ("attention_bias", _NONE, "MLA projection biases are not implemented (DeepSeek-V3 has none)"),
)


def quantization(q: Any, what: str) -> tuple[tuple[int, int] | None, packed_int.PackedScheme | None]:
    """(FP8 block size, packed-integer scheme) of a ``quantization_config`` this family
    dequantizes on load: DeepSeek's block FP8 (``quant_method`` ``fp8``) or compressed-tensors'
    packed integers (Kimi-K2.5's INT4 experts); any other quantization is a one-line ValueError
    naming it."""
    if not q:
        return None, None
    method = q.get("quant_method") if isinstance(q, Mapping) else q
    if method == "compressed-tensors":
        return None, packed_int.read_scheme(q, what)
    if method != "fp8":
        raise ValueError(f"{what}: quantization_config quant_method={method!r} is not read (only DeepSeek's "
                         "block FP8, quant_method 'fp8', and compressed-tensors' packed integers): "
                         "dequantize the checkpoint to bf16 first")
    return weight_block_size(q, what), None


def _int(d: Mapping[str, Any], field: str, default=None, minimum: int = 1) -> int:
    v = d.get(field, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or int(v) < minimum:
        raise ValueError(f"target config.json ({MODEL_TYPE}): {field} must be an integer >= {minimum}, got {v!r}")
    return int(v)


class DeepseekV3Family(TargetFamily):
    """The ``deepseek_v3`` family (module docstring)."""

    model_types = (MODEL_TYPE, KIMI_TEXT, KIMI_MULTIMODAL)
    name = MODEL_TYPE
    architecture = "DeepseekV3ForCausalLM"
    tree_refusal = None  # the state is a KVCache (compact) and the mask takes a tree

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]) -> DeepseekV3Config:
        """Reads a ``DeepseekV3ForCausalLM`` config.json; unimplemented options (:data:`_OPTIONS`)
        are refused, naming the field."""
        what = f"target config.json ({d.get('model_type')})"
        top = d
        if d.get("model_type") == KIMI_MULTIMODAL:
            tc = d.get("text_config")
            if not isinstance(tc, Mapping):
                raise ValueError(f"{what} has no text_config: a multimodal {KIMI_MULTIMODAL} checkpoint keeps "
                                 f"the text model's fields there (or give a text-only {MODEL_TYPE} config)")
            d = {**tc, "tie_word_embeddings": top.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))}
            for k in ("eos_token_id", "bos_token_id", "quantization_config"):
                if d.get(k) is None and top.get(k) is not None:
                    d[k] = top[k]
        block, scheme = quantization(d.get("quantization_config"), what)
        missing = [k for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                               "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
                   if d.get(k) is None]
        if missing:
            raise ValueError(f"{what} is missing the MLA / MoE fields: {', '.join(missing)}")
        problems = unsupported_decoder_features(d, qwen3_attention=False)
        problems += [f"{f}={d[f]!r}: {why}" for f, fine, why in _OPTIONS if f in d and not fine(d[f])]
        refuse(problems, what)
        fields = decoder_fields_from_hf(d, "config.json")
        dr = _int(d, "qk_rope_head_dim")
        fields.update(head_dim=dr, num_kv_heads=fields["num_heads"])
        if d.get("head_dim") not in (None, dr):
            raise ValueError(f"{what}: head_dim {d['head_dim']} must equal qk_rope_head_dim {dr} "
                             "(transformers sets it so; it sizes the rotary embedding)")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        interleave = d.get("rope_interleave", True)
        if not isinstance(interleave, bool):
            raise ValueError(f"{what}: rope_interleave must be true or false, got {interleave!r}")
        nextn = d.get("num_nextn_predict_layers", d.get("num_mtp_layers", 0)) or 0
        return DeepseekV3Config(
            model_type=MODEL_TYPE, **fields,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"), eos_token_id=eos_ids,
            q_lora_rank=int(d.get("q_lora_rank") or 0), kv_lora_rank=_int(d, "kv_lora_rank"),
            qk_nope_head_dim=_int(d, "qk_nope_head_dim"), qk_rope_head_dim=dr,
            v_head_dim=_int(d, "v_head_dim"), rope_interleave=interleave,
            num_experts=_int(d, "n_routed_experts"), num_experts_per_tok=_int(d, "num_experts_per_tok"),
            moe_intermediate_size=_int(d, "moe_intermediate_size"),
            n_shared_experts=_int(d, "n_shared_experts", 0, minimum=0),
            n_group=_int(d, "n_group", 1), topk_group=_int(d, "topk_group", 1),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
            first_k_dense_replace=_int(d, "first_k_dense_replace", 0, minimum=0),
            num_nextn_predict_layers=int(nextn), fp8_weight_block_size=block, packed_int_scheme=scheme)

    def check_config(self, cfg) -> None:
        if not isinstance(cfg, DeepseekV3Config):
            raise ValueError("a deepseek_v3 target needs a DeepseekV3Config (dflash_jax.targets.mla), "
                             "with the MLA and MoE fields")
        if cfg.num_kv_heads != cfg.num_heads:
            raise ValueError(f"num_key_value_heads {cfg.num_kv_heads} must equal num_attention_heads "
                             f"{cfg.num_heads}: MLA has no key/value head groups")
        if cfg.head_dim != cfg.qk_rope_head_dim:
            raise ValueError(f"head_dim {cfg.head_dim} must equal qk_rope_head_dim {cfg.qk_rope_head_dim}")
        if cfg.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for rotary embeddings, got {cfg.qk_rope_head_dim}")
        E, G = cfg.num_experts, cfg.n_group
        if cfg.moe_layers:
            if not 1 <= cfg.num_experts_per_tok <= E:
                raise ValueError(f"num_experts_per_tok must be in 1..n_routed_experts={E}, got {cfg.num_experts_per_tok}")
            if E % G or (G > 1 and E // G < 2):
                raise ValueError(f"n_group {G} must divide n_routed_experts {E} into groups of at least 2 "
                                 "experts (a group is scored by its two best experts)")
            if not 1 <= cfg.topk_group <= G:
                raise ValueError(f"topk_group must be in 1..n_group={G}, got {cfg.topk_group}")
            if cfg.topk_group * (E // G) < cfg.num_experts_per_tok:
                raise ValueError(f"topk_group {cfg.topk_group} groups of {E // G} experts cannot hold "
                                 f"num_experts_per_tok {cfg.num_experts_per_tok} experts")

    def config_to_hf(self, cfg: DeepseekV3Config) -> dict:
        """transformers' ``DeepseekV3Config`` fields (RoPE in both spellings)."""
        eos: Any = list(cfg.eos_token_id)
        eos = eos[0] if len(eos) == 1 else (eos or None)
        return {"architectures": [self.architecture], "model_type": MODEL_TYPE,
                **decoder_fields_to_hf(cfg), "tie_word_embeddings": cfg.tie_word_embeddings,
                "attention_bias": False, "q_lora_rank": cfg.q_lora_rank or None,
                "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
                "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
                "rope_interleave": cfg.rope_interleave, "n_routed_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_intermediate_size,
                "n_shared_experts": cfg.n_shared_experts, "n_group": cfg.n_group,
                "topk_group": cfg.topk_group, "norm_topk_prob": cfg.norm_topk_prob,
                "routed_scaling_factor": cfg.routed_scaling_factor,
                "first_k_dense_replace": cfg.first_k_dense_replace,
                "num_nextn_predict_layers": cfg.num_nextn_predict_layers,
                "bos_token_id": cfg.bos_token_id, "eos_token_id": eos}

    # ------------------------------------------------------------------ checkpoints
    def _attention_shapes(self, cfg) -> dict[str, tuple[tuple[str, ...], bool, tuple[int, ...]]]:
        """{tensor suffix: (parameter path under layers/self_attn, transpose, shape on disk)}."""
        D, H = cfg.hidden_size, cfg.num_heads
        r, dr, qk, dv, rq = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_head_dim, cfg.v_head_dim, cfg.q_lora_rank
        out = {}
        if rq:
            out["q_a_proj.weight"] = (("q_a_proj", "kernel"), True, (rq, D))
            out["q_a_layernorm.weight"] = (("q_a_layernorm", "weight"), False, (rq,))
            out["q_b_proj.weight"] = (("q_b_proj", "kernel"), True, (H * qk, rq))
        else:
            out["q_proj.weight"] = (("q_proj", "kernel"), True, (H * qk, D))
        out["kv_a_proj_with_mqa.weight"] = (("kv_a_proj_with_mqa", "kernel"), True, (r + dr, D))
        out["kv_a_layernorm.weight"] = (("kv_a_layernorm", "weight"), False, (r,))
        out["kv_b_proj.weight"] = (("kv_b_proj", "kernel"), True, (H * (cfg.qk_nope_head_dim + dv), r))
        out["o_proj.weight"] = (("o_proj", "kernel"), True, (D, H * dv))
        return out

    def tensor_specs(self, cfg: DeepseekV3Config) -> dict[str, TensorSpec]:
        """All tensors of the per-expert layout (module docstring)."""
        D, V, E, Fm, F = (cfg.hidden_size, cfg.vocab_size, cfg.num_experts, cfg.moe_intermediate_size,
                          cfg.intermediate_size)
        Fs = cfg.n_shared_experts * Fm
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                specs[pre + norm + ".weight"] = TensorSpec(("layers", norm, "weight"), i, False, (D,))
            for suffix, (path, t, shape) in self._attention_shapes(cfg).items():
                specs[pre + "self_attn." + suffix] = TensorSpec(("layers", "self_attn") + path, i, t, shape)
        mlp = (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F)))
        for j, i in enumerate(cfg.dense_layers):
            for proj, shape in mlp:
                specs[f"model.layers.{i}.mlp.{proj}.weight"] = TensorSpec(("layers", "mlp", proj, "kernel"), j, True, shape)
        for m, i in enumerate(cfg.moe_layers):
            pre = f"model.layers.{i}.mlp."
            specs[pre + "gate.weight"] = TensorSpec(("layers", "moe", "gate", "kernel"), m, True, (E, D))
            specs[pre + "gate.e_score_correction_bias"] = TensorSpec(
                ("layers", "moe", "gate", "e_score_correction_bias"), m, False, (E,))
            for e in range(E):
                for proj, shape in (("gate_proj", (Fm, D)), ("up_proj", (Fm, D)), ("down_proj", (D, Fm))):
                    specs[f"{pre}experts.{e}.{proj}.weight"] = TensorSpec(
                        ("layers", "moe", "experts", proj), m, True, shape, expert=e)
            # always there, as transformers builds them (zero-width without shared experts)
            for proj, shape in (("gate_proj", (Fs, D)), ("up_proj", (Fs, D)), ("down_proj", (D, Fs))):
                specs[f"{pre}shared_experts.{proj}.weight"] = TensorSpec(
                    ("layers", "moe", "shared", proj, "kernel"), m, True, shape)
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    _LAYER = re.compile(r"model\.layers\.(\d+)\.")
    _FUSED = qwen3_moe.Qwen3MoeFamily._FUSED  # the fused-expert names qwen3_moe's conversion reads

    def convert_checkpoint_tensors(self, cfg: DeepseekV3Config, tensors: dict[str, np.ndarray],
                                   what: str = "checkpoint") -> dict[str, np.ndarray]:
        """The tensors as read -> the :meth:`tensor_specs` names: a multimodal layout's text
        prefixes renamed (:data:`TEXT_PREFIXES`) and its vision tensors dropped
        (:data:`IGNORED_PREFIXES`); the multi-token-prediction layers (``model.layers.{i}`` for
        i >= N, when ``num_nextn_predict_layers`` > 0) dropped, one log line for them; then packed
        integer and FP8 weights dequantized (``quantization.dequantize_block_fp8`` with their
        ``weight_scale_inv``); fused experts split (``qwen3_moe``'s conversion, the same names). A layer beyond N that
        the config does not announce, an FP8 weight without its scale or a scale without its
        weight is a CheckpointError naming the tensor."""
        renamed = self.stored_block_fp8_tensors(cfg, tensors, what)  # renamed, MTP layers dropped first
        packed = [n for n in renamed if n.endswith(packed_int.SUFFIXES)]
        if packed and cfg.packed_int_scheme is None:
            raise CheckpointError(f"{what}: {min(packed)} is a packed integer weight, but config.json has no "
                                  "compressed-tensors quantization_config")
        if packed:
            renamed = packed_int.dequantize_tensors(renamed, cfg.packed_int_scheme, what)
        return qwen3_moe.Qwen3MoeFamily.convert_checkpoint_tensors(self, cfg, self._dequantize(cfg, renamed, what),
                                                                   what)

    def stored_block_fp8_tensors(self, cfg: DeepseekV3Config, tensors: dict[str, np.ndarray],
                                 what: str = "checkpoint") -> dict[str, np.ndarray]:
        """The stored tensors renamed (a multimodal layout's text prefixes) and without the
        multi-token-prediction layers, nothing dequantized: what a block-FP8 file loads as stored
        (``checkpoints.load_target_params`` with ``keep_fp8``), and what
        :meth:`convert_checkpoint_tensors` starts from (so the dropped layers are never
        dequantized)."""
        renamed = text_model_tensors(tensors, TEXT_PREFIXES, IGNORED_PREFIXES, what, self.name)
        return self._drop_nextn_layers(cfg, renamed, what)

    def _drop_nextn_layers(self, cfg: DeepseekV3Config, tensors: dict[str, np.ndarray], what: str):
        """``tensors`` without the multi-token-prediction layers (``model.layers.{i}``, i >= N),
        one log line for them; a layer the config does not announce is a CheckpointError."""
        out, dropped = {}, set()
        for name, arr in tensors.items():
            hit = self._LAYER.match(name)
            if hit and int(hit.group(1)) >= cfg.num_layers:
                i = int(hit.group(1))
                if i >= cfg.num_layers + cfg.num_nextn_predict_layers:
                    raise CheckpointError(f"{what}: {name} belongs to layer {i}, but the config has "
                                          f"{cfg.num_layers} layers and {cfg.num_nextn_predict_layers} "
                                          "multi-token-prediction layers (num_nextn_predict_layers)")
                dropped.add(i)
                continue
            out[name] = arr
        if dropped:
            log.warning("%s: ignored the multi-token-prediction layers %s (not run by the %s target)",
                        what, sorted(dropped), self.name)
        return out

    def _dequantize(self, cfg: DeepseekV3Config, tensors: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        """Every ``{name}_scale_inv`` applied to its FP8 ``{name}`` (float32 out) and dropped;
        the pairs checked first (``quantization.split_block_fp8``)."""
        block = cfg.fp8_weight_block_size
        rest, scales = split_block_fp8(tensors, block, what)
        return {n: dequantize_block_fp8(a, scales[n], block) if n in scales else a for n, a in rest.items()}

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        """Random parameters (``mla.model`` tree): matrices normal(``init_scale``), norms 1,
        the routers' correction bias 0."""
        shapes: dict[str, Any] = {"embed_tokens": {"embedding": (cfg.vocab_size, cfg.hidden_size)},
                                  "norm": {"weight": (cfg.hidden_size,)}, "layers": {}}
        if not cfg.tie_word_embeddings:
            shapes["lm_head"] = {"kernel": (cfg.hidden_size, cfg.vocab_size)}
        for name, spec in self.tensor_specs(cfg).items():
            if spec.layer is None:
                continue
            stack = self.stack_size(cfg, spec.path[1])
            shape = tuple(reversed(spec.shape)) if spec.transpose else spec.shape
            if spec.expert is not None:
                shape = (stack, cfg.num_experts) + shape
            else:
                shape = (stack,) + shape
            node = shapes
            for k in spec.path[:-1]:
                node = node.setdefault(k, {})
            node[spec.path[-1]] = shape
        is_shape = lambda x: isinstance(x, tuple)

        def init(k):
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s, dtype), shapes, is_leaf=is_shape)
            return random_init(zeros, k, init_scale, dtype)

        return jax.jit(init)(key)

    def stack_size(self, cfg, kind: str) -> int:
        """How many layers the ``layers/{kind}`` parameters stack: the MoE layers' blocks, the
        dense layers' MLPs, every layer's attention and norms."""
        return {"moe": len(cfg.moe_layers), "mlp": len(cfg.dense_layers)}.get(kind, cfg.num_layers)

    def init_state(self, cfg, batch: int, max_len: int, dtype) -> KVCache:
        """The latent decode state (``mla.model.init_state``)."""
        return model.init_state(cfg, batch, max_len, dtype)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None,
                expert_axis=None, mla_form=None, moe_impl="auto", tree=None):
        """``mla.model.target_forward`` (``mla_form``: absorbed / expanded; ``moe_impl``:
        ``nn.moe.moe_ffn``'s; ``model_axis`` / ``expert_axis``: the mesh axes under
        ``shard_map``)."""
        return model.target_forward(cfg, params, tokens, positions, state, tap_layer_ids=tap_layer_ids,
                                    logit_index=logit_index, compute_logits=compute_logits,
                                    attention_impl=attention_impl, mla_form=mla_form, moe_impl=moe_impl,
                                    tree=tree, model_axis=model_axis, expert_axis=expert_axis)

    split_layers = staticmethod(model.split_layer_params)  # TargetFamily.loop_params, on CPU

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        """Megatron over ``model`` by heads: the columns of ``q_b_proj`` / ``q_proj`` and of
        ``kv_b_proj`` (both head-major: each head's ``dn + dr`` query and ``dn + dv`` key / value
        columns are contiguous) and the rows of ``o_proj``. The latent path (``q_a_proj``,
        ``kv_a_proj_with_mqa``, their norms) is replicated: every head reads the whole latent, so
        splitting it would need an all-gather per layer, and it is small (``D (rq + r + dr)``).
        The MoE block as ``qwen3_moe``'s (experts over ``expert``, each one's width over
        ``model``; router and correction bias replicated), the shared experts' width over
        ``model`` as a dense MLP's."""
        return {**partitioning.PARAM_AXES,
                ("q_a_proj", "kernel"): ("embed", "latent"),
                ("q_a_layernorm", "weight"): ("latent",),
                ("q_b_proj", "kernel"): ("latent", "heads"),
                ("kv_a_proj_with_mqa", "kernel"): ("embed", "latent"),
                ("kv_a_layernorm", "weight"): ("latent",),
                ("kv_b_proj", "kernel"): ("latent", "heads"),
                ("gate", "kernel"): ("embed", "router"),
                ("gate", "e_score_correction_bias"): ("router",),
                ("experts", "gate_proj"): ("expert", "embed", "mlp"),
                ("experts", "up_proj"): ("expert", "embed", "mlp"),
                ("experts", "down_proj"): ("expert", "mlp", "embed")}

    def state_axes(self, cfg) -> KVCache:
        """The latent state replicated over ``model`` (every head shard reads all of it), the
        rows over ``data``."""
        axes = ("layers", "batch", "slots", "latent", "latent")
        return KVCache(k=axes, v=axes, lengths=("batch",))

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        dims = [("num_attention_heads", cfg.num_heads, "query heads (each with its latent key / value expansion)")]
        if cfg.dense_layers:
            dims.append(("intermediate_size", cfg.intermediate_size, "dense layers' MLP width"))
        if cfg.moe_layers:
            dims.append(("moe_intermediate_size", cfg.moe_intermediate_size,
                         "each routed and shared expert's MLP width"))
        dims.append(("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)"))
        return dims

    # the shard's config as qwen3_moe's (heads, dense and expert widths, vocabulary over model;
    # unchanged over expert): the same fields, the same split
    local_config = qwen3_moe.Qwen3MoeFamily.local_config
    expert_local_config = qwen3_moe.Qwen3MoeFamily.expert_local_config

    def expert_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("n_routed_experts", cfg.num_experts, "routed experts")] if cfg.moe_layers else []

    # ------------------------------------------------------------------ size model
    def attention_matrix_params(self, cfg) -> int:
        """One layer's MLA matrices (q path, kv_a, kv_b, o)."""
        return sum(int(np.prod(s)) for _, t, s in self._attention_shapes(cfg).values() if t)

    def expert_params(self, cfg) -> int:
        """One routed expert's matrices: ``3 * D * Fm``."""
        return 3 * cfg.hidden_size * cfg.moe_intermediate_size

    def layer_vector_params(self, cfg) -> int:
        """Norm vectors per layer (input, post-attention, q and kv latent norms)."""
        return 2 * cfg.hidden_size + cfg.kv_lora_rank + cfg.q_lora_rank

    def _matrices(self, cfg, experts_per_moe_layer: float) -> float:
        D = cfg.hidden_size
        Nm, Nd = len(cfg.moe_layers), len(cfg.dense_layers)
        tables = 1 if cfg.tie_word_embeddings else 2
        shared = 3 * D * cfg.n_shared_experts * cfg.moe_intermediate_size
        return (cfg.num_layers * self.attention_matrix_params(cfg) + Nd * 3 * D * cfg.intermediate_size
                + Nm * (D * cfg.num_experts + shared + experts_per_moe_layer * self.expert_params(cfg))
                + tables * cfg.vocab_size * D)

    def num_params(self, cfg) -> int:
        """Every parameter transformers counts (the routers' correction biases included)."""
        return int(self.matrix_params(cfg) + cfg.num_layers * self.layer_vector_params(cfg)
                   + len(cfg.moe_layers) * cfg.num_experts + cfg.hidden_size)

    def matrix_params(self, cfg) -> int:
        return int(self._matrices(cfg, cfg.num_experts))

    def matrix_params_read(self, cfg, rows: int) -> float:
        """The shared matrices plus, per MoE layer, the experts ``rows`` tokens route to under
        uniform routing: ``E * (1 - (1 - k/E) ** rows)``."""
        E, k = cfg.num_experts, cfg.num_experts_per_tok
        return float(self._matrices(cfg, E * (1 - (1 - k / E) ** rows)))

    def matrix_params_per_token(self, cfg) -> int:
        return int(self._matrices(cfg, cfg.num_experts_per_tok))

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """The latent and the rope key of every layer: ``L * (r + dr) * itemsize`` (576 numbers
        per layer for DeepSeek-V3, against ``2 * H * (dn + dr)`` were the keys and values cached)."""
        return cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize


DEEPSEEK_V3 = DeepseekV3Family()
