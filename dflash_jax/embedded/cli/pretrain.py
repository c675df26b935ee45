"""Pretrain the embedded target on a build-corpus corpus (resumable). The training settings
are the fields of PretrainConfig (dflash_jax/embedded/pretrain.py), one option each."""

from __future__ import annotations

import sys

from dflash_jax.cli import add_dataclass_arguments, command_main, dataclass_from_args, run_cli
from dflash_jax.embedded.pretrain import MODEL_PRESETS, PretrainConfig, Pretrainer


def add_arguments(p) -> None:

    p.add_argument("--corpus", required=True, help="directory written by build-corpus")
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), default="cpu", help="model size")
    p.add_argument("--init-from", default=None, metavar="TARGET",
                   help="start from this target (a checkpoint directory or 'embedded'; its shapes replace "
                        "--preset's) instead of random weights: a fine-tune; build the corpus with build-corpus "
                        "--tokenizer TARGET")
    p.add_argument("--stop-after", type=int, help="stop after this many more steps (resume later)")
    p.add_argument("--max-minutes", type=float, help="stop (on a checkpoint) after this much time")
    add_dataclass_arguments(p.add_argument_group("training settings (PretrainConfig)"), PretrainConfig)


def run(args):

    pcfg = dataclass_from_args(PretrainConfig, args)
    return Pretrainer(args.corpus, args.run, args.preset, pcfg, init_from=args.init_from).run(args.stop_after, args.max_minutes)


def main(argv=None):
    return command_main("pretrain", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
