"""Speculative decoding stays exact on hybrid linear-attention targets (``qwen3_5_text``: Gated
DeltaNet (GDN) and full-attention layers, Hv != Hk; ``dflash_jax/targets/hybrid``), whose GDN
state cannot be cropped: after each verified block the engine rolls every row back to the state
after its accepted row (``nn.gated_delta.GatedDeltaState``, record modes "replay" and
"snapshot").

* Greedy: a proposer that knows the target's greedy continuation is wrong at a draft index
  chosen per iteration and row (a schedule of random permutations of 0..bs-1), so every
  accepted length 0..bs-1 occurs in every row of a ragged batch, the rows at different lengths
  in the same iteration; 256 new tokens (tens to a hundred iterations, the state carried
  through every rollback) must equal plain autoregressive decoding, at block sizes 4 and 16, in
  both modes (replay with chunks of 3 rows, so a rollback lands inside any chunk of a block).
* Negative control: the same weights under a test-only family whose rollback keeps the GDN
  state after the whole block (``tests/support/hybrid_targets.py``) must differ from it.
* A real DFlash drafter reading the hybrid target's taps (a GDN and an attention layer)
  decodes exactly.
* Sampling at T > 0 keeps the target's distribution (``tests/support/exact_sampling.py``: exact
  distribution of the first tokens, chi-squared, Bonferroni), and the wrong rollback is
  rejected by the same check.
* Taps as the engine collects them (through the decode state, over blocks rolled back to
  partial acceptance) equal transformers' ``output_hidden_states`` of the committed sequence
  (the stateless taps are ``test_hybrid_qwen3_5.py``'s).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import targets

from support import exact_sampling
from support import hybrid_targets as ht
from support.oracle_proposers import ReferenceProposer, TableProposer
from support.tiers import tiered

pytestmark = [pytest.mark.xdist_group("hybrid_exact"), pytest.mark.torch]

# GDN layer then attention layer (Qwen3.5's order): a wrong GDN state also reaches the KV cache
LAYERS = (ht.LINEAR, ht.FULL)
CHUNK = {"replay": 3, "snapshot": 16}  # snapshot: verify blocks up to 16 rows run the recurrence
PROMPTS = [[3, 17, 4, 40, 9], [11, 2, 30, 5, 5, 8, 21, 1, 44, 7, 19]]
MAX_NEW = 256


@functools.lru_cache(maxsize=None)
def target(mode: str = "replay", model_type: str = "qwen3_5_text") -> dj.Target:
    """One set of weights (long GDN memory) under each rollback mode and family."""
    cfg = ht.hybrid_config(model_type, layer_types=LAYERS, gdn_rollback=mode, gdn_chunk=CHUNK[mode])
    if (mode, model_type) == ("replay", "qwen3_5_text"):
        return ht.random_target(cfg, seed=1)
    return dj.Target(cfg, target().params)


@functools.lru_cache(maxsize=None)
def reference():
    """Autoregressive greedy decoding: the oracle every greedy run must equal."""
    ref = dj.generate(target(), PROMPTS, MAX_NEW).sequences
    assert all(len(set(s)) > 20 for s in ref), "a degenerate model would not test the state"
    return ref


def schedule(bs: int, seed: int):
    """Per row, the accepted drafts of every iteration (random permutations of 0..bs-1, one
    after another: every length in each row's first bs iterations), and the table
    int32[B, width] of the draft index to get wrong at each anchor position (the row's
    length before the iteration, minus one)."""
    rng = np.random.default_rng(seed)
    width = max(map(len, PROMPTS)) + MAX_NEW + bs
    table = np.zeros((len(PROMPTS), width), np.int32)
    plans = []
    for b, p in enumerate(PROMPTS):
        start, plan = len(p), []  # the first anchor is the prefill's token, at len(prompt)
        while start < width:
            for a in rng.permutation(bs):
                if start < width:
                    table[b, start] = a
                    plan.append(int(a))
                    start += int(a) + 1
        plans.append(plan)
    return plans, table


def scheduled_proposer(bs: int, seed: int):
    """A ``ReferenceProposer`` of the autoregressive continuation, wrong at the schedule's
    draft index (bs - 1: nowhere, the whole block accepted); and the schedule."""
    plans, table = schedule(bs, seed)
    rows = np.zeros_like(table)
    for b, (p, r) in enumerate(zip(PROMPTS, reference())):
        rows[b, :len(p) + len(r)] = p + r
    wrong = jnp.asarray(table)
    return ReferenceProposer(rows, lambda start: wrong[jnp.arange(wrong.shape[0]), start]), plans


def run_scheduled(t: dj.Target, bs: int):
    proposer, plans = scheduled_proposer(bs, seed=bs)
    drafter = ht.random_drafter(t, bs, seed=6)
    return dj.generate(t, PROMPTS, MAX_NEW, drafter=drafter, proposer=proposer), plans


# ---------------------------------------------------------------------------- greedy == AR
@pytest.mark.parametrize("mode", tiered(["replay", "snapshot"], fast=["snapshot"]))
@pytest.mark.parametrize("bs", tiered([4, 16], fast=[16]))
def test_greedy_equals_autoregressive_for_every_accepted_length(mode, bs):
    """Also the long run: 256 tokens per row, every iteration's rollback carried on."""
    r, plans = run_scheduled(target(mode), bs)
    assert r.sequences == reference()
    together = []
    for b, (plan, lens) in enumerate(zip(plans, r.acceptance_lengths)):
        accepted = [a - 1 for a in lens[:-1]]  # the last iteration may be cut by the budget
        assert accepted == plan[:len(accepted)], f"row {b}: the schedule was not followed"
        assert set(accepted) == set(range(bs)), f"row {b}: accepted lengths {sorted(set(accepted))}"
        together.append(accepted)
    n = min(map(len, together))
    assert sum(x != y for x, y in zip(together[0][:n], together[1][:n])) > n // 2  # ragged
    assert r.num_steps >= MAX_NEW // bs


@pytest.mark.slow
def test_the_gdn_kernels_decode_exactly():
    """``gdn_impl="pallas"``: the chunked form as the kernels of ``kernels/gdn_chunk.py``
    (interpreted here) in the prefill and every verify block, chunks of 3 rows in blocks of 4
    (a chunk padded to the kernel's 16-row tile), the replay rollback reading the kernels'
    boundary states: every accepted length, the same tokens as autoregressive decoding."""
    t = dj.Target(dataclasses.replace(target().config, gdn_impl="pallas"), target().params)
    r, plans = run_scheduled(t, 4)
    assert r.sequences == reference()
    assert all(set(a - 1 for a in lens[:-1]) == set(range(4)) for lens in r.acceptance_lengths)


@pytest.mark.slow
def test_rollback_that_keeps_the_whole_block_is_caught():
    """Negative control: the same weights and schedule, the GDN state after the whole block
    kept (the KV cache cropped right)."""
    bad = target("replay", ht.WRONG_TYPE)
    assert isinstance(targets.family_of(bad.config), ht.WrongRollbackFamily)
    r, _ = run_scheduled(bad, 4)
    ref = reference()
    assert r.sequences != ref
    for b, (got, want) in enumerate(zip(r.sequences, ref)):
        first = next(i for i, (x, y) in enumerate(zip(got, want)) if x != y)
        wrong = sum(x != y for x, y in zip(got, want))
        print(f"row {b}: first differs at new token {first} ({got[first]} vs {want[first]}), "
              f"{wrong} of {len(want)} tokens differ")
        assert first < 20 and wrong > len(want) // 2


@pytest.mark.slow
def test_dflash_drafter_on_hybrid_taps_equals_autoregressive():
    """A random DFlash drafter conditioned on the taps of the GDN layer 0 and the attention
    layer 1 (the last, after the final norm)."""
    t = target()
    drafter = ht.random_drafter(t, 16, seed=7, target_layer_ids=(0, 1))
    assert drafter.config.target_layer_ids == (0, 1)
    r = dj.generate(t, PROMPTS, 64, drafter=drafter)  # greedy: a prefix of the reference
    print(f"DFlash drafter: tau {r.tau:.2f}, {r.num_steps} iterations")
    assert r.sequences == [s[:64] for s in reference()]
    assert r.tau > 1  # some drafts accepted: rollbacks that keep more than the anchor


# ---------------------------------------------------------------------------- sampling
# As test_speculative.py's sampling tests: ROWS rows of one prompt, the first DEPTH emitted
# tokens against the exact distribution (prefixes enumerated over a vocabulary of 8), the table
# proposer sampling from the exact next-token distribution at another temperature (q close to
# p: full blocks and every partial acceptance occur). Token 1.. come from the first iteration,
# the rest from the next, which starts from the rolled-back state.
DEPTH, BLOCK, ROWS, ALPHA, Q_TEMPERATURE = 5, 4, 8192, 1e-4, 1.3
SAMPLING_PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def sampling_setup():
    """(correct target, the same weights under the wrong rollback, exact prefix logits)."""
    cfgs = [ht.hybrid_config(kind, vocab_size=8, hidden_size=16, intermediate_size=32, num_heads=2,
                             num_kv_heads=1, linear_num_key_heads=1, linear_num_value_heads=2,
                             layer_types=LAYERS, max_position_embeddings=64, gdn_chunk=2)
            for kind in ("qwen3_5_text", ht.WRONG_TYPE)]
    # a 16-position cache (prompt 3 + 5 new + a block) keeps the many-row batches small
    good = ht.random_target(cfgs[0], seed=7, init_scale=0.5, max_len=16)
    bad = dj.Target(cfgs[1], good.params, max_len=16)
    return good, bad, exact_sampling.PrefixLogits.compute(good, SAMPLING_PROMPT, DEPTH)


def sample(t, prefix_logits):
    drafter = ht.random_drafter(t, BLOCK, seed=8)
    proposer = TableProposer(prefix_logits, q_temperature=Q_TEMPERATURE)
    return dj.generate(t, [SAMPLING_PROMPT] * ROWS, DEPTH, drafter=drafter, proposer=proposer,
                       sampled_draft=True, temperature=1.0, seed=3)


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(sampling_setup):
    good, _, prefix_logits = sampling_setup
    r = sample(good, prefix_logits)
    joint, _ = prefix_logits.joint(1.0)
    report = exact_sampling.fit(r.sequences, joint, ALPHA)
    hist = r.acceptance_histogram
    print(f"hybrid sampling: tau {r.tau:.2f}, histogram {hist.tolist()}, {report}")
    assert not report.rejected, report
    first = np.array([lens[0] for lens in r.acceptance_lengths])  # every first-iteration length
    assert all(np.mean(first == a) > 0.05 for a in range(1, BLOCK + 1)), np.bincount(first)


@pytest.mark.slow
def test_sampling_with_the_wrong_rollback_is_rejected(sampling_setup):
    """Negative control: the same check rejects the whole-block rollback."""
    _, bad, prefix_logits = sampling_setup
    r = sample(bad, prefix_logits)
    report = exact_sampling.fit(r.sequences, prefix_logits.joint(1.0)[0], ALPHA)
    print(f"hybrid sampling, wrong rollback: {report}")
    assert report.rejected, report


# ---------------------------------------------------------------------------- taps
def hf_hybrid(seed: int = 0):
    """A tiny ``Qwen3_5ForCausalLM`` (GDN, attention, GDN; Hv = 2 Hk), weights large enough to
    matter: matrices normal(0.15), conv filters normal(0.4), norms and gates spread."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_conv_kernel_dim=4,
                            max_position_embeddings=128, layer_types=list(ht.LAYER_TYPES))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn_like(p)
            if "conv1d" in name:
                p.copy_(0.4 * noise)
            elif p.ndim == 1:
                p.add_(0.2 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    model = hf_hybrid()
    path = tmp_path_factory.mktemp("hybrid_taps")
    model.save_pretrained(path)
    return model, dj.load_target(str(path))


# rows kept of each 6-row block (the first: the prompt, all kept), per row of the batch
KEEP = [[6, 3, 1, 6, 2, 4], [6, 1, 4, 2, 6, 3]]


@pytest.mark.parametrize("mode", tiered(["replay", "snapshot"], fast=["replay"]))
def test_taps_through_rollbacks_equal_transformers_hidden_states(hf_pair, mode):
    """The engine's view: 6-row blocks through the decode state, each row keeping KEEP[b][i]
    rows (the rest garbage, as rejected drafts are) and rolled back to them; the taps of every
    kept row of layers 0 (GDN), 1 (attention) and 2 (GDN, last: after the final norm) equal
    transformers' ``hidden_states[i + 1]`` at that position of the committed sequence."""
    import torch

    model, loaded = hf_pair
    cfg = dataclasses.replace(loaded.config, gdn_rollback=mode, gdn_chunk=CHUNK[mode] + 1)
    fam = targets.family_of(cfg)
    T, B, D, V = 6, len(KEEP), cfg.hidden_size, cfg.vocab_size
    rng = np.random.default_rng(0)
    committed = rng.integers(0, V, (B, sum(KEEP[0])))
    assert sum(KEEP[1]) == committed.shape[1]
    with torch.no_grad():
        hidden = model(torch.as_tensor(committed), output_hidden_states=True).hidden_states
    want = np.stack([h.numpy() for h in hidden[1:]])  # [3, B, S, D]

    @jax.jit
    def step(params, tokens, state, keep):
        positions = state.lengths[:, None] + jnp.arange(T)[None]
        _, taps, state = fam.forward(cfg, params, tokens, positions, state, tap_layer_ids=(0, 1, 2),
                                     compute_logits=False)
        return taps, state.rollback(state.lengths - T + keep)

    state = fam.init_state(cfg, B, 64, jnp.float32)
    pos = np.zeros(B, int)
    for i in range(len(KEEP[0])):
        keep = np.array([k[i] for k in KEEP])
        block = rng.integers(0, V, (B, T))  # rejected rows: garbage
        for b in range(B):
            block[b, :keep[b]] = committed[b, pos[b]:pos[b] + keep[b]]
        taps, state = step(loaded.params, jnp.asarray(block, jnp.int32), state, jnp.asarray(keep, jnp.int32))
        taps = np.asarray(taps).reshape(B, T, 3, D)
        for b in range(B):
            got = taps[b, :keep[b]].transpose(1, 0, 2)  # [3, kept, D]
            ref = want[:, b, pos[b]:pos[b] + keep[b]]
            err = float(np.max(np.abs(got - ref)))
            assert err < 2e-4, f"{mode}: block {i}, row {b}: taps differ by {err:.3g}"
        pos += keep
    np.testing.assert_array_equal(np.asarray(state.lengths), pos)


# ---------------------------------------------------------------------------- the MoE hybrids
@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_next"])
def test_moe_hybrids_greedy_equals_autoregressive_for_every_accepted_length(model_type):
    """The MoE hybrid families in the loop: bs 4, replay rollback (chunks of 3), every accepted
    length 0..3 in both rows of a ragged batch, 96 new tokens equal to AR."""
    t = ht.moe_hybrid(model_type)
    assert targets.family_of(t.config).model_types[0] == model_type
    new, bs = 96, 4
    ref = dj.generate(t, PROMPTS, new).sequences
    assert all(len(set(s)) > 10 for s in ref), "a degenerate model would not test the state"
    rng = np.random.default_rng(0)
    width = max(map(len, PROMPTS)) + new + bs
    table = rng.integers(0, bs, size=(len(PROMPTS), width)).astype(np.int32)
    rows = np.zeros_like(table)
    for b, (p, r) in enumerate(zip(PROMPTS, ref)):
        rows[b, :len(p) + len(r)] = p + r
    wrong = jnp.asarray(table)
    proposer = ReferenceProposer(rows, lambda start: wrong[jnp.arange(wrong.shape[0]), start])
    r = dj.generate(t, PROMPTS, new, drafter=ht.random_drafter(t, bs, seed=6), proposer=proposer)
    assert r.sequences == ref
    for b, lens in enumerate(r.acceptance_lengths):
        assert {a - 1 for a in lens[:-1]} == set(range(bs)), f"row {b}: {sorted(set(lens))}"
