"""Pallas kernels (Triton lowering on GPU) with plain ``jnp`` references of the same signature.

The models select an implementation with ``attention_impl="xla" | "pallas"``; the dense XLA
reference today is ``dflash_jax.nn.attention.dot_product_attention``.
"""
