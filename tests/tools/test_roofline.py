"""The roofline model: its counts against hand-computed values for a small config, against
the models' real parameter trees, and against XLA's cost analysis of the compiled programs."""

import json

import jax
import pytest

from dflash_jax.bench import decode_speed
from dflash_jax.tools import roofline
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.targets import init_target_params

# D 8, F 16, 2 layers, 2 heads / 1 KV head of 4, vocab 32. Per layer: q 8*2*4 = 64, k = v =
# 8*1*4 = 32, o 64, MLP 3*8*16 = 384 (576 matrix parameters); vectors 2*8 + 2*4 = 24 (Qwen3).
SMALL = TargetConfig(model_type="qwen3", vocab_size=32, hidden_size=8, intermediate_size=16,
                     num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
DRAFTER = DrafterConfig.for_target(SMALL, num_layers=1, block_size=4, mask_token_id=1,
                                   target_layer_ids=(0, 1))
UNIT = roofline.Device("1 byte/s, 1 FLOP/s", bandwidth=1.0, peak_flops=1.0, source="test")


def by_name(costs):
    return {c.name: (c.flops, c.weights, c.kv_read, c.kv_write, c.activations) for c in costs}


def test_ar_step_by_hand():
    """One AR step at context 10, bf16 (2 bytes)."""
    costs = by_name(roofline.ar_step(SMALL, 10))
    assert costs == {
        # 2 FLOPs * 1 row * 2 layers * 576; weights 2 * (576 + 24) * 2 B; embedding row 8 * 2 B
        "target linears": (2304, 2400, 0, 0, 16),
        # pairs 1 * 10 + 1 = 11: 4 * 2 layers * 2 heads * 4 * 11; KV 10 positions * 2 (K, V) *
        # 2 layers * 1 head * 4 * 2 B = 320 read, the new row's 32 written
        "target attention": (704, 0, 320, 32, 0),
        # 2 * 8 * 32; (32 * 8 + 8 final norm) * 2 B; 32 float32 logits
        "target LM head": (512, 528, 0, 0, 128),
    }


def test_dflash_iteration_by_hand():
    """bs 4 at context 10 with a 1-layer, 2-tap drafter; the 4 rows of the last block are
    projected as new context (ctx_rows = bs, as the engine does)."""
    costs = by_name(roofline.dflash_iteration(SMALL, DRAFTER, 4, 10))
    assert costs == {
        # 2 * 4 rows * 16 * 8; (16 * 8 + 8 hidden_norm) * 2 B; taps read 4 * 16 * 2 B
        "drafter fc": (1024, 272, 0, 0, 128),
        # 2 * (4 rows * (64 + 64 + 384) + 8 rows (block + context) * (32 + 32)); 600 * 2 B;
        # 4 block embeddings * 8 * 2 B
        "drafter linears": (5120, 1200, 0, 0, 64),
        # non-causal: 4 * (10 + 4) = 56 pairs * 4 * 2 * 4; 10 context positions * 2 * 4 * 2 B
        # read; only the 4 context rows written, not the block
        "drafter attention": (1792, 0, 160, 64, 0),
        # the target's head on bs - 1 = 3 rows: 2 * 3 * 8 * 32; 3 * 32 * 4 B logits
        "drafter LM head": (1536, 528, 0, 0, 384),
        # 2 * 2 layers * 4 rows * 576; embeddings in + 2 taps out: 4 * 8 * 3 * 2 B
        "target linears": (9216, 2400, 0, 0, 192),
        # causal: 4 * 10 + (1 + 2 + 3 + 4) = 50 pairs * 4 * 2 * 2 * 4; 4 rows * 32 B written
        "target attention": (3200, 0, 320, 128, 0),
        "target LM head": (2048, 528, 0, 0, 512),
    }
    it = roofline.dflash_iteration(SMALL, DRAFTER, 4, 10)
    assert roofline.total(it, "flops") == 23936 and roofline.total(it, "bytes") == 6880


def test_time_sums_per_component_maxima():
    """At 1 byte/s and 1 FLOP/s: linears 2416 B vs 2304 FLOP, attention 352 B vs 704 FLOP,
    LM head 656 B vs 512 FLOP: 2416 + 704 + 656 s (one max over the totals would say 3520)."""
    costs = roofline.ar_step(SMALL, 10)
    assert roofline.seconds(costs, UNIT) == 2416 + 704 + 656
    assert [c.bound(UNIT) for c in costs] == ["memory", "compute", "memory"]
    times = roofline.step_times(SMALL, DRAFTER, 4, 10, UNIT)
    assert times["t_ar_s"] == 3776
    # iteration: max per component = 1024 + 5120 + 1792 + 1536 + 9216 + 3200 + 2048
    assert times["t_iter_s"] == 23936 and times["ratio"] == pytest.approx(23936 / 3776)
    assert roofline.predicted_speedup(6.49, 1.0, roofline.PAPER_IMPLIED_RATIO) == pytest.approx(4.86)


def test_datasheet_devices():
    h100, h200, b200 = (roofline.DEVICES[k] for k in ("h100", "h200", "b200"))
    assert (h100.bandwidth, h200.bandwidth, b200.bandwidth) == (3.35e12, 4.8e12, 8e12)
    assert h100.peak_flops == h200.peak_flops == 989e12 and b200.peak_flops == 2.25e15


@pytest.mark.parametrize("cfg", [
    SMALL,
    TargetConfig(model_type="llama", vocab_size=48, hidden_size=16, intermediate_size=24,
                 num_layers=3, num_heads=4, num_kv_heads=2, head_dim=4, attention_bias=True),
    TargetConfig(model_type="qwen3", vocab_size=40, hidden_size=8, intermediate_size=12,
                 num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, tie_word_embeddings=True),
], ids=["qwen3", "llama-bias", "qwen3-tied"])
def test_weight_bytes_equal_the_parameter_trees(cfg):
    """The weights a step reads are the model's real parameters, less the input embedding
    table (only gathered) unless it is also the (tied) LM head; decode_speed counts with them."""
    params = jax.eval_shape(lambda k: init_target_params(cfg, k), jax.random.key(0))
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    if not cfg.tie_word_embeddings:
        n -= cfg.vocab_size * cfg.hidden_size
    kv = 3 * 7 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4  # 3 rows, 7 positions
    assert decode_speed.step_bytes(cfg, params, 3, 7) == {"weights": 4 * n, "kv": kv}


def test_drafter_parameter_count_equals_its_tree():
    params = jax.eval_shape(lambda k: init_drafter_params(DRAFTER, k), jax.random.key(0))
    assert roofline._drafter_params(DRAFTER) == sum(x.size for x in jax.tree_util.tree_leaves(params))


def test_counts_agree_with_xla_cost_analysis():
    """XLA's cost analysis of the project's compiled programs (1-layer versions): FLOPs within
    a few percent (XLA adds the elementwise ops), bytes never below the formula's floor."""
    target = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16)
    drafter = DrafterConfig.for_target(target, num_layers=2, block_size=4, mask_token_id=1,
                                       target_layer_ids=(0, 2))
    check = roofline.xla_check(target, drafter, block_size=4, cache_len=32)
    assert set(check["programs"]) == {"ar_step", "verify", "draft"}
    for name, p in check["programs"].items():
        assert 1.0 <= p["flops_ratio"] < 1.10, (name, p)
        assert 1.0 <= p["bytes_ratio_gather_corrected"] <= p["bytes_ratio"], (name, p)


def test_geometric_acceptance_and_best_block_size():
    assert roofline.geometric_tau(0.5, 4) == 1.875  # 1 + 1/2 + 1/4 + 1/8
    assert roofline.alpha_for_tau(1.875, 4) == pytest.approx(0.5)
    assert roofline.geometric_tau(roofline.alpha_for_tau(6.49, 16), 16) == pytest.approx(6.49)
    with pytest.raises(ValueError, match="between 1 and the block size"):
        roofline.alpha_for_tau(5.0, 4)
    rows = roofline.best_block_sizes({4: 1.2, 8: 1.25, 16: 1.3}, [3.0, 6.0, 10.0], reference_bs=16)
    # fixed tau: the cheapest block that can reach it (tau 3: bs 4, 3 / 1.2; tau 6: bs 8, 6 / 1.25)
    assert [(r["fixed_best_bs"], r["fixed_speedup"]) for r in rows] == [(4, 2.5), (8, 4.8), (16, 10 / 1.3)]
    # geometric: tau 10 at bs 16 needs alpha ~0.93, where bs 16's longer blocks beat bs 8's cost
    assert rows[2]["geometric_best_bs"] == 16
    assert rows[2]["geometric_speedup"] == pytest.approx(10 / 1.3)


def test_command_writes_json_markdown_and_plot(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(SMALL.to_hf_dict()))
    (tmp_path / "d" / "config.json").write_text(json.dumps(DRAFTER.to_hf_dict()))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"average": {"tau": 2.5}}))
    report = roofline.main(["--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"),
                            "--context", "10", "--bench-json", str(bench), "--tau", "3",
                            "--no-xla-check", "--out", str(tmp_path / "out")])
    h200 = report["analysis"]["devices"]["h200"]
    t_ar, t_iter = h200["t_ar_us"], h200["t_iter_us"]
    assert report["taus"] == {"ours": 2.5, "tau 3": 3.0}
    assert h200["speedup"]["ours"] == pytest.approx(2.5 * t_ar / t_iter)
    assert h200["ratio_by_block_size"]["4"] == pytest.approx(t_iter / t_ar)
    stem = tmp_path / "out" / "t_d1_bs4_S10_b1"
    assert json.loads(stem.with_suffix(".json").read_text())["settings"]["context"] == 10
    md = stem.with_suffix(".md").read_text()
    assert all(d.name in md for d in roofline.DEVICES.values())
    assert stem.with_suffix(".png").stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--target", "x"], "--target needs --drafter"),
    (["--block-size", "1", "--no-xla-check"], "--block-size must be >= 2"),
    (["--tau", "0.5", "--no-xla-check"], "--tau values"),
    (["--devices", "h100", "--no-xla-check"], "--plot-device h200 is not among"),
])
def test_command_refuses_bad_settings(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        roofline.main(argv + ["--out", str(tmp_path)])


def test_one_layer_of_a_drafter_with_sliding_layers():
    """The 1-layer pair of XLA's cost check keeps a drafter with its own attention shapes and
    sliding-window layers valid (its first layer's type)."""
    t = TargetConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                     num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16)
    d = DrafterConfig(num_layers=2, hidden_size=32, intermediate_size=48, num_heads=4,
                      num_kv_heads=2, head_dim=8, vocab_size=64, block_size=8, num_target_layers=4,
                      target_layer_ids=(1, 2), mask_token_id=3,
                      layer_types=("sliding_attention", "full_attention"), sliding_window=3)
    t1, d1 = roofline.one_layer(t, d)
    assert (t1.num_layers, d1.num_layers, d1.num_taps) == (1, 1, 2)
    assert d1.layer_types == ("sliding_attention",) and d1.sliding_window == 3
    assert (d1.num_heads, d1.head_dim) == (4, 8)
