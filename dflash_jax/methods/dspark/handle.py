"""The DSpark drafter handle (:class:`DSparkDrafter`) and its checkpoint I/O in SpecForge's
layout; ``load_drafter`` / ``save_drafter`` reach these through the method registry."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.handle import OneDeviceDrafter
from dflash_jax.methods.dspark.checkpoint import load_dspark_params, save_dspark_params
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.model import init_dspark_params


@dataclasses.dataclass
class DSparkDrafter(OneDeviceDrafter):
    """A DSpark drafter: config and parameters (``OneDeviceDrafter``): one device, the target's
    embedding and LM head."""

    method_name = "dspark"  # its drafting method (dflash_jax.methods)
    label = "DSpark"

    config: DSparkConfig

    @classmethod
    def random(cls, target, num_layers: int = 1, block_size: int = 7, mask_token_id: int | None = None,
               target_layer_ids=None, seed: int = 0, dtype=None, init_scale: float = 0.02,
               **dspark) -> "DSparkDrafter":
        """A random-weight DSpark drafter shaped for ``target`` (``dspark``: the fields of
        :data:`~dflash_jax.methods.dspark.config.DSPARK_FIELDS`, else their defaults, the Markov
        rank at most the vocabulary's size)."""
        mask = target.config.vocab_size - 1 if mask_token_id is None else mask_token_id
        dspark = {"markov_rank": min(256, target.config.vocab_size), **dspark}
        cfg = DSparkConfig.for_target(target.config, num_layers, block_size, mask, target_layer_ids, **dspark)
        check(cfg, target)
        return cls(cfg, init_dspark_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale))


def from_dflash(drafter, block_size: int | None = None, seed: int = 0, **dspark) -> DSparkDrafter:
    """A DSpark drafter on the DFlash ``drafter``'s backbone, to fine-tune from its weights: the
    Markov head adds nothing at first (``markov_w2`` zero; ``markov_w1`` random, so ``w2``
    learns), the confidence head predicts 1/2 everywhere (zero), ``block_size`` the DFlash
    drafter's minus one (the same verify width). Its drafts are not DFlash's: a DSpark row
    drafts the token after its position, a DFlash row the token at it, so fine-tuning starts one
    row off (``docs/dspark.md``)."""
    base = drafter.config
    base = dataclasses.replace(base, block_size=block_size or max(base.block_size - 1, 1))
    cfg = DSparkConfig.from_backbone(base, **{"markov_rank": min(256, base.vocab_size), **dspark})
    fresh = init_dspark_params(cfg, jax.random.key(seed), drafter.dtype)
    heads = {"markov_head": {**fresh["markov_head"],
                             "markov_w2": jax.tree.map(jnp.zeros_like, fresh["markov_head"]["markov_w2"])}}
    if cfg.enable_confidence_head:
        heads["confidence_head"] = jax.tree.map(jnp.zeros_like, fresh["confidence_head"])
    return DSparkDrafter(cfg, {**drafter.params, **heads})


def check(cfg: DSparkConfig, target) -> None:
    """Refuses a drafter that does not fit ``target`` or a target on a mesh."""
    DSparkDrafter.check(cfg, target)


def load(path: str, target, dtype=None) -> DSparkDrafter:
    """The DSpark drafter in the directory ``path``, checked against ``target``."""
    cfg = DSparkConfig.from_pretrained(path)
    check(cfg, target)
    return DSparkDrafter(cfg, load_dspark_params(path, cfg, dtype=dtype or target.dtype), os.fspath(path))


def save(drafter: DSparkDrafter, path: str | os.PathLike) -> None:
    save_dspark_params(path, drafter.config, drafter.params)
