"""Tree verification (``verification.tree``, ``docs/trees.md``) is exact.

* The tree builder against brute force: the best-first tree of N nodes is the N - 1 highest
  scoring root paths (every prefix of a path scores higher, so that set is a tree).
* The tree forward against plain causal forwards: node i's logits and taps, computed in one
  pass over the whole tree through the cache, equal a cache-less causal forward over the prompt
  and node i's root path (dense, qwen3_moe, gpt_oss with sinks and a sliding window narrower
  than the tree's depth, deepseek_v3, gemma4, and the hybrid families, whose Gated DeltaNet
  layers give each node its own path's state), on best-first trees and a hand-made one whose depth-4 node
  lies under a rank-1 depth-1 node (its slot and RoPE distances to that ancestor differ across
  the window: a window measured in slots for the block's keys fails).
* Greedy tree decoding equals autoregressive decoding on a ragged batch, with an oracle
  proposer that places the target's own next token at a chosen sibling rank at every depth
  (or nowhere); every iteration's acceptance length equals the one a brute-force walk of the
  same tree predicts (so the acceptance, not only the output, is checked); on the hybrid
  families too, with both GDN rollback modes. A hybrid tree's record has the bytes
  ``tree_record_bytes`` states, and a tree that does not fit in memory is refused.
* The drafter's context after each tree iteration holds the target's taps of the committed
  tokens (a cache-less jnp forward over the committed sequence), the accepted path's in path
  order (taps of the tree's first nodes instead fail), on a small random DFlash pair.
* The chain as a tree (``tree_topk=1``, N = block size) gives the DFlash chain's tokens and
  acceptance lengths on the embedded pair, and trees of 16 / 32 nodes equal AR there.
* ``KVCache.compact`` against a numpy move; what cannot verify trees is refused by name.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.verification import tree as trees
from dflash_jax.nn.tree_attention import TreeAttention
from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.proposers import Proposer
from support import hybrid_targets as ht
from support.tiers import tiered

pytestmark = pytest.mark.xdist_group("tree_exact")

DENSE = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=3,
                        num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)


# ---------------------------------------------------------------------------- the builder
def brute_force_paths(scores: np.ndarray, nodes: int) -> set[tuple[int, ...]]:
    """The ``nodes - 1`` best rank paths (tuples of sibling ranks, one per depth) when the rank-r
    token at depth d scores ``scores[d, r]`` (log-probabilities): all paths enumerated."""
    D, K = scores.shape
    paths = [p for n in range(1, D + 1) for p in itertools.product(range(K), repeat=n)]
    value = {p: sum(scores[d, r] for d, r in enumerate(p)) for p in paths}
    return set(sorted(paths, key=lambda p: -value[p])[:nodes - 1])


def rank_paths(tree: trees.Tree, row: int) -> set[tuple[int, ...]]:
    """The rank path of every valid non-root node of ``tree``'s row."""
    out = set()
    parents, ranks, valid = (np.asarray(x[row]) for x in (tree.parents, tree.rank, tree.valid))
    for i in range(1, len(parents)):
        if not valid[i]:
            continue
        path, j = [], i
        while j:
            path.append(int(ranks[j]))
            j = int(parents[j])
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("nodes,topk", [(2, 3), (9, 2), (20, 3), (40, 4)])
def test_best_first_tree_is_the_best_paths(nodes, topk):
    rng = np.random.default_rng(nodes)
    D, V, B = 4, 7, 3
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(B, D, V)) * 2, jnp.float32))
    tree = trees.best_first_tree(jnp.arange(B, dtype=jnp.int32), logp, nodes, topk)
    for b in range(B):
        lp = np.asarray(logp[b], np.float64)
        order = np.argsort(-lp, axis=1, kind="stable")[:, :topk]
        scores = np.take_along_axis(lp, order, 1)
        assert rank_paths(tree, b) == brute_force_paths(scores, nodes)
        # tokens: the rank-r token of the node's depth; parents before children
        tok, depth, rank, par = (np.asarray(x[b]) for x in (tree.tokens, tree.depth, tree.rank, tree.parents))
        assert tok[0] == b and depth[0] == 0
        for i in range(1, nodes):
            assert tok[i] == order[depth[i] - 1, rank[i]] and par[i] < i and depth[i] == depth[par[i]] + 1


def test_topk_one_is_the_chain_and_a_larger_budget_is_invalid_past_it():
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (2, 5, 9)))
    tree = trees.best_first_tree(jnp.array([3, 4]), logp, 8, 1)
    np.testing.assert_array_equal(tree.tokens[:, 1:6], jnp.argmax(logp, -1))
    np.testing.assert_array_equal(tree.parents[:, 1:6], np.arange(5)[None].repeat(2, 0))
    assert np.asarray(tree.valid).tolist() == [[True] * 6 + [False] * 2] * 2


def test_ancestor_mask_and_path_nodes():
    # root 0; 1, 2 children of 0; 3 child of 1; 4 child of 3; 5 child of 2
    parents = jnp.array([[0, 0, 0, 1, 3, 2]])
    depth = jnp.array([[0, 1, 1, 2, 3, 2]])
    tree = trees.Tree(jnp.zeros_like(parents), parents, depth, jnp.zeros_like(parents),
                      jnp.ones(parents.shape, bool), jnp.zeros(parents.shape))
    mask = np.asarray(trees.ancestor_mask(tree, 3))[0]
    expect = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}}
    for i, seen in expect.items():
        assert set(np.flatnonzero(mask[i])) == seen
    path = trees.path_nodes(jnp.asarray(mask)[None], depth, jnp.array([4]), 5)
    assert np.asarray(path).tolist() == [[0, 1, 3, 4, 0]]


def test_kv_cache_compact_moves_the_accepted_path():
    rng = np.random.default_rng(0)
    k = rng.normal(size=(2, 2, 12, 1, 3)).astype(np.float32)
    cache = dj.KVCache(jnp.asarray(k), jnp.asarray(-k), jnp.array([9, 9]))
    start = jnp.array([3, 5])
    source = jnp.array([[0, 2, 5, 6], [0, 1, 4, 0]])
    out = cache.compact(start, source)
    want = k.copy()
    for b in range(2):
        for j in range(4):
            want[:, b, int(start[b]) + j] = k[:, b, int(start[b]) + int(source[b, j])]
    np.testing.assert_array_equal(np.asarray(out.k), want)
    np.testing.assert_array_equal(np.asarray(out.v), -want)


# ---------------------------------------------------------------------------- the tree forward
def gpt_oss_target():
    from transformers import GptOssConfig

    hf = GptOssConfig(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                      vocab_size=32, hidden_size=32, intermediate_size=32, head_dim=8,
                      num_attention_heads=4, num_key_value_heads=2, sliding_window=3,
                      max_position_embeddings=256, eos_token_id=None, pad_token_id=None).to_dict()
    return dj.Target.random(dj.TargetConfig.from_hf_dict(hf), seed=3, init_scale=0.3)


def qwen3_moe_target():
    from transformers import Qwen3MoeConfig

    hf = Qwen3MoeConfig(vocab_size=32, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=256, norm_topk_prob=True).to_dict()
    return dj.Target.random(dj.TargetConfig.from_hf_dict(hf), seed=2, init_scale=0.3)


def deepseek_v3_target():
    from transformers import DeepseekV3Config

    hf = DeepseekV3Config(vocab_size=32, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                          kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
                          v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                          topk_group=1, first_k_dense_replace=1, max_position_embeddings=256).to_dict()
    return dj.Target.random(dj.TargetConfig.from_hf_dict(hf), seed=5, init_scale=0.3)


def gemma4_target():
    """Sliding (window 3) and full layers of their own shapes, per-layer inputs, a KV-shared
    layer of each type, the MoE block."""
    from transformers import Gemma4TextConfig

    hf = Gemma4TextConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=5,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
                          num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=3,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                       "sliding_attention", "full_attention"],
                          hidden_size_per_layer_input=4, vocab_size_per_layer_input=32, num_kv_shared_layers=2,
                          enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8,
                          final_logit_softcapping=5.0, max_position_embeddings=256).to_dict()
    return dj.Target.random(dj.TargetConfig.from_hf_dict(hf), seed=6, init_scale=0.3)


FAMILIES = {"qwen3": lambda: dj.Target.random(DENSE, seed=1, init_scale=0.35),
            "qwen3_moe": qwen3_moe_target, "gpt_oss": gpt_oss_target, "deepseek_v3": deepseek_v3_target,
            "gemma4": gemma4_target,
            # the hybrids: GDN layers (long memory) around an attention layer; each node's GDN
            # state must be its own root path's
            "qwen3_5_text": lambda: ht.random_target(ht.hybrid_config(), seed=1),
            "qwen3_5_moe_text": lambda: ht.moe_hybrid("qwen3_5_moe_text"),
            "qwen3_next": lambda: ht.moe_hybrid("qwen3_next")}


# A hand-made tree (node: parent) for the third row: node 7 at depth 4 under the rank-1 depth-1
# node 2 (path 0, 2, 4, 5, 7), node 9 at depth 4 under the rank-0 node 1 (path 0, 1, 3, 6, 9).
# With gpt_oss's and gemma4's window of 3, node 7 (slot start + 7, position start + 4) sees its ancestors
# at depths 2 and 3 but not node 2 (position start + 1, slot start + 2): measured by slot, node
# 2 would fall inside its window. Siblings are listed in rank order.
HAND_PARENTS = [0, 0, 0, 1, 2, 4, 3, 5, 0, 6, 4]


def hand_tree(anchor: int) -> trees.Tree:
    """The tree of ``HAND_PARENTS`` (one row; tokens arbitrary, scores 0)."""
    par = np.array(HAND_PARENTS)
    depth, rank = np.zeros_like(par), np.zeros_like(par)
    for i in range(1, len(par)):
        depth[i] = depth[par[i]] + 1
        rank[i] = sum(par[j] == par[i] for j in range(1, i))
    assert depth[7] == 4 and rank[2] == 1 and par[4] == 2 and depth[9] == 4
    tokens = (anchor + 5 * np.arange(len(par))) % 31
    row = lambda a, dt=jnp.int32: jnp.asarray(a[None], dt)
    return trees.Tree(row(tokens), row(par), row(depth), row(rank), jnp.ones((1, len(par)), bool),
                      jnp.zeros((1, len(par)), jnp.float32))


@pytest.mark.parametrize("kind", tiered(sorted(FAMILIES), fast=["qwen3"]))
def test_tree_forward_equals_causal_forwards_of_each_path(kind):
    """Node i of a tree verified in one pass (after a ragged prefill) has the logits and taps
    of a plain causal forward over the prompt + node i's root path. Rows 0 and 1: best-first
    trees; row 2: ``hand_tree`` (a depth-4 node whose slot and position distances to an
    ancestor differ across gpt_oss's window)."""
    target = FAMILIES[kind]()
    cfg, fam = target.config, targets.family_of(target.config)
    prompts = [[3, 9, 4, 1, 7, 2, 8], [5, 6], [10, 2, 13, 4]]
    B, P, N, D, S = 3, 7, 11, 4, 32
    tokens = np.zeros((B, P), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    lens = jnp.array([len(p) for p in prompts], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    state = fam.init_state(cfg, B, S, jnp.float32)
    _, _, state = fam.forward(cfg, target.params, jnp.asarray(tokens), pos, state)
    state = state.rollback(lens)
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(7), (2, D, cfg.vocab_size)) * 3)
    anchors = jnp.array([11, 12], jnp.int32)
    tree = trees.Tree(*(jnp.concatenate(f, 0) for f in zip(trees.best_first_tree(anchors, logp, N, 3),
                                                            hand_tree(14))))
    mask = trees.ancestor_mask(tree, D)
    slots = lens[:, None] + jnp.arange(N, dtype=jnp.int32)
    taps_ids = (0, cfg.num_layers - 1)
    logits, taps, out_state = fam.forward(cfg, target.params, tree.tokens, slots, state,
                                          tap_layer_ids=taps_ids,
                                          tree=TreeAttention(lens[:, None] + tree.depth, mask))
    assert np.asarray(out_state.lengths).tolist() == (np.asarray(lens) + N).tolist()
    m = np.asarray(mask)
    # every (row, node) as its own right-padded sequence: prompt + the node's root path
    seqs = [prompts[b] + [int(tree.tokens[b, j]) for j in np.flatnonzero(m[b, i])]  # ancestors in order
            for b in range(B) for i in range(N)]
    width = max(len(x) for x in seqs)
    batch = jnp.asarray([x + [0] * (width - len(x)) for x in seqs], jnp.int32)
    last = jnp.asarray([len(x) - 1 for x in seqs], jnp.int32)
    ref_logits, ref_taps, _ = fam.forward(cfg, target.params, batch,
                                          jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), batch.shape),
                                          tap_layer_ids=taps_ids, logit_index=last)
    ref_taps = jnp.take_along_axis(ref_taps, last[:, None, None], axis=1)[:, 0]
    np.testing.assert_allclose(logits.reshape(B * N, -1), ref_logits[:, 0], rtol=2e-4, atol=2e-4,
                               err_msg=kind)
    np.testing.assert_allclose(taps.reshape(B * N, -1), ref_taps, rtol=2e-4, atol=2e-4)


@pytest.mark.slow
def test_a_node_that_sees_a_sibling_changes_its_logits():
    """The mask is applied: letting one node see a sibling changes that node's logits only."""
    target = FAMILIES["qwen3"]()
    cfg, fam = target.config, targets.family_of(target.config)
    state = fam.init_state(cfg, 1, 32, jnp.float32)
    _, _, state = fam.forward(cfg, target.params, jnp.array([[4, 5, 6]]), jnp.array([[0, 1, 2]]), state)
    parents = jnp.array([[0, 0, 0, 1]])  # nodes 1 and 2 are siblings; 3 is 1's child
    tree = trees.Tree(jnp.array([[7, 8, 9, 10]]), parents, jnp.array([[0, 1, 1, 2]]),
                      jnp.array([[0, 0, 1, 0]]), jnp.ones((1, 4), bool), jnp.zeros((1, 4)))
    mask = trees.ancestor_mask(tree, 2)
    slots = jnp.array([[3, 4, 5, 6]])
    run = lambda m: fam.forward(cfg, target.params, tree.tokens, slots, state,
                                tree=TreeAttention(3 + tree.depth, m))[0]
    good, bad = run(mask), run(mask.at[0, 2, 1].set(True))
    np.testing.assert_array_equal(good[0, [0, 1, 3]], bad[0, [0, 1, 3]])
    assert float(jnp.max(jnp.abs(good[0, 2] - bad[0, 2]))) > 1e-3


# ---------------------------------------------------------------------------- greedy decoding
@dataclasses.dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class RankedTreeProposer(Proposer):
    """A test proposer: rolls the target forward from the committed state (its greedy
    continuation, the truth), then drafts a tree whose depth-d candidates are the truth at sibling
    rank ``ranks[b, d]`` (-1: the truth is not among them) and decoys at the other ranks, the
    rank-r candidate of depth d scored ``scores[d, r]`` (so the tree's shape is the same every
    iteration, and a brute-force walk predicts the acceptance)."""

    ranks: np.ndarray  # int32[B, D]
    scores: np.ndarray  # float32[D, K]

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        family, V = spec.family, spec.target.vocab_size
        D, K = self.scores.shape

        def step(carry, _):
            cache, tok = carry
            logits, _, cache = family.forward(spec.target, tparams, tok[:, None],
                                              cache.lengths[:, None], cache)
            tok = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)
            return (cache.rollback(cache.lengths), tok), tok

        _, truth = jax.lax.scan(step, (committed.target_state, committed.bonus), None, length=D)
        truth = truth.T  # [B, D]
        ranks = jnp.asarray(self.ranks)
        r = jnp.arange(K)
        # decoy j: truth + 1 + j (distinct, never the truth); the truth takes its rank's place
        decoy_rank = r[None, None, :] - (r[None, None, :] > ranks[:, :, None]) * (ranks[:, :, None] >= 0)
        cand = jnp.where(r[None, None, :] == ranks[:, :, None], truth[:, :, None],
                         (truth[:, :, None] + 1 + decoy_rank) % V)  # [B, D, K]
        logp = jnp.full(truth.shape + (V,), -1e4, jnp.float32)
        B = truth.shape[0]
        logp = logp.at[jnp.arange(B)[:, None, None], jnp.arange(D)[None, :, None], cand].set(
            jnp.broadcast_to(jnp.asarray(self.scores), cand.shape))
        return trees.best_first_tree(committed.bonus, logp, policy.nodes, policy.topk), state


def expected_acceptance(ranks, scores, nodes) -> int:
    """1 + the depth of the deepest node on the truth's rank path inside the brute-force tree
    (the proposer's logits are ``scores`` at its K candidates and -1e4 elsewhere: the tree
    ranks their log-softmax)."""
    scores = np.asarray(scores, np.float64)
    chosen = brute_force_paths(scores - np.log(np.exp(scores).sum(1, keepdims=True)), nodes)
    depth = 0
    for d, r in enumerate(ranks):
        if r < 0 or tuple(ranks[:d + 1]) not in chosen:
            break
        depth = d + 1
    return depth + 1


BS, K = 6, 3  # depth up to 5, three candidates per depth
SCORES = (-1.0 - np.array([[0.0, 1.1, 2.3]] * (BS - 1)) - 0.07 * np.arange(BS - 1)[:, None]
          + np.random.default_rng(0).uniform(0, 0.01, (BS - 1, K))).astype(np.float32)
RANKS = np.array([[0, 0, 0, 0, 0],  # the truth always the best candidate
                  [1, 0, 2, 0, 0],  # a second-ranked sibling, then a third
                  [2, 1, 0, 1, 0],
                  [-1, 0, 0, 0, 0]], np.int32)  # never drafted: one token per iteration


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [13], [14, 15, 16, 17, 18]]
BUDGETS = [20, 9, 17, 12]


@pytest.fixture(scope="module")
def dense_ar():
    target = dj.Target.random(DENSE, seed=4, init_scale=0.35)
    return target, PROMPTS, BUDGETS, dj.generate(target, PROMPTS, BUDGETS)


def hybrid_ar(kind: str):
    """A hybrid target (``qwen3_5_text-replay`` / ``-snapshot``: the GDN rollback; the MoE
    hybrids with replay, chunks of 3) with the prompts and budgets of :func:`dense_ar` and its
    AR output."""
    model_type, _, mode = kind.partition("-")
    target = FAMILIES[model_type]()
    if mode:
        target = dj.Target(dataclasses.replace(target.config, gdn_rollback=mode), target.params)
    return target, PROMPTS, BUDGETS, dj.generate(target, PROMPTS, BUDGETS)


GREEDY_CASES = [("dense", 6, "xla"), pytest.param("dense", 16, "xla", marks=pytest.mark.slow),
                pytest.param("dense", 11, "pallas", marks=pytest.mark.slow), ("qwen3_5_text-replay", 11, "xla")] + [
    pytest.param(kind, nodes, "xla", marks=pytest.mark.slow)
    for kind, nodes in (("qwen3_5_text-snapshot", 11), ("qwen3_5_text-replay", 16), ("qwen3_5_moe_text", 11),
                        ("qwen3_next", 11))] + [pytest.param("qwen3_5_text-replay", 11, "pallas", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind,nodes,impl", GREEDY_CASES)
def test_greedy_tree_equals_autoregressive_and_accepts_what_a_walk_predicts(dense_ar, kind, nodes, impl):
    """``impl`` "pallas": the Pallas kernel's tree mask (interpreted on CPU) in the loop. The
    hybrid targets: every node's GDN state its own branch's, the accepted path's kept by the
    replay or the snapshot record (a state from a sibling, or from the wrong depth, changes the
    tokens that follow: the tree forward's test checks each node's logits)."""
    target, prompts, budgets, ar = dense_ar if kind == "dense" else hybrid_ar(kind)
    proposer = RankedTreeProposer(RANKS, SCORES)
    out = dj.generate(target, prompts, budgets, proposer=proposer, block_size=BS, tree=nodes,
                      tree_topk=K, attention_impl=impl)
    assert out.sequences == ar.sequences
    for b in range(len(prompts)):
        want = expected_acceptance(RANKS[b].tolist(), SCORES, nodes)
        lens = out.acceptance_lengths[b]
        assert all(x == want for x in lens[:-1]), (b, want, lens)  # the last may hit the budget
        assert 1 <= lens[-1] <= want  # the prefill emits one token, the iterations the rest
        assert sum(lens[:-1]) < budgets[b] - 1 <= sum(lens)
        assert out.verify_lengths[b] == [nodes] * len(lens)
    # the cases reach depths 5 (rank 0 throughout), 3 and 1 with 16 nodes: not only full chains
    assert len({expected_acceptance(r.tolist(), SCORES, 16) for r in RANKS}) >= 3


def test_refusals_name_the_problem(dense_ar):
    target, prompts, budgets, _ = dense_ar
    drafter = dj.Drafter.random(target, num_layers=1, block_size=4, seed=1)
    cases = [(dict(tree=1), "at least 2 nodes"),
             (dict(tree=8, block_size="adaptive"), "two verify policies"),
             (dict(tree_topk=2), "belongs to tree verification"),
             (dict(tree=8, temperature=1.0, sampled_draft=True), "sampled_draft"),
             (dict(tree=8, tree_topk=0), "topk must be >= 1"),
             (dict(tree="8"), "tree must be an integer")]
    for options, match in cases:
        with pytest.raises(ValueError, match=match):
            dj.generate(target, prompts[:1], 4, drafter=drafter, **options)
    with pytest.raises(ValueError, match="needs a drafter"):
        dj.generate(target, prompts[:1], 4, tree=8)


@pytest.mark.parametrize("mode", ["replay", "snapshot"])
def test_hybrid_tree_records_have_the_stated_bytes_and_a_tree_that_does_not_fit_is_refused(mode, monkeypatch):
    """``tree_record_bytes`` (what a tree keeps per node and GDN layer) against the record a
    tree forward actually keeps, less its per-layer part (the conv window before the block,
    and the state before it: once in snapshot mode, twice as replay's boundaries); and a tree
    too large for the device's memory refused in one line naming the bytes, before anything
    compiles (the memory made small here)."""
    target = FAMILIES["qwen3_5_text"]()
    cfg = dataclasses.replace(target.config, gdn_rollback=mode)
    fam = targets.family_of(cfg)
    B, N, S = 2, 7, 32
    state = fam.init_state(cfg, B, S, jnp.float32)
    _, _, state = fam.forward(cfg, target.params, jnp.ones((B, 3), jnp.int32),
                              jnp.broadcast_to(jnp.arange(3, dtype=jnp.int32), (B, 3)), state)
    state = state.rollback(jnp.full((B,), 3, jnp.int32))
    tree = trees.best_first_tree(jnp.array([1, 2]), jax.random.normal(jax.random.key(0), (B, 3, cfg.vocab_size)), N, 2)
    slots = 3 + jnp.arange(N, dtype=jnp.int32)[None].repeat(B, 0)
    _, _, out = fam.forward(cfg, target.params, tree.tokens, slots, state,
                            tree=TreeAttention(3 + tree.depth, trees.ancestor_mask(tree, 3)))
    kept = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(out.gdn.record))
    L, K1, C = len(cfg.gdn_layers), cfg.linear_conv_kernel_dim - 1, cfg.conv_channels
    state_bytes = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    per_layer = K1 * C * 4 + (1 if mode == "snapshot" else 2) * state_bytes
    need = fam.tree_record_bytes(cfg, N, B, 4)
    assert kept - L * B * per_layer == need["record"] == L * B * N * need["per_node_per_layer"]
    # the device's memory one byte short of the parameters and an 8-node tree for one row
    params = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(target.params))
    short = params + fam.tree_record_bytes(cfg, 8, 1, 4)["total"] - 1
    monkeypatch.setattr(trees, "device_memory_bytes", lambda: short)
    drafter = ht.random_drafter(dj.Target(cfg, target.params), block_size=4, seed=1)
    with pytest.raises(ValueError, match=rf"a tree of 8 nodes at batch 1 needs .* GiB for the target's Gated "
                                         rf"DeltaNet layers \(.* KiB per node per layer, gdn_rollback='{mode}'\) "
                                         rf"beside .* GiB of parameters, more than the device's .* GiB: ask for "
                                         rf"fewer nodes"):
        dj.generate(dj.Target(cfg, target.params), [[1, 2, 3]], 4, drafter=drafter, verify=trees.TreeVerify(8))
    # exactly enough passes the same check (the spec generate builds, asked directly)
    spec = prepare_spec(dj.Target(cfg, target.params), drafter)
    trees.check_tree_memory(spec, 1, target.params, limit=short + 1)
    with pytest.raises(ValueError, match="a tree of 8 nodes at batch 1"):
        trees.check_tree_memory(spec, 1, target.params, limit=short)


def prepare_spec(target, drafter):
    """The engine spec ``generate(..., verify=TreeVerify(8))`` builds (no program compiled)."""
    from dflash_jax.decoding import engine
    from dflash_jax.verification.sampling import SamplingParams

    return engine.EngineSpec(target=target.config, proposer=DFlashProposer(drafter.config),
                             block_size=drafter.config.block_size, sampling=SamplingParams(0.0, None, None),
                             verify=trees.TreeVerify(8))


# ---------------------------------------------------------------------------- the drafter's context
@dataclasses.dataclass(frozen=True, eq=False)
class ContextRecorder(DFlashProposer):
    """The DFlash proposer (its trees unchanged) that also copies, at each tree proposal, (block
    start int32[B], the pending taps [B, bs, k*D] and their positions int32[B, bs] that this
    proposal writes into the drafter's context, the tree's tokens and parents [B, N]) to
    ``records``, in loop order. Compared and hashed by identity: traced anew per instance."""

    records: list = dataclasses.field(default_factory=list)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def propose_tree(self, spec, tparams, params, state, committed, key, policy):
        tree, new_state = super().propose_tree(spec, tparams, params, state, committed, key, policy)
        jax.debug.callback(lambda *xs: self.records.append(tuple(np.asarray(x) for x in xs)),
                           committed.start, state.pending_taps, state.pending_pos, tree.tokens,
                           tree.parents, ordered=True)
        return tree, new_state


CONTEXT_TARGET = dj.TargetConfig("qwen3", vocab_size=6, hidden_size=32, intermediate_size=48,
                                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                 max_position_embeddings=128)


def numpy_params(init, seed: int, scale: float = 0.35):
    """Random parameters shaped like ``init(key)``'s (traced for its shapes only, not compiled
    nor run: the tiny pair costs no init programs): matrices normal(``scale``), norm weights
    1 + 0.2 normal, drawn in numpy."""
    shapes = jax.eval_shape(init, jax.random.key(0))
    rng = np.random.default_rng(seed)
    draw = lambda path, s: jnp.asarray(
        1.0 + 0.2 * rng.normal(size=s.shape) if "weight" in jax.tree_util.keystr(path)
        else scale * rng.normal(size=s.shape), s.dtype)
    return jax.tree_util.tree_map_with_path(draw, shapes)


def context_pair():
    """(target, drafter): a random qwen3 target of 6 tokens (so a top-4 tree often holds the
    target's next token, at any rank) and a 1-layer DFlash drafter of block 4 on its 2 layers."""
    from dflash_jax.methods.dflash.model import init_drafter_params

    tparams = numpy_params(lambda k: targets.init_target_params(CONTEXT_TARGET, k, jnp.float32), 3)
    target = dj.Target(CONTEXT_TARGET, tparams)
    dcfg = dj.DrafterConfig.for_target(CONTEXT_TARGET, 1, 4, CONTEXT_TARGET.vocab_size - 1, (0, 1))
    dcfg.check_target(CONTEXT_TARGET)
    return target, dj.Drafter(dcfg, numpy_params(lambda k: init_drafter_params(dcfg, k), 4))


@pytest.mark.slow
def test_drafter_context_gets_the_accepted_paths_taps_in_path_order():
    """Greedy DFlash tree decoding (tree=12, top-4, block 4) on a small random pair: at every
    iteration, the taps the proposer writes into the drafter's context are, at each position
    committed by the last iteration (its anchor, then the accepted path), the target's taps
    there from a cache-less forward over the committed sequence (``drafter_reference.
    target_taps``, plain jnp); every committed position gets exactly one. Several iterations
    accept a path whose nodes are not the tree's first nodes (so taps gathered in node order,
    or not gathered, would be caught)."""
    from support.drafter_reference import target_taps

    target, drafter = context_pair()
    prompts, max_new, S_pad = [[1, 2, 3, 4, 5], [0, 3, 4, 4, 2, 1, 1, 3]], 24, 64
    recorder = ContextRecorder(drafter.config)
    out = dj.generate(target, prompts, max_new, drafter=drafter, proposer=recorder, tree=12,
                      tree_topk=4)
    records = recorder.records
    assert len(records) == max(len(a) for a in out.acceptance_lengths)
    off_order = 0
    for b, (prompt, seq, acc) in enumerate(zip(prompts, out.sequences, out.acceptance_lengths)):
        full = prompt + seq
        taps = np.asarray(target_taps(target.config, target.params,
                                      jnp.asarray(np.pad(full, (0, S_pad - len(full))), jnp.int32),
                                      drafter.config.target_layer_ids))
        covered = []
        for i in range(len(acc)):
            start = len(prompt) + sum(acc[:i])
            rec_start, pending, pos, *_ = (r[b] for r in records[i])
            assert int(rec_start) == start, (b, i)
            seen = pos < start  # what the drafter's context reads of the pending block
            covered += pos[seen].tolist()
            np.testing.assert_allclose(pending[seen], taps[pos[seen]], rtol=2e-4, atol=2e-4,
                                       err_msg=f"prompt {b}, iteration {i}, positions {pos[seen]}")
            if i:  # the last iteration's accepted path in its tree: was it the first nodes?
                tok, par = records[i - 1][3][b], records[i - 1][4][b]
                path = [0]
                for t in full[start - acc[i - 1] + 1:start]:
                    path.append(next((j for j in range(1, len(tok)) if par[j] == path[-1] and tok[j] == t), None))
                    assert path[-1] is not None, (b, i, "an accepted token not in the tree")
                off_order += path != list(range(len(path)))
        assert covered == list(range(len(prompt), len(prompt) + sum(acc[:-1]))), (b, covered)
    print(f"acceptance lengths {out.acceptance_lengths}; {off_order} paths not the first nodes")
    assert off_order >= 3


# ---------------------------------------------------------------------------- the embedded pair
@pytest.mark.slow
def test_embedded_pair_chain_tree_equals_the_chain_and_trees_equal_ar():
    target, drafter = dj.load_embedded()
    tok = target.tokenizer
    prompts = [tok.encode("Question: A farmer has 12 cows and buys 7 more. How many cows?\nAnswer:"),
               tok.encode("def add(a, b):")]
    n = 24
    chain = dj.generate(target, prompts, n, drafter=drafter)  # == AR (test_embedded_default)
    as_tree = dj.generate(target, prompts, n, drafter=drafter, tree=drafter.config.block_size, tree_topk=1)
    assert as_tree.sequences == chain.sequences
    assert as_tree.acceptance_lengths == chain.acceptance_lengths
    tree = dj.generate(target, prompts, n, drafter=drafter, tree=32)
    assert tree.sequences == chain.sequences
    assert max(max(x) for x in tree.acceptance_lengths) > 1  # the trained drafter is accepted
