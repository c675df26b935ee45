"""Decoding: one engine (``engine``) for autoregressive and speculative decoding, the same
on-device loop with block size 1 and no drafter for the former; the library's generation around
the engine (``prepare`` and ``generation``: argument checks, shape buckets, results and their
statistics); the adaptive verify's measured cost tables (``costs``); and the ``generate``
command (``cli``). The verify policies, the acceptance rules and the sampling filters are in
``dflash_jax.verification``. The library entry points are ``dflash_jax.generate`` and
``dflash_jax.generate_stream`` (speculative with ``drafter=``)."""
