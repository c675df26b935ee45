"""Domino's drafter configuration (``docs/domino.md``): DFlash's (``DrafterConfig``) plus the GRU
logit correction, in SpecForge's layout (architectures ``["DominoDraftModel"]``, the fields in
``dflash_config`` with ``projector_type: "domino"``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dflash_jax.config import read_config_json
from dflash_jax.methods.dflash.config import DFLASH_ARCHITECTURE, DrafterConfig

DOMINO_ARCHITECTURE = "DominoDraftModel"  # SpecForge's class name
DOMINO_FIELDS = ("emb_dim", "gru_hidden_dim", "shift_label", "pure_draft_prefix_len")
"""The fields Domino adds to DFlash's ``dflash_config``."""


@dataclasses.dataclass(frozen=True)
class DominoConfig(DrafterConfig):
    """A Domino drafter: a DFlash drafter (every field of ``DrafterConfig``; conditioning "kv"
    only) whose drafted rows get a correction from a GRU over the block's tokens before them.

    Attributes (beyond ``DrafterConfig``'s):
        emb_dim: E, the correction's bottleneck ([D + H] -> E -> V, SiLU between)
        gru_hidden_dim: H, the GRU's state (no biases)
        shift_label: True (the released config): block row k drafts the token after its
            position (rows 0 .. b-2 draft); False: DFlash's rows (row k drafts its own position,
            rows 1 .. b-1)
        pure_draft_prefix_len: P, the first drafts left uncorrected (the backbone's logits)
    """

    scales_implemented = False

    emb_dim: int = 256
    gru_hidden_dim: int = 1024
    shift_label: bool = True
    pure_draft_prefix_len: int = 1

    def __post_init__(self):
        super().__post_init__()
        for name in ("emb_dim", "gru_hidden_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Domino {name} must be an integer >= 1, got {v!r}")
        p = self.pure_draft_prefix_len
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.block_size - 1:
            raise ValueError(f"Domino pure_draft_prefix_len must be an integer in 0 .. {self.block_size - 2} (at "
                             f"least one corrected draft in a block of {self.block_size}), got {p!r}")
        if not isinstance(self.shift_label, bool):
            raise ValueError(f"Domino shift_label must be true or false, got {self.shift_label!r}")
        if self.conditioning != "kv":
            raise ValueError(f"Domino drafters are conditioned by kv injection, not {self.conditioning!r}")

    @property
    def backbone(self) -> DrafterConfig:
        return DrafterConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DrafterConfig)})

    @classmethod
    def for_target(cls, target, num_layers: int, block_size: int, mask_token_id: int,
                   target_layer_ids=None, intermediate_size: int | None = None, **domino) -> "DominoConfig":
        base = DrafterConfig.for_target(target, num_layers, block_size, mask_token_id, target_layer_ids,
                                        intermediate_size)
        return cls.from_backbone(base, **domino)

    @classmethod
    def from_backbone(cls, base: DrafterConfig, **domino) -> "DominoConfig":
        unknown = set(domino) - set(DOMINO_FIELDS)
        if unknown:
            raise TypeError(f"unknown Domino fields {sorted(unknown)}; they are {', '.join(DOMINO_FIELDS)}")
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(DrafterConfig)}, **domino)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DominoConfig":
        """SpecForge's layout: DFlash's released ``config.json`` with ``emb_dim`` and
        ``gru_hidden_dim`` (required), ``shift_label`` and ``pure_draft_prefix_len`` (default
        false, 0, as SpecForge reads them) in ``dflash_config``, ``projector_type`` "domino" or
        absent. Anything else is a ValueError naming the field."""
        dflash = dict(d.get("dflash_config") or {})
        projector = dflash.pop("projector_type", None)
        if projector not in (None, "domino"):
            raise ValueError(f"Domino drafter config.json dflash_config.projector_type={projector!r}: a Domino "
                             "drafter's is \"domino\"")
        own = {}
        for name in ("emb_dim", "gru_hidden_dim"):
            v = dflash.pop(name, None)
            if v is None:
                raise ValueError(f"Domino drafter config.json has no dflash_config.{name}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
                raise ValueError(f"Domino drafter config.json dflash_config.{name} must be an integer, got {v!r}")
            own[name] = int(v)
        own["shift_label"] = bool(dflash.pop("shift_label", False))
        p = dflash.pop("pure_draft_prefix_len", 0)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or int(p) != p:
            raise ValueError(f"Domino drafter config.json dflash_config.pure_draft_prefix_len must be an integer, "
                             f"got {p!r}")
        own["pure_draft_prefix_len"] = int(p)
        base = DrafterConfig.from_hf_dict({**d, "architectures": [DFLASH_ARCHITECTURE], "dflash_config": dflash})
        return cls.from_backbone(base, **own)

    @classmethod
    def from_pretrained(cls, path) -> "DominoConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        d = self.backbone.to_hf_dict()
        d["architectures"] = [DOMINO_ARCHITECTURE]
        d["dflash_config"] = {**d["dflash_config"], "projector_type": "domino",
                              **{name: getattr(self, name) for name in DOMINO_FIELDS}}
        return d
