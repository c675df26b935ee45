"""Model definitions: the target decoder, its static KV cache (and, later, the drafter)."""

from dflash_jax.models.cache import KVCache
from dflash_jax.models.target import TargetModel, init_target_params

__all__ = ["KVCache", "TargetModel", "init_target_params"]
