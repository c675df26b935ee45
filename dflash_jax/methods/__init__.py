"""Drafting methods: the registry that finds a method by the ``architectures`` a drafter
checkpoint's ``config.json`` names (``docs/methods.md``).

A *drafting method* (DFlash and the others) is one package under ``dflash_jax/methods/`` that owns
what is particular to it: its drafter handle and checkpoint layout (load and save), its default
block, the generation options it takes or refuses, and the proposer the engine runs for it. The
loaders (``load_drafter``, ``--drafter``) and the engine's preparation never name a concrete
method: they call :func:`method_for_hf` (a checkpoint) or :func:`method_of` (a loaded drafter)
and use the :class:`~dflash_jax.methods.base.DraftingMethod` it returns.

This package's ``__init__`` is the registry and imports nothing of the project (the method
packages import it); the interface is :class:`~dflash_jax.methods.base.DraftingMethod`, the
built-in methods are registered in ``dflash_jax/methods/builtin.py``.
"""

from __future__ import annotations

from typing import Any, Mapping

DEFAULT = "dflash"  # the method of a run or a report written before they named their method; train's default

_METHODS: dict[str, Any] = {}  # name -> DraftingMethod
_ARCHITECTURES: dict[str, Any] = {}  # config.json architecture -> DraftingMethod
_NAMED: dict[str, Any] = {}  # a shipped drafter's command-line name -> DraftingMethod


def register(method):
    """Adds ``method`` under its ``name``, each of its ``architectures`` and its shipped
    drafter's name; a name or an architecture already taken by another method is a ValueError."""
    if not method.name or not method.architectures:
        raise ValueError(f"{method!r} needs a name and at least one architecture")
    taken = [(_METHODS, method.name, "name"), *((_ARCHITECTURES, a, "architecture") for a in method.architectures)]
    if method.shipped_name:
        taken.append((_NAMED, method.shipped_name, "shipped drafter name"))
    for table, key, what in taken:
        other = table.get(key)
        if other is not None and other is not method:
            raise ValueError(f"{what} {key!r} is already registered to the drafting method {other.name!r}")
    for table, key, _ in taken:
        table[key] = method
    return method


def registered() -> tuple:
    """Every registered method, in registration order."""
    return tuple(_METHODS.values())


def supported_methods() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    return tuple(_METHODS)


def known() -> str:
    """The registered methods and their architectures, for messages."""
    return ", ".join(f"{m.name} ({', '.join(m.architectures)})" for m in _METHODS.values())


def method(name: str):
    """The method registered as ``name``; an unknown one is a ValueError listing the known."""
    found = _METHODS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown drafting method {name!r}; the known methods are {known()}")
    return found


def method_for_hf(d: Mapping[str, Any], where: str = ""):
    """The method a drafter's ``config.json`` dict names by its ``architectures``; for a config
    whose architectures name no registered method, the first method whose
    :meth:`~.base.DraftingMethod.claims` takes it by its fields; anything else is a one-line
    ValueError listing the known methods."""
    archs = [str(a) for a in (d.get("architectures") or [])]
    for a in archs:
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a]
    for m in _METHODS.values():
        if m.claims(d):
            return m
    named = f"architectures {archs}" if archs else "no architectures"
    raise ValueError(f"config.json{where} names {named}, which no registered drafting method reads; "
                     f"the known methods are {known()}")


def method_of(drafter):
    """The method of a loaded drafter (its handle class's ``method_name``); anything else is a
    ValueError naming the loaders."""
    name = getattr(type(drafter), "method_name", None)
    if name not in _METHODS:
        raise ValueError(f"drafter must be a drafter handle of a registered drafting method ({known()}), "
                         f"as dflash_jax.load_drafter returns; got {type(drafter).__name__}")
    return _METHODS[name]


def method_of_shipped_name(name) -> Any:
    """The method whose shipped drafter is called ``name`` on command lines (its
    ``shipped_name``), or None."""
    return _NAMED.get(name) if isinstance(name, str) else None
