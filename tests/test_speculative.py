"""Speculative decoding is lossless: greedy output equals autoregressive output token for token,
and sampled output has the target's distribution.

Besides the real (random-weight) DFlash drafter, which is almost always rejected, the tests
use an *oracle proposer*: it rolls the target itself forward from the current state (a real
computation through the same cache), so drafts are right and blocks are accepted in full;
``CORRUPT`` replaces draft tokens at random to produce every acceptance length in between.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dflash_jax as dj
from dflash_jax.decoding.sampling import process_logits
from dflash_jax.models.target import TargetModel, target_forward

CONFIGS = {
    "qwen3": dj.TargetConfig("qwen3", vocab_size=24, hidden_size=32, intermediate_size=48,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                             max_position_embeddings=256),
    "llama": dj.TargetConfig("llama", vocab_size=24, hidden_size=32, intermediate_size=48,
                             num_layers=4, num_heads=4, num_kv_heads=1, head_dim=8,
                             max_position_embeddings=256, tie_word_embeddings=True),
}


def oracle_draft(spec, tparams, dparams, state, key, *, corrupt=0.0, q_temperature=None):
    """Proposes the target's own continuation of ``[bonus]``: its argmax (greedy drafts) or a
    sample from its distribution at ``q_temperature`` (sampled drafts, with q returned)."""
    bs = spec.block_size
    cache, tok = state.tcache, state.bonus
    model = TargetModel(spec.target)
    drafts, qs = [], []
    for i in range(bs - 1):
        k_tok, k_bad, k_flip, key = jax.random.split(key, 4)
        logits, _, cache = model.apply({"params": tparams}, tok[:, None], cache.lengths[:, None], cache)
        if q_temperature is None:
            tok = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)
        else:
            q = process_logits(logits[:, 0] * spec.sampling.temperature / q_temperature, spec.sampling)
            qs.append(q)
            tok = jax.random.categorical(k_tok, q).astype(jnp.int32)
        bad = jax.random.uniform(k_flip, tok.shape) < corrupt
        tok = jnp.where(bad, jax.random.randint(k_bad, tok.shape, 0, spec.target.vocab_size), tok)
        drafts.append(tok)
    q_logp = jnp.stack(qs, 1) if qs else None
    return jnp.stack(drafts, 1), q_logp, state.dcache


ORACLE = functools.partial(oracle_draft, corrupt=0.0)
ORACLE_NOISY = functools.partial(oracle_draft, corrupt=0.25)


@functools.lru_cache(maxsize=None)
def pair(kind: str, seed: int):
    target = dj.Target.random(CONFIGS[kind], seed=seed, init_scale=0.35)
    drafter = dj.Drafter.random(target, num_layers=2, block_size=16, seed=seed + 100, init_scale=0.35)
    return target, drafter


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(CONFIGS)), seed=st.integers(0, 3),
       block_size=st.sampled_from([1, 2, 3, 5, 8, 16]),
       lens=st.lists(st.integers(1, 20), min_size=1, max_size=4),
       max_new=st.integers(1, 30), proposer=st.sampled_from(["dflash", "oracle", "noisy"]),
       n_stops=st.integers(0, 2), data=st.data())
def test_greedy_speculative_equals_autoregressive(kind, seed, block_size, lens, max_new, proposer,
                                                   n_stops, data):
    target, drafter = pair(kind, seed)
    V = target.config.vocab_size
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, V, size=n).tolist() for n in lens]
    stops = data.draw(st.lists(st.integers(0, V - 1), min_size=n_stops, max_size=n_stops))
    draft_fn = {"dflash": None, "oracle": ORACLE, "noisy": ORACLE_NOISY}[proposer]
    ar = dj.generate(target, prompts, max_new, stop_token_ids=stops)
    sp = dj.generate(target, prompts, max_new, stop_token_ids=stops, drafter=drafter,
                     block_size=block_size, draft_fn=draft_fn)
    assert sp.sequences == ar.sequences
    assert sp.finish_reasons == ar.finish_reasons
    for seq, acc in zip(sp.sequences, sp.acceptance_lengths):
        assert all(1 <= a <= block_size for a in acc)
        assert sum(acc) + 1 >= len(seq)  # every iteration commits its acceptance length (or ends)


def test_oracle_accepts_full_blocks_and_statistics():
    target, drafter = pair("qwen3", 0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
    r = dj.generate(target, prompts, 41, drafter=drafter, block_size=8, draft_fn=ORACLE)
    ar = dj.generate(target, prompts, 41)
    assert r.sequences == ar.sequences
    # 1 token from prefill, then 40 = 5 full blocks of 8
    assert r.acceptance_lengths == [[8] * 5, [8] * 5] and r.tau == 8.0 and r.num_steps == 5
    assert r.acceptance_histogram.tolist() == [0] * 7 + [10]
    assert r.position_acceptance_rate.tolist() == [1.0] * 7
    noisy = dj.generate(target, prompts, 41, drafter=drafter, block_size=8, draft_fn=ORACLE_NOISY)
    assert noisy.sequences == ar.sequences
    hist = noisy.acceptance_histogram
    assert hist.sum() == sum(len(a) for a in noisy.acceptance_lengths)
    assert 1 < noisy.tau < 8
    rate = noisy.position_acceptance_rate
    assert np.all(np.diff(rate) <= 0) and rate[0] > rate[-1]
    ar_r = dj.generate(target, prompts, 5)
    assert ar_r.tau == 1.0 and ar_r.acceptance_lengths == [[1] * 4] * 2


@pytest.mark.parametrize("steps", [2, 3])
def test_denoise_steps_stay_lossless(steps):
    target, drafter = pair("llama", 1)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    ar = dj.generate(target, prompts, 20)
    sp = dj.generate(target, prompts, 20, drafter=drafter, num_denoise_steps=steps, block_size=6)
    assert sp.sequences == ar.sequences


def test_streaming_concatenates_to_generate():
    target, drafter = pair("qwen3", 2)
    prompts = [[1, 2, 3], [7] * 9, [5]]
    stops = [4]
    ref = dj.generate(target, prompts, 25, drafter=drafter, draft_fn=ORACLE_NOISY, block_size=4,
                      stop_token_ids=stops)
    chunks = list(dj.generate_stream(target, prompts, 25, drafter=drafter, draft_fn=ORACLE_NOISY,
                                     block_size=4, stop_token_ids=stops, iterations_per_chunk=2))
    assert len(chunks) > 2 and chunks[-1].done == [True] * 3
    joined = [sum((c.tokens[b] for c in chunks), []) for b in range(3)]
    assert joined == ref.sequences
    ar_chunks = list(dj.generate_stream(target, prompts, 6, iterations_per_chunk=1))
    assert [sum((c.tokens[b] for c in ar_chunks), []) for b in range(3)] == \
        dj.generate(target, prompts, 6).sequences


# ---------------------------------------------------------------------------- sampling
def exact_joint(target, prompt, sampling, depth):
    """The target's exact distribution of the first ``depth`` tokens (after filters)."""
    cfg = target.config

    def probs(prefix):
        ids = jnp.asarray([prefix])
        logits, _, _ = target_forward(cfg, target.params, ids, jnp.arange(len(prefix))[None])
        return np.exp(np.asarray(process_logits(logits[0, -1], sampling), np.float64))

    dist = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for seq, p in dist.items():
            pr = probs(prompt + list(seq))
            for t in np.nonzero(pr > 1e-12)[0]:
                nxt[seq + (int(t),)] = p * pr[t]
        dist = nxt
    return dist


SAMPLING_CASES = [
    # (proposer, sampled_draft, sampling kwargs)
    (None, False, dict(temperature=1.0)),
    ("oracle_q", True, dict(temperature=1.0)),
    ("oracle_q", True, dict(temperature=0.8, top_k=6)),
    ("oracle", False, dict(temperature=1.2, top_p=0.9)),
    (None, True, dict(temperature=1.0)),
]
ORACLE_Q = functools.partial(oracle_draft, q_temperature=2.0)  # q flatter than p: residuals matter


@pytest.fixture(scope="module")
def sampling_target():
    cfg = dj.TargetConfig("qwen3", vocab_size=8, hidden_size=32, intermediate_size=48, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    target = dj.Target.random(cfg, seed=7, init_scale=0.4)
    return target, dj.Drafter.random(target, num_layers=1, block_size=4, seed=8, init_scale=0.4)


@pytest.mark.parametrize("proposer, sampled_draft, kw", SAMPLING_CASES)
def test_speculative_sampling_keeps_the_target_distribution(sampling_target, proposer, sampled_draft, kw):
    target, drafter = sampling_target
    prompt, depth, n = [1, 2, 3], 3, 6000
    draft_fn = {None: None, "oracle": ORACLE, "oracle_q": ORACLE_Q}[proposer]
    r = dj.generate(target, [prompt] * n, depth, drafter=drafter, block_size=4, draft_fn=draft_fn,
                    sampled_draft=sampled_draft, seed=3, **kw)
    sampling = dj.decoding.SamplingParams(kw["temperature"], kw.get("top_k"), kw.get("top_p"))
    exact = exact_joint(target, prompt, sampling, depth)
    counts = {}
    for s in r.sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert set(counts) <= set(exact), "sampled a sequence the target cannot produce"
    tv = 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in exact.items())
    support = len(exact)
    bound = 1.5 * np.sqrt(support / (2 * np.pi * n)) + 0.01
    assert tv < bound, (tv, bound, support)
    if proposer is not None:
        assert r.tau > 1.3  # the oracle's drafts are accepted often: acceptance is exercised


def test_wrong_acceptance_rule_is_detected(sampling_target):
    """Control: accepting every draft (no rejection) must fail the same distribution check."""
    target, drafter = sampling_target
    prompt, depth, n = [1, 2, 3], 3, 6000
    sampling = dj.decoding.SamplingParams(1.0)
    exact = exact_joint(target, prompt, sampling, depth)

    def accept_all(spec, tparams, dparams, state, key):
        draft, q, dcache = ORACLE_Q(spec, tparams, dparams, state, key)
        return draft, jnp.full_like(q, -1e9), dcache  # q tiny: p/q huge, so always accepted

    r = dj.generate(target, [prompt] * n, depth, drafter=drafter, block_size=4, draft_fn=accept_all,
                    sampled_draft=True, seed=3, temperature=1.0)
    counts = {}
    for s in r.sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    tv = 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in exact.items())
    assert tv > 1.5 * np.sqrt(len(exact) / (2 * np.pi * n)) + 0.01
