"""Target families: the registry that finds a family by Hugging Face
``model_type`` (see ``docs/targets.md``).

A *target family* is one architecture (dense Qwen3/Llama decoders, MoE, hybrid linear
attention, ...). It owns everything about it: reading and writing its ``config.json``, its
tensor names in both directions, its forward pass and decode state, its partition rules and its
size model. The engine, the checkpoint loader, the partition code and the cost models never
name a concrete architecture: they call :func:`family_of` and use the :class:`TargetFamily`
it returns.

The decode state a family's forward threads through (its "cache") is any pytree with

  * ``lengths``: int32[B], the positions of each row the state holds (committed tokens);
  * ``rollback(lengths) -> state``: the state as it was after the first ``lengths[b]``
    positions of row b, for lengths between the row's length before the last forward and
    after it (speculative decoding's rejection of the unaccepted block rows). An attention
    layer's KV cache just sets the length (``nn.cache.KVCache``); a recurrent layer
    restores the state it had after the accepted row (``nn.cache.RecurrentState``).

This package's ``__init__`` is the registry and imports nothing of the project (the config
readers and the families import it); the interface is :class:`~dflash_jax.targets.base.TargetFamily`,
the built-in families are registered in ``dflash_jax/targets/builtin.py``.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp

_FAMILIES: dict[str, Any] = {}  # model_type -> TargetFamily


def register(family):
    """Adds ``family`` under each of its ``model_types``; a type already taken by another
    family is a ValueError."""
    if not family.model_types:
        raise ValueError(f"{family!r} names no model_types")
    for t in family.model_types:
        other = _FAMILIES.get(t)
        if other is not None and other is not family:
            raise ValueError(f"model_type {t!r} is already registered to {other!r}")
    for t in family.model_types:
        _FAMILIES[t] = family
    return family


def supported_model_types() -> tuple[str, ...]:
    """Every registered ``model_type``, in registration order."""
    return tuple(_FAMILIES)


def family(model_type: str, where: str = ""):
    """The family registered for ``model_type``; an unknown one is a one-line ValueError that
    lists the supported types."""
    found = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise ValueError(f"unknown model_type {model_type!r}{where}; supported model types are "
                         f"{', '.join(_FAMILIES)}")
    return found


def family_of(cfg):
    """The family of a target config (by its ``model_type``)."""
    return family(getattr(cfg, "model_type", None))


def family_for_hf(d: Mapping[str, Any]):
    """The family that reads a ``config.json`` dict (by its ``model_type``)."""
    return family(d.get("model_type"), " in config.json")


# ---------------------------------------------------------------------------- dispatch
def target_forward(cfg, params, tokens, positions, state=None, **options):
    """``family_of(cfg).forward(cfg, params, tokens, positions, state, **options)``: one pass
    of any registered target (see ``TargetFamily.forward``)."""
    return family_of(cfg).forward(cfg, params, tokens, positions, state, **options)


def init_target_params(cfg, key, dtype=None, init_scale: float = 0.02):
    """Random parameters of any registered target (``TargetFamily.init_params``)."""
    return family_of(cfg).init_params(cfg, key, jnp.float32 if dtype is None else dtype, init_scale)
