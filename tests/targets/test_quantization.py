"""Weight-only quantized targets (``dflash_jax.quantization``, docs/quantization.md): the int8 and
FP8 values and scales against a float64 quantization of each column; each family's quantized
forward against its forward on the float64-dequantized weights; no float copy of the layers kept
in a compiled decode loop; greedy DFlash == AR at every accepted length on quantized dense, MoE
and hybrid targets; the quantized embedded target's logits within their stated bound of the
float32 ones; bad input refused before anything loads."""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import quantization as Q
from dflash_jax.config import TargetConfig
from dflash_jax.bench.prompt_sets import load_prompt_set
from dflash_jax.prompts import encode_prompt
from dflash_jax.targets import family_of, target_forward
from dflash_jax.tools.gpu_suite import MOE_TINY

from support import hybrid_targets as ht
from support.oracle_proposers import dflash_at_every_accepted_length
from support.tiers import tiered

pytestmark = pytest.mark.xdist_group("quantization")

PROMPTS = [[3, 17, 42, 8, 99, 23, 5, 61], [11, 4, 77, 30, 2]]
MAX_NEW, BS = 24, 4


def qmax_reference(kind):
    return {"int8": 127.0, "fp8": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)}[kind]


def float64_weight(w: Q.QuantizedWeight) -> np.ndarray:
    """The weight a QuantizedWeight stands for, in float64 on the host (the oracle)."""
    q = np.asarray(w.q).astype(np.float64)
    s = np.asarray(w.scale, np.float64)
    bi, bo = w.block
    s = np.repeat(np.repeat(s, bi, axis=-2)[..., :q.shape[-2], :], bo, axis=-1)[..., :q.shape[-1]]
    return q * s


def float64_dequantized(params):
    """``params`` with every quantized matrix replaced by its float64 dequantization in float32."""
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(float64_weight(x), jnp.float32) if Q.is_quantized_leaf(x) else x, params,
        is_leaf=Q.is_quantized_leaf)


@pytest.mark.parametrize("kind", Q.KINDS)
def test_values_and_scales_are_a_float64_quantization_of_each_output_channel(kind):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 48, 40)).astype(np.float32)  # [layers, in, out]
    w[0, 5, 7] = 30.0  # an outlier sets its column's scale alone
    w[1, :, 3] = 0.0  # an all-zero column
    qw = Q.quantize_array(jnp.asarray(w), kind)
    assert qw.q.dtype == Q.STORAGE[kind] and qw.scale.shape == (2, 1, 40) and qw.block == (48, 1)
    amax = np.abs(w.astype(np.float64)).max(axis=-2, keepdims=True)
    want_scale = np.where(amax > 0, amax / qmax_reference(kind), 1.0)
    np.testing.assert_allclose(np.asarray(qw.scale, np.float64), want_scale, rtol=1e-6)
    x = w.astype(np.float64) / np.asarray(qw.scale, np.float64)
    q = np.asarray(qw.q).astype(np.float64)
    if kind == "int8":
        np.testing.assert_array_equal(q, np.clip(np.round(x), -127, 127))
        assert np.abs(q).max() == 127
    else:  # the nearest e4m3 value of each (the cast's rounding), never past 448
        np.testing.assert_array_equal(q, x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
        assert np.abs(q).max() == 448
    # the weight it stands for is within half a step of each original value
    err = np.abs(float64_weight(qw) - w)
    step = np.asarray(qw.scale, np.float64) * (1.0 if kind == "int8" else np.maximum(
        2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -6))) - 3), 2.0 ** -9))
    assert np.all(err <= step / 2 + 1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(Q.dequantize)(qw)), float64_weight(qw), rtol=1e-6, atol=1e-7)


def test_block_scales_dequantize_as_float64_with_partial_edge_blocks():
    """The released FP8 layout (``weight_block_size`` [b_out, b_in], ``weight_scale_inv`` per
    block, edge blocks partial), read into the tree's [in, out] orientation."""
    rng = np.random.default_rng(1)
    out_dim, in_dim, block = 20, 12, (8, 5)  # 3 x 3 blocks, the last of each partial
    w8 = (rng.standard_normal((out_dim, in_dim)) * 100).astype(ml_dtypes.float8_e4m3fn)
    scale_inv = rng.uniform(0.01, 2.0, (3, 3)).astype(np.float32)
    qw = Q.from_block_fp8(w8, scale_inv, block, "float32", "w", "test")
    want = np.empty((out_dim, in_dim))
    for i in range(out_dim):
        for j in range(in_dim):
            want[i, j] = float(w8[i, j]) * float(scale_inv[i // block[0], j // block[1]])
    np.testing.assert_array_equal(float64_weight(qw), want.T)
    np.testing.assert_allclose(np.asarray(Q.dequantize(qw)), want.T, rtol=1e-7)
    with pytest.raises(ValueError, match=r"w_scale_inv has shape \[2, 3\], but FP8 blocks of \[8, 5\] "
                                         r"\(weight_block_size\) over w \[20, 12\] need \[3, 3\]"):
        Q.from_block_fp8(w8, scale_inv[:2], block, "float32", "w", "test")


# ---------------------------------------------------------------------------- every family
def family_target(name: str) -> dj.Target:
    if name == "embedded":
        return dj.load_embedded(dtype=jnp.float32)[0]
    if name in MOE_TINY:
        return dj.Target.random(TargetConfig.from_hf_dict(MOE_TINY[name]), seed=1, init_scale=0.1)
    if name == "qwen3_5_text":
        return ht.random_target(ht.hybrid_config("qwen3_5_text"), seed=0)
    from dflash_jax.targets.moe.qwen3_5_moe import MoeBlockConfig

    moe = MoeBlockConfig(hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=48, norm_topk_prob=True)
    return ht.random_target(ht.hybrid_config("qwen3_5_moe_text", layer_types=(ht.LINEAR, ht.LINEAR, ht.FULL),
                                             moe=moe), seed=3)


FAMILIES = ["embedded", *MOE_TINY, "qwen3_5_text", "qwen3_5_moe_text"]


@pytest.mark.parametrize("name", tiered(FAMILIES, fast=["embedded"]))
def test_each_family_runs_its_quantized_layers_as_their_float64_dequantization(name):
    """What is quantized (every linear layer's matrix and stacked expert matrix; not embeddings,
    the LM head, norms, biases, routers, gates or convolutions), and the forward pass on the
    quantized parameters equal to the forward on their float64 dequantization."""
    t = family_target(name)
    qp = Q.quantize_params(t.params, "int8")
    flat = jax.tree_util.tree_flatten_with_path(qp, is_leaf=Q.is_quantized_leaf)[0]
    quantized = {jax.tree_util.keystr(p) for p, x in flat if Q.is_quantized_leaf(x)}
    kept = {jax.tree_util.keystr(p) for p, x in flat if not Q.is_quantized_leaf(x) and x.ndim >= 2}
    assert quantized and all(k.endswith("['kernel']") or "['experts']" in k for k in quantized), quantized
    for never in ("embed", "lm_head", "router", "['gate']", "conv1d", "norm"):
        assert not any(never in k for k in quantized), (never, quantized)
    for must in ("o_proj", "down_proj"):
        assert any(must in k for k in quantized), (must, quantized)
    assert not any(k.endswith("['kernel']") and not any(e in k for e in Q.KEEP_KEYS) for k in kept), kept
    assert Q.param_bytes(qp) < 0.5 * Q.param_bytes(t.params) or name == "embedded"
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, t.config.vocab_size, (2, 12)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    fwd = jax.jit(lambda p: target_forward(t.config, p, tokens, positions)[0])
    with jax.default_matmul_precision("highest"):
        got, want = np.asarray(fwd(qp)), np.asarray(fwd(float64_dequantized(qp)))
        plain = np.asarray(fwd(t.params))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(got - plain).max() > 1e-4, "the quantization changed nothing: not tested"


def decode_loop_temp_bytes(t: dj.Target, params) -> int:
    """XLA's temporaries of an 8-step decode loop over ``params`` (the layout the engine runs)."""
    fam = family_of(t.config)
    p = fam.loop_params(params)

    def loop(p, tok):
        st = fam.init_state(t.config, 1, 64, jnp.float32)

        def body(i, c):
            tok, st = c
            logits, _, st = target_forward(t.config, p, tok, jnp.full((1, 1), i, jnp.int32), st)
            return jnp.argmax(logits[:, -1:], -1).astype(jnp.int32), st
        return jax.lax.fori_loop(0, 8, body, (tok, st))[0]
    return jax.jit(loop).lower(p, jnp.zeros((1, 1), jnp.int32)).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", tiered(["embedded", "gemma4_text"], fast=["gemma4_text"]))
def test_a_decode_loop_keeps_no_float_copy_of_the_quantized_layers(name):
    """Dequantized one layer at a time inside the loop: the compiled loop's temporaries exceed
    the float model's by at most about one layer's float weights (XLA hoisting every layer's
    dequantization out of the loop would keep them all: 1.3 MB against 0.5 on gemma4_text, 51 MB
    against 13 on the embedded target)."""
    t = family_target(name)
    qp = Q.quantize_params(t.params, "int8")
    layer_keys = [k for k in qp if k.startswith("layers")]
    if layer_keys == ["layers"]:  # stacked: one layer's share of the stack
        n = t.config.num_layers
        layer = Q.param_bytes(Q.dequantize_params(qp["layers"])) / n
    else:
        layer = max(Q.param_bytes(Q.dequantize_params(qp[k])) for k in layer_keys)
    all_layers = sum(Q.param_bytes(Q.dequantize_params(qp[k])) for k in layer_keys)
    base, quant = decode_loop_temp_bytes(t, t.params), decode_loop_temp_bytes(t, qp)
    assert quant <= base + 1.5 * layer, (quant, base, layer, all_layers)
    assert all_layers > 2.5 * layer  # the bound tells one layer from all of them


GREEDY_CASES = [("embedded", "int8"), ("embedded", "fp8"), ("qwen3_moe", "int8"), ("qwen3_5_text", "int8")]


@pytest.mark.parametrize("case", tiered(GREEDY_CASES, fast=[("embedded", "int8")], ids="-".join))
def test_greedy_dflash_equals_the_quantized_targets_autoregressive_output_at_every_length(case):
    name, kind = case
    t = family_target(name)
    qt = dj.Target(t.config, Q.quantize_params(t.params, kind), t.tokenizer)
    assert qt.quantization == kind
    prompts = [[x % t.config.vocab_size for x in p] for p in PROMPTS]
    reference = dj.generate(qt, prompts, MAX_NEW).sequences
    dflash_at_every_accepted_length(qt, prompts, MAX_NEW, reference, BS)


@pytest.mark.slow
def test_the_shipped_drafter_on_the_quantized_embedded_target():
    """Lossless with the real drafter too, and what it proposes still accepted: tau on two GSM8K
    and two MBPP prompts (64 new tokens) within 15 % of the float32 target's."""
    t, d = dj.load_embedded(dtype=jnp.float32)
    tok = t.tokenizer
    samples = load_prompt_set("gsm8k", max_samples=2) + load_prompt_set("mbpp", max_samples=2)
    prompts = [encode_prompt(x.turns[0], tok) for x in samples]
    taus = {}
    for kind in (None, *Q.KINDS):
        qt = t if kind is None else dj.Target(t.config, Q.quantize_params(t.params, kind), tok)
        r = dj.generate(qt, prompts, 64, drafter=dj.load_drafter("embedded", qt))
        if kind is not None:  # (the float32 target's: tests/embedded)
            assert r.sequences == dj.generate(qt, prompts, 64).sequences
        taus[kind] = np.mean([np.mean(a) for a in r.acceptance_lengths])
    assert taus[None] > 4  # measured 5.2 (int8 5.4, FP8 5.3)
    for kind in Q.KINDS:
        assert taus[kind] > 0.85 * taus[None], taus


def test_the_quantized_embedded_targets_logits_are_within_their_bound_of_float32():
    """Max |logit difference| on a prompt's 55 positions: int8 below 0.1, FP8 below 0.4
    (measured 0.050 and 0.158; logits' standard deviation about 2.2), the greedy token the same at
    most positions; a quantization without its scales is far outside."""
    t = family_target("embedded")
    ids = t.tokenizer.encode("Explain how a hash map works, step by step, with an example in Python. " * 3)[:64]
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    fwd = jax.jit(lambda p: target_forward(t.config, p, tokens, positions)[0])
    ref = np.asarray(fwd(t.params))
    for kind, bound in (("int8", 0.1), ("fp8", 0.4)):
        qp = Q.quantize_params(t.params, kind)
        got = np.asarray(fwd(qp))
        assert np.abs(got - ref).max() < bound, (kind, np.abs(got - ref).max())
        assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.9
        unscaled = jax.tree_util.tree_map(
            lambda x: Q.QuantizedWeight(x.q, jnp.full_like(x.scale, x.scale.mean()), x.block, x.dtype)
            if Q.is_quantized_leaf(x) else x, qp, is_leaf=Q.is_quantized_leaf)
        assert np.abs(np.asarray(fwd(unscaled)) - ref).max() > 5 * bound  # the negative control


# ---------------------------------------------------------------------------- bad input
def test_bad_quantization_requests_are_refused_before_anything_loads(tmp_path, capsys):
    with pytest.raises(ValueError, match="quantize='int4' is not a supported weight quantization: choose "
                                         "'int8', 'fp8', 'none'"):
        dj.load_target(str(tmp_path / "no-such-target"), quantize="int4")
    with pytest.raises(ValueError, match="quantized targets run on one device for now"):
        dj.load_target(str(tmp_path / "no-such-target"), quantize="int8", mesh=object())
    t = family_target("qwen3_moe")
    qt = dj.Target(t.config, Q.quantize_params(t.params, "fp8"))
    with pytest.raises(ValueError, match=r"quantized \(fp8\) in memory: save the float target"):
        qt.save(tmp_path / "saved")
    assert not os.path.exists(tmp_path / "saved")
    from dflash_jax.decoding import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--prompt", "hi", "--quantize", "int4"])
    assert e.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


def test_generate_command_quantizes_the_target(capsys):
    from dflash_jax.decoding import cli

    t, d = dj.load_embedded(dtype=jnp.float32)
    qt = dj.Target(t.config, Q.quantize_params(t.params, "int8"), t.tokenizer)
    want = t.tokenizer.decode(dj.generate(qt, [t.tokenizer.encode("The capital of France is")], 12).sequences[0])
    cli.main(["--prompt", "The capital of France is", "--max-new-tokens", "12", "--dtype", "float32",
              "--quantize", "int8", "--drafter", "embedded"])
    assert want in capsys.readouterr().out


# ---------------------------------------------------------------------------- released FP8 files
def test_a_released_block_fp8_checkpoint_loads_as_stored_or_dequantized(tmp_path):
    """A tiny random Qwen3 written in the released block-FP8 layout (``tools/fp8_checkpoint.py``:
    float8_e4m3fn weights, float32 ``weight_scale_inv`` per [16, 16] block, partial edge blocks,
    the released ``quantization_config``): loaded as stored, its matrices are those blocks (the
    values bit for bit, the scales transposed to [in, out]) and its logits equal the forward on
    the float64 dequantization; ``quantize='none'`` loads that dequantization; ``'int8'`` quantizes
    it per channel."""
    from dflash_jax.checkpoints import read_tensors
    from dflash_jax.tools import fp8_checkpoint

    src, out = tmp_path / "float", tmp_path / "fp8"
    cfg = TargetConfig(model_type="qwen3", vocab_size=96, hidden_size=40, intermediate_size=72, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=12, max_position_embeddings=128)
    dj.Target.random(cfg, seed=4, init_scale=0.1).save(src)
    names = fp8_checkpoint.main([str(src), str(out), "--block", "16", "16"])
    assert len(names) == 2 * 7 and not any("embed" in n or "norm" in n for n in names)
    stored = read_tensors(out)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3",
                                             "quant_method": "fp8", "weight_block_size": [16, 16]}
    t = dj.load_target(out)
    assert t.quantization == "fp8"
    q = t.params["layers"]["mlp"]["down_proj"]["kernel"]  # [2, 72, 40]: in 72 = 4.5 blocks of 16
    assert isinstance(q, Q.QuantizedWeight) and q.block == (16, 16) and q.scale.shape == (2, 5, 3)
    w = stored["model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(np.asarray(q.q[1]).view(np.uint8), w.T.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(q.scale[1]), stored["model.layers.1.mlp.down_proj.weight_scale_inv"].T)
    tokens = jnp.asarray([[5, 9, 81, 33, 2, 70]], jnp.int32)
    positions = jnp.arange(6, dtype=jnp.int32)[None]
    fwd = jax.jit(lambda p: target_forward(t.config, p, tokens, positions)[0])
    with jax.default_matmul_precision("highest"):
        want = np.asarray(fwd(float64_dequantized(t.params)))
        np.testing.assert_allclose(np.asarray(fwd(t.params)), want, rtol=1e-5, atol=1e-5)
        plain = dj.load_target(out, quantize="none")
        assert plain.quantization is None
        np.testing.assert_array_equal(np.asarray(plain.params["layers"]["mlp"]["down_proj"]["kernel"]),
                                      np.asarray(float64_dequantized(t.params)["layers"]["mlp"]["down_proj"]["kernel"]))
        np.testing.assert_allclose(np.asarray(fwd(plain.params)), want, rtol=1e-5, atol=1e-5)
    assert dj.load_target(out, quantize="int8").quantization == "int8"
    from dflash_jax.parallel import make_mesh

    mesh = make_mesh(data=1, model=1)
    with pytest.raises(ValueError, match="holds block-FP8 weights: quantized targets run on one device"):
        dj.load_target(out, mesh=mesh)
    on_mesh = dj.load_target(out, quantize="none", mesh=mesh)  # dequantized on the host, then placed
    np.testing.assert_array_equal(np.asarray(on_mesh.params["layers"]["mlp"]["down_proj"]["kernel"]),
                                  np.asarray(plain.params["layers"]["mlp"]["down_proj"]["kernel"]))
    assert dj.load_target(out, quantize="fp8").params["layers"]["mlp"]["up_proj"]["kernel"].block == (16, 16)
    # greedy DFlash == AR on it, as stored
    prompts = [[x % 96 for x in p] for p in PROMPTS]
    reference = dj.generate(t, prompts, MAX_NEW).sequences
    dflash_at_every_accepted_length(t, prompts, MAX_NEW, reference, BS)


def test_bad_block_fp8_checkpoints_are_refused_naming_the_tensor_or_field(tmp_path):
    from dflash_jax.checkpoints import read_tensors
    from dflash_jax.tools import fp8_checkpoint

    src, good = tmp_path / "float", tmp_path / "fp8"
    cfg = TargetConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    dj.Target.random(cfg, seed=1).save(src)
    fp8_checkpoint.main([str(src), str(good), "--block", "16", "16"])
    tensors = read_tensors(good)
    config = json.loads((good / "config.json").read_text())
    scale = "model.layers.0.mlp.up_proj.weight_scale_inv"

    def variant(name, tensors=tensors, config=config):
        d = tmp_path / name
        d.mkdir()
        fp8_checkpoint.write_safetensors_raw(tensors, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(config))
        return str(d)

    cases = [
        (variant("wrong-shape", {**tensors, scale: tensors[scale][:1]}),
         r"model.layers.0.mlp.up_proj.weight_scale_inv has shape \[1, 2\], but FP8 blocks of \[16, 16\] "
         r"\(weight_block_size\) over model.layers.0.mlp.up_proj.weight \[48, 32\] need \[3, 2\]"),
        (variant("int-scale", {**tensors, scale: tensors[scale].astype(np.int32)}),
         "weight_scale_inv is int32: FP8 block scales are float32"),
        (variant("no-scale", {n: a for n, a in tensors.items() if n != scale}),
         r"model.layers.0.mlp.up_proj.weight is stored in FP8 \(float8_e4m3fn\) without its "
         "model.layers.0.mlp.up_proj.weight_scale_inv"),
        (variant("no-config", tensors, {k: v for k, v in config.items() if k != "quantization_config"}),
         "is FP8 block-quantized, but config.json has no quantization_config with its weight_block_size"),
        (variant("bad-block", tensors, {**config, "quantization_config": {**config["quantization_config"],
                                                                          "weight_block_size": [16, 0]}}),
         r"weight_block_size must be two positive integers, got \[16, 0\]"),
        (variant("other-method", tensors, {**config, "quantization_config": {"quant_method": "gptq"}}),
         "quant_method='gptq' is not read"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            dj.load_target(path)
    with pytest.raises(FileExistsError):
        fp8_checkpoint.main([str(src), str(good)])
