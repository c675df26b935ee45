"""XLA:CPU compile settings for the test run (tests/conftest.py applies them before jax starts).

Nearly all of the suite's time is XLA compiling small programs that then run for a few steps.
The suite compiles with XLA:CPU's LLVM backend at optimisation level 0 and, where this jaxlib
still has them, the elemental (pre-MLIR) fusion emitters (``--xla_cpu_use_fusion_emitters=false``;
newer jaxlibs removed the flag and XLA aborts on a flag it does not know, so a subprocess asks
first). The HLO passes (fusion, SPMD partitioning, hence every collective) are the same; the
fused kernels' machine code differs, so floating-point results may differ in the last bits from
a default-flag process. Every comparison in the suite is between programs of one run (one set
of flags), or against an oracle with a tolerance (transformers, float64, the reference package).

Measured on a 2-core machine: a random tiny target's parameters compile in 0.8-1.5 s instead of
4.5 s; ``tests/decoding/test_speculative.py`` and ``tests/targets/test_target_parity.py`` (fast
tier) took 77 s instead of 109 s wall, 84 s instead of 139 s CPU. ``DFLASH_TESTS_DEFAULT_XLA=1``
runs the suite with XLA's default settings instead (also any flag of these names the user's own
``XLA_FLAGS`` sets is kept as the user set it)."""

from __future__ import annotations

import os
import subprocess
import sys

FAST_COMPILE = "--xla_backend_optimization_level=0"
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_KNOWN = "DFLASH_TESTS_XLA_HAS_EMITTERS_FLAG"  # the probe's answer, inherited by workers


def has_emitters_flag() -> bool:
    """Whether this jaxlib's XLA knows ``--xla_cpu_use_fusion_emitters`` (asked of a subprocess
    once per run: XLA aborts at start-up on a flag it does not know)."""
    if _KNOWN not in os.environ:
        env = dict(os.environ, XLA_FLAGS=ELEMENTAL_EMITTERS, JAX_PLATFORMS="cpu")
        probe = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda: 0)()"], env=env,
                               capture_output=True, timeout=300)
        os.environ[_KNOWN] = "1" if probe.returncode == 0 else "0"
    return os.environ[_KNOWN] == "1"


def flags() -> tuple[str, ...]:
    """:data:`FAST_COMPILE`, and :data:`ELEMENTAL_EMITTERS` where this jaxlib has the flag."""
    return (FAST_COMPILE, ELEMENTAL_EMITTERS) if has_emitters_flag() else (FAST_COMPILE,)


def apply(environ=os.environ) -> None:
    """Adds :func:`flags` to ``environ["XLA_FLAGS"]`` (before jax creates its CPU backend), but
    not a flag the user has set either way, and nothing with ``DFLASH_TESTS_DEFAULT_XLA=1``."""
    if environ.get("DFLASH_TESTS_DEFAULT_XLA") == "1":
        return
    current = environ.get("XLA_FLAGS", "")
    added = [f for f in flags() if f.split("=")[0] not in current]
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
