"""Command line: ``python -m dflash_jax <command> [options]`` (``<command> --help`` for each).

Every command is a module with ``add_arguments(parser)`` and ``run(args)`` (see
``dflash_jax/cli.py``), registered here on one parser as a subcommand. A command's module is
imported only when that command runs (or shows its help).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_jax.cli import PROG, HelpFormatter, parse_command, plain_description, run_cli
from dflash_jax import __version__

# name -> (module, one line of help)
COMMANDS = {
    "bench": ("dflash_jax.bench.harness", "AR vs DFlash on the paper's prompt sets (default: the embedded model)"),
    "generate": ("dflash_jax.decoding.cli",
                 "generate from a target (default: the embedded one), optionally with a drafter"),
    "decode-speed": ("dflash_jax.bench.decode_speed", "autoregressive decode benchmark on a random-weight target"),
    "spec-speed": ("dflash_jax.bench.spec_speed",
                   "DFlash vs autoregressive: ms/iteration, draft/verify times, tau, speedup"),
    "kernel-speed": ("dflash_jax.tools.kernel_speed",
                     "block-attention kernels (Pallas, Triton, XLA, cuDNN): microseconds and GB/s"),
    "roofline": ("dflash_jax.tools.roofline",
                 "bytes/FLOPs roofline of an AR step and a DFlash iteration; predicted speedup on H100/H200/B200"),
    "iteration-profile": ("dflash_jax.bench.iteration_profile",
                          "where a DFlash iteration's time goes (draft parts, verify 1/4/8/16 rows, accept) vs an AR step"),
    "parallel-speed": ("dflash_jax.tools.parallel_speed", "AR step and DFlash iteration time on every (data, model) mesh of 8 devices"),
    "parallel-comm": ("dflash_jax.tools.parallel_comm", "tensor-parallel communication model on paper: collectives, comm share, which mesh"),
    "train-memory": ("dflash_jax.tools.train_memory", "peak memory of a drafter training step, dense vs chunked attention, per mesh"),
    "gpu-compile": ("dflash_jax.tools.gpu_compile",
                    "compile the block-attention kernel for H100/H200/B200 without a GPU: registers, spills, occupancy"),
    "gpu-suite": ("dflash_jax.tools.gpu_suite", "every GPU measurement in one command (--smoke: tiny shapes, any machine)"),
    "train-speed": ("dflash_jax.bench.train_speed", "drafter training throughput benchmark"),
    "train-data": ("dflash_jax.training.cli.train_data",
                   "regenerate responses to prompt files with the target (token shards)"),
    "features": ("dflash_jax.training.cli.features", "write offline target features for a data directory"),
    "train": ("dflash_jax.training.cli.train", "train a DFlash drafter (optax + Orbax, resumable)"),
    "export": ("dflash_jax.training.cli.export", "write a training run's drafter in the released layout"),
    "build-corpus": ("dflash_jax.embedded.cli.build_corpus", "the embedded model's offline corpus and BPE tokenizer"),
    "pretrain": ("dflash_jax.embedded.cli.pretrain", "pretrain the embedded target on that corpus (resumable)"),
    "export-target": ("dflash_jax.embedded.cli.export_target", "write a pretraining run as a Hugging Face directory"),
    "embedded-prompts": ("dflash_jax.embedded.cli.embedded_prompts", "the embedded drafter's training prompts (jsonl)"),
    "build-embedded": ("dflash_jax.embedded.build", "the whole embedded-default recipe (resumable)"),
}


def command_module(name: str):
    """The module of command ``name`` (imported now)."""
    return importlib.import_module(COMMANDS[name][0])


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m dflash_jax``: every command a subcommand. Only ``command``'s
    options are added (its module imported); the others are listed with their help line."""
    p = argparse.ArgumentParser(
        prog=PROG, description="DFlash block-diffusion speculative decoding in JAX.",
        formatter_class=lambda prog: HelpFormatter(prog, max_help_position=28),
        epilog=f"'{PROG} <command> --help' describes a command's options.")
    # main() reads these two itself (--debug anywhere on the line); here for the help, and
    # without defaults, so that a command's parsed options are the command's own
    p.add_argument("--version", action="store_true", default=argparse.SUPPRESS, help="print the version and exit")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of an error (also DFLASH_DEBUG=1; anywhere on the line)")
    sub = p.add_subparsers(title="commands", metavar="<command>")
    for name, (module_name, help_) in COMMANDS.items():
        kwargs = {"help": help_, "prog": f"{PROG} {name}", "formatter_class": HelpFormatter}
        if name != command:
            sub.add_parser(name, **kwargs)
            continue
        module = command_module(name)
        module.add_arguments(sub.add_parser(name, description=plain_description(module.__doc__), **kwargs))
    return p


def usage() -> str:
    """The top-level help: the commands with their help lines."""
    return parser().format_help().rstrip("\n")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = [a for a in argv if a != "--debug"]
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return
    if args[0] == "--version":

        print(f"dflash-jax {__version__}")
        return
    name = args[0]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; the commands are {', '.join(COMMANDS)} "
              f"({PROG} --help describes them)", file=sys.stderr)
        sys.exit(2)
    run_cli(lambda rest: command_module(name).run(parse_command(name, None, rest, parser(name))),
            args[1:], debug="--debug" in argv)


if __name__ == "__main__":
    main()
