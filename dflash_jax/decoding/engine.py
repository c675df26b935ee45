"""The decoding engine: prefill, then one on-device ``lax.while_loop`` of
propose -> verify -> accept -> rollback -> commit (``docs/method.md``, ``docs/proposers.md``).

The engine names no concrete target and no concrete proposer: the target is its family
(``dflash_jax.targets``: forward, decode state, rollback), the proposer an object behind the
interface of ``dflash_jax.proposers`` whose state the loop carries without looking inside.
Autoregressive decoding is the same engine with no proposer and block size 1 (the block is
just the bonus token and verify is one target step), so the baseline and DFlash share every
line of the loop. Rows of a batch advance by their own acceptance lengths: each row has its own
state lengths, positions, stop ids and budget; a finished row idles.

One iteration, one function per step:
  * the proposer's ``propose``: the ``bs - 1`` tokens after the bonus;
  * :func:`verify`: the target over ``[bonus, proposal]``: logits [B, bs, V] and taps;
  * :func:`accept`: the accepted proposal length and the bonus token (the acceptance rule);
  * :func:`rollback`: the target's decode state back to the kept rows (KV: set the length);
  * :func:`commit`: emit the tokens, apply stop ids and budgets;
  * the proposer's ``observe``: the verified block's taps.

Modes, each a named value of :class:`EngineSpec`: no proposer = autoregressive; the acceptance
rule (:data:`MATCH`, :data:`REJECTION`); the verify length (:class:`FixedVerify`, the whole
block; :class:`AdaptiveVerify`, a length per iteration from the proposer's confidence and a
cost table passed in).

Acceptance rules:
  * :data:`MATCH` (greedy proposals): the target samples ``x_i ~ p_i`` at every block row
    (argmax at temperature 0) and the proposal is accepted while it agrees; every emitted token
    is a target sample given the true prefix, so the output has the target's distribution;
  * :data:`REJECTION` (sampled proposals, ``d_{i+1} ~ q_i``): accept with probability
    ``min(1, p_i(d)/q_i(d))``; at the first rejection emit a sample of
    ``normalise(max(p_i - q_i, 0))``; after a full block a sample of ``p_{bs-1}``. Lossless
    for any q.

Multi-device (``EngineSpec.mesh``, ``dflash_jax.parallel``): ``prefill`` and ``decode`` run their
whole body, the ``while_loop`` included, inside one ``shard_map`` over the mesh. Each device
runs the functions above on its rows (``data``) with the shard's configs (``model``: heads, KV
heads, MLP width, vocabulary split; ``expert``: an MoE target's experts split, the rows the
same on every device of the axis; ``parallel.rules``); the only cross-device steps are the
models' psums and the vocabulary reductions the rules are given (``EngineSpec.ops``,
``parallel.vocab.VocabOps``: argmax, log-softmax, values at token ids, sampling with the
single-device random numbers), which exchange numbers per row, never the logits.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax import targets
from dflash_jax.config import TargetConfig
from dflash_jax.decoding import tree as trees
from dflash_jax.decoding.sampling import SamplingParams, process_logits, sample_tokens
from dflash_jax.decoding.tree import TreeVerify
from dflash_jax.nn.tree_attention import TreeAttention
from dflash_jax.nn.cache import put_rows, take_rows
from dflash_jax.parallel import rules, vocab
from dflash_jax.proposers.base import Committed, Proposal, Proposer


# Bumped whenever a change to the loop changes what an iteration costs, so that measured cost
# tables (``decoding.adaptive``) made before it are measured again. 2: the target's weights
# split per layer on CPU (the dense family's ``loop_params``).
LOOP_VERSION = 2

MATCH = "match"
"""Acceptance rule: accept while the proposal equals the target's own choice (argmax at
temperature 0, else an independent sample per row): greedy proposals."""
REJECTION = "rejection"
"""Acceptance rule: rejection sampling against the proposal's distribution: sampled proposals."""
ACCEPTANCE_RULES = (MATCH, REJECTION)


@dataclasses.dataclass(frozen=True)
class FixedVerify:
    """Verify the whole block every iteration (the paper)."""


@dataclasses.dataclass(frozen=True)
class AdaptiveVerify:
    """Verify only the first L block rows per iteration (``decoding.adaptive``): L one of
    ``lengths`` (static, ascending, each <= the block size), chosen by :func:`choose_verify_length`
    from the proposer's confidence and ``costs``, the seconds of an iteration at each length
    (same order; measured by ``costs.cost_table`` or given); one compiled verify branch per
    length (``lax.switch``).

    Per row (``splits`` set; ``decoding.adaptive``): ``lengths`` is (short, long) and each
    iteration verifies the k rows whose drafts promise the most from the long length at the
    long length and the others at the short one, k one of ``splits`` (row counts, ascending,
    0 and the batch included) chosen by :func:`choose_row_split`; ``costs`` are then the
    seconds of an iteration at each split (same order); one compiled branch per split."""

    lengths: tuple[int, ...]
    costs: tuple[float, ...]
    splits: tuple[int, ...] | None = None

    @property
    def per_row(self) -> bool:
        return self.splits is not None


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about one decoding run (a jit cache key).

    proposer: the proposer (``dflash_jax.proposers``), or None: autoregressive decoding.
    acceptance: the acceptance rule, :data:`MATCH` or :data:`REJECTION` (a sampled proposer's).
    verify: :class:`FixedVerify`, :class:`AdaptiveVerify` or ``decoding.tree.TreeVerify`` (a
      tree of ``nodes`` drafts per iteration from the proposer's ``propose_tree``, depth up to
      ``block_size - 1``; :func:`_tree_iteration`).
    mesh: a ``(data, model)`` or ``(data, expert, model)`` device mesh (``parallel.make_mesh``)
      to run on, or None (one device). Inside the sharded program the functions see
      :meth:`local` specs: ``mesh`` None, ``shards`` set, the configs of one model (and
      expert) shard and ``expert_axis`` set when the target's experts are split.
    """

    target: TargetConfig
    proposer: Proposer | None
    block_size: int
    sampling: SamplingParams
    acceptance: str = MATCH
    verify: FixedVerify | AdaptiveVerify | TreeVerify = FixedVerify()
    out_len: int = 64
    attention_impl: str = "xla"
    mesh: Any = None
    shards: vocab.Shards | None = None
    expert_axis: str | None = None

    def __post_init__(self):
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {self.acceptance!r}")
        if (self.proposer is None) != (self.block_size == 1):
            raise ValueError(f"block_size={self.block_size} with proposer {self.proposer!r}: "
                             "autoregressive decoding is block size 1 without a proposer")
        if self.tree:
            self._check_tree()

    def _check_tree(self):
        """Raises ValueError when this run cannot verify trees (the reason named)."""
        if self.proposer is None:
            raise ValueError("tree verification needs a proposer (a drafter): autoregressive "
                             "decoding has no drafts")
        refusal = self.family.tree_refusal
        if refusal is not None:
            raise ValueError(f"the {self.target.model_type!r} target cannot verify a tree of "
                             f"drafts: {refusal}")
        if self.acceptance != MATCH:
            raise ValueError("a tree's siblings are the proposer's top-k tokens (deterministic "
                             "drafts): use a greedy-draft proposer (sampled_draft=False)")

    @property
    def tree(self) -> bool:
        """Whether each iteration verifies a tree of drafts (``decoding.tree``)."""
        return isinstance(self.verify, TreeVerify)

    @property
    def adaptive(self) -> bool:
        """Whether each iteration chooses its verify length."""
        return isinstance(self.verify, AdaptiveVerify)

    @property
    def tp_axis(self) -> str | None:
        """The mesh axis of the models' tensor-parallel psums (None: not split)."""
        return self.shards.tp_axis if self.shards is not None else None

    @property
    def target_axes(self) -> dict:
        """The mesh-axis keywords of the target family's forward: ``model_axis``, and
        ``expert_axis`` only when experts are split (a family without experts never sees it)."""
        axes = {"model_axis": self.tp_axis}
        if self.expert_axis is not None:
            axes["expert_axis"] = self.expert_axis
        return axes

    @property
    def ops(self) -> vocab.VocabOps:
        """The vocabulary reductions the sampling filters and acceptance rules are given."""
        return vocab.VocabOps(self.shards)

    def local(self) -> "EngineSpec":
        """The spec one device runs inside ``shard_map`` over ``self.mesh``."""
        sizes = rules.mesh_axis_sizes(self.mesh)
        m, e = sizes[rules.MODEL], rules.expert_size(self.mesh)
        return dataclasses.replace(
            self, mesh=None, shards=vocab.Shards(sizes[rules.DATA], m),
            target=rules.local_config(self.target, m, e), expert_axis=rules.expert_axis(self.mesh),
            proposer=self.proposer.local(m) if self.proposer is not None else None)

    @property
    def family(self):
        """The target's family (``dflash_jax.targets``): its forward, decode state, rules."""
        return targets.family_of(self.target)

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.proposer.tap_layer_ids if self.proposer is not None else ()

    @property
    def speculative(self) -> bool:
        return self.block_size > 1


@flax.struct.dataclass
class DecodeState:
    """The loop carry. B rows."""

    out: jax.Array  # int32[B, out_len] generated ids (-1 = none yet)
    n: jax.Array  # int32[B] number of ids in out
    done: jax.Array  # bool[B] the row stopped or spent its budget; it idles
    tcache: Any  # the target family's decode state (KVCache for dense targets); lengths int32[B] committed
    bonus: jax.Array  # int32[B] last committed token, at position tcache.lengths (next anchor)
    proposer: Any  # the proposer's own state (opaque here), None without a proposer
    accept_lens: jax.Array  # int32[B, out_len] acceptance length (accepted drafts + 1) per iteration
    verify_lens: jax.Array  # int32[B, out_len] block rows the target verified per iteration
    iters: jax.Array  # int32[B] iterations each row took part in
    key: jax.Array  # PRNG key


def is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """bool[...]: tokens[B, ...] is one of its row's stop ids (stop_ids int32[B, S], -1 = none)."""
    t = tokens.reshape(tokens.shape[0], -1, 1)
    hit = jnp.any((t == stop_ids[:, None, :]) & (stop_ids[:, None, :] >= 0), axis=-1)
    return hit.reshape(tokens.shape)


def committed(state: DecodeState) -> Committed:
    """What a proposer is told about the sequence in loop state ``state`` (``proposers.base``)."""
    return Committed(state.bonus, state.tcache.lengths, state.tcache, state.out, state.n)


def _axes_to_specs(axes):
    return jax.tree_util.tree_map(rules.logical_to_spec, axes, is_leaf=lambda x: isinstance(x, tuple))


# ---------------------------------------------------------------------------- prefill
@functools.partial(jax.jit, static_argnames=("spec", "cache_len"))
def prefill(tparams, pparams, tokens, lengths, max_new, stop_ids, key, *, spec: EngineSpec,
            cache_len: int) -> DecodeState:
    """Target over the right-padded prompts (tokens int32[B, P], lengths int32[B]); first token
    sampled at each row's last prompt position; the proposer set up from the prompt's taps
    (``pparams``: its parameters)."""
    args = (tparams, pparams, tokens, lengths, max_new, stop_ids, key)
    if spec.mesh is None:
        return _prefill(spec, cache_len, *args)
    row, row2 = rules.logical_to_spec(("batch",)), rules.logical_to_spec(("batch", "time"))
    in_specs = (target_param_specs(spec, tparams), rules.param_specs(pparams), row2, row, row, row2,
                jax.sharding.PartitionSpec())
    return jax.shard_map(functools.partial(_prefill, spec.local(), cache_len), mesh=spec.mesh,
                         in_specs=in_specs, out_specs=state_specs(spec), check_vma=False)(*args)


def target_param_specs(spec: EngineSpec, tparams):
    """The PartitionSpec tree of the target's parameters (its family's partition rules)."""
    return rules.param_specs(tparams, spec.family.param_axes(spec.target), mesh=spec.mesh)


def state_specs(spec: EngineSpec) -> DecodeState:
    """The PartitionSpec of every field of the loop state on ``spec.mesh``: rows over
    ``data``; the target's decode state by its family's axes, the proposer's by its own; the
    key replicated."""
    row, row2 = rules.logical_to_spec(("batch",)), rules.logical_to_spec(("batch", "time"))
    proposer = _axes_to_specs(spec.proposer.state_axes()) if spec.proposer is not None else None
    return DecodeState(out=row2, n=row, done=row, tcache=_axes_to_specs(spec.family.state_axes(spec.target)),
                       bonus=row, proposer=proposer, accept_lens=row2, verify_lens=row2, iters=row,
                       key=jax.sharding.PartitionSpec())


def _prefill(spec: EngineSpec, cache_len: int, tparams, pparams, tokens, lengths, max_new,
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
                                          attention_impl=spec.attention_impl, **spec.target_axes)
    first = sample_tokens(sub, logits[:, 0], spec.sampling, spec.ops)
    tcache = tcache.rollback(lengths)  # the right padding is not part of the prompt
    pstate = None
    if spec.proposer is not None:
        pstate = spec.proposer.init(spec, pparams, taps, positions, lengths, cache_len, dtype,
                                    tokens=tokens, tparams=tparams)
    out = jnp.full((B, spec.out_len), -1, jnp.int32).at[:, 0].set(first)
    n = jnp.ones((B,), jnp.int32)
    return DecodeState(
        out=out, n=n, done=is_stop(first, stop_ids) | (n >= max_new), tcache=tcache,
        bonus=first, proposer=pstate, accept_lens=jnp.zeros((B, spec.out_len), jnp.int32),
        verify_lens=jnp.zeros((B, spec.out_len), jnp.int32), iters=jnp.zeros((B,), jnp.int32),
        key=key)


# ---------------------------------------------------------------------------- adaptive length
def expected_tokens(lengths, draft_logp, state: DecodeState, max_new) -> jax.Array:
    """float32[B, len(lengths)]: the tokens each row is expected to emit when its first L block
    rows are verified, for each L of ``lengths`` (:func:`choose_verify_length`), capped by its
    remaining budget; 0 for a row that is done."""
    lengths = jnp.asarray(lengths, jnp.int32)
    B = draft_logp.shape[0]
    reach = jnp.exp(jnp.cumsum(draft_logp.astype(jnp.float32), axis=1))  # P(drafts 1..k accepted)
    prefix = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), jnp.cumsum(reach, axis=1)], axis=1)
    expected = 1.0 + prefix[:, lengths - 1]  # [B, n_lengths] tokens emitted verifying L rows
    expected = jnp.minimum(expected, (max_new - state.n).astype(jnp.float32)[:, None])
    return jnp.where(state.done[:, None], 0.0, expected)


def choose_verify_length(policy: AdaptiveVerify, draft_logp, state: DecodeState, max_new) -> jax.Array:
    """The index into ``policy.lengths`` of this iteration's verify length (one for the
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
    total = jnp.sum(expected_tokens(policy.lengths, draft_logp, state, max_new), axis=0)
    return jnp.argmax(total / jnp.asarray(policy.costs, jnp.float32)).astype(jnp.int32)


def choose_row_split(policy: AdaptiveVerify, draft_logp, state: DecodeState, max_new):
    """Per-row verification (``policy.splits``): which rows verify the long length.

    Each row's gain from the long length over the short one is its expected tokens at the long
    length less those at the short (:func:`expected_tokens`; 0 for a done row). The rows are
    ordered by gain, largest first (ties: the lower row index); at split k the first k verify
    long, the rest short, and the batch expects ``sum(short) + the k largest gains`` tokens.
    Divided by the measured cost of an iteration at that split, the largest wins (ties: the
    smaller split).

    Returns (index into ``policy.splits`` int32[], order int32[B]: the rows by gain)."""
    e = expected_tokens(policy.lengths, draft_logp, state, max_new)  # [B, 2]
    gain = e[:, 1] - e[:, 0]
    order = jnp.argsort(-gain, stable=True).astype(jnp.int32)
    top = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(gain[order])])  # [B + 1]
    total = jnp.sum(e[:, 0]) + top[jnp.asarray(policy.splits, jnp.int32)]
    return jnp.argmax(total / jnp.asarray(policy.costs, jnp.float32)).astype(jnp.int32), order


# ---------------------------------------------------------------------------- acceptance
def accept(rule: str, sampling: SamplingParams, draft, q_logp, logits, key,
           ops: vocab.VocabOps = vocab.LOCAL):
    """Decides how many draft tokens the target accepts, and the token it adds after them.

    Args:
      rule: :data:`MATCH` or :data:`REJECTION` (module docstring).
      sampling: the target's sampling (temperature, top-k, top-p).
      draft: int32[B, bs-1] the drafted tokens of block rows 1..bs-1.
      q_logp: float32[B, bs-1, V] the draft distribution each was sampled from (REJECTION).
      logits: float32[B, bs, V] the target's logits at the block rows (row i predicts row i+1).
      key: PRNG key.
      ops: the vocabulary reductions (``parallel.vocab.VocabOps``; V is then the shard's slice).

    Returns:
      (accepted int32[B] in 0..bs-1: the length of the accepted draft prefix,
       bonus int32[B]: the target's token after it; see the rules in the module docstring).
    """
    B, bs, V = logits.shape  # V: the shard's vocabulary slice under tensor parallelism
    if rule == MATCH:
        # greedy: argmax; sampling with a greedy draft: one independent target sample per row
        choice_BxBs = sample_tokens(key, logits, sampling, ops)
        match = draft == choice_BxBs[:, :-1]
        accepted = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
        return accepted, jnp.take_along_axis(choice_BxBs, accepted[:, None], 1)[:, 0]
    if q_logp is None:
        raise ValueError("the rejection rule needs the proposal's distribution (q_logp): a "
                         "sampled proposer returns it")
    k_u, k_res = jax.random.split(key)
    p_logp = process_logits(logits, sampling, ops)  # [B, bs, V]
    p_d = ops.take(p_logp[:, :-1], draft)  # [B, bs-1]
    q_d = ops.take(q_logp, draft)
    u = ops.uniform(k_u, (B, bs - 1))
    ok = jnp.log(u) < p_d - q_d  # u < p/q  (always when p >= q)
    accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    p_a = jnp.exp(jnp.take_along_axis(p_logp, accepted[:, None, None], 1)[:, 0])  # [B, V]
    q_pad = jnp.concatenate([jnp.exp(q_logp), jnp.zeros((B, 1, V), q_logp.dtype)], axis=1)
    q_a = jnp.take_along_axis(q_pad, accepted[:, None, None], 1)[:, 0]  # zeros after a full block
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = ops.sum(resid, keepdims=True)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)
    bonus = ops.categorical(k_res, jnp.log(resid))
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
                               **spec.target_axes)


def verify_tree(spec: EngineSpec, tparams, tree: trees.Tree, mask: jax.Array, tcache):
    """The target over the N nodes of ``tree`` in one pass (``docs/trees.md``): node i written
    to slot ``tcache.lengths + i``, rotated to ``tcache.lengths + depth[i]``, seeing the
    committed slots and its ancestors' (``mask``: ``decoding.tree.ancestor_mask``). Returns
    what :func:`verify` returns for a block of N rows."""
    start = tcache.lengths[:, None]
    slots = start + jnp.arange(tree.nodes, dtype=jnp.int32)
    return spec.family.forward(spec.target, tparams, tree.tokens, slots, tcache,
                               tap_layer_ids=spec.tap_layer_ids, attention_impl=spec.attention_impl,
                               tree=TreeAttention(start + tree.depth, mask), **spec.target_axes)


# ---------------------------------------------------------------------------- rollback
def rollback(state: DecodeState, accepted: jax.Array, tcache, done=None, start=None):
    """The target's decode state after verify (``tcache``, holding the whole block) rolled back
    to what each row keeps: ``start + accepted + 1`` positions (the anchor and the accepted
    drafts; the bonus, not yet seen by the target, is the next block's anchor), or ``start``
    for a row that was already done. A KV cache sets its length; a recurrent state restores
    the state after the last kept row (``nn.cache``). ``done`` / ``start`` (bool / int32[R]):
    a group of rows' own, instead of ``state.done`` and ``state.tcache.lengths``."""
    done = state.done if done is None else done
    start = state.tcache.lengths if start is None else start
    return tcache.rollback(jnp.where(done, start, start + accepted + 1))


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
def _iteration(spec: EngineSpec, tparams, vparams, pparams, max_new, stop_ids, state: DecodeState):
    """propose -> verify -> accept -> rollback -> commit for every row, then the proposer
    observes the verified block.

    ``tparams``: the target's parameters as given (the proposer gets these); ``vparams``: the
    same in the layout verify runs (the family's ``loop_params``)."""
    bs = spec.block_size
    B = state.bonus.shape[0]
    key, k_draft, k_accept = jax.random.split(state.key, 3)
    if spec.tree:
        return _tree_iteration(spec, tparams, vparams, pparams, max_new, stop_ids, state, k_draft,
                               k_accept).replace(key=key)
    positions = state.tcache.lengths[:, None] + jnp.arange(bs, dtype=jnp.int32)
    pstate = state.proposer
    if spec.proposer is not None:
        proposal, pstate = spec.proposer.propose(spec, tparams, pparams, pstate, committed(state), k_draft,
                                                 want_logp=spec.adaptive)
    else:  # autoregressive: the block is the bonus alone
        proposal = Proposal(jnp.zeros((B, 0), jnp.int32))
    draft = proposal.tokens
    block = jnp.concatenate([state.bonus[:, None], draft], axis=1)
    if spec.adaptive:
        accepted, bonus, taps, tcache, verified = _adaptive_verify(
            spec, vparams, state, block, positions, proposal, max_new, k_accept)
    else:
        logits, taps, tcache = verify(spec, vparams, block, positions, state.tcache)
        accepted, bonus = accept(spec.acceptance, spec.sampling, draft, proposal.q_logp, logits,
                                 k_accept, spec.ops)
        tcache = rollback(state, accepted, tcache)
        verified = bs
    state = commit(spec, state, draft, accepted, bonus, tcache, max_new, stop_ids, verified)
    if spec.proposer is not None:
        pstate = spec.proposer.observe(spec, pparams, pstate, taps, positions)
    return state.replace(proposer=pstate, key=key)


def _tree_iteration(spec: EngineSpec, tparams, vparams, pparams, max_new, stop_ids,
                    state: DecodeState, k_draft, k_accept) -> DecodeState:
    """One iteration with a tree of drafts (``decoding.tree``, ``docs/trees.md``): the
    proposer's tree of N nodes; the target over all of them in one pass, node i in slot
    ``start + i`` at RoPE position ``start + depth[i]``, seeing the committed slots and its
    ancestors; the accepted root path (greedy: :func:`decoding.tree.accept_greedy`; T > 0:
    ``decoding.tree_sampling.accept_sampled``); its nodes' K/V moved to slots ``start ..
    start + accepted`` (``compact``), the state rolled back after them; the path's tokens
    committed as a chain's accepted drafts; the proposer observes the path's taps in order."""
    policy, bs = spec.verify, spec.block_size
    N = policy.nodes
    start = state.tcache.lengths
    tree, pstate = spec.proposer.propose_tree(spec, tparams, pparams, state.proposer,
                                              committed(state), k_draft, policy)
    if tree.tokens.shape != (start.shape[0], N):
        raise ValueError(f"{type(spec.proposer).__name__}.propose_tree returned a tree of shape "
                         f"{tree.tokens.shape}; the policy asks for [{start.shape[0]}, {N}]")
    mask = trees.ancestor_mask(tree, bs - 1)
    logits, taps, tcache = verify_tree(spec, vparams, tree, mask, state.tcache)
    if spec.sampling.greedy:
        last, accepted, bonus = trees.accept_greedy(tree, mask, logits, spec.ops)
    else:
        from dflash_jax.decoding import tree_sampling

        last, accepted, bonus = tree_sampling.accept_sampled(tree, mask, logits, spec.sampling,
                                                             k_accept, spec.ops)
    path = trees.path_nodes(mask, tree.depth, last, bs)  # [B, bs]: root, then the accepted nodes
    tcache = rollback(state, accepted, tcache.compact(start, path))
    draft = jnp.take_along_axis(tree.tokens, path[:, 1:], axis=1)
    state = commit(spec, state, draft, accepted, bonus, tcache, max_new, stop_ids, N)
    if taps is not None:
        taps = jnp.take_along_axis(taps, path[:, :, None], axis=1)
    pstate = spec.proposer.observe(spec, pparams, pstate, taps,
                                   start[:, None] + jnp.arange(bs, dtype=jnp.int32))
    return state.replace(proposer=pstate)


def _verify_rows(spec: EngineSpec, tparams, block, positions, tcache, draft, q_logp, done, key):
    """Verify + accept + rollback of a block of L rows (``block`` int32[R, L], ``positions``,
    ``draft`` int32[R, L-1], ``q_logp`` or None, ``done`` bool[R]) for R rows whose decode
    state is ``tcache``. Returns (accepted int32[R], bonus int32[R], taps [R, bs, k*D] padded
    to the block with zeros (rows past L are never committed, so never read) or None, the
    rolled-back state)."""
    L = block.shape[1]
    start = tcache.lengths
    logits, taps, tcache = verify(spec, tparams, block, positions, tcache)
    accepted, bonus = accept(spec.acceptance, spec.sampling, draft, q_logp, logits, key, spec.ops)
    tcache = rollback(None, accepted, tcache, done, start)
    if taps is not None:
        taps = jnp.pad(taps, ((0, 0), (0, spec.block_size - L), (0, 0)))
    return accepted, bonus, taps, tcache


def _adaptive_verify(spec: EngineSpec, tparams, state: DecodeState, block, positions,
                     proposal: Proposal, max_new, key):
    """Verify + accept + rollback with the verify length chosen per iteration: the first L
    block rows of every row, L chosen by :func:`choose_verify_length` (one ``lax.switch``
    branch per static length), or, per row (``policy.splits``), the rows split into a long
    and a short group by :func:`choose_row_split` (one branch per split; a group's rows are
    taken out of the decode state, verified, and put back: ``nn.cache.take_rows``). Returns
    (accepted, bonus, taps, the rolled-back state, the rows verified: int32[] or int32[B])."""
    if proposal.logp is None:
        raise ValueError("the adaptive verify length is chosen from the proposer's confidence: "
                         "its propose(..., want_logp=True) must return Proposal.logp")
    policy = spec.verify
    B = block.shape[0]
    operands = (block, positions, state.tcache, proposal.tokens, proposal.q_logp)

    def group(operands, L, rows=None, k=key):
        block, positions, tcache, draft, q_logp = operands
        done = state.done
        if rows is not None:
            take = lambda x: None if x is None else jnp.take(x, rows, axis=0)
            block, positions, draft, q_logp, done = map(take, (block, positions, draft, q_logp, done))
            tcache = take_rows(tcache, rows, B)
        return _verify_rows(spec, tparams, block[:, :L], positions[:, :L], tcache, draft[:, :L - 1],
                            None if q_logp is None else q_logp[:, :L - 1], done, k)

    if not policy.per_row:
        choice = choose_verify_length(policy, proposal.logp, state, max_new)
        accepted, bonus, taps, tcache = jax.lax.switch(
            choice, [functools.partial(group, L=L) for L in policy.lengths], operands)
        return accepted, bonus, taps, tcache, jnp.asarray(policy.lengths, jnp.int32)[choice]

    short, long = policy.lengths
    choice, order = choose_row_split(policy, proposal.logp, state, max_new)

    def split(k):
        def run(operands):
            if k in (0, B):  # one group: the batch-wide verify at one length
                L = long if k else short
                return (*group(operands, L), jnp.full((B,), L, jnp.int32))
            k_long, k_short = jax.random.split(key)
            rows = (order[:k], order[k:])
            parts = (group(operands, long, rows[0], k_long), group(operands, short, rows[1], k_short))
            merge = lambda i: jnp.zeros((B,) + parts[0][i].shape[1:], parts[0][i].dtype) \
                .at[rows[0]].set(parts[0][i]).at[rows[1]].set(parts[1][i])
            taps = None if parts[0][2] is None else merge(2)
            slots = lambda i, L: jnp.take(operands[1], rows[i], axis=0)[:, :L]  # the K/V slots a group wrote
            tcache = put_rows(put_rows(operands[2], rows[0], parts[0][3], B, slots(0, long)),
                              rows[1], parts[1][3], B, slots(1, short))
            verified = jnp.full((B,), short, jnp.int32).at[rows[0]].set(long)
            return merge(0), merge(1), taps, tcache, verified
        return run

    return jax.lax.switch(choice, [split(k) for k in policy.splits], operands)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def decode(tparams, pparams, state: DecodeState, max_new, stop_ids, max_iterations,
           *, spec: EngineSpec) -> DecodeState:
    """Runs iterations until every row is done or ``max_iterations`` (a traced int) ran.

    One call with a large ``max_iterations`` is the whole generation on device; streaming calls
    it repeatedly with a small one and reads the state in between. On a mesh, each data shard
    runs the loop until its own rows are done (the loop's collectives are over ``model``, and
    ``expert`` for an MoE target, whose devices all hold the same rows).
    ``pparams``: the proposer's parameters.
    """
    args = (tparams, pparams, state, max_new, stop_ids, max_iterations)
    if spec.mesh is None:
        return _decode(spec, *args)
    row, row2 = rules.logical_to_spec(("batch",)), rules.logical_to_spec(("batch", "time"))
    states = state_specs(spec)
    in_specs = (target_param_specs(spec, tparams), rules.param_specs(pparams), states, row, row2,
                jax.sharding.PartitionSpec())
    return jax.shard_map(functools.partial(_decode, spec.local()), mesh=spec.mesh,
                         in_specs=in_specs, out_specs=states, check_vma=False)(*args)


def _decode(spec: EngineSpec, tparams, pparams, state: DecodeState, max_new, stop_ids,
            max_iterations) -> DecodeState:
    vparams = spec.family.loop_params(tparams)  # proposers get the parameters as given

    def cond(carry):
        state, it = carry
        return (it < max_iterations) & ~jnp.all(state.done)

    def body(carry):
        state, it = carry
        return _iteration(spec, tparams, vparams, pparams, max_new, stop_ids, state), it + 1

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state
