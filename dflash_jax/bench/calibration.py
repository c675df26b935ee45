"""How well a drafter's confidence predicts acceptance: what the adaptive verify length reads
(``proposers.base.Proposal.logp``, a log-probability that the target accepts each drafted row)
against what the target then accepts, on real decoding.

A greedy decode of the prompts records, per iteration, each drafted row's predicted chance
p_k = exp(logp_k) and the acceptance length a. Row k (0-based) was *reached* when every draft
before it was accepted (k <= a - 1); among reached rows the outcome is y_k = 1 when row k was
accepted (k < a - 1), else 0. That is the conditional event the adaptive verify multiplies
along the block (``verification.adaptive.expected_tokens``). The report per drafter:

- ``brier``: mean (p - y)^2 over reached rows (0 is perfect; a constant predictor at the base rate
  scores base * (1 - base), given as ``brier_base_rate``), overall and per block row;
- ``reliability``: per bin of p (10 equal bins), the mean p and the observed acceptance rate;
- ``mean_p`` and ``acceptance_rate``: calibration in the large.

- ``brier_ci`` and ``skill`` (1 - brier / brier_base_rate: above 0 beats the base rate) with
  ``skill_ci``: 95 % bootstrap intervals over prompts (the rows of one prompt are not
  independent).

DSpark's confidence is its confidence head (``docs/dspark.md``); DFlash's is the greedy draft's
log-probability under the drafter, the heuristic the adaptive verify reads for it. A DSpark
drafter is measured both ways (``--heuristic-too``, on by default): its head, and the heuristic
a drafter without one gets (``DSparkProposer.use_confidence_head``), on the same drafts and
rows, so their Brier scores compare paired (``paired``: the difference with its interval). The
last iteration of each prompt is left out (the budget may cut its verify short).

    python -m dflash_jax.bench.calibration --target embedded --drafter dflash=DIR --drafter dspark=DIR --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Sequence

import numpy as np

BINS = 10
RESAMPLES = 2000


def record(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int | None = None,
           **proposer_fields):
    """(p float[n], y float[n], row int[n], prompt int[n]) over every reached drafted row of a
    greedy decode of ``prompts`` (one batch) with ``drafter`` (module docstring);
    ``proposer_fields`` replace fields of the method's proposer (e.g. DSpark's
    ``use_confidence_head``)."""
    import jax

    import dflash_jax as dj
    from dflash_jax import methods
    from dflash_jax.decoding.prepare import GenerateOptions

    method = methods.method_of(drafter)
    bs = block_size or method.default_block_size(drafter)
    base = method.proposer(drafter, bs, GenerateOptions(block_size=bs), True)
    seen = []

    @dataclasses.dataclass(frozen=True, eq=False)
    class Recording(type(base)):
        __eq__ = object.__eq__
        __hash__ = object.__hash__

        def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
            proposal, new_state = super().propose(spec, tparams, params, state, committed, key, True)
            jax.debug.callback(lambda x: seen.append(np.asarray(x, np.float64)), proposal.logp, ordered=True)
            return proposal if want_logp else proposal._replace(logp=None), new_state

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    unknown = set(proposer_fields) - set(fields)
    if unknown:
        raise TypeError(f"{type(base).__name__} has no fields {sorted(unknown)}")
    proposer = Recording(**(fields | proposer_fields))
    res = dj.generate(target, [list(p) for p in prompts], max_new_tokens, drafter=drafter, block_size=bs,
                      proposer=proposer)
    p, y, row, prompt = [], [], [], []
    for b, lengths in enumerate(res.acceptance_lengths):
        for i, a in enumerate(lengths[:-1]):  # the last: possibly cut by the budget
            probs = np.exp(seen[i][b])
            for k in range(min(a, len(probs))):  # reached rows: 0 .. a - 1
                p.append(probs[k])
                y.append(1.0 if k < a - 1 else 0.0)
                row.append(k)
                prompt.append(b)
    return np.array(p), np.array(y), np.array(row, int), np.array(prompt, int)


def _bootstrap(prompt: np.ndarray, stat, seed: int = 0) -> list[float]:
    """The 95 % percentile interval of ``stat(selected rows)`` over prompts resampled with
    replacement (``RESAMPLES`` times)."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(prompt == q) for q in np.unique(prompt)]
    values = []
    for _ in range(RESAMPLES):
        pick = np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])
        v = stat(pick)
        if np.isfinite(v):
            values.append(v)
    if not values:  # e.g. the skill where every resample has one outcome only
        return [float("nan"), float("nan")]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def _skill(p, y) -> float:
    base = y.mean()
    return 1.0 - float(((p - y) ** 2).mean()) / (base * (1 - base)) if 0 < base < 1 else float("nan")


def summary(p: np.ndarray, y: np.ndarray, row: np.ndarray, prompt: np.ndarray | None = None) -> dict:
    """The module docstring's numbers of recorded (p, y, row), with the intervals when the rows'
    ``prompt`` is given."""
    if not len(p):
        raise ValueError("no drafted row was reached: decode longer or more prompts")
    base = float(y.mean())
    edges = np.linspace(0.0, 1.0, BINS + 1)
    which = np.clip(np.digitize(p, edges) - 1, 0, BINS - 1)
    reliability = [{"bin": [float(edges[i]), float(edges[i + 1])], "rows": int((which == i).sum()),
                    "mean_p": float(p[which == i].mean()), "accepted": float(y[which == i].mean())}
                   for i in range(BINS) if (which == i).any()]
    per_row = [{"row": int(k), "rows": int((row == k).sum()), "brier": float(((p - y) ** 2)[row == k].mean()),
                "mean_p": float(p[row == k].mean()), "accepted": float(y[row == k].mean())}
               for k in sorted(set(row.tolist()))]
    out = {"rows": int(len(p)), "brier": float(((p - y) ** 2).mean()), "brier_base_rate": base * (1 - base),
           "skill": _skill(p, y), "mean_p": float(p.mean()), "acceptance_rate": base, "reliability": reliability,
           "per_row": per_row}
    if prompt is not None:
        out["prompts"] = int(len(np.unique(prompt)))
        out["brier_ci"] = _bootstrap(prompt, lambda i: float(((p[i] - y[i]) ** 2).mean()))
        out["skill_ci"] = _bootstrap(prompt, lambda i: _skill(p[i], y[i]))
    return out


def paired(a, b) -> dict:
    """Brier(a) - Brier(b) with its 95 % bootstrap interval over prompts, for two predictors
    recorded on the same rows (``record``'s tuples of one decode's drafts)."""
    (pa, y, row, prompt), (pb, yb, rowb, promptb) = a, b
    if not (np.array_equal(y, yb) and np.array_equal(row, rowb) and np.array_equal(prompt, promptb)):
        raise ValueError("paired: the two records are not of the same rows")
    diff = (pa - y) ** 2 - (pb - y) ** 2
    return {"brier_difference": float(diff.mean()), "ci": _bootstrap(prompt, lambda i: float(diff[i].mean()))}


def plot(report: dict):
    """The reliability diagram (mean predicted chance vs observed acceptance per bin, the
    diagonal perfect) and the Brier score per block row, one line per predictor; each
    predictor's Brier with its 95 % interval in the legend where it has one (the title says
    so only then). No busy-machine mark: nothing here is timed."""
    from dflash_jax import figures, metrics
    from dflash_jax.reporting import new_figure

    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 4.5))
    ax1.plot([0, 1], [0, 1], color="0.6", linestyle=":", label="perfectly calibrated")
    with_ci = 0
    for name, s in report["drafters"].items():
        bins = s["reliability"]
        brier = metrics.interval_text(s["brier"], s.get("brier_ci"), digits=3)
        with_ci += "[" in brier
        ax1.plot([b["mean_p"] for b in bins], [b["accepted"] for b in bins], marker="o", label=f"{name}: Brier {brier}")
        ax2.plot([r["row"] + 1 for r in s["per_row"]], [r["brier"] for r in s["per_row"]], marker="o", label=name)
    ax1.set_xlabel("predicted chance the row is accepted (bin mean)")
    ax1.set_ylabel("observed acceptance")
    says = (f"legend: Brier [{figures.INTERVAL}]" if with_ci == len(report["drafters"]) else
            f"legend: Brier [{figures.INTERVAL}] where there is one" if with_ci else "Brier, no interval")
    ax1.set_title(f"reliability, {report['dataset']} x {report['prompts']} prompts ({says})")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("block row (draft k)")
    ax2.set_ylabel("Brier score (no interval)")
    ax2.set_title("Brier per block row (lower is better)")
    ax2.legend(fontsize=7)
    return figures.finish(fig)


def main(argv=None) -> dict:
    from dflash_jax.bench.prompt_sets import load_prompt_set
    from dflash_jax.files import write_json
    from dflash_jax.prompts import encode_prompt
    from dflash_jax.reporting import environment, machine_fields, portable_path, save_figure, start_measurement

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--drafter", action="append", required=True,
                    help="a drafter, as LABEL=CHECKPOINT or CHECKPOINT (repeat to compare several)")
    ap.add_argument("--no-heuristic", dest="heuristic_too", action="store_false",
                    help="measure a DSpark drafter's confidence head only (not also the heuristic on its drafts)")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--max-samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True, help="the directory for calibration.json and calibration.png")
    args = ap.parse_args(argv)
    if args.max_samples < 2 or args.max_new_tokens < 2:
        raise SystemExit("--max-samples must be >= 2 (the intervals resample prompts) and --max-new-tokens >= 2")
    named = [d.split("=", 1) if "=" in d else [d, d] for d in args.drafter]
    if len({n for n, _ in named}) != len(named):
        raise SystemExit(f"--drafter: two drafters have the same label ({', '.join(n for n, _ in named)}); "
                         "name them LABEL=CHECKPOINT")
    import dflash_jax as dj
    from dflash_jax import methods

    target = dj.load_target(args.target)
    prompts = [encode_prompt(s.turns[0], target.tokenizer)
               for s in load_prompt_set(args.dataset, max_samples=args.max_samples)]
    load_before, cpu, warning = start_measurement()
    report = {"benchmark": "calibration", "dataset": args.dataset, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "drafters": {}, "env": environment(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    report["paired"] = {}
    for name, path in named:
        drafter = dj.load_drafter(path, target)
        runs = {name: record(target, drafter, prompts, args.max_new_tokens)}
        if (args.heuristic_too and methods.method_of(drafter).name == "dspark"
                and drafter.config.enable_confidence_head):
            runs[f"{name} (heuristic)"] = record(target, drafter, prompts, args.max_new_tokens,
                                                 use_confidence_head=False)
            report["paired"][f"{name} - {name} (heuristic)"] = paired(*runs.values())
        for label, rec in runs.items():
            s = report["drafters"][label] = summary(*rec) | {"checkpoint": portable_path(path)}
            print(f"{label}: Brier {s['brier']:.4f} {s['brier_ci']} (base rate {s['brier_base_rate']:.4f}, skill "
                  f"{s['skill']:.3f} {s['skill_ci']}) over {s['rows']} rows; mean p {s['mean_p']:.3f}, "
                  f"accepted {s['acceptance_rate']:.3f}")
    for label, d in report["paired"].items():
        print(f"{label}: Brier difference {d['brier_difference']:+.4f}, 95% CI {d['ci']}")
    report["machine"] = machine_fields(cpu, load_before, warning)  # the numbers do not depend on it
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "calibration.json"), report)
    save_figure(plot(report), os.path.join(args.out, "calibration.png"))
    return report


if __name__ == "__main__":
    main()
