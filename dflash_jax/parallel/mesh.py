"""Device meshes (axes ``data`` and ``model``, and ``expert`` for mixture-of-experts targets)
and JAX's multi-host runtime.

    mesh = make_mesh(data=2, model=4)          # 8 devices, on one host or across hosts
    mesh = make_mesh(data=2, expert=2, model=2)  # experts of an MoE target over ``expert``
    target = dj.load_target(path, mesh=mesh)  # weights placed sharded as they load

Across hosts, call :func:`initialize` first (every process, same arguments but its own id):
it wires ``jax.distributed.initialize`` from arguments or the usual environment variables, and
on CPU selects the gloo collectives so that host devices of several processes can all-reduce.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
from jax.sharding import Mesh

from dflash_jax.parallel.rules import DATA, EXPERT, MODEL
from dflash_jax.xla_flags import cuda_plugin_installed

ENV_COORDINATOR = ("DFLASH_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
ENV_NUM_PROCESSES = ("DFLASH_NUM_PROCESSES", "JAX_NUM_PROCESSES")
ENV_PROCESS_ID = ("DFLASH_PROCESS_ID", "JAX_PROCESS_ID")


def make_mesh(data: int | None = None, model: int | None = None, devices=None,
              expert: int | None = None) -> Mesh:
    """A ``(data, model)`` mesh over ``devices`` (default: every device of every process), or,
    with ``expert`` given, a ``(data, expert, model)`` mesh (expert parallelism: a
    mixture-of-experts target's experts split over ``expert``, ``parallel.rules``).

    Give either of data and model or both; the missing one takes the remaining devices.
    ``model`` is the inner (fastest-varying) axis, so tensor-parallel groups are neighbouring
    devices (within one host, over NVLink, when ``model`` <= devices per host); ``expert`` is
    next, so an expert-parallel group (``expert x model`` devices, the MoE layers' all-reduce)
    is the next-nearest block of devices."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    for name, value in (("data", data), ("model", model), ("expert", expert)):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
            raise ValueError(f"mesh {name} size must be a positive integer, got {value!r}")
    e = 1 if expert is None else int(expert)
    if data is None and model is None:
        if n % e:
            raise ValueError(f"expert={e} does not divide the {n} devices; give data= too")
        data, model = n // e, 1
    elif data is None:
        if n % (model * e):
            raise ValueError(f"model={model}{f' x expert={e}' if e > 1 else ''} does not divide "
                             f"the {n} devices; give data= too")
        data = n // (model * e)
    elif model is None:
        if n % (data * e):
            raise ValueError(f"data={data}{f' x expert={e}' if e > 1 else ''} does not divide "
                             f"the {n} devices; give model= too")
        model = n // (data * e)
    if data * e * model > n:
        shape = f"data={data} x " + (f"expert={e} x " if expert is not None else "") + f"model={model}"
        raise ValueError(f"a mesh of {shape} needs {data * e * model} devices; "
                         f"{n} are available ({jax.default_backend()}; on CPU, set XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={data * e * model} before jax starts)")
    if expert is None:
        grid = np.array(devices[:data * model], dtype=object).reshape(data, model)
        return Mesh(grid, (DATA, MODEL))
    grid = np.array(devices[:data * e * model], dtype=object).reshape(data, e, model)
    return Mesh(grid, (DATA, EXPERT, MODEL))


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,model=4"`` -> {"data": 2, "model": 4} (the CLI's ``--mesh``; ``expert=2``
    adds the expert axis)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"(data|model|expert)\s*=\s*(\d+)", part)
        if not m:
            raise ValueError(f"--mesh {text!r}: expected entries like data=2,model=4 (axes data, "
                             "model and expert, positive sizes)")
        if m.group(1) in out:
            raise ValueError(f"--mesh {text!r} gives {m.group(1)} twice")
        out[m.group(1)] = int(m.group(2))
    if not out or any(v < 1 for v in out.values()):
        raise ValueError(f"--mesh {text!r}: expected entries like data=2,model=4 with sizes >= 1")
    return out


def _env(names) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None) -> bool:
    """``jax.distributed.initialize`` for a multi-process run; returns True when it ran.

    Arguments default to the environment (``DFLASH_*`` or ``JAX_*``: COORDINATOR_ADDRESS,
    NUM_PROCESSES, PROCESS_ID); with none given and none in the environment this is a
    single-process run and nothing happens. Must be called before any JAX computation. On a
    CPU backend the gloo collectives are selected (JAX's CPU cross-process all-reduce)."""
    coordinator_address = coordinator_address or _env(ENV_COORDINATOR)
    num_processes = num_processes if num_processes is not None else _env(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env(ENV_PROCESS_ID)
    given = [x is not None for x in (coordinator_address, num_processes, process_id)]
    if not any(given):
        return False
    if not all(given):
        raise ValueError(
            "a multi-process run needs the coordinator address, the number of processes and this "
            "process's id (arguments, --coordinator/--num-processes/--process-id, or the "
            "environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); "
            f"got address={coordinator_address!r}, processes={num_processes!r}, id={process_id!r}")
    num_processes, process_id = int(num_processes), int(process_id)
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is outside 0..{num_processes - 1}")
    platforms = (os.environ.get("JAX_PLATFORMS") or "").lower()
    if platforms in ("", "cpu") and not _has_accelerator_plugin():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids)
    return True


def _has_accelerator_plugin() -> bool:

    return cuda_plugin_installed()


def is_main_process() -> bool:
    """True on process 0 (the one that writes reports and exports)."""
    return jax.process_index() == 0
