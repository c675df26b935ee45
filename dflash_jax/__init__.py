"""dflash-jax: DFlash block-diffusion speculative decoding in JAX."""

from dflash_jax.api import (Drafter, GenerateResult, StreamChunk, Target, generate, generate_stream,
                            load_drafter, load_target, save_drafter)
from dflash_jax.checkpoints import CheckpointError
from dflash_jax.config import DrafterConfig, RopeConfig, TargetConfig
from dflash_jax.models.cache import KVCache

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "Drafter", "DrafterConfig", "GenerateResult", "KVCache", "RopeConfig",
    "StreamChunk", "Target", "TargetConfig", "generate", "generate_stream", "load_drafter",
    "load_target", "save_drafter", "__version__",
]
