"""The DSpark proposer (``docs/dspark.md``): DFlash's state and ``observe`` (the deferred context
update), one drafter pass over ``[bonus, MASK * (T-1)]`` at ``start .. start+T-1`` with T = the
verify block minus one, every row drafting (row t the token at start + t + 1), then the Markov
head row by row: the greedy draft takes each row's corrected argmax; the sampled one draws each
row from its corrected logits under the target's sampling (temperature, top-k, top-p), and that
distribution is the ``q`` rejection sampling verifies the row against.

Confidence (``Proposal.logp``, what the adaptive verify length reads): greedy, the confidence
head's log sigmoid(c_t) (without a head, the draft's log-probability); sampled, a quantity that
cannot depend on the drawn tokens (``proposers.base.Proposal``): the confidence head when it
reads the hidden state alone, else the backbone's self-agreement log sum_v p_t(v)^2 (the
corrected q_t of rows after the first depends on the draw before it)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.model import DSparkModel
from dflash_jax.proposers.base import Committed, Proposal
from dflash_jax.verification.sampling import process_logits


@dataclasses.dataclass(frozen=True)
class DSparkProposer(DFlashProposer):
    """config: the DSpark drafter. sample: draw each row from its corrected distribution (at the
    target's temperature, top-k, top-p) instead of its argmax. use_confidence_head: False gives
    the adaptive verify the heuristic a drafter without the head gets (the draft's probability;
    sampled, the backbone's self-agreement), to measure the head against it."""

    config: DSparkConfig
    use_confidence_head: bool = True

    def model(self, spec) -> DSparkModel:
        return DSparkModel(self.config, attention_impl=spec.attention_impl, model_axis=spec.tp_axis)

    def rows(self, spec, tparams, params, state, committed: Committed):
        """The deferred context update and the drafter's pass: (hidden [B, T, D] after the final
        norm, base logits [B, T, V], state), T = ``spec.block_size - 1``."""
        if spec.ops.vocab_split:
            raise ValueError("the DSpark Markov head needs each row's logits over the whole vocabulary, "
                             "which is split over the mesh's model axis here: run without tensor parallelism")
        T, start = spec.block_size - 1, committed.start
        model = self.model(spec)
        cache = model.apply({"params": params}, state.pending_taps, state.pending_pos, state.cache, start,
                            method=DSparkModel.project_context)
        block = jnp.concatenate([committed.bonus[:, None],
                                 jnp.full((start.shape[0], T - 1), self.config.mask_token_id, jnp.int32)], 1)
        positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)
        h = model.apply({"params": params}, spec.family.embed(tparams, block, spec.tp_axis), positions, cache,
                        method=DSparkModel.draft)
        return h, spec.family.lm_head(spec.target, tparams, h), state.replace(cache=cache)

    def propose(self, spec, tparams, params, state, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, object]:
        h, base, state = self.rows(spec, tparams, params, state, committed)
        tokens, q_logp, prev, logits = chain(self.model(spec), params, h, base, committed.bonus, key,
                                             spec.sampling if self.sample else None)
        logp = None
        if want_logp:
            logp = self.confidence(spec, params, h, base, prev, logits, tokens)
        return Proposal(tokens, q_logp, logp), state

    def confidence(self, spec, params, h, base, prev, logits, tokens) -> jax.Array:
        """``Proposal.logp`` float32[B, T] (module docstring)."""
        cfg = self.config
        head = (cfg.enable_confidence_head and self.use_confidence_head
                and not (self.sample and cfg.confidence_head_with_markov))
        if head:
            c = self.model(spec).apply({"params": params}, h, prev, method=DSparkModel.confidence)
            return jax.nn.log_sigmoid(c)
        if self.sample:
            return jnp.log(jnp.sum(jnp.exp(2.0 * process_logits(base, spec.sampling)), -1))
        return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0]

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        raise ValueError("DSpark drafts one path (its Markov head conditions each row on the token drafted "
                         "before it): verify a chain")

    def local(self, model: int) -> "DSparkProposer":
        if model == 1:
            return self
        raise ValueError("DSpark drafters run on one device (no tensor parallelism)")


def chain(model: DSparkModel, params, hidden_BxTxD, base_BxTxV, anchor_B, key, sampling=None):
    """The Markov head's path (module docstring): (tokens int32[B, T]; q_logp float32[B, T, V],
    each row's distribution under ``sampling``, or None when greedy (``sampling`` None); the
    tokens before each row int32[B, T]; the corrected logits float32[B, T, V])."""
    T = base_BxTxV.shape[1]
    keys = jax.random.split(key, T)
    state = model.apply({"params": params}, anchor_B.shape[0], method=DSparkModel.markov_init)
    prev, tokens, prevs, logits, q_logps = anchor_B, [], [], [], []
    for t in range(T):
        state, bias = model.apply({"params": params}, state, prev, hidden_BxTxD[:, t], method=DSparkModel.markov_step)
        row = base_BxTxV[:, t].astype(jnp.float32) + bias
        prevs.append(prev)
        if sampling is None:
            prev = jnp.argmax(row, -1).astype(jnp.int32)
        else:
            q = process_logits(row, sampling)
            prev = jax.random.categorical(keys[t], q, -1).astype(jnp.int32)
            q_logps.append(q)
        tokens.append(prev)
        logits.append(row)
    stack = lambda xs: jnp.stack(xs, 1)
    return stack(tokens), (stack(q_logps) if q_logps else None), stack(prevs), stack(logits)
