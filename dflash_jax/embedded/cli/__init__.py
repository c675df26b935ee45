"""The commands that build the embedded default, one module each (``add_arguments(parser)``
and ``run(args)``, see ``dflash_jax/cli.py``):

    python -m dflash_jax build-corpus       the corpus and byte-level BPE tokenizer
    python -m dflash_jax pretrain           pretrain the embedded target on it (resumable)
    python -m dflash_jax export-target      a pretraining run as a Hugging Face directory
    python -m dflash_jax embedded-prompts   the embedded drafter's training prompts (jsonl)

(``build-embedded``, ``dflash_jax/embedded/build.py``, runs them all.)
"""

from __future__ import annotations

DATA_DIR_HELP = ("training data: DIR/gsm8k/train.jsonl (GSM8K train, not shipped) and optionally "
                 "DIR/mbpp/sanitized-mbpp.json (else the package's copy); default $DFLASH_DATA_DIR, else "
                 "datasets/ under $DFLASH_JAX_HOME (~/.cache/dflash-jax/datasets)")
"""The help of ``--data-dir`` in the embedded recipe's commands (``build-embedded`` too)."""


def add_data_dir_argument(p) -> None:
    """``--data-dir``: where the training data is read (build-corpus, embedded-prompts); unset,
    :func:`dflash_jax.datasets.default_data_dir` when the command runs."""
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)


def training_prompts(argv=None):
    """``embedded-prompts`` in-process on ``argv`` (no error handling). Imported here: the
    command's module imports this package for :func:`add_data_dir_argument`."""
    from dflash_jax.embedded.cli import embedded_prompts

    return embedded_prompts.main(argv)
