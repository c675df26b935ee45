"""Block attention as a Triton-language kernel called from JAX through ``jax_triton.triton_call``.

Same signature, masking modes and result as :func:`kernels.block_attention.block_attention` (the
Pallas kernel; see its module docstring): q [B, T, H, Dh] against a cache k, v [B, S, Hkv, Dh]
(or the stacked [L, B, S, Hkv, Dh] with ``layer``) holding ``kv_lens[b]`` valid slots;
``causal=True``: query t sees slots ``s < kv_lens[b] + t + 1``; ``causal=False``: slots
``s < kv_lens[b]`` plus all T rows of the block's own ``k_blk, v_blk``, or with ``blk_mask``
bool[B, T, T] (tree verify) only the block rows j where ``blk_mask[b, t, j]``.

Kernel layout. The grid is ``(B, Hkv, num_splits + has_blk)``. As in the Pallas kernel, the G
query heads that share a KV head are folded into the ``ROWS = max(16, pow2(T * G))`` rows of one
tile (the kernel reads them straight from q, no padded copy), and the cache is split along S
into ``num_splits`` chunks (flash-decoding), each looping over ``BLOCK_K`` tiles up to the row's
valid length only, with an online softmax. Loads past S are masked, so S needs no padding. In
drafter mode the block's own rows are one more program per (b, kv head) (the last split), so
every program runs one loop of the same online-softmax step. The per-split states go through
:func:`kernels.block_attention.combine_splits`, the same ``jnp`` merge as the Pallas kernel.

CPU. ``triton_call`` has no CPU path: jax-triton imports only with a CUDA (or ROCm) jaxlib, and
its lowering builds the kernel call with the jaxlib GPU plugin (lowering for "cuda" from a CPU
jaxlib compiles the kernel to PTX, then finds no ``jaxlib.gpu_triton.TritonKernel``). So
``interpret=True`` runs the same kernel in Triton's interpreter on the host instead, through
``jax.pure_callback`` on torch CPU tensors: the tests use it, and so do the models on CPU.
:func:`compile_for_gpu` compiles the kernel for sm_90a / sm_100a without a GPU (Triton's own
compiler); ``python -m dflash_jax.tools.gpu_compile --impl triton`` reads registers, spills,
shared memory and occupancy from the result, per launch the engine makes.

Launch. Parameters left unset (``block_k``, ``num_splits``, ``num_warps``, ``num_stages``) come
from :func:`kernels.tuning.choose_launch` for the device's SM count, as in the Pallas kernel.
The block's own rows are a separate program here, not loaded by every cache program, so the
split count is modeled with ``block_rows=0``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import pickle
import subprocess
import sys
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np

try:
    import triton
    import triton.language as tl
except ModuleNotFoundError as e:  # an optional dependency: say which extra provides it
    raise ModuleNotFoundError(
        f"kernels.triton_block_attention (attention_impl='triton') needs the '{e.name}' package, "
        "which is not installed: pip install -e '.[gpu]' on a CUDA machine, or '.[test]' for "
        "Triton's interpreter on CPU; attention_impl='pallas' or 'xla' need neither",
        name=e.name) from e

from .block_attention import _check as check_arguments
from .block_attention import _gpu_sm_count, combine_splits, in_query_chunks
from .tuning import LaunchParams, choose_launch, next_pow2, split_layout

NEG = tl.constexpr(-1e30)  # finite "minus infinity", as in the Pallas kernel


# ---------------------------------------------------------------------------- kernel
@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """a [M, K] @ b [K, N] accumulated in float32. DOT_F32 multiplies float32 copies instead (the
    Triton interpreter has no bfloat16 dot, triton-lang/triton#11584; bf16 x bf16 products are
    exact in float32, so only the order of the sums can differ from the GPU's tensor cores)."""
    if DOT_F32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _attend_tile(q, acc, m, l, k_rows, v_rows, cols, n_cols, limit, allowed, DH: tl.constexpr,
                 BLOCK_D: tl.constexpr, ROW_STRIDE: tl.constexpr, SCALE: tl.constexpr,
                 PRECISION: tl.constexpr, DOT_F32: tl.constexpr, HAS_ALLOWED: tl.constexpr):
    """One online-softmax step over the key rows ``cols`` of a K/V source.

    q [ROWS, BLOCK_D]; acc [ROWS, BLOCK_D], m, l [ROWS] float32 (running sum of p @ v, max,
    sum of p); k_rows, v_rows: pointers to row 0 of this (b, kv head) with ROW_STRIDE elements
    between rows; cols [N] the rows to read (those >= n_cols are not loaded); limit [ROWS]:
    query row r sees the key rows ``cols < limit[r]``; allowed [ROWS, N] bool, read only when
    HAS_ALLOWED: further restricts what row r sees (the tree's ancestor mask).
    """
    dims = tl.arange(0, BLOCK_D)
    in_bounds = (cols < n_cols)[:, None] & (dims < DH)[None, :]
    offsets = cols[:, None] * ROW_STRIDE + dims[None, :]
    kt = tl.load(k_rows + offsets, mask=in_bounds, other=0.0)
    vt = tl.load(v_rows + offsets, mask=in_bounds, other=0.0)
    visible = cols[None, :] < limit[:, None]
    if HAS_ALLOWED:
        visible = visible & allowed
    scores = _dot(q, tl.trans(kt), PRECISION, DOT_F32)
    scores = tl.where(visible, scores * SCALE, NEG)
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    corr = tl.exp(m - m_new)
    p = tl.where(visible, tl.exp(scores - m_new[:, None]), 0.0)
    acc = acc * corr[:, None] + _dot(p.to(vt.dtype), vt, PRECISION, DOT_F32)
    return acc, m_new, l * corr + tl.sum(p, axis=1)


@triton.jit
def _block_attention_kernel(
        layer_ptr, lens_ptr, q_ptr, k_ptr, v_ptr, kb_ptr, vb_ptr, mask_ptr,  # inputs
        acc_ptr, m_ptr, l_ptr,  # outputs: per-split online-softmax states
        B: tl.constexpr, S: tl.constexpr, T: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr,
        DH: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr,
        CAUSAL: tl.constexpr, HAS_BLK: tl.constexpr, HAS_MASK: tl.constexpr, SCALE: tl.constexpr,
        PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """Program (b, g, split): rows of KV head g of batch row b against one chunk of the cache
    (split < NUM_SPLITS) or against the block's own rows (split == NUM_SPLITS, drafter mode).

    layer_ptr int32[1]; lens_ptr int32[B]; q_ptr [B, T, HKV * G, DH]; k_ptr, v_ptr
    [L, B, S, HKV, DH]; kb_ptr, vb_ptr [B, T, HKV, DH] (read only when HAS_BLK); mask_ptr
    int32[B, T, T] (read only when HAS_MASK: query t sees block row j where nonzero);
    acc_ptr f32[B, HKV, NUM_SPLITS + HAS_BLK, ROWS, BLOCK_D]; m_ptr, l_ptr f32[..., ROWS].
    """
    b = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    ROW_STRIDE: tl.constexpr = HKV * DH
    rows = tl.arange(0, ROWS)
    dims = tl.arange(0, BLOCK_D)
    t = rows // G  # query index of each row; rows >= T * G are padding
    row_ok = rows < T * G
    q_offsets = ((b * T + t) * (HKV * G) + g * G + rows % G) * DH
    q = tl.load(q_ptr + q_offsets[:, None] + dims[None, :],
                mask=row_ok[:, None] & (dims < DH)[None, :], other=0.0)
    kv_len = tl.load(lens_ptr + b)

    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    m = tl.full((ROWS,), NEG, dtype=tl.float32)
    l = tl.zeros((ROWS,), dtype=tl.float32)
    if split < NUM_SPLITS:  # a chunk of the cache
        layer = tl.load(layer_ptr)
        cache_row0 = (layer * B + b).to(tl.int64) * (S * ROW_STRIDE) + g * DH
        if CAUSAL:
            limit = kv_len + t + 1
            n_cols = tl.minimum(kv_len + T, S)
        else:
            limit = kv_len + 0 * t
            n_cols = tl.minimum(kv_len, S)
        first = split * TILES_PER_SPLIT
        n_tiles = tl.minimum(tl.maximum(tl.cdiv(n_cols, BLOCK_K) - first, 0), TILES_PER_SPLIT)
        for i in range(n_tiles):
            cols = (first + i) * BLOCK_K + tl.arange(0, BLOCK_K)
            acc, m, l = _attend_tile(q, acc, m, l, k_ptr + cache_row0, v_ptr + cache_row0, cols,
                                     n_cols, limit, limit, DH, BLOCK_D, ROW_STRIDE, SCALE,
                                     PRECISION, DOT_F32, False)
    else:  # the block's own K/V rows, seen by every query row (or as blk_mask says)
        if HAS_BLK:
            block_row0 = (b * T).to(tl.int64) * ROW_STRIDE + g * DH
            limit = tl.where(row_ok, T, 0)
            cols = tl.arange(0, BLOCK_T)
            if HAS_MASK:  # row r reads query t = r // G's row of the mask
                allowed = tl.load(mask_ptr + (b * T + t)[:, None] * T + cols[None, :],
                                  mask=row_ok[:, None] & (cols < T)[None, :], other=0) != 0
            else:
                allowed = limit
            acc, m, l = _attend_tile(q, acc, m, l, kb_ptr + block_row0, vb_ptr + block_row0,
                                     cols, T, limit, allowed, DH, BLOCK_D, ROW_STRIDE,
                                     SCALE, PRECISION, DOT_F32, HAS_MASK)

    state = ((b * HKV + g) * (NUM_SPLITS + HAS_BLK) + split) * ROWS + rows
    tl.store(acc_ptr + state[:, None] * BLOCK_D + dims[None, :], acc)
    tl.store(m_ptr + state, m)
    tl.store(l_ptr + state, l)


# ---------------------------------------------------------------------------- launch geometry
@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Grid, compile-time constants and launch options of one kernel launch.

    grid: (B, Hkv, num_splits + has_blk) programs; constexprs: the kernel's ``tl.constexpr``
    arguments; state_shape: (B, Hkv, num_splits + has_blk, ROWS, BLOCK_D) of the float32
    accumulator output (m and l drop the last axis); num_warps, num_stages: Triton's launch
    options (GPU only).
    """

    grid: tuple[int, int, int]
    constexprs: dict
    state_shape: tuple[int, int, int, int, int]
    num_warps: int
    num_stages: int

    @property
    def out_shapes(self):
        acc = jax.ShapeDtypeStruct(self.state_shape, jnp.float32)
        ml = jax.ShapeDtypeStruct(self.state_shape[:-1], jnp.float32)
        return acc, ml, ml

    @property
    def launch(self) -> LaunchParams:
        """(block_k, num_splits as run, num_warps, num_stages) of this plan."""
        c = self.constexprs
        return LaunchParams(c["BLOCK_K"], c["NUM_SPLITS"], self.num_warps, self.num_stages)


def plan_launch(q_shape, k_shape, dtype, *, causal: bool, has_blk: bool, has_mask: bool = False,
                scale: float | None = None,
                block_k: int | None = None, num_splits: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None,
                num_sms: int | None = None, interpret: bool = False) -> LaunchPlan:
    """The launch for q [B, T, H, Dh] against a cache [L, B, S, Hkv, Dh] of ``dtype``.

    block_k (a power of two >= 16), num_splits (chunks of S processed in parallel), num_warps,
    num_stages: None takes :func:`kernels.tuning.choose_launch`'s choice for a device of
    ``num_sms`` SMs (None: the tuner's default, an H100's 132). The cache programs do not load
    the block's rows (drafter mode gives them a program of their own), hence ``block_rows=0``.
    has_mask: the block's program reads a ``blk_mask`` (tree verify).
    interpret: for Triton's interpreter (float32 products, see ``_dot``).
    """
    B, T, H, Dh = q_shape
    S, Hkv = k_shape[2], k_shape[3]
    G = H // Hkv
    tuned = choose_launch(batch=B, seq=S, kv_heads=Hkv, num_queries=T, group=G, head_dim=Dh,
                          itemsize=jnp.dtype(dtype).itemsize, block_rows=0, num_sms=num_sms,
                          block_k=block_k, num_splits=num_splits, num_warps=num_warps,
                          num_stages=num_stages)
    block_k = tuned.block_k
    if block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 16 (a tensor-core tile), got {block_k}")
    num_splits, tiles_per_split = split_layout(S, block_k, tuned.num_splits)
    rows, block_d = max(16, next_pow2(T * G)), max(16, next_pow2(Dh))
    parts = num_splits + int(has_blk)
    constexprs = dict(
        B=B, S=S, T=T, HKV=Hkv, G=G, DH=Dh, BLOCK_D=block_d, ROWS=rows, BLOCK_K=block_k,
        BLOCK_T=max(16, next_pow2(T)), TILES_PER_SPLIT=tiles_per_split, NUM_SPLITS=num_splits,
        CAUSAL=bool(causal), HAS_BLK=bool(has_blk), HAS_MASK=bool(has_mask),
        SCALE=float(Dh ** -0.5 if scale is None else scale),
        # full float32 products for float32 inputs (no TF32); the option is ignored for bf16
        PRECISION="ieee" if jnp.dtype(dtype) == jnp.float32 or interpret else "tf32",
        DOT_F32=bool(interpret) and jnp.dtype(dtype) != jnp.float32)
    return LaunchPlan((B, Hkv, parts), constexprs, (B, Hkv, parts, rows, block_d),
                      tuned.num_warps, tuned.num_stages)


# ---------------------------------------------------------------------------- JAX wrapper
def block_attention_triton(q, k, v, kv_lens, k_blk=None, v_blk=None, *, causal: bool,
                           blk_mask=None, scale: float | None = None, layer=None, block_k: int | None = None,
                           num_splits: int | None = None, interpret: bool = False,
                           num_warps: int | None = None, num_stages: int | None = None):
    """Triton block attention (see the module docstring for the masking modes: causal, non-causal, tree).

    Args:
      q: [B, T, H, Dh]; k, v: [B, S, Hkv, Dh] cache, or the stacked cache of all layers
        [L, B, S, Hkv, Dh] with ``layer`` (an int or int32 scalar), read in place.
      kv_lens: int32[B] valid slots per row.
      k_blk, v_blk: [B, T, Hkv, Dh] the block's own K/V (non-causal mode only).
      blk_mask: bool[B, T, T] or None (non-causal mode only): query t sees block row j only
        where ``blk_mask[b, t, j]`` (tree verify's ancestor mask); None: every block row.
      scale: softmax scale (default Dh ** -0.5).
      block_k: cache tile; num_splits: chunks of S in parallel; num_warps, num_stages: Triton
        launch options (GPU only). None: chosen per shape and device by ``kernels/tuning.py``
        (:func:`plan_launch`).
      interpret: run the kernel in Triton's interpreter on the host (CPU; needs torch).
    Returns:
      [B, T, H, Dh] in q's dtype.
    """
    if k.ndim == 4:
        k, v, layer = k[None], v[None], 0
    elif layer is None:
        raise ValueError("a stacked [L, B, S, Hkv, Dh] cache needs layer=")
    # under jit, as the Pallas kernel, so tracing sees one removable call
    check_arguments(q, jax.ShapeDtypeStruct(k.shape[1:], k.dtype),
                    jax.ShapeDtypeStruct(v.shape[1:], v.dtype), kv_lens, k_blk, v_blk, causal, blk_mask)
    call = functools.partial(_block_attention_triton, k=k, v=v, k_blk=k_blk, v_blk=v_blk,
                             blk_mask=blk_mask, layer=layer, causal=causal, scale=None if scale is None else float(scale),
                             block_k=block_k, num_splits=num_splits, interpret=interpret,
                             num_warps=num_warps, num_stages=num_stages)
    if not causal:  # the drafter's block: its rows are both the queries and the extra keys
        return call(q, kv_lens=kv_lens)
    # a long causal block (a prefill) as query chunks, as the Pallas kernel does
    return in_query_chunks(lambda q_c, lens_c: call(q_c, kv_lens=lens_c), q, kv_lens, causal=True,
                           group=q.shape[2] // k.shape[3])


@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_k", "num_splits", "interpret",
                                             "num_warps", "num_stages"))
def _block_attention_triton(q, k, v, kv_lens, k_blk, v_blk, layer, blk_mask=None, *, causal, scale,
                            block_k, num_splits, interpret, num_warps, num_stages):
    check_arguments(q, k[0], v[0], kv_lens, k_blk, v_blk, causal, blk_mask)
    has_blk = k_blk is not None
    plan = plan_launch(q.shape, k.shape, k.dtype, causal=causal, has_blk=has_blk,
                       has_mask=blk_mask is not None, scale=scale,
                       block_k=block_k, num_splits=num_splits, num_warps=num_warps,
                       num_stages=num_stages, num_sms=_gpu_sm_count(), interpret=interpret)
    # one element type for every tile (tl.dot needs it); unused block pointers alias the cache,
    # an unused mask pointer the lengths
    kb, vb = (k_blk.astype(k.dtype), v_blk.astype(k.dtype)) if has_blk else (k, v)
    lens = kv_lens.astype(jnp.int32)
    mask = lens if blk_mask is None else blk_mask.astype(jnp.int32)
    args = (jnp.asarray(layer, jnp.int32).reshape(1), lens, q.astype(k.dtype), k, v, kb, vb, mask)
    if interpret:
        acc, m, l = jax.pure_callback(functools.partial(launch_interpreted, plan), plan.out_shapes,
                                      *args)
    else:
        acc, m, l = _triton_call(plan, args)
    return _merge_splits(acc, m, l, q.shape, k.shape[3]).astype(q.dtype)


def _triton_call(plan: LaunchPlan, args):
    try:
        import jax_triton as jt
    except ImportError as e:  # jax-triton imports only with a CUDA or ROCm jaxlib
        raise RuntimeError(f"block_attention_triton runs on a GPU through jax-triton ({e}); on a "
                           "CPU pass interpret=True (Triton's interpreter)") from e

    if _interpreting():
        raise RuntimeError("this process runs Triton's interpreter (TRITON_INTERPRET=1): "
                           "block_attention_triton needs interpret=True here")
    return jt.triton_call(*args, kernel=_block_attention_kernel, out_shape=plan.out_shapes,
                          grid=plan.grid, num_warps=plan.num_warps, num_stages=plan.num_stages,
                          name="dflash_block_attention_triton", **plan.constexprs)


def _merge_splits(acc, m, l, q_shape, Hkv: int):
    """Per-split states acc [B, Hkv, P, ROWS, BLOCK_D], m, l [B, Hkv, P, ROWS] -> [B, T, H, Dh]."""
    B, T, H, Dh = q_shape
    G = H // Hkv
    out = combine_splits(acc, m, l)[:, :, :T * G, :Dh]  # [B, Hkv, T * G, Dh]
    return out.reshape(B, Hkv, T, G, Dh).transpose(0, 2, 1, 3, 4).reshape(B, T, H, Dh)


# ---------------------------------------------------------------------------- interpreter
def _interpreting() -> bool:
    """Whether this process imported the kernel under Triton's interpreter (TRITON_INTERPRET=1:
    read when ``@triton.jit`` decorates, triton.language's own functions included, so it cannot
    be switched on later in a process that imported triton without it)."""
    return not isinstance(_block_attention_kernel, triton.runtime.JITFunction)


def _to_torch(x: np.ndarray):
    """numpy (bfloat16 from ml_dtypes included) -> a torch CPU tensor of its own copy."""
    import torch

    x = np.array(x, order="C")  # a writable copy (arrays from JAX are read-only views)
    if x.dtype == jnp.bfloat16:
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def _run_in_interpreter(plan: LaunchPlan, arrays) -> tuple[np.ndarray, ...]:
    """Launches the (interpreted) kernel over ``plan.grid`` on torch CPU tensors made from the
    host arrays (layer, lens, q, k, v, kb, vb, mask); returns the states (acc, m, l) as numpy."""
    import torch

    outs = [torch.empty(s.shape, dtype=torch.float32) for s in plan.out_shapes]
    _block_attention_kernel[plan.grid](*map(_to_torch, arrays), *outs, **plan.constexprs)
    return tuple(o.numpy() for o in outs)


class _InterpreterProcess:
    """A Python process started with TRITON_INTERPRET=1 that runs the kernel for this one:
    (plan, host arrays) go to its stdin and (ok, states or error text) come back on its stdout,
    pickled. It exits when this process closes its stdin."""

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "TRITON_INTERPRET": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": path}
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve_interpreter; serve_interpreter()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        atexit.register(self.close)

    def run(self, plan: LaunchPlan, arrays):
        with self._lock:
            try:
                pickle.dump((plan, [np.asarray(a) for a in arrays]), self._proc.stdin)
                self._proc.stdin.flush()
                ok, reply = pickle.load(self._proc.stdout)
            except (BrokenPipeError, EOFError) as e:
                raise RuntimeError("the Triton interpreter process exited (code "
                                   f"{self._proc.poll()}); its error is printed above") from e
        if not ok:
            raise RuntimeError(f"the Triton interpreter failed: {reply}")
        return reply

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


@functools.cache
def _interpreter_process() -> _InterpreterProcess:
    return _InterpreterProcess()


def serve_interpreter():
    """Main loop of :class:`_InterpreterProcess` (a process started with TRITON_INTERPRET=1)."""
    if not _interpreting():
        raise RuntimeError("serve_interpreter runs in a process started with TRITON_INTERPRET=1")
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the replies
    while True:
        try:
            plan, arrays = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = (True, _run_in_interpreter(plan, arrays))
        except Exception as e:  # sent back, raised there
            reply = (False, f"{type(e).__name__}: {e}")
        pickle.dump(reply, replies)
        replies.flush()


def launch_interpreted(plan: LaunchPlan, *arrays) -> tuple[np.ndarray, ...]:
    """Runs the kernel in Triton's interpreter on host arrays (layer, lens, q, k, v, kb, vb,
    mask):
    here if this process runs under TRITON_INTERPRET=1, else in a helper process that does.
    Returns the numpy states (acc, m, l) of ``plan.out_shapes``. Needs torch (CPU)."""
    try:
        import torch  # noqa: F401  (the interpreter launches on torch tensors)
    except ImportError as e:
        raise RuntimeError("the Triton interpreter (interpret=True, or attention_impl='triton' "
                           "off a GPU) launches on torch CPU tensors: pip install torch") from e
    if _interpreting():
        return _run_in_interpreter(plan, arrays)
    return _interpreter_process().run(plan, arrays)


# ---------------------------------------------------------------------------- GPU compile
def _signature(dtype) -> dict:
    """Triton pointer types of the kernel's array arguments."""
    elem = {jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float16): "fp16",
            jnp.dtype(jnp.float32): "fp32"}[jnp.dtype(dtype)]
    return {"layer_ptr": "*i32", "lens_ptr": "*i32", "q_ptr": f"*{elem}", "k_ptr": f"*{elem}",
            "v_ptr": f"*{elem}", "kb_ptr": f"*{elem}", "vb_ptr": f"*{elem}", "mask_ptr": "*i32",
            "acc_ptr": "*fp32",
            "m_ptr": "*fp32", "l_ptr": "*fp32"}


def compile_for_gpu(capability: int, plan: LaunchPlan, dtype, *, num_warps: int | None = None,
                    num_stages: int | None = None):
    """Compiles the kernel for ``capability`` (90: sm_90a, 100: sm_100a) without a GPU, with
    the options ``jax_triton.triton_call`` uses (16-byte aligned arrays, FP fusion on), and
    ``num_warps`` / ``num_stages`` (None: the plan's).

    Returns Triton's ``CompiledKernel``: ``.asm`` holds ttir/ttgir/llir/ptx/cubin and
    ``.metadata.shared`` the dynamic shared memory per program in bytes.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        raise RuntimeError("compile_for_gpu needs a process without TRITON_INTERPRET=1")
    signature = _signature(dtype)
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))}
    signature.update({name: "constexpr" for name in plan.constexprs})
    src = ASTSource(_block_attention_kernel, signature, constexprs=plan.constexprs, attrs=aligned)
    # a fresh cache: always a real compile, and jax_triton's import sets TRITON_CACHE_DIR="",
    # which leaves triton.compile without one
    with tempfile.TemporaryDirectory() as cache, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache
        options = {"num_warps": plan.num_warps if num_warps is None else num_warps,
                   "num_stages": plan.num_stages if num_stages is None else num_stages,
                   "enable_fp_fusion": True}
        return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
