"""dflash-jax: DFlash block-diffusion speculative decoding in JAX."""

from dflash_jax.api import GenerateResult, Target, generate, load_target
from dflash_jax.checkpoints import CheckpointError
from dflash_jax.config import RopeConfig, TargetConfig
from dflash_jax.models.cache import KVCache

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "GenerateResult", "KVCache", "RopeConfig", "Target", "TargetConfig",
    "generate", "load_target", "__version__",
]
