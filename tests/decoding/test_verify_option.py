"""``generate(..., verify=...)``: the verify policy as one value (``docs/methods.md``).

Each value decodes exactly as its deprecated spelling did (``tree=N, tree_topk=K``;
``block_size="adaptive"`` with ``cost_table``, ``verify_per_row``) and equal to autoregressive
decoding; the old spellings warn, the new ones do not; the verify lengths recorded show which
policy ran (a value ignored, the fixed block, would record the block size every iteration).
Refusals come before anything compiles, each naming what was wrong."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.decoding import engine
from dflash_jax.verification import adaptive
from dflash_jax.verification.sampling import SamplingParams

CFG = dj.TargetConfig("qwen3", vocab_size=24, hidden_size=32, intermediate_size=48, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
PROMPTS = [[3, 7, 1, 9, 4], [5, 2, 11]]
BS, NEW = 8, 20
DEPRECATION = "deprecated: pass verify="


@functools.lru_cache(maxsize=None)
def pair():
    target = dj.Target.random(CFG, seed=5, init_scale=0.35)
    # a drafter trained on nothing accepts little; its confidence still varies, so the adaptive
    # choices vary (cost tables below favour short verifies a little)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=BS, seed=6, init_scale=0.35)
    return target, drafter


def run(**options):
    """(sequences, acceptance lengths, verify lengths) and the verify-deprecation warnings."""
    target, drafter = pair()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = dj.generate(target, PROMPTS, NEW, drafter=drafter, **options)
    notes = [str(w.message) for w in seen if DEPRECATION in str(w.message)]
    return (r.sequences, r.acceptance_lengths, r.verify_lengths), notes


LENGTHS = adaptive.verify_lengths(BS)
TABLE = {L: 1.0 + 0.3 * L for L in LENGTHS}
SPLITS = adaptive.row_splits(len(PROMPTS))
SPLIT_TABLE = {k: 1.0 + 0.2 * k for k in SPLITS}
CASES = {
    # name: (the new value, its deprecated spelling, the verify lengths each iteration may record)
    "tree": (dj.TreeVerify(nodes=6, topk=2), dict(tree=6, tree_topk=2), {6}),
    "adaptive": (dj.Adaptive(cost_table=TABLE), dict(block_size="adaptive", cost_table=TABLE), set(LENGTHS)),
    "per-row": (dj.Adaptive(per_row=True, cost_table=SPLIT_TABLE),
                dict(block_size="adaptive", verify_per_row=True, cost_table=SPLIT_TABLE),
                set(adaptive.per_row_lengths(BS))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verify_values_decode_as_their_deprecated_spellings(case):
    value, old, allowed = CASES[case]
    target, _ = pair()
    ar = dj.generate(target, PROMPTS, NEW).sequences
    new, new_notes = run(verify=value)
    legacy, old_notes = run(**old)
    assert new == legacy, f"{case}: verify={value!r} decodes differently from {old}"
    assert new[0] == ar, f"{case}: verify={value!r} is not lossless"
    chosen = {v for row in new[2] for v in row}
    assert chosen <= allowed, f"{case}: verified {sorted(chosen)} rows, the policy allows {sorted(allowed)}"
    if case == "tree":
        assert chosen == {6}
    assert not new_notes and len(old_notes) == 1, (new_notes, old_notes)


def test_fixed_is_the_default():
    default, _ = run()
    fixed, notes = run(verify="fixed")
    assert default == fixed and not notes
    assert {v for row in fixed[2] for v in row} == {BS}


@pytest.mark.parametrize("options, message", [
    (dict(verify="tree"), r"^verify='tree': give 'fixed', 'adaptive'"),
    (dict(verify=dj.TreeVerify(6), tree=6), r"^verify=TreeVerify\(nodes=6, topk=4\) with tree: the verify "
                                            r"policy is one value"),
    (dict(verify="adaptive", block_size="adaptive"), r"with block_size='adaptive': the verify policy is one"),
    (dict(verify=dj.TreeVerify(6), sampled_draft=True), r"deterministic drafts\): it cannot be combined "
                                                        r"with sampled_draft=True"),
    (dict(verify=dj.Adaptive(lengths=(2, 9))), r"verify_lengths must be integers in 1\.\.8"),
    (dict(block_size="adaptive"), None),  # not a refusal: the deprecated spelling still works
])
def test_refusals(options, message):
    target, drafter = pair()
    if message is None:
        options["cost_table"] = TABLE
        assert dj.generate(target, PROMPTS[:1], 3, drafter=drafter, **options).sequences
        return
    with pytest.raises(ValueError, match=message):
        dj.generate(target, PROMPTS, 4, drafter=drafter, **options)


def test_policies_without_drafts_are_refused():
    target, _ = pair()
    with pytest.raises(ValueError, match=r"^verify=TreeVerify\(nodes=6, topk=4\) needs a drafter"):
        dj.generate(target, PROMPTS, 4, verify=dj.TreeVerify(6))
    with pytest.raises(ValueError, match=r"^verify='adaptive' needs a drafter"):
        dj.generate(target, PROMPTS, 4, verify="adaptive")
    with pytest.raises(ValueError, match=r"^verify=Adaptive\(per_row=True, .*\) needs a drafter"):
        dj.generate(target, PROMPTS, 4, verify=dj.Adaptive(per_row=True))
    with pytest.raises(ValueError, match=r"Adaptive\(splits=\.\.\.\) belongs to per-row verification"):
        dj.Adaptive(splits=(0, 1))
    # the engine's spec checks the policy itself, before anything compiles
    policy = adaptive.AdaptiveVerify(LENGTHS, tuple(TABLE.values()))
    with pytest.raises(ValueError, match="chosen from a proposer's confidence"):
        engine.EngineSpec(CFG, None, 1, SamplingParams(), verify=policy)
    with pytest.raises(ValueError, match="verify must be a verify policy"):
        engine.EngineSpec(CFG, None, 1, SamplingParams(), verify="fixed")


def test_a_value_outside_the_policies_is_named():
    target, drafter = pair()
    for bad in (3, np.int32(4), dj.Adaptive):
        with pytest.raises(ValueError, match=r"^verify=.*: give 'fixed', 'adaptive'"):
            dj.generate(target, PROMPTS, 4, drafter=drafter, verify=bad)


def test_the_verify_option_of_the_commands(capsys):
    """``--verify`` (the generate and bench commands) reads into the settings its deprecated
    spellings set; a mix of the two, or another form, is refused; the old options alone work
    and print a deprecation note."""
    from argparse import Namespace

    from dflash_jax.decoding import tree_args

    def read(**given):
        args = Namespace(**({"tree": None, "tree_topk": None, "block_size": None, "verify_per_row": False,
                             "verify": None} | given))
        tree_args.read_verify(args)
        return (args.tree, args.tree_topk, args.block_size, args.verify_per_row)

    assert read(verify="fixed") == (None, None, None, False)
    assert read(verify="adaptive") == (None, None, "adaptive", False)
    assert read(verify="adaptive-per-row") == (None, None, "adaptive", True)
    assert read(verify="tree:32") == (32, None, None, False)
    assert read(verify="tree:60:10") == (60, 10, None, False)
    assert capsys.readouterr().err == ""
    assert read(tree=16, tree_topk=2) == (16, 2, None, False)
    assert "--tree, --tree-topk are deprecated: use --verify" in capsys.readouterr().err
    for bad in ("tree", "tree:a", "tree:1:2:3", "chain"):
        with pytest.raises(ValueError, match=f"--verify '{bad}': give one of fixed, adaptive"):
            read(verify=bad)
    with pytest.raises(ValueError, match="--verify tree:8 with --tree: the verify policy is one option"):
        read(verify="tree:8", tree=8)
    with pytest.raises(ValueError, match="this command verifies per batch only"):
        args = Namespace(tree=None, tree_topk=None, block_size=None, verify="adaptive-per-row")
        tree_args.read_verify(args)
