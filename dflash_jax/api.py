"""The public entry points, as ``import dflash_jax as dj`` shows them: ``load_target``,
``load_drafter``, ``save_drafter``, ``load_embedded`` and ``generate`` / ``generate_stream``.

This module only gathers them; each lives beside what it belongs to:
  * ``dflash_jax.models.handles``: :class:`Target`, :class:`Drafter` (config + parameters) and
    their loading and saving;
  * ``dflash_jax.decoding.generation``: argument checks, shape buckets, ``generate``,
    ``generate_stream``, :class:`GenerateOptions` (their keyword options), :class:`GenerateResult`
    (tokens and acceptance statistics).
"""

from dflash_jax.decoding.generation import GenerateResult, StreamChunk, generate, generate_stream
from dflash_jax.decoding.prepare import GenerateOptions
from dflash_jax.models.handles import (EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR, Drafter, Target,
                                       load_drafter, load_embedded, load_target, save_drafter)

__all__ = [
    "Drafter", "EMBEDDED_DRAFTER_DIR", "EMBEDDED_TARGET_DIR", "GenerateOptions", "GenerateResult",
    "StreamChunk", "Target", "generate", "generate_stream", "load_drafter", "load_embedded",
    "load_target", "save_drafter",
]
