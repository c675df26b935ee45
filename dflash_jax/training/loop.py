"""The training loop of the drafter trainer and of the embedded target's pretraining: the
optimizer (AdamW, linear warmup then cosine decay, global-norm clipping), the batch order, and
:func:`run_loop`, which runs the steps with exact resume, JSONL metrics and a tqdm bar.

Determinism: the rows of step s depend only on (seed, s) (:func:`batch_rows`), so a run killed
at any point and resumed from its last checkpoint repeats no step and loses none; on CPU the
resumed run ends bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from dflash_jax.progress import progress

from dflash_jax.training.run_dir import truncate_metrics


def make_schedule(cfg, steps: int | None = None):
    """Warmup (``warmup_fraction`` of the run) then cosine decay to 0 over ``steps`` (default
    ``cfg.steps``); ``cfg`` has ``learning_rate``, ``warmup_fraction`` (and ``steps``)."""
    steps = cfg.steps if steps is None else steps
    if steps is None:
        raise ValueError("make_schedule needs the run's length: pass steps (TrainConfig.total_steps)")
    warmup = max(1, int(round(cfg.warmup_fraction * steps)))
    return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(steps, warmup + 1), 0.0)


def make_optimizer(cfg, steps: int | None = None):
    """Global-norm clipping (``cfg.grad_clip``), then AdamW (``cfg.weight_decay``) on
    :func:`make_schedule`."""
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(make_schedule(cfg, steps), weight_decay=cfg.weight_decay))


def batch_rows(step: int, num_rows: int, batch_size: int, seed: int, stream: int) -> tuple[int, np.ndarray]:
    """(epoch, sorted row ids) of training step ``step``.

    An epoch is ``num_rows // batch_size`` steps; each epoch walks a new permutation of the
    rows, drawn from (``seed``, epoch, ``stream``), batch by batch (the last
    ``num_rows % batch_size`` of it are left out that epoch). ``stream`` keeps the orders of
    different trainers apart (the drafter's is 7, the pretraining's 11)."""
    per_epoch = num_rows // batch_size
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch, stream]).permutation(num_rows)
    return epoch, np.sort(perm[i * batch_size:(i + 1) * batch_size])


def _agreed(flag: bool) -> bool:
    """Process 0's ``flag`` on every process (itself on a single-process run)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def run_loop(state: dict, step_fn: Callable[..., tuple[dict, dict]], batch: Callable[[int], tuple],
             manager: ocp.CheckpointManager, metrics_file: str, *, num_steps: int,
             checkpoint_every: int, tokens_per_step: int,
             row_metrics: Callable[[int, dict], dict] | None = None,
             evaluate: Callable[[dict, int, bool], dict] | None = None,
             postfix: Callable[[dict], dict] | None = None,
             stop_after: int | None = None, max_minutes: float | None = None,
             desc: str = "training") -> dict:
    """Runs training steps from ``state`` (restored from the newest checkpoint, or fresh) to
    ``num_steps``, or ``stop_after`` more steps, or until ``max_minutes`` pass; returns the
    final state.

    Step s (counted from 0, ``state["step"]`` is the first to run) is
    ``state, metrics = step_fn(state, *batch(s))``; the step function's metrics hold at least
    ``loss``, ``lr`` and ``grad_norm``. After it, with ``done = s + 1`` steps done:

    - a line of ``metrics_file`` (lines past the starting step, left by a killed run, are
      dropped first): ``step`` (done), ``loss``, ``lr``, ``grad_norm``, then
      ``row_metrics(done, metrics)``, ``tokens_per_s`` (``tokens_per_step`` over the step's
      time, the batch's assembly included) and ``time_s``, then ``evaluate(state, done, last)``
      (entries added to the line; ``last``: the run ends here, at ``num_steps`` or on the time
      limit);
    - a checkpoint (``manager``) every ``checkpoint_every`` steps and at the end of the run
      (``num_steps``, or the time limit, which stops the run on the checkpoint). A
      ``stop_after`` stop does not save: the resume starts at the last checkpoint.

    Across hosts every process runs the loop (the steps and the Orbax saves are collective:
    each process writes its own shards of a sharded state); only process 0 writes the
    metrics file and shows the bar. The time limit is process 0's decision, shared with the
    others, so that every process stops on the same step.
    """
    start = int(state["step"])
    main = jax.process_index() == 0
    if main:
        truncate_metrics(metrics_file, start)
    end = num_steps if stop_after is None else min(num_steps, start + stop_after)
    t_start = time.time()
    bar = progress(range(start, end), initial=start, total=num_steps, desc=desc, disable=not main)
    if start < end and main:
        bar.write("compiling the training step (the first step's time includes it) ...")
    with open(metrics_file if main else os.devnull, "a") as log:
        for step in bar:
            t0 = time.perf_counter()
            state, m = step_fn(state, *batch(step))
            m = jax.device_get(m)
            dt = time.perf_counter() - t0
            done = step + 1
            row = {"step": done, "loss": float(m["loss"]), "lr": float(m["lr"]),
                   "grad_norm": float(m["grad_norm"]), **(row_metrics(done, m) if row_metrics else {}),
                   "tokens_per_s": tokens_per_step / dt, "time_s": dt}
            timeout = max_minutes is not None and _agreed(time.time() - t_start > 60 * max_minutes)
            last = done == num_steps or timeout
            if evaluate is not None:
                row.update(evaluate(state, done, last))
            log.write(json.dumps(row) + "\n")
            log.flush()
            bar.set_postfix(postfix(row) if postfix else {"loss": f"{row['loss']:.3f}"})
            if done % checkpoint_every == 0 or last:
                manager.save(done, args=ocp.args.StandardSave(state))
            if timeout:
                break
    manager.wait_until_finished()
    return state

