"""The drafting budget of both methods against its cost: EAGLE-3 with k = 1, 2, 3, 5, 7 drafting
steps (chains) and its trees of 16 and 60 nodes, DFlash with blocks of 4, 8, 16 (chains) and
trees; tau and the decode speedup plotted against the draft's measured milliseconds per
iteration; inference only (no drafter is trained), T = 0.

    python -m experiments.ablate_budget                    # cpu preset: the embedded pair + embedded-eagle3
    python -m experiments.ablate_budget --preset smoke --out /tmp/budget   # random-weight EAGLE-3 drafter
    experiments.ablate_budget.run(preset="smoke") -> dict  # the table (table.json's content)

The paper's argument (docs/eagle3.md): EAGLE-3 drafts k tokens with k SEQUENTIAL passes of its
one layer, DFlash a whole block in ONE pass of its drafter, so EAGLE-3's draft cost grows with its
budget and DFlash's barely does. Each cell is one drafter and one budget:

  EAGLE-3 chain k   ``generate(..., drafter=eagle3, block_size=k + 1)``: k steps, k drafts
  EAGLE-3 tree N    ``generate(..., drafter=eagle3, block_size=depth + 1, tree=N, tree_topk=K)``:
                    EAGLE-2/3's dynamic tree of N nodes (root included), depth steps of K nodes
  DFlash block b    ``generate(..., drafter=dflash, block_size=b)``: one pass, b - 1 drafts
  DFlash tree N     ``generate(..., drafter=dflash, block_size=b, tree=N, tree_topk=K)`` (docs/trees.md)

Per cell the draft of one iteration is timed at the first prompt's context
(``bench.iteration_profile.step_ms``: the proposer's step jitted alone, the median of
``--timing-repeats`` runs after a compiling one; host dispatch included, one call), the whole
iteration's cost is the decode loop's (iteration / AR step), and the whole run is
``bench``'s protocol (batch 1, the prompt sets rendered with the chat template, compiles excluded
by a warm-up, mt-bench's second turn carrying the autoregressive answer), with per prompt the
autoregressive baseline run once and every cell after it, so the cells share their AR timings
(``ablate_tree``'s protocol). Every program has one shape for the whole run (one prompt width and
cache length over every set and cell), so each compiles once.

The EAGLE-3 drafter (``--eagle3``): ``embedded-eagle3``, the one shipped with the package for the
embedded target; a directory in the released layout; or ``random``, a random-weight drafter
(``methods.eagle3.named.random_eagle3``): acceptance ~1, for the smoke preset and the tests, whose
numbers are not results.

The outputs, under ``--out`` (default ``$DFLASH_JAX_HOME/results/ablations/ablate_budget``,
``...-smoke`` for the smoke preset; the committed results only with an explicit ``--out
results/ablations/ablate_budget``): ``table.json`` (settings, every response's acceptance lengths
and times, per cell the draft milliseconds, per set and on average tau and the decode
speedup with 95 % bootstrap intervals), ``table.md``, ``plot.png`` and ``README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import typing
from typing import Sequence

import numpy as np

from dflash_jax import figures, metrics
from dflash_jax.bench import harness
from dflash_jax.decoding.tree_args import tree_spec as parse_tree_spec
from dflash_jax.methods.eagle3.named import EMBEDDED_EAGLE3, RANDOM, load_eagle3_drafter
from dflash_jax.bench.prompt_sets import DATASETS, SUBSETS, load_prompt_set
from dflash_jax.cli import run_cli
from dflash_jax.decoding.generation import generate
from dflash_jax.decoding.prepare import round_up
from dflash_jax.experiments import framework
from dflash_jax.progress import progress
from dflash_jax.prompts import encode_prompt
from dflash_jax.reporting import command_line, cpu_model, environment, load_average, new_figure

NAME = "ablate_budget"
TABLE = framework.TABLE
EAGLE3 = "eagle3"
DFLASH = "dflash"

PRESETS: dict[str, dict] = {
    # seconds of decoding, one set, two prompts, a random-weight EAGLE-3 drafter, three cells
    # (an EAGLE-3 chain and tree, a DFlash chain): every stage runs (the test); no finding
    "smoke": dict(eagle3=RANDOM, eagle3_steps=(2,), eagle3_trees=("5:2",), eagle3_tree_steps=2,
                  dflash_blocks=(4,), dflash_trees=(), datasets=("gsm8k",), max_samples=2, max_new_tokens=16,
                  timing_repeats=2),
    # the committed run: the five sets, the grid of the module docstring, the shipped EAGLE-3 drafter
    "cpu": dict(eagle3=EMBEDDED_EAGLE3, datasets=DATASETS, max_samples=4, max_new_tokens=64),
}

SMOKE_NOTE = ("smoke run (--preset smoke): two prompts of 16 tokens and a random-weight EAGLE-3 drafter, to show "
              "that every stage runs; its numbers are not results, and no finding is drawn from them")

PAPER = {"dflash": {"speedup": 4.86, "tau": 6.49, "setting": "block 16"},
         "eagle3 tree 16": {"speedup": 1.76, "tau": 2.96},
         "eagle3 tree 60": {"speedup": 2.02, "tau": None},
         "source": "DFlash (arXiv 2602.06036) Table 1: Qwen3-8B, T = 0, average over its sets, H200, bf16"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run depends on; each field is an option (``--field-name``), a preset gives
    the defaults.

    Attributes:
        target: Hugging Face target directory (with its tokenizer); 'embedded': the target
            shipped in the package
        drafter: its DFlash drafter directory; 'embedded': the drafter shipped in the package
        eagle3: its EAGLE-3 drafter: 'embedded-eagle3' (shipped), a directory in the released
            layout, or 'random' (random weights: acceptance ~1, smoke runs only)
        dtype: dtype the models compute in (default: float32 on CPU, bfloat16 on a GPU)
        eagle3_steps: EAGLE-3 chains, one cell per drafting steps k (block k + 1)
        eagle3_trees: EAGLE-3 trees, one cell each, as N:TOPK (node budget, frontier width)
        eagle3_tree_steps: the EAGLE-3 trees' depth (drafting steps)
        dflash_blocks: DFlash chains, one cell per block size
        dflash_trees: DFlash trees, one cell each, as N:TOPK
        dflash_tree_block: the DFlash trees' block size (depth block - 1)
        datasets: prompt sets of the evaluation
        max_samples: prompts per set
        max_new_tokens: tokens generated per prompt
        subset: which prompts of a set (as ``bench --subset``)
        seed: seed of the prompt subset
        timing_repeats: timed runs of each cell's draft, the median reported
    """

    target: str = framework.EMBEDDED
    drafter: str = framework.EMBEDDED
    eagle3: str = EMBEDDED_EAGLE3
    dtype: typing.Literal["float32", "bfloat16"] | None = None
    eagle3_steps: tuple[int, ...] = (1, 2, 3, 5, 7)
    eagle3_trees: tuple[str, ...] = ("16:4", "60:10")
    eagle3_tree_steps: int = 7
    dflash_blocks: tuple[int, ...] = (4, 8, 16)
    dflash_trees: tuple[str, ...] = ("16:4", "32:4")
    dflash_tree_block: int = 16
    datasets: tuple[str, ...] = DATASETS
    max_samples: int = 4
    max_new_tokens: int = 64
    subset: str = "random"
    seed: int = 0
    timing_repeats: int = 5


def tree_spec(value) -> tuple[int, int]:
    """One tree setting ``N:TOPK`` -> (N, TOPK); refused naming the form."""
    return parse_tree_spec(value, "tree")


def resolve(preset: str, overrides: dict) -> Settings:
    """The preset's settings with ``overrides`` (field names), checked; raises ValueError
    naming the setting."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    names = [f.name for f in dataclasses.fields(Settings)]
    unknown = [k for k in overrides if k not in names]
    if unknown:
        raise ValueError(f"{NAME} has no setting {unknown[0]!r}; the settings are: {', '.join(names)}")
    values = PRESETS[preset] | {k: v for k, v in overrides.items() if v is not None}
    for k in ("eagle3_steps", "eagle3_trees", "dflash_blocks", "dflash_trees", "datasets"):
        if k in values:
            values[k] = tuple(values[k])
    s = Settings(**values)
    check(s)
    return s


def check(s: Settings) -> None:
    """Refuses settings no run could honour, naming the option and the fix."""
    if not (s.eagle3_steps or s.eagle3_trees) or not (s.dflash_blocks or s.dflash_trees):
        raise ValueError("each method needs at least one budget: --eagle3-steps or --eagle3-trees, and "
                         "--dflash-blocks or --dflash-trees")
    for name in ("eagle3_steps", "dflash_blocks"):
        values = getattr(s, name)
        low = 1 if name == "eagle3_steps" else 2
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                what = "drafting steps k >= 1" if low == 1 else "a block needs the anchor and a draft (>= 2)"
                raise ValueError(f"--{name.replace('_', '-')} {v!r}: {what}")
        if len(set(values)) != len(values):
            raise ValueError(f"--{name.replace('_', '-')} must not repeat a value")
    for name in ("eagle3_trees", "dflash_trees"):
        specs = [tree_spec(t) for t in getattr(s, name)]
        if len(set(specs)) != len(specs):
            raise ValueError(f"--{name.replace('_', '-')} must not repeat a tree")
    if s.eagle3_tree_steps < 1:
        raise ValueError(f"--eagle3-tree-steps {s.eagle3_tree_steps}: a tree needs at least one drafting step")
    if s.dflash_tree_block < 2:
        raise ValueError(f"--dflash-tree-block {s.dflash_tree_block}: a block needs the anchor and a draft (>= 2)")
    for name in ("max_samples", "max_new_tokens", "timing_repeats"):
        if getattr(s, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    framework.check_prompt_sets(s.datasets, s.subset)


def cells(s: Settings) -> list[dict]:
    """The grid: EAGLE-3 chains, EAGLE-3 trees, DFlash chains, DFlash trees, each by budget."""
    out = [{"method": EAGLE3, "block_size": k + 1, "nodes": None, "topk": None} for k in sorted(s.eagle3_steps)]
    out += [{"method": EAGLE3, "block_size": s.eagle3_tree_steps + 1, "nodes": n, "topk": k}
            for n, k in sorted(map(tree_spec, s.eagle3_trees))]
    out += [{"method": DFLASH, "block_size": b, "nodes": None, "topk": None} for b in sorted(s.dflash_blocks)]
    out += [{"method": DFLASH, "block_size": s.dflash_tree_block, "nodes": n, "topk": k}
            for n, k in sorted(map(tree_spec, s.dflash_trees))]
    return out


def family(cell: dict) -> str:
    """The line a cell is plotted on: 'EAGLE-3 chain', 'EAGLE-3 tree', 'DFlash chain', 'DFlash tree'."""
    return ("EAGLE-3" if cell["method"] == EAGLE3 else "DFlash") + (" tree" if cell["nodes"] else " chain")


def cell_name(cell: dict) -> str:
    if cell["method"] == EAGLE3:
        steps = cell["block_size"] - 1
        return (f"EAGLE-3 tree {cell['nodes']} (top-{cell['topk']}, {steps} steps)" if cell["nodes"]
                else f"EAGLE-3 chain, k = {steps}")
    return (f"DFlash tree {cell['nodes']} (top-{cell['topk']}, block {cell['block_size']})" if cell["nodes"]
            else f"DFlash chain, block {cell['block_size']}")


def budget_label(cell: dict) -> str:
    """The short label beside a cell's point in the plot."""
    if cell["nodes"]:
        return f"N={cell['nodes']}"
    return f"k={cell['block_size'] - 1}" if cell["method"] == EAGLE3 else f"b={cell['block_size']}"


def cell_options(cell: dict) -> dict:
    """``generate``'s keywords for a cell (its drafter aside)."""
    tree = {"tree": cell["nodes"], "tree_topk": cell["topk"]} if cell["nodes"] else {}
    return {"block_size": cell["block_size"]} | tree


def verify_rows(cell: dict) -> int:
    """Target rows verified per iteration: the block for a chain, N for a tree."""
    return cell["nodes"] or cell["block_size"]


# ---------------------------------------------------------------------------- the run
def draft_ms(target, drafter, ids, cell: dict, repeats: int) -> float:
    """Milliseconds of one draft of ``cell`` at the context of prompt ``ids``
    (``bench.iteration_profile.step_ms``: the proposer's step jitted alone)."""
    from dflash_jax.bench.iteration_profile import step_ms

    return step_ms(target, drafter, [ids], repeats, cell["block_size"], cell["nodes"], cell["topk"] or 4,
                   verify=False)["draft_ms"]


def evaluate(s: Settings, target, drafters: dict, bar_write=print) -> dict:
    """Times every cell's draft, then runs AR and every cell on every prompt (and
    turn) of every set; returns ``{"sets": {set: {"ar": [...], "cells": [[...] per cell],
    "same_output": [...], "ids": [...]}}, "steps": [{draft_ms} per cell], "pad_to": ...}``
    with Response dicts (``metrics.Response.to_dict``). ``drafters``: {method: drafter}."""
    tok = target.tokenizer
    encode = lambda turns: encode_prompt(turns, tok, enable_thinking=False)
    grid = cells(s)
    sets = {n: load_prompt_set(n, None, s.max_samples, s.seed, subset=s.subset) for n in s.datasets}
    bound = max(len(encode(harness.chat(x.turns, ["x"] * (len(x.turns) - 1)))) + (len(x.turns) - 1) * (s.max_new_tokens + 8)
                for samples in sets.values() for x in samples)
    extra = max(max(c["block_size"], verify_rows(c)) for c in grid)
    pad_to = (round_up(bound, 16), round_up(bound + s.max_new_tokens + extra, 64))
    stops = target.stop_token_ids
    run = lambda ids, cell: generate(target, [ids], s.max_new_tokens,
                                     drafter=None if cell is None else drafters[cell["method"]],
                                     stop_token_ids=stops, seed=s.seed, pad_to=pad_to,
                                     **({} if cell is None else cell_options(cell)))
    first = encode(harness.chat(next(iter(sets.values()))[0].turns[:1], []))
    steps = []
    with progress(total=len(grid), desc="timing the drafts", unit="cell") as bar:
        for cell in grid:
            steps.append({"draft_ms": draft_ms(target, drafters[cell["method"]], first, cell, s.timing_repeats)})
            bar.update(1)
    with progress(total=1 + len(grid), desc="compiling (warm-up)", unit="program") as bar:
        for cell in [None] + grid:
            run(first, cell)
            bar.update(1)
    out = {}
    total = sum(len(x.turns) for samples in sets.values() for x in samples)
    with progress(total=total, desc=f"AR + {len(grid)} cells per prompt", unit="prompt") as bar:
        for name, samples in sets.items():
            rec = {"ar": [], "cells": [[] for _ in grid], "same_output": [0] * len(grid), "ids": []}
            for x in samples:
                answers = []
                for t in range(len(x.turns)):
                    ids = encode(harness.chat(x.turns[:t + 1], answers))
                    ar = run(ids, None)
                    answers.append(tok.decode(ar.sequences[0], skip_special_tokens=True) if tok else "")
                    rec["ar"].append(metrics.response(ar).to_dict())
                    rec["ids"].append(f"{x.id}/{t + 1}")
                    for i, cell in enumerate(grid):
                        df = run(ids, cell)
                        if df.includes_compilation:
                            bar_write(f"warning: {cell_name(cell)} compiled after the warm-up on {x.id}: its time "
                                      "includes compilation")
                        rec["cells"][i].append(metrics.response(df).to_dict())
                        rec["same_output"][i] += int(df.sequences[0] == ar.sequences[0])
                    bar.update(1)
            out[name] = rec
    return {"sets": out, "steps": steps, "pad_to": list(pad_to), "context": len(first)}


def summarize(s: Settings, measured: dict) -> list[dict]:
    """One row per cell: its draft milliseconds, per set and on average tau and the
    decode speedup with 95 % intervals (bootstrap over responses, stratified by set), the
    iteration's cost in AR steps, and how many outputs equal the AR output."""
    rows = []
    for i, cell in enumerate(cells(s)):
        per, groups = {}, {}
        for name, rec in measured["sets"].items():
            ar = [metrics.Response.from_dict(r) for r in rec["ar"]]
            df = [metrics.Response.from_dict(r) for r in rec["cells"][i]]
            per[name] = metrics.summarize(ar, df, cell["block_size"]) | {
                "same_output": rec["same_output"][i], "iteration_cost_ar_steps": harness.iteration_cost(ar, df)}
            groups[name] = (ar, df)
        average = metrics.average(groups)
        average["responses"] = sum(p["responses"] for p in per.values())
        average["iteration_cost_ar_steps"] = float(np.mean([p["iteration_cost_ar_steps"] for p in per.values()]))
        rows.append({"label": dict(cell), "name": cell_name(cell), "family": family(cell),
                     "verify_rows": verify_rows(cell), **measured["steps"][i], "datasets": per,
                     "average": average, "same_output": sum(p["same_output"] for p in per.values()),
                     "responses": average["responses"]})
    return rows


# ---------------------------------------------------------------------------- outputs
def markdown(table: dict) -> str:
    sets = list(table["settings"]["datasets"])
    head = ("| cell | verify rows | draft ms / iteration | tau [95% CI] | "
            "speedup, decode [95% CI] | " + " | ".join(f"{x} tau / speedup" for x in sets)
            + " | iteration / AR step | same output as AR |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in table["rows"]:
        av = r["average"]
        c = [r["name"], str(r["verify_rows"]), f"{r['draft_ms']:.2f}",
             metrics.interval_text(av["tau"], av["tau_ci"]), metrics.interval_text(av["speedup"], av["speedup_ci"]) + "x"]
        c += [f"{r['datasets'][x]['tau']:.2f} / {r['datasets'][x]['speedup']:.2f}x" for x in sets]
        c += [f"{av['iteration_cost_ar_steps']:.2f}", f"{r['same_output']} / {r['responses']}"]
        lines.append("| " + " | ".join(c) + " |")
    return "\n".join(lines)


FAMILIES = ("EAGLE-3 chain", "EAGLE-3 tree", "DFlash chain", "DFlash tree")
STYLE = {"EAGLE-3 chain": ("C3", "o-"), "EAGLE-3 tree": ("C1", "s--"), "DFlash chain": ("C0", "o-"),
         "DFlash tree": ("C2", "s--")}


def plot(table: dict):
    """tau and decode speedup against the draft's measured ms per iteration: one line per
    method family through its budgets (labelled), 95 % intervals as error bars where they exist
    (the legend says which); a smoke run and a busy machine marked (``figures.report_notes``)."""
    fig, axes = new_figure(1, 2, figsize=(13, 4.8))
    rows = table["rows"]
    for ax, key, title in ((axes[0], "tau", "tau (mean acceptance length)"),
                           (axes[1], "speedup", "decode speedup over AR (x)")):
        for fam in FAMILIES:
            rs = sorted((r for r in rows if r["family"] == fam), key=lambda r: r["draft_ms"])
            if not rs:
                continue
            color, fmt = STYLE[fam]
            xs = np.array([r["draft_ms"] for r in rs])
            ys = np.array([r["average"][key] for r in rs])
            err = figures.interval_errors(ys, [r["average"][key + "_ci"] for r in rs])
            fewest = min((r["responses"] for r in rs if r.get("responses") is not None), default=None)
            ax.errorbar(xs, ys, yerr=err, fmt=fmt, color=color, capsize=3,
                        label=f"{fam} ({figures.interval_label(err, fewest)})")
            for r, x, y in zip(rs, xs, ys):
                ax.annotate(budget_label(r["label"]), (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=color)
        if key == "speedup":
            ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set(xlabel="draft ms per iteration (measured)", ylabel=title,
               title=f"{title}, {table['preset']} preset, T = 0")
        ax.legend(fontsize=7)
    env = table["environment"]
    fig.suptitle(f"{NAME}: drafting budget vs draft cost, EAGLE-3 ({table['settings']['eagle3']}) and DFlash "
                 f"({env.get('cpu_model') or env.get('device', '?')})")
    return figures.finish(fig, figures.report_notes(table))


def findings(table: dict) -> list[str]:
    """The draft cost against the budget per method (measured, no interval: one timing), tau
    and speedup across each method's budgets and between the methods' defaults through the
    intervals, and whether every output equals AR."""
    rows = table["rows"]
    out = []
    for fam in FAMILIES:
        rs = sorted((r for r in rows if r["family"] == fam), key=lambda r: (r["label"]["nodes"] or 0,
                                                                             r["label"]["block_size"]))
        if len(rs) < 2:
            continue
        a, b = rs[0], rs[-1]
        out.append(f"{fam}: {budget_label(a['label'])} -> {budget_label(b['label'])}: draft "
                   f"{a['draft_ms']:.2f} -> {b['draft_ms']:.2f} ms per iteration (x{b['draft_ms'] / a['draft_ms']:.2f}); "
                   f"tau {a['average']['tau']:.2f} -> {b['average']['tau']:.2f} ({framework.verdict(a, b)}); speedup "
                   f"{a['average']['speedup']:.2f}x -> {b['average']['speedup']:.2f}x "
                   f"({framework.verdict(a, b, 'speedup')})")
    largest = lambda fam: max((r for r in rows if r["family"] == fam), key=lambda r: r["label"]["block_size"],
                              default=None)
    e, d = largest("EAGLE-3 chain"), largest("DFlash chain")
    if e and d:
        out.append(f"the largest chains, {e['name']} against {d['name']}: draft {e['draft_ms']:.2f} vs "
                   f"{d['draft_ms']:.2f} ms ({e['label']['block_size'] - 1} sequential steps vs one pass over "
                   f"{d['label']['block_size']} rows); tau {e['average']['tau']:.2f} vs {d['average']['tau']:.2f} "
                   f"({framework.verdict(e, d)}); speedup {e['average']['speedup']:.2f}x vs "
                   f"{d['average']['speedup']:.2f}x ({framework.verdict(e, d, 'speedup')})")
    steps = sorted((r for r in rows if r["family"] == "EAGLE-3 chain"), key=lambda r: r["label"]["block_size"])
    if len(steps) >= 2:
        k = [r["label"]["block_size"] - 1 for r in steps]
        slope = np.polyfit(k, [r["draft_ms"] for r in steps], 1)[0]
        out.append(f"EAGLE-3's draft cost per extra step (least squares over k = {', '.join(map(str, k))}): "
                   f"{slope:.3f} ms; its drafter runs once per step, DFlash's once per iteration")
    lossless = all(r["same_output"] == r["responses"] for r in rows)
    out.append("every output equals the autoregressive output (T = 0)" if lossless else
               "some outputs differ from the autoregressive output: " + ", ".join(
                   f"{r['name']}: {r['same_output']} / {r['responses']}" for r in rows
                   if r["same_output"] != r["responses"]))
    return out


def readme(table: dict, md: str) -> str:
    s, env = table["settings"], table["environment"]
    load = table["load_average"]
    lines = [f"# {NAME} ({table['preset']} preset)", ""]
    if table["smoke"]:
        lines += [f"**This is a smoke run**: {SMOKE_NOTE.split(': ', 1)[1]}.", ""]
    lines += [__doc__.split("\n\n")[0].replace("\n", " "), "",
              f"Command: `{table['command']}`", "",
              f"Machine: {env['device']} ({env['platform']}, {env.get('cpu_model') or ''} {env['cpu_count']} cores), "
              f"jax {env['jax']}; load average (1, 5, 15 min) {load['before']} before and {load['after']} after; "
              f"{table['minutes']:.1f} minutes. The milliseconds, speedups and iteration costs depend on the load; "
              "tau and the outputs do not.", "",
              "## Settings", "",
              f"- pair: target {s['target']}, DFlash drafter {s['drafter']}, EAGLE-3 drafter {s['eagle3']}; no training",
              f"- EAGLE-3: chains of k = {', '.join(map(str, s['eagle3_steps']))} steps; trees "
              f"{', '.join(s['eagle3_trees']) or '-'} (N:top-k) of {s['eagle3_tree_steps']} steps",
              f"- DFlash: chains of block {', '.join(map(str, s['dflash_blocks']))}; trees "
              f"{', '.join(s['dflash_trees']) or '-'} (N:top-k) at block {s['dflash_tree_block']}",
              f"- evaluation: {', '.join(s['datasets'])}, {s['max_samples']} prompts each (mt-bench: 2 turns), "
              f"{s['max_new_tokens']} new tokens, T = 0, batch 1; per prompt AR once, then every cell; one compiled "
              f"program per cell (prompt width and cache {table['pad_to']})",
              f"- draft ms: the proposer's step jitted alone at the first prompt's context ({table['context']} "
              f"tokens), the median of {s['timing_repeats']} runs after a compiling one",
              "", "## Results", "",
              "tau: per response the mean acceptance length, then the mean over responses; speedup: mean AR time per "
              "output token / mean time per output token of the cell, decode phase only (docs/method.md section 6); "
              "[95% CI]: percentile bootstrap over responses, stratified by prompt set; none where it would rest on "
              f"fewer than {metrics.MIN_DISTINCT_SAMPLES} responses. iteration / AR step: decode time per iteration "
              "over AR time per token, mean over the sets.", "", md, "", "![plot](plot.png)", "",
              "## The paper", "",
              f"{PAPER['source']}: DFlash (block 16) {PAPER['dflash']['speedup']:.2f}x / tau {PAPER['dflash']['tau']:.2f}; "
              f"EAGLE-3 tree 16 {PAPER['eagle3 tree 16']['speedup']:.2f}x / tau {PAPER['eagle3 tree 16']['tau']:.2f}, "
              f"tree 60 {PAPER['eagle3 tree 60']['speedup']:.2f}x (no tau given). The paper does not vary the budget "
              "of either method against its cost; what an H100 would do with these budgets for Qwen3-8B is "
              "predicted by `python -m dflash_jax roofline --eagle3` (results/roofline/eagle3).", "",
              "## What the data shows", ""]
    why = framework.no_interval(table["rows"])
    if why:
        lines.append(f"- no finding from some rows: {why}; the comparisons below say where")
    lines += [f"- {x}" for x in findings(table)]
    return "\n".join(lines) + "\n"


def write_outputs(table: dict, out: str) -> None:
    md = markdown(table)
    framework.write_table_set(out, md, plot(table), readme(table, md), table)


def check_out(out: str, overwrite: bool) -> None:
    """``--out`` may be new, empty, or hold a table of this experiment (replaced only with
    ``--overwrite``); anything else is refused before anything runs."""
    framework.check_measured_out(out, NAME, overwrite)


def default_out(preset: str) -> str:
    return os.path.join(framework.home(), "results", "ablations", NAME if preset == "cpu" else f"{NAME}-{preset}")


def run(preset: str = "smoke", *, out: str | None = None, overwrite: bool = False, command: str | None = None,
        **overrides) -> dict:
    """Runs the ablation under ``preset`` with ``overrides`` (any :class:`Settings` field) and
    writes the outputs to ``out``; returns the table (table.json's content)."""
    import jax
    import jax.numpy as jnp

    from dflash_jax.models.handles import load_drafter, load_target

    t0 = time.perf_counter()
    s = resolve(preset, overrides)
    out = out or default_out(preset)
    check_out(out, overwrite)
    for kind, path in (("target", s.target), ("drafter", s.drafter)):
        if not os.path.isdir(framework.checkpoint_dir(path, kind)):
            raise FileNotFoundError(f"{kind} directory {path!r} does not exist (--{kind})")
    dtype = jnp.dtype(s.dtype) if s.dtype else (jnp.float32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16)
    target = load_target(framework.checkpoint_dir(s.target, "target"), dtype=dtype)
    if target.tokenizer is None:
        raise ValueError(f"{s.target} has no tokenizer; the prompt sets are text")
    drafters = {DFLASH: load_drafter(framework.checkpoint_dir(s.drafter, "drafter"), target, dtype=target.dtype),
                EAGLE3: load_eagle3_drafter(s.eagle3, target, dtype=target.dtype)}
    before = load_average()
    print(f"{NAME}: {len(cells(s))} cells + the AR baseline on {', '.join(s.datasets)}; results -> {out}",
          file=sys.stderr, flush=True)
    if preset == "smoke":
        print(SMOKE_NOTE, file=sys.stderr, flush=True)
    measured = evaluate(s, target, drafters)
    settings = json.loads(json.dumps(dataclasses.asdict(s), default=list))
    settings["target"] = framework.recorded_path(s.target, "target")
    settings["drafter"] = framework.recorded_path(s.drafter, "drafter")
    settings["eagle3"] = s.eagle3 if s.eagle3 in (RANDOM, EMBEDDED_EAGLE3) else framework.recorded_path(s.eagle3)
    table = {"experiment": NAME, "preset": preset, "smoke": preset == "smoke" or s.eagle3 == RANDOM,
             "settings": settings, "rows": summarize(s, measured), "responses": measured["sets"],
             "pad_to": measured["pad_to"], "context": measured["context"],
             # "paper" holds per-set rows in every table (viz.plot_against_paper); the paper gives
             # this comparison only as averages by method, so they go under their own key
             "paper": [], "paper_averages": PAPER,
             "command": command or f"experiments.{NAME}.run(preset={preset!r}, " + ", ".join(
                 f"{k}={v!r}" for k, v in overrides.items()) + ")",
             "environment": environment() | {"cpu_model": cpu_model()},
             "load_average": {"before": before, "after": load_average()},
             "minutes": (time.perf_counter() - t0) / 60, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_outputs(table, out)
    print(markdown(table))
    print(f"wrote {out}/table.md, table.json, plot.png, README.md", file=sys.stderr)
    return table


# ---------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m experiments.{NAME}", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="cpu",
                   help="smoke: seconds of decoding with a random-weight EAGLE-3 drafter, for tests; cpu: the "
                        "committed run (default)")
    p.add_argument("--out", help=f"output directory (default: $DFLASH_JAX_HOME/results/ablations/{NAME}[-<preset>]; "
                                 f"the committed results only with an explicit --out results/ablations/{NAME})")
    p.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    helps = framework.field_help(Settings)
    for f in dataclasses.fields(Settings):
        shown = ", ".join(f"{k} {framework._show(v.get(f.name, f.default))}" for k, v in PRESETS.items())
        kw = dict(dest=f.name, default=None, help=f"{helps.get(f.name, '')} (defaults: {shown})")
        if f.name in ("eagle3_steps", "dflash_blocks"):
            kw |= dict(nargs="+", type=int)
        elif f.name in ("eagle3_trees", "dflash_trees"):
            kw |= dict(nargs="*")
        elif f.name == "datasets":
            kw |= dict(nargs="+", choices=list(DATASETS))
        elif f.name in ("eagle3_tree_steps", "dflash_tree_block", "max_samples", "max_new_tokens", "seed",
                        "timing_repeats"):
            kw |= dict(type=int)
        elif f.name == "dtype":
            kw |= dict(choices=["float32", "bfloat16"])
        elif f.name == "subset":
            kw |= dict(choices=list(SUBSETS))
        p.add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def main(argv: Sequence[str] | None = None) -> dict | None:
    """``python -m experiments.ablate_budget``: parses the options and runs the ablation."""
    owns_process = argv is None  # the command line: Ctrl-C handling, the compilation cache (run_cli)
    argv = list(sys.argv[1:] if argv is None else argv)
    result = {}

    def go(a):
        args = parser().parse_args(a)
        overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)
                     if getattr(args, f.name) is not None}
        result["table"] = run(args.preset, out=args.out, overwrite=args.overwrite,
                              command=command_line(f"experiments.{NAME}", a), **overrides)

    run_cli(go, argv, owns_process=owns_process)
    return result.get("table")


if __name__ == "__main__":
    main()
