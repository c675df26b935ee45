"""Every acceptance rule in one place: how many drafted tokens the target keeps, and the token
it adds after them (``docs/method.md``, ``docs/trees.md``). Four rules, two for chains and two
for trees; each returns what was accepted and the bonus, and nothing else of the engine.

Chains (``accept``):
  * :data:`MATCH` (greedy proposals): the target samples ``x_i ~ p_i`` at every block row
    (argmax at temperature 0) and the proposal is accepted while it agrees; every emitted token
    is a target sample given the true prefix, so the output has the target's distribution;
  * :data:`REJECTION` (sampled proposals, ``d_{i+1} ~ q_i``): accept with probability
    ``min(1, p_i(d)/q_i(d))``; at the first rejection emit a sample of
    ``normalise(max(p_i - q_i, 0))``; after a full block a sample of ``p_{bs-1}``. Lossless
    for any q.

Trees (``verification.tree``: N nodes, each with its parent):
  * :func:`accept_tree_greedy` (temperature 0): the longest root path whose every token is the
    target's argmax at its parent, then the target's argmax after its last node;
  * :func:`accept_tree_sampled` (T > 0): multi-draft verification for deterministic (top-k)
    siblings, below.

Lossless tree acceptance at temperature > 0: multi-draft verification for deterministic
(top-k) siblings (``docs/trees.md``).

The rule (the one for deterministic drafts that tree-drafting reference code applies): walk
down from the root with p = the target's processed distribution at the current node
(``verification.sampling.process_logits``: temperature, top-k, top-p). Visit the node's valid
children in rank order; child x is accepted with probability

    p_res(x) = p(x) / (1 - R),   R = the mass of p on the siblings rejected before it,

i.e. p with the rejected siblings' tokens zeroed and renormalised (0 for a token already
rejected: siblings should be distinct, a repeated one is never accepted). On acceptance the
walk moves to x (p = the target's distribution there); when every child is rejected, or there
is none, it stops and the bonus is a sample of p with this node's children zeroed and
renormalised (p itself at a leaf). The emitted tokens then have the target's law: by induction
on the children visited, the token leaving a node is x with probability p(x) whether it is
accepted as a child or drawn as the bonus.

SpecInfer's rule (accept with min(1, p/q), residual ``max(p - q, 0)``) is not used: it assumes
siblings sampled from q, and with top-k siblings it is not lossless.

Implementation: every node carries one uniform u; child x "wins" at its parent when
``u < p_res(x)`` and no sibling of lower rank won, which draws the walk's decisions with
independent uniforms, the same law as visiting the children one by one. A node is accepted
when it and every ancestor won (as in :func:`accept_tree_greedy`, through the ancestor mask); at
most one child of a node wins, so the accepted nodes form one root path. Everything is a
[B, N] or [B, N, N] array (no loop over depth or rank), and the vocabulary is touched only
through ``parallel.vocab.VocabOps``, so it runs on a vocabulary split over devices as
:func:`accept` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from typing import TYPE_CHECKING

from dflash_jax.parallel import vocab
from dflash_jax.verification.sampling import SamplingParams, process_logits, sample_tokens

if TYPE_CHECKING:  # the tree module builds on this one
    from dflash_jax.verification.tree import Tree

MATCH = "match"
"""Acceptance rule: accept while the proposal equals the target's own choice (argmax at
temperature 0, else an independent sample per row): greedy proposals."""
REJECTION = "rejection"
"""Acceptance rule: rejection sampling against the proposal's distribution: sampled proposals."""
ACCEPTANCE_RULES = (MATCH, REJECTION)


# ---------------------------------------------------------------------------- chains
def accept(rule: str, sampling: SamplingParams, draft, q_logp, logits, key,
           ops: vocab.VocabOps = vocab.LOCAL):
    """Decides how many draft tokens the target accepts, and the token it adds after them.

    Args:
      rule: :data:`MATCH` or :data:`REJECTION` (module docstring).
      sampling: the target's sampling (temperature, top-k, top-p).
      draft: int32[B, bs-1] the drafted tokens of block rows 1..bs-1.
      q_logp: float32[B, bs-1, V] the draft distribution each was sampled from (REJECTION).
      logits: float32[B, bs, V] the target's logits at the block rows (row i predicts row i+1).
      key: PRNG key.
      ops: the vocabulary reductions (``parallel.vocab.VocabOps``; V is then the shard's slice).

    Returns:
      (accepted int32[B] in 0..bs-1: the length of the accepted draft prefix,
       bonus int32[B]: the target's token after it; see the rules in the module docstring).
    """
    B, bs, V = logits.shape  # V: the shard's vocabulary slice under tensor parallelism
    if rule == MATCH:
        # greedy: argmax; sampling with a greedy draft: one independent target sample per row
        choice_BxBs = sample_tokens(key, logits, sampling, ops)
        match = draft == choice_BxBs[:, :-1]
        accepted = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
        return accepted, jnp.take_along_axis(choice_BxBs, accepted[:, None], 1)[:, 0]
    if q_logp is None:
        raise ValueError("the rejection rule needs the proposal's distribution (q_logp): a "
                         "sampled proposer returns it")
    k_u, k_res = jax.random.split(key)
    p_logp = process_logits(logits, sampling, ops)  # [B, bs, V]
    p_d = ops.take(p_logp[:, :-1], draft)  # [B, bs-1]
    q_d = ops.take(q_logp, draft)
    u = ops.uniform(k_u, (B, bs - 1))
    ok = jnp.log(u) < p_d - q_d  # u < p/q  (always when p >= q)
    accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    p_a = jnp.exp(jnp.take_along_axis(p_logp, accepted[:, None, None], 1)[:, 0])  # [B, V]
    q_pad = jnp.concatenate([jnp.exp(q_logp), jnp.zeros((B, 1, V), q_logp.dtype)], axis=1)
    q_a = jnp.take_along_axis(q_pad, accepted[:, None, None], 1)[:, 0]  # zeros after a full block
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = ops.sum(resid, keepdims=True)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)
    bonus = ops.categorical(k_res, jnp.log(resid))
    return accepted, bonus


# ---------------------------------------------------------------------------- trees
def accept_tree_greedy(tree: Tree, mask: jax.Array, logits: jax.Array,
                       ops: vocab.VocabOps = vocab.LOCAL):
    """Greedy tree acceptance: a node is accepted when its token is the target's argmax at its
    parent and so is every ancestor's; siblings hold distinct tokens, so the accepted nodes are
    one root path. Its deepest node ``last`` ends the path; the bonus is the target's argmax
    there.

    Args:
      tree: the verified tree; mask: its ``verification.tree.ancestor_mask``; logits: float32[B, N, V] the
        target's logits at the nodes (row i predicts the token after node i).
    Returns:
      (last int32[B] the deepest accepted node (0: none, the root), accepted int32[B] = its
       depth (accepted draft tokens), bonus int32[B]).
    """
    choice = ops.argmax(logits).astype(jnp.int32)  # [B, N]
    parent_choice = jnp.take_along_axis(choice, tree.parents, axis=1)
    node = jnp.arange(tree.nodes)
    matched = (tree.tokens == parent_choice) & tree.valid | (node == 0)[None]
    ok = jnp.all(~mask | matched[:, None, :], axis=-1)  # every ancestor-or-self matched
    last = jnp.argmax(jnp.where(ok, tree.depth, -1), axis=1).astype(jnp.int32)
    rows = jnp.arange(tree.tokens.shape[0])
    return last, tree.depth[rows, last], choice[rows, last]


def target_logp(logits: jax.Array, sampling: SamplingParams,
                ops: vocab.VocabOps = vocab.LOCAL) -> jax.Array:
    """float32[B, N, V] the target's log-probabilities at the nodes: the processed distribution
    (temperature, top-k, top-p; excluded tokens -inf), or for greedy ``sampling`` (temperature
    0) the one-hot of the argmax (log 1 = 0 there, -inf elsewhere), so that the rule below is
    then greedy acceptance. ``V``: the shard's vocabulary slice under ``ops``."""
    if not sampling.greedy:
        return process_logits(logits, sampling, ops)
    best = ops.argmax(logits)  # [B, N] global token ids
    ids = _vocab_ids(ops, logits.shape[-1])
    return jnp.where(ids == best[..., None], 0.0, -jnp.inf).astype(jnp.float32)


def _vocab_ids(ops: vocab.VocabOps, local_vocab: int) -> jax.Array:
    """int32[V_local] the global token ids of this shard's vocabulary slice."""
    return ops.local(jnp.arange(local_vocab * ops.vocab_shards, dtype=jnp.int32))


def _prob_at(ops: vocab.VocabOps, logp: jax.Array, node: jax.Array, tokens: jax.Array) -> jax.Array:
    """float32[B, M]: ``exp(logp[b, node[b, m], tokens[b, m]])`` (logp [B, N, V], token ids
    global): one scalar gather per entry, no [B, M, V] copy; on a split vocabulary the shard
    holding the token gives it (a sum over shards of one number per entry)."""
    B, _, V = logp.shape
    local = tokens - _vocab_ids(ops, V)[0]
    mine = (local >= 0) & (local < V)
    val = logp[jnp.arange(B)[:, None], node, jnp.clip(local, 0, V - 1)]
    return ops.sum(jnp.where(mine, jnp.exp(val), 0.0)[..., None])


def accept_tree_sampled(tree: Tree, mask: jax.Array, logits: jax.Array, sampling: SamplingParams,
                   key: jax.Array, ops: vocab.VocabOps = vocab.LOCAL):
    """Tree acceptance by the multi-draft rule for deterministic siblings (module docstring).

    Args:
      tree: the verified tree (``Tree``: tokens, parents, depth, rank, valid, each [B, N]);
        invalid nodes are never children, node 0 (the root) never a child.
      mask: bool[B, N, N] its ``verification.tree.ancestor_mask``.
      logits: float32[B, N, V] the target's logits at the nodes (row i predicts the token
        after node i); V the shard's slice under ``ops``.
      sampling: the target's sampling (temperature 0: greedy, then the result is
        ``accept_tree_greedy``'s).
      key: PRNG key.
      ops: the vocabulary reductions (``parallel.vocab.VocabOps``).

    Returns:
      (last int32[B] the deepest accepted node (0: none, the root), accepted int32[B] its depth
       (accepted draft tokens), bonus int32[B] the token emitted after it): the same contract
       as :func:`accept_tree_greedy`.
    """
    B, N, V = logits.shape
    if tree.tokens.shape != (B, N):
        raise ValueError(f"the tree has {tree.tokens.shape[1]} nodes in {tree.tokens.shape[0]} "
                         f"rows but the logits are [B={B}, N={N}, V]: give the target's logits "
                         "at every node of the tree")
    k_u, k_bonus = jax.random.split(key)
    logp = target_logp(logits, sampling, ops)  # [B, N, V]
    node = jnp.arange(N, dtype=jnp.int32)
    is_child = tree.valid & (node > 0)[None]  # [B, N]: a node that can be accepted
    p_tok = _prob_at(ops, logp, tree.parents, tree.tokens)  # [B, N]: p at the parent of x

    # siblings[b, j, s]: s is a child of j's parent visited before j (lower rank; equal ranks
    # by index); repeat[b, j]: an earlier sibling holds j's token (p_res(x) = 0 then)
    same_parent = tree.parents[:, :, None] == tree.parents[:, None, :]
    rank_j, rank_s = tree.rank[:, :, None], tree.rank[:, None, :]
    before = (rank_s < rank_j) | ((rank_s == rank_j) & (node[None, None, :] < node[None, :, None]))
    siblings = same_parent & before & is_child[:, None, :] & is_child[:, :, None]
    same_token = tree.tokens[:, :, None] == tree.tokens[:, None, :]
    repeat = jnp.any(siblings & same_token, axis=-1)  # [B, N]
    # the rejected mass before j: each distinct earlier sibling token once
    rejected = jnp.sum(jnp.where(siblings & ~repeat[:, None, :], p_tok[:, None, :], 0.0), axis=-1)
    # 1 - R >= p(x) in exact arithmetic; the bound keeps float rounding from rejecting the
    # last child holding the remaining mass
    remaining = jnp.maximum(1.0 - rejected, p_tok)
    u = ops.uniform(k_u, (B, N))
    # u < p(x) / (1 - R), written without the division (no NaN when the rejected siblings
    # covered p: then p(x) = 0 and x is rejected)
    hit = is_child & ~repeat & (u * remaining < p_tok)
    # a child wins when it hits and no earlier sibling did
    wins = hit & ~jnp.any(siblings & hit[:, None, :], axis=-1)
    won = wins | (node == 0)[None]
    ok = jnp.all(~mask | won[:, None, :], axis=-1)  # it and every ancestor won
    last = jnp.argmax(jnp.where(ok, tree.depth, -1), axis=1).astype(jnp.int32)
    rows = jnp.arange(B)

    # the bonus: p at `last` with its (all rejected) children's tokens zeroed
    children = is_child & (tree.parents == last[:, None])  # [B, N]
    ids = _vocab_ids(ops, V)
    local = tree.tokens - ids[0]  # position in this shard's slice
    slot = jnp.where(children & (local >= 0) & (local < V), local, V)  # V: out of range, dropped
    zeroed = jnp.zeros((B, V), bool).at[rows[:, None], slot].set(True, mode="drop")
    p_last = logp[rows, last]  # [B, V]
    resid = jnp.where(zeroed, -jnp.inf, p_last)
    # empty residual (the children covered p's support and rounding rejected them all, which
    # has probability ~1e-7): fall back on p itself rather than sampling from nothing
    empty = ops.max(resid) == -jnp.inf
    resid = jnp.where(empty[:, None], p_last, resid)
    bonus = ops.categorical(k_bonus, resid)  # Gumbel-max: no renormalisation needed
    return last, tree.depth[rows, last], bonus.astype(jnp.int32)
