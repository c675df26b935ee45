"""The DFlash family's proposers after every accepted length: a drafter's state after any
verified block must be what a fresh prefill of the committed tokens gives, or the method drafts
worse after some lengths (never wrongly: the output stays the target's, so only its proposals
show it).

Per method (DFlash, DFlash2, DSpark, Domino; random tiny drafters, float32), a greedy run whose
verify is handed a known continuation (the AR output), wrong at a chosen draft position that
cycles through every one, so each iteration accepts exactly that many drafts (0 .. all). The
method's own proposer runs every iteration on the engine's state (its context cache, updated by
``observe`` from the verified rows) and its drafts are recorded. The oracle: one fresh run per
recorded iteration, its prompt the committed tokens before that iteration's block, whose first
proposal (the state from prefill alone) must equal the recorded one; the output equals AR."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.decoding.prepare import GenerateOptions
from dflash_jax.methods.dflash2.handle import DFlash2Drafter
from dflash_jax.methods.domino.handle import DominoDrafter
from dflash_jax.methods.dspark.handle import DSparkDrafter
from support.drafter_reference import recording
from support.tiers import tiered

pytestmark = pytest.mark.xdist_group("test_family_accepted_lengths")

CFG = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256)
PROMPTS = ([5, 9, 2, 7, 7, 1], [3, 3, 8, 41, 17, 22, 30])
BLOCK = 5  # the verify block: the bonus and 4 drafts, so accepted lengths 0 .. 4
NEW = 40


def drafters(target) -> dict:
    common = dict(num_layers=1, target_layer_ids=(0, 2), seed=5, dtype=jnp.float32, init_scale=0.3)
    return {"dflash": dj.Drafter.random(target, block_size=BLOCK, **common),
            "dflash2": DFlash2Drafter.random(target, block_size=BLOCK, selector_top_k=4, **common),
            "dspark": DSparkDrafter.random(target, block_size=BLOCK - 1, markov_rank=8, **common),
            "domino": DominoDrafter.random(target, block_size=BLOCK, emb_dim=8, gru_hidden_dim=6, **common)}


def forcing(proposer_class):
    """``proposer_class`` recorded (``support.drafter_reference.recording``: start, anchor, its
    own drafts per iteration), proposing to the verify ``known[b, start+1 : start+bs]`` instead,
    wrong (token + 1) at draft index ``wrong[start]`` (bs - 1: nowhere), a seeded draw per start,
    so the accepted lengths take every value as the starts advance."""
    base = recording(proposer_class)

    @dataclasses.dataclass(frozen=True, eq=False)
    class Forcing(base):
        known: object = None  # int32[B, width]: prompt + AR output per row
        wrong: object = None  # int32[width]: the wrong draft index at each start
        __eq__ = object.__eq__
        __hash__ = object.__hash__

        def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
            proposal, state = super().propose(spec, tparams, params, state, committed, key, want_logp)
            bs, rows, start = spec.block_size, jnp.asarray(self.known), committed.start
            idx = jnp.minimum(start[:, None] + 1 + jnp.arange(bs - 1), rows.shape[1] - 1)
            truth = jnp.take_along_axis(rows, idx, axis=1)
            bad = jnp.arange(bs - 1)[None] == jnp.asarray(self.wrong)[start][:, None]
            return proposal._replace(tokens=jnp.where(bad, (truth + 1) % spec.target.vocab_size, truth)), state

    return Forcing


def proposer_fields(drafter) -> dict:
    method = methods.method_of(drafter)
    base = method.proposer(drafter, BLOCK, GenerateOptions(block_size=BLOCK), True)
    return {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}, type(base)


@pytest.fixture(scope="module")
def target():
    return dj.Target.random(CFG, seed=3, init_scale=0.3, dtype=jnp.float32)


@pytest.mark.parametrize("name", tiered(["dflash", "dflash2", "dspark", "domino"], fast=["dspark"]))
def test_proposals_after_every_accepted_length_equal_a_fresh_prefill(target, name):
    drafter = drafters(target)[name]
    prompts = [list(p) for p in PROMPTS]
    ar = dj.generate(target, prompts, NEW)
    rows = np.zeros((len(prompts), 64), np.int32)
    for b, p in enumerate(prompts):
        full = p + list(ar.sequences[b])
        rows[b, :len(full)] = full
    fields, cls = proposer_fields(drafter)
    forced = forcing(cls)(**fields, known=rows, wrong=np.random.default_rng(0).integers(0, BLOCK, 64))
    res = dj.generate(target, prompts, NEW, drafter=drafter, block_size=BLOCK, proposer=forced)
    assert res.sequences == ar.sequences
    lengths = {a for per_row in res.acceptance_lengths for a in per_row[:-1]}
    assert lengths == set(range(1, BLOCK + 1)), lengths  # every accepted length, 0 .. bs-1 drafts
    # the oracle: per recorded iteration of each row (the last cut by the budget left out), a
    # fresh run whose prompt is the committed tokens before its block
    cases = []
    for b in range(len(prompts)):
        for i in range(len(res.acceptance_lengths[b]) - 1):
            start, anchor, draft = (int(forced.records[i][0][b]), int(forced.records[i][1][b]),
                                    forced.records[i][2][b])
            assert rows[b, start] == anchor
            cases.append((list(rows[b, :start]), draft))
    fresh = recording(cls)(**fields)
    dj.generate(target, [c[0] for c in cases], 2, drafter=drafter, block_size=BLOCK, proposer=fresh)
    first = fresh.records[0][2]
    mismatched = [i for i, (_, draft) in enumerate(cases) if not np.array_equal(first[i], draft)]
    assert not mismatched, [(len(cases[i][0]), cases[i][1].tolist(), first[i].tolist()) for i in mismatched]
    assert len(cases) >= 2 * BLOCK
