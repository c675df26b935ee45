"""What every result file records: device, versions, and a measured copy bandwidth."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


def environment() -> dict:
    import flax
    import numpy

    dev = jax.devices()[0]
    return {
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": dev.platform,
        "num_devices": jax.device_count(),
        "host": platform.node(),
        "cpu_count": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
        "flax": flax.__version__,
        "numpy": numpy.__version__,
    }


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


def command_line(module: str, argv) -> str:
    """The command that produced a result, for its JSON file."""
    return f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)


def new_figure(*args, **kwargs):
    """``plt.subplots`` on the non-interactive Agg backend: ``(fig, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def write_report(report: dict, out_dir: str, stem: str, plot: Callable[[dict], Any],
                 quiet: bool = False) -> str:
    """Writes ``out_dir/stem.json`` and ``out_dir/stem.png`` (the figure that ``plot(report)``
    returns), each atomically (a temporary file renamed into place); returns the path stem."""
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem)
    with open(path + ".json.tmp", "w") as f:
        json.dump(report, f, indent=2)
    os.replace(path + ".json.tmp", path + ".json")
    fig = plot(report)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=120)
    plt.close(fig)
    os.replace(path + ".tmp.png", path + ".png")
    if not quiet:
        print(f"wrote {path}.json and {path}.png")
    return path


def bench_parser(command: str, doc: str, presets) -> argparse.ArgumentParser:
    """The argument parser the model benchmarks start from (with ``--preset``)."""
    from dflash_jax.cli import command_parser

    p = command_parser(command, doc)
    p.add_argument("--preset", choices=sorted(presets), default="small")
    return p
