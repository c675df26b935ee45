"""The Domino proposer (``docs/domino.md``): DFlash's state and ``observe``, one drafter pass over
``[bonus, MASK * (b-1)]``, then the drafts one after another, each read from its row
(``model.py``: rows 0 .. b-2 with ``shift_label``, else 1 .. b-1) with the GRU's correction
over the tokens before it: greedy, the corrected argmax; sampled, a draw from the corrected
logits under the target's sampling, that law being the ``q`` rejection sampling verifies.
Confidence (``Proposal.logp``): greedy, the draft's log-probability; sampled, the backbone's
self-agreement (the corrected q depends on the draws before it)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.model import DominoModel
from dflash_jax.proposers.base import Committed, Proposal
from dflash_jax.verification.sampling import process_logits


@dataclasses.dataclass(frozen=True)
class DominoProposer(DFlashProposer):
    config: DominoConfig

    def model(self, spec) -> DominoModel:
        return DominoModel(self.config, attention_impl=spec.attention_impl, model_axis=spec.tp_axis)

    def rows(self, spec, tparams, params, state, committed: Committed):
        """The deferred context update and the drafter's pass: (hidden [B, b-1, D] of the drafting
        rows, their base logits, state)."""
        if spec.ops.vocab_split:
            raise ValueError("the Domino correction needs each row's logits over the whole vocabulary, which is "
                             "split over the mesh's model axis here: run without tensor parallelism")
        bs, start = spec.block_size, committed.start
        model = self.model(spec)
        cache = model.apply({"params": params}, state.pending_taps, state.pending_pos, state.cache, start,
                            method=DominoModel.project_context)
        block = jnp.concatenate([committed.bonus[:, None],
                                 jnp.full((start.shape[0], bs - 1), self.config.mask_token_id, jnp.int32)], 1)
        positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
        h = model.apply({"params": params}, spec.family.embed(tparams, block, spec.tp_axis), positions, cache,
                        method=DominoModel.draft)
        h = h[:, :bs - 1] if self.config.shift_label else h[:, 1:]
        return h, spec.family.lm_head(spec.target, tparams, h), state.replace(cache=cache)

    def propose(self, spec, tparams, params, state, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, object]:
        h, base, state = self.rows(spec, tparams, params, state, committed)
        model, P = self.model(spec), self.config.pure_draft_prefix_len
        B, T, _ = base.shape
        keys = jax.random.split(key, T)
        g = jnp.zeros((B, self.config.gru_hidden_dim), jnp.float32)
        prev, tokens, logits, q_logps = committed.bonus, [], [], []
        for t in range(T):
            x = spec.family.embed(tparams, prev[:, None], spec.tp_axis)[:, 0]
            g = model.apply({"params": params}, x, g, method=DominoModel.gru)
            row = base[:, t].astype(jnp.float32)
            if t >= P:
                row = row + model.apply({"params": params}, h[:, t], g, method=DominoModel.correction)
            if self.sample:
                q = process_logits(row, spec.sampling)
                prev = jax.random.categorical(keys[t], q, -1).astype(jnp.int32)
                q_logps.append(q)
            else:
                prev = jnp.argmax(row, -1).astype(jnp.int32)
            tokens.append(prev)
            logits.append(row)
        tokens, logits = jnp.stack(tokens, 1), jnp.stack(logits, 1)
        q_logp = jnp.stack(q_logps, 1) if self.sample else None
        logp = None
        if want_logp:
            logp = (jnp.log(jnp.sum(jnp.exp(2.0 * process_logits(base, spec.sampling)), -1)) if self.sample else
                    jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0])
        return Proposal(tokens, q_logp, logp), state

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        raise ValueError("Domino drafts one path (its GRU conditions each draft on the tokens drafted before it): "
                         "verify a chain")

    def local(self, model: int) -> "DominoProposer":
        if model == 1:
            return self
        raise ValueError("Domino drafters run on one device (no tensor parallelism)")
