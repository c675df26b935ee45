"""The DFlash drafter's proposals, iteration by iteration, against an independent reference.

Speculative decoding is lossless whatever the drafter proposes, so the greedy
"DFlash == autoregressive" tests (tests/test_speculative.py) pass with a broken drafter too.
This test checks the proposals themselves: it runs ``dflash_jax.generate`` with a recording
DFlash proposer (``DFlashProposer.propose``, its result unchanged) that copies every
iteration's draft, block start and anchor to the host; then it recomputes every one of those
drafts with a plain ``jnp`` re-implementation of the method (``docs/method.md``) written here (no Flax module, no engine or model code, no KV cache: the target and
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
from dflash_jax.proposers import DFlashProposer

from oracle_proposers import randomise_norms

MARGIN = 1e-4  # a decision closer than this (logits / log-probs) may flip with float rounding
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


# ---------------------------------------------------------------------------- the reference
def rms_norm(x, weight, eps):
    x = x.astype(jnp.float32)
    return weight * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(x, positions, theta):
    """Rotate-half RoPE (default scaling) of x [T, heads, Dh] at integer positions [T]."""
    dh = x.shape[-1]
    inv_freq = jnp.asarray(1.0 / theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh), jnp.float32)
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
    x1, x2 = x[..., :dh // 2], x[..., dh // 2:]
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def attention(q, k, v, visible):
    """GQA: q [T, H, Dh], k/v [S, Hkv, Dh] (query head h reads kv head h // (H / Hkv)),
    visible bool[T, S]; scale 1/sqrt(Dh)."""
    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(q.shape[-1])
    scores = jnp.where(visible[None], scores, -jnp.inf)
    return jnp.einsum("hts,shd->thd", jax.nn.softmax(scores, axis=-1), v)


def swiglu(p, x):
    return (jax.nn.silu(x @ p["gate_proj"]["kernel"]) * (x @ p["up_proj"]["kernel"])) @ p["down_proj"]["kernel"]


def layer_params(params, j):
    return jax.tree_util.tree_map(lambda a: a[j], params["layers"])


def lm_head_kernel(tparams):
    """[D, V]: the target's LM head (its embedding, transposed, when tied)."""
    return tparams["lm_head"]["kernel"] if "lm_head" in tparams else tparams["embed_tokens"]["embedding"].T


@functools.partial(jax.jit, static_argnames=("cfg", "tap_ids"))
def target_taps(cfg, params, tokens, tap_ids):
    """[S, k*D]: the tapped decoder-layer outputs of one sequence tokens int32[S] (causal, so
    rows past the sequence's end change nothing before it); the last layer's after the final
    norm (transformers' ``hidden_states[i + 1]``)."""
    S = tokens.shape[0]
    pos = jnp.arange(S)
    H, Hkv, Dh, eps, theta = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.rope.theta
    h = params["embed_tokens"]["embedding"][tokens]
    outs = []
    for j in range(cfg.num_layers):
        p = layer_params(params, j)
        a = p["self_attn"]
        x = rms_norm(h, p["input_layernorm"]["weight"], eps)
        q = (x @ a["q_proj"]["kernel"]).reshape(S, H, Dh)
        k = (x @ a["k_proj"]["kernel"]).reshape(S, Hkv, Dh)
        v = (x @ a["v_proj"]["kernel"]).reshape(S, Hkv, Dh)
        q, k = rms_norm(q, a["q_norm"]["weight"], eps), rms_norm(k, a["k_norm"]["weight"], eps)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        causal = pos[None, :] <= pos[:, None]
        h = h + attention(q, k, v, causal).reshape(S, H * Dh) @ a["o_proj"]["kernel"]
        h = h + swiglu(p["mlp"], rms_norm(h, p["post_attention_layernorm"]["weight"], eps))
        outs.append(h)
    outs[-1] = rms_norm(outs[-1], params["norm"]["weight"], eps)
    return jnp.concatenate([outs[i] for i in tap_ids], axis=-1)


@functools.partial(jax.jit, static_argnames=("dcfg",))
def draft_logits(dcfg, tparams, dparams, taps, start, block):
    """float32[bs-1, V]: the drafter's logits at block rows 1..bs-1 for the block tokens
    int32[bs] at positions start..start+bs-1, the context being the rows 0..start-1 of
    taps [S, k*D] (the rows from ``start`` on are not seen)."""
    eps, theta = dcfg.rms_norm_eps, dcfg.rope.theta
    H, Hkv, Dh = dcfg.num_heads, dcfg.num_kv_heads, dcfg.head_dim
    S, bs = taps.shape[0], block.shape[0]
    c = rms_norm(taps @ dparams["fc"]["kernel"], dparams["hidden_norm"]["weight"], eps)
    ctx_pos, blk_pos = jnp.arange(S), start + jnp.arange(bs)
    visible = jnp.concatenate([jnp.broadcast_to(ctx_pos < start, (bs, S)), jnp.ones((bs, bs), bool)], axis=1)
    h = tparams["embed_tokens"]["embedding"][block]
    for j in range(dcfg.num_layers):
        p = layer_params(dparams, j)
        a = p["self_attn"]
        x = rms_norm(h, p["input_layernorm"]["weight"], eps)
        q = rms_norm((x @ a["q_proj"]["kernel"]).reshape(bs, H, Dh), a["q_norm"]["weight"], eps)
        rows = jnp.concatenate([c, x])  # context rows, then block rows: the same k/v projections
        k = rms_norm((rows @ a["k_proj"]["kernel"]).reshape(S + bs, Hkv, Dh), a["k_norm"]["weight"], eps)
        v = (rows @ a["v_proj"]["kernel"]).reshape(S + bs, Hkv, Dh)
        q, k = rope(q, blk_pos, theta), rope(k, jnp.concatenate([ctx_pos, blk_pos]), theta)
        h = h + attention(q, k, v, visible).reshape(bs, H * Dh) @ a["o_proj"]["kernel"]
        h = h + swiglu(p["mlp"], rms_norm(h, p["post_attention_layernorm"]["weight"], eps))
    return (rms_norm(h, dparams["norm"]["weight"], eps) @ lm_head_kernel(tparams))[1:]


def top2_margin(logits):
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def reference_draft(dcfg, tparams, dparams, taps, anchor, start, bs, steps):
    """One draft from scratch. Returns (draft int[bs-1]; per-row margin float[bs-1]: the top-2
    logit gap of the pass that decided the row; the iteration's margin: the smallest gap of
    the decisions later passes read (a fixed row's argmax, the confidence at each pass's cut),
    inf for one pass)."""
    fill = np.full(bs - 1, dcfg.mask_token_id)
    filled = np.zeros(bs - 1, bool)
    margin = np.full(bs - 1, np.inf)
    decisive = np.inf
    for step in range(steps):
        block = jnp.asarray(np.concatenate([[anchor], fill]), jnp.int32)
        logits = np.asarray(draft_logits(dcfg, tparams, dparams, taps, jnp.int32(start), block))
        if step == steps - 1:
            break
        pred = logits.argmax(-1)
        conf = np.asarray(jnp.max(jax.nn.log_softmax(jnp.asarray(logits)), axis=-1))
        open_rows = np.flatnonzero(~filled)
        order = open_rows[np.argsort(-conf[open_rows], kind="stable")]
        n_new = round((bs - 1) * (step + 1) / steps) - int(filled.sum())
        chosen = order[:n_new]
        if 0 < n_new < len(order):  # the cut between the last row fixed and the first left masked
            decisive = min(decisive, conf[order[n_new - 1]] - conf[order[n_new]])
        gaps = top2_margin(logits)
        fill[chosen], filled[chosen], margin[chosen] = pred[chosen], True, gaps[chosen]
        decisive = min([decisive, *gaps[chosen]])
    margin = np.where(filled, margin, top2_margin(logits))
    return np.where(filled, fill, logits.argmax(-1)), margin, decisive


# ---------------------------------------------------------------------------- the test
@dataclasses.dataclass(frozen=True, eq=False)
class RecordingProposer(DFlashProposer):
    """The DFlash proposer (its proposals unchanged) that also copies each iteration's (block
    start int32[B], anchor int32[B], draft int32[B, bs-1]) to ``records``, in loop order.
    Compared and hashed by identity, so every instance is traced anew with its own list."""

    records: list = dataclasses.field(default_factory=list)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        proposal, state = super().propose(spec, tparams, params, state, committed, key, want_logp)
        jax.debug.callback(lambda *xs: self.records.append(tuple(np.asarray(x) for x in xs)),
                           committed.start, committed.bonus, proposal.tokens, ordered=True)
        return proposal, state


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("name", list(PAIRS))
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
