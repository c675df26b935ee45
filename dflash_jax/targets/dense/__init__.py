"""The dense decoder family: Qwen3 (``Qwen3ForCausalLM``) and Llama 3.x (``LlamaForCausalLM``).

Everything about these two architectures is here: the ``config.json`` reading (with the
refusals of fields not implemented) and writing, the checkpoint tensor names, the forward pass
(``model``), the decode state (a ``KVCache``: rollback sets the length), the partition rules
and the size model. The two differ only in Qwen3's per-head q/k RMSNorm, their architecture
name and Qwen3's attention-layout fields, so one class serves both (:data:`QWEN3`,
:data:`LLAMA`, registered in ``dflash_jax/targets/builtin.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dflash_jax.checkpoints import TensorSpec, layer_tensor_specs
from dflash_jax.config import (TargetConfig, decoder_fields_from_hf, decoder_fields_to_hf,
                               qwen3_full_attention_to_hf, refuse, unsupported_decoder_features)
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn import partitioning
from dflash_jax.targets.base import TargetFamily
from dflash_jax.targets.dense import model


class DenseFamily(TargetFamily):
    """A pre-norm decoder of GQA attention + SwiGLU MLP layers with a KV cache per layer."""

    tree_refusal = None  # verifies trees (nn.tree_attention)

    def __init__(self, model_type: str, architecture: str, qk_norm: bool):
        self.model_types = (model_type,)
        self.name = model_type
        self.architecture = architecture
        self.qk_norm = qk_norm

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]) -> TargetConfig:
        model_type = self.model_types[0]
        fields = decoder_fields_from_hf(d, "config.json")
        refuse(unsupported_decoder_features(d, qwen3_attention=model_type == "qwen3"),
               f"target config.json ({model_type})")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return TargetConfig(model_type=model_type, **fields,
                            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                            attention_bias=bool(d.get("attention_bias", False)),
                            bos_token_id=d.get("bos_token_id"), eos_token_id=eos_ids)

    def config_to_hf(self, cfg: TargetConfig) -> dict:
        """``architectures``, ``model_type``, the decoder shapes (``head_dim`` always
        explicit), ``hidden_act``, ``rms_norm_eps``, RoPE as top-level ``rope_theta`` +
        ``rope_scaling`` and as ``rope_parameters``, ``max_position_embeddings``,
        ``tie_word_embeddings``, ``attention_bias`` (+ ``mlp_bias`` for Llama; Qwen3's
        full-attention layout fields), ``bos_token_id``, ``eos_token_id`` (an int when there is
        one id, as hub files have it). The checkpoint writer adds ``dtype`` / ``torch_dtype``."""
        eos: Any = list(cfg.eos_token_id)
        if len(eos) == 1:
            eos = eos[0]
        elif not eos:
            eos = None
        layout = (qwen3_full_attention_to_hf(cfg.num_layers) if cfg.model_type == "qwen3"
                  else {"mlp_bias": False})
        return {"architectures": [self.architecture], "model_type": cfg.model_type,
                **decoder_fields_to_hf(cfg), "tie_word_embeddings": cfg.tie_word_embeddings,
                "attention_bias": cfg.attention_bias, **layout,
                "bos_token_id": cfg.bos_token_id, "eos_token_id": eos}

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg: TargetConfig) -> dict[str, TensorSpec]:
        """All tensors of a ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` checkpoint."""
        D, V = cfg.hidden_size, cfg.vocab_size
        specs = {"model.embed_tokens.weight": TensorSpec(("embed_tokens", "embedding"), None, False, (V, D))}
        specs.update(layer_tensor_specs("model.", cfg.num_layers, D, cfg.num_heads, cfg.num_kv_heads,
                                        cfg.head_dim, cfg.intermediate_size, self.qk_norm,
                                        cfg.attention_bias))
        specs["model.norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
        if not cfg.tie_word_embeddings:
            specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), None, True, (V, D))
        return specs

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        return model.init_target_params(cfg, key, dtype, init_scale)

    def init_state(self, cfg, batch: int, max_len: int, dtype) -> KVCache:
        return KVCache.for_config(cfg, batch, max_len, dtype)

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None,
                tree=None):
        return model.target_forward(cfg, params, tokens, positions, state,
                                    tap_layer_ids=tap_layer_ids, logit_index=logit_index,
                                    compute_logits=compute_logits, attention_impl=attention_impl,
                                    model_axis=model_axis, tree=tree)

    split_layers = staticmethod(model.split_layer_params)  # TargetFamily.loop_params, on CPU

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        """The decoder table (``nn.partitioning``; ``parallel.rules`` puts heads, KV heads, MLP
        width and vocabulary over ``model``, Megatron style)."""
        return partitioning.PARAM_AXES

    def state_axes(self, cfg) -> KVCache:
        return KVCache(k=partitioning.CACHE_AXES, v=partitioning.CACHE_AXES, lengths=("batch",))

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        return [("num_key_value_heads", cfg.num_kv_heads, "KV heads (a GQA group is never split)"),
                ("num_attention_heads", cfg.num_heads, "query heads"),
                ("intermediate_size", cfg.intermediate_size, "MLP width"),
                ("vocab_size", cfg.vocab_size, "vocabulary (embedding and LM head)")]

    def local_config(self, cfg, model: int):
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // model,
                                   num_kv_heads=cfg.num_kv_heads // model,
                                   intermediate_size=cfg.intermediate_size // model,
                                   vocab_size=cfg.vocab_size // model)

    # ------------------------------------------------------------------ size model
    def layer_matrix_params(self, cfg) -> int:
        """Parameters of one layer's matrices (q, k, v, o and the three MLP projections)."""
        D, Dh = cfg.hidden_size, cfg.head_dim
        return D * Dh * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * D * cfg.intermediate_size

    def layer_vector_params(self, cfg) -> int:
        """One layer's norms (two of D, Qwen3's q/k norms of Dh) and attention biases."""
        D, Dh = cfg.hidden_size, cfg.head_dim
        bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh + D if cfg.attention_bias else 0
        return 2 * D + (2 * Dh if self.qk_norm else 0) + bias

    def num_params(self, cfg) -> int:
        D, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
        per_layer = self.layer_matrix_params(cfg) + self.layer_vector_params(cfg)
        return L * per_layer + V * D * (1 if cfg.tie_word_embeddings else 2) + D

    def matrix_params(self, cfg) -> int:
        tables = 1 if cfg.tie_word_embeddings else 2
        return cfg.num_layers * self.layer_matrix_params(cfg) + tables * cfg.vocab_size * cfg.hidden_size

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """K and V of every layer: ``2 * L * Hkv * Dh * itemsize``."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


QWEN3 = DenseFamily("qwen3", "Qwen3ForCausalLM", qk_norm=True)
LLAMA = DenseFamily("llama", "LlamaForCausalLM", qk_norm=False)
