"""What a target's attention layers need to verify a tree of drafts in one pass
(``docs/trees.md``, ``verification.tree``).

A tree block of T nodes is written like a causal block, node t into cache slot
``start + t`` (``start`` = the row's committed length), but

* node t is rotated to its own position ``start + depth[t]`` (siblings share one), not to its
  slot: :attr:`TreeAttention.positions`;
* node t sees the committed slots ``< start`` and, of the block's slots, only those of its
  ancestors and itself: :attr:`TreeAttention.visible`.

A family's forward takes ``tree=TreeAttention(...)`` beside its ordinary ``positions`` argument,
which stays the slots ``start + arange(T)`` (where K/V are written; the state's length after the
pass is ``start + T``, as for a chain).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class TreeAttention:
    """positions: int32[B, T] the nodes' RoPE positions (``start + depth``);
    visible: bool[B, T, T] ``[b, t, j]``: node t sees node j (j is t or an ancestor of t)."""

    positions: jax.Array
    visible: jax.Array

    def check(self, slots: jax.Array) -> None:
        """Raises ValueError unless the shapes fit a block at ``slots`` int32[B, T]."""
        B, T = slots.shape
        if self.positions.shape != (B, T) or self.visible.shape != (B, T, T):
            raise ValueError(f"a tree over a block of {T} nodes (batch {B}) needs positions "
                             f"[{B}, {T}] and visible [{B}, {T}, {T}]; got {self.positions.shape} "
                             f"and {self.visible.shape}")


def block_relative(slots: jax.Array, num_slots: int):
    """(rel int32[B, 1, S], in_block bool[B, 1, S]): each cache slot's offset from the block's
    first slot ``slots[:, 0]``, and whether it is one of the block's T slots."""
    T = slots.shape[1]
    rel = jnp.arange(num_slots, dtype=jnp.int32)[None, None, :] - slots[:, :1, None]
    return rel, (rel >= 0) & (rel < T)


def cache_mask(slots: jax.Array, tree: TreeAttention, num_slots: int) -> jax.Array:
    """bool[B, T, S]: node t (block at ``slots`` int32[B, T] = start + arange(T)) sees cache slot
    s when ``s < start`` or s is the slot of one of its ancestors or itself."""
    B, T = slots.shape
    rel, in_block = block_relative(slots, num_slots)
    index = jnp.broadcast_to(jnp.clip(rel, 0, T - 1), (B, T, num_slots))
    seen = jnp.take_along_axis(tree.visible, index, axis=2)
    return (rel < 0) | (in_block & seen)


def slot_positions(slots: jax.Array, tree: TreeAttention, num_slots: int) -> jax.Array:
    """int32[B, S]: the RoPE position of the token in each cache slot: the slot itself before
    the block, the node's position in it (what a sliding window measures distance in). Slots
    past the block keep their own index (they are never visible)."""
    B, T = slots.shape
    rel, in_block = block_relative(slots, num_slots)
    rel, in_block = rel[:, 0], in_block[:, 0]
    node = jnp.take_along_axis(tree.positions, jnp.clip(rel, 0, T - 1), axis=1)
    return jnp.where(in_block, node, jnp.arange(num_slots, dtype=jnp.int32)[None])
