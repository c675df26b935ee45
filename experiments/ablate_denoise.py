"""Denoising steps: one trained drafter drafting with 1, 2 or 4 forward passes per block
(beyond the paper, its future work); inference only.

    python -m experiments.ablate_denoise                   # cpu preset, embedded target
    experiments.ablate_denoise.run(preset="smoke") -> Table

With ``num_denoise_steps`` s > 1 the drafter runs s passes over the block: after each pass
the most confident masked positions are filled in and the rest stay masked (``dflash_jax``
``generate(num_denoise_steps=...)``). More passes may draft better but each costs a drafter
forward, so the speedup weighs tau against the draft time (the draft ms column). Every cell
shares the drafter (trained once, the depth ablation's 1-layer cell under the cpu preset).
"""

from __future__ import annotations

from dflash_jax.experiments import framework, paper_numbers as paper


def cells(settings, train, axes) -> list[dict]:
    return [{"label": {"denoise_steps": d}, "evaluation": {"num_denoise_steps": d}} for d in axes["denoise_steps"]]


def findings(table) -> list[str]:
    rows = sorted(table.rows, key=lambda r: r["label"]["denoise_steps"])
    name = lambda r: f"{r['label']['denoise_steps']} pass(es)"
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    out.append("the paper drafts in one pass and leaves multi-step denoising to future work: no numbers to "
               "compare with")
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_denoise",
    description=__doc__.split("\n\n")[0],
    axes={"denoise_steps": {"smoke": (1, 2), "cpu": (1, 2, 4), "gpu": (1, 2, 4)}},
    axis_help={"denoise_steps": "drafter passes per draft, one evaluation each (one drafter)"},
    cells=cells, paper_rows=paper.DENOISE, paper_keys=["denoise_steps"], plot=framework.plot_beside_paper,
    findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``denoise_steps=(1, 2)``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
