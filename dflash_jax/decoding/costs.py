"""Measured cost tables of the adaptive block size (``verification.adaptive``): the seconds of one
decode iteration at each verify length, for a model pair, batch and device.

A table is measured once per (model pair, dtype, batch, device) by timing the decode loop forced
to each length, and cached as JSON in :func:`cache_dir` (``$DFLASH_CACHE_DIR``, else
``$XDG_CACHE_HOME/dflash_jax``, else ``~/.cache/dflash_jax``). A cached table is used only when
everything it was measured with matches; otherwise (another model, dtype, batch, device, CPU,
jax version, decode-loop version ``engine.LOOP_VERSION``, or an unreadable file) it is measured
again and replaced. ``generate`` and ``generate_stream`` call :func:`cost_table` before they
prepare their arguments when no table is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import jax
import numpy as np

from dflash_jax.decoding import engine
from dflash_jax.verification.adaptive import Adaptive, check_cost_table
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.files import exclusive, write_json
from dflash_jax.reporting import cpu_flags, cpu_model, load_average

MEASURE_CONTEXT = 192  # prompt tokens before the timed iterations (a typical benchmark prompt)
MEASURE_ITERATIONS = 24
MEASURE_REPEATS = 3


def cache_dir() -> str:
    """Where measured cost tables are cached (see the module docstring)."""
    if os.environ.get("DFLASH_CACHE_DIR"):
        return os.environ["DFLASH_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dflash_jax")


def device_signature(mesh=None) -> dict:
    """What the cost of an iteration depends on besides the models: the devices, the CPU
    (model, cores, instruction-set flags: two machines named "AMD EPYC" may differ in AVX-512)
    and the jax build."""
    dev = jax.devices()[0]
    flags = cpu_flags()
    return {"platform": dev.platform, "device_kind": getattr(dev, "device_kind", str(dev)),
            "devices": 1 if mesh is None else int(np.prod(mesh.devices.shape)),
            "mesh": None if mesh is None else dict(zip(mesh.axis_names, map(int, mesh.devices.shape))),
            "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "cpu_flags": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16],
            "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def cost_key(target, drafter, lengths: tuple[int, ...], batch: int, device: dict | None = None,
             splits: tuple[int, ...] | None = None) -> dict:
    """Everything a measured cost table depends on (compared whole when a cached table is read).
    ``splits``: per-row verification's (the table is then per split)."""
    dtype = lambda params: sorted({str(x.dtype) for x in jax.tree_util.tree_leaves(params)})
    key = {"target": target.config.to_hf_dict(), "drafter": drafter.config.to_hf_dict(),
           "dtype": dtype(target.params) + dtype(drafter.params), "verify_lengths": list(lengths),
           "batch": int(batch), "context": MEASURE_CONTEXT, "loop_version": engine.LOOP_VERSION,
           "device": device_signature(target.mesh) if device is None else device}
    if splits is not None:
        key["row_splits"] = list(splits)
    return key


def cache_path(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), f"verify-costs-{digest}.json")


def read_cached(key: dict) -> dict[int, float] | None:
    """The cached table measured with exactly ``key``, or None (absent, unreadable, or made
    with other settings: a file copied from another machine, say)."""
    path = cache_path(key)
    try:
        with open(path) as f:
            record = json.load(f)
        if json.loads(json.dumps(key, default=str)) != record["key"]:
            return None
        return {int(k): float(v) for k, v in record["costs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def cost_table(target, drafter, lengths: tuple[int, ...], batch: int = 1, *,
               refresh: bool = False, quiet: bool = False, splits: tuple[int, ...] | None = None
               ) -> dict[int, float]:
    """The per-iteration cost (seconds) of each verify length for this model pair, batch and
    device: the cached table when one matches, else measured (:func:`measure_costs`) and cached
    (written atomically; concurrent measurements of the same key are serialised). With
    ``splits`` (per-row verification, ``lengths`` = (short, long)): the cost of each split."""
    key = cost_key(target, drafter, lengths, batch, splits=splits)
    if not refresh and (hit := read_cached(key)) is not None:
        check_cost_table(hit, lengths if splits is None else splits, "verify length" if splits is None else "split")
        return hit
    path = cache_path(key)
    with exclusive(path + ".lock"):
        if not refresh and (hit := read_cached(key)) is not None:  # measured meanwhile
            return hit
        if not quiet:
            what = f"verify lengths {list(lengths)}" if splits is None else \
                f"row splits {list(splits)} (rows verifying {lengths[1]} rows, the rest {lengths[0]})"
            print(f"measuring the cost of an iteration at {what} on this device (once; cached in {path})",
                  file=sys.stderr)
        costs = measure_costs(target, drafter, lengths, batch, splits=splits)
        store(key, costs)
    return costs


def store(key: dict, costs: dict[int, float]) -> str:
    """Writes ``costs`` (seconds per decode iteration, by verify length or split) as the cached
    table of ``key`` (atomically), stamped with the time and load average; returns its path."""
    path = cache_path(key)
    write_json(path, {"key": key, "costs": {str(k): v for k, v in costs.items()},
                      "unit": "seconds per decode iteration",
                      "measured": {"time": _time_text(), "load_average": load_average()}})
    return path


def measure_costs(target, drafter, lengths: tuple[int, ...], batch: int = 1,
                  context: int = MEASURE_CONTEXT, iterations: int = MEASURE_ITERATIONS,
                  repeats: int = MEASURE_REPEATS, splits: tuple[int, ...] | None = None
                  ) -> dict[int, float]:
    """Seconds per decode iteration with the verify length forced to each of ``lengths``
    (the real on-device loop: draft of the whole block, verify + accept of L rows, commit),
    the median of ``repeats`` timed runs of ``iterations`` iterations after a warm-up, at a
    context of ``context`` prompt tokens. The lengths take turns (one run of each per round,
    after one compiling round), so a load that comes and goes during the measurement slows
    them alike: the choice depends only on their ratios. With ``splits`` (per-row
    verification): the seconds per iteration with the split forced to each of them instead."""
    V, longest = target.config.vocab_size, max(lengths)
    # a budget no run can exhaust before its timed iterations (a full block accepted each time)
    # and the context, both within the cache (a small target's max_len shortens them)
    iterations = max(1, min(iterations, (target.max_len // 2 - 1) // longest))
    budget = iterations * longest + 1
    context = max(1, min(context, target.max_len - budget))
    prompt = [(np.arange(context) * 7919 % V).tolist()] * batch  # fixed tokens, no stop ids
    forced = {L: Adaptive(lengths=(L,), cost_table={L: 1.0}) for L in lengths} if splits is None else \
        {k: Adaptive(per_row=True, lengths=lengths, splits=(k,), cost_table={k: 1.0}) for k in splits}
    times = {k: [] for k in forced}
    for r in range(repeats + 1):  # the first round compiles
        for k, policy in forced.items():
            t = iteration_seconds(target, drafter, prompt, budget, iterations, verify=policy)
            if r:
                times[k].append(t)
    return {k: float(np.median(t)) for k, t in times.items()}


def iteration_seconds(target, drafter, prompt, budget: int, iterations: int, **options) -> float:
    """Seconds per iteration of one run of the real decode loop (``engine.decode``) for at
    most ``iterations`` iterations after a fresh prefill of ``prompt`` (``options``: those of
    ``generate``); the first call of a shape includes its compilation."""
    pre = prepare_decode(target, prompt, budget, drafter=drafter, **options)
    t0 = time.perf_counter()
    state = engine.decode(target.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                          np.int32(iterations), spec=pre.spec)
    jax.block_until_ready(state.n)
    return (time.perf_counter() - t0) / max(int(np.max(jax.device_get(state.iters))), 1)


def _time_text() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
