"""What the benchmarks share: timing a compiled function, measured copy and read bandwidths,
the model benchmarks' parser. (What a result file records and how it is written:
``dflash_jax.reporting``.)"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def time_fn(fn, *args, repeats: int = 5) -> float:
    """Median wall seconds of ``fn(*args)`` (already compiled by one warm-up call)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def time_in_program(fn, *args, calls: int = 16, repeats: int = 5) -> float:
    """Median seconds per call of ``fn(*args)`` when ``calls`` calls run inside ONE compiled
    program, as a kernel does inside the on-device decode loop: no host dispatch between them
    (``time_fn`` of a single small kernel measures mostly dispatch and synchronisation). Each
    call gets a slightly different first argument, so the compiler cannot merge them, and every
    output feeds a small sum, so none is dropped."""

    def many(x, *rest):
        total = jnp.zeros((), jnp.float32)
        for i in range(calls):
            # factors 1 + i/64 are distinct in bfloat16 too (finer steps round to equal
            # values there, and the compiler then merges the calls: an inflated bandwidth)
            out = fn(x * jnp.asarray(1 + i / 64, x.dtype), *rest)
            total = total + jnp.sum(out[..., :1].astype(jnp.float32))
        return total

    return time_fn(jax.jit(many), *args, repeats=repeats) / calls


def copy_bandwidth(num_bytes: int | None = None, repeats: int = 10) -> float:
    """Device-to-device bandwidth in bytes/s: an elementwise ``x + 1`` over a large array
    reads and writes every byte once (2 * size bytes moved)."""
    if num_bytes is None:
        num_bytes = (1 << 30) if jax.devices()[0].platform == "gpu" else (256 << 20)
    x = jnp.zeros((num_bytes // 4,), jnp.float32)
    f = jax.jit(lambda a: a + 1.0)
    return 2 * x.nbytes / time_fn(f, x, repeats=repeats)


def read_bandwidth(num_bytes: int | None = None, repeats: int = 10) -> float:
    """Device read bandwidth in bytes/s: a full reduction reads every byte once. On CPUs a
    copy also pays for write-allocate traffic, so decode (which mostly reads) can exceed the
    copy figure; this one is the tighter bound there."""
    if num_bytes is None:
        num_bytes = (1 << 30) if jax.devices()[0].platform == "gpu" else (256 << 20)
    x = jnp.ones((num_bytes // 4,), jnp.float32)
    f = jax.jit(lambda a: jnp.sum(a))
    return x.nbytes / time_fn(f, x, repeats=repeats)


def add_preset_argument(p: argparse.ArgumentParser, presets) -> None:
    """``--preset``: the model shape of a model benchmark (one of ``presets``)."""
    p.add_argument("--preset", choices=sorted(presets), default="small",
                   help="model shape of the random-weight target")
