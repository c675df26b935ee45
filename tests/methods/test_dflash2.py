"""DFlash2 (``dflash_jax/methods/dflash2``) against its reference, z-lab's ``dflash==0.1.0``: on a
tiny pair rebuilt from numpy seeds (``tools/dflash2_reference.py``), every iteration's proposal
(the selector's candidates per block row and the drafted path), the acceptance lengths and the
output equal what the reference package computed (``tests/fixtures/dflash2_reference.json``,
written by running the package itself). The selector overrules the logits' argmax on most rows of
that pair, so a selector that scored with the wrong predecessor, codebook or projection drafts
other tokens; the outputs equal autoregressive decoding whatever it drafts.

Also: the layout read back bit-exactly, the configs the reference writes refused where a field
is missing or impossible, trees refused before anything compiles, sampled drafts lossless."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.methods.dflash2 import DFLASH2
from dflash_jax.methods.dflash2.config import DFlash2Config
from dflash_jax.methods.dflash2.handle import DFlash2Drafter
from dflash_jax.methods.dflash2.model import DFlash2Model
from dflash_jax.methods.dflash2.proposer import DFlash2Proposer
from dflash_jax.tools import dflash2_reference as ref
from support.drafter_reference import confidence_of_two_draws, law_target, recording, sampled_law

pytestmark = pytest.mark.xdist_group("test_dflash2")

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "dflash2_reference.json")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, drafter_dir = ref.write_pair(str(tmp_path_factory.mktemp("dflash2")))
    target = dj.load_target(target_dir)
    return target, dj.load_drafter(drafter_dir, target), drafter_dir


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


def test_the_fixture_is_of_this_pair(fixture):
    assert fixture["reference"] == "dflash==0.1.0" and fixture["seed"] == ref.SEED
    assert fixture["drafter"] == json.loads(json.dumps(ref.DRAFTER.to_hf_dict()))
    assert fixture["target"] == json.loads(json.dumps(ref.TARGET.to_hf_dict()))
    assert [r["prompt"] for r in fixture["runs"]] == [list(p) for p in ref.PROMPTS]


def test_proposals_and_acceptance_equal_the_reference(pair, fixture):
    target, drafter, _ = pair
    assert isinstance(drafter, DFlash2Drafter) and methods.method_of(drafter) is DFLASH2
    overruled = 0
    for run in fixture["runs"]:
        recorder = recording(DFlash2Proposer)(drafter.config)
        res = dj.generate(target, [run["prompt"]], fixture["max_new_tokens"], drafter=drafter, proposer=recorder)
        assert res.sequences[0] == run["output"]
        ours = [(int(start[0]), int(anchor[0]), draft[0].tolist()) for start, anchor, draft in recorder.records]
        theirs = run["iterations"]
        assert len(ours) == len(theirs)
        start, bs = len(run["prompt"]), drafter.config.block_size
        for (s, anchor, draft), it, a in zip(ours, theirs, res.acceptance_lengths[0]):
            assert (s, anchor) == (start, it["anchor"])
            if len(it["draft"]) == bs - 1:
                assert draft == it["draft"] and a == it["acceptance_length"]
                overruled += sum(d != m for d, m in zip(it["draft"], it["logits_argmax"]))
            else:  # the reference shortens the last blocks to the budget left (rows see each other)
                assert start + bs > len(run["prompt"]) + fixture["max_new_tokens"]
            start += a
    assert overruled > 100  # the selector, not the logits' argmax, chose most of these drafts


def test_candidates_equal_the_reference(pair, fixture):
    """The selector's top-k candidates per block row (as sets: the reference does not sort
    them) at the reference's first iterations, from the same loop state."""
    target, drafter, _ = pair
    run = fixture["runs"][0]
    seen = []

    @jax.jit
    def candidates(params, tparams, hidden, logits):
        return DFlash2Model(drafter.config).apply({"params": params}, hidden, logits,
                                                  method=DFlash2Model.candidates)[1]

    class Recording(recording(DFlash2Proposer)):
        def _draft(self, spec, tparams, params, state, committed):
            logits, fill, filled, state, h = super()._draft(spec, tparams, params, state, committed)
            jax.debug.callback(lambda c: seen.append(np.sort(np.asarray(c)[0], -1).tolist()),
                               candidates(params, tparams, h, logits), ordered=True)
            return logits, fill, filled, state, h

    dj.generate(target, [run["prompt"]], fixture["max_new_tokens"], drafter=drafter,
                proposer=Recording(drafter.config))
    full = [i for i, it in enumerate(run["iterations"]) if len(it["draft"]) == drafter.config.block_size - 1]
    assert len(full) >= len(run["iterations"]) - (drafter.config.block_size - 1)  # the last, shortened blocks
    assert [seen[i] for i in full] == [run["iterations"][i]["candidates"] for i in full]


def test_layout_round_trip_and_refusals(pair, tmp_path):
    target, drafter, drafter_dir = pair
    dj.save_drafter(drafter, tmp_path / "d")
    back = dj.load_drafter(tmp_path / "d", target)
    assert back.config == drafter.config
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(drafter.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with open(os.path.join(drafter_dir, "config.json")) as f:
        d = json.load(f)
    assert d["architectures"] == ["DFlash2DraftModel"]

    def refused(change, match):
        bad = json.loads(json.dumps(d))
        change(bad)
        with pytest.raises(ValueError, match=match):
            DFlash2Config.from_hf_dict(bad)

    refused(lambda c: c["dflash_config"].pop("selector_rank"), "no dflash_config.selector_rank")
    refused(lambda c: c["dflash_config"].update(conv_group_size=5), "conv_group_size 5 must divide hidden_size 32")
    refused(lambda c: c["dflash_config"].update(selector_top_k=65), "selector_top_k 65 exceeds the vocabulary")
    refused(lambda c: c["dflash_config"].update(selector_rank=0), "selector_rank must be an integer >= 1")
    refused(lambda c: c["dflash_config"].update(conditioning="input"), "conditioned by kv injection")
    refused(lambda c: c["dflash_config"].update(final_logit_softcapping=30.0), "final_logit_softcapping")
    # a DFlash2 checkpoint is not read as a DFlash one
    with pytest.raises(ValueError, match="this is a DFlash2 drafter config"):
        dj.DrafterConfig.from_hf_dict(d)


def test_trees_and_denoising_refused_before_compiling(pair, monkeypatch):
    target, drafter, _ = pair
    from dflash_jax.decoding import engine

    def compiled(*args, **kwargs):
        raise AssertionError("the engine ran before the refusal")

    monkeypatch.setattr(engine, "prefill", compiled)
    with pytest.raises(ValueError, match="a DFlash2 drafter drafts one path"):
        dj.generate(target, [[1, 2, 3]], 8, drafter=drafter, verify=dj.TreeVerify(8, 2))
    with pytest.raises(ValueError, match="num_denoise_steps: a DFlash2 drafter drafts in one pass"):
        dj.generate(target, [[1, 2, 3]], 8, drafter=drafter, num_denoise_steps=2)


def test_greedy_and_sampled_decoding_with_every_declared_policy(pair):
    target, drafter, _ = pair
    prompts = [list(p) for p in ref.PROMPTS]
    ar = dj.generate(target, prompts, 16).sequences
    assert dj.generate(target, prompts, 16, drafter=drafter).sequences == ar
    assert dj.generate(target, prompts, 16, drafter=drafter, block_size=3).sequences == ar
    adaptive = dj.generate(target, prompts, 16, drafter=drafter,
                           verify=dj.Adaptive(lengths=(3, 5), cost_table={3: 1.0, 5: 1.2}))
    assert adaptive.sequences == ar
    sampled = dj.generate(target, prompts, 16, drafter=drafter, temperature=1.0, sampled_draft=True, seed=1)
    assert [len(s) for s in sampled.sequences] == [16] * 3


def test_the_sampled_confidence_does_not_read_the_draw(pair):
    """With sampled drafts, ``Proposal.logp`` (what the adaptive verify length reads) is the same
    whatever tokens were drawn: the selector's q at a row depends on the token drawn before it,
    so the backbone's self-agreement stands in."""
    target, drafter, _ = pair
    seen = confidence_of_two_draws(target, drafter, DFlash2Proposer, [[5, 9, 2, 7]] * 4, 12, seed=2)
    assert any((ta != tb).any() for ta, tb, _, _ in seen)  # the draws differ
    for _, _, la, lb in seen:
        np.testing.assert_array_equal(la, lb)


# ---------------------------------------------------------------------------- the sampled law
S_DEPTH, S_BLOCK, S_ROWS, ALPHA = 5, 4, 8192, 1e-4
S_PROMPT = [1, 2, 3]


@pytest.mark.slow
def test_sampled_drafts_keep_the_target_law():
    """generate(temperature=1, sampled_draft=True) with a DFlash2 drafter: the first 5 tokens of
    S_ROWS rows have the target's exact law (a float64 oracle over every continuation,
    ``support/exact_sampling.py``); a second group of S_ROWS rows in the same compiled run, whose
    rejection sampling is handed the backbone's distribution (softmax of the block logits) instead
    of the selector's, which drew the tokens, is rejected by the same check."""
    target = law_target()
    drafter = DFlash2Drafter.random(target, num_layers=1, block_size=S_BLOCK, target_layer_ids=(0, 2), seed=8,
                                    init_scale=0.5, conv_kernel_size=2, conv_group_size=4, selector_rank=4,
                                    selector_top_k=4)
    right, wrong, first = sampled_law(target, drafter, DFlash2Proposer,
                                      lambda p, *state: p._draft(*state)[0], rows=S_ROWS, depth=S_DEPTH,
                                      block_size=S_BLOCK, prompt=S_PROMPT, alpha=ALPHA)
    print(f"DFlash2 sampled drafts T=1: drafts accepted in the first block {first.tolist()}, {right}; "
          f"backbone q: {wrong}")
    assert not right.rejected, right
    assert wrong.min_p < 1e-12, wrong
    assert first[1:].sum() > 0.2 * S_ROWS and first[-1] > 0.01 * S_ROWS, first  # drafts are accepted


def test_from_dflash_drafts_what_the_dflash_drafter_drafts():
    """The start of a DFlash2 fine-tune from a DFlash drafter (identity convolutions, a zero
    selector) proposes DFlash's drafts, iteration by iteration, and accepts as much."""
    from dflash_jax.methods.dflash.proposer import DFlashProposer
    from dflash_jax.methods.dflash2.handle import from_dflash

    target = dj.Target.random(ref.TARGET, seed=5, init_scale=0.3)
    dflash = dj.Drafter.random(target, num_layers=2, block_size=5, target_layer_ids=(0, 2), seed=6, init_scale=0.3)
    dflash2 = from_dflash(dflash, conv_kernel_size=3, selector_rank=4)
    assert dflash2.config.backbone == dflash.config and methods.method_of(dflash2) is DFLASH2
    records = []
    for drafter, proposer in ((dflash, DFlashProposer), (dflash2, DFlash2Proposer)):
        recorder = recording(proposer)(drafter.config)
        r = dj.generate(target, [list(p) for p in ref.PROMPTS], 20, drafter=drafter, proposer=recorder)
        records.append(([tuple(np.asarray(x).tolist() for x in rec) for rec in recorder.records], r.acceptance_lengths))
    assert records[0] == records[1] and sum(len(a) for a in records[0][1]) > 10
