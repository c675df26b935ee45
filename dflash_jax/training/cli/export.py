"""Write a training run's latest drafter in its drafting method's released layout, with what
else the method keeps (a draft vocabulary); ``load_drafter`` reads it back. It ends with what it
wrote (the directory, its files, the method and architecture) and the bench command that tries
the drafter."""

from __future__ import annotations

import json
import os
import shlex
import sys

from dflash_jax.cli import add_deprecated_alias, command_main, run_cli
from dflash_jax.hub import checkpoint_name
from dflash_jax.training.trainer import export_run


def add_arguments(p) -> None:
    p.add_argument("--run", required=True, help="training run directory")
    p.add_argument("--out", required=True, help="drafter directory to write")
    p.add_argument("--out-dtype", choices=["float32", "bfloat16"],
                   help="dtype the drafter's weights are written in (default: float32, the master weights)")
    add_deprecated_alias(p, "--dtype", "--out-dtype")  # --dtype is the compute dtype elsewhere


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def closing_lines(args, exported: dict) -> list[str]:
    """What ``export`` prints when it has written ``args.out``: the directory, its files, the
    drafting method and architecture (from the written config.json), and the bench command
    (the run's target as ``bench --target`` takes it: ``embedded``, a hub id, or its path)."""
    out = args.out.rstrip("/\\") or args.out
    files = sorted(os.path.relpath(os.path.join(d, f), args.out) for d, _, fs in os.walk(args.out) for f in fs)
    with open(os.path.join(args.out, "config.json")) as f:
        config = json.load(f)
    shape = [f"{config['num_hidden_layers']} layer{'s' if config['num_hidden_layers'] != 1 else ''}"
             if "num_hidden_layers" in config else None,
             f"block size {config['block_size']}" if "block_size" in config else None,
             f"weights in {args.out_dtype or 'float32'}"]
    architecture = ", ".join(config.get("architectures") or ["(none named)"])
    target = checkpoint_name(exported["target"]) if exported.get("target") else "TARGET"
    return [f"wrote {out}: the {exported['label']} drafter of run {args.run} at step {exported['step']} "
            f"(architecture {architecture}: {', '.join(x for x in shape if x)})",
            "files: " + ", ".join(f"{f} ({_size(os.path.getsize(os.path.join(args.out, f)))})" for f in files),
            "next: benchmark it against the target alone:",
            "  " + shlex.join(["python", "-m", "dflash_jax", "bench", "--target", target, "--drafter", out]
                              + (["--quantize", exported["target_quantization"]]
                                 if exported.get("target_quantization") else []))]


def run(args) -> dict:
    import jax
    import jax.numpy as jnp

    exported = export_run(args.run, args.out, jnp.dtype(args.out_dtype) if args.out_dtype else None)
    if jax.process_index() == 0:
        print("\n".join(closing_lines(args, exported)), flush=True)
    return exported


def main(argv=None):
    return command_main("export", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
