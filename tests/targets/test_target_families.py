"""Target families as plug-ins (``dflash_jax.targets``): the registry, and a family with a
recurrent layer (``tests/support/recurrent_family.py``, one module + one registry line) decoded by the
unchanged engine.

The recurrent state cannot be cropped like a KV cache: after each verified block the engine
rolls it back to the state after the accepted row. The oracle proposer here knows the target's
greedy continuation and is wrong at a chosen draft position in every iteration, so each
iteration's acceptance length is known in advance and every length 1..bs occurs; the output must
equal plain autoregressive decoding (itself checked against a cache-less step-by-step oracle).
The negative control is the same family with the rollback bug (the state after the whole block
kept): its speculative output must differ from the autoregressive one.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.nn.cache import RecurrentState

from support import recurrent_family  # registers the test families
from support.oracle_proposers import ReferenceProposer

pytestmark = pytest.mark.xdist_group("target_families")

DIMS = dict(vocab_size=48, hidden_size=32, intermediate_size=24, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=8, max_position_embeddings=256)
CFG = dj.TargetConfig("test_recurrent", **DIMS)
BS = 6
PROMPTS = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 1, 44]]
MAX_NEW = 40


# ---------------------------------------------------------------------------- registry
def test_unknown_model_type_lists_the_supported_ones():
    with pytest.raises(ValueError, match=r"unknown model_type 'gpt2'; supported model types are qwen3, llama"):
        dj.TargetConfig("gpt2", **DIMS)
    with pytest.raises(ValueError, match=r"unknown model_type 'mamba' in config.json; supported .*qwen3, llama"):
        dj.TargetConfig.from_hf_dict({"model_type": "mamba"})
    assert targets.supported_model_types()[:2] == ("qwen3", "llama")


def test_a_model_type_belongs_to_one_family():
    with pytest.raises(ValueError, match="already registered"):
        targets.register(recurrent_family.RecurrentTestFamily("qwen3"))
    assert targets.family_of(CFG) is recurrent_family.RECURRENT
    assert targets.family("qwen3").tensor_specs(dj.TargetConfig("qwen3", **{**DIMS, "num_layers": 1}))


def test_what_a_family_does_not_define_is_named():
    with pytest.raises(NotImplementedError, match="'test_recurrent' target family does not define tensor_specs"):
        targets.family_of(CFG).tensor_specs(CFG)


# ---------------------------------------------------------------------------- the state
def test_recurrent_state_rollback_restores_the_snapshot_after_the_kept_row():
    rng = np.random.default_rng(0)
    snaps = jnp.asarray(rng.normal(size=(2, 3, 5, 4)), jnp.float32)  # [layers, B, T + 1, S]
    start = jnp.array([7, 0, 3])
    st = RecurrentState.init(2, 3, (4,)).after_block(snaps, start, start + 4)
    np.testing.assert_array_equal(st.state, snaps[:, :, -1])
    back = st.rollback(jnp.array([8, 0, 7]))  # keep 1, 0 and all 4 rows of the block
    for b, i in enumerate([1, 0, 4]):
        np.testing.assert_array_equal(back.state[:, b], snaps[:, b, i])
    assert back.snapshots is None and back.lengths.tolist() == [8, 0, 7]


# ---------------------------------------------------------------------------- decoding
@functools.lru_cache(maxsize=None)
def target(model_type: str = "test_recurrent"):
    cfg = dj.TargetConfig(model_type, **DIMS)
    return dj.Target.random(cfg, seed=5, init_scale=0.35)


ORACLE_LEN = max(map(len, PROMPTS)) + MAX_NEW  # one static shape: one compiled oracle program


@functools.lru_cache(maxsize=None)
def cacheless_logits():
    """A full cache-less forward of ``target()``: tokens int32[1, ORACLE_LEN] -> logits
    float32[1, ORACLE_LEN, V] (jitted once)."""
    t = target()
    positions = jnp.arange(ORACLE_LEN, dtype=jnp.int32)[None]
    return jax.jit(lambda toks: targets.target_forward(t.config, t.params, toks, positions)[0])


def stepwise_greedy(t, prompt, n):
    """The oracle: argmax of a full cache-less forward over the whole sequence, one token at a
    time. The sequence is padded to ORACLE_LEN so that every step runs one compiled program;
    the model is causal (attention masked by position, the recurrence a forward scan), so the
    padding after row ``len(seq) - 1`` does not reach that row's logits (were it to, the oracle
    would disagree with the cached decoding it checks)."""
    assert t is target() and len(prompt) + n <= ORACLE_LEN
    forward = cacheless_logits()
    seq = list(prompt)
    for _ in range(n):
        toks = np.zeros((1, ORACLE_LEN), np.int32)
        toks[0, :len(seq)] = seq
        logits = forward(jnp.asarray(toks))
        seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    return seq[len(prompt):]


@functools.lru_cache(maxsize=None)
def reference():
    return dj.generate(target(), PROMPTS, MAX_NEW).sequences


def wrong_at(start, bs: int = BS):
    """The draft index the oracle gets wrong in the iteration that starts at ``start``
    (bs - 1: none wrong, the whole block is accepted); with these prompts and budget, every
    acceptance length 1..bs occurs (asserted)."""
    return (start // 5) % bs


def proposer_for(ref_seqs):
    """The reference continuation of every prompt, wrong at ``wrong_at(start)``."""
    width = max(len(p) + len(r) for p, r in zip(PROMPTS, ref_seqs)) + BS
    rows = np.zeros((len(PROMPTS), width), np.int32)
    for b, (p, r) in enumerate(zip(PROMPTS, ref_seqs)):
        rows[b, :len(p) + len(r)] = p + r
    return ReferenceProposer(rows, wrong_at)


def test_recurrent_family_autoregressive_equals_the_cacheless_oracle():
    ref = reference()
    for prompt, seq in zip(PROMPTS, ref):
        assert seq == stepwise_greedy(target(), prompt, MAX_NEW)
    assert len(set(ref[0])) > 5, "a degenerate model would not test the state"


def test_recurrent_family_speculative_equals_autoregressive_for_every_accepted_length():
    ref = reference()
    t = target()
    drafter = dj.Drafter.random(t, num_layers=1, block_size=BS, seed=6)
    r = dj.generate(t, PROMPTS, MAX_NEW, drafter=drafter, proposer=proposer_for(ref))
    assert r.sequences == ref
    seen = set()
    for prompt, lens in zip(PROMPTS, r.acceptance_lengths):
        start = len(prompt)  # the first iteration's anchor is the prefill's token at len(prompt)
        for a in lens[:-1]:  # the last iteration may be cut by the budget
            assert a == wrong_at(start) + 1
            seen.add(a)
            start += a
    assert seen == set(range(1, BS + 1)), f"acceptance lengths seen: {sorted(seen)}"


@pytest.mark.slow
def test_recurrent_family_with_the_dflash_drafter_equals_autoregressive():
    t = target()
    drafter = dj.Drafter.random(t, num_layers=1, block_size=BS, seed=7, init_scale=0.35)
    assert dj.generate(t, PROMPTS, MAX_NEW, drafter=drafter).sequences == reference()


@pytest.mark.slow
def test_rollback_that_keeps_the_whole_block_is_caught():
    """Negative control: the same weights with the whole-block rollback bug (in decoding).
    Autoregressive decoding keeps every verified row, so it is unaffected; speculative decoding
    is not."""
    good, bad = target(), target("test_recurrent_wrong_rollback")
    jax.tree_util.tree_map(np.testing.assert_array_equal, good.params, bad.params)
    ref = reference()
    assert dj.generate(bad, PROMPTS, MAX_NEW).sequences == ref
    drafter = dj.Drafter.random(bad, num_layers=1, block_size=BS, seed=6)
    wrong = dj.generate(bad, PROMPTS, MAX_NEW, drafter=drafter, proposer=proposer_for(ref)).sequences
    assert wrong != ref
