"""Decoding: one engine (``engine``) for autoregressive and DFlash speculative decoding, the
same on-device loop with block size 1 and no drafter for the former; the target's sampling
(``sampling``); the library's generation around the engine (``generation``: argument checks,
shape buckets, results and their statistics); and the ``generate`` command (``cli``). The
library entry points are ``dflash_jax.generate`` and ``dflash_jax.generate_stream``
(speculative with ``drafter=``)."""

from dflash_jax.decoding.sampling import SamplingParams, process_logits, sample_tokens

__all__ = ["SamplingParams", "process_logits", "sample_tokens"]
