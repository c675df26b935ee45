"""The EAGLE-3 drafter handle (:class:`Eagle3Drafter`: config in the released
``LlamaForCausalLMEagle3`` layout, parameters and the draft vocabulary's map) and its
checkpoint I/O (``dflash_jax.methods.eagle3.checkpoint``); ``load_drafter`` / ``save_drafter`` reach
these through the method registry (``docs/eagle3.md``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.hub import ASSETS_DIR, is_embedded, resolve_checkpoint
from dflash_jax.methods.eagle3.checkpoint import load_eagle3_params, save_eagle3_params
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.methods.eagle3.model import init_eagle3_params


@dataclasses.dataclass
class Eagle3Drafter:
    """An EAGLE-3 drafter (``docs/eagle3.md``): config (the released ``LlamaForCausalLMEagle3``
    layout), the :class:`~dflash_jax.methods.eagle3.model.Eagle3Model` parameters, and the draft
    vocabulary's map ``d2t`` int32[Vd] (target id = draft id + d2t[draft id]). It embeds with
    the target's embedding, which is never copied into ``params``. Pass it to ``generate`` as
    ``drafter=`` like a DFlash drafter; its chain length is ``block_size - 1`` drafting steps
    (default :data:`EAGLE3_DEFAULT_BLOCK`)."""

    method_name = "eagle3"  # its drafting method (dflash_jax.methods)

    config: Eagle3Config
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
    def random(cls, target, draft_vocab=None, target_layer_ids=None, seed: int = 0,
               dtype=None, init_scale: float = 0.02) -> "Eagle3Drafter":
        """A random-weight EAGLE-3 drafter shaped for ``target``. ``draft_vocab``: the target
        ids of the draft vocabulary (any order; stored sorted), or None for the whole
        vocabulary; ``target_layer_ids``: the three feature layers (default
        ``methods.eagle3.config.default_eagle3_layer_ids``)."""
        vocab = (np.arange(target.config.vocab_size) if draft_vocab is None
                 else np.unique(np.asarray(draft_vocab, np.int64)))
        cfg = Eagle3Config.for_target(target.config, int(vocab.size), target_layer_ids)
        cfg.check_target(target.config)
        params = init_eagle3_params(cfg, jax.random.key(seed), dtype or target.dtype, init_scale)
        return cls(cfg, params, d2t_of_vocab(vocab))


EMBEDDED_EAGLE3 = "embedded-eagle3"  # the shipped EAGLE-3 drafter's name on command lines
EMBEDDED_EAGLE3_DIR = os.path.join(ASSETS_DIR, "eagle3")
"""The embedded target's EAGLE-3 drafter (the DFlash drafter's baseline, ``docs/eagle3.md``)."""


def resolve(name: str | os.PathLike, revision: str | None = None) -> str:
    """The directory of an EAGLE-3 drafter named ``name``: ``embedded`` is the shipped one,
    anything else as ``hub.resolve_checkpoint`` resolves a drafter (a PathLike is a path, never
    a repo id)."""
    if is_embedded(name):
        if revision is not None:
            raise ValueError("drafter 'embedded' is the model shipped in the package: it has no revision")
        return EMBEDDED_EAGLE3_DIR
    return os.fspath(resolve_checkpoint(name, revision, kind="drafter"))
EAGLE3_DEFAULT_BLOCK = 8  # the anchor + 7 drafting steps (SpecForge's training-time-test length)


def d2t_of_vocab(vocab) -> np.ndarray:
    """The offsets ``d2t`` int32[Vd] of a draft vocabulary given as sorted target ids."""
    vocab = np.asarray(vocab, np.int64)
    return (vocab - np.arange(vocab.size)).astype(np.int32)


VOCAB_FILE = "draft_vocab.json"  # a training run's draft vocabulary: sorted target ids


def vocab_digest(vocab) -> str:
    """sha256 of a draft vocabulary (int32 ids), recorded in run.json."""
    return hashlib.sha256(np.asarray(vocab, np.int32).tobytes()).hexdigest()


# ------------------------------------------------------------------ the loss

def read_run_vocab(run_dir: str, record: dict) -> np.ndarray:
    """A run's draft vocabulary (``draft_vocab.json``), checked against run.json's digest."""
    path = os.path.join(run_dir, VOCAB_FILE)
    with open(path) as f:
        vocab = np.asarray(json.load(f), np.int32)
    if vocab_digest(vocab) != record.get("draft_vocab_sha256"):
        raise ValueError(f"{path} does not match the draft vocabulary recorded in {run_dir}/run.json: "
                         "the run directory was altered")
    return vocab


def from_run(run_dir: str, record: dict, cfg: Eagle3Config, params) -> Eagle3Drafter:
    """The drafter a training run holds: its config and parameters with the run's draft
    vocabulary (``export``)."""
    return Eagle3Drafter(cfg, params, d2t_of_vocab(read_run_vocab(run_dir, record)))


def load(path: str, target, dtype=None) -> Eagle3Drafter:
    """The EAGLE-3 drafter in the directory ``path`` (``config.json`` with architectures
    ``LlamaForCausalLMEagle3``, safetensors with ``d2t`` / ``t2d``), checked against
    ``target``; ``dtype`` defaults to the target's."""
    cfg = Eagle3Config.from_pretrained(path, target.config)
    cfg.check_target(target.config)
    params, d2t = load_eagle3_params(path, cfg, dtype=dtype or target.dtype)
    return Eagle3Drafter(cfg, params, d2t, path, target.mesh)


def save(drafter: Eagle3Drafter, path: str | os.PathLike) -> None:
    """Writes config.json + model.safetensors (with ``d2t`` and ``t2d``) in the released
    EAGLE-3 layout."""
    save_eagle3_params(path, drafter.config, drafter.params, drafter.d2t)
