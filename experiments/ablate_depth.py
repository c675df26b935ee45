"""Drafter depth: drafters of several depths, the same block size, taps and training budget,
each measured against autoregressive decoding on the same prompts.

    python -m experiments.ablate_depth                     # cpu preset: 1, 2, 3 layers, embedded target
    python -m experiments.ablate_depth --preset gpu --target Qwen3-8B-DIR   # the paper's 3, 5, 8
    experiments.ablate_depth.run(preset="smoke") -> Table

The paper's finding (docs/method.md section 6): a deeper drafter drafts better (tau rises with depth)
but costs more per draft, so the speedup peaks at a middle depth.
"""

from __future__ import annotations

import numpy as np

from dflash_jax import figures
from dflash_jax.experiments import framework, paper_numbers as paper
from dflash_jax.reporting import new_figure


def cells(settings, train, axes) -> list[dict]:
    return [{"label": {"layers": n}, "drafter": {"layers": n}} for n in axes["depths"]]


def plot(table):

    rows = table.rows
    x = [r["label"]["layers"] for r in rows]
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 4))
    counts = [c for c in map(framework.responses_of, rows) if c is not None]
    for ax, key, name in ((ax1, "tau", "tau"), (ax2, "speedup", "speedup, decode (x)")):
        v = np.array([r["average"][key] for r in rows])
        err = figures.interval_errors(v, [r["average"][key + "_ci"] for r in rows])
        ax.errorbar(x, v, yerr=err, marker="o", capsize=4,
                    label=f"here ({table.preset} preset, {figures.interval_label(err, min(counts) if counts else None)})")
        ax.set_xlabel("drafter layers")
        ax.set_ylabel(name)
        ax.set_xticks(x)
    ax1.set_title(f"tau vs depth ({table.preset} preset on {table.environment['device']})")
    draft = [r["draft_ms"] for r in rows]
    if all(d is not None for d in draft):
        twin = ax2.twinx()
        twin.plot(x, draft, "s--", color="tab:red", label="draft ms / iteration")
        twin.set_ylabel("draft ms / iteration", color="tab:red")
    ax2.set_title("decode-only speedup and draft cost vs depth")
    ax1.legend(fontsize=8)
    return fig


def findings(table) -> list[str]:
    rows = sorted(table.rows, key=lambda r: r["label"]["layers"])
    name = lambda r: f"{r['label']['layers']} layer(s)"
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    draft = [r["draft_ms"] for r in rows]
    if all(d is not None for d in draft):
        out.append("draft cost per iteration: " + ", ".join(f"{name(r)} {r['draft_ms']:.2f} ms" for r in rows)
                   + " (verify " + ", ".join(f"{r['verify_ms']:.2f}" for r in rows) + " ms)")
    out.append("the paper (Qwen3-8B, H200): tau rises with depth on every set (MATH-500 5.64 / 5.99 / 6.33 "
               "for 3 / 5 / 8 layers) while the speedup is flat or falls (4.69 / 4.71 / 4.64x): the trade-off "
               "between drafting better and drafting slower")
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        rises = hi["average"]["tau"] > lo["average"]["tau"]
        sure = framework.separated(lo, hi)
        why = framework.no_interval([lo, hi])
        out.append(f"against the paper's direction: tau {'rises' if rises else 'does not rise'} from {name(lo)} to "
                   f"{name(hi)} here ({lo['average']['tau']:.2f} -> {hi['average']['tau']:.2f}), "
                   + ("agreeing with the paper" if rises and sure else
                      "disagreeing with the paper" if sure else
                      f"{why}: this run neither confirms nor contradicts the paper" if why else
                      "a difference within the 95 % intervals: this budget neither confirms nor contradicts the paper"))
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_depth",
    description=__doc__.split("\n\n")[0],
    axes={"depths": {"smoke": (1, 2), "cpu": (1, 2, 3), "gpu": (3, 5, 8)}},
    axis_help={"depths": "drafter depths (layers), one cell each"},
    cells=cells, paper_rows=paper.DEPTH, paper_keys=["layers"], plot=plot, findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``depths=(1, 2)``, ``steps=50``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
