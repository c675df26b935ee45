"""YaRN rotary embeddings (``RopeConfig`` rope type "yarn", ``nn.layers.rope_cos_sin``) against
transformers' own: ``ROPE_INIT_FUNCTIONS["yarn"]`` (inverse frequencies and attention scaling)
and the cos / sin its gpt-oss rotary module returns; the config.json round trip in both
spellings, and the refusals."""

import copy

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

from dflash_jax.config import RopeConfig, decoder_fields_to_hf, rope_from_hf
from dflash_jax.nn.layers import rope_cos_sin, rope_inv_freq

pytestmark = pytest.mark.torch

HEAD_DIM = 64
CASES = [
    # gpt-oss-20b / 120b's released RoPE
    dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
         original_max_position_embeddings=4096, rope_theta=150000.0),
    # transformers' defaults: truncate true, beta 32 / 1, the scaling from factor alone
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=2048, rope_theta=10000.0),
    # DeepSeek-style mscale / mscale_all_dim, and an explicit attention_factor
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=1024, rope_theta=1e6,
         mscale=1.0, mscale_all_dim=0.5, beta_fast=16.0, truncate=True),
    dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=512, rope_theta=5e5,
         attention_factor=0.9, beta_slow=2.0, truncate=False),
]


def hf_config(params: dict) -> GptOssConfig:
    return GptOssConfig(head_dim=HEAD_DIM, num_attention_heads=8, hidden_size=512,
                        max_position_embeddings=131072, rope_parameters=copy.deepcopy(params))


@pytest.mark.parametrize("params", CASES, ids=["gpt-oss", "defaults", "mscale", "attention_factor"])
def test_yarn_frequencies_scaling_and_cos_sin_match_transformers(params):
    cfg = hf_config(params)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    rope = rope_from_hf(cfg.to_dict())
    assert rope.rope_type == "yarn"
    # torch's and numpy's float32 pow differ in the last bit for a few frequencies
    np.testing.assert_allclose(rope_inv_freq(HEAD_DIM, rope), inv_freq.numpy(), rtol=2e-7, atol=0)
    assert rope.attention_scaling == pytest.approx(scaling, rel=1e-12)
    positions = np.array([[0, 1, 7, 100, 4095, 4096, 60000], [3, 2, 1, 0, 9, 131071, 5]])
    with torch.no_grad():
        cos_ref, sin_ref = GptOssRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32),
                                                      torch.from_numpy(positions))
    cos, sin = rope_cos_sin(jnp.asarray(positions, jnp.int32), HEAD_DIM, rope)
    half = HEAD_DIM // 2  # transformers' gpt-oss keeps one half; ours repeats it (rotate-half)
    np.testing.assert_array_equal(np.asarray(cos[..., :half]), np.asarray(cos[..., half:]))
    # angles up to 1.3e5 rad: both sides compute the angle in float32, so they may part by an ulp
    # of the angle (and cos / sin of a large float32 argument by about as much: XLA:CPU's range
    # reduction differs between AVX2 and AVX-512), scaled by the attention scaling
    angle = positions[..., None].astype(np.float64) * inv_freq.numpy().astype(np.float64)
    bound = 2 * np.spacing(np.abs(angle).astype(np.float32)) * max(scaling, 1.0) + 1e-6
    assert np.all(np.abs(np.asarray(cos[..., :half]) - cos_ref.numpy()) <= bound)
    assert np.all(np.abs(np.asarray(sin[..., :half]) - sin_ref.numpy()) <= bound)
    small = positions < 200  # where the angle (float32 ulps) is small enough for a tight bound
    np.testing.assert_allclose(np.asarray(cos[..., :half])[small], cos_ref.numpy()[small], atol=5e-5)
    if scaling != 1.0:  # the scaling is applied (a cos/sin without it would fail the bounds above)
        assert np.abs(np.asarray(cos[0, 0])).max() == pytest.approx(scaling, rel=1e-6)


def test_other_rope_types_are_unchanged_by_the_scaling():
    rope = RopeConfig(theta=1e6)
    assert rope.attention_scaling == 1.0
    cos, sin = rope_cos_sin(jnp.arange(5)[None], 8, rope)
    assert float(cos[0, 0, 0]) == 1.0 and float(sin[0, 0, 0]) == 0.0


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling", "both"])
def test_yarn_config_round_trip_in_both_spellings(spelling):
    fields = {k: v for k, v in CASES[0].items() if k != "rope_theta"}
    d = {"rope_theta": 150000.0, "max_position_embeddings": 131072}
    if spelling in ("rope_parameters", "both"):
        d["rope_parameters"] = {**fields, "rope_theta": 150000.0}
    if spelling in ("rope_scaling", "both"):
        d["rope_scaling"] = dict(fields)
    rope = rope_from_hf(d)
    assert rope == RopeConfig(theta=150000.0, rope_type="yarn", factor=32.0,
                              original_max_position_embeddings=4096, beta_fast=32.0,
                              beta_slow=1.0, truncate=False)
    assert rope.to_hf() == {"rope_theta": 150000.0, **fields}
    assert rope.to_hf_scaling() == fields

    class Cfg:  # decoder_fields_to_hf writes both spellings; reading them gives the same rope
        vocab_size = hidden_size = intermediate_size = num_layers = num_heads = 8
        num_kv_heads, head_dim, rms_norm_eps, max_position_embeddings = 8, 1, 1e-6, 131072

    Cfg.rope = rope
    written = decoder_fields_to_hf(Cfg)
    assert rope_from_hf(written) == rope
    assert hf_config(written["rope_parameters"]).rope_parameters["truncate"] is False


def test_yarn_defaults_follow_transformers():
    rope = rope_from_hf({"rope_parameters": {"rope_type": "yarn", "factor": 4.0},
                         "max_position_embeddings": 8192})
    assert (rope.beta_fast, rope.beta_slow, rope.truncate) == (32.0, 1.0, True)
    assert rope.original_max_position_embeddings == 8192  # transformers' setdefault
    rope = rope_from_hf({"rope_parameters": {"rope_type": "yarn", "factor": None,
                                             "original_max_position_embeddings": 2048},
                         "max_position_embeddings": 8192})
    assert rope.factor == 4.0  # max_position_embeddings / original, as transformers


@pytest.mark.parametrize("d, match", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                          "low_freq_factor": 1.0}}, "yarn rope_parameters has fields .*low_freq_factor"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
      "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}},
     "contradictory yarn factor"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                          "truncate": "no"}}, "truncate must be true or false"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
      "original_max_position_embeddings": 128}, "contradictory original_max_position_embeddings"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, "unsupported rope scaling type 'longrope'"),
])
def test_bad_yarn_configs_are_refused(d, match):
    with pytest.raises(ValueError, match=match):
        rope_from_hf(d)
