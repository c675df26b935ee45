"""Progress bars: the one place a ``tqdm`` bar is made (:func:`progress`).

On a terminal a bar is tqdm's own, redrawn in place. Anywhere else (a log file, a pipe, CI, a
notebook's captured stream) a redrawn bar leaves carriage returns, and nested bars leave
cursor-movement escape codes, in the text; there :func:`progress` writes plain lines instead:
the bar's state as one line of ASCII, at most every :data:`PLAIN_INTERVAL_S` seconds (and the
final state), with no carriage return and no escape code.

It imports nothing of ``dflash_jax``.
"""

from __future__ import annotations

import re
import sys

from tqdm import tqdm

PLAIN_INTERVAL_S = 30.0
"""Seconds between two plain progress lines at most (a log gets a line per half minute)."""

_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\r")


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes and anything
    without a working ``isatty``)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class PlainLines:
    """A text stream for a bar that is not on a terminal: each redraw tqdm writes becomes one
    line (carriage returns and escape codes removed; blank redraws, which clear a bar, dropped)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        line = _CONTROL.sub("", text).rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        flush = getattr(self.stream, "flush", None)
        if flush is not None:
            flush()

    def isatty(self) -> bool:
        return False


class Bar(tqdm):
    """A tqdm bar whose :meth:`write` (a message printed above the bars) goes to stderr, where
    the bars are, unless told otherwise (tqdm's default is stdout, among a command's results)."""

    @classmethod
    def write(cls, s, file=None, end="\n", nolock=False):
        return super().write(s, file=sys.stderr if file is None else file, end=end, nolock=nolock)


class PlainBar(Bar):
    """The bar off a terminal: a new postfix or description is shown with the next line, not
    as a line of its own (a training loop sets one every step)."""

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=True):
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc=None, refresh=True):
        super().set_description(desc, refresh=False)


def progress(iterable=None, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)`` on a terminal (``file``, default stderr); elsewhere the same
    bar written as plain lines (:class:`PlainLines`, :class:`PlainBar`): ASCII, a fixed width,
    no nesting (``position`` is dropped), one line per :data:`PLAIN_INTERVAL_S` at most. Its
    ``write`` goes to stderr (:class:`Bar`)."""
    stream = kwargs.pop("file", None) or sys.stderr
    if is_terminal(stream):
        return Bar(iterable, file=stream, **kwargs)
    kwargs.pop("position", None)
    kwargs.setdefault("mininterval", PLAIN_INTERVAL_S)
    kwargs["maxinterval"] = max(kwargs["mininterval"], kwargs.get("maxinterval", 0))  # no forced redraws
    kwargs.update(ascii=True, ncols=100, dynamic_ncols=False)
    return PlainBar(iterable, file=PlainLines(stream), **kwargs)
