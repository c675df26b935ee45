"""Write a training run's latest drafter in the released layout."""

from __future__ import annotations

import sys

from dflash_jax.cli import command_main, run_cli
from dflash_jax.training.trainer import export_run


def add_arguments(p) -> None:
    p.add_argument("--run", required=True, help="training run directory")
    p.add_argument("--out", required=True, help="drafter directory to write")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="cast the weights (default: the float32 master weights)")


def run(args) -> None:
    import jax.numpy as jnp


    export_run(args.run, args.out, jnp.dtype(args.dtype) if args.dtype else None)
    print(f"wrote {args.out}")


def main(argv=None):
    return command_main("export", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
