"""The ``gemma4_text`` target family against transformers' ``Gemma4ForCausalLM`` (float32, tiny
random checkpoints written by ``save_pretrained``, norms, layer scalars and router scales drawn
away from 1), and a DFlash drafter on it against the reference package ``dflash==0.1.0``
(``tests/fixtures/gemma4_dflash_reference.json``, ``tools/gemma4_dflash_reference.py``):

* logits and taps on the full pass and through the decode state in blocks, for three variants:
  ``dense`` (sliding and full layers with their own head dims and KV heads, keys as values on
  the full layers, proportional partial RoPE, soft-capped tied head), ``moe`` (the MoE block
  beside the MLP; routing ids and weights equal transformers' router inside the model) and
  ``ple`` (per-layer input embeddings, KV-shared layers with double-wide MLPs, untied head);
* greedy ``generate`` equals transformers' on a ragged batch; greedy DFlash equals
  autoregressive decoding for every acceptance length; sampling keeps the target's law (and a
  state that keeps the whole block does not);
* a DFlash drafter with ``input_embedding_scale``, ``output_multiplier`` and
  ``final_logit_softcapping``: drafts, every row's five best logits and the acceptance lengths
  equal the reference's, iteration for iteration;
* checkpoints: the multimodal ``gemma4`` layout loads its text model (towers ignored by name),
  stored K/V of shared layers are ignored, ``Target.save`` writes transformers' tensors back bit
  for bit, bad fields are one-line errors naming them.
"""

import dataclasses
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
from dflash_jax.targets import gemma4
from dflash_jax.targets.gemma4 import model as g4

from support.model_parity import torch_forward
from support.moe_oracles import separated_router
from support.oracle_proposers import dflash_at_every_accepted_length
from support.tiers import tiered

pytestmark = [pytest.mark.xdist_group("gemma4"), pytest.mark.torch]

TOL = 1e-4
SL, FL = "sliding_attention", "full_attention"
HF_DIMS = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
               attention_k_eq_v=True, sliding_window=5, hidden_size_per_layer_input=0,
               vocab_size_per_layer_input=96, final_logit_softcapping=6.0, layer_types=[SL, SL, FL, SL, SL, FL],
               rms_norm_eps=1e-6, max_position_embeddings=256)
VARIANTS = {
    "dense": {},
    "moe": dict(enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=12,
                attention_k_eq_v=False, rope_parameters={SL: {"rope_type": "default", "rope_theta": 500.0},
                                                         FL: {"rope_type": "proportional", "rope_theta": 1e4,
                                                              "partial_rotary_factor": 0.5, "factor": 2.0}}),
    "ple": dict(hidden_size_per_layer_input=6, num_kv_shared_layers=3, use_double_wide_mlp=True,
                tie_word_embeddings=False),
}


def make_hf(variant: str, seed: int = 0):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    cfg = Gemma4TextConfig(**{**HF_DIMS, **VARIANTS[variant]})
    cfg._attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scale"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("router.proj.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, p.shape[0], p.shape[1], 2.0)))
            else:
                p.normal_(0.0, 0.15)
        for layer in model.model.layers:
            layer.layer_scalar.copy_(torch.tensor([0.7 + 0.1 * layer.layer_idx]))
    return model


@functools.lru_cache(maxsize=None)
def checkpoint(variant: str):
    """(torch model, checkpoint directory written by its save_pretrained)."""
    import tempfile

    model = make_hf(variant)
    path = tempfile.mkdtemp(prefix=f"gemma4-{variant}-")
    model.save_pretrained(path)
    return model, path


@functools.lru_cache(maxsize=None)
def target(variant: str = "dense"):
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


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize("variant", tiered(sorted(VARIANTS), fast=["ple"]))
def test_logits_and_taps_equal_transformers(variant):
    model, _ = checkpoint(variant)
    t = target(variant)
    cfg, D = t.config, t.config.hidden_size
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 22))
    ref_logits, ref_hidden = torch_forward(model, ids)
    assert np.abs(ref_logits).max() > 2.0  # the cap (6) bends them
    tap_ids = tuple(range(cfg.num_layers))
    forward = jax.jit(functools.partial(targets.target_forward, cfg), static_argnames=("tap_layer_ids",))
    pos = jnp.broadcast_to(jnp.arange(22), (2, 22))
    logits, taps, _ = forward(t.params, jnp.asarray(ids), pos, tap_layer_ids=tap_ids)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0)
    for j, i in enumerate(tap_ids):  # tap of layer i == hidden_states[i + 1] (the last one normed)
        np.testing.assert_allclose(np.asarray(taps[..., j * D:(j + 1) * D]), ref_hidden[i + 1], atol=TOL, rtol=0)
    fam = targets.family_of(cfg)
    state = fam.init_state(cfg, 2, 40, jnp.float32)
    for lo, hi in [(0, 9), (9, 10), (10, 22)]:  # past the window of 5 in the later blocks
        logits, taps, state = forward(t.params, jnp.asarray(ids[:, lo:hi]),
                                      jnp.broadcast_to(jnp.arange(lo, hi), (2, hi - lo)), state, tap_layer_ids=(1,))
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(taps), ref_hidden[2][:, lo:hi], atol=TOL, rtol=0)


def test_routing_inside_the_model_equals_transformers():
    model, _ = checkpoint("moe")
    cfg, params = target("moe").config, target("moe").params
    captured = {}
    hooks = [layer.router.register_forward_hook(
        lambda mod, inp, out, i=i: captured.__setitem__(i, (inp[0].numpy(), out[1].numpy(), out[2].numpy())))
        for i, layer in enumerate(model.model.layers)]
    torch_forward(model, np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 24)))
    for h in hooks:
        h.remove()
    route = jax.jit(functools.partial(g4.route, cfg))
    for i in range(cfg.num_layers):
        x, ref_w, ref_ids = captured[i]
        w, got = route(params[f"layers_{i}"]["router"], jnp.asarray(x))
        order, ref_order = np.argsort(np.asarray(got), -1), np.argsort(ref_ids, -1)
        np.testing.assert_array_equal(np.take_along_axis(np.asarray(got), order, -1),
                                      np.take_along_axis(ref_ids, ref_order, -1))
        np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order, -1),
                                   np.take_along_axis(ref_w, ref_order, -1), atol=1e-5)
        assert len(np.unique(ref_ids)) >= cfg.num_experts - 1


def test_state_layout_size_and_rollback():
    """One cache per layer type, a layer for each layer with K/V of its own (the KV-shared ones
    have none): what ``state_bytes_per_token`` says. A block run then rolled back continues
    exactly as the shorter prefix did."""
    t = target("ple")
    cfg, fam = t.config, targets.family_of(t.config)
    assert cfg.kv_layers == (0, 1, 2) and cfg.kv_producers == (2, 1)
    state = fam.init_state(cfg, 2, 40, jnp.float32)
    assert state.sliding.k.shape == (2, 2, 40, 2, 8) and state.full.k.shape == (1, 2, 40, 1, 16)
    per_token = sum(x.size // (2 * 40) for x in (state.sliding.k, state.sliding.v, state.full.k, state.full.v)) * 4
    assert fam.state_bytes_per_token(cfg, 4) == per_token
    ids = jnp.asarray(np.random.default_rng(5).integers(0, 96, size=(2, 20)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(20), (2, 20))
    f = jax.jit(functools.partial(targets.target_forward, cfg))
    _, _, full = f(t.params, ids[:, :12], pos[:, :12], fam.init_state(cfg, 2, 40, jnp.float32))
    rolled = full.rollback(jnp.array([7, 9], jnp.int32))
    want, _, _ = f(t.params, ids, pos)
    a, _, _ = f(t.params, jnp.stack([ids[0, 7:15], ids[1, 9:17]]), jnp.stack([pos[0, 7:15], pos[1, 9:17]]), rolled)
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(want[0, 7:15]), atol=TOL)
    np.testing.assert_allclose(np.asarray(a[1]), np.asarray(want[1, 9:17]), atol=TOL)


def test_parameter_count():
    for variant in VARIANTS:
        model = checkpoint(variant)[0]
        t = target(variant)
        fam = targets.family_of(t.config)
        buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith("layer_scalar"))
        assert fam.num_params(t.config) == sum(p.numel() for p in model.parameters()) + buffers
        assert fam.num_params(t.config) == sum(x.size for x in jax.tree_util.tree_leaves(t.params))


def hf_greedy(model, prompt, max_new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


PROMPTS = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 3, 44, 60, 7], [90]]
MAX_NEW = 24
BS = 5


@functools.lru_cache(maxsize=None)
def reference(variant: str = "ple"):
    return dj.generate(target(variant), PROMPTS, MAX_NEW, stop_token_ids=()).sequences


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ple", "moe"])
def test_greedy_generate_equals_transformers_on_a_ragged_batch(variant):
    model, _ = checkpoint(variant)
    ref = reference(variant)
    for p, seq in zip(PROMPTS, ref):
        assert seq == hf_greedy(model, p, MAX_NEW)
    assert len({tok for seq in ref for tok in seq}) > 10, "a degenerate model would not test much"


def test_dflash_equals_autoregressive_for_every_acceptance_length():
    dflash_at_every_accepted_length(target("ple"), PROMPTS, MAX_NEW, reference("ple"), BS)


# ---------------------------------------------------------------------------- the reference's drafter
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gemma4_dflash_reference.json")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dflash_jax.tools import gemma4_dflash_reference as ref

    target_dir, drafter_dir = ref.write_pair(str(tmp_path_factory.mktemp("gemma4-dflash")))
    t = dj.load_target(target_dir)
    return ref, t, dj.load_drafter(drafter_dir, t)


def test_a_scaled_and_capped_drafter_drafts_what_the_reference_drafts(pair):
    """The three drafter fields read from config.json as the reference reads them, and per
    iteration the drafts, each row's five best logits and the acceptance length equal the
    reference's (``dflash_generate`` with transformers' Gemma 4); the output equals it too."""
    from dflash_jax.methods.dflash.proposer import DFlashProposer
    from support.drafter_reference import recording

    ref, t, drafter = pair
    with open(FIXTURE) as fh:
        fixture = json.load(fh)
    assert fixture["reference"] == "dflash==0.1.0" and fixture["seed"] == ref.SEED
    assert fixture["drafter"] == json.loads(json.dumps(ref.DRAFTER.to_hf_dict()))
    assert fixture["target"] == json.loads(json.dumps(ref.TARGET.to_hf_dict()))
    d = drafter.config
    assert (d.input_embedding_scale, d.output_multiplier, d.final_logit_softcapping) == (4.0, 0.75, 2.5)
    seen = []

    class Recording(recording(DFlashProposer)):
        def _draft(self, spec, tparams, params, state, committed):
            out = super()._draft(spec, tparams, params, state, committed)
            jax.debug.callback(lambda x: seen.append(np.asarray(x)[0]), out[0], ordered=True)
            return out

    checked = 0
    for run in fixture["runs"]:
        seen.clear()
        recorder = Recording(d)
        res = dj.generate(t, [run["prompt"]], fixture["max_new_tokens"], drafter=drafter, proposer=recorder,
                          stop_token_ids=())
        assert res.sequences[0] == run["output"]
        assert len(recorder.records) == len(run["iterations"])
        for (start, anchor, draft), logits, it, a in zip(recorder.records, seen, run["iterations"],
                                                         res.acceptance_lengths[0]):
            if len(it["draft"]) != d.block_size - 1:  # the reference shortens its last blocks
                continue
            assert draft[0].tolist() == it["draft"] and a == it["acceptance_length"]
            top = np.take_along_axis(logits, np.asarray(it["top_ids"]), -1)
            np.testing.assert_allclose(top, it["top_logits"], atol=1e-4)
            assert np.all(np.sort(logits, -1)[:, -1] <= d.final_logit_softcapping)
            checked += 1
    assert checked >= 50


def test_drafter_scalings_read_both_places_and_refused_where_not_implemented(pair):
    from dflash_jax.methods.dflash.config import DrafterConfig
    from dflash_jax.methods.dspark.config import DSparkConfig

    ref, t, drafter = pair
    d = drafter.config.to_hf_dict()
    assert d["dflash_config"]["final_logit_softcapping"] == 2.5
    top = {**d, "dflash_config": {k: v for k, v in d["dflash_config"].items()
                                  if k not in DrafterConfig.OUTPUT_FIELDS},
           "final_logit_softcapping": 2.5, "output_multiplier": 0.75, "input_embedding_scale": 4.0}
    assert DrafterConfig.from_hf_dict(top) == drafter.config  # the reference's fallback: the top level
    both = {**top, "dflash_config": {**top["dflash_config"], "output_multiplier": 0.5}}
    assert DrafterConfig.from_hf_dict(both).output_multiplier == 0.5  # dflash_config first
    with pytest.raises(ValueError, match=r"output_multiplier=\"x\": must be a number"):
        DrafterConfig.from_hf_dict({**top, "output_multiplier": "x"})
    with pytest.raises(ValueError, match=r"DSparkConfig does not implement input_embedding_scale"):
        DSparkConfig(**{f.name: getattr(drafter.config, f.name) for f in dataclasses.fields(DrafterConfig)})


# ---------------------------------------------------------------------------- checkpoints
def test_save_round_trips_bit_exact_and_transformers_reads_our_config(tmp_path):
    for variant in ("moe", "ple"):
        _, path = checkpoint(variant)
        t = target(variant)
        out = str(tmp_path / variant)
        t.save(out)
        ours, theirs = load_file(os.path.join(out, "model.safetensors")), load_file(os.path.join(path, "model.safetensors"))
        assert sorted(ours) == sorted(theirs)
        for name in theirs:
            np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
        assert dj.load_target(out).config == t.config
        from transformers import Gemma4ForCausalLM

        hf = Gemma4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        ids = np.arange(14)[None] % 96
        np.testing.assert_allclose(torch_forward(hf, ids)[0], torch_forward(checkpoint(variant)[0], ids)[0], atol=1e-5)


def test_the_multimodal_layout_loads_its_text_model_and_shared_kv_tensors_are_ignored(tmp_path, caplog):
    """transformers' ``Gemma4ForConditionalGeneration`` (a vision tower beside the text model)
    written by save_pretrained: the text model loads and its logits equal transformers' on text;
    the towers are ignored by name. K/V projections stored for KV-shared layers (the released
    files carry them) are ignored by name too."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(1)
    text = {**HF_DIMS, **VARIANTS["ple"], "num_hidden_layers": 3, "layer_types": [SL, FL, SL],
            "num_kv_shared_layers": 1, "tie_word_embeddings": True}
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16)
    hf_cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    hf_cfg._attn_implementation = "eager"
    hf_cfg.text_config._attn_implementation = "eager"
    model = Gemma4ForConditionalGeneration(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.15)
    path = str(tmp_path / "mm")
    model.save_pretrained(path)
    with caplog.at_level(logging.WARNING):
        t = dj.load_target(path)
    assert "vision-tower tensors" in caplog.text
    assert t.config.model_type == "gemma4_text" and t.config.num_layers == 3
    ids = np.random.default_rng(0).integers(0, 96, size=(1, 16))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids)).logits.numpy()
    got = targets.target_forward(t.config, t.params, jnp.asarray(ids), jnp.arange(16)[None])[0]
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL, rtol=0)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    extra = {"model.language_model.layers.2.self_attn.k_proj.weight": np.zeros((16, 32), np.float32),
             "model.language_model.layers.2.self_attn.k_norm.weight": np.ones(8, np.float32)}
    save_file({**tensors, **extra}, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = dj.load_target(path)
    assert "ignored the K/V projections stored for the KV-shared layers [2]" in caplog.text
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, again.params)
    with open(os.path.join(path, "config.json")) as fh:
        top = json.load(fh)
    with pytest.raises(ValueError, match=r"\(gemma4\) has no text_config"):
        dj.TargetConfig.from_hf_dict({k: v for k, v in top.items() if k != "text_config"})


@pytest.mark.parametrize("field, value, match", [
    ("hidden_activation", "silu", r"hidden_activation='silu': only 'gelu_pytorch_tanh'"),
    ("use_bidirectional_attention", "all", r"use_bidirectional_attention='all': only causal text"),
    ("attention_bias", True, r"attention_bias=true: attention biases are not implemented"),
    ("rope_parameters", {SL: {"rope_type": "default", "rope_theta": 1e4}, FL: {"rope_type": "yarn", "rope_theta": 1e4}},
     r"rope_parameters\.full_attention\.rope_type='yarn': only 'default', 'proportional'"),
    ("num_kv_shared_layers", 6, r"num_kv_shared_layers=6 must be in 0\.\.5"),
    ("enable_moe_block", True, r"enable_moe_block=true but num_experts=null"),
    ("per_layer_config", {"0": {"head_dim": 16}}, r"per_layer_config\['0'\] overrides a layer that is not a full"),
    ("quantization_config", {"quant_method": "compressed-tensors"}, r"quant_method='compressed-tensors'"),
])
def test_unimplemented_fields_are_refused(field, value, match):
    d = gemma4.GEMMA4.config_to_hf(target("dense").config)
    d[field] = value
    if field == "enable_moe_block":
        d["num_experts"] = None
    with pytest.raises(ValueError, match=match):
        dj.TargetConfig.from_hf_dict(d)
    with open(os.path.join(checkpoint("dense")[1], "config.json")) as fh:  # transformers' own config.json
        assert dj.TargetConfig.from_hf_dict(json.load(fh)) == target("dense").config


def test_released_config_fields_read_as_transformers_reads_them():
    """Gemma 4 31B's fields (no per_layer_config: global_head_dim and, with k_eq_v,
    num_global_key_value_heads; per-layer inputs on by default when the field is absent)."""
    d = {"model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 5376, "intermediate_size": 21504,
         "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
         "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
         "sliding_window": 1024, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0}
    cfg = dj.TargetConfig.from_hf_dict(d)
    assert cfg.layer_types.count(FL) == 10 and cfg.layer_types[-1] == FL
    assert (cfg.full_head_dim, cfg.full_kv_heads, cfg.num_kv_heads) == (512, 4, 16)
    assert cfg.full_rope == gemma4.LayerRope("proportional", 1e6, 0.25, 1.0)
    assert dj.TargetConfig.from_hf_dict({**d, "attention_k_eq_v": False}).full_kv_heads == 16
    no_ple = {k: v for k, v in d.items() if k != "hidden_size_per_layer_input"}
    assert dj.TargetConfig.from_hf_dict(no_ple).hidden_size_per_layer_input == 256
    fam = targets.family_of(cfg)
    assert 30e9 < fam.num_params(cfg) < 32e9  # "31B"


# ---------------------------------------------------------------------------- sampling
DEPTH, BLOCK, ROWS, ALPHA, Q_TEMPERATURE = 5, 4, 8192, 1e-4, 1.3
SAMPLING_PROMPT = [1, 2, 3]
NO_ROLLBACK = "test_gemma4_no_rollback"


@flax.struct.dataclass
class NoRollbackState(g4.Gemma4State):
    """The negative control's bug: after a verified block the state keeps the whole block."""

    def rollback(self, lengths):
        return self.crop(jnp.maximum(self.lengths, jnp.asarray(lengths, jnp.int32)))


class NoRollbackFamily(gemma4.Gemma4Family):
    model_types = (NO_ROLLBACK,)
    name = NO_ROLLBACK

    def init_state(self, cfg, batch, max_len, dtype):
        s = super().init_state(cfg, batch, max_len, dtype)
        return NoRollbackState(sliding=s.sliding, full=s.full)


if NO_ROLLBACK not in targets.supported_model_types():
    targets.register(NoRollbackFamily())  # the negative control's registry line


@pytest.fixture(scope="module")
def sampling_setup():
    from support import exact_sampling

    hf = {**gemma4.GEMMA4.config_to_hf(target("ple").config), "vocab_size": 8, "vocab_size_per_layer_input": 8,
          "max_position_embeddings": 64, "sliding_window": 3}
    cfg = dj.TargetConfig.from_hf_dict(hf)
    good = dj.Target.random(cfg, seed=7, init_scale=0.5, max_len=16)
    bad = dj.Target(dataclasses.replace(cfg, model_type=NO_ROLLBACK), good.params, max_len=16)
    return good, bad, exact_sampling.PrefixLogits.compute(good, SAMPLING_PROMPT, DEPTH)


def sample(t, prefix_logits):
    from support.oracle_proposers import TableProposer

    drafter = dj.Drafter.random(t, num_layers=1, block_size=BLOCK, seed=8)
    proposer = TableProposer(prefix_logits, q_temperature=Q_TEMPERATURE)
    return dj.generate(t, [SAMPLING_PROMPT] * ROWS, DEPTH, drafter=drafter, proposer=proposer,
                       sampled_draft=True, temperature=1.0, seed=3, stop_token_ids=())


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution_and_a_state_that_keeps_the_block_does_not(sampling_setup):
    from support import exact_sampling

    good, bad, prefix_logits = sampling_setup
    joint, _ = prefix_logits.joint(1.0)
    r = sample(good, prefix_logits)
    report = exact_sampling.fit(r.sequences, joint, ALPHA)
    print(f"gemma4 sampling: tau {r.tau:.2f}, histogram {r.acceptance_histogram.tolist()}, {report}")
    assert not report.rejected, report
    first = np.array([lens[0] for lens in r.acceptance_lengths])
    assert all(np.mean(first == a) > 0.05 for a in range(1, BLOCK + 1)), np.bincount(first)
    wrong = exact_sampling.fit(sample(bad, prefix_logits).sequences, joint, ALPHA)
    print(f"gemma4 sampling, no rollback: {wrong}")
    assert wrong.rejected, wrong


def test_the_released_31b_drafter_config_fits_the_31b_target():
    """``z-lab/gemma-4-31B-it-DFlash``'s shapes (its model card and a public conversion: 5 layers of
    its own attention, 64 / 8 heads of 128, MLP 10752, 6 taps, block 16, mask id 4, the soft cap 30
    at the top level, where the reference also reads it) in the released layout, against Gemma 4
    31B's config: read, checked against the target (only D, V, the layer count, the mask row and
    the taps must fit), and written back with the cap in ``dflash_config``."""
    from dflash_jax.methods.dflash.config import DrafterConfig

    d = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 262144, "hidden_size": 5376,
         "intermediate_size": 10752, "num_hidden_layers": 5, "num_attention_heads": 64, "num_key_value_heads": 8,
         "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 262144,
         "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "block_size": 16,
         "num_target_layers": 60, "final_logit_softcapping": 30.0,
         "dflash_config": {"target_layer_ids": [1, 12, 23, 35, 46, 57], "mask_token_id": 4}}
    drafter = DrafterConfig.from_hf_dict(d)
    assert drafter.final_logit_softcapping == 30.0 and drafter.num_taps == 6
    from dflash_jax.tools.roofline_gemma4 import MODELS

    target = dj.TargetConfig.from_hf_dict(MODELS["gemma-4-31b"])
    drafter.check_target(target)
    assert drafter.to_hf_dict()["dflash_config"]["final_logit_softcapping"] == 30.0
    assert DrafterConfig.from_hf_dict(drafter.to_hf_dict()) == drafter
