"""The whole embedded-default recipe in one resumable command:

    python -m dflash_jax build-embedded --work runs/embedded --data-dir DIR

corpus + tokenizer -> pretrain the target -> export it (bf16, Hugging Face layout) -> training
prompts -> target-regenerated responses -> train the drafter -> export it (released layout)
-> bench -> model cards. Every stage runs as ``python -m dflash_jax <stage>`` in the work
directory, with paths relative to it, and skips work already done (the two training stages
resume from their last Orbax checkpoint), so the command can be rerun after a kill with the
same settings (WORK/build.json records them; other settings are refused up front).

Where things go (WORK is --work):

    WORK/build.json            the settings of this work directory
    WORK/corpus, target-run, prompts.jsonl, drafter-data, drafter-run, bench
                               the stages' results (kept for resuming)
    WORK/export/{target,drafter}  the pair as the stages write it (with its model cards)
    ASSETS/{target,drafter}    the installed pair: --assets, default WORK/assets

Nothing is lost by a default:
  * every stage's settings, the install destination and the training data are checked before
    the first stage runs; a mistake is a one-line error and nothing is written;
  * the pair is installed only when every stage (model cards included) has succeeded, as one
    unit: it is copied into a new directory beside ASSETS and renamed into place (the old pair
    stays until the new one is complete), so a failed or interrupted build never leaves a
    half-replaced or mismatched target/drafter;
  * an existing, non-empty ASSETS directory is replaced only with --overwrite;
  * the package's own shipped embedded default (dflash_jax/assets) is never written unless
    --into-package is given (it implies --overwrite for that directory); --assets may not
    point into, or contain, the package's assets directory or the work directory.

The training data comes from --data-dir, else $DFLASH_DATA_DIR, else datasets/ under the
project's home ($DFLASH_JAX_HOME, default ~/.cache/dflash-jax): GSM8K train as
DIR/gsm8k/train.jsonl (it does not ship; when it is missing, the build says where to download
it and where to put it, before any stage runs), and MBPP sanitized as
DIR/mbpp/sanitized-mbpp.json when the directory has it, else the package's copy. The model
cards record the rebuild command without this machine's absolute paths (they become WORK,
ASSETS, DATA_DIR).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

from dflash_jax.cli import command_main, command_parser
from dflash_jax.files import check_settings, write_json
from dflash_jax.models.handles import ASSETS_DIR as PACKAGE_ASSETS
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.embedded.pretrain import MODEL_PRESETS, model_config
from dflash_jax.training.data import check_hold_out
from dflash_jax.bench import harness
from dflash_jax.embedded import cards, corpus
from dflash_jax.embedded.cli import DATA_DIR_HELP
from dflash_jax.embedded.corpus import check_training_data

EVAL_PROMPTS = 16  # held-out sequences the drafter trainer evaluates tau on
BLOCK_SIZE = 16
REGEN_MAX_LEN = 512  # train-data --max-len
VOCAB_SIZE = 8192  # build-corpus's default vocabulary


def _run(args: list[str], cwd: str) -> None:
    """One stage: ``python -m dflash_jax <args>`` in a subprocess in the work directory ``cwd``
    (its paths are relative to it, so the commands the stages record are portable)."""
    print(f"+ (cd {cwd} && python -m dflash_jax {' '.join(args)})", flush=True)
    subprocess.run([sys.executable, "-m", "dflash_jax", *args], check=True, cwd=cwd)


# where each stage writes, relative to the work directory (the stages run there)
CORPUS, TARGET_RUN, PROMPTS, REGEN = "corpus", "target-run", "prompts.jsonl", "drafter-data"
DRAFTER_RUN, BENCH, EXPORT = "drafter-run", "bench", "export"  # EXPORT: the pair before it is installed
TARGET, DRAFTER = os.path.join(EXPORT, "target"), os.path.join(EXPORT, "drafter")
SETTINGS = "build.json"
STAGE_OUTPUTS = (CORPUS, TARGET_RUN, PROMPTS, REGEN, DRAFTER_RUN, BENCH, EXPORT, SETTINGS)
# the build's options that decide what the stages make (a resume must keep them)
RECIPE_OPTIONS = ("preset", "target_steps", "num_prompts", "max_new_tokens", "drafter_layers", "taps",
                  "drafter_steps", "drafter_batch", "num_anchors", "drafter_lr")
# bench options the build sets itself
BENCH_OWN = ("target", "drafter", "out")


def parser():
    """The command's parser on its own."""
    p = command_parser("build-embedded", __doc__)
    add_arguments(p)
    return p


def add_arguments(p) -> None:
    p.add_argument("--work", default=os.path.join("runs", "embedded"),
                   help="working directory: corpus, runs, data, exports (resumed when it exists)")
    p.add_argument("--assets", default=None,
                   help="where the finished pair is installed, as ASSETS/target and ASSETS/drafter "
                        "(default: WORK/assets)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing non-empty --assets directory (without it, one is refused)")
    p.add_argument("--into-package", action="store_true",
                   help="install into the package's shipped dflash_jax/assets, replacing the embedded "
                        "default (the only way to write there)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--preset", default="cpu", choices=sorted(MODEL_PRESETS), help="model size of the target")
    p.add_argument("--target-steps", type=int, default=1200, help="pretraining steps")
    p.add_argument("--num-prompts", type=int, default=4000,
                   help=f"drafter training prompts ({EVAL_PROMPTS} of them held out to measure tau)")
    p.add_argument("--max-new-tokens", type=int, default=192,
                   help="tokens generated per prompt at most when regenerating (the responses)")
    p.add_argument("--drafter-layers", type=int, default=1, help="layers of the drafter")
    p.add_argument("--taps", type=int, nargs="+", default=[1, 2, 3],
                   help="target layers the drafter reads (distinct, below the preset's layer count)")
    p.add_argument("--drafter-steps", type=int, default=2200, help="training steps of the drafter")
    p.add_argument("--drafter-batch", type=int, default=8, help="training sequences per step of the drafter")
    p.add_argument("--num-anchors", type=int, default=32,
                   help="anchors (block starts) per training sequence of the drafter")
    p.add_argument("--drafter-lr", type=float, default=1e-3,
                   help="peak learning rate of the drafter's training")
    p.add_argument("--bench-args", default="",
                   help="extra arguments for the final bench run, checked up front (not --target/--drafter/"
                        "--out), e.g. --bench-args='--datasets gsm8k --max-samples 4'")


# ------------------------------------------------------------------------------- checks
def _inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies under it (both real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_model(a) -> None:
    """The drafter's shape against the preset's target: the trainer's own check
    (``DrafterConfig.check_target``) on the configs the stages will build."""
    layers = MODEL_PRESETS[a.preset]["num_layers"]
    bad = [t for t in a.taps if not 0 <= t < layers]
    if bad or len(set(a.taps)) != len(a.taps):
        raise ValueError(f"--taps {' '.join(map(str, a.taps))}: the {a.preset} preset's target has "
                         f"{layers} layers, so taps must be distinct layer ids in 0..{layers - 1}")
    target = model_config(a.preset, VOCAB_SIZE, eos_id=0)
    DrafterConfig.for_target(target, a.drafter_layers, BLOCK_SIZE, 1, tuple(a.taps)).check_target(target)


def check_numbers(a) -> None:
    """The stages' numeric settings, including the drafter trainer's held-out split."""
    for name in ("target_steps", "drafter_steps", "drafter_batch", "drafter_layers", "num_anchors",
                 "max_new_tokens"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.drafter_lr > 0:
        raise ValueError(f"--drafter-lr must be > 0, got {a.drafter_lr}")
    need = EVAL_PROMPTS + a.drafter_batch  # one sequence per prompt
    try:
        check_hold_out(EVAL_PROMPTS, a.num_prompts)  # what `train --eval-prompts` does with the data
        if a.num_prompts - EVAL_PROMPTS < a.drafter_batch:
            raise ValueError(f"{a.num_prompts - EVAL_PROMPTS} sequences are left to train on, fewer "
                             f"than --drafter-batch {a.drafter_batch}")
    except ValueError as e:
        raise ValueError(f"--num-prompts {a.num_prompts} is too few: the drafter trainer holds out "
                         f"{EVAL_PROMPTS} sequences to measure tau and trains on the rest in batches of "
                         f"--drafter-batch ({a.drafter_batch}) ({e}); use --num-prompts {need} or more") from None
    if a.max_new_tokens >= REGEN_MAX_LEN:
        raise ValueError(f"--max-new-tokens {a.max_new_tokens}: regenerated sequences are at most "
                         f"{REGEN_MAX_LEN} tokens, prompt included; use fewer than {REGEN_MAX_LEN}")


def bench_arguments(a) -> list[str]:
    """--bench-args split and parsed by bench's own parser (a mistake is found now, not after
    training); the options the build sets itself are refused."""
    try:
        extra = shlex.split(a.bench_args)
    except ValueError as e:
        raise ValueError(f"--bench-args {a.bench_args!r}: {e}") from None
    p = harness.parser()
    unset = object()
    p.set_defaults(**{k: unset for k in BENCH_OWN})

    def refuse(*args):
        raise ValueError(f"--bench-args {a.bench_args!r}: {args[-1] if args else 'asks for help'}")

    p.error, p.exit, p.print_help = refuse, refuse, lambda *args: refuse()
    given = p.parse_args(extra)
    own = [k for k in BENCH_OWN if getattr(given, k) is not unset]
    if own:
        raise ValueError(f"--bench-args {a.bench_args!r}: leave out --{' and --'.join(own)} (the build "
                         "benches the pair it built, into WORK/bench)")
    return extra


def check_destination(a, assets: str) -> None:
    """Where the pair will be installed: never into the package or the work directory by
    accident, never over an existing pair without --overwrite."""
    given = assets
    assets, package = os.path.realpath(assets), os.path.realpath(PACKAGE_ASSETS)
    work = os.path.realpath(a.work)
    if a.into_package and a.assets is not None and os.path.realpath(a.assets) != package:
        raise ValueError("--into-package installs into dflash_jax/assets: leave --assets unset with it")
    if assets == package and not a.into_package:
        raise ValueError(f"--assets {given} is the package's shipped embedded default: pass "
                         "--into-package to replace it, or choose another directory")
    if assets != package and (_inside(assets, package) or _inside(package, assets)):
        raise ValueError(f"--assets {given} overlaps the package's shipped embedded default "
                         f"({PACKAGE_ASSETS}); choose a directory outside it (or --into-package)")
    if _inside(work, assets):
        raise ValueError(f"--assets {given} would replace the work directory {a.work}: choose another "
                         "directory (the default is WORK/assets)")
    for name in STAGE_OUTPUTS:
        if _inside(assets, os.path.join(work, name)):
            raise ValueError(f"--assets {given} is inside the stage output {os.path.join(a.work, name)}: "
                             "choose another directory (the default is WORK/assets)")
    if os.path.lexists(assets) and not os.path.isdir(assets):
        raise ValueError(f"--assets {given} exists and is not a directory")
    if os.path.isdir(assets) and os.listdir(assets) and not (a.overwrite or a.into_package):
        raise ValueError(f"--assets {given} exists and is not empty: pass --overwrite to replace "
                         "it (or another --assets)")
    parent = os.path.dirname(assets)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot install into {given}: {parent} is not writable")


def recipe_settings(a) -> dict:
    return {k: getattr(a, k) for k in RECIPE_OPTIONS} | {"block_size": BLOCK_SIZE,
                                                        "eval_prompts": EVAL_PROMPTS}


def check_resume(a) -> None:
    """A work directory is resumed only with the settings it was started with."""
    check_settings(os.path.join(a.work, SETTINGS), recipe_settings(a), holder=f"{a.work} was started",
                   remedy="rerun with those to resume it, or use a new --work",
                   lead="", show_key=lambda k: f"--{k.replace('_', '-')}", show_value=_show)


def _show(v) -> str:
    return " ".join(map(str, v)) if isinstance(v, list) else str(v)


def available_prompts(data_dir: str, num: int) -> int:
    """How many of ``num`` training prompts ``embedded-prompts`` can draw from ``data_dir``
    (``corpus.training_prompts`` returns min(num, prompts available)); the standard library's
    functions are scanned only when the other styles fall short."""
    return corpus.available_training_prompts(data_dir, num)


def check_data(a) -> str | None:
    """The training data directory, checked, when a stage still needs it (None otherwise)."""
    work = a.work
    need_corpus = not os.path.exists(os.path.join(work, CORPUS, "corpus.json"))
    need_prompts = not os.path.exists(os.path.join(work, PROMPTS))
    if not (need_corpus or need_prompts):
        return None
    data_dir = check_training_data(a.data_dir)  # --data-dir, else the default data directory
    if need_prompts:
        have = available_prompts(data_dir, a.num_prompts)
        if have < a.num_prompts:
            raise ValueError(f"--num-prompts {a.num_prompts}: the training data in {data_dir} and the "
                             f"standard library give only {have} prompts; use --num-prompts {have} or fewer")
    return os.path.abspath(data_dir)


def validate(a, assets: str) -> tuple[str | None, list[str]]:
    """Checks every stage's settings before any runs; returns the training data directory (None
    when the stages that read it are done) and the bench stage's extra arguments. Raises
    ValueError / OSError; writes nothing."""
    check_model(a)
    check_numbers(a)
    bench_extra = bench_arguments(a)
    check_destination(a, assets)
    check_resume(a)
    return check_data(a), bench_extra


# ------------------------------------------------------------------------------- install
def install(staged: str, assets: str) -> None:
    """Replaces the ``assets`` directory by ``staged`` (a finished target/ + drafter/ pair) with
    renames: the old pair stays in place until the new one is complete beside it."""
    parent = os.path.dirname(os.path.abspath(assets)) or "."
    os.makedirs(parent, exist_ok=True)
    new = os.path.join(parent, f".{os.path.basename(assets)}.new-{os.getpid()}")
    old = os.path.join(parent, f".{os.path.basename(assets)}.old-{os.getpid()}")
    shutil.rmtree(new, ignore_errors=True)
    try:
        shutil.copytree(staged, new)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    if os.path.exists(assets):
        os.replace(assets, old)
        try:
            os.replace(new, assets)
        except BaseException:
            os.replace(old, assets)
            shutil.rmtree(new, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, assets)


# ------------------------------------------------------------------------------- cards
PATH_OPTIONS = {"work": "WORK", "assets": "ASSETS", "data_dir": "DATA_DIR"}


def _portable(value: str, placeholder: str) -> str:
    return placeholder if os.path.isabs(os.path.expanduser(value)) else value


def portable_command(a, p=None) -> str:
    """The rebuild command for the model cards, from the parsed options: those that differ from
    their defaults, absolute paths of this machine written as WORK / ASSETS / DATA_DIR
    (relative ones as given), without --overwrite (a permission, not part of the recipe)."""
    p = p or parser()
    out = []
    for act in p._actions:
        if not act.option_strings or act.dest in ("help", "overwrite"):
            continue
        value = getattr(a, act.dest)
        if value == act.default or value is None:
            continue
        opt = max(act.option_strings, key=len)
        if act.dest in PATH_OPTIONS:
            out += [opt, _portable(value, PATH_OPTIONS[act.dest])]
        elif act.nargs == 0:
            out.append(opt)
        elif act.dest == "bench_args":
            out += [opt, " ".join(_portable(t, "PATH") for t in shlex.split(value))]
        elif isinstance(value, list):
            out += [opt, *map(str, value)]
        else:
            out += [opt, str(value)]
    return "`" + shlex.join(["python", "-m", "dflash_jax", "build-embedded", *out]) + "`"


# ------------------------------------------------------------------------------- the build
def run(a) -> None:
    """The build (see the module docstring) with the parsed options ``a``."""
    assets = PACKAGE_ASSETS if a.into_package else (a.assets or os.path.join(a.work, "assets"))
    data_dir, bench_extra = validate(a, assets)  # nothing has been written before this returns
    data = ["--data-dir", data_dir] if data_dir else []
    w = a.work
    os.makedirs(w, exist_ok=True)
    write_json(os.path.join(w, SETTINGS), recipe_settings(a))
    if not os.path.exists(os.path.join(w, CORPUS, "corpus.json")):
        _run(["build-corpus", "--out", CORPUS, *data], w)
    _run(["pretrain", "--corpus", CORPUS, "--run", TARGET_RUN, "--preset", a.preset,
          "--steps", str(a.target_steps)], w)
    _run(["export-target", "--corpus", CORPUS, "--run", TARGET_RUN, "--out", TARGET], w)
    if not os.path.exists(os.path.join(w, PROMPTS)):
        _run(["embedded-prompts", "--out", PROMPTS, "--num", str(a.num_prompts), *data], w)
    _run(["train-data", "--target", TARGET, "--prompts", PROMPTS, "--out", REGEN, "--dtype", "float32",
          "--max-new-tokens", str(a.max_new_tokens), "--max-len", str(REGEN_MAX_LEN), "--batch-size", "32"], w)
    recipe = {"num_prompts": a.num_prompts, "max_new_tokens": a.max_new_tokens, "steps": a.drafter_steps,
              "batch_size": a.drafter_batch, "num_anchors": a.num_anchors, "learning_rate": a.drafter_lr,
              "gamma": 7.0, "commands": portable_command(a)}
    _run(["train", "--target", TARGET, "--data", REGEN, "--run", DRAFTER_RUN, "--target-dtype", "float32",
          "--drafter-layers", str(a.drafter_layers), "--block-size", str(BLOCK_SIZE), "--taps", *map(str, a.taps),
          "--steps", str(a.drafter_steps), "--batch-size", str(a.drafter_batch), "--num-anchors",
          str(a.num_anchors), "--learning-rate", str(a.drafter_lr), "--checkpoint-every", "50",
          "--eval-prompts", str(EVAL_PROMPTS), "--eval-every", "200"], w)
    _run(["export", "--run", DRAFTER_RUN, "--out", DRAFTER, "--out-dtype", "bfloat16"], w)
    shutil.copy(os.path.join(w, DRAFTER_RUN, "metrics.jsonl"), os.path.join(w, DRAFTER, "training_metrics.jsonl"))
    with open(os.path.join(w, DRAFTER, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=2)
    _run(["bench", "--target", TARGET, "--drafter", DRAFTER, "--out", BENCH, *bench_extra], w)

    cards.write_cards(os.path.join(w, EXPORT), recipe, os.path.join(w, BENCH, "bench.json"))
    install(os.path.join(w, EXPORT), assets)
    print(f"embedded default written to {assets}")


def main(argv=None):
    return command_main("build-embedded", sys.modules[__name__], argv)


if __name__ == "__main__":
    from dflash_jax.cli import run_cli

    run_cli(main)
