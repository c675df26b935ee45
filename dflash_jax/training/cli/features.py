"""Write offline target features (the tapped hidden states) for a data directory."""

from __future__ import annotations

import sys

from dflash_jax import quantization
from dflash_jax.cli import command_main, run_cli
from dflash_jax.hub import CHECKPOINT_HELP
from dflash_jax.parallel.cli import add_arguments as add_parallel_arguments, mesh_from_args
from dflash_jax.models.handles import load_target
from dflash_jax.training.features import write_features


def add_arguments(p) -> None:
    p.add_argument("--target", required=True, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--data", required=True, help="data directory written by train-data")
    p.add_argument("--out", required=True, help="features directory to write")
    p.add_argument("--taps", type=int, nargs="+", required=True, help="target layer ids")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass of the target")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="compute dtype of the target (default: the checkpoint's)")
    quantization.add_argument(p)

    add_parallel_arguments(p)


def run(args) -> None:

    mesh = mesh_from_args(args)  # before any JAX computation (multi-host runtime)
    import jax.numpy as jnp


    target = load_target(args.target, dtype=jnp.dtype(args.dtype) if args.dtype else None, mesh=mesh,
                         quantize=args.quantize)
    write_features(target, args.data, args.out, args.taps, args.batch_size)


def main(argv=None):
    return command_main("features", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
