"""The EAGLE-3 roofline (``dflash_jax.tools.roofline_eagle3``, ``roofline --eagle3``): an EAGLE-3
iteration's bytes and FLOPs counted by hand for a tiny config (chain and tree), its time and
speedup on a 1 byte/s, 1 FLOP/s device, the DFlash row equal to the dense roofline's iteration,
the draft growing with the steps k, the refusals, and the command's files."""

import json

import pytest

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.tools import roofline, roofline_eagle3 as re3

pytestmark = pytest.mark.xdist_group("test_roofline_eagle3")

# test_roofline's small target: D 8, F 16, 2 layers, 2 heads / 1 KV head of 4, vocab 32
SMALL = TargetConfig(model_type="qwen3", vocab_size=32, hidden_size=8, intermediate_size=16,
                     num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
DRAFTER = DrafterConfig.for_target(SMALL, num_layers=1, block_size=4, mask_token_id=1,
                                   target_layer_ids=(0, 1))
EAGLE = re3.eagle3_config(SMALL, 16)  # draft vocabulary 16, feature layers (0, 1, 1)
UNIT = roofline.Device("1 byte/s, 1 FLOP/s", bandwidth=1.0, peak_flops=1.0, source="test")

# The layer's matrices: q 2D*H*Dh = 16*8 = 128, k = v = 16*4 = 64, o 8*8 = 64, MLP 3*8*16 = 384:
# 704 parameters, + 3 norms of 8 = 728, 1456 bytes in bf16. K/V of one entry: 2 * 1 * 4 * 2 B = 16 B.
# The head: 16 * 8 + 8 (norm) = 136 parameters, 272 B; one row's float32 logits 64 B.
CHAIN = {  # k = 3 steps, S = 10 cached entries, 4 committed rows projected (k + 1)
    # fc [24, 8] on 4 rows: 2*4*24*8 FLOPs, 24*8*2 B weights, 4 rows of 24 taps read (2 B)
    "eagle3 fc": (1536, 384, 0, 0, 192),
    # 4 rows through the layer; 4*10 + 4*5/2 = 50 pairs * 4*2*4; 10 entries read, 4 written; 4 embedding rows
    "eagle3 step 1 layer": (5632, 1456, 0, 0, 64),
    "eagle3 step 1 attention": (1600, 0, 160, 64, 0),
    "eagle3 step 1 head": (256, 272, 0, 0, 64),  # the last row only: 2*8*16
    # 1 row; it sees 10 + 4 committed entries and itself: 15 pairs; 14 entries read
    "eagle3 step 2 layer": (1408, 1456, 0, 0, 16),
    "eagle3 step 2 attention": (480, 0, 224, 16, 0),
    "eagle3 step 2 head": (256, 272, 0, 0, 64),
    # its parent and itself: 16 pairs; 15 entries read
    "eagle3 step 3 layer": (1408, 1456, 0, 0, 16),
    "eagle3 step 3 attention": (512, 0, 240, 16, 0),
    "eagle3 step 3 head": (256, 272, 0, 0, 64),
}
TREE_STEPS = {  # the same with a frontier of topk = 2 rows per step after the first
    "eagle3 step 2 layer": (2816, 1456, 0, 0, 32),
    "eagle3 step 2 attention": (960, 0, 224, 32, 0),  # 2 rows * 15 pairs
    "eagle3 step 2 head": (512, 272, 0, 0, 128),
    "eagle3 step 3 layer": (2816, 1456, 0, 0, 32),
    "eagle3 step 3 attention": (1024, 0, 256, 32, 0),  # 2 * 16 pairs; 14 + 2 step-2 entries read
    "eagle3 step 3 head": (512, 272, 0, 0, 128),
}


def by_name(costs):
    return {c.name: (c.flops, c.weights, c.kv_read, c.kv_write, c.activations) for c in costs}


def test_eagle3_draft_by_hand():
    assert by_name(re3.eagle3_draft(EAGLE, re3.Method("eagle3", 3), 10)) == CHAIN
    tree = re3.eagle3_draft(EAGLE, re3.Method("eagle3", 3, nodes=6, topk=2), 10)
    assert by_name(tree) == CHAIN | TREE_STEPS
    assert re3.eagle3_params(EAGLE) == 24 * 8 + 704 + 24 + 8 + 128


def test_eagle3_verify_by_hand():
    """The chain verifies k + 1 = 4 rows causally, 3 layers' taps written: the target's 576
    matrix parameters per layer, 4 * 8 * (1 + 3) * 2 B of embeddings and taps, 4*10 + 10 pairs;
    the tree verifies its 6 nodes under the ancestor mask and compacts at most 4 rows."""
    chain = by_name(re3.eagle3_verify(SMALL, re3.Method("eagle3", 3), 10))
    assert chain == {"target linears": (9216, 2400, 0, 0, 256),
                     "target attention": (3200, 0, 320, 128, 0),
                     "target LM head": (2048, 528, 0, 0, 512)}
    tree = by_name(re3.eagle3_verify(SMALL, re3.Method("eagle3", 3, nodes=6, topk=2), 10))
    assert tree["target attention"] == (4 * 2 * 2 * 4 * (6 * 10 + 36), 0, 320, 192, 0)
    assert tree["KV compact"] == (0, 0, 4 * 32, 4 * 32, 0)


def test_time_and_speedup_by_hand(monkeypatch):
    """On 1 byte/s and 1 FLOP/s a component takes max(bytes, FLOPs) s. The chain's draft:
    1536 + (5632 + 1600 + 336) + (1472 + 480 + 336) + (1472 + 512 + 336) = 13712; its verify
    9216 + 3200 + 2048 = 14464; the AR step 3776 (test_roofline's counts). At tau 2.96 the
    speedup is 2.96 * 3776 / 28176; DFlash's row is the dense roofline's block-4 iteration."""
    monkeypatch.setitem(roofline.DEVICES, "unit", UNIT)
    res = re3.analyse(SMALL, DRAFTER, EAGLE, re3.methods(3, [(6, 2)]), 10, ["unit"])["devices"]["unit"]
    assert res["t_ar_us"] == pytest.approx(1e6 * 3776)
    d, chain, tree = res["methods"]
    assert chain["method"] == "eagle3 chain 3" and chain["verify_rows"] == 4
    assert chain["draft_us"] == pytest.approx(1e6 * 13712)
    assert chain["verify_us"] == pytest.approx(1e6 * 14464)
    assert chain["speedup"] == pytest.approx(2.96 * 3776 / 28176)
    dense_iter = roofline.dflash_iteration(SMALL, DRAFTER, 4, 10)
    assert d["t_iter_us"] == pytest.approx(1e6 * roofline.seconds(dense_iter, UNIT))
    assert d["draft_us"] == pytest.approx(1e6 * roofline.seconds(dense_iter[:4], UNIT))
    assert d["speedup"] == pytest.approx(6.49 / d["ratio"])
    assert chain["tau_to_match_dflash"] == pytest.approx(d["speedup"] * chain["ratio"])
    assert tree["method"] == "eagle3 tree 6" and tree["verify_rows"] == 6


def test_qwen3_8b_draft_grows_with_the_steps():
    """Each EAGLE-3 step reads the layer and the head again: on an H100 the draft grows by at
    least their bytes / bandwidth per step (the memory floor of a batch-1 step)."""
    q = TargetConfig(**roofline.PRESETS["qwen3-8b"])
    e = re3.eagle3_config(q)
    assert e.target_layer_ids == (1, 17, 32) and e.draft_vocab_size == 32000
    dev = roofline.DEVICES["h100"]
    per_step = (sum(re3.eagle3_layer_params(e).values()) + 32000 * 4096) * 2 / dev.bandwidth
    times = [roofline.seconds(re3.eagle3_draft(e, re3.Method("eagle3", k), 1024), dev) for k in range(1, 9)]
    for a, b in zip(times, times[1:]):
        assert b - a >= per_step


@pytest.mark.parametrize("argv, match", [
    (["--eagle3", "--eagle3-trees", "16"], "give N:TOPK"),
    (["--eagle3", "--eagle3-trees", "1:4"], "N >= 2 nodes"),
    (["--eagle3", "--eagle3-steps", "0"], "--eagle3-steps must be >= 1"),
    (["--eagle3", "--tree"], "leave out --moe, --hybrid and --tree"),
])
def test_bad_command_lines_refused(tmp_path, argv, match):
    with pytest.raises(ValueError, match=match):
        roofline.main(argv + ["--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_command_writes_json_markdown_and_plot(tmp_path):
    rep = roofline.main(["--eagle3", "--out", str(tmp_path / "o")])
    stem = tmp_path / "o" / "eagle3_qwen3-8b_k7_S1024_b1"
    for ext in ("json", "md", "png"):
        assert stem.with_suffix("." + ext).stat().st_size > 0
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["settings"]["trees"] == [[16, 4], [60, 10]]
    r = rep["analysis"]["devices"]["h100"]
    assert [m["method"] for m in r["methods"]] == ["dflash", "eagle3 chain 7", "eagle3 tree 16", "eagle3 tree 60"]
    for m in r["methods"]:
        assert m["t_iter_us"] == pytest.approx(m["draft_us"] + m["verify_us"])
        assert m["speedup"] == pytest.approx(m["tau"] * r["t_ar_us"] / m["t_iter_us"])
    md = stem.with_suffix(".md").read_text()
    assert "| eagle3 tree 16 | 16 |" in md and "1.76x / 2.96" in md
