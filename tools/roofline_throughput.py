"""Throughput against interactivity predicted on GPUs by the roofline (``roofline --throughput``).

For each scenario (Qwen3-8B with its 5-layer drafter on one H100 and on one B200; gpt-oss-120b
with its released 8-layer drafter on 8 x B200, tensor parallel, MXFP4 experts) and each batch
size B = 1, 2, 4, ..., 1024 that fits its memory, one step of every method is costed by the roofline models
(:mod:`dflash_jax.tools.roofline`, :mod:`dflash_jax.tools.roofline_moe`; collectives from
:mod:`dflash_jax.tools.parallel_comm`):

  AR            one target row per user per step: t = t_AR(B), per-user tokens/s 1 / t.
  DFlash fixed  the drafter's own block bs0 (16 for Qwen3-8B, 10 for gpt-oss-120b): draft the
                block, verify B x bs0 rows; per-user tokens/s tau / t_iter(bs0, B).
  DFlash best   per batch, the verify length bs in 2 ... bs0 that maximises the predicted
                throughput, tau(bs) / t_iter(bs, B), with tau(bs) from the geometric
                acceptance model fitted to the paper's tau at bs0.

Aggregate tokens/s = B x per-user. Weights are read once per step for the whole batch; K/V,
attention, logits and FLOPs grow with B x rows (the cost functions' ``batch``). A component's
time is max(bytes / bandwidth, FLOPs / peak), a step the sum over components plus, on 8 GPUs,
its collectives (ring all-reduce, latency L each). The draft and the verify do not overlap.

The verify turns compute-bound at the first batch where the target forward's FLOPs / peak
exceed its bytes / bandwidth (every component summed; also given for its linears alone, the
largest component, which the dense roofline's ``compute_bound_block_size`` looks at). A batch
is refused where the pair's weights and the K/V of B sequences at their final length exceed
``parallel_comm.MEMORY_FRACTION`` of one GPU's memory (the sweep stops there and says so).

tau per prompt set is the paper's (Qwen3-8B, Table 1, T = 0; gpt-oss-120b: its drafter's model
card, gsm8k and mt-bench); MATH-500 is the set of SGLang's serving numbers (B200, Qwen3-8B:
5.1x at concurrency 1, 2.8x at 32, tau 8.01), set beside the predicted speedup at the same
batch; the speedup at a fixed interactivity is read off the curves with
:func:`dflash_jax.bench.throughput.throughput_at`.

    python -m dflash_jax roofline --throughput --out results/throughput/gpu_predicted
    python -m dflash_jax.tools.roofline_throughput --out results/throughput/gpu_predicted
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Mapping, Sequence

import numpy as np

from dflash_jax.bench.throughput import fixed_interactivity, throughput_at
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.tools import parallel_comm as pc
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_moe as moe
from dflash_jax.tools.roofline import DEVICES, Device

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
AR, FIXED, BEST = "ar", "dflash", "best"
METHODS = (AR, FIXED, BEST)
LABELS = {AR: "AR", FIXED: "DFlash, the drafter's block", BEST: "DFlash, best block per batch"}
SEARCH_LIMIT = 4096
"""Largest batch searched for the compute-bound turn (beyond the memory cap too: said so)."""
SGLANG = {"model": "qwen3-8b", "device": "b200", "set": "math500", "tau": 8.01,
          "speedup": {1: 5.1, 32: 2.8},
          "source": "DFlash release notes: SGLang serving, B200, Qwen3-8B, MATH-500, tau 8.01"}
NVIDIA = {"model": "gpt-oss-120b", "speedup": 15.0, "per_user_tokens_per_s": (500.0, 600.0),
          "source": "NVIDIA: up to 15x throughput at a fixed per-user interactivity, gpt-oss-120b, "
                    "TensorRT-LLM, 8 Blackwell GPUs"}


def qwen3_8b_taus() -> dict[str, float]:
    """The paper's Table 1 tau per prompt set (Qwen3-8B, T = 0) and its average."""
    from dflash_jax.experiments import paper_numbers

    return {name: tau for name, (_, tau) in paper_numbers.TABLE1[0.0].items()}


def gpt_oss_taus() -> dict[str, float]:
    """gpt-oss-120b's drafter model card (block 10, H200): gsm8k and mt-bench, and their mean."""
    taus = dict(moe.TAUS["gpt-oss-120b"])
    return taus | {"average": float(np.mean(list(taus.values())))}


# ---------------------------------------------------------------------------- the pairs
@dataclasses.dataclass(frozen=True)
class DensePair:
    """A dense target and its drafter on one GPU; ``context``: the mean cached positions S of a
    step, ``final_context``: a sequence's cache at its end (what memory must hold)."""

    target: TargetConfig
    drafter: DrafterConfig
    context: int
    final_context: int
    weight_bytes: int = 2

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    def _kw(self, batch: int) -> dict:
        return dict(batch=batch, weight_bytes=self.weight_bytes, kv_bytes=self.weight_bytes)

    def ar(self, batch: int, device: Device) -> tuple[list, float]:
        """(costs of the AR step, seconds of its collectives)."""
        return dense.ar_step(self.target, self.context, **self._kw(batch)), 0.0

    def iteration(self, bs: int, batch: int, device: Device) -> tuple[list, float]:
        return dense.dflash_iteration(self.target, self.drafter, bs, self.context, **self._kw(batch)), 0.0

    def verify(self, bs: int, batch: int) -> list:
        """The target forward of the step (bs = 1: the AR step)."""
        taps = self.drafter.num_taps if bs > 1 else 0
        return dense.target_forward(self.target, bs, self.context, taps=taps, **self._kw(batch))

    def memory(self, batch: int) -> dict:
        """Bytes on the GPU: the pair's weights, the K/V of ``batch`` sequences at the end."""
        return pc.memory_per_device(self.target, self.drafter, 1, batch, self.final_context,
                                    self.weight_bytes, self.weight_bytes)


@dataclasses.dataclass(frozen=True)
class MoePair:
    """A mixture-of-experts target and its (dense) drafter over ``layout.devices`` GPUs with
    NVLink of ``node`` (a :data:`parallel_comm.NODES` key), collectives of latency ``latency_us``."""

    shape: moe.MoeShape
    drafter: DrafterConfig
    layout: moe.Layout
    context: int
    final_context: int
    node: str = "b200"
    latency_us: float = pc.LATENCY_US

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    def _comm(self, drafter, rows: int, batch: int) -> float:
        p = self.layout.devices
        colls = moe.collectives(self.shape, drafter, rows, p, batch,
                                replicate_attention=self.layout.replicate_attention)
        return moe.comm_seconds(colls, p, self.node, self.latency_us)

    def ar(self, batch: int, device: Device) -> tuple[list, float]:
        return moe.ar_step(self.shape, self.context, self.layout, batch=batch), self._comm(None, 1, batch)

    def iteration(self, bs: int, batch: int, device: Device) -> tuple[list, float]:
        costs = moe.dflash_iteration(self.shape, self.drafter, bs, self.context, self.layout, batch=batch)
        return costs, self._comm(self.drafter, bs, batch)

    def verify(self, bs: int, batch: int) -> list:
        taps = self.drafter.num_taps if bs > 1 else 0
        return moe.moe_target_forward(self.shape, bs, self.context, self.layout, taps=taps, batch=batch)

    def memory(self, batch: int) -> dict:
        """Bytes on one GPU: every weight split evenly over the GPUs (experts at the layout's
        bytes, the rest bf16), the K/V of ``batch`` sequences at the end (sliding layers keep
        their window), the drafter's K/V included."""
        s, p, d = self.shape, self.layout.devices, self.drafter
        expert = s.moe_layers * s.num_experts * (moe.expert_matrix_params(s) + moe.expert_vector_params(s))
        expert_bytes = s.moe_layers * s.num_experts * (moe.expert_matrix_params(s) * self.layout.expert_bytes
                                                       + moe.expert_vector_params(s) * 2)
        weights = ((moe.num_params(s) - expert) * 2 + expert_bytes + dense._drafter_params(d) * 2) / p
        n = self.final_context
        positions = s.full_layers * n + s.sliding_layers * min(n, s.sliding_window or n)
        per_seq = (positions * 2 * s.num_kv_heads * s.head_dim * 2
                   + d.num_layers * n * 2 * d.num_kv_heads * d.head_dim * 2) / p
        return {"weights": weights, "kv": batch * per_seq, "total": weights + batch * per_seq}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One panel: ``pair`` on ``device`` (``gpus`` of them), ``memory`` bytes of HBM per GPU,
    the acceptance lengths ``taus`` {prompt set: tau at the drafter's block}, ``plot_set`` the
    set its plot and headline use."""

    key: str
    label: str
    pair: DensePair | MoePair
    device: Device
    memory: float
    taus: Mapping[str, float]
    plot_set: str
    gpus: int = 1


def scenarios(context: int, final_context: int, drafter_layers: int = 5, weight_bytes: int = 2,
              target: TargetConfig | None = None, drafter: DrafterConfig | None = None) -> list[Scenario]:
    """The three scenarios of the committed report."""
    if target is None:
        target = TargetConfig(**dense.PRESETS["qwen3-8b"])
        drafter = DrafterConfig.for_target(target, drafter_layers, block_size=16,
                                           mask_token_id=dense.QWEN3_MASK_TOKEN_ID)
    qwen = DensePair(target, drafter, context, final_context, weight_bytes)
    name, shape, oss_drafter = moe.pair("gpt-oss-120b")
    oss = MoePair(shape, oss_drafter, moe.Layout(8, "tp", moe.MXFP4_BYTES), context, final_context, "b200")
    budget = lambda key: pc.MEMORY_FRACTION * pc.NODES[key].memory
    return [Scenario("qwen3-8b_h100", "Qwen3-8B, 1 x H100", qwen, DEVICES["h100"], budget("h100"),
                     qwen3_8b_taus(), "math500"),
            Scenario("qwen3-8b_b200", "Qwen3-8B, 1 x B200", qwen, DEVICES["b200"], budget("b200"),
                     qwen3_8b_taus(), "math500"),
            Scenario("gpt-oss-120b_8xb200", "gpt-oss-120b, 8 x B200 (TP 8, MXFP4 experts)", oss,
                     DEVICES["b200"], budget("b200"), gpt_oss_taus(), "gsm8k", gpus=8)]


# ---------------------------------------------------------------------------- one point
def check_memory(sc: Scenario, batch: int) -> dict:
    """The memory of ``batch`` sequences on one GPU; a ValueError past the scenario's budget."""
    mem = sc.pair.memory(batch)
    if mem["total"] > sc.memory:
        raise ValueError(f"batch {batch} does not fit {sc.label}: weights {mem['weights'] / 1e9:.1f} GB + "
                         f"K/V {mem['kv'] / 1e9:.1f} GB per GPU exceed the {sc.memory / 1e9:.1f} GB budget "
                         f"({pc.MEMORY_FRACTION:.0%} of its memory); use a smaller batch or a shorter context")
    return mem


def ar_seconds(sc: Scenario, batch: int) -> float:
    costs, comm = sc.pair.ar(batch, sc.device)
    return dense.seconds(costs, sc.device) + comm


def iteration_seconds(sc: Scenario, bs: int, batch: int) -> float:
    costs, comm = sc.pair.iteration(bs, batch, sc.device)
    return dense.seconds(costs, sc.device) + comm


def best_block(sc: Scenario, alpha: float, batch: int) -> tuple[int, float, float]:
    """(bs, tau(bs), t_iter(bs)) maximising tau(bs) / t_iter(bs) over bs = 2 ... the drafter's block."""
    cands = []
    for bs in range(2, sc.pair.block_size + 1):
        tau, t = dense.geometric_tau(alpha, bs), iteration_seconds(sc, bs, batch)
        cands.append((tau / t, bs, tau, t))
    _, bs, tau, t = max(cands)
    return bs, tau, t


def point(sc: Scenario, method: str, batch: int, tau: float) -> dict:
    """One method at one batch: step time, tokens per step per user, per-user and aggregate
    tokens/s (the row layout of :mod:`dflash_jax.bench.throughput`), memory; refuses a batch
    that does not fit."""
    mem = check_memory(sc, batch)
    bs0 = sc.pair.block_size
    if method == AR:
        bs, tokens, t = 1, 1.0, ar_seconds(sc, batch)
    elif method == FIXED:
        bs, tokens, t = bs0, tau, iteration_seconds(sc, bs0, batch)
    elif method == BEST:
        bs, tokens, t = best_block(sc, dense.alpha_for_tau(tau, bs0), batch)
    else:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    per_user = tokens / t
    return {"method": method, "batch": batch, "block_size": bs, "tau": tokens, "step_us": 1e6 * t,
            "per_user_tokens_per_s": {"mean": per_user}, "aggregate_tokens_per_s": batch * per_user,
            "memory_gb": mem["total"] / 1e9}


def bound_times(sc: Scenario, bs: int, batch: int) -> dict:
    """The target forward of ``batch`` x ``bs`` rows: its FLOPs / peak and bytes / bandwidth,
    summed over components and for its linears alone (the first component)."""
    costs = sc.pair.verify(bs, batch)
    dev = sc.device
    return {"compute_s": dense.total(costs, "flops") / dev.peak_flops,
            "memory_s": dense.total(costs, "bytes") / dev.bandwidth,
            "linears_compute_s": costs[0].flops / dev.peak_flops,
            "linears_memory_s": costs[0].bytes / dev.bandwidth}


def compute_bound_batch(sc: Scenario, method: str, tau: float, limit: int = SEARCH_LIMIT) -> dict:
    """The first batch (1 ... ``limit``) at which the method's target forward is compute-bound,
    all components summed (``forward``) and its linears alone (``linears``); None if not
    up to ``limit``. The best-block method uses its chosen block at each batch."""
    bs0 = sc.pair.block_size
    alpha = dense.alpha_for_tau(tau, bs0) if method == BEST else None
    out = {"forward": None, "linears": None}
    for b in range(1, limit + 1):
        bs = {AR: 1, FIXED: bs0}.get(method) or best_block(sc, alpha, b)[0]
        t = bound_times(sc, bs, b)
        if out["forward"] is None and t["compute_s"] > t["memory_s"]:
            out["forward"] = b
        if out["linears"] is None and t["linears_compute_s"] > t["linears_memory_s"]:
            out["linears"] = b
        if out["forward"] is not None and out["linears"] is not None:
            break
    return out


def largest_batch(sc: Scenario, limit: int = SEARCH_LIMIT) -> int:
    """The largest batch whose weights + K/V fit (bisection; memory grows with the batch)."""
    lo, hi = 0, limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sc.pair.memory(mid)["total"] <= sc.memory else (lo, mid)
    return lo


# ---------------------------------------------------------------------------- a scenario
def curves(sc: Scenario, tau: float, batches: Sequence[int] = BATCHES) -> list[dict]:
    """Every method's points at the batches that fit (the sweep stops at the first that does not)."""
    rows = []
    for b in batches:
        if sc.pair.memory(b)["total"] > sc.memory:
            break
        rows += [point(sc, m, b, tau) for m in METHODS]
    return rows


def speedup_at_batch(rows: Sequence[dict], batch: int) -> dict | None:
    """Aggregate of each DFlash method over AR's at the same batch; None if the batch is absent."""
    at = {r["method"]: r for r in rows if r["batch"] == batch}
    if AR not in at:
        return None
    ar = at[AR]["aggregate_tokens_per_s"]
    return {m: at[m]["aggregate_tokens_per_s"] / ar for m in (FIXED, BEST)} | {"best_block_size": at[BEST]["block_size"]}


def at_levels(rows: Sequence[dict], levels: Sequence[float]) -> list[dict]:
    """Aggregate tokens/s of every method at these per-user speeds (interpolated; None where a
    method's curve does not reach) and DFlash's over AR's where both do."""
    from dflash_jax.bench.throughput import curve

    out = []
    for x in levels:
        agg = {m: throughput_at(curve(rows, m), x) for m in METHODS}
        out.append({"per_user_tokens_per_s": x, "aggregate": agg,
                    "speedup": {m: (agg[m] / agg[AR] if agg[m] is not None and agg[AR] else None)
                                for m in (FIXED, BEST)}})
    return out


def analyse(sc: Scenario, batches: Sequence[int] = BATCHES) -> dict:
    """A scenario's curves per prompt set, its headline speedups, compute-bound batches, memory."""
    sets = {}
    for name, tau in sc.taus.items():
        rows = curves(sc, tau, batches)
        sets[name] = {"tau": tau, "alpha": dense.alpha_for_tau(tau, sc.pair.block_size), "rows": rows,
                      "speedup_at_batch": {str(b): speedup_at_batch(rows, b) for b in (1, 32)},
                      "fixed_interactivity": fixed_interactivity(rows, METHODS)}
    plot_tau = sc.taus[sc.plot_set]
    fit = largest_batch(sc)
    swept = [b for b in batches if b <= fit]
    return {"key": sc.key, "label": sc.label, "device": dataclasses.asdict(sc.device), "gpus": sc.gpus,
            "block_size": sc.pair.block_size, "drafter_layers": sc.pair.drafter.num_layers,
            "context": sc.pair.context, "final_context": sc.pair.final_context,
            "memory_budget_gb": sc.memory / 1e9, "largest_batch_that_fits": fit,
            "sweep_stopped": None if len(swept) == len(batches) else
            {"batch": batches[len(swept)], "memory_gb": sc.pair.memory(batches[len(swept)])["total"] / 1e9},
            "plot_set": sc.plot_set,
            "compute_bound_batch": {m: compute_bound_batch(sc, m, plot_tau) for m in METHODS},
            "sets": sets}


# ---------------------------------------------------------------------------- the report
def run_throughput(args) -> dict:
    """``roofline --throughput``: the three scenarios, JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    for flag, bad in (("--moe", args.moe), ("--hybrid", args.hybrid), ("--tree", args.tree is not None),
                      ("--eagle3", args.eagle3), ("--bench-json", args.bench_json),
                      ("--batch", args.batch != 1), ("--tau", list(args.tau) != [dense.PAPER["tau"]]),
                      ("--block-size", args.block_size), ("--target", args.target), ("--drafter", args.drafter)):
        if bad:
            raise ValueError(f"--throughput sweeps its own batch sizes for Qwen3-8B and gpt-oss-120b at the paper's "
                             f"tau per prompt set and the drafters' own blocks: leave out {flag}")
    if dense.DTYPE_BYTES[args.dtype] != 2:
        raise ValueError(f"--throughput models 2-byte weights and K/V (gpt-oss-120b's non-expert weights are bf16): "
                         f"--dtype {args.dtype} is not modelled, use bfloat16 or float16")
    if args.drafter_layers < 1:
        raise ValueError(f"--drafter-layers must be >= 1, got {args.drafter_layers}")
    name, target, drafter = dense.load_pair(args)
    if args.context < 2:
        raise ValueError(f"--context must be >= 2 (a prompt of S / 2 and S new tokens), got {args.context}")
    context, final = args.context, args.context // 2 + args.context
    scs = scenarios(context, final, args.drafter_layers, dense.DTYPE_BYTES[args.dtype], target, drafter)
    report = {
        "benchmark": "roofline_throughput",
        "command": command_line("dflash_jax", invocation(args)),
        "settings": {"pair": name, "context": context, "prompt_len": context // 2, "new_tokens": context,
                     "final_context": final, "dtype": args.dtype, "batches": list(BATCHES),
                     "memory_fraction": pc.MEMORY_FRACTION, "latency_us": pc.LATENCY_US,
                     "methods": {m: LABELS[m] for m in METHODS}},
        "sglang": SGLANG, "nvidia": NVIDIA,
        "scenarios": [analyse(sc) for sc in scs],
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    report["comparison"] = comparison(report, scs)
    return publish_report(report, args.out, "gpu_predicted", plot, markdown)


def _scenario(report: dict, key: str) -> dict:
    return next(s for s in report["scenarios"] if s["key"] == key)


def comparison(report: dict, scs: Sequence[Scenario]) -> dict:
    """The predictions beside SGLang's (B200, Qwen3-8B, MATH-500, at its tau 8.01 too) and
    NVIDIA's gpt-oss-120b claim (aggregate at 500 and 600 tokens/s per user)."""
    out = {}
    b200 = _scenario(report, "qwen3-8b_b200")
    sc = next(s for s in scs if s.key == "qwen3-8b_b200")
    at_sglang_tau = curves(sc, SGLANG["tau"])
    out["sglang"] = {"table1_tau": b200["sets"][SGLANG["set"]]["tau"],
                     "predicted": {str(b): b200["sets"][SGLANG["set"]]["speedup_at_batch"][str(b)] for b in (1, 32)},
                     "predicted_at_sglang_tau": {str(b): speedup_at_batch(at_sglang_tau, b) for b in (1, 32)},
                     "measured": {str(b): v for b, v in SGLANG["speedup"].items()}}
    oss = _scenario(report, "gpt-oss-120b_8xb200")
    out["nvidia"] = {name: {"tau": d["tau"], "levels": at_levels(d["rows"], NVIDIA["per_user_tokens_per_s"]),
                            "ar_batch1_per_user": d["rows"][0]["per_user_tokens_per_s"]["mean"],
                            "per_user_where_speedup_reaches": where_speedup_reaches(d["rows"], NVIDIA["speedup"])}
                     for name, d in oss["sets"].items()}
    return out


def where_speedup_reaches(rows: Sequence[dict], target: float, points: int = 2000) -> dict:
    """Per DFlash method, the lowest per-user speed (on a fine geometric grid over AR's curve)
    at which its aggregate over AR's reaches ``target``; None if nowhere."""
    from dflash_jax.bench.throughput import curve

    xs = [p[0] for p in curve(rows, AR)]
    grid = np.geomspace(min(xs), max(xs), points)
    out = {}
    for m in (FIXED, BEST):
        hits = [lv["per_user_tokens_per_s"] for lv in at_levels(rows, grid)
                if lv["speedup"][m] is not None and lv["speedup"][m] >= target]
        out[m] = float(min(hits)) if hits else None
    return out


def _largest(s: dict) -> str:
    n = s["largest_batch_that_fits"]
    return f">= {n}" if n >= SEARCH_LIMIT else str(n)


def _fmt(x, spec=".2f", suffix="x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [f"`{report['command']}`", "",
             "A model on paper (the roofline of every step, no GPU run). Assumptions:", "",
             f"- context: the mean cached positions of a step S = {st['context']} (a prompt of "
             f"{st['prompt_len']} and {st['new_tokens']} new tokens: prompt + half the output); memory holds "
             f"every sequence's K/V at its end ({st['final_context']} positions); a batch fits when the "
             f"pair's weights + K/V per GPU (the drafter's counted for AR too) stay within {st['memory_fraction']:.0%} of its memory (logits and "
             "other activations are left to the rest);",
             f"- {st['dtype']} weights, K/V and activations, float32 logits; gpt-oss-120b's experts MXFP4 "
             "(17/32 bytes per parameter), tensor parallel over 8 GPUs (every expert split by its columns, "
             f"attention by heads), NVLink collectives with L = {st['latency_us']:g} us each; uniform routing;",
             "- a step's time: the sum over its components of max(bytes / bandwidth, FLOPs / peak) "
             "(datasheet H100 SXM and B200), plus the collectives; no launch overheads; the draft and the "
             "verify run one after the other (no overlap); weights read once per step for the whole batch, "
             "K/V, attention, logits and FLOPs per row (batch x block rows);",
             "- acceptance: tau per prompt set at the drafter's block (Qwen3-8B: the paper's Table 1, T = 0, "
             "5-layer drafter, block 16, 'average' the paper's average over its seven sets; gpt-oss-120b: its drafter's model card, 8 layers, block 10, "
             "'average' the mean of its two sets); the same tau at every batch (a real batch's rows differ); "
             "for other blocks, geometric: per-row acceptance alpha fitted to tau at the drafter's block, "
             "tau(bs) = (1 - alpha^bs) / (1 - alpha); the best block searched over 2 ... the drafter's block;",
             "- per-user tokens/s = tau / step time (AR: 1 / step time); aggregate = batch x per-user; every "
             "user decodes in every step (a full static batch, no prefill interleaved);",
             "- compute-bound: the first batch at which the target forward's FLOPs / peak exceed its bytes / "
             "bandwidth (all its components summed; its linears alone in brackets), searched up to "
             f"{SEARCH_LIMIT} whatever the memory.", ""]
    lines += ["| scenario | set (tau) | speedup at concurrency 1: fixed / best (bs) | at 32: fixed / best (bs) "
              "| largest batch that fits |", "|---|---|---|---|---|"]
    for s in report["scenarios"]:
        for name, d in s["sets"].items():
            cells = []
            for b in ("1", "32"):
                sp = d["speedup_at_batch"][b]
                cells.append("-" if sp is None else
                             f"{sp[FIXED]:.2f}x / {sp[BEST]:.2f}x ({sp['best_block_size']})")
            lines.append(f"| {s['label']} | {name} ({d['tau']:.2f}) | {cells[0]} | {cells[1]} | "
                         f"{_largest(s)} |")
    lines += ["", "Where the target forward turns compute-bound (first batch; the linears alone in brackets; "
              "at the plotted set's tau for the best block):", "",
              "| scenario | " + " | ".join(LABELS[m] for m in METHODS) + " |", "|---|---|---|---|"]
    for s in report["scenarios"]:
        cb = s["compute_bound_batch"]
        cells = [f"{cb[m]['forward'] or f'> {SEARCH_LIMIT}'} ({cb[m]['linears'] or f'> {SEARCH_LIMIT}'})"
                 for m in METHODS]
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    lines += ["", "(The linears: the dense target's matrices; gpt-oss-120b's attention projections and routers, "
              "its routed experts being a component of their own. Past the drafter's block's turn its aggregate "
              "stops growing with the batch: every further user divides the per-user speed.)"]
    c = report["comparison"]
    sg = c["sglang"]
    lines += ["", f"**Against SGLang** (B200, Qwen3-8B, MATH-500; measured {sg['measured']['1']}x at "
              f"concurrency 1 and {sg['measured']['32']}x at 32, tau 8.01): predicted "
              f"{sg['predicted']['1'][FIXED]:.2f}x and {sg['predicted']['32'][FIXED]:.2f}x with block 16 at "
              f"Table 1's tau {sg['table1_tau']:.2f} ({sg['predicted']['1'][BEST]:.2f}x and "
              f"{sg['predicted']['32'][BEST]:.2f}x with the best block), "
              f"{sg['predicted_at_sglang_tau']['1'][FIXED]:.2f}x and {sg['predicted_at_sglang_tau']['32'][FIXED]:.2f}x "
              f"at SGLang's tau 8.01. Measured, concurrency 32 keeps {sg['measured']['32'] / sg['measured']['1']:.0%} "
              f"of the speedup at 1; predicted {sg['predicted']['32'][FIXED] / sg['predicted']['1'][FIXED]:.0%}.", ""]
    lines += [f"**Against NVIDIA's gpt-oss-120b claim** (up to {NVIDIA['speedup']:g}x throughput at a fixed "
              "per-user speed, 8 Blackwell GPUs): predicted aggregate tokens/s at "
              + " and ".join(f"{x:g}" for x in NVIDIA["per_user_tokens_per_s"]) + " tokens/s per user:", "",
              "| set (tau) | per user | AR | DFlash, block 10 | best block | DFlash / AR | AR's batch-1 speed |",
              "|---|---|---|---|---|---|---|"]
    for name, d in c["nvidia"].items():
        for lv in d["levels"]:
            a = lv["aggregate"]
            lines.append(f"| {name} ({d['tau']:.2f}) | {lv['per_user_tokens_per_s']:g} | {_fmt(a[AR], '.0f', '')} | "
                         f"{_fmt(a[FIXED], '.0f', '')} | {_fmt(a[BEST], '.0f', '')} | "
                         f"{_fmt(lv['speedup'][FIXED])} / {_fmt(lv['speedup'][BEST])} | {d['ar_batch1_per_user']:.0f} |")
    lines += ["", "('-': the method's curve does not reach that per-user speed within the batches that fit.) "
              f"The predicted speedup reaches {NVIDIA['speedup']:g}x from these per-user speeds up: "
              + "; ".join(f"{name} {_fmt(d['per_user_where_speedup_reaches'][FIXED], '.0f', '')} (block 10), "
                          f"{_fmt(d['per_user_where_speedup_reaches'][BEST], '.0f', '')} (best block)"
                          for name, d in c["nvidia"].items())
              + " tokens/s per user. At AR's batch-1 speed AR serves one user while DFlash serves many at the "
              "same speed: the ratio there is about the number of users DFlash serves, and it falls towards "
              "the same-batch speedup as the per-user speed drops."]
    for s in report["scenarios"]:
        d = s["sets"][s["plot_set"]]
        stop = s["sweep_stopped"]
        lines += ["", f"### {s['label']}, {s['plot_set']} (tau {d['tau']:.2f}, alpha {d['alpha']:.3f})", "",
                  f"Block {s['block_size']}, {s['drafter_layers']}-layer drafter; "
                  + (f"the sweep stops at batch {stop['batch']} ({stop['memory_gb']:.1f} GB per GPU > "
                     f"{s['memory_budget_gb']:.1f} GB); " if stop else "every batch fits; ")
                  + f"largest batch that fits: {_largest(s)}.", "",
                  "| batch | AR: per-user / aggregate tok/s | DFlash block "
                  f"{s['block_size']}: per-user / aggregate | best block: bs, per-user / aggregate | "
                  "speedup at this batch: fixed / best | step us: AR / fixed |", "|---|---|---|---|---|---|"]
        by = {}
        for r in d["rows"]:
            by.setdefault(r["batch"], {})[r["method"]] = r
        for b, m in by.items():
            pu = lambda r: f"{r['per_user_tokens_per_s']['mean']:.0f} / {r['aggregate_tokens_per_s']:.0f}"
            ar = m[AR]["aggregate_tokens_per_s"]
            lines.append(f"| {b} | {pu(m[AR])} | {pu(m[FIXED])} | {m[BEST]['block_size']}, {pu(m[BEST])} | "
                         f"{m[FIXED]['aggregate_tokens_per_s'] / ar:.2f}x / {m[BEST]['aggregate_tokens_per_s'] / ar:.2f}x | "
                         f"{m[AR]['step_us']:.0f} / {m[FIXED]['step_us']:.0f} |")
        lines += ["", "Speedup at a fixed per-user speed (levels: AR's points; DFlash's aggregate interpolated "
                  "on its curve; '-': below the slowest per-user speed DFlash reaches in the batches that fit):", "",
                  "| per-user tok/s (AR batch) | fixed | best |", "|---|---|---|"]
        for lv in d["fixed_interactivity"]:
            lines.append(f"| {lv['per_user_tokens_per_s']:.0f} ({lv['ar_batch']}) | {_fmt(lv[FIXED])} | {_fmt(lv[BEST])} |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """One panel per scenario: aggregate against per-user tokens/s, one curve per method at the
    plotted set's tau, points labelled by batch, the compute-bound point ringed."""
    import matplotlib
    import matplotlib.ticker

    from dflash_jax.bench.throughput import curve

    n = len(report["scenarios"])
    fig, axes = new_figure(1, n, figsize=(5.6 * n, 5.2))
    axes = np.atleast_1d(axes)
    for ax, s in zip(axes, report["scenarios"]):
        d = s["sets"][s["plot_set"]]
        for m, style in zip(METHODS, ("o-", "s-", "^--")):
            pts = curve(d["rows"], m)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=4, label=LABELS[m])
            for x, y, b in pts:
                ax.annotate(str(b), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
            turn = s["compute_bound_batch"][m]["forward"]
            ringed = [p for p in pts if turn is not None and p[2] >= turn]
            if ringed:
                ax.plot([ringed[0][0]], [ringed[0][1]], "o", ms=13, mfc="none", mec=line.get_color(), mew=1.5)
                ax.annotate(f"compute-bound from B = {turn}", (ringed[0][0], ringed[0][1]),
                            textcoords="offset points", xytext=(-40, {AR: 10, FIXED: -22, BEST: 12}[m]),
                            fontsize=7, color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="per-user tokens / s (interactivity)",
               ylabel="aggregate tokens / s (throughput)",
               title=f"{s['label']}\n{s['plot_set']}, tau {d['tau']:.2f} at block {s['block_size']}")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", lw=0.3)
    axes[len(axes) // 2].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.suptitle(f"predicted by the roofline: batch 1 ... {max(report['settings']['batches'])} as memory allows, "
                 f"S = {report['settings']['context']}, {report['settings']['dtype']}; ring: the target "
                 "forward turns compute-bound")
    return fig


def main(argv=None) -> dict:
    """``python -m dflash_jax.tools.roofline_throughput [options]`` = ``roofline --throughput``."""
    return dense.main(["--throughput", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    from dflash_jax.cli import run_cli

    run_cli(main)
