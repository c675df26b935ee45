"""What every ``python -m dflash_jax <command>`` shares: its parser, its error handling.

A command is a function ``main(argv)`` that builds its parser with :func:`command_parser` and
raises ``ValueError`` / ``OSError`` (``FileNotFoundError``, ...) for a user's mistake. Run
through :func:`run_cli` (``python -m dflash_jax`` and every module's ``__main__`` block), such
an error prints one line ``error: ...`` on stderr and exits with status 2; ``--debug`` (or
``DFLASH_DEBUG=1``) shows the traceback instead. Ctrl-C exits with status 130 and one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

PROG = "python -m dflash_jax"
DEBUG_ENV = "DFLASH_DEBUG"
USER_ERRORS = (ValueError, OSError)  # CheckpointError is a ValueError


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and shows the default of every option that has one
    (an option whose default is None says in its help what happens when it is not given)."""

    def _format_action(self, action):
        if (action.option_strings and not action.required and action.default is not None
                and action.default is not argparse.SUPPRESS and action.nargs != 0
                and "default" not in (action.help or "")):
            action.help = ((action.help or "") + " (default: %(default)s)").strip()
        return super()._format_action(action)


def command_parser(command: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """The parser of ``python -m dflash_jax <command>`` (its real program name, defaults shown;
    a module docstring given as the description loses its reStructuredText double backticks)."""
    if description:
        description = description.replace("``", "").replace(":func:", "").replace(":class:", "")
    return argparse.ArgumentParser(prog=f"{PROG} {command}", description=description,
                                   formatter_class=HelpFormatter, **kwargs)


def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_cli(main: Callable[[list[str]], object], argv: Sequence[str] | None = None,
            debug: bool = False) -> None:
    """Runs a command's ``main(argv)`` with the user-facing error handling (see module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug or debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except USER_ERRORS as e:
        if debug:
            raise
        message = str(e) or type(e).__name__
        if isinstance(e, OSError) and e.filename and str(e.filename) not in message:
            message = f"{e.filename}: {message}"
        print(f"error: {' '.join(message.split())}  (--debug shows the traceback)", file=sys.stderr)
        sys.exit(2)


def status(message: str) -> None:
    """A progress line on stderr (``compiling ...``), flushed at once."""
    print(message, file=sys.stderr, flush=True)
