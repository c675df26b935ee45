"""Logical axes of the shared building blocks' arrays: the decoder-layer parameters (target
families and the drafter name them alike) and the KV cache. ``parallel.rules`` maps logical
axes to mesh axes; a target family hands its table to it (``TargetFamily.param_axes``)."""

PARAM_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    ("embed_tokens", "embedding"): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("q_proj", "bias"): ("heads",),
    ("k_proj", "bias"): ("kv_heads",),
    ("v_proj", "bias"): ("kv_heads",),
    ("o_proj", "bias"): ("embed",),
    ("q_norm", "weight"): ("head_dim",),
    ("k_norm", "weight"): ("head_dim",),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("input_layernorm", "weight"): ("embed",),
    ("post_attention_layernorm", "weight"): ("embed",),
    ("norm", "weight"): ("embed",),
    ("hidden_norm", "weight"): ("embed",),
    ("fc", "kernel"): ("taps", "embed"),
}
"""(module, parameter) -> logical axes of its dims; parameters under ``layers/`` carry the
stacked ``layers`` axis first."""

CACHE_AXES = ("layers", "batch", "slots", "kv_heads", "head_dim")
"""KVCache k / v; ``lengths`` is ("batch",)."""
