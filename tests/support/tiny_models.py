"""Tiny checkpoints for the tests: transformers models with random weights, and a tiny Qwen3-like
chat target saved with the embedded tokenizer."""

from __future__ import annotations

import os


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


# A chat template with Qwen3's thinking switch, written like Qwen3's own generation prompt: with
# ``enable_thinking`` false the assistant header is followed by an empty think block; with it
# true or unset (Qwen3's default: thinking) by nothing.
QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}")
QWEN3_ASSISTANT = "<|im_start|>assistant\n"  # the prompt's end with thinking on
QWEN3_NO_THINK = QWEN3_ASSISTANT + "<think>\n\n</think>\n\n"  # and with thinking off


def save_chat_target(root, chat_template: str, drafter: bool = True):
    """A tiny random Qwen3 target with the embedded model's tokenizer and ``chat_template``,
    saved in ``root/target`` (and a random 1-layer block-4 drafter in ``root/drafter``).
    Returns (target dir, drafter dir or None)."""
    import dflash_jax as dj
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dj.EMBEDDED_TARGET_DIR)
    tok.chat_template = chat_template
    cfg = dj.TargetConfig("qwen3", vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=1024,
                          eos_token_id=(tok.eos_token_id,))
    target = dj.Target.random(cfg, seed=0, init_scale=0.3)
    target.tokenizer = tok
    target.save(os.path.join(root, "target"))
    if not drafter:
        return os.path.join(root, "target"), None
    dj.save_drafter(dj.Drafter.random(target, num_layers=1, block_size=4, seed=1), os.path.join(root, "drafter"))
    return os.path.join(root, "target"), os.path.join(root, "drafter")
