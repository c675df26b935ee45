"""Write a pretraining run's target as a Hugging Face directory."""

from __future__ import annotations

import json
import sys

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.embedded.pretrain import export_target
from dflash_jax.reporting import command_line


def add_arguments(p) -> None:
    p.add_argument("--corpus", required=True, help="directory written by build-corpus")
    p.add_argument("--run", required=True, help="pretraining run directory")
    p.add_argument("--out", required=True, help="Hugging Face directory to write")


def run(args) -> dict:

    facts = export_target(args.run, args.corpus, args.out, command=command_line("dflash_jax", invocation(args)))
    print(json.dumps({k: facts[k] for k in ("parameters", "steps", "tokens_seen", "heldout_loss")}),
          file=sys.stderr)
    return facts


def main(argv=None):
    return command_main("export-target", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
