"""EAGLE-3 drafters by the names a command line gives them (what a benchmark compares DFlash with).

    load_eagle3_drafter("embedded-eagle3", target)   # shipped with the package (the embedded target's)
    load_eagle3_drafter("path/to/eagle3", target)    # a directory in the released layout
    load_eagle3_drafter("random", target)            # random weights: acceptance ~1, smoke runs only

``random`` is ``Eagle3Drafter.random`` with every 4th target token as its draft vocabulary and,
for targets of fewer than 8 layers (no default feature layers), layers 0, 1, 2 (the embedded
EAGLE-3 drafter's) as its features; its numbers are not results.
"""

from __future__ import annotations

import os

import numpy as np

from dflash_jax.methods.eagle3 import EAGLE3
from dflash_jax.methods.eagle3.handle import EMBEDDED_EAGLE3, EMBEDDED_EAGLE3_DIR, Eagle3Drafter
from dflash_jax.models.handles import load_drafter

RANDOM = "random"
NAMES_HELP = EAGLE3.names_help


def random_eagle3(target, dtype=None, seed: int = 0):
    """A random-weight EAGLE-3 drafter for ``target`` (module docstring)."""
    n = target.config.num_layers
    ids = None if n >= 8 else tuple(min(i, n - 1) for i in (0, 1, 2))
    return Eagle3Drafter.random(target, draft_vocab=np.arange(0, target.config.vocab_size, 4),
                                target_layer_ids=ids, seed=seed, dtype=dtype)


def load_eagle3_drafter(name: str, target, dtype=None):
    """The EAGLE-3 drafter ``name`` names (module docstring); a missing one is refused naming
    the alternatives."""
    if name == RANDOM:
        return random_eagle3(target, dtype)
    if name == EMBEDDED_EAGLE3:
        if not os.path.exists(os.path.join(EMBEDDED_EAGLE3_DIR, "config.json")):
            raise FileNotFoundError(f"the shipped EAGLE-3 drafter ({EMBEDDED_EAGLE3}) is not in this installation "
                                    f"({EMBEDDED_EAGLE3_DIR}); give an EAGLE-3 drafter directory, or {RANDOM!r} "
                                    "(random weights, smoke runs only)")
        return load_drafter(EMBEDDED_EAGLE3, target, dtype=dtype)
    if not os.path.isdir(name):
        raise FileNotFoundError(f"EAGLE-3 drafter {name!r}: not a directory; give {NAMES_HELP}")
    return EAGLE3.load(name, target, dtype=dtype)
