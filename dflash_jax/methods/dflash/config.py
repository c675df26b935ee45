"""DFlash's drafter configuration (``docs/method.md`` section 3): :class:`DrafterConfig`, the
released ``config.json`` read and written, the fields other DFlash implementations read and this
project refuses (``_DRAFTER_VARIANTS``), the attention layout, and the conditioning ablation."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from dflash_jax import methods
from dflash_jax.config import (QWEN3_DEFAULT_MAX_WINDOW_LAYERS, RopeConfig, TargetConfig,
                               decoder_fields_from_hf, decoder_fields_to_hf, default_target_layer_ids,
                               has_rope_theta, qwen3_full_attention_to_hf, read_config_json, refuse,
                               unsupported_decoder_features)


# Drafter fields that the public DFlash implementations (the reference, vLLM, SGLang,
# tpu-inference) read and that this project does not implement: (section, name, the values that
# are fine, why). Section "" is the top level, "dflash_config" the nested dict.
_OFF = lambda v: not v                                   # absent, null, false or 0
_ON = lambda v: v is None or v is True                   # absent, null or true
_ONE = lambda v: v is None or (not isinstance(v, bool) and float(v) == 1.0)
_DRAFTER_VARIANTS = (
    ("", "attention_bias", _OFF, "the drafter has no attention biases (docs/method.md section 3)"),
    ("", "is_causal", _OFF, "the drafter's block attention is non-causal"),
    ("dflash_config", "causal", _OFF, "the drafter's block attention is non-causal"),
    ("dflash_config", "use_swa", _OFF,
     "DSpark-style sliding-window attention (use_swa / swa_window_size) is not implemented; "
     "sliding drafter layers are read from layer_types + sliding_window"),
    ("dflash_config", "attention_sink_bias", _OFF, "attention sinks are not implemented"),
    ("", "add_swa_attention_sink_bias", _OFF, "attention sinks are not implemented"),
    ("dflash_config", "attention_value_scale", _ONE, "value scaling is not implemented"),
    ("", "logit_scale", _ONE, "logit scaling is not implemented"),
    ("dflash_config", "projector_type", _OFF,
     "only the released projector (fc + hidden_norm) is implemented; a \"dspark\" drafter is read as "
     "DSpark's (architectures DSparkDraftModel)"),
    ("dflash_config", "conv_kernel_size", _OFF, "convolutional drafters are not implemented"),
    ("dflash_config", "conv_group_size", _OFF, "convolutional drafters are not implemented"),
    ("dflash_config", "selector_rank", _OFF, "feature selectors are not implemented"),
    ("dflash_config", "selector_top_k", _OFF, "feature selectors are not implemented"),
    ("dflash_config", "shift_label", _OFF, "shifted (Domino) labels are not implemented: "
     "block row k predicts the token at anchor + k"),
    ("dflash_config", "pure_draft_prefix_len", _OFF, "Domino draft prefixes are not implemented"),
    ("", "has_embed_tokens", _OFF, "the drafter uses the target's embedding, never its own"),
    ("", "has_lm_head", _OFF, "the drafter uses the target's LM head, never its own"),
    ("", "use_aux_hidden_state", _ON, "the drafter is conditioned on the target's taps"),
    ("dflash_config", "use_aux_hidden_state", _ON, "the drafter is conditioned on the target's taps"),
    ("", "sample_from_anchor", _ON, "block row 0 is the anchor token (docs/method.md section 3)"),
    ("dflash_config", "sample_from_anchor", _ON, "block row 0 is the anchor token (docs/method.md section 3)"),
)


def _unsupported_drafter_features(d: Mapping[str, Any]) -> list[str]:
    """:func:`unsupported_decoder_features` plus the DFlash-specific variants above and the
    attention layouts :func:`drafter_attention_layout` refuses."""
    problems = unsupported_decoder_features(d, qwen3_attention=False)
    problems += drafter_attention_layout(d)[2]
    dflash = d.get("dflash_config") or {}
    for section, key, fine, why in _DRAFTER_VARIANTS:
        src = dflash if section else d
        if key in src and not fine(src[key]):
            name = f"{section}.{key}" if section else key
            problems.append(f"{name}={json.dumps(src[key])}: {why}")
    for key, ours in (("draft_vocab_size", "vocab_size"), ("target_hidden_size", "hidden_size")):
        if d.get(key) is not None and d.get(key) != d.get(ours):
            problems.append(f"{key}={d[key]} differs from {ours}={d.get(ours)}: the drafter works in "
                            "the target's vocabulary and hidden size")
    return problems


DRAFTER_LAYER_TYPES = ("full_attention", "sliding_attention")
"""The drafter layer types implemented (``DrafterConfig.layer_types``)."""


def drafter_attention_layout(d: Mapping[str, Any]) -> tuple[tuple[str, ...] | None, int | None,
                                                            list[str]]:
    """A drafter config.json's attention layout, read as transformers 5's ``Qwen3Config`` (and
    the reference's ``model.py``, SpecForge's ``DFlashDraftModel`` and SGLang) read it:
    ``(layer_types or None for all full, sliding_window or None, problems)``.

    ``sliding_window`` counts only with ``use_sliding_window: true`` (transformers sets it to
    null otherwise); an explicit ``layer_types`` decides which layers slide, else layers
    ``>= max_window_layers`` (default 28) slide when a window is set. Problems (each
    ``"field=value: why"``): a layer type other than full / sliding attention, a ``layer_types``
    of the wrong length, sliding layers without a window (the reference would run them as full
    attention, SpecForge refuses them), a window < 1, a ``dflash_config.swa_window_size`` that
    differs from the window, and explicitly non-causal sliding layers (``is_causal`` /
    ``dflash_config.causal`` false: SGLang then drops the causal block mask they were trained
    with).
    """
    problems: list[str] = []
    n = int(d.get("num_hidden_layers") or 0)
    window = d.get("sliding_window") if d.get("use_sliding_window", False) else None
    raw_types = d.get("layer_types")
    if raw_types is not None:
        types = tuple(str(t) for t in raw_types)
        other = sorted(set(types) - set(DRAFTER_LAYER_TYPES))
        if other:
            problems.append(f"layer_types contains {', '.join(map(repr, other))}: only "
                            + " and ".join(map(repr, DRAFTER_LAYER_TYPES)) + " drafter layers are "
                            "implemented")
        if len(types) != n:
            problems.append(f"layer_types has {len(types)} entries for {n} layers "
                            "(num_hidden_layers)")
    else:
        first = int(d.get("max_window_layers", QWEN3_DEFAULT_MAX_WINDOW_LAYERS))
        types = tuple("sliding_attention" if window is not None and i >= first
                      else "full_attention" for i in range(n))
    sliding = "sliding_attention" in types
    if sliding and window is None:
        problems.append(
            f"layer_types contains 'sliding_attention' but the config sets no window "
            f"(use_sliding_window={json.dumps(d.get('use_sliding_window'))}, "
            f"sliding_window={json.dumps(d.get('sliding_window'))}): transformers and the "
            "reference would run those layers as full attention, SpecForge refuses them; set "
            "use_sliding_window true and the window the drafter was trained with, or make them "
            "'full_attention'")
    if sliding and window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            problems.append(f"sliding_window={json.dumps(window)}: a sliding window must be an "
                            "integer >= 1 (positions a query sees, itself included)")
        swa = (d.get("dflash_config") or {}).get("swa_window_size")
        if swa is not None and swa != window:
            problems.append(f"dflash_config.swa_window_size={json.dumps(swa)} differs from "
                            f"sliding_window={window}: make them equal")
        for name, value in (("is_causal", d.get("is_causal")),
                            ("dflash_config.causal", (d.get("dflash_config") or {}).get("causal"))):
            if value is False:
                problems.append(f"{name}=false with sliding_attention layers: non-causal sliding "
                                "layers are not implemented (the released sliding drafters were "
                                "trained with a causal block in those layers; remove the field)")
    if not sliding:
        return None, None, problems
    return types, window, problems


CONDITIONINGS = ("kv", "input", "none")
"""How a drafter sees the target's features (``DrafterConfig.conditioning``)."""


def check_conditioning(value, where: str = "conditioning") -> str:
    """``value`` if it is one of :data:`CONDITIONINGS`, else a ValueError naming ``where``."""
    if not isinstance(value, str) or value not in CONDITIONINGS:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, CONDITIONINGS))}, got "
                         f"{value!r}")
    return value


def conditioning_from_hf(d: Mapping[str, Any]) -> str:
    """The conditioning a drafter ``config.json`` records in ``dflash_config.conditioning``
    (absent: ``"kv"``, the released drafters); an unknown value is a ValueError."""
    dflash = d.get("dflash_config") or {}
    if "conditioning" not in dflash:
        return "kv"
    return check_conditioning(dflash["conditioning"], "drafter config.json dflash_config.conditioning")


DFLASH_ARCHITECTURE = "DFlashDraftModel"  # the class name the released DFlash layout records


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """A DFlash drafter (docs/method.md section 3): ``num_layers`` = n Qwen3-style layers,
    conditioned on ``len(target_layer_ids)`` = k target taps.

    Its hidden size and vocabulary are the target's (it reads the target's features, embedding
    and LM head: :meth:`check_target`); its attention shapes (``num_heads``, ``num_kv_heads``,
    ``head_dim``) and ``intermediate_size`` are its own (:meth:`for_target` copies the
    target's; released drafters for MoE and hybrid targets differ, e.g. 32 / 4 / 128 on
    Qwen3.5-35B-A3B's 16 / 2 / 256).

    ``block_size`` is the training block size (the default at inference);
    ``mask_token_id`` must be a row of the target's embedding.

    ``layer_types``: None (every layer full attention) or one of ``"full_attention"`` /
    ``"sliding_attention"`` per layer; sliding layers use ``sliding_window`` = W >= 1 (None
    without sliding layers). SpecForge's DFlash training mask (``create_dflash_sdpa_mask`` with
    ``sliding_window``): in a sliding layer the block row at offset o (position ``p = a + o``,
    anchor a) sees context positions ``p - (W - 1) <= t < a`` and only the block rows at
    offsets ``<= o`` (causal in the block, not windowed); full layers: every context position
    ``t < a`` and the whole block (``methods.dflash.model``; docs/proposers.md). Only with conditioning
    ``"kv"``.

    ``conditioning``: how the target's projected features ``c = hidden_norm(fc(taps))`` enter
    the drafter (``methods.dflash.model``):

      * ``"kv"`` (the paper's method, the released drafters): injected into the keys and values
        of every layer;
      * ``"input"`` (the paper's "input fusion" comparison): only as input rows of the first
        layer, before the block rows; they go through the layers causally like an ordinary
        prefix, and layer j's block rows attend to layer j's K/V of those rows;
      * ``"none"`` (no target features): the block attends only to itself; no ``fc`` or
        ``hidden_norm`` parameters.

    ``config.json`` records it as ``dflash_config.conditioning`` when it is not ``"kv"``.
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
    conditioning: str = "kv"
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    OUTPUT_FIELDS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
    """The reference's (``dflash==0.1.0``) scalings around the target's embedding and LM head,
    which Gemma 4's drafters set: the block's embedding is the target's raw table row times
    ``input_embedding_scale``; the draft logits are the target's raw head times
    ``output_multiplier``, then ``c tanh(l / c)`` with c = ``final_logit_softcapping`` (None or
    0: no cap). Read from ``dflash_config`` first, then the top level, as the reference reads
    them; written into ``dflash_config`` when not the identity."""
    scales_implemented = True
    """False for a method built on this config whose drafter does not apply the scalings."""

    def __post_init__(self):
        check_conditioning(self.conditioning)
        if not self.scales_implemented and self.has_output_scalings:
            raise ValueError(f"{type(self).__name__} does not implement input_embedding_scale / "
                             "output_multiplier / final_logit_softcapping (DFlash drafters do): use a "
                             "drafter without them")
        if not self.input_embedding_scale > 0 or not self.output_multiplier > 0:
            raise ValueError(f"input_embedding_scale and output_multiplier must be positive, got "
                             f"{self.input_embedding_scale} and {self.output_multiplier}")
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping >= 0:
            raise ValueError(f"final_logit_softcapping must be positive (or null / 0: none), got "
                             f"{self.final_logit_softcapping}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("a drafter needs at least one target layer id")
        for name in ("num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"drafter {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"drafter head_dim must be even for rotary embeddings, got {self.head_dim}")
        self._check_layout()

    def _check_layout(self) -> None:
        """``layer_types`` / ``sliding_window`` (class docstring); an all-full ``layer_types``
        is stored as None, so equal drafters compare equal."""
        types = self.layer_types
        if types is not None:
            types = tuple(types)
            if len(types) != self.num_layers or set(types) - set(DRAFTER_LAYER_TYPES):
                raise ValueError(
                    f"layer_types must give one of {', '.join(map(repr, DRAFTER_LAYER_TYPES))} for "
                    f"each of the {self.num_layers} layers, got {list(types)}")
            if "sliding_attention" not in types:
                types = None
        window = self.sliding_window
        if types is None:
            window = None
        elif isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"sliding_attention layers need sliding_window >= 1 (positions a "
                             f"query sees, itself included), got {window!r}")
        elif self.conditioning != "kv":
            raise ValueError(f"sliding_attention layers are implemented for conditioning 'kv' (the "
                             f"released drafters), not {self.conditioning!r}")
        object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "sliding_window", window)

    @property
    def has_output_scalings(self) -> bool:
        return (self.input_embedding_scale != 1.0 or self.output_multiplier != 1.0
                or bool(self.final_logit_softcapping))

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def layer_windows(self) -> tuple[int, ...] | None:
        """Per layer, its sliding window (0 for a full-attention layer); None when no layer
        slides."""
        if self.layer_types is None:
            return None
        return tuple(self.sliding_window if t == "sliding_attention" else 0 for t in self.layer_types)

    @classmethod
    def for_target(cls, target: TargetConfig, num_layers: int, block_size: int, mask_token_id: int,
                   target_layer_ids: tuple[int, ...] | None = None,
                   intermediate_size: int | None = None,
                   conditioning: str = "kv") -> "DrafterConfig":
        """A drafter shaped like ``target``: its heads, KV heads and head_dim (the released
        recipe for dense targets; ``dataclasses.replace`` the result for others), full attention
        in every layer (``conditioning``: see the class)."""
        ids = tuple(target_layer_ids) if target_layer_ids else default_target_layer_ids(
            target.num_layers, num_layers)
        return cls(num_layers=num_layers, hidden_size=target.hidden_size,
                   intermediate_size=intermediate_size or target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
                   head_dim=target.head_dim, vocab_size=target.vocab_size, block_size=block_size,
                   num_target_layers=target.num_layers, target_layer_ids=ids,
                   mask_token_id=mask_token_id, rms_norm_eps=target.rms_norm_eps, rope=target.rope,
                   max_position_embeddings=target.max_position_embeddings,
                   conditioning=conditioning)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DrafterConfig":
        """Reads the released layout: a Qwen3 config plus ``block_size``, ``num_target_layers``
        and ``dflash_config: {target_layer_ids, mask_token_id}``.

        ``block_size`` and ``num_target_layers`` may also sit in ``dflash_config`` (SGLang reads
        both places; they must agree). The attention shapes are the file's own; the attention
        layout (``layer_types``, ``use_sliding_window``, ``sliding_window``,
        ``max_window_layers``) is read as transformers 5 reads it
        (:func:`drafter_attention_layout`). Refused with a ValueError naming the field: anything
        the drafter here does not implement (causal full or biased attention, non-causal sliding
        layers, DSpark's ``use_swa``, attention sinks, its own embedding or LM head, other
        projectors, Domino's shifted labels; see ``_DRAFTER_VARIANTS``), and a
        config without a RoPE theta (transformers would use 10000, vLLM's and tpu-inference's
        DFlash drafters 1e6). ``dflash_config.conditioning`` (this project's ablations, see the
        class) is ``"kv"`` when absent; another value than ``"kv"``, ``"input"``, ``"none"`` is
        a ValueError.
        """
        archs = [str(a) for a in (d.get("architectures") or [])]
        others = [m.label for m in methods.registered() if m.name != "dflash"
                  and any(a in m.architectures for a in archs)]
        if others:
            article = "an" if others[0][:1].upper() in "AEIOU" else "a"
            raise ValueError(f"this is {article} {others[0]} drafter config (architectures {archs}), not a "
                             "DFlash one: load it with load_drafter, which picks the drafting "
                             "method by architectures")
        fields = decoder_fields_from_hf(d, "drafter config.json")
        refuse(_unsupported_drafter_features(d), "drafter config.json")
        if not has_rope_theta(d):
            raise ValueError("drafter config.json states no rope_theta: readers disagree on the "
                             "default (transformers 10000, vLLM and tpu-inference 1e6); write the "
                             "target's rope_theta into it")
        dflash = dict(d.get("dflash_config") or {})
        for key in ("num_target_layers", "block_size"):
            if key in dflash and key in d and int(dflash[key]) != int(d[key]):
                raise ValueError(f"drafter config.json gives contradictory {key} values "
                                 f"({key}={d[key]}, dflash_config.{key}={dflash[key]})")
        top = {**{k: dflash[k] for k in ("num_target_layers", "block_size") if k in dflash}, **d}
        if "num_target_layers" not in top:
            raise ValueError("drafter config.json has no num_target_layers: is this a DFlash drafter?")
        N = int(top["num_target_layers"])
        if "mask_token_id" not in dflash:
            raise ValueError("drafter config.json has no dflash_config.mask_token_id; set it to the "
                             "target's mask token (Qwen3: 151669, Llama-3.1: 128002)")
        ids = dflash.get("target_layer_ids")
        ids = tuple(int(i) for i in ids) if ids else default_target_layer_ids(N, fields["num_layers"])
        aux = d.get("eagle_aux_hidden_state_layer_ids")
        if aux and [int(i) for i in aux] != [i + 1 for i in ids]:
            raise ValueError(
                f"drafter config.json has eagle_aux_hidden_state_layer_ids={list(aux)}, which vLLM "
                f"reads before dflash_config.target_layer_ids={list(ids)} and which must be those "
                f"ids plus one ({[i + 1 for i in ids]}); fix it or remove it")
        layer_types, window, _ = drafter_attention_layout(d)
        scalings = {}
        for key in cls.OUTPUT_FIELDS:  # the reference's reading: dflash_config first, then the top level
            value = dflash.get(key, d.get(key))
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"drafter config.json {key}={json.dumps(value)}: must be a number")
            if value is not None:
                scalings[key] = float(value)
        if not scalings.get("final_logit_softcapping", 1.0):
            scalings["final_logit_softcapping"] = None
        return cls(**fields, block_size=int(top.get("block_size", 16)), num_target_layers=N,
                   target_layer_ids=ids, mask_token_id=int(dflash["mask_token_id"]),
                   conditioning=conditioning_from_hf(d), layer_types=layer_types,
                   sliding_window=window, **scalings)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "DrafterConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        """The released DFlash ``config.json``, read the same by transformers 4.x / 5.x (through
        ``Qwen3Config``), the reference's ``DFlashDraftModel``, vLLM, SGLang and tpu-inference.

        Fields: ``architectures: ["DFlashDraftModel"]`` (the class name vLLM and SGLang
        dispatch on), ``model_type: "qwen3"``, the decoder shapes and RoPE as in
        :meth:`TargetConfig.to_hf_dict`, ``attention_bias: false``, Qwen3's attention layout:
        without sliding layers full attention (``use_sliding_window: false``,
        ``sliding_window: null``, ``layer_types`` all ``"full_attention"``: vLLM and SGLang then
        build non-causal full attention), with them SpecForge's layout (``use_sliding_window:
        true``, ``sliding_window``, ``layer_types``, and ``max_window_layers`` = the number of
        leading full layers when the sliding ones are the last ones, which transformers 4.x
        versions without ``layer_types`` read, else ``num_hidden_layers`` as SpecForge writes),
        ``tie_word_embeddings: false`` (no embedding or head of its own), top-level
        ``block_size`` (tpu-inference defaults to 8 without it) and ``num_target_layers``, and
        ``dflash_config: {"target_layer_ids", "mask_token_id"}`` (tpu-inference defaults the
        mask id to 0 without it). No ``auto_map``: the modelling code is not shipped, see
        README "Config compatibility".

        A drafter whose ``conditioning`` is not ``"kv"`` also has ``dflash_config.conditioning``
        (read by :meth:`from_hf_dict` only: other readers would build the kv drafter); the kv
        layout has no such key.
        """
        dflash_config = {"target_layer_ids": list(self.target_layer_ids),
                         "mask_token_id": self.mask_token_id}
        if self.conditioning != "kv":
            dflash_config["conditioning"] = self.conditioning
        if self.input_embedding_scale != 1.0:
            dflash_config["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash_config["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping:
            dflash_config["final_logit_softcapping"] = self.final_logit_softcapping
        return {
            "architectures": [DFLASH_ARCHITECTURE],
            "model_type": "qwen3",
            **decoder_fields_to_hf(self),
            "attention_bias": False,
            **self._attention_layout_to_hf(),
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": dflash_config,
        }

    def _attention_layout_to_hf(self) -> dict:
        """``use_sliding_window``, ``sliding_window``, ``max_window_layers``, ``layer_types``
        (:meth:`to_hf_dict`)."""
        if self.layer_types is None:
            return qwen3_full_attention_to_hf(self.num_layers)
        types = list(self.layer_types)
        first = types.index("sliding_attention")
        suffix = all(t == "sliding_attention" for t in types[first:])
        return {"use_sliding_window": True, "sliding_window": self.sliding_window,
                "max_window_layers": first if suffix else self.num_layers, "layer_types": types}

    def check_target(self, target: TargetConfig) -> None:
        """Raises ValueError naming every way this drafter disagrees with ``target``: what the
        drafter reads from it must fit (hidden size, vocabulary, the number of target layers,
        the mask token as a row of its embedding, the taps as its layers). The attention shapes
        and MLP width are the drafter's own and need not equal the target's."""
        problems = []
        for mine, theirs, label in (
                (self.hidden_size, target.hidden_size, "hidden_size"),
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
