"""The issue's tree measurement: ``bench`` for the chain and for trees of N nodes on the same
prompts, repeated, in one process, with one summary.

    python -m dflash_jax tree-bench --out results/tree/bench       # chain (block 16) + trees 16 32 64, 3 runs
    python -m dflash_jax tree-bench --nodes 8 --runs 1 --max-samples 1 --max-new-tokens 8 \\
        --datasets gsm8k --out runs/tree_bench                     # smoke size

Every run benches every configuration once (``bench_harness.main``: AR vs DFlash, tau per
response then averaged, decode-only speedup; the chain first, then the trees in the order
given, so a change of the machine's load during a run hits all of them), writing
``run<r>/<config>/bench.{json,md,png}``. One process: each program is compiled once, in the
first run's warm-ups. Then ``tree_bench.json`` / ``.md`` / ``.png``: per configuration the
average tau (identical over runs at temperature 0, checked), the decode speedup (median and
min..max over the runs), tau pooled, the iteration cost in AR steps and whether every DFlash
output equalled AR; and ``tau_curve.json``, the measured tau of the chain and of each tree in
the form ``roofline --tree --tau-curve`` reads.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from dflash_jax.bench.prompt_sets import DATASETS
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.files import write_json
from dflash_jax.reporting import (command_line, environment, machine_fields, machine_sentence,
                                  new_figure, publish_report, start_measurement)

NODES = (16, 32, 64)


def configs(nodes, topk: int | None) -> dict[str, list[str]]:
    """name -> the extra ``bench`` options of each configuration (the chain first)."""
    extra = [] if topk is None else ["--tree-topk", str(topk)]
    return {"chain": []} | {f"tree{n}": ["--tree", str(n), *extra] for n in nodes}


def summarize(runs: list[dict], block_size: int) -> dict:
    """One configuration's summary over its bench reports (one per run)."""
    av = [r["average"] for r in runs]
    taus = [a["tau"] for a in av]
    speed = [a["speedup"] for a in av]
    same = all(d["same_output"] == d["turns"] for r in runs for d in r["datasets"].values())
    return {"tau": float(np.median(taus)), "tau_runs": taus, "tau_ci": av[0]["tau_ci"],
            "tau_pooled": av[0]["tau_pooled"], "speedup": float(np.median(speed)), "speedup_runs": speed,
            "speedup_min": min(speed), "speedup_max": max(speed),
            "iteration_cost_ar_steps": float(np.median([a["iteration_cost_ar_steps"] for a in av])),
            "per_set_tau": {n: d["tau"] for n, d in runs[0]["datasets"].items()},
            "responses": sum(d["turns"] for d in runs[0]["datasets"].values()),
            "same_output_as_ar": same, "block_size": block_size,
            "load_average_before": [r.get("load_average_before") for r in runs]}


def markdown(report: dict) -> str:
    s, res = report["settings"], report["results"]
    lines = [f"`{report['command']}`", "",
             f"Embedded pair unless named (target {s['target'] or 'embedded'}), T = 0, prompt sets "
             f"{', '.join(s['datasets'])}, {s['max_samples']} prompts per set (mt-bench: 2 turns each), "
             f"at most {s['max_new_tokens']} new tokens; trees best-first with at most "
             f"{s['tree_topk'] or 4} children per node; {s['runs']} runs, each benching every "
             "configuration once (AR and DFlash on every prompt).", "",
             machine_sentence(report), "",
             "| configuration | rows verified | tau (mean of per-response) [95% CI] | tau pooled | decode speedup, "
             "median (min..max over runs) | iteration, AR steps | DFlash == AR |", "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        rows = r["block_size"] if name == "chain" else int(name.removeprefix("tree"))
        ci = r["tau_ci"]
        ci = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and all(np.isfinite(ci)) else ""
        label = f"chain, block {r['block_size']}" if name == "chain" else f"tree {rows}"
        lines.append(f"| {label} | {rows} | {r['tau']:.2f}{ci} | {r['tau_pooled']:.2f} | {r['speedup']:.2f}x "
                     f"({r['speedup_min']:.2f}..{r['speedup_max']:.2f}) | {r['iteration_cost_ar_steps']:.2f} | "
                     f"{'all' if r['same_output_as_ar'] else 'NOT all'} |")
    sets = list(next(iter(res.values()))["per_set_tau"])
    lines += ["", "tau per prompt set:", "", "| configuration | " + " | ".join(sets) + " |",
              "|---|" + "---|" * len(sets)]
    for name, r in res.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['per_set_tau'][n]:.2f}" for n in sets) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    res = report["results"]
    fig, (a, b) = new_figure(1, 2, figsize=(11, 4))
    trees = [(int(k.removeprefix("tree")), v) for k, v in res.items() if k != "chain"]
    chain = res["chain"]
    for ax, key, runs, label in ((a, "tau", "tau_runs", "tau (mean acceptance length)"),
                                 (b, "speedup", "speedup_runs", "decode speedup over AR (x)")):
        n = [t[0] for t in trees]
        ax.plot(n, [t[1][key] for t in trees], "o-", color="C1", label="tree (median over runs)")
        for x, t in trees:
            ax.plot([x] * len(t[runs]), t[runs], "k.", ms=3)
        ax.axhline(chain[key], color="C0", ls="--", label=f"chain, block {chain['block_size']}")
        ax.plot([chain["block_size"]] * len(chain[runs]), chain[runs], "s", color="C0", ms=4)
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set(xlabel="tree nodes N (rows verified per iteration)", ylabel=label)
        ax.legend(fontsize=8)
    b.axhline(1.0, color="k", lw=0.6)
    m = report["machine"]
    fig.suptitle(f"trees vs chain, T = 0, {report['env']['device']} ({(m['cpu'] or {}).get('model') or '?'}), "
                 f"load {(m['load_average_before'] or [float('nan')])[0]:.1f}")
    return fig


def add_arguments(p) -> None:
    p.add_argument("--target", default=None, metavar="CHECKPOINT",
                   help="the target (default: the embedded one), as bench takes it")
    p.add_argument("--drafter", default=None, metavar="CHECKPOINT",
                   help="the DFlash drafter, as bench takes it (default: the embedded drafter)")
    p.add_argument("--nodes", type=int, nargs="+", default=list(NODES), help="tree node budgets N (root included)")
    p.add_argument("--tree-topk", type=int, default=None,
                   help="children per tree node at most, the drafter's K most likely tokens of the next "
                        "position (default: bench's, 4)")
    p.add_argument("--runs", type=int, default=3, help="runs of every configuration (speedup: median, min..max)")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS, help="prompt sets")
    p.add_argument("--max-samples", type=int, default=2, help="prompts per set (bench's --subset random)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="tokens generated per prompt at most (fewer at a stop token)")
    p.add_argument("--out", default="runs/tree_bench", help="output directory")


def run(args) -> dict:
    from dflash_jax.bench import harness

    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    if any(n < 2 for n in args.nodes):
        raise ValueError(f"--nodes {args.nodes}: a tree needs at least 2 nodes (the root and one draft)")
    load_before, cpu, warning = start_measurement()
    common = ["--no-adaptive", "--datasets", *args.datasets, "--max-samples", str(args.max_samples),
              "--max-new-tokens", str(args.max_new_tokens)]
    common += ["--target", args.target] if args.target else []
    common += ["--drafter", args.drafter] if args.drafter else []
    cfgs = configs(args.nodes, args.tree_topk)
    reports = {k: [] for k in cfgs}
    t0 = time.perf_counter()
    for r in range(args.runs):
        for name, extra in cfgs.items():
            print(f"run {r + 1}/{args.runs}: {name}", file=sys.stderr, flush=True)
            reports[name].append(harness.main([*common, *extra, "--out", os.path.join(args.out, f"run{r + 1}", name)]))
    bs = reports["chain"][0]["settings"]["block_size"]
    results = {k: summarize(v, bs) for k, v in reports.items()}
    for k, v in results.items():
        if len(set(np.round(v["tau_runs"], 9))) > 1:
            print(f"warning: {k}: tau differs between runs {v['tau_runs']} (at T = 0 it should not)", file=sys.stderr)
    report = {"benchmark": "tree_bench", "command": command_line("dflash_jax", invocation(args)),
              "settings": {"target": args.target, "drafter": args.drafter, "nodes": args.nodes,
                           "tree_topk": args.tree_topk, "runs": args.runs, "datasets": args.datasets,
                           "max_samples": args.max_samples, "max_new_tokens": args.max_new_tokens},
              "results": results, "wall_time_s": time.perf_counter() - t0,
              "machine": machine_fields(cpu, load_before, warning), "env": environment(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(os.path.join(args.out, "tau_curve.json"), {
        "chain": results["chain"]["tau"], "block_size": bs,
        "trees": {str(n): results[f"tree{n}"]["tau"] for n in args.nodes},
        "source": f"{report['command']} ({report['time']}): tau, mean of per-response, over the prompt sets"})
    return publish_report(report, args.out, "tree_bench", plot, markdown)


def main(argv=None) -> dict:
    return command_main("tree-bench", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
