"""Roofline of tree verification on hybrid (Gated DeltaNet) targets (``roofline --hybrid MODEL
--tree [N ...] --tau-curve FILE``): the predicted speedup of a DFlash tree of N nodes over
autoregressive decoding on Qwen3.5-shaped targets, per GDN rollback mode, and the node budget
that maximises it on each device.

One tree iteration (docs/trees.md, "Hybrid targets") is the chain's draft of the block, then:

  target linears     every weight once, N-row matmuls (as :mod:`roofline_hybrid`'s verify);
  target attention   the attention layers' K/V of S positions read, the N rows' written; each
                     row over the S cached positions and the N x N block under the ancestor
                     mask (``N S + N^2`` pairs, as :mod:`roofline_tree`);
  target GDN tree    per GDN layer and row: the state read once, the conv window read, the
                     nodes' record written (replay: each node's conv input and prepared k, v,
                     g, beta, the state before the block twice; snapshot: every node's state
                     after its path, and the one before); FLOPs of the tree's delta rule over
                     one chunk of N nodes with the ancestor mask: ``S0^T k`` and ``S0^T q``
                     (``4 N Hv dk dv``), ``k.k``, ``q.k``, the solve and ``att u``
                     (``2 N^2 Hv (dk + dv) + 2 N^2 Hv (dk + dv)``), and with snapshot every
                     node's state (``2 N^2 Hv dk dv``);
  compact            the accepted path (at most ``bs`` rows) moved into place: the attention
                     layers' K/V and the GDN record of ``bs`` nodes read and written;
  GDN rollback       as the chain's with a chunk of ``bs`` rows (:func:`roofline_hybrid.gdn_bytes`);
  target LM head     on the N rows.

``speedup(N) = tau(N) t_AR / t_iter(N)`` with the measured tau curve of ``--tau-curve`` scaled so
that the chain's tau is the paper's 6.49 (:class:`roofline_tree.TauCurve`: the assumption that a
tree gains over the chain on these targets what it gained on the pair the curve was measured
on; budgets past the measured ones extrapolated ``flat`` and ``log``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Sequence

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_hybrid as rh
from dflash_jax.tools import roofline_tree as rt
from dflash_jax.tools.roofline import Cost, DEVICES

NODES = (16, 32, 64, 128)
DEVICES_DEFAULT = ("h100", "b200")


def gdn_tree(s: rh.HybridShape, nodes: int, mode: str, *, batch: int = 1, conv_itemsize: int = 2) -> dict:
    """{"read", "write", "flops"} of the GDN layers in a tree verify of ``nodes`` nodes (module
    doc), for ``batch`` rows."""
    L, S = s.gdn_layers, s.state_elems * rh.STATE_BYTES
    Hv, dk, dv, N = s.num_v_heads, s.head_k_dim, s.head_v_dim, nodes
    window = (s.conv_kernel - 1) * s.channels * conv_itemsize
    inputs = (s.conv_kernel - 1 + N) * s.channels * conv_itemsize
    flops = 4 * N * Hv * dk * dv + 4 * N * N * Hv * (dk + dv)
    if mode == "snapshot":
        record = (N + 1) * S
        flops += 2 * N * N * Hv * dk * dv
    elif mode == "replay":
        record = 2 * S + N * Hv * (dk + dv + 2) * rh.STATE_BYTES
    else:
        raise ValueError(f"mode must be one of {', '.join(rh.MODES)}, got {mode!r}")
    return {"read": batch * L * (S + window), "write": batch * L * (record + inputs), "flops": batch * L * flops}


def compact_cost(s: rh.HybridShape, block_size: int, mode: str, *, batch: int = 1, kv_bytes: int = 2) -> Cost:
    """The accepted path's ``block_size`` rows moved into place: the attention layers' K/V and
    the GDN layers' per-node record (read and written)."""
    kv = block_size * 2 * s.attention_layers * s.num_kv_heads * s.head_dim * kv_bytes
    per_node = (s.state_elems * rh.STATE_BYTES if mode == "snapshot"
                else s.num_v_heads * (s.head_k_dim + s.head_v_dim + 2) * rh.STATE_BYTES)
    gdn = block_size * s.gdn_layers * (per_node + s.channels * kv_bytes)
    moved = batch * (kv + gdn)
    return Cost("compact", flops=0.0, kv_read=moved, kv_write=moved)


def tree_iteration(s: rh.HybridShape, drafter: DrafterConfig, block_size: int, nodes: int, context: int,
                   mode: str, *, batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """One tree iteration (module doc)."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    linears, attn, _, head = rh.target_forward(s, nodes, context, step="verify", mode=mode,
                                               taps=drafter.num_taps, **kw)
    pairs = nodes * context + nodes * nodes
    attn = dataclasses.replace(attn, flops=4 * batch * s.attention_layers * s.num_heads * s.head_dim * pairs)
    g = gdn_tree(s, nodes, mode, batch=batch, conv_itemsize=kv_bytes)
    return (dense.drafter_forward(drafter, rh._Head(s.hidden_size, s.vocab_size), block_size, context,
                                  block_size, **kw)
            + [linears, attn, Cost("target GDN tree", flops=g["flops"], kv_read=g["read"], kv_write=g["write"]),
               head, compact_cost(s, block_size, mode, batch=batch, kv_bytes=kv_bytes),
               rh.rollback_cost(s, mode, block_size, batch=batch, kv_bytes=kv_bytes)])


def analyse(s: rh.HybridShape, drafter: DrafterConfig, curve: rt.TauCurve, nodes: Sequence[int], context: int,
            devices: Sequence[str], *, batch: int = 1) -> dict:
    """Per device and rollback mode: t_AR, the chain's iteration, each budget's tree iteration
    with its ratio, tau (scaled) and predicted speedup under both extrapolations, the best N of
    each, and the GDN share of the iteration's bytes."""
    bs, scale = curve.block_size, curve.scale()
    out = {}
    for name in devices:
        dev = DEVICES[name]
        t_ar = dense.seconds(rh.ar_step(s, context, batch=batch), dev)
        per_mode = {}
        for mode in rh.MODES:
            t_chain = dense.seconds(rh.dflash_iteration(s, drafter, bs, context, mode, batch=batch), dev)
            chain_tau = min(curve.chain * scale, float(bs))
            rows = []
            for n in nodes:
                it = tree_iteration(s, drafter, bs, n, context, mode, batch=batch)
                g = next(c for c in it if c.name == "target GDN tree")
                rows.append(rt.tree_row(curve, n, it, dev, t_ar) | {"gdn_bytes": g.kv_read + g.kv_write})
            per_mode[mode] = {
                "chain": {"t_iter_us": 1e6 * t_chain, "ratio": t_chain / t_ar, "tau": chain_tau,
                          "speedup": dense.predicted_speedup(chain_tau, t_ar, t_chain)},
                "trees": rows, "best_nodes": rt.best_nodes(rows)}
        out[name] = {"t_ar_us": 1e6 * t_ar, "modes": per_mode}
    return {"scale": scale, "devices": out}


def markdown(report: dict) -> str:
    st, c, a = report["settings"], report["tau_curve"], report["analysis"]
    lines = [f"`{report['command']}`", "",
             f"{report['model']}: {report['params'] / 1e9:.2f}B parameters, {report['gdn_layers']} GDN and "
             f"{report['attention_layers']} attention layers; a {report['drafter_layers']}-layer drafter, block "
             f"{st['block_size']}; context S = {st['context']}, batch {st['batch']}, bf16 weights, float32 GDN states.",
             "", f"tau: the curve of {c['source'] or st['tau_curve_file']} (chain {c['chain']:.2f}), scaled by "
             f"{a['scale']:.3f} so that the chain's tau is the paper's 6.49 (Qwen3-8B; an assumption for these "
             "targets). *flat* / *log*: budgets past the measured ones.", "",
             "| device | mode | N | t_iter / t_AR | GDN MB / iter | tau (flat) | speedup (flat) | tau (log) | speedup (log) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dev, d in a["devices"].items():
        for mode, m in d["modes"].items():
            ch = m["chain"]
            lines.append(f"| {dev} | {mode} | chain | {ch['ratio']:.3f} | - | {ch['tau']:.2f} | {ch['speedup']:.2f}x | "
                         f"{ch['tau']:.2f} | {ch['speedup']:.2f}x |")
            for r in m["trees"]:
                lines.append(f"| {dev} | {mode} | {r['nodes']} | {r['ratio']:.3f} | {r['gdn_bytes'] / 1e6:.0f} | "
                             f"{r['flat']['tau']:.2f} | {r['flat']['speedup']:.2f}x | {r['log']['tau']:.2f} | "
                             f"{r['log']['speedup']:.2f}x |")
    lines += ["", "Best node budget (flat / log): " + "; ".join(
        f"{dev} {mode}: {m['best_nodes']['flat']} / {m['best_nodes']['log']}"
        for dev, d in a["devices"].items() for mode, m in d["modes"].items()), ""]
    return "\n".join(lines)


def plot(report: dict):
    fig, ax = new_figure(figsize=(6.5, 4))
    for dev, d in report["analysis"]["devices"].items():
        for mode, m in d["modes"].items():
            xs = [r["nodes"] for r in m["trees"]]
            for how, style in (("flat", "o-"), ("log", "s--")):
                ax.plot(xs, [r[how]["speedup"] for r in m["trees"]], style, ms=3, label=f"{dev}, {mode}, {how}")
    ax.set(xscale="log", xlabel="tree nodes N", ylabel="predicted speedup over AR (roofline)",
           title=f"{report['model']}: DFlash trees, S = {report['settings']['context']}, "
                 f"batch {report['settings']['batch']}")
    ax.legend(fontsize=6)
    return fig


def run_hybrid_tree(args) -> dict:
    """``roofline --hybrid MODEL --tree [N ...] --tau-curve FILE``: one hybrid model (named, or a
    config.json) on H100 and B200 (or ``--devices``), both rollback modes."""
    from dflash_jax.cli import invocation

    if len(args.hybrid) != 1:
        raise ValueError(f"--hybrid with --tree takes one model, got {len(args.hybrid)}: {' '.join(args.hybrid)}")
    nodes, curve = rt.tree_request(args, NODES)
    for name in ("context", "batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    name, s, drafter = rh.pair(args.hybrid[0])
    drafter = dataclasses.replace(drafter, block_size=curve.block_size)
    devices = list(DEVICES_DEFAULT) if list(args.devices) == list(DEVICES) else list(args.devices)
    report = {
        "benchmark": "roofline_hybrid_tree", "command": command_line("dflash_jax", invocation(args)),
        "model": name, "shape": dataclasses.asdict(s), "params": rh.num_params(s), "gdn_layers": s.gdn_layers,
        "attention_layers": s.attention_layers, "drafter": drafter.to_hf_dict(), "drafter_layers": drafter.num_layers,
        "settings": {"block_size": curve.block_size, "context": args.context, "batch": args.batch, "nodes": nodes,
                     "devices": devices, "tau_curve_file": args.tau_curve},
        "tau_curve": {"chain": curve.chain, "trees": {str(n): t for n, t in curve.trees.items()},
                      "block_size": curve.block_size, "source": curve.source},
        "analysis": analyse(s, drafter, curve, nodes, args.context, devices, batch=args.batch),
        "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
        "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    stem = f"tree_{re.sub(r'[^A-Za-z0-9.]+', '-', name)}_bs{curve.block_size}_S{args.context}_b{args.batch}"
    return publish_report(report, args.out, stem, plot, markdown)
