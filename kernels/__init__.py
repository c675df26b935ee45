"""Pallas kernels (Triton lowering on GPU) with plain ``jnp`` references of the same signature.

``block_attention`` / ``block_attention_reference``: a block of queries against a KV cache
with per-row lengths, causal (verify/decode) or non-causal with the block's own rows (drafter).
The models select an implementation with ``attention_impl="xla" | "pallas"``.
"""

from kernels.block_attention import block_attention, block_attention_reference

__all__ = ["block_attention", "block_attention_reference"]
