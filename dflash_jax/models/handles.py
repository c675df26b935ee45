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


@dataclasses.dataclass
class Eagle3Drafter:
    """An EAGLE-3 drafter (``docs/eagle3.md``): config (the released ``LlamaForCausalLMEagle3``
    layout), the :class:`~dflash_jax.models.eagle3.Eagle3Model` parameters, and the draft
    vocabulary's map ``d2t`` int32[Vd] (target id = draft id + d2t[draft id]). It embeds with
    the target's embedding, which is never copied into ``params``. Pass it to ``generate`` as
    ``drafter=`` like a DFlash drafter; its chain length is ``block_size - 1`` drafting steps
    (default :data:`EAGLE3_DEFAULT_BLOCK`)."""

    config: Any  # Eagle3Config
    params: Any
    d2t: Any
    path: str | None = None
    mesh: Any = None

    def __post_init__(self):
        d2t = np.asarray(self.d2t)
        if d2t.shape != (self.config.draft_vocab_size,) or not np.issubdtype(d2t.dtype, np.integer):
            raise ValueError(f"d2t must be an integer array of shape [{self.config.draft_vocab_size}] "
                             f"(draft_vocab_size), got {d2t.dtype} {d2t.shape}")
        ids = np.arange(d2t.size) + d2t
        if ids.min(initial=0) < 0 or ids.max(initial=0) >= self.config.vocab_size or \
                np.unique(ids).size != ids.size:
            raise ValueError("d2t does not map the draft vocabulary to distinct target tokens "
                             f"(draft id + d2t[draft id] must be distinct ids in [0, "
                             f"{self.config.vocab_size})): the vocabulary map is corrupt")
        self.d2t = d2t.astype(np.int32)
        if self.mesh is not None:
            raise ValueError("EAGLE-3 drafters run on one device here: load the target without "
                             "a mesh to use one")

    @property
    def dtype(self):
        return self.params["fc"]["kernel"].dtype

    @property
    def block_size(self) -> int:
        """The default block: the anchor and ``EAGLE3_DEFAULT_BLOCK - 1`` drafting steps (the
        training-time test's length)."""
        return EAGLE3_DEFAULT_BLOCK

    @property
    def draft_vocab(self) -> np.ndarray:
        """int32[Vd] the target ids of the draft vocabulary, in draft-id order."""
        return (np.arange(self.d2t.size) + self.d2t).astype(np.int32)

    def proposer_params(self) -> dict:
        """What the engine hands the proposer: ``{"model": params, "d2t": int32[Vd]}``."""
        return {"model": self.params, "d2t": jnp.asarray(self.d2t)}

    @classmethod
    def random(cls, target: Target, draft_vocab=None, target_layer_ids=None, seed: int = 0,
               dtype=None, init_scale: float = 0.02) -> "Eagle3Drafter":
        """A random-weight EAGLE-3 drafter shaped for ``target``. ``draft_vocab``: the target
        ids of the draft vocabulary (any order; stored sorted), or None for the whole
        vocabulary; ``target_layer_ids``: the three feature layers (default
        ``config.default_eagle3_layer_ids``)."""
        from dflash_jax.config import Eagle3Config
        from dflash_jax.models.eagle3 import init_eagle3_params

        vocab = (np.arange(target.config.vocab_size) if draft_vocab is None
                 else np.unique(np.asarray(draft_vocab, np.int64)))
        cfg = Eagle3Config.for_target(target.config, int(vocab.size), target_layer_ids)
        cfg.check_target(target.config)
        params = init_eagle3_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale)
        return cls(cfg, params, d2t_of_vocab(vocab))


EMBEDDED_EAGLE3 = "embedded-eagle3"  # the shipped EAGLE-3 drafter's name on command lines
EAGLE3_DEFAULT_BLOCK = 8  # the anchor + 7 drafting steps (SpecForge's training-time-test length)


def d2t_of_vocab(vocab) -> np.ndarray:
    """The offsets ``d2t`` int32[Vd] of a draft vocabulary given as sorted target ids."""
    vocab = np.asarray(vocab, np.int64)
    return (vocab - np.arange(vocab.size)).astype(np.int32)


def load_eagle3(path: str | os.PathLike, target: Target, dtype=None, *,
                revision: str | None = None) -> Eagle3Drafter:
    """Loads an EAGLE-3 drafter in the released layout (``config.json`` with architectures
    ``LlamaForCausalLMEagle3``, safetensors with ``d2t`` / ``t2d``): a directory, a repo id, or
    ``"embedded"``, the embedded target's EAGLE-3 drafter shipped in the package. Checks that it
    fits ``target``; ``dtype`` defaults to the target's."""
    from dflash_jax.checkpoints_eagle3 import load_eagle3_params
    from dflash_jax.config import Eagle3Config

    path = os.fspath(resolve_checkpoint(path, revision, kind="eagle3"))
    cfg = Eagle3Config.from_pretrained(path, target.config)
    cfg.check_target(target.config)
    params, d2t = load_eagle3_params(path, cfg, dtype=dtype or target.dtype)
    return Eagle3Drafter(cfg, params, d2t, path, target.mesh)


def save_eagle3(drafter: Eagle3Drafter, path: str | os.PathLike) -> None:
    """Writes config.json + model.safetensors (with ``d2t`` and ``t2d``) in the released
    EAGLE-3 layout."""
    from dflash_jax.checkpoints_eagle3 import save_eagle3_params

    save_eagle3_params(path, drafter.config, drafter.params, drafter.d2t)


def load_any_drafter(path: str | os.PathLike, target: Target, dtype=None, *,
                     revision: str | None = None):
    """A DFlash or an EAGLE-3 drafter, by its config.json's ``architectures`` (command lines'
    ``--drafter``); ``"embedded"`` is the shipped DFlash drafter, ``"embedded-eagle3"`` the
    shipped EAGLE-3 one."""
    from dflash_jax.config import read_config_json

    if path == EMBEDDED_EAGLE3:
        return load_eagle3("embedded", target, dtype)
    resolved = os.fspath(resolve_checkpoint(path, revision, kind="drafter"))
    archs = read_config_json(resolved).get("architectures") or []
    if any("eagle3" in str(a).lower() for a in archs):
        return load_eagle3(resolved, target, dtype)
    return load_drafter(resolved, target, dtype)
