"""The DFlash drafter's proposals, iteration by iteration, against an independent reference.

Speculative decoding is lossless whatever the drafter proposes, so the greedy
"DFlash == autoregressive" tests (tests/decoding/test_speculative.py) pass with a broken drafter too.
This test checks the proposals themselves: it runs ``dflash_jax.generate`` with a recording
DFlash proposer (``DFlashProposer.propose``, its result unchanged) that copies every
iteration's draft, block start and anchor to the host; then it recomputes every one of those
drafts with a plain ``jnp`` re-implementation of the method (``docs/method.md``, in ``tests/support/drafter_reference.py``) (no Flax module, no engine or model code, no KV cache: the target and
the drafter run from scratch over the committed sequence of that iteration):

  * target taps: decoder-layer outputs ``hidden_states[i + 1]`` of the committed tokens (the
    last layer's after the final norm), causal attention over the whole sequence;
  * drafter: ``c = hidden_norm(fc(taps))`` for the context rows ``0..start-1``; the block
    ``[anchor, MASK * (bs-1)]`` embedded with the target's embedding at positions
    ``start..start+bs-1``; per layer ``x = input_layernorm(h)``, ``q = q_norm(q_proj(x))``,
    ``K = k_norm(k_proj([c ; x]))``, ``V = v_proj([c ; x])``, rotate-half RoPE at each row's
    own position, NON-causal GQA of the block queries over every context row and every block
    row, ``h += o_proj(attn)``, ``h += mlp(post_attention_layernorm(h))``; logits by the
    target's LM head on ``norm(h)`` (the embedding when tied); the draft is the argmax of block
    rows 1..bs-1;
  * ``num_denoise_steps = s > 1``: after pass k < s-1 the most confident still-masked rows
    (confidence = max log-softmax) keep their argmax as the next pass's input, so that
    ``round((bs-1)(k+1)/s)`` rows are fixed; the last pass's argmax fills the others.

Two pairs, each with s = 1 and s = 3, a batch of two ragged prompts, every iteration of each
row (>= 4 per row; its start must be ``prompt_len + sum(acceptance_lengths[:i])`` and its
anchor the committed token there):

  * "random": a tiny random Qwen3 target and 2-layer block-8 drafter (float32), every RMSNorm
    weight randomised (unit weights would hide a swapped or missing norm), taps (1, 3) (the
    last layer included; the default for 4 target + 2 drafter layers is (1, 1)). Its drafts
    are nearly always rejected, so the context grows one row per iteration;
  * "embedded": the shipped pair (trained drafter, block 16, taps (1, 2, 3), tied LM head) in
    float32, on text prompts: blocks are often partly accepted, so several verified rows enter
    the drafter's context at once.

Tokens are compared exactly wherever the reference's decision is clear: the top-2 logit margin
of the pass that decided the row, and for s > 1 every earlier decision that a later pass reads
(the argmax of each fixed row, the confidence gap at each pass's cut), above ``MARGIN``; nearly
all rows must be clear.

Mutation audit (done when the test was written, each in a separate copy of the repository;
every one fails this test): (1) the multi-pass draft keeps the LEAST confident rows
(``argsort(-conf)`` -> ``argsort(conf)`` in the DFlash proposer's ``propose``; fails the s = 3 cases);
(2) the draft block shifted by one position (block positions ``start + 1 + arange(bs)``, or
the draft read from ``h[:, :-1]`` instead of ``h[:, 1:]``); (3) the context keys at the wrong
positions (``pending_pos + 1`` in ``propose``'s ``project_context``, or ``positions + 1`` in
the prefill's, ``init``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj

from support.drafter_reference import MARGIN, RecordingProposer, reference_draft, target_taps, top2_margin
from support.oracle_proposers import randomise_norms
from support.tiers import tiered

MIN_ITERATIONS = 4
S_PAD = 128  # the reference runs on sequences padded to this length (one compiled program)

TINY = dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
EMBEDDED_PROMPTS = ("def fibonacci(n):\n    if n < 2:\n        return n\n",
                    "Question: Natalia sold clips to 48 of her friends in April, and then she "
                    "sold half as many clips in May. How many clips did she sell altogether?\n"
                    "Answer:")
# name: (block size, max new tokens)
PAIRS = {"random": (8, 24), "embedded": (16, 48)}


# ---------------------------------------------------------------------------- models
@functools.lru_cache(maxsize=None)
def pair(name: str):
    """(target, drafter, prompts) of one of ``PAIRS``."""
    if name == "embedded":
        target, drafter = dj.load_embedded(dtype=jnp.float32)
        return target, drafter, [target.tokenizer.encode(p) for p in EMBEDDED_PROMPTS]
    target = dj.Target.random(TINY, seed=0, init_scale=0.35)
    target = dataclasses.replace(target, params=randomise_norms(target.params, jax.random.key(10)))
    drafter = dj.Drafter.random(target, num_layers=2, block_size=PAIRS[name][0], seed=1,
                                init_scale=0.35, target_layer_ids=(1, 3))
    drafter = dataclasses.replace(drafter, params=randomise_norms(drafter.params, jax.random.key(11)))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, TINY.vocab_size - 1, size=n).tolist() for n in (5, 11)]
    return target, drafter, prompts


@pytest.mark.parametrize("steps", tiered([1, 3], fast=[3]))
@pytest.mark.parametrize("name", tiered(PAIRS, fast=["random"]))
def test_drafts_equal_reference_over_consecutive_iterations(name, steps):
    target, drafter, prompts = pair(name)
    bs, max_new = PAIRS[name]
    dcfg = drafter.config
    recorder = RecordingProposer(drafter.config, num_denoise_steps=steps)
    records = recorder.records
    res = dj.generate(target, prompts, max_new, drafter=drafter, block_size=bs, proposer=recorder)
    assert len(records) == max(len(a) for a in res.acceptance_lengths)
    if name == "embedded":  # several verified rows entered the drafter's context at once
        assert sum(a > 2 for acc in res.acceptance_lengths for a in acc) >= 4, res.acceptance_lengths

    rows = clear = 0
    for b, (prompt, seq, acc) in enumerate(zip(prompts, res.sequences, res.acceptance_lengths)):
        assert len(seq) == max_new and len(acc) >= MIN_ITERATIONS, (b, len(seq), acc)
        full = prompt + seq
        assert len(full) <= S_PAD
        tokens = jnp.asarray(np.pad(full, (0, S_PAD - len(full))), jnp.int32)
        taps = target_taps(target.config, target.params, tokens, dcfg.target_layer_ids)
        for i in range(len(acc)):
            start = len(prompt) + sum(acc[:i])
            rec_start, rec_anchor, rec_draft = (r[b] for r in records[i])
            assert (int(rec_start), int(rec_anchor)) == (start, full[start]), (b, i)
            draft, margin, decisive = reference_draft(dcfg, target.params, drafter.params, taps,
                                                      full[start], start, bs, steps)
            ok = (margin > MARGIN) & (decisive > MARGIN)
            rows, clear = rows + ok.size, clear + int(ok.sum())
            np.testing.assert_array_equal(
                rec_draft[ok], draft[ok],
                err_msg=f"prompt {b}, iteration {i} (start {start}, anchor {full[start]}): "
                        f"engine {rec_draft.tolist()}, reference {draft.tolist()}")
    assert clear >= 0.9 * rows, (clear, rows)
