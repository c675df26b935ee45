"""Static model configurations, built from and written back to Hugging Face ``config.json``.

Configs are frozen, hashable dataclasses so they can be passed to ``jax.jit`` as static
arguments. Field names describe dimensions in the notation of docs/method.md section 1.

Every ``config.json`` this module writes reads the same in transformers 4.x, transformers 5.x
and the DFlash serving engines: RoPE is written both as the hub's top-level ``rope_theta`` +
``rope_scaling`` (what 4.x, vLLM's and tpu-inference's DFlash drafters read; 4.x silently
falls back to theta 10000 without it, tpu-inference to 1e6) and as transformers 5's
``rope_parameters``; the dtype as ``torch_dtype`` (4.x) beside ``dtype`` (5.x); Qwen3 configs
spell out full attention (``use_sliding_window: false``, ``sliding_window: null``,
``layer_types``). The readers accept either generation's layout, refuse a file whose two
spellings disagree (the two transformers generations would build different models from it), and
refuse features this project does not implement (causal drafter attention outside sliding
layers, biases in the drafter, partial or interleaved rotary, ...) with the field named, instead
of silently ignoring them. Drafters may have their own attention shapes and sliding-window layers
(``layer_types`` + ``sliding_window``, SpecForge's layout; ``DrafterConfig``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

from dflash_jax import targets

SUPPORTED_ROPE_TYPES = ("default", "llama3", "yarn")
LLAMA3_ROPE_FIELDS = ("factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings")
YARN_ROPE_FIELDS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                    "truncate", "attention_factor", "mscale", "mscale_all_dim")
"""The YaRN fields transformers reads (``_compute_yarn_parameters``); any other field of a yarn
``rope_parameters`` / ``rope_scaling`` is refused."""
QWEN3_DEFAULT_MAX_WINDOW_LAYERS = 28
"""transformers' ``Qwen3Config`` default: with ``use_sliding_window``, layers from here on slide."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters.

    ``rope_type`` is ``"default"`` (plain RoPE), ``"llama3"`` (Llama 3.1+ frequency scaling,
    which uses ``factor``, ``low_freq_factor``, ``high_freq_factor`` and
    ``original_max_position_embeddings``) or ``"yarn"`` (YaRN, gpt-oss and others: ``factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``truncate`` and the
    cos/sin scale ``attention_factor``, which is None to derive it from ``factor``, ``mscale``
    and ``mscale_all_dim`` as transformers does; :attr:`attention_scaling`).
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    @property
    def attention_scaling(self) -> float:
        """The factor cos and sin are multiplied by (transformers' ``attention_scaling``): 1
        except for YaRN, where it is ``attention_factor`` or, when that is None,
        ``m(factor, mscale) / m(factor, mscale_all_dim)`` (both given) or ``m(factor, 1)``,
        with ``m(s, c) = 0.1 * c * ln(s) + 1`` (1 for s <= 1)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)

        def m(scale: float, c: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * c * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return m(self.factor, self.mscale) / m(self.factor, self.mscale_all_dim)
        return m(self.factor)

    def to_hf(self) -> dict:
        """transformers 5's ``rope_parameters``: ``{"rope_theta", "rope_type"}`` (+ the four
        llama3 fields, or the yarn fields)."""
        out: dict[str, Any] = {"rope_theta": self.theta, "rope_type": self.rope_type}
        out.update(self._scaling_fields())
        return out

    def to_hf_scaling(self) -> dict | None:
        """The hub's top-level ``rope_scaling`` (what transformers 4.x reads): None for plain
        RoPE, else the Llama-3.1 layout ``{"rope_type": "llama3", "factor", "low_freq_factor",
        "high_freq_factor", "original_max_position_embeddings"}`` or the YaRN one
        (``{"rope_type": "yarn", "factor", "original_max_position_embeddings", "beta_fast",
        "beta_slow", "truncate"}`` + ``attention_factor`` / ``mscale`` / ``mscale_all_dim``
        when set, as gpt-oss's hub file has it)."""
        if self.rope_type == "default":
            return None
        return {"rope_type": self.rope_type, **self._scaling_fields()}

    def _scaling_fields(self) -> dict:
        if self.rope_type == "llama3":
            return self._llama3_fields()
        if self.rope_type == "yarn":
            out = dict(factor=self.factor,
                       original_max_position_embeddings=self.original_max_position_embeddings,
                       beta_fast=self.beta_fast, beta_slow=self.beta_slow, truncate=self.truncate)
            out.update({k: getattr(self, k) for k in ("attention_factor", "mscale", "mscale_all_dim")
                        if getattr(self, k) is not None})
            return out
        return {}

    def _llama3_fields(self) -> dict:
        return dict(factor=self.factor, low_freq_factor=self.low_freq_factor,
                    high_freq_factor=self.high_freq_factor,
                    original_max_position_embeddings=self.original_max_position_embeddings)


def decoder_fields_from_hf(d: Mapping[str, Any], what: str) -> dict:
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


def decoder_fields_to_hf(cfg) -> dict:
    """Inverse of :func:`decoder_fields_from_hf`, readable by transformers 4.x and 5.x alike.

    RoPE goes in both layouts: top-level ``rope_theta`` + ``rope_scaling`` (hub, 4.x) and
    ``rope_parameters`` (5.x); the two always carry the same values.
    """
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
        "rope_theta": cfg.rope.theta,
        "rope_scaling": cfg.rope.to_hf_scaling(),
        "rope_parameters": cfg.rope.to_hf(),
        "max_position_embeddings": cfg.max_position_embeddings,
    }


def qwen3_full_attention_to_hf(num_layers: int) -> dict:
    """Qwen3's attention-layout fields, spelled out as full attention in every layer (what the
    hub's Qwen3 files and transformers 5 write; 4.x reads ``use_sliding_window``, 5.x and the
    serving engines ``layer_types``)."""
    return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": num_layers,
            "layer_types": ["full_attention"] * num_layers}


# ---------------------------------------------------------------------------- refusals
def unsupported_decoder_features(d: Mapping[str, Any], qwen3_attention: bool) -> list[str]:
    """Fields of a target or drafter config that ask for something this project does not
    implement, each as ``"field=value: why / what to do"``.

    ``qwen3_attention``: apply Qwen3's sliding-window fields (transformers' Llama ignores them).
    """
    problems = []
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        problems.append(f"hidden_act={act!r}: only the SwiGLU MLP with silu is implemented")
    if d.get("mlp_bias", False):
        problems.append("mlp_bias=true: MLP biases are not implemented (no Qwen3/Llama-3 "
                        "checkpoint uses them)")
    rope_params = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), Mapping) else {}
    for where, value in (("partial_rotary_factor", d.get("partial_rotary_factor")),
                         ("rope_parameters.partial_rotary_factor",
                          rope_params.get("partial_rotary_factor"))):
        if value is not None and float(value) != 1.0:
            problems.append(f"{where}={value}: rotary embedding of part of each head is not "
                            "implemented (only the whole head, as Qwen3 and Llama 3)")
    for key in ("is_neox_style", "rope_is_neox_style"):
        if d.get(key, True) is False:
            problems.append(f"{key}=false: the interleaved (GPT-J) rotary layout is not "
                            "implemented; dflash-jax rotates halves, as transformers' Qwen3/Llama")
    if qwen3_attention:
        problems += _sliding_window_problems(d)
    return problems


def _sliding_window_problems(d: Mapping[str, Any]) -> list[str]:
    """Sliding-window attention that transformers (4.x or 5.x) would apply to a Qwen3 config.

    transformers 4.x slides layer i when ``use_sliding_window`` and ``sliding_window`` is set and
    ``i >= max_window_layers`` (default 28); 5.x reads ``layer_types`` (derived by the same
    rule when absent). Hub Qwen3 files have ``use_sliding_window: false`` (with
    ``sliding_window`` null or a number): full attention everywhere, accepted.
    """
    problems = []
    n = int(d.get("num_hidden_layers") or 0)
    layer_types = d.get("layer_types")
    if layer_types is not None:
        other = sorted({str(t) for t in layer_types if t != "full_attention"})
        if other:
            problems.append(f"layer_types contains {', '.join(map(repr, other))}: only "
                            "'full_attention' layers are implemented (no sliding-window or other "
                            "attention variants)")
        elif len(layer_types) != n:
            problems.append(f"layer_types has {len(layer_types)} entries for {n} layers")
    window = d.get("sliding_window")
    first = d.get("max_window_layers", QWEN3_DEFAULT_MAX_WINDOW_LAYERS)
    if d.get("use_sliding_window", False) and window is not None and int(first) < n:
        problems.append(
            f"use_sliding_window=true with sliding_window={window}: layers {int(first)}..{n - 1} "
            f"would attend to a window of {window} tokens (transformers 4.x), which dflash-jax does "
            "not implement; set use_sliding_window to false if the model was trained with full "
            "attention")
    return problems


def refuse(problems: list[str], what: str) -> None:
    if problems:
        raise ValueError(
            f"{what} asks for what dflash-jax does not implement (refused rather than ignored: "
            "the model would silently compute something else here; change a field only if the "
            "weights were trained without that feature, else use an implementation that has it):"
            "\n  " + "\n  ".join(problems))


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """A decoder-only target LM's static config: the fields every target family has (the dense
    Qwen3 / Llama 3.x family uses exactly these; families with more, MoE or hybrid layers,
    subclass it). Its ``model_type`` names the family (``dflash_jax.targets``), which reads and
    writes it (:meth:`from_hf_dict`, :meth:`to_hf_dict`) and sizes it (:meth:`num_params`).

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
        family = targets.family(self.model_type)  # an unknown type lists the supported ones
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
        if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope type {self.rope.rope_type!r}; supported: "
                + ", ".join(map(repr, SUPPORTED_ROPE_TYPES)))
        family.check_config(self)

    @property
    def qk_norm(self) -> bool:
        """Whether the family applies a per-head RMSNorm to q and k before RoPE (Qwen3 does,
        Llama does not)."""
        return bool(getattr(targets.family_of(self), "qk_norm", False))

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    # ------------------------------------------------------------------ Hugging Face I/O
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "TargetConfig":
        """The config of a Hugging Face ``config.json``, read by the family registered for its
        ``model_type`` (an unknown type is a ValueError listing the supported ones)."""
        return targets.family_for_hf(d).config_from_hf(d)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "TargetConfig":
        return cls.from_hf_dict(read_config_json(path))

    def to_hf_dict(self) -> dict:
        """A ``config.json`` dictionary that transformers 4.x and 5.x load as the same model
        (written by the family)."""
        return targets.family_of(self).config_to_hf(self)

    def num_params(self) -> int:
        """The parameter count (the family's size model)."""
        return targets.family_of(self).num_params(self)


def rope_from_hf(d: Mapping[str, Any]) -> RopeConfig:
    """Reads RoPE settings from either generation's layout.

    Hub files for Qwen3 and Llama-3.x carry ``rope_theta`` at the top level and an optional
    ``rope_scaling`` dict (transformers 4.x reads only these); transformers 5 writes a single
    ``rope_parameters`` dict instead (and 5.x prefers it when both are present). Files written by
    this project carry both. When both spellings are present they must agree, else the two
    transformers generations would build different models from the file: a theta or rope
    type that differs between them is a ValueError naming both values. No theta anywhere means
    transformers' default, 10000.
    """
    params = _flat_rope_parameters(d.get("rope_parameters"))
    has_scaling = "rope_scaling" in d
    scaling = d.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ValueError(f"rope_scaling must be a dict or null, got {scaling!r}")
    scaling = dict(scaling or {})

    thetas = {}  # where -> value, for every place a theta is written
    for where, src in (("rope_theta", d), ("rope_parameters.rope_theta", params),
                       ("rope_scaling.rope_theta", scaling)):
        if src.get("rope_theta") is not None:
            thetas[where] = float(src["rope_theta"])
    theta = next(iter(thetas.values()), 10000.0)
    if any(not math.isclose(v, theta, rel_tol=1e-9) for v in thetas.values()):
        raise ValueError(
            "config.json gives contradictory RoPE theta values ("
            + ", ".join(f"{k}={v:g}" for k, v in thetas.items())
            + "): transformers 4.x reads the top-level rope_theta, 5.x rope_parameters; "
            "make them equal to the theta the model was trained with")

    def rope_type(src: Mapping[str, Any]) -> str:
        return str(src.get("rope_type", src.get("type", "default")))

    types = {}
    if params:
        types["rope_parameters.rope_type"] = rope_type(params)
    if has_scaling:  # null rope_scaling is an explicit "default" for transformers 4.x
        types["rope_scaling.rope_type" if scaling else "rope_scaling"] = rope_type(scaling)
    if len(set(types.values())) > 1:
        raise ValueError(
            "config.json gives contradictory RoPE types ("
            + ", ".join(f"{k}={v!r}" for k, v in types.items())
            + "): transformers 4.x reads rope_scaling (null = plain RoPE), 5.x rope_parameters; "
            "write the same scaling in both")
    kind = next(iter(types.values()), "default")
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling type {kind!r}; supported: "
            + ", ".join(map(repr, SUPPORTED_ROPE_TYPES)))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "yarn":
        return _yarn_from_hf(d, theta, params, scaling)
    values = {}
    for field in LLAMA3_ROPE_FIELDS:
        found = {where: src[field] for where, src in (("rope_parameters", params),
                                                      ("rope_scaling", scaling)) if field in src}
        if not found:
            raise ValueError(f"llama3 rope scaling is missing field {field!r}")
        if len({float(v) for v in found.values()}) > 1:
            raise ValueError(
                f"config.json gives contradictory llama3 {field} values ("
                + ", ".join(f"{w}.{field}={v}" for w, v in found.items())
                + "): transformers 4.x reads rope_scaling, 5.x rope_parameters; make them equal")
        values[field] = next(iter(found.values()))
    return RopeConfig(theta=theta, rope_type="llama3", factor=float(values["factor"]),
                      low_freq_factor=float(values["low_freq_factor"]),
                      high_freq_factor=float(values["high_freq_factor"]),
                      original_max_position_embeddings=int(values["original_max_position_embeddings"]))


def _yarn_from_hf(d: Mapping[str, Any], theta: float, params: dict, scaling: dict) -> RopeConfig:
    """The YaRN RopeConfig of a config.json whose rope type is ``"yarn"`` (``params``: the flat
    ``rope_parameters``, ``scaling``: ``rope_scaling``; a field in both must agree). Defaults as
    transformers 5 fills them in: ``beta_fast`` 32 and ``beta_slow`` 1 when absent or null,
    ``truncate`` true, ``original_max_position_embeddings`` the top-level one or else
    ``max_position_embeddings``, a null ``factor`` ``max_position_embeddings /
    original_max_position_embeddings``. Fields transformers' YaRN does not read are refused."""
    known = set(YARN_ROPE_FIELDS) | {"rope_type", "type", "rope_theta"}
    for where, src in (("rope_parameters", params), ("rope_scaling", scaling)):
        unknown = sorted(k for k in src if k not in known)
        if unknown:
            raise ValueError(
                f"yarn {where} has fields dflash-jax does not implement: {', '.join(unknown)} "
                f"(known: {', '.join(YARN_ROPE_FIELDS)})")
    values: dict[str, Any] = {}
    for field in YARN_ROPE_FIELDS:
        found = {where: src[field] for where, src in (("rope_parameters", params),
                                                      ("rope_scaling", scaling)) if field in src}
        if len({json.dumps(v) for v in found.values()}) > 1 and len(
                {None if v is None else float(v) for v in found.values()}) > 1:
            raise ValueError(
                f"config.json gives contradictory yarn {field} values ("
                + ", ".join(f"{w}.{field}={v}" for w, v in found.items())
                + "): transformers 4.x reads rope_scaling, 5.x rope_parameters; make them equal")
        values[field] = next(iter(found.values()), None)
    top_original = d.get("original_max_position_embeddings")
    original = values["original_max_position_embeddings"]
    if top_original is not None and original is not None and int(top_original) != int(original):
        raise ValueError(
            f"config.json gives contradictory original_max_position_embeddings values (top level "
            f"{top_original}, yarn {original}): transformers takes the top-level one; make them equal")
    if original is None:
        original = top_original if top_original is not None else d.get("max_position_embeddings")
    if original is None:
        raise ValueError("yarn rope scaling needs original_max_position_embeddings (or "
                         "max_position_embeddings)")
    factor = values["factor"]
    if factor is None:
        if d.get("max_position_embeddings") is None:
            raise ValueError("yarn rope scaling needs a factor (or max_position_embeddings)")
        factor = int(d["max_position_embeddings"]) / int(original)
    truncate = values["truncate"]
    if truncate is not None and not isinstance(truncate, bool):
        raise ValueError(f"yarn truncate must be true or false, got {truncate!r}")
    optional = {k: None if values[k] is None else float(values[k])
                for k in ("attention_factor", "mscale", "mscale_all_dim")}
    return RopeConfig(theta=theta, rope_type="yarn", factor=float(factor),
                      original_max_position_embeddings=int(original),
                      beta_fast=float(values["beta_fast"] or 32.0),
                      beta_slow=float(values["beta_slow"] or 1.0),
                      truncate=True if truncate is None else truncate, **optional)


def _flat_rope_parameters(params) -> dict:
    """``rope_parameters`` as one flat dict. transformers 5 may nest it per layer type
    (``{"full_attention": {...}, "sliding_attention": {...}}``); only full attention is
    implemented here, so a nested dict may hold that one entry."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    if params and all(isinstance(v, Mapping) for v in params.values()):
        if set(params) != {"full_attention"}:
            raise ValueError(
                f"rope_parameters is given per layer type ({', '.join(sorted(params))}): only "
                "'full_attention' layers are implemented")
        return dict(params["full_attention"])
    return dict(params)


def has_rope_theta(d: Mapping[str, Any]) -> bool:
    """Whether a config states its RoPE theta (in either layout)."""
    params = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), Mapping) else {}
    scaling = d.get("rope_scaling") if isinstance(d.get("rope_scaling"), Mapping) else {}
    return any(src.get("rope_theta") is not None for src in (d, params, scaling)) or any(
        isinstance(v, Mapping) and v.get("rope_theta") is not None for v in params.values())


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
    """docs/method.md section 2: n taps spread evenly from layer 1 to layer N-3 (``[N // 2]`` for n = 1).

    For a 36-layer target and 5 drafter layers: (1, 9, 17, 25, 33).
    """
    N, n = num_target_layers, num_draft_layers
    if n == 1:
        return (N // 2,)
    if N < 4:
        raise ValueError(f"the default tap formula needs a target with >= 4 layers, got {N}; "
                         "pass target_layer_ids explicitly")
    return tuple(int(round(1 + j * (N - 4) / (n - 1))) for j in range(n))
