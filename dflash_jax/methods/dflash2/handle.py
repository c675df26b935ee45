"""The DFlash2 drafter handle (:class:`DFlash2Drafter`) and its checkpoint I/O in the reference's
layout; ``load_drafter`` / ``save_drafter`` reach these through the method registry."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.handle import OneDeviceDrafter
from dflash_jax.methods.dflash2.checkpoint import load_dflash2_params, save_dflash2_params
from dflash_jax.methods.dflash2.config import DFlash2Config
from dflash_jax.methods.dflash2.model import init_dflash2_params


@dataclasses.dataclass
class DFlash2Drafter(OneDeviceDrafter):
    """A DFlash2 drafter: config and parameters (``OneDeviceDrafter``): one device, the target's
    embedding and LM head."""

    method_name = "dflash2"  # its drafting method (dflash_jax.methods)
    label = "DFlash2"

    config: DFlash2Config

    @classmethod
    def random(cls, target, num_layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
               target_layer_ids=None, seed: int = 0, dtype=None, init_scale: float = 0.02,
               **dflash2) -> "DFlash2Drafter":
        """A random-weight DFlash2 drafter shaped for ``target`` (``dflash2``: the fields of
        :data:`~dflash_jax.methods.dflash2.config.DFLASH2_FIELDS`, else their defaults; the
        default group size is the hidden size's largest divisor up to 64)."""
        mask = target.config.vocab_size - 1 if mask_token_id is None else mask_token_id
        cfg = DFlash2Config.for_target(target.config, num_layers, block_size, mask, target_layer_ids,
                                       **_defaults(dflash2, target.config.hidden_size, target.config.vocab_size))
        check(cfg, target)
        return cls(cfg, init_dflash2_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale))


def _defaults(dflash2: dict, hidden_size: int, vocab_size: int) -> dict:
    """``dflash2`` with the defaults of :meth:`DFlash2Drafter.random` filled in: the group size
    the hidden size's largest divisor up to 64, at most 8 candidates."""
    group = max(g for g in range(1, min(hidden_size, 64) + 1) if hidden_size % g == 0)
    return {"conv_group_size": group, "selector_top_k": min(8, vocab_size), **dflash2}


def from_dflash(drafter, **dflash2) -> DFlash2Drafter:
    """A DFlash2 drafter that drafts exactly what the DFlash ``drafter`` drafts, to train on
    from its weights: the backbone's parameters, each convolution the identity (base kernel 1 at
    offset 0, 0 elsewhere; a zero kernel projection) and a zero selector (zero codebooks: every
    candidate's score is its logit, so the path is the logits' argmax). ``dflash2``: the DFlash2
    fields (:data:`~dflash_jax.methods.dflash2.config.DFLASH2_FIELDS`; defaults as
    :meth:`DFlash2Drafter.random`'s)."""
    base = drafter.config
    D = base.hidden_size
    cfg = DFlash2Config.from_backbone(base, **_defaults(dflash2, D, base.vocab_size))
    shapes = jax.eval_shape(lambda k: init_dflash2_params(cfg, k, drafter.dtype), jax.random.key(0))
    K = cfg.conv_kernel_size
    identity = jnp.zeros((cfg.num_layers, 2, K, D), drafter.dtype).at[:, :, 0, :].set(1)
    convs = {name: {"base_kernel": identity,
                    "kernel_projection": {"kernel": jnp.zeros(shapes["layers"][name]["kernel_projection"]["kernel"].shape,
                                                              drafter.dtype)}}
             for name in ("attention_conv", "mlp_conv")}
    selector = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["candidate_selector"])
    params = {**drafter.params, "layers": {**drafter.params["layers"], **convs}, "candidate_selector": selector}
    return DFlash2Drafter(cfg, params)


def check(cfg: DFlash2Config, target) -> None:
    """Refuses a drafter that does not fit ``target`` or a target on a mesh."""
    DFlash2Drafter.check(cfg, target)


def load(path: str, target, dtype=None) -> DFlash2Drafter:
    """The DFlash2 drafter in the directory ``path``, checked against ``target``."""
    cfg = DFlash2Config.from_pretrained(path)
    check(cfg, target)
    return DFlash2Drafter(cfg, load_dflash2_params(path, cfg, dtype=dtype or target.dtype), os.fspath(path))


def save(drafter: DFlash2Drafter, path: str | os.PathLike) -> None:
    save_dflash2_params(path, drafter.config, drafter.params)
