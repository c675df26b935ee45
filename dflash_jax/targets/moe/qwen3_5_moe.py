"""The sparse MoE block of the Qwen3.5 / Qwen3.6 MoE text model (``model_type``
``qwen3_5_moe_text``; transformers' ``Qwen3_5MoeSparseMoeBlock``), on its own: the hybrid
family (its Gated DeltaNet and gated-attention layers) plugs it into every decoder layer, with
its config fields (:func:`block_config_from_hf`), tensor names (:func:`mlp_tensor_specs`,
:func:`convert_fused_experts`), partition table (:data:`PARAM_AXES`) and size model.

What the block computes for a row ``x[D]`` (``docs/targets.md``):

    p = softmax(x @ W_router)                     over all E experts (float32)
    ids = top_k(p), w = p[ids] / sum(p[ids])      renormalised (Qwen3-Next: when norm_topk_prob)
    y = sum_j w_j * down_j(silu(x @ gate_j) * (x @ up_j))          routed experts (nn.moe)
      + sigmoid(x @ w_shared_gate) * down_s(silu(x @ gate_s) * (x @ up_s))   shared expert

Parameters of one block (kernels are [in, out], the transpose of PyTorch's Linear weights; the
routed experts as the ``qwen3_moe`` family stores them; a decoder stacks every leaf with a
leading layer axis):

  gate/kernel                                 [D, E]        the router
  experts/{gate,up}_proj                      [E, D, F]     F = moe_intermediate_size
  experts/down_proj                           [E, F, D]
  shared_expert/{gate,up}_proj/kernel         [D, Fs]       Fs = shared_expert_intermediate_size
  shared_expert/down_proj/kernel              [Fs, D]
  shared_expert_gate/kernel                   [D, 1]

Checkpoints store the routed experts in one of two layouts, both read into these parameters:

  * fused (the released Qwen3.5 / 3.6 checkpoints): ``mlp.experts.gate_up_proj`` [E, 2F, D]
    (gate rows first, then up) and ``mlp.experts.down_proj`` [E, D, F];
  * per expert (what transformers 5's ``save_pretrained`` writes, its weight conversion
    reversed): ``mlp.experts.{e}.{gate,up}_proj.weight`` [F, D] and
    ``mlp.experts.{e}.down_proj.weight`` [D, F].

The router is ``mlp.gate.weight`` [E, D], the shared expert
``mlp.shared_expert.{gate,up,down}_proj.weight`` and ``mlp.shared_expert_gate.weight`` [1, D].
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.checkpoints import (CheckpointError, TensorSpec, _dtype_fields, params_to_tensors, read_tensors,
                                    tensors_to_params, write_safetensors)
from dflash_jax.config import read_config_json, refuse
from dflash_jax.files import write_json
from dflash_jax.nn import moe
from dflash_jax.nn.layers import random_init
from dflash_jax.parallel import experts as expert_parallel

MODEL_TYPE = "qwen3_5_moe_text"


# ---------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class MoeBlockConfig:
    """The MoE block's static config (hashable: a ``jit`` static argument).

    ``hidden_size`` = D, ``num_experts`` = E, ``num_experts_per_tok`` = k,
    ``moe_intermediate_size`` = F (one routed expert's SwiGLU width),
    ``shared_expert_intermediate_size`` = Fs. The top-k weights are renormalised (Qwen3.5
    always; ``norm_topk_prob=False``: not, as a Qwen3-Next config may ask, transformers'
    ``Qwen2MoeTopKRouter``). A tensor-parallel shard's config has its own widths
    (:func:`block_local_config`)."""

    hidden_size: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True

    def __post_init__(self):
        for name in ("hidden_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "shared_expert_intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"MoE block config field {name} must be a positive integer, "
                                 f"got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must not exceed "
                             f"num_experts ({self.num_experts})")


REQUIRED_FIELDS = ("hidden_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                   "shared_expert_intermediate_size")

_ONE = lambda v: v is None or (not isinstance(v, bool) and float(v) == 1.0)
_UNSET = lambda v: v is None or v in (0, 1) and not isinstance(v, bool)
_ROUTING_OPTIONS = (
    # (field, value that is fine, why it is refused otherwise); output_router_logits and
    # router_aux_loss_coef are training-only (the load-balancing loss): accepted and ignored
    ("norm_topk_prob", lambda v: v is None or v is True,
     "Qwen3.5's MoE block always renormalises the top-k weights (transformers ignores this "
     "field); a config asking for unnormalised weights describes another model"),
    ("scoring_func", lambda v: v in (None, "softmax"),
     "only the softmax router is implemented (no sigmoid scoring)"),
    ("topk_method", lambda v: v in (None, "greedy"),
     "only plain top-k routing is implemented (no group-limited or bias-corrected routing)"),
    ("n_group", _UNSET, "group-limited routing is not implemented"),
    ("topk_group", _UNSET, "group-limited routing is not implemented"),
    ("routed_scaling_factor", _ONE, "scaling the routed experts' output is not implemented"),
    ("moe_router_bias", lambda v: not v, "a router bias is not implemented"),
    ("router_bias", lambda v: not v, "a router bias is not implemented"),
    ("e_score_correction_bias", lambda v: not v, "bias-corrected routing is not implemented"),
    ("mlp_only_layers", lambda v: not v,
     "dense (non-MoE) layers are not implemented: every Qwen3.5 MoE layer has the sparse block"),
    ("decoder_sparse_step", _UNSET,
     "MoE layers at a step other than 1 are not implemented: every Qwen3.5 MoE layer is sparse"),
    ("moe_router_type", lambda v: v in (None, "softmax", "topk"), "unknown router type"),
    ("router_type", lambda v: v in (None, "softmax", "topk"), "unknown router type"),
    ("n_shared_experts", lambda v: v in (None, 1), "the block has exactly one shared expert"),
    ("moe_layer_freq", lambda v: v in (None, 1), "every Qwen3.5 MoE layer is sparse"),
    ("first_k_dense_replace", lambda v: not v, "every Qwen3.5 MoE layer is sparse"),
    ("mlp_bias", lambda v: not v, "MLP biases are not implemented"),
    ("hidden_act", lambda v: v in (None, "silu", "swish"),
     "only the SwiGLU experts with silu are implemented"),
)


def text_config(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's config of a ``config.json`` dict: ``d`` itself for
    ``qwen3_5_moe_text``, its ``text_config`` for the multimodal ``qwen3_5_moe`` file."""
    if d.get("model_type") == "qwen3_5_moe" and isinstance(d.get("text_config"), Mapping):
        return d["text_config"]
    return d


def unsupported_routing_options(d: Mapping[str, Any]) -> list[str]:
    """The fields of a ``qwen3_5_moe_text`` config that ask for a routing or expert variant
    this block does not implement, each as ``"field=value: why"``."""
    d = text_config(d)
    return [f"{field}={d[field]!r}: {why}" for field, fine, why in _ROUTING_OPTIONS
            if field in d and not fine(d[field])]


def block_config_from_hf(d: Mapping[str, Any], what: str = "config.json") -> MoeBlockConfig:
    """The block's config from a ``qwen3_5_moe_text`` (or ``qwen3_5_moe``) ``config.json``
    dict. A missing field or a routing option that is not implemented is a one-line
    ValueError naming the field."""
    d = text_config(d)
    missing = [k for k in REQUIRED_FIELDS if d.get(k) is None]
    if missing:
        raise ValueError(f"{what} is missing the MoE block's fields: {', '.join(missing)}")
    problems = unsupported_routing_options(d)
    if problems:
        refuse(problems, f"{what} ({MODEL_TYPE} MoE block)")
    return MoeBlockConfig(**{k: _int(d[k], k, what) for k in REQUIRED_FIELDS})


def _int(value, field: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"{what}: {field} must be an integer, got {value!r}")
    return int(value)


def block_config_to_hf(cfg: MoeBlockConfig) -> dict:
    """The block's ``config.json`` fields (the hybrid family adds its own)."""
    return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
            "hidden_act": "silu"}


def block_local_config(cfg: MoeBlockConfig, model: int) -> MoeBlockConfig:
    """The config one of ``model`` tensor-parallel shards computes with: every routed expert's
    width and the shared expert's divided by ``model`` (:data:`PARAM_AXES`). The expert count
    stays: the router scores all ``E`` experts on every shard, and an expert-parallel shard
    takes its local expert count from its weights. Raises ValueError naming the field that
    ``model`` does not divide."""
    for field in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if getattr(cfg, field) % model:
            raise ValueError(f"{field}={getattr(cfg, field)} is not divisible by the model axis "
                             f"size {model}")
    return dataclasses.replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size // model,
                               shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // model)


# ---------------------------------------------------------------------------- the block
def moe_block(cfg: MoeBlockConfig, params, x: jax.Array, *, impl: str = "auto",
              model_axis: str | None = None, expert_axis: str | None = None,
              return_routing: bool = False):
    """The block on rows ``x`` [..., D] with one block's ``params`` (module docstring).

    Returns y [..., D] in ``x``'s dtype, or with ``return_routing`` ``(y, weights
    float32[..., k], expert_ids int32[..., k])`` (global expert ids, best first). The router's
    products accumulate in float32 and it routes in float32. ``impl``: ``nn.moe.moe_ffn``'s
    grouped matmul (``"ragged"``), gathered active experts (``"gather"``) or ``"auto"``.

    Inside ``shard_map`` (``parallel.experts``): ``expert_axis``, the mesh axis the experts are
    split over (``params["experts"]`` holds this shard's ``E / e`` experts, consecutive);
    ``model_axis``, the one every expert's and the shared expert's width is split over
    (``cfg`` from :func:`block_local_config`). The routed experts and the shared expert (added
    on one expert shard only) are then summed with ONE ``psum`` over ``(expert, model)``."""
    k = cfg.num_experts_per_tok
    logits = jnp.dot(x, params["gate"]["kernel"].astype(x.dtype), preferred_element_type=jnp.float32)
    weights, ids = moe.route_softmax_topk(logits, k, normalize=cfg.norm_topk_prob)
    ex = params["experts"]
    offset = expert_parallel.expert_offset(ex["gate_proj"].shape[0], expert_axis)
    routed = moe.moe_ffn(x, weights, ids, gate=ex["gate_proj"], up=ex["up_proj"],
                         down=ex["down_proj"], expert_offset=offset, impl=impl)
    se = params["shared_expert"]
    dot = lambda a, w: jnp.dot(a, w.astype(a.dtype))
    h = jax.nn.silu(dot(x, se["gate_proj"]["kernel"])) * dot(x, se["up_proj"]["kernel"])
    scale = jax.nn.sigmoid(dot(x, params["shared_expert_gate"]["kernel"]))
    shared = scale * dot(h, se["down_proj"]["kernel"])
    y = expert_parallel.combine(routed + expert_parallel.once_over(shared, expert_axis).astype(routed.dtype),
                                expert_axis, model_axis).astype(x.dtype)
    return (y, weights, ids) if return_routing else y


def block_param_shapes(cfg: MoeBlockConfig) -> dict:
    """One block's parameter tree with each leaf's shape (a tuple)."""
    D, E, F, Fs = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size,
                   cfg.shared_expert_intermediate_size)
    return {"gate": {"kernel": (D, E)},
            "experts": {"gate_proj": (E, D, F), "up_proj": (E, D, F), "down_proj": (E, F, D)},
            "shared_expert": {"gate_proj": {"kernel": (D, Fs)}, "up_proj": {"kernel": (D, Fs)},
                              "down_proj": {"kernel": (Fs, D)}},
            "shared_expert_gate": {"kernel": (D, 1)}}


def init_block_params(cfg: MoeBlockConfig, key: jax.Array, dtype=jnp.float32,
                      init_scale: float = 0.02, num_layers: int | None = None):
    """Random parameters of one block (``num_layers``: that many, stacked [N, ...]): every
    matrix normal(``init_scale``) in ``dtype``, drawn under ``jit`` (no float32 copy of a large
    block)."""
    lead = () if num_layers is None else (num_layers,)
    shapes = block_param_shapes(cfg)
    is_shape = lambda v: isinstance(v, tuple)

    def init(k):
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(lead + s, dtype), shapes, is_leaf=is_shape)
        return random_init(zeros, k, init_scale, dtype)

    return jax.jit(init)(key)


# ---------------------------------------------------------------------------- partitioning
PARAM_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    ("gate", "kernel"): ("embed", "router"),
    ("experts", "gate_proj"): ("expert", "embed", "mlp"),
    ("experts", "up_proj"): ("expert", "embed", "mlp"),
    ("experts", "down_proj"): ("expert", "mlp", "embed"),
    ("gate_proj", "kernel"): ("embed", "mlp"),          # the shared expert: as the dense MLP
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("shared_expert_gate", "kernel"): ("embed", "router"),
}
"""(module, parameter) -> logical axes of the block's parameters (``parallel.rules``, the same
as the ``qwen3_moe`` family's for the router and experts; a decoder adds its stacked
``layers`` axis first): experts over ``expert``, every expert's width and the shared expert's
over ``mlp`` (``model``), the router and the shared expert's gate replicated (``router``).
A hybrid family merges this table into its ``param_axes``."""


def expert_dims(cfg: MoeBlockConfig) -> list[tuple[str, int, str]]:
    """(config field, size, what) of the dimensions split over the ``expert`` mesh axis
    (``TargetFamily.expert_dims``)."""
    return [("num_experts", cfg.num_experts, "routed experts")]


# ---------------------------------------------------------------------------- size model
def block_num_params(cfg: MoeBlockConfig) -> int:
    """Parameters of one block (all matrices): router ``D E``, experts ``3 E D F``, shared
    expert ``3 D Fs`` and its gate ``D``."""
    D, E, F, Fs = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size,
                   cfg.shared_expert_intermediate_size)
    return D * E + 3 * E * D * F + 3 * D * Fs + D


block_matrix_params = block_num_params
"""Every parameter of the block is in a matrix (no norms or biases): what tensor and expert
parallelism split or replicate."""


def expected_active_experts(num_experts: int, k: int, rows: int) -> float:
    """Distinct experts ``rows`` tokens route to, expected under uniform routing:
    ``E * (1 - (1 - k/E) ** rows)`` (``k`` for one row, at most ``min(E, rows * k)``)."""
    if rows <= 0:
        return 0.0
    return min(float(num_experts) * (1.0 - (1.0 - k / num_experts) ** rows),
               float(min(num_experts, rows * k)))


def block_matrix_params_read(cfg: MoeBlockConfig, rows: int) -> float:
    """Expected parameters one pass over ``rows`` tokens of one sequence reads from the block:
    the router, the shared expert and its gate always, and ``3 D F`` for every routed expert
    the rows reach (:func:`expected_active_experts`). ``TargetFamily.matrix_params_read``."""
    D, F = cfg.hidden_size, cfg.moe_intermediate_size
    shared = D * cfg.num_experts + 3 * D * cfg.shared_expert_intermediate_size + D
    return shared + expected_active_experts(cfg.num_experts, cfg.num_experts_per_tok, rows) * 3 * D * F


def block_matrix_params_per_token(cfg: MoeBlockConfig) -> int:
    """Parameters one token multiplies with in the block: the router, the shared expert and
    its gate, and its ``k`` routed experts. ``TargetFamily.matrix_params_per_token``."""
    D, F = cfg.hidden_size, cfg.moe_intermediate_size
    return (D * cfg.num_experts + 3 * D * cfg.shared_expert_intermediate_size + D
            + cfg.num_experts_per_tok * 3 * D * F)


# ---------------------------------------------------------------------------- checkpoints
FUSED, PER_EXPERT = "fused", "per_expert"
EXPERT_LAYOUTS = (FUSED, PER_EXPERT)
"""How a checkpoint stores the routed experts (module docstring): ``fused``, as the released
Qwen3.5 checkpoints; ``per_expert``, as transformers 5's ``save_pretrained`` writes them."""

_PER_EXPERT_NAME = re.compile(r"experts\.(\d+)\.")


def mlp_tensor_specs(cfg: MoeBlockConfig, prefix: str, path: tuple[str, ...] = (),
                     layer: int | None = None) -> dict[str, TensorSpec]:
    """{tensor name: ``checkpoints.TensorSpec``} of one block in the per-expert layout (the
    fused one is converted to it: :func:`convert_fused_experts`). ``prefix``: the block's
    name prefix (``"model.layers.3.mlp."``); ``path``: the parameter path above the block's
    own keys (``("layers", "mlp")`` in a decoder); ``layer``: its index on the stacked layer
    axis (None: not stacked)."""
    D, E, F, Fs = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size,
                   cfg.shared_expert_intermediate_size)
    spec = lambda keys, shape, expert=None: TensorSpec(path + keys, layer, True, shape, expert)
    specs = {f"{prefix}gate.weight": spec(("gate", "kernel"), (E, D)),
             f"{prefix}shared_expert.gate_proj.weight": spec(("shared_expert", "gate_proj", "kernel"), (Fs, D)),
             f"{prefix}shared_expert.up_proj.weight": spec(("shared_expert", "up_proj", "kernel"), (Fs, D)),
             f"{prefix}shared_expert.down_proj.weight": spec(("shared_expert", "down_proj", "kernel"), (D, Fs)),
             f"{prefix}shared_expert_gate.weight": spec(("shared_expert_gate", "kernel"), (1, D))}
    for e in range(E):
        for proj, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            specs[f"{prefix}experts.{e}.{proj}.weight"] = spec(("experts", proj), shape, e)
    return specs


def mlp_tensor_shapes(cfg: MoeBlockConfig, prefix: str, layout: str = FUSED) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape on disk} of one block's tensors in ``layout``."""
    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert layout must be one of {EXPERT_LAYOUTS}, got {layout!r}")
    shapes = {n: s.shape for n, s in mlp_tensor_specs(cfg, prefix).items()}
    if layout == FUSED:
        E, D, F = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        shapes = {n: s for n, s in shapes.items() if not _PER_EXPERT_NAME.match(n[len(prefix):])}
        shapes[f"{prefix}experts.gate_up_proj"] = (E, 2 * F, D)
        shapes[f"{prefix}experts.down_proj"] = (E, D, F)
    return shapes


def expert_layout(names, prefix: str, what: str = "checkpoint") -> str:
    """The expert layout of the block at ``prefix`` among the tensor ``names``; a block that
    stores both, or neither, is a one-line CheckpointError naming the tensors."""
    fused = sorted(n for n in names if n in (f"{prefix}experts.gate_up_proj", f"{prefix}experts.down_proj"))
    per_expert = sorted(n for n in names if n.startswith(prefix)
                        and _PER_EXPERT_NAME.match(n[len(prefix):]))
    if fused and per_expert:
        raise CheckpointError(f"{what}: {prefix}experts stores its experts both fused ({fused[0]}) "
                              f"and per expert ({per_expert[0]}): keep one layout")
    if fused:
        return FUSED
    if per_expert:
        return PER_EXPERT
    raise CheckpointError(f"{what}: tensor {prefix}experts.gate_up_proj is missing (the fused "
                          f"experts; or per expert: {prefix}experts.0.gate_proj.weight, ...)")


def check_mlp_tensors(shapes: Mapping[str, tuple[int, ...]], cfg: MoeBlockConfig, prefix: str,
                      what: str = "checkpoint") -> str:
    """Checks the block's tensors among ``shapes`` ({name: shape on disk}; other tensors are
    not looked at): returns the expert layout; a missing, mis-shaped or unexpected tensor of
    the block is a one-line CheckpointError naming it (and counting the other problems)."""
    layout = expert_layout(shapes, prefix, what)
    expected = mlp_tensor_shapes(cfg, prefix, layout)
    problems = [f"tensor {n} is missing" for n in expected if n not in shapes]
    problems += [f"tensor {n} has shape {list(shapes[n])}, expected {list(s)} (hidden_size="
                 f"{cfg.hidden_size}, num_experts={cfg.num_experts}, moe_intermediate_size="
                 f"{cfg.moe_intermediate_size}, shared_expert_intermediate_size="
                 f"{cfg.shared_expert_intermediate_size} in config.json)"
                 for n, s in expected.items() if n in shapes and tuple(shapes[n]) != s]
    problems += [f"tensor {n} is not part of the block (num_experts={cfg.num_experts})"
                 for n in sorted(shapes) if n.startswith(prefix) and n not in expected]
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CheckpointError(f"{what}: {problems[0]}{more}")
    return layout


def convert_fused_experts(cfg: MoeBlockConfig, tensors: Mapping[str, np.ndarray], prefix: str,
                          what: str = "checkpoint") -> dict[str, np.ndarray]:
    """``tensors`` with the block at ``prefix`` checked (:func:`check_mlp_tensors`) and, when
    its experts are fused, split into the per-expert tensors :func:`mlp_tensor_specs` names
    (views of the fused arrays: ``gate_up_proj[e, :F]`` is expert e's gate, ``[e, F:]`` its
    up); every other tensor passes through. A hybrid family's ``convert_checkpoint_tensors``
    calls it once per layer."""
    layout = check_mlp_tensors({n: tuple(t.shape) for n, t in tensors.items()}, cfg, prefix, what)
    if layout == PER_EXPERT:
        return dict(tensors)
    F = cfg.moe_intermediate_size
    out = dict(tensors)
    gate_up = out.pop(f"{prefix}experts.gate_up_proj")
    down = out.pop(f"{prefix}experts.down_proj")
    for e in range(cfg.num_experts):
        out[f"{prefix}experts.{e}.gate_proj.weight"] = gate_up[e, :F]
        out[f"{prefix}experts.{e}.up_proj.weight"] = gate_up[e, F:]
        out[f"{prefix}experts.{e}.down_proj.weight"] = down[e]
    return out


def mlp_params_from_tensors(tensors: Mapping[str, np.ndarray], cfg: MoeBlockConfig, prefix: str,
                            dtype=None, what: str = "checkpoint") -> dict:
    """One block's parameters (module docstring; ``dtype`` casts, None keeps the stored one)
    from its tensors in either expert layout, checked first: nothing is built from a block
    with a problem. Tensors outside ``prefix`` are ignored."""
    mine = {n: t for n, t in tensors.items() if n.startswith(prefix)}
    mine = convert_fused_experts(cfg, mine, prefix, what)
    return tensors_to_params(mine, mlp_tensor_specs(cfg, prefix), dtype=dtype, what=what)


def mlp_params_to_tensors(params, cfg: MoeBlockConfig, prefix: str, layout: str = FUSED) -> dict[str, np.ndarray]:
    """Inverse of :func:`mlp_params_from_tensors`: one block's tensors named and shaped as on
    disk in ``layout`` (default the released, fused one)."""
    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert layout must be one of {EXPERT_LAYOUTS}, got {layout!r}")
    out = params_to_tensors(params, mlp_tensor_specs(cfg, prefix))
    if layout == FUSED:
        E = cfg.num_experts
        take = lambda proj: [out.pop(f"{prefix}experts.{e}.{proj}.weight") for e in range(E)]
        gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
        out[f"{prefix}experts.gate_up_proj"] = np.ascontiguousarray(
            np.concatenate([np.stack(gate), np.stack(up)], axis=1))
        out[f"{prefix}experts.down_proj"] = np.ascontiguousarray(np.stack(down))
    return out


# ---------------------------------------------------------------------------- a stack of blocks
LAYER_PREFIX = "model.layers.{}.mlp."
"""The block's tensor prefix in layer i of a ``Qwen3_5MoeForCausalLM`` checkpoint (the
multimodal release adds ``language_model.`` after ``model.``)."""


def save_block_layers(path, cfg: MoeBlockConfig, params, layout: str = FUSED,
                      max_shard_bytes: int | None = None) -> None:
    """Writes the blocks of ``params`` (one block's tree stacked [N, ...]) as the ``mlp``
    tensors of N layers (:data:`LAYER_PREFIX`) in ``layout``, safetensors + a config.json
    with the block's fields and ``num_hidden_layers`` = N: the MoE half of a Qwen3.5 MoE
    checkpoint (the block's tests, ``tools/load_report.py``)."""
    n = jax.tree_util.tree_leaves(params)[0].shape[0]
    tensors = {}
    for i in range(n):
        layer = jax.tree_util.tree_map(lambda x, i=i: x[i], params)
        tensors.update(mlp_params_to_tensors(layer, cfg, LAYER_PREFIX.format(i), layout))
    write_safetensors(path, tensors, max_shard_bytes)
    config = {"model_type": MODEL_TYPE, "hidden_size": cfg.hidden_size, "num_hidden_layers": n,
              **block_config_to_hf(cfg), **_dtype_fields(tensors.values())}
    write_json(os.path.join(os.fspath(path), "config.json"), config)


def load_block_layers(path, dtype=None) -> tuple[MoeBlockConfig, dict]:
    """The blocks of every layer of a checkpoint directory (either expert layout, every layer
    checked before anything is built; any tensor outside the layers' blocks is refused):
    ``(config, params stacked [N, ...])``; ``dtype`` casts (None keeps the stored one)."""
    d = read_config_json(path)
    cfg = block_config_from_hf(d, f"{os.fspath(path)}/config.json")
    n = _int(text_config(d).get("num_hidden_layers"), "num_hidden_layers", "config.json")
    what = f"checkpoint {os.fspath(path)!r}"
    tensors = read_tensors(path)
    specs: dict[str, TensorSpec] = {}
    for i in range(n):
        prefix = LAYER_PREFIX.format(i)
        tensors = convert_fused_experts(cfg, tensors, prefix, what)
        specs.update(mlp_tensor_specs(cfg, prefix, layer=i))
    return cfg, tensors_to_params(tensors, specs, dtype=dtype, what=what)
