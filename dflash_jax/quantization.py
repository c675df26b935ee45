"""Weight-only quantized targets: int8 and FP8 (``float8_e4m3fn``) linear layers (docs/quantization.md).

A quantized matrix is a :class:`QuantizedWeight`, a pytree node in the parameter tree where the
float kernel ``[..., in, out]`` was: the stored values ``q`` (int8 or float8_e4m3fn, the kernel's
shape) and float32 ``scale`` ``[..., ceil(in / bi), ceil(out / bo)]``, one per block of ``(bi,
bo)`` entries (leading axes: the stacked layer and expert axes, which slicing a layer or an
expert out of the stack slices alike). The weight it stands for is ``q * scale`` per block:

* per output channel (what :func:`quantize_params` makes): blocks ``(in, 1)``, one scale per
  column, ``scale = max |w[:, j]| / qmax`` (qmax 127 for int8, 448 for e4m3), ``q = round(w /
  scale)`` (int8: to nearest, clipped to +-127; FP8: the cast's round-to-nearest-even);
* per block (the released FP8 checkpoints, ``weight_block_size`` ``[b_out, b_in]`` and a
  float32 ``weight_scale_inv`` per block, edge blocks partial; :func:`from_block_fp8`):
  blocks ``(b_in, b_out)`` in the tree's ``[in, out]`` orientation.

Each family's layer function calls :func:`dequantize_tree` on its own layer's parameters, so
the float weights exist one layer at a time inside the compiled step, never as a copy kept
beside the quantized ones; the parameters at rest, and what a step reads from memory, are the
1-byte values plus the scales. Embeddings, the LM head, norms, biases, routers and gates,
convolution filters and recurrent-decay vectors stay as they are (:func:`quantizable`).
"""

from __future__ import annotations

import math
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("int8", "fp8")
"""What ``quantize=`` accepts besides None (keep what is stored) and "none" (dequantize a
quantized checkpoint on load)."""
OPTIONS = (*KINDS, "none")
STORAGE = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}
QMAX = {"int8": 127.0, "fp8": 448.0}  # the largest magnitude each stores (e4m3fn: 448)
KIND_OF_DTYPE = {"int8": "int8", "float8_e4m3fn": "fp8"}

# parameter-path keys whose matrices are never quantized: the token embeddings, the LM head, the
# routers and gates (a routing decision flips on a small error; released FP8 checkpoints keep
# them in bf16 too), Gemma 4's model-level per-layer projection, convolution filters
KEEP_KEYS = ("embed_tokens", "embed_tokens_per_layer", "lm_head", "router", "gate", "shared_expert_gate",
             "per_layer_model_projection", "conv1d")


@jax.tree_util.register_pytree_node_class
class QuantizedWeight:
    """``q`` [..., in, out] (int8 / float8_e4m3fn), ``scale`` float32 [..., ceil(in / bi),
    ceil(out / bo)], ``block`` (bi, bo), ``dtype`` the float dtype it dequantizes to (the
    target's compute dtype). Leaves: q and scale; block and dtype are static."""

    def __init__(self, q, scale, block: tuple[int, int], dtype: str):
        self.q, self.scale, self.block, self.dtype = q, scale, (int(block[0]), int(block[1])), str(dtype)

    def tree_flatten(self):
        return (self.q, self.scale), (self.block, self.dtype)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @property
    def kind(self) -> str:
        return KIND_OF_DTYPE[jnp.dtype(self.q.dtype).name]

    @property
    def nbytes(self) -> int:
        return int(self.q.size * self.q.dtype.itemsize + self.scale.size * self.scale.dtype.itemsize)

    def __repr__(self) -> str:
        return (f"QuantizedWeight({self.kind} {list(self.shape)}, scale {list(self.scale.shape)}, "
                f"block {self.block}, as {self.dtype})")


def is_quantized_leaf(x) -> bool:
    return isinstance(x, QuantizedWeight)


def check_kind(quantize) -> None:
    """``quantize`` is None or one of :data:`OPTIONS`; anything else is a one-line ValueError."""
    if quantize is not None and quantize not in OPTIONS:
        raise ValueError(f"quantize={quantize!r} is not a supported weight quantization: choose "
                         f"{', '.join(repr(k) for k in OPTIONS)} (or None to keep the stored weights)")


def _expand(scale, n: int, b: int, axis: int):
    """``scale`` repeated ``b`` times along ``axis`` and cut to ``n`` (a partial edge block)."""
    if scale.shape[axis] == 1:
        return scale  # broadcasts
    return jax.lax.slice_in_dim(jnp.repeat(scale, b, axis=axis), 0, n, axis=axis % scale.ndim)


def dequantize(w: QuantizedWeight):
    """The float weight ``q * scale`` per block, in ``w.dtype`` (the product in float32)."""
    n_in, n_out = w.q.shape[-2], w.q.shape[-1]
    s = _expand(_expand(w.scale, n_in, w.block[0], -2), n_out, w.block[1], -1)
    return (w.q.astype(jnp.float32) * s).astype(w.dtype)


def dequantize_tree(tree, anchor=None):
    """``tree`` with every :class:`QuantizedWeight` replaced by its float weight (a tree without
    any is returned as it is): what a family's layer function runs on.

    ``anchor``: an array the step computes (the layer's input activations). The quantized
    values pass through one ``optimization_barrier`` with it, so the dequantized weights depend
    on the step and XLA cannot hoist them out of a decode loop (its loop-invariant code motion
    otherwise moves every layer's dequantization in front of the loop when the layers are
    separate arguments, keeping a float copy of all of them for the whole loop: measured on the
    embedded target's split layout, 51 MB of temporaries against one layer's 13). Without an anchor the caller runs
    the layers in a scan, whose per-layer slices are loop-variant already."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_quantized_leaf)
    where = [i for i, x in enumerate(leaves) if is_quantized_leaf(x)]
    if not where:
        return tree
    if anchor is not None:
        parts = [(leaves[i].q, leaves[i].scale) for i in where]
        parts, _ = jax.lax.optimization_barrier((parts, anchor))
        for i, (q, s) in zip(where, parts):
            leaves[i] = QuantizedWeight(q, s, leaves[i].block, leaves[i].dtype)
    for i in where:
        leaves[i] = dequantize(leaves[i])
    return jax.tree_util.tree_unflatten(treedef, leaves)


def is_quantized(params) -> bool:
    """Whether ``params`` holds any quantized matrix."""
    return any(is_quantized_leaf(x) for x in jax.tree_util.tree_leaves(params, is_leaf=is_quantized_leaf))


def quantized_kind(params) -> str | None:
    """"int8", "fp8", "mixed" or None: the kinds of the quantized matrices in ``params``."""
    kinds = {x.kind for x in jax.tree_util.tree_leaves(params, is_leaf=is_quantized_leaf) if is_quantized_leaf(x)}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


def quantizable(keys: Iterable[str], leaf) -> bool:
    """Whether the parameter at path ``keys`` is a linear layer's matrix that quantization
    replaces: a Dense ``kernel`` or a stacked expert matrix (``experts/<name>``, not its bias)
    of at least two dimensions, outside :data:`KEEP_KEYS`."""
    keys = tuple(str(k) for k in keys)
    if getattr(leaf, "ndim", 0) < 2 or not jnp.issubdtype(leaf.dtype, jnp.floating):
        return False
    if any(k in KEEP_KEYS for k in keys):
        return False
    if keys[-1] == "kernel":
        return True
    return len(keys) >= 2 and keys[-2] == "experts" and not keys[-1].endswith("bias")


def _check_storage_kind(kind, what: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"{what} needs one of {KINDS}, got {kind!r}")


def quantize_array(w, kind: str, dtype=None) -> QuantizedWeight:
    """Per-output-channel weight-only quantization of ``w`` [..., in, out] (module docstring).
    ``dtype``: what it dequantizes to (default ``w``'s dtype)."""
    _check_storage_kind(kind, "quantize_array")
    dtype = jnp.dtype(dtype or w.dtype).name
    wf = jnp.asarray(w, jnp.float32)
    amax = jnp.max(jnp.abs(wf), axis=-2, keepdims=True)
    scale = jnp.where(amax > 0, amax / QMAX[kind], 1.0).astype(jnp.float32)
    x = wf / scale
    if kind == "int8":
        q = jnp.clip(jnp.round(x), -127, 127).astype(jnp.int8)
    else:
        q = jnp.clip(x, -QMAX[kind], QMAX[kind]).astype(STORAGE[kind])
    return QuantizedWeight(q, scale, (wf.shape[-2], 1), dtype)


_quantize_jit = jax.jit(quantize_array, static_argnums=(1, 2))


def quantize_params(params, kind: str):
    """``params`` with every :func:`quantizable` matrix quantized per output channel to ``kind``
    ("int8" / "fp8"); matrices already quantized are kept as they are."""
    _check_storage_kind(kind, "quantize_params")

    def one(path, x):
        if is_quantized_leaf(x):
            return x
        keys = [getattr(p, "key", getattr(p, "name", p)) for p in path]
        return _quantize_jit(x, kind, jnp.dtype(x.dtype).name) if quantizable(keys, x) else x

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=is_quantized_leaf)


def dequantize_params(params):
    """``params`` with every quantized matrix replaced by its float weight (at rest)."""
    return jax.jit(dequantize_tree)(params) if is_quantized(params) else params


def param_bytes(params) -> int:
    """Bytes the parameters hold (quantized values and scales as stored)."""
    total = 0
    for x in jax.tree_util.tree_leaves(params, is_leaf=is_quantized_leaf):
        total += x.nbytes if is_quantized_leaf(x) else int(x.size * jnp.dtype(x.dtype).itemsize)
    return total


def check_block_fp8(w: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], name: str, what: str) -> None:
    """A released block-FP8 weight and its scale as :func:`from_block_fp8` reads them: a
    float8_e4m3fn matrix, float scales of the shape its blocks need; else a CheckpointError
    naming the tensor. Reads shapes and dtypes only."""
    from dflash_jax.checkpoints import CheckpointError

    if w.ndim != 2:
        raise CheckpointError(f"{what}: {name} has a block scale but {w.ndim} dimensions (2 expected)")
    out_dim, in_dim = w.shape  # the last block of each dimension may be partial
    want = (math.ceil(out_dim / block[0]), math.ceil(in_dim / block[1]))
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(f"{what}: {name}{SCALE_INV} has shape {list(scale_inv.shape)}, but FP8 blocks "
                              f"of {list(block)} (weight_block_size) over {name} {list(w.shape)} need {list(want)}")
    if np.dtype(scale_inv.dtype).name not in ("float32", "bfloat16", "float16", "float64"):
        raise CheckpointError(f"{what}: {name}{SCALE_INV} is {scale_inv.dtype}: FP8 block scales are float32 "
                              "(or bfloat16)")
    if "float8_e4m3fn" not in str(w.dtype):
        raise CheckpointError(f"{what}: {name} is {w.dtype}, not float8_e4m3fn, but has a weight_scale_inv")


def from_block_fp8(w: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], dtype: str, name: str,
                   what: str) -> QuantizedWeight:
    """A released block-FP8 Linear weight: ``w`` float8_e4m3fn [out, in] and its float32
    ``weight_scale_inv`` [ceil(out / b_out), ceil(in / b_in)] (``block`` = ``weight_block_size``,
    [b_out, b_in]) as a :class:`QuantizedWeight` in the tree's [in, out] orientation; a scale
    of another shape or dtype is a ValueError naming the tensor (:func:`check_block_fp8`)."""
    check_block_fp8(w, scale_inv, block, name, what)
    return QuantizedWeight(np.ascontiguousarray(w.T), np.ascontiguousarray(scale_inv.astype(np.float32).T),
                           (block[1], block[0]), dtype)


def add_argument(p) -> None:
    """``--quantize`` on a command that loads a target (argparse refuses other values)."""
    p.add_argument("--quantize", choices=OPTIONS, default=None,
                   help="the target's linear layers weight-only quantized on load: int8 or fp8 "
                        "(float8_e4m3fn), one scale per output channel (docs/quantization.md); 'none' "
                        "dequantizes a quantized checkpoint; default: the weights as stored")


# ---------------------------------------------------------------------------- released FP8 files
SCALE_INV = "_scale_inv"  # ``<name>.weight_scale_inv``: the block scales of ``<name>.weight``


def fp8_block_size(q, what: str) -> tuple[int, int] | None:
    """The ``weight_block_size`` [b_out, b_in] of a block-FP8 ``quantization_config`` (the
    released Qwen3-FP8 and DeepSeek-V3 files: ``quant_method`` "fp8", ``fmt`` "e4m3"); None
    without a quantization_config; another quantization, or a bad block size, is a one-line
    ValueError naming the field."""
    if not q:
        return None
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ValueError(f"{what}: quantization_config quant_method={method!r} is not read for this target "
                         "family (only block FP8, quant_method 'fp8'): dequantize the checkpoint to bf16 first")
    return weight_block_size(q, what)


def weight_block_size(q, what: str) -> tuple[int, int]:
    """The ``weight_block_size`` of an ``fp8`` ``quantization_config`` (e4m3 weights in blocks);
    another format or a bad size is a one-line ValueError naming the field."""
    if q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{what}: quantization_config fmt={q.get('fmt')!r}: only e4m3 FP8 weights are read")
    block = q.get("weight_block_size")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise ValueError(f"{what}: quantization_config weight_block_size must be two positive integers, "
                         f"got {block!r}")
    return int(block[0]), int(block[1])


def split_block_fp8(tensors: dict, block: tuple[int, int] | None, what: str) -> tuple[dict, dict]:
    """(the tensors without their ``weight_scale_inv``, {weight name: its scale}) of a checkpoint;
    an FP8 weight without its scale, a scale without its weight, a non-FP8 weight with a scale,
    or FP8 weights without a ``quantization_config`` are one-line CheckpointErrors naming the
    tensor; each scale's shape is checked against its weight (:func:`from_block_fp8`)."""
    from dflash_jax.checkpoints import CheckpointError

    scales = {n[:-len(SCALE_INV)]: n for n in tensors if n.endswith(SCALE_INV)}
    fp8 = sorted(n for n, a in tensors.items() if "float8" in str(a.dtype))
    if (scales or fp8) and block is None:
        name = (sorted(scales.values()) or fp8)[0]
        raise CheckpointError(f"{what}: {name} is FP8 block-quantized, but config.json has no "
                              "quantization_config with its weight_block_size")
    for w, sname in sorted(scales.items()):
        if w not in tensors:
            raise CheckpointError(f"{what}: {sname} has no weight {w} to scale")
    for n in fp8:
        if n not in scales:
            raise CheckpointError(f"{what}: {n} is stored in FP8 ({tensors[n].dtype}) without its {n}{SCALE_INV}")
    for w in scales:  # checked here, so nothing is built from a bad pair
        check_block_fp8(tensors[w], tensors[scales[w]], block, w, what)
    rest = {n: a for n, a in tensors.items() if n not in scales.values()}
    return rest, {w: tensors[s] for w, s in scales.items()}


def dequantize_block_fp8(w: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """float32 ``w * scale_inv`` per block of a released FP8 weight [out, in] (exact: the
    product of an e4m3 value and a float32 scale is computed in float64, then rounded once)."""
    s = np.repeat(np.repeat(scale_inv.astype(np.float64), block[0], 0), block[1], 1)[:w.shape[0], :w.shape[1]]
    return (w.astype(np.float64) * s).astype(np.float32)
