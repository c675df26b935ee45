"""The confidence a sampled DFlash draft gives the adaptive verify length (``Proposal.logp``) is
q's self-agreement, ``log sum_x q(x)^2`` per row (docs/api.md), and reads none of the drawn
tokens: a confidence that did (``log q(draft)``) would verify unlikely draws less often and skew
the output. The per-row sampling test (decoding/test_adaptive_rows.py) catches such a rule
through the table proposer's ``peek``, but the random DFlash drafter there is rejected too
often for the chi-squared test to see the same bug in the DFlash proposer (the mutation audit's
``dflash-confidence-peeks`` passed it). So this checks the DFlash proposer's confidence itself:
every row of every iteration of a per-row adaptive run at T = 1, recorded from inside the loop,
against the self-agreement recomputed in float64 from the recorded q; and the rows where the
drawn token's own log-probability differs from it, so that a peeking rule cannot pass."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.verification import adaptive
from dflash_jax.methods.dflash.proposer import DFlashProposer

pytestmark = pytest.mark.slow


@dataclasses.dataclass(frozen=True, eq=False)
class ConfidenceRecorder(DFlashProposer):
    """The DFlash proposer (proposals unchanged) that copies each iteration's (tokens, q_logp,
    logp) to ``records``."""

    records: list = dataclasses.field(default_factory=list)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        proposal, state = super().propose(spec, tparams, params, state, committed, key, want_logp)
        if want_logp:
            jax.debug.callback(lambda *xs: self.records.append(tuple(np.asarray(x) for x in xs)),
                               proposal.tokens, proposal.q_logp, proposal.logp, ordered=True)
        return proposal, state


def test_sampled_confidence_is_self_agreement_and_reads_no_drawn_token():
    cfg = dj.TargetConfig("qwen3", vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    target = dj.Target(cfg, dj.Target.random(cfg, seed=7, init_scale=0.5).params, max_len=32)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=4, seed=8, init_scale=0.5)
    recorder = ConfidenceRecorder(drafter.config, sample=True)
    dj.generate(target, [[1, 2, 3]] * 8, 12, drafter=drafter, proposer=recorder, sampled_draft=True,
                temperature=1.0, seed=3, block_size="adaptive", verify_lengths=(2, 4),
                verify_per_row=True,
                cost_table=dict(zip(adaptive.row_splits(8), (1.0, 1.0, 1.6, 1.8, 2.0))))
    assert len(recorder.records) >= 3
    peeking_differs = 0
    for tokens, q_logp, logp in recorder.records:
        q = np.exp(q_logp.astype(np.float64))  # [B, bs-1, V]
        want = np.log((q * q).sum(-1))
        np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-6)
        drawn = np.take_along_axis(q_logp, tokens[..., None], -1)[..., 0]
        peeking_differs += int((np.abs(drawn - want) > 1e-3).sum())
    assert peeking_differs > 10  # a confidence that read the draws would have failed above
