"""On-device autoregressive decoding: prefill, then one ``lax.while_loop`` of single-token steps.

Both stages are jitted; the host sees results only when a stage returns. Rows of a batch have
their own prompt length, stop tokens and token budget; a finished row stays idle (its cache
length does not move and its outputs are not written).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dflash_jax.config import TargetConfig
from dflash_jax.decoding.sampling import SamplingParams, sample_tokens
from dflash_jax.models.cache import KVCache
from dflash_jax.models.target import TargetModel


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "cache_len", "tap_layer_ids"))
def prefill(params, tokens, lengths, key, *, cfg: TargetConfig, sampling: SamplingParams,
            cache_len: int, tap_layer_ids: tuple[int, ...] = ()):
    """Runs the target over right-padded prompts and samples the first new token.

    Args:
      tokens: int32[B, P] prompts, right-padded; lengths: int32[B] real prompt lengths.
    Returns:
      first: int32[B] first generated token; cache with ``lengths`` = prompt lengths;
      taps: [B, P, k*D] tapped features of the prompt positions (None without taps).
    """
    B, P = tokens.shape
    dtype = params["embed_tokens"]["embedding"].dtype
    cache = KVCache.for_config(cfg, B, cache_len, dtype)
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    logits, taps, cache = TargetModel(cfg, tap_layer_ids).apply(
        {"params": params}, tokens, positions, cache, logit_index=lengths - 1)
    first = sample_tokens(key, logits[:, 0], sampling)
    return first, cache.crop(lengths), taps


def is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """bool[B]: tokens[B] is one of its row's stop ids (stop_ids int32[B, S], -1 = padding)."""
    return jnp.any((tokens[:, None] == stop_ids) & (stop_ids >= 0), axis=-1)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "out_len"))
def decode_loop(params, cache: KVCache, first, max_new, stop_ids, key, *, cfg: TargetConfig,
                sampling: SamplingParams, out_len: int):
    """Generates until every row hit a stop token or its budget, all inside one while_loop.

    Args:
      cache: the prefilled cache; first: int32[B] the first generated tokens;
      max_new: int32[B] per-row budgets (>= 1); stop_ids: int32[B, S];
      out_len: static width of the output buffer (>= max(max_new)).
    Returns:
      out int32[B, out_len] (-1 after each row's end), num_generated int32[B], steps int32.
    """
    B = first.shape[0]
    rows = jnp.arange(B)
    model = TargetModel(cfg)
    out = jnp.full((B, out_len), -1, jnp.int32).at[:, 0].set(first)
    n = jnp.ones((B,), jnp.int32)
    done = is_stop(first, stop_ids) | (n >= max_new)

    def cond(state):
        return ~jnp.all(state[2])

    def body(state):
        out, n, done, cache, tok, key, steps = state
        key, sub = jax.random.split(key)
        positions = cache.lengths[:, None]
        logits, _, new_cache = model.apply({"params": params}, tok[:, None], positions, cache)
        new = sample_tokens(sub, logits[:, 0], sampling)
        live = ~done
        out = out.at[rows, jnp.where(live, n, out_len)].set(new, mode="drop")
        cache = new_cache.crop(jnp.where(live, new_cache.lengths, cache.lengths))
        n = n + live
        tok = jnp.where(live, new, tok)
        done = done | is_stop(new, stop_ids) | (n >= max_new)
        return out, n, done, cache, tok, key, steps + 1

    state = (out, n, done, cache, first, key, jnp.int32(0))
    out, n, _, _, _, _, steps = jax.lax.while_loop(cond, body, state)
    return out, n, steps
