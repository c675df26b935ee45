"""Expert parallelism inside ``shard_map``: what an MoE layer does with the mesh axes it is given
(``parallel.rules`` has the layout; ``nn.moe.moe_ffn`` computes the local experts).

On a mesh ``(data, expert = e, model = m)`` one device of an ``expert x model`` group holds the
routed experts ``[j E/e, (j+1) E/e)`` (``j``: its index on ``expert``), each with ``F / m`` of
its intermediate columns (``model``), and the same rows as every other device of the group.
An MoE layer then

  1. runs the router (replicated) on its rows: top-k ids over all E experts, the same on every
     device of the group;
  2. runs its local experts on the rows routed to them (:func:`expert_offset`: the global id of
     its first local expert; pairs routed elsewhere contribute zero);
  3. sums with ONE ``psum`` over ``(expert, model)`` (:func:`combine`): the experts' outputs
     across ``expert`` and the partial products of the split intermediate dimension across
     ``model``. An all-reduce of [rows, D] per MoE layer, in place of the dense MLP's psum over
     ``model``; no all-to-all, no capacity limit, no token permutation across devices.

A bias on the experts' output (gpt-oss's ``down_proj`` bias) is added by one ``model`` shard only
(:func:`once_over`), since the psum adds every shard's copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def expert_offset(num_local: int, expert_axis: str | None):
    """The global id of this device's first local expert: ``axis_index(expert_axis) *
    num_local`` (int32 scalar, traced), or 0 when experts are not split."""
    if expert_axis is None:
        return 0
    return jax.lax.axis_index(expert_axis).astype(jnp.int32) * num_local


def reduce_axes(expert_axis: str | None, model_axis: str | None) -> tuple[str, ...]:
    """The mesh axes an MoE layer's output is summed over (those that are split)."""
    return tuple(a for a in (expert_axis, model_axis) if a is not None)


def combine(y: jax.Array, expert_axis: str | None, model_axis: str | None) -> jax.Array:
    """The routed experts' output ``y [..., D]`` (this device's local experts and intermediate
    columns) summed over the split axes: one ``psum`` over ``(expert, model)``; ``y`` itself on
    one device."""
    axes = reduce_axes(expert_axis, model_axis)
    return jax.lax.psum(y, axes) if axes else y


def once_over(x: jax.Array, axis: str | None) -> jax.Array:
    """``x`` on shard 0 of ``axis``, zeros on the others (a replicated bias added before a psum
    over ``axis`` is then added once); ``x`` itself when ``axis`` is None."""
    if axis is None:
        return x
    return jnp.where(jax.lax.axis_index(axis) == 0, x, jnp.zeros((), x.dtype))
