"""Shared fixtures: tiny Hugging Face checkpoints made by transformers with random weights."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
             max_position_embeddings=256, initializer_range=0.08)


def make_hf_model(kind: str, **overrides):
    """A transformers model with random weights (fp32, eager attention)."""
    import torch  # imported here: the torch-free tests run without it (.ci/newest-jax)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(overrides.pop("seed", 0))
    kw = {**SMALL, **overrides}
    if kind == "qwen3":
        cfg, cls = Qwen3Config(**kw), Qwen3ForCausalLM
    elif kind == "llama":
        kw.setdefault("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                                       "rope_theta": 500000.0})
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    # norms are initialised to ones by transformers; randomise them so norm weights are tested
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


# (name, kind, overrides): the parity grid of the foundation issue
HF_VARIANTS = {
    "qwen3": ("qwen3", {}),
    "qwen3-tied-bias": ("qwen3", {"tie_word_embeddings": True, "attention_bias": True}),
    "llama3-untied": ("llama", {"tie_word_embeddings": False}),
    "llama3-tied": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
}


@pytest.fixture(scope="session", params=sorted(HF_VARIANTS))
def hf_checkpoint(request, tmp_path_factory):
    """(name, torch model, checkpoint directory) for each variant of the parity grid."""
    kind, overrides = HF_VARIANTS[request.param]
    model = make_hf_model(kind, **overrides)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, str(path)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jit caches after each test module. A full run compiles hundreds of programs (the
    Pallas interpreter's are large); keeping them all made XLA's CPU compiler crash late in the
    suite (segfault while compiling, never in a module run alone)."""
    yield
    import jax

    jax.clear_caches()
