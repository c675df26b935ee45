"""Roofline of tree verification (``roofline --tree``): the predicted speedup of a DFlash tree of
N nodes over autoregressive decoding, and the node budget N that maximises it.

One tree iteration (docs/trees.md) is the chain's draft, unchanged (the drafter's one pass over
the block of ``bs`` rows gives the distributions at every depth; the tree is built from their
top-k, a negligible on-device step not counted), then:

  verify    the target on the N tree rows per sequence over its cache of S positions: every
            weight read once, N-row matmuls, the taps of the N rows written for the drafter,
            the N rows' K/V written; attention: each row over the S cached positions and over
            the N x N block under the ancestor mask (the kernel evaluates the whole masked
            block: ``N S + N^2`` (query, key) pairs, against the chain's causal ``N S + N (N + 1) / 2``);
            the LM head on all N rows (float32 logits written).
  compact   the accepted path's K/V moved to the contiguous slots after the committed ones: at
            most ``bs`` rows (the depth bound is ``bs - 1`` drafts, plus the root) read and
            written in every layer; no FLOPs.

Each component's time is max(bytes / bandwidth, FLOPs / peak) and the iteration's the sum
(:mod:`dflash_jax.tools.roofline`'s rules and counts otherwise), so

    speedup(N) = tau(N) * t_AR / t_iter(N)

where tau(N) is a MEASURED curve (the embedded pair: the chain at block ``bs`` and trees of
some node budgets, ``--tau-curve FILE``), SCALED so that the chain's tau equals the paper's
6.49 for Qwen3-8B: tau(N) = tau_measured(N) * 6.49 / tau_chain, capped at ``bs`` (an
assumption: that a tree gains over the chain the same fraction on Qwen3-8B as on the embedded
pair). Node budgets beyond
the largest measured one are extrapolated two ways, both stated: ``flat`` (tau stays at the
largest measured budget's: a floor, a larger best-first tree holds the smaller one) and
``log`` (tau keeps growing by the last measured doubling's gain per doubling of N, capped at
``bs``). The chain row is the dense roofline's DFlash iteration at block ``bs``.

Where verify turns compute-bound: the ridge point of a device is peak / bandwidth FLOP per byte
(295 for an H100 SXM's datasheet); N-row bf16 linears do about N FLOPs per weight byte (2 N
FLOPs per 2-byte parameter), so the verify's linears turn compute-bound at N close to the ridge
point. The attention over the cache turns compute-bound much earlier: 4 H Dh N (S + N) FLOPs
against 4 S Hkv Dh bytes of bf16 K/V per layer is (H / Hkv) N (1 + N / S) FLOP per byte (N about
70 for Qwen3-8B's 4 query heads per KV head at S = 1024), but it is a small part of the step.

The tau-curve file (JSON):

    {"chain": 5.41, "trees": {"16": 6.0, "32": 6.3, "64": 6.5}, "block_size": 16,
     "source": "where the numbers come from"}

    python -m dflash_jax roofline --tree --tau-curve results/roofline/tree/tau_curve.json \\
        --out results/roofline/tree
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Mapping, Sequence

import numpy as np

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax import sizes
from dflash_jax.tools import roofline as dense
from dflash_jax.tools.roofline import Cost, DEVICES, Device

NODES = (16, 32, 64, 128, 256)
"""Node budgets the report predicts the speedup for (``--tree`` with no value)."""
CURVE_NODES = (2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 2048)
"""Node budgets of the t_iter / t_AR curve (wide enough to pass every device's ridge point)."""
TREE_DEVICES = ("h100", "h100-measured")
EXTRAPOLATIONS = ("flat", "log")


# ---------------------------------------------------------------------------- costs
def tree_verify(target: TargetConfig, nodes: int, context: int, *, taps: int, block_size: int,
                batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The target verifying ``nodes`` tree rows per sequence over ``context`` cached positions,
    then the compaction of the accepted path (at most ``block_size`` rows); see the module doc."""
    linears, attention, head = dense.target_forward(target, nodes, context, taps=taps, batch=batch,
                                                    weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    attention = dense.decoder_attention("target attention", target, target.num_layers,
                                        nodes * context + nodes * nodes, context, nodes,
                                        batch=batch, kv_bytes=kv_bytes)
    moved = batch * block_size * sizes.kv_bytes_per_position(target, target.num_layers, kv_bytes)
    return [linears, attention, head, Cost("KV compact", flops=0.0, kv_read=moved, kv_write=moved)]


def tree_iteration(target: TargetConfig, drafter: DrafterConfig, block_size: int, nodes: int,
                   context: int, *, batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """One tree iteration: the chain's draft of the block (``block_size`` rows, ``block_size``
    context rows projected), then :func:`tree_verify` of ``nodes`` rows."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    return (dense.drafter_forward(drafter, target, block_size, context, block_size, **kw)
            + tree_verify(target, nodes, context, taps=drafter.num_taps, block_size=block_size, **kw))


def ridge_point(device: Device) -> float:
    """FLOPs per byte at which a kernel turns compute-bound on ``device``: peak / bandwidth."""
    return device.peak_flops / device.bandwidth


def compute_bound_nodes(target: TargetConfig, drafter: DrafterConfig, block_size: int, context: int,
                        device: Device, component: str = "target linears", limit: int = 1 << 14,
                        **kw) -> int | None:
    """The smallest node budget at which ``component`` of the tree verify is compute-bound on
    ``device`` (bisection: a component's FLOPs per byte grow with N); None if not up to ``limit``."""
    def bound(n):
        costs = {c.name: c for c in tree_verify(target, n, context, taps=drafter.num_taps,
                                                 block_size=block_size, **kw)}
        return costs[component].bound(device) == "compute"

    if not bound(limit):
        return None
    lo, hi = 1, limit  # bound(hi) holds; find the first n with bound(n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if bound(mid) else (mid, hi)
    return hi if not bound(lo) else lo


# ---------------------------------------------------------------------------- tau
@dataclasses.dataclass(frozen=True)
class TauCurve:
    """A measured acceptance curve: ``chain`` (tau of the chain at ``block_size``) and
    ``trees`` ({node budget: tau}), from ``source``."""

    chain: float
    trees: dict
    block_size: int
    source: str = ""

    def scale(self, paper_tau: float = dense.PAPER["tau"]) -> float:
        """The factor that puts the chain at the paper's tau: paper_tau / chain."""
        return paper_tau / self.chain

    def tau(self, nodes: int, extrapolation: str = "flat") -> tuple[float, bool]:
        """(measured tau at ``nodes``, whether it was measured). Between measured budgets tau
        is interpolated linearly in log2 N; below the smallest it is the smallest's; above the
        largest ``extrapolation`` decides: ``flat`` keeps the largest's, ``log`` continues the
        last measured doubling's gain per doubling (a single budget: flat), capped at the block."""
        if extrapolation not in EXTRAPOLATIONS:
            raise ValueError(f"extrapolation must be one of {', '.join(EXTRAPOLATIONS)}, got {extrapolation!r}")
        ns = sorted(self.trees)
        if nodes in self.trees:
            return float(self.trees[nodes]), True
        if nodes < ns[0]:
            return float(self.trees[ns[0]]), False
        if nodes < ns[-1]:
            hi = next(n for n in ns if n > nodes)
            lo = max(n for n in ns if n < nodes)
            f = (math.log2(nodes) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return float(self.trees[lo] + f * (self.trees[hi] - self.trees[lo])), False
        last = float(self.trees[ns[-1]])
        if extrapolation == "flat" or len(ns) < 2:
            return last, False
        per_doubling = (last - self.trees[ns[-2]]) / (math.log2(ns[-1]) - math.log2(ns[-2]))
        grown = last + max(per_doubling, 0.0) * (math.log2(nodes) - math.log2(ns[-1]))
        return min(grown, float(self.block_size)), False


def read_tau_curve(path: str) -> TauCurve:
    """The tau-curve JSON file (module doc); a malformed one is refused naming what is wrong."""
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise ValueError(f"--tau-curve {path!r} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--tau-curve {path!r} is not JSON ({e}); expected "
                         '{"chain": TAU, "trees": {"NODES": TAU, ...}, "block_size": BS}') from None
    return tau_curve_from_dict(d, path)


def tau_curve_from_dict(d: Mapping, where: str = "the tau curve") -> TauCurve:
    """A :class:`TauCurve` from its JSON form, checked: a chain tau, at least one tree, every
    tau in [1, block_size], node budgets >= 2."""
    if not isinstance(d, Mapping) or "chain" not in d or "trees" not in d or "block_size" not in d:
        raise ValueError(f"{where} needs the keys 'chain' (the chain's tau), 'trees' ({{node budget: tau}}) "
                         f"and 'block_size'; got {sorted(d) if isinstance(d, Mapping) else type(d).__name__}")
    bs = d["block_size"]
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 2:
        raise ValueError(f"{where}: block_size must be an integer >= 2, got {bs!r}")
    trees = {}
    if not isinstance(d["trees"], Mapping) or not d["trees"]:
        raise ValueError(f"{where}: 'trees' must map node budgets to tau, at least one, got {d['trees']!r}")
    for k, v in d["trees"].items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: tree node budget {k!r} is not an integer") from None
        if n < 2:
            raise ValueError(f"{where}: a tree has at least 2 nodes (the root and one draft), got {n}")
        trees[n] = v
    for name, tau in [("chain", d["chain"])] + [(f"tree {n}", t) for n, t in trees.items()]:
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 1.0 <= tau <= bs:
            raise ValueError(f"{where}: tau of the {name} must be a number in [1, block_size {bs}] "
                             f"(a mean acceptance length, bonus included), got {tau!r}")
    return TauCurve(float(d["chain"]), {n: float(t) for n, t in sorted(trees.items())}, bs,
                    str(d.get("source", "")))


# ---------------------------------------------------------------------------- analysis
def tree_row(curve: TauCurve, nodes: int, iteration: Sequence[Cost], device: Device, t_ar: float) -> dict:
    """One node budget's row: the tree iteration's time, its ratio to ``t_ar`` and each
    component's bound on ``device``, and under each extrapolation tau (measured, and scaled to
    the paper's chain, capped at the block) with the predicted speedup."""
    t_iter = dense.seconds(iteration, device)
    row = {"nodes": nodes, "t_iter_us": 1e6 * t_iter, "ratio": t_iter / t_ar,
           "bound": {c.name: c.bound(device) for c in iteration}}
    for how in EXTRAPOLATIONS:
        tau, measured = curve.tau(nodes, how)
        scaled = min(tau * curve.scale(), float(curve.block_size))
        row[how] = {"tau_measured": tau, "tau": scaled, "measured": measured,
                    "speedup": dense.predicted_speedup(scaled, t_ar, t_iter)}
    return row


def best_nodes(rows: Sequence[dict]) -> dict:
    """{extrapolation: the node budget of the highest predicted speedup} over :func:`tree_row` rows."""
    return {how: max(rows, key=lambda r: r[how]["speedup"])["nodes"] for how in EXTRAPOLATIONS}


def analyse(target: TargetConfig, drafter: DrafterConfig, curve: TauCurve, nodes: Sequence[int],
            context: int, devices: Sequence[str], *, batch: int = 1, weight_bytes: int = 2) -> dict:
    """Per device: t_AR, the chain's iteration and each node budget's tree iteration, their
    ratios, tau (measured and scaled), the predicted speedups under both extrapolations with
    the best N of each, the ridge point and the node budgets where the verify's linears, its
    attention and its LM head turn compute-bound, and the ratio curve over :data:`CURVE_NODES`."""
    bs = curve.block_size
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=weight_bytes)
    scale = curve.scale()
    ar = dense.ar_step(target, context, **kw)
    chain = dense.dflash_iteration(target, drafter, bs, context, **kw)
    out = {}
    for name in devices:
        dev = DEVICES[name]
        t_ar = dense.seconds(ar, dev)
        t_chain = dense.seconds(chain, dev)
        rows = [tree_row(curve, n, tree_iteration(target, drafter, bs, n, context, **kw), dev, t_ar)
                for n in nodes]
        chain_tau = min(curve.chain * scale, float(bs))
        out[name] = {
            "t_ar_us": 1e6 * t_ar, "chain": {"t_iter_us": 1e6 * t_chain, "ratio": t_chain / t_ar,
                                              "tau_measured": curve.chain, "tau": chain_tau,
                                              "speedup": dense.predicted_speedup(chain_tau, t_ar, t_chain)},
            "trees": rows, "best_nodes": best_nodes(rows),
            "ridge_point_flop_per_byte": ridge_point(dev),
            "compute_bound_nodes": {c: compute_bound_nodes(target, drafter, bs, context, dev, c, **kw)
                                    for c in ("target linears", "target attention", "target LM head")},
            "ratio_by_nodes": {str(n): dense.seconds(tree_iteration(target, drafter, bs, n, context, **kw), dev) / t_ar
                               for n in CURVE_NODES},
        }
    return {"scale": scale, "devices": out}


# ---------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    s, c = report["settings"], report["tau_curve"]
    a = report["analysis"]
    lines = [f"`{report['command']}`", "",
             f"{report['pair']['name']}: target {report['pair']['target_params'] / 1e9:.2f}B params, "
             f"{report['pair']['drafter_layers']}-layer drafter; block {s['block_size']} (tree depth <= "
             f"{s['block_size'] - 1}), context S = {s['context']}, batch {s['batch']}, {s['dtype']}.", "",
             f"tau: measured on {c['source'] or 'the given curve'} (chain {c['chain']:.2f}; trees "
             + ", ".join(f"{n}: {t:.2f}" for n, t in c["trees"].items())
             + f"), **scaled by 6.49 / {c['chain']:.2f} = {a['scale']:.3f}** so that the chain's tau is the "
             "paper's 6.49 for Qwen3-8B (an assumption: the tree's relative gain carries over). Budgets "
             "not measured: *flat* keeps the largest measured budget's tau (a floor), *log* continues the "
             "last doubling's gain per doubling of N (capped at the block); interpolated / extrapolated "
             "values are in italics.", ""]
    for name, r in a["devices"].items():
        dev = DEVICES[name]
        cb = r["compute_bound_nodes"]
        lines += [f"### {dev.name}", "",
                  f"t_AR {r['t_ar_us']:.0f} us; chain (block "
                  f"{s['block_size']}): t_iter {r['chain']['t_iter_us']:.0f} us, t_iter / t_AR "
                  f"{r['chain']['ratio']:.3f}, tau {r['chain']['tau']:.2f}, speedup "
                  f"{r['chain']['speedup']:.2f}x.", "",
                  "| N | t_iter (us) | t_iter / t_AR | break-even tau gain over the previous N | tau (flat) | "
                  "speedup (flat) | tau (log) | speedup (log) |",
                  "|---|---|---|---|---|---|---|---|"]
        prev = None
        for row in r["trees"]:
            cells = []
            for how in EXTRAPOLATIONS:
                x = row[how]
                tau = f"{x['tau']:.2f}" if x["measured"] else f"*{x['tau']:.2f}*"
                sp = f"{x['speedup']:.2f}x" + (" **best**" if r["best_nodes"][how] == row["nodes"] else "")
                cells += [tau, sp]
            even = "-" if prev is None else f"{100 * (row['t_iter_us'] / prev['t_iter_us'] - 1):+.2f} %"
            lines.append(f"| {row['nodes']} | {row['t_iter_us']:.0f} | {row['ratio']:.3f} | {even} | "
                         + " | ".join(cells) + " |")
            prev = row
        fmt = lambda n: "> 16384" if n is None else str(n)
        lines += ["", f"Ridge point {r['ridge_point_flop_per_byte']:.0f} FLOP/byte: the verify's linears turn "
                  f"compute-bound from N = {fmt(cb['target linears'])}, its LM head from "
                  f"{fmt(cb['target LM head'])}, its attention over the cache from {fmt(cb['target attention'])}. "
                  "t_iter / t_AR by N: " + ", ".join(f"{k}: {v:.3f}" for k, v in r["ratio_by_nodes"].items())
                  + ". (break-even tau gain: how much more tau a budget needs than the previous one to be as fast, "
                  "the growth of t_iter.)", ""]
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Left: predicted speedup against N per device (both extrapolations, measured budgets
    filled, best N starred, the chain dashed). Right: t_iter / t_AR against N, ridge points."""
    fig, (a, b) = new_figure(1, 2, figsize=(13, 4.6))
    res = report["analysis"]["devices"]
    for i, (name, r) in enumerate(res.items()):
        color = f"C{i}"
        xs = [row["nodes"] for row in r["trees"]]
        for how, style in (("flat", "-"), ("log", "--")):
            ys = [row[how]["speedup"] for row in r["trees"]]
            a.plot(xs, ys, style, color=color, label=f"{DEVICES[name].name}, {how}")
            best = next(row for row in r["trees"] if row["nodes"] == r["best_nodes"][how])
            a.plot([best["nodes"]], [best[how]["speedup"]], "*", color=color, ms=13)
        meas = [row for row in r["trees"] if row["flat"]["measured"]]
        a.plot([row["nodes"] for row in meas], [row["flat"]["speedup"] for row in meas], "o", color=color)
        a.axhline(r["chain"]["speedup"], color=color, ls=":", lw=1,
                  label=f"chain block {report['settings']['block_size']} ({r['chain']['speedup']:.2f}x)")
    a.set_xscale("log", base=2)
    a.set(xlabel="tree nodes N (filled: tau measured there; star: best N)", ylabel="predicted speedup (x)",
          title="speedup = tau(N) * t_AR / t_iter(N) (tau scaled to the paper's chain)")
    a.minorticks_off()
    a.set_xticks(report["settings"]["nodes"], [str(n) for n in report["settings"]["nodes"]])
    a.legend(fontsize=7)
    for i, (name, r) in enumerate(res.items()):
        items = sorted((int(k), v) for k, v in r["ratio_by_nodes"].items())
        b.plot([k for k, _ in items], [v for _, v in items], "o-", ms=3, color=f"C{i}", label=DEVICES[name].name)
        turn = r["compute_bound_nodes"]["target linears"]
        if turn:
            b.axvline(turn, color=f"C{i}", ls=":", lw=1,
                      label=f"verify linears compute-bound from N = {turn} (ridge point "
                            f"{r['ridge_point_flop_per_byte']:.0f} FLOP/byte)")
    b.set_xscale("log", base=2)
    b.set(yscale="log", xlabel="tree nodes N", ylabel="t_iter / t_AR", title="tree iteration cost (roofline)")
    b.legend(fontsize=7)
    fig.suptitle(f"tree roofline: {report['pair']['name']}, {report['pair']['drafter_layers']}-layer drafter, "
                 f"block {report['settings']['block_size']}, S = {report['settings']['context']}, "
                 f"batch {report['settings']['batch']}")
    return fig


def tree_request(args, default_nodes: Sequence[int]) -> tuple[list[int], TauCurve]:
    """The node budgets of ``--tree`` (none given: ``default_nodes``) and the curve of
    ``--tau-curve``, refused in one line when missing or below 2 nodes."""
    if not args.tau_curve:
        raise ValueError("--tree needs --tau-curve FILE: the measured tau of the chain and of trees "
                         '({"chain": TAU, "trees": {"16": TAU, ...}, "block_size": 16}; e.g. from results/tree/)')
    nodes = list(args.tree) or list(default_nodes)
    bad = [n for n in nodes if n < 2]
    if bad:
        raise ValueError(f"--tree node budgets must be >= 2 (the root and one draft), got {bad[0]}")
    return nodes, read_tau_curve(args.tau_curve)


def run_tree(args) -> dict:
    """``roofline --tree [N ...] --tau-curve FILE``: the pair of :func:`dense.load_pair` (Qwen3-8B
    shapes and a ``--drafter-layers`` drafter by default) on H100 (datasheet and measured, or
    ``--devices`` when given other than the default); JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    nodes, curve = tree_request(args, NODES)
    if args.block_size and args.block_size != curve.block_size:
        raise ValueError(f"--block-size {args.block_size} differs from the tau curve's block_size "
                         f"{curve.block_size}: the taus were measured at that block")
    for name in ("context", "batch", "drafter_layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    name, target, drafter = dense.load_pair(args)
    devices = list(TREE_DEVICES) if list(args.devices) == list(DEVICES) else list(args.devices)
    report = {
        "benchmark": "roofline_tree",
        "command": command_line("dflash_jax", invocation(args)),
        "pair": {"name": name, "target": target.to_hf_dict(), "drafter": drafter.to_hf_dict(),
                 "target_params": target.num_params(), "drafter_params": dense._drafter_params(drafter),
                 "drafter_layers": drafter.num_layers, "taps": drafter.num_taps},
        "settings": {"block_size": curve.block_size, "context": args.context, "batch": args.batch,
                     "dtype": args.dtype, "nodes": nodes, "devices": devices, "tau_curve_file": args.tau_curve},
        "tau_curve": {"chain": curve.chain, "trees": {str(n): t for n, t in curve.trees.items()},
                      "block_size": curve.block_size, "source": curve.source},
        "assumption": f"tau(N) = tau_measured(N) * {dense.PAPER['tau']} / tau_measured(chain): the chain is put at "
                      "the paper's tau for Qwen3-8B and the trees keep their measured relative gain",
        "paper": dense.PAPER,
        "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
        "analysis": analyse(target, drafter, curve, nodes, args.context, devices, batch=args.batch,
                            weight_bytes=dense.DTYPE_BYTES[args.dtype]),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    stem = f"tree_{name}_d{drafter.num_layers}_bs{curve.block_size}_S{args.context}_b{args.batch}"
    return publish_report(report, args.out, stem, plot, markdown)
