"""The verify-policy options of the ``generate`` and ``bench`` commands (``--verify fixed |
adaptive | adaptive-per-row | tree:N[:K]``; ``docs/methods.md``) and their deprecated spellings
(``--tree N``, ``--tree-topk K``, ``--block-size adaptive``, ``--verify-per-row``;
``docs/trees.md``): defined once so that both commands take, check and pass them the same way.
``--verify`` is read into the same settings the deprecated options set (``args.tree``,
``args.tree_topk``, ``args.block_size``, ``args.verify_per_row``), which the reports record."""

from __future__ import annotations

import argparse
import sys

from dflash_jax.verification.adaptive import ADAPTIVE
from dflash_jax.verification.tree import TreeVerify

DEFAULT_TOPK = 4
"""Children per node at most when ``--tree-topk`` is not given (``TreeVerify.topk``'s default)."""


VERIFY_FORMS = ("fixed", "adaptive", "adaptive-per-row", "tree:N", "tree:N:K")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``--verify`` and the deprecated ``--tree`` / ``--tree-topk`` to a command's parser."""
    p.add_argument("--verify", default=None, metavar="POLICY",
                   help="the verify policy (docs/methods.md): 'fixed' (the whole block; default), 'adaptive' "
                        "(the verify length per iteration from the drafter's confidence and this device's "
                        "measured costs), 'adaptive-per-row' (chosen per row), or 'tree:N[:K]' (a tree of N "
                        "draft nodes per iteration, the root included, each node's K most likely children, "
                        f"default K {DEFAULT_TOPK}; docs/trees.md)")
    p.add_argument("--tree", type=int, default=None, metavar="N",
                   help="deprecated, --verify tree:N: verify a tree of N draft nodes per iteration")
    p.add_argument("--tree-topk", type=int, default=None, metavar="K",
                   help="deprecated, --verify tree:N:K: children per tree node at most")


def read_verify(args: argparse.Namespace) -> None:
    """Reads ``--verify`` into the settings the deprecated options set (module docstring); a
    value of another form, or ``--verify`` beside a deprecated option, is a ValueError; the
    deprecated options alone get a note on stderr."""
    value = getattr(args, "verify", None)
    old = [name for name, used in (("--tree", getattr(args, "tree", None) is not None),
                                   ("--tree-topk", getattr(args, "tree_topk", None) is not None),
                                   ("--block-size adaptive", getattr(args, "block_size", None) == ADAPTIVE),
                                   ("--verify-per-row", bool(getattr(args, "verify_per_row", False))))
           if used]
    if value is None:
        if old:
            print(f"note: {', '.join(old)} are deprecated: use --verify ({' | '.join(VERIFY_FORMS)})",
                  file=sys.stderr)
        return
    if old:
        raise ValueError(f"--verify {value} with {', '.join(old)}: the verify policy is one option; "
                         f"pass --verify alone")
    text = str(value).strip().lower()
    if text == "fixed":
        return
    if text in (ADAPTIVE, "adaptive-per-row"):
        args.block_size = ADAPTIVE
        if text != ADAPTIVE:
            if not hasattr(args, "verify_per_row"):
                raise ValueError(f"--verify {value}: this command verifies per batch only; use "
                                 "--verify adaptive")
            args.verify_per_row = True
        return
    if text.startswith("tree:"):
        parts = text.split(":")[1:]
        try:
            nums = [int(x) for x in parts]
        except ValueError:
            nums = []
        if len(nums) in (1, 2):
            args.tree = nums[0]
            args.tree_topk = nums[1] if len(nums) == 2 else None
            return
    raise ValueError(f"--verify {value!r}: give one of {', '.join(VERIFY_FORMS)} (e.g. tree:32:4)")


def check(args: argparse.Namespace, has_drafter: bool = True) -> None:
    """Reads ``--verify`` (:func:`read_verify`), then raises ValueError naming the option and
    the fix when the tree options do not fit the rest of ``args`` (``block_size``) or the run
    (``has_drafter``)."""
    read_verify(args)
    tree, topk = getattr(args, "tree", None), getattr(args, "tree_topk", None)
    if tree is None:
        if topk is not None:
            raise ValueError(f"--tree-topk {topk} needs --tree N (the node budget of the tree it shapes)")
        return
    if tree < 2:
        raise ValueError(f"--tree {tree}: a tree needs at least 2 nodes (the root and one draft); "
                         "pass --tree 16, 32 or 64, or leave --tree out for the chain")
    if topk is not None and topk < 1:
        raise ValueError(f"--tree-topk {topk}: a node needs at least 1 child (1: the chain's argmax "
                         f"path); pass a positive K (default {DEFAULT_TOPK})")
    if getattr(args, "block_size", None) == ADAPTIVE:
        raise ValueError("--tree with --block-size adaptive: the adaptive block chooses how many chain "
                         "rows to verify, a tree verifies its N nodes; pass one of them")
    if not has_drafter:
        raise ValueError("--tree needs --drafter (the tree is grown from the drafter's distributions)")


def options(args: argparse.Namespace) -> dict:
    """The tree options' values (``tree``, ``tree_topk``, as reports record them); {} for the
    chain."""
    if getattr(args, "tree", None) is None:
        return {}
    topk = getattr(args, "tree_topk", None)
    return {"tree": args.tree, "tree_topk": DEFAULT_TOPK if topk is None else topk}


def policy(args: argparse.Namespace) -> TreeVerify | None:
    """The verify policy of the tree options (``generate(..., verify=...)``): a
    :class:`TreeVerify`, or None for the chain (the default)."""
    opt = options(args)
    return tree_policy(opt.get("tree"), opt.get("tree_topk", DEFAULT_TOPK))


def tree_policy(nodes: int | None, topk: int = DEFAULT_TOPK) -> TreeVerify | None:
    """The ``generate(..., verify=...)`` value of a tree setting: ``TreeVerify(nodes, topk)``, or
    None (the chain) when ``nodes`` is None or 0."""
    return TreeVerify(nodes, topk) if nodes else None


def label(args: argparse.Namespace) -> str:
    """The DFlash method's name in reports: "DFlash tree N" (K != 4: "..., top-K"), else
    "DFlash"."""
    opt = options(args)
    if not opt:
        return "DFlash"
    return f"DFlash tree {opt['tree']}" + ("" if opt["tree_topk"] == DEFAULT_TOPK else f", top-{opt['tree_topk']}")


def tree_spec(value, what: str = "tree") -> tuple[int, int]:
    """A tree setting ``N:TOPK`` (node budget, root included; children per node) -> (N, TOPK);
    refused naming ``what`` (the option or setting it came from) and the form."""
    try:
        n, k = (int(x) for x in str(value).split(":"))
    except ValueError:
        raise ValueError(f"{what} {value!r}: give N:TOPK (node budget, root included, and children per "
                         "node), e.g. 16:4 60:10") from None
    if n < 2 or k < 1:
        raise ValueError(f"{what} {value!r}: a tree needs N >= 2 nodes (the root and one draft) and TOPK >= 1")
    return n, k
