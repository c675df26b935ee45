"""EAGLE-3's names as ``dflash_jax.models.handles`` offered them before the method packages
(``DraftingMethod.handle_exports``): the handle class and constants, and two deprecated loaders
that warn."""

from __future__ import annotations

import os

from dflash_jax.methods.eagle3 import EAGLE3, handle
from dflash_jax.methods.eagle3.handle import (EAGLE3_DEFAULT_BLOCK, EMBEDDED_EAGLE3, Eagle3Drafter,
                                              d2t_of_vocab)
from dflash_jax.models.handles import Target, deprecated, save_drafter

__all__ = ["EAGLE3", "EAGLE3_DEFAULT_BLOCK", "EMBEDDED_EAGLE3", "Eagle3Drafter", "d2t_of_vocab",
           "load_eagle3", "save_eagle3"]


def load_eagle3(path: str | os.PathLike, target: Target, dtype=None, *,
                revision: str | None = None):
    """Deprecated: :func:`~dflash_jax.models.handles.load_drafter` loads an EAGLE-3 drafter too
    (by its architectures). This one loads EAGLE-3 drafters only, as before; ``"embedded"`` here
    is the shipped EAGLE-3 drafter (``"embedded-eagle3"`` for ``load_drafter``)."""
    deprecated("load_eagle3", "load_drafter")
    return EAGLE3.load(handle.resolve(path, revision), target, dtype)


def save_eagle3(drafter, path: str | os.PathLike) -> None:
    """Deprecated: :func:`~dflash_jax.models.handles.save_drafter` writes a drafter of any method."""
    deprecated("save_eagle3", "save_drafter")
    save_drafter(drafter, path)
