"""One sharded forward pass of the target outside the decoding loop (scoring, checks).

``target_logits(target, tokens)`` runs the target family's forward inside ``shard_map`` on
the target's mesh with the layout of ``parallel.rules`` and returns the logits as one global
array [B, T, V] (rows over ``data``, vocabulary over ``model``, replicated over ``expert``;
nothing is gathered)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dflash_jax.parallel import rules
from dflash_jax.targets import family_of, target_forward


def target_logits(target, tokens) -> jax.Array:
    """float32 logits [B, T, V] of ``tokens`` int32[B, T] (positions 0..T-1, no cache), on the
    target's mesh (or its one device when it has none)."""
    tokens = np.asarray(tokens, np.int32)
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    if target.mesh is None:
        return target_forward(target.config, target.params, jnp.asarray(tokens),
                              jnp.asarray(positions))[0]
    sizes = rules.mesh_axis_sizes(target.mesh)
    if tokens.shape[0] % sizes[rules.DATA]:
        raise ValueError(f"{tokens.shape[0]} rows cannot be split over data={sizes[rules.DATA]}")
    rows = NamedSharding(target.mesh, P(rules.DATA, None))
    return _sharded_logits(target.config, target.mesh, target.params,
                           rules.place(tokens, rows), rules.place(positions, rows))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _sharded_logits(cfg, mesh, params, tokens, positions):
    m, e = rules.mesh_axis_sizes(mesh)[rules.MODEL], rules.expert_size(mesh)
    local = rules.local_config(cfg, m, e)
    axes = {"model_axis": rules.MODEL if m > 1 else None}
    if e > 1:  # only a family with experts takes it (TargetFamily.forward)
        axes["expert_axis"] = rules.EXPERT

    def body(p, t, pos):
        return target_forward(local, p, t, pos, **axes)[0]

    specs = rules.param_specs(params, family_of(cfg).param_axes(cfg), mesh=mesh)
    return jax.shard_map(body, mesh=mesh, in_specs=(specs, P(rules.DATA, None), P(rules.DATA, None)),
                         out_specs=P(rules.DATA, None, rules.MODEL), check_vma=False)(
        params, tokens, positions)
