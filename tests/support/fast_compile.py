"""XLA:CPU compile settings for the test run (tests/conftest.py applies them before jax starts).

Nearly all of the suite's time is XLA compiling small programs that then run for a few steps. The
suite compiles with XLA:CPU's LLVM backend at optimisation level 0 and, where this jaxlib still has
them, the elemental (pre-MLIR) fusion emitters (``--xla_cpu_use_fusion_emitters=false``; newer
jaxlibs removed the flag and XLA aborts on a flag it does not know, so a subprocess asks first), and
LLVM's code generation in one piece rather than split over threads
(``--xla_cpu_parallel_codegen_split_count=1``): the suite runs one pytest-xdist worker per core, so
the split's threads only contend with the other worker. The HLO passes (fusion, SPMD partitioning,
hence every collective) are the same; the fused kernels' machine code differs, so floating-point
results may differ in the last bits from a default-flag process. Every comparison in the suite is
between programs of one run (one set of flags), or against an oracle with a tolerance (transformers,
float64, the reference package).

Measured on a 2-core machine: a random tiny target's parameters compile in 0.8-1.5 s instead of 4.5
s; ``tests/decoding/test_speculative.py`` and ``tests/targets/test_target_parity.py`` (fast tier)
took 77 s instead of 109 s wall, 84 s instead of 139 s CPU. The serial code generation, measured on
the 2-core Xeon (the embedded pair's first DFlash and AR ``generate``, XLA's own backend-compile
time, two such processes at once as the suite's two workers are, 3 rounds): 2.0-2.5 s -> 1.5-1.6 s
backend compile, 3.7-4.7 s -> 3.1-3.3 s per process; alone, 1.6-1.8 s -> 1.4-1.6 s.
``DFLASH_TESTS_DEFAULT_XLA=1`` runs the suite with XLA's default settings instead (also any flag of
these names the user's own ``XLA_FLAGS`` sets is kept as the user set it)."""

from __future__ import annotations

import os
import subprocess
import sys

FAST_COMPILE = "--xla_backend_optimization_level=0"
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
SERIAL_CODEGEN = "--xla_cpu_parallel_codegen_split_count=1"
OPTIONAL = (ELEMENTAL_EMITTERS, SERIAL_CODEGEN)  # used where this jaxlib's XLA knows them


def _known_variable(flag: str) -> str:
    """The environment variable that holds the probe's answer for ``flag`` (inherited by workers)."""
    return "DFLASH_TESTS_XLA_KNOWS_" + flag.lstrip("-").split("=")[0].upper()


def knows(flag: str) -> bool:
    """Whether this jaxlib's XLA knows ``flag`` (asked of a subprocess once per run and flag:
    XLA aborts at start-up on a flag it does not know)."""
    known = _known_variable(flag)
    if known not in os.environ:
        env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
        probe = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda: 0)()"], env=env,
                               capture_output=True, timeout=300)
        os.environ[known] = "1" if probe.returncode == 0 else "0"
    return os.environ[known] == "1"


def flags() -> tuple[str, ...]:
    """:data:`FAST_COMPILE`, and each of :data:`OPTIONAL` that this jaxlib knows."""
    return (FAST_COMPILE, *(f for f in OPTIONAL if knows(f)))


def names() -> tuple[str, ...]:
    """The XLA flag names (no dashes, no value) that :func:`flags` may set."""
    return tuple(f.lstrip("-").split("=")[0] for f in (FAST_COMPILE, *OPTIONAL))


def apply(environ=os.environ) -> None:
    """Adds :func:`flags` to ``environ["XLA_FLAGS"]`` (before jax creates its CPU backend), but
    not a flag the user has set either way, and nothing with ``DFLASH_TESTS_DEFAULT_XLA=1``."""
    if environ.get("DFLASH_TESTS_DEFAULT_XLA") == "1":
        return
    current = environ.get("XLA_FLAGS", "")
    added = [f for f in flags() if f.split("=")[0] not in current]
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
