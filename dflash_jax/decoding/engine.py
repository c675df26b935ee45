"""The decoding engine: prefill, then one on-device ``lax.while_loop`` of iterations
(``docs/method.md``, ``docs/methods.md``).

The engine names no concrete target, proposer or verify policy: the target is its family
(``dflash_jax.targets``: forward, decode state, rollback), the proposer an object behind the
interface of ``dflash_jax.proposers`` whose state the loop carries without looking inside, the
verify policy an object behind ``verification.policy.VerifyPolicy``. Autoregressive decoding is
the same engine with no proposer and block size 1 (the block is just the bonus token and
verify is one target step), so the baseline and DFlash share every line of the loop. Rows of a
batch advance by their own acceptance lengths: each row has its own state lengths, positions,
stop ids and budget; a finished row idles.

One iteration:
  * the policy's ``step``: the proposer's drafts (a chain or a tree), the target over them, the
    acceptance rule (``verification.acceptance``), the target's decode state rolled back to
    what each row keeps; it returns the kept path as a chain (``verification.policy.Verified``);
  * :func:`commit`: emit the tokens, apply stop ids and budgets;
  * the proposer's ``observe``: the taps of the kept path.

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
from dflash_jax.parallel import rules, vocab
from dflash_jax.proposers.base import Committed, Proposer
from dflash_jax.verification.acceptance import ACCEPTANCE_RULES, MATCH
from dflash_jax.verification.policy import FixedVerify, VerifyPolicy
from dflash_jax.verification.sampling import SamplingParams, sample_tokens


# Bumped whenever a change to the loop changes what an iteration costs, so that measured cost
# tables (``verification.adaptive``) made before it are measured again. 2: the target's weights
# split per layer on CPU (the dense family's ``loop_params``).
LOOP_VERSION = 2

@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about one decoding run (a jit cache key).

    proposer: the proposer (``dflash_jax.proposers``), or None: autoregressive decoding.
    acceptance: the chain acceptance rule (``verification.acceptance``): ``MATCH`` or
      ``REJECTION`` (a sampled proposer's).
    verify: the verify policy (``verification.policy.VerifyPolicy``): ``FixedVerify`` (the
      default), ``verification.adaptive.AdaptiveVerify`` or ``verification.tree.TreeVerify``.
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
    verify: VerifyPolicy = FixedVerify()
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
        if not isinstance(self.verify, VerifyPolicy):
            raise ValueError(f"verify must be a verify policy (verification.policy.VerifyPolicy), "
                             f"got {self.verify!r}")
        self.verify.check(self)

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
      tcache: the target's state rolled back to what each row keeps (the policy's step).
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
    """One iteration for every row: the policy's step (propose, verify, accept, roll back),
    :func:`commit`, then the proposer observes the kept path.

    ``tparams``: the target's parameters as given (the proposer gets these); ``vparams``: the
    same in the layout verify runs (the family's ``loop_params``)."""
    key, k_draft, k_accept = jax.random.split(state.key, 3)
    step = spec.verify.step(spec, tparams, vparams, pparams, state, committed(state), max_new,
                            k_draft, k_accept)
    state = commit(spec, state, step.draft, step.accepted, step.bonus, step.tcache, max_new,
                   stop_ids, step.verified)
    pstate = step.proposer
    if spec.proposer is not None:
        pstate = spec.proposer.observe(spec, pparams, pstate, step.taps, step.positions)
    return state.replace(proposer=pstate, key=key)


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
