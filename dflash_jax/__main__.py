"""Command line: ``dflash-jax <command> [options]`` (the console script) or
``python -m dflash_jax <command> [options]``; ``<command> --help`` describes each.

Every command is a module with ``add_arguments(parser)`` and ``run(args)`` (see
``dflash_jax/cli.py``), registered here on one parser as a subcommand. A command's module is
imported only when that command runs (or shows its help). The top-level help lists the
commands under the headings of :data:`GROUPS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import textwrap

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
    "moe-layer-speed": ("dflash_jax.tools.moe_layer_speed",
                        "one MoE layer (gather / ragged_dot) vs dense layers: decode and verify times"),
    "gdn-kernel-speed": ("dflash_jax.tools.gdn_kernel_speed",
                         "Gated DeltaNet chunked form: the Pallas kernels against the jnp form, ms per layer call"),
    "gdn-rollback": ("dflash_jax.tools.gdn_rollback",
                     "Gated DeltaNet rollback, snapshot vs replay: verify + rollback time and record bytes"),
    "hybrid-speed": ("dflash_jax.tools.hybrid_speed",
                     "tiny hybrid (GDN) target against a dense one of the same size: prefill and decode per token"),
    "load-report": ("dflash_jax.tools.load_report",
                    "load time and peak host memory of tiny and mid-size MoE checkpoints (random weights)"),
    "roofline": ("dflash_jax.tools.roofline",
                 "bytes/FLOPs roofline of an AR step and a DFlash iteration; predicted speedup on H100/H200/B200"),
    "tree-verify-cost": ("dflash_jax.tools.tree_verify_cost",
                         "verify cost of N tree nodes vs N chain rows (tree mask), and of the whole iteration"),
    "tree-bench": ("dflash_jax.tools.tree_bench",
                   "bench the chain and trees of N nodes on the same prompts, repeated: tau and speedup vs N"),
    "iteration-profile": ("dflash_jax.bench.iteration_profile",
                          "where a DFlash iteration's time goes (draft parts, verify 1/4/8/16 rows, accept) vs an AR step"),
    "parallel-speed": ("dflash_jax.tools.parallel_speed", "AR step and DFlash iteration time on every (data, model) mesh of 8 devices"),
    "parallel-comm": ("dflash_jax.tools.parallel_comm", "tensor-parallel communication model on paper: collectives, comm share, which mesh"),
    "hybrid-plan": ("dflash_jax.tools.hybrid_plan",
                    "memory and communication plans of Qwen3.5 hybrid targets on GPU meshes, predicted iteration / AR step"),
    "train-memory": ("dflash_jax.tools.train_memory", "peak memory of a drafter training step, dense vs chunked attention, per mesh"),
    "gpu-compile": ("dflash_jax.tools.gpu_compile",
                    "compile the block-attention kernel for H100/H200/B200 without a GPU: registers, spills, occupancy"),
    "gpu-suite": ("dflash_jax.tools.gpu_suite", "every GPU measurement in one command (--smoke: tiny shapes, any machine)"),
    "throughput": ("dflash_jax.bench.throughput",
                   "batched decoding: aggregate vs per-user tokens/s per batch size, AR / DFlash fixed / adaptive"),
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


# The top-level help's headings, in this order; every command under exactly one of them
# (tests/cli/test_cli_options.py checks it). EXPERIMENTS lists no command: the experiments are
# modules of their own (see experiment_entries).
EXPERIMENTS = "experiments"
GROUPS = {
    "run and benchmark": ["generate", "bench", "throughput", "spec-speed", "decode-speed", "iteration-profile",
                          "tree-bench", "tree-verify-cost", "train-speed", "load-report"],
    "train a drafter": ["train-data", "features", "train", "export"],
    EXPERIMENTS: [],
    "embedded-model recipe (how the shipped default pair was made)":
        ["build-corpus", "pretrain", "export-target", "embedded-prompts", "build-embedded"],
    "GPU and parallel diagnostics": ["roofline", "gpu-compile", "gpu-suite", "kernel-speed", "moe-layer-speed",
                                     "gdn-kernel-speed", "gdn-rollback", "hybrid-speed", "parallel-speed", "parallel-comm", "hybrid-plan", "train-memory"],
}
SCRIPT = "dflash-jax"  # the console script ([project.scripts] in pyproject.toml)


def program_name() -> str:
    """How this process was started: ``dflash-jax`` through the console script, else
    ``python -m dflash_jax``."""
    return SCRIPT if os.path.basename(sys.argv[0]) in (SCRIPT, SCRIPT + ".exe") else PROG


def experiment_entries() -> list[tuple[str, str]]:
    """(name, one line) of the experiments heading: the ablations (``experiments/ablate_*.py``,
    found on disk) and the paper's figures."""
    import dflash_jax.experiments as experiments  # a docstring only: imports nothing heavy

    ablations = sorted(m.name.removeprefix("ablate_") for m in pkgutil.iter_modules(experiments.__path__)
                       if m.name.startswith("ablate_"))
    return [("ablate_<x>", "one of the paper's ablations, <x>: " + ", ".join(ablations)),
            ("paper", "the paper's tables and figures ('paper all': every one, the ablations included)")]


class CommandsFormatter(HelpFormatter):
    """The top-level help: the commands under the headings of :data:`GROUPS` (argparse lists
    subcommands in one flat list; parsing still goes through ``add_subparsers``)."""

    def add_argument(self, action):
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):  # the commands sit one heading deeper
            longest = max(len(a.dest) for a in action._get_subactions())
            self._action_max_length = max(self._action_max_length, self._current_indent + 4 + longest)

    def _format_action(self, action):
        if not isinstance(action, argparse._SubParsersAction):
            return super()._format_action(action)
        by_name = {a.dest: a for a in action._get_subactions()}
        parts = []
        for title, names in GROUPS.items():
            if title == EXPERIMENTS:
                title = ("experiments (python -m experiments.<name> [--help]; installed without a clone: "
                         "python -m dflash_jax.experiments.<name>)")
                names = [argparse.Action([], name, help=help_) for name, help_ in experiment_entries()]
            else:
                names = [by_name[name] for name in names]
            parts += [line + "\n" for line in textwrap.wrap(
                title + ":", self._width - self._current_indent, initial_indent=" " * self._current_indent,
                subsequent_indent=" " * (self._current_indent + 4))]
            self._indent()
            for entry in names:  # (super() does not reach into a comprehension)
                parts.append(super()._format_action(entry))
            self._dedent()
        return "".join(parts)


def command_module(name: str):
    """The module of command ``name`` (imported now)."""
    return importlib.import_module(COMMANDS[name][0])


def parser(command: str | None = None, prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of ``python -m dflash_jax`` (``prog``: the program name its help shows, e.g.
    ``dflash-jax``): every command a subcommand. Only ``command``'s options are added (its module
    imported); the others are listed with their help line."""
    p = argparse.ArgumentParser(
        prog=prog, description="DFlash block-diffusion speculative decoding in JAX.",
        formatter_class=lambda prog: CommandsFormatter(prog, max_help_position=28),
        epilog=f"'{prog} <command> --help' describes a command's options.")
    # main() reads these two itself (--debug anywhere on the line); here for the help, and
    # without defaults, so that a command's parsed options are the command's own
    p.add_argument("--version", action="store_true", default=argparse.SUPPRESS, help="print the version and exit")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of an error (also DFLASH_DEBUG=1; anywhere on the line)")
    sub = p.add_subparsers(title="commands", metavar="<command>")
    for name, (module_name, help_) in COMMANDS.items():
        kwargs = {"help": help_, "prog": f"{prog} {name}", "formatter_class": HelpFormatter}
        if name != command:
            sub.add_parser(name, **kwargs)
            continue
        module = command_module(name)
        module.add_arguments(sub.add_parser(name, description=plain_description(module.__doc__), **kwargs))
    return p


def usage(prog: str = PROG) -> str:
    """The top-level help: the commands with their help lines, under their headings."""
    return parser(prog=prog).format_help().rstrip("\n")


def main(argv=None):
    """The command line (``dflash-jax`` and ``python -m dflash_jax``): ``argv`` (default: this
    process's arguments) is a command and its options."""
    prog = program_name() if argv is None else PROG
    owns_process = argv is None  # this process's command line: run_cli may end the process (Ctrl-C)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = [a for a in argv if a != "--debug"]
    if not args or args[0] in ("-h", "--help"):
        print(usage(prog))
        return
    if args[0] == "--version":

        print(f"dflash-jax {__version__}")
        return
    name = args[0]
    if name not in COMMANDS:
        if name == "paper" or name.startswith("ablate_") or name.startswith("ablate-"):
            print(f"error: {name!r} is an experiment, not a command: run it as python -m "
                  f"experiments.{name.replace('-', '_')} from a clone, or python -m "
                  f"dflash_jax.experiments.{name.replace('-', '_')} where the package is installed", file=sys.stderr)
            sys.exit(2)
        print(f"error: unknown command {name!r}; the commands are {', '.join(COMMANDS)} "
              f"({prog} --help describes them)", file=sys.stderr)
        sys.exit(2)
    run_cli(lambda rest: command_module(name).run(parse_command(name, None, rest, parser(name, prog))),
            args[1:], debug="--debug" in argv, owns_process=owns_process)


if __name__ == "__main__":
    main()
