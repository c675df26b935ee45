"""dflash_jax.viz, the notebooks' views: the token colouring's spans and HTML (escaping, cut last
iteration, byte-level tokens), and the plots' data against hand-computed values."""

from __future__ import annotations

import colorsys
import glob
import io
import json
import os
from html.parser import HTMLParser

import numpy as np
import pytest

from dflash_jax import viz
from dflash_jax.decoding.generation import GenerateResult
from dflash_jax.metrics import Response

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WordTokenizer:
    """decode = the concatenation of each id's string (the tokenizer protocol viz uses)."""

    def __init__(self, vocab):
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids)


class ByteTokenizer:
    """Ids are UTF-8 bytes; an incomplete character decodes to U+FFFD, as byte-level BPE does."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")


def result(seq, lengths, block_size=4):
    return GenerateResult([list(seq)], ["length"], [3], [list(lengths)], block_size, 0.1, 0.2, len(lengths))


class Spans(HTMLParser):
    """(style, title, text) of every <span> in the view's HTML, text unescaped."""

    def __init__(self, markup):
        super().__init__(convert_charrefs=True)
        self.spans, self.open = [], None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        if tag == "span":
            a = dict(attrs)
            self.open = [a["style"], a["title"], ""]

    def handle_data(self, data):
        if self.open is not None:
            self.open[2] += data

    def handle_endtag(self, tag):
        if tag == "span":
            self.spans.append(tuple(self.open))
            self.open = None


def test_iteration_spans_follow_the_acceptance_lengths():
    assert viz.iteration_spans(7, [2, 3, 1]) == [(0, 1), (1, 3), (3, 6), (6, 7)]
    # the last iteration is cut where the row stopped (a stop id or its budget inside the block)
    assert viz.iteration_spans(5, [2, 4]) == [(0, 1), (1, 3), (3, 5)]
    assert viz.iteration_spans(3, [1, 1]) == [(0, 1), (1, 2), (2, 3)]  # autoregressive
    assert viz.iteration_spans(1, []) == [(0, 1)] and viz.iteration_spans(0, []) == []
    with pytest.raises(ValueError, match="cover 2 of the sequence's 3 tokens"):
        viz.iteration_spans(3, [1])
    with pytest.raises(ValueError, match=">= 1"):
        viz.iteration_spans(3, [0, 2])


def test_token_view_html_spans_titles_and_escaping():
    tok = WordTokenizer({0: "def", 1: " f", 2: "(", 3: "x", 4: ")", 5: ":", 6: " <", 7: "b>", 8: "&"})
    view = viz.token_view(result([0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4]), tok)
    spans = Spans(view.html).spans
    assert [t for _, _, t in spans] == ["def", " f(x", ")", ": <b>&"]
    assert [title for _, title, _ in spans] == [
        "prefill: the first token",
        "iteration 1: 3 tokens (2 accepted drafts + 1 from the target)",
        "iteration 2: 1 token (0 accepted drafts + 1 from the target)",
        "iteration 3: 4 tokens (3 accepted drafts + 1 from the target)"]
    # the text is escaped: no markup of the generated text reaches the HTML
    assert "<b>" not in view.html and " &lt;b&gt;&amp;" in view.html
    assert view._repr_html_() == view.html and str(view) == "def f(x): <b>&"
    assert repr(view) == "def f(x): <b>&\n(" + view.caption + ")"
    assert "9 tokens: 1 from the prefill + 3 iterations (tau 2.67, block size 4)" in view.caption
    # colours: the prefill grey; neighbouring iterations differ in hue; a longer acceptance is darker
    colors = [s.color for s in view.spans]
    assert colors[0] == viz.PREFILL_COLOR and len(set(colors)) == 4
    rgb = lambda c: tuple(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5))
    hls = [colorsys.rgb_to_hls(*rgb(c)) for c in colors[1:]]
    assert abs(hls[0][0] - hls[1][0]) > 0.2 and abs(hls[0][0] - hls[2][0]) < 0.01  # alternating hues
    assert hls[2][1] < hls[0][1] < hls[1][1]  # 4 tokens darker than 3, 3 darker than 1
    assert [style for style, _, _ in spans] == [f"background-color:{c}" for c in colors]


def test_token_view_of_a_cut_last_iteration_and_of_autoregressive_decoding():
    tok = WordTokenizer({i: chr(ord("a") + i) for i in range(10)})
    view = viz.token_view(result([0, 1, 2, 3, 4], [2, 16], block_size=16), tok)
    assert [(s.text, s.tokens) for s in view.spans] == [("a", 1), ("bc", 2), ("de", 2)]
    ar = viz.token_view(result([5, 6, 7], [1, 1], block_size=1), tok)
    assert [s.text for s in ar.spans] == ["f", "g", "h"] and ar.spans[1].color != ar.spans[2].color


def test_token_view_keeps_characters_split_across_iterations_whole():
    """A character whose bytes two iterations produced: the texts still join to the decoded
    sequence (no U+FFFD), each span decoded on its own where prefixes disagree."""
    seq = list("aé€b".encode())  # é is 2 bytes, € 3
    view = viz.token_view(result(seq, [2, 2, 3]), ByteTokenizer())
    # bytes a | C3 A9 | E2 82 | AC 62: the euro sign is completed by the third iteration
    assert [(s.text, s.tokens) for s in view.spans] == [("a", 1), ("é", 2), ("", 2), ("€b", 2)]
    assert str(view) == "aé€b"
    ok = viz.token_view(result(list("abcd".encode()), [1, 2]), ByteTokenizer())
    assert str(ok) == "abcd" and [s.text for s in ok.spans] == ["a", "b", "cd"]


def test_token_view_texts_join_to_the_real_tokenizers_decode():
    from transformers import AutoTokenizer

    from dflash_jax.models.handles import EMBEDDED_TARGET_DIR

    tok = AutoTokenizer.from_pretrained(EMBEDDED_TARGET_DIR)
    seq = tok.encode("def add(a, b):\n    return a + b  # <sum> & 'done' ü") + [tok.eos_token_id]
    rng = np.random.default_rng(0)
    lengths, left = [], len(seq) - 1
    while left > 0:
        lengths.append(int(min(left, rng.integers(1, 6))))
        left -= lengths[-1]
    view = viz.token_view(result(seq, lengths, block_size=8), tok)
    assert str(view) == tok.decode(seq, skip_special_tokens=False) and str(view).endswith(tok.eos_token)
    assert "".join(t for _, _, t in Spans(view.html).spans) == str(view)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    return buf.getvalue()


def test_plot_acceptance_histogram_and_positions():
    lengths = [[1, 3, 4], [2]]
    fig = viz.plot_acceptance(lengths, block_size=4)
    hist_ax, pos_ax = fig.axes
    assert [p.get_height() for p in hist_ax.patches] == [0.25, 0.25, 0.25, 0.25]
    np.testing.assert_allclose(pos_ax.lines[0].get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(pos_ax.lines[0].get_ydata(), [3 / 4, 2 / 4, 1 / 4])
    assert hist_ax.get_legend().get_texts()[0].get_text() == "tau 2.33"  # (8/3 + 2) / 2
    assert _png(fig).startswith(b"\x89PNG")
    # a GenerateResult (its block size), Responses, and named series side by side
    fig = viz.plot_acceptance(result([0] * 6, [3, 2], block_size=4))
    assert [p.get_height() for p in fig.axes[0].patches] == [0, 0.5, 0.5, 0]
    two = viz.plot_acceptance({"a": [Response(4, (1, 2), 0, 1)], "b": result([0] * 5, [4])})
    heights = [p.get_height() for p in two.axes[0].patches]
    assert heights == [0.5, 0.5, 0, 0, 0, 0, 0, 1.0]
    assert [t.get_text() for t in two.axes[1].get_legend().get_texts()] == ["a", "b"]
    np.testing.assert_allclose(two.axes[1].lines[1].get_ydata(), [1, 1, 1])


def test_plot_training_reads_the_runs_metrics(tmp_path):
    rows = [{"step": s, "loss": 6.0 - s, "lr": 1e-3} | ({"eval_tau": 1 + s / 10} if s % 2 == 0 else {})
            for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert viz.read_metrics(tmp_path) == rows
    fig = viz.plot_training(str(tmp_path))
    loss, tau = fig.axes
    np.testing.assert_allclose(loss.lines[0].get_xdata(), [1, 2, 3, 4])
    np.testing.assert_allclose(loss.lines[0].get_ydata(), [5, 4, 3, 2])
    np.testing.assert_allclose(tau.lines[0].get_xdata(), [2, 4])
    np.testing.assert_allclose(tau.lines[0].get_ydata(), [1.2, 1.4])
    without = viz.plot_training([{"step": 1, "loss": 3.0}])
    assert not without.axes[1].lines and "no held-out tau" in without.axes[1].texts[0].get_text()


def _row(label, tau, ci, speedup, per_set):
    return {"label": label, "average": {"tau": tau, "tau_ci": ci, "speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1]},
            "datasets": {s: {"tau": t, "speedup": speedup} for s, t in per_set.items()}}


def test_plot_against_paper_shows_our_rows_and_the_papers():
    from dflash_jax.experiments import paper_numbers as paper

    table = {"experiment": "ablate_block_size", "preset": "cpu", "environment": {"device": "cpu"},
             "rows": [_row({"train_block_size": 16, "eval_block_size": 8}, 2.0, [1.5, 2.5], 0.9, {"gsm8k": 2.2, "mbpp": 1.8}),
                      _row({"train_block_size": 16, "eval_block_size": 16}, 3.0, [2.0, 4.0], 1.1, {"gsm8k": 3.5, "mbpp": 2.5})],
             "paper": paper.BLOCK_SIZE}
    fig = viz.plot_against_paper(table)
    (ours_tau, paper_tau, ours_speed, paper_speed) = fig.axes
    assert [p.get_height() for p in ours_tau.patches] == [2.0, 3.0]
    assert [p.get_height() for p in ours_speed.patches] == [0.9, 1.1]
    np.testing.assert_allclose(ours_tau.lines[-2].get_ydata(), [2.2, 3.5])  # gsm8k markers
    assert [t.get_text() for t in ours_tau.get_xticklabels()] == ["16 → 8", "16 → 16"]
    # the error bars span the intervals
    segs = ours_tau.collections[0].get_segments()
    np.testing.assert_allclose([s[:, 1] for s in segs], [[1.5, 2.5], [2.0, 4.0]])
    math500 = [r["datasets"]["math500"] for r in paper.BLOCK_SIZE]
    heights = [p.get_height() for p in paper_tau.patches]
    assert heights[:4] == [m["tau"] for m in math500]
    assert [p.get_height() for p in paper_speed.patches][:4] == [m["speedup"] for m in math500]
    assert [t.get_text() for t in paper_tau.get_xticklabels()] == ["16 → 16", "16 → 8", "8 → 16", "8 → 8"]
    assert _png(fig).startswith(b"\x89PNG")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "results", "ablations", "*", "table.json"))))
def test_plot_against_paper_reads_the_committed_tables(path):
    with open(path) as f:
        table = json.load(f)
    fig = viz.plot_against_paper(table)
    assert [p.get_height() for p in fig.axes[0].patches] == pytest.approx([r["average"]["tau"] for r in table["rows"]])
