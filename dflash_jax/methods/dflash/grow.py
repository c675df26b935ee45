"""Starting a DFlash training run from a drafter of another shape (``docs/experiments.md``, the
depth and block size ablations in the trained regime).

- Another block size: the weights do not depend on it (a block is the drafter's input length),
  so a drafter trained at block 16 starts a run at block 8 as it is.
- More layers (``grow``): a trained L-layer drafter becomes an L'-layer one whose drafts are
  unchanged at step 0. Each new layer is a copy of the start's last layer with its attention
  output projection (``o_proj``) and MLP down projection (``down_proj``) set to zero, so it adds
  exactly zero to the residual stream: the hidden state leaving the start's layers reaches the
  final norm unchanged, bit for bit. Its query, key, value, gate and up projections start as the
  trained layer's (features the drafter already reads) rather than random ones; training moves
  the zeroed projections first (their gradient is the product of the layer's inputs and the
  loss's gradient at the residual, which is not zero), then the rest.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.config import DrafterConfig

# the new layers' parameters set to zero: the projections that write into the residual stream
ZEROED = (("self_attn", "o_proj"), ("mlp", "down_proj"))


def start_difference(start: DrafterConfig, run: DrafterConfig, grow: bool) -> str | None:
    """Why a run of config ``run`` cannot start from a drafter of config ``start`` (None: it
    can): every field must be equal but the block size, and, with ``grow``, the number of
    layers, which may only rise."""
    if grow and start.layer_types is not None:
        return ("growing a drafter with per-layer attention types (layer_types) is not supported: "
                "give a drafter whose layers all attend alike")
    allowed = {"block_size": run.block_size}
    if grow:
        if run.num_layers < start.num_layers:
            return (f"--grow adds layers: the run's {run.num_layers} layer(s) are fewer than the starting "
                    f"drafter's {start.num_layers}")
        allowed["num_layers"] = run.num_layers
    comparable = dataclasses.replace(start, **allowed)
    if comparable == run:
        return None
    fields = [f.name for f in dataclasses.fields(DrafterConfig) if getattr(comparable, f.name) != getattr(run, f.name)]
    return ", ".join(f"{n} {getattr(start, n)!r} (the run's {getattr(run, n)!r})" for n in fields)


def grow_params(params: dict, num_layers: int) -> dict:
    """``params`` (a DFlash drafter's tree, layers stacked on a leading axis) with new layers
    appended up to ``num_layers``: copies of the last layer, :data:`ZEROED` at zero."""
    layers = params["layers"]
    have = jax.tree.leaves(layers)[0].shape[0]
    if num_layers < have:
        raise ValueError(f"cannot grow a {have}-layer drafter to {num_layers} layers")
    new = num_layers - have
    if new == 0:
        return params

    def extend(path, x):
        names = tuple(getattr(k, "key", None) for k in path)
        copies = jnp.repeat(x[-1:], new, axis=0)
        if any(names[i:i + 2] == z for z in ZEROED for i in range(len(names) - 1)):
            copies = jnp.zeros_like(copies)
        return jnp.concatenate([x, copies], axis=0)

    return dict(params, layers=jax.tree_util.tree_map_with_path(extend, layers))
