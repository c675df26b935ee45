"""``dflash_jax.bench.throughput`` (throughput against interactivity): on a tiny random pair the
measurement's numbers are recomputed from independent runs of ``generate`` (aggregate and
per-user speed from the decode times, the verified and wasted rows from the acceptance lengths
and the block), every batch's DFlash rows equal AR's, the curve reading on made-up points by
hand, the refusals, and the command end to end on the embedded pair."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.bench import throughput as tp

pytestmark = [pytest.mark.xdist_group("test_throughput"), pytest.mark.slow]

TINY = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
MAX_NEW = 12
BLOCK = 4


# The per-row method's cost tables (one per batch: the seconds of an iteration at each split of
# the rows into long and short verifies), seeded in a fresh cache before the measurement instead of
# measured (six programs compiled and timed, a third of this file's time; measuring and caching a
# per-split table is tests/decoding/test_adaptive_rows.py's test). Split 1 (one row verifies the
# long length, the others the short one) costs half the others, so at batch 3 it wins every
# iteration and the per-row record counts rows verified at both lengths.
ROW_SPLIT_COSTS = {1: {0: 1.0, 1: 1.5}, 3: {0: 2.0, 1: 1.0, 2: 2.0, 3: 2.0}}


def seed_per_row_cost_tables(target, drafter, cache: str) -> list[str]:
    """Writes the tables of :data:`ROW_SPLIT_COSTS` where ``generate`` looks for them, under the
    key it computes (the pair, dtype, (short, long) lengths, batch, splits, device); returns
    their paths."""
    from dflash_jax.decoding import costs
    from dflash_jax.verification.adaptive import per_row_lengths, row_splits

    paths = []
    for batch, table in ROW_SPLIT_COSTS.items():
        key = costs.cost_key(target, drafter, per_row_lengths(BLOCK), batch, splits=row_splits(batch))
        assert sorted(table) == list(row_splits(batch))
        path = costs.store(key, table)
        assert path.startswith(cache)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = dj.Target.random(TINY, seed=0, init_scale=0.35)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=BLOCK, seed=1, init_scale=0.35,
                                target_layer_ids=(1, 3))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, TINY.vocab_size - 1, size=n).tolist() for n in (5, 9, 3)]
    with pytest.MonkeyPatch.context() as mp:  # the module's own cost-table cache
        cache = str(tmp_path_factory.mktemp("verify_costs"))
        mp.setenv("DFLASH_CACHE_DIR", cache)
        seeded = seed_per_row_cost_tables(target, drafter, cache)
        measured = tp.measure(target, drafter, prompts, [1, 3], MAX_NEW, (tp.AR, tp.DFLASH, tp.PER_ROW), repeats=2)
        # the seeded tables were found (under generate's own key) and used: nothing measured
        assert sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".json")) == sorted(seeded)
        yield target, drafter, prompts, measured


def _row(measured, method, batch):
    return next(r for r in measured["rows"] if r["method"] == method and r["batch"] == batch)


def test_numbers_follow_from_independent_runs(tiny):
    target, drafter, prompts, measured = tiny
    assert measured["same_output"] == {"1": True, "3": True}
    r = _row(measured, tp.DFLASH, 3)
    # the oracle: the same batch decoded again; greedy, so the same acceptance
    g = dj.generate(target, prompts, MAX_NEW, drafter=drafter, stop_token_ids=())
    assert g.sequences == dj.generate(target, prompts, MAX_NEW, stop_token_ids=()).sequences
    assert r["tau_rows"] == pytest.approx([np.mean(a) for a in g.acceptance_lengths])
    assert r["iterations"] == g.num_steps == max(len(a) for a in g.acceptance_lengths)
    verified = 3 * BLOCK * g.num_steps  # a dense batch verifies the whole block of every row, every iteration
    assert r["verify"]["verified"] == verified
    # the decode loop makes all but the first token of each row (the prefill makes it)
    assert [sum(a) for a in g.acceptance_lengths] == [MAX_NEW - 1] * 3
    assert r["verify"]["useful"] == 3 * (MAX_NEW - 1)
    assert r["verify"]["wasted_share"] == pytest.approx(1 - 3 * (MAX_NEW - 1) / verified)
    assert r["aggregate_tokens_per_s"] == pytest.approx(3 * (MAX_NEW - 1) / np.mean(r["decode_s_runs"]))
    per_iter = np.mean(r["decode_s_runs"]) / r["iterations"]
    users = (MAX_NEW - 1) / (np.array([len(a) for a in g.acceptance_lengths]) * per_iter)
    assert r["per_user_tokens_per_s"]["mean"] == pytest.approx(users.mean())
    assert r["per_user_tokens_per_s"]["p10"] == pytest.approx(np.percentile(users, 10))
    assert r["prompt_padding_share"] == pytest.approx(1 - 17 / 27)
    ar = _row(measured, tp.AR, 3)  # AR: one row verified per row and iteration, all kept
    assert ar["tau"]["mean"] == 1.0 and ar["iterations"] == MAX_NEW - 1 and ar["verify"]["wasted_share"] == 0.0


def test_per_row_numbers_follow_from_an_independent_run(tiny):
    """The per-row method's record against the same batch decoded again with the same (cached)
    cost table: the same lengths chosen, rows verified counted by hand (a finished row idles at
    the short length, 3 = the block less one); the seeded table makes one row verify long and
    the others short in every iteration, so both lengths are counted."""
    target, drafter, prompts, measured = tiny
    r = _row(measured, tp.PER_ROW, 3)
    g = dj.generate(target, prompts, MAX_NEW, drafter=drafter, stop_token_ids=(), block_size="adaptive",
                    verify_per_row=True)
    assert g.sequences == dj.generate(target, prompts, MAX_NEW, stop_token_ids=()).sequences
    assert r["tau_rows"] == pytest.approx([np.mean(a) for a in g.acceptance_lengths])
    short = 3
    verified = sum(sum(v) + (g.num_steps - len(v)) * short for v in g.verify_lengths)
    assert r["verify"]["verified"] == verified
    assert set(v for row in g.verify_lengths for v in row) == {short, BLOCK}
    assert all(sorted(v[i] for v in g.verify_lengths if i < len(v)) == [short, short, BLOCK]
               for i in range(g.num_steps) if all(i < len(v) for v in g.verify_lengths))
    assert r["verify_rows_per_iteration"] == pytest.approx(verified / (3 * g.num_steps))


def test_wasted_rows_count_rows_past_acceptance_budget_and_finish():
    # a 4-row block, budget 9 (8 from the decode loop). Row 0: 3 + 3 + 4 emitted, 8 kept: 2 rows past
    # its acceptance, 2 past its budget. Row 1: 4 + 4, finished after 2 iterations, then its 4 rows
    # idle in the third.
    w = tp.wasted_rows([[3, 3, 4], [4, 4]], [[4, 4, 4], [4, 4]], max_new=9)
    assert w == {"verified": 24, "useful": 16, "wasted_share": pytest.approx(1 - 16 / 24)}
    # lengths chosen per iteration: row 1's idle third iteration verifies the batch's 8 rows
    w = tp.wasted_rows([[3, 3, 4], [4, 4]], [[4, 4, 8], [8, 4]], max_new=9)
    assert w["verified"] == 16 + 12 + 8
    # per row: row 1 verified its own lengths, then idles at the short length given
    w = tp.wasted_rows([[3, 3, 4], [4, 4]], [[4, 4, 8], [8, 4]], max_new=9, idle_length=2)
    assert w["verified"] == 16 + 12 + 2


def test_the_curve_reading_by_hand():
    rows = [{"method": m, "batch": b, "per_user_tokens_per_s": {"mean": u}, "aggregate_tokens_per_s": a}
            for m, b, u, a in [("ar", 1, 100, 100), ("ar", 4, 80, 320), ("ar", 16, 40, 640),
                               ("dflash", 1, 200, 200), ("dflash", 4, 120, 480), ("dflash", 16, 60, 960)]]
    pts = tp.curve(rows, "dflash")
    assert tp.throughput_at(pts, 120) == 480
    assert tp.throughput_at(pts, 100) == pytest.approx(480 + (960 - 480) * (100 - 120) / (60 - 120))
    assert tp.throughput_at(pts, 50) is None and tp.throughput_at(pts, 250) is None
    levels = tp.fixed_interactivity(rows, ("ar", "dflash"))
    assert [lv["ar_batch"] for lv in levels] == [1, 4, 16]
    assert levels[0]["dflash"] == pytest.approx(tp.throughput_at(pts, 100) / 100)
    assert levels[1]["dflash"] == pytest.approx((480 + 480 * (80 - 120) / (60 - 120)) / 320)
    assert levels[2]["dflash"] is None  # 40 tok/s per user is below DFlash's measured range


@pytest.mark.parametrize("kwargs, match", [
    (dict(batches=[0]), "positive integers"),
    (dict(batches=[4]), "needs 4 prompts; 3 given"),
    (dict(methods=("ar", "eagle")), "unknown method"),
    (dict(max_new=1), "must be >= 2"),
])
def test_refusals(tiny, kwargs, match):
    target, drafter, prompts, _ = tiny
    args = dict(batches=[1], max_new=4, methods=(tp.AR,)) | kwargs
    with pytest.raises(ValueError, match=match):
        tp.measure(target, drafter, prompts, args["batches"], args["max_new"], args["methods"], repeats=1)
    with pytest.raises(ValueError, match="need a drafter"):
        tp.measure(target, None, prompts, [1], 4, (tp.DFLASH,), repeats=1)


def test_the_command_on_the_embedded_pair(tmp_path):
    # (the adaptive methods measure their cost tables first: the tiny pair's tests cover them)
    report = tp.main(["--batch-sizes", "1", "2", "--max-new-tokens", "8", "--repeats", "1", "--datasets",
                      "gsm8k", "mbpp", "--methods", "ar", "dflash", "--out", str(tmp_path)])
    assert report["same_output"] == {"1": True, "2": True}
    assert report["settings"]["prompt_sets_in_order"] == ["gsm8k", "mbpp"]
    assert {(r["method"], r["batch"]) for r in report["rows"]} == {(m, b) for m in ("ar", "dflash") for b in (1, 2)}
    saved = json.loads((tmp_path / "throughput_cpu.json").read_text())
    assert saved["fixed_interactivity"] == report["fixed_interactivity"]
    md = (tmp_path / "throughput_cpu.md").read_text()
    assert "Speedup over AR at a fixed per-user speed" in md and "| 2 | DFlash, fixed block |" in md
    assert (tmp_path / "throughput_cpu.png").stat().st_size > 0


def test_the_compute_bound_batch_by_hand():
    # rows verified per second: 16 rows / 10 ms at batch 1 = 1600; 32 / 12 ms = 2667;
    # 64 / 22 ms = 2909; 128 / 44 ms = 2909: from batch 2 at >= 90 % of the largest rate
    rows = [{"method": "dflash", "batch": b, "verify_rows_per_iteration": 16, "iteration_ms": ms}
            for b, ms in [(1, 10.0), (2, 12.0), (4, 22.0), (8, 44.0)]]
    assert tp.row_rates(rows, "dflash")[0] == (1, pytest.approx(1600))
    assert tp.compute_bound_from(rows, "dflash") == 2
    assert tp.compute_bound_from(rows, "dflash", share=0.95) == 4
    assert tp.compute_bound_from(rows, "ar") is None
