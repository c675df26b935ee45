"""EAGLE-3's drafter config (:class:`Eagle3Config`): the released ``LlamaForCausalLMEagle3``
layout (SpecForge's and the EAGLE repository's ``config.json``), read, written and checked
against a target; ``docs/eagle3.md``."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from dflash_jax.config import (SUPPORTED_ROPE_TYPES, RopeConfig, TargetConfig, decoder_fields_from_hf,
                               decoder_fields_to_hf, read_config_json, refuse)

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_eagle3_layer_ids(num_target_layers: int) -> tuple[int, int, int]:
    """The three target layers whose outputs feed an EAGLE-3 drafter when its config names none:
    SpecForge's default ``(1, N // 2 - 1, N - 4)`` (layer outputs; the EAGLE repository's
    inputs of layers 2, N // 2 and N - 3 are the same hidden states). Targets too shallow for
    three distinct, increasing layers there (N < 8) have no default: name them."""
    n = int(num_target_layers)
    ids = (1, n // 2 - 1, n - 4)
    if not ids[0] < ids[1] < ids[2]:
        raise ValueError(f"a {n}-layer target has no default EAGLE-3 feature layers (the rule "
                         f"(1, N // 2 - 1, N - 4) gives {list(ids)}): name three increasing "
                         "layers (eagle_config.eagle_aux_hidden_state_layer_ids, or "
                         "--eagle3-layers when training)")
    return ids


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 drafter (``docs/eagle3.md``) in the released layout (SpecForge's and the EAGLE
    repository's ``LlamaForCausalLMEagle3``).

    One Llama decoder layer (``midlayer``) whose attention projections read ``2 D`` inputs
    ``[input_layernorm(embed(token)) ; hidden_norm(feature)]``; ``fc`` maps the three tapped
    target features ``[3 * target_hidden_size]`` to D; ``norm`` + ``lm_head`` give logits over
    the draft vocabulary (``draft_vocab_size`` = Vd tokens; draft id i is target id
    ``i + d2t[i]``, the map travelling with the weights). The embedding is the target's.

    ``target_layer_ids``: the three target layers whose OUTPUTS are the features (the
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` of the config.json; our tap convention:
    the last layer's output is after the final norm). ``norm_output``: logits from the normed
    hidden state (SpecForge's default; False: the raw one).
    """

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_hidden_size: int
    target_layer_ids: tuple[int, int, int]
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    max_position_embeddings: int = 4096
    norm_output: bool = True

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        for name in ("vocab_size", "draft_vocab_size", "hidden_size", "intermediate_size",
                     "num_heads", "num_kv_heads", "head_dim", "target_hidden_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v <= 0:
                raise ValueError(f"EAGLE-3 config field {name} must be a positive integer, got {v!r}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size ({self.draft_vocab_size}) is larger than the "
                             f"target's vocab_size ({self.vocab_size}): the draft vocabulary is "
                             "a subset of the target's")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if len(self.target_layer_ids) != 3:
            raise ValueError(f"an EAGLE-3 drafter reads exactly three target layers (low, middle, "
                             f"high), got target_layer_ids={list(self.target_layer_ids)}")
        n = self.num_target_layers
        if n is not None and (isinstance(n, bool) or int(n) != n or n <= 0):
            raise ValueError(f"EAGLE-3 config field num_target_layers must be a positive integer "
                             f"or absent, got {n!r}")
        bad = [i for i in self.target_layer_ids if i < 0 or (n is not None and i >= n)]
        if bad:
            raise ValueError(f"EAGLE-3 feature layers {bad} (target_layer_ids / eagle_config."
                             "eagle_aux_hidden_state_layer_ids) are not layers of the "
                             + (f"{n}-layer target" if n is not None else "target (negative)")
                             + ": name three layer indices in [0, num_target_layers)")
        if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope type {self.rope.rope_type!r}; supported: "
                             + ", ".join(map(repr, SUPPORTED_ROPE_TYPES)))

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features ``fc`` reads: 3 * target_hidden_size."""
        return 3 * self.target_hidden_size

    @classmethod
    def for_target(cls, target: TargetConfig, draft_vocab_size: int | None = None,
                   target_layer_ids=None, intermediate_size: int | None = None) -> "Eagle3Config":
        """An EAGLE-3 drafter shaped like ``target``'s layers (heads, head_dim, MLP width, RoPE),
        with ``draft_vocab_size`` tokens (default the whole vocabulary) and the given feature
        layers (default :func:`default_eagle3_layer_ids`)."""
        ids = (default_eagle3_layer_ids(target.num_layers) if target_layer_ids is None
               else tuple(target_layer_ids))
        return cls(vocab_size=target.vocab_size,
                   draft_vocab_size=int(draft_vocab_size or target.vocab_size),
                   hidden_size=target.hidden_size,
                   intermediate_size=int(intermediate_size or target.intermediate_size),
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
                   head_dim=target.head_dim, target_hidden_size=target.hidden_size,
                   target_layer_ids=ids, num_target_layers=target.num_layers,
                   rms_norm_eps=target.rms_norm_eps, rope=target.rope,
                   max_position_embeddings=target.max_position_embeddings)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], target: TargetConfig | None = None) -> "Eagle3Config":
        """Reads an EAGLE-3 ``config.json``. Its feature layers come from
        ``eagle_config.eagle_aux_hidden_state_layer_ids``; a config without them (the EAGLE
        repository's releases) takes :func:`default_eagle3_layer_ids` of ``target`` (needed
        then)."""
        archs = list(d.get("architectures") or [])
        if not any("eagle3" in a.lower() for a in archs):
            raise ValueError(f"not an EAGLE-3 drafter config: architectures {archs} (expected "
                             f"{EAGLE3_ARCHITECTURE!r}); a DFlash drafter loads with "
                             "load_drafter")
        layers = int(d.get("num_hidden_layers", 1))
        problems = []
        if layers != 1:
            problems.append(f"num_hidden_layers: {layers} (an EAGLE-3 drafter has one decoder "
                            "layer, 'midlayer')")
        if d.get("fc_norm"):
            problems.append("fc_norm: true (per-feature RMSNorms before fc)")
        if d.get("attention_bias"):
            problems.append("attention_bias: true")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            problems.append(f"hidden_act: {act!r} (SwiGLU with silu only)")
        refuse(problems, "this EAGLE-3 config")
        f = decoder_fields_from_hf(d, "EAGLE-3 config.json")
        eagle = d.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if target is None:
                raise ValueError("this EAGLE-3 config names no feature layers "
                                 "(eagle_config.eagle_aux_hidden_state_layer_ids): load it with "
                                 "its target, which gives the default ones")
            ids = default_eagle3_layer_ids(target.num_layers)
        return cls(vocab_size=f["vocab_size"],
                   draft_vocab_size=int(d.get("draft_vocab_size") or f["vocab_size"]),
                   hidden_size=f["hidden_size"], intermediate_size=f["intermediate_size"],
                   num_heads=f["num_heads"], num_kv_heads=f["num_kv_heads"], head_dim=f["head_dim"],
                   target_hidden_size=int(d.get("target_hidden_size") or f["hidden_size"]),
                   target_layer_ids=tuple(ids),
                   num_target_layers=(int(eagle["num_target_layers"]) if "num_target_layers" in eagle
                                      else target.num_layers if target is not None else None),
                   rms_norm_eps=f["rms_norm_eps"], rope=f["rope"],
                   max_position_embeddings=f["max_position_embeddings"],
                   norm_output=bool(d.get("norm_output", True)))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, target: TargetConfig | None = None) -> "Eagle3Config":
        return cls.from_hf_dict(read_config_json(path), target)

    def to_hf_dict(self) -> dict:
        """The config.json SpecForge writes (``LlamaForCausalLMEagle3``, model_type llama), with
        the feature layers in ``eagle_config``."""
        fields = decoder_fields_to_hf(_Eagle3HF(self))
        eagle = {"eagle_aux_hidden_state_layer_ids": list(self.target_layer_ids)}
        if self.num_target_layers is not None:
            eagle["num_target_layers"] = self.num_target_layers
        return {"architectures": [EAGLE3_ARCHITECTURE], "model_type": "llama", **fields,
                "draft_vocab_size": self.draft_vocab_size,
                "target_hidden_size": self.target_hidden_size, "attention_bias": False,
                "tie_word_embeddings": False, "norm_output": self.norm_output,
                "eagle_config": eagle}

    def check_target(self, target: TargetConfig) -> None:
        """Raises ValueError naming every way this drafter does not fit ``target`` (the hidden
        size and vocabulary it shares, the feature width, the feature layers)."""
        problems = []
        for mine, theirs, label in (
                (self.hidden_size, target.hidden_size, "hidden_size (the drafter embeds tokens with the target's embedding)"),
                (self.vocab_size, target.vocab_size, "vocab_size"),
                (self.target_hidden_size, target.hidden_size, "target_hidden_size")):
            if mine != theirs:
                problems.append(f"{label}: drafter {mine}, target {theirs}")
        if self.num_target_layers is not None and self.num_target_layers != target.num_layers:
            problems.append(f"num_target_layers: drafter {self.num_target_layers}, target "
                            f"{target.num_layers}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} are not layers of the {target.num_layers}-layer target")
        if problems:
            raise ValueError("EAGLE-3 drafter and target do not match:\n  " + "\n  ".join(problems))


@dataclasses.dataclass(frozen=True)
class _Eagle3HF:
    """The decoder fields of an :class:`Eagle3Config` as :func:`decoder_fields_to_hf` reads them."""

    cfg: Eagle3Config

    def __getattr__(self, name):
        return 1 if name == "num_layers" else getattr(self.cfg, name)
