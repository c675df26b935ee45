"""The DFlash drafter (``drafter``), a Flax Linen module used functionally, and the handles of
loaded models (``handles``: ``Target``, ``Drafter``, their loading and saving). The target
architectures are families in ``dflash_jax.targets``; the decode states are in ``nn.cache``."""

from dflash_jax.models.drafter import DrafterModel, init_drafter_params

__all__ = ["DrafterModel", "init_drafter_params"]
