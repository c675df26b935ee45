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


def _decoder_fields_from_hf(d: Mapping[str, Any], what: str) -> dict:
    """The decoder-shape fields shared by targets and drafters, read from a config.json."""
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{what} is missing required fields: {', '.join(missing)}")
    heads = int(d["num_attention_heads"])
    return dict(
        vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]), num_layers=int(d["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope=rope_from_hf(d),
        max_position_embeddings=int(d.get("max_position_embeddings", 4096)))


def _decoder_fields_to_hf(cfg) -> dict:
    """Inverse of :func:`_decoder_fields_from_hf` (transformers-5 ``rope_parameters``)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": cfg.rope.to_hf(),
        "max_position_embeddings": cfg.max_position_embeddings,
    }


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
        fields = _decoder_fields_from_hf(d, "config.json")
        if d.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported (no Qwen3/Llama-3 checkpoint uses it)")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            model_type=model_type,
            **fields,
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
            **_decoder_fields_to_hf(self),
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


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """SPEC section 2: n taps spread evenly from layer 1 to layer N-3 (``[N // 2]`` for n = 1).

    For a 36-layer target and 5 drafter layers: (1, 9, 17, 25, 33).
    """
    N, n = num_target_layers, num_draft_layers
    if n == 1:
        return (N // 2,)
    if N < 4:
        raise ValueError(f"the default tap formula needs a target with >= 4 layers, got {N}; "
                         "pass target_layer_ids explicitly")
    return tuple(int(round(1 + j * (N - 4) / (n - 1))) for j in range(n))


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """A DFlash drafter (SPEC section 3): ``num_layers`` = n Qwen3-style layers with the
    target's attention shapes, conditioned on ``len(target_layer_ids)`` = k target taps.

    ``block_size`` is the training block size (the default at inference);
    ``mask_token_id`` must be a row of the target's embedding.
    """

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    max_position_embeddings: int = 4096

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("a drafter needs at least one target layer id")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def for_target(cls, target: TargetConfig, num_layers: int, block_size: int, mask_token_id: int,
                   target_layer_ids: tuple[int, ...] | None = None,
                   intermediate_size: int | None = None) -> "DrafterConfig":
        """A drafter shaped like ``target`` (the released recipe)."""
        ids = tuple(target_layer_ids) if target_layer_ids else default_target_layer_ids(
            target.num_layers, num_layers)
        return cls(num_layers=num_layers, hidden_size=target.hidden_size,
                   intermediate_size=intermediate_size or target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
                   head_dim=target.head_dim, vocab_size=target.vocab_size, block_size=block_size,
                   num_target_layers=target.num_layers, target_layer_ids=ids,
                   mask_token_id=mask_token_id, rms_norm_eps=target.rms_norm_eps, rope=target.rope,
                   max_position_embeddings=target.max_position_embeddings)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DrafterConfig":
        """Reads the released layout: a Qwen3 config plus ``block_size``, ``num_target_layers``
        and ``dflash_config: {target_layer_ids, mask_token_id}``."""
        fields = _decoder_fields_from_hf(d, "drafter config.json")
        dflash = dict(d.get("dflash_config") or {})
        if "num_target_layers" not in d:
            raise ValueError("drafter config.json has no num_target_layers: is this a DFlash drafter?")
        N = int(d["num_target_layers"])
        if "mask_token_id" not in dflash:
            raise ValueError("drafter config.json has no dflash_config.mask_token_id; set it to the "
                             "target's mask token (Qwen3: 151669, Llama-3.1: 128002)")
        ids = dflash.get("target_layer_ids")
        ids = tuple(int(i) for i in ids) if ids else default_target_layer_ids(N, fields["num_layers"])
        return cls(**fields, block_size=int(d.get("block_size", 16)), num_target_layers=N,
                   target_layer_ids=ids, mask_token_id=int(dflash["mask_token_id"]))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "DrafterConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            **_decoder_fields_to_hf(self),
            "attention_bias": False,
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids),
                              "mask_token_id": self.mask_token_id},
        }

    def check_target(self, target: TargetConfig) -> None:
        """Raises ValueError naming every way this drafter disagrees with ``target``."""
        problems = []
        for mine, theirs, label in (
                (self.hidden_size, target.hidden_size, "hidden_size"),
                (self.num_heads, target.num_heads, "num_attention_heads"),
                (self.num_kv_heads, target.num_kv_heads, "num_key_value_heads"),
                (self.head_dim, target.head_dim, "head_dim"),
                (self.vocab_size, target.vocab_size, "vocab_size"),
                (self.num_target_layers, target.num_layers, "num_target_layers vs the target's num_hidden_layers")):
            if mine != theirs:
                problems.append(f"{label}: drafter {mine}, target {theirs}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} is not a row of the target's "
                            f"embedding (vocab_size {target.vocab_size})")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} are not layers of the {target.num_layers}-layer target")
        if problems:
            raise ValueError("drafter and target do not match:\n  " + "\n  ".join(problems))
