"""Shared building blocks: RMSNorm, rotary embeddings, SwiGLU MLP, dense attention."""

from dflash_jax.nn.layers import MLP, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq
from dflash_jax.nn.attention import block_sparse_attention, dot_product_attention, segmented_attention

__all__ = ["MLP", "RMSNorm", "apply_rope", "rope_cos_sin", "rope_inv_freq", "dot_product_attention", "segmented_attention",
           "block_sparse_attention"]
