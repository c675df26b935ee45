"""The drafter training loop shared by every drafting method: optax AdamW (warmup + cosine,
clipping), Orbax checkpoints, exact resume, JSONL metrics with a tqdm bar, periodic real tau
evaluation, meshes. A method's objective (its drafter's initial weights, a step's inputs, the
loss, the drafter of given weights) is a :class:`Trainer` subclass in its package
(``docs/methods.md``), e.g. ``methods/dflash/training.py``.

Determinism: the batch of step s (and what an objective draws for it, e.g. DFlash's anchors)
depends only on (seed, s), so a run killed
at any point and resumed from its last checkpoint repeats no step and loses none; on CPU the
resumed run ends bitwise equal to an uninterrupted one.

An epoch is ``len(data) // batch_size`` steps: each epoch draws a new permutation of the
sequences (the last ``len(data) % batch_size`` of it are left out that epoch; DFlash also
resamples every sequence's anchors, docs/method.md section 5). The length of a run is ``steps``, or ``epochs``
(the recipe's unit: ``ceil(epochs * steps_per_epoch)`` steps), not both.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from typing import Any, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from dflash_jax import methods
from dflash_jax.config import read_config_json
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK, check_chunk
from dflash_jax.training import sharding
from dflash_jax.training.blocks import check_anchor_strategy, check_gamma
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.loop import batch_rows, make_optimizer, make_schedule, run_loop
from dflash_jax.files import write_json
from dflash_jax.training.run_dir import (CHECKPOINTS, METRICS_FILE, NEW_RUN_REMEDY, RUN_FILE, START_EVAL_FILE, check_run_file,
                                         checkpoint_manager, reading_manager, restore_latest, saved_steps)
from dflash_jax.hub import checkpoint_name
from dflash_jax.models.handles import save_drafter
from dflash_jax.decoding.generation import generate


DEFAULT_STEPS = 1000  # the length of a run given neither steps nor epochs


def steps_per_epoch(num_sequences: int, batch_size: int) -> int:
    """Steps of one epoch (module docstring): ``num_sequences // batch_size``."""
    return num_sequences // batch_size


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Paper defaults (docs/method.md section 5) where it gives them.

    ``steps`` or ``epochs`` (not both) sets the length of the run; with neither it is
    :data:`DEFAULT_STEPS` steps (:meth:`total_steps`). The loss weighs block row k >= 1 by
    ``exp(-(k-1)/gamma)`` (``gamma`` > 0; None: the paper's for the block size), or by 1 with
    ``uniform_weights``. Every field is an option of ``python -m dflash_jax train``, with the
    help text below.

    Attributes:
        steps: training steps (with neither steps nor epochs: 1000, DEFAULT_STEPS)
        epochs: train for this many epochs instead of steps (the recipe's unit; fractions
            allowed): ceil(epochs * (training sequences // batch size)) steps, every epoch a new
            order of the sequences and new anchors
        batch_size: training sequences per step
        learning_rate: peak AdamW learning rate (linear warmup, then cosine decay to 0)
        warmup_fraction: fraction of the run's steps that warm the learning rate up
        grad_clip: clip the gradients to this global norm
        weight_decay: AdamW weight decay (the paper is silent; SpecForge's value)
        num_anchors: anchors (block starts) sampled per training sequence
        anchors: how block starts are chosen: 'random' (the paper: num_anchors valid anchors
            drawn per sequence, new every epoch) or 'fixed' (an ablation: each response cut into
            consecutive blocks from its first token, at most num_anchors of them)
        gamma: loss decay: block row k weighs exp(-(k-1)/gamma), gamma > 0 (not given: the
            paper's for the block size: 7 for 16, 5 for 10, 4 for 8)
        uniform_weights: weigh every predicted block row the same (instead of the decay;
            excludes gamma)
        seed: seed of the initial weights, the order of the data and the anchors
        checkpoint_every: save a checkpoint every this many steps (and at the end)
        keep_checkpoints: how many of the newest checkpoints to keep
        eval_every: measure tau on the held-out prompts every this many steps (0: never)
        eval_max_new_tokens: tokens generated per held-out prompt to measure tau
        compute_dtype: dtype of the forward and backward passes (not given: the target's);
            the master weights stay float32
        anchor_chunk: blocks per chunk of the memory-efficient training attention (the drafter's
            attention is dense when num_anchors <= anchor_chunk and the sequence length <=
            context_chunk; else chunked: online softmax, rematerialised, scores of one anchor
            chunk x context chunk at a time); lower both when a step runs out of memory
        context_chunk: context positions per chunk of the memory-efficient training attention
            (see anchor_chunk)
    """

    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 8
    learning_rate: float = 6e-4
    warmup_fraction: float = 0.04
    grad_clip: float = 1.0
    weight_decay: float = 0.0  # the paper is silent; SpecForge's default
    num_anchors: int = 512
    anchors: Literal["random", "fixed"] = "random"
    gamma: float | None = None
    uniform_weights: bool = False
    seed: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    eval_every: int = 0
    eval_max_new_tokens: int = 64
    compute_dtype: Literal["float32", "bfloat16"] | None = None  # None: the target's dtype (bf16 on GPU)
    anchor_chunk: int = DEFAULT_ANCHOR_CHUNK  # dense attention up to 64 anchors
    context_chunk: int = DEFAULT_CONTEXT_CHUNK  # ... and length 1024 (every CPU-scale run)

    def __post_init__(self):
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"give the length of the run as steps ({self.steps}) or as epochs "
                             f"({self.epochs}), not both (--steps / --epochs)")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, (int, np.integer))
                                       or self.steps < 1):
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.epochs is not None and (isinstance(self.epochs, bool) or not isinstance(self.epochs, (int, float, np.integer, np.floating))
                                        or not 0 < self.epochs < math.inf):
            raise ValueError(f"epochs must be a number > 0 (fractions allowed), got {self.epochs!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        check_anchor_strategy(self.anchors)
        check_chunk("anchor_chunk", self.anchor_chunk)
        check_chunk("context_chunk", self.context_chunk)
        if self.gamma is not None:
            check_gamma(self.gamma)
            if self.uniform_weights:
                raise ValueError(f"uniform weights and gamma={self.gamma} exclude each other: give one of "
                                 "them (--uniform-weights / --gamma)")

    def total_steps(self, num_sequences: int) -> int:
        """The length of the run on ``num_sequences`` training sequences: ``steps``, or
        ``ceil(epochs * steps_per_epoch)``, or :data:`DEFAULT_STEPS`."""
        if self.steps is not None:
            return int(self.steps)
        if self.epochs is None:
            return DEFAULT_STEPS
        per_epoch = steps_per_epoch(num_sequences, self.batch_size)
        if per_epoch < 1:
            raise ValueError(f"the dataset has {num_sequences} sequences, fewer than batch_size "
                             f"{self.batch_size}: an epoch would have no step")
        return max(1, math.ceil(round(self.epochs * per_epoch, 9)))  # round: 0.1 * 30 is 3, not 4


WIDTH_BUCKET = 64  # a step's columns are a multiple of this (or the dataset's whole width)


def batch_width(lengths, seq_len: int, bucket: int = WIDTH_BUCKET) -> int:
    """Columns a step needs: its longest row rounded up to a multiple of ``bucket``, at most
    ``seq_len``."""
    longest = int(np.max(lengths)) if len(lengths) else seq_len
    return min(seq_len, max(bucket, -(-longest // bucket) * bucket))


BATCH_STREAM = 7  # the drafter's stream of batch orders (training.loop.batch_rows)


class Trainer:
    """The shared drafter trainer: trains a drafter of one drafting method for ``target`` on a
    token dataset, in ``run_dir``. The loop is the same for every method (data order, AdamW
    with warmup and cosine decay, clipping, Orbax checkpoints, exact resume, JSONL metrics,
    held-out tau, meshes); a method's trainer subclass is its objective, the parts marked
    "the method's parts" below (``docs/methods.md``): :meth:`init_params`, :meth:`batch`,
    :meth:`loss` and :meth:`drafter`, and where it needs them the others.

    run_dir/run.json (configs; a resume with different ones is refused), run_dir/checkpoints
    (Orbax: params, optimizer state, step), run_dir/metrics.jsonl.

    With ``mesh`` (a method whose :attr:`supports_mesh`) it trains on several devices or hosts
    (``training.sharding``): checkpoints are written sharded (each process its shards) and
    restore onto any mesh; a resume on the same mesh is bitwise exact on CPU, on another one
    equal up to float rounding.

    ``Trainer(...)`` itself, as before drafting methods were plug-ins, is the default method's
    trainer (DFlash's), with a DeprecationWarning.
    """

    method: str = ""  # the drafting method's registry name (train's --method)
    record_added: dict = {}  # settings added to the run record after runs were started
    record_names_method = True  # run.json's "method" (runs of the default method written before it lack it)
    ignored_settings: tuple[str, ...] = ()  # TrainConfig fields the method's objective does not read
    supports_mesh = False  # whether the objective trains on a mesh (else a mesh is refused)

    def __new__(cls, *args, **kwargs):
        if cls is Trainer:  # the old spelling: the default method's trainer
            default = methods.method(methods.DEFAULT).trainer
            warnings.warn(f"Trainer(...) is the shared loop now; {methods.DEFAULT}'s trainer is "
                          f"{default.__module__}.{default.__name__}", DeprecationWarning, stacklevel=2)
            return default(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, target, drafter_config, data: TokenDataset, run_dir: str, cfg: TrainConfig,
                 eval_prompts: Sequence[Sequence[int]] | None = None, init_from: str | None = None,
                 mesh=None, fsdp: bool = False):
        """``init_from``: a drafter directory (the method's released layout) to start from
        instead of random weights (continued training / fine-tuning); its config must equal
        ``drafter_config``.

        ``mesh``: a ``(data, model)`` mesh (``dflash_jax.parallel.make_mesh``) to train on:
        batch rows over ``data``, the frozen target tensor-parallel over ``model`` by
        ``parallel.rules`` (a target on no mesh or another one is placed on this one), the
        drafter and its optimizer state replicated, or with ``fsdp`` split over ``data``
        (``training.sharding`` says what goes where and why jit's GSPMD partitioning). The
        mesh and the layout are not part of the run's settings: a run resumes on any mesh
        (its checkpoint is restored onto the new layout) and continues equally up to float
        rounding. Only process 0 writes run.json and the metrics. None: one device, the
        single-device step unchanged."""
        if mesh is not None and not self.supports_mesh:
            raise ValueError(f"{methods.method(self.method).label} training runs on one device (drop --mesh)")
        drafter_config.check_target(target.config)
        self.target, self.dcfg = target, drafter_config
        self.init_from = None if init_from is None else os.path.abspath(init_from)
        if init_from is not None:
            self._check_init_from(init_from)
        if len(data) < cfg.batch_size:
            raise ValueError(f"the dataset has {len(data)} sequences, fewer than batch_size {cfg.batch_size}")
        if fsdp and mesh is None:
            raise ValueError("fsdp shards the drafter over the mesh's data axis: give a mesh too (--mesh)")
        self.mesh, self.fsdp = mesh, bool(fsdp)
        if mesh is not None:  # every check before any work
            sharding.check_mesh(mesh, cfg.batch_size, target.config, drafter_config,
                                len(eval_prompts) if eval_prompts and cfg.eval_every else 0)
            if target.mesh != mesh:
                target = dataclasses.replace(target, mesh=mesh)  # its params placed by the rules
        self.target, self.data, self.cfg, self.eval_prompts = target, data, cfg, eval_prompts
        self.run_dir = os.path.abspath(run_dir)
        self.shown_run_dir = os.fspath(run_dir)  # as the user gave it, for messages
        os.makedirs(self.run_dir, exist_ok=True)
        self.steps_per_epoch = steps_per_epoch(len(data), cfg.batch_size)
        self.num_steps = cfg.total_steps(len(data))
        record = self._run_record()
        check_run_file(self.run_dir, record, added=self.record_added, remedy=self._refusal_remedy(record))
        self.tx = make_optimizer(cfg, self.num_steps)
        self.schedule = make_schedule(cfg, self.num_steps)
        self.weights = self._loss_weights()
        self.compute_dtype = jnp.dtype(cfg.compute_dtype) if cfg.compute_dtype else target.dtype
        self.manager = checkpoint_manager(self.run_dir, cfg.keep_checkpoints)
        if mesh is not None:
            self.state_shardings = sharding.state_shardings(
                jax.eval_shape(lambda: self._fresh_state(jax.random.key(0))), mesh, self.fsdp)
        self._step_fns: dict[tuple[bool, ...], Any] = {}  # jitted steps by which inputs are None

    # ------------------------------------------------------------------ the method's parts
    def init_params(self, key) -> Any:
        """The drafter's random initial parameters (float32) from ``key``."""
        raise NotImplementedError(f"{type(self).__name__} must implement init_params")

    def batch(self, step: int) -> tuple:
        """The inputs of training step ``step`` as host arrays (None for an absent one): the
        rows of the step's batch (:func:`step_rows`), whatever the objective needs of them.
        Arrays are laid out rows first (split over the mesh's data axis on a mesh)."""
        raise NotImplementedError(f"{type(self).__name__} must implement batch")

    def loss(self, params, tparams, *inputs) -> tuple[jax.Array, dict]:
        """(loss, metrics) of the drafter ``params`` (in the compute dtype) on one step's
        inputs (:meth:`device_inputs` of :meth:`batch`); the metrics hold ``loss`` and
        ``accuracy_per_pos`` (float[positions]: how often each drafted position is right)."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss")

    def drafter(self, params) -> Any:
        """The drafter handle of ``params`` in the target's dtype, as ``generate`` takes it (for
        the held-out tau)."""
        raise NotImplementedError(f"{type(self).__name__} must implement drafter")

    def device_inputs(self, tparams, *inputs) -> tuple:
        """The step's inputs as the loss takes them, computed on the device inside the step but
        outside the differentiated loss (e.g. the target's features); default: as given."""
        return inputs

    def load_params(self, init_from: str) -> Any:
        """The float32 parameters of the drafter in ``init_from`` (checked already by
        :meth:`_check_init_from`)."""
        return methods.method(self.method).load(init_from, self.target, dtype=jnp.float32).params

    def _check_init_from(self, init_from: str) -> None:
        """Refuses an ``init_from`` drafter of another config than ``self.dcfg``."""
        loaded = methods.method(self.method).config_from_hf(read_config_json(init_from))
        if loaded != self.dcfg:
            raise ValueError(f"{init_from} holds a drafter with another config ({loaded}); "
                             f"expected {self.dcfg}")

    def _loss_weights(self) -> jax.Array | None:
        """The loss's weights the objective reads as ``self.weights`` (None: none)."""
        return None

    def record_settings(self) -> dict:
        """The run record's entries of the method's own settings (a resume must give the same)."""
        return {}

    def row_metrics(self, done: int, m: dict) -> dict:
        """The entries a step's metrics line adds to the loop's (``run_loop``'s row_metrics)."""
        return {"epoch": round(done / self.steps_per_epoch, 4),
                "accuracy_per_pos": [round(float(x), 4) for x in m["accuracy_per_pos"]]}

    def eval_options(self) -> dict:
        """``generate``'s options for the held-out tau (e.g. the block the method drafts)."""
        return {}

    # ------------------------------------------------------------------ bookkeeping
    def _run_record(self) -> dict:
        # train.steps is the run's length (from epochs when they were given); train.epochs as given
        train = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in self.ignored_settings}
        return ({"method": self.method} if self.record_names_method else {}) | {
            "drafter": self.dcfg.to_hf_dict(), "train": train | {"steps": self.num_steps},
            "target": self.target.path, "data_dir": os.path.abspath(self.data.data_dir)} | (
            self.record_settings()) | ({"init_from": self.init_from} if self.init_from else {}) | (
            {"target_quantization": self.target.quantization} if getattr(self.target, "quantization", None) else {})

    def _method_flag(self) -> str:
        """What the messages' `train` commands add for this method (nothing for the default)."""
        return "" if self.method == methods.DEFAULT else f" --method {self.method}"

    def _refusal_remedy(self, record: dict) -> str:
        """What the refusal of other settings on this run directory suggests: a run's settings
        (its length too: the learning rate decays to 0 at its last step) cannot change, so
        training on from a run's weights is a new run started ``--init-from`` its export (when
        it has a checkpoint and the drafter keeps its shape)."""
        steps = saved_steps(self.run_dir)
        if not steps:
            return NEW_RUN_REMEDY
        try:
            with open(os.path.join(self.run_dir, RUN_FILE)) as f:
                same_drafter = json.load(f).get("drafter") == json.loads(json.dumps(record["drafter"]))
        except (OSError, ValueError, AttributeError):
            same_drafter = False
        if not same_drafter:
            return (f"{NEW_RUN_REMEDY} (a drafter of another shape cannot start from this run's "
                    "weights)")
        run, export = self._shown_paths(steps[-1])
        return (f"a run's settings cannot change, its length neither (the learning rate decays to 0 at "
                f"its last step): resume with the same settings, or train on from this run's weights "
                f"(step {steps[-1]}) in a new run directory: `python -m dflash_jax export --run {run} --out "
                f"{export}`, then `python -m dflash_jax train{self._method_flag()} --init-from {export} "
                f"--run NEW_RUN_DIR "
                f"...` with the new settings")

    def _shown_paths(self, step: int) -> tuple[str, str]:
        """(the run directory as the user gave it, the export directory the messages suggest)."""
        run = self.shown_run_dir.rstrip("/\\") or self.shown_run_dir
        return run, f"{run}-step{step}"

    def complete_message(self, step: int) -> str:
        """The line a run that has done all its steps prints when it is run again."""
        run, export = self._shown_paths(step)
        # as --target takes it: 'embedded' for the shipped model, a hub snapshot by its repo id
        target = checkpoint_name(self.target.path) if self.target.path else "TARGET_DIR"
        return (f"run {run} is complete at step {step} of {self.num_steps} (checkpoint "
                f"{os.path.join(run, CHECKPOINTS, str(step))}); nothing to train. Export it with "
                f"`python -m dflash_jax export --run {run} --out {export}` and evaluate it with "
                f"`python -m dflash_jax bench --target {target} --drafter {export}`; to train "
                f"on, start a new run from the export: `python -m dflash_jax "
                f"train{self._method_flag()} --init-from {export} "
                f"--run NEW_RUN_DIR ...`")

    def init_state(self, seed: int | None = None) -> dict:
        """The state a run starts from: :meth:`load_params` of ``init_from``, or random weights
        (:meth:`init_params` of ``seed``, default the run's)."""
        if self.init_from is None:
            return self._fresh_state(jax.random.key(self.cfg.seed if seed is None else seed))
        return self._state_of(self.load_params(self.init_from))

    def _fresh_state(self, key) -> dict:
        """The initial state of random weights from ``key``."""
        return self._state_of(self.init_params(key))

    def _state_of(self, params) -> dict:
        return {"params": params, "opt_state": self.tx.init(params), "step": jnp.int32(0)}

    def restore_or_init(self) -> dict:
        """The newest checkpoint, or the initial state; on a mesh, laid out by
        ``state_shardings`` (a checkpoint written on another mesh is resharded as it loads)."""
        fresh = self.init_state()
        if self.mesh is not None:
            fresh = sharding.place(fresh, self.state_shardings)
        return restore_latest(self.manager, fresh)

    # ------------------------------------------------------------------ the step
    def schedule_inputs(self, step) -> tuple:
        """Inputs of the loss that follow the training step (``step``: int32, the optimizer steps
        done, traced), appended to :meth:`device_inputs`'s (e.g. Domino's base-loss weight);
        default: none."""
        return ()

    def _train_step(self, state, tparams, *inputs):
        inputs = tuple(self.device_inputs(tparams, *inputs)) + tuple(self.schedule_inputs(state["step"]))

        def loss_fn(p):
            p = jax.tree.map(lambda x: x.astype(self.compute_dtype), p)
            return self.loss(p, tparams, *inputs)

        return self._optimizer_step(state, loss_fn)

    def _optimizer_step(self, state, loss_fn):
        """One AdamW step on ``loss_fn(params) -> (loss, metrics)`` (gradients in float32):
        (the new state, the metrics with the gradient norm and learning rate)."""
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {**metrics, "grad_norm": optax.global_norm(grads), "lr": self.schedule(state["step"])}
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    def _step_fn(self, state, tparams, *inputs):
        """The jitted step on ``inputs``: one compilation per pattern of absent (None) inputs;
        on a mesh, partitioned by XLA from the shardings of its inputs and outputs."""
        absent = tuple(x is None for x in inputs)
        fn = self._step_fns.get(absent)
        if fn is None:
            if self.mesh is None:
                fn = jax.jit(self._train_step)
            else:
                rows = sharding.batch_sharding(self.mesh)
                fn = jax.jit(self._train_step, in_shardings=(
                    self.state_shardings, sharding.param_shardings(self.target.params, self.mesh),
                    *(None if a else rows for a in absent)),
                    out_shardings=(self.state_shardings, sharding.replicated(self.mesh)))
            self._step_fns[absent] = fn
        return fn(state, tparams, *inputs)

    def step_inputs(self, step: int) -> tuple:
        """:meth:`batch` of ``step`` as device arrays: on a mesh, global arrays with their rows
        over ``data`` (every process has the batch)."""
        inputs = self.batch(step)
        if self.mesh is not None:
            rows = sharding.batch_sharding(self.mesh)
            return tuple(None if x is None else sharding.global_array(x, rows) for x in inputs)
        return tuple(None if x is None else jnp.asarray(x) for x in inputs)

    def step_rows(self, step: int) -> tuple[int, np.ndarray, int]:
        """(epoch, sorted sequence ids, columns) of training step ``step``: the step's rows of
        the epoch's permutation (:func:`~dflash_jax.training.loop.batch_rows`, the same order for
        every method) and its width, its longest row rounded up to a bucket (the padding after
        it changes nothing: attention is causal and the losses count response tokens only), so
        a dataset padded to a long max_len does not make every step pay for it; few buckets,
        few compilations."""
        epoch, ids = batch_rows(step, len(self.data), self.cfg.batch_size, self.cfg.seed, BATCH_STREAM)
        return epoch, ids, batch_width(self.data.lengths[ids], self.data.seq_len)

    # ------------------------------------------------------------------ the loop
    def evaluate_tau(self, params) -> float:
        """tau of :meth:`drafter` of ``params`` on the held-out prompts (``eval_max_new_tokens``
        each; on a mesh, by the sharded engine)."""
        r = generate(self.target, list(self.eval_prompts), self.cfg.eval_max_new_tokens,
                     drafter=self.drafter(params), **self.eval_options())
        return r.tau

    def _evaluate_start(self, state) -> None:
        """A run that starts from a drafter (``--init-from``) with held-out evaluation measures
        that drafter's held-out tau before its first step, once (:data:`START_EVAL_FILE`), so
        that its curve says what the training changed."""
        path = os.path.join(self.run_dir, START_EVAL_FILE)
        if (self.init_from is None or not (self.eval_prompts and self.cfg.eval_every)
                or int(state["step"]) != 0 or os.path.exists(path)):
            return
        tau = self.evaluate_tau(state["params"])
        if jax.process_index() == 0:
            write_json(path, {"eval_tau": tau, "step": 0})
            print(f"held-out tau of the starting drafter (--init-from): {tau:.2f}", flush=True)

    def run(self, stop_after: int | None = None) -> dict:
        """Trains until the run's length (``num_steps``; or ``stop_after`` more steps); returns
        the final state (:func:`~dflash_jax.training.loop.run_loop`).

        A run that has done all its steps trains nothing and writes nothing: it prints one
        line (:meth:`complete_message`: the step, its checkpoint, how to export, evaluate and
        train on) and returns its last checkpoint's state."""
        done = self.manager.latest_step()
        if done is not None and done >= self.num_steps:
            if jax.process_index() == 0:
                print(self.complete_message(done), flush=True)
            return self.restore_or_init()

        def evaluate(state, done, last):
            if self.eval_prompts and self.cfg.eval_every and done % self.cfg.eval_every == 0:
                return {"eval_tau": self.evaluate_tau(state["params"])}
            return {}

        state = self.restore_or_init()
        self._evaluate_start(state)
        return run_loop(
            state, lambda state, *inputs: self._step_fn(state, self.target.params, *inputs),
            self.step_inputs, self.manager, os.path.join(self.run_dir, METRICS_FILE),
            num_steps=self.num_steps, checkpoint_every=self.cfg.checkpoint_every,
            tokens_per_step=self.cfg.batch_size * self.data.seq_len, row_metrics=self.row_metrics,
            evaluate=evaluate, stop_after=stop_after, desc="training drafter",
            postfix=lambda row: {"loss": f"{row['loss']:.3f}",
                                 "accuracy1": f"{row['accuracy_per_pos'][0]:.2f}"})


def run_method(run_dir: str) -> tuple[Any, dict]:
    """(the drafting method a run trains, its run.json): run.json's ``method``; runs recorded
    before runs named their method have none and are the default method's (DFlash's)."""
    with open(os.path.join(run_dir, RUN_FILE)) as f:
        record = json.load(f)
    return methods.method(record.get("method", methods.DEFAULT)), record


def latest_params(run_dir: str) -> tuple[Any, Any, int]:
    """(drafter config, fp32 params, step) of a run's newest checkpoint; the config is the run's
    drafting method's (:func:`run_method`)."""
    return _latest(run_dir, *run_method(run_dir))


def _latest(run_dir: str, method, record: dict) -> tuple[Any, Any, int]:
    """:func:`latest_params` for a run whose method and run.json were read already."""
    dcfg = method.config_from_hf(record["drafter"])
    manager = reading_manager(run_dir)
    step = manager.latest_step()
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints yet")
    # a checkpoint written on a mesh of other devices loads onto this process's first device
    restored = manager.restore(step, args=ocp.args.StandardRestore(
        fallback_sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0])))
    return dcfg, restored["params"], step


def export_run(run_dir: str, out_dir: str, dtype=None) -> dict:
    """Writes a run's newest drafter in its method's released layout (loadable by
    ``load_drafter``, with whatever else the method's layout holds). Returns what was exported:
    ``{"method": its registry name, "label", "step": the checkpoint's, "target": the run's
    target directory as run.json records it}``."""
    method, record = run_method(run_dir)
    dcfg, params, step = _latest(run_dir, method, record)
    if dtype is not None:
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
    if jax.process_index() == 0:  # across hosts, process 0 writes the export
        save_drafter(method.from_run(run_dir, record, dcfg, params), out_dir)
    return {"method": method.name, "label": method.label, "step": int(step), "target": record.get("target"),
            "target_quantization": record.get("target_quantization")}
