"""Re-aligning the shipped drafter to a changed target: held-out tau and benchmark tau against
fine-tune steps, on the quantized embedded target and on the embedded target fine-tuned on one
prompt style (docs/quantization.md, "Re-aligning a drafter").

    python -m experiments.realign --work runs/realign --data-dir DIR --out results/quantized/realign

Each branch is the recipe of docs/train-your-drafter.md with the served target in every step:

* ``int8``: the embedded target with its linear layers in int8 (``--quantize int8``);
* ``finetuned``: the embedded target fine-tuned on GSM8K train alone (``build-corpus --sources
  gsm8k_train --tokenizer embedded``, then ``pretrain --init-from embedded``, ``export-target``):
  a target changed enough to move the hidden features the drafter reads.

Per branch: GSM8K-style training prompts (``embedded-prompts --styles gsm8k``, drawn from GSM8K
train), answered by the branch's target (``train-data``); ``train --init-from embedded`` on them
with the held-out tau measured every ``--eval-every`` steps (step 0 is the shipped drafter);
the drafter exported at each of ``--steps`` and benchmarked against the branch's target on the
GSM8K test prompts (``bench``: AR and DFlash on the same prompts, tau per response). The
reference is the shipped pair itself (float32 target) on the same prompts.

Every stage runs ``python -m dflash_jax ...`` in a subprocess and is skipped when its output is
complete, so a killed run resumes (training resumes from its last checkpoint). The GSM8K train
file is needed (``--data-dir``, as for ``embedded-prompts``). The report (``realign.json``,
``README.md``, ``realign.png`` under ``--out``) compares each step's benchmark tau with step 0's,
paired over the same prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from dflash_jax import metrics
from dflash_jax.figures import interval_errors, interval_label
from dflash_jax.files import write_text
from dflash_jax.reporting import command_line, cpu_description, new_figure, write_report
from dflash_jax.training.run_dir import METRICS_FILE, START_EVAL_FILE, held_out_curve, saved_steps, start_tau

BRANCHES = ("int8", "finetuned")
PROMPTS = "prompts.jsonl"
REFERENCE = "reference"


def _run(args: list[str]) -> None:
    print("+ python -m dflash_jax " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "dflash_jax", *args], check=True)


def target_args(work: str, branch: str) -> list[str]:
    """The ``--target`` (and ``--quantize``) options of a branch's target."""
    if branch == "int8":
        return ["--target", "embedded", "--quantize", "int8"]
    if branch == "finetuned":
        return ["--target", os.path.join(work, "finetuned", "target"), "--quantize", "none"]
    return ["--target", "embedded", "--quantize", "none"]  # the reference: the shipped pair


def bench_args(a) -> list[str]:
    return ["--datasets", "gsm8k", "--max-samples", str(a.bench_samples), "--max-new-tokens",
            str(a.max_new_tokens), "--no-adaptive"]


def finetune_target(a, work: str) -> None:
    """The ``finetuned`` branch's target: the embedded one fine-tuned on GSM8K train."""
    d = os.path.join(work, "finetuned")
    if os.path.exists(os.path.join(d, "target", "config.json")):
        return
    if not os.path.exists(os.path.join(d, "corpus", "corpus.json")):
        _run(["build-corpus", "--out", os.path.join(d, "corpus"), "--sources", "gsm8k_train",
              "--tokenizer", "embedded", "--data-dir", a.data_dir])
    _run(["pretrain", "--corpus", os.path.join(d, "corpus"), "--run", os.path.join(d, "pretrain"),
          "--init-from", "embedded", "--steps", str(a.target_steps), "--batch-size", "8",
          "--learning-rate", str(a.target_lr), "--warmup-fraction", "0.05", "--checkpoint-every", "50",
          "--eval-every", "50"])
    _run(["export-target", "--corpus", os.path.join(d, "corpus"), "--run", os.path.join(d, "pretrain"),
          "--out", os.path.join(d, "target")])


def run_branch(a, work: str, branch: str) -> None:
    d = os.path.join(work, branch)
    target = target_args(work, branch)
    bench0 = os.path.join(d, "bench-step0")
    if not os.path.exists(os.path.join(bench0, "bench.json")):
        _run(["bench", *target, "--drafter", "embedded", *bench_args(a), "--out", bench0])
    if not os.path.exists(os.path.join(d, "data", "metadata.json")):
        _run(["train-data", *target, "--prompts", os.path.join(work, PROMPTS), "--out", os.path.join(d, "data"),
              "--max-prompts", str(a.num_prompts), "--max-new-tokens", str(a.max_new_tokens),
              "--max-len", "384", "--batch-size", "32", "--dtype", "float32"])
    run_dir = os.path.join(d, "run")
    for s in a.steps:
        bench = os.path.join(d, f"bench-step{s}")
        if os.path.exists(os.path.join(bench, "bench.json")):
            continue
        have = max(saved_steps(run_dir), default=0)
        if have < s:
            _run(["train", *target, "--init-from", "embedded", "--data", os.path.join(d, "data"), "--run", run_dir,
                  "--steps", str(max(a.steps)), "--stop-after", str(s - have), "--batch-size", "8",
                  "--num-anchors", "32", "--learning-rate", str(a.learning_rate), "--checkpoint-every",
                  str(a.eval_every), "--keep-checkpoints", "2", "--eval-prompts", "16", "--eval-every",
                  str(a.eval_every), "--target-dtype", "float32"])
        drafter = os.path.join(d, f"drafter-step{s}")
        if not os.path.exists(os.path.join(drafter, "config.json")):
            if max(saved_steps(run_dir), default=0) != s:  # export writes the newest checkpoint
                raise RuntimeError(f"{run_dir} is past step {s} but {drafter} was never exported; "
                                   f"remove {bench} and {run_dir} to run this branch again")
            _run(["export", "--run", run_dir, "--out", drafter])
        _run(["bench", *target, "--drafter", drafter, *bench_args(a), "--out", bench])


# ----------------------------------------------------------------------------------- report
def _bench(path: str) -> dict:
    with open(os.path.join(path, "bench.json")) as f:
        return json.load(f)


def _portable(command: str, work: str) -> str:
    """A recorded command with the work directory written as ``WORK`` (no machine's path)."""
    return command.replace(work.rstrip(os.sep) + os.sep, "WORK/").replace(work, "WORK")


def branch_table(work: str, branch: str, steps: list[int]) -> dict:
    """One branch's rows: per step, the bench tau with its interval, its paired difference from
    step 0 (the same prompts), DFlash == AR counts; and the run's held-out tau curve."""
    d = os.path.join(work, branch)
    base = _bench(os.path.join(d, "bench-step0"))
    rows = []
    for s in [0, *steps]:
        b = _bench(os.path.join(d, f"bench-step{s}"))
        try:  # paired over the same prompts, per prompt set
            diff, diff_ci = metrics.paired_tau_change(base, b)["average"]
        except ValueError as e:
            raise ValueError(f"{branch} step {s}: its bench answered other prompts than step 0's ({e}); rerun it "
                             "with the same bench options") from e
        same = sum(x["same_output"] for x in b["datasets"].values())
        turns = sum(x["turns"] for x in b["datasets"].values())
        rows.append({"step": s, "tau": b["average"]["tau"], "tau_ci": b["average"]["tau_ci"],
                     "tau_diff": diff, "tau_diff_ci": diff_ci if s else None,
                     "busy_warning": b["busy_warning"],
                     "same_output": same, "turns": turns, "command": _portable(b["command"], work),
                     "load_average_before": b["load_average_before"]})
    with open(os.path.join(d, "run", METRICS_FILE)) as f:
        metric_rows = [json.loads(line) for line in f if line.strip()]
    curve = [{"step": 0, "tau": start_tau(os.path.join(d, "run"))}] + held_out_curve(metric_rows)
    with open(os.path.join(d, "run", "run.json")) as f:
        run = json.load(f)
    return {"rows": rows, "held_out": curve, "train_settings": run.get("train", run)}


def report(work: str, steps: list[int], branches: list[str]) -> dict:
    ref = _bench(os.path.join(work, REFERENCE, "bench-step0"))
    out = {"reference": {"tau": ref["average"]["tau"], "tau_ci": ref["average"]["tau_ci"],
                         "command": _portable(ref["command"], work)},
           "branches": {b: branch_table(work, b, steps) for b in branches}, "steps": steps}
    out["cpu"] = ref["cpu"]
    out["busy_warning"] = next((r["busy_warning"] for b in out["branches"].values() for r in b["rows"]
                                if r["busy_warning"]), None)
    ft = os.path.join(work, "finetuned", "target", "training.json")
    if "finetuned" in branches and os.path.exists(ft):
        with open(ft) as f:
            facts = json.load(f)
        out["finetuned_target"] = {k: facts[k] for k in ("steps", "tokens_seen", "heldout_loss", "train")}
        start = os.path.join(work, "finetuned", "pretrain", START_EVAL_FILE)
        if os.path.exists(start):  # the held-out loss of the target it started from
            with open(start) as f:
                out["finetuned_target"]["start_heldout_loss"] = json.load(f)["heldout_loss"]
    return out


def _fmt(v, ci) -> str:
    return metrics.interval_text(v, ci) if ci is not None else f"{v:.2f}"


def markdown(rep: dict) -> str:
    r = rep["reference"]
    lines = ["# Re-aligning the shipped drafter to a changed target", "",
             "The shipped embedded drafter fine-tuned (`train --init-from embedded`) on a changed target's own "
             "answers to GSM8K-style training prompts and its features, measured at each step against that "
             "target on GSM8K test prompts (`bench`, tau per response then averaged, 95 % bootstrap intervals; "
             "the difference from step 0 is paired over the same prompts). Held-out tau: the run's own "
             "evaluation on 16 held-out regenerated sequences (one number per step, no interval). Made by "
             "`python -m experiments.realign`.", "",
             f"Reference, the shipped pair (float32 target) on the same prompts: tau {_fmt(r['tau'], r['tau_ci'])}.",
             ""]
    for name, b in rep["branches"].items():
        held = {c["step"]: c["tau"] for c in b["held_out"] if c["tau"] is not None}
        lines += [f"## {name}", "", "| fine-tune steps | bench tau [95% CI] | minus step 0 [95% CI] | held-out tau | "
                  "DFlash == AR |", "|---|---|---|---|---|"]
        for row in b["rows"]:
            diff = "" if row["tau_diff_ci"] is None else _fmt(row["tau_diff"], row["tau_diff_ci"])
            h = f"{held[row['step']]:.2f}" if row["step"] in held else ""
            lines.append(f"| {row['step']} | {_fmt(row['tau'], row['tau_ci'])} | {diff} | {h} | "
                         f"{row['same_output']}/{row['turns']} |")
        lines += ["", f"Last bench command: `{b['rows'][-1]['command']}`.", ""]
    if "finetuned_target" in rep:
        f = rep["finetuned_target"]
        lines += [f"The fine-tuned target: {f['steps']} steps of batch {f['train']['batch_size']} at learning rate "
                  f"{f['train']['learning_rate']} on GSM8K train ({f['tokens_seen']:,} tokens); its held-out GSM8K "
                  f"loss {f['heldout_loss']:.3f}"
                  + (f" (the shipped target's {f['start_heldout_loss']:.3f})" if "start_heldout_loss" in f else "")
                  + ".", ""]
    lines += ["## What the data shows", "", *findings(rep), ""]
    loads = sorted(x["load_average_before"][0] for b in rep["branches"].values() for x in b["rows"])
    lines += [f"Machine: {cpu_description(rep['cpu'])}; 1-minute load average before the bench runs "
              f"{loads[0]:.2f} to {loads[-1]:.2f} (tau does not depend on the load).", ""]
    return "\n".join(lines)


def _apart(a: list, b: list) -> bool:
    """Whether two intervals do not overlap."""
    return a[1] < b[0] or b[1] < a[0]


def findings(rep: dict) -> list[str]:
    """One line per branch, each claim resting on intervals: the start against the reference
    pair (unpaired: the intervals apart or not), the largest paired change from step 0 and
    whether its interval excludes 0, the best step against the reference."""
    ref = rep["reference"]
    out = []
    for name, b in rep["branches"].items():
        rows = b["rows"]
        start, best = rows[0], max(rows[1:], key=lambda r: r["tau_diff"])
        worst = min(rows[1:], key=lambda r: r["tau_diff"])
        gap = (f"the changed target cost the shipped drafter tau ({_fmt(start['tau'], start['tau_ci'])} against the "
               f"reference's {_fmt(ref['tau'], ref['tau_ci'])}: the intervals are apart)"
               if _apart(start["tau_ci"], ref["tau_ci"]) else
               f"the shipped drafter starts within the reference's interval ({_fmt(start['tau'], start['tau_ci'])} "
               f"against {_fmt(ref['tau'], ref['tau_ci'])}): no loss the intervals show")
        lo, hi = best["tau_diff_ci"]
        if lo > 0:
            change = (f"re-aligning won back {_fmt(best['tau_diff'], best['tau_diff_ci'])} by step {best['step']} "
                      f"(interval above 0)")
            change += ("; the re-aligned drafter stays below the reference pair (intervals apart)"
                       if _apart(best["tau_ci"], ref["tau_ci"]) and best["tau"] < ref["tau"] else
                       "; it is then within the reference pair's interval")
        else:
            change = f"no step gained tau the intervals can tell from 0 (best {_fmt(best['tau_diff'], [lo, hi])})"
        if worst["tau_diff_ci"][1] < 0:
            change += (f"; by step {worst['step']} re-aligning had cost tau: "
                       f"{_fmt(worst['tau_diff'], worst['tau_diff_ci'])} (interval below 0)")
        out.append(f"- **{name}**: {gap}; {change}.")
    return out


def plot(rep: dict):
    fig, (a, b) = new_figure(1, 2, figsize=(12, 4.8))
    r = rep["reference"]
    a.axhspan(*r["tau_ci"], color="grey", alpha=0.15)
    a.axhline(r["tau"], color="grey", linestyle=":", label="shipped pair, float32 target (95% CI band)")
    errs, derrs = [], []
    for i, (name, br) in enumerate(rep["branches"].items()):
        xs = np.asarray([row["step"] for row in br["rows"]]) + 8 * i  # side by side, not over each other
        vals = [row["tau"] for row in br["rows"]]
        err = interval_errors(vals, [row["tau_ci"] for row in br["rows"]])
        errs.append(err)
        line = a.errorbar(xs, vals, yerr=err, marker="o", capsize=3, label=f"{name}: bench tau, GSM8K test")
        color = line[0].get_color()
        held = [c for c in br["held_out"] if c["tau"] is not None]
        a.plot([c["step"] for c in held], [c["tau"] for c in held], linestyle="--", marker=".", color=color,
               alpha=0.7, label=f"{name}: held-out tau (no interval)")
        rows = br["rows"][1:]
        dvals = [row["tau_diff"] for row in rows]
        derr = interval_errors(dvals, [row["tau_diff_ci"] for row in rows])
        derrs.append(derr)
        b.errorbar(xs[1:], dvals, yerr=derr, marker="o", capsize=3, color=color, label=name)
    a.set_xlabel("fine-tune steps of the drafter (--init-from embedded)")
    a.set_ylabel(f"tau ({interval_label(errs)})")
    a.set_title("tau against the changed target")
    a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    b.axhline(0, color="black", linewidth=0.8)
    b.set_xlabel("fine-tune steps of the drafter")
    b.set_ylabel(f"bench tau minus step 0's, paired ({interval_label(derrs)})")
    b.set_title("tau won back (or lost) by re-aligning")
    b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return fig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.realign", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="work directory (every stage's output; resumed)")
    p.add_argument("--out", required=True, help="directory for realign.json, README.md and realign.png")
    p.add_argument("--data-dir", default=None, help="the data directory holding gsm8k/train.jsonl")
    p.add_argument("--branches", nargs="+", choices=BRANCHES, default=list(BRANCHES))
    p.add_argument("--steps", nargs="+", type=int, default=[100, 300, 600],
                   help="drafter fine-tune steps to benchmark at (the run's length is the largest)")
    p.add_argument("--eval-every", type=int, default=100, help="held-out tau (and a checkpoint) every N steps")
    p.add_argument("--learning-rate", type=float, default=3e-4, help="the drafter's peak learning rate")
    p.add_argument("--num-prompts", type=int, default=384, help="training prompts each target answers")
    p.add_argument("--max-new-tokens", type=int, default=96, help="for train-data and bench")
    p.add_argument("--bench-samples", type=int, default=16, help="GSM8K test prompts per bench")
    p.add_argument("--target-steps", type=int, default=200, help="fine-tune steps of the finetuned target")
    p.add_argument("--target-lr", type=float, default=1e-3, help="its peak learning rate")
    p.add_argument("--report-only", action="store_true", help="write the report from the work directory")
    return p


def check(a, p) -> None:
    steps = sorted(set(a.steps))
    if steps[0] < 1 or any(s % a.eval_every for s in steps):
        p.error(f"--steps must be positive multiples of --eval-every {a.eval_every} (checkpoints are kept "
                f"there), got {a.steps}")
    a.steps = steps
    for name in ("num_prompts", "max_new_tokens", "bench_samples", "target_steps", "eval_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")


def main(argv=None) -> dict:
    p = parser()
    a = p.parse_args(argv)
    check(a, p)
    work = os.path.abspath(a.work)
    if not a.report_only:
        if not a.data_dir:
            from dflash_jax.embedded.corpus import check_training_data

            a.data_dir = check_training_data(None)  # before anything runs: GSM8K train is needed
        os.makedirs(work, exist_ok=True)
        if not os.path.exists(os.path.join(work, PROMPTS)):
            _run(["embedded-prompts", "--out", os.path.join(work, PROMPTS), "--num", str(a.num_prompts),
                  "--styles", "gsm8k", "--max-prompt-tokens", "256", "--data-dir", a.data_dir])
        ref = os.path.join(work, REFERENCE, "bench-step0")
        if not os.path.exists(os.path.join(ref, "bench.json")):
            _run(["bench", *target_args(work, REFERENCE), "--drafter", "embedded", *bench_args(a), "--out", ref])
        if "finetuned" in a.branches:
            finetune_target(a, work)
        for b in a.branches:
            run_branch(a, work, b)
    rep = report(work, a.steps, a.branches)
    given = sys.argv[1:] if argv is None else list(argv)
    rep["command"] = command_line("dflash_jax.experiments.realign", ["WORK" if x == a.work else x for x in given])
    write_report(rep, a.out, "realign", plot, quiet=True)
    write_text(os.path.join(a.out, "README.md"), markdown(rep))
    print(markdown(rep))
    return rep


if __name__ == "__main__":
    main()
