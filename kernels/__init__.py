"""Pallas kernels (Triton lowering on GPU) with plain ``jnp`` references of the same signature.

``block_attention`` / ``block_attention_reference``: a block of queries against a KV cache
with per-row lengths, causal (verify/decode) or non-causal with the block's own rows (drafter).
The models select an implementation with ``attention_impl="xla" | "pallas" | "triton"``.

``kernels.triton_block_attention.block_attention_triton``: the same block attention written in
the Triton language and called through ``jax_triton.triton_call`` (imported from its module, as
it needs ``triton``).

``kernels.gdn_chunk.gdn_chunked``: the hybrid targets' chunked Gated DeltaNet form, its
per-chunk triangular solve and its chunk-by-chunk state walk as Pallas kernels; the reference
is ``dflash_jax.nn.gated_delta.chunked``. Hybrid configs select it with ``gdn_impl="pallas"``.
"""

from .block_attention import block_attention, block_attention_reference

__all__ = ["block_attention", "block_attention_reference"]
