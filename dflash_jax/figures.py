"""Figures that say what they are: one set of rules for every PNG the project writes (the bench,
the experiments and the paper's figures, the tools' reports, the notebooks' plots).

- An interval is named on a figure ("95% CI") only where one is drawn: :func:`interval_errors`
  turns recorded intervals into error-bar lengths, ``None`` where no interval exists (too few
  responses: ``metrics.MIN_DISTINCT_SAMPLES``), and :func:`interval_label` says "95% CI" or
  "no interval (n < 8)" from what it returned. A missing interval is not drawn as a zero-length
  bar.
- A smoke run and a busy machine are marked on the figure itself (:func:`smoke_note`,
  :func:`busy_note`, :func:`report_notes` for a report dict), in the figure's title line, so
  a PNG copied out of its directory still says that its numbers mean nothing, or that its
  speed ratios were measured under load.
- :func:`finish` lays the figure out so that every title, label and legend lies on the canvas
  (titles wrapped to their column, constrained layout) and moves a legend that would cover a
  bar out of the way (``loc="best"`` first, beside the axes when that still covers one).

``reporting.write_report`` finishes every report figure; the experiments, the paper's figures
and ``viz`` call :func:`finish` themselves.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Mapping, Sequence

import numpy as np

from dflash_jax import metrics

INTERVAL = "95% CI"
NOTE_COLOR = "darkred"


# ---------------------------------------------------------------------------- intervals
def interval_errors(values: Sequence[float], intervals) -> np.ndarray | None:
    """Error-bar lengths ``(2, n)`` (below, above) for ``values`` from their recorded
    ``intervals`` (``n`` pairs, ``[nan, nan]`` or None where there is none): NaN where a value
    has no finite interval, so that no bar is drawn there; None where no value has one (pass
    ``yerr=None``: nothing that looks like an interval is drawn)."""
    v = np.asarray(values, float).reshape(-1)
    ci = np.array([[np.nan, np.nan] if c is None else c for c in intervals], float).reshape(len(v), 2)
    ok = np.isfinite(ci).all(axis=1) & np.isfinite(v)
    if not ok.any():
        return None
    err = np.full((2, len(v)), np.nan)
    err[0, ok] = np.maximum(v[ok] - ci[ok, 0], 0.0)
    err[1, ok] = np.maximum(ci[ok, 1] - v[ok], 0.0)
    return err


def interval_label(errors, responses: int | None = None) -> str:
    """What a figure may say about the intervals :func:`interval_errors` gave (one result, or a
    list of them for series drawn together): "95% CI" when every value has one; "95% CI where
    n >= 8" when only some do; "no interval (n < 8)" when none does and ``responses`` (what the
    values rest on, the fewest where several) is below
    :data:`dflash_jax.metrics.MIN_DISTINCT_SAMPLES`; "no interval" otherwise."""
    n_min = metrics.MIN_DISTINCT_SAMPLES
    parts = list(errors) if isinstance(errors, (list, tuple)) else [errors]
    drawn = [np.isfinite(e).all(axis=0) for e in parts if e is not None]
    if drawn:
        every = all(d.all() for d in drawn) and len(drawn) == len(parts)
        return INTERVAL if every else f"{INTERVAL} where n >= {n_min}"
    if responses is not None and not metrics.interval_supported(responses):
        return f"no interval (n < {n_min})"
    return "no interval"


# ---------------------------------------------------------------------------- notes
def smoke_note(preset: str) -> str:
    """The mark of a smoke run's figure."""
    return f"smoke run ({preset} preset): numbers mean nothing"


def busy_note(load: Sequence[float] | None, cores: int | None) -> str | None:
    """The mark of a figure measured on a busy machine (``reporting.busy_warning``'s rule on the
    1-minute ``load`` before the runs), None when it was quiet or the load is unknown."""
    from dflash_jax.reporting import busy_warning

    if not load or not cores or busy_warning(list(load), int(cores)) is None:
        return None
    return f"busy machine (1-minute load {load[0]:.2f} on {cores} cores as the runs began): times and speed ratios are off"


def _numbers(x) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(v, (int, float)) for v in x)


_BEFORE = ("load_average_before", "load_average_start")


def _befores(record) -> list[float]:
    """The 1-minute loads recorded before measurements (``load_average_before``, or
    ``load_average_start``), at any depth."""
    if isinstance(record, Mapping):
        own = [v[0] for k, v in record.items() if k in _BEFORE and _numbers(v)]
        return own + [x for k, v in record.items() if k not in _BEFORE for x in _befores(v)]
    if isinstance(record, list):
        return [x for v in record for x in _befores(v)]
    return []


def load_before(report: Mapping) -> float | None:
    """The 1-minute load the report's measurements began at, as far as it recorded one: the
    lowest ``load_average_before`` (or ``_start``) at any depth (each later one includes the run
    before it);
    else ``load_average["before"]`` (the tree and budget ablations); else the lowest load as
    a cell began (an experiments table's rows: ``[before, after]`` pairs); else a top-level
    ``load_average`` recorded beside a ``load_average_after``. None where there is none."""
    found = _befores(report)
    if found:
        return min(found)
    la = report.get("load_average")
    if isinstance(la, Mapping) and _numbers(la.get("before")):
        return la["before"][0]
    cells = [pair[0] for r in report.get("rows") or [] if isinstance(r, Mapping)
             for pair in r.get("load_average") or [] if _numbers(pair)]
    if cells:
        return min(cells)
    if _numbers(la) and "load_average_after" in report:
        return la[0]
    return None


def report_notes(report: Mapping) -> list[str]:
    """The notes a report's figure carries: :func:`smoke_note` where the report says it is a
    smoke run (``"smoke": true`` with its ``"preset"``), :func:`busy_note` where the machine was
    busy as its measurements began (:func:`load_before`, on the cores it recorded); a recorded
    ``busy_warning`` of None (at the top or under ``machine``) means quiet."""
    notes = []
    if report.get("smoke"):
        notes.append(smoke_note(str(report.get("preset", "smoke"))))
    machine = report.get("machine") if isinstance(report.get("machine"), Mapping) else {}
    recorded = [d for d in (report, machine) if "busy_warning" in d]
    if recorded and not any(d["busy_warning"] for d in recorded):
        return notes
    cpu = machine.get("cpu") or report.get("cpu") or {}
    env = report.get("environment") or report.get("env") or {}
    cores = (cpu.get("cores") if isinstance(cpu, Mapping) else None) or env.get("cpu_count")
    load = load_before(report)
    note = busy_note(None if load is None else [load], cores)
    if note is None and recorded:  # warned, but the load it warned of is not recorded here
        note = "busy machine as the runs began: times and speed ratios are off"
    if note:
        notes.append(note)
    return notes


# ---------------------------------------------------------------------------- layout
def _renderer(fig):
    """A renderer for measuring text: the Agg canvas's own, or one for a figure made without
    pyplot (``matplotlib.figure.Figure``: its canvas has none)."""
    get = getattr(fig.canvas, "get_renderer", None)
    if get is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
        get = fig.canvas.get_renderer
    return get()


def _fit(text, room: float, renderer, vertical: bool = False) -> bool:
    """Wraps ``text`` (a title or label) at word boundaries until it spans at most ``room``
    pixels (its height for a ``vertical`` label); where one word is wider than that, shrinks
    its font (to 6 points at least). Returns whether it changed anything."""
    s = text.get_text()
    if not s or room <= 0 or not text.get_visible():
        return False
    changed = False
    for _ in range(6):
        box = text.get_window_extent(renderer)
        span = box.height if vertical else box.width
        if span <= room:
            return changed
        longest = max(len(line) for line in s.split("\n"))
        width = max(8, int(longest * room / span * 0.95))
        wrapped = "\n".join(textwrap.fill(line, width, break_long_words=False) or line for line in s.split("\n"))
        if wrapped == s:  # a word longer than the room: a smaller font
            size = text.get_fontsize()
            if size <= 6:
                return changed
            text.set_fontsize(max(6.0, size * room / span))
        else:
            s = wrapped
            text.set_text(s)
        changed = True
    return changed


def _fit_texts(fig) -> bool:
    """One pass of :func:`_fit` over the suptitle (the figure's width) and every axes' titles
    and x label (centred on the axes as laid out, each may span twice its distance to the
    nearer side of the axes' grid cell: the layout leaves a title's width to its axes) and y
    label (likewise, vertically). Returns whether anything changed."""
    renderer = _renderer(fig)
    changed = False
    if fig._suptitle is not None:
        changed |= _fit(fig._suptitle, 0.96 * fig.bbox.width, renderer)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        box = ax.get_window_extent(renderer)
        x0, x1, y0, y1 = _cell(ax, fig)
        cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        across = 2 * min(cx - x0, x1 - cx) - 4
        for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label):
            changed |= _fit(t, across, renderer)
        changed |= _fit(ax.yaxis.label, 2 * min(cy - y0, y1 - cy) - 4, renderer, vertical=True)
    return changed


def _cell(ax, fig) -> tuple[float, float, float, float]:
    """The pixels (x0, x1, y0, y1) of the grid cell an axes was made in, its share of the
    figure by the grid's ratios (the whole figure for an axes outside any grid): the room for
    its title and labels."""
    spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
    w, h = fig.bbox.width, fig.bbox.height
    if spec is None:
        return 0.0, w, 0.0, h
    grid = spec.get_gridspec()
    nrows, ncols = grid.get_geometry()
    wr = np.cumsum([0.0] + list(grid.get_width_ratios() or [1] * ncols))
    hr = np.cumsum([0.0] + list(grid.get_height_ratios() or [1] * nrows))
    x0, x1 = wr[spec.colspan.start] / wr[-1] * w, wr[spec.colspan.stop] / wr[-1] * w
    top, bottom = hr[spec.rowspan.start] / hr[-1], hr[spec.rowspan.stop] / hr[-1]  # rows count from the top
    return x0, x1, (1 - bottom) * h, (1 - top) * h


def _bars(fig) -> list:
    """Every bar of the figure's axes (the patches of their bar containers, ``hist`` included)."""
    from matplotlib.container import BarContainer

    return [p for ax in fig.axes for c in ax.containers if isinstance(c, BarContainer)
            for p in c.patches if p.get_visible()]


def legend_covers_bars(legend, renderer, bars) -> bool:
    box = legend.get_window_extent(renderer)
    return any(box.overlaps(b.get_window_extent(renderer)) for b in bars
               if np.isfinite(b.get_height()) and np.isfinite(b.get_width()) and b.get_height() and b.get_width())


def _clear_legends(fig) -> None:
    """Moves each axes legend that covers a bar: to ``loc="best"``, then, where that still
    covers one, beside its axes (the layout makes room). A move changes the layout (an axes
    beside a moved legend narrows), so every legend is checked again until none covers a bar."""
    bars = _bars(fig)
    if not bars:
        return
    stage = {}  # legend -> 1 at "best", 2 beside its axes
    for _ in range(4):
        renderer = _renderer(fig)
        covering = [ax for ax in fig.axes if ax.get_legend() is not None and stage.get(ax.get_legend(), 0) < 2
                    and legend_covers_bars(ax.get_legend(), renderer, bars)]
        if not covering:
            return
        for ax in covering:
            leg = ax.get_legend()
            if stage.get(leg, 0) == 0:
                leg.set_loc("best")
                stage[leg] = 1
                continue
            # beside the axes, in one column: the same entries, drawn anew
            texts = leg.get_texts()
            title = leg.get_title().get_text()
            beside = ax.legend(leg.legend_handles, [t.get_text() for t in texts], loc="upper left",
                               bbox_to_anchor=(1.02, 1.0), ncols=1, frameon=leg.get_frame_on(),
                               fontsize=texts[0].get_fontsize() if texts else None, title=title or None)
            stage[beside] = 2
        fig.draw_without_rendering()


def finish(fig, notes: Iterable[str | None] = ()):
    """Lays ``fig`` out to say what it is, within its canvas: the ``notes`` (smoke run, busy
    machine; None entries skipped) head its title line in :data:`NOTE_COLOR`; titles and axis
    labels are wrapped to their grid cell; the figure takes the constrained layout (the tight
    one with colorbars) where it has no layout engine yet; legends that cover a bar are moved.
    Returns ``fig``."""
    # finishing twice (a plot function, then the report writer) adds each note once
    had = getattr(fig, "_figure_notes", [])
    notes = had + [n for n in dict.fromkeys(notes) if n and n not in had]
    if notes != had:
        base = getattr(fig, "_figure_title", fig.get_suptitle())
        fig.suptitle("\n".join(notes + ([base] if base else [])), color=NOTE_COLOR)
        fig._figure_notes, fig._figure_title = notes, base
    if fig.get_layout_engine() is None:
        # colorbars made without a layout engine sit in a grid the constrained layout cannot
        # rebuild: those figures take the tight layout
        bars = any(getattr(ax, "_colorbar", None) is not None for ax in fig.axes)
        fig.set_layout_engine("tight" if bars else "constrained")
    fig.draw_without_rendering()  # the layout, then what it cannot do: legends off bars, long titles
    _clear_legends(fig)
    for _ in range(3):
        if not _fit_texts(fig):
            break
        fig.draw_without_rendering()
    return fig
