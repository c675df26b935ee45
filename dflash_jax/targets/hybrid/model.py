"""The forward pass of a hybrid linear-attention decoder (Qwen3.5 / 3.6 and, with its
projections converted at load time, Qwen3-Next) and its decode state, in plain ``jnp``.

Per layer i (pre-norm; every RMSNorm is zero-centred, ``norm(x) * (1 + w)``, except the GDN
output norm):

  * a GDN layer (``layer_types[i] == "linear_attention"``): ``in_proj_qkv`` -> the causal conv
    and the gated delta rule (``nn.gated_delta.mix``), ``norm(o) * w * silu(in_proj_z x)`` per
    value head (``gated_delta.gated_rms_norm``), ``out_proj``;
  * a full-attention layer: ``q_proj`` of width 2 H Dh, each head's first Dh dims the query and
    the next Dh a gate; q/k norms per head; RoPE over the first ``rotary_dim`` dims of each head
    (rotate-half); GQA attention through the KV cache; the output times ``sigmoid(gate)``
    before ``o_proj``;
  * then the MLP of ``cfg.mlp_kind(i)``: dense SwiGLU, or the Qwen3.5 MoE block
    (``targets.moe.qwen3_5_moe.moe_block``, shared expert included).

Parameter tree (kernels [in, out], the transpose of PyTorch's Linear weights; Lg GDN layers and
La attention layers, each stack in layer order; Ld / Lm layers with the dense / MoE MLP):

  embed_tokens/embedding                          [V, D]
  gdn/input_layernorm/weight                      [Lg, D]    (also post_attention_layernorm)
  gdn/linear_attn/in_proj_qkv/kernel              [Lg, D, C]
  gdn/linear_attn/in_proj_z/kernel                [Lg, D, Hv*dv]
  gdn/linear_attn/in_proj_{a,b}/kernel            [Lg, D, Hv]
  gdn/linear_attn/conv1d/kernel                   [Lg, K, 1, C]  (conv1d.weight [C, 1, K] transposed)
  gdn/linear_attn/{A_log,dt_bias}                 [Lg, Hv]
  gdn/linear_attn/norm/weight                     [Lg, dv]
  gdn/linear_attn/out_proj/kernel                 [Lg, Hv*dv, D]
  attn/input_layernorm/weight                     [La, D]    (also post_attention_layernorm)
  attn/self_attn/q_proj/kernel                    [La, D, 2*H*Dh]  (+ bias with attention_bias)
  attn/self_attn/{k,v}_proj/kernel                [La, D, Hkv*Dh]
  attn/self_attn/o_proj/kernel                    [La, H*Dh, D]
  attn/self_attn/{q,k}_norm/weight                [La, Dh]
  mlp/{gate,up}_proj/kernel, mlp/down_proj/kernel [Ld, D, F], [Ld, F, D]
  moe/...                                         [Lm, ...]  (``qwen3_5_moe`` block tree)
  norm/weight                                     [D]
  lm_head/kernel                                  [D, V]     (absent when tied)

The layers run as one ``lax.scan`` over the repeats of the layer pattern's period
(:func:`layer_period`: Qwen3.5's three GDN layers and one attention layer), and inside one
period a scan per run of consecutive layers of one kind (mixer and MLP), a run of one layer as
a plain call: the compile time is that of one period whatever the depth.

Decode state (:class:`HybridState`): ``kv``, a ``KVCache`` of the La attention layers, and
``gdn``, a ``GatedDeltaState`` of the Lg GDN layers (conv windows, float32 recurrent states and
the last block's record). Rollback crops the cache and restores every GDN layer's state after
the kept row. Which form each GDN layer runs (static choices; both forms agree to float32
rounding and both records roll back exactly):

  * no state (scoring, training): the chunked form, nothing recorded;
  * with a state and T == 1: the recurrence (a one-token step);
  * with a state and 1 < T <= ``gdn_chunk`` (a verify block): the recurrence with snapshots
    when ``gdn_rollback == "snapshot"``, else the chunked form with the replay record;
  * with a state and T > ``gdn_chunk`` (a prompt): the chunked form with the replay record;
  * a tree block (``tree=``): every node's state its root path's (``gated_delta.tree_delta``),
    recorded per node (snapshot: every node's state; replay: its inputs), put in the accepted
    path's order by :meth:`HybridState.compact`.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax.nn import dot_product_attention, gated_delta, rope_cos_sin
from dflash_jax.nn.attention import BLOCK_ATTENTION, check_attention_impl
from dflash_jax.nn import tree_attention
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.tree_attention import TreeAttention
from dflash_jax.nn.head import embed, lm_head
from dflash_jax.nn.layers import apply_rope
from dflash_jax.targets.dense.model import check_forward_inputs, collect_taps, kernel_attention
from dflash_jax.targets.moe.qwen3_5_moe import block_param_shapes, moe_block
from dflash_jax.quantization import dequantize_tree


# ---------------------------------------------------------------------------- the decode state
@flax.struct.dataclass
class HybridState:
    """A hybrid target's decode state: ``kv`` (KVCache [La, B, max_len, Hkv, Dh]) and ``gdn``
    (GatedDeltaState [Lg, B, ...]); ``lengths`` int32[B] the positions held."""

    kv: KVCache
    gdn: gated_delta.GatedDeltaState

    @property
    def lengths(self) -> jax.Array:
        return self.kv.lengths

    @property
    def batch(self) -> int:
        return self.kv.batch

    def rollback(self, lengths) -> "HybridState":
        """Each row's state after its first ``lengths[b]`` positions (between its length before
        the last forward and after it): the cache cropped, every GDN layer's conv window and
        recurrent state restored (``GatedDeltaState.rollback``)."""
        return self.replace(kv=self.kv.rollback(lengths), gdn=self.gdn.rollback(lengths))

    def compact(self, start, source) -> "HybridState":
        """After a tree block (``verification.tree``): the accepted path's K/V moved to slots
        ``start ..`` and the GDN layers' record put in the path's order
        (``GatedDeltaState.compact``); :meth:`rollback` then keeps the path's first rows."""
        return self.replace(kv=self.kv.compact(start, source), gdn=self.gdn.compact(start, source))


def init_state(cfg, batch: int, max_len: int, dtype, state_class=HybridState) -> HybridState:
    """An empty state (lengths 0) for ``batch`` rows of up to ``max_len`` positions."""
    kv = KVCache.init(len(cfg.attention_layers), batch, max_len, cfg.num_kv_heads, cfg.head_dim, dtype)
    gdn = gated_delta.GatedDeltaState.init(
        len(cfg.gdn_layers), batch, cfg.linear_conv_kernel_dim, cfg.conv_channels,
        cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, dtype)
    return state_class(kv=kv, gdn=gdn)


# ---------------------------------------------------------------------------- building blocks
def zc_rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """The zero-centred RMSNorm ``norm(x) * (1 + w)`` over the last axis, in float32, returned
    in x's dtype (transformers' ``Qwen3_5RMSNorm``)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + w.astype(jnp.float32))).astype(x.dtype)


def partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first ``R = cos.shape[-1]`` dims of each head of x [B, T, heads, Dh]
    (rotate-half over those R dims, ``cos/sin`` [B, T, R]); the other dims pass through."""
    R = cos.shape[-1]
    if R == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return jnp.concatenate([apply_rope(x[..., :R], cos, sin), x[..., R:]], axis=-1)


def _dense(x, p, model_axis: str | None = None):
    """``x @ kernel + bias``; ``model_axis``: the kernel's rows are split over that mesh axis
    (a row-parallel projection): the partial products are summed with one ``psum``, then the
    (replicated) bias is added once."""
    y = jnp.dot(x, p["kernel"].astype(x.dtype))
    if model_axis is not None:
        y = jax.lax.psum(y, model_axis)
    return y + p["bias"].astype(y.dtype) if "bias" in p else y


def swiglu(x, p, model_axis: str | None = None):
    """The dense MLP ``down(silu(gate x) * up x)`` (``model_axis``: its width split over it)."""
    return _dense(jax.nn.silu(_dense(x, p["gate_proj"])) * _dense(x, p["up_proj"]), p["down_proj"], model_axis)


def mlp(cfg, kind: str, p, x, moe_impl: str = "auto", model_axis=None, expert_axis=None):
    """Layer MLP of ``kind`` (``cfg.mlp_kind``) on x [B, T, D]."""
    if kind == "moe":
        return moe_block(cfg.moe, p, x, impl=moe_impl, model_axis=model_axis, expert_axis=expert_axis)
    return swiglu(x, p, model_axis)


def gdn_form(cfg, T: int, has_state: bool, tree: bool = False) -> tuple[str, bool]:
    """(form, record) of the GDN layers for a block of T rows (module docstring); a tree block
    records every node's state (``"recurrent"``) in snapshot mode, its inputs (``"chunked"``)
    in replay mode (``nn.gated_delta.mix``)."""
    if tree:
        return ("recurrent" if cfg.gdn_rollback == "snapshot" else "chunked"), True
    if not has_state:
        return "chunked", False
    if T == 1 or (T <= cfg.gdn_chunk and cfg.gdn_rollback == "snapshot"):
        return "recurrent", True
    return "chunked", True


def gdn_mixer(cfg, p, x, window, state0, form: str, record: bool, tree=None, model_axis=None):
    """A GDN layer's token mixing on normed x [B, T, D] with its ``linear_attn`` parameters:
    returns (y [B, T, D], the layer's ``BlockRecord`` or None). ``window`` [B, K-1, C],
    ``state0`` float32[B, Hv, dk, dv]: the layer's state before the block (None: a start);
    ``tree``: (visible, depth) of a tree block (``gated_delta.mix``). ``model_axis``: the
    layer's key heads (with their value heads, conv channels and gates) are split over it
    (``cfg`` the shard's), ``out_proj`` is row-parallel."""
    B, T, _ = x.shape
    Hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    qkv = _dense(x, p["in_proj_qkv"])
    z = _dense(x, p["in_proj_z"]).reshape(B, T, Hv, dv)
    b = _dense(x, p["in_proj_b"])
    a = _dense(x, p["in_proj_a"])
    o, rec = gated_delta.mix(
        qkv, a, b, conv_weight=p["conv1d"]["kernel"][:, 0, :], A_log=p["A_log"], dt_bias=p["dt_bias"],
        num_k_heads=cfg.linear_num_key_heads, head_k_dim=cfg.linear_key_head_dim,
        num_v_heads=Hv, head_v_dim=dv, window=window, state0=state0, form=form, record=record,
        chunk_size=cfg.gdn_chunk, impl=cfg.gdn_impl, tree=tree)
    o = gated_delta.gated_rms_norm(o, z, p["norm"]["weight"], cfg.rms_norm_eps)
    return _dense(o.reshape(B, T, Hv * dv).astype(x.dtype), p["out_proj"], model_axis), rec


def attention_mixer(cfg, p, x, cos, sin, positions, mask, cache: KVCache | None, index,
                    attention_impl: str = "xla", tree_visible=None, model_axis=None):
    """A gated full-attention layer on normed x [B, T, D] with its ``self_attn`` parameters,
    through attention layer ``index`` of ``cache`` (or over the block alone). Returns
    (y [B, T, D], cache). ``tree_visible`` bool[B, T, T]: a tree block's ancestor mask (``mask``
    is then the tree's over the cache; a kernel sees the block's own rows under it).
    ``model_axis``: heads split over it (``cfg`` the shard's), ``o_proj`` row-parallel."""
    B, T, _ = x.shape
    H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qg = _dense(x, p["q_proj"]).reshape(B, T, H, 2 * Dh)
    q, gate = qg[..., :Dh], qg[..., Dh:].reshape(B, T, H * Dh)
    k = _dense(x, p["k_proj"]).reshape(B, T, Hkv, Dh)
    v = _dense(x, p["v_proj"]).reshape(B, T, Hkv, Dh)
    q = partial_rope(zc_rms_norm(q, p["q_norm"]["weight"], cfg.rms_norm_eps), cos, sin)
    k = partial_rope(zc_rms_norm(k, p["k_norm"]["weight"], cfg.rms_norm_eps), cos, sin)
    if cache is not None:
        cache = cache.write(index, k, v, positions)
        if attention_impl in BLOCK_ATTENTION:  # positions: start + arange(T)
            out = kernel_attention(attention_impl, q, k, v, cache, positions, index, tree_visible)
        else:
            out = dot_product_attention(q, cache.k[index], cache.v[index], mask)
    else:
        out = dot_product_attention(q, k, v, mask)
    out = out.reshape(B, T, H * Dh) * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
    return _dense(out, p["o_proj"], model_axis), cache


# ---------------------------------------------------------------------------- layer runs
def layer_runs(cfg, num_layers: int | None = None) -> list[tuple[tuple[str, str], int, int]]:
    """``((mixer kind, MLP kind), first layer, end layer)`` of every maximal run of consecutive
    layers of one kind among the first ``num_layers`` (default all), in order."""
    runs: list[tuple[tuple[str, str], int, int]] = []
    for i in range(cfg.num_layers if num_layers is None else num_layers):
        kinds = cfg.layer_kinds(i)
        if runs and runs[-1][0] == kinds:
            runs[-1] = (kinds, runs[-1][1], i + 1)
        else:
            runs.append((kinds, i, i + 1))
    return runs


def layer_period(cfg) -> int:
    """The smallest p dividing N such that layer i has the kinds of layer ``i % p`` (4 for
    Qwen3.5's three GDN layers and one attention layer; N when the pattern does not repeat):
    the forward scans over the N / p periods, so its compile time is that of one period."""
    kinds = [cfg.layer_kinds(i) for i in range(cfg.num_layers)]
    return next(p for p in range(1, cfg.num_layers + 1)
                if cfg.num_layers % p == 0 and all(kinds[i] == kinds[i % p] for i in range(cfg.num_layers)))


def stack_sizes(cfg, period: int) -> dict[str, int]:
    """{parameter stack (``gdn``, ``attn``, ``mlp``, ``moe``): its layers in one period}."""
    sizes: dict[str, int] = {}
    for i in range(period):
        for kind in cfg.layer_kinds(i):
            sizes[kind] = sizes.get(kind, 0) + 1
    return sizes


def _take(tree, lo: int, n: int):
    return jax.tree_util.tree_map(lambda x: x if (lo == 0 and x.shape[0] == n) else x[lo:lo + n], tree)


def _index(tree, i: int):
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def forward(cfg, params, tokens, positions, state: HybridState | None = None, *,
            tap_layer_ids: Sequence[int] = (), logit_index=None, compute_logits: bool = True,
            attention_impl: str = "xla", model_axis: str | None = None,
            expert_axis: str | None = None, moe_impl: str = "auto", tree: TreeAttention | None = None):
    """One causal pass (``TargetFamily.forward``): tokens, positions int32[B, T] (with a state:
    ``state.lengths + arange(T)``; ``tree``: the block is a tree of drafts, node t at slot
    ``positions[:, t]``, rotated to ``tree.positions``, its GDN state its root path's
    (``nn.gated_delta.tree_delta``), compacted to the accepted path by ``HybridState.compact``). Returns ``(logits float32[B, T, V] | [B, 1, V] | None,
    taps [B, T, k*D] | None, state)``; the taps are transformers' ``hidden_states[i + 1]``
    (the last layer's after the final norm) of GDN and attention layers alike; the state holds
    the block (``lengths = positions[:, -1] + 1``) and rolls back to any length from the one it
    had on entry (``HybridState.rollback``)."""
    check_attention_impl(attention_impl)
    tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
    check_forward_inputs(cfg, tokens, positions, tap_layer_ids)
    B, T = tokens.shape
    if state is not None and state.batch != B:
        raise ValueError(f"state batch {state.batch} != tokens batch {B}")
    h = embed(params, tokens, model_axis)
    cos, sin = rope_cos_sin(positions if tree is None else tree.positions, cfg.rotary_dim, cfg.rope)
    cache = None if state is None else state.kv
    gdn_tree = None
    if tree is not None:
        if cache is None:
            raise ValueError("a tree block is verified through a decode state: pass one")
        tree.check(positions)
        mask = tree_attention.cache_mask(positions, tree, cache.max_len)
        gdn_tree = (tree.visible, tree.positions - positions[:, :1])  # (ancestors, depth)
    elif cache is not None:
        mask = jnp.arange(cache.max_len)[None, None, :] <= positions[:, :, None]
    else:
        mask = positions[:, None, :] <= positions[:, :, None]
    K = len(tap_layer_ids)
    taps = jnp.zeros((K, B, T, cfg.hidden_size), h.dtype) if K else None
    form, record = gdn_form(cfg, T, state is not None, tree is not None)
    eps = cfg.rms_norm_eps
    mlp_opts = dict(moe_impl=moe_impl, model_axis=model_axis, expert_axis=expert_axis)

    def tap(taps, h, layer):
        if not K:
            return taps
        hit = (jnp.asarray(tap_layer_ids) == layer)[:, None, None, None]
        return jnp.where(hit, h[None].astype(taps.dtype), taps)

    def finish(lp, mlp_kind, mp, h, y):
        h = h + y.astype(h.dtype)
        x = zc_rms_norm(h, lp["post_attention_layernorm"]["weight"], eps)
        return h + mlp(cfg, mlp_kind, mp, x, **mlp_opts).astype(h.dtype)

    def gdn_layer(carry, xs, mlp_kind):
        h, taps, layer = carry
        lp, mp, window, s0 = xs
        lp, mp = dequantize_tree((lp, mp), h)  # a quantized layer's matrices, in its own step (dflash_jax.quantization)
        y, rec = gdn_mixer(cfg, lp["linear_attn"], zc_rms_norm(h, lp["input_layernorm"]["weight"], eps),
                           window, s0, form, record, gdn_tree, model_axis)
        h = finish(lp, mlp_kind, mp, h, y)
        return (h, tap(taps, h, layer), layer + 1), rec

    def attn_layer(carry, xs, mlp_kind):
        h, cache, taps, layer, index = carry
        lp, mp = xs
        lp, mp = dequantize_tree((lp, mp), h)  # as in gdn_layer
        y, cache = attention_mixer(cfg, lp["self_attn"], zc_rms_norm(h, lp["input_layernorm"]["weight"], eps),
                                   cos, sin, positions, mask, cache, index, attention_impl,
                                   None if tree is None else tree.visible, model_axis)
        h = finish(lp, mlp_kind, mp, h, y)
        return (h, cache, tap(taps, h, layer), layer + 1, index + 1), None

    gdn = None if state is None else state.gdn
    period = layer_period(cfg)
    R = cfg.num_layers // period
    sizes = stack_sizes(cfg, period)  # stack name -> its layers in one period
    per_period = lambda x, n: x.reshape((R, n) + x.shape[1:])
    xs = ({k: jax.tree_util.tree_map(lambda x, n=n: per_period(x, n), params[k]) for k, n in sizes.items()},
          None if gdn is None else per_period(gdn.conv, sizes["gdn"]),
          None if gdn is None else per_period(gdn.ssm, sizes["gdn"]))

    def one_period(carry, xs):
        """The layers of one period (runs of one kind: a scan each, or a call for one layer)."""
        stacks, conv, ssm = xs
        h, cache, taps, layer, index = carry
        records = []
        for (mixer, mlp_kind), first, end in layer_runs(cfg, period):
            n = end - first
            j, m = cfg.stack_index(first)
            lp, mp = _take(stacks[mixer], j, n), _take(stacks[mlp_kind], m, n)
            if mixer == "gdn":
                win = None if conv is None else conv[j:j + n]
                s0 = None if ssm is None else ssm[j:j + n]
                step = lambda c, x, k=mlp_kind: gdn_layer(c, x, k)
                if n == 1:
                    (h, taps, layer), rec = step((h, taps, layer), _index((lp, mp, win, s0), 0))
                    rec = jax.tree_util.tree_map(lambda x: x[None], rec)
                else:
                    (h, taps, layer), rec = jax.lax.scan(step, (h, taps, layer), (lp, mp, win, s0))
                records.append(rec)
            else:
                step = lambda c, x, k=mlp_kind: attn_layer(c, x, k)
                c = (h, cache, taps, layer, index)
                if n == 1:
                    c, _ = step(c, _index((lp, mp), 0))
                else:
                    c, _ = jax.lax.scan(step, c, (lp, mp))
                h, cache, taps, layer, index = c
        rec = jax.tree_util.tree_map(lambda *r: jnp.concatenate(r), *records) if records else None
        return (h, cache, taps, layer, index), rec

    carry = (h, cache, taps, jnp.int32(0), jnp.int32(0))
    (h, cache, taps, _, _), records = jax.lax.scan(one_period, carry, xs)
    if state is not None:
        lengths = positions[:, -1] + 1
        gdn = state.gdn
        if records is not None:  # [R, layers per period, ...] -> [Lg, ...] in layer order
            stacked = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), records)
            gdn = gdn.after_block(stacked, state.lengths, lengths)
        else:
            gdn = gdn.replace(start=state.lengths, lengths=lengths)
        state = state.replace(kv=cache.crop(lengths), gdn=gdn)
    final_norm = lambda x: zc_rms_norm(x, params["norm"]["weight"], eps)
    taps = collect_taps(taps, lambda: final_norm(h), tap_layer_ids, cfg.num_layers)
    if not compute_logits:
        return None, taps, state
    if logit_index is not None:
        h = jnp.take_along_axis(h, logit_index.astype(jnp.int32)[:, None, None], axis=1)
    return lm_head(cfg, params, final_norm(h)), taps, state


# ---------------------------------------------------------------------------- parameters
STACKS = ("gdn", "attn", "mlp", "moe")
"""The parameter tree's stacks of layers (a leading layer axis each)."""


def param_shapes(cfg) -> dict:
    """The parameter tree with each leaf's shape (module docstring)."""
    D, V, H, Hkv, Dh = cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    Hv, dv, C, K = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.conv_channels,
                    cfg.linear_conv_kernel_dim)
    Lg, La = len(cfg.gdn_layers), len(cfg.attention_layers)
    kinds = [cfg.mlp_kind(i) for i in range(cfg.num_layers)]
    Ld, Lm = kinds.count("mlp"), kinds.count("moe")
    norms = lambda L: {"input_layernorm": {"weight": (L, D)}, "post_attention_layernorm": {"weight": (L, D)}}
    tree: dict = {"embed_tokens": {"embedding": (V, D)}, "norm": {"weight": (D,)}}
    if Lg:
        tree["gdn"] = {**norms(Lg), "linear_attn": {
            "in_proj_qkv": {"kernel": (Lg, D, C)}, "in_proj_z": {"kernel": (Lg, D, Hv * dv)},
            "in_proj_a": {"kernel": (Lg, D, Hv)}, "in_proj_b": {"kernel": (Lg, D, Hv)},
            "conv1d": {"kernel": (Lg, K, 1, C)}, "A_log": (Lg, Hv), "dt_bias": (Lg, Hv),
            "norm": {"weight": (Lg, dv)}, "out_proj": {"kernel": (Lg, Hv * dv, D)}}}
    if La:
        attn = {"q_proj": {"kernel": (La, D, 2 * H * Dh)}, "k_proj": {"kernel": (La, D, Hkv * Dh)},
                "v_proj": {"kernel": (La, D, Hkv * Dh)}, "o_proj": {"kernel": (La, H * Dh, D)},
                "q_norm": {"weight": (La, Dh)}, "k_norm": {"weight": (La, Dh)}}
        if cfg.attention_bias:
            for name, width in (("q_proj", 2 * H * Dh), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh),
                                ("o_proj", D)):
                attn[name]["bias"] = (La, width)
        tree["attn"] = {**norms(La), "self_attn": attn}
    if Ld:
        F = cfg.intermediate_size
        tree["mlp"] = {"gate_proj": {"kernel": (Ld, D, F)}, "up_proj": {"kernel": (Ld, D, F)},
                       "down_proj": {"kernel": (Ld, F, D)}}
    if Lm:
        tree["moe"] = jax.tree_util.tree_map(lambda s: (Lm,) + s, block_param_shapes(cfg.moe),
                                             is_leaf=lambda v: isinstance(v, tuple))
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = {"kernel": (D, V)}
    return tree


def init_params(cfg, key: jax.Array, dtype=jnp.float32, init_scale: float = 0.02):
    """Random parameters in ``dtype``, drawn under ``jit``: matrices normal(``init_scale``),
    the conv filters normal(``K ** -0.5``), the zero-centred norms 0 (scale 1), the GDN output
    norm 1, ``dt_bias`` 1 and ``A_log = log(uniform(1, 16))`` (transformers' init ranges)."""
    shapes = param_shapes(cfg)
    is_shape = lambda v: isinstance(v, tuple)
    K = cfg.linear_conv_kernel_dim

    def init(k):
        leaves, tree = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_shape)
        keys = jax.random.split(k, len(leaves))
        out = []
        for (path, shape), kk in zip(leaves, keys):
            name = jax.tree_util.keystr(path)
            if "linear_attn']['norm" in name:
                x = jnp.ones(shape, jnp.float32)
            elif name.endswith("['weight']") or name.endswith("['bias']"):
                x = jnp.zeros(shape, jnp.float32)
            elif "dt_bias" in name:
                x = jnp.ones(shape, jnp.float32)
            elif "A_log" in name:
                x = jnp.log(jax.random.uniform(kk, shape, jnp.float32, 1.0, 16.0))
            elif "conv1d" in name:
                x = K ** -0.5 * jax.random.normal(kk, shape, jnp.float32)
            else:
                x = init_scale * jax.random.normal(kk, shape, jnp.float32)
            out.append(x.astype(dtype))
        return jax.tree_util.tree_unflatten(tree, out)

    return jax.jit(init)(key)
