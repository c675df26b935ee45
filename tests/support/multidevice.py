"""Running test code on several (host CPU) devices, in a subprocess, so that the rest of the
suite keeps its one device: XLA reads ``--xla_force_host_platform_device_count`` once, when jax
starts its CPU backend.

The code runs as a script with the repository on ``sys.path`` and prints its result as the
JSON line ``RESULT {...}`` (:func:`emit`); :func:`run_on_devices` returns that dict and shows
the subprocess's output when it fails.

``fast_compile=True`` adds :func:`fast_compile_flags` to the subprocess's ``XLA_FLAGS``, for a
subprocess that compiles many small programs and runs each for a few steps (compiling is then
nearly all its time): XLA:CPU's LLVM backend at optimisation level 0 and, where this jaxlib still
has them, the elemental (pre-MLIR) fusion emitters (``--xla_cpu_use_fusion_emitters=false``;
newer jaxlibs removed the flag, and XLA aborts on an unknown flag, so it is added only when this
jaxlib knows it). The SPMD partitioning, hence the collectives, is the same; the fused kernels'
code differs. Measured (2 cores, CPU time): the sampled DFlash decode
loop on a 2 x 4 mesh compiles in 10.6 s at the default level, 5.9 s at level 0, 3.0 s at level 0
with the elemental emitters; ``test_expert_parallel.py``'s subprocess took 132 s, 87 s and 52 s
(a loaded machine: +-15 %); ``test_parallel.py``'s 8-device engine runs 508 s at the default
level, 336 s at level 0 (an earlier measurement). Floating-point results may differ in the last
bits between the settings (the reference logits moved by about 1e-6; every token, acceptance
length, sampled draw and compiled collective of ``test_expert_parallel.py`` and
``test_vocab_parallel.py`` was the same), so a test that compares a single-device run with a
sharded one compiles both in the same subprocess, under the same flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.fast_compile import flags as fast_compile_flags, names as fast_compile_names

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "RESULT "


def device_env(devices: int, fast_compile: bool = False) -> dict:
    """The environment of a subprocess with ``devices`` host CPU devices (and, with
    ``fast_compile``, :func:`fast_compile_flags`)."""
    env = dict(os.environ)
    own = ("force_host_platform_device_count",) + (fast_compile_names() if fast_compile else ())
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not any(o in f for o in own)]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]
                                + (list(fast_compile_flags()) if fast_compile else []))
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_on_devices(code: str, devices: int = 8, timeout: float = 1200, args=(), fast_compile: bool = False) -> dict:
    """Runs ``code`` (dedented) with ``devices`` host devices; returns what it emitted."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          env=device_env(devices, fast_compile), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(PREFIX)]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"multi-device subprocess failed (exit {proc.returncode}):\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}")
    return json.loads(lines[-1][len(PREFIX):])


_RESULTS: dict = {}


def shared_run(tmp_path_factory, name: str, code: str, devices: int = 8, fast_compile: bool = False) -> dict:
    """:func:`run_on_devices` once per test session, however pytest-xdist spreads the tests that
    use it: the result is kept for the process and in a file under the session's base temp
    directory that every worker shares (the first worker runs it under a lock, the others wait
    and read it). CI's logs showed a module fixture set up on two workers despite its
    ``xdist_group`` (twice 345 s)."""
    if name in _RESULTS:
        return _RESULTS[name]
    from dflash_jax.files import exclusive

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / f"multidevice-{name}.json"
    with exclusive(str(path) + ".lock"):
        if path.exists():
            result = json.loads(path.read_text())
        else:
            result = run_on_devices(code, devices, fast_compile=fast_compile)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            os.replace(tmp, path)
    _RESULTS[name] = result
    return result


def emit(result: dict) -> None:
    """Called by the subprocess code: prints the result line."""
    print(PREFIX + json.dumps(result), flush=True)


def error(fn) -> str | None:
    """Called by the subprocess code: the message of the ValueError ``fn()`` raises, or None
    when it raises none (a refusal that did not happen)."""
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None
