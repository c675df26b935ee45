"""The gpt_oss target family (``dflash_jax/targets/moe/gpt_oss.py``) against transformers'
PyTorch ``GptOssForCausalLM`` (float32, a tiny random model).

The model: 4 layers alternating sliding window (W = 5) and full attention, prompts longer than
the window, 8 experts with k = 2, YaRN RoPE, q/k/v/o biases, sinks drawn around 1 (they take a
large share of each softmax), ``swiglu_limit`` 2 so both clamps of the experts' GLU act, and
router weights large enough that every top-k decision has a margin. The experts' weights are
MXFP4 numbers made by transformers' own ``convert_moe_packed_tensors`` from random packed
blocks, so the same model is stored both ways: transformers' ``save_pretrained`` (dequantized)
and the released MXFP4 layout (``_blocks`` / ``_scales``, hand-written here).
"""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import GptOssConfig as HFConfig, GptOssForCausalLM
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.checkpoints import CheckpointError
from dflash_jax.parallel import rules
from dflash_jax.targets.moe import gpt_oss, mxfp4

from support.oracle_proposers import ReferenceProposer

pytestmark = [pytest.mark.xdist_group("gpt_oss"), pytest.mark.torch]

N_LAYERS, E, K, D, F, V, W = 4, 8, 2, 32, 32, 96, 5
TOL = 5e-5  # float32, relative to the logits' scale (measured: 1.2e-5)
PROMPTS = [[5, 17, 4], [11, 2, 30, 5, 5, 8, 21, 1, 44, 60, 7]]  # ragged; the second > W
ROPE = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 64, "rope_theta": 500.0}


def hf_config(**over):
    kw = dict(num_hidden_layers=N_LAYERS, num_local_experts=E, num_experts_per_tok=K, vocab_size=V,
              hidden_size=D, intermediate_size=F, head_dim=8, num_attention_heads=4,
              num_key_value_heads=2, sliding_window=W, max_position_embeddings=256,
              swiglu_limit=2.0, rope_parameters=dict(ROPE), eos_token_id=None, pad_token_id=None)
    kw.update(over)
    return HFConfig(**kw)


def packed(rng, shape, lo, hi):
    """Random MXFP4 blocks [..., out, in/32, 16] and scales in [lo, hi)."""
    blocks = rng.integers(0, 256, (*shape[:-1], shape[-1] // 32, 16), dtype=np.uint8)
    scales = rng.integers(lo, hi, (*shape[:-1], shape[-1] // 32), dtype=np.uint8)
    return blocks, scales


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(torch model, float checkpoint dir, MXFP4 checkpoint dir, the MXFP4 tensors)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = GptOssForCausalLM(hf_config()).eval()
    quant = {}
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)
        for i, layer in enumerate(model.model.layers):
            layer.mlp.router.weight.normal_(0, 2.0)
            layer.mlp.router.bias.normal_(0, 0.5)
            layer.self_attn.sinks.normal_(1.0, 1.0)
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.self_attn.o_proj):
                proj.weight.normal_(0, 0.2)
                proj.bias.normal_(0, 0.1)
            ex = layer.mlp.experts
            for name, shape, lo, hi in (("gate_up_proj", (E, 2 * F, D), 124, 127),
                                        ("down_proj", (E, D, F), 122, 125)):
                blocks, scales = packed(rng, shape, lo, hi)
                weight = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                    dtype=torch.float32)
                getattr(ex, name).copy_(weight)  # transformers' own dequantization: [E, in, out]
                quant[f"model.layers.{i}.mlp.experts.{name}"] = (blocks, scales)
            ex.gate_up_proj_bias.normal_(0, 0.3)
            ex.down_proj_bias.normal_(0, 0.1)
    float_dir = tmp_path_factory.mktemp("gpt_oss_float")
    model.save_pretrained(float_dir)
    # the released layout: experts as MXFP4 blocks + scales, a quantization_config
    mx_dir = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    tensors = load_file(os.path.join(float_dir, "model.safetensors"))
    for name, (blocks, scales) in quant.items():
        del tensors[name]
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    save_file(tensors, os.path.join(mx_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(float_dir, "config.json")))
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    json.dump(config, open(os.path.join(mx_dir, "config.json"), "w"))
    return model, str(float_dir), str(mx_dir), tensors


@pytest.fixture(scope="module")
def target(models):
    return dj.load_target(models[1])


TAPS = (0, 1, 2, N_LAYERS - 1)


def positions_of(tokens):
    return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


forward = jax.jit(targets.target_forward, static_argnums=0, static_argnames=("tap_layer_ids",))
"""``targets.target_forward``, compiled once per config and shape"""


@functools.lru_cache(maxsize=None)
def probe_tokens():
    return np.random.default_rng(1).integers(0, V, (2, 14))


def torch_outputs(model, tokens):
    """Logits, hidden states, and per layer the router's input and its top-k (ids, weights,
    the gap between the k-th and (k+1)-th logit)."""
    routed = {}

    def hook(i):
        def fn(module, inputs, output):
            logits, scores, ids = output
            top = torch.topk(logits, K + 1, dim=-1).values
            routed[i] = (inputs[0].numpy(), ids.numpy(), scores.numpy(),
                         (top[:, K - 1] - top[:, K]).numpy())
        return fn

    handles = [layer.mlp.router.register_forward_hook(hook(i))
               for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        out = model(torch.from_numpy(tokens), output_hidden_states=True)
    for h in handles:
        h.remove()
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states], routed


# ---------------------------------------------------------------------------- forward
def test_logits_taps_and_routing_match_transformers(models, target):
    model = models[0]
    tokens = probe_tokens()
    ref, hidden, routed = torch_outputs(model, tokens)
    taps_ids = TAPS
    logits, taps, _ = forward(target.config, target.params, jnp.asarray(tokens, jnp.int32),
                              positions_of(tokens), tap_layer_ids=taps_ids)
    scale = np.abs(ref).max()
    err = np.abs(np.asarray(logits) - ref).max()
    print(f"gpt_oss logits: max |err| {err:.2e}, max |logit| {scale:.2f}")
    assert err < TOL * scale
    for j, i in enumerate(taps_ids):  # the last tap is after the final norm: hidden_states[-1]
        got = np.asarray(taps[..., j * D:(j + 1) * D])
        assert np.abs(got - hidden[i + 1]).max() < TOL * np.abs(hidden[i + 1]).max(), i
    # routing: our router on transformers' router inputs picks the same experts, same weights
    for i in range(N_LAYERS):
        x, ids, weights, gap = routed[i]
        assert gap.min() > 1e-3, "a top-k decision too close to call: the test would be fragile"
        layer = jax.tree_util.tree_map(lambda a: a[i], target.params["layers"])
        w, got_ids = gpt_oss.route(target.config, layer["mlp"], jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(got_ids), ids)
        np.testing.assert_allclose(np.asarray(w), weights, atol=1e-5)
        assert len(np.unique(ids)) == E  # every expert is used somewhere


def test_the_clamped_glu_acts_on_both_sides(target):
    """The experts' pre-activations reach past the limit (2) on both sides, so the clamps are
    exercised by the parity test; the GLU itself against its formula."""
    h = jnp.asarray(np.random.default_rng(2).normal(0, 3, (5, 2 * F)), jnp.float32)
    gate, up = np.asarray(h[:, 0::2]), np.asarray(h[:, 1::2])
    g = np.minimum(gate, 2.0)
    want = (np.clip(up, -2.0, 2.0) + 1) * g / (1 + np.exp(-1.702 * g))
    np.testing.assert_allclose(np.asarray(gpt_oss.gpt_oss_glu(h, 1.702, 2.0)), want, rtol=1e-6, atol=1e-6)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(20, D)), jnp.float32)
    e = jax.tree_util.tree_map(lambda a: a[0], target.params["layers"])["mlp"]["experts"]
    pre = jnp.einsum("nd,edf->enf", x, e["gate_up_proj"]) + e["gate_up_proj_bias"][:, None]
    assert float(pre[..., 0::2].max()) > 2.0 and float(pre[..., 1::2].min()) < -2.0


def mutated(target, **changes):
    """The target's logits on the probe tokens with a changed config or sinks."""
    cfg, params = target.config, target.params
    if "sinks" in changes:
        params = jax.tree_util.tree_map(lambda a: a, params)
        params["layers"]["self_attn"]["sinks"] = jnp.full_like(params["layers"]["self_attn"]["sinks"],
                                                               changes.pop("sinks"))
    cfg = dataclasses.replace(cfg, **changes)
    tokens = probe_tokens()  # the parity test's call (its taps too): a changed sink needs no compile
    return np.asarray(forward(cfg, params, jnp.asarray(tokens, jnp.int32), positions_of(tokens),
                              tap_layer_ids=TAPS)[0])


def test_a_wrong_sink_or_window_fails_the_parity_test(models, target):
    """Negative controls: without sinks (a logit of -1e30: the plain softmax) or with the window
    one longer or one shorter (the off-by-one), the logits miss transformers' by far more than
    the tolerance."""
    ref = torch_outputs(models[0], probe_tokens())[0]
    bound = TOL * np.abs(ref).max()
    for what, logits in [
            ("no sinks", mutated(target, sinks=-1e30)),
            ("window W + 1", mutated(target, sliding_window=W + 1)),
            ("window W - 1", mutated(target, sliding_window=W - 1))]:
        err = np.abs(logits - ref).max()
        print(f"{what}: max |err| {err:.3f} ({err / bound:.0f}x the tolerance)")
        assert err > 1000 * bound, what


def test_the_cache_and_verify_blocks_see_exactly_the_window(models, target):
    """Through the KV cache in the engine's three ways (a prompt chunk, single tokens, blocks of
    16 rows, each row seeing its own window of W positions), and after a rollback that drops a
    rejected block's rows (slots rewritten later), the logits equal transformers' full pass."""
    tokens = np.random.default_rng(4).integers(0, V, (1, 50))
    ref = torch_outputs(models[0], tokens)[0]
    cfg = target.config
    state = targets.family_of(cfg).init_state(cfg, 1, 64, jnp.float32)
    got = np.zeros_like(ref)
    junk = np.random.default_rng(5).integers(0, V, (1, 16))
    for lo, hi in [(0, 16), (16, 17), (17, 18), (18, 34), (34, 50)]:
        if lo == 18:  # a rejected block first: written, then rolled back entirely
            _, _, state = forward(cfg, target.params, jnp.asarray(junk, jnp.int32),
                                  jnp.arange(18, 34, dtype=jnp.int32)[None], state)
            state = state.rollback(jnp.array([18]))
        pos = jnp.arange(lo, hi, dtype=jnp.int32)[None]
        logits, _, state = forward(cfg, target.params, jnp.asarray(tokens[:, lo:hi], jnp.int32), pos, state)
        got[:, lo:hi] = np.asarray(logits)
    # against transformers, position by position, no further than our own full pass is plus the
    # tolerance: where float32 rounding sets the full pass apart from transformers (7e-5 of the
    # logits' scale at one position on an AVX-512 CPU, 1.2e-5 on AVX2), the cache may be as far
    full = forward(cfg, target.params, jnp.asarray(tokens, jnp.int32), jnp.arange(50, dtype=jnp.int32)[None],
                   targets.family_of(cfg).init_state(cfg, 1, 64, jnp.float32))[0]
    full_err = np.abs(np.asarray(full) - ref).max(-1)
    assert np.all(np.abs(got - ref).max(-1) <= full_err + TOL * np.abs(ref).max())


# ---------------------------------------------------------------------------- checkpoints
def test_mxfp4_dequantization_equals_transformers_conversion():
    """float32 (ldexp) and bfloat16 (the loader's table path; with scales near 0 or 255, where
    values leave bfloat16's normal range, the ldexp path) against transformers' conversion."""
    rng = np.random.default_rng(6)
    for lo, hi in ((100, 150), (0, 256)):
        blocks, scales = packed(rng, (3, 5, 64), lo, hi)
        for torch_dtype, np_dtype in ((torch.float32, np.float32), (torch.bfloat16, jnp.bfloat16)):
            ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                             dtype=torch_dtype).float().numpy()
            got = mxfp4.dequantize_mxfp4(blocks, scales, np_dtype).astype(np.float32)
            assert got.shape == (3, 64, 5)  # [E, in, out]: stored out-major, returned as the model holds it
            np.testing.assert_array_equal(got, ref)
    b2, s2 = mxfp4.quantize_mxfp4(mxfp4.dequantize_mxfp4(blocks, scales))
    np.testing.assert_array_equal(mxfp4.dequantize_mxfp4(b2, s2), mxfp4.dequantize_mxfp4(blocks, scales))


def test_the_mxfp4_layout_loads_as_the_same_model(models, target):
    model, _, mx_dir, _ = models
    t = dj.load_target(mx_dir, dtype=jnp.float32)
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, target.params)
    t16 = dj.load_target(mx_dir)  # stored dtype: the experts dequantized to bfloat16 (exact)
    e = t16.params["layers"]["mlp"]["experts"]
    assert e["gate_up_proj"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(e["gate_up_proj"], np.float32),
                                  np.asarray(target.params["layers"]["mlp"]["experts"]["gate_up_proj"]))


@pytest.mark.parametrize("bug, match", [
    ("block_size", r"down_proj_blocks has shape \[8, 32, 2, 8\]: MXFP4 blocks are .*16 bytes"),
    ("scales_shape", r"gate_up_proj_scales has shape \[8, 64, 2\], but .*gate_up_proj_blocks \[8, 64, 1, 16\] needs"),
    ("no_scales", r"layers.1.mlp.experts.down_proj_scales is missing"),
    ("both", r"layers.0.mlp.experts.gate_up_proj is stored both dequantized and as MXFP4"),
    ("dtype", r"down_proj_blocks / .*down_proj_scales must be uint8"),
    ("groups", r"down_proj_blocks \[8, 32, 2, 16\] dequantizes to \[8, 64, 32\], expected \[8, 32, 32\]"),
])
def test_malformed_mxfp4_tensors_are_one_line_errors_naming_the_tensor(models, tmp_path, bug, match):
    _, _, mx_dir, tensors = models
    tensors = dict(tensors)
    name = "model.layers.1.mlp.experts.down_proj"
    if bug == "block_size":
        tensors[f"{name}_blocks"] = np.zeros((E, D, 2, 8), np.uint8)
    elif bug == "scales_shape":
        tensors["model.layers.1.mlp.experts.gate_up_proj_scales"] = np.zeros((E, 2 * F, 2), np.uint8)
    elif bug == "no_scales":
        del tensors[f"{name}_scales"]
    elif bug == "both":
        tensors["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((E, D, 2 * F), np.float32)
    elif bug == "dtype":
        tensors[f"{name}_blocks"] = tensors[f"{name}_blocks"].astype(np.int8)
    elif bug == "groups":
        tensors[f"{name}_blocks"] = np.zeros((E, D, 2, 16), np.uint8)
        tensors[f"{name}_scales"] = np.zeros((E, D, 2), np.uint8)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with open(os.path.join(mx_dir, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(CheckpointError, match=match) as info:
        dj.load_target(tmp_path)
    assert "\n" not in str(info.value)


def test_save_round_trip_is_bit_exact_and_transformers_reads_it(models, target, tmp_path):
    _, float_dir, _, _ = models
    target.save(tmp_path)
    a = load_file(os.path.join(float_dir, "model.safetensors"))
    b = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    again = dj.load_target(tmp_path)
    assert again.config == target.config
    hf = HFConfig.from_pretrained(tmp_path)  # transformers builds the same model from our config.json
    for key in ("layer_types", "sliding_window", "num_local_experts", "num_experts_per_tok",
                "swiglu_limit", "swiglu_alpha", "head_dim", "rms_norm_eps"):
        assert getattr(hf, key) == getattr(hf_config(), key), key
    assert {k: v for k, v in hf.rope_parameters.items()} == ROPE


# ---------------------------------------------------------------------------- decoding
MAX_NEW = 80


@pytest.fixture(scope="module")
def ar(target):
    return dj.generate(target, PROMPTS, MAX_NEW).sequences


HF_NEW = 32  # transformers' generate checks the first 32 (its MoE loop is slow on CPU)


def test_greedy_generate_equals_transformers_on_a_ragged_batch(models, ar):
    model = models[0]
    for prompt, ours in zip(PROMPTS, ar):
        with torch.no_grad():  # one row at a time: transformers' own greedy decoding, no padding
            out = model.generate(torch.tensor([prompt]), max_new_tokens=HF_NEW, do_sample=False,
                                 min_new_tokens=HF_NEW)
        assert ours[:HF_NEW] == out[0, len(prompt):].tolist()
    assert len(set(ar[1][:HF_NEW])) > 4, "a degenerate continuation would not test much"


BS = 16
SCHEDULE = ([16, 1, 14, 3, 12, 5, 10, 7], [15, 2, 13, 4, 11, 6, 9, 8])
"""The acceptance lengths each row's first iterations must have (then whole blocks): all of
1..16, each once, in 68 tokens per row."""


def test_greedy_dflash_equals_autoregressive_for_every_acceptance_length(target, ar):
    """Blocks of 16 rows (more than the window W = 5: each verify row must see exactly its own
    window through the cache, and rejected rows are rolled back) with a proposer that knows the
    greedy continuation and is wrong at a chosen index in every iteration (SCHEDULE); the
    output equals autoregressive decoding, which equals transformers' (the test above)."""
    width = max(len(p) + len(r) for p, r in zip(PROMPTS, ar)) + BS
    rows = np.zeros((len(PROMPTS), width), np.int32)
    table = np.full((len(PROMPTS), width), BS - 1, np.int32)  # [row, start] -> wrong draft index
    for b, (p, r) in enumerate(zip(PROMPTS, ar)):
        rows[b, :len(p) + len(r)] = p + r
        start = len(p)  # the first iteration's anchor: the prefill's token at len(prompt)
        for a in SCHEDULE[b]:
            table[b, start], start = a - 1, start + a

    def wrong_at(start):
        return jnp.asarray(table)[jnp.arange(len(PROMPTS)), jnp.minimum(start, width - 1)]

    drafter = dj.Drafter.random(target, num_layers=1, block_size=BS, seed=6)
    r = dj.generate(target, PROMPTS, MAX_NEW, drafter=drafter, proposer=ReferenceProposer(rows, wrong_at))
    assert r.sequences == ar
    for b, lens in enumerate(r.acceptance_lengths):
        assert list(lens[:len(SCHEDULE[b])]) == SCHEDULE[b]
    assert set(SCHEDULE[0]) | set(SCHEDULE[1]) == set(range(1, BS + 1))


# ---------------------------------------------------------------------------- config, sizes, rules
def test_config_reads_the_hub_layout_and_refuses_what_is_not_implemented(target):
    hub = {**hf_config().to_dict(), "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"},
           "experts_per_token": K, "quantization_config": {"quant_method": "mxfp4"}}
    hub.pop("rope_parameters")
    hub["rope_theta"] = ROPE["rope_theta"]
    assert dj.TargetConfig.from_hf_dict(hub) == target.config
    assert dj.TargetConfig.from_hf_dict(target.config.to_hf_dict()) == target.config
    bad = [({"quantization_config": {"quant_method": "fp8"}}, "quant_method='fp8'"),
           ({"layer_types": ["sliding_attention", "chunked_attention"] * 2}, "'chunked_attention'"),
           ({"layer_types": ["full_attention"] * 3}, "layer_types has 3 entries for 4 layers"),
           ({"sliding_window": None}, "sliding_window=null with sliding_attention layers"),
           ({"experts_per_token": 3}, "experts_per_token=3 differs from num_experts_per_tok=2"),
           ({"rope_scaling": {**hub["rope_scaling"], "alpha": 1}}, "yarn rope_scaling has fields .*alpha"),
           ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
           ({"swiglu_alpha": None}, "swiglu_alpha=null: must be a number"),
           ({"swiglu_limit": "7"}, "swiglu_limit=\"7\": must be a number")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            dj.TargetConfig.from_hf_dict({**hub, **change})


def test_size_model_and_partition_rules(models, target):
    cfg, fam = target.config, targets.family_of(target.config)
    assert fam.num_params(cfg) == sum(p.numel() for p in models[0].parameters())
    assert fam.num_params(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(target.params))
    experts = N_LAYERS * E * 3 * D * F
    assert fam.matrix_params_per_token(cfg) == fam.matrix_params(cfg) - experts * (E - K) // E
    assert fam.matrix_params_read(cfg, 1) == pytest.approx(fam.matrix_params_per_token(cfg))
    read16 = fam.matrix_params_read(cfg, 16)  # E (1 - (1 - k/E)^16) = 7.92 of 8 experts
    assert read16 == pytest.approx(fam.matrix_params(cfg) - experts * (1 - K / E) ** 16)
    specs = rules.param_specs(target.params, fam.param_axes(cfg))
    e_spec = specs["layers"]["mlp"]["experts"]["gate_up_proj"]
    assert tuple(e_spec) == (None, "expert", None, "model")
    assert tuple(specs["layers"]["self_attn"]["sinks"]) == (None, "model")
    with pytest.raises(ValueError, match="attention_impl='xla' only"):
        targets.target_forward(cfg, target.params, jnp.zeros((1, 2), jnp.int32),
                               jnp.zeros((1, 2), jnp.int32), attention_impl="pallas")


def test_bad_forward_inputs_are_named(target):
    ok = jnp.zeros((1, 3), jnp.int32)
    for tokens, positions, taps, match in ((ok[0], ok[0], (), "tokens must have rank 2"),
                                           (ok, jnp.zeros((1, 4), jnp.int32), (), "must equal tokens shape"),
                                           (ok, ok, (N_LAYERS,), f"tap layer id {N_LAYERS} is outside")):
        with pytest.raises(ValueError, match=match):
            targets.target_forward(target.config, target.params, tokens, positions, tap_layer_ids=taps)
