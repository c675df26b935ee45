"""Roofline of EAGLE-3 against DFlash (``roofline --eagle3``): the predicted draft and verify
time of one iteration and the speedup over autoregressive decoding, for Qwen3-8B shapes on an
H100 in bf16 by default.

The paper's argument is the draft: EAGLE-3 (docs/eagle3.md) drafts with k SEQUENTIAL steps of
its one decoder layer, DFlash with ONE parallel pass of its drafter over the block. At batch 1
on a GPU every step is memory-bound, so each EAGLE-3 step reads the layer's weights and its
draft-vocabulary head again: k reads, where DFlash's 5 layers are read once.

One EAGLE-3 iteration (``k`` drafting steps, the block ``k + 1`` rows):

  fc        the ``ctx_rows`` newly committed positions' target features [3 Dt] through ``fc``
            (default ``ctx_rows = k + 1``: static shapes, the whole verified block, as this
            engine projects it; the accepted rows alone are ~tau);
  step 1    the layer on those ``ctx_rows`` rows (their K/V into the drafter's cache; each row
            attends to the S cached entries and causally to the new ones), the head [D, Vd] on
            the last row (the first draft);
  step s    (s = 2 .. k) the layer on ``r`` rows: the chain's one drafted token (r = 1), or a
            tree's frontier of ``topk`` nodes (EAGLE-2/3's dynamic tree: the topk best nodes of
            the previous depth, each expanded into its topk children; r = topk); each row
            attends to the S + ctx_rows committed entries and to its own s - 1 drafted
            ancestors (itself included); the head on the r rows;
  verify    the target on the k + 1 chain rows (causal), or on the N tree nodes under the
            ancestor mask and the compaction of the accepted path (:mod:`roofline_tree`), the
            taps of 3 layers written for ``fc``.

Per step the layer's input is [embed ; feature], 2D wide, into q/k/v (the embedding rows are
gathered from the target's table: activations), so its matrices hold ``2 D (H + 2 Hkv) Dh +
H Dh D + 3 D F`` parameters; the vectors are its three RMSNorms (and the final ``norm`` with
the head). The top-k and the tree bookkeeping are not counted (a few small kernels: launch
overheads, which the roofline does not model, and which fall on EAGLE-3's k sequential steps,
not on DFlash's one pass).

One DFlash iteration is the dense roofline's (:func:`roofline.dflash_iteration`): the released
5-layer Qwen3-8B-DFlash-b16 drafter's shapes over the block of 16 rows, then the verify of 16
rows. Each component's time is max(bytes / bandwidth, FLOPs / peak), summed.

    speedup = tau * t_AR / (t_draft + t_verify)

at the paper's tau values (Qwen3-8B, T = 0): DFlash 6.49 (4.86x measured on an H200), EAGLE-3
tree 16 2.96 (1.76x); for tree 60 the paper gives only the speedup (2.02x), and no chain; those
rows are predicted at the tree-16 tau and the report gives, per row, the tau EAGLE-3 would need
to match DFlash's predicted speedup and (where the paper gives the speedup) the tau that speedup
implies at the roofline's t_iter / t_AR.

    python -m dflash_jax roofline --eagle3 --out results/roofline/eagle3
    python -m dflash_jax roofline --eagle3 --eagle3-steps 7 --eagle3-trees 16:4 60:10 --context 1024
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from dflash_jax.decoding.tree_args import tree_spec as parse_tree_spec
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.eagle3 import EAGLE3, size as eagle3_size
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_tree
from dflash_jax.tools.roofline import Cost, DEVICES

QWEN3_8B_DRAFT_VOCAB = 32000
"""Draft vocabulary of the released EAGLE-3 drafters for Qwen3-8B (and SpecForge's default)."""
STEPS = 7
"""EAGLE-3's drafting steps per iteration: the training-time test's length, the tree depth."""
TREES = ((16, 4), (60, 10))
"""(node budget N, topk) of the paper's two EAGLE-3 trees: N = 16 with top-4, N = 60 with
EAGLE-3's default top-10."""
PAPER = {"dflash": {"tau": 6.49, "speedup": 4.86},
         "eagle3 tree 16": {"tau": 2.96, "speedup": 1.76},
         "eagle3 tree 60": {"tau": None, "speedup": 2.02},
         "source": "DFlash (arXiv 2602.06036) Table 1, Qwen3-8B, T = 0, average, H200, bf16"}
EAGLE3_DEVICES = ("h100", "h100-measured")


@dataclasses.dataclass(frozen=True)
class Method:
    """One drafting method's iteration: ``kind`` 'dflash' or 'eagle3'; for EAGLE-3 ``steps``
    (k) and, for a tree, ``nodes`` (N, root included) and ``topk`` (frontier width)."""

    kind: str
    steps: int = STEPS
    nodes: int | None = None
    topk: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "dflash":
            return "dflash"
        return f"eagle3 tree {self.nodes}" if self.nodes else f"eagle3 chain {self.steps}"

    @property
    def frontier(self) -> int:
        """Rows of each EAGLE-3 step after the first: 1 (chain) or topk (tree)."""
        return self.topk if self.nodes else 1


def eagle3_config(target: TargetConfig, draft_vocab: int = QWEN3_8B_DRAFT_VOCAB) -> Eagle3Config:
    """The released-layout EAGLE-3 drafter for ``target``: one layer shaped like the target's
    (heads, head_dim, MLP width), ``draft_vocab`` tokens, SpecForge's default feature layers
    (layers 0, 1, 2 for a target of fewer than 8 layers, as the embedded EAGLE-3 drafter)."""
    n = target.num_layers
    ids = None if n >= 8 else (0, min(1, n - 1), min(2, n - 1))  # shallow targets: the first three
    return Eagle3Config.for_target(target, draft_vocab_size=min(draft_vocab, target.vocab_size),
                                   target_layer_ids=ids)


def eagle3_layer_params(cfg: Eagle3Config) -> dict:
    """Parameters of the decoder layer's matrices (EAGLE-3's size model,
    ``methods/eagle3/size.py``): q/k/v read the 2D-wide input."""
    return eagle3_size.layer_params(cfg)


def eagle3_params(cfg: Eagle3Config) -> int:
    """Every parameter of the drafter (its method's size model): fc, the layer (matrices + 3
    norms), norm, the head."""
    return EAGLE3.num_params(cfg)


def eagle3_draft(cfg: Eagle3Config, method: Method, context: int, ctx_rows: int | None = None, *,
                 batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The k drafting steps of one EAGLE-3 iteration (module docstring) at ``context`` cached
    drafter entries S; ``ctx_rows`` committed rows projected (default k + 1): EAGLE-3's size
    model (``draft_costs``)."""
    return EAGLE3.draft_costs(cfg, None, method.steps + 1, context, tree_topk=method.topk if method.nodes else None,
                              ctx_rows=ctx_rows, batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)


def eagle3_verify(target: TargetConfig, method: Method, context: int, *, batch: int = 1,
                  weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The target on the chain's k + 1 rows, or on the tree's N nodes (and the compaction of
    at most k + 1 accepted rows), 3 layers' taps written."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    if method.nodes:
        return roofline_tree.tree_verify(target, method.nodes, context, taps=3,
                                         block_size=method.steps + 1, **kw)
    return dense.target_forward(target, method.steps + 1, context, taps=3, **kw)


def iteration(target: TargetConfig, dflash: DrafterConfig, eagle: Eagle3Config, method: Method,
              context: int, **kw) -> tuple[list[Cost], list[Cost]]:
    """(draft costs, verify costs) of one iteration of ``method``."""
    if method.kind == "dflash":
        bs = dflash.block_size
        costs = dense.dflash_iteration(target, dflash, bs, context, **kw)
        return costs[:4], costs[4:]
    return eagle3_draft(eagle, method, context, **kw), eagle3_verify(target, method, context, **kw)


def methods(steps: int = STEPS, trees: Sequence[tuple[int, int]] = TREES) -> list[Method]:
    """DFlash, the EAGLE-3 chain of ``steps`` and each (N, topk) tree at depth ``steps``."""
    return ([Method("dflash"), Method("eagle3", steps)]
            + [Method("eagle3", steps, n, t) for n, t in trees])


def paper_tau(label: str) -> tuple[float, str]:
    """The tau a method is predicted at and where it comes from."""
    if label == "dflash":
        return PAPER["dflash"]["tau"], "the paper's DFlash tau"
    if label == "eagle3 tree 16":
        return PAPER["eagle3 tree 16"]["tau"], "the paper's EAGLE-3 tree-16 tau"
    return PAPER["eagle3 tree 16"]["tau"], "the paper gives none here: its EAGLE-3 tree-16 tau"


def analyse(target: TargetConfig, dflash: DrafterConfig, eagle: Eagle3Config, ms: Sequence[Method],
            context: int, devices: Sequence[str], *, batch: int = 1, weight_bytes: int = 2) -> dict:
    """Per device and method: draft, verify and iteration time, t_iter / t_AR, the tau it is
    predicted at and the speedup; the tau each EAGLE-3 row needs to match DFlash; the tau the
    paper's speedup implies at this t_iter / t_AR; the draft time against the steps k."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=weight_bytes)
    ar = dense.ar_step(target, context, **kw)
    out = {}
    for name in devices:
        dev = DEVICES[name]
        t_ar = dense.seconds(ar, dev)
        rows = []
        for m in ms:
            draft, verify = iteration(target, dflash, eagle, m, context, **kw)
            td, tv = dense.seconds(draft, dev), dense.seconds(verify, dev)
            ratio = (td + tv) / t_ar
            tau, source = paper_tau(m.label)
            paper = PAPER.get(m.label, {})
            rows.append({"method": m.label, "kind": m.kind, "steps": m.steps if m.kind == "eagle3" else None,
                         "nodes": m.nodes, "topk": m.topk,
                         "verify_rows": m.nodes or (dflash.block_size if m.kind == "dflash" else m.steps + 1),
                         "draft_us": 1e6 * td, "verify_us": 1e6 * tv, "t_iter_us": 1e6 * (td + tv),
                         "ratio": ratio, "draft_over_ar": td / t_ar, "tau": tau, "tau_source": source,
                         "speedup": tau / ratio,
                         "paper_speedup": paper.get("speedup"), "paper_tau": paper.get("tau"),
                         "paper_implied_ratio": (paper["tau"] / paper["speedup"]
                                                 if paper.get("tau") and paper.get("speedup") else None),
                         "tau_implied_by_paper_speedup": (paper["speedup"] * ratio if paper.get("speedup")
                                                          else None),
                         "bytes": {"draft": dense.total(draft, "bytes"), "verify": dense.total(verify, "bytes")},
                         "flops": {"draft": dense.total(draft, "flops"), "verify": dense.total(verify, "flops")},
                         "bound": {c.name: c.bound(dev) for c in draft + verify}})
        best = rows[0]["speedup"]
        for r in rows:
            r["tau_to_match_dflash"] = best * r["ratio"] if r["kind"] == "eagle3" else None
        by_steps = {str(k): 1e6 * dense.seconds(eagle3_draft(eagle, Method("eagle3", k), context, **kw), dev)
                    for k in range(1, 17)}
        out[name] = {"t_ar_us": 1e6 * t_ar, "methods": rows, "eagle3_chain_draft_us_by_steps": by_steps}
    return {"ar_step": {"flops": dense.total(ar, "flops"), "bytes": dense.total(ar, "bytes")}, "devices": out}


def markdown(report: dict) -> str:
    s, p = report["settings"], report["pair"]
    lines = [f"`{report['command']}`", "",
             f"{p['name']}: target {p['target_params'] / 1e9:.2f}B params; DFlash drafter {p['dflash_layers']} "
             f"layers, block {p['dflash_block_size']} ({p['dflash_params'] / 1e6:.0f}M params); EAGLE-3 drafter "
             f"1 layer, draft vocabulary {p['draft_vocab']} ({p['eagle3_params'] / 1e6:.0f}M params), "
             f"{s['steps']} steps; trees " + ", ".join(f"{n} nodes with top-{k}" for n, k in s["trees"])
             + f"; context S = {s['context']}, batch {s['batch']}, {s['dtype']}.", "",
             "tau: the paper's (Qwen3-8B, T = 0): DFlash 6.49, EAGLE-3 tree 16 2.96; the paper gives no "
             "EAGLE-3 chain tau and no tree-60 tau, so those rows are predicted at 2.96 (the chain's real tau "
             "is lower, the tree 60's higher): read their *tau to match DFlash* and *tau implied by the "
             "paper's speedup* instead.", ""]
    for name, r in report["analysis"]["devices"].items():
        lines += [f"### {DEVICES[name].name}", "", f"t_AR {r['t_ar_us']:.0f} us.", "",
                  "| method | verify rows | draft (us) | verify (us) | t_iter (us) | t_iter / t_AR | draft / t_AR | "
                  "tau | predicted speedup | the paper | tau to match DFlash | tau implied by the paper's speedup |",
                  "|" + "---|" * 12]
        for m in r["methods"]:
            paper = ("-" if m["paper_speedup"] is None else f"{m['paper_speedup']:.2f}x"
                     + ("" if m["paper_tau"] is None else f" / {m['paper_tau']:.2f}"))
            fmt = lambda v: "-" if v is None else f"{v:.2f}"
            lines.append(f"| {m['method']} | {m['verify_rows']} | {m['draft_us']:.0f} | {m['verify_us']:.0f} | "
                         f"{m['t_iter_us']:.0f} | {m['ratio']:.3f} | {m['draft_over_ar']:.3f} | {m['tau']:.2f} | "
                         f"{m['speedup']:.2f}x | {paper} | {fmt(m['tau_to_match_dflash'])} | "
                         f"{fmt(m['tau_implied_by_paper_speedup'])} |")
        k = r["eagle3_chain_draft_us_by_steps"]
        d = r["methods"][0]
        lines += ["", f"EAGLE-3 chain draft time by steps k: " + ", ".join(f"{i}: {v:.0f} us" for i, v in k.items())
                  + f"; DFlash's one pass over {report['pair']['dflash_block_size']} rows: {d['draft_us']:.0f} us.", ""]
    lines += ["The paper's measured t_iter / t_AR (tau / speedup, on an H200): DFlash "
              f"{PAPER['dflash']['tau'] / PAPER['dflash']['speedup']:.3f}, EAGLE-3 tree 16 "
              f"{PAPER['eagle3 tree 16']['tau'] / PAPER['eagle3 tree 16']['speedup']:.3f}: the gap over the roofline's "
              "is what a real implementation adds (launches, the tree's bookkeeping, kernel efficiency), "
              "larger for EAGLE-3's k sequential small steps."]
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Left: draft and verify time per method (stacked), t_AR dashed. Middle: predicted speedup
    against tau per method, the paper's points. Right: EAGLE-3 chain draft time against k beside
    DFlash's one pass."""
    fig, (a, b, c) = new_figure(1, 3, figsize=(17, 4.6))
    dev = report["settings"]["devices"][0]
    r = report["analysis"]["devices"][dev]
    names = [m["method"] for m in r["methods"]]
    draft = [m["draft_us"] for m in r["methods"]]
    verify = [m["verify_us"] for m in r["methods"]]
    a.bar(names, draft, label="draft")
    a.bar(names, verify, bottom=draft, label="verify")
    a.axhline(r["t_ar_us"], color="k", ls="--", lw=0.8, label=f"AR step ({r['t_ar_us']:.0f} us)")
    a.set(ylabel="us per iteration", title=f"one iteration on {DEVICES[dev].name}")
    a.tick_params(axis="x", labelsize=8)
    a.legend(fontsize=7)
    for i, m in enumerate(r["methods"]):
        top = max(m["tau"], m["paper_tau"] or 0, 8.0)
        taus = [1 + j * (top - 1) / 63 for j in range(64)]
        b.plot(taus, [t / m["ratio"] for t in taus], color=f"C{i}", label=f"{m['method']} (t_iter / t_AR "
                                                                          f"{m['ratio']:.2f})")
        b.plot([m["tau"]], [m["speedup"]], "o", color=f"C{i}")
        if m["paper_speedup"] is not None and m["paper_tau"] is not None:
            b.plot([m["paper_tau"]], [m["paper_speedup"]], "*", ms=12, color=f"C{i}")
        elif m["paper_speedup"] is not None:
            b.axhline(m["paper_speedup"], color=f"C{i}", ls=":", lw=1, label=f"the paper's {m['method']} "
                                                                             f"({m['paper_speedup']:.2f}x)")
    b.set(xlabel="tau", ylabel="predicted speedup (x)", ylim=(0, None),
          title="speedup = tau * t_AR / t_iter (dots: at the paper's tau; stars: the paper, H200)")
    b.legend(fontsize=7)
    for i, name in enumerate(report["settings"]["devices"]):
        items = sorted((int(k), v) for k, v in report["analysis"]["devices"][name]["eagle3_chain_draft_us_by_steps"].items())
        c.plot([k for k, _ in items], [v for _, v in items], "o-", ms=3, color=f"C{i}",
               label=f"EAGLE-3 chain, {DEVICES[name].name}")
        d = report["analysis"]["devices"][name]["methods"][0]["draft_us"]
        c.axhline(d, color=f"C{i}", ls="--", lw=1, label=f"DFlash, one pass ({d:.0f} us)")
    c.set(xlabel="EAGLE-3 drafting steps k", ylabel="draft us per iteration", title="k sequential steps vs one pass")
    c.legend(fontsize=7)
    fig.suptitle(f"EAGLE-3 vs DFlash roofline: {report['pair']['name']}, {report['settings']['dtype']}, "
                 f"S = {report['settings']['context']}, batch {report['settings']['batch']}")
    return fig


def tree_spec(text: str) -> tuple[int, int]:
    """One ``--eagle3-trees`` value ``N:TOPK``."""
    return parse_tree_spec(text, "--eagle3-trees")


def run_eagle3(args) -> dict:
    """``roofline --eagle3``: Qwen3-8B's shapes (or ``--target``'s config with its DFlash
    ``--drafter``), DFlash with the 5-layer block-16 drafter against the EAGLE-3 chain and
    trees; JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    for name in ("context", "batch", "drafter_layers", "eagle3_steps", "eagle3_draft_vocab"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    trees = [tree_spec(t) for t in args.eagle3_trees]
    name, target, dflash = dense.load_pair(args)
    if args.block_size:
        dflash = dataclasses.replace(dflash, block_size=args.block_size)
    eagle = eagle3_config(target, args.eagle3_draft_vocab)
    devices = list(EAGLE3_DEVICES) if list(args.devices) == list(DEVICES) else list(args.devices)
    ms = methods(args.eagle3_steps, trees)
    report = {
        "benchmark": "roofline_eagle3",
        "command": command_line("dflash_jax", invocation(args)),
        "pair": {"name": name, "target": target.to_hf_dict(), "dflash": dflash.to_hf_dict(),
                 "eagle3": eagle.to_hf_dict(), "target_params": target.num_params(),
                 "dflash_params": dense._drafter_params(dflash), "dflash_layers": dflash.num_layers,
                 "dflash_block_size": dflash.block_size, "eagle3_params": eagle3_params(eagle),
                 "draft_vocab": eagle.draft_vocab_size},
        "settings": {"steps": args.eagle3_steps, "trees": trees, "context": args.context, "batch": args.batch,
                     "dtype": args.dtype, "devices": devices},
        "paper": PAPER,
        "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
        "analysis": analyse(target, dflash, eagle, ms, args.context, devices, batch=args.batch,
                            weight_bytes=dense.DTYPE_BYTES[args.dtype]),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    stem = f"eagle3_{name}_k{args.eagle3_steps}_S{args.context}_b{args.batch}"
    return publish_report(report, args.out, stem, plot, markdown)
