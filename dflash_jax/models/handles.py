"""Model handles: a loaded target (:class:`Target`) or drafter (:class:`Drafter`) is its static
config, its parameter pytree and where it came from; ``load_target`` / ``load_drafter`` /
``save_drafter`` / ``load_embedded`` read and write them through ``dflash_jax.checkpoints``.
The public names are re-exported by ``dflash_jax`` (``dj.load_target``, ...).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.checkpoints import (load_drafter_params, load_target_params, save_drafter_params,
                                    save_target_params, save_tokenizer)
from dflash_jax.config import DrafterConfig, TargetConfig
from dflash_jax.hub import (ASSETS_DIR, EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR,  # noqa: F401 (re-exported)
                            resolve_checkpoint)
from dflash_jax.models.drafter import init_drafter_params
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
        if self.mesh is not None:
            rules.check_mesh_split(self.config, self.mesh)
            self.params = rules.shard_params(self.params, self.mesh,
                                             family_of(self.config).param_axes(self.config))
        limit = self.config.max_position_embeddings
        if self.max_len is None:
            self.max_len = limit
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
        save_target_params(path, self.config, self.params, max_shard_bytes)
        if self.tokenizer is not None:
            save_tokenizer(self.tokenizer, path)


def load_target(path: str | os.PathLike, dtype=None, max_len: int | None = None, *,
                allow_extrapolation: bool = False, mesh=None, revision: str | None = None) -> Target:
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
    """
    path = os.fspath(resolve_checkpoint(path, revision, kind="target"))
    if mesh is not None:
        config = TargetConfig.from_pretrained(path)
        rules.check_mesh_split(config, mesh)
        config, params = load_target_params(path, config, dtype=dtype,
                                            sharding_of=_sharding_on(mesh, family_of(config).param_axes(config)))
    else:
        config, params = load_target_params(path, dtype=dtype)
    tokenizer = None
    if any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return Target(config, params, tokenizer, max_len, path, allow_extrapolation, mesh)


def _sharding_on(mesh, table=None):
    """param path, ndim -> its NamedSharding on ``mesh`` (``parallel.rules``; ``table``: a
    target family's ``param_axes``, default the drafter's)."""
    def sharding_of(path, ndim):
        return jax.sharding.NamedSharding(
            mesh, rules.logical_to_spec(rules.param_logical_axes(tuple(path), ndim, table),
                                        mesh=mesh))
    return sharding_of


@dataclasses.dataclass
class Drafter:
    """A DFlash drafter: config (released layout) and parameters; uses the target's embedding
    and LM head, which are never copied into ``params``. ``mesh``: the mesh its parameters are
    placed on (its target's; None: one device)."""

    config: DrafterConfig
    params: Any
    path: str | None = None
    mesh: Any = None

    def __post_init__(self):
        if self.mesh is not None:
            rules.check_model_split(self.config, rules.mesh_axis_sizes(self.mesh)[rules.MODEL],
                                    "drafter")
            self.params = rules.shard_params(self.params, self.mesh)

    @property
    def dtype(self):
        # conditioning "none" has no fc
        return (self.params["fc"]["kernel"] if "fc" in self.params else self.params["norm"]["weight"]).dtype

    @classmethod
    def random(cls, target: Target, num_layers: int = 1, block_size: int = 16,
               mask_token_id: int | None = None, target_layer_ids=None, seed: int = 0,
               dtype=None, init_scale: float = 0.02, conditioning: str = "kv") -> "Drafter":
        """A random-weight drafter shaped for ``target`` (default mask id: the last vocab row;
        ``conditioning``: see :class:`~dflash_jax.config.DrafterConfig`)."""
        mask = target.config.vocab_size - 1 if mask_token_id is None else mask_token_id
        cfg = DrafterConfig.for_target(target.config, num_layers, block_size, mask, target_layer_ids,
                                       conditioning=conditioning)
        cfg.check_target(target.config)
        params = init_drafter_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale)
        return cls(cfg, params, mesh=target.mesh)


def load_drafter(path: str | os.PathLike, target: Target, dtype=None, *,
                 revision: str | None = None) -> Drafter:
    """Loads a drafter in the released DFlash layout and checks it fits ``target``.

    ``path``: a directory, a Hugging Face repo id ``org/name[@revision]``
    (``"z-lab/Qwen3-8B-DFlash-b16"``; ``revision=`` names the revision too) or ``"embedded"``,
    as for :func:`load_target`. ``dtype`` defaults to the target's dtype (drafter and target
    compute together). On a target loaded with a mesh, the drafter is placed sharded on the
    same mesh as it loads."""
    path = os.fspath(resolve_checkpoint(path, revision, kind="drafter"))
    cfg = DrafterConfig.from_pretrained(path)
    cfg.check_target(target.config)
    if target.mesh is not None:
        rules.check_model_split(cfg, rules.mesh_axis_sizes(target.mesh)[rules.MODEL], "drafter")
        params = load_drafter_params(path, cfg, dtype=dtype or target.dtype,
                                     sharding_of=_sharding_on(target.mesh))
    else:
        params = load_drafter_params(path, cfg, dtype=dtype or target.dtype)
    return Drafter(cfg, params, path, target.mesh)


def save_drafter(drafter: Drafter, path: str | os.PathLike) -> None:
    """Writes config.json + model.safetensors in the released DFlash layout."""
    save_drafter_params(path, drafter.config, drafter.params)


def load_embedded(dtype=None, max_len: int | None = None, mesh=None) -> tuple["Target", "Drafter"]:
    """The embedded default pair shipped in the package: ``(target, drafter)``.

    ``dtype`` casts both (None keeps the stored bfloat16; ``jnp.float32`` is faster on most
    CPUs); the directories are :data:`EMBEDDED_TARGET_DIR` and :data:`EMBEDDED_DRAFTER_DIR`.
    """
    target = load_target(EMBEDDED_TARGET_DIR, dtype=dtype, max_len=max_len, mesh=mesh)
    return target, load_drafter(EMBEDDED_DRAFTER_DIR, target, dtype=dtype)
