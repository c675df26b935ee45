"""DSpark's drafter configuration (``docs/dspark.md``): DFlash's (``DrafterConfig``) plus the
low-rank Markov head and the confidence head, in SpecForge's layout (architectures
``["DSparkDraftModel"]``, the fields in ``dflash_config`` with ``projector_type: "dspark"``; an
export normalised for SGLang, ``["Qwen3DSparkModel"]`` with the fields at the top level, is read
too).

Block rows: a DSpark drafter of ``block_size`` b runs over b rows ``[anchor, MASK * (b-1)]`` and
drafts at every row, the anchor's included (row k proposes the token after position anchor + k,
as SpecForge trains it), so it proposes b tokens and the target verifies b + 1."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dflash_jax.config import read_config_json
from dflash_jax.methods.dflash.config import DFLASH_ARCHITECTURE, DrafterConfig

DSPARK_ARCHITECTURE = "DSparkDraftModel"  # SpecForge's class name
DSPARK_ARCHITECTURES = (DSPARK_ARCHITECTURE, "Qwen3DSparkModel")  # and the SGLang-normalised export's
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
DSPARK_FIELDS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")
"""The fields DSpark adds to DFlash's ``dflash_config`` (an SGLang export has them at the top)."""


@dataclasses.dataclass(frozen=True)
class DSparkConfig(DrafterConfig):
    """A DSpark drafter: a DFlash drafter (every field of ``DrafterConfig``; conditioning "kv"
    only; ``block_size`` b = the rows it runs over and the tokens it drafts, module docstring)
    whose logits at each row get a bias from the token before it, and which predicts each row's
    chance of acceptance.

    Attributes (beyond ``DrafterConfig``'s):
        markov_rank: r, the rank of the Markov head (token embedding [V, r], projection [r, V])
        markov_head_type: "vanilla" (bias = w2 e[prev]), "gated" (e[prev] gated by the row's
            hidden state) or "rnn" (a recurrent state over the block's rows)
        enable_confidence_head: whether it has the confidence head (a linear map to one logit)
        confidence_head_with_markov: the confidence head reads e[prev] beside the hidden state
    """

    scales_implemented = False

    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True

    def __post_init__(self):
        super().__post_init__()
        r = self.markov_rank
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"DSpark markov_rank must be an integer >= 1 (the Markov head is what DSpark adds "
                             f"to DFlash), got {r!r}")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"DSpark markov_head_type {self.markov_head_type!r} is not implemented; the types "
                             f"are {', '.join(MARKOV_HEAD_TYPES)}")
        for name in ("enable_confidence_head", "confidence_head_with_markov"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DSpark {name} must be true or false, got {getattr(self, name)!r}")
        if self.conditioning != "kv":
            raise ValueError(f"DSpark drafters are conditioned by kv injection, not {self.conditioning!r}")

    @property
    def confidence_width(self) -> int:
        """The confidence head's input width: D, plus r with the Markov embedding."""
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)

    @property
    def backbone(self) -> DrafterConfig:
        """The DFlash drafter under the heads."""
        return DrafterConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DrafterConfig)})

    @classmethod
    def for_target(cls, target, num_layers: int, block_size: int, mask_token_id: int,
                   target_layer_ids=None, intermediate_size: int | None = None, **dspark) -> "DSparkConfig":
        """:meth:`DrafterConfig.for_target` with the DSpark fields (``dspark``: any of
        :data:`DSPARK_FIELDS`; the rest their defaults)."""
        base = DrafterConfig.for_target(target, num_layers, block_size, mask_token_id, target_layer_ids,
                                        intermediate_size)
        return cls.from_backbone(base, **dspark)

    @classmethod
    def from_backbone(cls, base: DrafterConfig, **dspark) -> "DSparkConfig":
        unknown = set(dspark) - set(DSPARK_FIELDS)
        if unknown:
            raise TypeError(f"unknown DSpark fields {sorted(unknown)}; they are {', '.join(DSPARK_FIELDS)}")
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(DrafterConfig)}, **dspark)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DSparkConfig":
        """SpecForge's layout: DFlash's released ``config.json`` (read and refused as
        :meth:`DrafterConfig.from_hf_dict` reads it) with the :data:`DSPARK_FIELDS` in
        ``dflash_config`` (or at the top level), ``projector_type`` "dspark" or absent,
        ``attention_mode`` "gqa" (fewer K/V heads than query heads) or "mha" (as many), and
        ``confidence_head_alpha`` (a training weight; the confidence head is on by default when
        it is above 0). Anything else is a ValueError naming the field."""
        dflash = dict(d.get("dflash_config") or {})
        top = {k: v for k, v in d.items() if k not in DSPARK_FIELDS}

        def field(name, default=None):
            value = dflash.pop(name, None)
            return d.get(name, default) if value is None else value

        projector = dflash.pop("projector_type", None)
        if projector not in (None, "dspark"):
            raise ValueError(f"DSpark drafter config.json dflash_config.projector_type={projector!r}: a DSpark "
                             "drafter's is \"dspark\"")
        mode = str(dflash.pop("attention_mode", "gqa")).lower()
        heads, kv = d.get("num_attention_heads"), d.get("num_key_value_heads", d.get("num_attention_heads"))
        if mode not in ("gqa", "mha"):
            raise ValueError(f"DSpark drafter config.json dflash_config.attention_mode={mode!r}: it is "
                             "\"gqa\" or \"mha\"")
        if heads is not None and (mode == "mha") != (kv == heads):
            raise ValueError(f"DSpark drafter config.json dflash_config.attention_mode={mode!r} does not match "
                             f"{heads} query and {kv} key/value heads (\"mha\": as many, \"gqa\": fewer)")
        alpha = dflash.pop("confidence_head_alpha", None)
        rank = field("markov_rank", 0)
        if isinstance(rank, bool) or not isinstance(rank, (int, float)) or int(rank) != rank or rank < 1:
            raise ValueError(f"DSpark drafter config.json dflash_config.markov_rank={rank!r}: it must be an "
                             "integer >= 1 (a DSpark drafter without its Markov head is a DFlash drafter)")
        own = {"markov_rank": int(rank),
               "markov_head_type": str(field("markov_head_type", "vanilla")).lower(),
               "enable_confidence_head": bool(field("enable_confidence_head", bool(alpha) and float(alpha) > 0))}
        own["confidence_head_with_markov"] = bool(field("confidence_head_with_markov", False))
        if own["markov_head_type"] not in MARKOV_HEAD_TYPES:
            raise ValueError(f"DSpark drafter config.json dflash_config.markov_head_type="
                             f"{own['markov_head_type']!r} is not implemented; the types are "
                             f"{', '.join(MARKOV_HEAD_TYPES)}")
        base = DrafterConfig.from_hf_dict({**top, "architectures": [DFLASH_ARCHITECTURE], "dflash_config": dflash})
        return cls.from_backbone(base, **own)

    @classmethod
    def from_pretrained(cls, path) -> "DSparkConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        """SpecForge's layout: DFlash's released ``config.json`` with architectures
        ``["DSparkDraftModel"]`` and, in ``dflash_config``, ``projector_type`` "dspark",
        ``attention_mode`` and the :data:`DSPARK_FIELDS`."""
        d = self.backbone.to_hf_dict()
        d["architectures"] = [DSPARK_ARCHITECTURE]
        mode = "mha" if self.num_kv_heads == self.num_heads else "gqa"
        d["dflash_config"] = {**d["dflash_config"], "projector_type": "dspark", "attention_mode": mode,
                              **{name: getattr(self, name) for name in DSPARK_FIELDS}}
        return d
