"""A training run's directory, shared by the drafter trainer and the embedded target's
pretraining:

    run.json        the run's settings; a resume with other settings is refused
    checkpoints/    Orbax checkpoints of the training state (params, optimizer state, step)
    metrics.jsonl   one JSON line per step

A resume restores the newest checkpoint and drops the metric lines of the steps after it
(they run again), so a run killed at any point and resumed repeats no step and loses none.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import orbax.checkpoint as ocp

from dflash_jax.files import atomic_path, check_settings, write_json

RUN_FILE = "run.json"
CHECKPOINTS = "checkpoints"
METRICS_FILE = "metrics.jsonl"
START_EVAL_FILE = "start_eval.json"  # the held-out tau of the weights a run started --init-from


NEW_RUN_REMEDY = "resume with the same settings or use a new run directory"


def check_run_file(run_dir: str, record: dict, added: dict | None = None,
                   remedy: str = NEW_RUN_REMEDY) -> None:
    """Writes ``run_dir/run.json`` on a first start; on a resume, refuses other settings.

    Across hosts every process checks and only process 0 writes.
    ``added``: ``{section: {key: value}}``, settings added to ``record[section]`` after some
    runs were started, with the value those runs had implicitly; an old ``run.json`` without
    them resumes when the new record has that value (:func:`dflash_jax.files.check_settings`).
    ``remedy``: what the refusal tells the user to do instead."""
    path = os.path.join(run_dir, RUN_FILE)
    if check_settings(path, record, holder=f"{run_dir} belongs to a run", added=added,
                      remedy=remedy) is None \
            and jax.process_index() == 0:  # across hosts, only process 0 writes it
        write_json(path, record)


def saved_steps(run_dir: str) -> list[int]:
    """The steps of the checkpoints in ``run_dir/checkpoints``, oldest first, read from the
    directory names without opening them (Orbax names a finished checkpoint by its step and
    renames it into place only when it is complete)."""
    path = os.path.join(run_dir, CHECKPOINTS)
    if not os.path.isdir(path):
        return []
    return sorted(int(n) for n in os.listdir(path) if n.isdigit() and os.path.isdir(os.path.join(path, n)))


def checkpoint_manager(run_dir: str, keep: int) -> ocp.CheckpointManager:
    """Synchronous Orbax checkpoints in ``run_dir/checkpoints`` (a kill never leaves half a step)."""
    return ocp.CheckpointManager(
        os.path.join(run_dir, CHECKPOINTS),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False))


READ_ONLY_NOTICE = "Given directory is read only"
"""The start of the warning Orbax logs whenever a checkpoint manager is opened read-only."""


class _DropReadOnlyNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(READ_ONLY_NOTICE)


def reading_manager(run_dir: str) -> ocp.CheckpointManager:
    """The checkpoints of ``run_dir`` opened to read (export, evaluation): read-only, so that
    reading a run never creates, cleans or deletes anything in it (a run still training, or one
    on a read-only disk). The options are the ones read-only implies (Orbax warns about each
    it has to change), and the one warning Orbax logs for any read-only manager,
    :data:`READ_ONLY_NOTICE`, is dropped: reading is what was asked for, and a normal export
    prints no library warning."""
    logger = logging.getLogger("absl")  # Orbax logs through absl.logging
    notice = _DropReadOnlyNotice()
    logger.addFilter(notice)
    try:
        return ocp.CheckpointManager(
            os.path.join(os.path.abspath(run_dir), CHECKPOINTS),
            options=ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False))
    finally:
        logger.removeFilter(notice)


def restore_latest(manager: ocp.CheckpointManager, fresh: dict) -> dict:
    """The newest checkpoint restored into the structure of ``fresh``, or ``fresh`` if none."""
    latest = manager.latest_step()
    if latest is None:
        return fresh
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, fresh)
    return manager.restore(latest, args=ocp.args.StandardRestore(abstract))


def truncate_metrics(path: str, step: int) -> None:
    """Drops metric lines of steps after the restored checkpoint ``step`` (they will run again)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip()]
    keep = []
    for line in rows:
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            break  # a line cut by a kill: everything after it is stale
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.writelines(keep)


def held_out_curve(rows: list[dict], window: int = 50) -> list[dict]:
    """The held-out tau curve of a run's ``metrics.jsonl`` rows: for each step that measured it
    (``eval_tau``), ``{"step", "tau", "loss"}`` with the mean training loss of the ``window``
    steps up to it (None when no row in that window has a loss). Unrounded: callers round."""
    out = []
    for i, r in enumerate(rows):
        if r.get("eval_tau") is not None:
            recent = [x["loss"] for x in rows[max(0, i - window + 1):i + 1] if "loss" in x]
            out.append({"step": r["step"], "tau": float(r["eval_tau"]),
                        "loss": float(sum(recent) / len(recent)) if recent else None})
    return out


def start_tau(run_dir: str) -> float | None:
    """The held-out tau a run measured on its starting weights (``--init-from``, before its first
    step; :data:`START_EVAL_FILE`), or None."""
    path = os.path.join(run_dir, START_EVAL_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return float(json.load(f)["eval_tau"])


def metric_rows(run_dir: str) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` (none when it does not exist yet), up to a line cut
    by a kill."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return rows


def run_length(run_dir: str) -> int | None:
    """The steps a run is to train (its run.json's ``train.steps``), None when it has no run.json."""
    try:
        with open(os.path.join(run_dir, RUN_FILE)) as f:
            return int(json.load(f)["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_complete(run_dir: str) -> bool:
    """Whether ``run_dir`` holds a run whose newest checkpoint is its last step."""
    steps, saved = run_length(run_dir), saved_steps(run_dir)
    return steps is not None and bool(saved) and saved[-1] >= steps
