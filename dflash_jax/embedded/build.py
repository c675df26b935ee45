"""The whole embedded-default recipe in one resumable command:

    python -m dflash_jax build-embedded --work runs/embedded

corpus + tokenizer -> pretrain the target -> export it (bf16, Hugging Face layout) -> training
prompts -> target-regenerated responses -> train the drafter -> export it (released layout)
-> bench -> model cards. Every stage works inside --work and skips work already done (the two
training stages resume from their last Orbax checkpoint), so the command can be rerun after a
kill. Only when every stage has succeeded is the finished pair installed, as one unit, into
--assets (default: WORK/assets): a new directory is written beside it and renamed into place,
so a failed or interrupted build never leaves a half-replaced or mismatched target/drafter.

An existing --assets directory is replaced only with --overwrite; the package's own shipped
assets (dflash_jax/assets) only with --into-package (which implies it). Every stage's settings
are checked before the first stage runs. The training data (GSM8K train, MBPP) comes from
--data-dir, $DFLASH_DATA_DIR or ../shared/datasets beside the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from dflash_jax.api import ASSETS_DIR as PACKAGE_ASSETS
from dflash_jax.cli import command_parser

EVAL_PROMPTS = 16  # held-out sequences the drafter trainer evaluates tau on
BLOCK_SIZE = 16


def _run(args: list[str], cwd: str) -> None:
    """One stage: ``python -m dflash_jax <args>`` in a subprocess in the work directory ``cwd``
    (its paths are relative to it, so the commands the stages record are portable)."""
    print(f"+ (cd {cwd} && python -m dflash_jax {' '.join(args)})", flush=True)
    subprocess.run([sys.executable, "-m", "dflash_jax", *args], check=True, cwd=cwd)


# where each stage writes, relative to the work directory (the stages run there)
CORPUS, TARGET_RUN, PROMPTS, REGEN = "corpus", "target-run", "prompts.jsonl", "drafter-data"
DRAFTER_RUN, BENCH, EXPORT = "drafter-run", "bench", "export"  # EXPORT: the pair before it is installed
TARGET, DRAFTER = os.path.join(EXPORT, "target"), os.path.join(EXPORT, "drafter")


def parser():
    p = command_parser("build-embedded", __doc__)
    p.add_argument("--work", default=os.path.join("runs", "embedded"),
                   help="working directory: corpus, runs, data, exports (resumed when it exists)")
    p.add_argument("--assets", default=None, help="where the finished pair is installed (default: WORK/assets)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --assets directory")
    p.add_argument("--into-package", action="store_true",
                   help="install into the package's shipped dflash_jax/assets (replaces the embedded default)")
    p.add_argument("--data-dir", default=None,
                   help="training data: DIR/gsm8k/train.jsonl, DIR/mbpp/sanitized-mbpp.json (default: "
                        "$DFLASH_DATA_DIR, else ../shared/datasets beside the checkout)")
    p.add_argument("--preset", default="cpu", choices=["cpu", "gpu", "tiny"], help="target size")
    p.add_argument("--target-steps", type=int, default=1200, help="pretraining steps")
    p.add_argument("--num-prompts", type=int, default=4000, help="drafter training prompts")
    p.add_argument("--max-new-tokens", type=int, default=192, help="response length when regenerating")
    p.add_argument("--drafter-layers", type=int, default=1)
    p.add_argument("--taps", type=int, nargs="+", default=[1, 2, 3], help="target layers the drafter reads")
    p.add_argument("--drafter-steps", type=int, default=2200)
    p.add_argument("--drafter-batch", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=32, help="anchors per training sequence")
    p.add_argument("--drafter-lr", type=float, default=1e-3)
    p.add_argument("--bench-args", default="", help="extra arguments for the final bench run")
    return p


def validate(a, assets: str) -> str | None:
    """Checks every stage's settings before any runs; returns the training data directory (None
    when the stages that read it are done). Raises ValueError / FileNotFoundError."""
    from dflash_jax.bench.prompt_sets import default_data_dir
    from dflash_jax.embedded.corpus import check_training_data
    from dflash_jax.embedded.pretrain import MODEL_PRESETS

    layers = MODEL_PRESETS[a.preset]["num_layers"]
    bad = [t for t in a.taps if not 0 <= t < layers]
    if bad or len(set(a.taps)) != len(a.taps):
        raise ValueError(f"--taps {' '.join(map(str, a.taps))}: the {a.preset} preset's target has "
                         f"{layers} layers, so taps must be distinct layer ids in 0..{layers - 1}")
    for name in ("target_steps", "drafter_steps", "drafter_batch", "drafter_layers", "num_anchors",
                 "max_new_tokens"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.num_prompts <= EVAL_PROMPTS + a.drafter_batch:
        raise ValueError(f"--num-prompts {a.num_prompts} is too few: the drafter trainer holds out "
                         f"{EVAL_PROMPTS} sequences for tau and needs at least --drafter-batch "
                         f"({a.drafter_batch}) to train on; use at least {EVAL_PROMPTS + a.drafter_batch + 1}")
    if not a.drafter_lr > 0:
        raise ValueError(f"--drafter-lr must be > 0, got {a.drafter_lr}")
    given, assets = assets, os.path.abspath(assets)
    package = os.path.abspath(PACKAGE_ASSETS)
    if assets == package and not a.into_package:
        raise ValueError(f"--assets {given} is the package's shipped embedded default: pass "
                         "--into-package to replace it, or choose another directory")
    if a.into_package and a.assets is not None and os.path.abspath(a.assets) != package:
        raise ValueError("--into-package installs into dflash_jax/assets: leave --assets unset with it")
    if os.path.isdir(assets) and os.listdir(assets) and not (a.overwrite or a.into_package):
        raise ValueError(f"--assets {given} exists and is not empty: pass --overwrite to replace "
                         "it (or another --assets)")
    work = a.work
    need_data = not (os.path.exists(os.path.join(work, CORPUS, "corpus.json"))
                     and os.path.exists(os.path.join(work, PROMPTS)))
    data_dir = a.data_dir or default_data_dir()
    if need_data:
        check_training_data(data_dir)
    return os.path.abspath(data_dir) if data_dir else None


def install(staged: str, assets: str) -> None:
    """Replaces the ``assets`` directory by ``staged`` (a finished target/ + drafter/ pair) with
    renames: the old pair stays in place until the new one is complete beside it."""
    parent = os.path.dirname(os.path.abspath(assets)) or "."
    os.makedirs(parent, exist_ok=True)
    new = os.path.join(parent, f".{os.path.basename(assets)}.new-{os.getpid()}")
    old = os.path.join(parent, f".{os.path.basename(assets)}.old-{os.getpid()}")
    shutil.rmtree(new, ignore_errors=True)
    shutil.copytree(staged, new)
    if os.path.exists(assets):
        os.replace(assets, old)
        try:
            os.replace(new, assets)
        except OSError:
            os.replace(old, assets)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, assets)


PATH_OPTIONS = ("--work", "--assets", "--data-dir")


def _portable_command(argv) -> str:
    """The rebuild command for the model cards: the options as given, but paths of this machine
    (work, assets and data directories) written as placeholders."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in PATH_OPTIONS:
            out.append(f"{name} {name[2:].replace('-', '_').upper()}")
            skip = "=" not in arg
        elif arg in ("--overwrite", "--into-package"):
            continue
        else:
            out.append(f"'{arg}'" if " " in arg else arg)
    return "`python -m dflash_jax build-embedded " + " ".join(out) + "`"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    assets = PACKAGE_ASSETS if a.into_package else (a.assets or os.path.join(a.work, "assets"))
    data_dir = validate(a, assets)
    data = ["--data-dir", data_dir] if data_dir else []
    w = a.work
    os.makedirs(w, exist_ok=True)
    if not os.path.exists(os.path.join(w, CORPUS, "corpus.json")):
        _run(["build-corpus", "--out", CORPUS, *data], w)
    _run(["pretrain", "--corpus", CORPUS, "--run", TARGET_RUN, "--preset", a.preset,
          "--steps", str(a.target_steps)], w)
    _run(["export-target", "--corpus", CORPUS, "--run", TARGET_RUN, "--out", TARGET], w)
    if not os.path.exists(os.path.join(w, PROMPTS)):
        _run(["embedded-prompts", "--out", PROMPTS, "--num", str(a.num_prompts), *data], w)
    _run(["train-data", "--target", TARGET, "--prompts", PROMPTS, "--out", REGEN, "--dtype", "float32",
          "--max-new-tokens", str(a.max_new_tokens), "--max-len", "512", "--batch-size", "32"], w)
    recipe = {"num_prompts": a.num_prompts, "max_new_tokens": a.max_new_tokens, "steps": a.drafter_steps,
              "batch_size": a.drafter_batch, "num_anchors": a.num_anchors, "learning_rate": a.drafter_lr,
              "gamma": 7.0, "commands": _portable_command(argv)}
    _run(["train", "--target", TARGET, "--data", REGEN, "--run", DRAFTER_RUN, "--dtype", "float32",
          "--drafter-layers", str(a.drafter_layers), "--block-size", str(BLOCK_SIZE), "--taps", *map(str, a.taps),
          "--steps", str(a.drafter_steps), "--batch-size", str(a.drafter_batch), "--num-anchors",
          str(a.num_anchors), "--learning-rate", str(a.drafter_lr), "--checkpoint-every", "50",
          "--eval-prompts", str(EVAL_PROMPTS), "--eval-every", "200"], w)
    _run(["export", "--run", DRAFTER_RUN, "--out", DRAFTER, "--dtype", "bfloat16"], w)
    shutil.copy(os.path.join(w, DRAFTER_RUN, "metrics.jsonl"), os.path.join(w, DRAFTER, "training_metrics.jsonl"))
    with open(os.path.join(w, DRAFTER, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=2)
    _run(["bench", "--target", TARGET, "--drafter", DRAFTER, "--out", BENCH, *a.bench_args.split()], w)
    from dflash_jax.embedded.cards import write_cards

    write_cards(os.path.join(w, EXPORT), recipe, os.path.join(w, BENCH, "bench.json"))
    install(os.path.join(w, EXPORT), assets)
    print(f"embedded default written to {assets}")


if __name__ == "__main__":
    from dflash_jax.cli import run_cli

    run_cli(main)
