"""Two file rules every writer of the package follows (standard library only, so any module can
import it without an import cycle):

- :func:`atomic_path` (and :func:`write_text`, :func:`write_json`): a file or directory is
  written under a temporary name beside its destination and renamed into place, so a reader,
  or a run killed half-way, sees the old content or the new, never a part.
- :func:`check_settings`: a resumable directory records the settings it was made with; work
  resumes there only with the same settings, else a ``ValueError`` names every difference.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any, Callable, Iterator

_ABSENT = object()

HOME_ENV = "DFLASH_JAX_HOME"


def home(environ=None) -> str:
    """The project's own directory outside any checkout: ``$DFLASH_JAX_HOME``, else
    ``$XDG_CACHE_HOME/dflash-jax``, else ``~/.cache/dflash-jax`` (read at each call). The
    experiments' runs and outputs, the command line's compilation cache and data a user places
    for the recipes (``datasets/``) live under it. ``environ``: another environment than this
    process's."""
    environ = os.environ if environ is None else environ
    if environ.get(HOME_ENV):
        return os.path.expanduser(environ[HOME_ENV])
    cache = environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.join(os.path.expanduser(cache), "dflash-jax")


def temporary_name(path: str, keep_extension: bool = False) -> str:
    """The temporary name :func:`atomic_path` writes ``path`` under: ``path.tmp``
    (``run.json.tmp``, ``model.safetensors.tmp``: no glob for the final names matches it), or
    with ``keep_extension`` ``path.tmp.<ext>`` (``shard-00000.npz.tmp.npz``), for writers that go
    by the extension (``np.save`` and ``np.savez`` append theirs, ``savefig`` picks the format
    by it); readers that glob such files skip names ending in ``.tmp.<ext>``."""
    path = os.fspath(path).rstrip("/") or "/"
    return path + ".tmp" + (os.path.splitext(path)[1] if keep_extension else "")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, keep_extension: bool = False) -> Iterator[str]:
    """Yields the temporary name of ``path`` (:func:`temporary_name`); what the body writes
    there, a file or a directory, is renamed to ``path`` when the body returns. When the body
    raises, the temporary is removed and ``path`` is left as it was.

    A file replaces an existing ``path`` atomically (``os.replace``). A directory cannot replace
    a non-empty one in one rename: the old ``path`` is removed just before the rename."""
    path = os.fspath(path).rstrip("/") or "/"
    tmp = temporary_name(path, keep_extension)
    _remove(tmp)  # left by a killed run
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if os.path.isdir(tmp) and os.path.isdir(path):
        shutil.rmtree(path)
    os.replace(tmp, path)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)


def _with_added(old: Any, added: dict) -> Any:
    """``old`` with the settings of ``added`` it lacks (one level into dict sections)."""
    if not isinstance(old, dict):
        return old
    old = dict(old)
    for key, value in added.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            old[key] = _with_added(old[key], value)
        else:
            old.setdefault(key, value)
    return old


def _differences(old: Any, new: Any, name: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every setting that differs, in ``new``'s order
    (then the keys only ``old`` has); sections (dicts on both sides) are compared key by key."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [(name, old, new)]
    out = []
    for key in [*new, *(k for k in old if k not in new)]:
        out += _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{name}.{key}" if name else key)
    return out


def _show_json(value: Any) -> str:
    return "not set" if value is _ABSENT else json.dumps(value)


def check_settings(path: str | os.PathLike, settings: dict, *, holder: str, remedy: str,
                   section: str | None = None, added: dict | None = None,
                   lead: str = "differs in ", show_key: Callable[[str], str] = str,
                   show_value: Callable[[Any], str] = _show_json) -> dict | None:
    """Refuses to resume work recorded in the JSON file ``path`` with settings other than
    ``settings``.

    ``path`` holds the settings themselves, or (``section``) holds them under that key.
    ``added``: settings introduced after some of these files were written, with the value
    those files had implicitly (``{section: {key: value}}`` fills one level into a section):
    an old file without them resumes when the new settings have that value. Both sides are
    compared as JSON (a tuple equals a list). Returns the file's content, or None when there
    is no file yet (nothing recorded: any settings go).

    Raises:
        ValueError: ``"{holder} with other settings: {lead}{key} {old} (now {new}), ...;
            {remedy}"``, every differing setting (``show_key``, ``show_value``; nested keys
            dotted, ``train.steps``).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        content = json.load(f)
    old = content
    if section is not None:
        old = content.get(section, _ABSENT) if isinstance(content, dict) else _ABSENT
    old = _with_added(old, added or {})
    new = json.loads(json.dumps(settings))
    if not isinstance(old, dict):
        said = f"no settings readable in {path} ({_show_json(old)})"
    else:
        diffs = _differences(old, new)
        if not diffs:
            return content

        def show(value):
            return "not set" if value is _ABSENT else show_value(value)

        said = lead + ", ".join(f"{show_key(k)} {show(a)} (now {show(b)})" for k, a, b in diffs)
    raise ValueError(f"{holder} with other settings: {said}; {remedy}")


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, wait_message: Callable[[], None] | None = None) -> Iterator[None]:
    """Holds an exclusive lock on the file ``path`` (created if missing) for the ``with`` block:
    a second process asking for the same lock waits until the first releases it, or dies (the
    operating system drops the lock of a killed process, so no stale lock is left behind).
    ``wait_message`` is called once when the lock is busy. POSIX ``flock``.

    The holder writes its process id into the file while it holds the lock (and empties it
    on release), so that a process waiting for it can say whom it waits for
    (:func:`lock_holder`)."""
    import fcntl

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_message is not None:
                wait_message()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.truncate(0)
            f.write(f"{os.getpid()}\n")
            f.flush()
            yield
        finally:
            f.truncate(0)
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def lock_holder(path: str | os.PathLike) -> int | None:
    """The process id an :func:`exclusive` holder of ``path`` wrote there, or None (no holder,
    or one that has not written it yet)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
