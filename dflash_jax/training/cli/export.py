"""Write a training run's latest drafter in its drafting method's released layout, with what
else the method keeps (a draft vocabulary); ``load_drafter`` reads it back."""

from __future__ import annotations

import sys

from dflash_jax.cli import add_deprecated_alias, command_main, run_cli
from dflash_jax.training.trainer import export_run


def add_arguments(p) -> None:
    p.add_argument("--run", required=True, help="training run directory")
    p.add_argument("--out", required=True, help="drafter directory to write")
    p.add_argument("--out-dtype", choices=["float32", "bfloat16"],
                   help="dtype the drafter's weights are written in (default: float32, the master weights)")
    add_deprecated_alias(p, "--dtype", "--out-dtype")  # --dtype is the compute dtype elsewhere


def run(args) -> None:
    import jax.numpy as jnp


    export_run(args.run, args.out, jnp.dtype(args.out_dtype) if args.out_dtype else None)
    print(f"wrote {args.out}")


def main(argv=None):
    return command_main("export", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
