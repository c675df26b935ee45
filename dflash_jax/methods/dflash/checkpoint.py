"""DFlash's checkpoint layout (``docs/method.md`` section 3): the released drafter's tensor names
both ways (``model.safetensors`` + ``config.json``), on the readers and writers of
``dflash_jax.checkpoints``."""

from __future__ import annotations

import os

from dflash_jax.checkpoints import (TensorSpec, _dtype_fields, layer_tensor_specs, params_to_tensors,
                                    read_sharded_params, read_tensors, tensors_to_params,
                                    write_safetensors)
from dflash_jax.config import read_config_json
from dflash_jax.files import write_json
from dflash_jax.methods.dflash.config import conditioning_from_hf


def drafter_tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Tensors of a released DFlash drafter (docs/method.md section 3): no embedding, no LM head; a
    drafter with conditioning "none" has no ``fc`` and ``hidden_norm`` either."""
    D = cfg.hidden_size
    specs = {}
    if getattr(cfg, "conditioning", "kv") != "none":
        specs["fc.weight"] = TensorSpec(("fc", "kernel"), None, True, (D, cfg.num_taps * D))
        specs["hidden_norm.weight"] = TensorSpec(("hidden_norm", "weight"), None, False, (D,))
    specs.update(layer_tensor_specs("", cfg.num_layers, D, cfg.num_heads, cfg.num_kv_heads,
                                    cfg.head_dim, cfg.intermediate_size, qk_norm=True,
                                    attention_bias=False))
    specs["norm.weight"] = TensorSpec(("norm", "weight"), None, False, (D,))
    return specs


def load_drafter_params(path: str | os.PathLike, cfg, dtype=None, sharding_of=None) -> dict:
    """Reads a drafter directory's safetensors into a parameter tree (validated against cfg).

    Embedding / LM-head copies that some exports include are ignored: the drafter always uses
    the target's.

    Raises:
      ValueError: the directory's config.json records another conditioning than
        ``cfg.conditioning`` (kv and input drafters have the same tensors, so only the config
        tells them apart), or an unknown one.
    """
    check_drafter_conditioning(path, cfg)
    ignore = ("embed_tokens.weight", "lm_head.weight", "model.embed_tokens.weight")
    what = f"drafter checkpoint {os.fspath(path)!r}"
    if sharding_of is not None:
        return read_sharded_params(path, drafter_tensor_specs(cfg), sharding_of, dtype, ignore, what)
    return tensors_to_params(read_tensors(path), drafter_tensor_specs(cfg), dtype=dtype,
                             ignore=ignore, what=what)


def check_drafter_conditioning(path: str | os.PathLike, cfg) -> None:
    """Refuses to load the drafter directory ``path`` into ``cfg`` when its config.json records
    another ``dflash_config.conditioning`` (absent: "kv"); a directory without config.json is
    not checked."""
    path = os.fspath(path)
    if not os.path.exists(os.path.join(path, "config.json")):
        return
    saved = conditioning_from_hf(read_config_json(path))
    wanted = getattr(cfg, "conditioning", "kv")
    if saved != wanted:
        raise ValueError(
            f"the checkpoint at {path} was trained with conditioning {saved!r}; this config asks "
            f"for {wanted!r} (a drafter's weights only compute what they were trained for): load "
            f"it with its own config (DrafterConfig.from_pretrained) or use conditioning={saved!r}")


def save_drafter_params(path: str | os.PathLike, cfg, params) -> None:
    """Saves config.json (:meth:`DrafterConfig.to_hf_dict` + dtype) and model.safetensors in
    the released DFlash layout."""
    tensors = params_to_tensors(params, drafter_tensor_specs(cfg))
    write_safetensors(path, tensors)
    config = {**cfg.to_hf_dict(), **_dtype_fields(tensors.values())}
    write_json(os.path.join(os.fspath(path), "config.json"), config)
