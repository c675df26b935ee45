"""DFlash2's drafter configuration (``docs/dflash2.md``): DFlash's (``DrafterConfig``) plus the
grouped dynamic causal convolutions around every layer's attention and MLP and the candidate
selector, in the layout of the reference package (``dflash==0.1.0``: architectures
``["DFlash2DraftModel"]``, the four fields in ``dflash_config``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dflash_jax.config import read_config_json
from dflash_jax.methods.dflash.config import DFLASH_ARCHITECTURE, DrafterConfig

DFLASH2_ARCHITECTURE = "DFlash2DraftModel"  # the class name the reference package records
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
"""The fields DFlash2 adds to DFlash's ``dflash_config`` (the reference also reads them at the
top level, after ``dflash_config``)."""


@dataclasses.dataclass(frozen=True)
class DFlash2Config(DrafterConfig):
    """A DFlash2 drafter: a DFlash drafter (every field of ``DrafterConfig``; conditioning "kv"
    only) whose layers wrap their attention and their MLP each in a grouped dynamic causal
    convolution over the block rows, and whose block logits go through a candidate selector.

    Attributes (beyond ``DrafterConfig``'s):
        conv_kernel_size: K, the block rows each convolution reaches back (itself included)
        conv_group_size: channels per group (it divides hidden_size); each group gets one
            input-dependent kernel tap per offset, added to a per-channel base kernel
        selector_rank: r, the rank of the selector's token codebooks [V, r] and its projection
            of the block row's hidden state [D, r]
        selector_top_k: the candidates per block row the selector re-scores (the logits' top-k)
    """

    scales_implemented = False

    conv_kernel_size: int = 4
    conv_group_size: int = 64
    selector_rank: int = 64
    selector_top_k: int = 8

    def __post_init__(self):
        super().__post_init__()
        for name in DFLASH2_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DFlash2 {name} must be an integer >= 1, got {value!r}")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"DFlash2 conv_group_size {self.conv_group_size} must divide hidden_size "
                             f"{self.hidden_size} (the convolution's channel groups)")
        if self.selector_top_k > self.vocab_size:
            raise ValueError(f"DFlash2 selector_top_k {self.selector_top_k} exceeds the vocabulary "
                             f"({self.vocab_size} tokens)")
        if self.conditioning != "kv":
            raise ValueError(f"DFlash2 drafters are conditioned by kv injection, not {self.conditioning!r}")

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    @property
    def backbone(self) -> DrafterConfig:
        """The DFlash drafter under the convolutions and the selector."""
        return DrafterConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DrafterConfig)})

    @classmethod
    def for_target(cls, target, num_layers: int, block_size: int, mask_token_id: int,
                   target_layer_ids=None, intermediate_size: int | None = None, conditioning: str = "kv",
                   **dflash2) -> "DFlash2Config":
        """:meth:`DrafterConfig.for_target` with the DFlash2 fields (``dflash2``: any of
        :data:`DFLASH2_FIELDS`; the rest their defaults)."""
        base = DrafterConfig.for_target(target, num_layers, block_size, mask_token_id, target_layer_ids,
                                        intermediate_size, conditioning)
        return cls.from_backbone(base, **dflash2)

    @classmethod
    def from_backbone(cls, base: DrafterConfig, **dflash2) -> "DFlash2Config":
        unknown = set(dflash2) - set(DFLASH2_FIELDS)
        if unknown:
            raise TypeError(f"unknown DFlash2 fields {sorted(unknown)}; they are {', '.join(DFLASH2_FIELDS)}")
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(DrafterConfig)}, **dflash2)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DFlash2Config":
        """The reference's layout: DFlash's released ``config.json`` (read and refused as
        :meth:`DrafterConfig.from_hf_dict` reads it) with architectures ``DFlash2DraftModel``
        and the four :data:`DFLASH2_FIELDS` in ``dflash_config`` (or at the top level); a
        missing one is a ValueError naming it."""
        dflash = dict(d.get("dflash_config") or {})
        own = {}
        for name in DFLASH2_FIELDS:
            value = dflash.pop(name, d.get(name))
            if value is None:
                raise ValueError(f"DFlash2 drafter config.json has no dflash_config.{name}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise ValueError(f"DFlash2 drafter config.json dflash_config.{name} must be an integer, "
                                 f"got {value!r}")
            own[name] = int(value)
        base = {k: v for k, v in d.items() if k not in DFLASH2_FIELDS}
        base = DrafterConfig.from_hf_dict({**base, "architectures": [DFLASH_ARCHITECTURE], "dflash_config": dflash})
        return cls.from_backbone(base, **own)

    @classmethod
    def from_pretrained(cls, path) -> "DFlash2Config":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        """DFlash's released layout with architectures ``["DFlash2DraftModel"]`` and the four
        fields in ``dflash_config``, as the reference package reads it."""
        d = self.backbone.to_hf_dict()
        d["architectures"] = [DFLASH2_ARCHITECTURE]
        d["dflash_config"] = {**d["dflash_config"], **{name: getattr(self, name) for name in DFLASH2_FIELDS}}
        return d
