"""Views for notebooks: generated text with every token coloured by the iteration that produced
it (HTML), and plots of acceptance, of a training run and of an ablation beside the paper.

    from dflash_jax import viz
    viz.token_view(result, tokenizer)        # displays as HTML in Jupyter (``.html`` is the markup)
    viz.plot_acceptance(result)              # acceptance-length histogram + per-position acceptance
    viz.plot_training("run1")                # loss and held-out tau of a drafter run (metrics.jsonl)
    viz.plot_against_paper(table)            # an experiments table.json beside the paper's rows

The plots return a ``matplotlib.figure.Figure`` made without pyplot (no global figure state, no
backend switch): Jupyter displays a figure that is a cell's value; elsewhere ``fig.savefig``.
Their size in pixels follows ``matplotlib.rcParams["figure.dpi"]``. The metrics are
``dflash_jax.metrics``' (docs/method.md section 6).
"""

from __future__ import annotations

import colorsys
import dataclasses
import html
import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from dflash_jax import figures, metrics
from dflash_jax.bench.prompt_sets import DATASETS

PREFILL_COLOR = "#d9d9d9"
HUES = (0.58, 0.33)  # blue and green, alternating between consecutive iterations


# ---------------------------------------------------------------------------- token colouring
def iteration_spans(num_tokens: int, acceptance_lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` token ranges of a generated sequence by what produced them: the first
    token comes from the prefill, then iteration i commits ``acceptance_lengths[i]`` tokens
    (accepted drafts + the target's bonus token). The last iteration is cut at the sequence's
    end (a stop id or the budget ends a row inside a block). Autoregressive results (all
    lengths 1) give one token per range.

    Raises ValueError when the lengths do not cover the sequence (they belong to another row).
    """
    spans, pos = ([(0, 1)] if num_tokens else []), 1
    for a in acceptance_lengths:
        if pos >= num_tokens:
            break
        if a < 1:
            raise ValueError(f"acceptance lengths are >= 1 (accepted drafts + the bonus), got {a}")
        spans.append((pos, min(pos + int(a), num_tokens)))
        pos = spans[-1][1]
    if pos < num_tokens:
        raise ValueError(f"the acceptance lengths cover {pos} of the sequence's {num_tokens} tokens: "
                         "pass the acceptance lengths of the same row")
    return spans


def _span_texts(tokens: Sequence[int], spans: list[tuple[int, int]], tokenizer) -> list[str]:
    """The text of each span, joining to ``tokenizer.decode(tokens)``: the difference of
    consecutive prefix decodes, where a prefix's trailing U+FFFD (the first bytes of a character
    that a byte-level token split) is left to the span that completes the character; each span
    decoded alone where a prefix's text is not a prefix of the next one's."""
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
    prefixes = [""] + [decode(tokens[:end]).rstrip("\ufffd") for _, end in spans[:-1]]
    prefixes += [decode(tokens)] if spans else []
    if all(b.startswith(a) for a, b in zip(prefixes, prefixes[1:])):
        return [b[len(a):] for a, b in zip(prefixes, prefixes[1:])]
    return [decode(tokens[s:e]) for s, e in spans]


def iteration_color(iteration: int, tokens: int, block_size: int) -> str:
    """Background colour of an iteration's tokens: alternating hues so neighbours differ, darker
    the more tokens the iteration committed (1 token: pale, a whole block: deep); the prefill's
    token (iteration 0) is grey."""
    if iteration == 0:
        return PREFILL_COLOR
    share = (tokens - 1) / max(1, block_size - 1)
    r, g, b = colorsys.hls_to_rgb(HUES[(iteration - 1) % 2], 0.92 - 0.32 * min(1.0, share), 0.75)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))


@dataclasses.dataclass(frozen=True)
class Span:
    """The tokens one step produced: ``iteration`` 0 is the prefill, 1.. the decode loop."""

    text: str
    iteration: int
    tokens: int
    color: str

    @property
    def title(self) -> str:
        if self.iteration == 0:
            return "prefill: the first token"
        drafted = self.tokens - 1
        return (f"iteration {self.iteration}: {self.tokens} token{'s' * (self.tokens != 1)} "
                f"({drafted} accepted draft{'s' * (drafted != 1)} + 1 from the target)")


@dataclasses.dataclass(frozen=True, repr=False)
class TokenView:
    """A generated sequence split by iteration; Jupyter shows it as HTML (``_repr_html_``),
    ``str()`` is the plain text, ``repr()`` the text and the caption."""

    spans: tuple[Span, ...]
    caption: str

    @property
    def html(self) -> str:
        body = "".join(f'<span style="background-color:{s.color}" title="{html.escape(s.title)}">'
                       f"{html.escape(s.text)}</span>" for s in self.spans)
        return ('<div style="font-family:monospace;white-space:pre-wrap;line-height:1.5;color:#000">'
                f"{body}</div>"
                f'<div style="font-size:smaller;color:#555">{html.escape(self.caption)}</div>')

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return "".join(s.text for s in self.spans)

    def __repr__(self) -> str:
        return f"{self}\n({self.caption})"


def token_view(result, tokenizer, row: int = 0) -> TokenView:
    """Row ``row`` of a ``GenerateResult`` (``dj.generate``) with every token coloured by the
    iteration that produced it (hover: how many of its tokens were accepted drafts). The
    text is HTML-escaped; special tokens (a stop token) are shown."""
    tokens = list(result.sequences[row])
    lengths = list(result.acceptance_lengths[row])
    spans = iteration_spans(len(tokens), lengths)
    texts = _span_texts(tokens, spans, tokenizer)
    bs = getattr(result, "block_size", None) or max(lengths, default=1)
    out = tuple(Span(t, i, e - s, iteration_color(i, e - s, bs)) for i, ((s, e), t) in enumerate(zip(spans, texts)))
    per_iteration = f"tau {metrics.tau([lengths]):.2f}" if lengths else "no iterations"
    caption = (f"{len(tokens)} tokens: 1 from the prefill + {len(spans) - 1} iterations ({per_iteration}, block "
               f"size {bs}); colour = iteration (alternating hues), darker = more tokens accepted in it")
    return TokenView(out, caption)


# ---------------------------------------------------------------------------- plots
def _figure(ncols: int, nrows: int = 1, width: float = 5.5, height: float = 3.4):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _named_runs(runs) -> dict[str, list]:
    """{name: per response acceptance lengths} from a GenerateResult, a list of acceptance-length
    lists or Responses, or a mapping of names to either."""
    if isinstance(runs, Mapping):
        return {str(k): _named_runs(v)[""] for k, v in runs.items()}
    lengths = getattr(runs, "acceptance_lengths", runs)
    return {"": [list(getattr(r, "acceptance_lengths", r)) for r in lengths]}


def plot_acceptance(runs, block_size: int | None = None):
    """Acceptance-length histogram (fraction of iterations with length 1..bs) and per-position
    acceptance rate (P(draft token k accepted), k = 1..bs-1) of a ``GenerateResult``, of a list
    of per-response acceptance lengths or ``metrics.Response`` s, or of a mapping name -> either
    (one series each, e.g. two drafters). ``block_size``: default the result's, or the longest
    length seen."""
    named = _named_runs(runs)
    if block_size is None:
        given = [getattr(v, "block_size", None) for v in (runs.values() if isinstance(runs, Mapping) else [runs])]
        block_size = max([b for b in given if b] or [max(r) for v in named.values() for r in v if len(r)] or [1])
    fig, ((ax1, ax2),) = _figure(2)
    width = 0.8 / len(named)
    for i, (name, lengths) in enumerate(named.items()):
        hist = metrics.acceptance_histogram(lengths, block_size)
        frac = hist / max(1, hist.sum())
        label = f"{name + ': ' if name else ''}tau {metrics.tau(lengths):.2f}"
        ax1.bar(np.arange(1, block_size + 1) + (i - (len(named) - 1) / 2) * width, frac, width, label=label)
        ax2.plot(np.arange(1, block_size), metrics.position_acceptance(lengths, block_size), "o-", ms=3,
                 label=name or None)
    ax1.set(xlabel="acceptance length (accepted drafts + bonus)", ylabel="fraction of iterations",
            title="acceptance lengths")
    ax1.legend(fontsize=8)
    ax2.set(xlabel="draft position k", ylabel="P(draft token k accepted)", ylim=(0, 1.02),
            title="per-position acceptance")
    if len(named) > 1:
        ax2.legend(fontsize=8)
    return figures.finish(fig)


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The rows of a drafter run's ``metrics.jsonl`` (one per step: step, loss, lr,
    accuracy_per_pos, ..., eval_tau where it was measured)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_training(run: str | os.PathLike | Sequence[Mapping[str, Any]]):
    """Training loss per step and the held-out tau where it was measured (``TrainConfig
    .eval_every``) of a drafter run: its directory (``metrics.jsonl``) or its rows."""
    rows = read_metrics(run) if isinstance(run, (str, os.PathLike)) else list(run)
    fig, ((ax1, ax2),) = _figure(2)
    steps = [r["step"] for r in rows]
    ax1.plot(steps, [r["loss"] for r in rows], lw=1)
    ax1.set(xlabel="step", ylabel="loss (decayed block loss)", title="training loss", yscale="log")
    evals = [(r["step"], r["eval_tau"]) for r in rows if r.get("eval_tau") is not None]
    if evals:
        ax2.plot(*zip(*evals), "o-")
    else:
        ax2.text(0.5, 0.5, "no held-out tau measured\n(TrainConfig.eval_every = 0)", ha="center", va="center",
                 transform=ax2.transAxes)
    ax2.set(xlabel="step", ylabel="tau", title="held-out tau (real generation)")
    return figures.finish(fig)


def _label_text(label: Mapping) -> str:
    return " → ".join(str(v) for v in label.values())


METRIC_NAMES = {"tau": "tau", "speedup": "decode speedup (x)"}


def _set_color(name: str) -> str:
    """One colour per prompt set, the same in every panel."""
    return f"C{DATASETS.index(name) + 1}" if name in DATASETS else "C9"


def _responses(row: Mapping) -> int | None:
    """How many responses a row's average rests on (recorded, or summed over its sets)."""
    if row.get("average", {}).get("responses") is not None:
        return int(row["average"]["responses"])
    counts = [d.get("responses") for d in (row.get("datasets") or {}).values() if isinstance(d, Mapping)]
    return int(sum(counts)) if counts and None not in counts else None


def plot_against_paper(table: Mapping, keys: Sequence[str] = ("tau", "speedup")):
    """An ablation's results beside the paper's: ``table`` is an experiments table
    (``results/ablations/<experiment>/table.json``, or ``Table.to_json()``). Per metric in
    ``keys``, left: our rows (the average over the prompt sets with its 95 % interval where it
    has one, the legend saying which, and each set as a marker); right: the paper's rows for
    the same ablation, per prompt set. A smoke run and a busy machine are marked
    (:func:`dflash_jax.figures.report_notes`)."""
    rows, paper = table["rows"], table.get("paper") or []
    fig, axes = _figure(2, len(keys), height=3.0)
    label_keys = list(rows[0]["label"]) if rows else []
    env = table.get("environment", {})
    counts = [n for n in map(_responses, rows) if n is not None]
    for (ours, theirs), key in zip(axes, keys):
        x = np.arange(len(rows))
        avg = np.array([r["average"][key] for r in rows], float)
        ci = np.array([r["average"][key + "_ci"] for r in rows], float).reshape(len(rows), 2)
        err = figures.interval_errors(avg, ci)
        ours.bar(x, avg, 0.6, yerr=err, capsize=3, color="C0", alpha=0.5,
                 label=f"average, {figures.interval_label(err, min(counts) if counts else None)}")
        if key == "speedup":
            ours.axhline(1.0, color="0.5", lw=0.8, ls="--")
        for s in (list(rows[0]["datasets"]) if rows else []):
            ours.plot(x, [r["datasets"][s][key] for r in rows], "o", ms=4, label=s, color=_set_color(s))
        names = [_label_text(r["label"]) for r in rows]
        # long labels side by side run into each other (about 11 characters fit per row of 6)
        slant = {"rotation": 20, "ha": "right"} if len(rows) * max(map(len, names), default=0) > 66 else {}
        ours.set_xticks(x, names, **slant)
        # the highest finite value shown (a row may have no interval: too few responses)
        shown = np.array(list(ci[:, 1]) + list(avg) + [r["datasets"][s][key] for r in rows for s in r["datasets"]],
                         float)
        top = float(shown[np.isfinite(shown)].max()) if np.isfinite(shown).any() else 1.0
        ours.set(xlabel=" → ".join(label_keys), ylabel=METRIC_NAMES.get(key, key), ylim=(0, 1.35 * top),
                 title=f"here: {table.get('preset', '?')} preset on {env.get('device', '?')}")
        ours.legend(fontsize=7, ncol=3, loc="upper left")
        # the paper's rows may cover different sets and leave a metric out (None): nan, no bar
        psets = list(dict.fromkeys(s for p in paper for s in p["datasets"]))
        value = lambda p, s: (p["datasets"].get(s) or {}).get(key)
        width = 0.8 / max(1, len(psets))
        for j, s in enumerate(psets):
            theirs.bar(np.arange(len(paper)) + (j - (len(psets) - 1) / 2) * width,
                       [np.nan if value(p, s) is None else value(p, s) for p in paper], width, label=s,
                       color=_set_color(s))
        theirs.set_xticks(np.arange(len(paper)), [_label_text(p["setting"]) for p in paper])
        theirs.set(xlabel=" → ".join(paper[0]["setting"]) if paper else "", ylabel=METRIC_NAMES.get(key, key),
                   title=("the paper: Qwen3-8B, H200, bf16" + "".join(
                       f"\n{_label_text(p['setting'])}: {p['note']}" for p in paper if p.get("note")))
                   if paper else "the paper: no numbers for this")
        known = [value(p, s) for p in paper for s in psets if value(p, s) is not None]
        if known:
            theirs.set_ylim(0, 1.25 * max(known))
            theirs.legend(fontsize=7, ncol=3, loc="upper right")
    return figures.finish(fig, figures.report_notes(table))
