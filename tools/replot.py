"""Draw a result's figure again from the JSON beside it, with today's plotting code: the PNG
only; the JSON, its numbers and the markdown are left as they are.

    python -m dflash_jax.tools.replot results/paper/table1.json results/ablations/ablate_tree/table.json
    python -m dflash_jax.tools.replot --list         # every committed PNG: its JSON, or why it cannot be redrawn

What draws a JSON's figure is found from the JSON itself: an experiments table (``table.json``:
``experiment`` and ``rows``) by the experiment's plot, and its training curves where it has
them; a paper item (``item``) by :data:`experiments.paper.FIGURES`; a calibration record by
``bench.calibration.plot``; any other report by the module its ``command`` ran (``python -m
dflash_jax <command>`` through :data:`dflash_jax.__main__.COMMANDS`, the roofline's model
options to their modules), through :func:`dflash_jax.reporting.report_figure` as when it was
written. A figure whose inputs the JSON does not hold (training_curve's loss curves, reports of
a format the plot no longer reads, PNGs made by hand) is named with the reason and left alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys

# the roofline's model options and the modules that model them
ROOFLINE_MODULES = {"--moe": "roofline_moe", "--hybrid": "roofline_hybrid", "--gemma4": "roofline_gemma4",
                    "--tree": "roofline_tree", "--eagle3": "roofline_eagle3", "--family": "roofline_methods",
                    "--throughput": "roofline_throughput"}


class CannotRedraw(Exception):
    """The JSON does not hold what its figure is drawn from."""


def _module(name: str):
    """A module by the name a command line recorded: ``dflash_jax.bench.X`` of a tool that has
    moved since is ``dflash_jax.tools.X``."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return importlib.import_module("dflash_jax.tools." + name.rsplit(".", 1)[-1])


def report_plot(record: dict):
    """The plot function (report -> figure) of a report, from the command that wrote it."""
    from dflash_jax.__main__ import COMMANDS

    words = (record.get("command") or "").split()
    if "-m" not in words:
        raise CannotRedraw("no command recorded: what drew its figure is unknown")
    i = words.index("-m")
    name, rest = words[i + 1], words[i + 2:]
    if name == "dflash_jax":
        if not rest or rest[0] not in COMMANDS:
            raise CannotRedraw(f"unknown command in {record['command']!r}")
        name, rest = COMMANDS[rest[0]][0], rest[1:]
    if name.endswith(".roofline"):
        name = ("dflash_jax.tools.roofline_hybrid_tree" if "--hybrid" in rest and "--tree" in rest  # trees on a hybrid
                else next((f"dflash_jax.tools.{m}" for flag, m in ROOFLINE_MODULES.items() if flag in rest), name))
    module = _module(name)
    if name.endswith("gpu_compile"):
        return module.plot_rows if "--engine" in rest else module.plot_before_after
    if not hasattr(module, "plot"):
        raise CannotRedraw(f"{name} draws no figure")
    return module.plot


def figures_of(path: str) -> list[tuple[str, object]]:
    """``[(png path, figure)]`` drawn from the JSON at ``path``, finished as its writer finishes
    them; raises :class:`CannotRedraw` where the JSON does not hold their inputs."""
    from dflash_jax.reporting import report_figure

    with open(path) as f:
        record = json.load(f)
    here, stem = os.path.dirname(path), os.path.splitext(path)[0]
    if not isinstance(record, dict):
        raise CannotRedraw("not a report")
    if "experiment" in record and "rows" in record:  # an experiments table
        from dflash_jax.experiments import framework

        module = importlib.import_module(f"dflash_jax.experiments.{record['experiment']}")
        experiment = getattr(module, "EXPERIMENT", None)
        if experiment is None:  # the tree and budget ablations plot their table as a dict
            return [(os.path.join(here, "plot.png"), module.plot(record))]
        table = framework.Table(experiment, record["preset"], record["settings"], record["budget"], record["rows"],
                                record["command"], record["environment"], record["minutes"])
        out = [(os.path.join(here, "plot.png"), table.plot())]
        if framework.training_curves(table.rows):
            out.append((os.path.join(here, framework.CURVES_PLOT), framework.plot_curves(table)))
        return out
    if "item" in record:  # a paper item
        from dflash_jax.experiments import paper

        if record["item"] not in paper.FIGURES:
            raise CannotRedraw(f"{record['item']}'s figure is drawn from the runs' metrics, which its JSON "
                               "does not keep (run the item again)")
        return [(stem + ".png", paper.item_figure(record))]
    if record.get("benchmark") == "calibration":
        from dflash_jax.bench import calibration

        return [(stem + ".png", calibration.plot(record))]
    plot = report_plot(record)
    try:
        return [(stem + ".png", report_figure(record, plot))]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise CannotRedraw(f"its plot does not read this report's format ({type(e).__name__}: {e})") from e


def committed_figures(root: str = ".") -> list[tuple[str, str | None]]:
    """Every PNG that git tracks under ``results/`` (outside a git checkout, every one there)
    with the JSON it is drawn from (beside it, same stem; ``table.json`` for an experiment's
    ``plot.png`` and ``curves.png``), or None."""
    try:
        pngs = subprocess.run(["git", "ls-files", "results/*.png"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # a copy without git (a scratch tree, an archive)
        pngs = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(os.path.join(root, "results"))
                      for f in files if f.endswith(".png"))
    out = []
    for png in pngs:
        here, name = os.path.split(png)
        source = os.path.join(here, "table.json") if name in ("plot.png", "curves.png") else png[:-4] + ".json"
        out.append((png, source if os.path.exists(os.path.join(root, source)) else None))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_jax.tools.replot", description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="*", help="result JSON files whose figures to draw again")
    p.add_argument("--list", action="store_true", help="every committed PNG: its JSON, or why it cannot be redrawn")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dflash_jax.reporting import save_figure

    if args.list:
        for png, source in committed_figures():
            why = "no JSON beside it" if source is None else None
            if source is not None:
                try:
                    drawn = figures_of(source)
                    for _, fig in drawn:
                        plt.close(fig)
                    if png not in [d for d, _ in drawn]:
                        why = f"{source} draws other figures"
                except CannotRedraw as e:
                    why = str(e)
            print(f"{png}: " + (f"from {source}" if why is None else f"cannot redraw: {why}"))
        return 0
    status = 0
    for path in args.json:
        try:
            drawn = figures_of(path)
        except CannotRedraw as e:
            print(f"{path}: cannot redraw: {e}", file=sys.stderr)
            status = 1
            continue
        for png, fig in drawn:
            save_figure(fig, png)
            print(f"wrote {png}")
    return status


if __name__ == "__main__":
    sys.exit(main())
