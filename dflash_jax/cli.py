"""What every ``python -m dflash_jax <command>`` shares: how a command is declared, its
parser, its error handling.

A command is a module with two functions:

* ``add_arguments(parser)`` adds the command's options to an ``argparse`` parser (the
  module docstring is the command's description in ``--help``);
* ``run(args)`` does the work from the parsed options; it raises ``ValueError`` /
  ``OSError`` (``FileNotFoundError``, ...) for a user's mistake.

``python -m dflash_jax`` registers every command on one parser (``add_subparsers``, see
``dflash_jax/__main__.py``); a module that also runs as ``python -m <module>`` builds the same
parser with :func:`command_parser` and :func:`command_main`. Run through :func:`run_cli`, a
user's mistake prints one line ``error: ...`` on stderr and exits with status 2; ``--debug``
(or ``DFLASH_DEBUG=1``) shows the traceback instead. Ctrl-C exits with status 130 and one line
(SIGTERM: 143), without the crash of JAX's teardown (see :func:`run_cli`). A command run as
the process's command line uses JAX's persistent compilation cache
(``dflash_jax.compilation_cache``: a second run loads what the first compiled).

The options of a config dataclass (``TrainConfig``, ``PretrainConfig``) are derived from its
fields by :func:`add_dataclass_arguments` and turned back into it by :func:`dataclass_from_args`.
"""

from __future__ import annotations

import _thread
import argparse
import atexit
import dataclasses
import gc
import inspect
import logging
import os
import re
import signal
import sys
import threading
import time
import types
import typing
from typing import Any, Callable, Sequence

PROG = "python -m dflash_jax"
DEBUG_ENV = "DFLASH_DEBUG"
USER_ERRORS = (ValueError, OSError)  # CheckpointError is a ValueError
INVOCATION = "invocation"  # the attribute the parsed args carry: [command, *its arguments]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and shows the default of every option that has one
    (an option whose default is None says in its help what happens when it is not given)."""

    def _format_action(self, action):
        if (action.option_strings and not action.required and action.default is not None
                and action.default is not argparse.SUPPRESS and action.nargs != 0
                and "default" not in (action.help or "")):
            action.help = ((action.help or "") + " (default: %(default)s)").strip()
        return super()._format_action(action)


def plain_description(doc: str | None) -> str | None:
    """A module docstring as a ``--help`` description (without reStructuredText markup)."""
    if not doc:
        return doc
    return doc.replace("``", "").replace(":func:", "").replace(":class:", "").replace(":data:", "")


def command_parser(command: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """The parser of ``python -m dflash_jax <command>`` (its real program name, defaults shown)."""
    return argparse.ArgumentParser(prog=f"{PROG} {command}", description=plain_description(description),
                                   formatter_class=HelpFormatter, **kwargs)


def parse_command(command: str, module, argv: Sequence[str] | None = None,
                  parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """``argv`` parsed by the command's parser (``module.add_arguments`` on
    :func:`command_parser`, or on ``parser``); the result records the invocation (see
    :func:`invocation`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if parser is None:
        parser = command_parser(command, module.__doc__)
        module.add_arguments(parser)
        args = parser.parse_args(argv)
    else:  # python -m dflash_jax: the parser with every command, argv without the name
        args = parser.parse_args([command, *argv])
    setattr(args, INVOCATION, [command, *argv])
    return args


def command_main(command: str, module, argv: Sequence[str] | None = None):
    """A command module's ``main(argv)``: ``module.run`` on the parsed ``argv`` (default: this
    process's arguments); what ``run`` returns. No error handling: see :func:`run_cli`."""
    return module.run(parse_command(command, module, argv))


def invocation(args: argparse.Namespace) -> list[str] | None:
    """The arguments of ``python -m dflash_jax`` that reproduce ``args`` (the command's name
    first), or None for args not made by :func:`parse_command`."""
    return getattr(args, INVOCATION, None)


def options(args: argparse.Namespace) -> dict:
    """The parsed options as a dict (for a report), without the recorded invocation."""
    return {k: v for k, v in vars(args).items() if k != INVOCATION}


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option (see :func:`add_deprecated_alias`): sets the new option's
    value and prints one line ``note: OLD is deprecated here; use NEW`` on stderr."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is deprecated here; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser, old: str, new: str) -> None:
    """Keeps ``old`` working as a hidden alias of the option ``new`` already on ``parser`` (the
    same value type and choices; a note on stderr when used). For an option renamed because its
    name meant something else in another command (one meaning per option name)."""
    matches = [a for a in parser._actions if new in a.option_strings]
    if len(matches) != 1:
        raise ValueError(f"no option {new} on the parser to keep {old} for")
    (action,) = matches
    parser.add_argument(old, dest=action.dest, action=DeprecatedAlias, new=new, nargs=action.nargs,
                        type=action.type, choices=action.choices, metavar=action.metavar,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)


# ------------------------------------------------------------------ options from a dataclass
def field_help(cls) -> dict[str, str]:
    """Each field's help text: its ``metadata["help"]``, else its entry in the class
    docstring's ``Attributes:`` section (``name: text``, continued on deeper-indented lines)."""
    helps: dict[str, str] = {}
    name, inside = None, False
    for line in (inspect.getdoc(cls) or "").splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section
            break
        entry = re.match(r"^ {4}(\w+):\s*(.*)$", line)
        if entry:
            name = entry[1]
            helps[name] = entry[2]
        elif name and line.strip():
            helps[name] += " " + line.strip()
    for f in dataclasses.fields(cls):
        if "help" in f.metadata:
            helps[f.name] = f.metadata["help"]
    return helps


def flag(name: str) -> str:
    """The option of a field: ``--`` and the name with dashes (``grad_clip`` -> ``--grad-clip``)."""
    return "--" + name.replace("_", "-")


def check_minimum(args: argparse.Namespace, minimum: int, *names: str) -> None:
    """Raises a one-line ValueError naming the first option of ``names`` (attribute names) set
    below ``minimum``; a command calls it before it loads or compiles anything."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            raise ValueError(f"{flag(name)} must be >= {minimum}, got {value}")


def check_sampling_options(args: argparse.Namespace) -> None:
    """``--temperature``, ``--top-k``, ``--top-p`` where the command has them, checked as
    ``SamplingParams`` checks them, each error naming the option (before anything is loaded)."""
    from dflash_jax.verification.sampling import check_sampling

    values = [getattr(args, n, None) for n in ("temperature", "top_k", "top_p")]
    check_sampling(0.0 if values[0] is None else values[0], values[1], values[2],
                   names=("--temperature", "--top-k", "--top-p"))


def argument_kwargs(name: str, hint, default) -> dict:
    """``add_argument`` keywords for a field of type ``hint`` (``X | None`` is X, optional)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"field {name}: no command-line option for the type {hint}")
        hint = inner[0]
    if hint is bool:
        return {"action": "store_true"} if default is False else {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(hint) is typing.Literal:
        choices = list(typing.get_args(hint))
        return {"type": type(choices[0]), "choices": choices}
    if hint in (int, float, str):
        return {"type": hint}
    if typing.get_origin(hint) in (tuple, list):
        inner = [a for a in typing.get_args(hint) if a is not Ellipsis]
        if len(set(inner)) == 1 and inner[0] in (int, float, str):
            return {"type": inner[0], "nargs": "+"}
    raise TypeError(f"field {name}: no command-line option for the type {hint}")


def add_dataclass_arguments(parser, cls, skip: Sequence[str] = (),
                            exclusive: Sequence[Sequence[str]] = ()) -> list[str]:
    """Adds an option for every field of the dataclass ``cls`` but ``skip``: ``--field-name``,
    typed from the field's annotation (``typing.get_type_hints``: int, float, str, a
    ``Literal`` of choices, ``X | None``, a bool as a switch), its default, and its help text
    (:func:`field_help`). The fields of each tuple in ``exclusive`` exclude each other.
    Returns the names of the fields added."""
    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    groups = {}
    for names in exclusive:
        group = parser.add_mutually_exclusive_group()
        groups.update({name: group for name in names})
    added = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kwargs: dict[str, Any] = argument_kwargs(f.name, hints[f.name], f.default)
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        groups.get(f.name, parser).add_argument(flag(f.name), dest=f.name, help=helps.get(f.name),
                                               **kwargs)
        added.append(f.name)
    return added


def dataclass_from_args(cls, args: argparse.Namespace, skip: Sequence[str] = ()):
    """The dataclass ``cls`` from options :func:`add_dataclass_arguments` added (fields in
    ``skip`` keep their defaults); its own checks (``__post_init__``) run here."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip})


# ------------------------------------------------------------------ running a command
def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


# A signal that stops a command, and the status the command then exits with (128 + its number).
STOP_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class _Stop:
    """What :func:`run_cli` knows of the stop signals of the process it runs in."""
    signum: int | None = None  # the first stop signal that came
    status: int | None = None  # and the status it gives: 130 / 143
    redeliver = False  # the next SIGINT / SIGTERM is that first one again (see _raise_soon), not a second
    previous_unraisablehook = None


def _leave(status: int, message: str | None = None) -> None:
    """Ends the process now with ``status``: ``message`` on stderr, stdout, stderr and the
    logging handlers flushed, and none of the interpreter's own teardown (see :func:`run_cli`)."""
    if message:
        print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe
            pass
    logging.shutdown()
    os._exit(status)


def _on_stop_signal(signum, frame) -> None:
    """The SIGINT / SIGTERM handler of a process :func:`run_cli` owns. The first signal raises
    KeyboardInterrupt (the command keeps what it finished, as on a plain Ctrl-C) and arranges
    that the process ends with :func:`_leave` once Python has shut down its own threads; a second
    one while the first is being handled ends the process at once (what is on disk stays whole:
    the commands write their files atomically)."""
    if _Stop.redeliver:  # the first one again (see _raise_soon)
        _Stop.redeliver = False
    elif _Stop.status is not None:
        _leave(_Stop.status, "interrupted again: leaving now")
    else:
        _Stop.signum, _Stop.status = signum, STOP_SIGNALS[signum]
        atexit.register(_leave, _Stop.status)  # registered last, so it runs first among the exit handlers
    if _dropped_if_raised(frame):
        _raise_soon()
    else:
        raise KeyboardInterrupt


def _dropped_if_raised(frame) -> bool:
    """Whether an exception raised at ``frame`` would be dropped by Python ("Exception ignored
    in ..."): it runs inside a garbage-collection callback (JAX has one, ``_xla_gc_callback``, and
    a Ctrl-C was lost in it: the command ran on to the end) or inside
    :func:`_redeliver_dropped_interrupt`."""
    codes = {_redeliver_dropped_interrupt.__code__}
    codes |= {getattr(getattr(c, "__func__", c), "__code__", None) for c in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _raise_soon() -> None:
    """Signals the first stop signal to the main thread again in a few milliseconds, from a
    thread (made pending from the main thread, it would call :func:`_on_stop_signal` again at
    once, inside this call): :func:`_on_stop_signal` raises it once the main thread is out of
    the place where a KeyboardInterrupt would be dropped."""
    _Stop.redeliver = True
    threading.Thread(target=_interrupt_main_later, args=(_Stop.signum,), daemon=True).start()


def _interrupt_main_later(signum: int, delay_s: float = 0.005) -> None:
    time.sleep(delay_s)
    _thread.interrupt_main(signum)


def _redeliver_dropped_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` of a process :func:`run_cli` owns: a KeyboardInterrupt that Python
    dropped where :func:`_dropped_if_raised` does not see it (a weakref callback, a ``__del__``)
    is raised again (:func:`_raise_soon`)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _Stop.signum is not None:
        _raise_soon()
    else:
        (_Stop.previous_unraisablehook or sys.__unraisablehook__)(unraisable)


def _own_stop_signals() -> None:
    """Installs :func:`_on_stop_signal` for the stop signals this process does not ignore (a
    command started with ``nohup`` or in the background of a script keeps ignoring SIGINT) and
    :func:`_redeliver_dropped_interrupt`."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, _on_stop_signal)
    if sys.unraisablehook is not _redeliver_dropped_interrupt:
        _Stop.previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _redeliver_dropped_interrupt


def run_cli(main: Callable[[list[str]], object], argv: Sequence[str] | None = None,
            debug: bool = False, owns_process: bool | None = None) -> None:
    """Runs a command's ``main(argv)`` with the user-facing error handling (see module doc).

    ``owns_process`` (default: ``argv is None``, i.e. the command is this process's command line):
    the command is the whole program, and a Ctrl-C (SIGINT) or SIGTERM ends the process with
    status 130 / 143 without running JAX's native teardown. A Ctrl-C can stop the main thread
    while XLA still compiles a program in its thread pool (jaxlib checks for signals while it
    waits for a compilation, and leaves the compilation running); the interpreter's final
    garbage collection then destroys the XLA client under that compilation, and the process died
    with a segmentation fault (status 139) after the command had printed its message and kept its
    finished work. So after the first such signal the process leaves with ``os._exit`` once
    Python has joined its threads (outputs flushed, nothing else of the teardown run); a second
    signal while the command writes what it keeps ends it at once. Run in-process
    (``owns_process`` false: a test, a notebook), Ctrl-C raises ``SystemExit(130)`` as before."""
    owns_process = argv is None if owns_process is None else owns_process
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug or debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    if owns_process:
        _own_stop_signals()
    try:
        if owns_process:  # the command line: programs compiled once are loaded by the next run
            from dflash_jax import compilation_cache

            compilation_cache.configure()
        main(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        print("terminated" if _Stop.status == STOP_SIGNALS[signal.SIGTERM] else "interrupted", file=sys.stderr)
        sys.exit(_Stop.status or 130)
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
