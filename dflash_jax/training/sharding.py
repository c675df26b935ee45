"""How a training step is laid out on a ``(data, model)`` device mesh (``Trainer(mesh=...)`` of a method that trains on meshes,
``python -m dflash_jax train --mesh data=2,model=4``).

What is sharded how:

  * the batch: every per-row array (tokens, loss mask, anchors, valid, offline taps) is split
    by rows over ``data`` (the logical axis ``batch`` of ``parallel.rules``): data parallelism.
    The batch size must be a multiple of ``data``.
  * the frozen target: its parameters are placed by ``parallel.rules`` (the same table the
    decoding engine uses): attention heads, MLP width and vocabulary (embedding, LM head) over
    ``model``, everything else replicated. The teacher-forced feature extraction
    (``loss.target_features``) and the LM head the drafter's logits go through run inside the
    same jitted step, so they run tensor-parallel on those shards.
  * the drafter's parameters and its AdamW state: replicated on every device by default;
    with ``fsdp`` (FSDP / ZeRO-3 style) every leaf is split over ``data`` along its largest dim
    that ``data`` divides (the first such dim on a tie), and a leaf no dim of which ``data``
    divides (scalars, the optimizer's step count) stays replicated. The moments of AdamW have
    the parameters' shapes, so they are split exactly like the parameters. The drafter is not
    split over ``model``: it is a few layers next to a whole target, and replicating it keeps
    its layout independent of the target's heads.
  * the step's metrics: replicated (every process can read them).

Why GSPMD here and ``shard_map`` in the engine: the training step is one jitted function
(target forward, drafter forward and backward, optimizer update) whose collectives are the
standard ones of data parallelism (gradient all-reduce, or reduce-scatter / all-gather under
FSDP) and of Megatron tensor parallelism; XLA's SPMD partitioner derives them from the shardings
of the inputs and outputs given to ``jax.jit``, from the same rule table, with the step's code
unchanged (the single-device step and the sharded one are the same function, so they cannot
drift apart). The decode loop instead needs hand-placed collectives (vocabulary-sharded argmax
and sampling, the per-step cache updates inside a while loop), which ``shard_map`` expresses.

Every global array is assembled with ``jax.make_array_from_callback`` from host values every
process holds in full (the dataset, the initial weights), each process filling only its own
devices' shards, so the same code runs on one host and across hosts.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dflash_jax.parallel import rules


def mesh_sizes(mesh) -> Mapping[str, int]:
    """{"data": d, "model": m} of ``mesh`` (ValueError for a mesh without those axes)."""
    return rules.mesh_axis_sizes(mesh)


def check_batch(mesh, batch_size: int) -> None:
    """ValueError when ``batch_size`` rows cannot be split evenly over the mesh's ``data``."""
    data = mesh_sizes(mesh)[rules.DATA]
    if batch_size % data:
        fits = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(f"batch_size {batch_size} cannot be split over the mesh's data={data} "
                         f"shards (data parallelism splits the batch rows evenly): use a batch "
                         f"size that is a multiple of {data}, or a mesh with data in {fits}")


def check_mesh(mesh, batch_size: int, target_config, drafter_config=None,
               eval_prompts: int = 0) -> Mapping[str, int]:
    """Every check of a training mesh, before any work: the batch splits over ``data``, the
    target splits over ``model`` (``parallel.rules.check_model_split``), and, when tau is
    measured during training (``eval_prompts`` > 0, on the mesh, by the sharded engine), the
    drafter splits over ``model`` and the held-out prompts over ``data``. Returns the sizes."""
    sizes = mesh_sizes(mesh)
    check_batch(mesh, batch_size)
    rules.check_model_split(target_config, sizes[rules.MODEL], "target")
    if eval_prompts:
        if drafter_config is not None:
            rules.check_model_split(drafter_config, sizes[rules.MODEL], "drafter")
        if eval_prompts % sizes[rules.DATA]:
            raise ValueError(f"{eval_prompts} held-out prompts cannot be split over the mesh's "
                             f"data={sizes[rules.DATA]} shards to measure tau: hold out a "
                             f"multiple of {sizes[rules.DATA]} (--eval-prompts)")
    return sizes


def fsdp_spec(shape, data: int) -> P:
    """The FSDP PartitionSpec of a leaf of ``shape``: its largest dim divisible by ``data``
    split over ``data`` (the first on a tie); replicated when none is (or ``data`` is 1)."""
    if data > 1:
        dims = [i for i, n in enumerate(shape) if n % data == 0 and n >= data]
        if dims:
            best = max(dims, key=lambda i: (shape[i], -i))
            return P(*[rules.DATA if i == best else None for i in range(len(shape))])
    return P()


def state_shardings(abstract_state, mesh, fsdp: bool = False):
    """NamedShardings of a training state (params, opt_state, step): replicated, or with
    ``fsdp`` each leaf by :func:`fsdp_spec`."""
    data = mesh_sizes(mesh)[rules.DATA]
    return jax.tree.map(
        lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), data) if fsdp else P()),
        abstract_state)


def param_shardings(params, mesh):
    """NamedShardings of target parameters by ``parallel.rules``."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), rules.param_specs(params))


def batch_sharding(mesh) -> NamedSharding:
    """Rows (axis 0) over ``data`` (the logical axis ``batch``), the other dims whole."""
    return NamedSharding(mesh, rules.logical_to_spec(("batch",)))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def global_array(x, sharding) -> jax.Array:
    """The global array of host value ``x`` (the same on every process) laid out by
    ``sharding``; each process fills only its addressable shards (``parallel.rules.place``)."""
    return rules.place(np.asarray(x), sharding)


def place(tree, shardings):
    """:func:`global_array` over a pytree (``shardings``: the same structure)."""
    return jax.tree.map(global_array, tree, shardings)
