"""Multi-device and multi-host execution: meshes with axes ``data`` and ``model`` (and ``expert``
for mixture-of-experts targets: expert parallelism), the partition
rules of every parameter and cache tensor (``parallel.rules``, one table), vocabulary-sharded
reductions and sampling (``parallel.vocab``). The engine runs its prefill and its whole decode
loop inside ``shard_map`` over the mesh (``decoding.engine``): tensor parallelism over
``model`` (Megatron layout, one psum after each attention and MLP output projection), data
parallelism over ``data`` (rows), expert parallelism over ``expert`` (an MoE layer's experts
split, one psum over ``(expert, model)`` after it). ``mesh=None`` everywhere is the single-device path.
"""

from dflash_jax.parallel.mesh import initialize, is_main_process, make_mesh, parse_mesh
from dflash_jax.parallel.rules import (DATA, EXPERT, LOGICAL_RULES, MODEL, PARAM_AXES, cache_specs,
                                       check_expert_split, check_mesh_split, check_model_split,
                                       expert_axis, expert_size, local_config, logical_to_spec,
                                       mesh_axis_sizes, param_specs, shard_params)
from dflash_jax.parallel.vocab import Shards
from dflash_jax.parallel.forward import target_logits

__all__ = ["DATA", "EXPERT", "LOGICAL_RULES", "MODEL", "PARAM_AXES", "Shards", "cache_specs",
           "check_expert_split", "check_mesh_split", "check_model_split", "expert_axis",
           "expert_size", "initialize", "is_main_process", "local_config",
           "logical_to_spec", "make_mesh", "mesh_axis_sizes", "param_specs", "parse_mesh",
           "shard_params", "target_logits"]
