"""Tree drafts and tree verification (``docs/trees.md``).

A tree proposal is N nodes per row: node 0 is the root (the iteration's anchor, the last
committed token), every other node a drafted token whose parent has a smaller index. The target
verifies all N nodes in one pass: node i sits in cache slot ``start + i`` (its own slot), is
rotated to position ``start + depth[i]`` (siblings share a position), and sees the committed
slots ``< start`` plus the slots of its ancestors and itself (:func:`ancestor_mask`). The
accepted nodes form one root path; their K/V move to the contiguous slots ``start ..
start + accepted`` afterwards (:meth:`dflash_jax.nn.cache.KVCache.compact`).

The tree rule (:func:`best_first_tree`): from the proposer's log-probabilities at each draft
depth, the node budget is spent best-first on the paths of highest product of probabilities,
each node's children being the ``topk`` most likely tokens of the next depth in rank order.
Since a drafter's distributions at the depths are independent of the tokens above them (one
parallel pass), a path's score is the sum of its tokens' log-probabilities, and best-first
growth keeps the N - 1 highest-scoring paths that are closed under taking prefixes. With
``topk = 1`` the tree is the chain: the argmax at every depth, the whole block.

The policy (:class:`TreeVerify`, a ``verification.policy.VerifyPolicy``): each iteration the
proposer's tree, the target over all its nodes in one pass (:func:`verify_tree`), the accepted
root path (``verification.acceptance``: :func:`~dflash_jax.verification.acceptance.
accept_tree_greedy` at temperature 0, ``accept_tree_sampled``, multi-draft verification for
deterministic siblings, above it), the path's K/V compacted and the state rolled back after it,
and the path handed to the engine as a chain's accepted drafts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from dflash_jax.nn.tree_attention import TreeAttention
from dflash_jax.parallel import vocab
from dflash_jax.verification import acceptance
from dflash_jax.verification.policy import Verified, VerifyPolicy, rollback, verify


@dataclasses.dataclass(frozen=True)
class TreeVerify(VerifyPolicy):
    """The tree verify policy: ``nodes`` (N) rows verified per iteration, the root (the anchor)
    included, so N = block size verifies as many rows as the chain; ``topk``: the most children
    a node gets (the proposer's ``topk`` most likely tokens of the next depth). The depth is
    bounded by the proposer's block (``block_size - 1`` drafts)."""

    name: ClassVar[str] = "tree"
    nodes: int
    topk: int = 4

    def __post_init__(self):
        for name in ("nodes", "topk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"TreeVerify.{name} must be an integer, got {v!r}")
        if self.nodes < 2:
            raise ValueError(f"a tree needs at least 2 nodes (the root and one draft), got "
                             f"nodes={self.nodes}")
        if self.topk < 1:
            raise ValueError(f"TreeVerify.topk must be >= 1, got {self.topk}")

    def check(self, spec) -> None:
        if spec.proposer is None:
            raise ValueError("tree verification needs a proposer (a drafter): autoregressive "
                             "decoding has no drafts")
        refusal = spec.family.tree_refusal
        if refusal is not None:
            raise ValueError(f"the {spec.target.model_type!r} target cannot verify a tree of "
                             f"drafts: {refusal}")
        if spec.acceptance != acceptance.MATCH:
            raise ValueError("a tree's siblings are the proposer's top-k tokens (deterministic "
                             "drafts): use a greedy-draft proposer (sampled_draft=False)")

    def slots(self, block_size: int) -> int:
        return max(block_size, self.nodes)

    def step(self, spec, tparams, vparams, pparams, state, seen, max_new, k_draft,
             k_accept) -> Verified:
        """The proposer's tree of N nodes; the target over all of them in one pass, node i in
        slot ``start + i`` at RoPE position ``start + depth[i]``, seeing the committed slots and
        its ancestors; the accepted root path; its nodes' K/V moved to slots ``start .. start +
        accepted`` (``compact``), the state rolled back after them; the path's tokens and taps
        returned as a chain's (the proposer observes the path in order)."""
        bs, N = spec.block_size, self.nodes
        start = state.tcache.lengths
        tree, pstate = spec.proposer.propose_tree(spec, tparams, pparams, state.proposer, seen,
                                                  k_draft, self)
        if tree.tokens.shape != (start.shape[0], N):
            raise ValueError(f"{type(spec.proposer).__name__}.propose_tree returned a tree of shape "
                             f"{tree.tokens.shape}; the policy asks for [{start.shape[0]}, {N}]")
        mask = ancestor_mask(tree, bs - 1)
        logits, taps, tcache = verify_tree(spec, vparams, tree, mask, state.tcache)
        if spec.sampling.greedy:
            last, accepted, bonus = acceptance.accept_tree_greedy(tree, mask, logits, spec.ops)
        else:
            last, accepted, bonus = acceptance.accept_tree_sampled(tree, mask, logits, spec.sampling,
                                                                   k_accept, spec.ops)
        path = path_nodes(mask, tree.depth, last, bs)  # [B, bs]: root, then the accepted nodes
        tcache = rollback(accepted, tcache.compact(start, path), state.done, start)
        draft = jnp.take_along_axis(tree.tokens, path[:, 1:], axis=1)
        if taps is not None:
            taps = jnp.take_along_axis(taps, path[:, :, None], axis=1)
        positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
        return Verified(draft, accepted, bonus, tcache, taps, positions, N, pstate)


def device_memory_bytes() -> int | None:
    """The default device's memory (``bytes_limit`` of its memory stats; a CPU: the host's
    physical memory), or None where neither is known."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 (a backend without memory stats)
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform != "cpu":  # an accelerator that does not say: nothing to check against
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_tree_memory(spec, batch: int, params, limit: int | None = None) -> None:
    """Refuses, before anything compiles, a tree whose per-node records do not fit beside the
    target's parameters ``params`` (a pytree of arrays or shapes; activations in the dtype of
    its largest floating leaf) in the device's memory (``limit``, default
    :func:`device_memory_bytes`): a family whose decode state keeps something per tree node
    says how much by ``tree_record_bytes(cfg, nodes, batch, itemsize)`` (the hybrid targets'
    GDN layers); others keep only the tree's K/V, which the cache holds anyway."""
    measure = getattr(spec.family, "tree_record_bytes", None)
    if measure is None or not isinstance(spec.verify, TreeVerify):
        return
    limit = device_memory_bytes() if limit is None else limit
    if limit is None:
        return
    leaves = jax.tree_util.tree_leaves(params)
    params_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
    floats = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    itemsize = max(floats, key=lambda x: x.size).dtype.itemsize if floats else 2
    nodes = spec.verify.nodes
    need = measure(spec.target, nodes, batch, itemsize)
    if need["total"] + params_bytes > limit:
        gib = 2 ** 30
        raise ValueError(
            f"a tree of {nodes} nodes at batch {batch} needs {need['total'] / gib:.2f} GiB for the "
            f"target's {need['what']} ({need['per_node_per_layer'] / 2 ** 10:.1f} KiB per node per layer, "
            f"{need['setting']}) beside {params_bytes / gib:.2f} GiB of parameters, "
            f"more than the device's {limit / gib:.2f} GiB: ask for fewer nodes (tree=) or rows"
            + (f", or {need['smaller']}" if need.get("smaller") else ""))


class Tree(NamedTuple):
    """A tree proposal for B rows of N nodes (node 0 = the root = the anchor).

    tokens: int32[B, N] node tokens (``tokens[:, 0]`` is the anchor).
    parents: int32[B, N] parent index, smaller than the node's own (``parents[:, 0] = 0``).
    depth: int32[B, N] edges from the root (the root 0; a node's RoPE position is start + depth).
    rank: int32[B, N] rank among its siblings (0: the proposer's most likely token there).
    valid: bool[B, N] False for nodes the proposer could not fill (e.g. ``topk = 1`` and a
      budget beyond the chain): they are verified like the others but never accepted.
    score: float32[B, N] the proposer's log-probability of the path root -> node (0 at the root).
    """

    tokens: jax.Array
    parents: jax.Array
    depth: jax.Array
    rank: jax.Array
    valid: jax.Array
    score: jax.Array

    @property
    def nodes(self) -> int:
        return self.tokens.shape[1]


def best_first_tree(anchor: jax.Array, logp: jax.Array, nodes: int, topk: int, ops=None) -> Tree:
    """The best-first tree of ``nodes`` nodes over per-depth log-probabilities.

    Args:
      anchor: int32[B] the root's token.
      logp: float32[B, D, V] the proposer's log-probabilities at draft depths 1..D (row d - 1 is
        depth d), each independent of the tokens above it; unnormalised ones (logits) are
        normalised here. The ranks are taken from ``logp`` as given, so with logits they are
        exactly the logits' order (``topk = 1`` is the argmax, as the chain drafts it: a
        log-softmax can round two close logits to one value and reorder them).
      nodes: N, the budget (root included); topk: K, children per node at most.
      ops: the vocabulary reductions (``parallel.vocab.VocabOps``; None: one device). With the
        vocabulary split over a mesh's model axis, ``logp`` is this shard's slice [B, D, V/m]:
        each depth's top-K is exchanged as K values and ids per shard (``VocabOps.top_k``) and
        the normaliser as one number per row, never the logits; the tree is the one device's.

    The rule: a candidate is (parent node, depth d, rank r), scored ``score(parent) + the r-th
    largest logp at depth d``; N - 1 times the best candidate becomes a node (ties: the
    candidate found first), and is replaced by its next sibling (rank r + 1, if r + 1 < K) and
    joined by its first child (depth d + 1, rank 0, if d < D). Children are thus added in rank
    order, and node indices grow along every path. When fewer than N - 1 candidates exist
    (K = 1: only the chain) the remaining nodes are invalid (``Tree.valid``).

    Returns a :class:`Tree` with the nodes in the order they were chosen (scores non-increasing).
    """
    ops = vocab.LOCAL if ops is None else ops
    B, D, _ = logp.shape
    N, K = int(nodes), int(min(topk, logp.shape[-1] * ops.vocab_shards))
    logp = logp.astype(jnp.float32)
    vals, ids = ops.top_k(logp, K)  # [B, D, K] descending, global ids
    vals = vals - ops.logsumexp(logp)[..., None]  # log-probabilities
    vals = jnp.pad(vals, ((0, 0), (0, 1), (0, 1)), constant_values=-jnp.inf)  # depth D+1, rank K: none
    ids = ids.astype(jnp.int32)
    rows = jnp.arange(B)
    neg = jnp.float32(-jnp.inf)
    # candidate slot 0: the root's first child; slot n (n >= 1): node n's pending child or sibling
    c_parent = jnp.zeros((B, N), jnp.int32)
    c_depth = jnp.ones((B, N), jnp.int32)
    c_rank = jnp.zeros((B, N), jnp.int32)
    c_score = jnp.full((B, N), neg).at[:, 0].set(vals[:, 0, 0])
    tree = Tree(jnp.zeros((B, N), jnp.int32).at[:, 0].set(anchor.astype(jnp.int32)),
                jnp.zeros((B, N), jnp.int32), jnp.zeros((B, N), jnp.int32),
                jnp.zeros((B, N), jnp.int32), jnp.zeros((B, N), bool).at[:, 0].set(True),
                jnp.zeros((B, N), jnp.float32))

    def add(n, carry):
        tree, c_parent, c_depth, c_rank, c_score = carry
        i = jnp.argmax(c_score, axis=1)  # [B] the best candidate (first among equals)
        s = c_score[rows, i]
        ok = s > neg
        p, d, r = c_parent[rows, i], c_depth[rows, i], c_rank[rows, i]
        tok = ids[rows, d - 1, jnp.minimum(r, K - 1)]
        tree = Tree(tree.tokens.at[:, n].set(jnp.where(ok, tok, 0)),
                    tree.parents.at[:, n].set(jnp.where(ok, p, 0)),
                    tree.depth.at[:, n].set(jnp.where(ok, d, 0)),
                    tree.rank.at[:, n].set(jnp.where(ok, r, 0)),
                    tree.valid.at[:, n].set(ok), tree.score.at[:, n].set(jnp.where(ok, s, neg)))
        # the popped slot takes the next sibling; slot n the first child of the new node
        sib = tree.score[rows, p] + vals[rows, d - 1, jnp.minimum(r + 1, K)]
        c_rank = c_rank.at[rows, i].set(r + 1)
        c_score = c_score.at[rows, i].set(jnp.where(ok & (r + 1 < K), sib, neg))
        child = s + vals[rows, jnp.minimum(d, D), 0]
        c_parent = c_parent.at[:, n].set(n)
        c_depth = c_depth.at[:, n].set(d + 1)
        c_rank = c_rank.at[:, n].set(0)
        c_score = c_score.at[:, n].set(jnp.where(ok & (d < D), child, neg))
        return tree, c_parent, c_depth, c_rank, c_score

    tree, *_ = jax.lax.fori_loop(1, N, add, (tree, c_parent, c_depth, c_rank, c_score))
    return tree


def ancestor_mask(tree: Tree, max_depth: int) -> jax.Array:
    """bool[B, N, N]: ``[b, i, j]`` = node j is node i or one of its ancestors (what node i
    sees of the tree). ``max_depth``: an upper bound of ``tree.depth`` (static)."""
    B, N = tree.parents.shape
    node = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (B, N))
    cols = jnp.arange(N, dtype=jnp.int32)
    seen = node[:, :, None] == cols
    up = node
    for _ in range(int(max_depth)):
        up = jnp.take_along_axis(tree.parents, up, axis=1)  # one more generation up (root: 0)
        seen = seen | (up[:, :, None] == cols)
    return seen


def path_nodes(mask: jax.Array, depth: jax.Array, last: jax.Array, length: int) -> jax.Array:
    """int32[B, length]: the node at depth k of the root path to node ``last`` int32[B] (k up to
    its depth; 0, the root, past it). ``mask``: :func:`ancestor_mask`; depth: int32[B, N]."""
    B, N = depth.shape
    on_path = jnp.take_along_axis(mask, last[:, None, None], axis=1)[:, 0]  # [B, N]
    k = jnp.arange(length, dtype=jnp.int32)
    hit = on_path[:, None, :] & (depth[:, None, :] == k[None, :, None])  # [B, length, N]
    return jnp.argmax(hit, axis=-1).astype(jnp.int32)  # no hit (k > depth): 0


def verify_tree(spec, tparams, tree: Tree, mask: jax.Array, tcache):
    """The target over the N nodes of ``tree`` in one pass: node i written to slot
    ``tcache.lengths + i``, rotated to ``tcache.lengths + depth[i]``, seeing the committed slots
    and its ancestors' (``mask``: :func:`ancestor_mask`). Returns what
    ``verification.policy.verify`` returns for a block of N rows."""
    start = tcache.lengths[:, None]
    slots = start + jnp.arange(tree.nodes, dtype=jnp.int32)
    return verify(spec, tparams, tree.tokens, slots, tcache, tree=TreeAttention(start + tree.depth, mask))
