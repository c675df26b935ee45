"""Decode states that roll back: the static-shape KV cache of attention layers and the state
of recurrent (linear-attention) layers.

Both have ``lengths`` int32[B] (positions held per row) and ``rollback(lengths)``, the one
operation the engine calls after verifying a block: keep each row's first ``lengths[b]``
positions (``dflash_jax.targets``).

KV cache: every sequence of the batch owns cache slots ``0 .. max_len - 1``; the token at
absolute position ``p`` lives in slot ``p``. Rolling back (cropping) only sets ``lengths``:
slots past the length are overwritten by the next write at those positions and never read
before that, because attention only lets a query at position ``p`` see slots ``<= p``.

Recurrent state: a fixed-size state per layer and row that each token updates, so it cannot be
cropped; a forward over a block records the state after every block row, and rollback restores
the one after the last kept row.
"""

from __future__ import annotations

import dataclasses

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

    def rollback(self, lengths: jax.Array) -> "KVCache":
        """The decode-state rollback (``dflash_jax.targets``): for a KV cache, :meth:`crop`."""
        return self.crop(lengths)

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

    def compact(self, start: jax.Array, source: jax.Array) -> "KVCache":
        """Moves each row's accepted tree nodes to contiguous slots (``verification.tree``): slot
        ``start + k`` takes the K/V of slot ``start + source[b, k]`` (source int32[B, M], node
        indices of the accepted path, ``source[:, 0] = 0``, increasing along the path) in every
        layer, for k = 0..M-1. Entries past a row's accepted path move garbage into slots past
        its new length, which are never read before they are written again."""
        rows = jnp.arange(self.batch)[:, None]
        start = jnp.asarray(start, jnp.int32)[:, None]
        src = start + source
        dst = start + jnp.arange(source.shape[1], dtype=jnp.int32)[None]
        k = self.k[:, rows, src]  # [L, B, M, Hkv, Dh]
        v = self.v[:, rows, src]
        return self.replace(k=self.k.at[:, rows, dst].set(k, mode="drop"),
                            v=self.v.at[:, rows, dst].set(v, mode="drop"))


@flax.struct.dataclass
class RecurrentState:
    """The state of recurrent layers (e.g. linear attention's conv and matrix state), rolled
    back by restoring a snapshot.

    state: [layers, B, *S] after the last kept position of each row.
    snapshots: [layers, B, T + 1, *S] written by the last forward over a block of T rows:
      index 0 the state before the block, index i the state after block row i - 1; None once
      rolled back (the decode loop carries rolled-back states only).
    start: int32[B] each row's length before that block; lengths: int32[B] positions held.
    """

    state: jax.Array
    snapshots: jax.Array | None
    start: jax.Array
    lengths: jax.Array

    @classmethod
    def init(cls, num_layers: int, batch: int, shape: tuple[int, ...], dtype=jnp.float32) -> "RecurrentState":
        zeros = jnp.zeros((batch,), jnp.int32)
        return cls(jnp.zeros((num_layers, batch) + tuple(shape), dtype), None, zeros, zeros)

    def after_block(self, snapshots: jax.Array, start: jax.Array, lengths: jax.Array) -> "RecurrentState":
        """The state after a forward over a block: ``snapshots`` [layers, B, T + 1, *S]
        (index 0 = before the block), the block starting at ``start`` and ending at ``lengths``."""
        return RecurrentState(snapshots[:, :, -1], snapshots, jnp.asarray(start, jnp.int32),
                              jnp.asarray(lengths, jnp.int32))

    def rollback(self, lengths: jax.Array) -> "RecurrentState":
        """Each row's state after its first ``lengths[b]`` positions: the snapshot after block
        row ``lengths[b] - start[b] - 1`` (the state before the block when nothing of it is
        kept). ``lengths`` must lie in ``[start, start + T]``; without snapshots (nothing run
        since the last rollback) only ``lengths == self.lengths`` is meaningful."""
        lengths = jnp.asarray(lengths, jnp.int32)
        if self.snapshots is None:
            return self.replace(lengths=lengths)
        T1 = self.snapshots.shape[2]
        index = jnp.clip(lengths - self.start, 0, T1 - 1)  # [B]
        rows = jnp.arange(self.snapshots.shape[1])
        kept = self.snapshots[:, rows, index]  # [layers, B, *S]
        return RecurrentState(kept, None, lengths, lengths)


# ---------------------------------------------------------------------------- rows of a state
# A rolled-back decode state (what the decode loop carries) holds arrays of two kinds: per-row
# int32[B] (lengths, start) and per-layer [layers, B, ...] (K/V, conv windows, recurrent
# states). Per-row adaptive verification (``verification.adaptive``) verifies groups of rows at
# different lengths: it takes the groups' rows out of the state and puts them back after.
def _row_axis(x: jax.Array, batch: int) -> int:
    axis = 0 if x.ndim == 1 else 1
    if x.shape[axis] != batch:
        raise ValueError(f"a decode-state array of shape {x.shape} has no batch axis of {batch} rows "
                         "where a rolled-back state keeps it (int32[B] or [layers, B, ...]); roll "
                         "the state back first, or give the family's state that layout")
    return axis


def take_rows(state, rows: jax.Array, batch: int):
    """The decode state of the rows ``rows`` (int32[R], indices into ``batch`` rows) of the
    rolled-back ``state`` (any of this module's states, or a family's composite of them): a
    state of R rows."""
    return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=_row_axis(x, batch)), state)


def put_rows(state, rows: jax.Array, part, batch: int, written: jax.Array | None = None):
    """``state`` (B = ``batch`` rows) with the rows ``rows`` (int32[R]) replaced by the R-row
    state ``part`` (rolled back, the same structure).

    ``written``: int32[R, T] the only K/V slots ``part`` changed since it was taken out of
    ``state`` (the block its forward wrote): a :class:`KVCache`, also inside a composite state,
    then gets only those slots and the lengths back instead of every slot of the rows; other
    arrays (a recurrent state: one per row and layer) are put back whole."""
    if written is not None and isinstance(state, KVCache):
        dst, src = rows[:, None], jnp.arange(rows.shape[0])[:, None]
        slot = lambda a, b: a.at[:, dst, written].set(b[:, src, written], mode="drop")
        return state.replace(k=slot(state.k, part.k), v=slot(state.v, part.v),
                             lengths=state.lengths.at[rows].set(part.lengths))
    if written is not None and dataclasses.is_dataclass(state):
        return state.replace(**{f.name: put_rows(getattr(state, f.name), rows, getattr(part, f.name), batch, written)
                                for f in dataclasses.fields(state)})

    def put(x, p):
        return x.at[rows].set(p) if _row_axis(x, batch) == 0 else x.at[:, rows].set(p)
    return jax.tree_util.tree_map(put, state, part)
