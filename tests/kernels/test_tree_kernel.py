"""Tree verify in the block-attention kernels: the non-causal mode with ``blk_mask`` (query t sees
the committed slots < kv_lens and only the block rows j of its ancestors and itself) against the
dense jnp reference, the reference against an independent dense softmax written here, and a
mutant mask that lets one node see a sibling. The Pallas kernel runs in interpret mode on CPU
(compiled on a GPU), the Triton-language kernel in Triton's interpreter (through jax-triton on a
GPU)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax.verification.tree import ancestor_mask, best_first_tree
from dflash_jax.kernels import block_attention, block_attention_reference
from dflash_jax.kernels.block_attention import MAX_ROWS
from dflash_jax.nn.attention import pallas_block_attention, triton_block_attention
from support.tiers import tiered

pytestmark = pytest.mark.xdist_group("test_tree_kernel")

INTERPRET = jax.default_backend() != "gpu"
B, S, HKV, DH, TOPK, LAYER = 3, 48, 2, 16, 3, 1


@functools.partial(jax.jit, static_argnums=1)
def random_tree(logits, N):
    """The best-first tree of N nodes (``TOPK`` children at most) over random per-depth
    log-probabilities logits [B, N - 1, V], and its ancestor mask bool[B, N, N]."""
    tree = best_first_tree(jnp.zeros((logits.shape[0],), jnp.int32), jax.nn.log_softmax(logits),
                           N, TOPK)
    return tree, ancestor_mask(tree, N - 1)


def inputs(rng, T, G):
    """q [B, T, H, Dh]; the stacked cache k, v [2, B, S, Hkv, Dh] (layer LAYER is read; the other
    is noise); kv_lens int32[B] ragged with row 0 empty; the block's own kb, vb [B, T, Hkv, Dh]."""
    mk = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    q, k, v = mk(B, T, HKV * G, DH), mk(2, B, S, HKV, DH), mk(2, B, S, HKV, DH)
    kb, vb = mk(B, T, HKV, DH), mk(B, T, HKV, DH)
    lens = jnp.asarray(rng.integers(1, S - T + 1, size=B), jnp.int32).at[0].set(0)
    return q, k, v, lens, kb, vb


def kernel(q, k, v, lens, kb, vb, mask, impl=pallas_block_attention):
    """The kernel as the models call it (``nn.attention.pallas_block_attention`` or
    ``triton_block_attention``: the stacked cache read in place at a layer index)."""
    return np.asarray(impl(q, k, v, lens, causal=False, layer=jnp.int32(LAYER), k_blk=kb, v_blk=vb,
                           blk_mask=mask))


reference = jax.jit(block_attention_reference, static_argnames=("causal",))


def dense_tree_attention(q, k, v, lens, kb, vb, mask):
    """Independent of the kernels' code: for each (row, query, head) a float64 numpy softmax over
    the committed slots < lens[b] followed by the block rows j with mask[b, t, j]; zeros for a
    query that sees nothing. k, v: one layer [B, S, Hkv, Dh]."""
    q, k, v, kb, vb, mask = map(np.asarray, (q, k, v, kb, vb, mask))
    T, H, Dh = q.shape[1:]
    G = H // k.shape[2]
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        for t in range(T):
            keep = np.flatnonzero(mask[b, t])
            for h in range(H):
                keys = np.concatenate([k[b, :lens[b], h // G], kb[b, keep, h // G]]).astype(np.float64)
                vals = np.concatenate([v[b, :lens[b], h // G], vb[b, keep, h // G]]).astype(np.float64)
                if len(keys):
                    s = keys @ q[b, t, h].astype(np.float64) / np.sqrt(Dh)
                    p = np.exp(s - s.max())
                    out[b, t, h] = (p / p.sum()) @ vals
    return out


# (T nodes, G query heads per KV head): GQA 1, 2, 4; T = 32 with G = 4 is 128 folded rows, more
# than MAX_ROWS = 64, so the kernel runs two query chunks of 16 that must carry their mask rows
CASES = [(5, 1), (5, 4), (16, 2), (32, 4)]
CHUNKED = (32, 4)
FAST_CASES = [(5, 4), CHUNKED]  # the fast tier's (the whole suite: all four)


@pytest.fixture(scope="module", params=tiered(CASES, FAST_CASES, ids=lambda c: f"T{c[0]}-g{c[1]}"))
def case(request):
    """One random tree and its inputs; the kernel and the reference on its ancestor mask, on a
    mutant that also lets the last node with a sibling see that sibling (not an ancestor), and
    on a mask where node 2 of row 0 (no committed slots) sees nothing."""
    T, G = request.param
    rng = np.random.default_rng(T * 10 + G)
    tree, mask = random_tree(jnp.asarray(rng.normal(size=(B, T - 1, 11)) * 2.0, jnp.float32), T)
    depth, parents = np.asarray(tree.depth), np.asarray(tree.parents)
    assert (depth[:, 1:] < np.arange(1, T)).any(), "some node is off the chain: a real tree"
    node = max(i for i in range(1, T) if (parents[0, 1:] == parents[0, i]).sum() > 1)
    sibling = next(j for j in range(1, T) if j != node and parents[0, j] == parents[0, node])
    assert not bool(mask[0, node, sibling])
    mutant = mask.at[0, node, sibling].set(True)
    blind = mask.at[0, 2].set(False)
    args = inputs(rng, T, G)
    q, k, v, lens, kb, vb = args
    one = (q, k[LAYER], v[LAYER], lens, kb, vb)  # the layer the kernel reads
    return dict(T=T, G=G, mask=mask, mutant=mutant, blind=blind, node=node, args=args, one=one,
                out=kernel(*args, mask), out_mutant=kernel(*args, mutant),
                out_blind=kernel(*args, blind),
                ref=np.asarray(reference(*one, causal=False, blk_mask=mask)),
                ref_mutant=np.asarray(reference(*one, causal=False, blk_mask=mutant)),
                ref_blind=np.asarray(reference(*one, causal=False, blk_mask=blind)))


def test_tree_kernel_matches_reference(case):
    """Random best-first trees, ragged kv_lens (row 0: no committed slots), GQA, query chunks."""
    assert (case["T"] * case["G"] > MAX_ROWS) == ((case["T"], case["G"]) == CHUNKED)
    assert not np.isnan(case["out"]).any()
    np.testing.assert_allclose(case["out"], case["ref"], atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(case["out_mutant"], case["ref_mutant"], atol=3e-5, rtol=3e-5)


@pytest.fixture(scope="module")
def triton_outputs(case):
    """The Triton-language kernel on the case's three masks (its own fixture: on a GPU it needs
    jax-triton, which the Pallas tests do not)."""
    run = functools.partial(kernel, impl=triton_block_attention)
    return {name: run(*case["args"], case[mask])
            for name, mask in (("out", "mask"), ("out_mutant", "mutant"), ("out_blind", "blind"))}


@pytest.mark.slow
@pytest.mark.triton
def test_triton_tree_kernel(case, triton_outputs):
    """The same trees through the Triton-language kernel (one program for the block's rows, which
    reads the whole [T, T] mask; no query chunks): == the reference on the ancestor mask, the
    mutant and the blind mask; the mutant changes its node only; a blind node gets zeros."""
    for name in ("", "_mutant", "_blind"):
        assert not np.isnan(triton_outputs["out" + name]).any()
        np.testing.assert_allclose(triton_outputs["out" + name], case["ref" + name], atol=3e-5,
                                   rtol=3e-5)
    only_the_node_changed(triton_outputs["out"], triton_outputs["out_mutant"], case["node"])
    blind_node_gets_zeros(triton_outputs["out_blind"], triton_outputs["out"])


def test_reference_matches_an_independent_dense_softmax(case):
    for mask, ref in ((case["mask"], case["ref"]), (case["mutant"], case["ref_mutant"])):
        np.testing.assert_allclose(ref, dense_tree_attention(*case["one"], mask), atol=2e-5,
                                   rtol=2e-5)


def test_a_mask_that_lets_a_node_see_a_sibling_changes_only_that_node(case):
    """The mutant mask changes the kernel's output at its node and nowhere else (T = 32: the
    node sits in the second query chunk, whose rows of the mask are the ones applied)."""
    node = case["node"]
    if case["T"] * case["G"] > MAX_ROWS:
        assert node >= MAX_ROWS // case["G"], "the node is not in a later chunk"
    only_the_node_changed(case["out"], case["out_mutant"], node)


def only_the_node_changed(out, mutant, node):
    """out, mutant [B, T, H, Dh]: they differ at (row 0, node) and are equal everywhere else."""
    changed = np.abs(out - mutant).max(axis=(2, 3))  # [B, T]
    assert changed[0, node] > 1e-3, changed[0, node]
    changed[0, node] = 0
    assert changed.max() == 0.0


def test_a_node_that_sees_nothing_gets_zeros(case):
    """No committed slot (row 0) and an all-False mask row: zeros, never NaN, in the kernel and
    the reference; the other nodes keep their outputs."""
    for name in ("out", "ref"):
        blind_node_gets_zeros(case[name + "_blind"], case[name])


def blind_node_gets_zeros(blind, out):
    """blind: the output with node 2 of row 0 seeing nothing: zeros there, no NaN, and ``out``'s
    values everywhere else."""
    keep = np.ones(out.shape[:2], bool)
    keep[0, 2] = False
    assert not np.isnan(blind).any() and np.abs(blind[0, 2]).max() == 0.0
    np.testing.assert_array_equal(blind[keep], out[keep])


@pytest.mark.triton
def test_bad_blk_mask_is_refused():
    rng = np.random.default_rng(0)
    q, k, v, lens, kb, vb = inputs(rng, 5, 2)
    k, v = k[LAYER], v[LAYER]
    mask = jnp.ones((B, 5, 5), bool)
    with pytest.raises(ValueError, match="blk_mask restricts the block's own rows"):
        block_attention(q, k, v, lens, causal=True, blk_mask=mask, interpret=INTERPRET)
    with pytest.raises(ValueError, match="blk_mask restricts the block's own rows"):
        block_attention_reference(q, k, v, lens, causal=False, blk_mask=mask)  # no k_blk
    with pytest.raises(ValueError, match=r"blk_mask must have shape \(3, 5, 5\)"):
        block_attention(q, k, v, lens, kb, vb, causal=False, blk_mask=mask[:, :4],
                        interpret=INTERPRET)
    for impl in (pallas_block_attention, triton_block_attention):
        with pytest.raises(ValueError, match=r"blk_mask must have shape \(3, 5, 5\)"):
            impl(q, k[None], v[None], lens, causal=False, layer=0, k_blk=kb, v_blk=vb,
                 blk_mask=mask[:1])
        with pytest.raises(ValueError, match="blk_mask restricts the block's own rows"):
            impl(q, k[None], v[None], lens, causal=True, layer=0, blk_mask=mask)
