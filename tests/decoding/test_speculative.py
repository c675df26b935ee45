"""Speculative decoding is lossless: greedy output equals autoregressive output token for token,
and sampled output has the target's distribution.

Besides the real (random-weight) DFlash drafter, which is almost always rejected, the tests
use *oracle proposers* (``tests/support/oracle_proposers.py``, ``generate(..., proposer=...)``): ``ORACLE``
rolls the target itself forward from the current state (a real computation through the same
cache), so drafts are right and blocks are accepted in full; ``ORACLE_NOISY`` replaces a quarter
of its draft tokens at random to produce every acceptance length in between; ``TableProposer``
(sampling tests) proposes from the target's exact next-token distribution at another
temperature, so q is close to p but not equal.

The sampling tests compare many sampled rows with the exact distribution of the first tokens
(tests/support/exact_sampling.py) and must reject plausible wrong acceptance rules patched into
``verification.acceptance.accept`` (negative controls), so they can fail.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.verification.sampling import process_logits

from support import exact_sampling
from support.oracle_proposers import ORACLE, ORACLE_NOISY, TableProposer
from support.tiers import tiered

CONFIGS = {
    "qwen3": dj.TargetConfig("qwen3", vocab_size=24, hidden_size=32, intermediate_size=48,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                             max_position_embeddings=256),
    "llama": dj.TargetConfig("llama", vocab_size=24, hidden_size=32, intermediate_size=48,
                             num_layers=4, num_heads=4, num_kv_heads=1, head_dim=8,
                             max_position_embeddings=256, tie_word_embeddings=True),
}


@functools.lru_cache(maxsize=None)
def pair(kind: str, seed: int):
    target = dj.Target.random(CONFIGS[kind], seed=seed, init_scale=0.35)
    drafter = dj.Drafter.random(target, num_layers=2, block_size=16, seed=seed + 100, init_scale=0.35)
    return target, drafter


# Each case: one target, a batch of ragged prompts, one autoregressive reference and the
# speculative runs (block size, proposer) that must equal it. Together they cover batch sizes
# 1, 3, 4; block sizes 1, 2, 3, 5, 8, 16; every proposer; budgets 1 to 30 (one per row too, and
# cut inside a block); no stop, one stop per row and two, placed where the reference emits them
# (so rows do stop, inside accepted blocks too). Every program compiled here costs seconds, so
# the cases are few and each covers several of these.
GREEDY_CASES = {
    # name: (kind, seed, prompt lengths, max_new_tokens, stops, [(block size, proposer), ...])
    "b1-bs16-bs1": ("qwen3", 0, [5], 30, None, [(16, "oracle"), (1, "dflash")]),
    "b4-bs2-bs8-row-budgets-two-stops": ("llama", 1, [1, 20, 7, 3], [13, 1, 30, 16], "two",
                                         [(2, "noisy"), (8, "noisy")]),
    "b3-bs3-bs5-row-stops": ("qwen3", 2, [3, 17, 8], 25, "one", [(3, "oracle"), (5, "dflash")]),
}


@pytest.mark.parametrize("case", tiered(GREEDY_CASES, fast=["b1-bs16-bs1"]))
def test_greedy_speculative_equals_autoregressive(case):
    kind, seed, lens, max_new, stop_mode, runs = GREEDY_CASES[case]
    target, drafter = pair(kind, seed)
    V = target.config.vocab_size
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, V, size=n).tolist() for n in lens]
    stops = ()
    if stop_mode:  # tokens the free run emits: row b stops at its (3 + 2b)-th token, or earlier
        free = dj.generate(target, prompts, max_new).sequences
        pick = lambda seq, i: seq[min(i, len(seq) - 1)]
        stops = [[pick(s, 2 + 2 * b)] + ([pick(s, 9)] if stop_mode == "two" else []) for b, s in enumerate(free)]
    ar = dj.generate(target, prompts, max_new, stop_token_ids=stops)
    if stop_mode:
        assert "stop" in ar.finish_reasons
    for block_size, proposer in runs:
        custom = {"dflash": None, "oracle": ORACLE, "noisy": ORACLE_NOISY}[proposer]
        sp = dj.generate(target, prompts, max_new, stop_token_ids=stops, drafter=drafter,
                         block_size=block_size, proposer=custom)
        assert sp.sequences == ar.sequences, (block_size, proposer)
        assert sp.finish_reasons == ar.finish_reasons
        for seq, acc in zip(sp.sequences, sp.acceptance_lengths):
            assert all(1 <= a <= block_size for a in acc)
            assert sum(acc) + 1 >= len(seq)  # every iteration commits its acceptance length (or ends)
        if proposer == "oracle" and block_size > 1:  # its drafts are the reference's tokens
            assert max(max(a, default=0) for a in sp.acceptance_lengths) == block_size


@pytest.mark.slow
def test_oracle_accepts_full_blocks_and_statistics():
    target, drafter = pair("qwen3", 0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
    r = dj.generate(target, prompts, 41, drafter=drafter, block_size=8, proposer=ORACLE)
    ar = dj.generate(target, prompts, 41)
    assert r.sequences == ar.sequences
    # 1 token from prefill, then 40 = 5 full blocks of 8
    assert r.acceptance_lengths == [[8] * 5, [8] * 5] and r.tau == 8.0 and r.num_steps == 5
    assert r.acceptance_histogram.tolist() == [0] * 7 + [10]
    assert r.position_acceptance_rate.tolist() == [1.0] * 7
    noisy = dj.generate(target, prompts, 41, drafter=drafter, block_size=8, proposer=ORACLE_NOISY)
    assert noisy.sequences == ar.sequences
    hist = noisy.acceptance_histogram
    assert hist.sum() == sum(len(a) for a in noisy.acceptance_lengths)
    assert 1 < noisy.tau < 8
    rate = noisy.position_acceptance_rate
    assert np.all(np.diff(rate) <= 0) and rate[0] > rate[-1]
    ar_r = dj.generate(target, prompts, 5)
    assert ar_r.tau == 1.0 and ar_r.acceptance_lengths == [[1] * 4] * 2


@pytest.mark.slow
@pytest.mark.parametrize("steps", [2, 3])
def test_denoise_steps_stay_lossless(steps):
    target, drafter = pair("llama", 1)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    ar = dj.generate(target, prompts, 20)
    sp = dj.generate(target, prompts, 20, drafter=drafter, num_denoise_steps=steps, block_size=6)
    assert sp.sequences == ar.sequences


@pytest.mark.slow
def test_streaming_concatenates_to_generate():
    target, drafter = pair("qwen3", 2)
    prompts = [[1, 2, 3], [7] * 9, [5]]
    stops = [4]
    ref = dj.generate(target, prompts, 25, drafter=drafter, proposer=ORACLE_NOISY, block_size=4,
                      stop_token_ids=stops)
    chunks = list(dj.generate_stream(target, prompts, 25, drafter=drafter, proposer=ORACLE_NOISY,
                                     block_size=4, stop_token_ids=stops, iterations_per_chunk=2))
    assert len(chunks) > 2 and chunks[-1].done == [True] * 3
    joined = [sum((c.tokens[b] for c in chunks), []) for b in range(3)]
    assert joined == ref.sequences
    ar_chunks = list(dj.generate_stream(target, prompts, 6, iterations_per_chunk=1))
    assert [sum((c.tokens[b] for c in ar_chunks), []) for b in range(3)] == \
        dj.generate(target, prompts, 6).sequences


# ---------------------------------------------------------------------------- sampling
# The emitted tokens of many rows (one batched generate call per case) against the target's
# exact distribution of its first DEPTH tokens (tests/support/exact_sampling.py: enumerated prefixes,
# per-position and joint chi-squared, Bonferroni). With block size 4 the first iteration emits
# tokens 1..4; token 4 is the bonus after a full block, which the table proposer reaches often.
DEPTH, BLOCK, ROWS, ALPHA = 5, 4, 16384, 1e-4
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def sampling_setup():
    cfg = dj.TargetConfig("qwen3", vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    random = dj.Target.random(cfg, seed=7, init_scale=0.5)
    # a 16-token cache (prompt 3 + 5 new + a block) keeps the many-row batches small
    target = dj.Target(cfg, random.params, max_len=16)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=BLOCK, seed=8, init_scale=0.5)
    return target, drafter, exact_sampling.PrefixLogits.compute(target, PROMPT, DEPTH)


Q_TEMPERATURE = 1.3  # the sampled table proposer's temperature relative to the target's
SAMPLING_CASES = {
    # name: (proposer, sampled_draft, sampling kwargs); top-p 0.85 and top-k 4 are clear of
    # float32 rounding for this target (sample_and_fit checks)
    "sampled-table-T1": ("table", True, dict(temperature=1.0)),
    "sampled-table-T2-topk": ("table", True, dict(temperature=2.0, top_k=4)),
    "greedy-table-T1-topp": ("table", False, dict(temperature=1.0, top_p=0.85)),
    "sampled-dflash-T1-topp": ("dflash", True, dict(temperature=1.0, top_p=0.85)),
}


def run_case(setup, case, groups=1, seed=3, adaptive=None, peek=False):
    """generate on ROWS * groups rows of one case, with a fresh proposer object (a new engine
    spec, so the engine is traced anew: a patched ``accept`` is what runs); and the exact
    joint of the first DEPTH tokens. ``adaptive``: options of ``block_size="adaptive"``
    (``verify_lengths``, ``cost_table``) instead of the fixed block; ``peek``: the table
    proposer's confidence reads its drawn tokens (a bug, ``TableProposer.peek``)."""
    target, drafter, prefix_logits = setup
    proposer, sampled_draft, kw = SAMPLING_CASES[case]
    custom = None if proposer == "dflash" else TableProposer(
        prefix_logits, q_temperature=Q_TEMPERATURE if sampled_draft else None, peek=peek)
    block = dict(block_size="adaptive", **adaptive) if adaptive else dict(block_size=BLOCK)
    r = dj.generate(target, [PROMPT] * (ROWS * groups), DEPTH, drafter=drafter, proposer=custom,
                    sampled_draft=sampled_draft, seed=seed, **block, **kw)
    joint, margin = prefix_logits.joint(kw["temperature"], kw.get("top_k"), kw.get("top_p"))
    assert margin > 1e-5, "a top-k/top-p decision is too close to call in float32"
    return r, joint


@pytest.mark.parametrize("case", tiered(SAMPLING_CASES, fast=["sampled-table-T1"]))
def test_speculative_sampling_keeps_the_target_distribution(sampling_setup, case):
    r, joint = run_case(sampling_setup, case)
    report = exact_sampling.fit(r.sequences, joint, ALPHA)
    print(f"{case}: prefill {r.prefill_time_s:.1f} s, decode {r.decode_time_s:.1f} s, tau {r.tau:.2f}, "
          f"histogram {r.acceptance_histogram.tolist()}, {report}")
    assert not report.rejected, report
    if SAMPLING_CASES[case][0] == "table":  # acceptance is exercised, full blocks included
        assert r.acceptance_histogram[BLOCK - 1] > 0.1 * r.acceptance_histogram.sum()


def rejection_accept(sampling, draft, q_logp, logits, key, bug=None):
    """``verification.acceptance.accept`` written again as textbook rejection sampling (a greedy draft is a
    one-hot q), with one ``bug`` of: "accept_all" (every draft accepted); "residual_p" (at
    the first rejection a sample of p, not of normalise(max(p - q, 0))); "bonus_residual"
    (after a full block a sample of the residual of p against the last draft row's q, not of
    p); "u_lt_p" (accept when u < p(d), not u < p(d) / q(d)). None: the correct rule."""
    B, bs, V = logits.shape
    k_u, k_res = jax.random.split(key)
    p = jnp.exp(process_logits(logits, sampling))  # [B, bs, V]
    q = jax.nn.one_hot(draft, V) if q_logp is None else jnp.exp(q_logp)  # [B, bs-1, V]
    p_d = jnp.take_along_axis(p[:, :-1], draft[..., None], -1)[..., 0]
    q_d = jnp.take_along_axis(q, draft[..., None], -1)[..., 0]
    u = jax.random.uniform(k_u, (B, bs - 1))
    ok = {"accept_all": u < 2.0, "u_lt_p": u < p_d}.get(bug, u * q_d < p_d)
    a = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    rows = jnp.arange(B)
    p_a = p[rows, a]
    q_a = jnp.concatenate([q, jnp.zeros((B, 1, V))], 1)[rows, a]  # no q after a full block
    if bug == "bonus_residual":
        q_a = q[rows, jnp.minimum(a, bs - 2)]
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = resid.sum(-1, keepdims=True)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)
    if bug == "residual_p":
        resid = p_a
    return a, jax.random.categorical(k_res, jnp.log(resid), -1).astype(jnp.int32)


MUTANTS = {
    # case: the rules run side by side, ROWS rows each (None: the rewritten rule, no bug)
    "sampled-table-T1": [None, "accept_all", "residual_p", "bonus_residual", "u_lt_p"],
    # with a one-hot q, u < p(d) is the correct rule
    "greedy-table-T1-topp": [None, "accept_all", "residual_p", "bonus_residual"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MUTANTS))
def test_wrong_acceptance_rules_are_rejected(sampling_setup, monkeypatch, case):
    """Negative controls: the chain acceptance rule (``verification.acceptance.accept``)
    replaced by plausible wrong rules must fail the check the engine passes, and the same rule
    written without a bug must pass it. One compiled run: row group g (ROWS rows) uses the rule
    MUTANTS[case][g]."""
    from dflash_jax.verification import acceptance

    bugs, traced = MUTANTS[case], []

    def patched(rule, sampling, draft, q_logp, logits, key, ops):  # one device: local ops
        assert not ops.vocab_split
        traced.append(True)
        group = jnp.arange(logits.shape[0]) // ROWS
        outs = [rejection_accept(sampling, draft, q_logp, logits, key, bug) for bug in bugs]
        pick = lambda i: jnp.select([group == g for g in range(len(bugs))], [o[i] for o in outs])
        return pick(0), pick(1)

    monkeypatch.setattr(acceptance, "accept", patched)
    r, joint = run_case(sampling_setup, case, groups=len(bugs))
    assert traced, "the patched accept was not traced"
    for g, bug in enumerate(bugs):
        report = exact_sampling.fit(r.sequences[g * ROWS:(g + 1) * ROWS], joint, ALPHA)
        print(f"{case} {bug}: {report}")
        assert report.rejected == (bug is not None), (bug, str(report))
