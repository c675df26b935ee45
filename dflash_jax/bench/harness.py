"""The paper's benchmark protocol: autoregressive vs DFlash decoding on the same prompts.

    python -m dflash_jax bench                       # embedded default, all five prompt sets
    python -m dflash_jax bench --target Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 \\
        --max-samples 80 --max-new-tokens 2048 --dtype bfloat16

Per prompt set it prints docs/method.md section 6's metrics (``dflash_jax.metrics``): tau (per response
the mean acceptance length, then the mean over responses) and the decode-only speedup (mean
AR time per output token / mean DFlash time per output token over the responses, prefill
excluded; batch 1; each set padded to its own program shape, or with ``--program-shape one`` all
to one, compiled by a warm-up that the timings exclude: :meth:`Runner.program_shape`), each with a 95 % bootstrap interval over
the responses, beside the pooled tau and the end-to-end speedup (prefill included); then the
averages over the sets, the acceptance-length histogram and the per-position acceptance
rates, and writes ``bench.json``, ``bench.md`` and ``bench.png`` under ``--out``. At
temperature 0 it also counts the prompts whose DFlash
output equals the autoregressive output (it must be all of them). mt-bench is two-turn:
each method's turn-2 prompt carries the autoregressive answer to turn 1.

Before the runs it prints the CPU (model, vector extensions) and the load average, with a
warning when the machine is busy (``reporting.busy_warning``); the summary says what one DFlash
iteration cost in AR steps on this machine, the speedup that implies (tau pooled / cost), and
what the same acceptance gives where an iteration costs :data:`REFERENCE_ITERATION_COST` AR
steps (the H100 measurement). Intervals resting on fewer than ``metrics.MIN_DISTINCT_SAMPLES``
responses are not given ("n < 8: no interval").

``--drafter`` takes a drafter of any registered drafting method (``docs/methods.md``; a shipped
one by its name), told apart by its config.json's architectures (``load_drafter``,
``dflash_jax.methods``): the speculative column is then that method's, its chain of
``block_size - 1`` drafts (the method's default block) or, with ``--tree N --tree-topk K``, its
tree; the adaptive table only for a method that measures its own costs
(``DraftingMethod.automatic_adaptive``).

Prompts are rendered with the target's chat template with the thinking switch off (Qwen3's
``enable_thinking=False``, as the reference benchmark; ``--thinking`` turns it on), and
``--max-samples`` picks prompts the ``--subset`` way: ``random`` (default) or ``reference``
(the DFlash reference's ``random.seed(0); random.shuffle``, first N: same prompts as its
numbers). Both settings are recorded in ``bench.json`` (``settings``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from dflash_jax import methods, metrics
from dflash_jax import quantization
from dflash_jax.bench.prompt_sets import DATASETS, SUBSETS, load_prompt_set, locate_prompt_set
from dflash_jax.cli import check_minimum, check_sampling_options, command_main, command_parser, invocation, options, run_cli, status
from dflash_jax.hub import CHECKPOINT_HELP, EMBEDDED, expand_embedded, resolve_checkpoint
from dflash_jax.models.handles import (EMBEDDED_DRAFTER_DIR as EMBEDDED_DRAFTER,
                                       EMBEDDED_TARGET_DIR as EMBEDDED_TARGET, load_drafter, load_target)
from dflash_jax.files import write_text
from dflash_jax.progress import progress
from dflash_jax.reporting import (busy_warning, command_line, cpu_description, cpu_info, environment,
                                  load_average, new_figure, portable_path, write_report)
from dflash_jax.verification.adaptive import ADAPTIVE, block_size_arg
from dflash_jax.decoding import tree_args
from dflash_jax.parallel import cli as parallel_cli, is_main_process
from dflash_jax.decoding.prepare import round_up
from dflash_jax.prompts import encode_prompt, has_thinking_switch
from dflash_jax.decoding.generation import generate


# What one DFlash iteration costs in AR steps where decoding is memory-bound, as on a GPU:
# 1.305 = result.iteration_over_ar_step (10.30 ms per iteration / 7.90 ms per AR step) in
# results/gpu/h100/spec/qwen3-8b_gpu_bfloat16_pallas_b1_bs16.json, measured on an NVIDIA H100
# for Qwen3-8B shapes + a 5-layer drafter, bfloat16, block 16, batch 1, 512-token prompt
# (results/ does not ship with the package, so the number is kept here;
# tests/bench/test_bench_report.py checks it against that file). The XLA attention run of the same
# suite gave 1.260; the paper's 4.86x at tau 6.49 on an H200 implies 1.335.
REFERENCE_ITERATION_COST = 1.305
REFERENCE_ITERATION_SOURCE = ("NVIDIA H100, Qwen3-8B shapes, bf16, block 16: "
                              "results/gpu/h100/spec/qwen3-8b_gpu_bfloat16_pallas_b1_bs16.json")


def parser() -> argparse.ArgumentParser:
    """The command's parser on its own (``build-embedded`` checks its --bench-args with it)."""
    p = command_parser("bench", __doc__)
    add_arguments(p)
    return p


def add_arguments(p) -> None:
    p.add_argument("--target", default=EMBEDDED, metavar="CHECKPOINT",
                   help=f"the target: {CHECKPOINT_HELP} (default: embedded)")
    p.add_argument("--drafter", default=None, metavar="CHECKPOINT",
                   help="the drafter, named the same way, e.g. z-lab/Qwen3-8B-DFlash-b16 with "
                        "Qwen/Qwen3-8B (default: the embedded drafter, with the embedded target); a drafter "
                        "of another drafting method (its config.json tells; docs/methods.md) benches that "
                        "method instead")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS, help="prompt sets")
    p.add_argument("--data-dir", default=None,
                   help="read the prompt sets from this directory (layout of dflash_jax/bench/data) "
                        "instead of the copies shipped with the package; also $DFLASH_DATA_DIR")
    p.add_argument("--hub", action="store_true",
                   help="read the prompt sets from the Hugging Face hub (needs `datasets` and a network)")
    p.add_argument("--max-samples", type=int, default=8, help="prompts per set (chosen by --subset)")
    p.add_argument("--subset", choices=SUBSETS, default="random",
                   help="which --max-samples prompts of a set: 'random' = a subset drawn with numpy from "
                        "--seed, kept in dataset order; 'reference' = the DFlash reference benchmark's "
                        "random.seed(--seed); random.shuffle(set); first N (with --seed 0 the same prompts "
                        "as the reference's, in its order); 'first' = the first N in dataset order")
    p.add_argument("--thinking", action="store_true",
                   help="render prompts with the chat template's thinking switch on (Qwen3's "
                        "enable_thinking=True); default off, as the reference benchmark (templates "
                        "without the switch are unaffected)")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens generated per prompt at most (fewer at a stop token)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")

    p.add_argument("--block-size", type=block_size_arg, default=None,
                   help="speculative block size (default: the drafter's); 'adaptive' is deprecated: "
                        "--verify adaptive")
    p.add_argument("--program-shape", choices=("per-set", "one"), default="per-set",
                   help="per-set (default): every prompt set padded to its own longest prompt and cache, "
                        "so its decode timings are its own (a compile per distinct shape; the persistent "
                        "compilation cache serves them to the next run); one: every set padded to the "
                        "run's longest, compiled once, but with XLA attention a shorter set's decode steps "
                        "also attend over the padding (measured on the embedded pair: cache 320 -> 448 made "
                        "AR 9 %% and DFlash 5 %% slower per token, the speedup 2-3 %% higher)")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True,
                   help="also run DFlash with block_size='adaptive' on every prompt, beside the fixed "
                        "block, and report it as a second table (verify lengths 4 / 8 / 16 chosen per "
                        "iteration from the drafter's confidence and this device's cached costs, "
                        "measured once, ~20 s); on by default, --no-adaptive: the fixed block only; "
                        "off with --tree (the tree run is then the DFlash column)")
    tree_args.add_arguments(p)
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of the prompt subset (--subset) and of sampling")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="compute dtype of the target and drafter (default float32 on CPU, the checkpoint's "
                        "elsewhere)")
    quantization.add_argument(p)
    p.add_argument("--out", default="runs/bench", help="output directory (bench.json, bench.md, bench.png)")

    parallel_cli.add_arguments(p)  # one prompt at a time: a mesh with data=1 (model=N: TP)


class Runner:
    """Runs one method (AR or DFlash) on chat turns with shapes fixed per prompt set."""

    def __init__(self, target, drafter, args):

        self.target, self.drafter, self.args = target, drafter, args
        thinking = bool(getattr(args, "thinking", False))
        self.encode = lambda turns: encode_prompt(turns, target.tokenizer, enable_thinking=thinking)
        self.stops = target.stop_token_ids
        self.warmed: set = set()  # the program shapes whose programs this runner has compiled

    def block_size(self) -> int:
        """The verified block: ``--block-size``, else the drafter's default."""
        a = self.args
        return drafter_block_size(self.drafter) if a.block_size in (None, ADAPTIVE) else a.block_size

    def block_rows(self) -> int:
        """Rows the cache holds past the committed tokens: the verified block, or a tree's nodes."""
        return max(self.block_size(), getattr(self.args, "tree", None) or 0)

    def program_shape(self, sets) -> tuple[int, int]:
        """One (prompt width, cache length) that serves every turn of every sample of ``sets``
        (an iterable of sample lists): the longest prompt (a later turn carries the earlier
        answers, each at most ``max_new_tokens`` + 8 tokens of template) rounded up to 16, and
        the cache for it, the new tokens and a verified block rounded up to 64 (at most the
        target's cache). With one shape for several sets (``--program-shape one``) the AR and
        the speculative programs compile once for all of them; the padding costs prefill time
        (excluded from the decode timings) and, on the XLA attention path, which masks rather
        than skips the cache's empty slots, attention work in every decode step of the shorter
        sets, more for AR than for DFlash relative to their step times (so their speedups come
        out a little high; the option's help gives the measurement)."""
        a = self.args
        bound = max(len(self.encode(chat(s.turns, ["x"] * (len(s.turns) - 1))))
                    + (len(s.turns) - 1) * (a.max_new_tokens + 8) for samples in sets for s in samples)
        rows = self.block_rows()
        cache = round_up(bound + a.max_new_tokens + rows, 64)
        max_len = getattr(self.target, "max_len", None)  # never past what the target's cache can hold
        if max_len:
            cache = min(cache, max_len + rows)
        return min(round_up(bound, 16), cache - rows), cache

    def warm_up(self, first, pad_to, adaptive: bool, bar) -> None:
        """Compiles (or loads from the persistent compilation cache) the AR and speculative
        programs of ``pad_to`` by running them once on ``first``; nothing when this runner has
        done so already. The timed runs exclude this."""
        key = (tuple(pad_to), adaptive)
        if key in self.warmed:
            return
        bar.write("compiling the AR and speculative programs "
                  f"(prompt width {pad_to[0]}, cache {pad_to[1]}) and warming up; the timings exclude this",
                  file=sys.stderr)
        t0 = time.perf_counter()
        for d in (None, self.drafter):
            self.run(first, d, pad_to)
        if adaptive:
            self.run(first, self.drafter, pad_to, adaptive=True)
        self.warmed.add(key)
        bar.write(f"ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    def run(self, ids, drafter, pad_to, adaptive: bool = False):

        a = self.args
        adaptive = adaptive or a.block_size == ADAPTIVE
        block_size = None if drafter is None or a.block_size == ADAPTIVE else a.block_size
        verify = (ADAPTIVE if adaptive else tree_args.policy(a)) if drafter else None
        return generate(self.target, [ids], a.max_new_tokens, drafter=drafter, temperature=a.temperature,
                        stop_token_ids=self.stops, seed=a.seed, block_size=block_size, verify=verify,
                        num_denoise_steps=getattr(a, "num_denoise_steps", 1),
                        sampled_draft=getattr(a, "sampled_draft", False), pad_to=pad_to)


def chat(turns, answers):
    out = []
    for i, u in enumerate(turns):
        out.append({"role": "user", "content": u})
        if i < len(answers):
            out.append({"role": "assistant", "content": answers[i]})
    return out


def drafter_block_size(drafter) -> int:
    """A drafter's default block (its method's ``default_block_size``: a DFlash drafter's
    trained block)."""
    return methods.method_of(drafter).default_block_size(drafter)


def drafter_method(drafter) -> str:
    """The drafter's method name (e.g. ``"dflash"``): the report's ``settings.method``."""
    return methods.method_of(drafter).name


def report_method(report: dict):
    """The drafting method a report measured (reports written before reports named it: DFlash)."""
    return methods.method(report["settings"].get("method", methods.DEFAULT))


def bench_dataset(runner: Runner, samples, bar, pad_to: tuple[int, int] | None = None) -> dict:
    """Both methods on every sample (and turn) of one prompt set; returns its record. ``pad_to``:
    the program shape (:meth:`Runner.program_shape`; default: this set's own), compiled at the
    first set that uses it."""
    a, tok = runner.args, runner.target.tokenizer

    bs = runner.block_size()
    adaptive = bool(getattr(a, "adaptive", False)) and getattr(a, "tree", None) is None
    pad_to = runner.program_shape([samples]) if pad_to is None else pad_to
    runner.warm_up(runner.encode(chat(samples[0].turns[:1], [])), pad_to, adaptive, bar)
    rec = {"samples": [], "same_output": 0, "turns": 0, "timed_runs_with_compilation": 0,
           "program_shape": {"prompt_width": pad_to[0], "cache_length": pad_to[1]}}
    for s in samples:
        answers = []
        for t in range(len(s.turns)):
            ids = runner.encode(chat(s.turns[:t + 1], answers))
            ar = runner.run(ids, None, pad_to)
            df = runner.run(ids, runner.drafter, pad_to)
            answers.append(tok.decode(ar.sequences[0], skip_special_tokens=True) if tok else "")
            same = ar.sequences[0] == df.sequences[0]
            rec["same_output"] += int(same)
            rec["turns"] += 1
            lengths = lambda r: {"verify_lengths": r.verify_lengths[0]}
            sample = {"id": s.id, "turn": t + 1, "prompt_tokens": len(ids), "same_output": same,
                      "ar": metrics.response(ar).to_dict(),
                      "dflash": metrics.response(df).to_dict() | (lengths(df) if a.block_size == ADAPTIVE else {})}
            timed = [ar, df]
            if adaptive:
                ad = runner.run(ids, runner.drafter, pad_to, adaptive=True)
                sample["adaptive"] = metrics.response(ad).to_dict() | lengths(ad)
                sample["same_output_adaptive"] = ar.sequences[0] == ad.sequences[0]
                timed.append(ad)
            compiled = sum(r.includes_compilation for r in timed)  # the warm-up should leave none
            if compiled:
                rec["timed_runs_with_compilation"] += compiled
                bar.write(f"warning: {compiled} timed run(s) of {s.id} compiled a program after the "
                          "warm-up: their times include compilation", file=sys.stderr)
            rec["samples"].append(sample)
            bar.update(1)
    return summarize_set(rec, bs, main_adaptive=a.block_size == ADAPTIVE)


def summarize_set(rec: dict, block_size: int, main_adaptive: bool = False) -> dict:
    """A prompt set's record with every number the report gives, computed from its
    per-response ``samples`` (and their ``adaptive`` runs where present); ``main_adaptive``:
    the main DFlash run chose its verify lengths (``--block-size adaptive``)."""
    rec.update(metrics.summarize(*responses(rec), block_size))
    rec.update(set_speed_terms(rec))
    if main_adaptive:
        rec.update(verify_length_summary(rec["samples"], "dflash"))
    if rec["samples"] and all("adaptive" in x for x in rec["samples"]):
        rec["adaptive"] = metrics.summarize(*responses(rec, "adaptive"), block_size) | {
            "same_output": sum(x["same_output_adaptive"] for x in rec["samples"])} | verify_length_summary(
            rec["samples"], "adaptive") | set_speed_terms(rec, "adaptive")
    return rec


def verify_length_summary(rows: list[dict], method: str) -> dict:
    """The mean and the counts of the verify lengths an adaptive ``method`` chose over ``rows``."""
    chosen = [v for x in rows for v in x[method]["verify_lengths"]]
    return {"mean_verify_length": float(np.mean(chosen)) if chosen else float("nan"),
            "verify_length_counts": {str(L): chosen.count(L) for L in sorted(set(chosen))}}


def responses(record: dict, method: str = "dflash") -> tuple[list, list]:
    """(AR responses, ``method`` responses: "dflash", or "adaptive" with ``--adaptive``) of a
    prompt set's record, paired, in order."""
    rows = record["samples"]
    return ([metrics.Response.from_dict(x["ar"]) for x in rows],
            [metrics.Response.from_dict(x[method]) for x in rows])


def iteration_cost(ar, dflash) -> float:
    """What one DFlash iteration cost in AR steps: DFlash decode seconds per loop iteration
    over AR decode seconds per step (one token), each pooled over the responses (all decode
    time / all iterations). The decode speedup is about (tokens per iteration, i.e. tau
    pooled) / this. nan without iterations on either side."""
    ar_steps, df_iterations = (sum(len(r.acceptance_lengths) for r in x) for x in (ar, dflash))
    if not ar_steps or not df_iterations:
        return float("nan")
    ar_s = sum(r.decode_s for r in ar if r.acceptance_lengths)
    df_s = sum(r.decode_s for r in dflash if r.acceptance_lengths)
    return (df_s / df_iterations) / (ar_s / ar_steps) if ar_s > 0 else float("nan")


def speed_terms(tau_pooled: float, cost: float, reference: bool = True) -> dict:
    """Why a speedup is what it is: the iteration ``cost`` in AR steps, the speedup it implies
    here (``tau_pooled / cost``: tokens per iteration over AR steps per iteration) and, with
    ``reference``, the one the same acceptance gives where an iteration of the fixed block
    costs :data:`REFERENCE_ITERATION_COST` AR steps (a GPU; not for the adaptive block, whose
    verify lengths, chosen from this machine's costs, would be others there)."""
    return {"iteration_cost_ar_steps": cost,
            "speedup_from_cost": tau_pooled / cost if cost > 0 else float("nan")} | (
        {"speedup_at_reference_cost": tau_pooled / REFERENCE_ITERATION_COST} if reference else {})


def explanation(report: dict) -> str:
    """The summary's account of the speedup, one paragraph per table (fixed, adaptive block):
    the iteration cost in AR steps measured here, the speedup it implies, and what the same
    acceptance gives at :data:`REFERENCE_ITERATION_COST`."""
    out = []
    main = main_run_name(report)
    for key, label in (("average", main), ("average_adaptive", "adaptive block")):
        av = report.get(key) or {}
        cost = av.get("iteration_cost_ar_steps", float("nan"))
        if not np.isfinite(cost):
            continue
        tp = av["tau_pooled"]
        who = report_method(report).label
        text = (f"Why {av['speedup']:.2f}x ({label}): one {who} iteration (draft + verify) cost "
                f"{cost:.2f} AR steps here ({who} decode time per iteration / AR decode time per "
                f"token, mean over the sets) and made {tp:.2f} tokens (tau pooled), so speedup ~ "
                f"{tp:.2f} / {cost:.2f} = {av['speedup_from_cost']:.2f}x (the table's "
                f"{av['speedup']:.2f}x averages per-response times).")
        if "speedup_at_reference_cost" in av and report["settings"].get("method", "dflash") == "dflash":
            text += (f" Where an iteration costs {REFERENCE_ITERATION_COST:.3f} AR steps "
                     f"({REFERENCE_ITERATION_SOURCE}), the same acceptance gives ~ {tp:.2f} / "
                     f"{REFERENCE_ITERATION_COST:.3f} = {av['speedup_at_reference_cost']:.2f}x.")
        out.append(text)
    return "\n\n".join(out)


def set_speed_terms(record: dict, method: str = "dflash") -> dict:
    """:func:`speed_terms` of one prompt set's record, from its per-response data."""
    ar, dflash = responses(record, method)
    return speed_terms(metrics.pooled_tau(dflash), iteration_cost(ar, dflash), reference=method == "dflash")


def average(datasets: dict, method: str = "dflash") -> dict:
    """The average over the finished prompt sets (``metrics.average``), with the mean of the
    per-set iteration costs and the speedups it implies with the average tau pooled
    (:func:`speed_terms`)."""
    av = metrics.average({name: responses(r, method) for name, r in datasets.items()})
    costs = [iteration_cost(*responses(r, method)) for r in datasets.values()]
    return av | speed_terms(av["tau_pooled"], float(np.mean(costs)) if costs else float("nan"),
                            reference=method == "dflash")


def markdown(report: dict) -> str:
    """The table: docs/method.md section 6's tau and decode-only speedup with 95 % bootstrap intervals
    over responses, then the pooled tau and the end-to-end (prefill included) speedup."""
    tables = [_table(report, "dflash")]
    if "average_adaptive" in report:
        tables.append("DFlash with the adaptive block size (`--adaptive`; verify length chosen per "
                      "iteration), the same prompts, AR and fixed-block runs:\n\n" + _table(report, "adaptive"))
    return "\n\n".join(tables)


def method_label(report: dict) -> str:
    """The main speculative run's name in the outputs: "DFlash", or "DFlash tree N" with
    ``--tree`` (``tree_args.label``; a report written before trees existed: "DFlash"); with
    another method's drafter its label the same way."""
    st = report["settings"]
    label = tree_args.label(argparse.Namespace(tree=st.get("tree"), tree_topk=st.get("tree_topk")))
    return label.replace("DFlash", report_method(report).label)


def main_run_name(report: dict) -> str:
    """The main DFlash run beside the adaptive one, in legends and the summary: "fixed block",
    or "tree N" with ``--tree``."""
    label, method = method_label(report), report_method(report).label
    return "fixed block" if label == method else label.removeprefix(method + " ")


def _table(report: dict, method: str) -> str:
    greedy = report["settings"]["temperature"] == 0
    adaptive = method == "adaptive"
    who = "DFlash" if adaptive else method_label(report)
    head = ("| dataset | responses | tau [95% CI] | speedup, decode [95% CI] | tau pooled | speedup, end to end "
            f"| AR ms/token | {who} ms/token | iteration, AR steps |" + (f" {who} == AR |" if greedy else "")
            + (" mean verify length |" if adaptive else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, rec in report["datasets"].items():
        r = rec["adaptive"] if adaptive else rec
        cost = r.get("iteration_cost_ar_steps", float("nan"))
        n = rec["turns"]
        row = (f"| {name} | {n} | {_interval(r['tau'], r['tau_ci'], n)} | "
               f"{_interval(r['speedup'], r['speedup_ci'], n, 'x')} | {r['tau_pooled']:.2f} | "
               f"{r['end_to_end_speedup']:.2f}x | {r['ar_decode_ms_per_token']:.2f} | "
               f"{r['dflash_decode_ms_per_token']:.2f} | {cost:.2f} |")
        lines.append(row + (f" {r['same_output']}/{rec['turns']} |" if greedy else "")
                     + (f" {r['mean_verify_length']:.1f} |" if adaptive else ""))
    av = report["average_adaptive" if adaptive else "average"]
    n = sum(rec["turns"] for rec in report["datasets"].values())  # the average's interval rests on all
    lines.append(f"| **average** | | **{_interval(av['tau'], av['tau_ci'], n)}** | "
                 f"**{_interval(av['speedup'], av['speedup_ci'], n, 'x')}** | {av['tau_pooled']:.2f} | "
                 f"{av['end_to_end_speedup']:.2f}x | | | {av.get('iteration_cost_ar_steps', float('nan')):.2f} |"
                 + (" |" if greedy else "") + (" |" if adaptive else ""))
    return "\n".join(lines)


def _interval(value: float, ci, n: int, unit: str = "") -> str:
    """``"1.23 [1.11, 1.43]x"``; without an interval, the reason: ``"1.23x (n < 8: no
    interval)"`` where it would rest on too few (``n``) responses (``metrics.interval_supported``)."""
    if ci is not None and all(np.isfinite(ci)):
        return metrics.interval_text(value, ci) + unit
    why = "no interval" if metrics.interval_supported(n) else f"n < {metrics.MIN_DISTINCT_SAMPLES}: no interval"
    return f"{value:.2f}{unit} ({why})"


def plot(report: dict):
    """bench.png: the decode speedup and tau on axes of their own (fixed and adaptive block
    side by side, per set and the average, 95 % intervals where they exist, and the titles say
    which; legends below the axes, clear of the bars), the acceptance-length histogram and the
    per-position acceptance; a busy machine is marked (``figures.report_notes``)."""
    names = list(report["datasets"])
    fig, ((ax_speed, ax_tau), (ax_hist, ax_pos)) = new_figure(2, 2, figsize=(14, 8.5))
    main = main_run_name(report)
    methods = [("dflash", main)]
    if "average_adaptive" in report:
        methods.append(("adaptive", "adaptive block"))
    groups = names + ["average"]

    def record(group, method):
        if group == "average":
            return report["average_adaptive" if method == "adaptive" else "average"]
        rec = report["datasets"][group]
        return rec["adaptive"] if method == "adaptive" else rec

    from dflash_jax import figures

    x, width = np.arange(len(groups)), 0.8 / len(methods)
    turns = [rec["turns"] for rec in report["datasets"].values() if rec.get("turns") is not None]
    says = {}  # what each panel may say of its intervals: only those drawn (figures.interval_label)
    for ax, key in ((ax_speed, "speedup"), (ax_tau, "tau")):
        errors = []
        for i, (method, label) in enumerate(methods):
            recs = [record(g, method) for g in groups]
            vals = np.array([r[key] for r in recs], float)
            errors.append(figures.interval_errors(vals, [r[key + "_ci"] for r in recs]))
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, vals, width, yerr=errors[-1], capsize=3, label=label)
        says[key] = figures.interval_label(errors, min(turns) if turns else None)
        ax.set_xticks(x, groups)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=len(methods), frameon=False)
    ax_speed.axhline(1.0, color="k", lw=0.8)
    ax_speed.set_ylabel("decode speedup over AR (x)")
    cost = report["average"].get("iteration_cost_ar_steps", float("nan"))
    where = (report.get("cpu") or {}).get("model") if report["environment"]["platform"] == "cpu" else None
    ax_speed.set_title(f"decode speedup on {where or report['environment']['device']}, "
                       f"T={report['settings']['temperature']} (an iteration = {cost:.2f} AR steps "
                       f"here), {says['speedup']}")
    ax_tau.set_ylabel("tau (accepted drafts + 1 per iteration)")
    ax_tau.set_title(f"tau, mean acceptance length, {says['tau']}")
    hist = np.sum([report["datasets"][n]["histogram"] for n in names], axis=0)
    ax_hist.bar(np.arange(1, len(hist) + 1), hist / max(hist.sum(), 1))
    ax_hist.set_xlabel("acceptance length (accepted drafts + 1)")
    ax_hist.set_ylabel("fraction of iterations")
    ax_hist.set_title(f"acceptance-length histogram (all sets, {main})")
    for n in names:
        rate = report["datasets"][n]["position_acceptance"]
        ax_pos.plot(np.arange(1, len(rate) + 1), rate, marker=".", label=n)
    ax_pos.set_xlabel("draft position k")
    ax_pos.set_ylabel("P(draft token k accepted)")
    ax_pos.set_ylim(0, 1)
    ax_pos.set_title(f"per-position acceptance ({main})")
    ax_pos.legend(fontsize=8, loc="upper right")
    return figures.finish(fig, figures.report_notes(report))


def run(args) -> dict:
    """The benchmark of parsed ``args``; the report records the command that reproduces them
    (:func:`dflash_jax.cli.invocation`; this process's command line for other ``args``)."""
    import jax
    import jax.numpy as jnp

    check_minimum(args, 1, "max_samples", "max_new_tokens")
    check_sampling_options(args)
    tree_args.check(args)
    if args.tree is not None:  # the tree run is the DFlash column; no adaptive (chain) table
        args.adaptive = False
    target_name = expand_embedded(args.target, "target")  # the embedded pair records its package path
    shipped = methods.method_of_shipped_name(args.drafter)
    drafter_dir = (shipped.shipped_dir() if shipped is not None else
                   expand_embedded(args.drafter, "drafter") if args.drafter else
                   EMBEDDED_DRAFTER if os.path.abspath(target_name) == EMBEDDED_TARGET else None)
    if drafter_dir is None:
        raise ValueError("--drafter is required with a --target other than the embedded one")
    # a repo id is fetched here (into the Hugging Face cache), before the prompt sets are read
    target_path = resolve_checkpoint(target_name, kind="target")
    drafter_path = resolve_checkpoint(drafter_dir, kind="drafter")
    sources = {n: locate_prompt_set(n, args.data_dir, args.hub) for n in args.datasets}
    sets = {n: load_prompt_set(n, args.data_dir, args.max_samples, args.seed, hub=args.hub, subset=args.subset)
            for n in args.datasets}
    machine = machine_check()  # once the model and the prompts are found (an error comes first, alone)
    dtype = jnp.dtype(args.dtype) if args.dtype else (jnp.float32 if jax.devices()[0].platform == "cpu" else None)

    mesh = parallel_cli.mesh_from_args(args)
    if mesh is not None and mesh.devices.shape[0] != 1:
        raise ValueError(f"--mesh {args.mesh}: the benchmark decodes one prompt at a time, so "
                         "the data axis must be 1 (e.g. --mesh data=1,model=4)")
    shipped_names = {EMBEDDED_TARGET: EMBEDDED, **{os.path.abspath(m.shipped_dir()): m.shipped_name
                                                   for m in methods.registered() if m.shipped_name}}
    shown = lambda name, path: shipped_names.get(os.path.abspath(path), name)
    status(f"loading {shown(args.target, target_name)} and {shown(args.drafter, drafter_dir)} ...")
    target = load_target(target_path, dtype=dtype, mesh=mesh, quantize=args.quantize)
    if target.tokenizer is None:
        raise ValueError(f"{args.target} has no tokenizer; the benchmark prompts are text")
    drafter = load_drafter(drafter_path, target, dtype=dtype)
    if not methods.method_of(drafter).automatic_adaptive:  # no adaptive table: its method's declaration
        args.adaptive = False
    runner = Runner(target, drafter, args)
    report = {
        "command": command_line("dflash_jax", invocation(args)), "environment": environment(),
        "cpu": machine["cpu"], "load_average_before": machine["load_average"],
        "busy_warning": machine["busy_warning"],
        "settings": options(args) | {"target": _portable(target_name), "drafter": _portable(drafter_dir),
                                  "prompt_sources": {n: _portable(w) for n, w in sources.items()},
                                  "block_size": args.block_size or drafter_block_size(drafter),
                                  "method": drafter_method(drafter),
                                  "enable_thinking": args.thinking,
                                  "chat_template_has_thinking_switch": has_thinking_switch(target.tokenizer)},
        "datasets": {}, "complete": False,
    }
    t0 = time.perf_counter()
    total = sum(len(s.turns) for v in sets.values() for s in v)
    label = method_label({"settings": {"tree": args.tree, "tree_topk": args.tree_topk,
                                       "method": drafter_method(drafter)}})
    # --program-shape one: one program for every set (else each set's own, bench_dataset)
    pad_to = runner.program_shape(sets.values()) if args.program_shape == "one" else None
    with progress(total=total, desc=f"bench (AR + {label})", unit="prompt") as bar:
        for name, samples in sets.items():
            try:
                bar.set_postfix(dataset=name)
                report["datasets"][name] = bench_dataset(runner, samples, bar, pad_to)
                _write(report, args.out, t0, quiet=True)  # each set is kept as soon as it finishes
            except KeyboardInterrupt:  # (also while that set is written: written again here)
                bar.close()
                if report["datasets"]:
                    _write(report, args.out, t0)
                    kept = f"kept the finished sets ({', '.join(report['datasets'])}) in {args.out}"
                else:
                    kept = "no set had finished"
                print(f"interrupted {'after' if name in report['datasets'] else 'during'} {name}: {kept}",
                      file=sys.stderr)
                sys.exit(130)
    report["complete"] = True
    report["load_average_after"] = load_average()
    table = _write(report, args.out, t0)
    hist = np.sum([r["histogram"] for r in report["datasets"].values()], axis=0)
    print("\n" + table + "\n")
    print("acceptance-length histogram (length: count): "
          + ", ".join(f"{i + 1}: {c}" for i, c in enumerate(hist)))
    rate = metrics.position_acceptance([r for d in report["datasets"].values() for r in responses(d)[1]],
                                       len(hist))
    print("P(draft position k accepted), all sets: " + ", ".join(f"{k + 1}: {p:.2f}" for k, p in enumerate(rate)))
    print(f"{report['wall_time_s']:.0f} s for the runs (compilation and warm-up included; the "
          f"per-set timings exclude them), peak resident memory {report['peak_rss_mib']:.0f} MiB")
    print(f"\n{explanation(report)}\n\n{machine_text(report)}")
    return report


def machine_check(load: list[float] | None = None, cores: int | None = None) -> dict:
    """Before the runs: prints (stderr) the CPU (model, vector extensions) and the load
    average, and a one-line warning when the machine is busy (``reporting.busy_warning``);
    returns them for the report. ``load`` / ``cores``: this machine's unless given."""
    load = load_average() if load is None else load
    cpu = cpu_info() | ({"cores": cores} if cores is not None else {})
    warning = busy_warning(load, cpu["cores"])
    status(f"machine: {cpu_description(cpu)}; load average {_load_text(load)}")
    if warning:
        status(warning)
    return {"cpu": cpu, "load_average": load, "busy_warning": warning}


def _load_text(load, minutes: bool = True) -> str:
    return "unknown" if not load else ", ".join(f"{x:.2f}" for x in load) + (" (1, 5, 15 min)" if minutes else "")


def machine_text(report: dict) -> str:
    """The machine and its load, as the summary and bench.md state them."""
    cpu = report.get("cpu")
    text = (f"Machine: {cpu_description(cpu) if cpu else report['environment']['device']}; load average "
            f"{_load_text(report.get('load_average_before'))} before the runs")
    if report.get("load_average_after"):
        text += f", {_load_text(report['load_average_after'], minutes=False)} after"
    warning = report.get("busy_warning")
    return text + (f". {warning[0].upper()}{warning[1:]}." if warning else ".")


def _portable(path: str) -> str:
    """A path for the report as ``reporting.portable_path`` writes it: shipped files relative to
    the package's root, an installed package's (HumanEval's) relative to its site-packages."""
    return portable_path(path)


def _write(report: dict, out: str, t0: float, quiet: bool = False) -> str:
    """Writes bench.json / .md / .png for the sets finished so far (process 0 of a
    multi-process run only); returns the table."""
    results = report["datasets"]
    report["average"] = average(results)
    if results and all("adaptive" in r for r in results.values()):
        report["average_adaptive"] = average(results, "adaptive")
    report["wall_time_s"] = time.perf_counter() - t0
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return _write_files(report, out, quiet)


def rederive(out: str, cpu: dict | None = None) -> dict:
    """Recomputes every number of the bench report in ``out`` from its per-response records
    with this version's code (per-set summaries, iteration costs, averages, intervals) and
    writes bench.json / .md / .png again: for a report written before a metric existed. What
    the run recorded (command, environment, load, wall time, memory, every response) is kept,
    its paths written as :func:`_portable` writes them;
    ``cpu``: a :func:`reporting.cpu_info` record to add where the run recorded none (the caller
    vouches that it is the run's machine). ``rederived`` in the report says when and how."""
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    st = report["settings"]  # the recorded paths as this version records them (no absolute ones)
    st.update({k: _portable(st[k]) for k in ("target", "drafter") if isinstance(st.get(k), str)})
    st["prompt_sources"] = {n: _portable(w) for n, w in st.get("prompt_sources", {}).items()}
    for rec in report["datasets"].values():
        summarize_set(rec, len(rec["histogram"]), main_adaptive="verify_lengths" in rec["samples"][0]["dflash"])
    report["average"] = average(report["datasets"])
    if all("adaptive" in r for r in report["datasets"].values()):
        report["average_adaptive"] = average(report["datasets"], "adaptive")
    if cpu is not None and "cpu" not in report:
        report["cpu"] = cpu
    report["rederived"] = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "how": f"dflash_jax.bench.harness.rederive({portable_path(out)!r}"
                                  + (", cpu=reporting.cpu_info())" if cpu is not None else ")")}
    _write_files(report, out, quiet=True)
    return report


def _write_files(report: dict, out: str, quiet: bool = False) -> str:
    """bench.json / .md / .png of ``report`` (process 0 only); returns the table."""
    table = markdown(report)
    if not is_main_process():
        return table
    write_report(report, out, "bench", plot, quiet=True)
    st = report["settings"]
    why = explanation(report)
    again = report.get("rederived")
    write_text(os.path.join(out, "bench.md"),
               f"`{report['command']}` on {report['environment']['device']} "
               f"(jax {report['environment']['jax']}); prompts: --subset {st.get('subset', 'random')}, "
               f"thinking {'on' if st.get('enable_thinking') else 'off'}\n\n{machine_text(report)}"
               + (f" The numbers below were derived again from the run's per-response records on "
                  f"{again['time']} by `{again['how']}` (the timings are the run's"
                  + ("; the CPU was read then, on the run's machine" if "cpu=" in again["how"] else "")
                  + ")." if again else "")
               + f"\n\n{table}\n\n" + (why + "\n\n" if why else "") +
               "tau: per response the mean acceptance length, then the mean over responses; speedup: "
               "mean AR time per output token / mean DFlash time per output token, decode phase only "
               "(docs/method.md section 6); [95% CI]: percentile bootstrap over the responses (seed 0), "
               f"not given where it would rest on fewer than {metrics.MIN_DISTINCT_SAMPLES} responses; "
               "tau pooled: all iterations in one mean (tokens per iteration); end to end: the same "
               "speedup with the prefill included; iteration, AR steps: DFlash decode time per "
               "iteration / AR decode time per token, each pooled over the set's responses.\n")
    if not quiet:
        print(f"wrote {os.path.join(out, 'bench')}.json, .md and .png")
    return table


def main(argv=None) -> dict:
    return command_main("bench", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
