"""Target taps: drafters reading 1, 2 or 3 target layers (the paper: 3 vs 5 taps), the same
depth, block size and training budget.

    python -m experiments.ablate_taps                      # cpu preset: 1, 2, 3 taps of the 4-layer embedded target
    python -m experiments.ablate_taps --preset gpu --target Qwen3-8B-DIR    # the paper's 3 vs 5
    experiments.ablate_taps.run(preset="smoke") -> Table

Which layers: docs/method.md section 2's formula spread to k taps, ``ids[j] = round(1 + j (N - 4) / (k - 1))``
(``[N // 2]`` for one tap), when the target is deep enough for k distinct ids (N - 3 >= k);
on a shallower target (the embedded one has N = 4, where the formula's range 1..N-3 is the
single layer 1) the k taps are spread the same way over layers 1..N-1: 1 tap [2] (the
formula's), 2 taps [1, 3], 3 taps [1, 2, 3] (the cpu preset's taps, so that cell is the depth
ablation's 1-layer drafter, reused). The paper (3-layer drafters, Qwen3-8B): 5 taps beat 3 on
every set.
"""

from __future__ import annotations

from dflash_jax.experiments import framework, paper_numbers as paper
from dflash_jax.config import TargetConfig


def spread_taps(num_target_layers: int, k: int) -> tuple[int, ...]:
    """k target layer ids (module docstring): the default formula (docs/method.md section 2), or spread over 1..N-1 when the
    target is too shallow for k distinct ids. A ValueError when it has fewer than k layers."""
    n = num_target_layers
    if k < 1 or (k > 1 and k > n - 1):
        raise ValueError(f"{k} taps need k >= 1 and a target of at least {k + 1} layers (tapping layers "
                         f"1..N-1); this one has {n}")
    if k == 1:
        return (n // 2,)
    last = n - 3 if n - 3 >= k else n - 1
    return tuple(int(round(1 + j * (last - 1) / (k - 1))) for j in range(k))


def cells(settings, train, axes) -> list[dict]:

    n = TargetConfig.from_pretrained(framework.checkpoint_dir(settings.target)).num_layers
    out = []
    for k in axes["num_taps"]:
        taps = spread_taps(n, k)
        out.append({"label": {"num_taps": k, "layers": ",".join(map(str, taps))}, "drafter": {"taps": taps}})
    return out


def findings(table) -> list[str]:
    rows = sorted(table.rows, key=lambda r: r["label"]["num_taps"])
    name = lambda r: f"{r['label']['num_taps']} tap(s) [{r['label']['layers']}]"
    out = framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
    out.append("the paper (3-layer drafters, Qwen3-8B): 3 taps 5.38 / 4.47 / 3.07 vs 5 taps 5.64 / 4.61 / 3.18 "
               "tau on MATH-500 / HumanEval / MT-Bench: more taps draft better")
    if len(rows) >= 2:
        out.append(framework.paper_direction(rows[-1], rows[0], name, "more taps, higher tau"))
    return out


EXPERIMENT = framework.Experiment(
    name="ablate_taps",
    description=__doc__.split("\n\n")[0],
    axes={"num_taps": {"smoke": (1, 3), "cpu": (1, 2, 3), "gpu": (3, 5)}},
    axis_help={"num_taps": "numbers of target layers tapped, one drafter each (which layers: the module doc)"},
    cells=cells, paper_rows=paper.TAPS, paper_keys=["num_taps"], plot=framework.plot_beside_paper,
    findings=findings)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``num_taps=(1, 3)``, ``steps=50``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
