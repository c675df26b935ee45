"""The training commands, one module each (``add_arguments(parser)`` and ``run(args)``, see
``dflash_jax/cli.py``):

    python -m dflash_jax train-data   regenerate responses to prompts with the target
    python -m dflash_jax features     offline target features for a data directory
    python -m dflash_jax train        train a DFlash drafter
    python -m dflash_jax export       a run's drafter in the released layout
"""
