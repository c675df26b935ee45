"""The hybrid (Gated DeltaNet) benchmarks and roofline (``tools/roofline_hybrid.py``,
``tools/gdn_rollback.py``, ``tools/hybrid_speed.py``): the roofline's parameter and byte counts
for a tiny config against hand arithmetic and against the ``qwen3_5_text`` family's size model;
the rollback record's bytes by formula against what ``nn.gated_delta`` actually keeps; the
commands on smoke sizes write their JSON, markdown and PNG with the machine recorded. No timing
is asserted."""

import json

import jax
import pytest

from dflash_jax import targets
from dflash_jax.config import TargetConfig
from dflash_jax.tools import gdn_rollback, hybrid_speed, roofline, roofline_hybrid as rh

pytestmark = [pytest.mark.xdist_group("test_hybrid_bench"), pytest.mark.slow]

# D 8, V 16, F 12, 4 layers (3 GDN + 1 attention), attention 2 heads / 1 KV head of 4,
# GDN 1 key head of 2, 2 value heads of 3, conv kernel 3
TINY = {"model_type": "qwen3_5_text", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 1,
        "linear_num_value_heads": 2, "linear_key_head_dim": 2, "linear_value_head_dim": 3,
        "linear_conv_kernel_dim": 3, "partial_rotary_factor": 0.5, "tie_word_embeddings": False}


def test_parameter_and_state_counts_by_hand_and_against_the_family():
    """By hand: C = 2*1*2 + 2*3 = 10; an attention layer's matrices q 8*2*2*4 = 128 (doubled:
    the gate), k 32, v 32, o 64 = 256 and q/k norms 8; a GDN layer's in_proj_qkv 80, in_proj_z
    48, in_proj_a + in_proj_b 32, out_proj 48 = 208 and conv 3*10 + A_log, dt_bias 4 + norm 3 = 37;
    every layer's MLP 288 and two norms 16: 264 + 3*245 + 4*304 = 2215; + final norm 8 +
    embedding 128 + head 128 = 2479. State per GDN layer and row: 2*2*3 = 12 floats (48 bytes)
    and a conv window of 2*10 bf16 (40 bytes); KV per token 2*1*1*4*2 = 16 bytes."""
    s = rh.shape_from_hf(TINY)
    assert (s.gdn_layers, s.attention_layers, s.channels) == (3, 1, 10)
    assert rh.num_params(s) == 2479
    assert rh.fixed_state_bytes(s, batch=2) == 2 * 3 * (48 + 40)
    assert rh.kv_bytes_per_token(s) == 16
    cfg = TargetConfig.from_hf_dict(TINY)
    fam = targets.family_of(cfg)
    assert fam.num_params(cfg) == rh.num_params(s)
    assert fam.fixed_state_bytes(cfg, 2) == rh.fixed_state_bytes(s, batch=2)
    assert fam.state_bytes_per_token(cfg, 2) == rh.kv_bytes_per_token(s)
    for name, d in rh.MODELS.items():  # the real configs, read by the family
        cfg = TargetConfig.from_hf_dict(d)
        assert targets.family_of(cfg).num_params(cfg) == rh.num_params(rh.shape_from_hf(d)), name
    # a multimodal config.json: the text model under text_config, tie at the top level
    nested = rh.shape_from_hf({"model_type": "qwen3_5", "tie_word_embeddings": True,
                               "text_config": {k: v for k, v in TINY.items() if k != "tie_word_embeddings"}})
    assert nested.tie_word_embeddings and rh.num_params(nested) == 2479 - 128


def test_gdn_bytes_of_both_modes_by_hand():
    """Block T = 4, batch 2, bf16 conv inputs, 3 GDN layers; per layer and row (S = 48 bytes of
    state, W = 40 bytes of conv window, C = 10):
    AR: read S + W = 88, write 88, FLOPs 6 * 12 = 72;
    verify, snapshot: read 88; write (T+1) S + (K-1+T) C 2 = 240 + 120 = 360;
    verify, replay (one chunk of 4): write 2 S + 4 * 2 * (2+3+2) * 4 = 96 + 224, + 120 = 440;
    rollback, snapshot: read 88, write 88, no FLOPs;
    rollback, replay: read S + 224 + W = 312, write 88,
    FLOPs 4*4*2*2*3 + 2*4*4*2*(2+3) = 192 + 320 = 512."""
    s = rh.shape_from_hf(TINY)
    n = 3 * 2
    g = lambda step, mode: rh.gdn_bytes(s, step, mode, 4, batch=2, conv_itemsize=2)
    assert g("ar", "replay") == {"read": 88 * n, "write": 88 * n, "flops": 72 * n}
    assert g("verify", "snapshot") == {"read": 88 * n, "write": 360 * n, "flops": 6 * 4 * 12 * n}
    assert g("verify", "replay") == {"read": 88 * n, "write": 440 * n, "flops": 6 * 4 * 12 * n}
    assert g("rollback", "snapshot") == {"read": 88 * n, "write": 88 * n, "flops": 0}
    assert g("rollback", "replay") == {"read": 312 * n, "write": 88 * n, "flops": 512 * n}
    # the iteration carries them as its "target GDN" and "GDN rollback" components
    drafter = rh.pair("qwen3.5-4b")[2]
    it = {c.name: c for c in rh.dflash_iteration(s, drafter, 4, 32, "snapshot", batch=2)}
    assert (it["target GDN"].kv_read, it["target GDN"].kv_write) == (88 * n, 360 * n)
    assert it["GDN rollback"].bytes == 176 * n
    # the weights: every layer parameter once in bf16, the head V D + final norm D
    ar = {c.name: c for c in rh.ar_step(s, 32, batch=2)}
    assert ar["target linears"].weights == (2479 - 8 - 2 * 128) * 2
    assert ar["target LM head"].weights == (16 * 8 + 8) * 2
    with pytest.raises(ValueError, match="step must be"):
        rh.gdn_bytes(s, "draft", "replay", 4)


def test_bad_configs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"layer_types"):
        rh.shape_from_hf({**TINY, "layer_types": ["linear_attention"] * 3 + ["mamba"]})
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        rh.shape_from_hf({k: v for k, v in TINY.items() if k != "linear_num_value_heads"})
    with pytest.raises(ValueError, match="neither a named model"):
        rh.pair("no-such-model")


@pytest.mark.parametrize("block,chunk", [(4, 64), (5, 4)])
def test_record_bytes_formula_equals_what_gated_delta_keeps(block, chunk):
    """The formula of ``gdn_rollback.record_bytes`` against the leaves of the record
    ``gated_delta.mix`` returns (``jax.eval_shape``), one chunk and two chunks (5 rows in
    chunks of 4: padded to 8)."""
    shape = gdn_rollback.Shape(**gdn_rollback.LAYERS["tiny"])
    x = jax.eval_shape(lambda: gdn_rollback.layer_inputs(shape, 2, block))  # nothing runs
    for mode in gdn_rollback.MODES:
        assert gdn_rollback.record_bytes(shape, mode, 2, block, chunk) == \
            gdn_rollback._record_nbytes(shape, mode, x, chunk), mode


def test_roofline_hybrid_command_writes_its_files(tmp_path):
    rep = roofline.main(["--hybrid", "qwen3.5-27b", "qwen3.5-4b", "--out", str(tmp_path)])
    assert {(r["model"], r["device"], r["mode"]) for r in rep["results"]} == {
        (m, d, k) for m in ("qwen3.5-27b", "qwen3.5-4b") for d in ("h100", "b200") for k in rh.MODES}
    for r in rep["results"]:
        assert 1 < r["ratio"] < 2 and r["block_size"] == 16
        assert r["speedup"]["paper, Qwen3-8B average"] == pytest.approx(6.49 / r["ratio"])
    by = {(r["model"], r["device"], r["mode"]): r for r in rep["results"]}
    for m in ("qwen3.5-27b", "qwen3.5-4b"):  # snapshot writes T + 1 states: more bytes, slower
        snap, replay = by[(m, "h100", "snapshot")], by[(m, "h100", "replay")]
        assert snap["iteration_gdn_bytes"] > replay["iteration_gdn_bytes"] and snap["ratio"] > replay["ratio"]
    text = (tmp_path / "roofline_hybrid.md").read_text()
    assert "| qwen3.5-27b | h100 | replay | 16 |" in text
    assert (tmp_path / "roofline_hybrid.png").stat().st_size > 0
    assert json.loads((tmp_path / "roofline_hybrid.json").read_text())["benchmark"] == "roofline_hybrid"
    with pytest.raises(ValueError, match="--hybrid names its targets"):
        roofline.main(["--hybrid", "qwen3.5-4b", "--moe", "gpt-oss-20b", "--out", str(tmp_path)])


def test_gdn_rollback_command_smoke(tmp_path):
    """The layer part on the tiny shape (the model part runs in test_gpu_suite's hybrid stage)."""
    rep = gdn_rollback.main(["--layer", "tiny", "--block-size", "4", "--batch", "2", "--repeats", "1",
                             "--calls-per-run", "1", "--model-new-tokens", "0", "--out", str(tmp_path)])
    rows = {r["mode"]: r for r in rep["layer"]}
    assert set(rows) == {"snapshot", "replay", "projections"}
    for mode in gdn_rollback.MODES:
        r = rows[mode]
        assert r["record_bytes"] == r["record_bytes_eval_shape"] > 0
        assert r["snapshot_vs_replay_max_abs_diff"] < 1e-5 and len(r["times_s"]) == 1
    assert rows["snapshot"]["record_bytes"] > rows["replay"]["record_bytes"]
    assert rep["machine"]["cpu"]["cores"] and "load_average_before" in rep["machine"]
    assert rep["model"] is None
    text = (tmp_path / "gdn_rollback.md").read_text()
    assert "| 4 | 2 | snapshot |" in text and "load average" in text
    assert (tmp_path / "gdn_rollback.png").stat().st_size > 0
    with pytest.raises(ValueError, match="--calls-per-run"):
        gdn_rollback.main(["--calls-per-run", "0", "--out", str(tmp_path)])
    # (the GDN kernels' benchmark runs in test_gpu_suite's hybrid stage; here its refusals)
    from dflash_jax.tools import gdn_kernel_speed

    with pytest.raises(ValueError, match="--chunk must be >= 1, got 0"):
        gdn_kernel_speed.main(["--chunk", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--tokens values must be >= 1, got \[0\]"):
        gdn_kernel_speed.main(["--tokens", "0", "--out", str(tmp_path)])


def test_hybrid_speed_command_smoke(tmp_path):
    rep = hybrid_speed.main(["--preset", "tiny", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1",
                             "--out", str(tmp_path)])
    r = rep["results"]
    assert r["hybrid"]["config"]["model_type"] == "qwen3_5_text" and r["dense"]["config"]["model_type"] == "qwen3"
    for k in ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"):
        assert r["hybrid"]["config"][k] == r["dense"]["config"][k]
    assert r["ratio"]["decode_ms_per_token"] == pytest.approx(
        r["hybrid"]["decode_ms_per_token"]["median"] / r["dense"]["decode_ms_per_token"]["median"])
    assert "Hybrid / dense" in (tmp_path / "hybrid_speed_tiny.md").read_text()
    assert (tmp_path / "hybrid_speed_tiny.png").stat().st_size > 0
    assert hybrid_speed.dense_twin(TargetConfig.from_hf_dict(TINY)).num_heads == 2


def test_gpu_compile_hybrid_configs_and_refusals(tmp_path):
    """``gpu-compile --engine --hybrid-target``: the target of each mode is the named model with
    that rollback, its drafter fits it; without --engine, or with an unknown name, refused."""
    from dflash_jax.tools import gpu_compile

    for mode in gpu_compile.HYBRID_ROLLBACKS:
        target, drafter = gpu_compile.hybrid_engine_configs("qwen3.5-4b", mode)
        assert target.gdn_rollback == mode and len(target.gdn_layers) == 24
        drafter.check_target(target)
        tiny, tiny_drafter = gpu_compile.hybrid_engine_configs("tiny", mode)
        assert tiny.gdn_rollback == mode and tiny_drafter.block_size == 8 and tiny.gdn_impl == "xla"
        assert gpu_compile.hybrid_engine_configs("qwen3.5-4b", mode, "pallas")[0].gdn_impl == "pallas"
    with pytest.raises(ValueError, match="add --engine"):
        gpu_compile.main(["--hybrid-target", "tiny", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="choose one of"):
        gpu_compile.hybrid_engine_configs("qwen3.5-9000b", "replay")
    with pytest.raises(ValueError, match="--gdn-impl chooses a hybrid target's GDN implementation"):
        gpu_compile.main(["--gdn-impl", "pallas", "--out", str(tmp_path)])


def test_roofline_of_hybrid_trees_by_hand_and_its_files(tmp_path):
    """``roofline --hybrid MODEL --tree``: the GDN layers' tree bytes and FLOPs on the tiny
    shape by hand (replay: each node's prepared k, v, g, beta and conv input, the state before
    the block twice; snapshot: every node's state), a tree iteration = the chain's draft + the
    tree verify + compaction + the chain's rollback of a block, the best node budget reported
    per device and mode from the scaled tau curve; refusals."""
    from dflash_jax.tools import roofline_hybrid_tree as rht

    s = rh.shape_from_hf(TINY)
    S, window = 2 * 2 * 3 * 4, 2 * (2 * 1 * 2 + 2 * 3) * 2  # Hv dk dv floats; (K-1) C bf16
    N = 5
    inputs = (2 + N) * 10 * 2
    replay = rht.gdn_tree(s, N, "replay")
    assert replay["read"] == 3 * (S + window)
    assert replay["write"] == 3 * (2 * S + N * 2 * (2 + 3 + 2) * 4 + inputs)
    flops = 4 * N * 2 * 2 * 3 + 4 * N * N * 2 * (2 + 3)
    assert replay["flops"] == 3 * flops
    snap = rht.gdn_tree(s, N, "snapshot")
    assert snap["write"] == 3 * ((N + 1) * S + inputs) and snap["flops"] == 3 * (flops + 2 * N * N * 2 * 2 * 3)
    _, _, drafter = rh.pair("qwen3.5-4b")
    big = rh.pair("qwen3.5-27b")[1]
    it = {c.name: c for c in rht.tree_iteration(big, drafter, 16, 32, 1024, "replay")}
    assert {"target linears", "target attention", "target GDN tree", "target LM head", "compact",
            "GDN rollback"} <= set(it)
    assert it["GDN rollback"] == rh.rollback_cost(big, "replay", 16)
    curve = tmp_path / "tau.json"
    curve.write_text(json.dumps({"chain": 4.0, "trees": {"16": 4.5, "32": 5.0, "64": 5.2}, "block_size": 16}))
    rep = roofline.main(["--hybrid", "qwen3.5-27b", "--tree", "16", "32", "64", "--tau-curve", str(curve),
                         "--out", str(tmp_path)])
    for dev in ("h100", "b200"):
        for mode in ("replay", "snapshot"):
            m = rep["analysis"]["devices"][dev]["modes"][mode]
            speed = {r["nodes"]: r["flat"]["speedup"] for r in m["trees"]}
            assert m["best_nodes"]["flat"] == max(speed, key=speed.get)
            assert m["trees"][0]["flat"]["tau"] == pytest.approx(4.5 * 6.49 / 4.0)
    assert rep["analysis"]["devices"]["h100"]["modes"]["replay"]["best_nodes"]["flat"] == 64
    assert (tmp_path / "tree_qwen3.5-27b_bs16_S1024_b1.png").stat().st_size > 0
    assert "Best node budget" in (tmp_path / "tree_qwen3.5-27b_bs16_S1024_b1.md").read_text()
    with pytest.raises(ValueError, match="--tree needs --tau-curve"):
        roofline.main(["--hybrid", "qwen3.5-27b", "--tree", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="takes one model"):
        roofline.main(["--hybrid", "qwen3.5-27b", "qwen3.5-4b", "--tree", "--tau-curve", str(curve),
                       "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="leave out --moe"):
        roofline.main(["--moe", "gpt-oss-20b", "--tree", "--tau-curve", str(curve), "--out", str(tmp_path)])
