"""The multi-device options every command shares: ``--mesh data=2,model=4`` and the multi-host
wiring (``--coordinator``, ``--num-processes``, ``--process-id``, or JAX's environment
variables), turned into a mesh by :func:`mesh_from_args`."""

from __future__ import annotations

from dflash_jax.parallel.mesh import initialize, make_mesh, parse_mesh


def add_arguments(p) -> None:
    g = p.add_argument_group("multi-device and multi-host")
    g.add_argument("--mesh", help="run on a device mesh, e.g. data=2,model=4 (data: rows split over "
                                  "devices; model: tensor parallelism; expert: a mixture-of-experts "
                                  "target's experts split, e.g. data=2,expert=2,model=2); default: "
                                  "one device")
    g.add_argument("--coordinator", help="multi-host: host:port of process 0 (or "
                                         "JAX_COORDINATOR_ADDRESS)")
    g.add_argument("--num-processes", type=int, help="multi-host: number of processes (or "
                                                     "JAX_NUM_PROCESSES)")
    g.add_argument("--process-id", type=int, help="multi-host: this process's id, 0..n-1 (or "
                                                  "JAX_PROCESS_ID); only process 0 writes files")


def mesh_from_args(args):
    """Initialises the multi-process runtime when asked (arguments or environment), then the
    ``--mesh`` (None without one: one device; a multi-process run without ``--mesh`` gets
    ``data`` over every device)."""
    multi = initialize(getattr(args, "coordinator", None), getattr(args, "num_processes", None),
                       getattr(args, "process_id", None))
    text = getattr(args, "mesh", None)
    if not text:
        return make_mesh() if multi else None
    return make_mesh(**parse_mesh(text))
