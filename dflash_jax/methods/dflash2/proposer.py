"""The DFlash2 proposer (``docs/dflash2.md``): DFlash's (the deferred context update, one drafter
pass over ``[bonus, MASK * (bs-1)]``, the same state and ``observe``) with DFlash2's layers,
then the candidate selector row by row (``methods/dflash2/model.py``): the greedy draft takes
each row's best-scored candidate; the sampled one draws it from softmax(score / T), and that
distribution (zero outside the row's candidates) is the ``q`` rejection sampling verifies it
against."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.methods.dflash2.config import DFlash2Config
from dflash_jax.methods.dflash2.model import DFlash2Model, step_scores
from dflash_jax.proposers.base import Committed, Proposal
from dflash_jax.verification.sampling import process_logits


@dataclasses.dataclass(frozen=True)
class DFlash2Proposer(DFlashProposer):
    """config: the DFlash2 drafter. sample: draw each row's token from the selector's
    distribution (at the target's temperature) instead of taking its best candidate."""

    config: DFlash2Config

    def model(self, spec) -> DFlash2Model:
        return DFlash2Model(self.config, attention_impl=spec.attention_impl, model_axis=spec.tp_axis)

    def propose(self, spec, tparams, params, state, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, object]:
        if spec.ops.vocab_split:
            raise ValueError("the DFlash2 selector needs each row's top-k tokens over the whole vocabulary, "
                             "which is split over the mesh's model axis here: run without tensor parallelism")
        logits, _, _, state, h = self._draft(spec, tparams, params, state, committed)
        tokens, cand, log_q = select(self.model(spec), params, h, logits, committed.bonus, key,
                                     spec.sampling.temperature if self.sample else 0.0)
        B, T, V = logits.shape
        q_logp = None
        if self.sample:  # the law each token was drawn from, over the whole vocabulary
            rows = (jnp.arange(B)[:, None, None], jnp.arange(T)[None, :, None], cand)
            q_logp = jnp.full((B, T, V), -jnp.inf, jnp.float32).at[rows].set(log_q)
        logp = None
        if want_logp:  # greedy: its choice's; sampled: the backbone's self-agreement (a row's q depends on
            # the token drawn before it, and the confidence may not read the draw: Proposal.logp)
            logp = (jnp.log(jnp.sum(jnp.exp(2.0 * process_logits(logits, spec.sampling, spec.ops)), -1))
                    if self.sample else jnp.max(log_q, -1))
        return Proposal(tokens, q_logp, logp), state

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        raise ValueError("DFlash2 drafts one path through its candidates (the selector conditions each row "
                         "on the token before it): verify a chain")

    def local(self, model: int) -> "DFlash2Proposer":
        if model == 1:
            return self
        raise ValueError("DFlash2 drafters run on one device (no tensor parallelism)")


def select(model: DFlash2Model, params, hidden_BxTxD, logits_BxTxV, anchor_B, key, temperature: float):
    """The selector's path (module docstring): (tokens int32[B, T], candidates int32[B, T, k],
    log q float32[B, T, k]: the log-softmax of each row's scores at ``temperature``, at 1 when
    greedy (``temperature`` 0), which takes the argmax)."""
    unary, cand, succ, proj = model.apply({"params": params}, hidden_BxTxD, logits_BxTxV,
                                          method=DFlash2Model.candidates)
    T = cand.shape[1]
    keys = jax.random.split(key, T)
    prev, tokens, log_qs = anchor_B, [], []
    for t in range(T):
        pred = model.apply({"params": params}, prev, method=DFlash2Model.predecessor)
        scores = step_scores(unary[:, t], succ[:, t], proj[:, t], pred)
        log_q = jax.nn.log_softmax(scores / (temperature if temperature > 0 else 1.0), -1)
        j = jax.random.categorical(keys[t], log_q) if temperature > 0 else jnp.argmax(scores, -1)
        prev = jnp.take_along_axis(cand[:, t], j[:, None], 1)[:, 0]
        tokens.append(prev)
        log_qs.append(log_q)
    return jnp.stack(tokens, 1), cand, jnp.stack(log_qs, 1)
