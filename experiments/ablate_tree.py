"""Tree budget x block size: the embedded pair's shipped drafter verified as the chain and as
best-first trees of 16, 32 and 64 nodes (docs/trees.md), at inference block sizes 8 and 16;
inference only (no drafter is trained), T = 0.

    python -m experiments.ablate_tree                      # cpu preset, the embedded pair
    python -m experiments.ablate_tree --preset smoke --out /tmp/tree
    experiments.ablate_tree.run(preset="smoke") -> dict    # the table (table.json's content)

Every cell decodes the same prompts with ``generate(target, prompts, n, drafter=d, tree=N,
tree_topk=K, block_size=bs)`` (the chain: ``tree=None``); a tree's depth is bounded by the
block (``bs - 1`` drafts), so a block of 8 caps the acceptance length at 8 whatever N. The
protocol is ``python -m dflash_jax bench``'s (batch 1, the prompt sets rendered with the chat
template, compiles excluded by a warm-up, mt-bench's second turn carrying the autoregressive
answer to the first), with one change that saves most of the time: per prompt the
autoregressive baseline runs once and every cell's DFlash run follows it (interleaved per
prompt), so the cells share their AR timings. Every program has one shape for the whole run
(one prompt width and cache length over every set), so each is compiled once.

The outputs, under ``--out`` (default ``$DFLASH_JAX_HOME/results/ablations/ablate_tree``,
``...-smoke`` for the smoke preset; the committed results only with an explicit ``--out
results/ablations/ablate_tree``): ``table.json`` (settings, every response's acceptance lengths
and times, per cell and prompt set tau and the decode-only speedup with the framework's 95 %
bootstrap intervals), ``table.md``, ``plot.png`` and ``README.md`` (command, machine and load
average, the table, the external reference, what the data shows). Findings compare rows only
through their intervals (``experiments.framework.verdict``).

The paper has no tree results for DFlash (its EAGLE-3 baseline uses trees of 16 and 60 nodes);
tree drafting on DFlash is reported elsewhere (:data:`EXTERNAL`), not by the paper.
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
from dflash_jax.bench.prompt_sets import DATASETS, SUBSETS, load_prompt_set
from dflash_jax.cli import run_cli
from dflash_jax.decoding.generation import generate
from dflash_jax.decoding.prepare import round_up
from dflash_jax.experiments import framework
from dflash_jax.progress import progress
from dflash_jax.prompts import encode_prompt
from dflash_jax.reporting import command_line, cpu_model, environment, load_average, new_figure

NAME = "ablate_tree"
CHAIN = "chain"
TABLE = framework.TABLE

PRESETS: dict[str, dict] = {
    # seconds of decoding, one set, two prompts: every stage runs (the test); no finding
    "smoke": dict(nodes=(CHAIN, 8), block_sizes=(8,), datasets=("gsm8k",), max_samples=2, max_new_tokens=16),
    # the committed run: the five sets, the grid
    "cpu": dict(nodes=(CHAIN, 16, 32, 64), block_sizes=(8, 16), datasets=DATASETS, max_samples=4,
                max_new_tokens=64),
}

SMOKE_NOTE = ("smoke run (--preset smoke): two prompts of 16 tokens, to show that every stage runs; its numbers "
              "are not results, and no finding is drawn from them")

EXTERNAL = [
    {"what": "SGLang pull request 31069, 'DFLASH EAGLE-style draft-tree verification' (open)",
     "url": "https://github.com/sgl-project/sglang/pull/31069",
     "reported": "about +22 % acceptance length with a node budget of 32 over the DFlash chain"},
    {"what": "vLLM pull request 42910, 'Support DDTree speculative decoding' (open), and the "
             "DDTree method it ports (Ringel & Romano, arXiv 2604.12989)",
     "url": "https://github.com/vllm-project/vllm/pull/42910",
     "reported": "tree drafting from the DFlash drafter; an independent measurement in its thread found no "
                 "acceptance gain on a Qwen3.5-4B hybrid target, so the gain depends on the pair"},
    {"what": "ddtree-mlx, an MLX port of DDTree on the DFlash drafter (via jundot/omlx pull request 805)",
     "url": "https://github.com/jundot/omlx/pull/805",
     "reported": "the same tree drafting on Apple silicon"},
]
"""Tree drafting on DFlash reported outside the paper (the issue cites about +21-22 % tau)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run depends on; each field is an option (``--field-name``), a preset gives
    the defaults.

    Attributes:
        target: Hugging Face target directory (with its tokenizer); 'embedded': the target
            shipped in the package
        drafter: its DFlash drafter directory; 'embedded': the drafter shipped in the package
        dtype: dtype the pair computes in (default: float32 on CPU, bfloat16 on a GPU)
        nodes: verify policies, one cell each per block size: 'chain' or a tree's node budget
            N (>= 2, the root included)
        block_sizes: inference block sizes (a tree's depth is at most block size - 1)
        tree_topk: children per tree node at most (the drafter's k most likely tokens)
        datasets: prompt sets of the evaluation
        max_samples: prompts per set
        max_new_tokens: tokens generated per prompt
        subset: which prompts of a set (as ``bench --subset``)
        seed: seed of the prompt subset
    """

    target: str = framework.EMBEDDED
    drafter: str = framework.EMBEDDED
    dtype: typing.Literal["float32", "bfloat16"] | None = None
    nodes: tuple = (CHAIN, 16, 32, 64)
    block_sizes: tuple[int, ...] = (8, 16)
    tree_topk: int = 4
    datasets: tuple[str, ...] = DATASETS
    max_samples: int = 4
    max_new_tokens: int = 64
    subset: str = "random"
    seed: int = 0


def node_budget(value) -> str | int:
    """One ``--nodes`` value: 'chain' or an integer node budget."""
    if value == CHAIN:
        return CHAIN
    try:
        return int(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r} is neither 'chain' nor a node budget (an integer >= 2)") from None


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
    for k in ("nodes", "block_sizes", "datasets"):
        values[k] = tuple(values[k]) if k in values else getattr(Settings, k)
    values["nodes"] = tuple(node_budget(n) for n in values.get("nodes", Settings.nodes))
    s = Settings(**values)
    check(s)
    return s


def check(s: Settings) -> None:
    """Refuses settings no run could honour, naming the option and the fix."""
    if not s.nodes or not s.block_sizes:
        raise ValueError("--nodes and --block-sizes each need at least one value")
    for n in s.nodes:
        if n != CHAIN and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ValueError(f"--nodes {n!r}: a tree needs at least 2 nodes (the root and one draft); "
                             f"give 'chain' or N >= 2")
    for bs in s.block_sizes:
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 2:
            raise ValueError(f"--block-sizes {bs!r}: a block needs the anchor and at least one draft (>= 2)")
    if len(set(s.nodes)) != len(s.nodes) or len(set(s.block_sizes)) != len(s.block_sizes):
        raise ValueError("--nodes and --block-sizes must not repeat a value")
    if s.tree_topk < 1:
        raise ValueError(f"--tree-topk {s.tree_topk}: a node needs at least 1 child")
    for name in ("max_samples", "max_new_tokens"):
        if getattr(s, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    framework.check_prompt_sets(s.datasets, s.subset)


def cells(s: Settings) -> list[dict]:
    """The grid: one cell per (block size, verify policy), the chain first at each block."""
    return [{"nodes": n, "block_size": bs} for bs in s.block_sizes for n in s.nodes]


def cell_name(cell: dict) -> str:
    return (CHAIN if cell["nodes"] == CHAIN else f"tree {cell['nodes']}") + f", block {cell['block_size']}"


def cell_options(cell: dict, topk: int) -> dict:
    """``generate``'s keywords for a cell."""
    tree = {} if cell["nodes"] == CHAIN else {"tree": cell["nodes"], "tree_topk": topk}
    return {"block_size": cell["block_size"]} | tree


def verify_rows(cell: dict) -> int:
    """Target rows verified per iteration: the block for the chain, N for a tree."""
    return cell["block_size"] if cell["nodes"] == CHAIN else cell["nodes"]


# ---------------------------------------------------------------------------- the run
def evaluate(s: Settings, target, drafter, bar_write=print) -> dict:
    """Runs AR and every cell on every prompt (and turn) of every set; returns
    ``{"sets": {set: {"ar": [...], "cells": [[...] per cell], "same_output": [...]}}, "pad_to": ...}``
    with Response dicts (``metrics.Response.to_dict``)."""
    tok = target.tokenizer
    encode = lambda turns: encode_prompt(turns, tok, enable_thinking=False)
    grid = cells(s)
    sets = {n: load_prompt_set(n, None, s.max_samples, s.seed, subset=s.subset) for n in s.datasets}
    # one (prompt width, cache length) for every set and cell: each program compiles once
    bound = max(len(encode(harness.chat(x.turns, ["x"] * (len(x.turns) - 1)))) + (len(x.turns) - 1) * (s.max_new_tokens + 8)
                for samples in sets.values() for x in samples)
    extra = max(max(c["block_size"], verify_rows(c)) for c in grid)
    pad_to = (round_up(bound, 16), round_up(bound + s.max_new_tokens + extra, 64))
    stops = target.stop_token_ids
    run = lambda ids, cell: generate(target, [ids], s.max_new_tokens, drafter=None if cell is None else drafter,
                                     stop_token_ids=stops, seed=s.seed, pad_to=pad_to,
                                     **({} if cell is None else cell_options(cell, s.tree_topk)))
    first = encode(harness.chat(next(iter(sets.values()))[0].turns[:1], []))
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
    return {"sets": out, "pad_to": list(pad_to)}


def summarize(s: Settings, measured: dict) -> list[dict]:
    """One row per cell: per set and on average tau and the decode speedup with 95 % intervals
    (``metrics.summarize`` / ``metrics.average``: bootstrap over responses, stratified by set),
    the iteration's cost in AR steps, and how many outputs equal the AR output."""
    rows = []
    for i, cell in enumerate(cells(s)):
        per = {}
        for name, rec in measured["sets"].items():
            ar = [metrics.Response.from_dict(r) for r in rec["ar"]]
            df = [metrics.Response.from_dict(r) for r in rec["cells"][i]]
            summary = metrics.summarize(ar, df, cell["block_size"])
            per[name] = summary | {"same_output": rec["same_output"][i],
                                   "iteration_cost_ar_steps": harness.iteration_cost(ar, df)}
        groups = {name: ([metrics.Response.from_dict(r) for r in rec["ar"]],
                         [metrics.Response.from_dict(r) for r in rec["cells"][i]])
                  for name, rec in measured["sets"].items()}
        average = metrics.average(groups)
        average["responses"] = sum(p["responses"] for p in per.values())
        costs = [p["iteration_cost_ar_steps"] for p in per.values()]
        average["iteration_cost_ar_steps"] = float(np.mean(costs))
        rows.append({"label": {"nodes": cell["nodes"], "block_size": cell["block_size"]},
                     "verify_rows": verify_rows(cell), "datasets": per, "average": average,
                     "same_output": sum(p["same_output"] for p in per.values()),
                     "responses": average["responses"]})
    return rows


# ---------------------------------------------------------------------------- outputs
def markdown(table: dict) -> str:
    rows, sets = table["rows"], list(table["settings"]["datasets"])
    head = ("| nodes | block | verify rows | tau [95% CI] | speedup, decode [95% CI] | tau vs the chain | "
            + " | ".join(f"{x} tau / speedup" for x in sets) + " | iteration / AR step | same output as AR |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    chain = {r["label"]["block_size"]: r for r in rows if r["label"]["nodes"] == CHAIN}
    for r in rows:
        av = r["average"]
        ref = chain.get(r["label"]["block_size"])
        gain = ("-" if ref is None or r is ref else
                f"{100 * (av['tau'] / ref['average']['tau'] - 1):+.1f} %")
        cells_ = [str(r["label"]["nodes"]), str(r["label"]["block_size"]), str(r["verify_rows"]),
                  metrics.interval_text(av["tau"], av["tau_ci"]), metrics.interval_text(av["speedup"], av["speedup_ci"]) + "x",
                  gain]
        cells_ += [f"{r['datasets'][x]['tau']:.2f} / {r['datasets'][x]['speedup']:.2f}x" for x in sets]
        cells_ += [f"{av['iteration_cost_ar_steps']:.2f}", f"{r['same_output']} / {r['responses']}"]
        lines.append("| " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def _order(nodes) -> int:
    return 0 if nodes == CHAIN else int(nodes)


def plot(table: dict):
    """tau and decode speedup against the verify policy (chain, then node budgets), one line
    per block size with its 95 % intervals where they exist; each prompt set a small marker; a
    smoke run and a busy machine marked (``figures.report_notes``)."""
    fig, axes = new_figure(1, 2, figsize=(12, 4.4))
    rows = table["rows"]
    policies = sorted({r["label"]["nodes"] for r in rows}, key=_order)
    x = {p: i for i, p in enumerate(policies)}
    for ax, key, title in ((axes[0], "tau", "tau (mean acceptance length)"),
                           (axes[1], "speedup", "decode speedup over AR (x)")):
        for j, bs in enumerate(sorted({r["label"]["block_size"] for r in rows})):
            rs = sorted((r for r in rows if r["label"]["block_size"] == bs), key=lambda r: _order(r["label"]["nodes"]))
            xs = np.array([x[r["label"]["nodes"]] for r in rs]) + 0.08 * (j - 0.5)
            ys = np.array([r["average"][key] for r in rs])
            err = figures.interval_errors(ys, [r["average"][key + "_ci"] for r in rs])
            fewest = min((r["responses"] for r in rs if r.get("responses") is not None), default=None)
            ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, color=f"C{j}",
                        label=f"block {bs}, average, {figures.interval_label(err, fewest)}")
            for name in table["settings"]["datasets"]:
                ax.plot(xs, [r["datasets"][name][key] for r in rs], ".", color=f"C{j}", alpha=0.35)
        if key == "speedup":
            ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set_xticks(range(len(policies)), [str(p) if p == CHAIN else f"tree {p}" for p in policies])
        ax.set(xlabel="verify policy (small dots: the prompt sets)", ylabel=title,
               title=f"{title}, {table['preset']} preset, T = 0")
        ax.legend(fontsize=7)
    fig.suptitle(f"{NAME}: the embedded pair's shipped drafter, top-{table['settings']['tree_topk']} trees "
                 f"({table['environment'].get('device', '?')})")
    return figures.finish(fig, figures.report_notes(table))


def findings(table: dict) -> list[str]:
    """Each tree against the chain of its block, tau and speedup, through the intervals; the
    two block sizes at each policy; the external reference."""
    rows = table["rows"]
    by = {(r["label"]["nodes"], r["label"]["block_size"]): r for r in rows}
    out = []
    for bs in table["settings"]["block_sizes"]:
        if (CHAIN, bs) not in by:
            continue
        chain = by[(CHAIN, bs)]
        for n in table["settings"]["nodes"]:
            if n == CHAIN or (n, bs) not in by:
                continue
            r = by[(n, bs)]
            for key in ("tau", "speedup"):
                a, b = chain["average"][key], r["average"][key]
                out.append(f"block {bs}, {key}: chain {a:.2f} -> tree {n} {b:.2f} ({100 * (b / a - 1):+.1f} %; "
                           f"{framework.verdict(chain, r, key)})")
    sizes = sorted(table["settings"]["block_sizes"])
    if len(sizes) >= 2:
        for n in table["settings"]["nodes"]:
            pair = [by.get((n, bs)) for bs in (sizes[0], sizes[-1])]
            if all(pair):
                out.append(f"{n if n == CHAIN else f'tree {n}'}: block {sizes[0]} -> {sizes[-1]}: tau "
                           f"{pair[0]['average']['tau']:.2f} -> {pair[1]['average']['tau']:.2f} "
                           f"({framework.verdict(pair[0], pair[1])})")
    for bs in table["settings"]["block_sizes"]:
        trees = [n for n in table["settings"]["nodes"] if n != CHAIN and (n, bs) in by]
        if (CHAIN, bs) in by and trees:
            big = by[(max(trees), bs)]
            out.append(f"block {bs}: one iteration cost {by[(CHAIN, bs)]['average']['iteration_cost_ar_steps']:.2f} "
                       f"AR steps with the chain and {big['average']['iteration_cost_ar_steps']:.2f} with the tree of "
                       f"{max(trees)} here: on a CPU the target's verify is compute-bound, its time grows with the "
                       "rows verified, and the tree's extra acceptance does not pay for its extra rows; at batch 1 on a "
                       "GPU the verify is memory-bound up to the ridge point (hundreds of rows), where N rows cost "
                       "about what one does (the roofline's prediction per node budget: results/roofline/tree)")
    lossless = all(r["same_output"] == r["responses"] for r in rows)
    out.append("every DFlash output equals the autoregressive output (T = 0)" if lossless else
               "some outputs differ from the autoregressive output: " + ", ".join(
                   f"{r['label']}: {r['same_output']} / {r['responses']}" for r in rows if r["same_output"] != r["responses"]))
    out.append("the paper has no tree results for DFlash; the external reports (below) give about +22 % tau at a "
               "budget of 32 on GPU-served pairs: a different pair and drafter, not a comparison")
    return out


def readme(table: dict, md: str) -> str:
    s, env = table["settings"], table["environment"]
    lines = [f"# {NAME} ({table['preset']} preset)", ""]
    if table["preset"] == "smoke":
        lines += [f"**This is a smoke run**: {SMOKE_NOTE.split(': ', 1)[1]}.", ""]
    load = table["load_average"]
    intro = __doc__.split("\n\n")[0].replace("\n", " ")
    shipped = s["target"] == "embedded" and s["drafter"] == "embedded"
    if not shipped:  # another pair: name it instead of the shipped one
        intro = intro.replace("the embedded pair's shipped drafter", f"the drafter {s['drafter']} of the target {s['target']}")
    lines += [intro, "",
              f"Command: `{table['command']}`", "",
              f"Machine: {env['device']} ({env['platform']}, {env.get('cpu_model') or ''} {env['cpu_count']} cores), "
              f"jax {env['jax']}; load average (1, 5, 15 min) {load['before']} before and {load['after']} after; "
              f"{table['minutes']:.1f} minutes. The speedups and the iteration cost depend on the load (other jobs "
              "shared the 2 cores); tau and the outputs do not.", "",
              "## Settings", "",
              f"- pair: target {s['target']}, drafter {s['drafter']} "
              + ("(the shipped one, trained at block 16; no training here)" if shipped else "(no training here)"),
              f"- grid: verify {', '.join(str(n) for n in s['nodes'])} x inference block {', '.join(map(str, s['block_sizes']))}; "
              f"trees grown best-first from the drafter's per-depth log-probabilities, top-{s['tree_topk']} "
              "children per node, depth <= block - 1 (docs/trees.md)",
              f"- evaluation: {', '.join(s['datasets'])}, {s['max_samples']} prompts each (mt-bench: 2 turns), "
              f"{s['max_new_tokens']} new tokens, T = 0, batch 1; per prompt AR once, then every cell; one "
              f"compiled program per cell (prompt width and cache {table['pad_to']})",
              "", "## Results", "",
              "tau: per response the mean acceptance length, then the mean over responses; speedup: mean AR "
              "time per output token / mean DFlash time per output token, decode phase only (docs/method.md "
              "section 6); [95% CI]: percentile bootstrap over responses, stratified by prompt set; none where it "
              f"would rest on fewer than {metrics.MIN_DISTINCT_SAMPLES} responses. tau vs the chain: the "
              "average tau against the chain's at the same block. iteration / AR step: DFlash decode time per "
              "iteration over AR time per token, mean over the sets.", "", md, "", "![plot](plot.png)", "",
              "## The paper, and what others report", "",
              "The paper (arXiv 2602.06036) verifies chains only: it has no tree results for DFlash (its EAGLE-3 "
              "baseline uses trees of 16 and 60 nodes). Tree drafting on the DFlash drafter has been reported "
              "outside the paper; these are **not the paper's numbers** and are other pairs on GPUs:", ""]
    lines += [f"- [{e['what']}]({e['url']}): {e['reported']}" for e in EXTERNAL]
    lines += ["", "## What the data shows", ""]
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
    drafter = load_drafter(framework.checkpoint_dir(s.drafter, "drafter"), target, dtype=target.dtype)
    before = load_average()
    print(f"{NAME}: {len(cells(s))} cells + the AR baseline on {', '.join(s.datasets)}; results -> {out}",
          file=sys.stderr, flush=True)
    if preset == "smoke":
        print(SMOKE_NOTE, file=sys.stderr, flush=True)
    measured = evaluate(s, target, drafter)
    settings = json.loads(json.dumps(dataclasses.asdict(s), default=list))
    settings["target"] = framework.recorded_path(s.target, "target")
    settings["drafter"] = framework.recorded_path(s.drafter, "drafter")
    table = {"experiment": NAME, "preset": preset, "smoke": preset == "smoke", "settings": settings,
             "rows": summarize(s, measured), "responses": measured["sets"], "pad_to": measured["pad_to"],
             "external": EXTERNAL, "paper": [],
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
                   help="smoke: seconds of decoding, for tests; cpu: the committed run (default)")
    p.add_argument("--out", help=f"output directory (default: $DFLASH_JAX_HOME/results/ablations/{NAME}[-<preset>]; "
                                 f"the committed results only with an explicit --out results/ablations/{NAME})")
    p.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    helps = framework.field_help(Settings)
    for f in dataclasses.fields(Settings):
        shown = ", ".join(f"{k} {framework._show(v.get(f.name, f.default))}" for k, v in PRESETS.items())
        kw = dict(dest=f.name, default=None, help=f"{helps.get(f.name, '')} (defaults: {shown})")
        if f.name == "nodes":
            kw |= dict(nargs="+", type=node_budget)
        elif f.name in ("block_sizes",):
            kw |= dict(nargs="+", type=int)
        elif f.name == "datasets":
            kw |= dict(nargs="+", choices=list(DATASETS))
        elif f.name in ("tree_topk", "max_samples", "max_new_tokens", "seed"):
            kw |= dict(type=int)
        elif f.name == "dtype":
            kw |= dict(choices=["float32", "bfloat16"])
        elif f.name == "subset":
            kw |= dict(choices=list(SUBSETS))
        p.add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def main(argv: Sequence[str] | None = None) -> dict | None:
    """``python -m experiments.ablate_tree``: parses the options and runs the ablation."""
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
