"""Loss decay: the position-decayed loss weights ``exp(-(k-1)/gamma)`` (the paper's gamma for
the block size: 7 for 16) vs uniform weights, the same drafter, data, anchors and steps.

    python -m experiments.ablate_loss_decay                # cpu preset, embedded target
    python -m experiments.ablate_loss_decay --preset gpu --target Qwen3-8B-DIR
    experiments.ablate_loss_decay.run(preset="smoke") -> Table

A trainer setting (``TrainConfig.uniform_weights``); only the weights differ between the two
cells (tests/training/test_training.py checks it). The paper motivates the decay (a block is accepted
up to its first wrong draft, so the early positions matter most); the paper reports no numbers
for it, so the table has none beside ours.
"""

from __future__ import annotations

from dflash_jax.experiments import framework, paper_numbers as paper


def cells(settings, train, axes) -> list[dict]:
    bad = [w for w in axes["weightings"] if w not in ("decay", "uniform")]
    if bad:
        raise ValueError(f"unknown loss weighting {bad[0]!r}; choose from decay, uniform")
    return [{"label": {"loss_weights": w}, "train": {"uniform_weights": w == "uniform"}} for w in axes["weightings"]]


def findings(table) -> list[str]:
    by = {r["label"]["loss_weights"]: r for r in table.rows}
    name = lambda r: f"{r['label']['loss_weights']} weights"
    rows = [by[w] for w in ("decay", "uniform") if w in by]
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    if len(rows) == 2:
        out.append(framework.paper_direction(by["decay"], by["uniform"], name,
                                             "the decay is the recipe's choice; no numbers in the paper"))
        pa, pb = (by[w]["datasets"] for w in ("decay", "uniform"))
        first = {w: by[w]["datasets"][next(iter(pa))]["position_acceptance"] for w in ("decay", "uniform")}
        out.append("per-position acceptance, first prompt set, positions 1 / 4 / last: "
                   + "; ".join(f"{w} " + " / ".join(f"{p[i]:.2f}" for i in (0, min(3, len(p) - 1), len(p) - 1))
                               for w, p in first.items()))
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_loss_decay",
    description=__doc__.split("\n\n")[0],
    axes={"weightings": {"smoke": ("decay", "uniform"), "cpu": ("decay", "uniform"), "gpu": ("decay", "uniform")}},
    axis_help={"weightings": "decay and/or uniform, one drafter each"},
    cells=cells, paper_rows=paper.LOSS_DECAY, paper_keys=["loss_weights"], plot=framework.plot_beside_paper,
    findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``steps=50``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
