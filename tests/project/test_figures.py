"""Every kind of figure the project writes says what it is, on its canvas:

(a) every title, label, legend and tick label lies inside the canvas once drawn;
(b) a text that claims an interval ("95% CI", "interval") belongs to an axes that draws one (error
    bars or a band of finite, non-zero extent) or writes its bounds ("[1.20, 1.45]"); a figure
    without intervals says "no interval";
(c) a smoke run's figure says "smoke" and names its preset; a busy machine is marked;
(d) no legend covers a bar.

The figures are drawn by the project's own plot functions from realistic inputs: the committed
results (bench, the experiments' tables, the paper's items) as they are, and altered the way a
smoke run or a two-prompt bench leaves them (no intervals, the smoke preset, a busy machine, a
long CPU name). The checks are written here, not taken from ``dflash_jax.figures``. The slow
test draws every committed PNG again from its JSON (``tools/replot.py``) and checks it the same
way.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.text import Text  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAN = float("nan")


def _load(rel: str) -> dict:
    with open(os.path.join(ROOT, rel)) as f:
        return json.load(f)


# ---------------------------------------------------------------------------- the checks
def _draw(fig):
    """Lays the figure out as the writers do (its own layout engine, else tight_layout), draws it
    on an Agg canvas and returns the renderer."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _shown(t) -> bool:
    return isinstance(t, Text) and t.get_visible() and bool(t.get_text().strip())


def _in_view(ax, label, axis: str) -> bool:
    """Whether a tick label belongs to a tick inside the axis' view (only those are drawn)."""
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    x, y = label.get_position()
    v = x if axis == "x" else y
    return lo - 1e-9 * max(1.0, abs(lo)) <= v <= hi + 1e-9 * max(1.0, abs(hi))


def _figure_texts(fig) -> list:
    """The texts a reader sees: the suptitle and figure texts, figure legends, and per axes its
    titles, axis labels, tick labels in view, texts and legend."""
    out = [t for t in [fig._suptitle, *fig.texts] if _shown(t)]
    for leg in fig.legends:
        out += [t for t in leg.get_texts() if _shown(t)]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [t for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label) if _shown(t)]
        if ax.axison:
            for axis, labels in (("x", ax.get_xticklabels() + ax.get_xticklabels(minor=True)),
                                 ("y", ax.get_yticklabels() + ax.get_yticklabels(minor=True))):
                out += [t for t in labels if _shown(t) and _in_view(ax, t, axis)]
        out += [t for t in ax.texts if _shown(t)]
        if ax.get_legend() is not None:
            out += [t for t in ax.get_legend().get_texts() if _shown(t)]
    return out


def texts_outside_canvas(fig, renderer) -> list[str]:
    """(a): the texts (and legends) whose drawn box leaves the canvas (1 pixel of slack)."""
    box = fig.bbox
    out = []
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for t in _figure_texts(fig) + legends:
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            name = t.get_text() if isinstance(t, Text) else "a legend"
            out.append(f"{name!r} at {np.round(e.extents, 1).tolist()} outside {np.round(box.extents, 1).tolist()}")
    return out


CLAIM = re.compile(r"\bCI\b|interval", re.I)
DENIAL = re.compile(r"\bno (95 ?% )?(interval|CI)\b", re.I)
BOUNDS = re.compile(r"\[\s*-?\d+(\.\d+)?,\s*-?\d+(\.\d+)?\s*\]")


def _finite_extent(points) -> bool:
    p = np.asarray(points, float)
    return p.size > 0 and bool(np.isfinite(p).all()) and float(np.ptp(p.reshape(-1, 2), axis=0).max()) > 0


def draws_intervals(ax) -> bool:
    """An axes draws an interval: an error bar (an errorbar container's bar lines) or a
    fill_between band of finite, non-zero extent, or a text in it that writes the bounds."""
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            for lc in c.lines[2]:
                if isinstance(lc, LineCollection) and any(_finite_extent(s) for s in lc.get_segments()):
                    return True
    for c in ax.collections:
        if isinstance(c, PolyCollection) and not isinstance(c, LineCollection):
            if any(_finite_extent(p.vertices) for p in c.get_paths()):
                return True
    texts = list(ax.texts) + (list(ax.get_legend().get_texts()) if ax.get_legend() is not None else [])
    return any(BOUNDS.search(t.get_text()) for t in texts)


def _claims(texts) -> list[str]:
    return [t.get_text() for t in texts if _shown(t) and CLAIM.search(DENIAL.sub("", t.get_text()))]


def false_interval_claims(fig) -> list[str]:
    """(b): texts that claim an interval where their axes (for the suptitle and figure legends:
    the figure) draws none."""
    out = []
    by_axes = {}
    for ax in fig.axes:
        own = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        if ax.get_legend() is not None:
            own += list(ax.get_legend().get_texts())
        by_axes[ax] = _claims(own)
    # an axes and its twin show one panel: the claim of one may rest on the other's bars
    for ax, claims in by_axes.items():
        panel = [a for a in fig.axes if a is ax or (a.get_position().bounds == ax.get_position().bounds)]
        if claims and not any(draws_intervals(a) for a in panel):
            out += claims
    figure_level = [fig._suptitle, *fig.texts] + [t for leg in fig.legends for t in leg.get_texts()]
    if _claims(figure_level) and not any(draws_intervals(a) for a in fig.axes):
        out += _claims(figure_level)
    return out


def legends_over_bars(fig, renderer) -> list[str]:
    """(d): legends whose box overlaps a bar of finite, non-zero size."""
    bars = [p for ax in fig.axes for c in ax.containers if isinstance(c, BarContainer) for p in c.patches
            if p.get_visible() and np.isfinite([p.get_height(), p.get_width()]).all() and p.get_height() and p.get_width()]
    out = []
    for leg in list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        box = leg.get_window_extent(renderer)
        hit = [p for p in bars if box.overlaps(p.get_window_extent(renderer))]
        if hit:
            out.append(f"legend {[t.get_text() for t in leg.get_texts()]} over {len(hit)} bar(s)")
    return out


def all_text(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(Text) if _shown(t))


def check(fig) -> str:
    """Draws ``fig`` and checks (a), (b) and (d); returns its text for further checks."""
    import matplotlib.pyplot as plt

    renderer = _draw(fig)
    problems = texts_outside_canvas(fig, renderer) + false_interval_claims(fig) + legends_over_bars(fig, renderer)
    text = all_text(fig)
    plt.close(fig)
    assert not problems, "\n".join(problems)
    return text


# ---------------------------------------------------------------------------- inputs
def _no_intervals(record, responses: int | None = None):
    """``record`` as a run too small for intervals leaves it: every ``*_ci`` NaN (and the
    responses counts set to ``responses``)."""
    if isinstance(record, dict):
        for k, v in record.items():
            if k.endswith("_ci") and isinstance(v, list):
                record[k] = [NAN, NAN]
            elif responses is not None and k in ("responses", "turns") and isinstance(v, int):
                record[k] = responses
            else:
                _no_intervals(v, responses)
    elif isinstance(record, list):
        for v in record:
            _no_intervals(v, responses)
    return record


def bench_report(n: int, busy: bool = False) -> dict:
    """The committed bench's report as a run of ``n`` prompts per set leaves it: below 8, two
    sets and no interval anywhere (2 x 2 = 4 responses in the average too); a long CPU name."""
    r = _load("results/bench/bench.json")
    r["cpu"]["model"] = "Intel(R) Xeon(R) Platinum 8488C CPU @ 2.40GHz"
    r["load_average_before"] = [3.6, 2.0, 1.1] if busy else [0.3, 0.4, 0.5]
    r["busy_warning"] = "warning: the machine is busy" if busy else None
    for rec in r["datasets"].values():
        rec["turns"] = n
    if n < 8:
        r["datasets"] = {k: r["datasets"][k] for k in ("gsm8k", "mbpp")}
        _no_intervals(r)
    return r


def experiment_table(rel: str, preset: str | None = None):
    """An experiments ``Table`` from a committed ``table.json``; with ``preset`` (a smoke one)
    as that preset's two-prompt run leaves it: no intervals, 2 responses a row."""
    from dflash_jax.experiments import framework

    j = _load(rel)
    if preset is not None:
        j = smoke_dict_table(rel) | {"preset": preset}
    module = importlib.import_module(f"dflash_jax.experiments.{j['experiment']}")
    return framework.Table(module.EXPERIMENT, j["preset"], j["settings"], j["budget"], j["rows"], j["command"],
                           j["environment"], j["minutes"])


def smoke_dict_table(rel: str) -> dict:
    """A committed table as a smoke run leaves it, as a dict (``Table.to_json()``'s form)."""
    j = _no_intervals(copy.deepcopy(_load(rel)), 2)
    j["preset"], j["smoke"] = "smoke", True
    for r in j["rows"]:
        r["average"]["responses"] = 2
    return j


def paper_record(item: str, smoke: bool) -> dict:
    r = _load(f"results/paper/{item}.json")
    if smoke:
        r = _no_intervals(copy.deepcopy(r), 2)
        r["preset"], r["smoke"] = "smoke", True
    return r


# ---------------------------------------------------------------------------- the figures
@pytest.mark.parametrize("n", [2, 10])
def test_bench_figure(n):
    from dflash_jax.bench import harness

    fig = harness.plot(bench_report(n))
    speed, tau = fig.axes[0].get_title(), fig.axes[1].get_title()
    text = check(fig)
    if n < 8:
        assert "no interval (n < 8)" in speed and "no interval (n < 8)" in tau and "95%" not in text
    else:
        assert speed.endswith("95% CI") and tau.endswith("95% CI")
    assert "Platinum 8488C" in text and "busy" not in text


def test_bench_figure_marks_a_busy_machine():
    from dflash_jax.bench import harness

    text = check(harness.plot(bench_report(10, busy=True)))
    assert "busy machine" in text and "3.60 on 2 cores" in text


@pytest.mark.parametrize("rel", ["results/ablations/ablate_depth/table.json",
                                 "results/ablations/ablate_block_size/table.json",
                                 "results/ablations/ablate_conditioning/table.json",
                                 "results/methods/table.json"])
@pytest.mark.parametrize("preset", [None, "smoke"])
def test_experiment_figure(rel, preset):
    table = experiment_table(rel, preset)
    text = check(table.plot())
    assert f"{table.preset} preset" in text  # the real preset, not the device alone
    if preset == "smoke":
        assert "smoke run (smoke preset)" in text and "no interval (n < 8)" in text and "95%" not in text
    else:
        assert "smoke" not in text and "95% CI" in text


def test_training_curves_of_a_smoke_table():
    from dflash_jax.experiments import framework

    text = check(framework.plot_curves(experiment_table("results/methods/table.json", "test")))
    assert "smoke run (test preset)" in text


@pytest.mark.parametrize("name", ["ablate_tree", "ablate_budget"])
@pytest.mark.parametrize("smoke", [False, True])
def test_measured_ablation_figure(name, smoke):
    module = importlib.import_module(f"dflash_jax.experiments.{name}")
    rel = f"results/ablations/{name}/table.json"
    table = smoke_dict_table(rel) if smoke else _load(rel)
    text = check(module.plot(table))
    assert ("smoke run (smoke preset)" in text) == smoke
    assert "busy machine" in text  # both were measured at a 1-minute load above 1 on 2 cores
    assert ("no interval (n < 8)" in text) == smoke and ("95% CI" in text) != smoke


@pytest.mark.parametrize("item", ["table1", "acceptance", "block_size_curve"])
@pytest.mark.parametrize("smoke", [False, True])
def test_paper_figure(item, smoke):
    from dflash_jax.experiments import paper

    text = check(paper.item_figure(paper_record(item, smoke)))
    assert ("smoke run (smoke preset)" in text) == smoke
    if item == "table1":
        assert ("no interval (n < 8)" in text) == smoke
        assert ("95% CI where n >= 8" in text) != smoke  # per set none (6 prompts), on average one


def test_notebook_figures():
    from dflash_jax import viz
    from dflash_jax.experiments import paper_numbers

    lengths = [[1, 3, 4, 16, 2], [2, 5, 1], [16, 16, 3]]
    check(viz.plot_acceptance({"a drafter with a long name": lengths, "b": lengths[:2]}, block_size=16))
    check(viz.plot_training([{"step": s, "loss": 5.0 / s, "eval_tau": 1 + s / 100 if s % 50 == 0 else None}
                             for s in range(1, 201)]))
    table = _load("results/ablations/ablate_conditioning/table.json") | {"paper": paper_numbers.CONDITIONING}
    check(viz.plot_against_paper(table))
    smoke = smoke_dict_table("results/ablations/ablate_loss_decay/table.json")
    text = check(viz.plot_against_paper(smoke))
    assert "smoke run (smoke preset)" in text and "no interval (n < 8)" in text


def test_reports_through_the_writer(tmp_path):
    """A tool's report goes through ``reporting.write_report``: laid out, and a busy machine
    marked from the load it recorded."""
    from dflash_jax import reporting
    from dflash_jax.tools import tree_bench

    report = _load("results/tree/bench/tree_bench.json")
    text = check(reporting.report_figure(report, tree_bench.plot))
    assert "busy machine (1-minute load 9.80 on 2 cores" in text
    reporting.write_report(report, str(tmp_path), "tree_bench", tree_bench.plot, quiet=True)
    assert (tmp_path / "tree_bench.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------- the committed ones
# committed PNGs that cannot be drawn again from a JSON beside them, and why
NOT_REDRAWN = {
    "results/gpu/h100/exactness_bench/bench.png": "an earlier bench report format (no intervals recorded)",
    "results/gpu/h100_before_xla_flags/bench/bench.png": "an earlier bench report format (no intervals recorded)",
    "results/gpu/h100/tree/tree_h100.png": "drawn by hand from several spec-speed runs",
    "results/tree/bench_quiet/bench_quiet.png": "drawn by hand from summary.json",
    "results/paper/training_curve.png": "drawn from the drafter runs' metrics, which its JSON does not keep",
}


def _committed():
    from dflash_jax.tools import replot

    return replot.committed_figures(ROOT)


def test_every_committed_figure_is_drawn_again_or_named():
    from dflash_jax.tools import replot

    missing = {png for png, source in _committed() if source is None}
    assert missing <= set(NOT_REDRAWN), missing - set(NOT_REDRAWN)
    for png in set(NOT_REDRAWN) - missing:
        source = dict(_committed())[png]
        with pytest.raises(replot.CannotRedraw):
            replot.figures_of(os.path.join(ROOT, source))


@pytest.mark.slow
@pytest.mark.parametrize("png, source", [c for c in _committed() if c[0] not in NOT_REDRAWN],
                         ids=lambda v: v if isinstance(v, str) and v.endswith(".png") else "")
def test_committed_figure_drawn_again(png, source):
    from dflash_jax.tools import replot

    drawn = dict(replot.figures_of(os.path.join(ROOT, source)))
    fig = drawn.pop(os.path.join(ROOT, png))
    for other in drawn.values():
        import matplotlib.pyplot as plt

        plt.close(other)
    check(fig)
