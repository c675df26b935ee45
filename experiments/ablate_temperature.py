"""Temperature: one trained drafter at T = 0 (greedy) and T = 1 (lossless rejection sampling),
with the greedy draft the paper uses and, at T > 0, with drafts sampled from the drafter's
distribution; inference only.

    python -m experiments.ablate_temperature               # cpu preset, embedded target
    experiments.ablate_temperature.run(preset="smoke") -> Table

At T > 0 AR and DFlash both sample (the same seed, different random streams), so the
outputs differ while following the same distribution (tests/test_speculative.py checks the
distribution). The paper's Table 1 (Qwen3-8B): tau 6.49 / speedup 4.86x on average at T = 0,
5.48 / 4.03x at T = 1.
"""

from __future__ import annotations

from dflash_jax.experiments import framework, paper_numbers as paper


def cells(settings, train, axes) -> list[dict]:
    out = []
    for t in axes["temperatures"]:
        for draft in (("greedy",) if t == 0 else ("greedy", "sampled")):
            out.append({"label": {"temperature": float(t), "draft": draft},
                        "evaluation": {"temperature": float(t), "sampled_draft": draft == "sampled"}})
    return out


def findings(table) -> list[str]:
    rows = sorted(table.rows, key=lambda r: (r["label"]["temperature"], r["label"]["draft"]))
    name = lambda r: f"T={r['label']['temperature']:g} ({r['label']['draft']} draft)"
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    greedy = [r for r in rows if r["label"]["draft"] == "greedy"]
    if len(greedy) >= 2:
        out.append(framework.paper_direction(greedy[0], greedy[-1], name,
                                             "tau falls from T = 0 to T = 1, 6.49 -> 5.48 on average"))
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_temperature",
    description=__doc__.split("\n\n")[0],
    axes={"temperatures": {"smoke": (0.0, 1.0), "cpu": (0.0, 1.0), "gpu": (0.0, 1.0)}},
    axis_help={"temperatures": "evaluation temperatures (greedy draft at each; also a sampled draft when T > 0)"},
    cells=cells, paper_rows=paper.TEMPERATURE, paper_keys=["temperature", "draft"], plot=framework.plot_beside_paper,
    findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``temperatures=(0.0, 1.0)``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
