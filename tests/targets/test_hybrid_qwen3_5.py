"""The Qwen3.5 / 3.6 hybrid target families (``qwen3_5_text``, ``qwen3_5_moe_text``;
``dflash_jax.targets.hybrid``) against transformers' PyTorch models (float32, tiny random
checkpoints written by ``save_pretrained`` with Hv != Hk, GDN and attention layers mixed):

* logits and every layer's tap (``hidden_states[i + 1]``) of ``Qwen3_5ForCausalLM``, with the
  GDN layers' chunked form in one chunk and in several; ``Qwen3_5MoeForCausalLM``'s logits;
* the multimodal release layout (``Qwen3_5ForConditionalGeneration`` with a tiny vision tower,
  plus MTP tensors): ``load_target`` loads the text model (same logits as transformers'
  multimodal model on text) and says what it ignored;
* the decode state against the one-pass forward: a prompt, then one token at a time and blocks
  of several (both rollback modes); rollback of the hybrid state to every kept length of a
  block (ragged over the batch, one row per length) then a continuation equals a fresh pass
  over the kept prefix;
* config.json and weights written by ``Target.save`` load in transformers as the same model;
  the config reads back equal;
* bad input: one-line errors naming the field or tensor.
"""

import dataclasses
import json
import logging
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
from dflash_jax.config import TargetConfig
from dflash_jax.targets.hybrid import qwen3_5

from support.moe_oracles import separated_router

pytestmark = [pytest.mark.xdist_group("hybrid_qwen3_5"), pytest.mark.torch]

TOL = 5e-5
"""Relative to the largest |value|: float32 transformers is as far (1e-4 on logits of 5) from
its own float64 run as this implementation is."""
D = 64
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention"] * 2
"""Two repeats of a period of two GDN layers and an attention layer: the forward's scan over
periods (records and states restacked in layer order), its scan over a run of GDN layers, and
taps of both kinds, the last one after the final norm."""
TEXT_DIMS = dict(vocab_size=128, hidden_size=D, intermediate_size=96, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                 linear_conv_kernel_dim=4, max_position_embeddings=256, layer_types=LAYER_TYPES)
MOE_DIMS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=48)
VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=D,
              patch_size=4, num_position_embeddings=16)


def randomize(model, seed: int, scale: float = 0.15):
    """Weights large enough that every part shows in the logits: matrices normal(scale), conv
    filters normal(0.4), the norms' weights normal(0.2) around their init, A_log / dt_bias
    spread; MoE routers well separated (no near-tie between the k-th and next expert)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "conv1d" in name:
                p.copy_(0.4 * noise)
            elif "A_log" in name or "dt_bias" in name:
                p.add_(0.5 * noise)
            elif p.ndim == 1:
                p.add_(0.2 * noise)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, p.shape[0], p.shape[1], scale=4.0)))
            else:
                p.copy_(scale * noise)
    return model.eval()


def hf_text_model(seed=0, **over):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{**TEXT_DIMS, **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomize(Qwen3_5ForCausalLM(cfg), seed)


def hf_logits(model, ids, hidden=False):
    with torch.no_grad():
        out = model(torch.as_tensor(np.asarray(ids)), output_hidden_states=hidden)
    return out if hidden else out.logits.numpy()


_fwd = jax.jit(lambda cfg, params, tokens, positions, state, taps:
               targets.family_of(cfg).forward(cfg, params, tokens, positions, state, tap_layer_ids=taps),
               static_argnums=(0, 5))


def run(cfg, params, tokens, state=None, taps=()):
    """Our forward (jitted) at positions ``state.lengths + arange(T)`` (0.. without a state).
    Where the GDN form does not depend on ``gdn_rollback`` (no state, one token, a block longer
    than ``gdn_chunk``: ``model.gdn_form``), the config is compiled as the replay one's, so
    that the two modes' tests share those compilations."""
    tokens = jnp.asarray(tokens, jnp.int32)
    T = tokens.shape[1]
    if state is None or T == 1 or T > cfg.gdn_chunk:
        cfg = dataclasses.replace(cfg, gdn_rollback="replay")
    start = jnp.zeros(tokens.shape[0], jnp.int32) if state is None else state.lengths
    positions = start[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    return _fwd(cfg, params, tokens, positions, state, tuple(taps))


rollback = jax.jit(lambda state, lengths: state.rollback(lengths))


def close(a, b, what, tol=TOL):
    """max |a - b| below ``tol`` times the reference's largest magnitude (at least 1)."""
    b = np.asarray(b)
    err, scale = float(np.max(np.abs(np.asarray(a) - b))), max(1.0, float(np.max(np.abs(b))))
    print(f"{what}: max |diff| {err:.3g}, max |ref| {scale:.3g}")
    assert err < tol * scale, f"{what}: max |diff| {err:.3g} (largest |value| {scale:.3g})"


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """(transformers model, its save_pretrained dir, our Target loaded from it)."""
    model = hf_text_model()
    path = str(tmp_path_factory.mktemp("qwen3_5_text"))
    model.save_pretrained(path)
    return model, path, dj.load_target(path)


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(1).integers(0, TEXT_DIMS["vocab_size"], (2, 24))


# ---------------------------------------------------------------------------- parity
def test_logits_and_taps_match_transformers(text, ids):
    model, _, target = text
    cfg = target.config
    assert cfg.layer_types == tuple(TEXT_DIMS["layer_types"]) and cfg.partial_rotary_factor == 0.25
    assert cfg.rotary_dim == 4 and cfg.gdn_layers == (0, 1, 3, 4) and cfg.attention_layers == (2, 5)
    out = hf_logits(model, ids, hidden=True)
    # chunks of 8: two chunk boundaries inside the prompt (the other tests run one chunk)
    layers = tuple(range(6))
    logits, taps, _ = run(dataclasses.replace(cfg, gdn_chunk=8), target.params, ids, taps=layers)
    close(logits, out.logits.numpy(), "logits")
    for i in layers:  # GDN layers 0, 1, 3, 4, attention layers 2 and 5 (after the final norm)
        close(taps[..., i * D:(i + 1) * D], out.hidden_states[i + 1].numpy(), f"tap {i}")
    fam = targets.family_of(cfg)
    assert fam.num_params(cfg) == sum(p.numel() for p in model.parameters())


def test_moe_text_matches_transformers(tmp_path, ids):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    dims = {k: v for k, v in TEXT_DIMS.items() if k != "intermediate_size"}
    hcfg = Qwen3_5MoeTextConfig(**dims, **MOE_DIMS, tie_word_embeddings=True)
    hcfg._attn_implementation = "eager"
    torch.manual_seed(2)
    model = randomize(Qwen3_5MoeForCausalLM(hcfg), 2, scale=0.1)
    model.save_pretrained(tmp_path)
    target = dj.load_target(tmp_path)
    cfg = target.config
    assert cfg.model_type == "qwen3_5_moe_text" and cfg.moe.num_experts == 4 and cfg.tie_word_embeddings
    logits, _, _ = run(cfg, target.params, ids)
    close(logits, hf_logits(model, ids), "MoE logits", tol=2 * TOL)  # experts' sums: more rounding
    assert targets.family_of(cfg).num_params(cfg) == sum(p.numel() for p in model.parameters())
    # written back, transformers reads the same model (per-expert tensors, MoE config fields)
    target.save(tmp_path / "ours")
    again = Qwen3_5MoeForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    close(hf_logits(again, ids), logits, "MoE logits after Target.save", tol=2 * TOL)


def test_multimodal_layout_loads_the_text_model(tmp_path, ids, caplog):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text_cfg = {**TEXT_DIMS}
    mcfg = Qwen3_5Config(text_config=text_cfg, vision_config=VISION, tie_word_embeddings=True)
    mcfg._attn_implementation = "eager"
    torch.manual_seed(3)
    model = randomize(Qwen3_5ForConditionalGeneration(mcfg), 3)
    model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    assert any(n.startswith("model.language_model.") for n in tensors)
    n_visual = sum(n.startswith("model.visual.") for n in tensors)
    tensors["mtp.fc.weight"] = np.ones((D, 2 * D), np.float32)  # the release's MTP head
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="dflash_jax.targets.hybrid.qwen3_5"):
        target = dj.load_target(tmp_path)
    said = caplog.text
    assert f"{n_visual} vision-tower tensors (model.visual.*)" in said
    assert "1 multi-token-prediction tensors (mtp.*)" in said
    cfg = target.config
    assert cfg.model_type == "qwen3_5_text" and cfg.tie_word_embeddings and "lm_head" not in target.params
    logits, _, _ = run(cfg, target.params, ids)
    close(logits, hf_logits(model, ids), "multimodal checkpoint's text logits")


# ---------------------------------------------------------------------------- decode state
MODES = [("replay", 4, 5), ("snapshot", 4, 4)]
"""(gdn_rollback, gdn_chunk, verify block length) of the decode-state tests: replay with a
block over a chunk boundary; snapshot with a block the recurrence runs (up to gdn_chunk rows).
The prompt of 8 is chunked in both modes, and the tests share their shapes (6 rows; blocks of
8, 1, 3 and 5 or 4; a 16-token pass) and so their compilations."""
B, P, C = 6, 8, 3


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(5)
    return rng.integers(0, TEXT_DIMS["vocab_size"], (B, P + 5 + C))


@pytest.mark.slow
def test_decode_state_matches_one_pass(text, rows):
    """A prompt (chunked, over chunk boundaries), one-token steps (the recurrence) and blocks
    through the state: the logits of the one pass. (The snapshot mode's blocks run the
    recurrence: test_rollback_to_every_length checks them against a fresh pass.)"""
    _, _, target = text
    mode, chunk, _ = MODES[0]
    cfg = dataclasses.replace(target.config, gdn_rollback=mode, gdn_chunk=chunk)
    fam = targets.family_of(cfg)
    full, _, _ = run(cfg, target.params, rows)
    state = fam.init_state(cfg, B, 32, jnp.float32)
    got, t = [], 0
    for n in (P, 1, 1, C, C):
        logits, _, state = run(cfg, target.params, rows[:, t:t + n], state)
        got.append(logits)
        t += n
        np.testing.assert_array_equal(state.lengths, [t] * B)
        state = rollback(state, state.lengths)  # the loop carries rolled-back states
    close(jnp.concatenate(got, axis=1), full, f"{mode}: stepped logits vs one pass")


@pytest.mark.slow
@pytest.mark.parametrize("mode,chunk,T", MODES)
def test_rollback_to_every_length(text, rows, mode, chunk, T):
    """Six rows run a prompt (8) and a block (T), roll back to keep n = 0..T of the block (row
    b keeps b % (T + 1)) and continue with 3 more tokens: their logits equal a fresh pass over
    prompt + block[:n] + continuation (right-padded into one batch: causal, so the padding
    after a row's tokens does not change them)."""
    _, _, target = text
    cfg = dataclasses.replace(target.config, gdn_rollback=mode, gdn_chunk=chunk)
    fam = targets.family_of(cfg)
    prompt, block, cont = rows[:, :P], rows[:, P:P + T], rows[:, P + T:P + T + C]
    state = fam.init_state(cfg, B, 32, jnp.float32)
    _, _, state = run(cfg, target.params, prompt, state)
    state = rollback(state, state.lengths)
    _, _, state = run(cfg, target.params, block, state)
    rec = state.gdn.record  # the verify block's form: the recurrence keeps every row's state
    assert (rec.snapshots is not None, rec.bounds is not None) == (mode == "snapshot", mode == "replay")
    keep = np.arange(B) % (T + 1)
    state = rollback(state, jnp.asarray(P + keep, jnp.int32))
    assert state.gdn.record is None
    logits, _, state = run(cfg, target.params, cont, state)
    np.testing.assert_array_equal(state.lengths, P + keep + C)
    seqs = np.zeros_like(rows)
    for b in range(B):
        row = np.concatenate([prompt[b], block[b, :keep[b]], cont[b]])
        seqs[b, :len(row)] = row
    fresh, _, _ = run(cfg, target.params, seqs)
    want = np.stack([np.asarray(fresh)[b, P + keep[b]:P + keep[b] + C] for b in range(B)])
    close(logits, want, f"{mode}: logits after rollback to every kept length")


# ---------------------------------------------------------------------------- config and saving
def test_save_loads_in_transformers_and_config_round_trips(text, ids, tmp_path):
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    model, _, target = text
    target.save(tmp_path)
    again = Qwen3_5ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    close(hf_logits(again, ids), hf_logits(model, ids), "transformers on what Target.save wrote")
    hf = AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == "qwen3_5_text" and list(hf.layer_types) == TEXT_DIMS["layer_types"]
    assert hf.rope_parameters["partial_rotary_factor"] == 0.25
    assert TargetConfig.from_hf_dict(hf.to_dict()) == target.config
    assert TargetConfig.from_pretrained(tmp_path) == target.config
    # the MoE config through transformers' class
    from transformers import Qwen3_5MoeTextConfig

    dims = {k: v for k, v in TEXT_DIMS.items() if k != "intermediate_size"}
    moe = TargetConfig.from_hf_dict(Qwen3_5MoeTextConfig(**dims, **MOE_DIMS).to_dict())
    back = Qwen3_5MoeTextConfig(**{k: v for k, v in moe.to_hf_dict().items() if k != "architectures"})
    assert TargetConfig.from_hf_dict(back.to_dict()) == moe
    # without layer_types: transformers' rule (every 4th layer full attention)
    d = {k: v for k, v in moe.to_hf_dict().items() if k != "layer_types"}
    assert TargetConfig.from_hf_dict(d).layer_types == (("linear_attention",) * 3 + ("full_attention",)
                                                        + ("linear_attention",) * 2)


def test_random_params_and_sizes():
    cfg = TargetConfig.from_hf_dict({"model_type": "qwen3_5_text", **TEXT_DIMS})
    fam = targets.family_of(cfg)
    shapes = jax.eval_shape(lambda k: fam.init_params(cfg, k, jnp.bfloat16), jax.random.key(0))
    assert {x.dtype for x in jax.tree_util.tree_leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}
    specs = fam.tensor_specs(cfg)  # every parameter has its tensors, of the spec'd shapes
    assert fam.num_params(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(shapes)) == sum(
        int(np.prod(s.shape)) for s in specs.values())
    assert fam.state_bytes_per_token(cfg, 2) == 2 * 2 * 2 * 16 * 2  # two attention layers' K and V
    assert fam.fixed_state_bytes(cfg, 3, 2) == 4 * 3 * (3 * 64 * 2 + 4 * 8 * 8 * 4)


# ---------------------------------------------------------------------------- bad input
def _one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, msg


@pytest.mark.parametrize("change,parts", [
    (dict(layer_types=LAYER_TYPES[:1] + ["sliding_attention"] + LAYER_TYPES[2:]),
     ("layer_types[1]='sliding_attention'", "linear_attention, full_attention")),
    (dict(layer_types=LAYER_TYPES[:2]), ("layer_types has 2 entries", "num_hidden_layers is 6")),
    (dict(linear_num_value_heads=3), ("linear_num_value_heads (3)", "linear_num_key_heads (2)")),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                           "original_max_position_embeddings": 128}), ("rope type 'yarn'", "rope_type")),
])
def test_bad_configs_are_one_line_errors(change, parts):
    with pytest.raises(ValueError) as e:
        TargetConfig.from_hf_dict({"model_type": "qwen3_5_text", **TEXT_DIMS, **change})
    _one_line(e, *parts)


def test_multimodal_config_without_text_config():
    with pytest.raises(ValueError) as e:
        TargetConfig.from_hf_dict({"model_type": "qwen3_5", "vision_config": VISION})
    _one_line(e, "qwen3_5", "text_config")
    with pytest.raises(ValueError) as e:
        TargetConfig.from_hf_dict({"model_type": "qwen3_5_moe", **TEXT_DIMS})
    _one_line(e, "text_config")


def test_mrope_fields_are_accepted():
    rope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5,
            "mrope_section": [1, 1, 0], "mrope_interleaved": True}
    cfg = TargetConfig.from_hf_dict({"model_type": "qwen3_5", "tie_word_embeddings": True,
                                     "text_config": {**TEXT_DIMS, "rope_parameters": rope}})
    assert cfg.rotary_dim == 8 and cfg.rope.theta == 1e6 and cfg.tie_word_embeddings
    # the MoE release's layout: the block's fields under text_config too
    dims = {k: v for k, v in TEXT_DIMS.items() if k != "intermediate_size"}
    moe = TargetConfig.from_hf_dict({"model_type": "qwen3_5_moe", "text_config": {
        **dims, **MOE_DIMS, "model_type": "qwen3_5_moe_text", "rope_parameters": rope}})
    assert moe.model_type == "qwen3_5_moe_text" and moe.moe.shared_expert_intermediate_size == 48
    assert not moe.tie_word_embeddings and moe.intermediate_size == 48


def _multimodal_copy(text, tmp_path):
    """The text checkpoint rewritten in the multimodal layout (``model.language_model.``)."""
    _, path, _ = text
    tensors = {n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n: t
               for n, t in load_file(os.path.join(path, "model.safetensors")).items()}
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    os.makedirs(tmp_path, exist_ok=True)
    return tensors, {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                     "text_config": d}


def _write(tmp_path, tensors, config):
    save_file(tensors, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp_path, "config.json"), "w") as f:
        json.dump(config, f)


def test_bad_checkpoints_name_the_tensor(text, tmp_path):
    tensors, config = _multimodal_copy(text, tmp_path)
    name = "model.language_model.layers.4.linear_attn.in_proj_a.weight"
    _write(tmp_path, {n: t for n, t in tensors.items() if n != name}, config)
    with pytest.raises(CheckpointError) as e:
        dj.load_target(tmp_path)
    _one_line(e, "GDN tensor model.layers.4.linear_attn.in_proj_a.weight is missing")
    _write(tmp_path, tensors, {**config, "text_config": {**config["text_config"], "linear_conv_kernel_dim": 3}})
    with pytest.raises(CheckpointError) as e:
        dj.load_target(tmp_path)
    _one_line(e, "model.layers.0.linear_attn.conv1d.weight has kernel size 4", "linear_conv_kernel_dim is 3")
    # the text-only layout: the family's pre-check gives the same one-line messages
    _, path, _ = text
    shutil.copy(os.path.join(path, "config.json"), tmp_path / "config.json")
    plain = {n.replace("model.language_model.", "model."): t for n, t in tensors.items()}
    save_file({n: t for n, t in plain.items() if "layers.3.linear_attn.dt_bias" not in n},
              os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        dj.load_target(tmp_path)
    _one_line(e, "GDN tensor model.layers.3.linear_attn.dt_bias is missing")
    save_file(plain, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    _write(tmp_path, plain, {**d, "linear_conv_kernel_dim": 3})
    with pytest.raises(CheckpointError) as e:
        dj.load_target(tmp_path)
    _one_line(e, "model.layers.0.linear_attn.conv1d.weight has kernel size 4", "linear_conv_kernel_dim is 3")


def test_state_class_and_forward_checks(text):
    _, _, target = text
    cfg = target.config
    fam = targets.family_of(cfg)
    state = fam.init_state(cfg, 2, 16, jnp.float32)
    assert isinstance(state, qwen3_5.QWEN3_5.state_class)
    assert state.kv.k.shape == (2, 2, 16, 2, 16) and state.gdn.ssm.shape == (4, 2, 4, 8, 8)
    with pytest.raises(ValueError, match="tap layer id 6"):
        fam.forward(cfg, target.params, jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3), jnp.int32),
                    tap_layer_ids=(6,))
    with pytest.raises(ValueError, match="state batch 2 != tokens batch 1"):
        fam.forward(cfg, target.params, jnp.zeros((1, 3), jnp.int32), jnp.zeros((1, 3), jnp.int32), state)
