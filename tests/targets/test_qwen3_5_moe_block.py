"""The Qwen3.5 / Qwen3.6 MoE block (``dflash_jax/targets/moe/qwen3_5_moe.py``) against
transformers' ``Qwen3_5MoeSparseMoeBlock`` with the same weights (float32): the output, the
routing indices and weights, both checkpoint layouts (the per-expert one transformers'
``save_pretrained`` writes, the fused one of the released checkpoints) loading to the same
parameters, the config reader's refusals, the one-line errors for bad expert tensors, the size
model and the partition table."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dflash_jax.checkpoints import CheckpointError, read_tensors, write_safetensors
from dflash_jax.parallel import rules
from dflash_jax.targets.moe import qwen3_5_moe as q
from support.moe_oracles import separated_router

pytestmark = [pytest.mark.xdist_group("qwen3_5_moe_block"), pytest.mark.torch]

D, E, K, F, FS = 16, 8, 2, 12, 20  # F != FS: a swapped width cannot pass
PREFIX = "model.layers.0.mlp."


def hf_text_config(**overrides):
    from transformers import Qwen3_5MoeTextConfig

    fields = dict(vocab_size=64, hidden_size=D, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, num_experts=E, num_experts_per_tok=K,
                  moe_intermediate_size=F, shared_expert_intermediate_size=FS,
                  linear_key_head_dim=4, linear_value_head_dim=4, linear_num_key_heads=2,
                  linear_num_value_heads=2, layer_types=["full_attention"])
    return Qwen3_5MoeTextConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A one-layer ``Qwen3_5MoeForCausalLM`` with random weights (std 0.3) and a router with
    well-separated logits (and input rows where its top k are clear), saved by ``save_pretrained`` (per-expert layout) and, its MoE block's
    in-memory tensors, as the released fused layout; the block's output and routing on random
    rows."""
    from transformers import Qwen3_5MoeForCausalLM

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = Qwen3_5MoeForCausalLM(hf_text_config()).float().eval()
    block = model.model.layers[0].mlp
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        block.gate.weight.copy_(torch.from_numpy(separated_router(rng, E, D, scale=4.0)))
    root = tmp_path_factory.mktemp("qwen3_5_moe_block")
    model.save_pretrained(root / "per_expert")
    fused = {PREFIX + n: p.detach().numpy().copy() for n, p in block.state_dict().items()}
    write_safetensors(root / "fused", fused)
    # rows whose k-th and (k+1)-th router logits are at least 0.1 apart
    candidates = rng.standard_normal((256, D)).astype(np.float32)
    ordered = -np.sort(-(candidates @ block.gate.weight.detach().numpy().T), axis=-1)
    x = candidates[ordered[:, K - 1] - ordered[:, K] > 0.1][:14].reshape(2, 7, D)
    with torch.no_grad():
        y = block(torch.from_numpy(x)).numpy()
        logits, weights, ids = block.gate(torch.from_numpy(x).reshape(-1, D))
    return {"root": root, "config": json.loads((root / "per_expert" / "config.json").read_text()),
            "x": x, "y": y, "logits": logits.numpy(), "weights": weights.numpy(),
            "ids": ids.numpy(), "fused": fused, "block": block}


def random_layers(cfg, n, dtype, seed=1):
    """``n`` blocks' random parameters stacked [n, ...] (numpy draws, nothing compiled)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.standard_normal((n,) + s), dtype),
                                  q.block_param_shapes(cfg), is_leaf=lambda v: isinstance(v, tuple))


def block_tensors(directory):
    return {k: v for k, v in read_tensors(directory).items() if k.startswith(PREFIX)}


def test_the_router_premise_top_k_has_margins(hf):
    """The parity below compares routing indices: every row's k-th and (k+1)-th logits are
    far apart, so no rounding can swap them."""
    ordered = -np.sort(-hf["logits"], axis=-1)
    assert (ordered[:, K - 1] - ordered[:, K]).min() > 0.05


def test_save_pretrained_writes_per_expert_and_release_is_fused(hf):
    names = set(read_tensors(hf["root"] / "per_expert"))
    assert f"{PREFIX}experts.{E - 1}.gate_proj.weight" in names
    assert f"{PREFIX}experts.gate_up_proj" not in names
    assert hf["fused"][f"{PREFIX}experts.gate_up_proj"].shape == (E, 2 * F, D)
    assert hf["fused"][f"{PREFIX}experts.down_proj"].shape == (E, D, F)


def test_both_layouts_load_to_the_same_params(hf):
    cfg = q.block_config_from_hf(hf["config"])
    per_expert = block_tensors(hf["root"] / "per_expert")
    fused = block_tensors(hf["root"] / "fused")
    assert q.expert_layout(per_expert, PREFIX) == q.PER_EXPERT
    assert q.expert_layout(fused, PREFIX) == q.FUSED
    a = q.mlp_params_from_tensors(per_expert, cfg, PREFIX)
    b = q.mlp_params_from_tensors(fused, cfg, PREFIX)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    # the gate half is what transformers' gate rows hold (not the up half)
    np.testing.assert_array_equal(a["experts"]["gate_proj"][3],
                                  per_expert[f"{PREFIX}experts.3.gate_proj.weight"].T)
    # and back: each layout written again is the same tensors
    for layout, src in ((q.FUSED, fused), (q.PER_EXPERT, per_expert)):
        again = q.mlp_params_to_tensors(a, cfg, PREFIX, layout)
        assert sorted(again) == sorted(src)
        for name in src:
            np.testing.assert_array_equal(again[name], src[name])


@pytest.mark.parametrize("impl", ["ragged", "gather"])
def test_block_equals_transformers(hf, impl):
    cfg = q.block_config_from_hf(hf["config"])
    params = q.mlp_params_from_tensors(block_tensors(hf["root"] / "fused"), cfg, PREFIX)
    y, weights, ids = jax.jit(lambda p, x: q.moe_block(cfg, p, x, impl=impl, return_routing=True))(
        params, jnp.asarray(hf["x"]))
    np.testing.assert_array_equal(np.asarray(ids).reshape(-1, K), hf["ids"])
    np.testing.assert_allclose(np.asarray(weights).reshape(-1, K), hf["weights"], atol=5e-6)
    np.testing.assert_allclose(np.asarray(y), hf["y"], atol=1e-5, rtol=1e-5)
    # the shared expert and its gate matter: without them the output is far off
    no_shared = jax.tree_util.tree_map(lambda v: v, params)
    no_shared["shared_expert_gate"]["kernel"] = np.full_like(params["shared_expert_gate"]["kernel"], -1e4)
    assert np.abs(np.asarray(q.moe_block(cfg, no_shared, jnp.asarray(hf["x"]), impl=impl)) - hf["y"]).max() > 1e-2


def test_rows_route_alike_in_a_block_and_one_at_a_time(hf):
    """A 16-row verify and 1-row steps route and compute the same (float32)."""
    cfg = q.block_config_from_hf(hf["config"])
    params = q.mlp_params_from_tensors(block_tensors(hf["root"] / "per_expert"), cfg, PREFIX)
    x = jnp.asarray(hf["x"][0])
    block = jax.jit(lambda p, x: q.moe_block(cfg, p, x, return_routing=True))
    whole, _, ids = block(params, x)
    for t in range(x.shape[0]):
        one, _, one_ids = block(params, x[t:t + 1])
        np.testing.assert_array_equal(np.asarray(one_ids), np.asarray(ids[t:t + 1]))
        np.testing.assert_allclose(np.asarray(one), np.asarray(whole[t:t + 1]), atol=1e-5)


@pytest.mark.parametrize("layout", [q.FUSED, q.PER_EXPERT])
def test_block_layers_round_trip(tmp_path, layout):
    cfg = q.MoeBlockConfig(D, E, K, F, FS)
    params = random_layers(cfg, 2, jnp.bfloat16)
    q.save_block_layers(tmp_path, cfg, params, layout)
    cfg2, loaded = q.load_block_layers(tmp_path)
    assert cfg2 == cfg
    for x, y in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(loaded)):
        assert x.dtype == y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


@pytest.mark.parametrize("change, names", [
    (lambda t: t.pop(f"{PREFIX}experts.5.up_proj.weight"), f"tensor {PREFIX}experts.5.up_proj.weight is missing"),
    (lambda t: t.__setitem__(f"{PREFIX}experts.2.down_proj.weight", np.zeros((D, F + 1), np.float32)),
     f"tensor {PREFIX}experts.2.down_proj.weight has shape [16, 13], expected [16, 12]"),
    (lambda t: t.__setitem__(f"{PREFIX}experts.{E}.gate_proj.weight", np.zeros((F, D), np.float32)),
     f"tensor {PREFIX}experts.{E}.gate_proj.weight is not part of the block"),
    (lambda t: t.__setitem__(f"{PREFIX}experts.gate_up_proj", np.zeros((E, 2 * F, D), np.float32)),
     f"stores its experts both fused ({PREFIX}experts.gate_up_proj) and per expert"),
    (lambda t: [t.pop(n) for n in list(t) if ".experts." in n],
     f"tensor {PREFIX}experts.gate_up_proj is missing"),
])
def test_bad_per_expert_tensors_are_one_line_errors(hf, change, names):
    cfg = q.block_config_from_hf(hf["config"])
    tensors = block_tensors(hf["root"] / "per_expert")
    change(tensors)
    with pytest.raises(CheckpointError) as e:
        q.mlp_params_from_tensors(tensors, cfg, PREFIX, what="ckpt")
    assert names in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("ckpt: ")


def test_bad_fused_tensors_are_one_line_errors(hf):
    cfg = q.block_config_from_hf(hf["config"])
    tensors = dict(hf["fused"])
    tensors[f"{PREFIX}experts.gate_up_proj"] = tensors[f"{PREFIX}experts.gate_up_proj"][:, :F]
    del tensors[f"{PREFIX}shared_expert_gate.weight"]
    with pytest.raises(CheckpointError) as e:
        q.mlp_params_from_tensors(tensors, cfg, PREFIX)
    msg = str(e.value)
    assert "\n" not in msg and f"tensor {PREFIX}shared_expert_gate.weight is missing" in msg
    assert "(and 1 more problems)" in msg


def test_load_block_layers_checks_every_layer_before_building(tmp_path):
    cfg = q.MoeBlockConfig(D, E, K, F, FS)
    params = random_layers(cfg, 2, jnp.float32)
    q.save_block_layers(tmp_path, cfg, params, q.FUSED)
    tensors = read_tensors(tmp_path)
    del tensors["model.layers.1.mlp.experts.down_proj"]
    write_safetensors(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.1\.mlp\.experts\.down_proj is missing"):
        q.load_block_layers(tmp_path)


def test_config_reader(hf):
    cfg = q.block_config_from_hf(hf["config"])
    assert cfg == q.MoeBlockConfig(D, E, K, F, FS)
    assert {**hf["config"], **q.block_config_to_hf(cfg)} == hf["config"]  # the same fields and values
    # the multimodal file nests the text model's config
    assert q.block_config_from_hf({"model_type": "qwen3_5_moe", "text_config": hf["config"]}) == cfg


@pytest.mark.parametrize("field, value", [
    ("norm_topk_prob", False), ("scoring_func", "sigmoid"), ("n_group", 4), ("topk_group", 2),
    ("topk_method", "noaux_tc"), ("routed_scaling_factor", 2.5), ("mlp_only_layers", [0]),
    ("decoder_sparse_step", 2), ("hidden_act", "gelu"), ("router_bias", True)])
def test_unimplemented_routing_options_are_refused_by_name(hf, field, value):
    with pytest.raises(ValueError, match=field):
        q.block_config_from_hf({**hf["config"], field: value})
    q.block_config_from_hf({**hf["config"], "norm_topk_prob": True, "decoder_sparse_step": 1})


def test_missing_and_bad_fields(hf):
    d = {k: v for k, v in hf["config"].items() if k != "moe_intermediate_size"}
    with pytest.raises(ValueError, match="missing the MoE block's fields: moe_intermediate_size"):
        q.block_config_from_hf(d)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        q.block_config_from_hf({**hf["config"], "num_experts_per_tok": E + 1})


def test_size_model(hf):
    cfg = q.block_config_from_hf(hf["config"])
    assert q.block_num_params(cfg) == sum(p.numel() for p in hf["block"].parameters())
    active = D * E + 3 * D * FS + D + K * 3 * D * F
    assert q.block_matrix_params_per_token(cfg) == active
    assert q.block_matrix_params_read(cfg, 1) == pytest.approx(active)
    assert q.block_matrix_params_read(cfg, 10_000) == pytest.approx(q.block_num_params(cfg))
    assert q.expected_active_experts(128, 8, 16) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))
    assert 81 < q.expected_active_experts(128, 8, 16) < 83  # issue 32: ~82 of 128 for k = 8


def test_partition_table_covers_every_parameter():
    cfg = q.MoeBlockConfig(D, E, K, F, FS)
    params = jax.eval_shape(lambda: q.init_block_params(cfg, jax.random.key(0)))
    table = {**rules.PARAM_AXES, **q.PARAM_AXES}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = ("mlp",) + tuple(k.key for k in path)
        axes = rules.param_logical_axes(keys, x.ndim, table)
        spec = rules.logical_to_spec(axes)
        if keys[-2:] in (("gate", "kernel"), ("shared_expert_gate", "kernel")):
            assert all(s is None for s in spec), keys  # routing is computed whole on every shard
        if keys[1] == "experts":
            assert spec[0] == rules.EXPERT and spec[1 if keys[-1] == "down_proj" else 2] == rules.MODEL


SHARDED = """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from dflash_jax.parallel import rules
    from dflash_jax.targets.moe import qwen3_5_moe as q
    from support.moe_oracles import separated_router
    from support.multidevice import emit

    data = np.load(sys.argv[1])
    cfg = q.MoeBlockConfig(*[int(v) for v in data["shape"]])
    rng = np.random.default_rng(3)
    params = jax.tree_util.tree_map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s), jnp.float32),
                                    q.block_param_shapes(cfg), is_leaf=lambda v: isinstance(v, tuple))
    params["gate"]["kernel"] = jnp.asarray(separated_router(rng, cfg.num_experts, cfg.hidden_size, 4.0).T)
    x = jnp.asarray(data["x"])
    whole, _, ids = jax.jit(lambda p, x: q.moe_block(cfg, p, x, return_routing=True))(params, x)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("expert", "model"))
    table = {**rules.PARAM_AXES, **q.PARAM_AXES}
    specs = jax.tree_util.tree_map_with_path(lambda path, v: rules.logical_to_spec(
        rules.param_logical_axes(tuple(k.key for k in path), v.ndim, table)), params)
    local = q.block_local_config(cfg, model=2)
    f = jax.shard_map(lambda p, x: q.moe_block(local, p, x, model_axis="model", expert_axis="expert",
                                               return_routing=True),
                      mesh=mesh, in_specs=(specs, P()), out_specs=P(), check_vma=False)
    sharded, _, sharded_ids = jax.jit(f)(params, x)
    emit({"diff": float(jnp.abs(sharded - whole).max()), "scale": float(jnp.abs(whole).max()),
          "same_ids": bool((sharded_ids == ids).all()),
          "experts_spec": [str(a) for a in specs["experts"]["gate_proj"]],
          "shared_spec": [str(a) for a in specs["shared_expert"]["down_proj"]["kernel"]]})
"""


@pytest.mark.multidevice
@pytest.mark.slow
def test_a_sharded_block_equals_one_device(tmp_path):
    """Experts over an ``expert`` axis of 2 and every width over a ``model`` axis of 2, under
    ``shard_map`` on 4 host devices (a subprocess), laid out by the block's partition table:
    the one-device output and routing (the shared expert counted once, not once per expert
    shard)."""
    from support.multidevice import run_on_devices

    rng = np.random.default_rng(5)
    np.savez(tmp_path / "in.npz", shape=np.array([D, E, K, F, FS]),
             x=rng.standard_normal((3, 4, D)).astype(np.float32))
    out = run_on_devices(SHARDED, devices=4, args=[tmp_path / "in.npz"])
    assert out["experts_spec"] == ["expert", "None", "model"] and out["shared_spec"] == ["model", "None"]
    assert out["same_ids"] and out["diff"] < 1e-5 * max(1.0, out["scale"]), out
    cfg = q.MoeBlockConfig(D, E, K, F, FS)
    with pytest.raises(ValueError, match="moe_intermediate_size=12 is not divisible by the model axis size 5"):
        q.block_local_config(cfg, model=5)
