"""The Domino drafter handle (:class:`DominoDrafter`) and its checkpoint I/O in SpecForge's
layout; ``load_drafter`` / ``save_drafter`` reach these through the method registry."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.handle import OneDeviceDrafter
from dflash_jax.methods.domino.checkpoint import load_domino_params, save_domino_params
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.model import init_domino_params


@dataclasses.dataclass
class DominoDrafter(OneDeviceDrafter):
    """A Domino drafter: config and parameters (``OneDeviceDrafter``)."""

    method_name = "domino"  # its drafting method (dflash_jax.methods)
    label = "Domino"

    config: DominoConfig

    @classmethod
    def random(cls, target, num_layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
               target_layer_ids=None, seed: int = 0, dtype=None, init_scale: float = 0.02,
               **domino) -> "DominoDrafter":
        """A random-weight Domino drafter shaped for ``target`` (``domino``: the fields of
        :data:`~dflash_jax.methods.domino.config.DOMINO_FIELDS`, else their defaults)."""
        mask = target.config.vocab_size - 1 if mask_token_id is None else mask_token_id
        cfg = DominoConfig.for_target(target.config, num_layers, block_size, mask, target_layer_ids, **domino)
        DominoDrafter.check(cfg, target)
        return cls(cfg, init_domino_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale))


def start_fields(hidden_size: int) -> dict:
    """The Domino fields of a drafter started on a DFlash backbone of width ``hidden_size``:
    DFlash's rows (``shift_label`` false), one uncorrected draft, the released widths (GRU 1024,
    bottleneck 256) at most the hidden size."""
    return {"shift_label": False, "pure_draft_prefix_len": 1, "gru_hidden_dim": min(1024, hidden_size),
            "emb_dim": min(256, hidden_size)}


def from_dflash(drafter, seed: int = 0, **domino) -> DominoDrafter:
    """A Domino drafter on the DFlash ``drafter``'s backbone, to fine-tune from its weights, its
    first drafts exactly the backbone's: DFlash's rows (``shift_label`` false) and block size,
    the correction adding nothing (``embed_proj_out`` zero; the GRU and ``embed_proj_in`` random,
    so the correction learns). The other fields (``domino``) default to :func:`start_fields`
    (``docs/domino.md``)."""
    base = drafter.config
    cfg = DominoConfig.from_backbone(base, **{**start_fields(base.hidden_size), **domino})
    fresh = init_domino_params(cfg, jax.random.key(seed), drafter.dtype)
    heads = {name: fresh[name] for name in ("gru_w_ih", "gru_w_hh", "embed_proj_in")}
    heads["embed_proj_out"] = jax.tree.map(jnp.zeros_like, fresh["embed_proj_out"])
    return DominoDrafter(cfg, {**drafter.params, **heads})


def load(path: str, target, dtype=None) -> DominoDrafter:
    cfg = DominoConfig.from_pretrained(path)
    DominoDrafter.check(cfg, target)
    return DominoDrafter(cfg, load_domino_params(path, cfg, dtype=dtype or target.dtype), os.fspath(path))


def save(drafter: DominoDrafter, path: str | os.PathLike) -> None:
    save_domino_params(path, drafter.config, drafter.params)
