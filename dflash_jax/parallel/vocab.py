"""Reductions over a vocabulary split across the ``model`` axis, and random numbers that do not
depend on the split (used inside ``shard_map``).

Inside the sharded program every device holds logits ``[rows/d, ..., V/m]`` of its own rows
(the ``data`` axis) and its own vocabulary slice (the ``model`` axis). Nothing here gathers the
full logits except :func:`gather_vocab`, which top-p sampling needs (its threshold depends on
the sorted distribution); top-k's threshold comes from every shard's k largest values
(:func:`kth_largest`):

  * greedy argmax: each shard's (max, argmax); an all-gather of those two numbers per row; the
    first shard holding the maximum wins, which is the first index of the global maximum, as
    ``jnp.argmax`` takes on one device;
  * log-softmax: ``pmax`` of the row maxima and ``psum`` of the shifted exponentials;
  * the value at given token ids: a masked local gather and ``psum``;
  * sampling: Gumbel-max, which is how ``jax.random.categorical`` samples: the noise of the
    WHOLE [rows, ..., V] array is drawn from the same key as on one device and each shard keeps
    its block, so a sharded run samples the same tokens as the single-device run with the same
    seed (up to float rounding of the normaliser, which can only matter at exact ties).

Every function takes ``shards`` (a :class:`Shards`, or None for the plain single-device
computation, which is then exactly today's code).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.parallel.rules import DATA, MODEL


@dataclasses.dataclass(frozen=True)
class Shards:
    """Static description of the mesh a function runs on inside ``shard_map``: ``data`` row
    shards and ``model`` tensor-parallel shards (vocabulary split when ``model > 1``)."""

    data: int = 1
    model: int = 1
    data_axis: str = DATA
    model_axis: str = MODEL

    @property
    def vocab_split(self) -> bool:
        return self.model > 1

    @property
    def tp_axis(self) -> str | None:
        """The axis name for the model's psums (None without tensor parallelism)."""
        return self.model_axis if self.model > 1 else None

    def row_offset(self, local_rows: int) -> jax.Array:
        if self.data == 1:
            return jnp.int32(0)
        return jax.lax.axis_index(self.data_axis) * local_rows

    def vocab_offset(self, local_vocab: int) -> jax.Array:
        if not self.vocab_split:
            return jnp.int32(0)
        return jax.lax.axis_index(self.model_axis) * local_vocab


def argmax(x: jax.Array, shards: Shards | None) -> jax.Array:
    """int32 index of the maximum over the last (vocabulary) axis, in global token ids."""
    if shards is None or not shards.vocab_split:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    local_max = jnp.max(x, axis=-1)
    local_idx = jnp.argmax(x, axis=-1).astype(jnp.int32) + shards.vocab_offset(x.shape[-1])
    maxes = jax.lax.all_gather(local_max, shards.model_axis)  # [m, ...]
    idxs = jax.lax.all_gather(local_idx, shards.model_axis)
    best = jnp.argmax(maxes, axis=0)  # first shard with the maximum
    return jnp.take_along_axis(idxs, best[None], axis=0)[0]


def logsumexp(x: jax.Array, shards: Shards | None) -> jax.Array:
    """log sum exp over the last axis [...] (rows of -inf give -inf)."""
    if shards is None or not shards.vocab_split:
        return jax.nn.logsumexp(x, axis=-1)
    m = jax.lax.pmax(jnp.max(x, axis=-1), shards.model_axis)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    s = jax.lax.psum(jnp.sum(jnp.exp(x - m_safe[..., None]), axis=-1), shards.model_axis)
    return jnp.log(s) + m_safe


def log_softmax(x: jax.Array, shards: Shards | None) -> jax.Array:
    if shards is None or not shards.vocab_split:
        return jax.nn.log_softmax(x, axis=-1)
    return x - logsumexp(x, shards)[..., None]


def take(x: jax.Array, ids: jax.Array, shards: Shards | None) -> jax.Array:
    """``x[..., ids]`` for global token ids ``ids`` [...] (x [..., V or V/m])."""
    if shards is None or not shards.vocab_split:
        return jnp.take_along_axis(x, ids[..., None], axis=-1)[..., 0]
    Vl = x.shape[-1]
    local = ids - shards.vocab_offset(Vl)
    mine = (local >= 0) & (local < Vl)
    val = jnp.take_along_axis(x, jnp.clip(local, 0, Vl - 1)[..., None], axis=-1)[..., 0]
    return jax.lax.psum(jnp.where(mine, val, 0.0), shards.model_axis)


def kth_largest(x: jax.Array, k: int, shards: Shards | None) -> jax.Array:
    """The k-th largest value over the last axis [...]: each shard's min(k, V/m) largest
    values are all-gathered (k * m numbers per row, not the logits) and ranked together."""
    if shards is None or not shards.vocab_split:
        return jax.lax.top_k(x, k)[0][..., -1]
    local = jax.lax.top_k(x, min(k, x.shape[-1]))[0]
    every = jax.lax.all_gather(local, shards.model_axis, axis=x.ndim - 1, tiled=True)
    return jax.lax.top_k(every, k)[0][..., -1]


def top_k(x: jax.Array, k: int, shards: Shards | None) -> tuple[jax.Array, jax.Array]:
    """(values, int32 global token ids) of the k largest over the last axis [..., k], in
    descending order, ties to the lower id (``jax.lax.top_k``'s order over the whole
    vocabulary): each shard's min(k, V/m) largest with their ids are all-gathered (2 k m numbers
    per row, never the logits) and ranked together. Shard s holds ids ``s V/m ..``, so in the
    gathered order an equal value of a lower id comes first, as on one device."""
    if shards is None or not shards.vocab_split:
        vals, ids = jax.lax.top_k(x, k)
        return vals, ids.astype(jnp.int32)
    vals, ids = jax.lax.top_k(x, min(k, x.shape[-1]))
    ids = ids.astype(jnp.int32) + shards.vocab_offset(x.shape[-1])
    every = jax.lax.all_gather(vals, shards.model_axis, axis=x.ndim - 1, tiled=True)
    every_ids = jax.lax.all_gather(ids, shards.model_axis, axis=x.ndim - 1, tiled=True)
    vals, at = jax.lax.top_k(every, k)
    return vals, jnp.take_along_axis(every_ids, at, axis=-1)


def gather_vocab(x: jax.Array, shards: Shards | None) -> jax.Array:
    """The full last axis [..., V] from the shards' slices."""
    if shards is None or not shards.vocab_split:
        return x
    return jax.lax.all_gather(x, shards.model_axis, axis=x.ndim - 1, tiled=True)


def local_vocab(x_full: jax.Array, shards: Shards | None) -> jax.Array:
    """This shard's slice of a full-vocabulary array [..., V]."""
    if shards is None or not shards.vocab_split:
        return x_full
    Vl = x_full.shape[-1] // shards.model
    return jax.lax.dynamic_slice_in_dim(x_full, shards.vocab_offset(Vl), Vl, axis=x_full.ndim - 1)


def global_noise(key, sampler, local_shape, shards: Shards, vocab: bool) -> jax.Array:
    """This shard's block of ``sampler(key, global_shape)``: rows (axis 0) split over ``data``
    and, when ``vocab``, the last axis over ``model``: the same numbers as on one device."""
    shape = list(local_shape)
    shape[0] *= shards.data
    if vocab and shards.vocab_split:
        shape[-1] *= shards.model
    full = sampler(key, tuple(shape))
    out = jax.lax.dynamic_slice_in_dim(full, shards.row_offset(local_shape[0]), local_shape[0], 0)
    if vocab:
        out = local_vocab(out, shards)
    return out


def categorical(key, logp: jax.Array, shards: Shards | None) -> jax.Array:
    """int32 samples of ``softmax(logp)`` over the last axis, like ``jax.random.categorical``
    (Gumbel-max with the noise of the whole array), rows and vocabulary possibly sharded."""
    if shards is None:
        return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
    noise = global_noise(key, lambda k, s: jax.random.gumbel(k, s, logp.dtype), logp.shape,
                         shards, vocab=True)
    return argmax(logp + noise, shards)


def uniform(key, shape, shards: Shards | None) -> jax.Array:
    """float32 uniform[0, 1) of local ``shape`` (rows first), the rows' numbers of one device."""
    if shards is None:
        return jax.random.uniform(key, shape)
    return global_noise(key, lambda k, s: jax.random.uniform(k, s), shape, shards, vocab=False)


@dataclasses.dataclass(frozen=True)
class VocabOps:
    """The reductions over the vocabulary axis that sampling filters and acceptance rules need,
    injected into them: for one device (``shards`` None: the plain ``jnp`` reductions) or for a
    vocabulary split over ``model`` inside ``shard_map`` (the functions above: scalars per row
    cross devices, never the logits, except :meth:`gather` for top-p). The rules see only these
    methods, never the mesh."""

    shards: Shards | None = None

    @property
    def vocab_split(self) -> bool:
        return self.shards is not None and self.shards.vocab_split

    @property
    def vocab_shards(self) -> int:
        """Number of vocabulary slices (the full vocabulary is this times the local one)."""
        return self.shards.model if self.vocab_split else 1

    def argmax(self, x):
        return argmax(x, self.shards)

    def max(self, x):
        """Maximum over the last axis [...]."""
        m = jnp.max(x, axis=-1)
        return jax.lax.pmax(m, self.shards.model_axis) if self.vocab_split else m

    def sum(self, x, keepdims: bool = False):
        """Sum over the last axis."""
        s = jnp.sum(x, axis=-1, keepdims=keepdims)
        return jax.lax.psum(s, self.shards.model_axis) if self.vocab_split else s

    def logsumexp(self, x):
        return logsumexp(x, self.shards)

    def log_softmax(self, x):
        return log_softmax(x, self.shards)

    def take(self, x, ids):
        return take(x, ids, self.shards)

    def kth_largest(self, x, k: int):
        return kth_largest(x, k, self.shards)

    def top_k(self, x, k: int):
        """(values, global ids) of the k largest over the vocabulary (:func:`top_k`)."""
        return top_k(x, k, self.shards)

    def gather(self, x):
        """The whole vocabulary axis (top-p's sort needs it)."""
        return gather_vocab(x, self.shards)

    def local(self, x_full):
        return local_vocab(x_full, self.shards)

    def categorical(self, key, logp):
        return categorical(key, logp, self.shards)

    def uniform(self, key, shape):
        return uniform(key, shape, self.shards)


LOCAL = VocabOps()
"""The single-device reductions."""
