"""Model handles: a loaded target (:class:`Target`) or drafter (:class:`Drafter`) is its static
config, its parameter pytree and where it came from; ``load_target`` / ``load_drafter`` /
``save_drafter`` / ``load_embedded`` read and write them through ``dflash_jax.checkpoints``.
The public names are re-exported by ``dflash_jax`` (``dj.load_target``, ...).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax import methods
from dflash_jax import quantization
from dflash_jax.checkpoints import load_target_params, save_target_params, save_tokenizer
from dflash_jax.config import TargetConfig, read_config_json
from dflash_jax.hub import (ASSETS_DIR, EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR,  # noqa: F401 (re-exported)
                            is_embedded, resolve_checkpoint)
from dflash_jax.methods.dflash import Drafter
from dflash_jax.parallel import rules
from dflash_jax.targets import family_of, init_target_params

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclasses.dataclass
class Target:
    """A loaded target LM: static config, parameter pytree, optional tokenizer.

    ``max_len`` is the largest KV cache a ``generate`` call may allocate (prompt plus new
    tokens, per row); it defaults to the model's ``max_position_embeddings`` and may exceed it
    only with ``allow_extrapolation=True`` (positions the model was not trained on).

    ``mesh``: a ``(data, model)`` mesh (``dflash_jax.parallel.make_mesh``): the parameters are
    placed on it by ``parallel.rules`` and ``generate`` runs sharded; None: one device.
    """

    config: TargetConfig
    params: Any
    tokenizer: Any = None
    max_len: int | None = None
    path: str | None = None
    allow_extrapolation: bool = False
    mesh: Any = None

    def __post_init__(self):
        if self.mesh is not None and quantization.is_quantized(self.params):
            raise ValueError("a quantized target runs on one device for now: load it without a mesh, "
                             "or without quantize=")
        if self.mesh is not None:
            rules.check_mesh_split(self.config, self.mesh)
            self.params = rules.shard_params(self.params, self.mesh,
                                             family_of(self.config).param_axes(self.config))
        limit = self.config.max_position_embeddings
        exact = family_of(self.config).exact_positions(self.config)
        if self.max_len is None:
            self.max_len = limit if exact is None else min(limit, exact)
        if exact is not None and not isinstance(self.max_len, bool) and isinstance(self.max_len, (int, np.integer)) \
                and self.max_len > exact:
            raise ValueError(f"max_len={self.max_len} is above the {self.config.model_type} target's exact "
                             f"length {exact} (see its family's exact_positions): use max_len <= {exact}")
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, (int, np.integer)):
            raise ValueError(f"max_len must be an integer, got {self.max_len!r}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {self.max_len}")
        if self.max_len > limit and not self.allow_extrapolation:
            raise ValueError(
                f"max_len={self.max_len} is above the model's max_position_embeddings={limit} "
                "(the longest context it was trained for): use max_len <= "
                f"{limit}, or pass allow_extrapolation=True to use positions beyond it knowingly")

    @property
    def dtype(self):
        return self.params["embed_tokens"]["embedding"].dtype

    @property
    def quantization(self) -> str | None:
        """"int8" / "fp8" when the linear layers are quantized (``dflash_jax.quantization``), else None."""
        return quantization.quantized_kind(self.params)

    @property
    def stop_token_ids(self) -> list[int]:
        """The config's eos ids, plus the tokenizer's eos when it is another id."""
        stops = list(self.config.eos_token_id)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and eos not in stops:
            stops.append(eos)
        return stops

    @classmethod
    def random(cls, config: TargetConfig, seed: int = 0, dtype=jnp.float32,
               max_len: int | None = None, init_scale: float = 0.02, mesh=None) -> "Target":
        """A target with random weights (benchmarks, tests); the same weights on any mesh."""
        return cls(config, init_target_params(config, jax.random.key(seed), dtype, init_scale),
                   max_len=max_len, mesh=mesh)

    def save(self, path: str | os.PathLike, max_shard_bytes: int | None = None) -> None:
        """Writes config.json + safetensors (and the tokenizer, when there is one)."""
        if quantization.is_quantized(self.params):
            raise ValueError(f"this target's weights are quantized ({self.quantization}) in memory: save the "
                             "float target it was loaded from (quantize= applies on load)")
        save_target_params(path, self.config, self.params, max_shard_bytes)
        if self.tokenizer is not None:
            save_tokenizer(self.tokenizer, path)


def load_target(path: str | os.PathLike, dtype=None, max_len: int | None = None, *,
                allow_extrapolation: bool = False, mesh=None, revision: str | None = None,
                quantize: str | None = None) -> Target:
    """Loads a Hugging Face checkpoint of a registered target family (Qwen3, Llama-3.x;
    ``dflash_jax.targets``).

    Args:
      path: a directory with config.json and model.safetensors (or a sharded index); a Hugging
        Face repo id ``org/name[@revision]`` (``"Qwen/Qwen3-8B"``), fetched into the hub cache
        (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``: :func:`dflash_jax.hub.resolve_checkpoint`); or
        ``"embedded"``, the target shipped in the package.
      dtype: cast the weights (e.g. ``jnp.bfloat16``); None keeps the stored dtype.
      max_len: KV cache capacity limit; default the config's max_position_embeddings.
      allow_extrapolation: allow ``max_len`` above max_position_embeddings.
      mesh: a ``(data, model)`` mesh (``dflash_jax.parallel.make_mesh``): the weights are placed
        sharded as they load (each process reads only its devices' slices of the safetensors
        files) and ``generate`` runs on the mesh. None: one device.
      revision: with a repo id: its branch, tag or commit (or write ``org/name@revision``).
      quantize: ``"int8"`` / ``"fp8"``: the linear layers weight-only quantized per output channel
        after loading (``dflash_jax.quantization``: 1-byte values and float32 scales, dequantized
        layer by layer inside the compiled step; embeddings, LM head, norms and routers kept);
        ``"none"``: a quantized checkpoint dequantized; None: the weights as stored. One device.
    """
    quantization.check_kind(quantize)
    if quantize in quantization.KINDS and mesh is not None:
        raise ValueError(f"quantize={quantize!r} with a mesh: quantized targets run on one device for now; "
                         "drop the mesh or the quantization")
    path = os.fspath(resolve_checkpoint(path, revision, kind="target"))
    keep_fp8 = quantize in (None, "fp8")  # a released FP8 file as stored
    if mesh is not None:
        config = TargetConfig.from_pretrained(path)
        rules.check_mesh_split(config, mesh)
        config, params = load_target_params(path, config, dtype=dtype, keep_fp8=keep_fp8,
                                            sharding_of=rules.sharding_of(mesh, family_of(config).param_axes(config)))
    else:
        config, params = load_target_params(path, dtype=dtype, keep_fp8=keep_fp8)
    if quantize in quantization.KINDS:  # ("none" was read dequantized: keep_fp8)
        params = quantization.quantize_params(params, quantize)
    tokenizer = None
    if any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return Target(config, params, tokenizer, max_len, path, allow_extrapolation, mesh)


def load_drafter(path: str | os.PathLike, target: Target, dtype=None, *,
                 revision: str | None = None):
    """Loads a drafter of any registered drafting method (``dflash_jax.methods``), found by its
    ``config.json``'s ``architectures``, and checks it fits ``target``.

    ``path``: a directory, a Hugging Face repo id ``org/name[@revision]``
    (``"z-lab/Qwen3-8B-DFlash-b16"``; ``revision=`` names the revision too), ``"embedded"`` (the
    shipped DFlash drafter, as for :func:`load_target`) or a method's shipped drafter by its name
    (``DraftingMethod.shipped_name``). ``dtype`` defaults to the target's dtype (drafter and target
    compute together). On a target loaded with a mesh, a DFlash drafter is placed sharded on the
    same mesh as it loads. Returns the method's handle (:class:`Drafter` for DFlash)."""
    shipped = methods.method_of_shipped_name(path)
    if shipped is not None and not is_embedded(path):
        if revision is not None:
            raise ValueError(f"drafter {path!r} is shipped in the package: it has no revision")
        path = shipped.shipped_dir()
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"the shipped {shipped.name} drafter ({shipped.shipped_name}) is not in "
                                    f"this installation ({path})")
    resolved = os.fspath(resolve_checkpoint(path, revision, kind="drafter"))
    method = methods.method_for_hf(read_config_json(resolved), f" in {resolved}")
    return method.load(resolved, target, dtype)


def save_drafter(drafter, path: str | os.PathLike) -> None:
    """Writes ``drafter`` (a handle of any registered drafting method) to the directory
    ``path``: config.json + model.safetensors in its method's released layout."""
    methods.method_of(drafter).save(drafter, path)


def load_embedded(dtype=None, max_len: int | None = None, mesh=None) -> tuple["Target", "Drafter"]:
    """The embedded default pair shipped in the package: ``(target, drafter)``.

    ``dtype`` casts both (None keeps the stored bfloat16; ``jnp.float32`` is faster on most
    CPUs); the directories are :data:`EMBEDDED_TARGET_DIR` and :data:`EMBEDDED_DRAFTER_DIR`.
    """
    target = load_target(EMBEDDED_TARGET_DIR, dtype=dtype, max_len=max_len, mesh=mesh)
    return target, load_drafter(EMBEDDED_DRAFTER_DIR, target, dtype=dtype)


def load_any_drafter(path: str | os.PathLike, target: Target, dtype=None, *,
                     revision: str | None = None):
    """Deprecated: :func:`load_drafter` picks the drafting method by architectures."""
    deprecated("load_any_drafter", "load_drafter")
    return load_drafter(path, target, dtype, revision=revision)


def deprecated(old: str, new: str) -> None:
    """Warns that ``old`` is deprecated in favour of ``dflash_jax.<new>``."""
    warnings.warn(f"{old} is deprecated: use dflash_jax.{new}, which reads a drafter of any drafting "
                  "method (dflash_jax.methods)", DeprecationWarning, stacklevel=3)


def __getattr__(name: str):
    """The names a drafting method still offers through this module, for code written before the
    method packages (its ``DraftingMethod.handle_exports`` module: deprecated loaders, its handle
    class), found through the registry so that this module names no method."""
    for method in methods.registered():
        if method.handle_exports and name in getattr(
                module := importlib.import_module(method.handle_exports), "__all__", ()):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
