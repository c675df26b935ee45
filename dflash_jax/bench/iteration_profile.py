"""Where one speculative iteration's time goes, next to one autoregressive step, for a target +
drafter (default: the embedded pair, float32 on CPU), at a realistic context.

Each part is timed inside one compiled program (``n`` calls in a ``lax.fori_loop``, their
integer inputs shifted by the loop index so the compiler cannot hoist them out): what it costs
inside the on-device decode loop, without host dispatch. The parts:

  * the draft's parts, as the drafter's method times them (``DraftingMethod.profile_parts``;
    DFlash's: the context update, the drafter's layers over the block, the LM head and argmax,
    ``methods/dflash/profile.py``);
  * verify L: the target over the first L block rows (its LM head included) for L = 1 (the
    AR step's target pass), 4, 8 and the block size;
  * accept + commit;
  * the whole iteration and the whole AR step, from the real decode loop (``engine.decode``
    with a fixed number of iterations).

With ``--<method>-drafter NAME`` (one option per drafting method that names drafters for
comparison: ``DraftingMethod.names_help``) it also profiles each method's runs
(``DraftingMethod.profile_settings``: DFlash's chain and tree of 16 against that method's
chain and trees). Per run: the draft (the proposer's ``propose`` / ``propose_tree``) and the
verify (the target over the block or the tree) of one iteration, each jitted alone at the
context (:func:`step_ms`: the median of ``--repeats`` runs, host dispatch included), and the
whole iteration from the decode loop.

    python -m dflash_jax iteration-profile --out results/iteration_profile
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.bench.env import time_fn
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.reporting import command_line, cpu_model, environment, load_average, new_figure, write_report
from dflash_jax.decoding.costs import iteration_seconds
from dflash_jax.decoding import engine
from dflash_jax import methods
from dflash_jax.verification import acceptance, policy, tree as trees
from dflash_jax.verification.adaptive import Adaptive
from dflash_jax.decoding import tree_args
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.hub import CHECKPOINT_HELP, EMBEDDED
from dflash_jax.methods.base import DraftingMethod
from dflash_jax.models.handles import load_drafter, load_target
from dflash_jax.files import write_text
from dflash_jax.progress import progress

LENGTHS = (1, 4, 8, 16)


def in_loop(fn, args, n: int, repeats: int, carried: int | None = None) -> float:
    """Median seconds per call of ``fn(i, *args)`` run ``n`` times in one ``fori_loop``
    (``i`` the traced loop index). Every element of every output feeds a running sum, so the
    compiler can drop none of the work (summing only one element let it drop, e.g., the rows
    and the cache writes that element does not depend on). With ``carried`` (an index into
    ``args``), ``fn`` returns ``(outputs, new_value)`` and ``new_value`` is that argument of the
    next call, as the decode loop carries its caches (their in-place updates are then timed as
    they run there)."""
    return time_fn(loop_program(fn, n, carried), *args, repeats=repeats) / n


def loop_program(fn, n: int, carried: int | None = None):
    """The jitted program :func:`in_loop` times: ``program(*args)`` runs ``fn(i, *args)``
    ``n`` times in one ``fori_loop`` (same ``carried``), every output element summed into the
    float32 it returns. Kept compiled by the caller that times it itself."""

    def consume(acc, out):
        return acc + sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(out))

    def program(*args):
        if carried is None:
            return jax.lax.fori_loop(0, n, lambda i, acc: consume(acc, fn(i, *args)), jnp.float32(0))

        def body(i, c):
            acc, value = c
            out, value = fn(i, *args[:carried], value, *args[carried + 1:])
            return consume(acc, out), value

        return jax.lax.fori_loop(0, n, body, (jnp.float32(0), args[carried]))[0]

    return jax.jit(program)


def loop_time(target, drafter, prompt, iterations: int, repeats: int, **options) -> float:
    """Seconds per iteration of the real decode loop (``iterations`` iterations, no stop): the
    median of ``repeats`` runs after a compiling one."""
    bs = 1 if drafter is None else (options.get("block_size") if isinstance(options.get("block_size"), int)
                                    else methods.method_of(drafter).default_block_size(drafter))
    budget = iterations * bs + 1
    times = [iteration_seconds(target, drafter, prompt, budget, iterations, **options)
             for _ in range(repeats + 1)]
    return float(np.median(times[1:]))


def measure(target, drafter, context: int, n: int, repeats: int, iterations: int) -> dict:
    """The parts of one iteration of ``drafter``'s method and the decode loop's iteration and
    AR step, in milliseconds, at a ``context``-token prompt (module docstring)."""
    method = methods.method_of(drafter)
    V, bs = target.config.vocab_size, method.default_block_size(drafter)
    prompt = [(np.arange(context) * 7919 % V).tolist()]
    pre = prepare_decode(target, prompt, 64, drafter=drafter)
    # the target's weights in the layout the decode loop uses (split per layer on CPU)
    spec, tp, state = pre.spec, pre.spec.family.loop_params(target.params), pre.state
    start = state.tcache.lengths
    positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
    block = jnp.broadcast_to(state.bonus[:, None], (1, bs))  # the verify's cost does not depend on the tokens
    shift = lambda i, toks: (toks + i) % V
    parts = dict(method.profile_parts(target, drafter, pre, tp, n, repeats, in_loop))
    lengths = [L for L in LENGTHS if L < bs] + [bs]
    for L in lengths:
        def verify(i, tp, cache, L=L):  # logits and taps consumed, the written cache carried
            logits, taps, cache = policy.verify(spec, tp, shift(i, block[:, :L]), positions[:, :L], cache)
            return (logits, taps), cache

        parts[f"verify {L}"] = in_loop(verify, (tp, state.tcache), n, repeats, carried=1)
    draft = block[:, 1:]
    logits = policy.verify(spec, tp, block, positions, state.tcache)[0]

    def accept_commit(i, logits, tcache):
        d = shift(i, draft)
        accepted, bonus = acceptance.accept(spec.acceptance, spec.sampling, d, None, logits, jax.random.key(0))
        tcache = policy.rollback(accepted, tcache, state.done, state.tcache.lengths)
        return engine.commit(spec, state, d, accepted, bonus, tcache, pre.max_new, pre.stop_ids).out

    parts["accept + commit"] = in_loop(accept_commit, (logits, state.tcache), n, repeats)
    loops = {"AR step": loop_time(target, None, prompt, iterations, repeats)}
    name = f"{method.label} iteration"
    loops[f"{name}, block {bs}"] = loop_time(target, drafter, prompt, iterations, repeats)
    for L in lengths[1:-1]:
        loops[f"{name}, verify {L}"] = loop_time(target, drafter, prompt, iterations, repeats,
                                                  verify=Adaptive(lengths=(L,), cost_table={L: 1.0}))
    ms = lambda d: {k: 1e3 * v for k, v in d.items()}
    parts, loops = ms(parts), ms(loops)
    summed = sum(v for k, v in parts.items() if k.startswith("draft")) + parts[f"verify {bs}"] \
        + parts["accept + commit"]
    ratio = loops[f"{name}, block {bs}"] / loops["AR step"]
    return {"context": context, "block_size": bs, "method": method.name, "parts_ms": parts, "loops_ms": loops,
            "sum_of_parts_ms": summed, "iteration_over_ar_step": ratio,
            "verify_block_over_verify1": parts[f"verify {bs}"] / parts["verify 1"]}


def method_runs(names) -> list[tuple[str, str, dict]]:
    """(label, method name, settings) of the per-method profile for the drafting methods named
    in ``names``, in registry order: each method's ``profile_settings``."""
    return [(f"{m.label} {suffix}", m.name, settings) for m in methods.registered() if m.name in names
            for suffix, settings in m.profile_settings]


def step_ms(target, drafter, prompt, repeats: int, block_size: int | None = None, tree: int | None = None,
            tree_topk: int = 4, verify: bool = True) -> dict:
    """Milliseconds of one draft and (``verify``) one verify of an iteration at the context of
    ``prompt`` ([[token ids]]): the proposer's ``propose`` (``propose_tree`` with ``tree`` nodes),
    and the target over the block (under the ancestor mask for a tree), each jitted alone, the
    median of ``repeats`` runs after a compiling one (host dispatch included: one call each)."""
    pre = prepare_decode(target, prompt, 8, drafter=drafter, block_size=block_size,
                         verify=tree_args.tree_policy(tree, tree_topk))
    spec, dp, state, key = pre.spec, pre.drafter_params, pre.state, jax.random.key(0)
    tp = target.params
    if tree:
        draft = jax.jit(lambda tp, dp, st, k: spec.proposer.propose_tree(
            spec, tp, dp, st.proposer, engine.committed(st), k, spec.verify))
    else:
        draft = jax.jit(lambda tp, dp, st, k: spec.proposer.propose(
            spec, tp, dp, st.proposer, engine.committed(st), k))
    out = {"draft_ms": 1e3 * time_fn(draft, tp, dp, state, key, repeats=repeats)}
    if not verify:
        return out
    proposed = draft(tp, dp, state, key)[0]
    if tree:
        mask = trees.ancestor_mask(proposed, spec.block_size - 1)
        run = jax.jit(functools.partial(trees.verify_tree, spec))
        out["verify_ms"] = 1e3 * time_fn(run, tp, proposed, mask, state.tcache, repeats=repeats)
    else:
        block = jnp.concatenate([state.bonus[:, None], proposed.tokens], axis=1)
        positions = state.tcache.lengths[:, None] + jnp.arange(block.shape[1], dtype=jnp.int32)
        run = jax.jit(functools.partial(policy.verify, spec))
        out["verify_ms"] = 1e3 * time_fn(run, tp, block, positions, state.tcache, repeats=repeats)
    return out


def method_profile(target, drafters: dict, context: int, repeats: int, iterations: int,
                   runs=None) -> dict:
    """Per run of ``runs`` ((label, method name, settings); default :func:`method_runs`) whose
    method is in ``drafters`` ({method name: its drafter}): :func:`step_ms`'s draft and verify,
    the decode loop's whole iteration, and the AR step, in milliseconds, at a
    ``context``-token prompt."""
    V = target.config.vocab_size
    prompt = [(np.arange(context) * 7919 % V).tolist()]
    rows = []
    chosen = [r for r in (method_runs(drafters) if runs is None else runs) if r[1] in drafters]
    with progress(total=len(chosen), desc="profiling the methods", unit="method") as bar:
        for label, kind, options in chosen:
            d = drafters[kind]
            bs = options.get("block_size") or methods.method_of(d).default_block_size(d)
            steps = step_ms(target, d, prompt, repeats, bs, options.get("tree"), options.get("tree_topk", 4))
            it = 1e3 * loop_time(target, d, prompt, iterations, repeats, block_size=bs,
                                 verify=tree_args.tree_policy(options.get("tree"), options.get("tree_topk", 4)))
            rows.append({"method": label, "kind": kind, "block_size": bs, "tree": options.get("tree"),
                         "tree_topk": options.get("tree_topk"), "verify_rows": options.get("tree") or bs,
                         **steps, "iteration_ms": it})
            bar.update(1)
    ar = 1e3 * loop_time(target, None, prompt, iterations, repeats)
    for r in rows:
        r["iteration_over_ar_step"] = r["iteration_ms"] / ar
        r["draft_share"] = r["draft_ms"] / (r["draft_ms"] + r["verify_ms"])
    return {"context": context, "ar_step_ms": ar, "rows": rows}


def methods_markdown(m: dict) -> str:
    """The per-method table."""
    lines = ["| method | block | verify rows | draft ms | verify ms | draft share | iteration ms (decode loop) | "
             "iteration / AR step |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['block_size']} | {r['verify_rows']} | {r['draft_ms']:.2f} | {r['verify_ms']:.2f} | "
              f"{100 * r['draft_share']:.0f} % | {r['iteration_ms']:.2f} | {r['iteration_over_ar_step']:.2f} |"
              for r in m["rows"]]
    return "\n".join(lines + ["", f"AR step {m['ar_step_ms']:.2f} ms (decode loop), context {m['context']}; draft "
                               "and verify each jitted alone (one call, host dispatch included)."])


def plot(report: dict):
    methods = report.get("methods")
    if report["result"] is None:  # --methods-only
        fig, c = new_figure(1, 1, figsize=(8, 4))
        _plot_methods(c, methods)
        return fig
    depths = report.get("depths")
    panels = 2 + bool(methods) + bool(depths)
    fig, axes = new_figure(1, panels, figsize=(6 * panels, 4))
    a, b = axes[0], axes[1]
    parts = report["result"]["parts_ms"]
    a.barh(list(parts)[::-1], list(parts.values())[::-1])
    a.set(xlabel="ms per call (in one compiled loop)", title="parts of an iteration")
    loops = report["result"]["loops_ms"]
    b.bar(range(len(loops)), list(loops.values()))
    b.set_xticks(range(len(loops)), [k.replace(" iteration, ", "\n") for k in loops], fontsize=8)
    b.set(ylabel="ms per iteration (decode loop)",
          title=f"{report['environment']['device']} ({report['cpu'] or '?'}), load {report['load_average'][0]:.1f}")
    if methods:
        _plot_methods(axes[2], methods)
    if depths:
        _plot_depths(axes[-1], depths)
    return fig


def _plot_depths(c, depths: dict) -> None:
    """Draft (all three parts), verify of the block and the decode loop's iteration against depth."""
    layers = [int(k) for k in depths]
    rows = list(depths.values())
    bs = rows[0]["block_size"]
    draft = [sum(r["parts_ms"][k] for k in ("draft, context", "draft, layers", "draft, LM head + argmax")) for r in rows]
    c.plot(layers, draft, "o-", label="draft (context + layers + LM head)")
    c.plot(layers, [r["parts_ms"][f"verify {bs}"] for r in rows], "s-", label=f"verify {bs}")
    c.plot(layers, [r["loops_ms"][f"DFlash iteration, block {bs}"] for r in rows], "^-", label="iteration (decode loop)")
    c.plot(layers, [r["loops_ms"]["AR step"] for r in rows], "--", color="0.4", label="AR step")
    c.set(xlabel="drafter layers", ylabel="ms", xticks=layers, title="draft grows with depth, verify does not")
    c.legend(fontsize=7)


def _plot_methods(c, methods: dict) -> None:
    """Draft and verify per method, stacked, the decode loop's iteration and the AR step."""
    rows = methods["rows"]
    names = [r["method"].replace(", ", "\n") for r in rows]
    c.bar(names, [r["draft_ms"] for r in rows], label="draft (jitted alone)")
    c.bar(names, [r["verify_ms"] for r in rows], bottom=[r["draft_ms"] for r in rows], label="verify (jitted alone)")
    c.plot(names, [r["iteration_ms"] for r in rows], "k_", ms=20, mew=2, label="iteration (decode loop)")
    c.axhline(methods["ar_step_ms"], color="0.4", ls="--", lw=0.8, label="AR step")
    c.tick_params(axis="x", labelsize=7)
    c.set(ylabel="ms per iteration", title="per method: draft and verify of one iteration")
    c.legend(fontsize=7)


def markdown(report: dict) -> str:
    if report["result"] is None:
        return methods_markdown(report["methods"])
    r = report["result"]
    lines = ["| part | ms |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in r["parts_ms"].items()]
    lines += [f"| sum of the parts of a block-{r['block_size']} iteration | {r['sum_of_parts_ms']:.2f} |", "",
              "| decode loop | ms per iteration |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in r["loops_ms"].items()]
    lines += ["", f"iteration / AR step: {r['iteration_over_ar_step']:.2f} (the tau at which the drafter "
              f"breaks even); verify {r['block_size']} / verify 1: {r['verify_block_over_verify1']:.2f}"]
    if report.get("methods"):
        lines += ["", methods_markdown(report["methods"])]
    if report.get("depths"):
        lines += ["", depths_markdown(report["depths"])]
    return "\n".join(lines)


def depth_profile(target, drafter, depths, context: int, n: int, repeats: int, iterations: int) -> dict:
    """The parts of one iteration for drafters of each depth in ``depths``: ``drafter``'s
    method's drafter like it (block size, taps, ...) with that many layers and random weights
    (``DraftingMethod.with_depth``; a part's time does not depend on the weights). The draft's
    layer part grows with depth; the verify parts are the target's alone and should not."""
    method = methods.method_of(drafter)
    out = {}
    for layers in progress(list(depths), desc="depths", unit="depth"):
        d = method.with_depth(drafter, layers, target)
        params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(d.params))
        out[str(layers)] = measure(target, d, context, n, repeats, iterations) | {"drafter_params": params}
    return out


def check_depths(drafter, depths) -> None:
    """Refuses ``--depths`` below one layer, or that the drafter's method cannot vary, before
    anything is measured."""
    if min(depths) < 1:
        raise ValueError(f"--depths must be >= 1 layer each, got {depths}")
    method = methods.method_of(drafter)
    if type(method).with_depth is DraftingMethod.with_depth:
        raise ValueError(f"--depths varies the drafter's layers: {method.label} drafters have no "
                         f"depth to vary here (drop --depths)")


def depths_markdown(depths: dict) -> str:
    """One row per drafter depth: the draft parts, the full-block verify, the iteration and its
    ratio to an AR step."""
    first = next(iter(depths.values()))
    bs = first["block_size"]
    lines = [f"| drafter layers | parameters | draft, context ms | draft, layers ms | draft, LM head ms | verify {bs} ms | "
             f"DFlash iteration ms | AR step ms | iteration / AR step |", "|---|---|---|---|---|---|---|---|---|"]
    for layers, r in depths.items():
        p, lo = r["parts_ms"], r["loops_ms"]
        lines.append(f"| {layers} | {r['drafter_params'] / 1e6:.2f}M | {p['draft, context']:.2f} | {p['draft, layers']:.2f} | "
                     f"{p['draft, LM head + argmax']:.2f} | {p[f'verify {bs}']:.2f} | "
                     f"{lo[f'DFlash iteration, block {bs}']:.2f} | {lo['AR step']:.2f} | "
                     f"{r['iteration_over_ar_step']:.2f} |")
    return "\n".join(lines)


def add_arguments(p) -> None:

    p.add_argument("--target", default=EMBEDDED, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--drafter", default=EMBEDDED, metavar="CHECKPOINT",
                   help="its drafter (of any drafting method), named the same way")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype of the target and drafter")
    p.add_argument("--context", type=int, default=192,
                   help="cached positions S (prompt tokens) before the timed step")
    p.add_argument("--calls", type=int, default=20, help="calls per compiled timing loop")
    p.add_argument("--iterations", type=int, default=24, help="decode-loop iterations per timing")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each part, the median reported")
    for m in compared_methods():
        p.add_argument(f"--{m.name}-drafter", metavar="NAME",
                       help=f"also profile each drafting method's runs against a {m.label} drafter: {m.names_help}")
    p.add_argument("--methods-only", action="store_true",
                   help="with a --<method>-drafter option: the per-method profile only (not the parts of an "
                        "iteration)")
    p.add_argument("--depths", type=int, nargs="+", metavar="N",
                   help="also profile random drafters of these depths (the drafter's block size and taps, N "
                        "layers each): draft time against depth, verify time beside it")
    p.add_argument("--out", default="runs/iteration_profile", help="output directory")


def compared_methods() -> list:
    """The drafting methods whose drafters the per-method profile takes by name
    (``DraftingMethod.names_help``), each with its ``--<name>-drafter`` option."""
    return [m for m in methods.registered() if m.names_help]


def run(args) -> dict:
    compared = {m: getattr(args, f"{m.name}_drafter") for m in compared_methods()
                if getattr(args, f"{m.name}_drafter", None)}
    if args.methods_only and not compared:
        options = " or ".join(f"--{m.name}-drafter NAME" for m in compared_methods())
        raise ValueError(f"--methods-only goes with {options} (the per-method profile)")
    dtype = jnp.dtype(args.dtype)
    target = load_target(args.target, dtype=dtype)
    drafter = load_drafter(args.drafter, target, dtype=dtype)
    if args.depths:
        check_depths(drafter, args.depths)
    load = load_average()
    result = None if args.methods_only else measure(target, drafter, args.context, args.calls, args.repeats,
                                                    args.iterations)
    per_method = None
    if compared:
        drafters = {methods.method_of(drafter).name: drafter} | {
            m.name: m.by_name(name, target, dtype=dtype) for m, name in compared.items()}
        per_method = method_profile(target, drafters, args.context, args.repeats, args.iterations) | {
            m.name: name for m, name in compared.items()}
    depths = None
    if args.depths:
        depths = depth_profile(target, drafter, args.depths, args.context, args.calls, args.repeats,
                               args.iterations)
    report = {"benchmark": "iteration_profile", "command": command_line("dflash_jax", invocation(args)),
              "dtype": args.dtype, "environment": environment(), "cpu": cpu_model(),
              "load_average": load, "load_average_after": load_average(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "result": result, "methods": per_method,
              "depths": depths}
    table = markdown(report)
    print(table)
    stem = write_report(report, args.out, f"iteration_profile_{report['environment']['platform']}_{args.dtype}", plot)
    write_text(stem + ".md", f"`{report['command']}` on {report['environment']['device']} ({report['cpu']}, "
               f"{report['environment']['cpu_count']} cores, load average {report['load_average'][0]:.1f}), "
               f"jax {report['environment']['jax']}, {args.dtype}, context {args.context}\n\n{table}\n")
    return report


def main(argv=None) -> dict:
    return command_main("iteration-profile", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
