"""Throughput against interactivity predicted on GPUs (``dflash_jax.tools.roofline_throughput``,
``roofline --throughput``): batch 1 equal to the single-stream roofline (``roofline.step_times``,
``roofline_moe.step_times``), one point's per-user and aggregate tokens/s by hand, the
compute-bound batch where the affine FLOP and byte counts cross (and where it moves when the
peak is halved), the memory refusal, and the command's files."""

import dataclasses
import json
import math

import pytest

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.tools import roofline, roofline_moe as moe, roofline_throughput as rtp
from dflash_jax.tools.parallel_comm import LATENCY_US

pytestmark = pytest.mark.xdist_group("test_roofline_throughput")

# test_roofline's small pair: D 8, F 16, 2 layers, 2 heads / 1 KV head of 4, vocab 32; per layer
# 576 matrix parameters (q 64, k 32, v 32, o 64, MLP 384) and 24 vector ones (two norms, q/k norms)
SMALL = TargetConfig(model_type="qwen3", vocab_size=32, hidden_size=8, intermediate_size=16,
                     num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
SMALL_DRAFTER = DrafterConfig.for_target(SMALL, num_layers=1, block_size=4, mask_token_id=1,
                                         target_layer_ids=(0, 1))
UNIT = roofline.Device("1 byte/s, 1 FLOP/s", bandwidth=1.0, peak_flops=1.0, source="test")
FAST_MATH = roofline.Device("1 byte/s, 1e6 FLOP/s", bandwidth=1.0, peak_flops=1e6, source="test")
QWEN = TargetConfig(**roofline.PRESETS["qwen3-8b"])
QWEN_DRAFTER = DrafterConfig.for_target(QWEN, 5, block_size=16, mask_token_id=roofline.QWEN3_MASK_TOKEN_ID)
S, FINAL = 1024, 1536


def scenario(device, memory=1e15, pair=None, taus=None):
    pair = pair or rtp.DensePair(QWEN, QWEN_DRAFTER, S, FINAL)
    return rtp.Scenario("test", "test", pair, device, memory, taus or {"set": 6.49}, "set")


@pytest.mark.parametrize("device", ["h100", "b200"])
def test_batch_1_equals_the_single_stream_roofline(device):
    """AR and DFlash at batch 1 (and 8) against ``roofline.step_times`` of the same pair:
    aggregate = batch x tau / t (AR: tau 1); per-user = aggregate / batch."""
    sc = scenario(roofline.DEVICES[device])
    for batch in (1, 8):
        ref = roofline.step_times(QWEN, QWEN_DRAFTER, 16, S, roofline.DEVICES[device], batch=batch)
        ar, fixed = rtp.point(sc, rtp.AR, batch, 6.49), rtp.point(sc, rtp.FIXED, batch, 6.49)
        assert ar["aggregate_tokens_per_s"] == pytest.approx(batch / ref["t_ar_s"], rel=1e-12)
        assert fixed["aggregate_tokens_per_s"] == pytest.approx(batch * 6.49 / ref["t_iter_s"], rel=1e-12)
        assert fixed["per_user_tokens_per_s"]["mean"] == pytest.approx(6.49 / ref["t_iter_s"], rel=1e-12)
    # batch 1, the drafter's block: the same speedup as the single-stream roofline's report
    sp = rtp.speedup_at_batch(rtp.curves(sc, 6.49, (1,)), 1)
    assert sp[rtp.FIXED] == pytest.approx(6.49 / roofline.step_times(
        QWEN, QWEN_DRAFTER, 16, S, roofline.DEVICES[device])["ratio"], rel=1e-12)


def test_moe_batch_1_equals_the_moe_roofline():
    """gpt-oss-120b on 8 x B200 (TP, MXFP4): the steps equal ``roofline_moe.step_times``,
    collectives included."""
    sc = next(s for s in rtp.scenarios(S, FINAL) if s.gpus == 8)
    for batch in (1, 4):
        ref = moe.step_times(sc.pair.shape, sc.pair.drafter, 10, S, "b200", sc.pair.layout, batch=batch,
                             latency_us=LATENCY_US)
        assert 1e6 * rtp.ar_seconds(sc, batch) == pytest.approx(ref["t_ar_us"], rel=1e-12)
        assert 1e6 * rtp.iteration_seconds(sc, 10, batch) == pytest.approx(ref["t_iter_us"], rel=1e-12)
        assert ref["comm_ar_us"] > 0


def test_one_point_by_hand():
    """The small pair's AR step at batch 2 over S = 8 cached positions, bf16, counted by hand:
    linears 2*2*2*576 = 4608 FLOPs, (2 * 600 weights) * 2 B + 2 rows * 8 * 2 B = 2432 B;
    attention 9 (query, key) pairs * 4 * 2 heads * 4 * 2 layers * 2 = 1152 FLOPs, K/V of
    2 * 8 read and 2 written at 32 B each = 576 B; LM head 2*2*8*32 = 1024 FLOPs,
    (256 + 8) * 2 + 2 * 32 * 4 = 784 B. A DFlash point from the iteration's components."""
    pair = rtp.DensePair(SMALL, SMALL_DRAFTER, 8, 12)
    for device, step in ((UNIT, 4608 + 1152 + 1024), (FAST_MATH, 2432 + 576 + 784)):
        p = rtp.point(scenario(device, pair=pair), rtp.AR, 2, 3.0)
        assert p["step_us"] == pytest.approx(1e6 * step)
        assert p["per_user_tokens_per_s"]["mean"] == pytest.approx(1 / step)
        assert p["aggregate_tokens_per_s"] == pytest.approx(2 / step)
    costs = roofline.dflash_iteration(SMALL, SMALL_DRAFTER, 4, 8, batch=2)
    t = sum(max(c.bytes / UNIT.bandwidth, c.flops / UNIT.peak_flops) for c in costs)
    p = rtp.point(scenario(UNIT, pair=pair), rtp.FIXED, 2, 3.0)
    assert p["aggregate_tokens_per_s"] == pytest.approx(2 * 3.0 / t)
    assert p["per_user_tokens_per_s"]["mean"] == pytest.approx(3.0 / t)
    # the best block: tau(bs) / t_iter(bs) is largest at the one chosen
    alpha = roofline.alpha_for_tau(3.0, 4)
    best = rtp.point(scenario(UNIT, pair=pair), rtp.BEST, 2, 3.0)
    for bs in (2, 3, 4):
        t_bs = roofline.seconds(roofline.dflash_iteration(SMALL, SMALL_DRAFTER, bs, 8, batch=2), UNIT)
        assert best["per_user_tokens_per_s"]["mean"] >= roofline.geometric_tau(alpha, bs) / t_bs - 1e-15


def crossing(device, rows: int, taps: int) -> int:
    """The first batch at which the target forward of ``rows`` rows is compute-bound, from its
    counts at batch 1 and 2 (FLOPs f b, bytes W + a b: both affine in the batch)."""
    f = [roofline.total(roofline.target_forward(QWEN, rows, S, taps=taps, batch=b), "flops") for b in (1, 2)]
    by = [roofline.total(roofline.target_forward(QWEN, rows, S, taps=taps, batch=b), "bytes") for b in (1, 2)]
    slope_f, slope_b = f[1] - f[0], by[1] - by[0]
    assert f[0] == pytest.approx(slope_f)  # no FLOPs without rows
    weights = by[0] - slope_b
    # f b / peak > (W + a b) / bw  <=>  b > W / (f bw / peak - a)
    return math.floor(weights / (slope_f * device.bandwidth / device.peak_flops - slope_b)) + 1


def test_compute_bound_batch_moves_as_hand_arithmetic_says():
    """Block 16 on an H100-like device and on one with half its peak: the first compute-bound
    batch where the affine counts cross, about half as large with half the peak (the K/V bytes
    per batch keep it from exactly half); AR's forward is never compute-bound (its FLOPs per
    byte added per sequence stay below the ridge)."""
    full = roofline.Device("H100-like", 3.35e12, 989e12, "test")
    half = dataclasses.replace(full, peak_flops=989e12 / 2)
    found = {}
    for dev in (full, half):
        found[dev.peak_flops] = rtp.compute_bound_batch(scenario(dev), rtp.FIXED, 6.49)["forward"]
        assert found[dev.peak_flops] == crossing(dev, 16, QWEN_DRAFTER.num_taps)
    assert 0.4 < found[989e12 / 2] / found[989e12] < 0.6
    assert rtp.compute_bound_batch(scenario(full), rtp.AR, 6.49, limit=2048)["forward"] is None


def test_memory_refusal_past_capacity():
    """The pair's weights and the K/V of each sequence at its end (the target's 36 layers and
    the drafter's 5, 8 KV heads of 128, bf16, 1536 positions); a budget of 3.5 sequences
    admits batch 3, refuses 4, and the sweep stops there."""
    kv_per_sequence = (36 + 5) * 2 * 8 * 128 * 2 * FINAL
    weights = (QWEN.num_params() + roofline._drafter_params(QWEN_DRAFTER)) * 2
    pair = rtp.DensePair(QWEN, QWEN_DRAFTER, S, FINAL)
    assert pair.memory(3)["kv"] == 3 * kv_per_sequence
    assert pair.memory(3)["weights"] == weights
    sc = scenario(roofline.DEVICES["h100"], memory=weights + 3.5 * kv_per_sequence)
    assert rtp.point(sc, rtp.AR, 3, 6.49)["memory_gb"] == pytest.approx((weights + 3 * kv_per_sequence) / 1e9)
    with pytest.raises(ValueError, match="batch 4 does not fit"):
        rtp.point(sc, rtp.FIXED, 4, 6.49)
    assert rtp.largest_batch(sc) == 3
    assert sorted({r["batch"] for r in rtp.curves(sc, 6.49)}) == [1, 2]


def test_bad_command_lines_refused(tmp_path):
    out = ["--out", str(tmp_path / "o")]
    for argv, match in ((["--batch", "4"], "leave out --batch"), (["--moe", "gpt-oss-20b"], "leave out --moe"),
                        (["--tau", "5"], "leave out --tau"), (["--context", "1"], "--context must be >= 2"),
                        (["--target", "embedded", "--drafter", "embedded"], "leave out --target"),
                        (["--dtype", "float32"], "--dtype float32 is not modelled"),
                        (["--drafter-layers", "0"], "--drafter-layers must be >= 1")):
        with pytest.raises(ValueError, match=match):
            rtp.main(argv + out)
    assert not (tmp_path / "o").exists()


def test_command_writes_json_markdown_and_plot(tmp_path):
    """``python -m dflash_jax.tools.roofline_throughput``: the three files; the SGLang row's
    prediction equal to the B200 scenario's MATH-500 points; the speedup at fixed
    interactivity read with ``throughput_at``."""
    rep = rtp.main(["--out", str(tmp_path / "o")])
    stem = tmp_path / "o" / "gpu_predicted"
    for ext in ("json", "md", "png"):
        assert stem.with_suffix("." + ext).stat().st_size > 0
    assert json.loads(stem.with_suffix(".json").read_text())["benchmark"] == "roofline_throughput"
    assert [s["key"] for s in rep["scenarios"]] == ["qwen3-8b_h100", "qwen3-8b_b200", "gpt-oss-120b_8xb200"]
    b200 = rep["scenarios"][1]["sets"]["math500"]
    at = {(r["method"], r["batch"]): r["aggregate_tokens_per_s"] for r in b200["rows"]}
    assert rep["comparison"]["sglang"]["predicted"]["32"][rtp.FIXED] == pytest.approx(at["dflash", 32] / at["ar", 32])
    assert b200["tau"] == 7.87
    h100 = rep["scenarios"][0]
    assert h100["sweep_stopped"]["batch"] == 256  # 84 GB of weights + K/V against 72
    assert max(r["batch"] for r in h100["sets"]["math500"]["rows"]) == 128
    text = stem.with_suffix(".md").read_text()
    assert "Against SGLang" in text and "compute-bound" in text
