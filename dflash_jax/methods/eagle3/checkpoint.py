"""EAGLE-3 drafter directories (``docs/eagle3.md``) <-> (parameter tree, ``d2t``).

The released layout, as SpecForge's ``LlamaForCausalLMEagle3`` saves it: ``config.json``
(:meth:`~dflash_jax.methods.eagle3.config.Eagle3Config.to_hf_dict`) and ``model.safetensors`` (or a sharded
index) holding, with D = hidden_size, Dt = target_hidden_size, H / Hkv / Dh the heads, F the
MLP width, V = vocab_size and Vd = draft_vocab_size (Linear weights ``[out, in]``):

  fc.weight                                        [D, 3*Dt]
  midlayer.hidden_norm.weight                      [D]
  midlayer.input_layernorm.weight                  [D]
  midlayer.post_attention_layernorm.weight         [D]
  midlayer.self_attn.{q,k,v}_proj.weight           [H*Dh, 2D] / [Hkv*Dh, 2D] / [Hkv*Dh, 2D]
  midlayer.self_attn.o_proj.weight                 [D, H*Dh]
  midlayer.mlp.{gate,up}_proj.weight               [F, D];  midlayer.mlp.down_proj.weight [D, F]
  norm.weight                                      [D]
  lm_head.weight                                   [Vd, D]
  d2t                                              int64[Vd]  target id = draft id + d2t[draft id]
  t2d                                              bool[V]    True at the draft vocabulary's ids

Reading: ``embed_tokens.weight`` (SpecForge saves its frozen copy of the target's embedding) is
ignored: the drafter embeds with the target's. ``t2d`` is optional (SGLang and vLLM read only
``d2t``); when present it must mark exactly the ids ``d2t`` maps to. A checkpoint without
``d2t`` is read as the identity map when its draft vocabulary is the whole vocabulary
(``draft_vocab_size == vocab_size``) and refused otherwise. Every problem is one
:class:`~dflash_jax.checkpoints.CheckpointError` (a ``ValueError``) that names it and the fix.
"""

from __future__ import annotations

import os

import numpy as np

from dflash_jax.checkpoints import (
    CheckpointError,
    TensorSpec,
    _dtype_fields,
    check_tensor_set,
    params_to_tensors,
    read_tensors,
    tensors_to_params,
    write_safetensors,
)
from dflash_jax.config import read_config_json
from dflash_jax.methods.eagle3.config import EAGLE3_ARCHITECTURE, Eagle3Config
from dflash_jax.files import write_json

D2T, T2D = "d2t", "t2d"
IGNORED = ("embed_tokens.weight",)  # SpecForge's copy of the target's embedding


def eagle3_tensor_specs(cfg: Eagle3Config) -> dict[str, TensorSpec]:
    """The weight tensors of an EAGLE-3 checkpoint (module docstring; not ``d2t`` / ``t2d``),
    mapped into the :class:`~dflash_jax.methods.eagle3.model.Eagle3Model` parameter tree."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    rows = [
        ("fc.weight", ("fc", "kernel"), True, (D, cfg.feature_size)),
        ("midlayer.hidden_norm.weight", ("midlayer", "hidden_norm", "weight"), False, (D,)),
        ("midlayer.input_layernorm.weight", ("midlayer", "input_layernorm", "weight"), False, (D,)),
        ("midlayer.post_attention_layernorm.weight",
         ("midlayer", "post_attention_layernorm", "weight"), False, (D,)),
        ("midlayer.self_attn.q_proj.weight", ("midlayer", "self_attn", "q_proj", "kernel"), True, (q, 2 * D)),
        ("midlayer.self_attn.k_proj.weight", ("midlayer", "self_attn", "k_proj", "kernel"), True, (kv, 2 * D)),
        ("midlayer.self_attn.v_proj.weight", ("midlayer", "self_attn", "v_proj", "kernel"), True, (kv, 2 * D)),
        ("midlayer.self_attn.o_proj.weight", ("midlayer", "self_attn", "o_proj", "kernel"), True, (D, q)),
        ("midlayer.mlp.gate_proj.weight", ("midlayer", "mlp", "gate_proj", "kernel"), True, (F, D)),
        ("midlayer.mlp.up_proj.weight", ("midlayer", "mlp", "up_proj", "kernel"), True, (F, D)),
        ("midlayer.mlp.down_proj.weight", ("midlayer", "mlp", "down_proj", "kernel"), True, (D, F)),
        ("norm.weight", ("norm", "weight"), False, (D,)),
        ("lm_head.weight", ("lm_head", "kernel"), True, (cfg.draft_vocab_size, D)),
    ]
    return {name: TensorSpec(path, None, transpose, shape) for name, path, transpose, shape in rows}


def _first(ids, n: int = 8) -> str:
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids[:n])) + (", ..." if len(ids) > n else "")


def check_d2t(d2t, cfg: Eagle3Config, what: str = "d2t") -> np.ndarray:
    """``d2t`` as int32[Vd] after checking that it is an integer vector of ``draft_vocab_size``
    offsets mapping the draft ids to distinct target ids in ``[0, vocab_size)``.

    Raises:
      CheckpointError naming the first offending draft ids.
    """
    d2t = np.asarray(d2t)
    Vd, V = cfg.draft_vocab_size, cfg.vocab_size
    if d2t.shape != (Vd,) or not (np.issubdtype(d2t.dtype, np.integer) and d2t.dtype != bool):
        raise CheckpointError(f"{what} must be an integer vector of draft_vocab_size = {Vd} "
                              f"offsets, got {d2t.dtype} {list(d2t.shape)}: the draft vocabulary "
                              "map does not belong to this config")
    ids = np.arange(Vd, dtype=np.int64) + d2t.astype(np.int64)
    outside = np.flatnonzero((ids < 0) | (ids >= V))
    if outside.size:
        raise CheckpointError(
            f"{what} maps {outside.size} draft ids outside the target vocabulary [0, {V}) (draft "
            f"ids {_first(outside)} -> target ids {_first(ids[outside])}); d2t holds offsets "
            "(target id = draft id + d2t[draft id]): export the map again from the draft "
            "vocabulary's target ids")
    order = np.argsort(ids, kind="stable")
    dup = order[1:][ids[order][1:] == ids[order][:-1]]
    if dup.size:
        raise CheckpointError(
            f"{what} is not one-to-one: {dup.size} draft ids map to a target id an earlier draft "
            f"id already has (draft ids {_first(np.sort(dup))} -> target ids "
            f"{_first(ids[np.sort(dup)])}); export the map again from distinct target ids")
    return d2t.astype(np.int32)


def t2d_of_d2t(d2t, vocab_size: int) -> np.ndarray:
    """bool[V]: True at the target ids of the draft vocabulary ``d2t`` int[Vd] maps to."""
    t2d = np.zeros(int(vocab_size), bool)
    t2d[np.arange(np.asarray(d2t).size) + np.asarray(d2t, np.int64)] = True
    return t2d


def _check_t2d(t2d, d2t: np.ndarray, cfg: Eagle3Config, what: str) -> None:
    t2d = np.asarray(t2d)
    V = cfg.vocab_size
    if t2d.shape != (V,) or not (t2d.dtype == bool or (np.issubdtype(t2d.dtype, np.integer)
                                                       and np.isin(t2d, (0, 1)).all())):
        raise CheckpointError(f"{what}: t2d must be a bool vector of vocab_size = {V} entries, "
                              f"got {t2d.dtype} {list(t2d.shape)}: delete it (d2t alone defines "
                              "the draft vocabulary) or export it again")
    wrong = np.flatnonzero(t2d.astype(bool) != t2d_of_d2t(d2t, V))
    if wrong.size:
        raise CheckpointError(
            f"{what}: t2d disagrees with d2t at {wrong.size} target ids (first: {_first(wrong)}): "
            f"t2d marks {int(t2d.astype(bool).sum())} ids, d2t maps to {d2t.size}; the two maps "
            "come from different draft vocabularies: export them again together (or delete t2d, "
            "which is derived from d2t)")


def check_eagle3_dir(path: str | os.PathLike) -> None:
    """Refuses a directory whose config.json is not an EAGLE-3 drafter's (a DFlash drafter or a
    target), pointing at the right loader; a directory without config.json is not checked."""
    path = os.fspath(path)
    if not os.path.exists(os.path.join(path, "config.json")):
        return
    d = read_config_json(path)
    archs = [str(a) for a in (d.get("architectures") or [])]
    if any("eagle3" in a.lower() for a in archs):
        return
    kind = ("a DFlash drafter" if "dflash_config" in d or "block_size" in d else
            "not an EAGLE-3 drafter (a target?): an EAGLE-3 drafter's config.json names "
            f"architectures [{EAGLE3_ARCHITECTURE!r}]")
    raise ValueError(f"{path} has architectures {archs}: {kind}; load_drafter picks the drafting "
                     "method by architectures")


def load_eagle3_params(path: str | os.PathLike, cfg: Eagle3Config, dtype=None):
    """Reads an EAGLE-3 checkpoint directory (module docstring) into ``(params, d2t)``.

    Args:
      path: the directory (``model.safetensors`` or a sharded index with its shards).
      cfg: its config (``Eagle3Config.from_pretrained(path, target)``).
      dtype: cast every weight (None keeps the stored dtype).
    Returns:
      params: the :class:`~dflash_jax.methods.eagle3.model.Eagle3Model` tree (kernels ``[in, out]``);
      d2t: np.int32[Vd], target id = draft id + d2t[draft id].
    Raises:
      CheckpointError listing missing, unexpected and mis-shaped tensors at once, or naming a
      bad ``d2t`` / ``t2d``; ValueError for a directory that is not an EAGLE-3 drafter's.
    """
    check_eagle3_dir(path)
    what = f"EAGLE-3 checkpoint {os.fspath(path)!r}"
    specs = eagle3_tensor_specs(cfg)
    tensors = read_tensors(path)
    check_tensor_set({n: tuple(t.shape) for n, t in tensors.items()}, specs,
                     ignore=IGNORED + (D2T, T2D), what=what)
    if D2T in tensors:
        d2t = check_d2t(tensors[D2T], cfg, f"{what}: d2t")
    elif cfg.draft_vocab_size == cfg.vocab_size:
        d2t = np.zeros(cfg.vocab_size, np.int32)  # the whole vocabulary: the identity map
    else:
        raise CheckpointError(
            f"{what} has no d2t tensor, and its draft vocabulary is a subset (draft_vocab_size "
            f"{cfg.draft_vocab_size} < vocab_size {cfg.vocab_size}): without the map the draft "
            "ids mean nothing; add d2t (int64[draft_vocab_size], target id = draft id + "
            "d2t[draft id]: SpecForge writes it in the vocab-mapping file it trained with)")
    if T2D in tensors:
        _check_t2d(tensors[T2D], d2t, cfg, what)
    weights = {n: t for n, t in tensors.items() if n in specs}
    return tensors_to_params(weights, specs, dtype=dtype, what=what), d2t


def save_eagle3_params(path: str | os.PathLike, cfg: Eagle3Config, params, d2t,
                       max_shard_bytes: int | None = None) -> None:
    """Writes config.json (:meth:`Eagle3Config.to_hf_dict` + the weights' dtype) and
    model.safetensors (sharded + index above ``max_shard_bytes``) in the released layout, with
    ``d2t`` as int64 and ``t2d`` as bool as SpecForge stores them.

    Everything is checked before anything is written (a bad ``d2t`` or a parameter tree of
    other shapes leaves ``path`` as it was), and each file is written under a temporary name and
    renamed (``files.atomic_path``), so an interrupted save never leaves a half-written file.
    """
    d2t = check_d2t(d2t, cfg, "d2t")
    specs = eagle3_tensor_specs(cfg)
    try:
        weights = params_to_tensors(params, specs)
    except (KeyError, TypeError, IndexError) as e:
        raise CheckpointError(f"the parameters being saved are not an EAGLE-3 parameter tree "
                              f"(no {e} where {sorted(specs)} are read from): pass the "
                              "Eagle3Model parameters (Eagle3Drafter.params)") from None
    check_tensor_set({n: t.shape for n, t in weights.items()}, specs,
                     what="EAGLE-3 parameters being saved")
    tensors = {**weights, D2T: d2t.astype(np.int64), T2D: t2d_of_d2t(d2t, cfg.vocab_size)}
    write_safetensors(path, tensors, max_shard_bytes)
    config = {**cfg.to_hf_dict(), **_dtype_fields(weights.values())}
    write_json(os.path.join(os.fspath(path), "config.json"), config)


__all__ = ["eagle3_tensor_specs", "load_eagle3_params", "save_eagle3_params", "check_d2t",
           "t2d_of_d2t", "check_eagle3_dir"]
