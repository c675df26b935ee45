"""The collectives of a compiled SPMD program, read from its HLO text, for the multi-device
tests (run inside their subprocesses): each one's kind, dtype, shape, the mesh axes its replica
groups span and its group size."""

from __future__ import annotations

import re

import numpy as np

COLLECTIVE = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* (all-reduce|all-gather|all-to-all|"
                        r"collective-permute|reduce-scatter)(?:-start)?\(.*?replica_groups=(\S+)")


def groups(text: str) -> list[list[int]]:
    """The replica groups of an HLO ``replica_groups=`` value, explicit or in the iota form."""
    if text.startswith("{"):
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", text[1:-1])]
    m = re.match(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    dims = [int(d) for d in m.group(3).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(4):
        ids = ids.transpose([int(d) for d in m.group(4).split(",")])
    return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()


def collectives(hlo: str, mesh) -> list[dict]:
    """Every collective of a compiled program on ``mesh``: kind, dtype, dims, elements, the mesh
    axes its groups span (sorted) and the size of a group."""
    position = {i: np.unravel_index(i, mesh.devices.shape) for i in range(mesh.devices.size)}
    out = []
    for m in COLLECTIVE.finditer(hlo):
        dims = [int(d) for d in m.group(2).split(",") if d]
        gs = groups(m.group(4))
        spans = sorted({mesh.axis_names[a] for g in gs for a in range(len(mesh.axis_names))
                        if len({int(position[i][a]) for i in g}) > 1})
        out.append({"kind": m.group(3), "dtype": m.group(1), "dims": dims, "elements": int(np.prod(dims)),
                    "spans": spans, "group": len(gs[0])})
    return out
