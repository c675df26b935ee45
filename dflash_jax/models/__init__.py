"""The handles of loaded models (``handles``: ``Target``, the loaders ``load_target`` /
``load_drafter`` / ``load_embedded`` and ``save_drafter``). The target architectures are
families in ``dflash_jax.targets``; the drafters are in their drafting methods' packages
(``dflash_jax.methods``); the decode states are in ``nn.cache``."""
