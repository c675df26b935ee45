"""A test-only target family with a recurrent layer: proof that a new architecture is one module
plus one registry line (the line at the bottom), and that the engine's rollback restores a
recurrent state to the one after the accepted row.

The model (``model_type`` "test_recurrent", two decoder layers, plain ``jnp``):

  h = embed(tokens)
  layer 0, GQA attention through a KV cache:  h += o(attn(rope(q(n(h))), rope(k(n(h))), v(n(h))))
  layer 1, a gated linear recurrence (the shape of linear attention's state update):
      x = n(h);  a_t = sigmoid(x_t @ Wa + ba)  (per state channel, input-dependent decay)
      s_t = a_t * s_{t-1} + (1 - a_t) * (x_t @ Wu);   h += s_t @ Wo
  logits = lm_head(norm(h))

Its decode state is a KV cache (layer 0) and a ``RecurrentState`` (layer 1): rollback sets the
cache length and restores the recurrent state after the last kept row. ``WRONG_ROLLBACK`` is the
same family with the bug the rollback test must catch: the state after the WHOLE block is kept.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax import targets
from dflash_jax.nn.cache import KVCache, RecurrentState
from dflash_jax.nn import apply_rope, dot_product_attention, rope_cos_sin
from dflash_jax.targets.base import TargetFamily


def rms(x, w, eps):
    xf = x.astype(jnp.float32)
    return (w * xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)).astype(x.dtype)


@flax.struct.dataclass
class HybridState:
    """Layer 0's KV cache and layer 1's recurrent state."""

    kv: KVCache
    rec: RecurrentState

    @property
    def lengths(self):
        return self.kv.lengths

    def rollback(self, lengths):
        return HybridState(self.kv.rollback(lengths), self.rec.rollback(lengths))


@flax.struct.dataclass
class WholeBlockState(HybridState):
    """The bug: after a verified block (not after the prompt, so that only decoding is
    affected), rollback keeps the recurrent state after the whole block."""

    def rollback(self, lengths):
        lengths = jnp.asarray(lengths, jnp.int32)
        good = self.rec.rollback(lengths)
        if self.rec.snapshots is None:
            return WholeBlockState(self.kv.rollback(lengths), good)
        decoding = (self.rec.start > 0)[None, :, None]
        rec = good.replace(state=jnp.where(decoding, self.rec.snapshots[:, :, -1], good.state))
        return WholeBlockState(self.kv.rollback(lengths), rec)


class RecurrentTestFamily(TargetFamily):
    """Config: a ``TargetConfig`` (``num_layers`` = 2; ``intermediate_size`` = the recurrent
    state width S)."""

    def __init__(self, model_type: str, state_class=HybridState):
        self.model_types = (model_type,)
        self.name = model_type
        self.state_class = state_class

    def check_config(self, cfg) -> None:
        if cfg.num_layers != 2:
            raise ValueError(f"the test_recurrent family has 2 layers, got num_layers={cfg.num_layers}")

    def init_params(self, cfg, key, dtype, init_scale=0.02):
        D, H, Hkv, Dh, S, V = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                               cfg.intermediate_size, cfg.vocab_size)
        shapes = {"embed_tokens": {"embedding": (V, D)}, "lm_head": {"kernel": (D, V)},
                  "attn": {"q": (D, H * Dh), "k": (D, Hkv * Dh), "v": (D, Hkv * Dh), "o": (H * Dh, D)},
                  "rec": {"a": (D, S), "u": (D, S), "o": (S, D)}}
        leaves, tree = jax.tree_util.tree_flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
        keys = jax.random.split(key, len(leaves))
        params = jax.tree_util.tree_unflatten(
            tree, [(init_scale * jax.random.normal(k, s)).astype(dtype) for k, s in zip(keys, leaves)])
        params["rec"]["a_bias"] = jnp.full((S,), 1.0, dtype)  # decay ~0.73: a long memory
        for name in ("norm0", "norm1", "norm"):
            params[name] = jnp.ones((D,), dtype)
        return params

    def init_state(self, cfg, batch, max_len, dtype):
        return self.state_class(KVCache.init(1, batch, max_len, cfg.num_kv_heads, cfg.head_dim, dtype),
                                RecurrentState.init(1, batch, (cfg.intermediate_size,), dtype))

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids=(),
                logit_index=None, compute_logits=True, attention_impl="xla", model_axis=None):
        if model_axis is not None:
            raise ValueError("the test_recurrent family runs on one device")
        B, T = tokens.shape
        H, Hkv, Dh, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        h = jnp.take(params["embed_tokens"]["embedding"], tokens, axis=0)
        # layer 0: attention
        x = rms(h, params["norm0"], eps)
        cos, sin = rope_cos_sin(positions, Dh, cfg.rope)
        p = params["attn"]
        q = apply_rope((x @ p["q"]).reshape(B, T, H, Dh), cos, sin)
        k = apply_rope((x @ p["k"]).reshape(B, T, Hkv, Dh), cos, sin)
        v = (x @ p["v"]).reshape(B, T, Hkv, Dh)
        if state is not None:
            kv = state.kv.write(0, k, v, positions)
            mask = jnp.arange(kv.max_len)[None, None, :] <= positions[:, :, None]
            k, v = kv.k[0], kv.v[0]
        else:
            mask = positions[:, None, :] <= positions[:, :, None]
        h = h + dot_product_attention(q, k, v, mask).reshape(B, T, H * Dh) @ p["o"]
        out0 = h
        # layer 1: gated linear recurrence, the state after every row kept for rollback
        x = rms(h, params["norm1"], eps)
        r = params["rec"]
        a = jax.nn.sigmoid(x @ r["a"] + r["a_bias"])
        u = x @ r["u"]
        s0 = state.rec.state[0] if state is not None else jnp.zeros((B, cfg.intermediate_size), h.dtype)

        def step(s, au):
            a_t, u_t = au
            s = a_t * s + (1 - a_t) * u_t
            return s, s

        _, seq = jax.lax.scan(step, s0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(u, 0, 1)))
        seq = jnp.swapaxes(seq, 0, 1)  # [B, T, S]
        h = h + seq @ r["o"]
        normed = rms(h, params["norm"], eps)
        outs = {0: out0, 1: normed}  # the last layer's tap after the final norm
        taps = (jnp.concatenate([outs[i] for i in tap_layer_ids], -1) if tap_layer_ids else None)
        if state is not None:
            end = positions[:, -1] + 1
            snapshots = jnp.concatenate([s0[:, None], seq], axis=1)[None]  # [1, B, T + 1, S]
            state = self.state_class(kv.crop(end), state.rec.after_block(snapshots, state.lengths, end))
        if not compute_logits:
            return None, taps, state
        if logit_index is not None:
            normed = jnp.take_along_axis(normed, logit_index.astype(jnp.int32)[:, None, None], axis=1)
        return self.lm_head(cfg, params, normed), taps, state


RECURRENT = RecurrentTestFamily("test_recurrent")
WRONG_ROLLBACK = RecurrentTestFamily("test_recurrent_wrong_rollback", WholeBlockState)

targets.register(RECURRENT)  # the registry line
targets.register(WRONG_ROLLBACK)  # the negative control's
