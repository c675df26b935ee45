"""dflash-jax: DFlash block-diffusion speculative decoding in JAX."""

import logging as _logging


class _DropTorchMissingNotice(_logging.Filter):
    """transformers logs "PyTorch was not found ..." at import when torch is absent: noise for
    a JAX user (we use its tokenizers and configs only); every other message passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


_logging.getLogger("transformers").addFilter(_DropTorchMissingNotice())

from dflash_jax.xla_flags import add_gpu_flags as _add_gpu_flags  # noqa: E402

_add_gpu_flags()  # GPU installs only, before jax creates its backend (see dflash_jax/xla_flags.py)

import dflash_jax.targets.builtin  # noqa: E402,F401  (registers the built-in target families)
import dflash_jax.methods.builtin  # noqa: E402,F401  (registers the built-in drafting methods)

from dflash_jax.api import (EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR, Drafter,  # noqa: E402
                            GenerateResult, StreamChunk, Target, generate, generate_stream,
                            load_drafter, load_embedded, load_target, save_drafter)
from dflash_jax.checkpoints import CheckpointError  # noqa: E402
from dflash_jax.compilation_cache import use_compilation_cache  # noqa: E402
from dflash_jax.config import RopeConfig, TargetConfig  # noqa: E402
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.nn.cache import KVCache  # noqa: E402
from dflash_jax.verification.adaptive import Adaptive  # noqa: E402
from dflash_jax.verification.policy import FixedVerify  # noqa: E402
from dflash_jax.verification.tree import TreeVerify  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Adaptive", "CheckpointError", "Drafter", "DrafterConfig", "EMBEDDED_DRAFTER_DIR",
    "EMBEDDED_TARGET_DIR", "FixedVerify", "GenerateResult", "KVCache", "RopeConfig", "StreamChunk",
    "Target", "TargetConfig", "TreeVerify", "generate", "generate_stream", "load_drafter",
    "load_embedded", "load_target", "save_drafter", "use_compilation_cache", "__version__",
]
