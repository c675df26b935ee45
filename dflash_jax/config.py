"""Static model configurations, built from and written back to Hugging Face ``config.json``.

Configs are frozen, hashable dataclasses so they can be passed to ``jax.jit`` as static
arguments. Field names describe dimensions in the notation of SPEC.md section 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters.

    ``rope_type`` is ``"default"`` (plain RoPE) or ``"llama3"`` (Llama 3.1+ frequency scaling,
    which uses ``factor``, ``low_freq_factor``, ``high_freq_factor`` and
    ``original_max_position_embeddings``).
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def to_hf(self) -> dict:
        out: dict[str, Any] = {"rope_theta": self.theta, "rope_type": self.rope_type}
        if self.rope_type == "llama3":
            out.update(
                factor=self.factor,
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return out


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """A decoder-only target LM (Qwen3 or Llama 3.x).

    Dimensions: ``hidden_size`` = D, ``num_heads`` = H, ``num_kv_heads`` = Hkv,
    ``head_dim`` = Dh, ``intermediate_size`` = F (SwiGLU width), ``num_layers`` = N,
    ``vocab_size`` = V.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unknown model_type {self.model_type!r}; supported model types are "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope.rope_type not in ("default", "llama3"):
            raise ValueError(
                f"unsupported rope type {self.rope.rope_type!r}; supported: 'default', 'llama3'"
            )

    @property
    def qk_norm(self) -> bool:
        """Qwen3 applies a per-head RMSNorm to q and k before RoPE; Llama does not."""
        return self.model_type == "qwen3"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    # ------------------------------------------------------------------ Hugging Face I/O
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "TargetConfig":
        """Builds a config from the contents of a Hugging Face ``config.json``."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unknown model_type {model_type!r} in config.json; supported model types are "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config.json is missing required fields: {', '.join(missing)}")
        if d.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported (no Qwen3/Llama-3 checkpoint uses it)")
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        head_dim = d.get("head_dim") or hidden // num_heads
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=rope_from_hf(d),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_ids,
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "TargetConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        """A ``config.json`` dictionary that transformers 5 loads as the same model."""
        arch = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[self.model_type]
        eos: Any = list(self.eos_token_id)
        if len(eos) == 1:
            eos = eos[0]
        elif not eos:
            eos = None
        return {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": self.rope.to_hf(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }

    def num_params(self) -> int:
        D, F, L, V = self.hidden_size, self.intermediate_size, self.num_layers, self.vocab_size
        attn = D * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * D * F + 2 * D + (2 * self.head_dim if self.qk_norm else 0)
        return L * per_layer + V * D * (1 if self.tie_word_embeddings else 2) + D


def rope_from_hf(d: Mapping[str, Any]) -> RopeConfig:
    """Reads RoPE settings from either layout.

    Hub files for Qwen3-8B and Llama-3.1 carry ``rope_theta`` at the top level and an optional
    ``rope_scaling`` dict; transformers 5 writes a single ``rope_parameters`` dict instead.
    """
    params = dict(d.get("rope_parameters") or {})
    scaling = dict(d.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(
            f"unsupported rope scaling type {rope_type!r}; supported: 'default', 'llama3'"
        )
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    try:
        return RopeConfig(
            theta=float(theta),
            rope_type="llama3",
            factor=float(merged["factor"]),
            low_freq_factor=float(merged["low_freq_factor"]),
            high_freq_factor=float(merged["high_freq_factor"]),
            original_max_position_embeddings=int(merged["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ValueError(f"llama3 rope scaling is missing field {e.args[0]!r}") from None


def read_config_json(path: str | os.PathLike) -> dict:
    """Reads ``config.json`` from a checkpoint directory (or the file itself)."""
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        raise FileNotFoundError(
            f"no config.json at {file!r}: pass a Hugging Face checkpoint directory "
            "(config.json + model.safetensors)"
        )
    with open(file) as f:
        return json.load(f)
