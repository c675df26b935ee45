"""DSpark's checkpoint layout: DFlash's tensors (``methods/dflash/checkpoint.py``) plus the heads,
named as SpecForge names them (``[out, in]`` for linear maps):

    markov_head.markov_w1.weight        [V, r]        (an embedding)
    markov_head.markov_w2.weight        [V, r]
    markov_head.gate_proj.weight, .bias     [r, D + r], [r]       (gated)
    markov_head.joint_proj.weight, .bias    [3r, 2r + D], [3r]    (rnn)
    confidence_head.proj.weight, .bias      [1, D (+ r)], [1]     (with the confidence head)

Early SpecForge checkpoints keep the heads under ``logit_head.`` (``logit_head.markov_head.``,
``logit_head.confidence_head.``); both are read, the current names written."""

from __future__ import annotations

import os

from dflash_jax.checkpoints import (TensorSpec, _dtype_fields, params_to_tensors, read_tensors, tensors_to_params,
                                    write_safetensors)
from dflash_jax.files import write_json
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs

LEGACY_PREFIX = "logit_head."


def dspark_tensor_specs(cfg) -> dict[str, TensorSpec]:
    """Every tensor of a DSpark drafter (``DSparkConfig``)."""
    D, V, r = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank
    specs = drafter_tensor_specs(cfg)
    specs["markov_head.markov_w1.weight"] = TensorSpec(("markov_head", "markov_w1"), None, False, (V, r))
    specs["markov_head.markov_w2.weight"] = TensorSpec(("markov_head", "markov_w2", "kernel"), None, True, (V, r))
    own = {"gated": ("gate_proj", r, D + r), "rnn": ("joint_proj", 3 * r, 2 * r + D)}.get(cfg.markov_head_type)
    if own:
        name, out, inp = own
        specs[f"markov_head.{name}.weight"] = TensorSpec(("markov_head", name, "kernel"), None, True, (out, inp))
        specs[f"markov_head.{name}.bias"] = TensorSpec(("markov_head", name, "bias"), None, False, (out,))
    if cfg.enable_confidence_head:
        specs["confidence_head.proj.weight"] = TensorSpec(("confidence_head", "kernel"), None, True,
                                                          (1, cfg.confidence_width))
        specs["confidence_head.proj.bias"] = TensorSpec(("confidence_head", "bias"), None, False, (1,))
    return specs


def load_dspark_params(path: str | os.PathLike, cfg, dtype=None) -> dict:
    """A DSpark directory's safetensors as a parameter tree, validated against ``cfg``
    (embedding / LM-head copies ignored, as for DFlash; the legacy ``logit_head.`` names read)."""
    tensors = read_tensors(path)
    for name in [n for n in tensors if n.startswith(LEGACY_PREFIX)]:
        current = name[len(LEGACY_PREFIX):]
        if current.startswith(("markov_head.", "confidence_head.")) and current not in tensors:
            tensors[current] = tensors.pop(name)
    return tensors_to_params(tensors, dspark_tensor_specs(cfg), dtype=dtype,
                             ignore=("embed_tokens.weight", "lm_head.weight", "model.embed_tokens.weight"),
                             what=f"DSpark drafter checkpoint {os.fspath(path)!r}")


def save_dspark_params(path: str | os.PathLike, cfg, params) -> None:
    """config.json (``DSparkConfig.to_hf_dict`` + dtype) and model.safetensors, SpecForge's layout."""
    tensors = params_to_tensors(params, dspark_tensor_specs(cfg))
    write_safetensors(path, tensors)
    write_json(os.path.join(os.fspath(path), "config.json"), {**cfg.to_hf_dict(), **_dtype_fields(tensors.values())})
