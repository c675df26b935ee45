"""The fast tier inside parametrized tests (tests/README.md, "Tiers"): a grid's cases that add
coverage the fast tier already has elsewhere (another variant of the same family, another block
size through the same loop, a second temperature) run in the whole suite only."""

from __future__ import annotations

import pytest


def tiered(cases, fast, ids=str):
    """``parametrize`` (or fixture ``params``) values for ``cases``, each with the id ``ids(case)``
    (by default the case itself, as a plain list of names or numbers gives): those in ``fast`` run
    in every tier, the rest are marked slow."""
    cases, fast = list(cases), set(fast)
    unknown = fast - set(cases)
    assert not unknown, f"tiered: {sorted(map(str, unknown))} are not among the cases {cases}"
    return [pytest.param(c, id=ids(c), marks=() if c in fast else pytest.mark.slow) for c in cases]
