"""The mixture-of-experts core (``dflash_jax.nn.moe``) and the ``qwen3_moe`` target family
against their oracles:

* ``nn.moe``: both expert paths (grouped ``ragged_dot``, gathered active experts), both weight
  layouts, biases, a custom activation and expert-parallel shards against a dense ``jnp`` loop
  over the experts (``moe_oracles``); the routers against transformers' own router module;
* the family against transformers' ``Qwen3MoeForCausalLM`` (float32, a tiny random checkpoint
  written by ``save_pretrained``, routers with well-separated logits): the routing indices of
  every MoE layer (hooked on transformers' router), logits and taps on the full, chunked and
  token-by-token paths, greedy ``generate`` on a ragged batch, the parameter count;
* greedy DFlash with a proposer that is wrong at a chosen position in every iteration equals
  autoregressive decoding, for every acceptance length;
* checkpoints: both expert layouts load to the same parameters (transformers reads the fused one
  as the same model), ``Target.save`` writes back the same tensors bit for bit, and missing or
  mis-shaped experts and unimplemented routing fields are one-line errors naming them.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.checkpoints import CheckpointError
from dflash_jax.nn import moe
from dflash_jax.nn.cache import KVCache
from dflash_jax.parallel import rules
from dflash_jax.targets.moe import qwen3_moe, qwen3_moe_model

from support.model_parity import torch_forward
from support.moe_oracles import dense_moe_reference, separated_router
from support.oracle_proposers import dflash_at_every_accepted_length

pytestmark = [pytest.mark.xdist_group("moe_qwen3"), pytest.mark.torch]

TOL = 1e-4
HF_DIMS = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               num_experts=6, num_experts_per_tok=2, max_position_embeddings=256,
               initializer_range=0.1)
VARIANTS = {
    # the released models' routing (renormalised top-k), a dense layer before two MoE layers
    "norm": dict(norm_topk_prob=True, mlp_only_layers=[0]),
    # transformers' default routing (not renormalised), MoE every second layer, tied embeddings
    "step2-tied": dict(norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=True,
                       num_experts=4),
}


def make_hf_moe(seed: int = 0, **overrides):
    """A transformers Qwen3-MoE model (fp32, eager attention) with random norms and experts and
    routers whose logits are well separated (``moe_oracles.separated_router``)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(**{**HF_DIMS, **overrides})
    cfg._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, cfg.num_experts, cfg.hidden_size, 0.5)))
            elif "experts" in name:
                p.normal_(0.0, 0.15)
    return model


@functools.lru_cache(maxsize=None)
def checkpoint(variant: str):
    """(torch model, checkpoint directory written by its save_pretrained)."""
    import tempfile

    model = make_hf_moe(**VARIANTS[variant])
    path = tempfile.mkdtemp(prefix=f"moe-qwen3-{variant}-")
    model.save_pretrained(path)
    return model, path


@functools.lru_cache(maxsize=None)
def target(variant: str = "norm"):
    return dj.load_target(checkpoint(variant)[1])


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for variant in list(VARIANTS):
        if checkpoint.cache_info().currsize:
            shutil.rmtree(checkpoint(variant)[1], ignore_errors=True)
    checkpoint.cache_clear()
    target.cache_clear()
    reference.cache_clear()


# ---------------------------------------------------------------------------- nn.moe
def clamped_interleaved(h):
    """A gpt-oss-like activation (interleaved gate/up columns, clamps, (up + 1) * glu): the
    callback the FFN must accept as given."""
    gate, up = h[..., 0::2], h[..., 1::2]
    gate = jnp.minimum(gate, 1.0)
    up = jnp.clip(up, -1.0, 1.0)
    return (up + 1) * gate * jax.nn.sigmoid(1.702 * gate)


@pytest.mark.parametrize("layout", ["separate", "fused-biases-custom-activation"])
def test_moe_ffn_paths_equal_the_dense_loop(layout):
    rng = np.random.default_rng(0)
    N, D, F, E, k = 11, 16, 8, 6, 2
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    x = f32(N, D)
    weights, ids = moe.route_softmax_topk(f32(N, E) * 3, k, normalize=True)
    gate_up, down = f32(E, D, 2 * F), f32(E, F, D)
    kw = dict(down=down)
    if layout == "separate":
        kw.update(gate=gate_up[..., :F], up=gate_up[..., F:])
    else:
        kw.update(gate_up=gate_up)
    if layout.endswith("custom-activation"):
        kw.update(gate_up_bias=f32(E, 2 * F), down_bias=f32(E, D), activation=clamped_interleaved)
    arrays = {n: v for n, v in kw.items() if isinstance(v, jax.Array)}
    act = {n: v for n, v in kw.items() if not isinstance(v, jax.Array)}

    @jax.jit
    def everything(x, w, i, a):
        """The dense reference, then per path: all experts, the two expert-parallel shards of 3
        local experts each (summed: the caller's psum), and the input with a leading axis."""
        out = [dense_moe_reference(x, w, i, **a, **act)]
        for impl in ("ragged", "gather", "dense"):
            out.append(moe.moe_ffn(x, w, i, impl=impl, **a, **act))
            shards = [moe.moe_ffn(x, w, i, impl=impl, expert_offset=jnp.int32(3 * s),
                                  **{n: v[3 * s:3 * s + 3] for n, v in a.items()}, **act)
                      for s in range(2)]
            out += [shards[0] + shards[1], jnp.minimum(jnp.abs(shards[0]).max(), jnp.abs(shards[1]).max())]
            out.append(moe.moe_ffn(x[None], w[None], i[None], impl=impl, **a, **act)[0])
        return out

    ref, *got = everything(x, weights, ids, arrays)
    assert float(jnp.abs(ref).max()) > 1.0
    assert len(got) == 12
    for full, ep, smallest, leading in (got[:4], got[4:8], got[8:]):
        for y in (full, ep, leading):
            np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=1e-4, rtol=1e-5)
        assert float(smallest) > 0  # both shards contribute
    with pytest.raises(ValueError, match="impl must be"):
        moe.moe_ffn(x, weights, ids, impl="sparse", **kw)
    with pytest.raises(ValueError, match="either gate_up"):
        moe.moe_ffn(x, weights, ids, down=down)


def test_routers_equal_transformers():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 32)).astype(np.float32)
    w = separated_router(rng, 8, 32, 4.0)
    logits = jnp.asarray(x @ w.T)
    for norm in (True, False):
        router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=32, num_experts=8,
                                                   num_experts_per_tok=3, norm_topk_prob=norm))
        with torch.no_grad():
            router.weight.copy_(torch.from_numpy(w))
            _, ref_w, ref_ids = router(torch.from_numpy(x))
        got_w, got_ids = moe.route_softmax_topk(logits, 3, normalize=norm)
        np.testing.assert_array_equal(np.asarray(got_ids), ref_ids.numpy())
        np.testing.assert_allclose(np.asarray(got_w), ref_w.numpy(), atol=1e-6)
    # gpt-oss's order: top-k of the logits, then a softmax over the k
    top, ids = torch.topk(torch.from_numpy(np.array(logits)), 3, dim=-1)
    got_w, got_ids = moe.route_topk_softmax(logits, 3)
    np.testing.assert_array_equal(np.asarray(got_ids), ids.numpy())
    np.testing.assert_allclose(np.asarray(got_w), torch.softmax(top, -1).numpy(), atol=1e-6)


# ---------------------------------------------------------------------------- config
def test_moe_layers_follow_transformers_rule():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    for variant in VARIANTS:
        model = checkpoint(variant)[0]
        cfg = target(variant).config
        hf = tuple(i for i, layer in enumerate(model.model.layers)
                   if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock))
        assert cfg.moe_layers == hf and cfg.dense_layers and cfg.moe_layers
    assert target("norm").config.moe_layers == (1, 2)
    assert target("step2-tied").config.moe_layers == (1,)


def test_parameter_count_and_active_parameters():
    for variant in VARIANTS:
        model = checkpoint(variant)[0]
        cfg = target(variant).config
        fam = targets.family_of(cfg)
        assert fam.num_params(cfg) == sum(p.numel() for p in model.parameters())
        assert fam.num_params(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(target(variant).params))
        Nm, E, k = len(cfg.moe_layers), cfg.num_experts, cfg.num_experts_per_tok
        expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
        assert fam.matrix_params(cfg) - fam.matrix_params_per_token(cfg) == Nm * (E - k) * expert
        assert fam.matrix_params_read(cfg, 1) == pytest.approx(fam.matrix_params_per_token(cfg))
        assert fam.matrix_params_read(cfg, 1000) == pytest.approx(fam.matrix_params(cfg))
        uniform16 = fam.matrix_params_read(cfg, 16) - fam.matrix_params_per_token(cfg)
        assert uniform16 == pytest.approx(Nm * expert * (E * (1 - (1 - k / E) ** 16) - k))


def test_partition_rules_cover_every_parameter():
    t = target("norm")
    cfg, fam = t.config, targets.family_of(t.config)
    table = fam.param_axes(cfg)
    flat = jax.tree_util.tree_flatten_with_path(t.params)[0]
    for path, x in flat:
        keys = tuple(p.key for p in path)
        axes = rules.param_logical_axes(keys, x.ndim, table)
        if "experts" in keys:
            assert axes[:2] == ("layers", "expert") and "mlp" in axes
    assert fam.expert_dims(cfg) == [("num_experts", 6, "routed experts")]
    local = fam.local_config(cfg, 2)
    assert (local.moe_intermediate_size, local.intermediate_size, local.num_experts) == (8, 24, 6)
    assert ("moe_intermediate_size", 16, "each expert's MLP width") in fam.split_dims(cfg)
    assert fam.state_axes(cfg).k == rules.CACHE_AXES


# ---------------------------------------------------------------------------- parity
def test_routing_indices_equal_transformers():
    """Every MoE layer's router on transformers' own router input (hooked): the same experts
    and weights, with a clear margin between the k-th and the next expert (so the float32
    differences of the two implementations cannot flip a choice)."""
    model, _ = checkpoint("norm")
    cfg, params = target("norm").config, target("norm").params
    captured = {}
    hooks = [model.model.layers[i].mlp.gate.register_forward_hook(
        lambda mod, inp, out, i=i: captured.__setitem__(i, (inp[0].numpy(), out[1].numpy(), out[2].numpy())))
        for i in cfg.moe_layers]
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 24))
    torch_forward(model, ids)
    for h in hooks:
        h.remove()
    route = jax.jit(functools.partial(qwen3_moe_model.moe_block, cfg, return_routing=True))
    for m, i in enumerate(cfg.moe_layers):
        x, ref_w, ref_ids = captured[i]
        lp = jax.tree_util.tree_map(lambda a: a[m], params["layers"]["moe"])
        _, w, got = route(lp, jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(got), ref_ids)
        np.testing.assert_allclose(np.asarray(w), ref_w, atol=1e-6)
        logits = np.sort(x @ np.asarray(lp["gate"]["kernel"]), -1)[:, ::-1]
        k = cfg.num_experts_per_tok
        assert (logits[:, k - 1] - logits[:, k]).min() > 1e-4  # the implementations differ by ~1e-6
        assert 0.01 < ref_w.min() and ref_w.max() < 0.99  # and the weights are not one-hot
        assert len(np.unique(ref_ids)) == cfg.num_experts  # every expert is used


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_taps_equal_transformers(variant):
    model, _ = checkpoint(variant)
    t = target(variant)
    cfg, D = t.config, t.config.hidden_size
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 36))
    ref_logits, ref_hidden = torch_forward(model, ids)
    tap_ids = tuple(range(cfg.num_layers))
    forward = jax.jit(functools.partial(targets.target_forward, cfg),
                      static_argnames=("tap_layer_ids",))
    pos = jnp.broadcast_to(jnp.arange(36), (2, 36))
    logits, taps, _ = forward(t.params, jnp.asarray(ids), pos, tap_layer_ids=tap_ids)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0)
    for j, i in enumerate(tap_ids):  # tap of layer i == hidden_states[i + 1] (the last one normed)
        np.testing.assert_allclose(np.asarray(taps[..., j * D:(j + 1) * D]), ref_hidden[i + 1],
                                   atol=TOL, rtol=0)
    if variant != "norm":
        return
    # through the cache, blocks of 12 rows (24 rows x k = 48 token-expert pairs: the gathered
    # active experts, where the whole sequence took the grouped matmul), on the split per-layer
    # layout the CPU decode loop runs (single-token steps: the greedy generate test)
    split = targets.family_of(cfg).loop_params(t.params)
    assert "layers" not in split
    cache = KVCache.for_config(cfg, 2, 64)
    for lo, hi in [(0, 12), (12, 24), (24, 36)]:
        logits, taps, cache = forward(split, jnp.asarray(ids[:, lo:hi]),
                                      jnp.broadcast_to(jnp.arange(lo, hi), (2, hi - lo)), cache,
                                      tap_layer_ids=(1,))
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(taps), ref_hidden[2][:, lo:hi], atol=TOL, rtol=0)


def hf_greedy(model, prompt, max_new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPTS = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 1, 44, 60, 7], [90]]
MAX_NEW = 24
BS = 5


@functools.lru_cache(maxsize=None)
def reference():
    return dj.generate(target(), PROMPTS, MAX_NEW).sequences


@pytest.mark.slow
def test_greedy_generate_equals_transformers_on_a_ragged_batch():
    model, _ = checkpoint("norm")
    ref = reference()
    for p, seq in zip(PROMPTS, ref):
        assert seq == hf_greedy(model, p, MAX_NEW)
    assert len({tok for seq in ref for tok in seq}) > 10, "a degenerate model would not test much"


def test_dflash_equals_autoregressive_for_every_acceptance_length():
    dflash_at_every_accepted_length(target(), PROMPTS, MAX_NEW, reference(), BS)


# ---------------------------------------------------------------------------- checkpoints
def fuse_experts(src: str, dst: str, cfg) -> None:
    """A copy of the per-expert checkpoint ``src`` with each MoE layer's experts fused
    (``mlp.experts.gate_up_proj`` [E, 2Fm, D], ``mlp.experts.down_proj`` [E, D, Fm])."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for i in cfg.moe_layers:
        name = lambda e, p: f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
        E = range(cfg.num_experts)
        tensors[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([tensors.pop(name(e, "gate_proj")), tensors.pop(name(e, "up_proj"))]) for e in E])
        tensors[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack([tensors.pop(name(e, "down_proj")) for e in E])
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), dst)


def test_both_expert_layouts_load_the_same_and_save_round_trips_bit_exact(tmp_path):
    from transformers import Qwen3MoeForCausalLM

    model, path = checkpoint("norm")
    t = target("norm")
    fused = str(tmp_path / "fused")
    fuse_experts(path, fused, t.config)
    f = dj.load_target(fused)
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, f.params)
    # transformers reads the fused layout as the same model too (the gate rows come first)
    ids = np.arange(12)[None] % 96
    hf_fused = Qwen3MoeForCausalLM.from_pretrained(fused, attn_implementation="eager").eval()
    np.testing.assert_allclose(torch_forward(hf_fused, ids)[0], torch_forward(model, ids)[0],
                               atol=1e-5, rtol=0)
    # save: the per-expert layout, every tensor bit for bit as transformers wrote it
    f.save(str(tmp_path / "saved"))
    ours = load_file(str(tmp_path / "saved" / "model.safetensors"))
    theirs = load_file(os.path.join(path, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name])
        assert ours[name].dtype == theirs[name].dtype
    again = dj.load_target(str(tmp_path / "saved"))
    assert again.config == t.config
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, again.params)
    with open(tmp_path / "saved" / "config.json") as fh:
        assert json.load(fh)["num_experts"] == 6


def _edited_checkpoint(tmp_path, edit, config_edit=None, fused=False) -> str:
    _, path = checkpoint("norm")
    dst = str(tmp_path / "bad")
    if fused:
        fuse_experts(path, dst, target("norm").config)
    else:
        shutil.copytree(path, dst)
    file = os.path.join(dst, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    if config_edit:
        with open(os.path.join(dst, "config.json")) as fh:
            cfg = json.load(fh)
        config_edit(cfg)
        with open(os.path.join(dst, "config.json"), "w") as fh:
            json.dump(cfg, fh)
    return dst


@pytest.mark.parametrize("case, match", [
    ("missing", r"missing tensors \(1\):\n    model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"),
    ("misshaped", r"model\.layers\.1\.mlp\.experts\.0\.down_proj\.weight: expected \[32, 16\], found \[32, 15\]"),
    ("fused-misshaped", r"model\.layers\.1\.mlp\.experts\.gate_up_proj has shape \[6, 30, 32\], expected \[6, 32, 32\]"),
    ("fused-and-per-expert", r"layer 2 stores its experts both fused"),
    ("fused-in-dense-layer", r"model\.layers\.0\.mlp\.experts\.down_proj is an expert tensor, but layer 0 is a dense layer"),
])
def test_bad_expert_tensors_are_named(tmp_path, case, match):
    def edit(t):
        if case == "missing":
            del t["model.layers.2.mlp.experts.5.up_proj.weight"]
        elif case == "misshaped":
            t["model.layers.1.mlp.experts.0.down_proj.weight"] = t["model.layers.1.mlp.experts.0.down_proj.weight"][:, :15]
        elif case == "fused-misshaped":
            t["model.layers.1.mlp.experts.gate_up_proj"] = t["model.layers.1.mlp.experts.gate_up_proj"][:, :30]
        elif case == "fused-and-per-expert":
            t["model.layers.2.mlp.experts.0.gate_proj.weight"] = np.zeros((16, 32), np.float32)
        elif case == "fused-in-dense-layer":
            t["model.layers.0.mlp.experts.down_proj"] = t["model.layers.1.mlp.experts.down_proj"]

    path = _edited_checkpoint(tmp_path, edit, fused=case.startswith("fused"))
    with pytest.raises(CheckpointError, match=match):
        dj.load_target(path)


@pytest.mark.parametrize("field, value, match", [
    ("n_group", 4, r"n_group=4: group-limited routing is not implemented"),
    ("topk_method", "noaux_tc", r"topk_method='noaux_tc': only plain top-k"),
    ("scoring_func", "sigmoid", r"scoring_func='sigmoid': only the softmax router"),
    ("router_type", "expert_choice", r"router_type='expert_choice': unknown router type"),
    ("shared_expert_intermediate_size", 64, r"shared_expert_intermediate_size=64: shared experts"),
    ("num_local_experts", 8, r"contradictory expert counts \(num_experts=6, num_local_experts=8\)"),
    ("mlp_only_layers", [7], r"mlp_only_layers \[7\] are outside layers 0\.\.2"),
    ("num_experts_per_tok", 9, r"num_experts_per_tok must be in 1\.\.num_experts=6, got 9"),
    ("decoder_sparse_step", 0, r"decoder_sparse_step must be >= 1"),
])
def test_unimplemented_routing_fields_are_refused(field, value, match):
    d = qwen3_moe.QWEN3_MOE.config_to_hf(target("norm").config)
    d[field] = value
    with pytest.raises(ValueError, match=match):
        dj.TargetConfig.from_hf_dict(d)
    # training-only router fields are accepted (the auxiliary loss is not computed at inference)
    d = {**qwen3_moe.QWEN3_MOE.config_to_hf(target("norm").config), "output_router_logits": True,
         "router_aux_loss_coef": 0.01, "num_local_experts": 6}
    assert dj.TargetConfig.from_hf_dict(d) == target("norm").config


@pytest.mark.parametrize("tokens, positions, taps, match", [
    (np.zeros((2,), np.int32), np.zeros((2,), np.int32), (), "tokens must have rank 2"),
    (np.zeros((1, 3), np.float32), np.zeros((1, 3), np.int32), (), "tokens must be an integer array"),
    (np.zeros((1, 3), np.int32), np.zeros((1, 4), np.int32), (), "must equal tokens shape"),
    (np.zeros((1, 3), np.int32), np.zeros((1, 3), np.int32), (7,), "tap layer id 7 is outside"),
])
def test_bad_forward_inputs_are_named(tokens, positions, taps, match):
    t = target()
    with pytest.raises(ValueError, match=match):
        targets.target_forward(t.config, t.params, jnp.asarray(tokens), jnp.asarray(positions),
                               tap_layer_ids=taps)
