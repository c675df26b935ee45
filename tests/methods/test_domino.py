"""Domino (``dflash_jax/methods/domino``) against its reference, SpecForge's own ``DominoDraftModel``
(a6b6b023, run by ``tools/domino_reference.py`` into ``tests/fixtures/domino_reference.json``):
on a tiny pair rebuilt from numpy seeds, with the released variant (``shift_label``, one
uncorrected draft) and DFlash's rows, every iteration's drafts (SpecForge's own drafting, its
GRU's correction draft by draft), the acceptance lengths and the output equal the reference's;
the correction overrules the backbone's argmax on most rows of that pair.

Also: the layout read back bit-exactly and under SpecForge's legacy names, the configs refused
where a field is missing or impossible, trees refused before anything compiles, greedy == AR,
the sampled confidence independent of the draw, sampled drafts keeping the target's law (slow:
against a float64 oracle, the backbone's q as negative control)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.methods.domino import DOMINO
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.handle import DominoDrafter
from dflash_jax.methods.domino.proposer import DominoProposer
from dflash_jax.tools import domino_reference as ref
from support.drafter_reference import confidence_of_two_draws, law_target, recording, sampled_law

pytestmark = pytest.mark.xdist_group("test_domino")

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "domino_reference.json")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, drafter_dirs = ref.write_pair(str(tmp_path_factory.mktemp("domino")))
    target = dj.load_target(target_dir)
    return target, {k: dj.load_drafter(p, target) for k, p in drafter_dirs.items()}, drafter_dirs


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


def test_the_fixture_is_of_this_pair(fixture):
    assert fixture["seed"] == ref.SEED and fixture["reference"].startswith("sgl-project/SpecForge@")
    assert fixture["drafters"] == json.loads(json.dumps({k: c.to_hf_dict() for k, c in ref.DRAFTERS.items()}))


@pytest.mark.parametrize("kind", tuple(ref.DRAFTERS))
def test_drafts_and_acceptance_equal_the_reference(pair, fixture, kind):
    target, drafters, _ = pair
    drafter = drafters[kind]
    assert isinstance(drafter, DominoDrafter) and methods.method_of(drafter) is DOMINO
    b = drafter.config.block_size
    overruled = compared = 0
    for run in fixture["runs"][kind]:
        recorder = recording(DominoProposer)(drafter.config)
        res = dj.generate(target, [run["prompt"]], fixture["max_new_tokens"], drafter=drafter, proposer=recorder)
        assert res.sequences[0] == run["output"]
        theirs = run["iterations"]
        assert len(recorder.records) == len(theirs)
        start = len(run["prompt"])
        for (s, anchor, draft), it, a in zip(recorder.records, theirs, res.acceptance_lengths[0]):
            assert (int(s[0]), int(anchor[0]), draft[0].tolist()) == (start, it["anchor"], it["draft"])
            if start + b <= len(run["prompt"]) + fixture["max_new_tokens"]:
                assert a == it["acceptance_length"]
            overruled += sum(d != m for d, m in zip(it["draft"], it["backbone_argmax"]))
            compared += b - 1
            start += a
    assert overruled > compared // 2


def test_layout_round_trip_legacy_names_and_refusals(pair, tmp_path):
    from dflash_jax.checkpoints import read_tensors, write_safetensors

    target, drafters, drafter_dirs = pair
    for kind, drafter in drafters.items():
        dj.save_drafter(drafter, tmp_path / kind)
        back = dj.load_drafter(tmp_path / kind, target)
        assert back.config == drafter.config
        for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(drafter.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tensors = {("logit_head." + n if n.startswith(("prefix_gru", "embed_proj")) else n): v
               for n, v in read_tensors(drafter_dirs["shifted"]).items()}
    write_safetensors(tmp_path / "legacy", tensors)
    with open(os.path.join(drafter_dirs["shifted"], "config.json")) as f:
        d = json.load(f)
    (tmp_path / "legacy" / "config.json").write_text(json.dumps(d))
    back = dj.load_drafter(tmp_path / "legacy", target)
    np.testing.assert_array_equal(np.asarray(back.params["gru_w_ih"]), np.asarray(drafters["shifted"].params["gru_w_ih"]))
    assert methods.method_for_hf({**d, "architectures": ["Other"]}) is DOMINO

    def refused(change, match):
        bad = json.loads(json.dumps(d))
        change(bad)
        with pytest.raises(ValueError, match=match):
            DominoConfig.from_hf_dict(bad)

    refused(lambda c: c["dflash_config"].pop("emb_dim"), "no dflash_config.emb_dim")
    refused(lambda c: c["dflash_config"].update(gru_hidden_dim=0), "gru_hidden_dim must be an integer >= 1")
    refused(lambda c: c["dflash_config"].update(pure_draft_prefix_len=4), "pure_draft_prefix_len must be an integer in 0 .. 3")
    refused(lambda c: c["dflash_config"].update(projector_type="dspark"), "projector_type='dspark'")
    refused(lambda c: c["dflash_config"].update(conditioning="none"), "conditioned by kv injection")
    with pytest.raises(ValueError, match="this is a Domino drafter config"):
        dj.DrafterConfig.from_hf_dict(d)


def test_trees_refused_and_greedy_equals_ar(pair, monkeypatch):
    target, drafters, _ = pair
    prompts = [list(p) for p in ref.pair.PROMPTS]
    ar = dj.generate(target, prompts, 16).sequences
    for kind, drafter in drafters.items():
        assert dj.generate(target, prompts, 16, drafter=drafter).sequences == ar, kind
    from dflash_jax.decoding import engine

    def compiled(*args, **kwargs):
        raise AssertionError("the engine ran before the refusal")

    monkeypatch.setattr(engine, "prefill", compiled)
    with pytest.raises(ValueError, match="a Domino drafter drafts one path"):
        dj.generate(target, [[1, 2, 3]], 8, drafter=drafters["shifted"], verify=dj.TreeVerify(8, 2))


def test_the_sampled_confidence_does_not_read_the_draw(pair):
    target, drafters, _ = pair
    seen = confidence_of_two_draws(target, drafters["shifted"], DominoProposer, [[5, 9, 2, 7]] * 4, 12, seed=2)
    assert any((ta != tb).any() for ta, tb, _, _ in seen)
    for _, _, la, lb in seen:
        np.testing.assert_array_equal(la, lb)


S_DEPTH, S_BLOCK, S_ROWS, ALPHA = 5, 4, 8192, 1e-4
S_PROMPT = [1, 2, 3]


@pytest.mark.slow
def test_sampled_drafts_keep_the_target_law():
    """The first 5 tokens of S_ROWS rows sampled at T = 1 with sampled Domino drafts have the
    target's exact law (``support/exact_sampling.py``); a second group whose rejection sampling
    is handed the backbone's softmax instead of the corrected law is rejected."""
    target = law_target()
    drafter = DominoDrafter.random(target, num_layers=1, block_size=S_BLOCK, target_layer_ids=(0, 2), seed=8,
                                   init_scale=0.5, emb_dim=4, gru_hidden_dim=6, pure_draft_prefix_len=0)
    heads = {k: (jax.tree.map(lambda x: x / 0.5, v) if k.startswith(("gru", "embed_proj")) else v)
             for k, v in drafter.params.items()}
    drafter = DominoDrafter(drafter.config, heads)
    right, wrong, first = sampled_law(target, drafter, DominoProposer, lambda p, *state: p.rows(*state)[1],
                                      rows=S_ROWS, depth=S_DEPTH, block_size=S_BLOCK, prompt=S_PROMPT, alpha=ALPHA)
    print(f"Domino sampled drafts T=1: first block {first.tolist()}, {right}; backbone q: {wrong}")
    assert not right.rejected, right
    assert wrong.min_p < 1e-12, wrong
    assert first[1:].sum() > 0.1 * S_ROWS and first[-1] > 0.002 * S_ROWS, first  # drafts, whole blocks too, accepted
