"""Command line: ``python -m dflash_jax <command> [options]`` (``<command> --help`` for each)."""

from __future__ import annotations

import importlib
import sys

from dflash_jax.cli import PROG, run_cli

# name -> (module, function, one line of help); modules are imported only when their command runs
COMMANDS = {
    "bench": ("dflash_jax.bench.harness", "main",
              "AR vs DFlash on the paper's prompt sets (default: the embedded model)"),
    "generate": ("dflash_jax.decoding.cli", "generate",
                 "generate from a target (default: the embedded one), optionally with a drafter"),
    "decode-speed": ("dflash_jax.bench.decode_speed", "main",
                     "autoregressive decode benchmark on a random-weight target"),
    "spec-speed": ("dflash_jax.bench.spec_speed", "main",
                   "DFlash vs autoregressive: ms/iteration, draft/verify times, tau, speedup"),
    "kernel-speed": ("dflash_jax.bench.kernel_speed", "main",
                     "block-attention kernels (Pallas, Triton, XLA, cuDNN): microseconds and GB/s"),
    "roofline": ("dflash_jax.bench.roofline", "main",
                 "bytes/FLOPs roofline of an AR step and a DFlash iteration; predicted speedup on H100/H200/B200"),
    "gpu-suite": ("dflash_jax.bench.gpu_suite", "main",
                  "every GPU measurement in one command (--smoke: tiny shapes, any machine)"),
    "train-speed": ("dflash_jax.bench.train_speed", "main", "drafter training throughput benchmark"),
    "train-data": ("dflash_jax.training.cli", "train_data",
                   "regenerate responses to prompt files with the target (token shards)"),
    "features": ("dflash_jax.training.cli", "features", "write offline target features for a data directory"),
    "train": ("dflash_jax.training.cli", "train", "train a DFlash drafter (optax + Orbax, resumable)"),
    "export": ("dflash_jax.training.cli", "export", "write a training run's drafter in the released layout"),
    "build-corpus": ("dflash_jax.embedded.cli", "build_corpus", "the embedded model's offline corpus and BPE tokenizer"),
    "pretrain": ("dflash_jax.embedded.cli", "pretrain", "pretrain the embedded target on that corpus (resumable)"),
    "export-target": ("dflash_jax.embedded.cli", "export_target", "write a pretraining run as a Hugging Face directory"),
    "embedded-prompts": ("dflash_jax.embedded.cli", "training_prompts", "the embedded drafter's training prompts (jsonl)"),
    "build-embedded": ("dflash_jax.embedded.build", "main", "the whole embedded-default recipe (resumable)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} [--version] <command> [options] [--debug]", "",
             "DFlash block-diffusion speculative decoding in JAX.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", f"'{PROG} <command> --help' describes a command's options.",
              "--debug (or DFLASH_DEBUG=1) shows the Python traceback of an error."]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = [a for a in argv if a != "--debug"]
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return
    if args[0] == "--version":
        from dflash_jax import __version__

        print(f"dflash-jax {__version__}")
        return
    name = args[0]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; the commands are {', '.join(COMMANDS)} "
              f"({PROG} --help describes them)", file=sys.stderr)
        sys.exit(2)
    module, function, _ = COMMANDS[name]
    command = getattr(importlib.import_module(module), function)
    run_cli(command, argv[argv.index(name) + 1:], debug="--debug" in argv)


if __name__ == "__main__":
    main()
