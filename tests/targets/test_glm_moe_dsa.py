"""The ``glm_moe_dsa`` target family (GLM-5: DeepSeek-V3's latent attention and MoE with a
sparse-attention indexer) against transformers' ``GlmMoeDsaForCausalLM`` (float32, a tiny random
checkpoint written by ``save_pretrained``, the indexer's weights large so that its choice
matters where it has one):

* while no query sees more than ``index_topk`` keys, dense attention is the model: logits and
  taps equal transformers' (both MLA forms, through the latent state in blocks); greedy
  ``generate`` equals transformers' greedy generate; greedy DFlash equals AR at every accepted
  length;
* past ``index_topk`` the indexer drops keys (transformers' logits move away from the dense
  ones), and the target holds at most ``index_topk`` positions (its ``max_len``): a longer
  generation or pass is refused with one line before anything runs;
* the checkpoint (indexer tensors on the full layers only) round-trips bit for bit; bad
  per-layer types are one-line errors.
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
from safetensors.numpy import load_file

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.targets.mla import glm_moe_dsa

from support.model_parity import torch_forward
from support.moe_oracles import separated_router
from support.oracle_proposers import dflash_at_every_accepted_length

pytestmark = [pytest.mark.xdist_group("glm_moe_dsa"), pytest.mark.torch]

TOL = 1e-4
TOPK = 48  # >= every sequence below (prompt + 24 new + a block of 5)
HF = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
          num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
          qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, n_group=4, topk_group=2,
          num_experts_per_tok=3, first_k_dense_replace=1, index_head_dim=16, index_n_heads=2,
          index_topk_freq=2, max_position_embeddings=256, rms_norm_eps=1e-2)


def make_hf(index_topk: int, seed: int = 0):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    torch.manual_seed(seed)
    cfg = GlmMoeDsaConfig(**HF, index_topk=index_topk)
    cfg._attn_implementation = "eager"
    model = GlmMoeDsaForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "indexer" not in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, 8, 32, 2.0)))
            elif "experts" in name:
                p.normal_(0.0, 0.15)
            elif "indexer" in name:
                p.normal_(0.0, 0.5)
    return model


@functools.lru_cache(maxsize=None)
def checkpoint():
    import tempfile

    model = make_hf(TOPK)
    path = tempfile.mkdtemp(prefix="glm-moe-dsa-")
    model.save_pretrained(path)
    return model, path


@functools.lru_cache(maxsize=None)
def target():
    return dj.load_target(checkpoint()[1])


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    if checkpoint.cache_info().currsize:
        shutil.rmtree(checkpoint()[1], ignore_errors=True)
    checkpoint.cache_clear()
    target.cache_clear()


def test_the_config_follows_transformers():
    model, _ = checkpoint()
    cfg = target().config
    assert cfg.indexer_types == tuple(model.config.indexer_types) == ("full", "full", "shared")
    assert cfg.indexer_layers == (0, 1) and cfg.moe_layers == (1, 2) and cfg.rope_interleave
    assert targets.family_of(cfg).num_params(cfg) == sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))


def test_logits_and_taps_equal_transformers_within_index_topk():
    model, _ = checkpoint()
    t = target()
    cfg, D = t.config, t.config.hidden_size
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 30))
    ref_logits, ref_hidden = torch_forward(model, ids)
    forward = jax.jit(functools.partial(targets.target_forward, cfg), static_argnames=("tap_layer_ids", "mla_form"))
    pos = jnp.broadcast_to(jnp.arange(30), (2, 30))
    for form in ("absorbed", "expanded"):
        logits, taps, _ = forward(t.params, jnp.asarray(ids), pos, tap_layer_ids=(0, 2), mla_form=form)
        np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0, err_msg=form)
        np.testing.assert_allclose(np.asarray(taps[..., :D]), ref_hidden[1], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(taps[..., D:]), ref_hidden[3], atol=TOL, rtol=0)
    state = targets.family_of(cfg).init_state(cfg, 2, TOPK, jnp.float32)
    for lo, hi in [(0, 13), (13, 14), (14, 30)]:
        logits, _, state = forward(t.params, jnp.asarray(ids[:, lo:hi]),
                                   jnp.broadcast_to(jnp.arange(lo, hi), (2, hi - lo)), state)
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0)


def test_past_index_topk_the_indexer_drops_keys_and_the_family_refuses_that_length(tmp_path):
    """With index_topk 8 transformers' logits on 30 tokens leave the dense ones (the indexer
    chooses), while the first 8 positions, which see at most 8 keys, stay equal; the family
    refuses a pass or a decode state longer than index_topk, naming the field."""
    sparse, dense = make_hf(8), checkpoint()[0]
    ids = np.random.default_rng(0).integers(0, 96, size=(2, 30))
    a, b = torch_forward(sparse, ids)[0], torch_forward(dense, ids)[0]
    np.testing.assert_allclose(a[:, :8], b[:, :8], atol=1e-5)
    assert np.abs(a[:, 8:] - b[:, 8:]).max() > 1e-2
    sparse.save_pretrained(str(tmp_path / "sparse"))
    t = dj.load_target(str(tmp_path / "sparse"))
    assert t.config.index_topk == 8
    with pytest.raises(ValueError, match=r"index_topk=8 positions: a pass over 30 exceeds it"):
        targets.target_forward(t.config, t.params, jnp.asarray(ids), jnp.broadcast_to(jnp.arange(30), (2, 30)))
    assert t.max_len == 8  # prompt plus new tokens: at most index_topk
    with pytest.raises(ValueError, match=r"11 > the cache length max_len=8"):
        dj.generate(t, [[1, 2, 3]], 8)
    with pytest.raises(ValueError, match=r"max_len=9 is above the glm_moe_dsa target's exact length 8"):
        dj.load_target(str(tmp_path / "sparse"), max_len=9)
    np.testing.assert_allclose(  # within index_topk: exact
        np.asarray(targets.target_forward(t.config, t.params, jnp.asarray(ids[:, :8]),
                                          jnp.broadcast_to(jnp.arange(8), (2, 8)))[0]), a[:, :8], atol=TOL)


PROMPTS = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 1, 44, 60, 7], [90]]
MAX_NEW, BS = 24, 5


@functools.lru_cache(maxsize=None)
def reference():
    return dj.generate(target(), PROMPTS, MAX_NEW).sequences


@pytest.mark.slow
def test_greedy_generate_equals_transformers():
    model, _ = checkpoint()
    for p, seq in zip(PROMPTS, reference()):
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
        assert seq == out[0, len(p):].tolist()


def test_dflash_equals_autoregressive_for_every_acceptance_length():
    dflash_at_every_accepted_length(target(), PROMPTS, MAX_NEW, reference(), BS)


def test_save_round_trips_bit_exact_and_bad_types_are_named(tmp_path):
    _, path = checkpoint()
    t = target()
    t.save(str(tmp_path / "saved"))
    ours = load_file(str(tmp_path / "saved" / "model.safetensors"))
    theirs = load_file(os.path.join(path, "model.safetensors"))
    assert sorted(ours) == sorted(theirs) and any(".indexer." in n for n in theirs)
    assert not any(n.startswith("model.layers.2.self_attn.indexer") for n in theirs)  # a shared layer
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name])
    assert dj.load_target(str(tmp_path / "saved")).config == t.config
    with open(os.path.join(path, "config.json")) as fh:
        d = json.load(fh)
    for field, value, match in (("indexer_types", ["shared", "full", "full"], r"indexer_types\[0\] must be 'full'"),
                                ("indexer_types", ["full", "full"], r"indexer_types must list 3 of full / shared"),
                                ("mlp_layer_types", ["dense", "moe", "sparse"], r"mlp_layer_types must list 3 of dense / sparse"),
                                ("q_lora_rank", None, r"q_lora_rank must be set")):
        with pytest.raises(ValueError, match=match):
            glm_moe_dsa.GLM_MOE_DSA.config_from_hf({**d, field: value})
