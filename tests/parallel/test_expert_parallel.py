"""Expert parallelism (``parallel.rules``, ``parallel.experts``): a mixture-of-experts target's
experts split over the ``expert`` mesh axis, composed with tensor parallelism (``model``, also
inside each expert) and data parallelism (``data``), on 8 host CPU devices in ONE subprocess
(``tests/support/multidevice.py``).

Oracle: the single-device engine on the same weights (itself checked against transformers and
against AR decoding in ``tests/targets/test_moe_qwen3.py`` and ``tests/targets/test_gpt_oss.py``). A tiny
Qwen3-MoE (two MoE layers around a dense one, 8 experts, top 2) on meshes (data, expert, model)
= (2, 2, 2), (1, 4, 2) and (1, 8, 1), and a tiny gpt-oss (biases nonzero, so the experts' down
bias must be added once) on (2, 2, 2), a tiny DeepSeek-V3 (latent attention split by heads
with its latent state replicated, a shared expert added once, group-limited routing) on (2, 2, 2)
and (1, 2, 4), and a tiny Gemma 4 (sliding and full layers of their own KV heads, KV-shared
layers, per-layer inputs, the MoE block beside the MLP) on (2, 2, 2) and (1, 4, 2), must give greedy DFlash tokens and acceptance lengths
equal to one device (and greedy AR on (2, 2, 2)), logits within float32 tolerance, and expert
weights held E / e per device with F / m of each expert's width. The compiled decode loop's
collectives over the expert axis must be exactly the stated pattern: one all-reduce per MoE
layer per target forward, over the expert x model group, of the [rows, block, D] output; none
of any other kind. Bad meshes: an expert count the axis does not divide, and an expert axis for
a dense target, are one-line errors naming the field. The communication model's EP counts
(``tools/parallel_comm.py``) are checked by hand.
"""

from __future__ import annotations

import pytest

from dflash_jax.tools import parallel_comm as pc
from support.multidevice import shared_run

pytestmark = [pytest.mark.multidevice, pytest.mark.xdist_group("expert_parallel"), pytest.mark.slow]

CODE = r"""
import numpy as np
import jax
import dflash_jax as dj
from dflash_jax import parallel
from dflash_jax import targets
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.decoding import engine
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.targets.moe import Qwen3MoeConfig
from dflash_jax.verification.tree import TreeVerify
from support.hlo_collectives import collectives
from support.multidevice import emit, error

assert jax.device_count() == 8, jax.devices()
BLOCK = 4
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3, 3]]  # ragged
qwen = Qwen3MoeConfig(model_type="qwen3_moe", vocab_size=32, hidden_size=32, intermediate_size=48,
                      num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=128, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=(1,))
gpt = targets.family("gpt_oss").config_from_hf(dict(
    model_type="gpt_oss", vocab_size=32, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=8,
    num_experts_per_tok=2, sliding_window=4, max_position_embeddings=128, rms_norm_eps=1e-5,
    layer_types=["sliding_attention", "full_attention"], attention_bias=True,
    tie_word_embeddings=False, rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0,
    beta_slow=1.0, truncate=False, original_max_position_embeddings=4096, rope_theta=150000.0)))

deepseek = targets.family("deepseek_v3").config_from_hf(dict(
    model_type="deepseek_v3", vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
    n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1, routed_scaling_factor=2.5,
    max_position_embeddings=128))

gemma = targets.family("gemma4_text").config_from_hf(dict(
    model_type="gemma4_text", vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=2,
    attention_k_eq_v=True, sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=2, hidden_size_per_layer_input=4, vocab_size_per_layer_input=32, enable_moe_block=True,
    num_experts=8, top_k_experts=2, moe_intermediate_size=16, final_logit_softcapping=5.0,
    max_position_embeddings=128))

def gemma_params(params):
    for i in range(gemma.num_layers):
        router = params[f"layers_{i}"]["router"]
        router["proj"]["kernel"] *= 6.0
        router["scale"] = np.ones_like(router["scale"])
        router["per_expert_scale"] = np.ones_like(router["per_expert_scale"])
    return params

def expert_down(name, params):
    if name == "gemma4":  # one tree per layer: [E, F, D]
        return params["layers_0"]["experts"]["down_proj"]
    return params["layers"]["mlp" if name == "gpt_oss" else "moe"]["experts"]["down_proj"]

def deepseek_params(params):
    params["layers"]["moe"]["gate"]["kernel"] *= 6.0
    return params

def qwen_params(params):
    # routers with well separated logits: a near tie would let float32 rounding (a psum's
    # order) flip a top-k choice between meshes, which is not what this test is about
    params["layers"]["moe"]["gate"]["kernel"] *= 6.0
    return params

def gpt_params(params):
    params["layers"]["mlp"]["router"]["kernel"] *= 6.0
    rng = np.random.default_rng(3)  # nonzero biases: the experts' down bias is added once
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (0.1 * rng.standard_normal(x.shape)).astype(x.dtype)
        if "bias" in jax.tree_util.keystr(path) else x, params)

# random drafters whose greedy runs accept drafts (a small vocabulary makes that likely; these
# seeds give 16 and 3 accepted tokens): a run that accepts nothing would not test the rollback
DRAFTER_SEED = {"qwen3_moe": 2, "gpt_oss": 9, "deepseek_v3": 2, "gemma4": 2}
# model -> (config, parameter edit, its MoE layers, the scans over runs of them when stacked,
#           {mesh (data, expert, model): runs})
MODELS = {
    "qwen3_moe": (qwen, qwen_params, len(qwen.moe_layers), 2,  # MoE, dense, MoE
                  {(2, 2, 2): ("ar", "dflash", "tree"), (1, 4, 2): ("dflash",), (1, 8, 1): ("dflash",)}),
    "gpt_oss": (gpt, gpt_params, gpt.num_layers, 1, {(2, 2, 2): ("dflash",)}),  # all MoE
    # latent attention (heads over model, the latent state replicated), shared experts
    "deepseek_v3": (deepseek, deepseek_params, len(deepseek.moe_layers), 1,  # dense, MoE, MoE
                    {(2, 2, 2): ("ar", "dflash"), (1, 2, 4): ("dflash",)}),
    # per-layer trees; KV-shared layers, per-layer inputs (their table split by vocabulary), the MoE
    # block beside the MLP in every layer
    "gemma4": (gemma, gemma_params, gemma.num_layers, gemma.num_layers,
               {(2, 2, 2): ("ar", "dflash"), (1, 4, 2): ("dflash",)}),
}

def host_random(shapes, seed):
    # the project's random init (nn.layers.random_init: norms 1, biases 0, the rest
    # normal(0.15)) drawn on the host from the shapes alone: no init program to compile
    rng = np.random.default_rng(seed)
    def leaf(path, x):
        name = jax.tree_util.keystr(path)
        if "weight" in name:
            return np.ones(x.shape, x.dtype)
        if "bias" in name:
            return np.zeros(x.shape, x.dtype)
        return (0.15 * rng.standard_normal(x.shape)).astype(x.dtype)
    return jax.tree_util.tree_map_with_path(leaf, shapes)

def runs(target, which, drafter_params, mesh=None):
    drafter = dj.Drafter(dcfg, drafter_params, mesh=mesh)
    out = {}
    for run in which:
        if run == "tree":  # a tree of 6 nodes, top-2 children: one device's tree on the mesh
            r = dj.generate(target, prompts, 12, drafter=drafter, verify=TreeVerify(6, topk=2))
            out[run] = [r.sequences, r.acceptance_lengths]
            continue
        d = drafter if run == "dflash" else None
        r = dj.generate(target, prompts, 12, drafter=d)
        out[run] = [r.sequences, r.acceptance_lengths]
        if mesh is not None:  # the loop generate just compiled (a cache hit, no compile)
            pre = prepare_decode(target, prompts, 12, drafter=d)
            hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new,
                                      pre.stop_ids, np.int32(4), spec=pre.spec).compile().as_text()
            out[run + "_hlo"] = collectives(hlo, mesh)
    return out

shard = lambda x: list(x.sharding.shard_shape(x.shape))
result = {}
for name, (cfg, edit, moe_layers, moe_scans, meshes) in MODELS.items():
    params = edit(host_random(jax.eval_shape(lambda: targets.init_target_params(cfg, jax.random.key(0))), 1))
    single = dj.Target(cfg, params)
    dcfg = DrafterConfig.for_target(cfg, 1, BLOCK, cfg.vocab_size - 1)
    dparams = host_random(jax.eval_shape(lambda: init_drafter_params(dcfg, jax.random.key(0))),
                          DRAFTER_SEED[name])
    ref_logits = np.asarray(parallel.target_logits(single, [p[:2] for p in prompts]))
    which = sorted({r for rs in meshes.values() for r in rs} | ({"ar"} if name != "gpt_oss" else set()))
    result[name] = {"single": runs(single, which, dparams), "moe_layers": moe_layers, "moe_scans": moe_scans,
                    "meshes": {}}
    for (data, expert, model), which in meshes.items():
        mesh = parallel.make_mesh(data=data, expert=expert, model=model)
        target = dj.Target(cfg, params, mesh=mesh)
        down = expert_down(name, target.params)
        res = {**runs(target, which, dparams, mesh), "down_shard": shard(down), "down_full": list(down.shape),
               # the decode loop's layout: one tree per layer (an instruction per MoE layer in
               # the compiled loop) or stacked (one per scan over a run of MoE layers)
               "loop_split": "layers" not in targets.family_of(cfg).loop_params(target.params)}
        if (data, expert, model) == (2, 2, 2):  # one more compile per mesh: on the fullest mesh
            logits = np.asarray(parallel.target_logits(target, [p[:2] for p in prompts]))
            res |= {"logits_err": float(np.max(np.abs(logits - ref_logits))),
                    "logits_scale": float(np.max(np.abs(ref_logits)))}
        result[name]["meshes"][f"{data}x{expert}x{model}"] = res

import dataclasses
six = dataclasses.replace(qwen, num_experts=6)
dense = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=32, intermediate_size=64,
                     num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
result["errors"] = {  # refused before any weight is placed (no parameters needed)
    "indivisible": error(lambda: dj.Target(six, None, mesh=parallel.make_mesh(data=2, expert=4, model=1))),
    "dense": error(lambda: dj.Target(dense, None, mesh=parallel.make_mesh(data=2, expert=2, model=2))),
    "too_many": error(lambda: parallel.make_mesh(data=2, expert=4, model=2)),
    "parse": error(lambda: parallel.parse_mesh("data=2,experts=4")),
}
result["parsed"] = parallel.parse_mesh("data=2,expert=2,model=2")
emit(result)
"""


@pytest.fixture(scope="module")
def ep(tmp_path_factory):
    # fast_compile (multidevice): the one-device oracle runs in the same subprocess, under the
    # same flags; they leave the SPMD partitioning as it is (checked: every collective found, its
    # kind, dtype, size and groups, and every token were the default flags', for every case)
    return shared_run(tmp_path_factory, "expert_parallel", CODE, fast_compile=True)


CASES = [("qwen3_moe", "2x2x2", "ar"), ("qwen3_moe", "2x2x2", "dflash"),
         ("qwen3_moe", "1x4x2", "dflash"), ("qwen3_moe", "1x8x1", "dflash"),
         ("gpt_oss", "2x2x2", "dflash"), ("deepseek_v3", "2x2x2", "ar"), ("deepseek_v3", "2x2x2", "dflash"),
         ("deepseek_v3", "1x2x4", "dflash"), ("gemma4", "2x2x2", "ar"), ("gemma4", "2x2x2", "dflash"),
         ("gemma4", "1x4x2", "dflash")]
MODELS = ("qwen3_moe", "gpt_oss", "deepseek_v3", "gemma4")


@pytest.mark.parametrize("model,mesh,run", CASES)
def test_greedy_equal_to_one_device(ep, model, mesh, run):
    single, res = ep[model]["single"][run], ep[model]["meshes"][mesh]
    assert res[run][0] == single[0], f"{model} {run} tokens differ on mesh {mesh}"
    assert res[run][1] == single[1], f"{model} {run} acceptance lengths differ on mesh {mesh}"


def test_cases_cover_every_mesh_run(ep):
    ran = {(m, mesh, run) for m in ep if m in MODELS
           for mesh, res in ep[m]["meshes"].items() for run in ("ar", "dflash") if run in res}
    assert ran == set(CASES)


def test_a_tree_on_a_data_expert_model_mesh_equals_one_device(ep):
    """A tree of 6 nodes on qwen3_moe over (data 2, expert 2, model 2): the vocabulary split over
    model (each depth's top-2 exchanged), the experts over expert: one device's tokens and
    acceptance lengths, which equal AR's."""
    single, res = ep["qwen3_moe"]["single"]["tree"], ep["qwen3_moe"]["meshes"]["2x2x2"]["tree"]
    assert res == single and single[0] == ep["qwen3_moe"]["single"]["ar"][0]


def test_dflash_is_ar_and_accepts_drafts(ep):
    for model in ("qwen3_moe", "deepseek_v3", "gemma4"):
        single = ep[model]["single"]
        assert single["dflash"][0] == single["ar"][0], model
    for model in MODELS:  # a run that accepts nothing would test little
        assert any(a > 1 for row in ep[model]["single"]["dflash"][1] for a in row), model


@pytest.mark.parametrize("model", MODELS)
def test_logits_and_expert_layout(ep, model):
    assert "logits_err" in ep[model]["meshes"]["2x2x2"]
    for mesh, res in ep[model]["meshes"].items():
        data, expert, m = map(int, mesh.split("x"))
        if "logits_err" in res:
            assert res["logits_err"] <= 1e-5 * max(1.0, res["logits_scale"]), (mesh, res["logits_err"])
        # down_proj [MoE layers, E, F, D] (gemma4: one layer's, [E, F, D]): experts over expert,
        # each expert's width over model
        full = res["down_full"][-3:]
        assert res["down_shard"][-3:] == [full[0] // expert, full[1] // m, full[2]], mesh


@pytest.mark.parametrize("model,mesh,run", CASES)
def test_compiled_loop_collectives_over_the_expert_axis(ep, model, mesh, run):
    """The stated pattern, in the compiled decode loop (one target forward per iteration: the
    verify of BLOCK rows, or one AR step): one all-reduce per MoE layer over the expert x model
    group, of [rows per data shard, verified rows, D] float32; nothing else crosses the expert
    axis (the drafter, attention, embedding and argmax collectives stay within ``model``), and
    nothing crosses ``data``. A loop that runs its layers one call each (Qwen3-MoE's on CPU)
    has an instruction per MoE layer; one that runs them stacked (gpt-oss's) one per scan over
    a run of MoE layers, its body's all-reduce running once per layer."""
    data, expert, m = map(int, mesh.split("x"))
    res = ep[model]["meshes"][mesh]
    found = res[run + "_hlo"]
    over_expert = [c for c in found if "expert" in c["spans"]]
    assert len(over_expert) == (ep[model]["moe_layers"] if res["loop_split"]
                                else ep[model]["moe_scans"]), over_expert
    rows = 4 if run == "dflash" else 1
    for c in over_expert:
        assert c["kind"] == "all-reduce" and c["dtype"] == "f32", c
        assert c["group"] == expert * m, c
        assert c["spans"] == sorted(["expert"] + (["model"] if m > 1 else [])), c
        assert c["elements"] == (4 // data) * rows * 32, c
    assert all("data" not in c["spans"] for c in found)
    if m > 1:  # the tensor-parallel collectives are there too, within model
        assert any(c["spans"] == ["model"] for c in found)


def test_bad_meshes_are_clear_errors(ep):
    e = ep["errors"]
    assert "num_experts=6 (routed experts) is not divisible by 4" in e["indivisible"]
    assert "Expert-axis sizes that fit: [1, 2, 3]" in e["indivisible"]
    assert "expert=2" in e["dense"] and "(qwen3) has none" in e["dense"]
    assert "needs 16 devices" in e["too_many"] and "expert=4" in e["too_many"]
    assert "expert" in e["parse"]
    assert ep["parsed"] == {"data": 2, "expert": 2, "model": 2}


# ---------------------------------------------------------------------------- the comm model
def test_comm_model_counts_both_patterns_by_hand():
    """A tiny MoE shape (D 8, 3 layers of which 2 MoE, 8 experts, top 2), bf16, batch 1."""
    shape = pc.MoeShape(hidden_size=8, num_layers=3, moe_layers=2, num_experts=8, experts_per_token=2)
    # psum pattern, expert 2 x model 2, 4 rows: one all-reduce per MoE layer of 4 * 8 * 2 = 64 B
    r = pc.expert_parallel(shape, rows=4, expert=2, model=2, link_bandwidth=1.0, latency=0.0)
    p = r["psum"]
    assert (p["collectives"], p["group"], p["payload_bytes"]) == (2, 4, 2 * 64)
    assert p["link_bytes_per_layer"] == 2 * 3 / 4 * 64 and p["us"] == pytest.approx(1e6 * 2 * 96)
    # all-to-all: 2 rows per device, each to 2 experts: a send buffer of 2 * 2 * 8 * 2 = 64 B,
    # half of it leaves (e = 2); dispatch + combine per layer; plus the received rows' psum over
    # model (4 * 2 / 2 = 4 rows of 16 B, ring factor 1)
    a = r["all_to_all"]
    assert a["collectives"] == 2 * 2 + 2
    assert a["link_bytes_per_layer"] == 2 * 0.5 * 64 + 64
    # one device: nothing; a non-dividing expert axis is refused
    assert pc.expert_parallel(shape, 1, 1, 1)["psum"]["collectives"] == 0
    with pytest.raises(ValueError, match="must divide num_experts"):
        pc.expert_parallel(shape, 1, 3, 1)


def test_comm_model_big_shapes():
    """Qwen3-Coder-30B-A3B (D 2048, 48 MoE layers, k 8) and gpt-oss-120b (D 2880, 36, k 4) on
    8 devices, bf16, batch 1: the all-reduce moves 2 (g-1)/g b r D a per layer, e / k times the
    all-to-all's bytes at m = 1."""
    for name, D, L, k in (("qwen3-coder-30b-a3b", 2048, 48, 8), ("gpt-oss-120b", 2880, 36, 4)):
        shape = pc.MOE_MODELS[name]
        for rows in (1, 16):
            r = pc.expert_parallel(shape, rows, expert=8, model=1)
            assert r["psum"]["collectives"] == L and r["all_to_all"]["collectives"] == 2 * L
            assert r["psum"]["link_bytes_per_layer"] == 2 * 7 / 8 * rows * D * 2
            if rows == 16:
                ratio = r["psum"]["link_bytes"] / r["all_to_all"]["link_bytes"]
                assert ratio == pytest.approx(8 / k)
    report = pc.markdown({"settings": {"block_size": 16, "drafter_layers": 5, "context": 1024,
                                       "dtype": "bfloat16", "latency_us": 8.0, "tau": 6.49,
                                       "budget_context": 8192, "memory_fraction": 0.9,
                                       "batches": [], "tp": [1], "devices": ["b200"]},
                          "command": "x", "analysis": {"rows": [], "recommendations": [],
                                                       "sensitivity": [],
                                                       "expert_parallel": pc.expert_parallel_rows(
                                                           ["gpt-oss-120b"])}})
    assert "Expert parallelism" in report and "| gpt-oss-120b | 8 x 1 | 16 |" in report
