"""The DFlash drafter handle (:class:`Drafter`: config in the released layout and parameters)
and its checkpoint I/O in the released DFlash layout (``docs/method.md``); ``load_drafter`` /
``save_drafter`` reach these through the method registry."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from dflash_jax.methods.dflash.checkpoint import load_drafter_params, save_drafter_params
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.parallel import rules


@dataclasses.dataclass
class Drafter:
    """A DFlash drafter: config (released layout) and parameters; uses the target's embedding
    and LM head, which are never copied into ``params``. ``mesh``: the mesh its parameters are
    placed on (its target's; None: one device)."""

    method_name = "dflash"  # its drafting method (dflash_jax.methods)

    config: DrafterConfig
    params: Any
    path: str | None = None
    mesh: Any = None

    def __post_init__(self):
        if self.mesh is not None:
            rules.check_model_split(self.config, rules.mesh_axis_sizes(self.mesh)[rules.MODEL],
                                    "drafter")
            self.params = rules.shard_params(self.params, self.mesh)

    @property
    def dtype(self):
        # conditioning "none" has no fc
        return (self.params["fc"]["kernel"] if "fc" in self.params else self.params["norm"]["weight"]).dtype

    @classmethod
    def random(cls, target, num_layers: int = 1, block_size: int = 16,
               mask_token_id: int | None = None, target_layer_ids=None, seed: int = 0,
               dtype=None, init_scale: float = 0.02, conditioning: str = "kv") -> "Drafter":
        """A random-weight drafter shaped for ``target`` (default mask id: the last vocab row;
        ``conditioning``: see :class:`~dflash_jax.methods.dflash.config.DrafterConfig`)."""
        mask = target.config.vocab_size - 1 if mask_token_id is None else mask_token_id
        cfg = DrafterConfig.for_target(target.config, num_layers, block_size, mask, target_layer_ids,
                                       conditioning=conditioning)
        cfg.check_target(target.config)
        params = init_drafter_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale)
        return cls(cfg, params, mesh=target.mesh)


def load(path: str, target, dtype=None) -> Drafter:
    """The DFlash drafter in the directory ``path``, checked against ``target``; on a target
    loaded with a mesh it is placed sharded on the same mesh as it loads."""
    cfg = DrafterConfig.from_pretrained(path)
    cfg.check_target(target.config)
    if target.mesh is not None:
        rules.check_model_split(cfg, rules.mesh_axis_sizes(target.mesh)[rules.MODEL], "drafter")
        params = load_drafter_params(path, cfg, dtype=dtype or target.dtype,
                                     sharding_of=rules.sharding_of(target.mesh))
    else:
        params = load_drafter_params(path, cfg, dtype=dtype or target.dtype)
    return Drafter(cfg, params, path, target.mesh)


def save(drafter: Drafter, path: str | os.PathLike) -> None:
    """Writes config.json + model.safetensors in the released DFlash layout."""
    save_drafter_params(path, drafter.config, drafter.params)


@dataclasses.dataclass
class OneDeviceDrafter:
    """The handle of a drafter on DFlash's backbone that runs on one device (DFlash2's, DSpark's):
    config and parameters; like DFlash's it uses the target's embedding and LM head. A subclass
    names its method (``method_name``) and ``label``."""

    method_name = ""
    label = ""

    config: Any
    params: Any
    path: str | None = None
    mesh: Any = None  # always None: one device

    @property
    def dtype(self):
        return self.params["norm"]["weight"].dtype

    @classmethod
    def check(cls, cfg, target) -> None:
        """Refuses a drafter that does not fit ``target`` or a target on a mesh."""
        cfg.check_target(target.config)
        if target.mesh is not None:
            raise ValueError(f"{cls.label} drafters run on one device: load the target without a mesh")

