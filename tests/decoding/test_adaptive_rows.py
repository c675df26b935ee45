"""Per-row adaptive verification (``generate(..., block_size="adaptive", verify_per_row=True)``,
``verification.adaptive``, ``verification.adaptive.choose_row_split``, ``nn.cache.take_rows`` / ``put_rows``):
rows verified at different lengths in the same iteration still give exactly the autoregressive
output (a dense target with stops in a ragged batch, and a hybrid Gated DeltaNet target whose
recurrent state is taken apart and put back by rows); the split follows its formula (a numpy
reference, row by row); sampling keeps the target's distribution, and the same check rejects a
plausible bug (a confidence that reads the drawn draft tokens); the rows of a decode state
come out and go back unchanged; the cost table is measured per split and cached; bad options
are clear errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.decoding import costs, engine
from dflash_jax.verification import adaptive
from dflash_jax.nn import cache as cache_mod

from support import exact_sampling
from support import hybrid_targets as ht
from support.oracle_proposers import OracleProposer, TableProposer
from test_speculative import (ALPHA, DEPTH, PROMPT, Q_TEMPERATURE, ROWS, pair, run_case,
                               sampling_setup)  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.xdist_group("test_adaptive_rows"), pytest.mark.slow]

# right drafts with a quarter replaced at random, each row claiming its own random confidence
# per iteration: rows gain differently from the long length, so the split falls inside the batch
PER_ROW_ORACLE = OracleProposer(corrupt=0.25, confidences=(0.3, 0.85, 0.99), confidence_per_row=True)


def mixed_iterations(r, rows=slice(None)) -> int:
    """Iterations in which live rows (of ``rows``) verified different lengths."""
    lengths = r.verify_lengths[rows]
    longest = max(map(len, lengths))
    return sum(len({v[i] for v in lengths if i < len(v)}) > 1 for i in range(longest))


def test_per_row_greedy_equals_autoregressive_dense_with_stops():
    target, drafter = pair("llama", 1)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, target.config.vocab_size, size=n).tolist() for n in (1, 20, 7, 3)]
    budgets = [40, 64, 50, 30]
    free = dj.generate(target, prompts, budgets).sequences
    # rows 1 and 2 stop at the first token, from their 10th on, not emitted before
    first_new = lambda seq, i: [t for j, t in enumerate(seq) if j >= i and t not in seq[:j]][:1]
    stops = [[], first_new(free[1], 10), first_new(free[2], 10), []]
    assert stops[1] and stops[2]
    ar = dj.generate(target, prompts, budgets, stop_token_ids=stops)
    splits = adaptive.row_splits(4)
    assert splits == (0, 1, 2, 3, 4)
    r = dj.generate(target, prompts, budgets, drafter=drafter, block_size="adaptive", verify_per_row=True,
                    stop_token_ids=stops, cost_table={k: 1.0 + 0.1 * k for k in splits}, proposer=PER_ROW_ORACLE)
    assert r.sequences == ar.sequences and r.finish_reasons == ar.finish_reasons
    assert {v for row in r.verify_lengths for v in row} == {4, 16}
    for acc, ver in zip(r.acceptance_lengths, r.verify_lengths):
        assert len(acc) == len(ver) and all(1 <= a <= v for a, v in zip(acc, ver))
    assert mixed_iterations(r) >= 3  # the split inside the batch: groups of rows at 4 and at 16
    assert max(max(a, default=0) for a in r.acceptance_lengths) > 4
    assert r.finish_reasons[1] == r.finish_reasons[2] == "stop"


def test_per_row_greedy_equals_autoregressive_hybrid():
    """A Gated DeltaNet + attention target: the groups' recurrent states and K/V are taken out
    by rows, rolled back per group, and put back."""
    cfg = ht.hybrid_config(layer_types=(ht.LINEAR, ht.FULL), gdn_rollback="replay", gdn_chunk=3)
    target = ht.random_target(cfg, seed=1)
    drafter = ht.random_drafter(target, 16, seed=2)
    prompts = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 1, 44, 7, 19], [5, 6]]
    ar = dj.generate(target, prompts, 60)
    r = dj.generate(target, prompts, 60, drafter=drafter, block_size="adaptive", verify_per_row=True,
                    cost_table={0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3}, proposer=PER_ROW_ORACLE)
    assert r.sequences == ar.sequences
    assert mixed_iterations(r) >= 3


def expected_split(logp, n, done, budget, lengths, splits, costs):
    """The split rule in numpy, row by row: each row's gain of the long length over the short,
    the rows taken in order of gain (stable), every split's expected tokens per cost."""
    def tokens(b, L):
        reach, t = 1.0, 1.0
        for k in range(L - 1):
            reach *= float(np.exp(logp[b, k]))
            t += reach
        return 0.0 if done[b] else min(t, budget[b] - n[b])
    B = logp.shape[0]
    short = [tokens(b, lengths[0]) for b in range(B)]
    gain = [tokens(b, lengths[1]) - short[b] for b in range(B)]
    order = sorted(range(B), key=lambda b: -gain[b])  # Python's sort is stable
    best, best_score = None, -1.0
    for i, k in enumerate(splits):
        score = (sum(short) + sum(gain[b] for b in order[:k])) / costs[i]
        if score > best_score * (1 + 1e-6):
            best, best_score = i, score
    return best, order


@functools.partial(jax.jit, static_argnums=(0, 1))
def choose_split(lengths, splits, costs_, logp, state, budget):
    """``verification.adaptive.choose_row_split`` compiled as the engine compiles it, the policy's costs passed
    in (traced) instead of baked in: one program per batch size, not one per cost table."""
    return adaptive.choose_row_split(adaptive.AdaptiveVerify(lengths, costs_, splits), logp, state, budget)


def test_split_follows_expected_tokens_per_second():
    rng = np.random.default_rng(0)
    seen = set()
    for trial in range(40):
        B = int(rng.integers(2, 7))
        logp = np.log(rng.uniform(0.2, 1.0, size=(B, 15))).astype(np.float32)
        n = rng.integers(1, 20, size=B).astype(np.int32)
        budget = (n + rng.integers(1, 30, size=B)).astype(np.int32)
        done = rng.uniform(size=B) < 0.2
        splits = adaptive.row_splits(B)
        slope = rng.uniform(0.0, 0.4)
        costs_ = tuple(float(1.0 + slope * k / B * rng.uniform(0.9, 1.1)) for k in splits)
        state = engine.DecodeState(None, jnp.asarray(n), jnp.asarray(done), *[None] * 7)
        got, order = choose_split((4, 16), splits, jnp.asarray(costs_, jnp.float32), jnp.asarray(logp), state,
                                  jnp.asarray(budget))
        want, want_order = expected_split(logp, n, done, budget, (4, 16), splits, costs_)
        assert int(got) == want, trial
        k = splits[want]
        assert sorted(np.asarray(order)[:k].tolist()) == sorted(want_order[:k]), trial
        seen.add(want in (0, len(splits) - 1))
    assert seen == {True, False}  # both the batch-wide ends and splits inside the batch won


def per_row_options(rows: int) -> dict:
    """Verify lengths 2 and 4 split per row, a quarter of the rows verifying long for free: a
    split inside the batch wins most iterations. Of the default splits (0, 1/4, 1/2, 3/4, all)
    the two these costs never choose (1/2 at 1.6, 3/4 at 1.8) are left out: the same choices and
    the same output (checked: every p-value below equal with all five), two fewer verify
    branches to compile in each run."""
    splits = (0, rows // 4, rows)
    return dict(verify_lengths=(2, 4), verify_per_row=True, row_splits=splits,
                cost_table=dict(zip(splits, (1.0, 1.0, 2.0))))


def test_per_row_sampling_keeps_the_target_distribution_and_a_peeking_choice_is_rejected(sampling_setup):
    """16384 rows of the sampled table proposer, verify lengths 2 and 4 split per row with costs
    that make a split inside the batch pay off: the emitted tokens have the target's exact
    distribution. Negative control, a plausible bug, in the same run: 16384 more rows whose
    confidence (what the split reads) is the drawn tokens' own probabilities, so a row that drew an
    unlikely token verifies it less often; the same test rejects them. (A row's split depends on
    the other rows' confidences, never on its own draws: the correct rows stay exact beside the
    buggy ones.) Then the DFlash drafter's own sampled drafts, 16384 rows."""
    target, drafter, prefix_logits = sampling_setup
    joint, _ = prefix_logits.joint(1.0)
    proposer = TableProposer(prefix_logits, q_temperature=Q_TEMPERATURE, peek=True, peek_from_row=ROWS)
    r = dj.generate(target, [PROMPT] * (2 * ROWS), DEPTH, drafter=drafter, proposer=proposer, sampled_draft=True,
                    seed=3, block_size="adaptive", temperature=1.0, **per_row_options(2 * ROWS))
    honest = slice(0, ROWS)
    report = exact_sampling.fit(r.sequences[honest], joint, ALPHA)
    print(f"per-row: tau {r.tau:.2f}, mixed iterations {mixed_iterations(r, honest)}, {report}")
    assert not report.rejected, report
    assert mixed_iterations(r, honest) >= 2
    bad_report = exact_sampling.fit(r.sequences[ROWS:], joint, ALPHA)
    print(f"peeking: {bad_report}")
    assert bad_report.rejected, bad_report
    # the DFlash drafter's own sampled drafts (its confidence: q's self-agreement)
    r, joint_p = run_case(sampling_setup, "sampled-dflash-T1-topp", adaptive=per_row_options(ROWS))
    report = exact_sampling.fit(r.sequences, joint_p, ALPHA)
    print(f"per-row, DFlash drafts: tau {r.tau:.2f}, mixed iterations {mixed_iterations(r)}, {report}")
    assert not report.rejected, report
    assert mixed_iterations(r) >= 1


def test_rows_of_a_state_come_out_and_go_back():
    kv = cache_mod.KVCache.init(2, 5, 8, 1, 2)
    kv = kv.replace(k=jnp.arange(kv.k.size, dtype=jnp.float32).reshape(kv.k.shape),
                    v=-jnp.arange(kv.v.size, dtype=jnp.float32).reshape(kv.v.shape),
                    lengths=jnp.array([3, 1, 4, 1, 5]))
    rows = jnp.array([4, 1])
    part = cache_mod.take_rows(kv, rows, 5)
    assert part.k.shape == (2, 2, 8, 1, 2) and part.lengths.tolist() == [5, 1]
    np.testing.assert_array_equal(part.k[:, 0], kv.k[:, 4])
    back = cache_mod.put_rows(kv.replace(k=jnp.zeros_like(kv.k)), rows, part, 5)
    np.testing.assert_array_equal(back.k[:, [1, 4]], kv.k[:, [1, 4]])
    assert not np.asarray(back.k[:, [0, 2, 3]]).any()
    moved = cache_mod.put_rows(kv, jnp.array([0, 2]), part.replace(lengths=jnp.array([7, 7])), 5)
    assert moved.lengths.tolist() == [7, 1, 7, 1, 5]
    # the block a group's forward wrote (slots 2..3 of its rows) put back alone == the whole rows
    written = jnp.array([[2, 3], [6, 7]])
    changed = part.replace(k=part.k.at[:, jnp.arange(2)[:, None], written].set(0.5), lengths=jnp.array([4, 8]))
    whole = cache_mod.put_rows(kv, rows, changed, 5)
    window = cache_mod.put_rows(kv, rows, changed, 5, written)
    np.testing.assert_array_equal(whole.k, window.k)
    np.testing.assert_array_equal(whole.lengths, window.lengths)
    wrong = cache_mod.put_rows(kv, rows, changed, 5, written - 1)  # the wrong window misses a slot
    assert not np.array_equal(whole.k, wrong.k)
    with pytest.raises(ValueError, match="no batch axis of 4 rows"):
        cache_mod.take_rows(kv, rows, 4)


def test_cost_table_per_split_is_measured_and_cached(tmp_path, monkeypatch, capsys):
    """Splits 0 (every row verifies short: the batch-wide program) and 1 (one row long, one short:
    the grouped program that takes rows out and puts them back), each timed (a forced split is a
    program of its own: each split measured costs a compile)."""
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    target, drafter = pair("llama", 1)  # (the pair the greedy test built)
    table = costs.cost_table(target, drafter, (4, 16), 2, splits=(0, 1))
    assert sorted(table) == [0, 1] and all(v > 0 for v in table.values())
    assert "row splits [0, 1]" in capsys.readouterr().err
    assert costs.cost_table(target, drafter, (4, 16), 2, splits=(0, 1)) == table  # cached
    assert "measuring" not in capsys.readouterr().err
    batch_wide = costs.cost_key(target, drafter, (4, 16), 2)
    assert "row_splits" not in batch_wide  # the batch-wide tables' key is unchanged


@pytest.mark.parametrize("options, message", [
    (dict(block_size=16, verify_per_row=True), "belong to the adaptive block size"),
    # (a batch-wide cost table given: without one generate measures it before the options are checked)
    (dict(block_size="adaptive", row_splits=(0, 1), cost_table={4: 1.0, 8: 1.0, 16: 1.0}),
     "row_splits belongs to per-row verification"),
    (dict(block_size="adaptive", verify_per_row=True, verify_lengths=(4, 8, 16)), "a short and a long"),
    (dict(block_size="adaptive", verify_per_row=True, row_splits=(0, 3)), "integers in 0..2"),
    (dict(block_size="adaptive", verify_per_row=True, cost_table={4: 1.0, 16: 2.0}), "costs for splits"),
])
def test_bad_per_row_options_are_clear_errors(options, message):
    target, drafter = pair("llama", 1)
    with pytest.raises(ValueError, match=message):
        dj.generate(target, [[1, 2], [3]], 4, drafter=drafter, **options)


def test_the_generate_command_refuses_per_row_without_the_adaptive_block():
    from dflash_jax.decoding import cli

    with pytest.raises(ValueError, match="--verify-per-row needs --block-size adaptive"):
        cli.main(["--target", "embedded", "--drafter", "embedded", "--verify-per-row", "--max-new-tokens", "4",
                  "--prompt", "hello"])
