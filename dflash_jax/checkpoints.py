"""Hugging Face checkpoint directories <-> parameter pytrees.

Reads ``model.safetensors`` or a sharded ``model.safetensors.index.json`` and writes the same
layout back (PyTorch ``[out, in]`` Linear weights, per-layer tensor names), so a checkpoint
loaded and saved again is bit-identical. Every problem with the tensor set (missing,
unexpected, wrong shape) is reported at once in one ``CheckpointError``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from typing import Any, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from dflash_jax import quantization, targets
from dflash_jax.config import TargetConfig
from dflash_jax.files import atomic_path, write_json

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint's tensors do not match what the config requires."""


class TensorSpec(NamedTuple):
    """How one Hugging Face tensor maps into the parameter tree.

    ``path``: keys into the tree; ``layer``: index along the stacked layer axis, or None;
    ``transpose``: True for Linear weights ([out, in] on disk, [in, out] in the tree);
    ``shape``: the shape on disk; ``expert``: index along a stacked expert axis (after the
    layer axis), or None: a mixture-of-experts layer's per-expert tensors
    (``mlp.experts.{e}.gate_proj.weight`` [F, D]) stack into one parameter [layers, E, D, F];
    ``order``: the stored tensor's rows (its first axis, before the transpose) in the order the
    parameter keeps them (row j is stored row ``order[j]``), or None: as stored. A family whose
    parameter regroups a fused tensor's channels names it here (the hybrid targets' GDN
    ``in_proj_qkv`` and ``conv1d``, grouped by key head: ``nn.gated_delta.group_order``).
    """

    path: tuple[str, ...]
    layer: int | None
    transpose: bool
    shape: tuple[int, ...]
    expert: int | None = None
    order: tuple[int, ...] | None = None


def layer_tensor_specs(prefix: str, num_layers: int, D: int, H: int, Hkv: int, Dh: int, F: int,
                       qk_norm: bool, attention_bias: bool) -> dict[str, TensorSpec]:
    """Specs of the decoder-layer tensors shared by the target and the drafter."""
    specs: dict[str, TensorSpec] = {}
    per_layer: list[tuple[str, tuple[str, ...], bool, tuple[int, ...]]] = [
        ("input_layernorm.weight", ("input_layernorm", "weight"), False, (D,)),
        ("post_attention_layernorm.weight", ("post_attention_layernorm", "weight"), False, (D,)),
        ("self_attn.q_proj.weight", ("self_attn", "q_proj", "kernel"), True, (H * Dh, D)),
        ("self_attn.k_proj.weight", ("self_attn", "k_proj", "kernel"), True, (Hkv * Dh, D)),
        ("self_attn.v_proj.weight", ("self_attn", "v_proj", "kernel"), True, (Hkv * Dh, D)),
        ("self_attn.o_proj.weight", ("self_attn", "o_proj", "kernel"), True, (D, H * Dh)),
        ("mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), True, (F, D)),
        ("mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), True, (F, D)),
        ("mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), True, (D, F)),
    ]
    if qk_norm:
        per_layer += [
            ("self_attn.q_norm.weight", ("self_attn", "q_norm", "weight"), False, (Dh,)),
            ("self_attn.k_norm.weight", ("self_attn", "k_norm", "weight"), False, (Dh,)),
        ]
    if attention_bias:
        for name, width in (("q_proj", H * Dh), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh),
                            ("o_proj", D)):
            per_layer.append((f"self_attn.{name}.bias", ("self_attn", name, "bias"), False, (width,)))
    for i in range(num_layers):
        for name, path, transpose, shape in per_layer:
            specs[f"{prefix}layers.{i}.{name}"] = TensorSpec(("layers",) + path, i, transpose, shape)
    return specs


def target_tensor_specs(cfg) -> dict[str, TensorSpec]:
    """All tensors of a target checkpoint, as its family names them (``TargetFamily.tensor_specs``)."""
    return targets.family_of(cfg).tensor_specs(cfg)


# ---------------------------------------------------------------------------- reading
def checkpoint_files(path: str | os.PathLike) -> dict[str, str]:
    """Maps every tensor name in a checkpoint directory to the file that holds it."""
    path = os.fspath(path)
    index = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    if os.path.exists(single):
        with open_safetensors(single) as f:
            return {name: single for name in f.keys()}
    raise FileNotFoundError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {path!r}: pass a Hugging Face checkpoint directory")


def read_tensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Reads tensors (all, or the given names) as numpy arrays in their stored dtype."""
    files = checkpoint_files(path)
    wanted = set(files) if names is None else set(names) & set(files)
    by_file: dict[str, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, file_names in by_file.items():
        with open_safetensors(file) as f:
            for name in file_names:
                try:
                    if f.get_slice(name).get_dtype() in RAW_DTYPES:  # numpy's reader lacks them
                        out[name] = read_raw_tensor(file, name)
                        continue
                    out[name] = f.get_tensor(name)
                except SafetensorError as e:
                    raise CheckpointError(f"{file}: tensor {name!r} cannot be read ({e}); the file is "
                                          "damaged: download or export it again") from None
    return out


RAW_DTYPES = ("F8_E4M3", "F8_E5M2")
"""safetensors dtypes read by :func:`read_raw_tensor` (FP8 weights, e.g. DeepSeek-V3's released
files): the ``safetensors`` numpy reader has no numpy dtype for them."""


def read_raw_tensor(file: str, name: str) -> np.ndarray:
    """One tensor of a safetensors file read from its header and bytes, as an ``ml_dtypes``
    array (FP8: ``float8_e4m3fn`` / ``float8_e5m2``)."""
    import ml_dtypes

    dtypes = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
    with open(file, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        info = json.loads(fh.read(n))[name]
        lo, hi = info["data_offsets"]
        fh.seek(8 + n + lo)
        data = fh.read(hi - lo)
    return np.frombuffer(data, dtypes[info["dtype"]]).reshape(info["shape"])


def stored_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a checkpoint directory, from the file headers alone."""
    by_file: dict[str, list[str]] = {}
    for name, file in checkpoint_files(path).items():
        by_file.setdefault(file, []).append(name)
    shapes = {}
    for file, names in by_file.items():
        with open_safetensors(file) as f:
            for name in names:
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def open_safetensors(file: str):
    """``safe_open`` with an error that names the file when it is truncated or not safetensors."""
    if not os.path.exists(file):
        raise FileNotFoundError(f"{file} does not exist (it is listed in the checkpoint's index)")
    try:
        return safe_open(file, framework="numpy")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} is damaged or not a safetensors file ({e}): download or "
                              "export it again") from None


def tensors_to_params(tensors: dict[str, np.ndarray], specs: dict[str, TensorSpec],
                      dtype=None, ignore: Iterable[str] = (), what: str = "checkpoint") -> dict:
    """Builds the nested parameter tree from named tensors, validating the set and shapes.

    Raises:
      CheckpointError listing every missing, unexpected and mis-shaped tensor.
    """
    check_tensor_set({n: tuple(t.shape) for n, t in tensors.items()}, specs, ignore, what)
    groups: dict[tuple[str, ...], dict[tuple[int | None, int | None], np.ndarray]] = {}
    for name, spec in specs.items():
        arr = tensors[name]
        if spec.order is not None:
            arr = arr[np.asarray(spec.order)]
        if spec.transpose:
            arr = arr.T
        groups.setdefault(spec.path, {})[(spec.layer, spec.expert)] = arr
    params: dict[str, Any] = {}
    for path, parts in groups.items():
        arr = _stack_parts(parts, lambda key: parts[key])
        arr = jnp.asarray(arr, dtype=dtype) if dtype is not None else jnp.asarray(arr)
        _set_path(params, path, arr)
    return params


def _stacked_keys(keys) -> tuple[list, list]:
    """The layer indices and expert indices ([None] when that axis is absent) of one
    parameter's specs, in stacking order."""
    layers = sorted({k[0] for k in keys}, key=lambda i: -1 if i is None else i)
    experts = sorted({k[1] for k in keys}, key=lambda i: -1 if i is None else i)
    return layers, experts


def _stack_parts(parts, get):
    """One parameter from its specs' arrays (keyed by (layer, expert)): stacked along the layer
    axis, then the expert axis, where the specs carry them."""
    layers, experts = _stacked_keys(parts)
    rows = []
    for i in layers:
        row = [get((i, e)) for e in experts]
        rows.append(row[0] if experts == [None] else np.stack(row))
    return rows[0] if layers == [None] else np.stack(rows)


def _set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def check_tensor_set(shapes: dict[str, tuple[int, ...]], specs: dict[str, TensorSpec],
                     ignore: Iterable[str] = (), what: str = "checkpoint") -> None:
    """Raises one CheckpointError listing every missing, unexpected and mis-shaped tensor
    (``shapes``: name -> shape on disk)."""
    ignore = set(ignore)
    missing = sorted(n for n in specs if n not in shapes)
    unexpected = sorted(n for n in shapes if n not in specs and n not in ignore)
    misshaped = sorted(
        f"{n}: expected {list(s.shape)}, found {list(shapes[n])}"
        for n, s in specs.items() if n in shapes and tuple(shapes[n]) != s.shape)
    if missing or unexpected or misshaped:
        lines = [f"{what} does not match its config:"]
        for title, items in (("missing tensors", missing), ("unexpected tensors", unexpected),
                             ("tensors with the wrong shape", misshaped)):
            if items:
                lines.append(f"  {title} ({len(items)}):")
                lines += [f"    {x}" for x in items[:50]]
                if len(items) > 50:
                    lines.append(f"    ... and {len(items) - 50} more")
        raise CheckpointError("\n".join(lines))


def read_sharded_params(path: str | os.PathLike, specs: dict[str, TensorSpec], sharding_of,
                        dtype=None, ignore: Iterable[str] = (), what: str = "checkpoint") -> dict:
    """Like ``tensors_to_params(read_tensors(path), specs, ...)``, but every parameter is
    created directly as a global ``jax.Array`` with the sharding ``sharding_of(param path,
    ndim)``: each process reads, from the safetensors files, only the slices its own devices
    hold (``jax.make_array_from_callback``); the whole checkpoint is never in one host's
    memory. The tensor set is validated first, from the file headers alone."""
    files = checkpoint_files(path)
    shapes: dict[str, tuple[int, ...]] = {}
    by_file: dict[str, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with open_safetensors(file) as f:
            for name in names:
                shapes[name] = tuple(f.get_slice(name).get_shape())
    check_tensor_set(shapes, specs, ignore, what)
    groups: dict[tuple[str, ...], dict[tuple[int | None, int | None], str]] = {}
    for name, spec in specs.items():
        groups.setdefault(spec.path, {})[(spec.layer, spec.expert)] = name
    params: dict[str, Any] = {}
    for tree_path, by_key in groups.items():
        layers, experts = _stacked_keys(by_key)
        first = next(iter(by_key.values()))
        spec = specs[first]
        one = shapes[first][::-1] if spec.transpose else shapes[first]
        outer = tuple(len(ids) for ids in (layers, experts) if ids != [None])
        shape = outer + one

        def read(index, by_key=by_key, spec=spec, layers=layers, experts=experts, outer=outer):
            n_outer = len(outer)
            picks = []  # per stacked axis: the (layer or expert) ids this index covers
            for ids in (layers, experts):
                if ids == [None]:
                    picks.append([None])
                else:
                    picks.append(ids[index[len([p for p in picks if p != [None]])]])
            inner = index[n_outer:]
            disk = inner[::-1] if spec.transpose else inner  # [out, in] on disk

            def get(key):
                name = by_key[key]
                with open_safetensors(files[name]) as f:
                    if spec.order is None:
                        part = f.get_slice(name)[disk]
                    else:  # the rows this shard holds, read as the span that covers them
                        rows = np.asarray(spec.order)[disk[0]]
                        lo = int(rows.min())
                        part = f.get_slice(name)[(slice(lo, int(rows.max()) + 1),) + tuple(disk[1:])][rows - lo]
                return part.T if spec.transpose else part

            arr = _stack_parts({(i, e): None for i in picks[0] for e in picks[1]}, get)
            return arr.astype(dtype) if dtype is not None else arr

        arr = jax.make_array_from_callback(shape, sharding_of(tree_path, len(shape)), read)
        _set_path(params, tree_path, arr)
    return params


def params_to_tensors(params: dict, specs: dict[str, TensorSpec]) -> dict[str, np.ndarray]:
    """Inverse of :func:`tensors_to_params`: contiguous numpy tensors named as on disk."""
    out = {}
    for name, spec in specs.items():
        node = params
        for key in spec.path:
            node = node[key]
        arr = np.asarray(jax.device_get(node))
        if spec.layer is not None:
            arr = arr[spec.layer]
        if spec.expert is not None:
            arr = arr[spec.expert]
        if spec.transpose:
            arr = arr.T
        if spec.order is not None:  # back to the stored order
            stored = np.empty_like(arr)
            stored[np.asarray(spec.order)] = arr
            arr = stored
        out[name] = np.ascontiguousarray(arr)
    return out


def text_model_tensors(tensors: dict, text_prefixes: dict[str, str], ignored_prefixes: dict[str, str],
                       what: str, model: str) -> dict:
    """The text model's tensors of a multimodal checkpoint: names under a key of
    ``text_prefixes`` renamed to its value (the text-only layout), names under a key of
    ``ignored_prefixes`` (the towers) dropped with one log line counting them by its value (a
    kind, e.g. "vision-tower"); others kept. A name reached twice is a CheckpointError."""
    renamed, ignored = {}, {}
    for name, arr in tensors.items():
        kind = next((k for p, k in ignored_prefixes.items() if name.startswith(p)), None)
        if kind is not None:
            ignored[kind] = ignored.get(kind, 0) + 1
            continue
        prefix = next((p for p in text_prefixes if name.startswith(p)), None)
        new = name if prefix is None else text_prefixes[prefix] + name[len(prefix):]
        if new in renamed:
            raise CheckpointError(f"{what}: {new} is stored twice (as {name} too): keep one layout")
        renamed[new] = arr
    if ignored:
        log.warning("%s: ignored %s (not part of the %s text model)", what,
                    " and ".join(f"{n} {k} tensors" for k, n in ignored.items()), model)
    return renamed


# ---------------------------------------------------------------------------- writing
def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      max_shard_bytes: int | None = None) -> None:
    """Writes ``model.safetensors`` (or shards + index when larger than ``max_shard_bytes``).

    Files are written under temporary names and renamed, so an interrupted save never leaves
    a half-written checkpoint under the final name.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    total = sum(t.nbytes for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        _atomic_save(tensors, os.path.join(path, SINGLE_FILE))
        stale = os.path.join(path, INDEX_FILE)
        if os.path.exists(stale):
            os.remove(stale)
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, t in tensors.items():
        if size and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _atomic_save(shard, os.path.join(path, file))
        weight_map.update({name: file for name in shard})
    write_json(os.path.join(path, INDEX_FILE),
                       {"metadata": {"total_size": int(total)}, "weight_map": weight_map})
    stale = os.path.join(path, SINGLE_FILE)
    if os.path.exists(stale):
        os.remove(stale)


def _dtype_fields(tensors) -> dict:
    """config.json's dtype of the stored weights ("float32", "bfloat16" or "float16" when
    uniform, else "float32"), under both names: ``dtype`` (transformers 5) and ``torch_dtype``
    (transformers 4.x, which does not know ``dtype``)."""
    names = {str(t.dtype) for t in tensors}
    name = names.pop() if len(names) == 1 else "float32"
    return {"dtype": name, "torch_dtype": name}


def _atomic_save(tensors: dict[str, np.ndarray], file: str) -> None:
    with atomic_path(file) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.chmod(tmp, 0o644)  # safetensors creates owner-only files; shipped weights must be readable


# ---------------------------------------------------------------------------- target API
def load_target_params(path: str | os.PathLike, cfg: TargetConfig | None = None, dtype=None,
                       sharding_of=None, keep_fp8: bool = True):
    """Loads a target checkpoint directory into (config, params).

    ``dtype`` (e.g. ``jnp.bfloat16``) casts every tensor; None keeps the stored dtype.
    A tied checkpoint that still stores ``lm_head.weight`` is accepted (the copy is ignored).
    ``sharding_of(param path, ndim)``: place the parameters sharded as they are read
    (:func:`read_sharded_params`).

    A family may read other stored layouts than its ``tensor_specs`` (a mixture-of-experts
    checkpoint with its experts fused into one tensor per layer, quantized weights): it then
    defines ``convert_checkpoint_tensors(cfg, tensors, what) -> tensors`` (names and arrays as
    read -> the ``tensor_specs`` names, raising :class:`CheckpointError` naming a bad tensor),
    which runs when the checkpoint holds names outside its specs. Such a checkpoint is read
    whole on the host, then placed (``sharding_of``).

    Block-FP8 weights (the released ``-FP8`` files: ``quantization_config`` ``quant_method``
    "fp8", ``float8_e4m3fn`` weights and ``weight_scale_inv`` block scales): ``keep_fp8`` loads
    them as they are (``quantization.QuantizedWeight``, dequantized layer by layer inside the
    compiled step), else dequantized to float32 on load (then cast to ``dtype``). A family that
    reads them itself (``deepseek_v3``, whose config records ``fp8_weight_block_size``) names the
    stored tensors with ``stored_block_fp8_tensors``; with ``sharding_of`` it dequantizes them.
    """
    cfg = cfg or TargetConfig.from_pretrained(path)
    specs = target_tensor_specs(cfg)
    ignore = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    what = f"target checkpoint {os.fspath(path)!r}"
    convert = getattr(targets.family_of(cfg), "convert_checkpoint_tensors", None)
    stored = set(checkpoint_files(path))
    # a family that reads block FP8 itself (deepseek_v3) dequantizes on load unless kept, on one device
    own_fp8 = getattr(cfg, "fp8_weight_block_size", None) is not None
    block_fp8 = (any(n.endswith(quantization.SCALE_INV) for n in stored)
                 and (not own_fp8 or (keep_fp8 and sharding_of is None)))
    if block_fp8:
        if sharding_of is not None and keep_fp8:
            raise ValueError(f"{what} holds block-FP8 weights: quantized targets run on one device for now; "
                             "load it without a mesh, or dequantized (quantize='none')")
        params = _load_block_fp8(path, cfg, specs, ignore, what, dtype, convert, keep_fp8)
    else:
        direct = convert is None or stored <= set(specs) | set(ignore)
        check = getattr(targets.family_of(cfg), "check_checkpoint_tensors", None)
        if check is not None and direct:  # the family's one-line messages before the generic listing
            check(cfg, stored_shapes(path), what)
        if sharding_of is not None and direct:
            return cfg, read_sharded_params(path, specs, sharding_of, dtype, ignore, what)
        tensors = read_tensors(path)
        if not direct:  # another stored layout (fused experts, quantized blocks): the family converts
            tensors = convert(cfg, tensors, what)
        params = tensors_to_params(tensors, specs, dtype=dtype, ignore=ignore, what=what)
    if sharding_of is not None:  # read whole on the host, then placed
        params = jax.tree_util.tree_map_with_path(
            lambda p, x: jax.device_put(x, sharding_of(tuple(k.key for k in p), x.ndim)), params)
    return cfg, params


def _load_block_fp8(path, cfg, specs, ignore, what, dtype, convert, keep_fp8: bool):
    """:func:`load_target_params` of a checkpoint with released block-FP8 weights."""
    from dflash_jax.config import read_config_json

    block = quantization.fp8_block_size(read_config_json(path).get("quantization_config"), what)
    tensors = read_tensors(path)
    prepare = getattr(targets.family_of(cfg), "stored_block_fp8_tensors", None)
    if prepare is not None:  # the family's names for a file it also reads itself (deepseek_v3)
        tensors = prepare(cfg, tensors, what)
    tensors, scales = quantization.split_block_fp8(tensors, block, what)
    if not keep_fp8:
        tensors = {n: quantization.dequantize_block_fp8(a, scales[n], block) if n in scales else a
                   for n, a in tensors.items()}
        if set(tensors) - set(specs) - set(ignore) and convert is not None:
            tensors = convert(cfg, tensors, what)
        return tensors_to_params(tensors, specs, dtype=dtype, ignore=ignore, what=what)
    unknown = sorted(n for n in scales if n not in specs)
    if unknown:
        raise CheckpointError(f"{what}: {unknown[0]} is block-FP8 but not a tensor of the {cfg.model_type} layout "
                              "read quantized: load it with quantize='none' (dequantized on load)")
    values = tensors_to_params(tensors, specs, dtype=None, ignore=ignore, what=what)
    scale_specs = {n: specs[n]._replace(shape=tuple(scales[n].shape)) for n in scales}
    scale_tree = tensors_to_params({n: np.asarray(a, np.float32) for n, a in scales.items()}, scale_specs,
                                   what=what)
    float_dtype = jnp.dtype(dtype or next(a.dtype for n, a in tensors.items() if n not in scales
                                          and np.issubdtype(a.dtype, np.floating))).name
    b_out, b_in = block

    def merge(v, s):
        if isinstance(v, dict):
            return {k: merge(x, s.get(k) if isinstance(s, dict) else None) for k, x in v.items()}
        if s is not None:
            return quantization.QuantizedWeight(v, s, (b_in, b_out), float_dtype)
        return v.astype(float_dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v

    return merge(values, scale_tree)


def save_target_params(path: str | os.PathLike, cfg: TargetConfig, params,
                       max_shard_bytes: int | None = None, extra_config: dict | None = None) -> None:
    """Saves config.json (:meth:`TargetConfig.to_hf_dict` + dtype) and safetensors in the
    Hugging Face layout that transformers 4.x and 5.x load as the same model."""
    tensors = params_to_tensors(params, target_tensor_specs(cfg))
    export = getattr(targets.family_of(cfg), "export_checkpoint_tensors", None)
    if export is not None:  # a stored layout the specs cannot name (packed projections)
        tensors = export(cfg, tensors)
    write_safetensors(path, tensors, max_shard_bytes)
    config = {**cfg.to_hf_dict(), **_dtype_fields(tensors.values()), **(extra_config or {})}
    write_json(os.path.join(os.fspath(path), "config.json"), config)


# ---------------------------------------------------------------------------- tokenizers
def save_tokenizer(tokenizer, path: str | os.PathLike) -> None:
    """``tokenizer.save_pretrained(path)``, with a ``tokenizer_config.json`` that transformers
    4.x reads too.

    transformers 5 names a plain ``tokenizers``-backed tokenizer ``TokenizersBackend`` (a class
    4.x does not have) and lists extra special tokens as ``extra_special_tokens``; 4.x knows the
    same tokenizer as ``PreTrainedTokenizerFast`` with ``additional_special_tokens``, and 5.x
    reads that form as well. Load-time fields (``is_local``, ``local_files_only``) are dropped.
    """
    path = os.fspath(path)
    tokenizer.save_pretrained(path)
    file = os.path.join(path, "tokenizer_config.json")
    if not os.path.exists(file):
        return
    with open(file) as f:
        cfg = json.load(f)
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    for key in ("is_local", "local_files_only", "backend"):
        cfg.pop(key, None)
    write_json(file, cfg)
