"""The MoE roofline (``dflash_jax.tools.roofline_moe``, ``roofline --moe``): the expected-experts
formula, parameter counts against transformers' own MoE models and the published sizes, a
tiny target's step costs by hand, expert parallelism's busiest device, the refusals, and the
command's files."""

import json

import pytest

from dflash_jax.tools import roofline, roofline_moe as rm

pytestmark = [pytest.mark.xdist_group("test_roofline_moe"), pytest.mark.torch]

# D 8, 2 layers, 2 heads / 1 KV head of 4, vocab 32, 4 experts of width 4, 2 per token
TINY = rm.MoeShape(model_type="qwen3_moe", vocab_size=32, hidden_size=8, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=4, num_experts=4, experts_per_token=2,
                   expert_intermediate_size=4, moe_layers=2, qk_norm=True)


def by_name(costs):
    return {c.name: (c.flops, c.weights, c.kv_read, c.kv_write, c.activations) for c in costs}


def test_expected_experts():
    """E (1 - (1 - k/E)^t): one token reads k; the issue's 16-row figures (~82 of 128 for k 8,
    ~51 for k 4); never more than E."""
    assert rm.expected_experts(128, 8, 1) == pytest.approx(8)
    assert rm.expected_experts(128, 8, 16) == pytest.approx(82.4, abs=0.05)
    assert rm.expected_experts(128, 4, 16) == pytest.approx(51.0, abs=0.05)
    assert rm.expected_experts(4, 2, 3) == pytest.approx(3.5)  # 4 (1 - 1/8)
    assert rm.expected_experts(128, 4, 10_000) == pytest.approx(128)


def test_ar_step_and_verify_by_hand():
    """bf16, context 10. Per layer: attention 2*8*2*4 + 2*8*1*4 = 192, router 8*4 = 32,
    vectors 2*8 + 2*4 = 24; an expert 3*8*4 = 96."""
    assert by_name(rm.ar_step(TINY, 10)) == {
        # 2 * (2 * 192 + 2 * 32) FLOPs; (448 + 48) * 2 B; one embedding row 8 * 2 B
        "target linears": (896, 992, 0, 0, 16),
        # 1 row reads k = 2 experts a layer: 2 layers * 2 * 96 * 2 B; 2 * 2 * 2 * 96 FLOPs
        "target experts": (768, 768, 0, 0, 0),
        # 2 layers * 11 pairs * 4 * 2 heads * 4; K/V 10 positions * 2 layers * 2 * 4 * 2 B
        "target attention": (704, 0, 320, 32, 0),
        "target LM head": (512, 528, 0, 0, 128),
    }
    verify = by_name(rm.moe_target_forward(TINY, 3, 10, taps=2))
    # 3 rows read E_read(3) = 3.5 experts a layer (bytes), but compute only k per row (FLOPs)
    assert verify["target experts"] == (2 * 3 * 2 * 2 * 96, 2 * 3.5 * 96 * 2, 0, 0, 0)
    assert verify["target linears"][4] == 3 * 8 * 3 * 2  # embeddings in, 2 taps out


def test_sliding_layers_and_tensor_parallel_split():
    """A sliding layer (W 4) reads min(S, W - 1) = 3 cached positions and each row sees
    min(S + i + 1, W) = 4 keys; 2 devices halve heads, KV, experts' bytes and the LM head."""
    s = rm.MoeShape(model_type="gpt_oss", vocab_size=32, hidden_size=8, num_layers=2, num_heads=2,
                    num_kv_heads=2, head_dim=4, num_experts=4, experts_per_token=2,
                    expert_intermediate_size=4, moe_layers=2, sliding_window=4, sliding_layers=1)
    att = by_name(rm.moe_target_forward(s, 3, 10))["target attention"]
    pairs = (3 * 10 + 6) + 3 * 4  # the full layer, then the sliding one
    per_pos = 2 * 2 * 4 * 2
    assert att == (4 * 2 * 4 * pairs, 0, (10 + 3) * per_pos, 3 * 2 * per_pos, 0)
    one, two = (by_name(rm.moe_target_forward(s, 3, 10, rm.Layout(p))) for p in (1, 2))
    assert two["target experts"][1] == one["target experts"][1] / 2
    assert two["target attention"][2] == one["target attention"][2] / 2
    assert two["target LM head"][1] == (16 * 8 + 8) * 2


def test_parameter_counts_equal_transformers_models():
    """num_params of a config.json equals the parameters of transformers' model built from it:
    qwen3_moe with a dense layer (mlp_only_layers) and gpt_oss (biases, sinks, sliding)."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    qcfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1])
    gcfg = GptOssConfig(vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=4)
    for cfg, model in ((qcfg, Qwen3MoeForCausalLM), (gcfg, GptOssForCausalLM)):
        shape = rm.shape_from_hf(cfg.to_dict())
        n = sum(p.numel() for p in model(cfg).parameters())
        assert rm.num_params(shape) == n, cfg.model_type
    q = rm.shape_from_hf(qcfg.to_dict())
    assert (q.moe_layers, q.dense_layers, q.dense_intermediate_size) == (2, 1, 24)
    g = rm.shape_from_hf(gcfg.to_dict())
    assert (g.sliding_layers, g.sliding_window, g.attention_sinks, g.expert_bias) == (1, 4, True, True)


def test_published_sizes():
    """The named configs give the models' published sizes: gpt-oss-120b 116.8B (5.1B active),
    Qwen3-Coder-30B-A3B 30.5B (3.3B active with the embedding row)."""
    g = rm.shape_from_hf(rm.MODELS["gpt-oss-120b"])
    assert rm.num_params(g) == pytest.approx(116.8e9, rel=2e-3)
    assert rm.active_params(g) == pytest.approx(5.13e9, rel=1e-2)
    q = rm.shape_from_hf(rm.MODELS["qwen3-coder-30b-a3b"])
    assert rm.num_params(q) == pytest.approx(30.5e9, rel=2e-3)
    assert rm.active_params(q) + q.vocab_size * q.hidden_size == pytest.approx(3.35e9, rel=1e-2)
    # DeepSeek-V3 671B (37B activated: here with the embedding row), Kimi-K2.5's text model 1.03T
    # (the card: 1T total, 32B activated)
    ds = rm.shape_from_hf(rm.MODELS["deepseek-v3"])
    assert rm.num_params(ds) == pytest.approx(671.0e9, rel=1e-3)
    assert rm.active_params(ds) + ds.vocab_size * ds.hidden_size == pytest.approx(37.5e9, rel=1e-2)
    k = rm.shape_from_hf(rm.MODELS["kimi-k2.5"])
    assert rm.num_params(k) == pytest.approx(1.03e12, rel=1e-2)
    assert rm.active_params(k) + k.vocab_size * k.hidden_size == pytest.approx(32.9e9, rel=1e-2)
    # the released drafters: 0.78B and 0.47B without the shared embedding and head
    for name, n in (("gpt-oss-120b", 0.785e9), ("qwen3-coder-30b-a3b", 0.474e9)):
        assert roofline._drafter_params(rm.DrafterConfig(**rm.DRAFTERS[name])) == pytest.approx(n, rel=1e-2)


# MLA: D 8, 2 heads, kv latent 4, rope 2, no-rope 2, value 2, no q latent; 1 MoE layer
MLA = rm.MoeShape(model_type="deepseek_v3", vocab_size=32, hidden_size=8, num_layers=1, num_heads=2,
                  num_kv_heads=2, head_dim=2, num_experts=4, experts_per_token=2, expert_intermediate_size=4,
                  moe_layers=1, shared_expert_size=4, shared_gate=False, router_bias=True,
                  kv_lora_rank=4, qk_nope_head_dim=2, v_head_dim=2)


def test_latent_attention_by_hand():
    """MLA per layer: q 8*2*4 = 64 and kv_b 4*2*4 = 32 and o 2*2*8 = 32 split by heads, kv_a
    8*(4+2) = 48 replicated; a cached position holds r + dr = 6 numbers on every device (not
    halved by 2 GPUs); each (query, key) pair costs a head 2 (2r + dr) = 20 FLOPs."""
    assert rm.attention_params(MLA) == 64 + 32 + 32 + 48
    one, two = (by_name(rm.moe_target_forward(MLA, 3, 10, rm.Layout(p))) for p in (1, 2))
    pairs = 3 * 10 + 6
    assert one["target attention"] == (2 * 20 * pairs, 0, 10 * 6 * 2, 3 * 6 * 2, 0)
    assert two["target attention"] == (1 * 20 * pairs, 0, 10 * 6 * 2, 3 * 6 * 2, 0)
    # linears' FLOPs on one of 2 GPUs: half the per-head matrices (128) and of the shared expert
    # (3*8*4 = 96), all of the latent path and the router
    lin1, lin2 = one["target linears"][0], two["target linears"][0]
    assert lin1 - lin2 == 2 * 3 * (128 + 96) / 2


def test_latent_attention_counts_equal_transformers_and_the_family():
    """A DeepSeek-V3 config.json: the roofline's count equals transformers' model (its routers'
    correction biases are buffers there) and the deepseek_v3 family's size model; the state
    bytes per token are the family's; kimi_k25 reads its text_config."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from dflash_jax import targets

    torch.manual_seed(0)
    for q_lora in (24, None):
        cfg = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                               kv_lora_rank=16, q_lora_rank=q_lora, qk_rope_head_dim=8, qk_nope_head_dim=12,
                               v_head_dim=10, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                               topk_group=2, n_shared_experts=2, first_k_dense_replace=1)
        model = DeepseekV3ForCausalLM(cfg)
        n = sum(p.numel() for p in model.parameters()) + sum(
            b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
        d = cfg.to_dict()
        shape = rm.shape_from_hf(d)
        fam = targets.family("deepseek_v3")
        assert rm.num_params(shape) == n == fam.num_params(fam.config_from_hf(d)), q_lora
        assert (shape.moe_layers, shape.dense_layers, shape.shared_expert_size) == (2, 1, 32)
        per_token = 3 * rm.kv_numbers_per_position(shape, 4) * 2
        assert per_token == fam.state_bytes_per_token(fam.config_from_hf(d), 2)
        assert rm.shape_from_hf({"model_type": "kimi_k25", "text_config": {**d, "model_type": "kimi_k2"}}) == shape


def test_expert_parallel_busiest_device():
    """On 1 device the busiest device reads E_read; on E devices (one expert each) at most one
    expert; on 8 of 128 the busiest reads more than the mean E_read / 8 and no more than 16."""
    assert rm.ep_load(16, 2, 1, 3)["max_experts"] == pytest.approx(rm.expected_experts(16, 2, 3), rel=0.03)
    assert rm.ep_load(8, 2, 8, 5)["max_experts"] == 1.0
    load = rm.ep_load(128, 4, 8, 10)
    assert load["mean_experts"] < load["max_experts"] <= 16
    assert load["max_assignments"] >= 10 * 4 / 8


def test_more_rows_cost_more_than_dense():
    """The MoE pair's t_iter / t_AR grows with the block size (the verify reads more experts);
    reading only k experts per layer would bring it back down."""
    name, s, drafter = rm.pair("qwen3-coder-30b-a3b")
    r4, r16 = (rm.step_times(s, drafter, bs, 1024, "h100")["ratio"] for bs in (4, 16))
    assert 1.5 < r4 < r16
    k_only = rm.dataclasses.replace(s, num_experts=s.experts_per_token)
    assert rm.step_times(k_only, drafter, 16, 1024, "h100")["ratio"] < 1.5


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="qwen3_moe, gpt_oss or deepseek_v3"):
        rm.shape_from_hf({"model_type": "mixtral", "hidden_size": 8, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "vocab_size": 8})
    with pytest.raises(ValueError, match="num_experts_per_tok"):  # missing from the config
        rm.shape_from_hf({"model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "vocab_size": 8, "num_experts": 4,
                          "moe_intermediate_size": 4})
    with pytest.raises(ValueError, match="must divide num_key_value_heads"):
        rm.check_layout(TINY, rm.Layout(2))
    with pytest.raises(ValueError, match="neither a named MoE config"):
        rm.pair(str(tmp_path / "missing"))


def test_command_writes_json_markdown_and_plot(tmp_path):
    """``roofline --moe`` on a config.json path (one device profile) and on a named model with
    its TP and EP scenarios: files written, speedup = tau t_AR / t_iter."""
    cfg = dict(rm.MODELS["gpt-oss-20b"], num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg))
    rep = roofline.main(["--moe", str(tmp_path / "t"), "--moe-devices", "h100", "--block-size", "4",
                         "--out", str(tmp_path / "a")])
    assert [r["label"].split(",")[0] for r in rep["scenarios"]] == ["t"]
    for ext in ("json", "md", "png"):
        assert (tmp_path / "a" / f"moe.{ext}").stat().st_size > 0
    rep = roofline.main(["--moe", "gpt-oss-120b", "--out", str(tmp_path / "b")])
    layouts = [(r["device"], r["layout"]["devices"], r["layout"]["experts"]) for r in rep["scenarios"]]
    assert ("b200", 8, "tp") in layouts and ("b200", 8, "ep") in layouts
    for r in rep["scenarios"]:
        assert r["speedup"]["gsm8k"] == pytest.approx(5.3 * r["t_ar_us"] / r["t_iter_us"])
        assert r["block_size"] == 10 and r["experts_read"]["verify"] == pytest.approx(34.82, abs=0.01)
    md = (tmp_path / "b" / "moe.md").read_text()
    assert "EP 8" in md and "Best block size" in md


@pytest.mark.parametrize("name", ["qwen3-coder-30b-a3b", "gpt-oss-120b"])
def test_agrees_with_the_families_size_model(name):
    """The roofline's counts from config.json alone equal the registered family's size model
    (``TargetFamily.num_params`` / ``matrix_params_read`` / ``matrix_params_per_token``, which
    also count the input embedding table)."""
    from dflash_jax import targets
    from dflash_jax.config import TargetConfig

    cfg = TargetConfig.from_hf_dict(rm.MODELS[name])
    family, s = targets.family_of(cfg), rm.shape_from_hf(rm.MODELS[name])
    embedding = s.vocab_size * s.hidden_size
    assert family.num_params(cfg) == rm.num_params(s)
    assert family.matrix_params_per_token(cfg) == rm.active_params(s) + embedding
    for rows in (1, 10, 16):
        assert family.matrix_params_read(cfg, rows) == pytest.approx(rm.matrix_params_read(s, rows) + embedding)
