"""Gated DeltaNet (GDN), the linear-attention layer of the hybrid targets (Qwen3.5 / 3.6,
Qwen3-Next), and its decode state with an exact rollback (``docs/targets.md``).

Shapes: B rows, T block rows, Hk key heads of dk dims, Hv value heads of dv dims (Hv a multiple
of Hk: value head h reads key head ``h // (Hv // Hk)``, ``repeat_interleave`` order),
C = 2 Hk dk + Hv dv conv channels, K the conv kernel size. The channels are grouped by key
head (:func:`group_order`): key head h's q (dk), its k (dk), then the v of its r = Hv / Hk value
heads (r dv). A contiguous split of the channels by key heads (tensor parallelism,
``parallel.rules``) so keeps whole groups; checkpoints store q, then k, then v, and the loader
regroups them (``checkpoints.TensorSpec.order``).

What a GDN layer computes for one row (all in float32):

    x = silu(depthwise causal conv1d over [q k v] inputs)      kernel K, state: last K-1 inputs
    g_t = -exp(A_log) * softplus(a_t + dt_bias)               per value head, g <= 0
    beta_t = sigmoid(b_t)
    q, k L2-normalised (eps 1e-6), q scaled by dk^-1/2, key heads repeated onto value heads
    S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T     S: [Hv, dk, dv]
    o_t = S_t^T q_t

Two forms compute it (they agree to float32 rounding):

* :func:`recurrent`: the per-token recurrence, returning the state after every row (one-token
  steps, and verify when the rollback keeps snapshots);
* :func:`chunked`: the chunked (WY / UT-transform) form: per chunk of ``Cs`` rows,
  ``u = (I + tril_{-1}(beta_i e^{G_i - G_j} k_i.k_j))^{-1} beta (v - e^{G} S_0^T k)`` and
  ``S_C = e^{G_C} S_0 + sum_j e^{G_C - G_j} k_j u_j^T``, ``o_t = e^{G_t} S_0^T q_t +
  sum_{j<=t} e^{G_t - G_j} (q_t.k_j) u_j`` (G the within-chunk cumulative log decay). It
  returns the state at every chunk boundary.

Rollback (:class:`GatedDeltaState`): after a forward over a block each layer records what it
needs to give the state after any number ``n`` of the block's rows (``record_mode``):

* ``"snapshot"``: the recurrence's state after every row ([B, T + 1, Hv, dk, dv] per layer);
  rollback selects row ``n``;
* ``"replay"``: the chunk-boundary states and the block's prepared k, v, g, beta; rollback
  takes the boundary state before ``n``'s chunk and re-runs that chunk's state update with
  the rows from ``n`` on masked out (``beta = 0``, ``g = 0``: such a row leaves the state as
  it is), i.e. one chunk-sized state update instead of T states kept.

The conv state is rolled back by keeping the K-1 inputs before row ``n`` (the record keeps the
window and the block's inputs).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST
RECORD_MODES = ("replay", "snapshot")
DEFAULT_CHUNK = 64
IMPLS = ("xla", "pallas")  # the chunked form in jnp, or as Pallas kernels (``kernels/gdn_chunk.py``)


def _ein(spec, *xs):
    return jnp.einsum(spec, *xs, precision=HIGHEST)


# ---------------------------------------------------------------------------- sizes
def conv_channels(num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int) -> int:
    """C = 2 Hk dk + Hv dv: the conv runs over q, k and v concatenated."""
    return 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim


def group_order(num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int) -> tuple[int, ...]:
    """The grouped channel order (module docstring) as indices into the stored order (all q,
    then all k, then all v): grouped channel j is stored channel ``order[j]``."""
    Hk, dk, dv, r = num_k_heads, head_k_dim, head_v_dim, num_v_heads // num_k_heads
    kd = Hk * dk
    order: list[int] = []
    for h in range(Hk):
        order += range(h * dk, (h + 1) * dk)                      # q of key head h
        order += range(kd + h * dk, kd + (h + 1) * dk)            # its k
        order += range(2 * kd + h * r * dv, 2 * kd + (h + 1) * r * dv)  # its value heads' v
    return tuple(order)


def split_qkv(x: jax.Array, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int):
    """(q [..., Hk, dk], k [..., Hk, dk], v [..., Hv, dv]) of channels x [..., C] in the
    grouped order (:func:`group_order`)."""
    lead, dk = x.shape[:-1], head_k_dim
    g = x.reshape(lead + (num_k_heads, -1))
    return g[..., :dk], g[..., dk:2 * dk], g[..., 2 * dk:].reshape(lead + (num_v_heads, head_v_dim))


def state_elems(num_v_heads: int, head_k_dim: int, head_v_dim: int) -> int:
    """Hv dk dv: one GDN layer's recurrent state per row."""
    return num_v_heads * head_k_dim * head_v_dim


# ---------------------------------------------------------------------------- elementwise parts
def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (float32)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gates(a: jax.Array, b: jax.Array, A_log: jax.Array, dt_bias: jax.Array):
    """The per-token decay and write strength: a, b [B, T, Hv]; A_log, dt_bias [Hv].
    Returns (g, beta) float32[B, T, Hv]: ``g = -exp(A_log) softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``."""
    g = -jnp.exp(A_log.astype(jnp.float32)) * jax.nn.softplus(a.astype(jnp.float32)
                                                              + dt_bias.astype(jnp.float32))
    return g, jax.nn.sigmoid(b.astype(jnp.float32))


def causal_conv1d(x: jax.Array, window: jax.Array | None, weight: jax.Array):
    """The depthwise causal conv1d (no bias) with silu over ``x`` [B, T, C] after ``window``
    [B, K-1, C] (the K-1 inputs before the block; None: zeros, a sequence start).
    ``weight`` [K, C] (transformers' ``conv1d.weight`` [C, 1, K] transposed; tap K-1 is the
    current token). Returns (y [B, T, C] in x's dtype, inputs [B, K-1+T, C]: the window and
    the block, from which the conv state after any row is cut)."""
    B, T, C = x.shape
    K = weight.shape[0]
    if window is None:
        window = jnp.zeros((B, K - 1, C), x.dtype)
    inputs = jnp.concatenate([window.astype(x.dtype), x], axis=1)  # [B, K-1+T, C]
    xf, w = inputs.astype(jnp.float32), weight.astype(jnp.float32)
    y = sum(xf[:, i:i + T] * w[i] for i in range(K))
    return jax.nn.silu(y).astype(x.dtype), inputs


def prepare(q: jax.Array, k: jax.Array, v: jax.Array):
    """q, k [B, T, Hk, dk], v [B, T, Hv, dv] -> float32 q, k [B, T, Hv, dk] (L2-normalised,
    q scaled by dk^-1/2, key head ``h // (Hv // Hk)`` for value head h) and v [B, T, Hv, dv]."""
    Hk, Hv = k.shape[2], v.shape[2]
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5)
    if Hv != Hk:
        q, k = (jnp.repeat(x, Hv // Hk, axis=2) for x in (q, k))
    return q, k, v.astype(jnp.float32)


# ---------------------------------------------------------------------------- the two forms
def recurrent(q, k, v, g, beta, state0):
    """The per-token recurrence over prepared q, k [B, T, Hv, dk], v [B, T, Hv, dv],
    g, beta [B, T, Hv] from ``state0`` float32[B, Hv, dk, dv].

    Returns (o float32[B, T, Hv, dv], states float32[B, T + 1, Hv, dk, dv]: index 0 is
    ``state0``, index i the state after row i - 1)."""

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t = xs  # [B, Hv, d] / [B, Hv]
        s = s * jnp.exp(g_t)[..., None, None]
        mem = _ein("bhkv,bhk->bhv", s, k_t)
        s = s + k_t[..., :, None] * (b_t[..., None] * (v_t - mem))[..., None, :]
        return s, (_ein("bhkv,bhk->bhv", s, q_t), s)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (q, k, v, g, beta))
    _, (o, states) = jax.lax.scan(step, state0.astype(jnp.float32), xs)
    states = jnp.concatenate([state0[:, None].astype(jnp.float32), jnp.swapaxes(states, 0, 1)], 1)
    return jnp.swapaxes(o, 0, 1), states


def _to_chunks(x, n, cs):
    """[B, T, ...] -> [B, n, cs, ...] with the time axis zero-padded to n * cs."""
    pad = n * cs - x.shape[1]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((x.shape[0], n, cs) + x.shape[2:])


def unit_lower_inverse(A: jax.Array) -> jax.Array:
    """``(I + A)^-1`` of a strictly lower-triangular A [..., n, n] by forward substitution, row
    by row: ``T_i = e_i - A_i T`` (rows ``j < i`` of T are final, and ``A_ij = 0`` for
    ``j >= i``). n - 1 small steps; stable where the Neumann series cancels badly, and on CPU
    far cheaper than a batched ``solve_triangular`` (measured 560 ms for 8 x 8 systems of 32
    heads x 128 columns)."""
    n = A.shape[-1]

    def row(i, T):
        a_i = jax.lax.dynamic_slice_in_dim(A, i, 1, axis=-2)  # [..., 1, n]
        e_i = (jnp.arange(n) == i).astype(A.dtype)
        return jax.lax.dynamic_update_slice_in_dim(T, e_i - _ein("...ij,...jk->...ik", a_i, T), i, axis=-2)

    T = jnp.broadcast_to(jnp.eye(n, dtype=A.dtype), A.shape)
    return jax.lax.fori_loop(1, n, row, T) if n > 1 else T


def chunk_terms(k, v, g, beta, s0):
    """One chunk's delta-rule terms for prepared k [..., Cs, Hv, dk], v [..., Cs, Hv, dv],
    g, beta [..., Cs, Hv] and the state before it s0 [..., Hv, dk, dv].

    Returns (u [..., Cs, Hv, dv]: each row's correction written to the state, G [..., Cs, Hv]:
    the cumulative log decay, and the state after the chunk [..., Hv, dk, dv])."""
    cs = k.shape[-3]
    G = jnp.cumsum(g, axis=-2)  # [..., Cs, Hv]
    diff = G[..., :, None, :] - G[..., None, :, :]  # [..., i, j, Hv] = G_i - G_j
    lower = jnp.tril(jnp.ones((cs, cs), bool), -1)[..., None]
    decay = jnp.exp(jnp.where(lower, diff, -jnp.inf))  # strictly lower: i > j
    A = _ein("...ihd,...jhd->...hij", k, k) * jnp.moveaxis(decay, -1, -3) * \
        jnp.moveaxis(beta, -1, -2)[..., :, None]  # [..., Hv, i, j]
    rhs = beta[..., None] * (v - jnp.exp(G)[..., None] * _ein("...hkv,...ihk->...ihv", s0, k))
    rhs = jnp.moveaxis(rhs, -2, -3)  # [..., Hv, Cs, dv]
    u = _ein("...ij,...jv->...iv", unit_lower_inverse(A), rhs)
    u = jnp.moveaxis(u, -3, -2)  # [..., Cs, Hv, dv]
    G_end = G[..., -1:, :]  # [..., 1, Hv]
    w = jnp.exp(G_end - G)  # [..., Cs, Hv]
    s1 = jnp.exp(G_end[..., 0, :])[..., None, None] * s0 + _ein("...jhk,...jhv->...hkv", k * w[..., None], u)
    return u, G, s1


def chunked(q, k, v, g, beta, state0, chunk_size: int = DEFAULT_CHUNK):
    """The chunked form over prepared q, k [B, T, Hv, dk], v [B, T, Hv, dv], g, beta
    [B, T, Hv] from ``state0`` float32[B, Hv, dk, dv], in chunks of ``min(chunk_size, T)``
    rows (the last zero-padded: a padded row leaves the state as it is).

    Returns (o float32[B, T, Hv, dv], boundaries float32[B, N + 1, Hv, dk, dv]: the state
    before chunk 0, after chunk 0, ...; the last is the state after the block)."""
    B, T = k.shape[:2]
    cs = min(chunk_size, T)
    n = -(-T // cs)
    qc, kc, vc, gc, bc = (_to_chunks(x, n, cs) for x in (q, k, v, g, beta))

    def step(s, xs):
        q_c, k_c, v_c, g_c, b_c = xs  # [B, Cs, Hv, d]
        u, G, s1 = chunk_terms(k_c, v_c, g_c, b_c, s)
        diff = G[:, :, None, :] - G[:, None, :, :]  # [B, i, j, Hv]
        causal = jnp.tril(jnp.ones((cs, cs), bool))[None, :, :, None]
        att = _ein("bihd,bjhd->bijh", q_c, k_c) * jnp.exp(jnp.where(causal, diff, -jnp.inf))
        o = jnp.exp(G)[..., None] * _ein("bhkv,bihk->bihv", s, q_c) + _ein("bijh,bjhv->bihv", att, u)
        return s1, (o, s1)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (qc, kc, vc, gc, bc))
    _, (o, states) = jax.lax.scan(step, state0.astype(jnp.float32), xs)
    o = jnp.swapaxes(o, 0, 1).reshape((B, n * cs) + v.shape[2:])[:, :T]
    bounds = jnp.concatenate([state0[:, None].astype(jnp.float32), jnp.swapaxes(states, 0, 1)], 1)
    return o, bounds


def pallas_chunked(q, k, v, g, beta, state0, chunk_size: int = DEFAULT_CHUNK):
    """:func:`chunked` as the Pallas kernels of ``kernels.gdn_chunk``: compiled (Triton, TF32
    products) where the program is lowered for a GPU, interpreted elsewhere (the choice is made
    per lowering platform, as for ``nn.attention.pallas_block_attention``). Same arguments and
    results; in the interpreter the same numbers to float32 rounding, on a GPU to TF32's (10-bit
    products: a float32 run that must equal AR token for token, e.g. the GPU suite's exactness
    checks, keeps ``gdn_impl="xla"``)."""
    from dflash_jax.kernels.gdn_chunk import gdn_chunked

    def kernel(interpret: bool):
        return lambda *xs: gdn_chunked(*xs, chunk_size, interpret=interpret)

    return jax.lax.platform_dependent(q, k, v, g, beta, state0.astype(jnp.float32), cuda=kernel(False),
                                      rocm=kernel(False), default=kernel(True))


# ---------------------------------------------------------------------------- trees
def tree_taps(visible: jax.Array, depth: jax.Array, K: int) -> jax.Array:
    """Where each node of a tree block reads its K conv inputs: int32[B, N, K], tap j (0: the
    node itself, j: its j-th ancestor; past the root, the window's last inputs) as an index into
    ``[window (K-1 rows), the nodes (N rows)]``. Nodes are in topological order (an ancestor has
    a smaller index); ``visible`` bool[B, N, N]: ``[b, i, a]`` a is i or an ancestor of i;
    ``depth`` int32[B, N]: edges from the root (node 0)."""
    taps = []
    for j in range(K):
        jth = visible & (depth[:, None, :] == depth[:, :, None] - j)  # the ancestor j edges up
        taps.append(jnp.where(j <= depth, K - 1 + jnp.argmax(jth, axis=-1), (K - 1) - (j - depth)))
    return jnp.stack(taps, axis=-1).astype(jnp.int32)


def tree_conv1d(x: jax.Array, window: jax.Array | None, weight: jax.Array, visible: jax.Array,
                depth: jax.Array):
    """:func:`causal_conv1d` over a tree block x [B, N, C]: each node convolves the inputs of its
    own root path (its ancestors', then the window's; :func:`tree_taps`). Returns (y [B, N, C],
    inputs [B, K-1+N, C]: the window and the nodes, in node order)."""
    B, N, C = x.shape
    K = weight.shape[0]
    if window is None:
        window = jnp.zeros((B, K - 1, C), x.dtype)
    inputs = jnp.concatenate([window.astype(x.dtype), x], axis=1)
    taps = tree_taps(visible, depth, K)  # [B, N, K]
    xs = inputs[jnp.arange(B)[:, None, None], taps].astype(jnp.float32)  # [B, N, K, C]
    w = weight.astype(jnp.float32)
    y = sum(xs[:, :, K - 1 - i] * w[i] for i in range(K))  # weight tap K-1 is the node itself
    return jax.nn.silu(y).astype(x.dtype), inputs


def tree_delta(q, k, v, g, beta, state0, visible):
    """The delta rule over a tree block: every node's state is its root path's recurrence from
    ``state0`` (prepared q, k [B, N, Hv, dk], v [B, N, Hv, dv], g, beta [B, N, Hv], ``visible``
    bool[B, N, N] ancestors and self, nodes in topological order). It is the chunked form over
    one chunk with the ancestor mask in place of the causal one: node i's correction ``u_i``
    depends only on its ancestors' (what the chain along its path computes), G_i is the sum of g
    over its path, and ``I + A`` is lower-triangular in node order (``docs/trees.md``).

    Returns (o float32[B, N, Hv, dv], u float32[B, N, Hv, dv], G float32[B, N, Hv])."""
    vis = visible.astype(jnp.float32)
    G = _ein("bij,bjh->bih", vis, g)  # [B, N, Hv]: the log decay over each node's path
    N = k.shape[1]
    ancestors = visible & ~jnp.eye(N, dtype=bool)[None]
    diff = G[:, :, None, :] - G[:, None, :, :]  # [B, i, j, Hv]
    decay = jnp.exp(jnp.where(ancestors[..., None], diff, -jnp.inf))
    A = _ein("bihd,bjhd->bhij", k, k) * jnp.moveaxis(decay, -1, 1) * jnp.moveaxis(beta, -1, 1)[..., None]
    rhs = beta[..., None] * (v - jnp.exp(G)[..., None] * _ein("bhkv,bihk->bihv", state0, k))
    u = _ein("bhij,bhjv->bhiv", unit_lower_inverse(A), jnp.moveaxis(rhs, 2, 1))  # [B, Hv, N, dv]
    u = jnp.moveaxis(u, 1, 2)  # [B, N, Hv, dv]
    att = _ein("bihd,bjhd->bijh", q, k) * jnp.exp(jnp.where(visible[..., None], diff, -jnp.inf))
    o = jnp.exp(G)[..., None] * _ein("bhkv,bihk->bihv", state0, q) + _ein("bijh,bjhv->bihv", att, u)
    return o, u, G


def tree_states(k, u, G, state0, visible):
    """Every node's state after its root path (:func:`tree_delta`'s u and G): float32[B, N, Hv,
    dk, dv], ``S_i = e^{G_i} S0 + sum_{j on i's path} e^{G_i - G_j} k_j u_j^T``."""
    w = jnp.exp(jnp.where(visible[..., None], G[:, :, None, :] - G[:, None, :, :], -jnp.inf))  # [B, i, j, Hv]
    return (jnp.exp(G)[..., None, None] * state0[:, None]
            + _ein("bijh,bjhk,bjhv->bihkv", w, k, u))


# ---------------------------------------------------------------------------- one layer
@flax.struct.dataclass
class BlockRecord:
    """What one GDN layer's forward over a block keeps for the rollback (all [B, ...]):

    inputs: [B, K-1+T, C] the conv window before the block and the block's conv inputs;
    snapshots: float32[B, T+1, Hv, dk, dv] (``"snapshot"`` mode) or None;
    bounds: float32[B, N+1, Hv, dk, dv] the chunk-boundary states (``"replay"``) or None;
    k, v, g, beta: the block's prepared tensors, chunked [B, N, Cs, ...] (``"replay"``) or None.
    """

    inputs: jax.Array
    snapshots: jax.Array | None = None
    bounds: jax.Array | None = None
    k: jax.Array | None = None
    v: jax.Array | None = None
    g: jax.Array | None = None
    beta: jax.Array | None = None

    def final_state(self) -> jax.Array:
        return self.snapshots[:, -1] if self.snapshots is not None else self.bounds[:, -1]


def mix(qkv: jax.Array, a: jax.Array, b: jax.Array, *, conv_weight: jax.Array, A_log: jax.Array,
        dt_bias: jax.Array, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int,
        window: jax.Array | None = None, state0: jax.Array | None = None, form: str = "chunked",
        record: bool = False, chunk_size: int = DEFAULT_CHUNK, impl: str = "xla", tree=None):
    """A GDN layer's token mixing, from its projections to the core output (before the output
    norm): qkv [B, T, C] (the pre-conv ``in_proj_qkv`` output, channels grouped by key head:
    :func:`group_order`), a, b
    [B, T, Hv]; ``window`` [B, K-1, C] and ``state0`` float32[B, Hv, dk, dv] the layer's conv
    and recurrent state before the block (None: a sequence start).

    ``form``: ``"chunked"`` or ``"recurrent"``. ``record``: also return the
    :class:`BlockRecord` (the chunked form records for ``"replay"``, the recurrent one
    ``"snapshot"``). ``impl``: the chunked form's implementation (:data:`IMPLS`; the recurrent
    form is ``jnp`` either way). ``tree``: (visible bool[B, T, T], depth int32[B, T]) when the
    block is a tree of drafts (:func:`tree_delta`; ``form`` then names the record:
    ``"recurrent"`` every node's state, ``"chunked"`` the replay record of one chunk, both in
    node order until :meth:`GatedDeltaState.compact` puts them in the accepted path's).
    Returns (o float32[B, T, Hv, dv], record or None)."""
    if impl not in IMPLS:
        raise ValueError(f"GDN impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    B, T, C = qkv.shape
    want = conv_channels(num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    if C != want:
        raise ValueError(f"GDN qkv has {C} channels, expected 2 * {num_k_heads} * {head_k_dim} + "
                         f"{num_v_heads} * {head_v_dim} = {want}")
    if tree is None:
        x, inputs = causal_conv1d(qkv, window, conv_weight)
    else:
        x, inputs = tree_conv1d(qkv, window, conv_weight, *tree)
    q, k, v = prepare(*split_qkv(x, num_k_heads, head_k_dim, num_v_heads, head_v_dim))
    g, beta = gates(a, b, A_log, dt_bias)
    if state0 is None:
        state0 = jnp.zeros((B, num_v_heads, head_k_dim, head_v_dim), jnp.float32)
    if tree is not None:
        state0 = state0.astype(jnp.float32)
        o, u, G = tree_delta(q, k, v, g, beta, state0, tree[0])
        if not record:
            return o, None
        if form == "recurrent":
            states = tree_states(k, u, G, state0, tree[0])
            return o, BlockRecord(inputs, snapshots=jnp.concatenate([state0[:, None], states], 1))
        one = lambda t: t[:, None]  # the block as one chunk [B, 1, T, ...]
        return o, BlockRecord(inputs, bounds=jnp.stack([state0, state0], 1), k=one(k), v=one(v), g=one(g),
                              beta=one(beta))
    if form == "recurrent":
        o, states = recurrent(q, k, v, g, beta, state0)
        return o, (BlockRecord(inputs, snapshots=states) if record else None)
    if form != "chunked":
        raise ValueError(f"GDN form must be 'chunked' or 'recurrent', got {form!r}")
    o, bounds = (pallas_chunked if impl == "pallas" else chunked)(q, k, v, g, beta, state0, chunk_size)
    if not record:
        return o, None
    cs = min(chunk_size, T)
    n = bounds.shape[1] - 1
    kc, vc, gc, bc = (_to_chunks(t, n, cs) for t in (k, v, g, beta))
    return o, BlockRecord(inputs, bounds=bounds, k=kc, v=vc, g=gc, beta=bc)


def gated_rms_norm(x: jax.Array, z: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """The GDN output norm ``rmsnorm(x) * weight * silu(z)`` per value head: x, z [..., dv],
    weight [dv] (a plain scale, not zero-centred). Returns z's dtype."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)
    y = weight.astype(jnp.float32) * y.astype(z.dtype).astype(jnp.float32)
    return (y * jax.nn.silu(z.astype(jnp.float32))).astype(z.dtype)


# ---------------------------------------------------------------------------- the decode state
@flax.struct.dataclass
class GatedDeltaState:
    """The decode state of a model's GDN layers, stacked over them.

    conv: [L, B, K-1, C] the last K-1 conv inputs of each row;
    ssm: float32[L, B, Hv, dk, dv] the recurrent state;
    start: int32[B] each row's length before the last forward; lengths: int32[B];
    record: the last forward's :class:`BlockRecord` stacked over layers ([L, B, ...]), or None
      once rolled back (the decode loop carries rolled-back states only).
    """

    conv: jax.Array
    ssm: jax.Array
    start: jax.Array
    lengths: jax.Array
    record: BlockRecord | None = None

    @classmethod
    def init(cls, num_layers: int, batch: int, conv_kernel: int, channels: int, num_v_heads: int,
             head_k_dim: int, head_v_dim: int, dtype=jnp.float32) -> "GatedDeltaState":
        zeros = jnp.zeros((batch,), jnp.int32)
        return cls(jnp.zeros((num_layers, batch, conv_kernel - 1, channels), dtype),
                   jnp.zeros((num_layers, batch, num_v_heads, head_k_dim, head_v_dim), jnp.float32),
                   zeros, zeros)

    def layer(self, i):
        """(window [B, K-1, C], state0 [B, Hv, dk, dv]) of GDN layer ``i`` (static or traced)."""
        return self.conv[i], self.ssm[i]

    def after_block(self, record: BlockRecord, start, lengths) -> "GatedDeltaState":
        """The state after a forward over a block: ``record`` stacked over layers; the block
        starting at ``start`` and ending at ``lengths`` (int32[B])."""
        K1 = self.conv.shape[2]
        T = record.inputs.shape[2] - K1
        ssm = record.snapshots[:, :, -1] if record.snapshots is not None else record.bounds[:, :, -1]
        conv = record.inputs[:, :, T:].astype(self.conv.dtype)
        return GatedDeltaState(conv, ssm, jnp.asarray(start, jnp.int32),
                               jnp.asarray(lengths, jnp.int32), record)

    def compact(self, start, source) -> "GatedDeltaState":
        """After a forward over a tree block (``mix(tree=...)``): the record put in the order of
        each row's accepted root path, node ``source[b, k]`` (int32[B, M], ``source[:, 0] = 0``)
        becoming block row k, so that :meth:`rollback` to ``start + n`` gives the state after
        the path's first n nodes, as after a chain of them (``verification.tree``). Entries
        past a row's accepted path are never read (the rollback keeps fewer rows). ``start`` is
        the block's first position, which the record knows already (``KVCache.compact``'s
        signature)."""
        rec = self.record
        K1 = self.conv.shape[2]
        rows = jnp.arange(self.conv.shape[1])[:, None]
        source = jnp.asarray(source, jnp.int32)
        inputs = jnp.concatenate([rec.inputs[:, :, :K1], _path_order(rec.inputs[:, :, K1:], rows, source)], 2)
        if rec.snapshots is not None:
            snaps = jnp.concatenate([rec.snapshots[:, :, :1], _path_order(rec.snapshots[:, :, 1:], rows, source)], 2)
            return self.replace(record=BlockRecord(inputs, snapshots=snaps))
        chunk = lambda t: _path_order(t[:, :, 0], rows, source)[:, :, None]  # one chunk of the path
        return self.replace(record=rec.replace(inputs=inputs, k=chunk(rec.k), v=chunk(rec.v), g=chunk(rec.g),
                                               beta=chunk(rec.beta)))

    def rollback(self, lengths) -> "GatedDeltaState":
        """Each row's state after its first ``lengths[b]`` positions (in ``[start, start + T]``
        of the last forward's block): the conv window before block row ``n = lengths - start``
        and the recurrent state after rows ``0 .. n-1`` (module docstring)."""
        lengths = jnp.asarray(lengths, jnp.int32)
        rec = self.record
        if rec is None:
            return self.replace(lengths=lengths)
        L, B, K1 = self.conv.shape[:3]
        T = rec.inputs.shape[2] - K1
        n = jnp.clip(lengths - self.start, 0, T)  # [B]
        rows = jnp.arange(B)
        idx = n[:, None] + jnp.arange(K1)[None, :]  # [B, K-1]
        conv = rec.inputs[:, rows[:, None], idx].astype(self.conv.dtype)  # [L, B, K-1, C]
        if rec.snapshots is not None:
            ssm = rec.snapshots[:, rows, n]
        else:
            N, cs = rec.k.shape[2], rec.k.shape[3]
            c = jnp.minimum(n // cs, N - 1)
            r = n - c * cs  # rows of chunk c kept, 0..cs
            s0 = rec.bounds[:, rows, c]  # [L, B, Hv, dk, dv]
            pick = lambda x: x[:, rows, c]  # [L, B, cs, ...]
            live = (jnp.arange(cs)[None, :] < r[:, None])[None, :, :, None]  # [1, B, cs, 1]
            g = jnp.where(live, pick(rec.g), 0.0)
            beta = jnp.where(live, pick(rec.beta), 0.0)
            _, _, ssm = chunk_terms(pick(rec.k), pick(rec.v), g, beta, s0)
        return GatedDeltaState(conv, ssm, lengths, lengths, None)


def _path_order(x, rows, source):
    """x [L, B, N, ...] -> [L, B, M, ...]: each row's entries at the node indices source[b]."""
    return x[:, rows, source]


def stack_records(records: list[BlockRecord]) -> BlockRecord:
    """Per-layer records -> one with a leading layer axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *records)
