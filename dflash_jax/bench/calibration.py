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

DSpark's confidence is its confidence head (``docs/dspark.md``); DFlash's is the greedy draft's
log-probability under the drafter, the heuristic the adaptive verify reads for it. The last
iteration of each prompt is left out (the budget may cut its verify short).

    python -m dflash_jax.bench.calibration --target embedded --drafter embedded --drafter DIR --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Sequence

import numpy as np

BINS = 10


def record(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int | None = None):
    """(p float[n], y float[n], row int[n]) over every reached drafted row of a greedy decode of
    ``prompts`` (one batch) with ``drafter`` (module docstring)."""
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

    proposer = Recording(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init})
    res = dj.generate(target, [list(p) for p in prompts], max_new_tokens, drafter=drafter, block_size=bs,
                      proposer=proposer)
    p, y, row = [], [], []
    for b, lengths in enumerate(res.acceptance_lengths):
        for i, a in enumerate(lengths[:-1]):  # the last: possibly cut by the budget
            probs = np.exp(seen[i][b])
            for k in range(min(a, len(probs))):  # reached rows: 0 .. a - 1
                p.append(probs[k])
                y.append(1.0 if k < a - 1 else 0.0)
                row.append(k)
    return np.array(p), np.array(y), np.array(row, int)


def summary(p: np.ndarray, y: np.ndarray, row: np.ndarray) -> dict:
    """The module docstring's numbers of recorded (p, y, row)."""
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
    return {"rows": int(len(p)), "brier": float(((p - y) ** 2).mean()), "brier_base_rate": base * (1 - base),
            "mean_p": float(p.mean()), "acceptance_rate": base, "reliability": reliability, "per_row": per_row}


def main(argv=None) -> dict:
    from dflash_jax.bench.prompt_sets import load_prompt_set
    from dflash_jax.files import write_json
    from dflash_jax.prompts import encode_prompt
    from dflash_jax.reporting import environment

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--drafter", action="append", required=True, help="a drafter (repeat to compare several)")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--max-samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True, help="the directory for calibration.json")
    args = ap.parse_args(argv)
    if args.max_samples < 1 or args.max_new_tokens < 2:
        raise SystemExit("--max-samples must be >= 1 and --max-new-tokens >= 2")
    import dflash_jax as dj

    target = dj.load_target(args.target)
    prompts = [encode_prompt(s.turns[0], target.tokenizer)
               for s in load_prompt_set(args.dataset, max_samples=args.max_samples)]
    report = {"benchmark": "calibration", "dataset": args.dataset, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "drafters": {}, "env": environment(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name in args.drafter:
        drafter = dj.load_drafter(name, target)
        report["drafters"][name] = summary(*record(target, drafter, prompts, args.max_new_tokens))
        s = report["drafters"][name]
        print(f"{name}: Brier {s['brier']:.4f} (base rate {s['brier_base_rate']:.4f}) over {s['rows']} rows; "
              f"mean p {s['mean_p']:.3f}, accepted {s['acceptance_rate']:.3f}")
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "calibration.json"), report)
    return report


if __name__ == "__main__":
    main()
