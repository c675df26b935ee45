"""Tree acceptance at T > 0 (``verification.acceptance.accept_tree_sampled``) is lossless: the emitted
tokens (the accepted path, then the bonus) have the target's law.

Function level: one fixed hand-made tree (V = 7, depth 3, up to 3 children per node, a rank
order that differs from the node order, an invalid node whose token the target likes, and a
root whose children cover the whole support of the top-k / top-p filtered p), with fixed logits
per node (siblings differ, as a target's logits depend on the path), repeated over ROWS rows of
one call; and a repeated sibling token. The oracle is exact, in float64 numpy: the law of the whole emitted sequence is the
product of the target's (``exact_sampling.filter_probs``) probabilities along it, and an emitted
sequence ends where its last token is not a valid child of the node it leaves. Pearson's
chi-squared (``exact_sampling.pearson``, Bonferroni over the first token, the first two and the
whole sequence) must accept it and reject three plausible wrong rules written here (SpecInfer's
rule on top-k children, a residual not renormalised after a rejected sibling, a bonus drawn
from p without zeroing the rejected children), while the right rule written again here, as the
sequential walk, passes.
A second fixed tree whose root's children leave out the anchor token, which p at the root
favours: the anchor comes back as the root's bonus at rate p(anchor) (and the exact law holds),
while a rule that counts the root among its own children (so zeroes the anchor) is rejected.

At temperature 0 (and with top-k 1) p is one-hot, and the accepted path and bonus equal
``acceptance.accept_tree_greedy``'s on random best-first trees (an independent walk). With the vocabulary
split over 2 host devices the tokens are the single device's. Engine level: ``generate(tree=8,
temperature=1)`` with a tree proposer keeps the target's exact law of its first 5 tokens
(``tests/support/exact_sampling.py``), and a wrong rule patched into the same run is rejected;
on a hybrid target as well, where a node reading its elder sibling's GDN state, or its parent's
without its own token, is rejected.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.verification.acceptance import accept_tree_greedy, accept_tree_sampled, target_logp
from dflash_jax.verification.tree import Tree, ancestor_mask, best_first_tree

from support import exact_sampling
from support.oracle_proposers import TableProposer
from support.tree_cases import planted_case

pytestmark = pytest.mark.xdist_group("tree_sampling")

V, ROWS, ALPHA = 7, 20000, 1e-4
SAMPLING = SamplingParams(temperature=1.0, top_k=3, top_p=0.9)

# node: (token, parent, rank, valid); node 0 is the root (the anchor token 0)
NODES = [
    (0, 0, 0, True),
    (2, 0, 0, True), (5, 0, 1, True), (1, 0, 2, True),  # the root's children: p's whole support
    (2, 1, 1, True), (3, 1, 0, True),  # rank 1 before rank 0 in node order
    (6, 2, 0, True),
    (4, 1, 2, False),  # invalid: never a child, though p at node 1 favours token 4
    (4, 5, 0, True), (0, 5, 1, True),
    (1, 6, 0, True),
    (6, 2, 1, True), (2, 11, 0, True),  # a repeated sibling token: never accepted, nor its child
]
N, MAX_DEPTH = len(NODES), 3


def fixed_tree(rows: int, nodes=NODES) -> Tree:
    """The tree of ``nodes`` (default ``NODES``) in each of ``rows`` rows (scores unused: 0)."""
    tok, par, rank, valid = (np.array(c) for c in zip(*nodes))
    n = len(nodes)
    depth = np.zeros(n, int)
    for i in range(1, n):
        depth[i] = depth[par[i]] + 1
    rep = lambda a, dt: jnp.asarray(np.broadcast_to(a, (rows, n)), dt)
    return Tree(rep(tok, jnp.int32), rep(par, jnp.int32), rep(depth, jnp.int32),
                rep(rank, jnp.int32), rep(valid, bool), jnp.zeros((rows, n), jnp.float32))


def fixed_logits() -> np.ndarray:
    """float32[N, V]: the target's logits at each node (every node its own row)."""
    rng = np.random.default_rng(11)
    x = rng.normal(0.0, 1.0, (N, V))
    x[0] = [-1.0, 0.9, 1.6, -2.0, -0.2, 1.2, -1.5]  # top 3: {2, 5, 1}, all kept by top-p 0.9
    x[1, [4, 3, 2]] = 2.0, 1.7, 1.2  # the invalid node's token (4) is node 1's most likely
    x[2, 6] = 1.5
    x[5, [4, 0]] = 1.4, 1.0
    x[6, 1] = 1.3
    x[[3, 8], [1, 5]] = 3.0  # top-p 0.9 keeps two tokens there (top-k 3 three)
    return x.astype(np.float32)


def target_probs(logits) -> np.ndarray:
    p, margin = exact_sampling.filter_probs(logits, SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p)
    assert margin > 1e-3, "a top-k / top-p decision is too close to call in float32"
    return p


def children_of(n: int, nodes=NODES) -> list[int]:
    """The valid children of node n in rank order (the root, its own parent, is none)."""
    kids = [i for i in range(1, len(nodes)) if nodes[i][1] == n and nodes[i][3]]
    return sorted(kids, key=lambda i: nodes[i][2])


def exact_outcomes(p: np.ndarray, nodes=NODES) -> dict:
    """{emitted sequence (tuple): exact probability}: a path to node n, then a bonus b that is
    not one of n's children's tokens (p [len(nodes), V]: the target's at each node)."""
    out = {}

    def walk(n, prefix, prob):
        kids = {}
        for c in children_of(n, nodes):
            kids.setdefault(nodes[c][0], c)  # a repeated token: its first sibling only
        for b in range(V):
            if b in kids:
                walk(kids[b], prefix + (b,), prob * p[n, b])
            elif p[n, b] > 0:
                out[prefix + (b,)] = prob * p[n, b]

    walk(0, (), 1.0)
    return out


def emitted(last, bonus, nodes=NODES) -> list[tuple]:
    """The emitted sequences: the tokens of the path root -> last (root excluded), the bonus."""
    seqs = []
    for n, b in zip(np.asarray(last).tolist(), np.asarray(bonus).tolist()):
        path = []
        while n != 0:
            path.append(nodes[n][0])
            n = nodes[n][1]
        seqs.append(tuple(path[::-1]) + (b,))
    return seqs


def fit(seqs, outcomes) -> exact_sampling.FitReport:
    """p-values of the first token, the first two (or the first and 'none') and the whole
    sequence against the exact law; a sequence the law never emits fills a cell of probability
    0 (p-value 0)."""
    def table(key):
        cells = {}
        for s, pr in outcomes.items():
            cells[key(s)] = cells.get(key(s), 0.0) + pr
        names = list(cells) + ["impossible"]
        index = {k: i for i, k in enumerate(names)}
        counts = np.zeros(len(names))
        for s in seqs:
            counts[index.get(key(s), len(names) - 1)] += 1
        return exact_sampling.pearson(counts, np.array(list(cells.values()) + [0.0]))

    return exact_sampling.FitReport({"first token": table(lambda s: s[:1]),
                                     "first two": table(lambda s: s[:2]),
                                     "sequence": table(lambda s: s)}, ALPHA)


# ---------------------------------------------------------------- the rule written again, and wrong
def sequential_accept(tree, mask, logits, sampling, key, ops=None, *, bug=None, q=None):
    """The walk of the module docstring, node by node and child by child, in float64 numpy over
    the rows (the test's fixed tree: the structure is read from ``NODES``; same signature as
    ``accept_tree_sampled``). ``bug``: None (the right rule); "specinfer": SpecInfer's rule, child x
    accepted with min(1, r(x) / q(x)) and on its rejection r = normalise(max(r - q, 0)) (q: the
    drafter's distribution [N, V] at the parent), the bonus a sample of r; "no_renorm": child
    x accepted with p(x), not p(x) / (1 - the rejected siblings' mass); "bonus_p": the bonus a
    sample of p, the rejected children not zeroed."""
    del tree, mask, sampling, ops
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2 ** 31 - 1)))
    B = logits.shape[0]
    p = target_probs(np.asarray(logits[0], np.float64))  # [N, V], the same in every row
    cur, bonus = np.zeros(B, int), np.zeros(B, int)
    for n in range(N):  # parents come before their children: each node's rows are final here
        rows = np.flatnonzero(cur == n)
        r = np.tile(p[n], (len(rows), 1))  # the residual, unnormalised
        taken = np.zeros(len(rows), bool)
        for c in children_of(n):
            x, u = NODES[c][0], rng.random(len(rows))
            if bug == "specinfer":
                accept = u < np.minimum(1.0, r[:, x] / r.sum(1) / q[n, x])
            elif bug == "no_renorm":
                accept = u < p[n, x]
            else:
                accept = u * r.sum(1) < r[:, x]
            accept &= ~taken
            cur[rows[accept]] = c
            rejected = ~taken & ~accept
            if bug == "specinfer":
                res = np.maximum(r / r.sum(1, keepdims=True) - q[n], 0.0)
                ok = rejected & (res.sum(1) > 0)
                r[ok] = res[ok]
            else:
                r[rejected, x] = 0.0
            taken |= accept
        stop = ~taken
        r = r[stop]
        if bug == "bonus_p":
            r = np.tile(p[n], (len(r), 1))
        r[r.sum(1) == 0] = p[n]  # empty residual (no_renorm can reject p's whole support)
        cdf = np.cumsum(r / r.sum(1, keepdims=True), 1)
        bonus[rows[stop]] = np.minimum((rng.random(stop.sum())[:, None] >= cdf).sum(1), V - 1)
    depth = fixed_tree(1).depth[0]
    return jnp.asarray(cur, jnp.int32), depth[cur], jnp.asarray(bonus, jnp.int32)


def drafter_q() -> np.ndarray:
    """float64[N, V]: a drafter distribution at each node whose most likely tokens are the
    node's children in rank order (as top-k children are), and that differs from p."""
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 0.5, (N, V))
    for n in range(N):
        for r, c in enumerate(children_of(n)):
            x[n, NODES[c][0]] = 3.0 - 0.8 * r
    q = np.exp(x)
    return q / q.sum(1, keepdims=True)


RULES = {
    "accept_tree_sampled": accept_tree_sampled,
    "sequential": sequential_accept,
    "specinfer": functools.partial(sequential_accept, bug="specinfer", q=drafter_q()),
    "no_renorm": functools.partial(sequential_accept, bug="no_renorm"),
    "bonus_p": functools.partial(sequential_accept, bug="bonus_p"),
}


@pytest.fixture(scope="module")
def fixed_case():
    tree = fixed_tree(ROWS)
    logits = jnp.asarray(np.broadcast_to(fixed_logits(), (ROWS, N, V)))
    p = target_probs(fixed_logits())
    return tree, ancestor_mask(tree, MAX_DEPTH), logits, exact_outcomes(p), p


def test_exact_law_is_a_distribution(fixed_case):
    """The oracle itself: probabilities sum to 1, the root's children cover p's support (so a
    bonus at the root has probability 0), p at node 1 favours the invalid node's token, and
    the emitted sequences have lengths 2..4."""
    *_, outcomes, p = fixed_case
    assert abs(sum(outcomes.values()) - 1.0) < 1e-12
    assert set(np.flatnonzero(p[0])) == {NODES[c][0] for c in children_of(0)}
    assert np.argmax(p[1]) == NODES[7][0] and not NODES[7][3]
    assert {len(s) for s in outcomes} == {2, 3, 4}  # root: never a bonus; leaves at depth 3
    assert len(outcomes) == 18


@pytest.mark.parametrize("rule", list(RULES))
def test_emitted_tokens_have_the_target_law(fixed_case, rule):
    """accept_tree_sampled and the sequential walk pass; the three wrong rules are rejected by the
    same check at the same sample size (their p-values tiny)."""
    tree, mask, logits, outcomes, _ = fixed_case
    fn = RULES[rule]
    if fn is accept_tree_sampled:
        fn = jax.jit(functools.partial(accept_tree_sampled, sampling=SAMPLING))
        last, accepted, bonus = fn(tree, mask, logits, key=jax.random.key(0))
    else:
        last, accepted, bonus = fn(tree, mask, logits, SAMPLING, jax.random.key(0))
    last, accepted = np.asarray(last), np.asarray(accepted)
    assert np.array_equal(accepted, np.asarray(tree.depth[0])[last])
    report = fit(emitted(last, bonus), outcomes)
    print(f"{rule}: accepted histogram {np.bincount(accepted, minlength=4).tolist()}, {report}")
    if rule in ("accept_tree_sampled", "sequential"):
        assert not report.rejected, report
        assert np.all(np.bincount(accepted, minlength=MAX_DEPTH + 1)[1:] > 0.05 * ROWS)
    else:
        assert report.min_p < 1e-12, report


# ---------------------------------------------------------------- the anchor as the root's bonus
# A second fixed tree, whose root's children leave out the anchor (the root's own token, which
# p at the root favours): when the root's children are all rejected, the bonus is the anchor
# with probability p(anchor) / (1 - R). The root is its own parent (parents[0] = 0), so a rule
# that counts it among its own children zeroes the anchor and never emits it there. p at the
# root keeps {4, 2, 1} (top-k 3): the children {2, 5 (p = 0 there)} leave the bonus {4, 1}, so
# such a rule still has a token to draw (1), and the only trace is the anchor's missing mass.
ANCHOR = 4
ANCHOR_NODES = [
    (ANCHOR, 0, 0, True),
    (2, 0, 0, True), (5, 0, 1, True),  # not the anchor; token 5 outside p's support at the root
    (ANCHOR, 1, 0, True), (3, 1, 1, True),  # the anchor's token again, under node 1
]


def anchor_logits() -> np.ndarray:
    """float32[5, V]: the target's logits at each node of ``ANCHOR_NODES``."""
    x = np.random.default_rng(12).normal(0.0, 1.0, (len(ANCHOR_NODES), V))
    x[0] = [-1.0, 0.6, 1.0, -2.0, 2.2, -0.5, -1.5]  # p(anchor) = 0.665, p(2) = 0.2, p(1) = 0.134
    x[1, [ANCHOR, 3]] = 1.8, 1.2
    return x.astype(np.float32)


def root_its_own_child(tree, mask, logits, sampling, key):
    """A wrong rule: accept_tree_sampled's path, but a bonus at the root drawn with the root's own
    token zeroed too (the root counted among its children: ``tree.valid`` for ``is_child``)."""
    last, accepted, bonus = accept_tree_sampled(tree, mask, logits, sampling, key)
    logp = target_logp(logits, sampling)[:, 0]  # [B, V]: p at the root
    kids = tree.valid & (tree.parents == 0)  # node 0 included
    zeroed = jnp.zeros(logp.shape, bool).at[jnp.arange(logp.shape[0])[:, None], tree.tokens].max(kids)
    redraw = jax.random.categorical(jax.random.fold_in(key, 1), jnp.where(zeroed, -jnp.inf, logp))
    return last, accepted, jnp.where(last == 0, redraw, bonus)


def test_the_anchor_comes_back_as_the_bonus_at_its_rate():
    """accept_tree_sampled on ``ANCHOR_NODES`` (ROWS rows): the emitted sequences have the exact law
    (chi-squared as above) and the anchor alone is emitted at rate p(anchor) at the root (a
    binomial z-score). Negative control in the same compiled call: ``root_its_own_child``
    never emits the anchor there and is rejected by both checks."""
    nodes = ANCHOR_NODES
    p = target_probs(anchor_logits())
    outcomes = exact_outcomes(p, nodes)
    root_kids = {nodes[c][0] for c in children_of(0, nodes)}
    assert ANCHOR not in root_kids and p[0, ANCHOR] > 0.6 and set(np.flatnonzero(p[0])) - root_kids == {ANCHOR, 1}
    assert abs(sum(outcomes.values()) - 1.0) < 1e-12 and outcomes[(ANCHOR,)] == p[0, ANCHOR]
    tree = fixed_tree(ROWS, nodes)
    logits = jnp.asarray(np.broadcast_to(anchor_logits(), (ROWS,) + anchor_logits().shape))

    @jax.jit
    def both(tree, logits, key):
        mask = ancestor_mask(tree, 2)
        return [rule(tree, mask, logits, SAMPLING, key) for rule in (accept_tree_sampled, root_its_own_child)]

    reports = {}
    for name, (last, _, bonus) in zip(("accept_tree_sampled", "root its own child"),
                                      both(tree, logits, jax.random.key(4))):
        seqs = emitted(last, bonus, nodes)
        hits = sum(s == (ANCHOR,) for s in seqs)
        z = (hits - ROWS * p[0, ANCHOR]) / np.sqrt(ROWS * p[0, ANCHOR] * (1 - p[0, ANCHOR]))
        reports[name] = (z, fit(seqs, outcomes))
        print(f"{name}: the anchor as the root's bonus {hits / ROWS:.4f} (p = {p[0, ANCHOR]:.4f}, "
              f"z = {z:.1f}), {reports[name][1]}")
    z, report = reports["accept_tree_sampled"]
    assert abs(z) < 4.5 and not report.rejected, report
    z, report = reports["root its own child"]
    assert z < -50 and report.min_p < 1e-12, report


# ---------------------------------------------------------------- temperature 0: the greedy walk
def test_one_hot_p_walks_the_greedy_path():
    """With a one-hot p (greedy sampling, or top-k 1 at T = 0.7) the accepted path and the
    bonus are acceptance.accept_tree_greedy's: the node-by-node rule then accepts exactly the children
    holding the target's argmax. One batch of two kinds of rows: trees of 16 nodes with up to
    3 children (paths ending at every depth 0..4 and children of rank > 0 accepted) and chains
    (K = 1) under a 16-node budget, whose invalid nodes (token 0 under the root) sometimes hold
    the root's argmax and are not accepted."""
    parts = [planted_case(seed, 96, 16, topk, 5, vocab=12) for seed, topk in ((3, 3), (4, 1))]
    tree = Tree(*(jnp.concatenate(f, 0) for f in zip(*(p[0] for p in parts))))
    mask, logits = (jnp.concatenate([p[i] for p in parts], 0) for i in (1, 2))
    want = jax.jit(accept_tree_greedy)(tree, mask, logits)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.7, top_k=1)):
        got = jax.jit(accept_tree_sampled, static_argnums=3)(tree, mask, logits, sampling, jax.random.key(1))
        for name, w, g in zip(("last", "accepted", "bonus"), want, got):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"{sampling}: {name}")
    last, accepted = np.asarray(want[0]), np.asarray(want[1])
    assert set(range(5)) <= set(accepted[:96].tolist()), np.bincount(accepted[:96])
    rows = np.arange(len(last))
    assert np.any(np.asarray(tree.rank)[rows, last][:96] > 0)
    valid, tok = np.asarray(tree.valid)[96:], np.asarray(tree.tokens)[96:]
    root_best = np.argmax(np.asarray(logits)[96:, 0], -1)
    on_invalid = ~valid.all(1) & (root_best == 0) & (tok[:, 1] != 0)  # only invalid nodes hold 0
    assert on_invalid.any() and np.all(last[96:][on_invalid] == 0)


# ---------------------------------------------------------------- a vocabulary split over devices
SPLIT_CODE = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from dflash_jax import parallel
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.verification.acceptance import accept_tree_sampled
from dflash_jax.parallel import vocab
from support.multidevice import emit
from support.tree_cases import planted_case

mesh = parallel.make_mesh(data=1, model=2)
ops = vocab.VocabOps(vocab.Shards(data=1, model=2))
tree, mask, logits = planted_case(5, 64, 16, 3, 5, vocab=12)
logits = logits * 0.25  # planted argmaxes kept, but every token likely: the bonus varies
sampling, key = SamplingParams(temperature=0.8, top_k=5), jax.random.key(2)
local = jax.jit(accept_tree_sampled, static_argnums=3)(tree, mask, logits, sampling, key)
split = jax.jit(jax.shard_map(
    lambda t, m, x: accept_tree_sampled(t, m, x, sampling, key, ops), mesh=mesh,
    in_specs=(P(), P(), P(None, None, "model")), out_specs=P(), check_vma=False))(tree, mask, logits)
emit({name: [np.asarray(a).tolist() for a in r] for name, r in (("local", local), ("split", split))})
"""


@pytest.mark.multidevice
@pytest.mark.slow
def test_vocabulary_split_over_devices_gives_the_same_tokens():
    """On 2 host devices with the vocabulary split in two (``parallel.vocab.VocabOps``), the
    accepted path and the bonus equal the single-device result with the same key, row by row,
    at T = 0.8 with top-k 5 (the uniforms and the Gumbel noise are the whole array's; the rejected children are zeroed
    in the shard that holds them)."""
    from support.multidevice import run_on_devices

    out = run_on_devices(SPLIT_CODE, devices=2)
    assert out["split"] == out["local"]
    last, _, bonus = (np.array(a) for a in out["local"])
    assert len(set(bonus.tolist())) >= 5 and np.any(last > 0)  # top-k 5: every kept token


# ---------------------------------------------------------------- engine level: generate(tree=N)
# The emitted tokens of many rows of one generate call against the target's exact law of its
# first DEPTH tokens (tests/support/exact_sampling.py), as test_speculative's chain test does. Block 4:
# trees of depth up to 3, so the first iteration emits 1..4 tokens and the fifth comes later.
E_DEPTH, E_BLOCK, E_ROWS, E_NODES, E_TOPK = 5, 4, 8192, 8, 3
E_PROMPT = [1, 2, 3]


@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: it holds a table
class TreeTableProposer(TableProposer):
    """Drafts a tree as DFlash does (``verification.tree.best_first_tree`` over one distribution
    per depth): the target's exact next-token distribution at each depth along the row's
    generated prefix followed by its own argmax chain (``TableProposer``'s table), so q is
    close to p on the chain and the siblings off it are plausible tokens."""

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        V, depth = self.prefix_logits.vocab, self.prefix_logits.depth
        table = jnp.asarray(np.concatenate(self.prefix_logits.levels), jnp.float32)
        offsets = jnp.asarray(np.cumsum([0] + [V ** L for L in range(depth)]), jnp.int32)
        out, n = committed.generated, committed.num_generated
        j = jnp.arange(out.shape[1])
        power = jnp.where(j < n[:, None], V ** jnp.clip(n[:, None] - 1 - j, 0, depth), 0)
        value = jnp.sum(jnp.maximum(out, 0) * power, axis=1)  # the prefix read in base V
        rows = []
        for i in range(spec.block_size - 1):
            length = n + i
            logits = jnp.where((length < depth)[:, None],
                               table[offsets[jnp.minimum(length, depth - 1)] + value], 0.0)
            rows.append(jax.nn.log_softmax(logits, -1))
            value = jnp.where(length + 1 < depth, value * V + jnp.argmax(logits, -1), 0)
        logp = jnp.stack(rows, 1)  # [B, bs-1, V]
        return best_first_tree(committed.bonus, logp, policy.nodes, policy.topk), state


def bonus_from_p(tree, mask, logits, sampling, key, ops):
    """A wrong rule for the engine: accept_tree_sampled's path, but the bonus a sample of p at the
    last node, its rejected children not zeroed."""
    last, accepted, _ = accept_tree_sampled(tree, mask, logits, sampling, key, ops)
    p_last = target_logp(logits, sampling, ops)[jnp.arange(last.shape[0]), last]
    return last, accepted, ops.categorical(jax.random.fold_in(key, 1), p_last)


def tree_groups(target, prefix_logits, groups: int):
    """``generate(tree=E_NODES, temperature=1)`` with the table tree proposer over ``groups``
    groups of E_ROWS rows of E_PROMPT in one run: the result, and each group's fit of its first
    E_DEPTH tokens against the target's exact law."""
    r = dj.generate(target, [E_PROMPT] * (groups * E_ROWS), E_DEPTH,
                    proposer=TreeTableProposer(prefix_logits), block_size=E_BLOCK, tree=E_NODES,
                    tree_topk=E_TOPK, temperature=1.0, seed=3)
    joint, _ = prefix_logits.joint(1.0)
    return r, [exact_sampling.fit(r.sequences[i * E_ROWS:(i + 1) * E_ROWS], joint, ALPHA) for i in range(groups)]


@pytest.fixture(scope="module")
def engine_setup():
    cfg = dj.TargetConfig("qwen3", vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    random = dj.Target.random(cfg, seed=7, init_scale=0.5)
    target = dj.Target(cfg, random.params, max_len=24)  # prompt 3 + 5 new + a tree of 8 slots
    return target, exact_sampling.PrefixLogits.compute(target, E_PROMPT, E_DEPTH)


@pytest.mark.slow
def test_generate_with_a_tree_keeps_the_target_distribution(engine_setup, monkeypatch):
    """generate(tree=8, tree_topk=3, temperature=1) with a table tree proposer: the first 5
    tokens of E_ROWS rows have the target's exact law, and whole paths (depth 3) are accepted.
    Negative control in the same compiled run: a second group of E_ROWS rows whose acceptance
    draws the bonus from p without zeroing the rejected children (``bonus_from_p``) is
    rejected by the same check."""
    from dflash_jax.verification import acceptance

    target, prefix_logits = engine_setup
    traced = []

    def grouped(tree, mask, logits, sampling, key, ops):
        traced.append(True)
        right = accept_tree_sampled(tree, mask, logits, sampling, key, ops)
        wrong = bonus_from_p(tree, mask, logits, sampling, key, ops)
        group1 = jnp.arange(logits.shape[0]) >= E_ROWS
        return tuple(jnp.where(group1, w, r) for r, w in zip(right, wrong))

    monkeypatch.setattr(acceptance, "accept_tree_sampled", grouped)
    r, (right, wrong) = tree_groups(target, prefix_logits, 2)
    assert traced, "the engine did not call acceptance.accept_tree_sampled"
    first = np.array([a[0] for a in r.acceptance_lengths[:E_ROWS]])
    print(f"tree: tau {r.tau:.2f}, first acceptance lengths {np.bincount(first).tolist()}, {right}; "
          f"bonus from p: {wrong}")
    assert not right.rejected, right
    assert wrong.min_p < 1e-12, wrong
    assert np.all(np.bincount(first, minlength=E_BLOCK + 1)[1:] > 0.03 * E_ROWS)


@pytest.fixture(scope="module")
def hybrid_engine_setup():
    """A vocabulary-8 hybrid target (GDN, attention, GDN layers; replay rollback)."""
    from support import hybrid_targets as ht

    target = ht.random_target(ht.hybrid_config(vocab_size=8, hidden_size=16), seed=7, init_scale=0.5, max_len=24)
    return target, exact_sampling.PrefixLogits.compute(target, E_PROMPT, E_DEPTH)


def elder_sibling_paths(visible):
    """bool[B, N, N]: each node's root path with its elder sibling (the latest earlier node of
    the same parent) in its parent's place: the node reads its sibling's GDN state; a node
    without an elder sibling keeps its own path."""
    N = visible.shape[-1]
    eye = jnp.eye(N, dtype=bool)
    ancestors = visible & ~eye
    earlier = jnp.arange(N)[None, :] < jnp.arange(N)[:, None]
    sibling = jnp.all(ancestors[:, :, None, :] == ancestors[:, None, :, :], -1) & earlier  # [B, i, j]
    j = N - 1 - jnp.argmax(sibling[..., ::-1], -1)  # the latest one
    sib_path = jnp.take_along_axis(visible, j[..., None], axis=1) | eye
    return jnp.where(jnp.any(sibling, -1)[..., None], sib_path, visible)


@pytest.mark.slow
def test_generate_with_a_tree_on_a_hybrid_target_keeps_the_target_distribution(hybrid_engine_setup, monkeypatch):
    """The same engine-level check on a hybrid target, whose tree nodes each carry the GDN state
    of their own root path (``nn.gated_delta.tree_delta``). Three groups of E_ROWS rows in one
    compiled run: the right states keep the exact law of the first 5 tokens; each node reading
    its elder sibling's state, and each node reading its parent's state without its own token,
    are rejected by the same check."""
    from dflash_jax.nn import gated_delta

    target, prefix_logits = hybrid_engine_setup
    right_delta, traced = gated_delta.tree_delta, []

    def grouped(q, k, v, g, beta, state0, visible):
        traced.append(True)
        group = (jnp.arange(visible.shape[0]) // E_ROWS)[:, None, None]
        parent_only = visible & ~jnp.eye(visible.shape[-1], dtype=bool)  # no node sees itself
        wrong = jnp.where(group == 1, elder_sibling_paths(visible), jnp.where(group == 2, parent_only, visible))
        return right_delta(q, k, v, g, beta, state0, wrong)

    monkeypatch.setattr(gated_delta, "tree_delta", grouped)
    r, fits = tree_groups(target, prefix_logits, 3)
    assert traced, "the hybrid forward did not call gated_delta.tree_delta"
    first = np.array([a[0] for a in r.acceptance_lengths[:E_ROWS]])
    print(f"hybrid tree: tau {r.tau:.2f}, first acceptance lengths {np.bincount(first).tolist()}; right "
          f"{fits[0]}; sibling's state {fits[1]}; parent's state {fits[2]}")
    assert not fits[0].rejected, fits[0]
    assert fits[1].min_p < 1e-12 and fits[2].min_p < 1e-12, fits[1:]
    assert np.all(np.bincount(first, minlength=E_BLOCK + 1)[1:] > 0.03 * E_ROWS)
