"""The tree roofline (``dflash_jax.tools.roofline_tree``, ``roofline --tree``): a tree iteration's
costs and its predicted speedup by hand for a small config, the verify cost monotone in the node
budget, the compute-bound turn at the ridge point, the tau curve's interpolation and
extrapolation, the refusals, and the command's files."""

import json

import pytest

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.tools import roofline, roofline_tree as rt

pytestmark = pytest.mark.xdist_group("test_roofline_tree")

# test_roofline's small pair: D 8, F 16, 2 layers, 2 heads / 1 KV head of 4, vocab 32; per layer
# 576 matrix parameters and 24 vector ones; K/V of one position in both layers 2*2*1*4*2 B = 32 B
SMALL = TargetConfig(model_type="qwen3", vocab_size=32, hidden_size=8, intermediate_size=16,
                     num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
DRAFTER = DrafterConfig.for_target(SMALL, num_layers=1, block_size=4, mask_token_id=1,
                                   target_layer_ids=(0, 1))
UNIT = roofline.Device("1 byte/s, 1 FLOP/s", bandwidth=1.0, peak_flops=1.0, source="test")
QWEN = TargetConfig(**roofline.PRESETS["qwen3-8b"])
QWEN_DRAFTER = DrafterConfig.for_target(QWEN, 5, block_size=16, mask_token_id=roofline.QWEN3_MASK_TOKEN_ID)


def by_name(costs):
    return {c.name: (c.flops, c.weights, c.kv_read, c.kv_write, c.activations) for c in costs}


def test_tree_verify_by_hand():
    """6 tree rows at context 10, block 4 (the accepted path: at most 4 rows to move), 2 taps."""
    assert by_name(rt.tree_verify(SMALL, 6, 10, taps=2, block_size=4)) == {
        # 2 * 2 layers * 6 rows * 576; (576 + 24) * 2 layers * 2 B; embeddings in + 2 taps out 6 * 8 * 3 * 2 B
        "target linears": (13824, 2400, 0, 0, 288),
        # the whole masked block: 6 * 10 + 6 * 6 = 96 pairs * 4 * 2 layers * 2 heads * 4; 10 positions
        # read * 32 B, the 6 rows' K/V written
        "target attention": (6144, 0, 320, 192, 0),
        # 2 * 6 * 8 * 32; (32 * 8 + 8) * 2 B; 6 * 32 float32 logits
        "target LM head": (3072, 528, 0, 0, 768),
        # 4 rows * 32 B read and written
        "KV compact": (0, 0, 128, 128, 0),
    }


def test_speedup_by_hand(monkeypatch):
    """On a device of 1 byte/s and 1 FLOP/s a component takes max(bytes, FLOPs) seconds.
    AR step at context 10 (test_roofline's counts): max(2416, 2304) + max(352, 704) +
    max(656, 512) = 3776. Tree iteration of 6 nodes, block 4: the draft (test_roofline's counts)
    max(400, 1024) + max(1264, 5120) + max(224, 1792) + max(912, 1536) = 9472, the verify
    max(2688, 13824) + max(512, 6144) + max(1296, 3072) + max(256, 0) = 23296: 32768. With the
    chain measured at 3.245 (scale 6.49 / 3.245 = 2) and the tree of 6 at 1.9, tau 3.8 and the
    speedup 3.8 * 3776 / 32768."""
    monkeypatch.setitem(roofline.DEVICES, "unit", UNIT)
    curve = rt.tau_curve_from_dict({"chain": 3.245, "trees": {"6": 1.9}, "block_size": 4})
    r = rt.analyse(SMALL, DRAFTER, curve, [6], 10, ["unit"])["devices"]["unit"]
    assert r["t_ar_us"] == pytest.approx(1e6 * 3776)
    (row,) = r["trees"]
    assert row["t_iter_us"] == pytest.approx(1e6 * 32768)
    assert row["flat"]["tau"] == pytest.approx(3.8) and row["flat"]["measured"]
    assert row["flat"]["speedup"] == pytest.approx(3.8 * 3776 / 32768)
    assert r["chain"]["tau"] == 4.0  # 6.49 capped at the block


def test_verify_cost_monotone_in_nodes():
    """More tree rows never cost less: bytes, FLOPs and roofline time of the verify, and the
    whole iteration's time, non-decreasing in N on every device; strictly more FLOPs."""
    grid = [2, 4, 8, 16, 24, 32, 64, 96, 128, 200, 256, 300, 512, 1024, 4096]
    for name in ("h100", "h100-measured", "b200"):
        dev = roofline.DEVICES[name]
        prev = None
        for n in grid:
            v = rt.tree_verify(QWEN, n, 1024, taps=5, block_size=16)
            now = (roofline.total(v, "flops"), roofline.total(v, "bytes"), roofline.seconds(v, dev),
                   roofline.seconds(rt.tree_iteration(QWEN, QWEN_DRAFTER, 16, n, 1024), dev))
            if prev is not None:
                assert now[0] > prev[0] and all(a >= b for a, b in zip(now[1:], prev[1:])), (name, n)
            prev = now


def test_compute_bound_turn_at_the_ridge_point():
    """N-row bf16 linears do ~N FLOPs per weight byte, so the verify's linears turn compute-bound
    within 1 % above the ridge point (peak / bandwidth; the taps and embeddings add a little to
    the bytes); memory-bound one row below. The attention turns near (H / Hkv) N (1 + N / S) =
    ridge: N ~ 70 on an H100 at S = 1024 (within 10 %)."""
    for name in ("h100", "h100-measured", "h200", "b200"):
        dev = roofline.DEVICES[name]
        ridge = rt.ridge_point(dev)
        n = rt.compute_bound_nodes(QWEN, QWEN_DRAFTER, 16, 1024, dev)
        assert ridge <= n <= 1.01 * ridge + 1, (name, n, ridge)
        lin = lambda k: rt.tree_verify(QWEN, k, 1024, taps=5, block_size=16)[0]
        assert lin(n).bound(dev) == "compute" and lin(n - 1).bound(dev) == "memory"
    h100 = roofline.DEVICES["h100"]
    ratio = QWEN.num_heads // QWEN.num_kv_heads
    # (H / Hkv) N (1 + N / S) = ridge, solved for N
    expected = (-1 + (1 + 4 * rt.ridge_point(h100) / ratio / 1024) ** 0.5) / (2 / 1024)
    att = rt.compute_bound_nodes(QWEN, QWEN_DRAFTER, 16, 1024, h100, "target attention")
    assert att == pytest.approx(expected, rel=0.1)


def test_tau_curve_interpolation_and_extrapolation():
    """Measured budgets as given; between them linear in log2 N; below the smallest its tau;
    above the largest flat (the largest's) or log (the last doubling's gain per doubling,
    capped at the block)."""
    c = rt.tau_curve_from_dict({"chain": 4.0, "trees": {"16": 5.0, "64": 6.0}, "block_size": 8})
    assert c.tau(16) == (5.0, True) and c.tau(64, "log") == (6.0, True)
    assert c.tau(32) == (pytest.approx(5.5), False)  # halfway in log2 between 16 and 64
    assert c.tau(8) == (5.0, False)
    assert c.tau(256, "flat") == (6.0, False)
    assert c.tau(256, "log") == (pytest.approx(7.0), False)  # +0.5 per doubling, 2 doublings
    assert c.tau(4096, "log") == (8.0, False)  # capped at the block
    assert c.scale() == pytest.approx(6.49 / 4.0)


@pytest.mark.parametrize("curve, match", [
    ({"trees": {"16": 5.0}, "block_size": 16}, "needs the keys"),
    ({"chain": 5.0, "trees": {}, "block_size": 16}, "at least one"),
    ({"chain": 5.0, "trees": {"1": 5.0}, "block_size": 16}, "at least 2 nodes"),
    ({"chain": 5.0, "trees": {"x": 5.0}, "block_size": 16}, "not an integer"),
    ({"chain": 5.0, "trees": {"16": 17.0}, "block_size": 16}, r"tau of the tree 16 must be a number in \[1"),
    ({"chain": 0.5, "trees": {"16": 5.0}, "block_size": 16}, "tau of the chain"),
    ({"chain": 5.0, "trees": {"16": 5.0}, "block_size": 1}, "block_size must be an integer >= 2"),
])
def test_bad_tau_curves_refused(curve, match):
    with pytest.raises(ValueError, match=match):
        rt.tau_curve_from_dict(curve)


def test_bad_command_lines_refused(tmp_path):
    good = tmp_path / "tau.json"
    good.write_text(json.dumps({"chain": 5.0, "trees": {"16": 5.5}, "block_size": 16}))
    (tmp_path / "bad.json").write_text("{chain: 5")
    out = ["--out", str(tmp_path / "o")]
    cases = [(["--tree"], "--tree needs --tau-curve"),
             (["--tree", "1", "--tau-curve", str(good)], "must be >= 2"),
             (["--tree", "--tau-curve", str(tmp_path / "bad.json")], "is not JSON"),
             (["--tree", "--tau-curve", str(tmp_path / "missing.json")], "cannot be read"),
             (["--tree", "--tau-curve", str(good), "--block-size", "8"], "differs from the tau curve"),
             (["--tree", "--tau-curve", str(good), "--moe", "gpt-oss-20b"], "leave out --moe"),
             (["--tau-curve", str(good)], "goes with --tree")]
    for argv, match in cases:
        with pytest.raises(ValueError, match=match):
            roofline.main(argv + out)
    assert not (tmp_path / "o").exists()


def test_command_writes_json_markdown_and_plot(tmp_path):
    """``roofline --tree --tau-curve FILE``: the files, the chain row equal to the dense
    roofline's DFlash iteration at block 16, every speedup tau(N) t_AR / t_iter(N), one best N
    per extrapolation marked in the markdown."""
    path = tmp_path / "tau.json"
    path.write_text(json.dumps({"chain": 5.0, "trees": {"16": 5.5, "32": 6.0, "64": 6.25}, "block_size": 16,
                                "source": "a test curve"}))
    rep = roofline.main(["--tree", "--tau-curve", str(path), "--out", str(tmp_path / "o")])
    stem = tmp_path / "o" / "tree_qwen3-8b_d5_bs16_S1024_b1"
    for ext in ("json", "md", "png"):
        assert stem.with_suffix("." + ext).stat().st_size > 0
    assert rep["settings"]["nodes"] == list(rt.NODES)
    dense = roofline.step_times(QWEN, QWEN_DRAFTER, 16, 1024, roofline.DEVICES["h100"])
    r = rep["analysis"]["devices"]["h100"]
    assert r["chain"]["ratio"] == pytest.approx(dense["ratio"])
    assert r["chain"]["speedup"] == pytest.approx(6.49 / dense["ratio"])
    for row in r["trees"]:
        for how in rt.EXTRAPOLATIONS:
            assert row[how]["speedup"] == pytest.approx(row[how]["tau"] * r["t_ar_us"] / row["t_iter_us"])
    assert r["trees"][0]["flat"]["tau"] == pytest.approx(5.5 * 6.49 / 5.0)
    md = stem.with_suffix(".md").read_text()
    assert md.count("**best**") == 2 * len(rep["analysis"]["devices"])
    assert "scaled by 6.49 / 5.00" in md
