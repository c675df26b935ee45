"""Partition rules: one table from logical axes to mesh axes, one table from parameter names to
logical axes (the MaxText style), and the per-shard ("local") configs the sharded forward
passes run with.

The layout is Megatron tensor parallelism over the ``model`` mesh axis and data parallelism
over ``data``:

  * attention split by heads: the columns of q_proj (query heads) and of k_proj / v_proj (their
    KV heads) and the rows of o_proj. Heads are contiguous in ``H * Dh`` (head-major), so shard
    i of m holds query heads ``[i H/m, (i+1) H/m)`` and KV heads ``[i Hkv/m, (i+1) Hkv/m)``,
    exactly the KV heads those query heads use: a GQA group is never split. Hence m must
    divide Hkv (and so H).
  * MLP split by the intermediate dimension: columns of gate/up, rows of down.
  * one ``psum`` over ``model`` after o_proj and after down_proj (the row-parallel outputs).
  * embedding and LM head split by vocabulary (rows of ``embed_tokens``, columns of
    ``lm_head``); the lookup is a masked local gather + ``psum``, the logits stay split
    (``parallel.vocab`` reduces over them).
  * norms, q_norm / k_norm and the drafter's ``fc`` + ``hidden_norm`` are replicated: ``fc``
    maps the concatenated taps to the drafter's hidden size D, which every shard needs whole
    (its K/V projections read all of D), so splitting it would cost an all-gather of
    [rows, D] per draft for a matrix of k*D*D (one seventh of a Qwen3-8B drafter layer).
  * KV caches [layers, batch, slots, Hkv, Dh]: batch over ``data``, KV heads over ``model``.
  * a hybrid target's Gated DeltaNet layers split by key heads, each with its value heads
    (``gdn_heads``): the fused q/k/v projection's and the conv's channels, kept grouped by key
    head so that a contiguous split keeps whole groups (``nn.gated_delta.group_order``), the
    z / a / b projections, the decay and step parameters and out_proj's rows (one psum after
    it); the conv windows and recurrent states of the decode state likewise. Hence m must divide
    the GDN key heads too.

Expert parallelism (a mixture-of-experts target on a mesh with an ``expert`` axis,
``make_mesh(..., expert=e)``): the routed experts' stacked weights [E, ...] split by experts over
``expert`` (shard j holds experts ``[j E/e, (j+1) E/e)``), and each expert's intermediate
dimension over ``model`` as the dense MLP's (tensor parallelism inside the experts). Everything
else (attention, router, shared expert, embedding, head, caches) is laid out as above and
replicated over ``expert``: the rows a device decodes are the same on every device of its
``expert x model`` group. In an MoE layer each device runs the (replicated) router on all its
rows, then only its local experts on the rows routed to them (zero for the others), and one
``psum`` over ``(expert, model)`` sums the experts' contributions and the model shards' partial
sums: an all-reduce of [rows, D] per MoE layer, the dense MLP's psum widened to the group.
For decode and verify (1..16 rows per sequence) this moves less than an all-to-all dispatch
would and needs no capacity limit (``tools/parallel_comm.py`` counts both).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dflash_jax import targets
from dflash_jax.nn import partitioning

DATA, MODEL, EXPERT = "data", "model", "expert"

LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA),
    ("heads", MODEL),
    ("gdn_heads", MODEL),
    ("kv_heads", MODEL),
    ("mlp", MODEL),
    ("vocab", MODEL),
    ("expert", EXPERT),
    ("router", None),
    ("embed", None),
    ("layers", None),
    ("slots", None),
    ("head_dim", None),
    ("taps", None),
    ("time", None),
    ("latent", None),
    ("ple", None),
    ("scalar", None),
)
"""logical axis -> mesh axis (None = replicated). Change a mapping here, nowhere else."""

# the logical axes of the decoder layers' parameters and of the KV cache live with the building
# blocks (``nn.partitioning``); the mapping of logical to mesh axes is here
PARAM_AXES = partitioning.PARAM_AXES
CACHE_AXES = partitioning.CACHE_AXES


def logical_to_spec(axes, rules=LOGICAL_RULES, mesh=None) -> P:
    """PartitionSpec of an array whose dims have the logical names ``axes``; with ``mesh``,
    a mesh axis that ``mesh`` does not have (``expert`` on a ``(data, model)`` mesh) is
    replicated (None)."""
    table = dict(rules)
    unknown = [a for a in axes if a not in table]
    if unknown:
        raise KeyError(f"no partition rule for logical axes {unknown}; rules: {sorted(table)}")
    names = None if mesh is None else set(mesh.axis_names)
    return P(*(table[a] if names is None or table[a] in names else None for a in axes))


def param_logical_axes(path: tuple[str, ...], ndim: int, table=None) -> tuple[str, ...]:
    """Logical axes of the parameter at ``path`` (keys from the root) with ``ndim`` dims, by
    ``table`` ((module, parameter) -> axes, or a whole path -> axes: a target family's
    ``param_axes``; default :data:`PARAM_AXES`, the dense decoder's and the drafter's)."""
    table = PARAM_AXES if table is None else table
    path = tuple(path)
    if path in table:  # a whole-path entry names every axis, a stacked layer axis included
        axes = table[path]
    else:
        key = path[-2:]
        if key not in table:
            raise KeyError(f"parameter {'/'.join(path)} has no partition rule (parallel.rules.PARAM_AXES "
                           "or the target family's param_axes)")
        axes = table[key]
        if path[0] == "layers":
            axes = ("layers",) + axes
    if len(axes) != ndim:
        raise ValueError(f"parameter {'/'.join(path)} has {ndim} dims; its rule names {axes}")
    return axes


def _keys(path) -> tuple[str, ...]:
    return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in path)


def param_specs(params, table=None, rules=LOGICAL_RULES, mesh=None):
    """The PartitionSpec tree of a target or drafter parameter tree (None stays None);
    ``table``: see :func:`param_logical_axes`; ``mesh``: see :func:`logical_to_spec`."""
    if params is None:
        return None
    return jax.tree_util.tree_map_with_path(
        lambda path, x: logical_to_spec(param_logical_axes(_keys(path), x.ndim, table), rules, mesh),
        params)


def cache_specs(cache, rules=LOGICAL_RULES):
    """The PartitionSpec pytree of a KVCache (None stays None)."""
    if cache is None:
        return None
    kv = logical_to_spec(CACHE_AXES, rules)
    return cache.replace(k=kv, v=kv, lengths=logical_to_spec(("batch",), rules))


def shard_params(params, mesh, table=None, rules=LOGICAL_RULES):
    """``params`` placed on ``mesh`` by the rules (a no-op for arrays already placed so)."""
    specs = param_specs(params, table, rules, mesh)
    return jax.tree_util.tree_map(lambda x, s: place(x, NamedSharding(mesh, s)), params, specs)


def sharding_of(mesh, table=None):
    """``(param path, ndim) -> NamedSharding`` on ``mesh`` by these rules (``table``: a target
    family's ``param_axes``; default the drafter's): what the checkpoint readers take to place
    each tensor sharded as it loads."""
    def of(path, ndim):
        return NamedSharding(mesh, logical_to_spec(param_logical_axes(tuple(path), ndim, table), mesh=mesh))
    return of


def place(x, sharding):
    """``x`` (a host or single-device value, the same in every process, or a global array) as a
    global array with ``sharding``; each process builds only its own devices' shards, so this
    works across hosts too."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    host = np.asarray(jax.device_get(x) if isinstance(x, jax.Array) else x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


# ---------------------------------------------------------------------------- local configs
def _split_dims(cfg) -> list[tuple[str, int, str]]:
    """(field, size, what) of the dimensions split over ``model``: a target's from its family,
    a drafter's (the dense decoder layout without the vocabulary, which it does not own) here."""
    if hasattr(cfg, "model_type"):
        return targets.family_of(cfg).split_dims(cfg)
    return [("num_key_value_heads", cfg.num_kv_heads, "KV heads (a GQA group is never split)"),
            ("num_attention_heads", cfg.num_heads, "query heads"),
            ("intermediate_size", cfg.intermediate_size, "MLP width")]


def check_model_split(cfg, model: int, what: str = "target") -> None:
    """Raises ValueError, naming every dimension, when ``model`` shards cannot split ``cfg``
    (a target config or a DrafterConfig) by the layout above."""
    if model == 1:
        return
    dims = _split_dims(cfg)
    bad = [f"{name}={n} ({why}) is not divisible by {model}" for name, n, why in dims if n % model]
    if bad:
        fits = [m for m in range(1, model + 1) if all(n % m == 0 for _, n, _ in dims)]
        raise ValueError(f"a mesh with model={model} cannot split the {what}: " + "; ".join(bad)
                         + f". Model-axis sizes that fit: {fits}")


def check_expert_split(cfg, expert: int, what: str = "target") -> None:
    """Raises ValueError, naming the field, when an ``expert`` axis of that size cannot split
    ``cfg``'s experts (its family's ``expert_dims``), or when ``cfg`` has no experts to split
    (a dense target, a drafter: the axis would only replicate it)."""
    if expert == 1:
        return
    dims = targets.family_of(cfg).expert_dims(cfg) if hasattr(cfg, "model_type") else []
    if not dims:
        name = getattr(cfg, "model_type", "drafter")
        raise ValueError(f"a mesh with expert={expert} splits a mixture-of-experts target's "
                         f"experts; the {what} ({name}) has none: use a mesh without the expert "
                         "axis (make_mesh(data=..., model=...), --mesh data=..,model=..)")
    bad = [f"{name}={n} ({why}) is not divisible by {expert}" for name, n, why in dims if n % expert]
    if bad:
        fits = [e for e in range(1, expert + 1) if all(n % e == 0 for _, n, _ in dims)]
        raise ValueError(f"a mesh with expert={expert} cannot split the {what}'s experts: "
                         + "; ".join(bad) + f". Expert-axis sizes that fit: {fits}")


def check_mesh_split(cfg, mesh, what: str = "target") -> None:
    """:func:`check_model_split` and :func:`check_expert_split` of ``cfg`` on ``mesh``."""
    check_model_split(cfg, mesh_axis_sizes(mesh)[MODEL], what)
    check_expert_split(cfg, expert_size(mesh), what)


def local_config(cfg, model: int, expert: int = 1):
    """The config of one shard of a ``model`` x ``expert`` group: a target's by its family
    (``local_config``, then ``expert_local_config`` when ``expert`` > 1); a drafter's heads,
    KV heads and MLP width divided by ``model``; every other field unchanged."""
    if expert > 1:
        check_expert_split(cfg, expert)
        cfg = targets.family_of(cfg).expert_local_config(cfg, expert)
    if model == 1:
        return cfg
    check_model_split(cfg, model)
    if hasattr(cfg, "model_type"):
        return targets.family_of(cfg).local_config(cfg, model)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // model,
                               num_kv_heads=cfg.num_kv_heads // model,
                               intermediate_size=cfg.intermediate_size // model)


def expert_size(mesh) -> int:
    """The size of ``mesh``'s ``expert`` axis (1 without one)."""
    return dict(zip(mesh.axis_names, mesh.devices.shape)).get(EXPERT, 1)


def expert_axis(mesh) -> str | None:
    """The mesh axis an MoE target's experts split over inside ``shard_map`` (None: not split)."""
    return EXPERT if expert_size(mesh) > 1 else None


def mesh_axis_sizes(mesh) -> Mapping[str, int]:
    """{"data": d, "model": m} (and "expert": e when it has that axis) of a mesh built by
    :func:`parallel.make_mesh`."""
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    missing = [a for a in (DATA, MODEL) if a not in sizes]
    if missing:
        raise ValueError(f"the mesh has axes {tuple(mesh.axis_names)}; dflash-jax needs "
                         f"('{DATA}', '{MODEL}'): build it with dflash_jax.parallel.make_mesh")
    return sizes
