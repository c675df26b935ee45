"""Roofline of one autoregressive step and one DFlash iteration, from the model shapes.

For a target/drafter pair it counts the bytes every forward pass must move through HBM and the
FLOPs it must do, turns them into time on a device, and predicts the speedup of DFlash over
autoregressive (AR) decoding at a given acceptance length tau:

    speedup(tau) = tau * t_AR / t_iter

  * one AR step = the target on 1 row over a KV cache of S positions;
  * one DFlash iteration = the drafter on the block of bs rows (the new context rows projected
    through fc and every drafter layer's k/v, the block attending to its S context rows and
    to itself), the target's LM head on the bs - 1 draft rows, and the target verifying the bs
    rows (causal) over its cache of S positions.

What is counted (batch 1 unless --batch; weights read once per forward whatever the batch):
  weights      every matrix and norm vector of the forward, once (the input embedding
               table is only gathered: its rows are activations; a tied LM head reads the
               table in full). Dtype --dtype (bf16: 2 bytes).
  kv_read      K and V of the S cached positions, every layer: 2 * layers * S * Hkv * Dh.
  kv_write     K and V of the new rows (the target's block; the drafter's new context rows,
               not its block, whose K/V are never kept).
  activations  what crosses HBM between kernels and is not a weight: embedding rows gathered,
               target taps written and read by the drafter's fc, logits written (float32).
               Hidden states inside a layer are taken to stay on chip (written and read
               once they would add ~1 % to a Qwen3-8B layer's weight bytes at 16 rows; more
               for small models, see the cross-check).
  FLOPs        2 * rows * (parameters of each matrix the rows pass through), plus attention
               4 * H * Dh per (query, key) pair per layer (QK^T and PV); norms, RoPE, softmax
               and the SwiGLU product are not counted (XLA counts them, see the cross-check).

Time: each forward is cut into components (linears, attention, LM head, the drafter's fc);
a component takes max(bytes / bandwidth, FLOPs / peak) and the step takes the SUM of those
maxima (a single max over the totals would let the compute of one kernel hide the memory
traffic of another, which sequential kernels cannot do). Launch overheads and kernel
efficiency are not modelled: this is the floor a perfect implementation would reach.

The counts are cross-checked against XLA's cost analysis of this project's own compiled CPU
programs (the target forward, and the engine's draft step) for 1-layer versions of the pair,
and the prediction is set against the paper's measurement (Qwen3-8B with a 5-layer drafter,
block 16: tau 6.49 and 4.86x on an H200, i.e. t_iter / t_AR = 6.49 / 4.86 = 1.335).

    python -m dflash_jax.tools.roofline                  # Qwen3-8B + 5-layer drafter, block 16
    python -m dflash_jax.tools.roofline --target embedded --drafter embedded \\
        --context 256 --bench-json results/bench/bench.json
    python -m dflash_jax.tools.roofline --target Qwen/Qwen3-8B \\
        --drafter z-lab/Qwen3-8B-DFlash-b16     # a hub pair: only the two config.json are fetched
    python -m dflash_jax.tools.roofline --moe gpt-oss-120b qwen3-coder-30b-a3b   # MoE targets
    python -m dflash_jax.tools.roofline --hybrid qwen3.5-27b qwen3.5-4b   # hybrid (GDN) targets
    python -m dflash_jax.tools.roofline --gemma4 gemma-4-31b gemma-4-26b-a4b   # Gemma 4 (windows)
    python -m dflash_jax.tools.roofline --tree --tau-curve tau.json   # tree node budgets (N = 16 ... 256)
    python -m dflash_jax.tools.roofline --hybrid qwen3.5-27b --tree --tau-curve tau.json   # trees on a hybrid target
    python -m dflash_jax.tools.roofline --eagle3     # EAGLE-3 (chain, trees 16 / 60) against DFlash
    python -m dflash_jax.tools.roofline --family     # the DFlash family: DFlash, DFlash2, DSpark
    python -m dflash_jax.tools.roofline --throughput  # throughput against interactivity, batch 1 ... 1024

Mixture-of-experts targets (``--moe``) are modelled in :mod:`dflash_jax.tools.roofline_moe`:
the same components, with the routed experts' bytes counted for the experts the rows route to.
Hybrid linear-attention targets (``--hybrid``, Qwen3.5) in :mod:`dflash_jax.tools.roofline_hybrid`:
the GDN layers' fixed state instead of a KV cache, and the bytes of either rollback mode.
Tree verification (``--tree``, docs/trees.md) in :mod:`dflash_jax.tools.roofline_tree`: N tree
rows verified per iteration, tau(N) from a measured curve scaled to the paper's, the best N.
EAGLE-3 against DFlash (``--eagle3``) in :mod:`dflash_jax.tools.roofline_eagle3`: k sequential
1-layer drafting steps (chain, or trees of K frontier nodes per step) against one drafter pass.
Throughput against interactivity (``--throughput``) in :mod:`dflash_jax.tools.roofline_throughput`:
aggregate and per-user tokens/s per batch size, where the verify turns compute-bound.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from typing import Sequence

import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash import DFLASH, size as dflash_size
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.hub import resolve_checkpoint
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.sizes import Cost, decoder_attention, decoder_linears, lm_head, total
from dflash_jax.decoding import engine
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.targets import init_target_params, target_forward as forward
from dflash_jax.bench.decode_speed import PRESETS

PAPER = {"model": "Qwen3-8B", "drafter_layers": 5, "block_size": 16, "device": "h200",
         "tau": 6.49, "speedup": 4.86,
         "source": "DFlash (arXiv 2602.06036), Qwen3-8B, T = 0, average over 7 sets, H200"}
PAPER_IMPLIED_RATIO = PAPER["tau"] / PAPER["speedup"]
"""t_iter / t_AR that the paper's measured speedup implies at its tau (1.335)."""
PAPER_BS_ABLATION = {"set": "MATH-500, Qwen3-8B, 8-layer drafter", "tau_bs16": 6.33,
                     "tau_bs8_trained_at_16": 5.09, "tau_bs8_trained_at_8": 5.21}
"""The paper's block-size ablation: what the geometric acceptance model is checked against."""
QWEN3_MASK_TOKEN_ID = 151669
BLOCK_SIZES = (4, 8, 10, 16, 32)
"""Block sizes the speedup curves and the best-block-size table compare."""
CURVE_BLOCK_SIZES = (2, 4, 8, 10, 16, 32, 64, 128, 256, 512)
"""Block sizes of the t_iter / t_AR curve (wide enough to show where compute starts to bind)."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


# ---------------------------------------------------------------------------- devices
@dataclasses.dataclass(frozen=True)
class Device:
    """An accelerator as the roofline sees it: HBM ``bandwidth`` in bytes/s and dense bf16
    matmul ``peak_flops`` in FLOP/s; ``source`` says where the two numbers come from."""

    name: str
    bandwidth: float
    peak_flops: float
    source: str


DEVICES = {
    "h100": Device("H100 SXM 80GB (datasheet)", 3.35e12, 989e12,
                   "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: GPU memory bandwidth "
                   "3.35 TB/s (HBM3); BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense"),
    "h100-measured": Device("H100 80GB HBM3 (measured)", 3.0e12, 798e12,
                            "this project's GPU runs: copy bandwidth of x + 1 over 1 GiB (read + "
                            "write) and a large bf16 matmul, jax 0.11.2"),
    "h200": Device("H200 SXM 141GB (datasheet)", 4.8e12, 989e12,
                   "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: GPU memory bandwidth "
                   "4.8 TB/s (HBM3e); BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense"),
    "h200-measured": Device("H200 141GB HBM3e (measured)", 4.3e12, 790e12,
                            "this project's GPU runs: copy bandwidth of x + 1 over 1 GiB and a "
                            "large bf16 matmul, jax 0.11.2"),
    "b200": Device("B200 HGX (datasheet)", 8.0e12, 2.25e15,
                   "NVIDIA DGX B200 datasheet: 64 TB/s HBM3e for 8 GPUs = 8 TB/s each (NVIDIA's "
                   "current HGX B200 table says 7.7 TB/s); NVIDIA HGX B200 specifications: "
                   "FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with sparsity, 2.25 dense"),
}


# ---------------------------------------------------------------------------- costs
# Cost and the decoder-layer counts are the library's size model (dflash_jax/sizes.py)


def seconds(costs: Sequence[Cost], device: Device) -> float:
    """Step time on ``device``: the sum over components of their roofline times."""
    return sum(c.seconds(device) for c in costs)


def predicted_speedup(tau: float, t_ar: float, t_iter: float) -> float:
    """tau tokens per iteration of t_iter seconds against one token per t_ar seconds."""
    return tau * t_ar / t_iter


# ---------------------------------------------------------------------------- forwards
def target_forward(target: TargetConfig, rows: int, context: int, *, taps: int = 0,
                   logit_rows: int | None = None, batch: int = 1, weight_bytes: int = 2,
                   kv_bytes: int = 2, dense_cache: int | None = None) -> list[Cost]:
    """The target on ``rows`` new rows per sequence over a cache of ``context`` positions.

    Causal: row i sees the context and block rows 0..i (``context * rows + rows (rows + 1) / 2``
    pairs). ``taps``: number of tapped layers whose features [rows, taps * D] are written for the
    drafter. ``logit_rows``: rows that go through the LM head (default all). ``dense_cache=M``
    models this project's XLA attention path instead, which writes the block into the cache and
    attends to all M slots under a mask (M keys per query, all M slots read).
    """
    D = target.hidden_size
    if dense_cache is None:
        pairs, kv_read = rows * context + rows * (rows + 1) / 2, context
    else:
        pairs, kv_read = rows * dense_cache, dense_cache
    linears = decoder_linears("target linears", target, target.num_layers, rows, rows,
                              qk_norm=target.qk_norm, attention_bias=target.attention_bias,
                              batch=batch, weight_bytes=weight_bytes)
    gathered = batch * rows * D * (1 + taps) * weight_bytes  # embedding rows in, taps out
    return [dataclasses.replace(linears, activations=gathered),
            decoder_attention("target attention", target, target.num_layers, pairs, kv_read, rows,
                              batch=batch, kv_bytes=kv_bytes),
            lm_head("target LM head", target, rows if logit_rows is None else logit_rows,
                    batch=batch, weight_bytes=weight_bytes)]


def drafter_forward(drafter: DrafterConfig, target: TargetConfig, block_size: int, context: int,
                    ctx_rows: int, *, batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2,
                    dense_cache: int | None = None) -> list[Cost]:
    """One draft (docs/method.md section 3): DFlash's size model (``methods/dflash/size.py``):
    ``ctx_rows`` new context rows through fc + hidden_norm and every layer's k/v into the draft
    cache; the block of ``block_size`` rows through every layer, attending non-causally to
    ``context`` cached rows and to itself; the target's LM head on the ``block_size - 1``
    draft rows. ``dense_cache=M``: this project's XLA path (all M slots read, M + block_size
    keys per query)."""
    return dflash_size.draft_costs(drafter, target, block_size, context, ctx_rows, batch=batch,
                                   weight_bytes=weight_bytes, kv_bytes=kv_bytes, dense_cache=dense_cache)


def ar_step(target: TargetConfig, context: int, **kw) -> list[Cost]:
    """One autoregressive step: the target on 1 row per sequence at context ``context``."""
    return target_forward(target, 1, context, **kw)


def dflash_iteration(target: TargetConfig, drafter: DrafterConfig, block_size: int, context: int,
                     ctx_rows: int | None = None, **kw) -> list[Cost]:
    """One DFlash iteration at context ``context``: the draft, then the verify of the block.

    ``ctx_rows``: context rows projected into the draft cache per iteration; default
    ``block_size``, what this engine does (static shapes: the whole verified block is projected,
    rows past the accepted ones are masked); the reference projects only the ~tau accepted rows.
    """
    ctx_rows = block_size if ctx_rows is None else ctx_rows
    return (drafter_forward(drafter, target, block_size, context, ctx_rows, **kw)
            + target_forward(target, block_size, context, taps=drafter.num_taps, **kw))


# ---------------------------------------------------------------------------- predictions
def step_times(target: TargetConfig, drafter: DrafterConfig, block_size: int, context: int,
               device: Device, **kw) -> dict:
    """Roofline seconds of one AR step and one DFlash iteration, and their ratio."""
    t_ar = seconds(ar_step(target, context, **kw), device)
    t_iter = seconds(dflash_iteration(target, drafter, block_size, context, **kw), device)
    return {"t_ar_s": t_ar, "t_iter_s": t_iter, "ratio": t_iter / t_ar}


def compute_bound_block_size(target: TargetConfig, drafter: DrafterConfig, context: int,
                             device: Device, limit: int = 4096, **kw) -> int | None:
    """The smallest block size at which the verify's target linears (the largest component)
    become compute-bound on ``device``; None if not up to ``limit`` rows."""
    for bs in range(2, limit + 1):
        verify = target_forward(target, bs, context, taps=drafter.num_taps, **kw)
        if verify[0].bound(device) == "compute":
            return bs
    return None


def geometric_tau(alpha: float, block_size: int) -> float:
    """Mean acceptance length (bonus included) when each draft row is accepted with
    probability ``alpha`` given the previous ones: sum_{i<bs} alpha^i = (1 - a^bs) / (1 - a)."""
    return float(sum(alpha ** i for i in range(block_size)))


def alpha_for_tau(tau: float, block_size: int) -> float:
    """The per-row acceptance alpha whose :func:`geometric_tau` at ``block_size`` is ``tau``
    (bisection; tau must lie in [1, block_size])."""
    if not 1.0 <= tau <= block_size:
        raise ValueError(f"tau {tau} must lie between 1 and the block size {block_size}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if geometric_tau(mid, block_size) < tau else (lo, mid)
    return (lo + hi) / 2


def best_block_sizes(ratios: dict, taus: Sequence[float], reference_bs: int) -> list[dict]:
    """Best block size per tau, two ways. ``ratios``: {block size: t_iter / t_AR}.

    ``fixed``: tau is the same at every block size that can reach it (bs >= tau), so the
    cheapest such block wins. ``geometric``: tau is the acceptance length at ``reference_bs``,
    turned into a per-row acceptance alpha that sets tau at the other block sizes (an
    assumption, see the report)."""
    out = []
    for tau in taus:
        feasible = {bs: tau / r for bs, r in ratios.items() if bs >= tau}
        row = {"tau": tau, "fixed_best_bs": max(feasible, key=feasible.get) if feasible else None,
               "fixed_speedup": max(feasible.values()) if feasible else None}
        if 1.0 <= tau <= reference_bs:
            a = alpha_for_tau(tau, reference_bs)
            geo = {bs: geometric_tau(a, bs) / r for bs, r in ratios.items()}
            best = max(geo, key=geo.get)
            row |= {"alpha": a, "geometric_best_bs": best, "geometric_speedup": geo[best],
                    "geometric_speedup_at_reference": geo.get(reference_bs)}
        out.append(row)
    return out


# ---------------------------------------------------------------------------- XLA cross-check
def one_layer(target: TargetConfig, drafter: DrafterConfig):
    """1-layer versions of the pair (same widths, heads, vocabulary, number of taps): XLA's CPU
    cost analysis counts a while-loop body once, not per trip, and both models scan their
    layers (a length-1 scan is inlined, so every layer is counted)."""
    t1 = dataclasses.replace(target, num_layers=1)
    kinds = drafter.layer_types
    d1 = dataclasses.replace(drafter, num_layers=1, num_target_layers=1,
                             target_layer_ids=(0,) * drafter.num_taps,
                             layer_types=None if kinds is None else tuple(kinds[:1]))
    return t1, d1


def xla_cost(fn, *args) -> dict:
    """``{"flops", "bytes"}`` from XLA's cost analysis of ``jax.jit(fn)`` compiled for ``args``
    (arrays or ShapeDtypeStructs: nothing is run)."""
    import jax

    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
        analysis = analysis[0]
    return {"flops": float(analysis["flops"]), "bytes": float(analysis["bytes accessed"])}


def xla_programs(target: TargetConfig, drafter: DrafterConfig, block_size: int, cache_len: int):
    """The project's own programs for one AR step, one verify and one draft (float32), as
    ``{name: (fn, args)}`` over abstract arguments. The draft is the DFlash proposer's ``propose`` on a
    loop state shaped by ``engine.prefill``."""
    import jax
    import jax.numpy as jnp


    key = jax.random.key(0)
    tparams = jax.eval_shape(lambda k: init_target_params(target, k), key)
    dparams = jax.eval_shape(lambda k: init_drafter_params(drafter, k), key)
    cache = jax.eval_shape(lambda: KVCache.for_config(target, 1, cache_len))
    proposer = DFlashProposer(drafter)
    spec = engine.EngineSpec(target=target, proposer=proposer, block_size=block_size,
                             sampling=SamplingParams())
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    state = jax.eval_shape(
        functools.partial(engine.prefill, spec=spec, cache_len=cache_len),
        tparams, dparams, ints(1, 8), ints(1), ints(1), ints(1, 1), key)

    def run_target(taps, p, tokens, c):
        return forward(target, p, tokens, tokens, c, tap_layer_ids=taps)

    def draft(tp, dp, state, key):
        return proposer.propose(spec, tp, dp, state.proposer, engine.committed(state), key)

    return {
        "ar_step": (functools.partial(run_target, ()), (tparams, ints(1, 1), cache)),
        "verify": (functools.partial(run_target, drafter.target_layer_ids),
                   (tparams, ints(1, block_size), cache)),
        "draft": (draft, (tparams, dparams, state, key)),
    }


def formula_programs(target: TargetConfig, drafter: DrafterConfig, block_size: int,
                     cache_len: int) -> dict:
    """The roofline's counts for the programs of :func:`xla_programs` (float32, dense cache)."""
    kw = dict(weight_bytes=4, kv_bytes=4, dense_cache=cache_len)
    return {"ar_step": ar_step(target, cache_len, **kw),
            "verify": target_forward(target, block_size, cache_len, taps=drafter.num_taps, **kw),
            "draft": drafter_forward(drafter, target, block_size, cache_len, block_size, **kw)}


def gather_charge(target: TargetConfig, rows: int) -> float:
    """Bytes XLA's cost analysis charges for gathering ``rows`` rows of the float32 embedding
    table, measured on the gather alone: for more than one row it charges the whole table
    (a worst-case bound; the gather reads only the rows), for one row (a dynamic slice) the row."""
    import jax
    import jax.numpy as jnp

    table = jax.ShapeDtypeStruct((target.vocab_size, target.hidden_size), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, rows), jnp.int32)
    return xla_cost(lambda w, i: jnp.take(w, i, axis=0), table, ids)["bytes"]


def xla_check(target: TargetConfig, drafter: DrafterConfig, block_size: int, cache_len: int) -> dict:
    """Roofline counts vs XLA's cost analysis of the compiled CPU programs, for 1-layer versions
    of the pair: per program the formula's and XLA's FLOPs and bytes and their ratios
    (XLA / formula); ``bytes_ratio_gather_corrected`` replaces XLA's charge for the embedding
    gather (:func:`gather_charge`) by the bytes of the rows gathered."""
    t1, d1 = one_layer(target, drafter)
    formulas = formula_programs(t1, d1, block_size, cache_len)
    gathered_rows = {"ar_step": 1, "verify": block_size, "draft": block_size}
    out = {}
    for name, (fn, args) in xla_programs(t1, d1, block_size, cache_len).items():
        xla = xla_cost(fn, *args)
        mine = {"flops": total(formulas[name], "flops"), "bytes": total(formulas[name], "bytes")}
        rows = gathered_rows[name]
        corrected = xla["bytes"] - gather_charge(t1, rows) + rows * t1.hidden_size * 4
        out[name] = {"formula_flops": mine["flops"], "xla_flops": xla["flops"],
                     "flops_ratio": xla["flops"] / mine["flops"],
                     "formula_bytes": mine["bytes"], "xla_bytes": xla["bytes"],
                     "bytes_ratio": xla["bytes"] / mine["bytes"],
                     "xla_bytes_gather_corrected": corrected,
                     "bytes_ratio_gather_corrected": corrected / mine["bytes"]}
    return {"layers": 1, "cache_len": cache_len, "block_size": block_size, "dtype": "float32",
            "programs": out}


# ---------------------------------------------------------------------------- the report
def analyse(target: TargetConfig, drafter: DrafterConfig, block_size: int, context: int,
            devices: Sequence[str], taus: dict, *, batch: int = 1, weight_bytes: int = 2,
            block_sizes: Sequence[int] = BLOCK_SIZES) -> dict:
    """Every device's roofline: times, ratio, component breakdown, predicted speedups at
    ``taus`` ({label: tau}), the ratio per block size and the best block size per tau."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=weight_bytes)
    ar, it = ar_step(target, context, **kw), dflash_iteration(target, drafter, block_size, context, **kw)
    sizes = sorted(set(block_sizes) | {block_size})
    grid = [float(t) for t in range(1, max(sizes) + 1)]
    results = {}
    for name in devices:
        dev = DEVICES[name]
        t_ar, t_iter = seconds(ar, dev), seconds(it, dev)
        ratios = {bs: step_times(target, drafter, bs, context, dev, **kw)["ratio"]
                  for bs in sorted(set(sizes) | set(CURVE_BLOCK_SIZES))}
        results[name] = {
            "t_ar_us": 1e6 * t_ar, "t_iter_us": 1e6 * t_iter, "ratio": t_iter / t_ar,
            "speedup": {label: predicted_speedup(tau, t_ar, t_iter) for label, tau in taus.items()},
            "paper_implied_ratio": PAPER_IMPLIED_RATIO,
            "gap_to_paper_us": PAPER_IMPLIED_RATIO * 1e6 * t_ar - 1e6 * t_iter,
            "component_us": {step: [1e6 * c.seconds(dev) for c in costs]
                             for step, costs in (("ar_step", ar), ("iteration", it))},
            "component_bound": {step: [c.bound(dev) for c in costs]
                                for step, costs in (("ar_step", ar), ("iteration", it))},
            "ratio_by_block_size": {str(bs): r for bs, r in ratios.items()},
            "compute_bound_from_block_size": compute_bound_block_size(target, drafter, context,
                                                                      dev, **kw),
            "best_block_size": best_block_sizes({bs: ratios[bs] for bs in sizes}, grid, block_size),
        }
    return {"ar_step": {"flops": total(ar, "flops"), "bytes": total(ar, "bytes")},
            "iteration": {"flops": total(it, "flops"), "bytes": total(it, "bytes")},
            "components": {"ar_step": [c.to_dict() for c in ar],
                           "iteration": [c.to_dict() for c in it]},
            "block_sizes": sizes, "devices": results}


def markdown(report: dict) -> str:
    """The report's tables: per device, then the iteration's components, then the cross-check."""
    s = report["settings"]
    taus = report["taus"]
    head = ("| device | t_AR (us) | t_iter (us) | t_iter / t_AR | "
            + " | ".join(f"speedup at tau {t:.2f} ({label})" for label, t in taus.items())
            + " | paper's implied t_iter / t_AR | gap (us) | compute-bound from bs |")
    lines = [f"`{report['command']}`", "",
             f"{report['pair']['name']}: target {report['pair']['target_params'] / 1e6:.1f}M "
             f"params, drafter {report['pair']['drafter_params'] / 1e6:.1f}M "
             f"({report['pair']['drafter_layers']} layers, {report['pair']['taps']} taps); block "
             f"{s['block_size']}, context S = {s['context']}, batch {s['batch']}, {s['dtype']}. "
             f"Per step: AR {report['analysis']['ar_step']['bytes'] / 1e9:.3f} GB and "
             f"{report['analysis']['ar_step']['flops'] / 1e9:.2f} GFLOP, iteration "
             f"{report['analysis']['iteration']['bytes'] / 1e9:.3f} GB and "
             f"{report['analysis']['iteration']['flops'] / 1e9:.2f} GFLOP.", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in report["analysis"]["devices"].items():
        lines.append(f"| {DEVICES[name].name} | {r['t_ar_us']:.1f} | {r['t_iter_us']:.1f} | "
                     f"{r['ratio']:.3f} | " + " | ".join(f"{v:.2f}x" for v in r["speedup"].values())
                     + f" | {r['paper_implied_ratio']:.3f} | {r['gap_to_paper_us']:+.1f} | "
                     f"{r['compute_bound_from_block_size'] or '> 4096'} |")
    lines += ["", "(gap: the extra time per iteration, over the roofline's, that the paper's "
              f"{PAPER['speedup']}x at tau {PAPER['tau']} implies if its AR step ran at the roofline. "
              "compute-bound from bs: the block size from which the verify's target linears are "
              "compute-bound; below it every component is memory-bound and t_iter / t_AR is a "
              "ratio of bytes, the same on every device.)"]
    lines += ["", *_component_table(report), "", *_block_size_table(report)]
    if report.get("xla_check"):
        lines += ["", *_xla_table(report["xla_check"])]
    return "\n".join(lines) + "\n"


def _component_table(report: dict) -> list[str]:
    dev = report["settings"]["plot_device"]
    r = report["analysis"]["devices"][dev]
    lines = [f"Components on {DEVICES[dev].name} (time = max(bytes / bandwidth, FLOPs / peak), "
             "summed):", "",
             "| step | component | weights (MB) | KV read (MB) | KV write (MB) | activations (MB) "
             "| GFLOP | us | bound |", "|---|---|---|---|---|---|---|---|---|"]
    for step, costs in report["analysis"]["components"].items():
        for c, us, bound in zip(costs, r["component_us"][step], r["component_bound"][step]):
            lines.append(f"| {step} | {c['name']} | {c['weights'] / 1e6:.2f} | {c['kv_read'] / 1e6:.2f} | "
                         f"{c['kv_write'] / 1e6:.3f} | {c['activations'] / 1e6:.3f} | "
                         f"{c['flops'] / 1e9:.3f} | {us:.2f} | {bound} |")
    return lines


def _block_size_table(report: dict) -> list[str]:
    dev = report["settings"]["plot_device"]
    r = report["analysis"]["devices"][dev]
    bs = report["settings"]["block_size"]
    ratios = {k: v for k, v in r["ratio_by_block_size"].items()
              if int(k) in report["analysis"]["block_sizes"]}
    lines = [f"t_iter / t_AR by block size on {DEVICES[dev].name}: "
             + ", ".join(f"bs {k}: {v:.3f}" for k, v in ratios.items()), "",
             f"Best block size per tau on {DEVICES[dev].name} (fixed: tau the same at every block "
             f"size >= tau; geometric: tau measured at bs {bs}, per-row acceptance alpha fitted to "
             "it, tau(bs) = (1 - alpha^bs) / (1 - alpha)):", "",
             _geometric_check(), "",
             "| tau | fixed: best bs | speedup | alpha | geometric: best bs | speedup | "
             f"speedup at bs {bs} |", "|---|---|---|---|---|---|---|"]
    for row in r["best_block_size"]:
        if row["tau"] not in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16):
            continue
        geo = (f"{row['alpha']:.3f} | {row['geometric_best_bs']} | {row['geometric_speedup']:.2f}x | "
               f"{row['geometric_speedup_at_reference']:.2f}x" if "alpha" in row else "- | - | - | -")
        fixed = (f"{row['fixed_best_bs']} | {row['fixed_speedup']:.2f}x" if row["fixed_best_bs"]
                 else "- | -")
        lines.append(f"| {row['tau']:g} | {fixed} | {geo} |")
    return lines


def _geometric_check() -> str:
    """One line: the geometric model against the paper's block-size ablation."""
    ab = PAPER_BS_ABLATION
    alpha = alpha_for_tau(ab["tau_bs16"], 16)
    return (f"(Check of the geometric model on the paper's ablation, {ab['set']}: tau "
            f"{ab['tau_bs16']} at bs 16 gives alpha {alpha:.3f} and predicts tau "
            f"{geometric_tau(alpha, 8):.2f} at bs 8; measured {ab['tau_bs8_trained_at_16']} "
            f"(trained at 16) and {ab['tau_bs8_trained_at_8']} (trained at 8).)")


def _xla_table(check: dict) -> list[str]:
    lines = [f"Cross-check against XLA's cost analysis of the compiled CPU programs (1-layer "
             f"versions of the pair, float32, cache of {check['cache_len']} slots read densely, "
             f"block {check['block_size']}); ratio = XLA / formula:", "",
             "| program | formula GFLOP | XLA GFLOP | ratio | formula MB | XLA MB | ratio | "
             "ratio, gather corrected |", "|---|---|---|---|---|---|---|---|"]
    for name, p in check["programs"].items():
        lines.append(f"| {name} | {p['formula_flops'] / 1e9:.4f} | {p['xla_flops'] / 1e9:.4f} | "
                     f"{p['flops_ratio']:.4f} | {p['formula_bytes'] / 1e6:.2f} | "
                     f"{p['xla_bytes'] / 1e6:.2f} | {p['bytes_ratio']:.3f} | "
                     f"{p['bytes_ratio_gather_corrected']:.3f} |")
    lines += ["", "XLA also counts the FLOPs of the elementwise ops (norms, RoPE, softmax, SwiGLU, "
              "masks) that the formula leaves out. Its bytes charge a gather of more than one row "
              "with the whole embedding table (measured on the gather alone and replaced by the "
              "rows gathered in the last column); the rest is what this CPU program moves beyond "
              "the floor: a copy and a transpose of the cache buffers (not donated here), the "
              "activations between its unfused kernels, the draft logits read back by the argmax, "
              "and the drafter's k/v weights read twice (context rows and block rows are two "
              "separate projections). It shrinks as the widths grow: weights grow with D^2, "
              "activations with D."]
    return lines


def plot(report: dict):
    """Three panels: predicted speedup against tau per block size, the same under the geometric
    acceptance model, and t_iter / t_AR against block size per device."""
    dev = report["settings"]["plot_device"]
    r = report["analysis"]["devices"][dev]
    ratios = {int(k): v for k, v in r["ratio_by_block_size"].items()
              if int(k) in report["analysis"]["block_sizes"]}
    fig, (a, b, c) = new_figure(1, 3, figsize=(16, 4.4))
    _plot_speedup_vs_tau(a, report, ratios)
    _plot_geometric(b, ratios)
    _plot_ratio_vs_block_size(c, report)
    fig.suptitle(f"roofline: {report['pair']['name']}, {report['settings']['dtype']}, batch "
                 f"{report['settings']['batch']}, context S = {report['settings']['context']}, "
                 f"panels 1-2 on {DEVICES[dev].name}")
    return fig


def _plot_speedup_vs_tau(ax, report: dict, ratios: dict) -> None:
    """tau / (t_iter / t_AR) for tau up to each block size, the best block size, the paper."""
    rows = report["analysis"]["devices"][report["settings"]["plot_device"]]["best_block_size"]
    for bs, ratio in ratios.items():
        tau = np.linspace(1, bs, 64)
        ax.plot(tau, tau / ratio, label=f"bs {bs} (t_iter / t_AR {ratio:.3f})")
    best = [row for row in rows if row["fixed_best_bs"]]
    ax.plot([row["tau"] for row in best], [row["fixed_speedup"] for row in best], "k:", lw=2,
            label="best bs (smallest >= tau)")
    tau = np.linspace(1, max(ratios), 64)
    ax.plot(tau, tau / PAPER_IMPLIED_RATIO, "r--", lw=0.8,
            label=f"t_iter / t_AR = {PAPER_IMPLIED_RATIO:.3f} (the paper's, implied)")
    ax.plot([PAPER["tau"]], [PAPER["speedup"]], "r*", ms=12, label="paper, measured (H200)")
    for label, t in report["taus"].items():
        ax.axvline(t, color="gray", lw=0.6, ls="--")
        ax.text(t, 0.3, f" tau {t:.2f} ({label})", rotation=90, fontsize=7, va="bottom")
    ax.set(xlabel="tau (mean acceptance length, <= bs)", ylabel="predicted speedup (x)",
           ylim=(0, None), title="speedup = tau * t_AR / t_iter")
    ax.legend(fontsize=7)


def _plot_geometric(ax, ratios: dict) -> None:
    """Speedup against the per-row acceptance alpha when tau(bs) follows the geometric model."""
    alphas = np.linspace(0.3, 0.97, 68)
    for bs, ratio in ratios.items():
        ax.plot(alphas, [geometric_tau(x, bs) / ratio for x in alphas], label=f"bs {bs}")
    ax.plot(alphas, [max(geometric_tau(x, bs) / r for bs, r in ratios.items()) for x in alphas],
            "k:", lw=2, label="best bs")
    ax.set(xlabel="per-row acceptance alpha (tau(bs) = (1 - alpha^bs) / (1 - alpha))",
           ylabel="predicted speedup (x)", title="geometric acceptance model")
    ax.legend(fontsize=7)


def _plot_ratio_vs_block_size(ax, report: dict) -> None:
    """t_iter / t_AR against block size (log) for every device, and the paper's implied ratio."""
    for name, res in report["analysis"]["devices"].items():
        items = sorted((int(k), v) for k, v in res["ratio_by_block_size"].items())
        ax.plot([k for k, _ in items], [v for _, v in items], "o-", ms=3, label=DEVICES[name].name)
    ax.axhline(PAPER_IMPLIED_RATIO, color="r", ls="--",
               label=f"paper, implied ({PAPER_IMPLIED_RATIO:.3f})")
    ax.set(xscale="log", xlabel="block size", ylabel="t_iter / t_AR",
           title="iteration cost against block size")
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------------- command line
def load_pair(args) -> tuple[str, TargetConfig, DrafterConfig]:
    """(name, target, drafter) from --target/--drafter directories, or Qwen3-8B's shapes with
    a --drafter-layers drafter shaped like it (the released recipe)."""
    if args.target:
        if not args.drafter:
            raise ValueError("--target needs --drafter (a DFlash drafter directory or config.json)")
        # a repo id: only its config.json is fetched (the shapes are all this model needs)
        target = TargetConfig.from_pretrained(resolve_checkpoint(args.target, kind="target", files="config"))
        drafter = DrafterConfig.from_pretrained(resolve_checkpoint(args.drafter, kind="drafter", files="config"))
        drafter.check_target(target)
        return args.name or _directory_name(args.target), target, drafter
    if args.drafter:
        raise ValueError("--drafter needs --target (its target's directory or config.json)")
    target = TargetConfig(**PRESETS["qwen3-8b"])
    drafter = DrafterConfig.for_target(target, args.drafter_layers, block_size=16,
                                       mask_token_id=QWEN3_MASK_TOKEN_ID)
    return args.name or "qwen3-8b", target, drafter


def _directory_name(path: str) -> str:
    """A checkpoint's name: its directory (the file's directory for a config.json)."""
    path = os.path.abspath(path)
    return os.path.basename(os.path.dirname(path) if path.endswith(".json") else path)


def bench_tau(path: str) -> float:
    """The average tau of a ``python -m dflash_jax bench`` result file (bench.json)."""
    with open(path) as f:
        report = json.load(f)
    try:
        return float(report["average"]["tau"])
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no average tau: is it a bench.json of "
                         "'python -m dflash_jax bench'?") from None


def _drafter_params(drafter: DrafterConfig) -> int:
    """The drafter's parameter count: its method's size model (fc [k*D, D], hidden_norm and
    norm [D], its layers)."""
    return DFLASH.num_params(drafter)


def add_arguments(p) -> None:
    p.add_argument("--target", metavar="CHECKPOINT",
                   help="a target directory or config.json, a Hugging Face repo id org/name[@revision] "
                        "(only its config.json is downloaded) or 'embedded' (default: Qwen3-8B's shapes)")
    p.add_argument("--drafter", metavar="CHECKPOINT",
                   help="a DFlash drafter, named the same way (with --target)")
    p.add_argument("--name", help="the pair's name in the report and file names (default: the "
                   "target directory's name, or qwen3-8b)")
    p.add_argument("--drafter-layers", type=int, default=5,
                   help="layers of the drafter shaped like Qwen3-8B (without --target)")
    p.add_argument("--block-size", type=int, help="block size (default: the drafter's)")
    p.add_argument("--context", type=int, default=1024, help="cached positions S at the step")
    p.add_argument("--batch", type=int, default=1, help="batch size (sequences decoded together)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES),
                   help="compute dtype of the modelled pair: bytes per weight and KV cache element")
    p.add_argument("--tau", type=float, nargs="+", default=[PAPER["tau"]],
                   help="acceptance lengths to predict the speedup at (default: the paper's)")
    p.add_argument("--bench-json", help="a bench.json whose average tau is added as 'ours'")
    p.add_argument("--devices", nargs="+", default=list(DEVICES), choices=list(DEVICES),
                   help="device profiles (datasheet, or measured by this project)")
    p.add_argument("--plot-device", default=PAPER["device"], choices=list(DEVICES),
                   help="device of the speedup plot and the component table")
    p.add_argument("--xla-cache-len", type=int, default=256,
                   help="cache slots of the XLA cross-check programs")
    p.add_argument("--no-xla-check", action="store_true", help="skip the XLA cross-check")
    p.add_argument("--moe", nargs="+", metavar="MODEL",
                   help="mixture-of-experts targets instead of the dense pair: named configs ("
                        "gpt-oss-120b, gpt-oss-20b, qwen3-coder-30b-a3b, deepseek-v3, kimi-k2.5: "
                        "their scenarios, e.g. gpt-oss-120b on 8 x B200 with TP and EP) or "
                        "qwen3_moe / gpt_oss / deepseek_v3 (kimi_k2, kimi_k25) config.json paths "
                        "(tools/roofline_moe.py); writes moe.{json,md,png}")
    p.add_argument("--moe-devices", nargs="+", choices=list(DEVICES),
                   help="with --moe: single-GPU profiles to predict on instead of the named scenarios")
    p.add_argument("--hybrid", nargs="+", metavar="MODEL",
                   help="hybrid linear-attention targets instead of the dense pair: named configs "
                        "(qwen3.5-27b, qwen3.5-4b) or qwen3_5_text config.json paths, both GDN "
                        "rollback modes on H100 and B200 (tools/roofline_hybrid.py); writes "
                        "roofline_hybrid.{json,md,png}")
    p.add_argument("--gemma4", nargs="+", metavar="MODEL",
                   help="Gemma 4 targets instead of the dense pair: named configs (gemma-4-31b, "
                        "gemma-4-26b-a4b) or config.json paths, on H100 and B200 at contexts 1024, 8192 "
                        "and 32768, sliding layers reading their window (tools/roofline_gemma4.py); "
                        "writes roofline_gemma4.{json,md,png}")
    p.add_argument("--tree", nargs="*", type=int, metavar="N",
                   help="verify a tree of N draft nodes per iteration instead of the chain: the predicted "
                        "speedup at each of these node budgets N (default 16 32 64 128 256) with the best one "
                        "marked, from a measured tau curve (--tau-curve) scaled to the paper's tau "
                        "(tools/roofline_tree.py); writes tree_<pair>_....{json,md,png}")
    p.add_argument("--tau-curve", metavar="FILE",
                   help='with --tree: JSON {"chain": TAU, "trees": {"16": TAU, ...}, "block_size": 16, '
                        '"source": "..."}, the measured tau of the chain and of trees')
    p.add_argument("--family", action="store_true",
                   help="the DFlash family (DFlash, DFlash2, DSpark) on the dense target: each method's draft "
                        "from its size model, the verify, the speedup at the published tau "
                        "(tools/roofline_methods.py); writes methods_<pair>_....{json,md,png}")
    p.add_argument("--eagle3", action="store_true",
                   help="EAGLE-3 against DFlash: draft and verify time per iteration and the speedup at the "
                        "paper's tau, the EAGLE-3 chain of --eagle3-steps sequential 1-layer steps and its "
                        "trees against DFlash's one pass (tools/roofline_eagle3.py); writes "
                        "eagle3_<pair>_....{json,md,png}")
    p.add_argument("--eagle3-steps", type=int, default=7,
                   help="with --eagle3: drafting steps k per iteration (the tree depth; default 7)")
    p.add_argument("--eagle3-trees", nargs="*", default=["16:4", "60:10"], metavar="N:TOPK",
                   help="with --eagle3: EAGLE-3 trees, node budget and children per node (default 16:4 60:10, "
                        "the paper's 16 and 60 nodes)")
    p.add_argument("--eagle3-draft-vocab", type=int, default=32000,
                   help="with --eagle3: the EAGLE-3 drafter's draft vocabulary (default 32000, the released "
                        "Qwen3-8B drafters')")
    p.add_argument("--throughput", action="store_true",
                   help="throughput against interactivity: aggregate and per-user tokens/s of AR and DFlash "
                        "(the drafter's block and the best block per batch) for batch sizes 1 ... 1024 as memory "
                        "allows, at the paper's tau per prompt set, Qwen3-8B on one H100 and one B200 and "
                        "gpt-oss-120b on 8 x B200 (tools/roofline_throughput.py); writes gpu_predicted.{json,md,png}")
    p.add_argument("--out", default="runs/roofline", help="output directory")


def check_args(args) -> None:
    """Refuses settings the model cannot describe, naming the option."""
    for name in ("context", "batch", "drafter_layers", "xla_cache_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.block_size < 2:
        raise ValueError(f"--block-size must be >= 2 (one anchor and at least one draft row), "
                         f"got {args.block_size}")
    if any(t < 1 for t in args.tau):
        raise ValueError(f"--tau values are mean acceptance lengths (bonus included), >= 1: {args.tau}")
    if args.plot_device not in args.devices:
        raise ValueError(f"--plot-device {args.plot_device} is not among --devices {args.devices}")
    if not args.no_xla_check and args.xla_cache_len < args.block_size:
        raise ValueError(f"--xla-cache-len {args.xla_cache_len} must hold a block of {args.block_size}")


def run(args) -> dict:
    if getattr(args, "throughput", False):
        from dflash_jax.tools import roofline_throughput

        return roofline_throughput.run_throughput(args)
    if getattr(args, "family", False):
        from dflash_jax.tools import roofline_methods

        if args.moe or args.hybrid or args.tree is not None or args.eagle3:
            raise ValueError("--family models dense targets with the DFlash family's chains: leave out --moe, "
                             "--hybrid, --tree and --eagle3")
        return roofline_methods.run_methods(args)
    if getattr(args, "eagle3", False):
        from dflash_jax.tools import roofline_eagle3

        if args.moe or args.hybrid or args.tree is not None:
            raise ValueError("--eagle3 models dense targets with chain or EAGLE-3 trees: leave out --moe, "
                             "--hybrid and --tree")
        return roofline_eagle3.run_eagle3(args)
    if args.tree is not None:
        from dflash_jax.tools import roofline_tree

        if args.moe:
            raise ValueError("--tree models dense and hybrid targets: leave out --moe")
        if args.hybrid:
            from dflash_jax.tools import roofline_hybrid_tree

            return roofline_hybrid_tree.run_hybrid_tree(args)
        return roofline_tree.run_tree(args)
    if args.tau_curve:
        raise ValueError("--tau-curve is the measured tau of trees: it goes with --tree")
    if getattr(args, "gemma4", None):
        from dflash_jax.tools import roofline_gemma4

        if args.target or args.moe or args.hybrid:
            raise ValueError("--gemma4 names its targets itself: leave out --target, --moe and --hybrid")
        return roofline_gemma4.run_gemma4(args)
    if args.hybrid:
        from dflash_jax.tools import roofline_hybrid

        if args.target or args.moe:
            raise ValueError("--hybrid names its targets itself: leave out --target and --moe")
        return roofline_hybrid.run_hybrid(args)
    if args.moe:
        from dflash_jax.tools import roofline_moe

        if args.target:
            raise ValueError("--moe names its targets itself: leave out --target")
        return roofline_moe.run_moe(args)
    name, target, drafter = load_pair(args)
    args.block_size = args.block_size or drafter.block_size
    check_args(args)
    taus = {"ours": bench_tau(args.bench_json)} if args.bench_json else {}
    taus |= {("paper" if t == PAPER["tau"] else f"tau {t:g}"): t for t in args.tau}
    report = {
        "benchmark": "roofline",
        "command": command_line("dflash_jax", invocation(args)),
        "pair": {"name": name, "target": target.to_hf_dict(), "drafter": drafter.to_hf_dict(),
                 "target_params": target.num_params(), "drafter_params": _drafter_params(drafter),
                 "drafter_layers": drafter.num_layers, "taps": drafter.num_taps},
        "settings": {"block_size": args.block_size, "context": args.context, "batch": args.batch,
                     "dtype": args.dtype, "plot_device": args.plot_device,
                     "bench_json": args.bench_json},
        "taus": taus,
        "paper": PAPER | {"implied_ratio": PAPER_IMPLIED_RATIO},
        "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in args.devices},
        "analysis": analyse(target, drafter, args.block_size, args.context, args.devices, taus,
                            batch=args.batch, weight_bytes=DTYPE_BYTES[args.dtype]),
        "xla_check": None if args.no_xla_check else xla_check(target, drafter, args.block_size,
                                                              args.xla_cache_len),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    stem = (f"{name}_d{drafter.num_layers}_bs{args.block_size}_S{args.context}"
            f"_b{args.batch}")
    return publish_report(report, args.out, stem, plot, markdown)


def main(argv=None) -> dict:
    return command_main("roofline", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
