"""Sampling utilities: temperature, top-k and top-p applied to logits, greedy or sampled choice.

``SamplingParams`` is static (hashable) so one compiled loop serves one setting; the same
processing is what the speculative acceptance rules apply to both draft and target.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.parallel import vocab


def check_sampling(temperature, top_k, top_p, names=("temperature", "top_k", "top_p")) -> None:
    """Raises a one-line ValueError, naming the value by ``names`` (the fields, or a command's
    options), unless ``temperature`` >= 0, ``top_k`` a whole number >= 1 or None, ``top_p`` in
    (0, 1] or None."""
    if not temperature >= 0.0:
        raise ValueError(f"{names[0]} must be >= 0 (0: greedy), got {temperature}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"{names[1]} must be >= 1, a whole number (none: no limit), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"{names[2]} must be in (0, 1] (none: no threshold), got {top_p}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k / top_p restrict the sampled support."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(logits: jax.Array, params: SamplingParams,
                   ops: vocab.VocabOps = vocab.LOCAL) -> jax.Array:
    """Log-probabilities float32[..., V] after temperature, top-k and top-p (excluded = -inf).

    For greedy params this returns the log-softmax of the raw logits. ``ops``: the vocabulary
    reductions (``parallel.vocab.VocabOps``); with the vocabulary split inside ``shard_map``,
    logits and result are the shard's slice, top-k finds its threshold from every shard's k
    largest values, top-p gathers the whole vocabulary (its threshold needs the sorted
    distribution).
    """
    if ops.vocab_split:
        x = logits.astype(jnp.float32)
        if not params.greedy:
            x = x / params.temperature
        if params.top_p is not None and params.top_p < 1.0:  # a sort of the whole vocabulary
            x = ops.local(_filter(ops.gather(x), params))
        elif params.top_k is not None and params.top_k < x.shape[-1] * ops.vocab_shards:
            kth = ops.kth_largest(x, params.top_k)[..., None]
            x = jnp.where(x >= kth, x, -jnp.inf)
        return ops.log_softmax(x)
    x = logits.astype(jnp.float32)
    if not params.greedy:
        x = x / params.temperature
    return jax.nn.log_softmax(_filter(x, params), axis=-1)


def _filter(x: jax.Array, params: SamplingParams) -> jax.Array:
    """Top-k, then top-p, over the last axis (excluded = -inf)."""
    if params.top_k is not None and params.top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, params.top_k)[0][..., -1:]
        x = jnp.where(x >= kth, x, -jnp.inf)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_x, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        # keep the smallest prefix whose mass reaches top_p: a token is kept while the mass
        # strictly before it is below top_p (the top token is always kept)
        keep = mass_before < params.top_p
        cutoff = jnp.min(jnp.where(keep, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x >= cutoff, x, -jnp.inf)
    return x


def sample_tokens(key: jax.Array, logits: jax.Array, params: SamplingParams,
                  ops: vocab.VocabOps = vocab.LOCAL) -> jax.Array:
    """int32[...] tokens from logits[..., V]: argmax when greedy, else a categorical sample
    (``ops`` of a split vocabulary: the same tokens as on one device; ``parallel.vocab``)."""
    if params.greedy:
        return ops.argmax(logits)
    return ops.categorical(key, process_logits(logits, params, ops))
