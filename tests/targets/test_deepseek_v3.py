"""The ``deepseek_v3`` target family (multi-head latent attention, DeepSeek's MoE) against
transformers' ``DeepseekV3ForCausalLM`` (float32, tiny random checkpoints written by
``save_pretrained``, routers with well-separated scores and a nonzero correction bias):

* the router (sigmoid, selection-only bias, group-limited top-k, renormalised and scaled) against
  transformers' own router module, and the routing of every MoE layer inside the model (hooked);
* logits and taps, in both MLA forms (absorbed: the queries multiplied into the latent space;
  expanded: transformers' form), on the full pass and through the latent decode state in
  blocks, on the split per-layer layout; the state holds exactly ``r + dr`` numbers per token
  and layer, what the size model says;
* greedy ``generate`` equals transformers' greedy generate on a ragged batch; greedy DFlash with
  a proposer wrong at a chosen position equals autoregressive decoding for every acceptance
  length;
* checkpoints: fused experts load the same, ``Target.save`` writes back transformers' tensors bit
  for bit, multi-token-prediction layers are ignored by name, and bad fields and tensors are
  one-line errors naming them.

Variants: ``v3`` (DeepSeek-V3's shape: q and kv latents, YaRN with ``mscale_all_dim``,
interleaved rope dims, a layer-norm eps unlike the latent norms' fixed 1e-6, 4 groups of 2 experts, a shared expert, the first layer dense) and
``plain`` (no q latent, plain RoPE in halves, no groups, no shared expert, tied embeddings, every
layer MoE).
"""

import functools
import json
import logging
import os
import shutil

import flax.struct
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
from dflash_jax.targets.mla import deepseek_v3, model as mla

from support.model_parity import torch_forward
from support.moe_oracles import separated_router
from support.oracle_proposers import dflash_at_every_accepted_length
from support.tiers import tiered

pytestmark = [pytest.mark.xdist_group("deepseek_v3"), pytest.mark.torch]

TOL = 1e-4
HF_DIMS = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
               qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8,
               num_experts_per_tok=3, routed_scaling_factor=2.5, max_position_embeddings=256,
               initializer_range=0.1)
VARIANTS = {
    # rms_norm_eps far from the latent norms' fixed 1e-6, so that mixing them up shows
    "v3": dict(q_lora_rank=24, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
               rope_interleave=True, rms_norm_eps=1e-2,
               rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.7}),
    "plain": dict(q_lora_rank=None, n_group=1, topk_group=1, n_shared_experts=0, first_k_dense_replace=0,
                  rope_interleave=False, tie_word_embeddings=True, norm_topk_prob=False,
                  routed_scaling_factor=1.0),
}


def make_hf(seed: int = 0, **overrides):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**{**HF_DIMS, **overrides})
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    E = cfg.n_routed_experts
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, E, cfg.hidden_size, 2.0)))
            elif "experts" in name:
                p.normal_(0.0, 0.15)
        for layer in model.model.layers[cfg.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.from_numpy(rng.normal(0, 0.1, E).astype(np.float32)))
    return model


@functools.lru_cache(maxsize=None)
def checkpoint(variant: str):
    """(torch model, checkpoint directory written by its save_pretrained)."""
    import tempfile

    model = make_hf(**VARIANTS[variant])
    path = tempfile.mkdtemp(prefix=f"deepseek-v3-{variant}-")
    model.save_pretrained(path)
    return model, path


@functools.lru_cache(maxsize=None)
def target(variant: str = "v3"):
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


def sorted_routing(weights, ids):
    """(weights, ids) per row in expert-id order (transformers' top-k is unsorted)."""
    order = np.argsort(ids, axis=-1)
    return np.take_along_axis(np.asarray(weights), order, -1), np.take_along_axis(np.asarray(ids), order, -1)


# ---------------------------------------------------------------------------- the router
@pytest.mark.parametrize("groups", tiered([(4, 2), (1, 1), (2, 1)], fast=[(4, 2)], ids=lambda g: f"{g[0]}-groups-keep-{g[1]}"))
def test_router_equals_transformers(groups):
    """Group-limited choice on the biased scores, weights from the unbiased ones; the biased
    scores' margin between the k-th expert and the next is checked, so float32 differences cannot
    flip a choice. With 2 groups of 4, keeping 1: only experts of the better group are chosen."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    n_group, topk_group = groups
    rng = np.random.default_rng(1)
    E, D, k = 8, 32, 3
    x = rng.standard_normal((64, D)).astype(np.float32)
    w = separated_router(rng, E, D, 1.5)
    bias = rng.normal(0, 0.2, E).astype(np.float32)
    for norm, scale in ((True, 2.5), (False, 1.0)):
        router = DeepseekV3TopkRouter(DeepseekV3Config(hidden_size=D, n_routed_experts=E, num_experts_per_tok=k,
                                                       n_group=n_group, topk_group=topk_group,
                                                       norm_topk_prob=norm, routed_scaling_factor=scale))
        with torch.no_grad():
            router.weight.copy_(torch.from_numpy(w))
            router.e_score_correction_bias.copy_(torch.from_numpy(bias))
            _, ref_w, ref_ids = router(torch.from_numpy(x))
        got_w, got_ids = moe.route_sigmoid_group_topk(jnp.asarray(x @ w.T), jnp.asarray(bias), k,
                                                      n_group, topk_group, norm, scale)
        rw, ri = sorted_routing(ref_w.numpy(), ref_ids.numpy())
        gw, gi = sorted_routing(got_w, got_ids)
        np.testing.assert_array_equal(gi, ri)
        np.testing.assert_allclose(gw, rw, atol=1e-6)
    if groups == (2, 1):  # every choice inside one group of 4
        assert np.all(np.asarray(got_ids) // 4 == np.asarray(got_ids)[:, :1] // 4)
    assert len(np.unique(ri)) == E or groups == (2, 1)


def test_routing_inside_the_model_equals_transformers():
    model, _ = checkpoint("v3")
    cfg, params = target("v3").config, target("v3").params
    captured = {}
    hooks = [model.model.layers[i].mlp.gate.register_forward_hook(
        lambda mod, inp, out, i=i: captured.__setitem__(i, (inp[0].numpy(), out[1].numpy(), out[2].numpy())))
        for i in cfg.moe_layers]
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 24))
    torch_forward(model, ids)
    for h in hooks:
        h.remove()
    route = jax.jit(functools.partial(mla.route, cfg))
    for m, i in enumerate(cfg.moe_layers):
        x, ref_w, ref_ids = captured[i]
        lp = jax.tree_util.tree_map(lambda a: a[m], params["layers"]["moe"])
        w, got = route(lp, jnp.asarray(x).reshape(-1, cfg.hidden_size))
        gw, gi = sorted_routing(w, got)
        rw, ri = sorted_routing(ref_w, ref_ids)
        np.testing.assert_array_equal(gi, ri)
        np.testing.assert_allclose(gw, rw, atol=1e-5)
        assert len(np.unique(ri)) >= cfg.num_experts - 1  # not one expert for everything


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize("variant", tiered(sorted(VARIANTS), fast=["v3"]))
def test_logits_and_taps_equal_transformers_in_both_mla_forms(variant):
    model, _ = checkpoint(variant)
    t = target(variant)
    cfg, D = t.config, t.config.hidden_size
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 30))
    ref_logits, ref_hidden = torch_forward(model, ids)
    tap_ids = tuple(range(cfg.num_layers))
    forward = jax.jit(functools.partial(targets.target_forward, cfg), static_argnames=("tap_layer_ids", "mla_form"))
    pos = jnp.broadcast_to(jnp.arange(30), (2, 30))
    for form in mla.MLA_FORMS:
        logits, taps, _ = forward(t.params, jnp.asarray(ids), pos, tap_layer_ids=tap_ids, mla_form=form)
        np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0, err_msg=form)
        for j, i in enumerate(tap_ids):  # tap of layer i == hidden_states[i + 1] (the last one normed)
            np.testing.assert_allclose(np.asarray(taps[..., j * D:(j + 1) * D]), ref_hidden[i + 1],
                                       atol=TOL, rtol=0)
    # through the latent state in blocks (absorbed, the default with a state), on the split layout
    fam = targets.family_of(cfg)
    split = fam.loop_params(t.params)
    assert "layers" not in split
    state = fam.init_state(cfg, 2, 48, jnp.float32)
    for lo, hi in [(0, 11), (11, 12), (12, 30)]:
        logits, taps, state = forward(split, jnp.asarray(ids[:, lo:hi]),
                                      jnp.broadcast_to(jnp.arange(lo, hi), (2, hi - lo)), state,
                                      tap_layer_ids=(1,))
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(taps), ref_hidden[2][:, lo:hi], atol=TOL, rtol=0)


def test_the_state_holds_latents_and_rope_keys_only_and_rolls_back():
    """The state is [layers, B, S, 1, r] latents and [layers, B, S, 1, dr] rotated rope keys:
    ``state_bytes_per_token`` of them, against ``2 H (dn + dr)`` for expanded keys and values.
    A block run then rolled back continues exactly as the shorter prefix did."""
    t = target("v3")
    cfg, fam = t.config, targets.family_of(t.config)
    state = fam.init_state(cfg, 2, 40, jnp.float32)
    assert state.k.shape == (3, 2, 40, 1, 16) and state.v.shape == (3, 2, 40, 1, 8)
    per_token = sum(x.size // (2 * 40) for x in (state.k, state.v)) * 4
    assert fam.state_bytes_per_token(cfg, 4) == per_token == 3 * (16 + 8) * 4
    ds = deepseek_v3.DeepseekV3Config  # the released shape: 576 numbers per token and layer
    assert fam.state_bytes_per_token(dataclasses_replace(cfg, kv_lora_rank=512, qk_rope_head_dim=64,
                                                         head_dim=64, num_layers=61), 2) == 61 * 576 * 2
    assert issubclass(type(cfg), ds)
    ids = jnp.asarray(np.random.default_rng(5).integers(0, 96, size=(2, 20)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(20), (2, 20))
    f = jax.jit(functools.partial(targets.target_forward, cfg))
    _, _, full = f(t.params, ids[:, :12], pos[:, :12], fam.init_state(cfg, 2, 40, jnp.float32))
    rolled = full.rollback(jnp.array([7, 9], jnp.int32))
    want, _, _ = f(t.params, ids, pos)
    a, _, _ = f(t.params, jnp.stack([ids[0, 7:15], ids[1, 9:17]]), jnp.stack([pos[0, 7:15], pos[1, 9:17]]), rolled)
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(want[0, 7:15]), atol=TOL)
    np.testing.assert_allclose(np.asarray(a[1]), np.asarray(want[1, 9:17]), atol=TOL)


def dataclasses_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_parameter_count():
    for variant in VARIANTS:
        model = checkpoint(variant)[0]
        cfg = target(variant).config
        fam = targets.family_of(cfg)
        biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
        assert fam.num_params(cfg) == sum(p.numel() for p in model.parameters()) + biases
        assert fam.num_params(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(target(variant).params))
        Nm, E, k = len(cfg.moe_layers), cfg.num_experts, cfg.num_experts_per_tok
        assert fam.matrix_params(cfg) - fam.matrix_params_per_token(cfg) == Nm * (E - k) * fam.expert_params(cfg)


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
    model, _ = checkpoint("v3")
    ref = reference()
    for p, seq in zip(PROMPTS, ref):
        assert seq == hf_greedy(model, p, MAX_NEW)
    assert len({tok for seq in ref for tok in seq}) > 10, "a degenerate model would not test much"


def test_dflash_equals_autoregressive_for_every_acceptance_length():
    dflash_at_every_accepted_length(target(), PROMPTS, MAX_NEW, reference(), BS)


# ---------------------------------------------------------------------------- checkpoints
def fuse_experts(src: str, dst: str, cfg, extra: dict | None = None) -> None:
    """A copy of the per-expert checkpoint ``src`` with each MoE layer's experts fused
    (transformers' in-memory layout), plus ``extra`` tensors."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for i in cfg.moe_layers:
        name = lambda e, p: f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
        E = range(cfg.num_experts)
        tensors[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([tensors.pop(name(e, "gate_proj")), tensors.pop(name(e, "up_proj"))]) for e in E])
        tensors[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack([tensors.pop(name(e, "down_proj")) for e in E])
    tensors.update(extra or {})
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), dst)


def test_layouts_load_the_same_mtp_layers_are_ignored_and_save_round_trips_bit_exact(tmp_path, caplog):
    _, path = checkpoint("v3")
    t = target("v3")
    assert t.config.num_nextn_predict_layers == 1  # transformers writes one (it builds none)
    mtp = {"model.layers.3.eh_proj.weight": np.zeros((32, 64), np.float32),
           "model.layers.3.self_attn.kv_b_proj.weight": np.zeros((88, 16), np.float32)}
    fused = str(tmp_path / "fused")
    fuse_experts(path, fused, t.config, extra=mtp)
    with caplog.at_level(logging.WARNING):
        f = dj.load_target(fused)
    assert "ignored the multi-token-prediction layers [3]" in caplog.text
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, f.params)
    f.save(str(tmp_path / "saved"))
    ours = load_file(str(tmp_path / "saved" / "model.safetensors"))
    theirs = load_file(os.path.join(path, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name])
        assert ours[name].dtype == theirs[name].dtype
    again = dj.load_target(str(tmp_path / "saved"))
    assert again.config == t.config
    # transformers reads our config.json as the same model
    from transformers import DeepseekV3ForCausalLM

    hf = DeepseekV3ForCausalLM.from_pretrained(str(tmp_path / "saved"), attn_implementation="eager").eval()
    ids = np.arange(12)[None] % 96
    np.testing.assert_allclose(torch_forward(hf, ids)[0], torch_forward(checkpoint("v3")[0], ids)[0], atol=1e-5)
    # a layer past the announced multi-token-prediction layers is an error, not silently dropped
    bad = str(tmp_path / "bad")
    fuse_experts(path, bad, t.config, extra={"model.layers.4.eh_proj.weight": np.zeros((32, 64), np.float32)})
    with pytest.raises(CheckpointError, match=r"model\.layers\.4\.eh_proj\.weight belongs to layer 4"):
        dj.load_target(bad)


def test_a_latent_projection_of_the_wrong_rank_is_named(tmp_path):
    _, path = checkpoint("v3")
    dst = str(tmp_path / "bad")
    shutil.copytree(path, dst)
    file = os.path.join(dst, "model.safetensors")
    tensors = load_file(file)
    tensors["model.layers.1.self_attn.kv_b_proj.weight"] = tensors["model.layers.1.self_attn.kv_b_proj.weight"][:, :12]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.kv_b_proj\.weight: expected \[88, 16\], found \[88, 12\]"):
        dj.load_target(dst)


@pytest.mark.parametrize("field, value, match", [
    ("scoring_func", "softmax", r"scoring_func='softmax': only DeepSeek-V3's sigmoid router"),
    ("topk_method", "greedy", r"topk_method='greedy': only DeepSeek-V3's"),
    ("quantization_config", {"quant_method": "awq"},
     r"quant_method='awq' is not read \(only DeepSeek's block FP8, quant_method 'fp8', and compressed-tensors'"),
    ("quantization_config", {"quant_method": "compressed-tensors", "format": "float-quantized"},
     r"quantization_config format='float-quantized': only compressed-tensors' 'pack-quantized'"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [128]},
     r"weight_block_size must be two positive integers, got \[128\]"),
    ("n_group", 3, r"n_group 3 must divide n_routed_experts 8"),
    ("topk_group", 5, r"topk_group must be in 1\.\.n_group=4, got 5"),
    ("num_experts_per_tok", 9, r"num_experts_per_tok must be in 1\.\.n_routed_experts=8, got 9"),
    ("kv_lora_rank", None, r"missing the MLA / MoE fields: kv_lora_rank"),
    ("head_dim", 12, r"head_dim 12 must equal qk_rope_head_dim 8"),
    ("rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, r"rope"),
])
def test_unimplemented_or_inconsistent_fields_are_refused(field, value, match):
    d = deepseek_v3.DEEPSEEK_V3.config_to_hf(target("v3").config)
    d[field] = value
    if field == "rope_parameters":
        d.pop("rope_scaling", None)
    with pytest.raises(ValueError, match=match):
        dj.TargetConfig.from_hf_dict(d)
    # transformers' own config.json round-trips
    with open(os.path.join(checkpoint("v3")[1], "config.json")) as fh:
        assert dj.TargetConfig.from_hf_dict(json.load(fh)) == target("v3").config


# ---------------------------------------------------------------------------- FP8 block-quantized
FP8_BLOCK = (16, 8)  # not square, and partial edge blocks: kv_a_proj_with_mqa is [24, 32]


def quantize_fp8(w: np.ndarray, block=FP8_BLOCK):
    """DeepSeek's block FP8 by hand: per block the scale max|w| / 448 (e4m3's largest value), the
    weight divided by it and rounded to float8_e4m3fn. Returns (torch fp8 weight, float32 scale)."""
    b0, b1 = block
    rows, cols = -(-w.shape[0] // b0), -(-w.shape[1] // b1)
    scale = np.zeros((rows, cols), np.float32)
    q = np.zeros_like(w)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            scale[i, j] = max(float(np.abs(blk).max()), 1e-12) / 448.0
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = blk / scale[i, j]
    return torch.from_numpy(q).to(torch.float8_e4m3fn), scale


def dequantize_by_blocks(q, scale, block=FP8_BLOCK):
    """The oracle: block by block, ``q * scale``."""
    w = q.float().numpy().copy()
    b0, b1 = block
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] *= scale[i, j]
    return w


def fp8_checkpoint(dst, edit=None, quantization=True):
    """The v3 checkpoint with every projection of the attention, MLPs and experts stored as FP8
    blocks plus its ``weight_scale_inv`` (the router, norms, embedding and head stay float32, as
    in the released files); returns {name: dequantized oracle weight}."""
    from safetensors.torch import save_file as save_torch

    _, path = checkpoint("v3")
    tensors = {n: torch.from_numpy(a) for n, a in load_file(os.path.join(path, "model.safetensors")).items()}
    want = {}
    for name in list(tensors):
        quantized = name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight")
        if quantized and (".self_attn." in name or ".mlp." in name):
            q, scale = quantize_fp8(tensors[name].numpy())
            tensors[name], tensors[name + "_scale_inv"] = q, torch.from_numpy(scale)
            want[name] = dequantize_by_blocks(q, scale)
    if edit:
        edit(tensors)
    os.makedirs(dst, exist_ok=True)
    save_torch(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    if quantization:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": list(FP8_BLOCK)}
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return want


def test_fp8_block_quantized_weights_are_dequantized_on_load(tmp_path):
    """``quantize='none'``: every FP8 weight loads as its blocks times their scales (the oracle
    dequantizes block by block; edge blocks are partial); the model stays close to the float32
    one (FP8 rounding)."""
    want = fp8_checkpoint(str(tmp_path / "fp8"))
    assert len(want) > 40
    t = dj.load_target(str(tmp_path / "fp8"), quantize="none")
    assert t.config == target("v3").config and t.config.fp8_weight_block_size == FP8_BLOCK
    specs = targets.family_of(t.config).tensor_specs(t.config)
    for name, w in want.items():
        spec = specs[name]
        got = t.params
        for k in spec.path:
            got = got[k]
        got = np.asarray(got)[spec.layer]
        if spec.expert is not None:
            got = got[spec.expert]
        np.testing.assert_array_equal(got.T, w, err_msg=name)
        assert not np.array_equal(w, load_file(os.path.join(checkpoint("v3")[1], "model.safetensors"))[name])
    ids = jnp.asarray(np.arange(16)[None] % 96)
    pos = jnp.arange(16)[None]
    a = targets.target_forward(t.config, t.params, ids, pos)[0]
    b = targets.target_forward(target("v3").config, target("v3").params, ids, pos)[0]
    rel = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    assert 0 < rel < 0.5, rel  # FP8 keeps 3 mantissa bits


def test_fp8_block_quantized_weights_load_as_stored(tmp_path):
    """By default the FP8 blocks load as stored: each weight a ``QuantizedWeight`` whose values
    are the file's bytes and whose scales are its ``weight_scale_inv`` (both as [in, out]); the
    forward equals the forward on the dequantized load (the same blocks times scales, float64
    then rounded once); greedy decoding equals it; on a mesh they are dequantized on load."""
    from dflash_jax import quantization as Q
    from dflash_jax.checkpoints import read_tensors

    fp8_checkpoint(str(tmp_path / "fp8"))
    stored = read_tensors(str(tmp_path / "fp8"))
    t = dj.load_target(str(tmp_path / "fp8"))
    plain = dj.load_target(str(tmp_path / "fp8"), quantize="none")
    assert t.quantization == "fp8" and plain.quantization is None
    specs = targets.family_of(t.config).tensor_specs(t.config)
    checked = 0
    for name in ("model.layers.1.self_attn.kv_b_proj.weight", "model.layers.2.mlp.experts.3.down_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight"):
        spec, node = specs[name], t.params
        for k in spec.path:
            node = node[k]
        assert isinstance(node, Q.QuantizedWeight) and node.block == FP8_BLOCK[::-1], name
        index = (spec.layer,) if spec.expert is None else (spec.layer, spec.expert)
        np.testing.assert_array_equal(np.asarray(node.q)[index].view(np.uint8), stored[name].T.view(np.uint8))
        np.testing.assert_array_equal(np.asarray(node.scale)[index], stored[name + "_scale_inv"].T)
        checked += 1
    assert checked == 3
    ids = jnp.asarray(np.arange(16)[None] % 96)
    pos = jnp.arange(16)[None]
    with jax.default_matmul_precision("highest"):
        a = targets.target_forward(t.config, t.params, ids, pos)[0]
        b = targets.target_forward(plain.config, plain.params, ids, pos)[0]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    prompts = [[3, 17, 42, 8, 90, 23], [11, 4, 77, 30]]
    assert dj.generate(t, prompts, 12).sequences == dj.generate(plain, prompts, 12).sequences
    from dflash_jax.parallel import make_mesh

    on_mesh = dj.load_target(str(tmp_path / "fp8"), mesh=make_mesh(data=1, model=1))
    assert on_mesh.quantization is None


@pytest.mark.parametrize("case, match", [
    ("scale-shape", r"q_b_proj\.weight_scale_inv has shape \[4, 1\], but FP8 blocks of \[16, 8\] .* need \[5, 3\]"),
    ("no-scale", r"model\.layers\.2\.self_attn\.o_proj\.weight is stored in FP8 .* without its"),
    ("no-config", r"is FP8 block-quantized, but config\.json has no quantization_config"),
])
def test_bad_fp8_tensors_are_named(tmp_path, case, match):
    def edit(t):
        if case == "scale-shape":
            t["model.layers.1.self_attn.q_b_proj.weight_scale_inv"] = torch.ones(4, 1)
        elif case == "no-scale":
            del t["model.layers.2.self_attn.o_proj.weight_scale_inv"]

    fp8_checkpoint(str(tmp_path / "bad"), edit, quantization=case != "no-config")
    with pytest.raises(CheckpointError, match=match):
        dj.load_target(str(tmp_path / "bad"))


# ---------------------------------------------------------------------------- Kimi-K2.x
def test_kimi_k25_loads_its_text_model_and_kimi_k2_reads_as_deepseek_v3(tmp_path, caplog):
    """transformers' ``Kimi_K25ForConditionalGeneration`` (a vision tower beside a DeepSeek-V3
    text model) written by save_pretrained: the text model loads, its logits equal transformers'
    on text input; the released layout (``language_model.model.layers``) loads the same; the
    vision tensors are ignored by name; a ``kimi_k2`` text config is a deepseek_v3 config."""
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    torch.manual_seed(1)
    text = {**HF_DIMS, **VARIANTS["v3"], "model_type": "deepseek_v3", "num_hidden_layers": 2}
    vision = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=32, num_attention_heads=2,
                  pos_emb_height=4, pos_emb_width=4)
    hf_cfg = Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                            tie_word_embeddings=False)
    hf_cfg._attn_implementation = "eager"
    model = Kimi_K25ForConditionalGeneration(hf_cfg).eval()
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, 8, 32, 2.0)))
            elif "experts" in name:
                p.normal_(0.0, 0.15)
    path = str(tmp_path / "kimi")
    model.save_pretrained(path)
    with caplog.at_level(logging.WARNING):
        t = dj.load_target(path)
    assert "vision-tower tensors" in caplog.text and "projector tensors" in caplog.text
    assert t.config.model_type == "deepseek_v3" and t.config.num_layers == 2
    ids = np.random.default_rng(0).integers(0, 96, size=(1, 20))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids)).logits.numpy()
    got = targets.target_forward(t.config, t.params, jnp.asarray(ids), jnp.arange(20)[None])[0]
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL, rtol=0)
    # the released files name the layers "layers", not the "blocks" transformers writes
    tensors = load_file(os.path.join(path, "model.safetensors"))
    assert any(n.startswith("language_model.model.blocks.") for n in tensors)
    released = str(tmp_path / "released")
    os.makedirs(released)
    save_file({n.replace("language_model.model.blocks.", "language_model.model.layers."): a for n, a in tensors.items()},
              os.path.join(released, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(path, "config.json"), released)
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, dj.load_target(released).params)
    # kimi_k2: the text config's own model_type
    d = deepseek_v3.DEEPSEEK_V3.config_to_hf(t.config)
    assert dj.TargetConfig.from_hf_dict({**d, "model_type": "kimi_k2"}) == t.config
    with open(os.path.join(path, "config.json")) as fh:
        top = json.load(fh)
    with pytest.raises(ValueError, match=r"kimi_k25\) has no text_config"):
        dj.TargetConfig.from_hf_dict({k: v for k, v in top.items() if k != "text_config"})
    with pytest.raises(ValueError, match=r"config_groups.g.weights.symmetric=False: only symmetric"):
        dj.TargetConfig.from_hf_dict({**top, "quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                "strategy": "group", "group_size": 32}}}}})


@pytest.mark.slow
def test_a_gqa_drafter_of_its_own_shapes_drafts_for_the_mla_target(tmp_path):
    """Kimi-K2.5-DFlash's setup scaled down: a Qwen3-layout drafter with its own attention
    (GQA heads and head dim unlike the target's MLA, YaRN RoPE), saved and loaded against the
    MLA target; only hidden size, vocabulary, target layers, mask id and taps must match.
    Greedy DFlash with it equals autoregressive decoding."""
    import dataclasses

    from dflash_jax.config import RopeConfig
    from dflash_jax.methods.dflash.config import DrafterConfig
    from dflash_jax.methods.dflash.model import init_drafter_params

    t = target("v3")
    cfg = dataclasses.replace(DrafterConfig.for_target(t.config, 2, BS, 95, (0, 2)), num_heads=4, num_kv_heads=2,
                              head_dim=16, intermediate_size=40,
                              rope=RopeConfig(theta=5e4, rope_type="yarn", factor=4.0,
                                              original_max_position_embeddings=64))
    cfg.check_target(t.config)
    drafter = dj.Drafter(cfg, init_drafter_params(cfg, jax.random.key(3)))
    dj.save_drafter(drafter, str(tmp_path / "drafter"))
    loaded = dj.load_drafter(str(tmp_path / "drafter"), t)
    assert loaded.config == cfg and loaded.config.head_dim != t.config.head_dim
    r = dj.generate(t, PROMPTS, MAX_NEW, drafter=loaded)
    assert r.sequences == reference()
    with pytest.raises(ValueError, match=r"hidden_size: drafter 48, target 32"):
        dataclasses.replace(cfg, hidden_size=48).check_target(t.config)


# ---------------------------------------------------------------------------- sampling
# As the hybrid families' sampling test: ROWS rows of one prompt, the first DEPTH emitted tokens
# against the exact distribution (prefixes enumerated over a vocabulary of 8), drafts sampled
# from the exact next-token law at another temperature (every partial acceptance occurs).
DEPTH, BLOCK, ROWS, ALPHA, Q_TEMPERATURE = 5, 4, 8192, 1e-4, 1.3
SAMPLING_PROMPT = [1, 2, 3]
NO_ROLLBACK = "test_deepseek_v3_no_rollback"


@flax.struct.dataclass
class NoRollbackState(KVCache):
    """The negative control's bug: after a verified block the state keeps the whole block (its
    lengths are not cut back), so the next block is written and attends from the wrong place."""

    def rollback(self, lengths):
        return self.replace(lengths=jnp.maximum(self.lengths, jnp.asarray(lengths, jnp.int32)))


class NoRollbackFamily(deepseek_v3.DeepseekV3Family):
    model_types = (NO_ROLLBACK,)
    name = NO_ROLLBACK

    def init_state(self, cfg, batch, max_len, dtype):
        s = super().init_state(cfg, batch, max_len, dtype)
        return NoRollbackState(k=s.k, v=s.v, lengths=s.lengths)


if NO_ROLLBACK not in targets.supported_model_types():
    targets.register(NoRollbackFamily())  # the negative control's registry line


@pytest.fixture(scope="module")
def sampling_setup():
    """(target, the same weights under the no-rollback state, exact prefix logits)."""
    from support import exact_sampling

    hf = {**deepseek_v3.DEEPSEEK_V3.config_to_hf(target("v3").config), "vocab_size": 8,
          "max_position_embeddings": 64}
    cfg = dj.TargetConfig.from_hf_dict(hf)
    good = dj.Target.random(cfg, seed=7, init_scale=0.5, max_len=16)
    bad = dj.Target(dataclasses_replace(cfg, model_type=NO_ROLLBACK), good.params, max_len=16)
    return good, bad, exact_sampling.PrefixLogits.compute(good, SAMPLING_PROMPT, DEPTH)


def sample(t, prefix_logits):
    from support.oracle_proposers import TableProposer

    drafter = dj.Drafter.random(t, num_layers=1, block_size=BLOCK, seed=8)
    proposer = TableProposer(prefix_logits, q_temperature=Q_TEMPERATURE)
    return dj.generate(t, [SAMPLING_PROMPT] * ROWS, DEPTH, drafter=drafter, proposer=proposer,
                       sampled_draft=True, temperature=1.0, seed=3)


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution_and_a_state_that_keeps_the_block_does_not(sampling_setup):
    from support import exact_sampling

    good, bad, prefix_logits = sampling_setup
    joint, _ = prefix_logits.joint(1.0)
    r = sample(good, prefix_logits)
    report = exact_sampling.fit(r.sequences, joint, ALPHA)
    print(f"deepseek_v3 sampling: tau {r.tau:.2f}, histogram {r.acceptance_histogram.tolist()}, {report}")
    assert not report.rejected, report
    first = np.array([lens[0] for lens in r.acceptance_lengths])  # every first-iteration length
    assert all(np.mean(first == a) > 0.05 for a in range(1, BLOCK + 1)), np.bincount(first)
    wrong = exact_sampling.fit(sample(bad, prefix_logits).sequences, joint, ALPHA)
    print(f"deepseek_v3 sampling, no rollback: {wrong}")
    assert wrong.rejected, wrong


# ---------------------------------------------------------------------------- packed INT4 (Kimi-K2.5)
INT4_GROUP = 8


def pack_int4(w: np.ndarray, group: int = INT4_GROUP):
    """compressed-tensors' symmetric INT4 groups by hand: per row and group of ``group`` inputs the
    scale max|w| / 8, q = clip(round(w / scale), -8, 7), stored as q + 8 in 4-bit fields, field j of
    a row in int32 word j // 8 at bit 4 (j % 8). Returns (packed int32, scale float32, the weight
    q * scale the loader must give back)."""
    out_dim, in_dim = w.shape
    scale = np.abs(w).reshape(out_dim, -1, group).max(-1) / 8.0
    q = np.clip(np.round(w / np.repeat(scale, group, 1)), -8, 7).astype(np.int64)
    packed = np.zeros((out_dim, -(-in_dim // 8)), np.int64)
    for j in range(in_dim):
        packed[:, j // 8] |= (q[:, j] + 8) << (4 * (j % 8))
    packed = packed.astype(np.uint32).view(np.int32)
    return packed, scale.astype(np.float32), (q * np.repeat(scale, group, 1)).astype(np.float32)


def test_kimi_k25_int4_experts_load_dequantized(tmp_path):
    """The released Kimi-K2.5 layout in small: every routed expert weight stored as compressed-tensors'
    packed INT4 (``weight_packed`` / ``weight_scale`` / ``weight_shape``, groups of 8 here, 32 in the
    release) with its ``quantization_config``; the rest bf16-free float32 as transformers wrote it.
    The loader gives back exactly ``q * scale`` per weight (the hand packer's oracle), leaves the
    other tensors as stored, and the target runs; packed tensors without the config, or a packed
    weight without its scale, are one-line errors naming the tensor."""
    _, path = checkpoint("v3")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    want, stored = {}, {}
    for name, arr in tensors.items():
        if ".mlp.experts." in name and name.endswith(".weight"):
            packed, scale, deq = pack_int4(arr)
            base = name[:-len(".weight")]
            stored |= {base + ".weight_packed": packed, base + ".weight_scale": scale,
                       base + ".weight_shape": np.array(arr.shape, np.int64)}
            want[name] = deq
        else:
            stored[name] = arr
    assert len(want) == 3 * 8 * 2  # gate, up and down of 8 experts in 2 MoE layers
    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
            "dynamic": False, "actorder": None}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.gate$"]}
    dst = tmp_path / "int4"
    os.makedirs(dst)
    save_file(stored, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with open(dst / "config.json", "w") as fh:
        json.dump(config, fh)
    t = dj.load_target(str(dst))
    assert t.config == target("v3").config and t.config.packed_int_scheme.num_bits == 4
    specs = targets.family_of(t.config).tensor_specs(t.config)
    for name, w in want.items():
        spec = specs[name]
        got = np.asarray(t.params[spec.path[0]][spec.path[1]][spec.path[2]][spec.path[3]])[spec.layer][spec.expert]
        np.testing.assert_array_equal(got.T, w, err_msg=name)
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params["layers"]["self_attn"],
                           target("v3").params["layers"]["self_attn"])
    ids = jnp.asarray(np.arange(12)[None] % 96)
    a = targets.target_forward(t.config, t.params, ids, jnp.arange(12)[None])[0]
    b = targets.target_forward(target("v3").config, target("v3").params, ids, jnp.arange(12)[None])[0]
    assert 0 < float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) < 0.5  # INT4 keeps the model close
    del config["quantization_config"]
    with open(dst / "config.json", "w") as fh:
        json.dump(config, fh)
    with pytest.raises(CheckpointError, match=r"weight_packed is a packed integer weight, but config\.json has no"):
        dj.load_target(str(dst))

