"""Adaptive block size (``block_size="adaptive"``, ``dflash_jax.verification.adaptive``, ``costs``): greedy
output equals autoregressive output whatever lengths are chosen, the chosen lengths are
recorded per iteration, the choice follows its formula, sampling keeps the target's
distribution, the measured cost table is cached per model and device and rebuilt when either
changes, and bad tables or options are clear errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.decoding import costs, engine
from dflash_jax.verification import adaptive

from support import exact_sampling
from support.oracle_proposers import ORACLE_NOISY, OracleProposer
from support.tiers import tiered
from test_speculative import ALPHA, pair, run_case, sampling_setup  # noqa: F401 (fixture)

# The noisy oracle (right drafts with a quarter replaced at random) claiming, per iteration, a
# random one of three confidences (0.3, 0.85, 0.99 per token), so the adaptive choice visits
# every verify length (with the costs of CASES: 4, 8, 16).
CONFIDENT_NOISY_ORACLE = OracleProposer(corrupt=0.25, confidences=(0.3, 0.85, 0.99))


CASES = {
    # name: (kind, seed, prompt lengths, budgets, proposer, verify lengths, costs)
    "b3-noisy-random-confidence-stops": ("llama", 1, [1, 20, 7], [40, 64, 50], "noisy", (4, 8, 16),
                                         {4: 1.0, 8: 1.3, 16: 1.9}),
    "b1-dflash": ("qwen3", 0, [5], 30, "dflash", (2, 5, 16), {2: 1.0, 5: 1.0, 16: 1.0}),
}


@pytest.mark.parametrize("case", tiered(CASES, fast=["b3-noisy-random-confidence-stops"]))
def test_adaptive_greedy_equals_autoregressive_and_records_lengths(case):
    kind, seed, lens, budgets, proposer, lengths, costs = CASES[case]
    target, drafter = pair(kind, seed)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, target.config.vocab_size, size=n).tolist() for n in lens]
    free = dj.generate(target, prompts, budgets).sequences
    # row b stops at the first token, from its (20 + 12 b)-th on, not emitted before (if any)
    first_new = lambda s, i: [t for j, t in enumerate(s) if j >= i and t not in s[:j]][:1]
    stops = [first_new(s, 20 + 12 * b) for b, s in enumerate(free)] if len(prompts) > 1 else ()
    ar = dj.generate(target, prompts, budgets, stop_token_ids=stops)
    custom = CONFIDENT_NOISY_ORACLE if proposer == "noisy" else None
    r = dj.generate(target, prompts, budgets, drafter=drafter, block_size="adaptive", stop_token_ids=stops,
                    verify_lengths=lengths, cost_table=costs, proposer=custom)
    assert r.sequences == ar.sequences and r.finish_reasons == ar.finish_reasons
    assert r.block_size == 16
    for acc, ver in zip(r.acceptance_lengths, r.verify_lengths):
        assert len(ver) == len(acc)  # one recorded length per iteration
        assert set(ver) <= set(lengths)
        assert all(1 <= a <= v for a, v in zip(acc, ver))  # never more than was verified
    assert sum(map(len, r.verify_lengths)) > 3
    chosen = {v for row in r.verify_lengths for v in row}
    if proposer == "noisy":
        assert chosen == set(lengths), chosen  # the random confidences reach every branch
        assert max(max(a) for a in r.acceptance_lengths) > 4  # long blocks were accepted
    else:  # random drafter, equal costs: with budget left the longest length promises the most
        assert r.verify_lengths[0][:3] == [16, 16, 16]
    fixed = dj.generate(target, prompts, budgets, drafter=drafter, stop_token_ids=stops,
                        proposer=ORACLE_NOISY if proposer == "noisy" else None)
    assert all(set(v) == {16} for v in fixed.verify_lengths)
    assert [len(v) for v in fixed.verify_lengths] == [len(a) for a in fixed.acceptance_lengths]


def expected_choice(logp, n, done, budget, lengths, costs):
    """The verify-length rule computed in numpy, row by row and length by length."""
    best, best_score = None, -1.0
    for i, L in enumerate(lengths):
        total = 0.0
        for b in range(logp.shape[0]):
            if done[b]:
                continue
            reach, tokens = 1.0, 1.0
            for k in range(L - 1):
                reach *= float(np.exp(logp[b, k]))
                tokens += reach
            total += min(tokens, budget[b] - n[b])
        score = total / costs[i]
        if score > best_score * (1 + 1e-6):
            best, best_score = i, score
    return best


def test_choice_follows_expected_tokens_per_second():
    spec = lambda lengths, costs: adaptive.AdaptiveVerify(lengths, costs)
    rng = np.random.default_rng(0)
    choose = jax.jit(adaptive.choose_verify_length, static_argnums=0)
    seen = set()
    for trial in range(60):
        B = int(rng.integers(1, 4))
        level = rng.uniform(0.6, 1.0, size=(B, 1))  # per-token confidence around it
        logp = np.log(np.clip(level + rng.normal(0, 0.05, size=(B, 15)), 0.01, 1.0)).astype(np.float32)
        n = rng.integers(1, 20, size=B).astype(np.int32)
        budget = (n + rng.integers(1, 40, size=B)).astype(np.int32)
        done = rng.uniform(size=B) < 0.2
        lengths = (4, 8, 16)
        slope = rng.uniform(0.0, 0.15)  # a fixed draft cost plus a verify cost per row
        costs = tuple(float(1.0 + slope * L * rng.uniform(0.9, 1.1)) for L in lengths)
        state = engine.DecodeState(out=None, n=jnp.asarray(n), done=jnp.asarray(done), tcache=None,
                                   bonus=None, proposer=None, accept_lens=None, verify_lens=None,
                                   iters=None, key=None)
        got = int(choose(spec(lengths, costs), jnp.asarray(logp), state, jnp.asarray(budget)))
        assert got == expected_choice(logp, n, done, budget, lengths, costs), trial
        seen.add(got)
    assert seen == {0, 1, 2}
    # the extremes: a sure drafter with flat costs verifies everything, an unsure one the least,
    # and a row one token from its budget gains nothing from a longer block
    one = engine.DecodeState(None, jnp.array([1]), jnp.array([False]), *[None] * 7)
    sure, unsure = jnp.zeros((1, 15)), jnp.full((1, 15), -3.0)
    s = spec((4, 8, 16), (1.0, 1.1, 1.2))
    assert int(choose(s, sure, one, jnp.array([100]))) == 2
    assert int(choose(s, unsure, one, jnp.array([100]))) == 0
    assert int(choose(s, sure, one, jnp.array([2]))) == 0


@pytest.mark.slow
def test_adaptive_sampling_keeps_the_target_distribution(sampling_setup):
    """The sampled table proposer with the verify length chosen per iteration between 2 and 4
    rows (equal costs: 4 while rows have budget for it, 2 once every live row has one token
    left): the emitted tokens still have the target's exact distribution."""
    case = "sampled-table-T1"
    r, joint = run_case(sampling_setup, case, adaptive=dict(verify_lengths=(2, 4), cost_table={2: 1.0, 4: 1.0}))
    report = exact_sampling.fit(r.sequences, joint, ALPHA)
    chosen = {v for row in r.verify_lengths for v in row}
    print(f"adaptive {case}: tau {r.tau:.2f}, chosen {sorted(chosen)}, {report}")
    assert not report.rejected, report
    assert chosen == {2, 4}


# ---------------------------------------------------------------------------- the cost table
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    return tmp_path


def tables(cache_dir) -> dict:
    return {p.name: json.loads(p.read_text()) for p in sorted(cache_dir.glob("verify-costs-*.json"))}


@pytest.mark.slow
def test_cost_table_is_measured_once_and_rebuilt_for_another_model_or_device(cache, capsys, monkeypatch):
    target, drafter = pair("qwen3", 0)
    prompt = [[1, 2, 3, 4]]
    ref = dj.generate(target, prompt, 12).sequences
    r = dj.generate(target, prompt, 12, drafter=drafter, block_size="adaptive")
    assert r.sequences == ref
    assert "measuring the cost" in capsys.readouterr().err
    (name, record), = tables(cache).items()
    assert sorted(int(k) for k in record["costs"]) == [4, 8, 16]
    assert all(v > 0 for v in record["costs"].values())
    assert record["key"]["device"]["platform"] == jax.devices()[0].platform
    path = cache / name
    stamp = path.stat().st_mtime_ns
    # the same model and device: read from the cache, not measured again
    dj.generate(target, prompt, 12, drafter=drafter, block_size="adaptive")
    assert "measuring" not in capsys.readouterr().err and path.stat().st_mtime_ns == stamp
    # another model: its own table
    other = dj.Drafter.random(target, num_layers=1, block_size=8, seed=5)
    assert dj.generate(target, prompt, 12, drafter=other, block_size="adaptive").sequences == ref
    assert "measuring" in capsys.readouterr().err and len(tables(cache)) == 2
    assert sorted(int(k) for k in tables(cache)[min(set(tables(cache)) - {name})]["costs"]) == [4, 8]
    # a table measured on another device (a file copied from another machine) is not trusted
    record["key"]["device"]["cpu_flags"] = "another-cpu"
    record["costs"] = {"4": 9.0, "8": 9.0, "16": 9.0}
    path.write_text(json.dumps(record))
    dj.generate(target, prompt, 12, drafter=drafter, block_size="adaptive")
    assert "measuring" in capsys.readouterr().err
    fresh = json.loads(path.read_text())
    assert fresh["key"]["device"] == costs.device_signature() and 9.0 not in fresh["costs"].values()
    # an unreadable file is measured again, not an error
    path.write_text("{not json")
    dj.generate(target, prompt, 12, drafter=drafter, block_size="adaptive")
    assert "measuring" in capsys.readouterr().err and json.loads(path.read_text())["costs"]
    key = costs.cost_key(target, drafter, (4, 8, 16), 1)
    assert costs.cost_key(target, drafter, (4, 8, 16), 2) != key  # batch size
    cast = dj.Target(target.config, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), target.params))
    assert costs.cost_key(cast, drafter, (4, 8, 16), 1) != key  # dtype
    from dflash_jax.decoding import engine
    monkeypatch.setattr(engine, "LOOP_VERSION", engine.LOOP_VERSION + 1)
    assert costs.cost_key(target, drafter, (4, 8, 16), 1) != key  # a loop that costs otherwise


@pytest.mark.parametrize("options, message", [
    (dict(cost_table={4: 1.0, 8: 1.0}), "missing [16]"),
    (dict(cost_table={4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}), "not verify lengths: [32]"),
    (dict(cost_table={4: 1.0, 8: -1.0, 16: 1.0}), "cost_table[8] = -1.0"),
    (dict(cost_table={4: 1.0, 8: float("nan"), 16: 1.0}), "positive finite"),
    (dict(cost_table=[1.0, 2.0, 3.0]), "must be a mapping"),
    (dict(verify_lengths=(4, 32)), "integers in 1..16"),
    (dict(verify_lengths=(0, 8)), "integers in 1..16"),
    (dict(verify_lengths=(4, 4)), "a length twice"),
    (dict(verify_lengths=()), "verify_lengths is empty"),
])
def test_bad_cost_table_or_lengths_are_clear_errors(options, message, cache):
    target, drafter = pair("qwen3", 0)
    with pytest.raises(ValueError) as e:
        dj.generate(target, [[1, 2]], 4, drafter=drafter, block_size="adaptive", **options)
    assert message in str(e.value)
    assert not tables(cache)  # nothing measured or written for a bad call


def test_bad_adaptive_options_are_clear_errors(cache):
    target, drafter = pair("qwen3", 0)
    with pytest.raises(ValueError, match="positive integer or 'adaptive'"):
        dj.generate(target, [[1, 2]], 4, drafter=drafter, block_size="adaptve")
    with pytest.raises(ValueError, match="pass block_size='adaptive'"):
        dj.generate(target, [[1, 2]], 4, drafter=drafter, cost_table={16: 1.0})
    with pytest.raises(ValueError, match="needs a drafter"):
        dj.generate(target, [[1, 2]], 4, block_size="adaptive")
    with pytest.raises(ValueError, match="must return Proposal.logp"):  # it returns no confidence
        dj.generate(target, [[1, 2]], 4, drafter=drafter, block_size="adaptive", proposer=ORACLE_NOISY,
                    cost_table={4: 1.0, 8: 1.0, 16: 1.0})
