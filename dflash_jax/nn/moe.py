"""Mixture-of-experts building blocks: routers and the routed-expert FFN (pure functions over
arrays; ``docs/targets.md``, section "Mixture-of-experts targets").

Routers take the router logits ``float32[N, E]`` (the caller's matmul, bias included) and
return ``(weights float32[N, k], expert_ids int32[N, k])``:

- :func:`route_softmax_topk`: softmax over all ``E`` experts, then the top ``k``, optionally
  renormalised to sum 1 (Qwen3-MoE's ``norm_topk_prob``; always for the Qwen3.5 MoE);
- :func:`route_topk_softmax`: top ``k`` of the logits, then a softmax over those ``k``
  (gpt-oss).

:func:`moe_ffn` runs the routed experts: ``y[n] = sum_j weights[n, j] * FFN_{ids[n, j]}(x[n])``
with ``FFN_e(x) = down_e(act(x @ W1_e + b1_e)) + b2_e``. ``W1`` is either one fused
``gate_up`` array ``[E, D, 2F]`` (whose column order the activation knows: halves for
:func:`swiglu`, interleaved for gpt-oss) or separate ``gate`` / ``up`` arrays ``[E, D, F]``
(then the activation sees ``concat([x @ gate_e, x @ up_e], -1)``, the halves layout). Two
implementations give the same result:

- ``"ragged"``: the token-expert pairs sorted by expert and one grouped matmul
  (``jax.lax.ragged_dot``) per projection over all local experts (prefill, long blocks);
- ``"gather"``: the pairs' expert matrices gathered (``w[ids]``) and batched matmuls: reads only
  the active experts' weights, for few rows (decode);
- ``"dense"``: every row through every local expert, each expert's weights read once, the
  outputs combined with the routing weights (zero for experts a row does not route to). Once the
  pairs outnumber the experts (a verify block: 16 rows x k = 4 of 32 experts already reach
  28 of them), gathering copies experts several times over, and on CPU ``ragged_dot`` lowers to
  a masked product over every expert for every pair anyway.

``impl="auto"``: ``"gather"`` while the pairs ``N * k`` are fewer than the local experts and at
most ``gather_max_pairs``; otherwise ``"dense"`` on CPU and ``"ragged"`` (a grouped GEMM) on an
accelerator.

Expert parallelism: under ``shard_map`` with the expert dimension split over a mesh axis, call
:func:`moe_ffn` with the LOCAL experts' weights ``[E_local, ...]`` and
``expert_offset = axis_index * E_local`` (the global id of local expert 0; may be traced): pairs
routed to experts outside ``[expert_offset, expert_offset + E_local)`` contribute exactly zero
(biases included), so the caller's ``psum`` over the expert axis gives the full output. The
routing itself (router matmul and top-k) is computed on every shard from the full router.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Activation = Callable[[jax.Array], jax.Array]
"""``act(h[..., 2F]) -> [..., F]``: the expert's nonlinearity on the first projection's output
(bias added)."""


# ---------------------------------------------------------------------------------- routers
def route_softmax_topk(logits: jax.Array, k: int, normalize: bool):
    """Softmax over all experts, then the top ``k`` (Qwen3-MoE, Qwen3.5 MoE).

    logits: float[N, E] (computed in float32). ``normalize``: divide the ``k`` weights by their
    sum (Qwen3-MoE's ``norm_topk_prob``). Returns ``(weights float32[N, k], expert_ids
    int32[N, k])``, best first."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, ids.astype(jnp.int32)


def route_topk_softmax(logits: jax.Array, k: int):
    """Top ``k`` of the logits, then a softmax over those ``k`` (gpt-oss; a router bias is
    part of the caller's ``logits``).

    logits: float[N, E]. Returns ``(weights float32[N, k], expert_ids int32[N, k])``, best
    first."""
    top, ids = jax.lax.top_k(logits.astype(jnp.float32), k)
    return jax.nn.softmax(top, axis=-1), ids.astype(jnp.int32)


def route_sigmoid_group_topk(logits: jax.Array, bias: jax.Array, k: int, n_group: int,
                             topk_group: int, normalize: bool, scaling: float = 1.0):
    """DeepSeek-V3's router (``topk_method`` ``noaux_tc``, ``scoring_func`` ``sigmoid``;
    Kimi-K2.x): sigmoid scores; the choice is made on the scores plus the load-balancing
    ``bias`` float32[E] (``e_score_correction_bias``), which never enters the weights.

    Group-limited: the E experts form ``n_group`` equal groups, each scored by the sum of its two
    best biased scores; only the ``topk_group`` best groups stay eligible, and the ``k`` best
    eligible experts are chosen. Weights: the chosen experts' unbiased scores, divided by their sum
    (+1e-20) when ``normalize`` (``norm_topk_prob``), times ``scaling``
    (``routed_scaling_factor``).

    logits: float[N, E] (computed in float32). Returns ``(weights float32[N, k], expert_ids
    int32[N, k])``, best (by biased score) first."""
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    choice = scores + bias.astype(jnp.float32)
    n, e = choice.shape
    if n_group > 1:
        grouped = choice.reshape(n, n_group, e // n_group)
        group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, n_group]
        _, best = jax.lax.top_k(group_scores, topk_group)
        keep = jnp.zeros((n, n_group), bool).at[jnp.arange(n)[:, None], best].set(True)
        choice = jnp.where(jnp.repeat(keep, e // n_group, axis=-1), choice, -jnp.inf)
    _, ids = jax.lax.top_k(choice, k)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if normalize:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * scaling, ids.astype(jnp.int32)


# ---------------------------------------------------------------------------------- activations
def swiglu(h: jax.Array) -> jax.Array:
    """``silu(gate) * up`` of ``h[..., 2F] = [gate | up]`` (halves; Qwen's fused
    ``gate_up_proj`` order and the separate gate / up layout) -> [..., F]."""
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up


# ---------------------------------------------------------------------------------- the FFN
def moe_ffn(x: jax.Array, weights: jax.Array, expert_ids: jax.Array, *, down: jax.Array,
            gate_up: jax.Array | None = None, gate: jax.Array | None = None,
            up: jax.Array | None = None, gate_up_bias: jax.Array | None = None,
            down_bias: jax.Array | None = None, activation: Activation = swiglu,
            expert_offset: int | jax.Array = 0, impl: str = "auto",
            gather_max_pairs: int = 64) -> jax.Array:
    """The routed experts' weighted sum for every row of ``x``.

    x: [..., D] (leading dims flattened to N rows). weights: float[..., k], expert_ids:
    int[..., k] (a router's output, global expert ids). Expert weights, ``E`` = the local
    expert count: ``gate_up`` [E, D, 2F], or ``gate`` and ``up`` [E, D, F] (one of the two
    layouts); ``down`` [E, F, D]; optional ``gate_up_bias`` [E, 2F] (in ``gate_up``'s column
    order; with separate gate / up: ``[gate bias | up bias]``) and ``down_bias`` [E, D].
    ``activation``: ``act(h[..., 2F]) -> [..., F]`` (default :func:`swiglu`).
    ``expert_offset``: global id of local expert 0 (expert parallelism; module docstring).
    ``impl``: ``"ragged"``, ``"gather"``, ``"dense"`` or ``"auto"`` (module docstring).

    Returns [..., D] in ``x``'s dtype (the weighted sum accumulated in float32)."""
    if (gate_up is None) == (gate is None and up is None) or (gate is None) != (up is None):
        raise ValueError("moe_ffn takes either gate_up [E, D, 2F] or both gate and up [E, D, F]")
    if impl not in ("auto", "ragged", "gather", "dense"):
        raise ValueError(f"moe_ffn impl must be 'auto', 'ragged', 'gather' or 'dense', not {impl!r}")
    lead, d = x.shape[:-1], x.shape[-1]
    k = expert_ids.shape[-1]
    xf = x.reshape(-1, d)
    n = xf.shape[0]
    num_local = down.shape[0]
    local = expert_ids.reshape(n * k).astype(jnp.int32) - expert_offset
    valid = (local >= 0) & (local < num_local)
    w = weights.reshape(n * k).astype(jnp.float32)
    if impl == "auto":
        impl = auto_impl(n * k, num_local, gather_max_pairs)
    if impl == "dense":
        return _rows_dense(xf, local, valid, w, k, gate_up, gate, up, gate_up_bias, down,
                           down_bias, activation).astype(x.dtype).reshape(*lead, d)
    if impl == "gather":
        out = _pairs_gather(xf, local, valid, k, gate_up, gate, up, gate_up_bias, down,
                            down_bias, activation)
    else:
        out = _pairs_ragged(xf, local, valid, k, gate_up, gate, up, gate_up_bias, down,
                            down_bias, activation)
    out = jnp.where(valid[:, None], out.astype(jnp.float32), 0.0) * w[:, None]
    return jnp.sum(out.reshape(n, k, d), axis=1).astype(x.dtype).reshape(*lead, d)


def auto_impl(pairs: int, num_local: int, gather_max_pairs: int = 64,
              backend: str | None = None) -> str:
    """What ``impl="auto"`` runs for ``pairs`` token-expert pairs over ``num_local`` experts:
    ``"gather"`` while ``pairs < num_local`` and ``pairs <= gather_max_pairs`` (reads at most
    ``pairs`` experts), else ``"dense"`` on CPU and ``"ragged"`` elsewhere."""
    if pairs < num_local and pairs <= gather_max_pairs:
        return "gather"
    return "dense" if (backend or jax.default_backend()) == "cpu" else "ragged"


def _rows_dense(xf, local, valid, w, k, gate_up, gate, up, gate_up_bias, down, down_bias, act):
    """Every row through every local expert (each expert's matrices read once), combined with
    ``combine[n, e]`` = the routing weight of row n for local expert e (0 when it does not route
    there or the expert is not local). Returns float32[N, D]."""
    n = xf.shape[0]
    num_local = down.shape[0]
    onehot = (local[:, None] == jnp.arange(num_local)[None, :]) & valid[:, None]   # [P, E]
    combine = jnp.sum((onehot * w[:, None]).reshape(n, k, num_local), axis=1)      # [N, E]
    if gate_up is not None:
        h = jnp.einsum("nd,edf->enf", xf, gate_up.astype(xf.dtype))
    else:
        h = jnp.concatenate([jnp.einsum("nd,edf->enf", xf, gate.astype(xf.dtype)),
                             jnp.einsum("nd,edf->enf", xf, up.astype(xf.dtype))], axis=-1)
    if gate_up_bias is not None:
        h = h + gate_up_bias[:, None, :].astype(h.dtype)
    y = jnp.einsum("enf,efd->end", act(h), down.astype(h.dtype))
    if down_bias is not None:
        y = y + down_bias[:, None, :].astype(y.dtype)
    return jnp.einsum("ne,end->nd", combine, y.astype(jnp.float32))


def _pairs_gather(xf, local, valid, k, gate_up, gate, up, gate_up_bias, down, down_bias, act):
    """Per token-expert pair (row-major [N, k]): gathers the pair's expert matrices and
    multiplies (a batched matvec). Returns [N*k, D] (pairs to non-local experts: garbage of
    expert 0, masked by the caller)."""
    e = jnp.where(valid, local, 0)
    xp = jnp.repeat(xf, k, axis=0)                                   # [P, D]
    if gate_up is not None:
        h = jnp.einsum("pd,pdf->pf", xp, gate_up[e].astype(xp.dtype))
    else:
        h = jnp.concatenate([jnp.einsum("pd,pdf->pf", xp, gate[e].astype(xp.dtype)),
                             jnp.einsum("pd,pdf->pf", xp, up[e].astype(xp.dtype))], axis=-1)
    if gate_up_bias is not None:
        h = h + gate_up_bias[e].astype(h.dtype)
    y = jnp.einsum("pf,pfd->pd", act(h), down[e].astype(h.dtype))
    if down_bias is not None:
        y = y + down_bias[e].astype(y.dtype)
    return y


def _pairs_ragged(xf, local, valid, k, gate_up, gate, up, gate_up_bias, down, down_bias, act):
    """The pairs sorted by local expert (non-local ones last, outside every group), one
    ``ragged_dot`` per projection over the local experts, then unsorted. Returns [N*k, D]."""
    num_local = down.shape[0]
    key = jnp.where(valid, local, num_local)
    order = jnp.argsort(key, stable=True)
    sorted_key = key[order]
    sizes = jnp.bincount(key, length=num_local + 1)[:num_local].astype(jnp.int32)
    xs = jnp.repeat(xf, k, axis=0)[order]                            # [P, D]
    e = jnp.minimum(sorted_key, num_local - 1)

    def grouped(lhs, rhs):
        return jax.lax.ragged_dot(lhs, rhs.astype(lhs.dtype), sizes)

    if gate_up is not None:
        h = grouped(xs, gate_up)
    else:
        h = jnp.concatenate([grouped(xs, gate), grouped(xs, up)], axis=-1)
    if gate_up_bias is not None:
        h = h + gate_up_bias[e].astype(h.dtype)
    y = grouped(act(h), down)
    if down_bias is not None:
        y = y + down_bias[e].astype(y.dtype)
    inverse = jnp.argsort(order)
    return y[inverse]
