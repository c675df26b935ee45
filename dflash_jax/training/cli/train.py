"""Train a drafter of a drafting method (--method: dflash, the default, or another registered method
that trains; each method's options and run are its package's training module) on a data
directory written by train-data (optax AdamW, Orbax checkpoints; a run directory
that exists is resumed). The training settings are the fields of
TrainConfig (dflash_jax/training/trainer.py), one option each. --mesh data=D,model=M trains on
D*M devices (batch rows over data, the target tensor-parallel over model, --fsdp to split the
drafter and its optimizer state over data too); a run resumes on any mesh.

It ends with what the run holds: the run directory, its last checkpoint, the last held-out tau,
and the commands that export the drafter and benchmark it."""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import sys

from dflash_jax import methods
from dflash_jax import quantization
from dflash_jax.cli import (add_dataclass_arguments, add_deprecated_alias, command_main, dataclass_from_args,
                            flag, run_cli)
from dflash_jax.hub import CHECKPOINT_HELP
from dflash_jax.parallel.cli import add_arguments as add_parallel_arguments
from dflash_jax.training.run_dir import (CHECKPOINTS, METRICS_FILE, held_out_curve, is_complete, metric_rows, start_tau,
                                         run_length, saved_steps)
from dflash_jax.training.trainer import TrainConfig


def training_modules() -> dict:
    """{method name: the module with its part of this command} of every registered drafting
    method that trains here (``DraftingMethod.training_module``), the default (DFlash) first."""
    return {m.name: importlib.import_module(m.training_module) for m in methods.registered() if m.training_module}


def add_arguments(p) -> None:
    parts = training_modules()
    p.add_argument("--method", choices=list(parts), default=methods.DEFAULT,
                   help="the drafting method to train: " + "; ".join(
                       f"{name} ({methods.method(name).label})" for name in parts)
                   + " (docs/methods.md)")
    p.add_argument("--target", required=True, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--data", required=True, help="data directory written by train-data")
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    parts[methods.DEFAULT].add_train_arguments(p)  # its options first
    p.add_argument("--eval-prompts", type=int, default=0,
                   help="hold out the last N sequences (not trained on) and evaluate tau on their prompts")
    p.add_argument("--stop-after", type=int, help="stop after this many steps (for testing resume)")
    p.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from this drafter (a directory, a hub repo id such as "
                   "z-lab/Qwen3-8B-DFlash-b16, or 'embedded'; released layout; its config "
                   "replaces --drafter-layers/--block-size/--taps) instead of random weights")
    p.add_argument("--target-dtype", choices=["float32", "bfloat16"],
                   help="dtype the target is loaded and computes in (default: the checkpoint's); the "
                        "drafter's is --compute-dtype")
    add_deprecated_alias(p, "--dtype", "--target-dtype")  # --dtype is the compute dtype elsewhere
    quantization.add_argument(p)  # the target as train-data answered with it
    for name, part in parts.items():
        if name != methods.DEFAULT:
            part.add_train_arguments(p)
    add_dataclass_arguments(p.add_argument_group("training settings (TrainConfig)"), TrainConfig,
                            exclusive=[("steps", "epochs")])

    add_parallel_arguments(p)
    p.add_argument("--fsdp", action="store_true",
                   help="with --mesh: split the drafter's parameters and optimizer state over the "
                        "mesh's data axis (FSDP) instead of replicating them; the target is always "
                        "split over model (tensor parallelism) and the batch rows over data")


def check_method_options(args) -> None:
    """Refuses the options of other methods than ``--method``, and the training settings it
    does not read (one error naming them all)."""
    parts = training_modules()
    reads: dict[str, list[str]] = {}  # option -> the methods whose training reads it
    options = {}  # (dest, option) -> its value when not given
    for name, part in parts.items():
        for (dest, option), unset in part.TRAIN_OPTIONS.items():
            reads.setdefault(option, []).append(name)
            options[(dest, option)] = unset
    for f in dataclasses.fields(TrainConfig):
        reads[flag(f.name)] = [name for name, part in parts.items() if f.name not in part.IGNORED_SETTINGS]
        options[(f.name, flag(f.name))] = f.default
    given = [option for (dest, option), unset in options.items()
             if getattr(args, dest, unset) != unset and args.method not in reads[option]]
    if given:
        owners = [name for name in parts if any(name in reads[option] for option in given)]
        hint = f" (or pass --method {owners[0]})" if args.method == methods.DEFAULT and len(owners) == 1 else ""
        raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                         f"{' / '.join(methods.method(n).label for n in owners)}-only: drop "
                         f"{'it' if len(given) == 1 else 'them'} with --method {args.method}{hint}")


def closing_lines(args, cfg: TrainConfig) -> list[str]:
    """What ``train`` prints when it has trained: the run directory, its last checkpoint (path,
    step), the last held-out tau (``metrics.jsonl``'s ``eval_tau``, or why there is none), and
    the ``export`` and ``bench`` commands for that checkpoint, with this run's paths as the user
    gave them (the export directory is the one the trainer's own messages suggest)."""
    run = args.run.rstrip("/\\") or args.run
    steps, saved = run_length(args.run), saved_steps(args.run)
    lines = [f"run directory: {run} (run.json: settings, {CHECKPOINTS}/, {METRICS_FILE}: one line per step)"]
    if saved:
        step = saved[-1]
        done = steps is None or step >= steps
        lines.append(f"last checkpoint: {os.path.join(run, CHECKPOINTS, str(step))} (step {step}"
                     + (f" of {steps}" if steps is not None else "")
                     + (")" if done else "; the same command continues the run)"))
    else:
        lines.append("last checkpoint: none yet (one is saved every --checkpoint-every steps and at the end; "
                     "the same command starts the run again)")
    held, start = held_out_curve(metric_rows(args.run)), start_tau(args.run)
    if held:
        lines.append("held-out tau: " + (f"{start:.2f} at the start (the --init-from drafter) -> " if start else "")
                     + f"{held[-1]['tau']:.2f} at step {held[-1]['step']} ({METRICS_FILE}, eval_tau)")
    elif not args.eval_prompts:
        lines.append("held-out tau: no held-out evaluation ran (--eval-prompts N --eval-every K hold out N "
                     "sequences and measure tau on their prompts every K steps)")
    elif not cfg.eval_every:
        lines.append("held-out tau: no held-out evaluation ran (--eval-every N measures it every N steps)")
    else:
        lines.append(f"held-out tau: no held-out evaluation ran (it runs at the steps that are multiples of "
                     f"--eval-every {cfg.eval_every}; none yet)")
    if saved:
        export = f"{run}-step{saved[-1]}"
        lines += ["next: export the drafter, then benchmark it against the target alone:",
                  "  " + shlex.join(["python", "-m", "dflash_jax", "export", "--run", run, "--out", export]),
                  "  " + shlex.join(["python", "-m", "dflash_jax", "bench", "--target", args.target,
                                     "--drafter", export]
                                    + (["--quantize", args.quantize] if getattr(args, "quantize", None) else []))]
    return lines


def run(args) -> None:
    check_method_options(args)
    cfg = dataclass_from_args(TrainConfig, args)  # the settings are checked before anything is loaded
    finished_before = is_complete(args.run)  # then the trainer's own line says it all
    training_modules()[args.method].train_from_args(args, cfg)
    import jax

    if not finished_before and jax.process_index() == 0:
        print("\n".join(closing_lines(args, cfg)), flush=True)


def main(argv=None):
    return command_main("train", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
