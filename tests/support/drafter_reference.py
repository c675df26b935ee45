"""A plain ``jnp`` re-implementation of the DFlash drafter and the target's taps (``docs/method.md``;
no Flax module, no engine or model code, no KV cache), and a DFlash proposer that records each
iteration's proposal: the oracle of tests/proposers/test_drafter_proposals.py and
tests/models/test_drafter_shapes.py."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.methods.dflash.proposer import DFlashProposer

MARGIN = 1e-4  # a decision closer than this (logits / log-probs) may flip with float rounding


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


def recording(proposer_class, logp: bool = False):
    """``proposer_class`` (a chain proposer dataclass) whose proposals are unchanged but each
    iteration's (block start int32[B], anchor int32[B], draft int32[B, bs-1]) is also copied to
    ``records``, in loop order (with ``logp``, the drafter's log-probability of each draft token
    float32[B, bs-1] as a fourth entry). Compared and hashed by identity, so every instance is
    traced anew with its own list."""

    @dataclasses.dataclass(frozen=True, eq=False)
    class Recording(proposer_class):
        records: list = dataclasses.field(default_factory=list)
        __eq__ = object.__eq__
        __hash__ = object.__hash__

        def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
            proposal, state = super().propose(spec, tparams, params, state, committed, key, want_logp or logp)
            seen = (committed.start, committed.bonus, proposal.tokens) + ((proposal.logp,) if logp else ())
            jax.debug.callback(lambda *xs: self.records.append(tuple(np.asarray(x) for x in xs)), *seen,
                               ordered=True)
            return proposal, state

    Recording.__name__ = Recording.__qualname__ = f"Recording{proposer_class.__name__}"
    return Recording


RecordingProposer = recording(DFlashProposer)


def confidence_of_two_draws(target, drafter, proposer_class, prompts, max_new_tokens: int, **options) -> list:
    """Sampled decoding in which every iteration's proposal is drawn twice from the same state
    with two keys (the first goes on): per iteration (tokens of draw 1, of draw 2, ``logp`` of
    draw 1, of draw 2). A proposer whose sampled confidence reads the drawn tokens gives two
    ``logp`` that differ where the draws do (``proposers.base.Proposal``)."""
    seen = []

    @dataclasses.dataclass(frozen=True, eq=False)
    class TwoDraws(proposer_class):
        __eq__ = object.__eq__
        __hash__ = object.__hash__

        def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
            a, new_state = super().propose(spec, tparams, params, state, committed, key, True)
            b, _ = super().propose(spec, tparams, params, state, committed, jax.random.fold_in(key, 1), True)
            jax.debug.callback(lambda *xs: seen.append([np.asarray(x) for x in xs]),
                               a.tokens, b.tokens, a.logp, b.logp, ordered=True)
            return a, new_state

    import dflash_jax as dj
    dj.generate(target, prompts, max_new_tokens, drafter=drafter, temperature=1.0, sampled_draft=True,
                proposer=TwoDraws(drafter.config, sample=True), **options)
    return seen


def law_target():
    """The vocabulary-8 target the sampled-law tests draw from (``support/exact_sampling.py``
    computes its exact law over every continuation)."""
    import dflash_jax as dj

    cfg = dj.TargetConfig("qwen3", vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=3,
                          num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    return dj.Target(cfg, dj.Target.random(cfg, seed=7, init_scale=0.5).params, max_len=16)


def sampled_law(target, drafter, proposer_class, backbone_logits, *, rows: int = 8192, depth: int = 5,
                block_size: int = 4, prompt=(1, 2, 3), alpha: float = 1e-4, seed: int = 3):
    """Sampled decoding at T = 1 with sampled drafts from ``proposer_class``: 2 x ``rows``
    copies of ``prompt`` in one compiled run, the second group's rejection sampling handed the
    backbone's law (``process_logits`` of ``backbone_logits(proposer, spec, tparams, params,
    state, committed)`` [B, T, V]) instead of the law the tokens were drawn from. Returns (the
    first group's fit to the exact law of the first ``depth`` tokens, the second group's, the
    first group's first-iteration acceptance counts per length)."""
    import dflash_jax as dj
    from dflash_jax.verification.sampling import process_logits
    from support import exact_sampling

    @dataclasses.dataclass(frozen=True, eq=False)
    class BackboneQForSecondGroup(proposer_class):
        __eq__ = object.__eq__
        __hash__ = object.__hash__

        def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
            proposal, new_state = super().propose(spec, tparams, params, state, committed, key, want_logp)
            logits = backbone_logits(self, spec, tparams, params, state, committed)
            backbone = process_logits(logits, spec.sampling, spec.ops)
            wrong = (jnp.arange(logits.shape[0]) >= rows)[:, None, None]
            return proposal._replace(q_logp=jnp.where(wrong, backbone, proposal.q_logp)), new_state

    prefix_logits = exact_sampling.PrefixLogits.compute(target, list(prompt), depth)
    r = dj.generate(target, [list(prompt)] * (2 * rows), depth, drafter=drafter, block_size=block_size,
                    proposer=BackboneQForSecondGroup(drafter.config, sample=True), temperature=1.0,
                    sampled_draft=True, seed=seed)
    joint, _ = prefix_logits.joint(1.0)
    right = exact_sampling.fit(r.sequences[:rows], joint, alpha)
    wrong = exact_sampling.fit(r.sequences[rows:], joint, alpha)
    first = np.bincount([a[0] - 1 for a in r.acceptance_lengths[:rows]], minlength=block_size)
    return right, wrong, first
