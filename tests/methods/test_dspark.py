"""DSpark (``dflash_jax/methods/dspark``) against its reference, SpecForge's own modules
(``specforge/modeling/draft/dspark.py`` at a6b6b023, run by ``tools/dspark_reference.py`` into
``tests/fixtures/dspark_reference.json``): on a tiny pair rebuilt from numpy seeds, with each
Markov head type (vanilla, gated, rnn), every iteration's drafts, the confidence head's logits,
the acceptance lengths and the output equal the reference's. The Markov head overrules the
backbone's argmax on most rows of that pair, so a head with the wrong predecessor, gate,
recurrence or row alignment drafts other tokens; the outputs equal autoregressive decoding
whatever it drafts.

Also: the layout read back bit-exactly (and SpecForge's legacy names, and an SGLang export),
the configs refused where a field is impossible or a variant not implemented, trees refused
before anything compiles, the sampled confidence independent of the draw, sampled drafts
lossless (slow: the law against a float64 oracle, with the backbone's q as negative control)."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.methods.dspark import DSPARK
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.handle import DSparkDrafter, from_dflash
from dflash_jax.methods.dspark.model import DSparkModel
from dflash_jax.methods.dspark.proposer import DSparkProposer
from dflash_jax.tools import dspark_reference as ref
from support.drafter_reference import confidence_of_two_draws, law_target, recording, sampled_law

pytestmark = pytest.mark.xdist_group("test_dspark")

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "dspark_reference.json")
KINDS = tuple(ref.DRAFTERS)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, drafter_dirs = ref.write_pair(str(tmp_path_factory.mktemp("dspark")))
    target = dj.load_target(target_dir)
    return target, {k: dj.load_drafter(p, target) for k, p in drafter_dirs.items()}, drafter_dirs


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


def test_the_fixture_is_of_this_pair(fixture):
    assert fixture["reference"] == f"sgl-project/SpecForge@{ref.SPECFORGE_COMMIT}" and fixture["seed"] == ref.SEED
    assert fixture["drafters"] == json.loads(json.dumps({k: c.to_hf_dict() for k, c in ref.DRAFTERS.items()}))
    assert fixture["target"] == json.loads(json.dumps(ref.TARGET.to_hf_dict()))
    for kind in KINDS:
        assert [r["prompt"] for r in fixture["runs"][kind]] == [list(p) for p in ref.PROMPTS]


class Recording(recording(DSparkProposer)):
    """Also records each iteration's confidence (``Proposal.logp``, what the adaptive verify
    reads), whatever the verify policy."""

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        proposal, new_state = super().propose(spec, tparams, params, state, committed, key, True)
        jax.debug.callback(lambda x: self.records.append(("logp", np.asarray(x))), proposal.logp, ordered=True)
        return proposal if want_logp else proposal._replace(logp=None), new_state


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_confidence_and_acceptance_equal_the_reference(pair, fixture, kind):
    target, drafters, _ = pair
    drafter = drafters[kind]
    assert isinstance(drafter, DSparkDrafter) and methods.method_of(drafter) is DSPARK
    b = drafter.config.block_size
    overruled = compared = 0
    for run in fixture["runs"][kind]:
        recorder = Recording(drafter.config)
        res = dj.generate(target, [run["prompt"]], fixture["max_new_tokens"], drafter=drafter, proposer=recorder)
        assert res.sequences[0] == run["output"]
        proposals = [r for r in recorder.records if not isinstance(r[0], str)]
        confidences = [r[1] for r in recorder.records if isinstance(r[0], str)]
        theirs = run["iterations"]
        assert len(proposals) == len(theirs)
        start = len(run["prompt"])
        for i, ((s, anchor, draft), it, a) in enumerate(zip(proposals, theirs, res.acceptance_lengths[0])):
            assert (int(s[0]), int(anchor[0]), draft[0].tolist()) == (start, it["anchor"], it["draft"])
            if start + b + 1 <= len(run["prompt"]) + fixture["max_new_tokens"]:  # not cut by the budget
                assert a == it["acceptance_length"]
            if it["confidence"] is not None:  # log sigmoid of the head's logits
                np.testing.assert_allclose(confidences[i][0], -np.log1p(np.exp(-np.array(it["confidence"]))),
                                           atol=2e-4)
            overruled += sum(d != m for d, m in zip(it["draft"], it["backbone_argmax"]))
            compared += b
            start += a
    assert overruled > compared // 2  # the Markov head, not the backbone's argmax, chose most drafts


def test_layout_round_trip_legacy_names_and_an_sglang_export(pair, tmp_path):
    from dflash_jax.checkpoints import read_tensors, write_safetensors

    target, drafters, drafter_dirs = pair
    for kind, drafter in drafters.items():
        dj.save_drafter(drafter, tmp_path / kind)
        back = dj.load_drafter(tmp_path / kind, target)
        assert back.config == drafter.config
        for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(drafter.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the heads under SpecForge's early logit_head. names
    tensors = {("logit_head." + n if n.startswith(("markov_head", "confidence_head")) else n): v
               for n, v in read_tensors(drafter_dirs["vanilla"]).items()}
    legacy = tmp_path / "legacy"
    write_safetensors(legacy, tensors)
    with open(os.path.join(drafter_dirs["vanilla"], "config.json")) as f:
        d = json.load(f)
    (legacy / "config.json").write_text(json.dumps(d))
    back = dj.load_drafter(legacy, target)
    np.testing.assert_array_equal(np.asarray(back.params["markov_head"]["markov_w1"]),
                                  np.asarray(drafters["vanilla"].params["markov_head"]["markov_w1"]))
    # SGLang's normalised export: Qwen3DSparkModel, the DSpark fields at the top level
    dspark = {k: d["dflash_config"].pop(k) for k in ("markov_rank", "markov_head_type", "enable_confidence_head",
                                                     "confidence_head_with_markov")}
    sglang = {**d, **dspark, "architectures": ["Qwen3DSparkModel"]}
    assert DSparkConfig.from_hf_dict(sglang) == drafters["vanilla"].config
    assert methods.method_for_hf(sglang) is DSPARK
    # under no class name, the projector type says DSpark
    assert methods.method_for_hf({**d, "architectures": ["SomethingElse"],
                                  "dflash_config": {**d["dflash_config"], **dspark}}) is DSPARK


def test_bad_configs_are_refused_naming_the_field(pair):
    _, _, drafter_dirs = pair
    with open(os.path.join(drafter_dirs["gated"], "config.json")) as f:
        d = json.load(f)
    assert d["architectures"] == ["DSparkDraftModel"] and d["dflash_config"]["projector_type"] == "dspark"

    def refused(change, match):
        bad = json.loads(json.dumps(d))
        change(bad)
        with pytest.raises(ValueError, match=match):
            DSparkConfig.from_hf_dict(bad)

    refused(lambda c: c["dflash_config"].update(markov_rank=0), r"markov_rank=0: it must be an integer >= 1")
    refused(lambda c: c["dflash_config"].pop("markov_rank"), r"markov_rank=0")
    refused(lambda c: c["dflash_config"].update(markov_head_type="lstm"), "markov_head_type='lstm' is not implemented")
    refused(lambda c: c["dflash_config"].update(projector_type="domino"), "projector_type='domino'")
    refused(lambda c: c["dflash_config"].update(attention_mode="mha"), "attention_mode='mha' does not match 4 query "
                                                                       "and 2 key/value heads")
    refused(lambda c: c["dflash_config"].update(attention_mode="mla"), "attention_mode='mla'")
    refused(lambda c: c["dflash_config"].update(conditioning="input"), "conditioned by kv injection")
    refused(lambda c: c["dflash_config"].update(final_logit_softcapping=30.0), "final_logit_softcapping")
    # a DSpark checkpoint is not read as a DFlash one
    with pytest.raises(ValueError, match="this is a DSpark drafter config"):
        dj.DrafterConfig.from_hf_dict(d)
    with pytest.raises(ValueError, match="projector_type=\"dspark\".*DSpark's"):
        dj.DrafterConfig.from_hf_dict({**d, "architectures": ["DFlashDraftModel"]})


def test_trees_and_denoising_refused_before_compiling(pair, monkeypatch):
    target, drafters, _ = pair
    from dflash_jax.decoding import engine

    def compiled(*args, **kwargs):
        raise AssertionError("the engine ran before the refusal")

    monkeypatch.setattr(engine, "prefill", compiled)
    with pytest.raises(ValueError, match="a DSpark drafter drafts one path"):
        dj.generate(target, [[1, 2, 3]], 8, drafter=drafters["vanilla"], verify=dj.TreeVerify(8, 2))
    with pytest.raises(ValueError, match="num_denoise_steps: a DSpark drafter drafts in one pass"):
        dj.generate(target, [[1, 2, 3]], 8, drafter=drafters["vanilla"], num_denoise_steps=2)


def test_greedy_and_sampled_decoding_with_every_declared_policy(pair):
    """The fixed verify at the drafter's width and a narrower one, and the adaptive verify
    steered by the confidence head, all equal autoregressive decoding."""
    target, drafters, _ = pair
    prompts = [list(p) for p in ref.PROMPTS]
    ar = dj.generate(target, prompts, 16).sequences
    for kind, drafter in drafters.items():
        assert dj.generate(target, prompts, 16, drafter=drafter).sequences == ar, kind
    drafter = drafters["vanilla"]
    assert dj.generate(target, prompts, 16, drafter=drafter, block_size=3).sequences == ar
    # the adaptive verify steered by the confidence head, its cost table measured for the pair (the
    # method's automatic_adaptive) up to its verify width, 5
    measured = dj.generate(target, prompts, 16, drafter=drafter, verify=dj.Adaptive(lengths=(3, 5)))
    assert measured.sequences == ar and max(max(a) for a in measured.acceptance_lengths) <= 5
    sampled = dj.generate(target, prompts, 16, drafter=drafter, temperature=1.0, sampled_draft=True, seed=1)
    assert [len(s) for s in sampled.sequences] == [16] * 3


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_the_sampled_confidence_does_not_read_the_draw(pair, kind):
    """With sampled drafts, ``Proposal.logp`` (what the adaptive verify length reads) is the same
    whatever tokens were drawn (``proposers.base.Proposal``): two keys, other drafts, one logp.
    (vanilla: the head reads the drawn tokens, so the backbone's self-agreement stands in;
    gated: its head reads the hidden state alone.)"""
    target, drafters, _ = pair
    seen = confidence_of_two_draws(target, drafters[kind], DSparkProposer, [[5, 9, 2, 7]] * 4, 12, seed=2)
    assert any((ta != tb).any() for ta, tb, _, _ in seen)  # the draws differ
    for _, _, la, lb in seen:
        np.testing.assert_array_equal(la, lb)


def test_from_dflash_starts_with_heads_that_change_nothing():
    """The start of a DSpark fine-tune from a DFlash drafter: the backbone's weights, a Markov
    head adding zero to every row's logits, a confidence of 1/2; the verify width kept."""
    target = dj.Target.random(ref.TARGET, seed=5, init_scale=0.3)
    dflash = dj.Drafter.random(target, num_layers=2, block_size=5, target_layer_ids=(0, 2), seed=6, init_scale=0.3)
    dspark = from_dflash(dflash, markov_rank=4, markov_head_type="rnn")
    assert dspark.config.backbone == dataclasses.replace(dflash.config, block_size=4)
    assert DSPARK.default_block_size(dspark) == dflash.config.block_size
    model = DSparkModel(dspark.config)
    h = jax.random.normal(jax.random.key(0), (2, 4, 32))
    logits = jax.random.normal(jax.random.key(1), (2, 4, 64))
    prev = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    out = model.apply({"params": dspark.params}, logits, h, prev, method=DSparkModel.markov_block)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(logits))
    c = model.apply({"params": dspark.params}, h, prev, method=DSparkModel.confidence)
    np.testing.assert_array_equal(np.asarray(c), 0.0)
    for name in ("fc", "layers", "norm", "hidden_norm"):
        assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), dspark.params[name], dflash.params[name]))


# ---------------------------------------------------------------------------- the sampled law
S_DEPTH, S_BLOCK, S_ROWS, ALPHA = 5, 4, 8192, 1e-4
S_PROMPT = [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vanilla", "rnn"])
def test_sampled_drafts_keep_the_target_law(kind):
    """generate(temperature=1, sampled_draft=True) with a DSpark drafter: the first 5 tokens of
    S_ROWS rows have the target's exact law (a float64 oracle over every continuation,
    ``support/exact_sampling.py``); a second group of S_ROWS rows in the same compiled run, whose
    rejection sampling is handed the backbone's distribution (softmax of the uncorrected logits)
    instead of the Markov-corrected one that drew the tokens, is rejected by the same check."""
    target = law_target()
    drafter = DSparkDrafter.random(target, num_layers=1, block_size=S_BLOCK - 1, target_layer_ids=(0, 2), seed=8,
                                   init_scale=0.5, markov_rank=4, markov_head_type=kind)
    # a Markov head strong enough to move the drafts (weights of standard deviation 1)
    markov = jax.tree.map(lambda x: x / 0.5, drafter.params["markov_head"])
    drafter = DSparkDrafter(drafter.config, {**drafter.params, "markov_head": markov})
    right, wrong, first = sampled_law(target, drafter, DSparkProposer,
                                      lambda p, *state: p.rows(*state)[1], rows=S_ROWS, depth=S_DEPTH,
                                      block_size=S_BLOCK, prompt=S_PROMPT, alpha=ALPHA)
    print(f"DSpark {kind} sampled drafts T=1: drafts accepted in the first block {first.tolist()}, {right}; "
          f"backbone q: {wrong}")
    assert not right.rejected, right
    assert wrong.min_p < 1e-12, wrong
    assert first[1:].sum() > 0.2 * S_ROWS and first[-1] > 0.004 * S_ROWS, first  # drafts, whole blocks too, accepted
