"""Static-shape KV cache.

Every sequence of the batch owns cache slots ``0 .. max_len - 1``; the token at absolute
position ``p`` lives in slot ``p``. ``lengths[b]`` is the number of committed tokens of row b.
Cropping (speculative decoding's rollback) only sets ``lengths``: slots past the length are
overwritten by the next write at those positions and never read before that, because
attention only lets a query at position ``p`` see slots ``<= p``.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
    """k, v: [layers, B, max_len, Hkv, Dh]; lengths: int32[B]."""

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def init(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
             dtype=jnp.float32) -> "KVCache":
        shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   lengths=jnp.zeros((batch,), jnp.int32))

    @classmethod
    def for_config(cls, cfg, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        return cls.init(cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim, dtype)

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def crop(self, lengths: jax.Array) -> "KVCache":
        """Sets the committed length of every row (int32[B]); no data moves."""
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

    def write(self, layer: jax.Array | int, k: jax.Array, v: jax.Array,
              positions: jax.Array) -> "KVCache":
        """Writes k, v [B, T, Hkv, Dh] of one layer at slots ``positions`` int32[B, T].

        Positions outside ``[0, max_len)`` are dropped (finished rows may run past the end).
        The update is a scatter into the stacked buffer, which XLA performs in place.
        """
        rows = jnp.arange(k.shape[0])[:, None]
        kc = self.k.at[layer, rows, positions].set(k.astype(self.k.dtype), mode="drop")
        vc = self.v.at[layer, rows, positions].set(v.astype(self.v.dtype), mode="drop")
        return self.replace(k=kc, v=vc)
