"""The decoding engine: prefill, then one on-device ``lax.while_loop`` of
draft -> verify -> accept -> commit (SPEC.md section 4, DESIGN.md data flow).

Autoregressive decoding is the same engine with block size 1 and no drafter (the block is
just the bonus token and verify is one target step), so the baseline and DFlash share every
line of the loop. Rows of a batch advance by their own acceptance lengths: each row has its own
cache lengths, positions, stop ids and budget; a finished row idles.

Acceptance rules:
  * greedy (temperature 0): accept while ``draft[i+1] == argmax p_i``;
  * greedy draft + sampling: the target samples ``x_i ~ p_i`` at every block row and the draft
    is accepted while it agrees (SPEC section 4); every emitted token is a target sample given
    the true prefix, so the output has the target's distribution;
  * sampled draft: ``d_{i+1} ~ q_i``; accept with probability ``min(1, p_i(d)/q_i(d))``; at the
    first rejection emit a sample of ``normalise(max(p_i - q_i, 0))``; after a full block a
    sample of ``p_{bs-1}``. Lossless for any q (here q is the drafter's distribution with the
    same temperature/top-k/top-p as the target).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax.config import DrafterConfig, TargetConfig
from dflash_jax.decoding.sampling import SamplingParams, process_logits, sample_tokens
from dflash_jax.models.cache import KVCache
from dflash_jax.models.drafter import DrafterModel
from dflash_jax.models.target import TargetModel, embed, lm_head


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about one decoding run (a jit cache key).

    draft_fn: None for the DFlash drafter; otherwise a custom proposer with the signature of
      :func:`dflash_draft` (used to study the engine with controlled proposals).
    """

    target: TargetConfig
    drafter: DrafterConfig | None
    block_size: int
    sampling: SamplingParams
    sampled_draft: bool = False
    num_denoise_steps: int = 1
    out_len: int = 64
    draft_fn: Callable | None = None
    attention_impl: str = "xla"

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.target_layer_ids if self.drafter is not None else ()

    @property
    def speculative(self) -> bool:
        return self.block_size > 1


@flax.struct.dataclass
class DecodeState:
    """The loop carry. out int32[B, out_len] generated ids (-1 = none); n int32[B] count;
    done bool[B]; bonus int32[B] last committed token (at position tcache.lengths);
    pending_taps [B, bs, k*D] / pending_pos int32[B, bs]: target features of the last verified
    block, not yet projected into the drafter cache (positions >= ctx_len are ignored);
    acc int32[B, out_len] acceptance length of each iteration; iters int32[B]."""

    out: jax.Array
    n: jax.Array
    done: jax.Array
    tcache: KVCache
    dcache: Any
    bonus: jax.Array
    pending_taps: Any
    pending_pos: jax.Array
    acc: jax.Array
    iters: jax.Array
    key: jax.Array


def is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """bool[...]: tokens[B, ...] is one of its row's stop ids (stop_ids int32[B, S], -1 = none)."""
    t = tokens.reshape(tokens.shape[0], -1, 1)
    hit = jnp.any((t == stop_ids[:, None, :]) & (stop_ids[:, None, :] >= 0), axis=-1)
    return hit.reshape(tokens.shape)


# ---------------------------------------------------------------------------- prefill
@functools.partial(jax.jit, static_argnames=("spec", "cache_len"))
def prefill(tparams, dparams, tokens, lengths, max_new, stop_ids, key, *, spec: EngineSpec,
            cache_len: int) -> DecodeState:
    """Target over the right-padded prompts (tokens int32[B, P], lengths int32[B]); first token
    sampled at each row's last prompt position; prompt taps projected into the drafter cache."""
    cfg = spec.target
    B, P = tokens.shape
    dtype = tparams["embed_tokens"]["embedding"].dtype
    key, sub = jax.random.split(key)
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    logits, taps, tcache = TargetModel(cfg, spec.tap_layer_ids, attention_impl=spec.attention_impl).apply(
        {"params": tparams}, tokens, positions, KVCache.for_config(cfg, B, cache_len, dtype),
        logit_index=lengths - 1)
    first = sample_tokens(sub, logits[:, 0], spec.sampling)
    tcache = tcache.crop(lengths)
    bs = spec.block_size
    dcache = pending = None
    if spec.drafter is not None:
        d = spec.drafter
        dcache = KVCache.init(d.num_layers, B, cache_len, d.num_kv_heads, d.head_dim, dtype)
        if dparams is not None:
            _, dcache = DrafterModel(d, attention_impl=spec.attention_impl).apply(
                {"params": dparams}, None, None, dcache, taps,
                                              positions, lengths)
        pending = jnp.zeros((B, bs, taps.shape[-1]), taps.dtype)
    out = jnp.full((B, spec.out_len), -1, jnp.int32).at[:, 0].set(first)
    n = jnp.ones((B,), jnp.int32)
    return DecodeState(
        out=out, n=n, done=is_stop(first, stop_ids) | (n >= max_new), tcache=tcache,
        dcache=dcache, bonus=first, pending_taps=pending,
        pending_pos=jnp.full((B, bs), cache_len, jnp.int32),  # nothing pending: dropped writes
        acc=jnp.zeros((B, spec.out_len), jnp.int32), iters=jnp.zeros((B,), jnp.int32), key=key)


# ---------------------------------------------------------------------------- drafting
def dflash_draft(spec: EngineSpec, tparams, dparams, state: DecodeState, key):
    """One DFlash draft of the block ``[bonus, MASK * (bs-1)]`` at ``start = tcache.lengths``.

    Returns (draft int32[B, bs-1], draft log-probs float32[B, bs-1, V] or None, drafter cache).
    With ``num_denoise_steps = s > 1`` the drafter runs s times; after each pass but the last,
    the most confident still-masked rows keep their prediction as input to the next pass.
    """
    d, bs, steps = spec.drafter, spec.block_size, spec.num_denoise_steps
    start = state.tcache.lengths
    B = start.shape[0]
    positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
    model = DrafterModel(d, attention_impl=spec.attention_impl)
    fill = jnp.full((B, bs - 1), d.mask_token_id, jnp.int32)
    filled = jnp.zeros((B, bs - 1), bool)
    dcache = state.dcache
    for step in range(steps):
        block = jnp.concatenate([state.bonus[:, None], fill], axis=1)
        ctx = (state.pending_taps, state.pending_pos) if step == 0 else (None, None)
        h, dcache = model.apply({"params": dparams}, embed(tparams, block), positions, dcache,
                                *ctx, start)
        logits = lm_head(spec.target, tparams, h[:, 1:])
        if step == steps - 1:
            break
        pred = jnp.argmax(logits, -1).astype(jnp.int32)
        conf = jnp.where(filled, jnp.inf, jnp.max(jax.nn.log_softmax(logits), -1))
        rank = jnp.argsort(jnp.argsort(-conf, axis=-1), axis=-1)
        keep = rank < round((bs - 1) * (step + 1) / steps)
        fill = jnp.where(filled, fill, jnp.where(keep, pred, fill))
        filled = filled | keep
    if spec.sampled_draft:
        q_logp = process_logits(logits, spec.sampling)
        draft = jax.random.categorical(key, q_logp, axis=-1).astype(jnp.int32)
    else:
        q_logp = None
        draft = jnp.argmax(logits, -1).astype(jnp.int32)
    return jnp.where(filled, fill, draft), q_logp, dcache


# ---------------------------------------------------------------------------- acceptance
def accept(spec: EngineSpec, draft, q_logp, logits, key):
    """Returns (a int32[B] accepted draft tokens, bonus int32[B] the target's next token).

    draft int32[B, bs-1]; q_logp float32[B, bs-1, V] (sampled drafts) or None;
    logits float32[B, bs, V] the target's logits at the block rows."""
    B, bs, V = logits.shape
    if not spec.sampled_draft:
        # greedy: argmax; sampling with a greedy draft: one independent target sample per row
        choice = sample_tokens(key, logits, spec.sampling)
        match = draft == choice[:, :-1]
        a = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
        return a, jnp.take_along_axis(choice, a[:, None], 1)[:, 0]
    k_u, k_res = jax.random.split(key)
    p_logp = process_logits(logits, spec.sampling)
    p_d = jnp.take_along_axis(p_logp[:, :-1], draft[..., None], -1)[..., 0]
    q_d = jnp.take_along_axis(q_logp, draft[..., None], -1)[..., 0]
    u = jax.random.uniform(k_u, (B, bs - 1))
    ok = jnp.log(u) < p_d - q_d  # u < p/q  (always when p >= q)
    a = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    p_a = jnp.exp(jnp.take_along_axis(p_logp, a[:, None, None], 1)[:, 0])
    q_pad = jnp.concatenate([jnp.exp(q_logp), jnp.zeros((B, 1, V), q_logp.dtype)], axis=1)
    q_a = jnp.take_along_axis(q_pad, a[:, None, None], 1)[:, 0]  # zeros after a full block
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = jnp.sum(resid, -1, keepdims=True)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)
    bonus = jax.random.categorical(k_res, jnp.log(resid), axis=-1).astype(jnp.int32)
    return a, bonus


# ---------------------------------------------------------------------------- the loop
def _iteration(spec: EngineSpec, tparams, dparams, max_new, stop_ids, state: DecodeState):
    bs = spec.block_size
    B = state.bonus.shape[0]
    rows = jnp.arange(B)
    key, k_draft, k_accept = jax.random.split(state.key, 3)
    start = state.tcache.lengths
    positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)

    if spec.speculative:
        draft_fn = spec.draft_fn or dflash_draft
        draft, q_logp, dcache = draft_fn(spec, tparams, dparams, state, k_draft)
        block = jnp.concatenate([state.bonus[:, None], draft], axis=1)
    else:
        draft = jnp.zeros((B, 0), jnp.int32)
        q_logp, dcache, block = None, state.dcache, state.bonus[:, None]

    logits, taps, tcache = TargetModel(spec.target, spec.tap_layer_ids,
                                       attention_impl=spec.attention_impl).apply(
        {"params": tparams}, block, positions, state.tcache)
    a, bonus = accept(spec, draft, q_logp, logits, k_accept)

    # tokens emitted this iteration: draft[0..a-1] then the bonus; cut at a stop and the budget
    j = jnp.arange(bs)
    emit = jnp.where(j[None] < a[:, None], jnp.pad(draft, ((0, 0), (0, 1))), bonus[:, None])
    count = a + 1
    stop_at = jnp.where(is_stop(emit, stop_ids) & (j[None] < count[:, None]), j[None], bs)
    first_stop = jnp.min(stop_at, axis=1)
    count = jnp.minimum(jnp.minimum(count, first_stop + 1), max_new - state.n)
    live = ~state.done
    write = live[:, None] & (j[None] < count[:, None])
    cols = jnp.where(write, state.n[:, None] + j[None], spec.out_len)
    out = state.out.at[rows[:, None], cols].set(emit, mode="drop")
    n = state.n + jnp.where(live, count, 0)
    done = state.done | (live & ((first_stop < bs) & (first_stop < count) | (n >= max_new)))
    acc = state.acc.at[rows, jnp.where(live, state.iters, spec.out_len)].set(a + 1, mode="drop")
    new_len = jnp.where(live, start + a + 1, start)
    return DecodeState(
        out=out, n=n, done=done, tcache=tcache.crop(new_len), dcache=dcache,
        bonus=jnp.where(live, bonus, state.bonus),
        pending_taps=taps if spec.drafter is not None else None,
        pending_pos=positions, acc=acc, iters=state.iters + live, key=key)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def decode(tparams, dparams, state: DecodeState, max_new, stop_ids, max_iterations,
           *, spec: EngineSpec) -> DecodeState:
    """Runs iterations until every row is done or ``max_iterations`` (a traced int) ran.

    One call with a large ``max_iterations`` is the whole generation on device; streaming calls
    it repeatedly with a small one and reads the state in between.
    """
    def cond(carry):
        state, it = carry
        return (it < max_iterations) & ~jnp.all(state.done)

    def body(carry):
        state, it = carry
        return _iteration(spec, tparams, dparams, max_new, stop_ids, state), it + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state
