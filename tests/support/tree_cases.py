"""Planted tree-acceptance cases: best-first trees over random drafter log-probabilities with
target logits whose argmax sits on a chosen child (tests/decoding/test_tree_sampling.py, also in
its multi-device subprocess)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.verification.tree import ancestor_mask, best_first_tree


def planted_case(seed: int, rows: int, nodes: int, topk: int, depth: int, vocab: int):
    """A best-first tree over random drafter log-probabilities, and target logits whose argmax
    at a node is, three times in four, the token of one of its children drawn at random (any
    rank, invalid nodes included), so accepted paths of every depth occur."""
    rng = np.random.default_rng(seed)
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (rows, depth, vocab)), jnp.float32))
    anchor = jnp.asarray(rng.integers(0, vocab, rows), jnp.int32)
    tree = jax.jit(best_first_tree, static_argnums=(2, 3))(anchor, logp, nodes, topk)
    tok, par = np.asarray(tree.tokens), np.asarray(tree.parents)
    logits = rng.normal(0, 1, (rows, nodes, vocab))
    for b in range(rows):
        for n in range(nodes):
            kids = [c for c in range(1, nodes) if par[b, c] == n]
            if kids and rng.random() < 0.75:
                logits[b, n, tok[b, rng.choice(kids)]] += 10.0
    return tree, ancestor_mask(tree, depth), jnp.asarray(logits, jnp.float32)
