"""Model definitions: the target decoder (``target``), the DFlash drafter (``drafter``) and
their static KV cache (``cache``), all Flax Linen modules used functionally; and the handles of
loaded models (``handles``: ``Target``, ``Drafter``, their loading and saving)."""

from dflash_jax.models.cache import KVCache
from dflash_jax.models.drafter import DrafterModel, init_drafter_params
from dflash_jax.models.target import TargetModel, init_target_params

__all__ = ["DrafterModel", "KVCache", "TargetModel", "init_drafter_params", "init_target_params"]
