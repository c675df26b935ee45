"""DFlash2's checkpoint layout: DFlash's tensors (``methods/dflash/checkpoint.py``) plus, per
layer, the two convolution pairs, and the candidate selector, named as the reference package
(``dflash==0.1.0``) names them:

    layers.{j}.attention_conv.base_kernel               [2, K, D]
    layers.{j}.attention_conv.kernel_projection.weight  [2*K*G, D]
    layers.{j}.mlp_conv.base_kernel, .kernel_projection.weight   (the same)
    candidate_selector.predecessor_codebook              [V, r]
    candidate_selector.successor_codebook                [V, r]
    candidate_selector.hidden_projection.weight          [r, D]

The released checkpoints store the codebooks without a ``.weight`` suffix (the reference maps
them onto its embeddings' ``.weight`` as it loads); both spellings are read, the released one is
written."""

from __future__ import annotations

import os

from dflash_jax.checkpoints import (TensorSpec, _dtype_fields, params_to_tensors, read_tensors, tensors_to_params,
                                    write_safetensors)
from dflash_jax.files import write_json
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs

CODEBOOKS = ("predecessor_codebook", "successor_codebook")


def dflash2_tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Every tensor of a DFlash2 drafter (``DFlash2Config``)."""
    D, K, G, r = cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_groups, cfg.selector_rank
    specs = drafter_tensor_specs(cfg)
    for j in range(cfg.num_layers):
        for conv in ("attention_conv", "mlp_conv"):
            specs[f"layers.{j}.{conv}.base_kernel"] = TensorSpec(("layers", conv, "base_kernel"), j, False, (2, K, D))
            specs[f"layers.{j}.{conv}.kernel_projection.weight"] = TensorSpec(
                ("layers", conv, "kernel_projection", "kernel"), j, True, (2 * K * G, D))
    for book in CODEBOOKS:
        specs[f"candidate_selector.{book}"] = TensorSpec(("candidate_selector", book), None, False,
                                                         (cfg.vocab_size, r))
    specs["candidate_selector.hidden_projection.weight"] = TensorSpec(
        ("candidate_selector", "hidden_projection", "kernel"), None, True, (r, D))
    return specs


def load_dflash2_params(path: str | os.PathLike, cfg, dtype=None) -> dict:
    """A DFlash2 directory's safetensors as a parameter tree, validated against ``cfg``
    (embedding / LM-head copies ignored, as for DFlash)."""
    tensors = read_tensors(path)
    for book in CODEBOOKS:  # the reference's own state-dict spelling
        alias = f"candidate_selector.{book}.weight"
        if alias in tensors and f"candidate_selector.{book}" not in tensors:
            tensors[f"candidate_selector.{book}"] = tensors.pop(alias)
    return tensors_to_params(tensors, dflash2_tensor_specs(cfg), dtype=dtype,
                             ignore=("embed_tokens.weight", "lm_head.weight", "model.embed_tokens.weight"),
                             what=f"DFlash2 drafter checkpoint {os.fspath(path)!r}")


def save_dflash2_params(path: str | os.PathLike, cfg, params) -> None:
    """config.json (``DFlash2Config.to_hf_dict`` + dtype) and model.safetensors, the released layout."""
    tensors = params_to_tensors(params, dflash2_tensor_specs(cfg))
    write_safetensors(path, tensors)
    write_json(os.path.join(os.fspath(path), "config.json"), {**cfg.to_hf_dict(), **_dtype_fields(tensors.values())})
