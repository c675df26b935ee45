"""JAX's persistent compilation cache for the command line: a second run of a command loads the
programs the first one compiled instead of compiling them again (on a 2-core CPU the engine's
programs take tens of seconds to minutes to compile; loading them takes seconds:
``results/main_command``).

Every ``python -m dflash_jax <command>`` and ``python -m experiments.<name>`` turns it on
(:func:`configure`, from :func:`dflash_jax.cli.run_cli`) under the project's home,
``$DFLASH_JAX_HOME/xla-cache`` (:func:`dflash_jax.files.home`, default
``~/.cache/dflash-jax/xla-cache``), bounded to :data:`DEFAULT_MAX_BYTES` with the least recently
used programs evicted first. JAX keys an entry by the program, the compile options and the
jax / XLA versions and devices, so a hit is the executable that compiling would give.

- ``DFLASH_JAX_COMPILATION_CACHE=off`` (or ``0``, ``false``, ``no``) turns it off; a directory
  there puts it elsewhere.
- ``DFLASH_JAX_COMPILATION_CACHE_MAX_GB`` bounds its size (default 2).
- A cache the user has configured for JAX itself (``JAX_COMPILATION_CACHE_DIR`` or
  ``jax.config.jax_compilation_cache_dir``) is left as it is.

From Python (a notebook, a script): :func:`use_compilation_cache` does the same.
"""

from __future__ import annotations

import os
import sys

from dflash_jax.files import home

CACHE_ENV = "DFLASH_JAX_COMPILATION_CACHE"
MAX_GB_ENV = "DFLASH_JAX_COMPILATION_CACHE_MAX_GB"
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
MIN_COMPILE_SECONDS = 0.5  # programs that compile faster are not worth a file
_OFF = {"0", "off", "false", "no"}


def default_dir(environ=None) -> str:
    """``HOME/xla-cache`` (:func:`dflash_jax.files.home`)."""
    return os.path.join(home(environ), "xla-cache")


def _max_bytes(environ) -> int:
    value = environ.get(MAX_GB_ENV)
    if value is None:
        return DEFAULT_MAX_BYTES
    try:
        gb = float(value)
    except ValueError:
        gb = -1.0
    if not gb > 0:
        raise ValueError(f"${MAX_GB_ENV}={value!r}: give the compilation cache's size bound in GB, "
                         f"a number > 0 (e.g. 2), or turn the cache off with {CACHE_ENV}=off")
    return int(gb * 1024 ** 3)


def _configured_by_user(environ) -> str | None:
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    if environ is os.environ and "jax" in sys.modules:
        return sys.modules["jax"].config.jax_compilation_cache_dir
    return None


def configure(environ=None) -> str | None:
    """Turns the persistent compilation cache on for this process (and the processes it starts,
    through the environment) as the module docstring says; returns its directory, or None
    when it is off. A directory the user gave JAX is kept and returned. ``environ``: this
    process's environment (default), or a mapping to fill for a process to start (then
    ``jax.config`` is left alone)."""
    environ = os.environ if environ is None else environ
    own = _configured_by_user(environ)
    if own:
        return own
    value = environ.get(CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    return use_compilation_cache(value or None, _max_bytes(environ), environ)


def use_compilation_cache(path: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                          environ=None) -> str:
    """Turns JAX's persistent compilation cache on at ``path`` (default :func:`default_dir`),
    bounded to ``max_bytes`` (least recently used entries evicted; the bound also makes JAX
    lock the directory, so that two processes never read an entry the other is writing).
    Sets the environment JAX reads at import (inherited by the processes this one starts) and,
    when jax is imported already, ``jax.config``. Programs that compile in under
    :data:`MIN_COMPILE_SECONDS` are not stored, unless
    ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise."""
    environ = os.environ if environ is None else environ
    path = os.path.abspath(os.path.expanduser(path or default_dir(environ)))
    os.makedirs(path, exist_ok=True)
    value = environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", MIN_COMPILE_SECONDS)
    try:
        min_seconds = float(value)
    except ValueError:
        raise ValueError(f"$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS={value!r}: give the shortest compile time "
                         "worth storing in seconds (e.g. 0.5), or unset it") from None
    values = {"jax_compilation_cache_dir": path, "jax_compilation_cache_max_size": int(max_bytes),
              "jax_persistent_cache_min_compile_time_secs": min_seconds}
    for name, value in values.items():
        environ[name.upper()] = str(value)
    if environ is os.environ and "jax" in sys.modules:
        config = sys.modules["jax"].config
        for name, value in values.items():
            config.update(name, value)
    return path
