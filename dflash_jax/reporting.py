"""What every result file records, and how it is written: the command that produced it, the
machine and versions (:func:`environment`), and the JSON + PNG pair (:func:`write_report`).

Used by the benchmarks (``bench/``), the embedded-default build (``embedded/``) and training;
of ``dflash_jax`` it imports only ``files`` (atomic writes).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any, Callable

import jax

from dflash_jax.files import atomic_path, write_json


def environment() -> dict:
    """The device, the host and the versions a result was measured with."""
    import flax
    import numpy

    dev = jax.devices()[0]
    return {
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": dev.platform,
        "num_devices": jax.device_count(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),  # installed with jax
        "flax": flax.__version__,
        "numpy": numpy.__version__,
    }


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` line's value in ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): how busy the machine
    was, recorded beside every CPU timing."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_flags() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``; "" where unknown)."""
    return _cpuinfo("flags") or ""


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows, or None)."""
    return _cpuinfo("model name") or platform.processor() or None


def command_line(module: str, argv) -> str:
    """The command that produced a result, for its JSON file: ``python -m <module> <argv>``
    (``argv`` None: this process's own arguments)."""
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
    write_json(path + ".json", report)
    fig = plot(report)
    fig.tight_layout()
    with atomic_path(path + ".png", keep_extension=True) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    if not quiet:
        print(f"wrote {path}.json and {path}.png")
    return path
