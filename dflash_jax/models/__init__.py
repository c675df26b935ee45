"""Model definitions shared by every target family: the DFlash drafter (``drafter``) and the
decode states that roll back (``cache``: the KV cache, the recurrent state), Flax Linen modules
used functionally; and the handles of loaded models (``handles``: ``Target``, ``Drafter``,
their loading and saving). The target architectures are families in ``dflash_jax.targets``."""

from dflash_jax.models.cache import KVCache, RecurrentState
from dflash_jax.models.drafter import DrafterModel, init_drafter_params

__all__ = ["DrafterModel", "KVCache", "RecurrentState", "init_drafter_params"]
