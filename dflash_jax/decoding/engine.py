"""The decoding engine: prefill, then one on-device ``lax.while_loop`` of
draft -> verify -> accept -> commit (SPEC.md section 4, DESIGN.md data flow).

Autoregressive decoding is the same engine with block size 1 and no drafter (the block is
just the bonus token and verify is one target step), so the baseline and DFlash share every
line of the loop. Rows of a batch advance by their own acceptance lengths: each row has its own
cache lengths, positions, stop ids and budget; a finished row idles.

One iteration, one function per step:
  * :func:`dflash_draft`: the deferred context update (the previous block's verified features
    enter the drafter cache, see :class:`DecodeState`), then the drafter fills
    ``[bonus, MASK, ...]``: draft int32[B, bs-1];
  * :func:`verify`: the target over ``[bonus, draft]``: logits [B, bs, V] and taps;
  * :func:`accept`: the accepted draft length and the bonus token;
  * :func:`rollback`: the target's decode state back to the kept rows (KV: set the length);
  * :func:`commit`: emit the tokens, apply stop ids and budgets.

Acceptance rules:
  * greedy (temperature 0): accept while ``draft[i+1] == argmax p_i``;
  * greedy draft + sampling: the target samples ``x_i ~ p_i`` at every block row and the draft
    is accepted while it agrees (SPEC section 4); every emitted token is a target sample given
    the true prefix, so the output has the target's distribution;
  * sampled draft: ``d_{i+1} ~ q_i``; accept with probability ``min(1, p_i(d)/q_i(d))``; at the
    first rejection emit a sample of ``normalise(max(p_i - q_i, 0))``; after a full block a
    sample of ``p_{bs-1}``. Lossless for any q (here q is the drafter's distribution with the
    same temperature/top-k/top-p as the target).

Multi-device (``EngineSpec.mesh``, ``dflash_jax.parallel``): ``prefill`` and ``decode`` run their
whole body, the ``while_loop`` included, inside one ``shard_map`` over the mesh. Each device
runs the functions above on its rows (``data``) with the shard's configs (``model``: heads, KV
heads, MLP width, vocabulary split; ``parallel.rules``); the only cross-device steps are the
models' psums and the vocabulary reductions of ``parallel.vocab`` (argmax, log-softmax,
values at token ids, sampling with the single-device random numbers).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax import targets
from dflash_jax.config import DrafterConfig, TargetConfig
from dflash_jax.decoding.sampling import SamplingParams, process_logits, sample_tokens
from dflash_jax.models.cache import KVCache
from dflash_jax.parallel import rules, vocab
from dflash_jax.models.drafter import DrafterModel


# Bumped whenever a change to the loop changes what an iteration costs, so that measured cost
# tables (``decoding.adaptive``) made before it are measured again. 2: the target's weights
# split per layer on CPU (the dense family's ``loop_params``).
LOOP_VERSION = 2


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about one decoding run (a jit cache key).

    draft_fn: None for the DFlash drafter; otherwise a custom proposer with the signature of
      :func:`dflash_draft` (used to study the engine with controlled proposals).
    mesh: a ``(data, model)`` device mesh (``parallel.make_mesh``) to run on, or None (one
      device). Inside the sharded program the functions see :meth:`local` specs: ``mesh``
      None, ``shards`` set and the configs of one model shard.
    verify_lengths / verify_costs: adaptive block size (``decoding.adaptive``): the drafter
      drafts the whole ``block_size`` block, then each iteration verifies only its first
      L rows, L one of these static lengths (ascending, each <= block_size), chosen from the
      drafter's own confidence and the cost of an iteration at each length (seconds, same
      order); one compiled verify branch per length (``lax.switch``). Empty: always verify
      ``block_size`` rows (the paper's fixed block).
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
    mesh: Any = None
    shards: vocab.Shards | None = None
    verify_lengths: tuple[int, ...] = ()
    verify_costs: tuple[float, ...] = ()

    @property
    def adaptive(self) -> bool:
        """Whether each iteration chooses its verify length (see ``verify_lengths``)."""
        return bool(self.verify_lengths)

    @property
    def tp_axis(self) -> str | None:
        """The mesh axis of the models' tensor-parallel psums (None: not split)."""
        return self.shards.tp_axis if self.shards is not None else None

    def local(self) -> "EngineSpec":
        """The spec one device runs inside ``shard_map`` over ``self.mesh``."""
        sizes = rules.mesh_axis_sizes(self.mesh)
        m = sizes[rules.MODEL]
        return dataclasses.replace(
            self, mesh=None, shards=vocab.Shards(sizes[rules.DATA], m),
            target=rules.local_config(self.target, m),
            drafter=rules.local_config(self.drafter, m) if self.drafter is not None else None)

    @property
    def family(self):
        """The target's family (``dflash_jax.targets``): its forward, decode state, rules."""
        return targets.family_of(self.target)

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.target_layer_ids if self.drafter is not None else ()

    @property
    def speculative(self) -> bool:
        return self.block_size > 1


@flax.struct.dataclass
class DecodeState:
    """The loop carry. B rows, bs = block size, k*D = width of the target's taps.

    Deferred context update: the drafter's context is the target's features of the committed
    tokens, but verify produces them for the whole block before accept knows how many rows will
    be committed. So the verified block's taps wait in ``pending_taps`` and enter the drafter
    cache at the next draft (``DrafterModel.project_context`` in :func:`dflash_draft`), whose
    context length, the committed length, makes the rows past the accepted ones invisible (they
    are overwritten by a later block before they are read).
    """

    out: jax.Array  # int32[B, out_len] generated ids (-1 = none yet)
    n: jax.Array  # int32[B] number of ids in out
    done: jax.Array  # bool[B] the row stopped or spent its budget; it idles
    tcache: Any  # the target family's decode state (KVCache for dense targets); lengths int32[B] committed
    dcache: Any  # the drafter's context cache (KVCache, lengths = its context length) or None
    bonus: jax.Array  # int32[B] last committed token, at position tcache.lengths (next anchor)
    pending_taps: Any  # [B, bs, k*D] taps of the last verified block, not yet in dcache; or None
    pending_pos: jax.Array  # int32[B, bs] their positions (S = nothing pending: writes dropped)
    accept_lens: jax.Array  # int32[B, out_len] acceptance length (accepted drafts + 1) per iteration
    verify_lens: jax.Array  # int32[B, out_len] block rows the target verified per iteration
    iters: jax.Array  # int32[B] iterations each row took part in
    key: jax.Array  # PRNG key


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
    args = (tparams, dparams, tokens, lengths, max_new, stop_ids, key)
    if spec.mesh is None:
        return _prefill(spec, cache_len, *args)
    row, row2 = rules.logical_to_spec(("batch",)), rules.logical_to_spec(("batch", "time"))
    in_specs = (target_param_specs(spec, tparams), rules.param_specs(dparams), row2, row, row, row2,
                jax.sharding.PartitionSpec())
    return jax.shard_map(functools.partial(_prefill, spec.local(), cache_len), mesh=spec.mesh,
                         in_specs=in_specs, out_specs=state_specs(spec), check_vma=False)(*args)


def target_param_specs(spec: EngineSpec, tparams):
    """The PartitionSpec tree of the target's parameters (its family's partition rules)."""
    return rules.param_specs(tparams, spec.family.param_axes(spec.target))


def state_specs(spec: EngineSpec) -> DecodeState:
    """The PartitionSpec of every field of the loop state on ``spec.mesh``: rows over
    ``data``; the target's decode state by its family's axes, the drafter's cache also by KV
    heads over ``model``; the key replicated."""
    spec_of = rules.logical_to_spec
    row, row2 = spec_of(("batch",)), spec_of(("batch", "time"))
    kv = spec_of(rules.CACHE_AXES)
    cache = KVCache(k=kv, v=kv, lengths=row)
    tstate = jax.tree_util.tree_map(spec_of, spec.family.state_axes(spec.target),
                                    is_leaf=lambda x: isinstance(x, tuple))
    has_drafter = spec.drafter is not None
    return DecodeState(out=row2, n=row, done=row, tcache=tstate, dcache=cache if has_drafter else None,
                       bonus=row, pending_taps=spec_of(("batch", "time", "embed")) if has_drafter else None,
                       pending_pos=row2, accept_lens=row2, verify_lens=row2, iters=row, key=jax.sharding.PartitionSpec())


def _prefill(spec: EngineSpec, cache_len: int, tparams, dparams, tokens, lengths, max_new,
             stop_ids, key) -> DecodeState:
    cfg = spec.target
    B, P = tokens.shape
    dtype = tparams["embed_tokens"]["embedding"].dtype
    key, sub = jax.random.split(key)
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    family = spec.family
    logits, taps, tcache = family.forward(cfg, tparams, tokens, positions,
                                          family.init_state(cfg, B, cache_len, dtype),
                                          tap_layer_ids=spec.tap_layer_ids, logit_index=lengths - 1,
                                          attention_impl=spec.attention_impl, model_axis=spec.tp_axis)
    first = sample_tokens(sub, logits[:, 0], spec.sampling, spec.shards)
    tcache = tcache.rollback(lengths)  # the right padding is not part of the prompt
    bs = spec.block_size
    dcache = pending = None
    if spec.drafter is not None:
        d = spec.drafter
        dcache = KVCache.init(d.num_layers, B, cache_len, d.num_kv_heads, d.head_dim, dtype)
        if dparams is not None:
            dcache = DrafterModel(d, attention_impl=spec.attention_impl, model_axis=spec.tp_axis).apply(
                {"params": dparams}, taps, positions, dcache, lengths,
                method=DrafterModel.project_context)
        pending = jnp.zeros((B, bs, taps.shape[-1]), taps.dtype)
    out = jnp.full((B, spec.out_len), -1, jnp.int32).at[:, 0].set(first)
    n = jnp.ones((B,), jnp.int32)
    return DecodeState(
        out=out, n=n, done=is_stop(first, stop_ids) | (n >= max_new), tcache=tcache,
        dcache=dcache, bonus=first, pending_taps=pending,
        pending_pos=jnp.full((B, bs), cache_len, jnp.int32),  # nothing pending: dropped writes
        accept_lens=jnp.zeros((B, spec.out_len), jnp.int32),
        verify_lens=jnp.zeros((B, spec.out_len), jnp.int32), iters=jnp.zeros((B,), jnp.int32),
        key=key)


# ---------------------------------------------------------------------------- drafting
def dflash_draft(spec: EngineSpec, tparams, dparams, state: DecodeState, key):
    """One DFlash draft of the block ``[bonus, MASK * (bs-1)]`` at ``start = tcache.lengths``.

    First the deferred context update (see :class:`DecodeState`): the last verified block's taps
    enter the drafter cache, whose context length becomes ``start`` (the committed tokens).
    Then the drafter fills the block. With ``num_denoise_steps = s > 1`` it runs s times; after
    each pass but the last, the most confident still-masked rows keep their prediction as input
    to the next pass.

    Returns (draft int32[B, bs-1], draft log-probs float32[B, bs-1, V] or None, drafter cache,
    and for a greedy draft with ``spec.adaptive`` a 4th: float32[B, bs-1] the drafter's
    log-probability of each draft token, the confidence :func:`choose_verify_length` reads (a
    sampled draft's is read from q); a custom ``draft_fn`` with a greedy draft must return it
    too in adaptive mode).
    """
    d, bs, steps = spec.drafter, spec.block_size, spec.num_denoise_steps
    start = state.tcache.lengths
    B = start.shape[0]
    positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
    model = DrafterModel(d, attention_impl=spec.attention_impl, model_axis=spec.tp_axis)
    family, shards = spec.family, spec.shards
    fill = jnp.full((B, bs - 1), d.mask_token_id, jnp.int32)
    filled = jnp.zeros((B, bs - 1), bool)
    dcache = model.apply({"params": dparams}, state.pending_taps, state.pending_pos, state.dcache,
                         start, method=DrafterModel.project_context)
    for step in range(steps):
        block = jnp.concatenate([state.bonus[:, None], fill], axis=1)
        h = model.apply({"params": dparams}, family.embed(tparams, block, spec.tp_axis), positions,
                        dcache, method=DrafterModel.draft)
        logits = family.lm_head(spec.target, tparams, h[:, 1:])
        if step == steps - 1:
            break
        pred = vocab.argmax(logits, shards)
        if shards is not None and shards.vocab_split:  # max log-softmax = max logit - logsumexp
            top = jax.lax.pmax(jnp.max(logits, -1), shards.model_axis) - vocab.logsumexp(logits, shards)
        else:
            top = jnp.max(jax.nn.log_softmax(logits), -1)
        conf = jnp.where(filled, jnp.inf, top)
        rank = jnp.argsort(jnp.argsort(-conf, axis=-1), axis=-1)
        keep = rank < round((bs - 1) * (step + 1) / steps)
        fill = jnp.where(filled, fill, jnp.where(keep, pred, fill))
        filled = filled | keep
    if spec.sampled_draft:
        q_logp = process_logits(logits, spec.sampling, shards)
        draft = vocab.categorical(key, q_logp, shards)
    else:
        q_logp = None
        draft = vocab.argmax(logits, shards)
    draft = jnp.where(filled, fill, draft)
    if not spec.adaptive or q_logp is not None:
        return draft, q_logp, dcache
    logp = vocab.log_softmax(logits.astype(jnp.float32), shards)
    return draft, q_logp, dcache, vocab.take(logp, draft, shards)


# ---------------------------------------------------------------------------- adaptive length
def choose_verify_length(spec: EngineSpec, draft_logp, state: DecodeState, max_new) -> jax.Array:
    """The index into ``spec.verify_lengths`` of this iteration's verify length (one for the
    whole batch, or for a data shard's rows on a mesh).

    The drafter's probabilities stand in for acceptance: the chance that its first k draft
    tokens are all accepted is estimated as ``prod_{i<=k} q(d_i)``, so verifying L rows is
    expected to emit ``1 + sum_{k<L} prod_{i<=k} q(d_i)`` tokens, capped by the row's remaining
    budget (a row about to finish gains nothing from a long block). Summed over the live rows
    and divided by the measured iteration cost at L, it is the expected tokens per second;
    the largest wins (ties: the shorter length).

    Args:
      draft_logp: float32[B, bs-1] the proposer's log-probability of each draft token.
      state: the carry (``n``, ``done``); max_new: int32[B] budgets.
    """
    lengths = jnp.asarray(spec.verify_lengths, jnp.int32)
    B = draft_logp.shape[0]
    reach = jnp.exp(jnp.cumsum(draft_logp.astype(jnp.float32), axis=1))  # P(drafts 1..k accepted)
    prefix = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), jnp.cumsum(reach, axis=1)], axis=1)
    expected = 1.0 + prefix[:, lengths - 1]  # [B, n_lengths] tokens emitted verifying L rows
    expected = jnp.minimum(expected, (max_new - state.n).astype(jnp.float32)[:, None])
    total = jnp.sum(jnp.where(state.done[:, None], 0.0, expected), axis=0)
    return jnp.argmax(total / jnp.asarray(spec.verify_costs, jnp.float32)).astype(jnp.int32)


# ---------------------------------------------------------------------------- acceptance
def accept(spec: EngineSpec, draft, q_logp, logits, key):
    """Decides how many draft tokens the target accepts, and the token it adds after them.

    Args:
      draft: int32[B, bs-1] the drafted tokens of block rows 1..bs-1.
      q_logp: float32[B, bs-1, V] the draft distribution each was sampled from (sampled
        drafts), or None (greedy drafts).
      logits: float32[B, bs, V] the target's logits at the block rows (row i predicts row i+1).
      key: PRNG key.

    Returns:
      (accepted int32[B] in 0..bs-1: the length of the accepted draft prefix,
       bonus int32[B]: the target's token after it; see the rules in the module docstring).
    """
    B, bs, V = logits.shape  # V: the shard's vocabulary slice under tensor parallelism
    shards = spec.shards
    if not spec.sampled_draft:
        # greedy: argmax; sampling with a greedy draft: one independent target sample per row
        choice_BxBs = sample_tokens(key, logits, spec.sampling, shards)
        match = draft == choice_BxBs[:, :-1]
        accepted = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
        return accepted, jnp.take_along_axis(choice_BxBs, accepted[:, None], 1)[:, 0]
    k_u, k_res = jax.random.split(key)
    p_logp = process_logits(logits, spec.sampling, shards)  # [B, bs, V]
    p_d = vocab.take(p_logp[:, :-1], draft, shards)  # [B, bs-1]
    q_d = vocab.take(q_logp, draft, shards)
    u = vocab.uniform(k_u, (B, bs - 1), shards)
    ok = jnp.log(u) < p_d - q_d  # u < p/q  (always when p >= q)
    accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    p_a = jnp.exp(jnp.take_along_axis(p_logp, accepted[:, None, None], 1)[:, 0])  # [B, V]
    q_pad = jnp.concatenate([jnp.exp(q_logp), jnp.zeros((B, 1, V), q_logp.dtype)], axis=1)
    q_a = jnp.take_along_axis(q_pad, accepted[:, None, None], 1)[:, 0]  # zeros after a full block
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = jnp.sum(resid, -1, keepdims=True)
    if shards is not None and shards.vocab_split:
        mass = jax.lax.psum(mass, shards.model_axis)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)
    bonus = vocab.categorical(k_res, jnp.log(resid), shards)
    return accepted, bonus


# ---------------------------------------------------------------------------- verify
def verify(spec: EngineSpec, tparams, block: jax.Array, positions: jax.Array, tcache):
    """The target over the block ``[bonus, draft...]`` (tokens int32[B, T]) at positions
    int32[B, T] = ``tcache.lengths + arange(T)``, one causal pass through its decode state.

    Returns (logits float32[B, T, V]: row i predicts the token after ``block[:, i]``;
    taps [B, T, k*D] of the block rows, None without a drafter; the state holding the whole
    block, ``lengths = positions[:, -1] + 1``, rolled back by :func:`rollback`).
    """
    return spec.family.forward(spec.target, tparams, block, positions, tcache,
                               tap_layer_ids=spec.tap_layer_ids, attention_impl=spec.attention_impl,
                               model_axis=spec.tp_axis)


# ---------------------------------------------------------------------------- rollback
def rollback(state: DecodeState, accepted: jax.Array, tcache):
    """The target's decode state after verify (``tcache``, holding the whole block) rolled back
    to what each row keeps: ``start + accepted + 1`` positions (the anchor and the accepted
    drafts; the bonus, not yet seen by the target, is the next block's anchor), or ``start``
    for a row that was already done. A KV cache sets its length; a recurrent state restores
    the state after the last kept row (``models.cache``)."""
    start = state.tcache.lengths
    return tcache.rollback(jnp.where(state.done, start, start + accepted + 1))


# ---------------------------------------------------------------------------- commit
def commit(spec: EngineSpec, state: DecodeState, draft: jax.Array, accepted: jax.Array,
           bonus: jax.Array, tcache, max_new: jax.Array, stop_ids: jax.Array,
           verified: jax.Array | int | None = None) -> DecodeState:
    """Appends this iteration's tokens to every live row and takes the rolled-back target state.

    A row emits ``draft[:accepted]`` then ``bonus`` (``accepted + 1`` tokens), cut after its
    first stop id and at its budget; it is done when it emitted a stop id or reached
    ``max_new`` tokens. A row that was done changes nothing.

    Args:
      state: the carry before this iteration (``state.tcache.lengths`` = the block's start).
      draft: int32[B, bs-1]; accepted: int32[B] accepted draft tokens; bonus: int32[B].
      tcache: the target's state from :func:`rollback`.
      max_new: int32[B] token budget; stop_ids: int32[B, n_stop] (-1 = none).
      verified: the block rows the target verified this iteration (recorded per iteration;
        default: the block size).
    """
    bs = spec.block_size
    B = bonus.shape[0]
    rows, j = jnp.arange(B), jnp.arange(bs)
    live = ~state.done
    emit_BxBs = jnp.where(j[None] < accepted[:, None], jnp.pad(draft, ((0, 0), (0, 1))), bonus[:, None])
    count = accepted + 1
    stop_at = jnp.where(is_stop(emit_BxBs, stop_ids) & (j[None] < count[:, None]), j[None], bs)
    first_stop = jnp.min(stop_at, axis=1)
    count = jnp.minimum(jnp.minimum(count, first_stop + 1), max_new - state.n)
    write = live[:, None] & (j[None] < count[:, None])
    cols = jnp.where(write, state.n[:, None] + j[None], spec.out_len)  # out_len: dropped
    out = state.out.at[rows[:, None], cols].set(emit_BxBs, mode="drop")
    n = state.n + jnp.where(live, count, 0)
    done = state.done | (live & ((first_stop < bs) & (first_stop < count) | (n >= max_new)))
    at = jnp.where(live, state.iters, spec.out_len)
    accept_lens = state.accept_lens.at[rows, at].set(accepted + 1, mode="drop")
    verify_lens = state.verify_lens.at[rows, at].set(bs if verified is None else verified, mode="drop")
    return state.replace(
        out=out, n=n, done=done, tcache=tcache,
        bonus=jnp.where(live, bonus, state.bonus), accept_lens=accept_lens,
        verify_lens=verify_lens, iters=state.iters + live)


# ---------------------------------------------------------------------------- the loop
def _iteration(spec: EngineSpec, tparams, vparams, dparams, max_new, stop_ids, state: DecodeState):
    """draft -> verify -> accept -> rollback -> commit for every row, then the deferred context
    update.

    ``tparams``: the target's parameters as given (the proposer gets these); ``vparams``: the
    same in the layout verify runs (the family's ``loop_params``)."""
    bs = spec.block_size
    B = state.bonus.shape[0]
    key, k_draft, k_accept = jax.random.split(state.key, 3)
    positions = state.tcache.lengths[:, None] + jnp.arange(bs, dtype=jnp.int32)
    if spec.speculative:
        draft, q_logp, dcache, *conf = (spec.draft_fn or dflash_draft)(spec, tparams, dparams, state, k_draft)
    else:  # autoregressive: the block is the bonus alone
        draft, q_logp, dcache, conf = jnp.zeros((B, 0), jnp.int32), None, state.dcache, ()
    block = jnp.concatenate([state.bonus[:, None], draft], axis=1)
    if spec.adaptive:
        accepted, bonus, taps, tcache, verified = _adaptive_verify(
            spec, vparams, state, block, positions, draft, q_logp, conf, max_new, k_accept)
    else:
        logits, taps, tcache = verify(spec, vparams, block, positions, state.tcache)
        accepted, bonus = accept(spec, draft, q_logp, logits, k_accept)
        tcache = rollback(state, accepted, tcache)
        verified = None
    state = commit(spec, state, draft, accepted, bonus, tcache, max_new, stop_ids, verified)
    # the verified block's taps enter the drafter cache at the next draft (see DecodeState)
    return state.replace(dcache=dcache, pending_taps=taps if spec.drafter is not None else None,
                         pending_pos=positions, key=key)


def _adaptive_verify(spec: EngineSpec, tparams, state: DecodeState, block, positions, draft, q_logp,
                     conf, max_new, key):
    """Verify + accept of the first L block rows, L chosen by :func:`choose_verify_length`
    (one ``lax.switch`` branch per static length). The taps come back padded to the block
    (the rows past L are never committed, so their zeros are never read)."""
    if conf:
        draft_logp = conf[0]
    elif q_logp is not None:  # a sampled draft: q at its own tokens
        draft_logp = vocab.take(q_logp, draft, spec.shards)
    else:
        raise ValueError("block_size='adaptive' chooses the verify length from the proposer's "
                         "confidence: a custom draft_fn with a greedy draft must return a 4th "
                         "value, float32[B, bs-1] log-probabilities of its draft tokens")
    choice = choose_verify_length(spec, draft_logp, state, max_new)
    bs = spec.block_size

    def branch(L):
        def run(operands):
            block, positions, tcache, draft, q_logp = operands
            logits, taps, tcache = verify(spec, tparams, block[:, :L], positions[:, :L], tcache)
            accepted, bonus = accept(spec, draft[:, :L - 1],
                                     None if q_logp is None else q_logp[:, :L - 1], logits, key)
            tcache = rollback(state, accepted, tcache)  # here: the branches' states must agree
            if taps is not None:
                taps = jnp.pad(taps, ((0, 0), (0, bs - L), (0, 0)))
            return accepted, bonus, taps, tcache
        return run

    accepted, bonus, taps, tcache = jax.lax.switch(
        choice, [branch(L) for L in spec.verify_lengths], (block, positions, state.tcache, draft, q_logp))
    return accepted, bonus, taps, tcache, jnp.asarray(spec.verify_lengths, jnp.int32)[choice]


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def decode(tparams, dparams, state: DecodeState, max_new, stop_ids, max_iterations,
           *, spec: EngineSpec) -> DecodeState:
    """Runs iterations until every row is done or ``max_iterations`` (a traced int) ran.

    One call with a large ``max_iterations`` is the whole generation on device; streaming calls
    it repeatedly with a small one and reads the state in between. On a mesh, each data shard
    runs the loop until its own rows are done (the loop's collectives are over ``model`` only).
    """
    args = (tparams, dparams, state, max_new, stop_ids, max_iterations)
    if spec.mesh is None:
        return _decode(spec, *args)
    row, row2 = rules.logical_to_spec(("batch",)), rules.logical_to_spec(("batch", "time"))
    states = state_specs(spec)
    in_specs = (target_param_specs(spec, tparams), rules.param_specs(dparams), states, row, row2,
                jax.sharding.PartitionSpec())
    return jax.shard_map(functools.partial(_decode, spec.local()), mesh=spec.mesh,
                         in_specs=in_specs, out_specs=states, check_vma=False)(*args)


def _decode(spec: EngineSpec, tparams, dparams, state: DecodeState, max_new, stop_ids,
            max_iterations) -> DecodeState:
    vparams = spec.family.loop_params(tparams)  # custom proposers (draft_fn) get them as given

    def cond(carry):
        state, it = carry
        return (it < max_iterations) & ~jnp.all(state.done)

    def body(carry):
        state, it = carry
        return _iteration(spec, tparams, vparams, dparams, max_new, stop_ids, state), it + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state
