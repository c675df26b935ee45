"""The Gemma 4 roofline (``dflash_jax.tools.roofline_gemma4``, ``roofline --gemma4``): a tiny
target's step costs by hand (per-layer head dims and KV heads, sliding windows, KV-shared layers
reading without writing, the MoE block's experts read per row), the counts against the family's
size model and the released sizes, and the command's files."""

import json

import pytest

from dflash_jax.config import TargetConfig
from dflash_jax.targets import gemma4
from dflash_jax.tools import roofline, roofline_gemma4 as rg

pytestmark = pytest.mark.xdist_group("test_roofline_gemma4")

SL, FL = "sliding_attention", "full_attention"
# D 8, layers [S, F, S, F] of which the last two share the first two's K/V, window 3; sliding
# layers 1 KV head of 4, full layers 1 KV head of 8 (keys as values); 2 heads; MLP 8; vocab 32
TINY = TargetConfig.from_hf_dict(dict(
    model_type="gemma4_text", vocab_size=32, hidden_size=8, intermediate_size=8, num_hidden_layers=4,
    num_attention_heads=2, num_key_value_heads=1, head_dim=4, global_head_dim=8, num_global_key_value_heads=1,
    attention_k_eq_v=True, sliding_window=3, layer_types=[SL, FL, SL, FL], num_kv_shared_layers=2,
    hidden_size_per_layer_input=0, tie_word_embeddings=True))


def by_name(costs):
    return {c.name: (c.flops, c.weights, c.kv_read, c.kv_write, c.activations) for c in costs}


def test_ar_step_by_hand():
    """bf16, context 10. Matrices per layer: q 8*2*Dh, o 2*Dh*8, k and v 8*Dh (own K/V only; no
    v on the full layer, keys as values), MLP 3*8*8 = 192; Dh 4 / 8 for sliding / full. Layer 0
    (S): 64+64+32+32+192 = 384; 1 (F): 128+128+64+192 = 512; 2 (S, shared): 64+64+192 = 320; 3
    (F, shared, no wide MLP): 128+128+192 = 448; sum 1664. K/V read per position: sliding 2*1*4*2 = 16 B over min(10, 2) =
    2 positions, full 2*1*8*2 = 32 B over 10; writes only layers 0 and 1."""
    assert gemma4.GEMMA4.matrix_params(TINY) - 32 * 8 == 1664
    vectors = gemma4.GEMMA4.num_params(TINY) - gemma4.GEMMA4.matrix_params(TINY)
    got = by_name(rg.ar_step(TINY, 10))
    assert got["target linears"] == (2 * 1664, (1664 + vectors) * 2, 0, 0, 8 * 2)
    pairs = {0: 2 + 1, 1: 10 + 1, 2: 2 + 1, 3: 10 + 1}  # cached positions seen plus the row itself
    flops = sum(4 * 2 * (8 if i % 2 else 4) * p for i, p in pairs.items())
    assert got["target attention"] == (flops, 0, 2 * 16 * 2 + 2 * 32 * 10, 16 + 32, 0)
    assert got["target LM head"] == (2 * 8 * 32, (32 * 8 + 8) * 2, 0, 0, 32 * 4)
    no_window = by_name(rg.ar_step(TINY, 10, windowed=False))["target attention"]
    assert no_window[2] == 2 * 16 * 10 + 2 * 32 * 10
    assert gemma4.GEMMA4.state_bytes_per_token(TINY, 2) == 16 + 32  # the shared layers keep none


def test_moe_block_reads_the_experts_its_rows_route_to():
    import dataclasses

    cfg = dataclasses.replace(TINY, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=4)
    fam = gemma4.GEMMA4
    expert = 3 * 8 * 4
    base = rg.ar_step(TINY, 10)[0]
    one = rg.ar_step(cfg, 10)[0]
    router = 8 * 8  # a router [D, E] per layer
    # one row: k = 2 experts of each layer read and multiplied
    assert one.flops - base.flops == 2 * 4 * (router + 2 * expert)
    assert (one.weights - base.weights) / 2 == pytest.approx(4 * (router + 2 * expert) + fam.num_params(cfg)
                                                             - fam.matrix_params(cfg) - (fam.num_params(TINY)
                                                                                          - fam.matrix_params(TINY)))
    verify = rg.target_forward(cfg, 16, 10)[0]
    read = 8 * (1 - (1 - 2 / 8) ** 16)  # E (1 - (1 - k/E)^rows)
    assert (verify.weights - rg.target_forward(TINY, 16, 10)[0].weights) / 2 == pytest.approx(
        4 * (router + read * expert) + fam.num_params(cfg) - fam.matrix_params(cfg)
        - (fam.num_params(TINY) - fam.matrix_params(TINY)))


def test_released_sizes():
    """Gemma 4 31B: 30.7B parameters (Google's figure); 26B-A4B: 25.2B of which 3.8B per token
    (Google: 25.2B, 3.8B active); the 31B's K/V per token: 50 sliding layers of 16 x 256 and 10
    full of 4 x 512, keys and values, bf16."""
    big = rg.config_of(rg.MODELS["gemma-4-31b"])
    moe = rg.config_of(rg.MODELS["gemma-4-26b-a4b"])
    fam = gemma4.GEMMA4
    assert fam.num_params(big) / 1e9 == pytest.approx(30.7, abs=0.05)
    assert fam.num_params(moe) / 1e9 == pytest.approx(25.2, abs=0.1)
    assert fam.matrix_params_per_token(moe) / 1e9 == pytest.approx(3.8, abs=0.1)
    assert fam.state_bytes_per_token(big, 2) == 2 * 2 * (50 * 16 * 256 + 10 * 4 * 512)


def test_command_writes_the_report(tmp_path):
    out = tmp_path / "g4"
    roofline.main(["--gemma4", "gemma-4-31b", "gemma-4-26b-a4b", "--out", str(out)])
    report = json.loads((out / "roofline_gemma4.json").read_text())
    assert {r["model"] for r in report["results"]} == {"gemma-4-31b", "gemma-4-26b-a4b"}
    assert {(r["device"], r["context"]) for r in report["results"]} == {
        (d, c) for d in ("h100", "b200") for c in rg.CONTEXTS}
    by = {(r["model"], r["device"], r["context"]): r for r in report["results"]}
    long = by[("gemma-4-31b", "b200", 32768)]
    assert long["ar_kv_read_bytes"] < long["ar_kv_read_bytes_without_window"] / 5  # the windows' saving
    short = by[("gemma-4-31b", "b200", 1024)]
    assert short["ar_kv_read_bytes"] < short["ar_kv_read_bytes_without_window"]  # W - 1 < S
    assert by[("gemma-4-26b-a4b", "b200", 1024)]["ratio"] > 2 * short["ratio"]  # a verify reads most experts
    assert "5.8x" in (out / "roofline_gemma4.md").read_text()
    assert (out / "roofline_gemma4.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="--gemma4 names its targets itself"):
        roofline.main(["--gemma4", "gemma-4-31b", "--moe", "gpt-oss-120b", "--out", str(out)])
