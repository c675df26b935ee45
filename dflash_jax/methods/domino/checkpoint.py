"""Domino's checkpoint layout: DFlash's tensors plus SpecForge's names of the GRU and the
correction (``[out, in]`` for linear maps):

    prefix_gru.weight_ih_l0   [3H, D]      (the r, z, n parts)
    prefix_gru.weight_hh_l0   [3H, H]
    embed_proj.0.weight       [E, D + H]
    embed_proj.2.weight       [V, E]

Early SpecForge checkpoints keep them under ``logit_head.``; both are read, the current names
written."""

from __future__ import annotations

import os

from dflash_jax.checkpoints import (TensorSpec, _dtype_fields, params_to_tensors, read_tensors, tensors_to_params,
                                    write_safetensors)
from dflash_jax.files import write_json
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs

LEGACY_PREFIX = "logit_head."


def domino_tensor_specs(cfg) -> dict[str, TensorSpec]:
    D, H, E, V = cfg.hidden_size, cfg.gru_hidden_dim, cfg.emb_dim, cfg.vocab_size
    specs = drafter_tensor_specs(cfg)
    specs["prefix_gru.weight_ih_l0"] = TensorSpec(("gru_w_ih",), None, True, (3 * H, D))
    specs["prefix_gru.weight_hh_l0"] = TensorSpec(("gru_w_hh",), None, True, (3 * H, H))
    specs["embed_proj.0.weight"] = TensorSpec(("embed_proj_in", "kernel"), None, True, (E, D + H))
    specs["embed_proj.2.weight"] = TensorSpec(("embed_proj_out", "kernel"), None, True, (V, E))
    return specs


def load_domino_params(path: str | os.PathLike, cfg, dtype=None) -> dict:
    tensors = read_tensors(path)
    for name in [n for n in tensors if n.startswith(LEGACY_PREFIX)]:
        current = name[len(LEGACY_PREFIX):]
        if current.startswith(("prefix_gru.", "embed_proj.")) and current not in tensors:
            tensors[current] = tensors.pop(name)
    return tensors_to_params(tensors, domino_tensor_specs(cfg), dtype=dtype,
                             ignore=("embed_tokens.weight", "lm_head.weight", "model.embed_tokens.weight"),
                             what=f"Domino drafter checkpoint {os.fspath(path)!r}")


def save_domino_params(path: str | os.PathLike, cfg, params) -> None:
    tensors = params_to_tensors(params, domino_tensor_specs(cfg))
    write_safetensors(path, tensors)
    write_json(os.path.join(os.fspath(path), "config.json"), {**cfg.to_hf_dict(), **_dtype_fields(tensors.values())})
