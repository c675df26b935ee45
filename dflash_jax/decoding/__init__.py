"""Decoding engines (autoregressive; speculative joins through ``generate(drafter=...)``)."""

from dflash_jax.decoding.sampling import SamplingParams, process_logits, sample_tokens

__all__ = ["SamplingParams", "process_logits", "sample_tokens"]
