"""What verifying a tree of N draft nodes costs against N chain rows, on this machine: the
target's verify pass alone, and the whole decode-loop iteration.

    python -m dflash_jax tree-verify-cost --out results/tree           # the embedded pair
    python -m dflash_jax tree-verify-cost --target DIR --drafter DIR --nodes 4 8 --calls 2 \\
        --repeats 3 --iterations 2 --out runs/tree_verify_cost          # smoke size

Verify (``docs/trees.md``): one jitted call of the target family's ``forward`` over a block of N
rows through a cache filled with ``--context`` prompt positions, the drafter's tap layers
collected as the engine's verify does. The chain is the causal block (rows at slots and
positions ``start + arange(N)``); the tree is the same N rows with
``tree=TreeAttention(start + depth, ancestor_mask)`` of a best-first tree
(``verification.tree.best_first_tree``, ``--tree-topk`` children per node at most, depth at most the
drafter's block size - 1) grown from random per-depth distributions: the cost of a dense pass
does not depend on which tree it is, and the tree's shape is recorded. Each is timed inside one
compiled program (``--calls`` calls in a ``lax.fori_loop``, the written cache carried as the
decode loop carries it; ``iteration_profile.loop_program``). After one compiling call each, the
``--repeats`` runs interleave chain and tree at every N (their order alternating), so a change
of the machine's load hits both; the report gives the medians, min..max, the ratio of the
medians tree / chain and the median of the per-run ratios.

Iteration (with a drafter; ``--iterations 0`` skips it): seconds per iteration of the real
decode loop (``engine.decode``: draft, verify, accept, compact / commit) for ``--iterations``
iterations after a fresh prefill: the chain at the drafter's block size against trees of each
N, runs interleaved the same way.

Recorded beside: the machine (CPU model, vector extensions; the load averages before and after,
with ``reporting.busy_warning``), versions, the command. Writes ``tree_verify_cost.json``,
``.md`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.hub import CHECKPOINT_HELP, EMBEDDED
from dflash_jax.progress import progress
from dflash_jax.reporting import (command_line, environment, machine_fields, machine_sentence,
                                  new_figure, publish_report, start_measurement)

NODES = (16, 32, 64)
"""The node budgets measured by default (the issue's)."""

ROOM = 8
"""Cache positions left free past the largest block (nothing is written there)."""


def _spread(xs) -> dict:
    xs = [float(x) for x in xs]
    return {"runs": xs, "median": float(np.median(xs)), "min": min(xs), "max": max(xs)}


def random_tree(vocab: int, depth: int, nodes: int, topk: int, anchor: int, seed: int = 0):
    """A best-first :class:`~dflash_jax.verification.tree.Tree` of ``nodes`` nodes (batch 1) over
    random per-depth distributions (logits normal(0, 3) over ``vocab`` at depths 1..``depth``)."""
    from dflash_jax.verification.tree import best_first_tree

    logits = 3.0 * jax.random.normal(jax.random.key(seed), (1, depth, vocab), jnp.float32)
    return best_first_tree(jnp.array([anchor], jnp.int32), jax.nn.log_softmax(logits, -1), nodes, topk)


def tree_shape(tree) -> dict:
    """What a tree looks like: its depth, how many nodes sit at each depth, its leaves."""
    depth = np.asarray(tree.depth[0])
    parents = np.asarray(tree.parents[0])
    valid = np.asarray(tree.valid[0])
    has_child = np.zeros(len(depth), bool)
    has_child[parents[1:][valid[1:]]] = True
    return {"max_depth": int(depth[valid].max()), "valid_nodes": int(valid.sum()),
            "nodes_per_depth": np.bincount(depth[valid]).tolist(), "leaves": int((valid & ~has_child).sum())}


def measure_verify(target, drafter, nodes, topk: int, context: int, calls: int, repeats: int,
                   seed: int = 0) -> list[dict]:
    """Per N in ``nodes``: ms per verify call of the chain block and of the tree, every run,
    medians and ratios (one entry per N)."""
    from dflash_jax.bench.iteration_profile import loop_program
    from dflash_jax.decoding.prepare import prepare_decode
    from dflash_jax.verification.tree import ancestor_mask
    from dflash_jax.nn.tree_attention import TreeAttention

    V = target.config.vocab_size
    depth = (drafter.config.block_size if drafter is not None else max(nodes)) - 1
    prompt = [(np.arange(context) * 7919 % V).tolist()]
    pre = prepare_decode(target, prompt, max(nodes) + ROOM, drafter=drafter)
    spec, cache = pre.spec, pre.state.tcache
    tp = spec.family.loop_params(target.params)
    start = cache.lengths  # [1]
    kwargs = dict(tap_layer_ids=spec.tap_layer_ids, attention_impl=spec.attention_impl, **spec.target_axes)

    def program(N, tree):
        slots = start[:, None] + jnp.arange(N, dtype=jnp.int32)
        if tree is None:
            block, extra = slots % V, {}
        else:
            block = tree.tokens
            extra = {"tree": TreeAttention(start[:, None] + tree.depth, ancestor_mask(tree, depth))}

        def verify(i, tp, cache):  # logits and taps consumed, the written cache carried
            logits, taps, cache = spec.family.forward(spec.target, tp, (block + i) % V, slots, cache,
                                                      **kwargs, **extra)
            return (logits, taps), cache

        compiled = loop_program(verify, calls, carried=1)

        def timed() -> float:  # seconds per call, one run of the loop
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(tp, cache))
            return (time.perf_counter() - t0) / calls

        return timed

    out, runs = [], {}
    for N in nodes:
        tree = random_tree(V, depth, N, topk, int(pre.state.bonus[0]), seed)
        runs[N] = {"chain": program(N, None), "tree": program(N, tree), "shape": tree_shape(tree)}
    times = {N: {"chain": [], "tree": []} for N in nodes}
    for r in progress(range(repeats + 1), desc="verify: chain and tree runs", unit="run"):
        for N in nodes:
            order = ("chain", "tree") if r % 2 == 0 else ("tree", "chain")
            for kind in order:
                t = runs[N][kind]()  # the first round compiles: dropped
                if r:
                    times[N][kind].append(1e3 * t)
    for N in nodes:
        c, t = times[N]["chain"], times[N]["tree"]
        out.append({"nodes": N, "chain_ms": _spread(c), "tree_ms": _spread(t),
                    "ratio": float(np.median(t) / np.median(c)),
                    "paired_ratio": _spread(np.array(t) / np.array(c)), "tree": runs[N]["shape"]})
    return out


def measure_iteration(target, drafter, nodes, topk: int, context: int, iterations: int,
                      repeats: int) -> dict:
    """ms per decode-loop iteration: the chain at the drafter's block size and trees of each N
    (runs interleaved; the first of each, compiling, dropped)."""
    from dflash_jax.decoding.costs import iteration_seconds

    bs = drafter.config.block_size
    V = target.config.vocab_size
    prompt = [(np.arange(context) * 7919 % V).tolist()]
    budget = iterations * bs + 1
    configs = {f"chain, block {bs}": {}} | {f"tree {N}": {"tree": N, "tree_topk": topk} for N in nodes}
    times = {k: [] for k in configs}
    for r in progress(range(repeats + 1), desc="decode loop: chain and trees", unit="run"):
        names = list(configs) if r % 2 == 0 else list(configs)[::-1]
        for k in names:
            t = iteration_seconds(target, drafter, prompt, budget, iterations, **configs[k])
            if r:
                times[k].append(1e3 * t)
    chain = np.median(times[f"chain, block {bs}"])
    return {k: _spread(v) | {"over_chain": float(np.median(v) / chain)} for k, v in times.items()}


def markdown(report: dict) -> str:
    s, r = report["settings"], report["results"]
    lines = [f"`{report['command']}`", "",
             f"Target {s['target']} ({s['dtype']}, {report['env']['device']}), {s['context']} cached "
             f"positions; trees best-first with at most {s['tree_topk']} children per node, depth at most "
             f"{s['max_depth']}. Verify: one call of the family's forward over N rows, {s['calls']} calls "
             f"per compiled loop, {s['repeats']} runs interleaving chain and tree after a compiling one "
             "(median, min..max).", "",
             machine_sentence(report), "",
             "| N | chain ms | spread | tree ms | spread | tree / chain (medians) | per-run ratio, median "
             "(min..max) | tree depth | nodes per depth |", "|---|---|---|---|---|---|---|---|---|"]
    for e in r["verify"]:
        c, t, p = e["chain_ms"], e["tree_ms"], e["paired_ratio"]
        lines.append(f"| {e['nodes']} | {c['median']:.3f} | {c['min']:.3f}..{c['max']:.3f} | {t['median']:.3f} | "
                     f"{t['min']:.3f}..{t['max']:.3f} | {e['ratio']:.3f} | {p['median']:.3f} "
                     f"({p['min']:.3f}..{p['max']:.3f}) | {e['tree']['max_depth']} | "
                     f"{', '.join(map(str, e['tree']['nodes_per_depth']))} |")
    if r.get("iteration"):
        lines += ["", f"Whole decode-loop iteration (draft + verify + accept + commit), {s['iterations']} "
                  f"iterations per run, {s['repeats']} interleaved runs after a compiling one:", "",
                  "| loop | ms per iteration | spread | over the chain |", "|---|---|---|---|"]
        for k, v in r["iteration"].items():
            lines.append(f"| {k} | {v['median']:.2f} | {v['min']:.2f}..{v['max']:.2f} | {v['over_chain']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    r = report["results"]
    it = r.get("iteration")
    fig, axes = new_figure(1, 3 if it else 2, figsize=(14 if it else 10, 4))
    N = [e["nodes"] for e in r["verify"]]
    ax = axes[0]
    for kind, color in (("chain", "C0"), ("tree", "C1")):
        ax.plot(N, [e[f"{kind}_ms"]["median"] for e in r["verify"]], "o-", color=color, label=kind)
        for n, e in zip(N, r["verify"]):
            ax.plot([n] * len(e[f"{kind}_ms"]["runs"]), e[f"{kind}_ms"]["runs"], ".", color=color, ms=3)
    ax.set(xlabel="rows verified (N)", ylabel="ms per verify call", title="verify: N chain rows vs N tree nodes")
    ax.set_xticks(N)
    ax.legend()
    ax = axes[1]
    ax.plot(N, [e["ratio"] for e in r["verify"]], "o-", color="C1", label="medians")
    for n, e in zip(N, r["verify"]):
        ax.plot([n] * len(e["paired_ratio"]["runs"]), e["paired_ratio"]["runs"], "k.", ms=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhspan(0.95, 1.05, color="0.9", zorder=0, label="within 5 %")
    ax.set(xlabel="rows verified (N)", ylabel="tree / chain", title="verify cost of the tree mask")
    ax.set_xticks(N)
    ax.legend()
    if it:
        ax = axes[2]
        names = list(it)
        ax.bar(range(len(names)), [it[k]["median"] for k in names], color=["C0"] + ["C1"] * (len(names) - 1))
        for i, k in enumerate(names):
            ax.plot([i] * len(it[k]["runs"]), it[k]["runs"], "k.", ms=3)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set(ylabel="ms per iteration", title="decode loop: whole iteration")
    m = report["machine"]
    fig.suptitle(f"{report['settings']['target']}, {report['env']['device']} "
                 f"({(m['cpu'] or {}).get('model') or '?'}), load {(m['load_average_before'] or [float('nan')])[0]:.1f}")
    return fig


def add_arguments(p) -> None:
    p.add_argument("--target", default=EMBEDDED, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--drafter", default=None, metavar="CHECKPOINT",
                   help="its DFlash drafter, named the same way (default: the embedded drafter with the "
                        "embedded target, else none: no iteration timing, tree depth N - 1)")
    p.add_argument("--nodes", type=int, nargs="+", default=list(NODES), help="tree node budgets N (root included)")
    p.add_argument("--tree-topk", type=int, default=4,
                   help="children per tree node at most, the drafter's K most likely tokens of the next position")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype of the target and drafter")
    p.add_argument("--context", type=int, default=192, help="cached positions S (prompt tokens) before the timed step")
    p.add_argument("--calls", type=int, default=20, help="calls per compiled timing loop")
    p.add_argument("--repeats", type=int, default=15, help="timed runs of each (interleaved), the median reported")
    p.add_argument("--iterations", type=int, default=24,
                   help="decode-loop iterations per timing of the whole iteration (0: skip it)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random distributions the tree is grown from")
    p.add_argument("--out", default="runs/tree_verify_cost", help="output directory")


def run(args) -> dict:
    for name in ("context", "calls", "repeats", "tree_topk"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.iterations < 0:
        raise ValueError(f"--iterations must be >= 0 (0: no iteration timing), got {args.iterations}")
    if any(n < 2 for n in args.nodes):
        raise ValueError(f"--nodes {args.nodes}: a tree needs at least 2 nodes (the root and one draft)")
    from dflash_jax.models.handles import load_drafter, load_target

    load_before, cpu, warning = start_measurement()
    dtype = jnp.dtype(args.dtype)
    target = load_target(args.target, dtype=dtype)
    drafter_name = args.drafter or (EMBEDDED if args.target == EMBEDDED else None)
    drafter = load_drafter(drafter_name, target, dtype=dtype) if drafter_name else None
    nodes = sorted(set(args.nodes))
    results = {"verify": measure_verify(target, drafter, nodes, args.tree_topk, args.context, args.calls,
                                        args.repeats, args.seed)}
    if drafter is not None and args.iterations:
        results["iteration"] = measure_iteration(target, drafter, nodes, args.tree_topk, args.context,
                                                 args.iterations, args.repeats)
    depth = (drafter.config.block_size if drafter is not None else max(nodes)) - 1
    report = {"benchmark": "tree_verify_cost", "command": command_line("dflash_jax", invocation(args)),
              "settings": {"target": args.target, "drafter": drafter_name, "nodes": nodes,
                           "tree_topk": args.tree_topk, "max_depth": depth, "dtype": args.dtype,
                           "context": args.context, "calls": args.calls, "repeats": args.repeats,
                           "iterations": args.iterations if "iteration" in results else 0, "seed": args.seed},
              "results": results, "machine": machine_fields(cpu, load_before, warning),
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, args.out, "tree_verify_cost", plot, markdown)


def main(argv=None) -> dict:
    return command_main("tree-verify-cost", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
