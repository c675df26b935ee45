"""``dflash_jax.proposers.emulated.EmulatedProposer`` (a trained pair's acceptance emulated on a
random pair) on a tiny random target:

* greedy output == autoregressive decoding (the oracle: plain ``generate`` without a drafter),
  with and without the drafter's compute charged, on a ragged batch;
* the acceptance lengths the engine reports follow the stated model, a geometric acceptance
  truncated at the block: a Pearson chi-square over ~600 iterations (fixed seeds) passes for the
  model's alpha and fails for the negative controls (alpha shifted by 0.1; the truncation one
  draft later), and the mean is within 4 standard errors of ``geometric_tau(alpha, 16)``;
* the model's formulas against ``tools.roofline``'s independent ones;
* the proposer's confidence (what the adaptive verify length reads) is ``log alpha`` per draft:
  the engine's expected tokens at each verify length and the length it chooses from a cost table
  equal a hand computation from alpha (for an alpha above 1/2 and one below, where
  ``log(1 - alpha)`` would choose another length);
* the charged drafter is in the compiled loop (its matrix products are not dead code);
* the continuation as an input of the compiled loop: the same run, and no recompilation for a
  new continuation; a wrong continuation stays lossless, and its output repairs it;
* the refusals."""

from __future__ import annotations

import functools
import math
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.decoding import engine
from dflash_jax.verification.adaptive import (AdaptiveVerify, check_cost_table, choose_verify_length,
                                              expected_tokens, verify_lengths)
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.proposers.base import Committed
from dflash_jax.proposers.emulated import (EmulatedProposer, acceptance_probs, alpha_for_tau,
                                           emulated_generate, geometric_tau)
from dflash_jax.tools import roofline
from support.exact_sampling import pearson

pytestmark = pytest.mark.xdist_group("test_emulated_proposer")

TINY = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=1024)
BS = 16
TAU = 7.87  # the paper's MATH-500 tau (Qwen3-8B, block 16, T = 0)
MAX_NEW = 600
LENGTHS = (5, 9, 3, 7, 4, 11, 6, 8)  # a ragged batch of 8


@pytest.fixture(scope="module")
def runs():
    target = dj.Target.random(TINY, seed=0, init_scale=0.35)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=BS, seed=1, init_scale=0.35,
                                target_layer_ids=(1, 3))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, TINY.vocab_size - 1, size=n).tolist() for n in LENGTHS]
    ar = dj.generate(target, prompts, MAX_NEW, stop_token_ids=())
    alpha = alpha_for_tau(TAU, BS)
    plain = EmulatedProposer.from_reference(prompts, ar.sequences, alpha)  # no drafter charged
    charged = EmulatedProposer.from_reference(prompts, ar.sequences, alpha, drafter.config)
    em = emulated_generate(target, prompts, MAX_NEW, charged, drafter=drafter, stop_token_ids=(), seed=3)
    return dict(target=target, drafter=drafter, prompts=prompts, ar=ar, alpha=alpha, em=em,
                short=40, plain=plain, charged=charged)


def full_block_lengths(acceptance_lengths, budget: int, bs: int) -> np.ndarray:
    """The acceptance lengths of the iterations that began with room for a whole block
    (``budget - 1`` decode tokens per row, the prefill made the first): a selection decided
    before each draw, so the selected draws keep the model's distribution (the last
    iterations, cut by the budget, are left out)."""
    out = []
    for row in acceptance_lengths:
        done = 0
        for L in row:
            if budget - 1 - done >= bs:
                out.append(L)
            done += L
    return np.asarray(out)


@pytest.mark.slow
def test_greedy_output_equals_autoregressive(runs):
    ar, t, prompts, n = runs["ar"], runs["target"], runs["prompts"], runs["short"]
    assert runs["em"].sequences == ar.sequences  # the drafter charged
    # without it: the same output, and the same acceptance (same seed, same draws)
    plain = emulated_generate(t, prompts, n, runs["plain"], block_size=BS, stop_token_ids=(), seed=3)
    assert plain.sequences == [s[:n] for s in ar.sequences]
    k = [len(a) for a in plain.acceptance_lengths]
    assert [a[:i - 1] for a, i in zip(plain.acceptance_lengths, k)] == \
           [a[:i - 1] for a, i in zip(runs["em"].acceptance_lengths, k)]


@pytest.mark.slow
def test_the_continuation_as_an_input_reuses_the_compiled_loop(runs):
    """as_input=True: the same tokens and acceptance as the constant continuation; a second
    continuation of the same shape (another proposer object) runs without compiling."""
    t, d, prompts, n = runs["target"], runs["drafter"], runs["prompts"], MAX_NEW
    first = emulated_generate(t, prompts, n, runs["charged"], drafter=d, stop_token_ids=(), seed=3, as_input=True)
    assert first.sequences == runs["em"].sequences
    assert first.acceptance_lengths == runs["em"].acceptance_lengths
    again = EmulatedProposer.from_reference(prompts, runs["ar"].sequences, runs["alpha"], d.config)
    second = emulated_generate(t, prompts, n, again, drafter=d, stop_token_ids=(), seed=4, as_input=True)
    assert second.decode_compile_s == 0.0 and second.sequences == first.sequences
    assert second.acceptance_lengths != first.acceptance_lengths  # another seed, other draws


@pytest.mark.slow
def test_a_wrong_continuation_stays_lossless_and_its_output_repairs_it(runs):
    """What the GPU stage's refinement relies on: a continuation that is not the target's
    (one token changed, as a bf16 near-tie would) leaves the output AR's but loses acceptance
    after it; the run's own output, given back as the continuation, is followed exactly."""
    t, d, prompts, n, ar = runs["target"], runs["drafter"], runs["prompts"], runs["short"], runs["ar"]
    wrong = [list(s[:n]) for s in ar.sequences]
    wrong[0][10] = (wrong[0][10] + 1) % TINY.vocab_size
    bad = EmulatedProposer.from_reference(prompts, wrong, 1.0, d.config)  # alpha 1: every right draft accepted
    r = emulated_generate(t, prompts, n, bad, drafter=d, stop_token_ids=(), as_input=True)
    assert r.sequences == [s[:n] for s in ar.sequences] != wrong
    assert min(r.acceptance_lengths[0]) < BS and min(r.acceptance_lengths[1][:-1]) == BS
    fixed = EmulatedProposer.from_reference(prompts, r.sequences, 1.0, d.config)
    again = emulated_generate(t, prompts, n, fixed, drafter=d, stop_token_ids=(), as_input=True)
    assert again.sequences == r.sequences and all(min(a[:-1]) == BS for a in again.acceptance_lengths)


@pytest.mark.slow
def test_acceptance_follows_the_truncated_geometric_model(runs):
    alpha = runs["alpha"]
    L = full_block_lengths(runs["em"].acceptance_lengths, MAX_NEW, BS)
    assert len(L) > 500
    counts = np.bincount(L, minlength=BS + 2)[1:]  # lengths 1 .. bs + 1 (bs + 1 never occurs)
    assert counts[BS] == 0 and L.min() >= 1
    stat, dof, p = pearson(counts[:BS], acceptance_probs(alpha, BS))
    assert p > 0.01, (stat, dof, p, counts)
    # negative controls on the same counts: a plausible wrong model fails
    for shifted in (alpha - 0.1, min(alpha + 0.1, 1.0)):
        s2, d2, p2 = pearson(counts[:BS], acceptance_probs(shifted, BS))
        assert p2 < 1e-6, (shifted, s2, p2)
    # the truncation one draft later (17 lengths: the 16th not the last)
    s3, d3, p3 = pearson(counts, acceptance_probs(alpha, BS + 1))
    assert p3 < 1e-6, (s3, p3)
    # the mean: within 4 standard errors of the model's tau (its own variance)
    probs = acceptance_probs(alpha, BS)
    ls = np.arange(1, BS + 1)
    sd = math.sqrt(float(np.sum(probs * ls ** 2) - np.sum(probs * ls) ** 2))
    assert abs(L.mean() - geometric_tau(alpha, BS)) < 4 * sd / math.sqrt(len(L)), (L.mean(), sd)
    assert geometric_tau(alpha, BS) == pytest.approx(TAU)
    print(f"\nemulated acceptance, alpha {alpha:.4f} (tau {TAU} at block {BS}), {len(L)} iterations: "
          f"chi2 {stat:.2f} dof {dof} p {p:.3f}; alpha-0.1 chi2 {pearson(counts[:BS], acceptance_probs(alpha - 0.1, BS))[0]:.1f}; "
          f"truncation +1 chi2 {s3:.1f}; mean {L.mean():.3f} vs {geometric_tau(alpha, BS):.3f}")


def test_the_model_formulas_against_the_roofline_tools():
    for a in (0.0, 0.3, 0.7, 0.8941, 0.99, 1.0):
        for bs in (2, 8, 16):
            p = acceptance_probs(a, bs)
            assert p.sum() == pytest.approx(1.0)
            assert geometric_tau(a, bs) == pytest.approx(roofline.geometric_tau(a, bs))
            assert float(np.sum(p * np.arange(1, bs + 1))) == pytest.approx(geometric_tau(a, bs))
    for tau in (1.0, 4.24, 7.87, 15.5):
        assert alpha_for_tau(tau, 16) == pytest.approx(roofline.alpha_for_tau(tau, 16), abs=1e-9)


# verify length: iteration cost (seconds); with it alpha = the fitted one (0.894) verifies 16 rows and
# alpha = 0.3 verifies 4, where log(1 - alpha) as the confidence would choose 4 and 8
COSTS = {4: 1.0, 8: 1.15, 16: 1.3}


def test_the_confidence_is_log_alpha_and_steers_the_verify_length():
    """Proposal.logp (``want_logp``, what ``block_size="adaptive"`` reads) is the model's own
    confidence, ``log alpha`` for every draft of every row: the engine's expected tokens at a
    verify length L (1 + sum_{k<L} of the chance that the first k drafts are accepted, capped by
    the budget left; 0 for a done row) and the length it chooses from ``COSTS`` (the most
    expected tokens per second) equal a hand computation from alpha alone, where P(first k
    drafts accepted) = alpha^k (the module docstring's model). Two alphas, one on each side of
    1/2, so that a confidence of ``log(1 - alpha)`` would choose another length in both. No
    decoding: ``propose`` (no drafter charged) and the engine's choice are called directly."""
    B = len(LENGTHS)
    rows = np.random.default_rng(0).integers(0, TINY.vocab_size, (B, 64)).astype(np.int32)
    spec = types.SimpleNamespace(sampling=SamplingParams(), block_size=BS, target=TINY)
    start = jnp.asarray(LENGTHS, jnp.int32)  # the prefill's token: the first block's anchor
    committed = Committed(bonus=jnp.zeros(B, jnp.int32), start=start, target_state=None,
                          generated=jnp.zeros((B, MAX_NEW), jnp.int32), num_generated=jnp.ones(B, jnp.int32))
    lengths = verify_lengths(BS)
    assert lengths == tuple(COSTS)
    policy = AdaptiveVerify(lengths, check_cost_table(COSTS, lengths))
    # a ragged batch state: row 0 done, row 1 with 3 tokens of its budget left, the others fresh
    n = np.array([MAX_NEW, MAX_NEW - 3] + [1] * (B - 2))
    max_new = jnp.full(B, MAX_NEW, jnp.int32)

    @functools.partial(jax.jit, static_argnums=0)  # one compile per alpha (op by op: one per operation)
    def confidence_and_choice(proposer, committed, n, max_new):
        state = types.SimpleNamespace(n=n, done=n >= max_new)
        proposal, _ = proposer.propose(spec, None, None, None, committed, jax.random.key(0), want_logp=True)
        return (proposal.logp, expected_tokens(policy.lengths, proposal.logp, state, max_new),
                choose_verify_length(policy, proposal.logp, state, max_new))

    for alpha, want_length in ((alpha_for_tau(TAU, BS), 16), (0.3, 4)):
        proposer = EmulatedProposer(rows, (64,) * B, alpha)
        out = confidence_and_choice(proposer, committed, jnp.asarray(n, jnp.int32), max_new)
        logp, got, choice = map(np.asarray, out)
        assert logp.shape == (B, BS - 1) and logp.dtype == np.float32
        np.testing.assert_allclose(logp, np.float32(math.log(alpha)), rtol=1e-6, atol=0)
        # by hand: expected tokens per row and length, then the best tokens per cost
        hand = np.array([[0.0 if n[b] >= MAX_NEW else min(sum(alpha ** k for k in range(L)), MAX_NEW - n[b])
                          for L in lengths] for b in range(B)])
        np.testing.assert_allclose(got, hand, rtol=1e-5)
        per_cost = hand.sum(axis=0) / np.array([COSTS[L] for L in lengths])
        assert lengths[int(np.argmax(per_cost))] == want_length, (alpha, per_cost)
        assert np.sort(per_cost)[-1] > 1.1 * np.sort(per_cost)[-2]  # a clear choice
        assert lengths[int(choice)] == want_length, (alpha, lengths[int(choice)], per_cost)


@pytest.mark.slow
def test_the_charged_drafter_is_compiled_into_the_loop(runs):
    """The drafter's drafts are discarded; its products must still be in the compiled loop:
    as many as the DFlash proposer's. Control: before XLA's optimisation the emulation without
    the drafter has fewer products (so the count sees the drafter)."""
    t, d, prompts, seqs = runs["target"], runs["drafter"], runs["prompts"][:2], runs["ar"].sequences[:2]

    def lowered(**kw):
        pre = prepare_decode(t, prompts, 20, drafter=d, stop_token_ids=(), **kw)
        return engine.decode.lower(t.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                                   np.int32(1 << 30), spec=pre.spec)

    dots = lambda **kw: len(re.findall(r"\bdot\(", lowered(**kw).compile().as_text()))
    traced = lambda **kw: lowered(**kw).as_text().count("dot_general")
    alpha = runs["alpha"]
    charged = EmulatedProposer.from_reference(prompts, seqs, alpha, d.config)
    plain = EmulatedProposer.from_reference(prompts, seqs, alpha, d.config, charge=False)
    assert dots(proposer=charged) == dots() > 0
    assert traced(proposer=charged) > traced(proposer=plain) > 0


@pytest.mark.slow
def test_refusals(runs):
    t, d, prompts, seqs = runs["target"], runs["drafter"], runs["prompts"], runs["ar"].sequences
    for bad in (1.5, -0.1, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="alpha"):
            EmulatedProposer.from_reference(prompts, seqs, bad)
    with pytest.raises(ValueError, match="tau"):
        alpha_for_tau(17.0, 16)
    p = runs["plain"]
    with pytest.raises(ValueError, match=f"knows {MAX_NEW} tokens .* budget is {MAX_NEW + 1}"):
        emulated_generate(t, prompts, MAX_NEW + 1, p, block_size=BS)
    with pytest.raises(ValueError, match="not the prefix"):
        emulated_generate(t, [[1, 2, 3]] + prompts[1:], 8, p, block_size=BS)
    with pytest.raises(ValueError, match="temperature must be 0"):
        emulated_generate(t, prompts, 8, p, block_size=BS, temperature=0.7)
    with pytest.raises(ValueError, match="decode with temperature 0"):  # plain generate: refused when traced
        dj.generate(t, prompts, 8, proposer=p, block_size=BS, temperature=0.7)
    with pytest.raises(ValueError, match="pass drafter="):
        emulated_generate(t, prompts, 8, runs["charged"])
    with pytest.raises(ValueError, match="give its config"):
        EmulatedProposer.from_reference(prompts, seqs, 0.5, charge=True)
    with pytest.raises(ValueError, match="from_reference"):
        emulated_generate(t, prompts, 8, EmulatedProposer(None, (), 0.5, d.config), drafter=d)
    with pytest.raises(ValueError, match="one continuation"):
        EmulatedProposer.from_reference(prompts, seqs[:-1], 0.5)
