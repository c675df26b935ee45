"""Conditioning: how the target's features reach the drafter. ``kv`` (the paper's KV injection
into every drafter layer), ``input`` (the projected features enter only as input rows of the
first layer and pass through the layers: the paper's "input fusion"), ``none`` (no target
features: the paper's no-context row); the same depth, block size, taps and training budget.

    python -m experiments.ablate_conditioning              # cpu preset, embedded target
    python -m experiments.ablate_conditioning --preset gpu --target Qwen3-8B-DIR
    experiments.ablate_conditioning.run(preset="smoke") -> Table

The drafter field is ``DrafterConfig.conditioning`` (``dflash_config.conditioning`` in its
config.json; ``kv`` writes nothing new). The paper: injection beats input fusion (Qwen3-4B,
tau 4.2 / 4.0 / 3.0 vs 3.5 / 3.5 / 2.6 on GSM8K / HumanEval / MT-Bench), and a drafter
without target features still drafts (GSM8K tau 3.38, MATH-500 4.61, Qwen3-8B) but below
the conditioned ones.
"""

from __future__ import annotations

from dflash_jax.experiments import framework, paper_numbers as paper

ORDER = ("kv", "input", "none")


def cells(settings, train, axes) -> list[dict]:
    return [{"label": {"conditioning": c}, "drafter": {"conditioning": c}} for c in axes["conditionings"]]


def findings(table) -> list[str]:
    rows = sorted(table.rows, key=lambda r: ORDER.index(r["label"]["conditioning"]))
    by = {r["label"]["conditioning"]: r for r in rows}
    name = lambda r: r["label"]["conditioning"]
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    if "kv" in by and "input" in by:
        out.append(framework.paper_direction(by["kv"], by["input"], name,
                                             "KV injection above input fusion on every set, Qwen3-4B"))
    if "kv" in by and "none" in by:
        out.append(framework.paper_direction(by["kv"], by["none"], name,
                                             "target features help: the no-context drafter is the weakest"))
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_conditioning",
    description=__doc__.split("\n\n")[0],
    axes={"conditionings": {"smoke": ORDER, "cpu": ORDER, "gpu": ORDER}},
    axis_help={"conditionings": "kv, input and/or none, one drafter each"},
    cells=cells, paper_rows=paper.CONDITIONING, paper_keys=["conditioning"], plot=framework.plot_beside_paper,
    findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``conditionings=("kv", "none")``, ``steps=50``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
