"""Hugging Face checkpoint loading/saving and config parsing."""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import dflash_jax as dj
from dflash_jax.checkpoints import INDEX_FILE, SINGLE_FILE, read_tensors
from dflash_jax.config import TargetConfig

from support.tiny_models import make_hf_model

pytestmark = pytest.mark.torch


def all_tensors(path):
    return read_tensors(path)


def assert_same_tensors(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def test_round_trip_bit_exact(hf_checkpoint, tmp_path):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    target.save(tmp_path / "a")
    again = dj.load_target(tmp_path / "a")
    assert again.config == target.config
    assert_same_tensors(all_tensors(path), all_tensors(tmp_path / "a"))
    # and the saved directory loads in transformers as the same model
    from transformers import AutoModelForCausalLM
    import torch

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", attn_implementation="eager")
    ids = torch.arange(8)[None]
    with torch.no_grad():
        np.testing.assert_array_equal(model(ids).logits.numpy(), reloaded(ids).logits.numpy())


def test_round_trip_bf16_and_sharded(tmp_path):
    model = make_hf_model("qwen3")
    model.save_pretrained(tmp_path / "src")
    target = dj.load_target(tmp_path / "src", dtype=jnp.bfloat16)
    assert target.dtype == jnp.bfloat16
    target.save(tmp_path / "sharded", max_shard_bytes=40_000)
    assert os.path.exists(tmp_path / "sharded" / INDEX_FILE)
    assert not os.path.exists(tmp_path / "sharded" / SINGLE_FILE)
    shards = [f for f in os.listdir(tmp_path / "sharded") if f.startswith("model-")]
    assert len(shards) > 1
    again = dj.load_target(tmp_path / "sharded")
    assert again.dtype == jnp.bfloat16
    flat_a = all_tensors(tmp_path / "sharded")
    target.save(tmp_path / "single")
    assert_same_tensors(flat_a, all_tensors(tmp_path / "single"))
    assert next(iter(flat_a.values())).dtype == ml_dtypes.bfloat16
    with open(tmp_path / "single" / "config.json") as f:
        written = json.load(f)
    assert written["dtype"] == written["torch_dtype"] == "bfloat16"  # transformers 5 and 4.x names


def test_generate_in_bf16_uses_bf16_cache(tmp_path):
    model = make_hf_model("llama")
    model.save_pretrained(tmp_path)
    target = dj.load_target(tmp_path, dtype=jnp.bfloat16)
    from dflash_jax.decoding import engine
    from dflash_jax.verification.sampling import SamplingParams

    spec = engine.EngineSpec(target.config, None, 1, SamplingParams(), out_len=16)
    one = jnp.array([4])
    cache = engine.prefill(target.params, None, jnp.ones((1, 4), jnp.int32), one, one,
                           jnp.full((1, 1), -1), jax.random.key(0), spec=spec, cache_len=16).tcache
    assert cache.k.dtype == jnp.bfloat16
    assert dj.generate(target, [[1, 2, 3]], 4).num_generated == [4]


def _broken_copy(src, dst, edit):
    os.makedirs(dst)
    tensors = load_file(os.path.join(src, SINGLE_FILE))
    edit(tensors)
    save_file(tensors, os.path.join(dst, SINGLE_FILE))
    with open(os.path.join(src, "config.json")) as f:
        cfg = f.read()
    with open(os.path.join(dst, "config.json"), "w") as f:
        f.write(cfg)


def test_missing_unexpected_misshaped_listed_together(tmp_path):
    model = make_hf_model("qwen3")
    model.save_pretrained(tmp_path / "ok")

    def edit(t):
        del t["model.layers.1.self_attn.k_norm.weight"]
        del t["model.norm.weight"]
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:, :10].copy()
        t["model.extra.weight"] = np.zeros(3, np.float32)

    _broken_copy(tmp_path / "ok", tmp_path / "bad", edit)
    with pytest.raises(dj.CheckpointError) as e:
        dj.load_target(tmp_path / "bad")
    msg = str(e.value)
    assert "missing tensors (2)" in msg
    assert "model.layers.1.self_attn.k_norm.weight" in msg and "model.norm.weight" in msg
    assert "unexpected tensors (1)" in msg and "model.extra.weight" in msg
    assert "model.layers.0.mlp.up_proj.weight: expected [96, 64], found [96, 10]" in msg


def test_missing_files_and_dirs(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        dj.load_target(tmp_path)
    model = make_hf_model("qwen3")
    model.config.to_json_file(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        dj.load_target(tmp_path)


# ---------------------------------------------------------------------------- configs
HUB_QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 151936,
}
HUB_LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}


def test_hub_style_configs():
    q = TargetConfig.from_hf_dict(HUB_QWEN3_8B)
    assert (q.num_layers, q.hidden_size, q.head_dim, q.num_kv_heads) == (36, 4096, 128, 8)
    assert q.rope.theta == 1e6 and q.rope.rope_type == "default" and q.qk_norm
    assert q.eos_token_id == (151645,)
    ll = TargetConfig.from_hf_dict(HUB_LLAMA31_8B)
    assert ll.head_dim == 128  # no head_dim in the file: hidden / heads
    assert ll.rope.rope_type == "llama3" and ll.rope.theta == 500000.0 and ll.rope.factor == 8.0
    assert ll.rope.original_max_position_embeddings == 8192 and not ll.qk_norm
    assert ll.eos_token_id == (128001, 128008, 128009)
    # Llama 3.0 / 3.2 style: plain rope_theta, tied embeddings (3.2 1B)
    l32 = TargetConfig.from_hf_dict({**HUB_LLAMA31_8B, "tie_word_embeddings": True, "rope_scaling": None})
    assert l32.tie_word_embeddings and l32.rope.rope_type == "default"


def test_written_layout_round_trip():
    """to_hf_dict writes RoPE in both generations' layouts (top-level rope_theta + rope_scaling for
    transformers 4.x, rope_parameters for 5.x) with equal values; reading either layout alone, or
    both, gives the same config."""
    for d in (HUB_QWEN3_8B, HUB_LLAMA31_8B):
        cfg = TargetConfig.from_hf_dict(d)
        written = cfg.to_hf_dict()
        assert written["rope_theta"] == written["rope_parameters"]["rope_theta"] == cfg.rope.theta
        assert TargetConfig.from_hf_dict(written) == cfg
        only5 = {k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling")}
        only4 = {k: v for k, v in written.items() if k != "rope_parameters"}
        assert TargetConfig.from_hf_dict(only5) == TargetConfig.from_hf_dict(only4) == cfg


def test_num_params_matches_qwen3_8b():
    assert abs(TargetConfig.from_hf_dict(HUB_QWEN3_8B).num_params() / 1e9 - 8.19) < 0.01


@pytest.mark.parametrize("edit, match", [
    ({"model_type": "mistral"}, "unknown model_type 'mistral'.*qwen3, llama"),
    ({"num_key_value_heads": 5}, "multiple of num_key_value_heads"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "unsupported rope scaling type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "missing field"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_bad_configs(edit, match):
    d = {**HUB_LLAMA31_8B, **edit}
    with pytest.raises(ValueError, match=match):
        TargetConfig.from_hf_dict(d)


def test_missing_required_config_field():
    d = dict(HUB_QWEN3_8B)
    del d["hidden_size"]
    with pytest.raises(ValueError, match="missing required fields: hidden_size"):
        TargetConfig.from_hf_dict(d)
