"""The built-in drafting methods, one registry line each (``dflash_jax`` imports this module,
so they are registered before any drafter loads). A new method: its package under
``dflash_jax/methods/`` and one line here (``docs/methods.md``)."""

from dflash_jax.methods import register
from dflash_jax.methods import dflash
from dflash_jax.methods import dflash2
from dflash_jax.methods import domino
from dflash_jax.methods import dspark
from dflash_jax.methods import eagle3

register(dflash.DFLASH)
register(eagle3.EAGLE3)
register(dflash2.DFLASH2)
register(dspark.DSPARK)
register(domino.DOMINO)
