"""Throughput against interactivity: batched decoding measured the way serving engines report
it. For each batch size, AR and DFlash (fixed block, the adaptive verify length chosen per
batch, and chosen per row) decode the same prompts with the same token budget per row, and the
run records:

Decode phase only: a row's tokens are the ones the decode loop makes, all but its first (the
prefill makes the first), over the loop's time.

* aggregate output tokens/s: every row's decode tokens over the decode time of the batch;
* per-user tokens/s: a row's decode tokens over the time until it had its budget (mean, p10, p90 over
  rows). A row's finish time is its iteration count times the batch's mean iteration time: one
  compiled loop runs the whole batch, so per-iteration times are not observable one by one;
* tau per row (mean, p10, p90);
* the share of verified rows that were wasted: block rows past a row's acceptance, rows past
  its budget in its last iteration, and every row of a row that has finished while others run
  (a static batch keeps decoding it: its budget is spent, the batch's stragglers set the time);
* the padding of the ragged batch: the share of the prompt matrix that is padding.

Stop tokens are ignored (every row decodes exactly ``--max-new-tokens``), so the batch is
static and no row leaves early; no queue refills finished rows.

From the curves (aggregate tokens/s against per-user tokens/s, one point per batch size), the
speedup at a fixed interactivity is read off: at a per-user speed, the ratio of the
interpolated aggregate throughputs (linear between the measured points; none outside a
method's measured range).

    python -m dflash_jax throughput --batch-sizes 1 2 4 8 16 32 --out runs/throughput
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np

from dflash_jax.bench.prompt_sets import DATASETS, load_prompt_set
from dflash_jax.verification.adaptive import Adaptive, per_row_lengths
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.progress import Bar, progress
from dflash_jax.reporting import (command_line, environment, machine_fields, machine_sentence, new_figure,
                                  publish_report, start_measurement)

AR, DFLASH, ADAPTIVE_METHOD, PER_ROW = "ar", "dflash", "adaptive", "adaptive_rows"
METHODS = (AR, DFLASH, ADAPTIVE_METHOD, PER_ROW)
LABELS = {AR: "AR", DFLASH: "DFlash, fixed block", ADAPTIVE_METHOD: "DFlash, adaptive block (batch-wide)",
          PER_ROW: "DFlash, adaptive per row"}
OPTIONS = {AR: {}, DFLASH: {}, ADAPTIVE_METHOD: {"verify": Adaptive()}, PER_ROW: {"verify": Adaptive(per_row=True)}}
"""The ``generate`` options of each method (besides the drafter)."""
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32)


# ---------------------------------------------------------------------------- prompts
def pooled_prompts(target, datasets: Sequence[str], n: int, seed: int = 0, data_dir: str | None = None
                   ) -> list[tuple[str, list[int]]]:
    """``n`` prompts taken in turn from ``datasets`` (the first user turn of each sample, in
    the target's chat template): [(set, token ids)]. A batch of B uses the first B, so every
    batch size and method sees the same prompts."""
    from dflash_jax.prompts import encode_prompt

    per_set = -(-n // len(datasets))
    sets = {d: load_prompt_set(d, data_dir, per_set, seed) for d in datasets}
    pool = []
    for i in range(per_set):
        for d in datasets:
            if i < len(sets[d]):
                pool.append((d, encode_prompt(sets[d][i].turns[0], target.tokenizer)))
    if len(pool) < n:
        raise ValueError(f"the prompt sets {', '.join(datasets)} hold {len(pool)} prompts; a batch of {n} "
                         "needs as many: give more sets or a smaller --batch-sizes")
    return pool[:n]


# ---------------------------------------------------------------------------- one batch
def wasted_rows(acceptance_lengths: Sequence[Sequence[int]], verify_lengths: Sequence[Sequence[int]],
                max_new: int, idle_length: int | None = None) -> dict:
    """Verified rows of one batch run and how many were wasted.

    ``acceptance_lengths``: per row, the tokens each of its iterations emitted (accepted drafts
    + the bonus); ``verify_lengths``: per row, the block rows verified in each of its iterations.
    A row that finished early is still verified while the others run (a static batch): at the
    batch's length of that iteration (the longest-running row's record), or at ``idle_length``
    when lengths are chosen per row (finished rows are verified at the short length unless every
    row verifies long: a lower bound). A row's useful rows are the tokens it kept: at most its
    ``max_new`` budget less the first token, which the prefill made; every other verified row
    is waste: past its acceptance, past its budget, or after it finished."""
    longest = max(verify_lengths, key=len)
    idle = lambda n: int(np.sum(longest[n:])) if idle_length is None else idle_length * (len(longest) - n)
    verified = sum(int(np.sum(v)) + idle(len(v)) for v in verify_lengths)
    useful = sum(min(int(np.sum(a)), max_new - 1) for a in acceptance_lengths)
    return {"verified": verified, "useful": useful, "wasted_share": 1.0 - useful / verified if verified else 0.0}


def padding_share(prompt_lengths: Sequence[int]) -> float:
    """The share of the [B, longest prompt] prompt matrix that is padding."""
    return 1.0 - float(np.sum(prompt_lengths)) / (len(prompt_lengths) * max(prompt_lengths))


def batch_record(method: str, batch: int, results: Sequence, max_new: int, idle_length: int | None = None) -> dict:
    """The measurement of one (method, batch size) from its timed runs (``GenerateResult``s of
    the same prompts): speeds from each run and from their mean decode time, per-row tau and
    per-user speed, the wasted verify rows (``idle_length``: :func:`wasted_rows`) and the
    padding."""
    last = results[-1]
    times = [r.decode_time_s for r in results]
    decode_s = float(np.mean(times))
    iters = np.array([len(a) for a in last.acceptance_lengths], float)
    per_iter = decode_s / last.num_steps
    per_user = (max_new - 1) / (iters * per_iter)
    tau = np.array([float(np.mean(a)) for a in last.acceptance_lengths])
    verify = last.verify_lengths or [[1] * len(a) for a in last.acceptance_lengths]  # AR: one row
    waste = wasted_rows(last.acceptance_lengths, verify, max_new, idle_length)
    pct = lambda x, q: float(np.percentile(x, q))
    return {
        "method": method, "batch": batch, "runs": len(results), "decode_s_runs": times, "decode_s": decode_s,
        "iterations": last.num_steps, "iteration_ms": 1e3 * per_iter,
        "aggregate_tokens_per_s": batch * (max_new - 1) / decode_s,
        "aggregate_tokens_per_s_runs": [batch * (max_new - 1) / t for t in times],
        "per_user_tokens_per_s": {"mean": float(per_user.mean()), "p10": pct(per_user, 10), "p90": pct(per_user, 90)},
        "tau": {"mean": float(tau.mean()), "p10": pct(tau, 10), "p90": pct(tau, 90)},
        "tau_rows": tau.tolist(), "iterations_rows": iters.astype(int).tolist(),
        "verify_rows_per_iteration": waste["verified"] / (batch * last.num_steps),
        "verify": waste,
        "prompt_padding_share": padding_share(last.prompt_lengths),
    }


def measure(target, drafter, prompts: Sequence[Sequence[int]], batches: Sequence[int], max_new: int,
            methods: Sequence[str] = METHODS, repeats: int = 3, pad_to=None) -> dict:
    """Every (method, batch size): a compiling warm-up run, then ``repeats`` timed runs of the
    first B ``prompts``. Greedy; stop tokens ignored. Returns {"rows": [batch_record ...],
    "same_output": {batch: every speculative method's rows equal AR's}}."""
    from dflash_jax.bench.harness import drafter_block_size
    from dflash_jax.decoding.generation import generate

    check_settings(batches, max_new, methods, repeats, len(prompts))
    if any(m != AR for m in methods) and drafter is None:
        raise ValueError("the DFlash methods need a drafter")
    rows, same = [], {}
    short = per_row_lengths(drafter_block_size(drafter))[0] if PER_ROW in methods else None
    bar = progress(total=len(batches) * len(methods), desc="throughput (batch x method)", unit="run")
    for b in batches:
        batch_prompts = [list(p) for p in prompts[:b]]
        outputs = {}
        for m in methods:
            kw = OPTIONS[m] | ({} if m == AR else {"drafter": drafter})
            run = lambda: generate(target, batch_prompts, max_new, stop_token_ids=(), pad_to=pad_to, **kw)
            run()  # compiles (and, for the adaptive block, measures this device's cost table once)
            results = [run() for _ in range(repeats)]
            for r in results:
                if r.num_generated != [max_new] * b:
                    raise RuntimeError(f"{m} at batch {b}: rows generated {r.num_generated} tokens, not {max_new} each")
            outputs[m] = results[-1].sequences
            rows.append(batch_record(m, b, results, max_new, short if m == PER_ROW else None))
            bar.update(1)
            r = rows[-1]
            Bar.write(f"batch {b:3d} {LABELS[m]}: {r['aggregate_tokens_per_s']:.1f} tok/s aggregate, "
                      f"{r['per_user_tokens_per_s']['mean']:.1f} per user, tau {r['tau']['mean']:.2f}, "
                      f"{100 * r['verify']['wasted_share']:.0f}% of verified rows wasted")
        if AR in outputs:
            same[str(b)] = all(outputs[m] == outputs[AR] for m in outputs if m != AR)
    bar.close()
    return {"rows": rows, "same_output": same}


def check_settings(batches, max_new: int, methods, repeats: int, available: int) -> None:
    if not batches or any(b < 1 for b in batches):
        raise ValueError(f"--batch-sizes must be positive integers, got {list(batches)}")
    if max_new < 2 or repeats < 1:
        raise ValueError("--max-new-tokens must be >= 2 (the first token is the prefill's; the decode loop "
                         "makes the rest) and --repeats >= 1")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if max(batches) > available:
        raise ValueError(f"a batch of {max(batches)} needs {max(batches)} prompts; {available} given")


# ---------------------------------------------------------------------------- the curves
def curve(rows: Sequence[dict], method: str) -> list[tuple[float, float, int]]:
    """A method's points (per-user tokens/s, aggregate tokens/s, batch), by batch size."""
    return sorted(((r["per_user_tokens_per_s"]["mean"], r["aggregate_tokens_per_s"], r["batch"])
                   for r in rows if r["method"] == method), key=lambda p: p[2])


def throughput_at(points: Sequence[tuple[float, float, int]], per_user: float) -> float | None:
    """The aggregate throughput a curve gives at the per-user speed ``per_user``: linear
    between the two measured points around it (by per-user speed); None outside the curve's
    measured range."""
    pts = sorted((p[0], p[1]) for p in points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= per_user <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (per_user - x0) / (x1 - x0)
    if pts and pts[0][0] == per_user:
        return pts[0][1]
    return None


def fixed_interactivity(rows: Sequence[dict], methods: Sequence[str]) -> list[dict]:
    """The speedup over AR at fixed interactivity: at each AR point's per-user speed (the levels),
    each other method's interpolated aggregate throughput over AR's."""
    ar = curve(rows, AR)
    out = []
    for x, y, b in ar:
        level = {"per_user_tokens_per_s": x, "ar_batch": b, "ar_tokens_per_s": y}
        for m in methods:
            if m != AR:
                t = throughput_at(curve(rows, m), x)
                level[m] = None if t is None else t / y
        out.append(level)
    return out


SATURATION = 0.9


def row_rates(rows: Sequence[dict], method: str) -> list[tuple[int, float]]:
    """(batch, target rows verified per second) of a method, by batch: the batch's verified rows
    per iteration (every row's block rows, finished rows included) over the iteration time."""
    return sorted((r["batch"], r["batch"] * r["verify_rows_per_iteration"] / (r["iteration_ms"] / 1e3))
                  for r in rows if r["method"] == method)


def compute_bound_from(rows: Sequence[dict], method: str, share: float = SATURATION) -> int | None:
    """The smallest batch from which the target's verify is compute-bound here, read off the
    measurement: the first batch whose rows verified per second reach ``share`` of the largest
    rate measured (past it, more rows per iteration cost proportionally more time, so a larger
    batch or block buys no throughput). None without points."""
    rates = row_rates(rows, method)
    if not rates:
        return None
    top = max(r for _, r in rates)
    return next(b for b, r in rates if r >= share * top)


# ---------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"`{report['command']}`", "", machine_sentence(report), "",
             f"Target {s['target']}, drafter {s['drafter']}, {s['dtype']}; {s['max_new_tokens']} new tokens per row "
             f"(stop tokens ignored), prompts from {', '.join(s['datasets'])} taken in turn (a batch of B: the first "
             f"B), {s['repeats']} timed runs each after a compiling one, T = 0.", "",
             "| batch | method | aggregate tok/s | per-user tok/s mean [p10, p90] | tau mean [p10, p90] | "
             "verify rows / iteration | wasted verify rows | prompt padding | same output as AR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        u, t = r["per_user_tokens_per_s"], r["tau"]
        same = "" if r["method"] == AR else ("yes" if report["same_output"].get(str(r["batch"])) else "NO")
        lines.append(f"| {r['batch']} | {LABELS[r['method']]} | {r['aggregate_tokens_per_s']:.1f} | "
                     f"{u['mean']:.1f} [{u['p10']:.1f}, {u['p90']:.1f}] | {t['mean']:.2f} [{t['p10']:.2f}, "
                     f"{t['p90']:.2f}] | {r['verify_rows_per_iteration']:.1f} | "
                     f"{100 * r['verify']['wasted_share']:.0f} % | {100 * r['prompt_padding_share']:.0f} % | {same} |")
    lines += ["", f"Target rows verified per second (batch x rows verified per row and iteration, over the "
              f"iteration time; the verify is compute-bound from the first batch at {100 * SATURATION:.0f} % of a "
              "method's largest rate):", "",
              "| method | " + " | ".join(f"batch {b}" for b in s["batch_sizes"]) + " | compute-bound from batch |",
              "|---|" + "---|" * (len(s["batch_sizes"]) + 1)]
    for m in s["methods"]:
        rates = dict(row_rates(report["rows"], m))
        lines.append(f"| {LABELS[m]} | " + " | ".join(f"{rates[b]:.0f}" if b in rates else "-" for b in s["batch_sizes"])
                     + f" | {report['compute_bound_from'].get(m)} |")
    others = [m for m in s["methods"] if m != AR]
    if AR in s["methods"] and others:
        lines += ["", "Speedup over AR at a fixed per-user speed (the levels: AR's per-user speed at each batch; "
                  "the other methods' aggregate throughput interpolated there; '-': outside their measured range):",
                  "", "| per-user tok/s (AR batch) | " + " | ".join(LABELS[m] for m in others) + " |",
                  "|---|" + "---|" * len(others)]
        for lv in report["fixed_interactivity"]:
            cells = ["-" if lv[m] is None else f"{lv[m]:.2f}x" for m in others]
            lines.append(f"| {lv['per_user_tokens_per_s']:.1f} ({lv['ar_batch']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    fig, (a, b) = new_figure(1, 2, figsize=(10, 4))
    for m in report["settings"]["methods"]:
        pts = curve(report["rows"], m)
        a.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=LABELS[m])
        for x, y, bs in pts:
            a.annotate(str(bs), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        rows = sorted((r for r in report["rows"] if r["method"] == m), key=lambda r: r["batch"])
        b.plot([r["batch"] for r in rows], [100 * r["verify"]["wasted_share"] for r in rows], "o-", label=LABELS[m])
    a.set(xlabel="per-user tokens / s (interactivity)", ylabel="aggregate tokens / s (throughput)",
          title="throughput against interactivity (points: batch size)")
    a.legend(fontsize=7)
    b.set(xscale="log", xlabel="batch", ylabel="% of verified rows wasted", title="wasted verify rows")
    fig.suptitle(f"{report['settings']['target']} on {report['env']['device']}, {report['settings']['max_new_tokens']} "
                 "new tokens per row")
    return fig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="embedded", metavar="CHECKPOINT",
                   help="the target (a directory, a Hugging Face repo id, or 'embedded', the default)")
    p.add_argument("--drafter", default=None, metavar="CHECKPOINT",
                   help="the DFlash drafter (default: the embedded drafter, with the embedded target)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCHES), metavar="B",
                   help="batch sizes (rows decoded together)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                   help="ar, dflash (fixed block), adaptive (DFlash with the batch-wide adaptive block), "
                        "adaptive_rows (DFlash with the verify length chosen per row)")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS, help="prompt sets")
    p.add_argument("--data-dir", default=None,
                   help="read the prompt sets from this directory (layout of dflash_jax/bench/data) "
                        "instead of the copies shipped with the package; also $DFLASH_DATA_DIR")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens generated per prompt at most; here every row generates exactly this many "
                        "(stop tokens ignored)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per (method, batch size)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt subsets")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="compute dtype (default float32 on CPU, the checkpoint's elsewhere)")
    p.add_argument("--out", default="runs/throughput", help="output directory")


def run(args) -> dict:
    import jax
    import jax.numpy as jnp

    from dflash_jax.models.handles import load_drafter, load_target

    check_settings(args.batch_sizes, args.max_new_tokens, args.methods, args.repeats, max(args.batch_sizes))
    load_before, cpu, warning = start_measurement()
    dtype = jnp.dtype(args.dtype) if args.dtype else (jnp.float32 if jax.devices()[0].platform == "cpu" else None)
    target = load_target(args.target, dtype=dtype)
    if target.tokenizer is None:
        raise ValueError(f"--target {args.target}: no tokenizer in its directory; the prompt sets are text")
    drafter_name = args.drafter or ("embedded" if args.target == "embedded" else None)
    if drafter_name is None and any(m != AR for m in args.methods):
        raise ValueError("--drafter is required with a --target other than the embedded one (or --methods ar)")
    drafter = load_drafter(drafter_name, target, dtype=target.dtype) if drafter_name else None
    pool = pooled_prompts(target, args.datasets, max(args.batch_sizes), args.seed, args.data_dir)
    widest = max(len(ids) for _, ids in pool)
    measured = measure(target, drafter, [ids for _, ids in pool], sorted(set(args.batch_sizes)),
                       args.max_new_tokens, args.methods, args.repeats)
    report = {
        "benchmark": "throughput",
        "command": command_line("dflash_jax", invocation(args)),
        "settings": {"target": args.target, "drafter": drafter_name, "dtype": jnp.dtype(target.dtype).name,
                     "batch_sizes": sorted(set(args.batch_sizes)), "methods": list(args.methods),
                     "datasets": list(args.datasets), "max_new_tokens": args.max_new_tokens,
                     "repeats": args.repeats, "seed": args.seed, "widest_prompt": widest,
                     "prompt_sets_in_order": [d for d, _ in pool]},
        **measured,
        "fixed_interactivity": fixed_interactivity(measured["rows"], args.methods) if AR in args.methods else [],
        "compute_bound_from": {m: compute_bound_from(measured["rows"], m) for m in args.methods},
        "machine": machine_fields(cpu, load_before, warning),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return publish_report(report, args.out, f"throughput_{report['env']['platform']}", plot, markdown)


def main(argv=None) -> dict:
    return command_main("throughput", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
