"""The ablation framework: an experiment is a named grid of cells, each cell a drafter-training
setting plus an evaluation setting.

    python -m experiments.ablate_depth --preset cpu
    python -m experiments.ablate_block_size --preset smoke --out /tmp/bs
    experiments.ablate_depth.run(preset="smoke", steps=8) -> Table      # the same, from Python

Where things go (every experiment and ``experiments.paper`` alike): under the run home,
``$DFLASH_JAX_HOME`` (default ``~/.cache/dflash-jax``; :func:`home`), never into the checkout
unless asked: ``HOME/work`` is the run directory (``--work``: data, drafters, cells and
measurements, shared by every experiment) and ``HOME/results/ablations/<experiment>[-<preset>]``
the outputs (``--out``). The committed results under the repository's ``results/`` are written
only by an explicit ``--out results/ablations/<experiment>``.

What a run does, every step resumable and keyed by a hash of the settings that decide it:

1. training prompts (``prompt_source``) answered by the target itself (docs/method.md section 5):
   ``WORK/data/<hash>/`` (``dflash_jax.training.data.regenerate``; shared by every cell and
   every experiment with the same data settings);
2. per distinct training setting, a drafter trained with the project's trainer
   (``dflash_jax.methods.dflash.training.DFlashTrainer``, the shared trainer: AdamW, Orbax checkpoints, exact resume after a
   kill) and exported in the released layout: ``WORK/drafters/<hash>/{run,drafter,train.json}``.
   Cells that share a training setting (e.g. one drafter tested at several block sizes) share
   it;
3. per cell, the benchmark protocol of ``python -m dflash_jax bench`` (AR and DFlash on the
   same prompts, batch 1, interleaved per prompt) and the draft / verify step times:
   ``WORK/cells/<hash>/cell.json`` (settings, training steps/tokens/minutes, metrics with 95 %
   intervals, the command line, versions). A finished cell is reused (and named on the
   terminal: :class:`WorkLog`), recomputed only with ``--fresh`` or ``--remeasure``.

Every entry of the run directory (data, features, drafter, cell, measurement) goes through
:func:`work_entry`: reused when finished, else made under a lock beside it, so that a second
process asking for the same entry waits for the first and reuses what it made.

Every cell of a grid gets the same training budget (steps x sequences per step x anchors per
sequence, stated in the output), so cells differ only in what the ablation varies. Seeds are
fixed and recorded; ``--seeds N`` trains N seeds (seed, seed+1, ...) per cell and reports
the spread.

The outputs, under ``--out``: ``table.json`` / ``table.md`` (one row per cell: tau and
decode-only speedup per prompt set and on average with intervals, draft ms per iteration,
drafter parameters; the paper's numbers for the same ablation beside them), ``plot.png`` and
``README.md`` (what was run, the budget, what the data shows).

Presets: ``smoke`` (seconds of training, one prompt set, two prompts; its outputs say that
they are a smoke run and draw no finding), ``test`` (the test suite's: the smoke grids and
budget on training sequences of at most 64 tokens and two short MBPP prompts, so that every
evaluation of every grid, and of ``experiments.paper``'s test preset, shares one program shape;
a smoke run too), ``cpu`` (the embedded target, minutes per
cell: the committed results; its training prompts are the embedded drafter's mix, which needs
GSM8K train, the one file not shipped: the command says where to put it) and ``gpu`` (a real
target given by ``--target``, the paper's settings). Every preset value is an option;
``--help`` lists them with each preset's default.

Findings: a README's "What the data shows" compares rows only through their 95 % intervals,
and an interval exists only when it rests on at least ``metrics.MIN_DISTINCT_SAMPLES``
responses (:func:`dflash_jax.metrics.interval_supported`); below that a comparison says it is
not a finding.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import types
import typing
from typing import Any, Callable, Literal, Sequence

import numpy as np

from dflash_jax import metrics
from dflash_jax.bench.prompt_sets import DATASETS, SUBSETS, load_prompt_set, shipped_data_dir
from dflash_jax.cli import argument_kwargs, field_help, flag, run_cli
from dflash_jax.files import (HOME_ENV, atomic_path, exclusive, home as files_home, lock_holder, write_json,  # noqa: F401
                              write_text)  # (HOME_ENV: the run home's variable, read by users of this module)
from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR, load_drafter, load_target
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK
from dflash_jax.methods.dflash.training import DFlashTrainer, batch_for_step
from dflash_jax.training.trainer import TrainConfig, export_run
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.grow import start_difference
from dflash_jax.verification.adaptive import ADAPTIVE
from dflash_jax.datasets import default_data_dir
from dflash_jax.embedded import corpus
from dflash_jax.prompts import encode_prompt, humaneval_prompt
from dflash_jax.training.data import TokenDataset, read_prompt_file, regenerate
from dflash_jax.training.features import FeatureStore, write_features
from dflash_jax.training.run_dir import held_out_curve
from dflash_jax.bench import harness
from dflash_jax.bench.spec_speed import step_times
from dflash_jax.progress import Bar, progress
from dflash_jax.reporting import (command_line, cpu_description, cpu_info, cpu_model, environment, new_figure,
                                  portable_path)
from dflash_jax.bench.harness import responses
from dflash_jax.viz import plot_against_paper
from dflash_jax.experiments import paper_numbers as paper

PRESETS = ("smoke", "test", "cpu", "cpu-full", "gpu")
SMOKE_PRESETS = ("smoke", "test")  # their outputs say they are smoke runs (numbers that mean nothing)
PROMPT_SOURCES = ("shipped", "embedded-recipe", "embedded-styles")
# the five-style prompt list of the shipped drafter's later stages (docs/embedded-model.md):
# `embedded-prompts --num 40000 --seed 18`; a run takes its first prompts that fit
STYLES_POOL, STYLES_SEED = 40_000, 18
GRID_OF = {"cpu-full": "cpu", "test": "smoke"}  # a preset whose grids default to another's
FEATURE_DTYPE = "bfloat16"  # offline features are stored in it (--offline-features)
EMBEDDED = "embedded"  # --target embedded: the target shipped in the package
TABLE = "table.json"
GSM8K_TRAIN = os.path.join("gsm8k", "train.jsonl")
GSM8K_TRAIN_URL = ("https://raw.githubusercontent.com/openai/grade-school-math/master/"
                   "grade_school_math/data/train.jsonl")
MBPP_FILE = os.path.join("mbpp", "sanitized-mbpp.json")
# TrainConfig fields that do not change the trained drafter (resume is exact), or that the
# framework sets itself: not in the hash, not options
TRAIN_NOT_HASHED = ("checkpoint_every", "keep_checkpoints")
TRAIN_OWN = ("eval_every", "eval_max_new_tokens", "keep_checkpoints", "seed")
# settings added after cells were run, with their value in those runs: a value equal to it is
# left out of the hash, so the drafters and cells of earlier runs stay reusable
HASH_ADDED = {"drafter": {"conditioning": "kv"},
              "train": {"anchors": "random", "anchor_chunk": DEFAULT_ANCHOR_CHUNK,
                        "context_chunk": DEFAULT_CONTEXT_CHUNK},
              "evaluation": {"sampled_draft": False},
              "settings": {"offline_features": False, "curve_prompts": 0, "curve_every": 0,
                           "regen_temperature": 0.0, "init_from": None, "grow": False},
              # axes added to an experiment after its tables were written, at the value they had
              "axes": {"train_temperatures": [0.0]}}


def _hashed(part: str, values: dict) -> dict:
    added = HASH_ADDED[part]
    return {k: v for k, v in values.items() if not (k in added and v == added[k])}


# ---------------------------------------------------------------------------- where things go
def home() -> str:
    """The run home (:func:`dflash_jax.files.home`): every experiment's and the paper's default run
    directory and outputs lie under it (outside the checkout)."""
    return files_home()


def default_work() -> str:
    """The default run directory (``--work``): ``HOME/work`` (:func:`home`), shared by every
    experiment and the paper's items (a drafter or measurement one needs is another's too)."""
    return os.path.join(home(), "work")


def checkpoint_dir(name: str | None, kind: str = "target") -> str | None:
    """The directory a ``--target`` / ``--drafter`` value names: ``embedded`` is the model of
    that ``kind`` shipped in the package, a drafting method's shipped name (``embedded-eagle3``)
    its shipped drafter; anything else is a directory as given."""
    if name == EMBEDDED:
        return EMBEDDED_TARGET_DIR if kind == "target" else EMBEDDED_DRAFTER_DIR
    if kind == "drafter" and name is not None:
        from dflash_jax import methods

        shipped = methods.method_of_shipped_name(name)
        if shipped is not None:
            return shipped.shipped_dir()
    return name


def recorded_path(path: str | None, kind: str | None = None) -> str | None:
    """How a result file records a path setting: the shipped model of ``kind`` (``"target"``
    or ``"drafter"``) as ``embedded``, in this checkout or any other one (recognised by its
    place in the package, ``dflash_jax/assets/<kind>``); any other path as
    :func:`dflash_jax.reporting.portable_path` writes it (relative to the checkout, ``~/...``)."""
    if path is None or path == EMBEDDED:
        return path
    if kind is not None:
        norm = os.path.normpath(os.fspath(path))
        shipped = os.path.normpath(checkpoint_dir(EMBEDDED, kind))
        tail = os.path.join("dflash_jax", "assets", kind)
        if norm in (shipped, tail) or norm.endswith(os.sep + tail):
            return EMBEDDED
    return portable_path(path)


def comparable_identity(identity: dict | None) -> dict | None:
    """An output directory's identity as it is compared with another: by what decides the
    results, not by where the checkout or the data are. The target is written as
    :func:`recorded_path` writes it (so the committed tables of one checkout match a run in
    any other), a prompt file too, and ``data_dir`` (where GSM8K lies) is left out; training
    settings added since a table was written count at their old value as absent (``HASH_ADDED``)."""
    if not isinstance(identity, dict):
        return identity
    out = json.loads(json.dumps(identity))
    if isinstance(out.get("train"), dict):
        out["train"] = _hashed("train", out["train"])
    settings = out.get("settings")
    if isinstance(settings, dict):
        settings["target"] = recorded_path(settings.get("target"), "target")
        source = settings.get("prompt_source")
        if isinstance(source, str) and source.endswith(".jsonl"):
            settings["prompt_source"] = recorded_path(source)
        settings.pop("data_dir", None)
        out["settings"] = _hashed("settings", settings)
    if isinstance(out.get("axes"), dict):
        out["axes"] = _hashed("axes", out["axes"])
    return out


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run of an experiment depends on. Each field is an option of every
    experiment (``--field-name``); a preset gives every default.

    Attributes:
        target: Hugging Face target directory (with its tokenizer); 'embedded': the target
            shipped in the package
        dtype: dtype the target computes in (float32 on CPU, bfloat16 on a GPU)
        prompt_source: training prompts: 'shipped' (MBPP tasks outside its test split, shipped
            with the package, and documented standard-library functions as HumanEval-style
            prompts: needs nothing outside the repository), 'embedded-recipe' (the embedded
            drafter's mix: GSM8K train, MBPP non-test, stdlib functions; MBPP and the standard
            library ship, GSM8K train does not: DIR/gsm8k/train.jsonl in --data-dir,
            $DFLASH_DATA_DIR or $DFLASH_JAX_HOME/datasets), or a .jsonl prompt file (train-data's
            formats)
        data_dir: directory of the training datasets for 'embedded-recipe' (DIR/gsm8k/train.jsonl;
            DIR/mbpp/sanitized-mbpp.json when present, else the package's copy)
        num_prompts: training prompts (their responses are regenerated by the target)
        regen_max_new_tokens: response tokens per training prompt
        regen_max_len: training sequence length (prompt + response)
        regen_batch_size: prompts per batch when regenerating
        regen_temperature: temperature the target answers the training prompts at (0: its greedy
            answers, the paper's recipe; a grid may vary it)
        offline_features: train every drafter from the target's tapped features computed once
            per data and taps (stored in bfloat16: half a float32 cache, rounded once) instead
            of running the frozen target in every step; shared by every cell with those taps
        curve_prompts: training sequences held out (the data's last ones) whose prompts measure
            each drafter's held-out tau during training (0: none; the same for every cell)
        curve_every: measure the held-out tau every this many steps (0: no curve)
        init_from: a DFlash drafter every cell starts from instead of random weights
            ('embedded': the drafter shipped in the package, or a directory in the released
            layout; its layers, block size, taps and mask token must be the cell's): an
            ablation in the trained regime at a fine-tuning budget. With --steps 0 the cells
            measure that drafter as it is (no training data is made). A cell may train it at
            another block size (the weights do not depend on it)
        grow: with init_from, a cell of more layers than the starting drafter starts from it
            grown: new layers appended, copies of its last layer whose output and MLP down
            projections are zero, so that its drafts are unchanged at step 0
            (``dflash_jax.methods.dflash.grow``)
        layers: drafter layers (a grid may vary it)
        block_size: training block size (a grid may vary it)
        taps: target layer ids the drafter reads (default: docs/method.md section 2's formula)
        mask_token_id: the mask token (default: the tokenizer's)
        seed: the first training seed (weights, data order, anchors)
        seeds: seeds trained per cell (seed, seed+1, ...); the table reports their spread
        datasets: prompt sets of the evaluation
        max_samples: prompts per set
        max_new_tokens: tokens generated per evaluation prompt
        temperature: evaluation temperature (0: greedy)
        num_denoise_steps: drafter passes per draft
        subset: which prompts of a set (as ``bench --subset``)
        eval_block_size: inference block size (default: the training block size; a grid may
            vary it)
        eval_seed: seed of the prompt subset and of sampling
        timing_repeats: repeats of the draft / verify step timing (0: not timed)
    """

    target: str = EMBEDDED
    dtype: Literal["float32", "bfloat16"] | None = None
    prompt_source: str = "shipped"
    data_dir: str | None = None
    num_prompts: int = 64
    regen_max_new_tokens: int = 64
    regen_max_len: int = 256
    regen_batch_size: int = 16
    regen_temperature: float = 0.0
    offline_features: bool = False
    curve_prompts: int = 0
    curve_every: int = 0
    init_from: str | None = None
    grow: bool = False
    layers: int = 1
    block_size: int = 16
    taps: tuple[int, ...] | None = None
    mask_token_id: int | None = None
    seed: int = 0
    seeds: int = 1
    datasets: tuple[str, ...] = DATASETS
    max_samples: int = 8
    max_new_tokens: int = 128
    temperature: float = 0.0
    num_denoise_steps: int = 1
    subset: str = "random"
    eval_block_size: int | None = None
    eval_seed: int = 0
    timing_repeats: int = 5


def train_fields() -> list[dataclasses.Field]:
    """The TrainConfig fields that are experiment options (all but those the framework sets)."""
    return [f for f in dataclasses.fields(TrainConfig) if f.name not in TRAIN_OWN]


# the presets' values; fields not named keep Settings' / TrainConfig's defaults
BASE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(num_prompts=16, regen_max_new_tokens=24, regen_max_len=160, regen_batch_size=16,
                  steps=8, batch_size=4, num_anchors=8, learning_rate=1e-3, checkpoint_every=2,
                  datasets=("gsm8k",), max_samples=2, max_new_tokens=16, timing_repeats=2, taps=(1, 2, 3)),
    # the test suite's smoke run: smoke's grids (GRID_OF) and training budget on sequences of at
    # most 64 tokens (the shipped prompts that fit: one width for every step), evaluated on two
    # MBPP prompts (seed 1: 48 tokens at most) so that every cell of every grid runs at one
    # (prompt width, cache) shape, (48, 128) at inference blocks 4 to 16: the AR programs and
    # each drafter config's programs compile once for all of them (and for experiments.paper's
    # test preset, whose prompts have that shape too); one checkpoint, at the last step (the
    # suite's killed-cell test asks for one every 2 steps)
    "test": dict(num_prompts=16, regen_max_new_tokens=24, regen_max_len=64, regen_batch_size=16,
                 steps=8, batch_size=4, num_anchors=8, learning_rate=1e-3, checkpoint_every=8,
                 datasets=("mbpp",), max_samples=2, max_new_tokens=16, eval_seed=1, timing_repeats=1,
                 taps=(1, 2, 3)),
    "cpu": dict(prompt_source="embedded-recipe", num_prompts=1024, regen_max_new_tokens=128,
                regen_max_len=384, regen_batch_size=32, steps=400, batch_size=4, num_anchors=32,
                learning_rate=1e-3, checkpoint_every=50, max_samples=6, max_new_tokens=96,
                taps=(1, 2, 3)),
    # a budget at which the baseline drafter works (held-out tau >= 4): the shipped
    # drafter's five-style prompts answered by the target, 4000 steps of 8 sequences, offline
    # target features shared by every cell, the held-out tau curve every 500 steps
    "cpu-full": dict(prompt_source="embedded-styles", num_prompts=16384, regen_max_new_tokens=128,
                     regen_max_len=448, regen_batch_size=32, steps=4000, batch_size=8, num_anchors=32,
                     learning_rate=1e-3, checkpoint_every=100, max_samples=10, max_new_tokens=128,
                     taps=(1, 2, 3), offline_features=True, curve_prompts=16, curve_every=500),
    "gpu": dict(target=None, dtype="bfloat16", prompt_source=None, num_prompts=100_000,
                regen_max_new_tokens=2048, regen_max_len=3072, regen_batch_size=64, layers=5,
                steps=None, epochs=6, batch_size=32, num_anchors=512, checkpoint_every=1000,
                max_samples=128, max_new_tokens=2048, timing_repeats=20),
}


# ---------------------------------------------------------------------------- the grid
@dataclasses.dataclass(frozen=True)
class Cell:
    """One cell: ``label`` (the values the grid varies, for the table), the drafter-training
    setting (``drafter``: layers, block_size, taps, mask_token_id, conditioning; ``train``:
    TrainConfig fields) and the evaluation setting (``evaluation``)."""

    label: dict
    drafter: dict
    train: dict
    evaluation: dict
    data: dict = dataclasses.field(default_factory=dict)  # the training data's settings where a cell
    # has its own (regen_temperature); the run's otherwise

    @property
    def untrained(self) -> bool:
        """A ``steps 0`` cell: it measures the ``init_from`` drafter as it is (no data, no training)."""
        return self.train.get("steps") == 0


@dataclasses.dataclass(frozen=True)
class Experiment:
    """An ablation: its name, the values it varies (``axes``: option name -> per-preset
    default tuple), how the grid is built from the settings, and the paper's rows."""

    name: str
    description: str
    axes: dict[str, dict[str, tuple]]
    axis_help: dict[str, str]
    # (settings, train settings, axes) -> per cell {"label": {...}, and overrides: "drafter": {layers,
    # block_size, taps, conditioning}, "train": {TrainConfig fields}, "evaluation": {temperature,
    # num_denoise_steps, sampled_draft}, "eval_block_size": int}
    cells: Callable[[Settings, dict, dict], list[dict]]
    paper_rows: list[dict]
    paper_keys: list[str]
    plot: Callable[["Table"], Any]
    findings: Callable[["Table"], list[str]]
    # axis name -> the command-line type of one value (default: the axis's tuple[int, ...])
    axis_types: dict[str, Callable[[str], Any]] = dataclasses.field(default_factory=dict)
    # (work, cell) -> a dict saved with the cell's measurement as "extra" (None: nothing), for a
    # measurement of its own beside bench's (e.g. ablate_temperature's acceptance ceiling)
    measure: Callable[["Work", Cell], dict | None] | None = None
    # preset -> settings this experiment gives under it unless overridden (e.g. its --init-from)
    preset_settings: dict[str, dict] = dataclasses.field(default_factory=dict)


def stable_hash(obj: Any) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as canonical JSON."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def target_identity(path: str) -> dict:
    """What identifies a target independent of where it lies: its config.json's SHA-256 and
    the names and sizes of its weight files."""
    with open(os.path.join(path, "config.json"), "rb") as f:
        config = hashlib.sha256(f.read()).hexdigest()
    weights = sorted((n, os.path.getsize(os.path.join(path, n))) for n in os.listdir(path)
                     if n.endswith(".safetensors"))
    return {"config_sha256": config, "weights": weights}


# ---------------------------------------------------------------------------- settings
def preset_values(experiment: Experiment, preset: str) -> dict:
    """Every option's value under ``preset`` (Settings, TrainConfig fields and the axes)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    values = {f.name: f.default for f in dataclasses.fields(Settings)}
    values |= {f.name: f.default for f in train_fields()}
    values |= BASE_PRESETS[preset]
    values |= experiment.preset_settings.get(preset, experiment.preset_settings.get(GRID_OF.get(preset, preset), {}))
    # an axis without its own cpu-full grid has the cpu preset's (the same cells, a larger budget)
    values |= {name: tuple(per[preset] if preset in per else per[GRID_OF.get(preset, preset)])
               for name, per in experiment.axes.items()}
    return values


def option_names(experiment: Experiment) -> list[str]:
    return ([f.name for f in dataclasses.fields(Settings)] + [f.name for f in train_fields()]
            + list(experiment.axes))


def resolve(experiment: Experiment, preset: str, overrides: dict) -> tuple[Settings, dict, dict]:
    """(Settings, TrainConfig values, axes) of ``preset`` with ``overrides``; an unknown name is
    an error listing the options."""
    values = preset_values(experiment, preset)
    unknown = [k for k in overrides if k not in values]
    if unknown:
        raise ValueError(f"{experiment.name} has no setting {unknown[0]!r}; the settings are: "
                         + ", ".join(option_names(experiment)))
    values |= dict(overrides)
    # the run's length is steps or epochs: the one given replaces the preset's other
    if "steps" in overrides and "epochs" not in overrides:
        values["epochs"] = None
    if "epochs" in overrides and "steps" not in overrides:
        values["steps"] = None
    for k in ("taps", "datasets") + tuple(experiment.axes):
        if values.get(k) is not None and not isinstance(values[k], (str, bytes)):
            values[k] = tuple(values[k])
    settings = Settings(**{f.name: values[f.name] for f in dataclasses.fields(Settings)})
    train = {f.name: values[f.name] for f in train_fields()}
    axes = {k: values[k] for k in experiment.axes}
    return settings, train, axes


def check_prompt_sets(datasets, subset: str) -> None:
    """Raises ValueError unless ``datasets`` names at least one known prompt set and ``subset``
    is a known subset."""
    bad = [d for d in datasets if d not in DATASETS]
    if bad or not datasets:
        raise ValueError(f"unknown prompt set {bad[0] if bad else '(none given)'}; choose from {', '.join(DATASETS)}")
    if subset not in SUBSETS:
        raise ValueError(f"unknown subset {subset!r}; choose from {', '.join(SUBSETS)}")


def check_settings(experiment: Experiment, settings: Settings, train: dict, axes: dict, target_config) -> list[Cell]:
    """The grid's cells, every one checked as the trainer and the evaluation would check it,
    before anything runs. Raises ValueError naming the setting."""
    s = settings
    if s.prompt_source not in PROMPT_SOURCES and not s.prompt_source.endswith(".jsonl"):
        raise ValueError(f"prompt_source must be one of {', '.join(PROMPT_SOURCES)} or a .jsonl prompt "
                         f"file, got {s.prompt_source!r}")
    if s.prompt_source.endswith(".jsonl") and not os.path.isfile(s.prompt_source):
        raise FileNotFoundError(f"prompt file {s.prompt_source!r} does not exist")
    for name in ("num_prompts", "regen_max_new_tokens", "regen_max_len", "regen_batch_size", "seeds",
                 "max_samples", "max_new_tokens", "num_denoise_steps"):
        if getattr(s, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(s, name)} ({flag(name)})")
    if s.timing_repeats < 0:
        raise ValueError(f"timing_repeats must be >= 0, got {s.timing_repeats}")
    for name in ("curve_prompts", "curve_every"):
        if getattr(s, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(s, name)} ({flag(name)})")
    if s.curve_every and not s.curve_prompts:
        raise ValueError(f"curve_every {s.curve_every} needs held-out prompts to measure tau on: give "
                         "--curve-prompts N (e.g. 16), or --curve-every 0 for no curve")
    if s.curve_prompts >= s.num_prompts:
        raise ValueError(f"curve_prompts {s.curve_prompts} must be fewer than num_prompts {s.num_prompts}: the "
                         "held-out prompts are taken from the training data (its last sequences)")
    check_prompt_sets(s.datasets, s.subset)
    if s.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {s.temperature}")
    if s.regen_temperature < 0:
        raise ValueError(f"regen_temperature must be >= 0, got {s.regen_temperature}")
    if s.grow and s.init_from is None:
        raise ValueError("--grow adds layers to a trained drafter: give --init-from DRAFTER too")
    start = init_config(s.init_from)
    cells = []
    for seed in range(s.seed, s.seed + s.seeds):
        for spec in experiment.cells(s, train, axes):
            d = {"layers": s.layers, "block_size": s.block_size, "taps": s.taps,
                 "mask_token_id": s.mask_token_id, "conditioning": "kv"} | spec.get("drafter", {})
            unknown_drafter = set(d) - {"layers", "block_size", "taps", "mask_token_id", "conditioning",
                                        "source", *METHOD_FIELDS}
            if unknown_drafter:
                raise ValueError(f"{experiment.name}: cell {spec['label']} has unknown drafter entries "
                                 f"{sorted(unknown_drafter)}")
            unknown = set(spec) - {"label", "drafter", "train", "evaluation", "eval_block_size", "data"}
            unknown |= set(spec.get("data", {})) - {"regen_temperature"}
            unknown |= set(spec.get("evaluation", {})) - {"temperature", "num_denoise_steps", "sampled_draft"}
            if unknown:
                raise ValueError(f"{experiment.name}: cell {spec['label']} has unknown entries {sorted(unknown)}")
            if d.get("source") is not None:  # a drafter of any method, measured as it is
                cells.append(source_cell(experiment, s, spec, d["source"], train, seed))
                continue
            method_fields = check_method_fields(spec["label"], d, s)
            ev_bs = spec.get("eval_block_size", s.eval_block_size) or d["block_size"]
            if isinstance(ev_bs, str) and ev_bs != ADAPTIVE:
                raise ValueError(f"inference block size {ev_bs!r} of cell {spec['label']}: give an integer "
                                 f">= 2 or {ADAPTIVE!r} (the verify length chosen per iteration)")
            sizes = [("training block size", d["block_size"])]
            sizes += [] if ev_bs == ADAPTIVE else [("inference block size", ev_bs)]
            for what, bs in sizes:
                if bs < 2:
                    raise ValueError(f"{what} {bs} of cell {spec['label']}: a block needs the anchor and at "
                                     "least one draft position (block size >= 2; block size 1 is "
                                     "autoregressive decoding, the baseline every cell is measured against)")
            if not 1 <= d["layers"] <= target_config.num_layers:
                raise ValueError(f"cell {spec['label']} asks for a {d['layers']}-layer drafter; this framework "
                                 f"trains 1..{target_config.num_layers} layers for a {target_config.num_layers}-layer "
                                 "target (a drafter is a fraction of its target)")
            if d["mask_token_id"] is None:
                raise ValueError("the target's tokenizer has no mask token: pass --mask-token-id")
            cfg = DrafterConfig.for_target(target_config, d["layers"], d["block_size"], d["mask_token_id"],
                                           tuple(d["taps"]) if d["taps"] else None, conditioning=d["conditioning"])
            cfg.check_target(target_config)
            why = None if start is None else start_difference(start, cfg, s.grow)
            if why is not None:
                raise ValueError(f"--init-from {s.init_from} holds another drafter than cell {spec['label']} "
                                 f"trains: {why}; give the cell's settings of that drafter (--layers, --taps, "
                                 "--mask-token-id; more --layers with --grow) or another --init-from")
            tr = train | spec.get("train", {}) | {"seed": seed}
            if tr.get("steps") == 0:  # the starting drafter measured as it is
                if start is None:
                    raise ValueError("steps 0 trains nothing: give --init-from DRAFTER to measure that drafter as "
                                     "it is, or --steps N >= 1")
                if start != cfg:
                    raise ValueError(f"cell {spec['label']} trains nothing (steps 0): it measures the starting "
                                     f"drafter as it is, so its settings must be that drafter's ({start.num_layers} "
                                     f"layer(s), trained at block {start.block_size}; the inference block is "
                                     "--eval-block-size's), or give --steps N >= 1")
            else:
                TrainConfig(**tr)  # its own checks
            ev = cell_evaluation(s, spec, ev_bs, s.num_denoise_steps)
            if ev["temperature"] < 0:
                raise ValueError(f"cell {spec['label']}: temperature must be >= 0, got {ev['temperature']}")
            if ev["num_denoise_steps"] < 1:
                raise ValueError(f"cell {spec['label']}: num_denoise_steps must be >= 1, got {ev['num_denoise_steps']}")
            if ev["sampled_draft"] and ev["num_denoise_steps"] > 1:
                raise ValueError(f"cell {spec['label']}: sampled drafts support num_denoise_steps 1 only")
            drafter = {"layers": d["layers"], "block_size": d["block_size"],
                       "taps": list(cfg.target_layer_ids), "mask_token_id": d["mask_token_id"],
                       "conditioning": d["conditioning"]} | method_fields
            data = dict(spec.get("data", {}))
            if data.get("regen_temperature", 0.0) < 0:
                raise ValueError(f"cell {spec['label']}: regen_temperature must be >= 0, got {data['regen_temperature']}")
            cells.append(Cell(label=dict(spec["label"]) | {"seed": seed}, drafter=drafter, train=tr, evaluation=ev,
                              data=data))
    return cells


def cell_evaluation(s, spec: dict, block_size, num_denoise_steps: int) -> dict:
    """A cell's evaluation settings: the run's (prompt sets, samples, new tokens, temperature,
    subset, seed; greedy drafts) at ``block_size`` and ``num_denoise_steps``, with the cell's own
    ``evaluation`` entries over them."""
    return {"datasets": list(s.datasets), "max_samples": s.max_samples, "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature, "num_denoise_steps": num_denoise_steps, "subset": s.subset,
            "block_size": block_size, "seed": s.eval_seed, "sampled_draft": False} | spec.get("evaluation", {})


def source_cell(experiment, s, spec: dict, source: str, train: dict, seed: int) -> "Cell":
    """A cell measuring the drafter ``source`` (a directory or a shipped name, of any drafting
    method: e.g. ``embedded-eagle3``) as it is, beside the cells that train: it trains nothing
    (its ``train`` must say steps 0) and is evaluated at its ``eval_block_size``."""
    path = checkpoint_dir(source, "drafter")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"cell {spec['label']}: source drafter {source!r}: no drafter there "
                                f"(a directory with config.json and model.safetensors, or a shipped name)")
    tr = train | spec.get("train", {}) | {"seed": seed}
    if tr.get("steps") != 0:
        raise ValueError(f"cell {spec['label']}: a source drafter is measured as it is: its train needs steps 0")
    bs = spec.get("eval_block_size")
    if not isinstance(bs, int) or bs < 2:
        raise ValueError(f"cell {spec['label']}: a source drafter needs its eval_block_size (an integer >= 2)")
    ev = cell_evaluation(s, spec, bs, 1)
    return Cell(label=dict(spec["label"]) | {"seed": seed}, drafter={"source": source}, train=tr, evaluation=ev,
                data={})


METHOD_FIELDS = ("method", "loss", "dpace_alpha", "markov_rank")
"""A cell's drafter entries beyond DFlash's, each only where set (the drafters of earlier runs
keep their keys): the drafting method trained ("dflash", the default; "dspark": a DSpark
drafter on the cell's DFlash backbone, its block one row shorter so that the verify width is the
cell's block size; "domino": a Domino drafter on it with DFlash's rows, ``methods.domino.handle.
start_fields``), DFlash's loss ("dflash" or a D-PACE weighting) with ``dpace_alpha``, and
DSpark's ``markov_rank`` (default: 256, at most the vocabulary)."""


def check_method_fields(label, d: dict, settings) -> dict:
    """The cell's :data:`METHOD_FIELDS` that differ from the defaults, checked."""
    from dflash_jax.methods.dflash.loss import check_loss_type

    out = {}
    method = d.get("method", "dflash")
    if method not in ("dflash", "dspark", "domino"):
        raise ValueError(f"cell {label}: method {method!r} does not train in the experiments; they train "
                         "dflash, dspark and domino drafters")
    if method != "dflash":
        out["method"] = method
    loss = d.get("loss", "dflash")
    check_loss_type(loss, float(d.get("dpace_alpha", 0.5)))
    if loss != "dflash":
        if method != "dflash":
            raise ValueError(f"cell {label}: loss {loss!r} is DFlash's (D-PACE); a {method} drafter has its own")
        out |= {"loss": loss, "dpace_alpha": float(d.get("dpace_alpha", 0.5))}
    if method == "domino" and (settings.offline_features or d["conditioning"] != "kv"):
        raise ValueError(f"cell {label}: a Domino drafter is conditioned by kv injection and trains with online "
                         "target features; drop --offline-features")
    if method == "dspark":
        if settings.offline_features:
            raise ValueError(f"cell {label}: DSpark trains with online target features (its loss reads the "
                             "target's distributions); drop --offline-features")
        if d["conditioning"] != "kv" or d["block_size"] < 3:
            raise ValueError(f"cell {label}: a DSpark drafter is conditioned by kv injection and needs a block "
                             "of at least 3 (two drafter rows)")
        if "markov_rank" in d:
            if int(d["markov_rank"]) < 1:
                raise ValueError(f"cell {label}: markov_rank must be >= 1, got {d['markov_rank']}")
            out["markov_rank"] = int(d["markov_rank"])
    return out


def init_config(init_from: str | None) -> DrafterConfig | None:
    """The config of the ``init_from`` drafter (None without one); a clear error when it is
    missing or not a DFlash drafter."""
    if init_from is None:
        return None
    path = checkpoint_dir(init_from, "drafter")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"--init-from {init_from!r}: no drafter there (a directory with config.json and "
                                "model.safetensors in the released layout, or 'embedded')")
    return DrafterConfig.from_pretrained(path)


@functools.lru_cache(maxsize=None)  # every key of every cell asks; the weights are hashed once per run
def drafter_identity(init_from: str) -> dict:
    """What keys a drafter started from ``init_from``: the starting weights' content (the
    shipped drafter as ``embedded``), not where they lie."""
    from dflash_jax import methods

    path = checkpoint_dir(init_from, "drafter")
    shipped = init_from != EMBEDDED and methods.method_of_shipped_name(init_from) is not None
    return {"init_from": init_from if shipped else recorded_path(path, "drafter"),
            "sha256": "".join(_file_hash(os.path.join(path, n))[:16] for n in ("config.json", "model.safetensors"))}


# ---------------------------------------------------------------------------- entries of the run directory
MADE_FORMAT = "%Y-%m-%d %H:%M:%S"  # the local time an entry records as its "finished"


def made_now() -> str:
    """Now, as an entry of the run directory records when it was finished (its ``finished``)."""
    return time.strftime(MADE_FORMAT)


def lock_of(path: str) -> str:
    """The lock file of the run-directory entry ``path`` (a file or a directory): beside it and
    hidden, ``drafters/.<hash>.lock``, ``cells/<hash>/.cell.json.lock``, so that it outlives the
    entry's replacement and no listing of the entries' names matches it."""
    head, name = os.path.split(os.path.abspath(path).rstrip(os.sep))
    return os.path.join(head, f".{name}.lock")


def brief(values: dict, keys: Sequence[str]) -> str:
    """``key=value`` of ``keys`` in ``values`` (those present and not None), lists joined by commas."""
    def show(v):
        return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return " ".join(f"{k}={show(values[k])}" for k in keys if values.get(k) is not None)


def _state(path: str):
    """What tells two versions of the file ``path`` apart (None: no file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _finished_at(done: str, stamp: str) -> tuple[str, bool]:
    """When an entry was finished: the ``finished`` its JSON file ``stamp`` records, else the
    modification time of its ``done`` file; and whether it was recorded."""
    try:
        with open(stamp) as f:
            value = json.load(f).get("finished")
        if isinstance(value, str) and value:
            return value, True
    except (OSError, ValueError, AttributeError):
        pass
    return time.strftime(MADE_FORMAT, time.localtime(os.path.getmtime(done))), False


def _plural(kind: str, n: int) -> str:
    noun = {"data": "data set", "features": "feature store"}.get(kind, kind)
    return noun if n == 1 else noun + "s"


class WorkLog:
    """What one invocation reuses from its run directory (``--work``) and what it makes there.

    Every finished entry it reuses (data, features, drafter, cell, measurement) is said once, on
    stderr above the progress bars: its kind, where it is (relative to the run directory), the
    settings that define it in brief and the file holding them all, and when it was finished (as
    recorded, or else its file's modification time, said to be that). Past :attr:`SHOWN` entries
    of a kind they are only counted (``verbose``: each said); :meth:`summary` gives one line per
    kind at the end of the run. ``fresh``: an entry finished before this invocation asked for it
    is recomputed instead (what it made itself, or what another process finished while it waited
    for the entry, is reused)."""

    SHOWN = 4

    def __init__(self, root: str, fresh: bool = False, verbose: bool = False):
        self.root = os.path.abspath(root)
        self.fresh, self.verbose = bool(fresh), bool(verbose)
        self.made: set[str] = set()  # entries this invocation computed
        self.reused: dict[str, list[str]] = {}  # kind -> when each entry reused was finished
        self._said: set[str] = set()

    @staticmethod
    def say(text: str) -> None:
        Bar.write(text)  # stderr, above any progress bar

    def where(self, path: str) -> str:
        rel = os.path.relpath(os.path.abspath(path), self.root)
        return os.path.abspath(path) if rel.startswith("..") else rel

    def reuse(self, kind: str, path: str, finished: tuple[str, bool], about: str, settings: str | None = None,
              waited: bool = False) -> None:
        """Says (once per entry) that the entry ``path`` of ``kind`` is reused."""
        path = os.path.abspath(path)
        if path in self.made or path in self._said:
            return
        self._said.add(path)
        stamps = self.reused.setdefault(kind, [])
        stamps.append(finished[0])
        if self.verbose or len(stamps) <= self.SHOWN:
            when = finished[0] + ("" if finished[1] else " (the file's time: no time recorded)")
            held = None if not settings else "recorded in it" if os.path.abspath(settings) == path else self.where(settings)
            self.say(f"reused {kind} {self.where(path)}" + (f" ({about})" if about else "") + f": finished {when}"
                     + (", by another process while this one waited" if waited else "")
                     + (f"; settings {held}" if held else ""))
        elif len(stamps) == self.SHOWN + 1:
            self.say(f"reusing more {_plural(kind, 2)}: counted in the summary at the end (verbose: each named)")

    def summary(self) -> str | None:
        """One line: what was reused, per kind, finished when (None when nothing was)."""
        if not self.reused:
            return None

        def span(stamps):
            a, b = min(stamps), max(stamps)
            return a if a == b else f"{a} to {b[11:] if b[:10] == a[:10] else b}"

        parts = [f"{len(s)} {_plural(kind, len(s))} (finished {span(s)})" for kind, s in self.reused.items()]
        return f"reused from {self.root}: " + ", ".join(parts) + "; --fresh recomputes them"


def work_entry(log: WorkLog, kind: str, path: str, make: Callable[[str], Any], *, done: str | None = None,
               finished: Callable[[str], bool] = os.path.isfile, about: str = "", settings: str | None = None,
               stamp: str | None = None, fresh: bool | None = None) -> bool:
    """Reuses the finished entry ``path`` of the run directory, or makes it with ``make(dest)``;
    returns whether it was reused.

    ``path`` is a file (``done`` None), or a directory whose file ``done`` says whether it is
    finished (``finished(file)``; default: that it exists). A finished entry is reused and said
    (:meth:`WorkLog.reuse`; ``about``: its settings in brief; ``settings``: the file holding them
    all; ``stamp``: the JSON file whose ``finished`` says when, default the ``done`` file). Else
    the entry's lock (:func:`lock_of`) is taken, waiting with one line naming the entry and the
    process holding it, and the entry is looked at again: another process may have finished it
    meanwhile, and then it is reused. Else ``make(dest)`` writes it: ``dest`` is ``path`` itself
    (a killed computation resumes there), except when ``fresh`` (default ``log.fresh``) replaces
    an existing directory: then a temporary beside it, renamed over the old entry when ``make``
    returns (:func:`dflash_jax.files.atomic_path`), so that a reader finds the old entry or the
    new one, never a part, and a killed recomputation leaves the old one. A file entry's
    ``make`` writes the file atomically itself (``write_json``)."""
    path = os.path.abspath(path)
    fresh = log.fresh if fresh is None else fresh
    done_path = os.path.join(path, done) if done else path
    stamp = os.path.join(path, stamp) if stamp else done_path
    if path in log.made:
        return True
    if not fresh and finished(done_path):
        log.reuse(kind, path, _finished_at(done_path, stamp), about, settings)
        return True
    before = _state(done_path)
    lock = lock_of(path)
    waited = []

    def waiting():
        waited.append(True)
        pid = lock_holder(lock)
        log.say(f"waiting for {kind} {log.where(path)}" + (f" ({about})" if about else "") + ": "
                + (f"process {pid}" if pid else "another process") + f" holds its lock {log.where(lock)} "
                "and is computing it; it is reused when finished")

    with exclusive(lock, waiting):
        if finished(done_path) and (not fresh or _state(done_path) != before):
            log.reuse(kind, path, _finished_at(done_path, stamp), about, settings, waited=bool(waited))
            return True
        if fresh and done is not None and os.path.exists(path):
            with atomic_path(path) as tmp:
                os.makedirs(tmp)
                make(tmp)
        else:
            make(path)
    log.made.add(path)
    return False


# ---------------------------------------------------------------------------- the run directory
class Work:
    """The run directory (``--work``): data, drafters and cells, each keyed by a hash; ``log``
    says what is reused (:class:`WorkLog`; default: one of its own, reusing what is finished)."""

    def __init__(self, root: str, settings: Settings, target, log: WorkLog | None = None):
        self.root = os.path.abspath(root)
        self.settings, self.target = settings, target
        self.target_id = target_identity(checkpoint_dir(settings.target))
        self.log = log if log is not None else WorkLog(self.root)

    def regen_temperature(self, cell: Cell | None = None) -> float:
        """The temperature the target answers ``cell``'s training prompts at (the cell's own, or the run's)."""
        return float((cell.data if cell is not None else {}).get("regen_temperature", self.settings.regen_temperature))

    def data_key(self, cell: Cell | None = None) -> dict:
        s = self.settings
        source = s.prompt_source if not s.prompt_source.endswith(".jsonl") else _file_hash(s.prompt_source)
        key = {"target": self.target_id, "prompt_source": source, "num_prompts": s.num_prompts,
               "max_new_tokens": s.regen_max_new_tokens, "max_len": s.regen_max_len, "dtype": s.dtype}
        if self.regen_temperature(cell):  # only where set: the greedy data keep their key
            key["temperature"] = self.regen_temperature(cell)
        return key

    def drafter_key(self, cell: Cell) -> dict:
        train = {k: v for k, v in cell.train.items() if k not in TRAIN_NOT_HASHED}
        key = {"data": self.data_key(cell), "drafter": _hashed("drafter", cell.drafter), "train": _hashed("train", train)}
        # what changes the trained drafter beyond these, only where set (earlier keys unchanged):
        # bfloat16-rounded offline features, and fewer training sequences (the held-out ones)
        if self.settings.offline_features:
            key["features"] = FEATURE_DTYPE
        if self.settings.curve_prompts:
            key["held_out"] = self.settings.curve_prompts
            if self.settings.curve_every:  # the run record holds it: a resume must keep it
                key["curve_every"] = self.settings.curve_every
        if "source" in cell.drafter:  # a drafter measured as it is: its files alone decide it
            return {"source": drafter_identity(cell.drafter["source"]), "steps": 0}
        if self.settings.init_from is not None:
            key["init_from"] = drafter_identity(self.settings.init_from)
            if self.grows(cell):
                key["grown"] = True  # (a cell of the start's own depth is the same fine-tune either way)
            if cell.untrained:  # no training: the starting drafter alone decides it
                key = {"drafter": key["drafter"], "init_from": key["init_from"], "steps": 0}
        return key

    def grows(self, cell: Cell) -> bool:
        """Whether ``cell``'s drafter starts from the ``init_from`` drafter grown (``--grow`` and
        more layers than it has)."""
        s = self.settings
        return s.grow and s.init_from is not None and cell.drafter["layers"] > init_config(s.init_from).num_layers

    def cell_key(self, cell: Cell) -> dict:
        return {"drafter": self.drafter_key(cell), "evaluation": _hashed("evaluation", cell.evaluation),
                "dtype": self.settings.dtype}

    def data_dir(self, cell: Cell | None = None) -> str:
        return os.path.join(self.root, "data", stable_hash(self.data_key(cell)))

    def features_dir(self, taps, cell: Cell | None = None) -> str:
        return os.path.join(self.root, "features", stable_hash({"data": self.data_key(cell), "taps": list(taps),
                                                                "dtype": FEATURE_DTYPE}))

    def drafter_dir(self, cell: Cell) -> str:
        return os.path.join(self.root, "drafters", stable_hash(self.drafter_key(cell)))

    def cell_dir(self, cell: Cell) -> str:
        return os.path.join(self.root, "cells", stable_hash(self.cell_key(cell)))


def _file_hash(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def training_prompts(settings: Settings, tokenizer) -> list:
    """The first ``num_prompts`` prompts of ``prompt_source`` (see :class:`Settings`) whose
    response fits: rendered with the chat template, at most ``regen_max_len -
    regen_max_new_tokens`` tokens (longer ones are skipped, in order)."""
    s = settings
    if s.prompt_source == "embedded-styles":
        pool = styles_pool(s)
    elif s.prompt_source == "embedded-recipe":
        # the three styles the committed cells were trained on (the five-style mix of issue 18
        # is the embedded drafter's; since then the humaneval pool also holds class methods
        # and MBPP task 569, a copy of test task 104, is left out); the corpus reads both files
        # from one directory: links to where each one is
        with recipe_dir(s) as data_dir:
            pool = corpus.training_prompts(data_dir, 2 * s.num_prompts, seed=0,
                                           styles=("gsm8k", "mbpp", "humaneval"))
    elif s.prompt_source == "shipped":
        pools = [[u for u, _ in corpus.mbpp_train(shipped_data_dir())],
                 [humaneval_prompt(h) for h, _ in corpus.function_examples(corpus.stdlib_files())]]
        rng = np.random.default_rng(0)
        pool = [p for pair in zip(*[[pool[i] for i in rng.permutation(len(pool))] for pool in pools]) for p in pair]
    else:
        pool = read_prompt_file(s.prompt_source)
    limit = s.regen_max_len - s.regen_max_new_tokens
    fits = [p for p in pool if len(encode_prompt(p, tokenizer)) <= limit][:s.num_prompts]
    if len(fits) < s.num_prompts:
        raise ValueError(f"prompt_source {s.prompt_source!r} gives {len(fits)} prompts of at most {limit} tokens "
                         f"(regen_max_len - regen_max_new_tokens), fewer than num_prompts {s.num_prompts}: lower "
                         "--num-prompts, raise --regen-max-len or use another --prompt-source")
    return fits


def styles_pool(settings: Settings) -> list:
    """The 'embedded-styles' prompts in order: the shipped drafter's five-style list (GSM8K
    train, synthetic competition math, stdlib functions and methods as HumanEval tasks, MBPP
    non-test, synthetic chat; ``embedded-prompts --num 40000 --seed 18``), made from the same
    files as 'embedded-recipe' (:func:`recipe_files`)."""
    with recipe_dir(settings) as data_dir:
        return corpus.training_prompts(data_dir, STYLES_POOL, seed=STYLES_SEED)


@contextlib.contextmanager
def recipe_dir(settings: Settings):
    """A temporary directory holding the recipe's two data files (:func:`recipe_files`) as the
    corpus reads them (``gsm8k/train.jsonl``, ``mbpp/sanitized-mbpp.json``), by link."""
    with tempfile.TemporaryDirectory(prefix="dflash-recipe-") as data_dir:
        for rel, path in recipe_files(settings).items():
            os.makedirs(os.path.dirname(os.path.join(data_dir, rel)), exist_ok=True)
            _link(os.path.abspath(path), os.path.join(data_dir, rel))
        yield data_dir


def _link(src: str, dst: str) -> None:
    """``dst`` names the file ``src``: a symbolic link, or a copy where links are not allowed."""
    try:
        os.symlink(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _data_complete(meta: str) -> bool:
    try:
        with open(meta) as f:
            return bool(json.load(f).get("complete"))
    except (OSError, ValueError):
        return False


def prepare_data(work: Work, bar_write=print, cell: Cell | None = None) -> str:
    """The regenerated training data of ``cell`` (default: the run's; made once, reused by every
    cell and experiment with the same data settings; a second process asking for the same data
    waits for the first; :func:`work_entry`)."""
    out = work.data_dir(cell)
    about = brief(work.data_key(cell), ("prompt_source", "num_prompts", "max_new_tokens", "max_len", "temperature"))
    work_entry(work.log, "data", out, lambda dest: _regenerate(work, dest, bar_write, cell, shown=out),
               done="metadata.json", finished=_data_complete, about=about, settings=os.path.join(out, "key.json"),
               stamp="key.json")
    return out


def _regenerate(work: Work, out: str, bar_write, cell: Cell | None = None, shown: str | None = None) -> None:

    s = work.settings
    t = work.regen_temperature(cell)
    bar_write(f"regenerating the training data: {s.num_prompts} prompts answered by the target"
              + (f" at temperature {t:g}" if t else "") + f" -> {shown or out}")
    regenerate(work.target, training_prompts(s, work.target.tokenizer), out, max_new_tokens=s.regen_max_new_tokens,
               max_len=s.regen_max_len, batch_size=s.regen_batch_size, shard_size=max(256, s.regen_batch_size),
               source=f"experiments prompt_source={s.prompt_source}", temperature=t)
    # the key, and when the data were finished (not part of the key)
    write_json(os.path.join(out, "key.json"), work.data_key(cell) | {"finished": made_now()})


def drafter_about(work: Work, cell: Cell) -> str:
    """The settings that define the cell's drafter, in brief (the whole key is its key.json)."""
    d, t = cell.drafter, cell.train
    if "source" in d:
        return f"source={d['source']}"
    shown = {k: v for k, v in d.items() if not (k == "method" and v == "dflash" or k == "conditioning" and v == "kv")}
    out = brief(shown, ("method", "layers", "block_size", "taps", "conditioning", "loss")) + " " + brief(
        t, ("steps", "batch_size", "num_anchors", "learning_rate", "anchors", "seed"))
    if work.regen_temperature(cell):
        out += f" data_temperature={work.regen_temperature(cell):g}"
    if work.settings.init_from is not None:
        out += f" init_from={recorded_path(work.settings.init_from, 'drafter')}"
    return out


def train_drafter(work: Work, cell: Cell, data_dir: str) -> dict:
    """Trains (or resumes, or reuses) the cell's drafter; returns its train.json record. A
    second process asking for the same drafter (two experiments sharing ``--work``) waits for the
    first and reuses it (:func:`work_entry`)."""
    root = work.drafter_dir(cell)
    record_path = os.path.join(root, "train.json")

    def make(dest):
        if cell.untrained:
            _starting_drafter(work, cell, dest, os.path.join(dest, "train.json"))
        else:
            _train_drafter(work, cell, data_dir, dest, os.path.join(dest, "train.json"))

    work_entry(work.log, "drafter", root, make, done="train.json", about=drafter_about(work, cell),
               settings=os.path.join(root, "key.json"))
    with open(record_path) as f:
        record = json.load(f)
    if "blocks_seen" not in record:  # records written before it was counted: counted now, not saved
        try:
            record["blocks_seen"] = blocks_seen(cell, data_dir, record["steps"], work.settings.curve_prompts)
        except FileNotFoundError:  # the data was removed since: the count is unknown
            record["blocks_seen"] = None
    return record


def _starting_drafter(work: Work, cell: Cell, root: str, record_path: str) -> None:
    """A ``steps 0`` cell's drafter: its ``source`` drafter, or else the ``init_from`` one,
    copied in (it is small)."""
    if os.path.exists(record_path):
        return
    os.makedirs(root, exist_ok=True)
    write_json(os.path.join(root, "key.json"), work.drafter_key(cell))
    start = cell.drafter.get("source", work.settings.init_from)
    src, drafter_dir = checkpoint_dir(start, "drafter"), os.path.join(root, "drafter")
    if not os.path.isdir(drafter_dir):
        tmp = drafter_dir + f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(src, name), os.path.join(tmp, name))
        os.replace(tmp, drafter_dir)
    params = load_drafter(drafter_dir, work.target, dtype=work.target.dtype).params
    write_json(record_path, {"steps": 0, "sequences_per_step": 0, "anchors_per_sequence": 0, "blocks": 0,
                             "blocks_seen": 0, "tokens": 0, "minutes": 0.0, "final_loss": None,
                             "final_accuracy_per_pos": None, "training_sequences": 0,
                             "drafter_params": _count(params), "curve": [], "held_out_prompts": 0,
                             "offline_features": None, "init_from": drafter_identity(start),
                             "finished": made_now()})


def blocks_seen(cell: Cell, data_dir: str, steps: int, held_out: int = 0) -> int:
    """The training blocks the cell's drafter really saw: valid anchors summed over its steps
    (``blocks`` is the budget, steps x sequences x anchors; fixed anchors, or sequences with
    fewer valid anchors than ``num_anchors``, give fewer); ``held_out``: the data's last
    sequences kept out of training (``curve_prompts``)."""
    data, cfg = TokenDataset(data_dir), TrainConfig(**cell.train)
    if held_out:
        data.hold_out(held_out)
    return int(sum(batch_for_step(s, data, cfg, cell.drafter["block_size"])[2].sum() for s in range(steps)))


def _train_drafter(work: Work, cell: Cell, data_dir: str, root: str, record_path: str) -> None:
    import jax.numpy as jnp


    if os.path.exists(record_path):  # finished while we waited
        return
    os.makedirs(root, exist_ok=True)
    write_json(os.path.join(root, "key.json"), work.drafter_key(cell))
    d = cell.drafter
    dcfg = DrafterConfig.for_target(work.target.config, d["layers"], d["block_size"], d["mask_token_id"],
                                    tuple(d["taps"]), conditioning=d.get("conditioning", "kv"))
    data = TokenDataset(data_dir)
    s = work.settings
    held_out = data.hold_out(s.curve_prompts) if s.curve_prompts else None
    features = None
    if s.offline_features and d.get("conditioning", "kv") != "none":
        features = FeatureStore(prepare_features(work, data_dir, dcfg.target_layer_ids, cell), dcfg.target_layer_ids)
        if held_out:
            features.hold_out(s.curve_prompts)
    cfg = TrainConfig(**cell.train, eval_every=s.curve_every if held_out else 0)
    init_from = checkpoint_dir(s.init_from, "drafter") if s.init_from else None
    if d.get("method", "dflash") == "dspark":  # on the cell's DFlash backbone, one row shorter
        from dflash_jax.methods.dspark.config import DSparkConfig
        from dflash_jax.methods.dspark.training import DSparkTrainer

        rank = d.get("markov_rank", min(256, work.target.config.vocab_size))
        dcfg = DSparkConfig.from_backbone(dataclasses.replace(dcfg, block_size=dcfg.block_size - 1),
                                          markov_rank=rank)
        trainer = DSparkTrainer(work.target, dcfg, data, os.path.join(root, "run"), cfg, held_out,
                                init_from=init_from)
    elif d.get("method", "dflash") == "domino":  # on the cell's DFlash backbone, DFlash's rows
        from dflash_jax.methods.domino.config import DominoConfig
        from dflash_jax.methods.domino.handle import start_fields
        from dflash_jax.methods.domino.training import DominoTrainer

        dcfg = DominoConfig.from_backbone(dcfg, **start_fields(dcfg.hidden_size))
        trainer = DominoTrainer(work.target, dcfg, data, os.path.join(root, "run"), cfg, held_out,
                                init_from=init_from)
    else:
        trainer = DFlashTrainer(work.target, dcfg, data, os.path.join(root, "run"), cfg, features, held_out,
                                init_from=init_from, loss=d.get("loss", "dflash"),
                                dpace_alpha=d.get("dpace_alpha", 0.5), grow=work.grows(cell))
    start_path = os.path.join(root, START_TAU_FILE)
    if held_out and s.curve_every and trainer.manager.latest_step() is None and not os.path.exists(start_path):
        # the curve's step 0: the starting drafter on the held-out prompts (a resume keeps the file)
        write_json(start_path, {"tau": trainer.evaluate_tau(trainer.restore_or_init()["params"])})
    state = trainer.run()  # the final training state (restored when the run had already finished)
    drafter_dir = os.path.join(root, "drafter")
    if not os.path.isdir(drafter_dir):
        tmp = drafter_dir + f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        export_run(os.path.join(root, "run"), tmp, dtype=jnp.dtype(work.target.dtype))
        os.replace(tmp, drafter_dir)
    with open(os.path.join(root, "run", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    record = {"steps": trainer.num_steps, "sequences_per_step": cfg.batch_size, "anchors_per_sequence": cfg.num_anchors,
              "blocks": trainer.num_steps * cfg.batch_size * cfg.num_anchors,
              "blocks_seen": blocks_seen(cell, data_dir, trainer.num_steps, s.curve_prompts),
              "tokens": trainer.num_steps * cfg.batch_size * data.seq_len,
              "minutes": sum(r.get("time_s", 0.0) for r in rows) / 60,
              "final_loss": rows[-1]["loss"] if rows else None,
              "final_accuracy_per_pos": rows[-1].get("accuracy_per_pos") if rows else None,
              "training_sequences": len(data), "drafter_params": _count(state["params"]),
              "curve": start_point(start_path) + training_curve(rows), "held_out_prompts": s.curve_prompts,
              "offline_features": FEATURE_DTYPE if features is not None else None}
    if s.init_from is not None:
        record["init_from"] = drafter_identity(s.init_from)
    record["finished"] = made_now()
    write_json(record_path, record)


START_TAU_FILE = "start_tau.json"


def start_point(path: str) -> list[dict]:
    """The curve's step-0 point, the starting drafter's held-out tau (no training loss yet), when
    it was measured (``path``: the drafter's start_tau.json); else none."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{"step": 0, "tau": float(json.load(f)["tau"]), "loss": None}]


def training_curve(rows: list[dict], window: int = 50) -> list[dict]:
    """The held-out tau curve of a run's metrics rows (:func:`dflash_jax.training.run_dir.held_out_curve`):
    per step with ``eval_tau``, the step, the tau, and the training loss averaged over the
    ``window`` steps up to it."""
    return held_out_curve(rows, window)


def prepare_features(work: Work, data_dir: str, taps, cell: Cell | None = None) -> str:
    """The data's offline target features for ``taps`` (computed once, in bfloat16, shared by
    every drafter with those taps; a second process asking for them waits for the first)."""
    out = work.features_dir(taps, cell)

    def make(dest):
        print(f"offline target features (taps {list(taps)}) of {data_dir} -> {out}", file=sys.stderr, flush=True)
        write_features(work.target, data_dir, dest, taps, batch_size=work.settings.regen_batch_size,
                       store_dtype=FEATURE_DTYPE)
        write_json(os.path.join(dest, "complete.json"), {"data_dir": data_dir, "taps": list(taps),
                                                         "finished": made_now()})

    work_entry(work.log, "features", out, make, done="complete.json",
               about=f"taps={','.join(map(str, taps))} {FEATURE_DTYPE} of {work.log.where(data_dir)}")
    return out


def _count(params) -> int:
    import jax

    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def evaluate_cell(work: Work, cell: Cell, training: dict, command: str, bar, remeasure: bool = False,
                  measure: Callable[[Work, Cell], dict | None] | None = None) -> dict:
    """The cell's evaluation (bench's protocol) and step times; writes and returns cell.json.
    ``remeasure``: measure again even when a cell.json exists (its drafter reused), and
    replace it: the quiet timing pass after cells were measured beside other work."""
    out = os.path.join(work.cell_dir(cell), "cell.json")
    made = {}

    def make(dest):
        made["record"] = _evaluate_cell(work, cell, training, command, bar, dest, measure)

    about = _label(cell.label, list(cell.label)) + "; " + brief(
        cell.evaluation, ("block_size", "temperature", "datasets", "max_samples", "max_new_tokens"))
    work_entry(work.log, "cell", out, make, about=about, settings=out, fresh=work.log.fresh or remeasure)
    if "record" in made:
        return made["record"]
    with open(out) as f:
        return json.load(f)


def _evaluate_cell(work: Work, cell: Cell, training: dict, command: str, bar, out: str, measure=None) -> dict:

    ev = cell.evaluation
    load_before = os.getloadavg()
    drafter = load_drafter(os.path.join(work.drafter_dir(cell), "drafter"), work.target, dtype=work.target.dtype)
    args = types.SimpleNamespace(max_new_tokens=ev["max_new_tokens"], temperature=ev["temperature"],
                                 seed=ev["seed"], block_size=ev["block_size"], thinking=False,
                                 num_denoise_steps=ev["num_denoise_steps"],
                                 sampled_draft=ev.get("sampled_draft", False))
    runner = harness.Runner(work.target, drafter, args)
    sets = {n: load_prompt_set(n, None, ev["max_samples"], ev["seed"], subset=ev["subset"]) for n in ev["datasets"]}
    # each set at its own program shape: its decode timings are its own (bench --program-shape)
    datasets = {n: harness.bench_dataset(runner, samples, bar) for n, samples in sets.items()}
    timing = {}
    if work.settings.timing_repeats:
        first = runner.encode(harness.chat(next(iter(sets.values()))[0].turns[:1], []))
        # an adaptive cell's draft and (longest) verify at the drafter's block
        timed = drafter.config.block_size if ev["block_size"] == ADAPTIVE else ev["block_size"]
        timing = step_times(work.target, drafter, [first], timed, work.settings.timing_repeats,
                            num_denoise_steps=ev["num_denoise_steps"])
    record = {"label": cell.label, "key": work.cell_key(cell), "drafter_hash": stable_hash(work.drafter_key(cell)),
              "settings": {"drafter": cell.drafter, "train": cell.train, "evaluation": ev,
                           "target": recorded_path(work.settings.target, "target"), "dtype": work.settings.dtype},
              "training": training, "datasets": datasets, "average": harness.average(datasets),
              "draft_ms": timing.get("draft_ms"), "verify_ms": timing.get("verify_ms"),
              "command": command, "environment": environment(), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
              # the 1-minute load average as the measurement began and ended (the machine's
              # own run included: about 2 on a busy 2-core machine with nothing else)
              "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}
    extra = measure(work, cell) if measure is not None else None
    if extra is not None:
        record["extra"] = extra
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json(out, record)
    return record


# ---------------------------------------------------------------------------- the table
@dataclasses.dataclass
class Table:
    """An experiment's results: one row per cell (seeds aggregated), the paper's rows, and
    what was run. ``rows``: dicts; :meth:`to_markdown`, :meth:`plot`."""

    experiment: Experiment
    preset: str
    settings: dict
    budget: dict
    rows: list[dict]
    command: str
    environment: dict
    minutes: float

    def to_json(self) -> dict:
        return {"experiment": self.experiment.name, "preset": self.preset, "smoke": self.preset in SMOKE_PRESETS,
                "settings": self.settings,
                "budget": self.budget, "rows": self.rows, "paper": self.experiment.paper_rows,
                "command": self.command, "environment": self.environment, "minutes": self.minutes}

    def to_markdown(self) -> str:
        keys = [k for k in self.rows[0]["label"] if k != "seed"] if self.rows else []
        sets = list(self.rows[0]["datasets"]) if self.rows else []
        head = ("| " + " | ".join(keys) + " | tau [95% CI] | speedup, decode [95% CI] | "
                + " | ".join(f"{s} tau / speedup" for s in sets)
                + " | draft ms/iter | verify ms | drafter params | blocks seen | train min |")
        lines = [head, "|" + "---|" * (len(keys) + len(sets) + 7)]
        for r in self.rows:
            av = r["average"]
            cells = [str(r["label"][k]) for k in keys]
            cells += [metrics.interval_text(av["tau"], av["tau_ci"]),
                      metrics.interval_text(av["speedup"], av["speedup_ci"]) + "x"]
            cells += [f"{r['datasets'][s]['tau']:.2f} / {r['datasets'][s]['speedup']:.2f}x" for s in sets]
            ms = lambda v: "-" if v is None else f"{v:.2f}"
            cells += [ms(r["draft_ms"]), ms(r["verify_ms"]), f"{r['drafter_params'] / 1e6:.2f}M",
                      "-" if r.get("blocks_seen") is None else f"{r['blocks_seen']:,.0f}", f"{r['train_minutes']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        if any(len(r["seeds"]) > 1 for r in self.rows):
            lines += ["", "Per seed (average tau / speedup): " + "; ".join(
                f"{_label(r['label'], keys)}: " + ", ".join(f"{x['tau']:.2f}/{x['speedup']:.2f}x" for x in r["seeds"])
                for r in self.rows)]
        return "\n".join(lines)

    def plot(self):
        """The experiment's figure, laid out and marked as a smoke run or measured on a busy
        machine where it was (:func:`dflash_jax.figures.finish`)."""
        from dflash_jax import figures

        return figures.finish(self.experiment.plot(self), figures.report_notes(self.to_json()))


def _label(label: dict, keys) -> str:
    return ", ".join(f"{k} {label[k]}" for k in keys)


def aggregate(cells: list[Cell], records: list[dict]) -> list[dict]:
    """One row per cell label (seeds together): per set and on average, tau and the decode
    speedup with intervals from a bootstrap stratified by set and seed."""
    groups: dict[str, list[tuple[Cell, dict]]] = {}
    for c, r in zip(cells, records):
        key = json.dumps({k: v for k, v in c.label.items() if k != "seed"}, sort_keys=True)
        groups.setdefault(key, []).append((c, r))
    rows = []

    for key, members in groups.items():
        recs = [r for _, r in members]
        sets = list(recs[0]["datasets"])
        per_set = {}
        for s in sets:
            av = metrics.average({f"seed{i}": responses(r["datasets"][s]) for i, r in enumerate(recs)})
            first = recs[0]["datasets"][s]
            per_set[s] = av | {"histogram": np.sum([r["datasets"][s]["histogram"] for r in recs], axis=0).tolist(),
                               "position_acceptance": np.mean([r["datasets"][s]["position_acceptance"] for r in recs],
                                                              axis=0).tolist(),
                               "same_output": sum(r["datasets"][s]["same_output"] for r in recs),
                               "responses": sum(r["datasets"][s]["turns"] for r in recs),
                               "block_size": len(first["histogram"])}
            if "mean_verify_length" in first:  # an adaptive cell: the verify lengths it chose
                per_set[s]["mean_verify_length"] = float(np.mean([r["datasets"][s]["mean_verify_length"]
                                                                  for r in recs]))
        average = metrics.average({f"{s}/seed{i}": responses(r["datasets"][s]) for s in sets
                                   for i, r in enumerate(recs)})
        average["responses"] = sum(per_set[s]["responses"] for s in sets)  # what its intervals rest on
        mean = lambda xs: None if any(x is None for x in xs) else float(np.mean(xs))
        rows.append({"label": {k: v for k, v in members[0][0].label.items() if k != "seed"},
                     "datasets": per_set, "average": average,
                     "seeds": [{"seed": c.label["seed"], "tau": r["average"]["tau"], "speedup": r["average"]["speedup"]}
                               for c, r in members],
                     "draft_ms": mean([r["draft_ms"] for r in recs]), "verify_ms": mean([r["verify_ms"] for r in recs]),
                     "drafter_params": recs[0]["training"]["drafter_params"],
                     "blocks_seen": mean([r["training"].get("blocks_seen") for r in recs]),
                     "train_minutes": float(sum(r["training"]["minutes"] for r in recs)),
                     "load_average": [r.get("load_average") for r in recs],
                     **({"extra": [r.get("extra") for r in recs]} if any("extra" in r for r in recs) else {}),
                     "training": [r["training"] for r in recs], "cells": [r["drafter_hash"] for r in recs]})
    return rows


def responses_of(row: dict) -> int | None:
    """How many responses a row's average rests on (prompts x turns, every seed): the
    average's ``responses``, else the sum over its prompt sets; None where not recorded."""
    av = row.get("average", {})
    if av.get("responses") is not None:
        return int(av["responses"])
    sets = row.get("datasets") or {}
    if sets and all(isinstance(r, dict) and r.get("responses") is not None for r in sets.values()):
        return int(sum(r["responses"] for r in sets.values()))
    return None


def has_interval(row: dict, key: str = "tau") -> bool:
    """Whether a row's average has a 95 % interval of ``key`` that a finding may rest on: at
    least :data:`dflash_jax.metrics.MIN_DISTINCT_SAMPLES` responses
    (:func:`dflash_jax.metrics.interval_supported`) and finite bounds."""
    n = responses_of(row)
    ci = row["average"].get(key + "_ci")
    return ((n is None or metrics.interval_supported(n)) and ci is not None
            and bool(np.isfinite(np.asarray(ci, float)).all()))


def no_interval(rows: Sequence[dict], key: str = "tau") -> str | None:
    """Why rows give no finding on ``key`` (None when every one has its interval):
    ``"no 95 % interval (2 responses; an interval needs at least 8)"``."""
    missing = [r for r in rows if not has_interval(r, key)]
    if not missing:
        return None
    counts = [n for n in map(responses_of, missing) if n is not None]
    return ("no 95 % interval" + (f" ({min(counts)} responses; an interval needs at least "
                                  f"{metrics.MIN_DISTINCT_SAMPLES})" if counts else ""))


def separated(a: dict, b: dict, key: str = "tau") -> bool:
    """Whether two rows' 95 % intervals of ``key`` (average) exist (:func:`has_interval`) and
    do not overlap: the condition of a finding."""
    if not (has_interval(a, key) and has_interval(b, key)):
        return False
    (lo1, hi1), (lo2, hi2) = a["average"][key + "_ci"], b["average"][key + "_ci"]
    return bool(hi1 < lo2 or hi2 < lo1)


def verdict(a: dict, b: dict, key: str = "tau") -> str:
    """Whether the difference of two rows on ``key`` is a finding, in words: the intervals do
    not overlap; or within them; or no interval at all (too few responses)."""
    why = no_interval([a, b], key)
    if why:
        return f"{why}: not a finding"
    return ("the intervals do not overlap" if separated(a, b, key)
            else "within the 95 % intervals: not a finding at this budget")


def compare(rows: list[dict], name: Callable[[dict], str], key: str = "tau") -> list[str]:
    """Sentences comparing consecutive rows on ``key``, saying when the difference is within
    the 95 % intervals or has none (then it is not a finding; :func:`verdict`)."""
    out = []
    for a, b in zip(rows, rows[1:]):
        va, vb = a["average"][key], b["average"][key]
        out.append(f"{key} {name(a)} -> {name(b)}: {va:.2f} -> {vb:.2f} ({vb - va:+.2f}; {verdict(a, b, key)})")
    return out


def paper_direction(better: dict, worse: dict, name: Callable[[dict], str], paper: str, key: str = "tau") -> str:
    """A sentence on whether ``better`` beats ``worse`` on ``key`` here as the paper says it
    does (``paper``: what the paper reports), and whether the 95 % intervals make it a finding."""
    vb, vw = better["average"][key], worse["average"][key]
    why = no_interval([better, worse], key)
    sure = separated(better, worse, key)
    same = vb > vw
    return (f"against the paper ({paper}): {key} {name(better)} {vb:.2f} vs {name(worse)} {vw:.2f} here: "
            + ("the paper's direction" if same else "the opposite direction")
            + (f", {why}: this run neither confirms nor contradicts the paper" if why else
               ", the 95 % intervals do not overlap" if sure else
               ", within the 95 % intervals: this budget neither confirms nor contradicts the paper"))


def plot_beside_paper(table: "Table"):
    """Our rows (average with its interval, each prompt set a marker) beside the paper's rows
    (:func:`dflash_jax.viz.plot_against_paper`)."""
    return plot_against_paper(table.to_json())


def label_text(row: dict) -> str:
    """A row's label as text ("conditioning input")."""
    return ", ".join(f"{k} {v}" for k, v in row["label"].items())


# ---------------------------------------------------------------------------- outputs
def existing_table(out: str) -> dict | None:
    """The table an ``--out`` directory holds, or None where it is new or empty; raises where it
    is a file or a non-empty directory without a table (nothing in it is overwritten)."""
    if not os.path.isdir(out) or not os.listdir(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"--out {out!r} is a file, not a directory")
        return None
    path = os.path.join(out, TABLE)
    if not os.path.exists(path):
        raise ValueError(f"--out {out!r} is a non-empty directory without a {TABLE}: it does not hold this "
                         "experiment's results and nothing in it is overwritten; give another --out")
    with open(path) as f:
        return json.load(f)


def check_experiment_of(old: dict, out: str, name: str) -> None:
    if old.get("experiment") != name:
        raise ValueError(f"--out {out!r} holds the results of experiment {old.get('experiment')!r}, not "
                         f"{name!r}; give another --out")


def check_out(out: str, experiment: Experiment, identity: dict, overwrite: bool) -> None:
    """``--out`` may be new, empty, or hold this experiment's table of the same settings
    (rewritten); anything else needs another --out, or --overwrite for a table of the same
    experiment. Raises before anything runs."""
    old = existing_table(out)
    if old is None:
        return
    check_experiment_of(old, out, experiment.name)
    if comparable_identity(old.get("identity")) != comparable_identity(identity) and not overwrite:
        raise ValueError(f"--out {out!r} holds {experiment.name} results of other settings (preset "
                         f"{old.get('preset')!r}, `{old.get('command')}`); give another --out, or --overwrite "
                         "to replace them")


def check_measured_out(out: str, name: str, overwrite: bool) -> None:
    """``--out`` of a measurement-only experiment (no training: ``ablate_tree``,
    ``ablate_budget``): new, empty, or holding that experiment's table, replaced only with
    ``--overwrite``. Raises before anything runs."""
    old = existing_table(out)
    if old is None:
        return
    check_experiment_of(old, out, name)
    if not overwrite:
        raise ValueError(f"--out {out!r} already holds {name} results (`{old.get('command')}`); pass --overwrite "
                         "to replace them, or give another --out")


def save_plot(fig, path: str) -> None:
    """Writes ``fig`` to ``path`` atomically (laid out first unless it lays itself out) and closes it."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:  # a figure laid out as it is drawn (constrained) keeps its layout
        fig.tight_layout()
    with atomic_path(path, keep_extension=True) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def write_table_set(out: str, md: str, fig, readme_text: str, table: dict) -> None:
    """An output set: ``table.md``, ``plot.png``, ``README.md``, then ``table.json`` (written
    last: it marks the set complete)."""
    os.makedirs(out, exist_ok=True)
    write_text(os.path.join(out, "table.md"), md + "\n")
    save_plot(fig, os.path.join(out, "plot.png"))
    write_text(os.path.join(out, "README.md"), readme_text)
    write_json(os.path.join(out, TABLE), table)


def write_outputs(table: Table, out: str, identity: dict) -> None:
    md = table.to_markdown()
    if training_curves(table.rows):  # before table.json, which marks the set complete
        os.makedirs(out, exist_ok=True)
        save_plot(plot_curves(table), os.path.join(out, CURVES_PLOT))
    write_table_set(out, md + "\n\nThe paper, same ablation:\n\n" + _paper_markdown(table.experiment), table.plot(),
                    readme(table, md), table.to_json() | {"identity": identity})


CURVES_PLOT = "curves.png"


def load_text(rows: Sequence[dict]) -> str | None:
    """The 1-minute load averages the rows were measured at, in words (None where no cell
    recorded one)."""
    loads = [x for r in rows for pair in r.get("load_average") or [] if pair for x in pair]
    if not loads:
        return None
    return (f"The speed columns were measured at 1-minute load averages of {min(loads):.1f}-{max(loads):.1f} "
            "(as each cell's measurement began and ended; the measurement itself keeps the machine's cores "
            "busy). tau does not depend on load.")


def drafters_of(rows: Sequence[dict]) -> dict:
    """The distinct drafters the rows were measured with: drafter hash -> its training record."""
    return {h: t for r in rows for h, t in zip(r.get("cells") or [], r.get("training") or [])}


def training_minutes(rows: Sequence[dict]) -> float:
    """Minutes of training steps of the rows' drafters, each counted once."""
    return float(sum(t.get("minutes") or 0.0 for t in drafters_of(rows).values()))


def training_curves(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    """Each trained drafter's held-out tau curve (``train.json``'s ``curve``) once, named by
    the first row it serves (and its seed when a row has several): ``[(name, curve)]``."""
    out, seen = [], set()
    for r in rows:
        trainings = r.get("training") or []
        for i, (h, t) in enumerate(zip(r.get("cells") or [None] * len(trainings), trainings)):
            if not (t or {}).get("curve") or (h is not None and h in seen):
                continue
            seen.add(h)
            seeds = r.get("seeds") or []
            seed = f", seed {seeds[i]['seed'] if i < len(seeds) else i}" if len(trainings) > 1 else ""
            out.append((label_text(r) + seed, t["curve"]))
    return out


def curves_markdown(rows: Sequence[dict]) -> str:
    """The held-out tau (and the mean training loss of the steps up to it) per step and drafter."""
    curves = training_curves(rows)
    steps = sorted({p["step"] for _, c in curves for p in c})
    lines = ["| step | " + " | ".join(n for n, _ in curves) + " |", "|" + "---|" * (len(curves) + 1)]
    for st in steps:
        cells = []
        for _, c in curves:
            p = next((p for p in c if p["step"] == st), None)
            cells.append("-" if p is None else f"{p['tau']:.2f}" + ("" if p["loss"] is None else f" ({p['loss']:.3f})"))
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(table: "Table"):
    """Held-out tau against training steps, one line per trained drafter."""
    fig, ax = new_figure(figsize=(6.5, 4))
    for name, curve in training_curves(table.rows):
        ax.plot([p["step"] for p in curve], [p["tau"] for p in curve], marker="o", label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out tau")
    ax.set_title(f"{table.experiment.name}: held-out tau during training ({table.preset} preset)")
    ax.legend(fontsize=8)
    from dflash_jax import figures

    return figures.finish(fig, [figures.smoke_note(table.preset)] if table.preset in SMOKE_PRESETS else [])


def _paper_markdown(experiment: Experiment) -> str:

    return paper.markdown(experiment.paper_rows, experiment.paper_keys)


def _cpu_text(env: dict) -> str:
    """The CPU as a README names it: model, family and model numbers, cores and vector extensions
    (tables written before ``cpu`` was recorded: the model name and cores)."""
    if env.get("cpu"):
        return cpu_description(env["cpu"])
    return f"{env.get('cpu_model') or ''} {env['cpu_count']} cores"


def _temperatures_text(table: Table) -> str:
    """The evaluation temperature, or the cells' temperatures where they set their own."""
    temps = sorted({r["label"]["temperature"] for r in table.rows}) if table.rows and all(
        "temperature" in r["label"] for r in table.rows) else [table.settings["temperature"]]
    return str(temps[0]) if len(temps) == 1 else " and ".join(map(str, temps)) + " (the temperature column)"


def readme(table: Table, md: str) -> str:
    e, b, env = table.experiment, table.budget, table.environment
    s = table.settings
    lines = [f"# {e.name} ({table.preset} preset)", ""]
    if table.preset in SMOKE_PRESETS:
        lines += [f"**This is a smoke run**: {SMOKE_NOTE.split(': ', 1)[1]}.", ""]
    lines += [e.description, "",
             f"Command: `{table.command}`", "",
             f"Machine: {env['device']} ({env['platform']}, {_cpu_text(env)}), jax {env['jax']}; {table.minutes:.1f} minutes for this invocation (cells reused from an earlier "
             "run cost nothing here; the train min column is each cell's own training time).", "",
             "## Budget (the same for every cell)", "",
             *([f"- training data: {s['num_prompts']} prompts ({s['prompt_source']}) answered by the target, "
                f"{s['regen_max_new_tokens']} new tokens each, sequence length {s['regen_max_len']}",
                f"- training: {b['steps']} steps x {b['sequences_per_step']} sequences x {b['anchors_per_sequence']} "
                f"anchors = {b['blocks']} blocks per cell at most (the blocks seen column counts the valid anchors "
                f"each drafter really trained on); lr {b['learning_rate']}, seeds {b['seeds']}"]
               if b["steps"] else ["- training: none, no training data (every cell measures the starting drafter "
                                   "below as it is)"]),
             *([f"- {b['untrained_cells']} of the cells train nothing (steps 0): they measure the starting "
                "drafter below as it is"] if b.get("untrained_cells") else []),
             *([f"- {b['source_cells']} of the cells measure a drafter of their own as it is, trained "
                f"elsewhere: {', '.join(f'`{x}`' for x in b['sources'])} (outside this budget)"]
               if b.get("source_cells") else []),
             *([f"- starting weights: every {'other ' if b.get('source_cells') else ''}cell's drafter is `{s['init_from']}`"
                + (", fine-tuned from there (an ablation in the trained regime)" if b["steps"] else ", as it is")
                + ("; a deeper cell's drafter is it grown: new layers appended, copies of its last layer with "
                   "their output and MLP down projections at zero, so that its drafts are unchanged at step 0"
                   if s.get("grow") and b["steps"] else "")]
               if s.get("init_from") else []),
             *([f"- target features: offline, computed once per data and taps and shared by every cell "
                f"(stored in {FEATURE_DTYPE}; the frozen target does not run in the training steps)"]
               if s.get("offline_features") and b["steps"] else []),
             *([f"- held out: the data's last {s['curve_prompts']} sequences, never trained on; their prompts "
                "measure the training curves below"] if s.get("curve_prompts") and b["steps"] else []),
             f"- compute: {training_minutes(table.rows):.0f} minutes of training steps in all ({len(drafters_of(table.rows))} "
             "drafters, each counted once however many rows it serves)",
             f"- evaluation: {', '.join(s['datasets'])}, {s['max_samples']} prompts each, {s['max_new_tokens']} new "
             f"tokens, T = {_temperatures_text(table)}, batch 1, AR and DFlash interleaved per prompt",
             "", "## Results", "",
             "tau: per response the mean acceptance length, then the mean over responses; speedup: mean AR "
             "time per output token / mean DFlash time per output token, decode phase only (docs/method.md section 6); "
             "[95% CI]: percentile bootstrap over prompts, stratified by prompt set (and seed), seed 0; none "
             f"where it would rest on fewer than {metrics.MIN_DISTINCT_SAMPLES} responses.", "",
             *([load_text(table.rows), ""] if load_text(table.rows) else []),
             md, "", "![plot](plot.png)", ""]
    if training_curves(table.rows):
        lines += ["## Training curves", "",
                  f"Held-out tau of each drafter during its training: greedy, {s['curve_prompts']} prompts held out "
                  "of the training data (its last sequences, never trained on), 64 new tokens, inference block = "
                  "training block, batch of all held-out prompts; in brackets the mean training loss of the 50 "
                  "steps up to that step. A curve still rising at its end means the budget, not the setting, "
                  "limits that cell.", "", curves_markdown(table.rows), "", f"![curves]({CURVES_PLOT})", ""]
    lines += ["## The paper, same ablation", "", _paper_markdown(e), "", "## What the data shows", ""]
    why = no_interval(table.rows)
    if why:
        missing = sum(not has_interval(r) for r in table.rows)
        rows = "any row" if missing == len(table.rows) else f"{missing} of the {len(table.rows)} rows"
        lines.append(f"- no finding from {rows}: {why}; the comparisons below say where")
    lines += [f"- {x}" for x in e.findings(table)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- running
def check_experiment(experiment: Experiment, preset: str, overrides: dict) -> tuple[Settings, dict, dict, list[Cell]]:
    """Every check :func:`run_experiment` makes before it runs anything (settings, target,
    tokenizer, cells); returns (settings, train settings, axes, cells). Raises with a message naming what is wrong."""
    settings, train, axes = resolve(experiment, preset, overrides)
    if settings.target is None:
        raise ValueError(f"the {preset} preset needs --target: a Hugging Face target directory (e.g. Qwen3-8B)")
    if settings.prompt_source is None:
        raise ValueError(f"the {preset} preset needs --prompt-source FILE.jsonl: the training prompts (the paper's "
                         "ablations: 100K prompts of Nemotron post-training v2 + CodeAlpaca, docs/method.md section 5; "
                         "train-data's formats), answered by the target")
    target_dir = checkpoint_dir(settings.target)
    if not os.path.isdir(target_dir):
        raise FileNotFoundError(f"target directory {settings.target!r} does not exist")

    tcfg = TargetConfig.from_pretrained(target_dir)
    if not any(os.path.exists(os.path.join(target_dir, n)) for n in ("tokenizer.json", "tokenizer.model")):
        raise ValueError(f"{settings.target} has no tokenizer (tokenizer.json or tokenizer.model): the "
                         "experiments render text prompts with the target's tokenizer and chat template")
    if settings.mask_token_id is None:
        from transformers import AutoTokenizer

        mask = getattr(AutoTokenizer.from_pretrained(target_dir), "mask_token_id", None)
        settings = dataclasses.replace(settings, mask_token_id=mask)
    cells = check_settings(experiment, settings, train, axes, tcfg)
    if settings.prompt_source in ("embedded-recipe", "embedded-styles"):
        recipe_files(settings, preset)
    return settings, train, axes, cells


def recipe_files(settings: Settings, preset: str | None = None) -> dict[str, str]:
    """The two data files of the 'embedded-recipe' prompts: ``{"gsm8k/train.jsonl": path,
    "mbpp/sanitized-mbpp.json": path}``. GSM8K train is looked for in ``data_dir``, else the
    library's data directory (:func:`dflash_jax.datasets.default_data_dir`: ``$DFLASH_DATA_DIR``,
    else ``HOME/datasets``), else ``HOME/data`` (where earlier versions asked for it); MBPP
    sanitized in the same directory when it holds it, else the package's copy (the same file:
    ``dflash_jax/bench/data/README.md``). Raises FileNotFoundError in one line saying what to
    download and where to put it."""
    dirs = [settings.data_dir] if settings.data_dir else [default_data_dir(), os.path.join(home(), "data")]
    for d in dirs:
        if os.path.isfile(os.path.join(d, GSM8K_TRAIN)):
            mbpp = os.path.join(d, MBPP_FILE)
            return {GSM8K_TRAIN: os.path.join(d, GSM8K_TRAIN),
                    MBPP_FILE: mbpp if os.path.isfile(mbpp) else os.path.join(shipped_data_dir(), MBPP_FILE)}
    where = os.path.join(settings.data_dir or default_data_dir(), GSM8K_TRAIN)
    who = f"the {preset} preset" if preset else f"--prompt-source {settings.prompt_source}"
    raise FileNotFoundError(
        f"{who} trains on the embedded drafter's prompt mix, and its GSM8K train split is the one file "
        f"that does not ship (MBPP and the standard library do): download {GSM8K_TRAIN_URL} to {where} "
        + ("" if settings.data_dir else f"(or set --data-dir DIR with DIR/{GSM8K_TRAIN}) ")
        + "and run again; or use --prompt-source shipped, which needs no download (other drafters than the "
        "committed tables')")


def run_experiment(experiment: Experiment, preset: str = "smoke", *, out: str | None = None,
                   work: str | None = None, overwrite: bool = False, command: str | None = None,
                   remeasure: bool = False, fresh: bool = False, verbose: bool = False,
                   log: WorkLog | None = None, **overrides) -> Table:
    """Runs (or resumes, or reuses) every cell of ``experiment`` under ``preset`` with
    ``overrides`` (any option, by field name) and writes the outputs to ``out`` (default
    :func:`default_out`). Returns the :class:`Table`. ``remeasure``: evaluate every cell again
    (trained drafters are reused), e.g. on a quiet machine after training beside other work.
    ``fresh``: recompute every entry of the run directory the cells need (data, features,
    drafters, cells) instead of reusing finished ones, each written over the old one when done;
    ``verbose``: name every entry reused, not only the first few of each kind (:class:`WorkLog`);
    ``log``: a log shared with the caller (``experiments.paper all``; its ``fresh`` and
    ``verbose`` hold)."""
    import jax
    import jax.numpy as jnp

    t0 = time.perf_counter()
    settings, train, axes, cells = check_experiment(experiment, preset, overrides)
    out = out or default_out(experiment, preset)
    work = work or default_work()
    command = command or _api_command(experiment, preset, out, work, overrides)
    # settings added since a table was written, at their old value, leave its identity unchanged
    identity = {"preset": preset, "settings": recorded_settings(settings), "train": _hashed("train", train),
                "axes": _jsonable(axes)}
    check_out(out, experiment, identity, overwrite)

    # dtype None: the platform's (float32 on CPU, bfloat16 on GPUs); hashed as given
    dtype = jnp.dtype(settings.dtype) if settings.dtype else (
        jnp.float32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16)
    target = load_target(checkpoint_dir(settings.target), dtype=dtype)
    own_log = log is None
    wk = Work(work, settings, target, log if log is not None else WorkLog(work, fresh, verbose))
    print(f"{experiment.name}: {_work_plan(wk, cells)}; results -> {out}", file=sys.stderr, flush=True)
    if preset in SMOKE_PRESETS:
        print(smoke_note(preset), file=sys.stderr, flush=True)
    records = []
    with progress(total=len(cells), desc=f"{experiment.name} cells", unit="cell", position=0) as cbar:
        for cell in cells:
            cbar.set_postfix_str(_label(cell.label, list(cell.label)))
            # a steps-0 cell measures the init_from drafter as it is: it needs no training data
            data_dir = None if cell.untrained else prepare_data(wk, cbar.write, cell)
            training = train_drafter(wk, cell, data_dir)
            n = sum(len(s.turns) for s in _sets_for(cell))
            with progress(total=n, desc="evaluating (AR + DFlash)", unit="prompt", leave=False, position=1) as ebar:
                # the training record as train_drafter gives it now (a cell measured earlier keeps
                # the one of its time, which may lack fields counted since, e.g. blocks_seen)
                records.append(evaluate_cell(wk, cell, training, command, ebar, remeasure, experiment.measure)
                               | {"training": training})
            cbar.update(1)
    trained = [r["training"] for r in records if r["training"]["steps"]]  # the budget is theirs
    first = trained[0] if trained else records[0]["training"]
    budget = {"steps": first["steps"], "sequences_per_step": first["sequences_per_step"],
              "anchors_per_sequence": first["anchors_per_sequence"], "blocks": first["blocks"],
              "learning_rate": train["learning_rate"], "seeds": list(range(settings.seed, settings.seed + settings.seeds))}
    sources = sorted({c.drafter["source"] for c in cells if "source" in c.drafter})
    if trained and len(trained) < len(records):
        budget["untrained_cells"] = len(records) - len(trained) - sum("source" in c.drafter for c in cells)
    if sources:
        budget["source_cells"] = sum("source" in c.drafter for c in cells)
        budget["sources"] = sources
    env = environment() | {"cpu_model": cpu_model(), "cpu": cpu_info()}
    table = Table(experiment, preset, recorded_settings(settings) | {"train": train, "axes": _jsonable(axes)}, budget,
                  aggregate(cells, records), command, env, (time.perf_counter() - t0) / 60)
    write_outputs(table, out, identity)
    title = " ".join(experiment.description.split()).split(":")[0]  # e.g. "Drafter depth"
    print(f"\n## {experiment.name}: {title} ({preset} preset)\n")  # a heading: `paper all` prints several
    print(table.to_markdown())
    if preset in SMOKE_PRESETS:
        print(smoke_note(preset), file=sys.stderr)
    if own_log and wk.log.summary():
        print(wk.log.summary(), file=sys.stderr)
    print(f"wrote {out}/table.md, table.json, plot.png, README.md", file=sys.stderr)
    return table


def _work_plan(wk: Work, cells: list[Cell]) -> str:
    """The cells and drafters a run needs under its run directory, and how many are finished there."""
    drafters = {wk.drafter_dir(c) for c in cells}
    done_cells = sum(os.path.isfile(os.path.join(wk.cell_dir(c), "cell.json")) for c in cells)
    done_drafters = sum(os.path.isfile(os.path.join(d, "train.json")) for d in drafters)
    text = (f"{len(cells)} {_plural('cell', len(cells))}, {len(drafters)} {_plural('drafter', len(drafters))} "
            f"under {wk.root}")
    if done_cells or done_drafters:
        text += (f"; finished there already: {done_cells} of the cells, {done_drafters} of the drafters, "
                 + ("recomputed (--fresh)" if wk.log.fresh else "reused (each named as it is; --fresh recomputes)"))
    return text


SMOKE_NOTE = ("smoke run (--preset smoke): a few prompts and training steps, to show that every stage runs; "
              "its numbers are not results, and no finding is drawn from them")


def smoke_note(preset: str) -> str:
    """:data:`SMOKE_NOTE` naming ``preset`` (one of :data:`SMOKE_PRESETS`)."""
    return SMOKE_NOTE.replace("--preset smoke", f"--preset {preset}")


def recorded_settings(settings: Settings) -> dict:
    """The settings as the outputs record them: paths by :func:`recorded_path` (the shipped
    target as ``embedded``, others relative to the checkout or ``~``), the same in every checkout."""
    out = _jsonable(settings)
    out["target"] = recorded_path(settings.target, "target")
    out["data_dir"] = recorded_path(settings.data_dir)
    out["init_from"] = recorded_path(settings.init_from, "drafter")
    if settings.prompt_source.endswith(".jsonl"):
        out["prompt_source"] = recorded_path(settings.prompt_source)
    return out


def _sets_for(cell: Cell):

    ev = cell.evaluation
    return [s for n in ev["datasets"] for s in load_prompt_set(n, None, ev["max_samples"], ev["seed"], subset=ev["subset"])]


def _jsonable(obj):
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.loads(json.dumps(obj, default=list))


def default_out(experiment: Experiment, preset: str) -> str:
    """``HOME/results/ablations/<experiment>`` for the cpu preset, ``...-<preset>`` for the
    others (:func:`home`: outside the checkout; its ``results/`` only by an explicit ``--out``)."""
    name = experiment.name if preset == "cpu" else f"{experiment.name}-{preset}"
    return os.path.join(home(), "results", "ablations", name)


def _api_command(experiment, preset, out, work, overrides) -> str:
    argv = ["--preset", preset, "--out", portable_path(out), "--work", portable_path(work)]
    for k, v in overrides.items():
        if isinstance(v, bool):
            argv += [flag(k)] if v else []
        elif isinstance(v, (list, tuple)):
            argv += [flag(k), *map(str, v)]
        elif v is not None:
            argv += [flag(k), str(v)]
    return f"python -m experiments.{experiment.name} " + " ".join(argv)


# ---------------------------------------------------------------------------- command line
def parser(experiment: Experiment) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m experiments.{experiment.name}",
                                description=experiment.description + "\n\n" + __doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="cpu",
                   help="smoke: seconds; test: smoke's grids at the test suite's size (short sequences, "
                        "two short MBPP prompts); cpu: the embedded target, minutes per cell (default); "
                        "cpu-full: the embedded target trained to where the method works, hours per cell "
                        "(docs/experiments.md); gpu: the paper's settings on --target")
    p.add_argument("--out", help="output directory (default: $DFLASH_JAX_HOME/results/ablations/<experiment> "
                                 "for the cpu preset, .../<experiment>-<preset> otherwise; DFLASH_JAX_HOME "
                                 "defaults to ~/.cache/dflash-jax). The committed results are rewritten only "
                                 "by an explicit --out results/ablations/<experiment>")
    p.add_argument("--work", help="run directory: data, drafters and cells keyed by the hash of their settings "
                                  "(finished ones are reused; default $DFLASH_JAX_HOME/work, shared by every "
                                  "experiment and experiments.paper)")
    p.add_argument("--remeasure", action="store_true",
                   help="evaluate every cell again, replacing its saved measurement (trained drafters are "
                        "reused): a quiet timing pass after cells were measured while other work ran")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out table of this experiment made with other settings")
    add_reuse_options(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    presets = {name: preset_values(experiment, name) for name in PRESETS}
    hints = typing.get_type_hints(Settings) | typing.get_type_hints(TrainConfig)
    helps = field_help(Settings) | field_help(TrainConfig) | experiment.axis_help
    groups = {"axes": p.add_argument_group(f"what {experiment.name} varies"),
              "settings": p.add_argument_group("data, drafter and evaluation settings"),
              "train": p.add_argument_group("training settings (TrainConfig)")}
    for group, names in (("axes", list(experiment.axes)), ("settings", [f.name for f in dataclasses.fields(Settings)]),
                         ("train", [f.name for f in train_fields()])):
        for name in names:
            hint = hints.get(name, tuple[int, ...])
            kwargs = argument_kwargs(name, hint, None)
            if name in experiment.axis_types:
                kwargs["type"] = experiment.axis_types[name]
            if kwargs.get("action") == "store_true":
                kwargs = {"action": argparse.BooleanOptionalAction}
            if name == "datasets":
                kwargs["choices"] = list(DATASETS)
            shown = ", ".join(f"{k} {_show(v[name])}" for k, v in presets.items())
            groups[group].add_argument(flag(name), dest=name, default=None,
                                       help=f"{helps.get(name, '')} (defaults: {shown})".replace("%", "%%"),
                                       **kwargs)
    return p


def add_reuse_options(p: argparse.ArgumentParser) -> None:
    """``--fresh`` and ``--verbose``: the options of every command that keeps work under ``--work``."""
    p.add_argument("--fresh", action="store_true",
                   help="recompute everything this run needs under --work (data, features, drafters, cells, "
                        "measurements) instead of reusing finished entries; each new entry replaces the old one "
                        "when it is finished, and entries this run does not need are left alone")
    p.add_argument("--verbose", action="store_true",
                   help="name every entry reused from --work (default: the first few of each kind, then a count)")


def _show(v) -> str:
    if isinstance(v, (list, tuple)):
        return " ".join(map(str, v)) or "-"
    if isinstance(v, str) and os.path.isabs(v):
        return "embedded" if v == EMBEDDED_TARGET_DIR else v
    return "-" if v is None else str(v)


def main(experiment: Experiment, argv: Sequence[str] | None = None) -> Table:
    """``python -m experiments.<name>``: parses the options and runs the experiment."""
    owns_process = argv is None  # the command line: Ctrl-C handling, the compilation cache (run_cli)
    argv = list(sys.argv[1:] if argv is None else argv)
    result = {}

    def go(a):
        args = parser(experiment).parse_args(a)
        names = option_names(experiment)
        overrides = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
        result["table"] = run_experiment(experiment, args.preset, out=args.out, work=args.work,
                                         overwrite=args.overwrite, remeasure=args.remeasure, fresh=args.fresh,
                                         verbose=args.verbose,
                                         command=command_line(f"experiments.{experiment.name}", a),
                                         **overrides)

    run_cli(go, argv, owns_process=owns_process)
    return result.get("table")
