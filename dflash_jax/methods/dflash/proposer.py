"""The DFlash proposer: a block-diffusion drafter conditioned on the target's features
(``models.drafter``; ``docs/method.md``).

State: the drafter's context cache (per layer, the K/V of the projected target features of the
committed positions) and the last verified block's taps, not yet in that cache (the deferred
context update below).

Deferred context update: the drafter's context is the target's features of the committed
tokens, but verify produces them for the whole block before acceptance knows how many rows will
be committed. So :meth:`DFlashProposer.observe` keeps the verified block's taps, and the next
:meth:`~DFlashProposer.propose` writes them into the context cache with context length = the
committed length, which makes the rows past the accepted ones invisible (they are overwritten
by a later block before they are read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.verification.sampling import process_logits
from dflash_jax.verification.tree import Tree, best_first_tree
from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import DrafterModel, block_embedding, draft_logits
from dflash_jax.nn.partitioning import CACHE_AXES
from dflash_jax.parallel import rules
from dflash_jax.proposers.base import Committed, Proposal, Proposer


@flax.struct.dataclass
class DFlashState:
    """B rows, bs = block size, k*D = width of the target's taps."""

    cache: KVCache  # the drafter's context cache; lengths = its context length
    pending_taps: jax.Array  # [B, bs, k*D] taps of the last verified block, not yet in the cache
    pending_pos: jax.Array  # int32[B, bs] their positions (S = nothing pending: writes dropped)


@dataclasses.dataclass(frozen=True)
class DFlashProposer(Proposer):
    """config: the drafter (released layout). num_denoise_steps: drafter passes per block (1 in
    the paper; with s > 1 the most confident still-masked rows keep their prediction as input
    to the next pass). sample: draw the proposal from the drafter's distribution (with the
    target's temperature / top-k / top-p) instead of its argmax."""

    config: DrafterConfig
    num_denoise_steps: int = 1
    sample: bool = False

    @property
    def sampled(self) -> bool:
        return self.sample

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    def model(self, spec) -> DrafterModel:
        return DrafterModel(self.config, attention_impl=spec.attention_impl, model_axis=spec.tp_axis)

    def init(self, spec, params, taps, positions, lengths, cache_len, dtype, *, tokens=None,
             tparams=None) -> DFlashState:
        """The prompt's taps projected into a fresh context cache (context length = ``lengths``)."""
        d, B = self.config, taps.shape[0]
        cache = KVCache.init(d.num_layers, B, cache_len, d.num_kv_heads, d.head_dim, dtype)
        if params is not None:  # None: shape-only uses (compile reports)
            cache = self.model(spec).apply({"params": params}, taps, positions, cache, lengths,
                                           method=DrafterModel.project_context)
        bs = spec.block_size
        return DFlashState(cache, jnp.zeros((B, bs, taps.shape[-1]), taps.dtype),
                           jnp.full((B, bs), cache_len, jnp.int32))  # nothing pending: dropped writes

    def propose(self, spec, tparams, params, state: DFlashState, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, DFlashState]:
        """The deferred context update, then the drafter over ``[bonus, MASK * (bs-1)]`` at
        ``start .. start+bs-1``: argmax (or, sampled, a draw) at rows 1..bs-1."""
        logits, fill, filled, state, _ = self._draft(spec, tparams, params, state, committed)
        ops = spec.ops
        if self.sample:
            q_logp = process_logits(logits, spec.sampling, ops)
            draft = jnp.where(filled, fill, ops.categorical(key, q_logp))
            # the confidence may not read the drawn tokens (``Proposal.logp``): q's self-agreement
            logp = jnp.log(ops.sum(jnp.exp(2.0 * q_logp))) if want_logp else None
            return Proposal(draft, q_logp, logp), state
        draft = jnp.where(filled, fill, ops.argmax(logits))
        logp = ops.take(ops.log_softmax(logits.astype(jnp.float32)), draft) if want_logp else None
        return Proposal(draft, None, logp), state

    def propose_tree(self, spec, tparams, params, state: DFlashState, committed: Committed, key,
                     policy) -> tuple[Tree, DFlashState]:
        """The drafter's one pass as for :meth:`propose`, then the best-first tree of
        ``policy.nodes`` nodes over its distributions at block rows 1..bs-1 (depths 1..bs-1;
        ``verification.tree.best_first_tree``): the ``policy.topk`` most likely tokens per depth,
        grown by the product of the drafter's probabilities along the path."""
        if self.sample:
            raise ValueError("trees are drafted from the drafter's top-k tokens (deterministic "
                             "drafts): use the greedy draft (sampled_draft=False) with a tree")
        if self.num_denoise_steps != 1:
            raise ValueError("trees are drafted from one drafter pass: num_denoise_steps must be 1 "
                             f"with a tree (got {self.num_denoise_steps})")
        logits, _, _, state, _ = self._draft(spec, tparams, params, state, committed)
        # with the vocabulary split over the mesh's model axis each depth's top-k is exchanged
        # as k values and ids per shard (parallel.vocab.top_k), never the logits
        return best_first_tree(committed.bonus, logits, policy.nodes, policy.topk, spec.ops), state

    def _draft(self, spec, tparams, params, state: DFlashState, committed: Committed):
        """The deferred context update and the drafter's passes: (logits [B, bs-1, V] of the
        last pass, the tokens fixed by earlier passes and where (multi-step), state, the last
        pass's hidden states [B, bs-1, D] at the drafted rows)."""
        d, bs, steps = self.config, spec.block_size, self.num_denoise_steps
        start = committed.start
        B = start.shape[0]
        positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
        model, family, ops = self.model(spec), spec.family, spec.ops
        fill = jnp.full((B, bs - 1), d.mask_token_id, jnp.int32)
        filled = jnp.zeros((B, bs - 1), bool)
        cache = model.apply({"params": params}, state.pending_taps, state.pending_pos, state.cache,
                            start, method=DrafterModel.project_context)
        for step in range(steps):
            block = jnp.concatenate([committed.bonus[:, None], fill], axis=1)
            h = model.apply({"params": params}, block_embedding(d, family, tparams, block, spec.tp_axis),
                            positions, cache, method=DrafterModel.draft)
            logits = draft_logits(d, family, spec.target, tparams, h[:, 1:])
            if step == steps - 1:
                break
            pred = ops.argmax(logits)
            top = ops.max(ops.log_softmax(logits))  # each row's top log-probability
            conf = jnp.where(filled, jnp.inf, top)
            rank = jnp.argsort(jnp.argsort(-conf, axis=-1), axis=-1)
            keep = rank < round((bs - 1) * (step + 1) / steps)
            fill = jnp.where(filled, fill, jnp.where(keep, pred, fill))
            filled = filled | keep
        return logits, fill, filled, state.replace(cache=cache), h[:, 1:]

    def observe(self, spec, params, state: DFlashState, taps, positions) -> DFlashState:
        """The verified block's taps wait for the next :meth:`propose` (module docstring); a
        block shorter than the state's (adaptive verify lengths) is padded (its rows past the
        verified ones are never committed, so never read)."""
        T = state.pending_taps.shape[1]
        if taps.shape[1] < T:
            taps = jnp.pad(taps, ((0, 0), (0, T - taps.shape[1]), (0, 0)))
        return state.replace(pending_taps=taps.astype(state.pending_taps.dtype), pending_pos=positions)

    def state_axes(self) -> Any:
        return DFlashState(KVCache(k=CACHE_AXES, v=CACHE_AXES, lengths=("batch",)),
                           ("batch", "time", "embed"), ("batch", "time"))

    def local(self, model: int) -> "DFlashProposer":
        return dataclasses.replace(self, config=rules.local_config(self.config, model))
