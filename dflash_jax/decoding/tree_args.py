"""The tree-verification options of the ``generate`` and ``bench`` commands (``--tree N``,
``--tree-topk K``; ``docs/trees.md``): defined once so that both commands take, check and pass
them the same way."""

from __future__ import annotations

import argparse

from dflash_jax.verification.adaptive import ADAPTIVE
from dflash_jax.verification.tree import TreeVerify

DEFAULT_TOPK = 4
"""Children per node at most when ``--tree-topk`` is not given (``TreeVerify.topk``'s default)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``--tree`` and ``--tree-topk`` to a command's parser."""
    p.add_argument("--tree", type=int, default=None, metavar="N",
                   help="verify a tree of N draft nodes per iteration (the root, the last committed "
                        "token, included; N >= 2) grown best-first from the drafter's per-position "
                        "distributions, instead of the chain (docs/trees.md); default: the chain")
    p.add_argument("--tree-topk", type=int, default=None, metavar="K",
                   help=f"with --tree: children per tree node at most, the drafter's K most likely "
                        f"tokens of the next position (default {DEFAULT_TOPK})")


def check(args: argparse.Namespace, has_drafter: bool = True) -> None:
    """Raises ValueError naming the option and the fix when the tree options do not fit the
    rest of ``args`` (``block_size``) or the run (``has_drafter``)."""
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
    return TreeVerify(opt["tree"], opt["tree_topk"]) if opt else None


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
