"""Block size: drafters trained at several block sizes, each tested at several inference
block sizes (a matrix), with the same depth, taps and training budget.

    python -m experiments.ablate_block_size               # cpu preset: train {8, 16} x test {4, 8, 16, adaptive}
    python -m experiments.ablate_block_size --preset gpu --target Qwen3-8B-DIR
    experiments.ablate_block_size.run(preset="smoke") -> Table

The paper (docs/method.md section 6) trains 8 and 16 and tests 8 and 16: a drafter trained at 16
generalises to 8 better than one trained at 8 generalises to 16, and 16 -> 16 is best.
The inference block size "adaptive" (not in the paper, which leaves it as future work) drafts
the whole trained block and verifies 4, 8 or the whole block, chosen per iteration from the
drafter's confidence and the device's measured cost of each length
(``generate(verify="adaptive")``).
"""

from __future__ import annotations

import numpy as np

from dflash_jax import figures, metrics
from dflash_jax.verification.adaptive import ADAPTIVE, block_size_arg
from dflash_jax.experiments import framework, paper_numbers as paper
from dflash_jax.reporting import new_figure


def _order(size) -> tuple:
    """Sort key of inference block sizes: the fixed ones ascending, then 'adaptive'."""
    return (size == ADAPTIVE, 0 if size == ADAPTIVE else size)


def cells(settings, train, axes) -> list[dict]:
    return [{"label": {"train_block_size": t, "eval_block_size": e}, "drafter": {"block_size": t},
             "eval_block_size": e} for t in axes["train_block_sizes"] for e in axes["eval_block_sizes"]]


def _matrix(table, key):
    trains = sorted({r["label"]["train_block_size"] for r in table.rows})
    evals = sorted({r["label"]["eval_block_size"] for r in table.rows}, key=_order)
    m = np.full((len(trains), len(evals)), np.nan)
    for r in table.rows:
        m[trains.index(r["label"]["train_block_size"]), evals.index(r["label"]["eval_block_size"])] = r["average"][key]
    return trains, evals, m


def plot(table):

    fig, axes = new_figure(1, 2, figsize=(11, 4))
    for ax, key, name in ((axes[0], "tau", "tau"), (axes[1], "speedup", "speedup, decode (x)")):
        trains, evals, m = _matrix(table, key)
        im = ax.imshow(m, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(evals)), evals)
        ax.set_yticks(range(len(trains)), trains)
        ax.set_xlabel("inference block size")
        ax.set_ylabel("training block size")
        shown = 0  # cells with their interval written under the value
        for i in range(len(trains)):
            for j in range(len(evals)):
                r = next(r for r in table.rows if r["label"] == {"train_block_size": trains[i], "eval_block_size": evals[j]})
                text = metrics.interval_text(m[i, j], r["average"][key + "_ci"]).replace(" [", "\n[")
                shown += "[" in text
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        bbox=dict(boxstyle="round", facecolor="white", alpha=0.7, lw=0))
        fig.colorbar(im, ax=ax)
        counts = [c for c in map(framework.responses_of, table.rows) if c is not None]
        says = (f"[{figures.INTERVAL}]" if shown == len(table.rows) else
                f"[{figures.INTERVAL}] where n >= {metrics.MIN_DISTINCT_SAMPLES}" if shown else
                figures.interval_label(None, min(counts) if counts else None))
        ax.set_title(f"{name} ({table.preset} preset, {says})")
    return fig


def findings(table) -> list[str]:
    out = []
    by = {(r["label"]["train_block_size"], r["label"]["eval_block_size"]): r for r in table.rows}
    trains = sorted({t for t, _ in by})
    evals = sorted({e for _, e in by}, key=_order)
    for e in evals:  # the same test block size, trained differently
        rows = [by[(t, e)] for t in trains if (t, e) in by]
        out += framework.compare(rows, lambda r: f"trained at {r['label']['train_block_size']} (tested at {e})", "tau")
    for t in trains:  # adaptive against the fixed block it drafts
        if (t, ADAPTIVE) in by and (t, t) in by:
            a, f = by[(t, ADAPTIVE)], by[(t, t)]
            verify = np.mean([d["mean_verify_length"] for d in a["datasets"].values()])
            verdict = framework.verdict(a, f, "speedup")
            out.append(f"adaptive verify length (trained at {t}, mean verify length {verify:.1f}): decode speedup "
                       f"{a['average']['speedup']:.2f}x against {f['average']['speedup']:.2f}x verifying the whole "
                       f"block, tau {a['average']['tau']:.2f} against {f['average']['tau']:.2f} ({verdict}); "
                       "a shorter verify caps tau, the question is whether the cheaper iteration pays for it")
    fixed = [e for e in evals if e != ADAPTIVE]
    if len(trains) >= 2 and len(fixed) >= 2:
        small, large = trains[0], trains[-1]
        if (large, small) in by and (small, large) in by:
            a, b = by[(large, small)], by[(small, large)]
            verdict = framework.verdict(a, b)
            out.append(f"cross-generalisation: trained {large} -> tested {small}: tau {a['average']['tau']:.2f}; "
                       f"trained {small} -> tested {large}: tau {b['average']['tau']:.2f} ({verdict}); the paper "
                       f"has the first above the second: "
                       + ("the same direction here" if a["average"]["tau"] > b["average"]["tau"] else
                          "the opposite direction here")
                       + ("" if framework.separated(a, b) else ", but not a finding"))
    out.append("the paper (Qwen3-8B, 8 layers, H200), tau on MATH-500: 16->16 6.33, 16->8 5.09, 8->16 5.02, "
               "8->8 5.21: training at 16 generalises to 8 better than training at 8 generalises to 16")
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_block_size",
    description=__doc__.split("\n\n")[0],
    axes={"train_block_sizes": {"smoke": (8, 16), "cpu": (8, 16), "gpu": (8, 16)},
          "eval_block_sizes": {"smoke": (8, 16), "cpu": (4, 8, 16, ADAPTIVE), "gpu": (8, 16, ADAPTIVE)}},
    axis_help={"train_block_sizes": "training block sizes, one drafter each",
               "eval_block_sizes": "inference block sizes every drafter is tested at ('adaptive': the "
                                   "verify length chosen per iteration among 4, 8 and the trained block)"},
    axis_types={"eval_block_sizes": block_size_arg},
    cells=cells, paper_rows=paper.BLOCK_SIZE, paper_keys=["train_block_size", "eval_block_size"],
    plot=plot, findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``train_block_sizes=(8,)``, ``steps=50``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
