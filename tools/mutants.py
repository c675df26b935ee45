"""Mutation audit (issue 48): plausible bugs planted in the library one at a time, each in a
scratch copy of the repository, and the tests that must catch them.

``tools/mutants.json`` lists the mutants: ``id``, ``what`` (one line), the library ``file``, the
exact ``original`` text, its ``replacement`` and ``tests`` (each entry one pytest command line:
paths or node ids, optionally ``-k EXPR``). Per mutant: the working tree's files (tracked, and
untracked but not ignored; ``--head``: the committed HEAD) are copied into a temporary directory
with links ``dflash_jax/{kernels,experiments,tools} -> ../<name>``; the original text must occur
exactly once in the copy's file, else the mutant is STALE (the code moved: update its entry);
the replacement is applied and the test entries run in order as ``python -m pytest -x -q ENTRY``
in the copy with ``PYTHONPATH`` = the copy, so that the copy's package shadows the checkout's
editable install (a pytest plugin given with ``-p`` records where every ``dflash_jax`` module
came from; one from outside the copy is an ERROR). The first entry that fails (exit status 1)
makes the mutant CAUGHT, all passing MISSED; any other status (a collection error, no test
selected, a timeout) is an ERROR. Standard library only.

    python -m tools.mutants --list
    python -m tools.mutants --check [--collect]   # originals occur once (--collect: entries select tests)
    python -m tools.mutants [--only ID ...] [--jobs N] [--timeout S] [--markdown FILE]

Exit status 0 when every selected mutant is CAUGHT (``--check``: applies), else 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "mutants.json")
LINKED = ("kernels", "experiments", "tools")  # top-level folders installed as dflash_jax.<name>
GUARD = """import json, os, sys


def pytest_sessionfinish(session, exitstatus):
    files = [os.path.realpath(m.__file__) for n, m in list(sys.modules.items())
             if (n == "dflash_jax" or n.startswith("dflash_jax.")) and getattr(m, "__file__", None)]
    with open(os.environ["DFLASH_MUTANT_GUARD"], "w") as f:
        json.dump(files, f)
"""
_RUNNING: set = set()  # the pytest processes running now (killed on Ctrl-C)
_LOCK = threading.Lock()
_STOP = threading.Event()  # set on Ctrl-C: no further test entry starts


def load(path: str = DATA) -> list[dict]:
    with open(path) as f:
        mutants = json.load(f)
    ids = [m["id"] for m in mutants]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: duplicate mutant ids")
    return mutants


def entry_paths(entry: str) -> list[str]:
    """The files a test entry names (its arguments that are not options or option values)."""
    args, out = shlex.split(entry), []
    for prev, a in zip([""] + args, args):
        if not a.startswith("-") and prev not in ("-k", "-m"):
            out.append(a.split("::")[0])
    return out


def stale(m: dict, root: str, head: bool) -> str | None:
    """Why mutant ``m`` does not apply to the checkout at ``root`` (None: it applies)."""
    try:
        if head:
            text = subprocess.run(["git", "show", f"HEAD:{m['file']}"], cwd=root, check=True,
                                  capture_output=True, text=True).stdout
        else:
            with open(os.path.join(root, m["file"])) as f:
                text = f.read()
    except (OSError, subprocess.CalledProcessError):
        return f"{m['file']} not found"
    if (n := text.count(m["original"])) != 1:
        return f"the original text occurs {n} times in {m['file']} (the code moved: update the entry)"
    if m["replacement"] == m["original"]:
        return "the replacement is the original"
    missing = [p for e in m["tests"] for p in entry_paths(e) if not os.path.exists(os.path.join(root, p))]
    return f"test files not found: {missing}" if missing else None


def copy_repo(root: str, dest: str, head: bool) -> None:
    """The repository's files into ``dest`` (module docstring), the links and the guard plugin."""
    if head:
        subprocess.run(f"git archive HEAD | tar -x -C {shlex.quote(dest)}", shell=True, cwd=root, check=True)
    else:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=root, check=True, capture_output=True).stdout.decode().split("\0")
        for rel in filter(None, listed):
            src, dst = os.path.join(root, rel), os.path.join(dest, rel)
            if os.path.lexists(src) and not os.path.isdir(src):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(src, dst, follow_symlinks=False)
    for name in LINKED:
        os.symlink(os.path.join("..", name), os.path.join(dest, "dflash_jax", name))
    with open(os.path.join(dest, "_mutant_guard.py"), "w") as f:
        f.write(GUARD)


def run_entry(cmd, copy, env, log, timeout) -> int | None:
    """Runs one pytest command in ``copy``; its exit status, None on a timeout."""
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    with _LOCK:
        _RUNNING.add(proc)
    try:
        return proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:  # a timeout or Ctrl-C: its whole process group
            kill(proc)
            proc.wait()
        with _LOCK:
            _RUNNING.discard(proc)


def kill(proc) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_mutant(m: dict, args, xla_cache: str) -> dict:
    """Copies, mutates and tests one mutant: its row of the report."""
    t0 = time.time()
    row = dict(m, outcome="ERROR", note="", seconds=0.0)
    copy = tempfile.mkdtemp(prefix=f"mutant-{m['id']}-")
    log_path = os.path.join(args.logs, f"{m['id']}.log")
    try:
        copy_repo(args.root, copy, args.head)
        path = os.path.join(copy, m["file"])
        with open(path) as f:
            text = f.read()
        if (n := text.count(m["original"])) != 1:
            row.update(outcome="STALE", note=f"the original text occurs {n} times in {m['file']}")
            return row  # (the finally below still times and removes the copy)
        with open(path, "w") as f:
            f.write(text.replace(m["original"], m["replacement"]))
        guard = os.path.join(copy, "_mutant_guard.json")
        env = dict(os.environ, PYTHONPATH=copy, DFLASH_MUTANT=m["id"], DFLASH_MUTANT_GUARD=guard,
                   JAX_COMPILATION_CACHE_DIR=xla_cache)
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
        row["outcome"], row["note"], imported = "MISSED", "every test entry passed", False
        with open(log_path, "w") as log:
            for entry in m["tests"]:
                if _STOP.is_set():
                    row.update(outcome="ERROR", note="interrupted")
                    break
                cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "_mutant_guard", *shlex.split(entry)]
                log.write(f"$ {shlex.join(cmd)}\n")
                log.flush()
                if os.path.exists(guard):
                    os.remove(guard)
                rc = run_entry(cmd, copy, env, log, args.timeout - (time.time() - t0))
                if rc is None:
                    row.update(outcome="ERROR", note=f"timeout after {args.timeout:.0f} s in: {entry}")
                    break
                try:
                    with open(guard) as f:
                        files = json.load(f)
                except (OSError, ValueError):
                    row.update(outcome="ERROR", note=f"the import guard did not report (exit {rc}): {entry}")
                    break
                real = os.path.realpath(copy) + os.sep
                outside = [p for p in files if not p.startswith(real)]
                if outside:
                    row.update(outcome="ERROR", note=f"dflash_jax imported from outside the copy: {outside[:3]}")
                    break
                imported = imported or os.path.realpath(path) in files
                if rc == 1:
                    row.update(outcome="CAUGHT", note=f"failed: {entry}")
                    break
                if rc != 0:
                    row.update(outcome="ERROR", note=f"pytest exit status {rc} (5: no test selected): {entry}")
                    break
        if row["outcome"] in ("CAUGHT", "MISSED") and not imported:
            row["note"] += "; the mutated module was never imported"
    except Exception as e:  # noqa: BLE001 - a copy or file error is this mutant's ERROR, not the run's end
        row.update(outcome="ERROR", note=f"{type(e).__name__}: {e}")
    finally:
        row["seconds"] = round(time.time() - t0, 1)
        if args.keep:
            row["note"] += f" (copy kept: {copy})"
        else:
            shutil.rmtree(copy, ignore_errors=True)
    return row


@functools.lru_cache(maxsize=None)
def collect(entry: str, root: str) -> str:
    """For ``--check --collect``: how many tests a test entry selects in the checkout."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *shlex.split(entry)],
                       cwd=root, capture_output=True, text=True)
    return f"{sum('::' in line for line in r.stdout.splitlines())} tests (exit {r.returncode}): {entry}"


def markdown(rows: list[dict]) -> str:
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| id | what | file | tests | outcome | seconds |", "|---|---|---|---|---|---|"]
    for r in rows:
        tests = "<br>".join(f"`{cell(t)}`" for t in r["tests"])
        lines.append(f"| {r['id']} | {cell(r['what'])} | `{r['file']}` | {tests} | {r['outcome']} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="ID", help="run these mutants (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    p.add_argument("--check", "--dry-run", action="store_true",
                   help="only check that each original text occurs exactly once and the test files exist")
    p.add_argument("--collect", action="store_true", help="with --check: also count the tests each entry selects")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per mutant, all its entries (default 1800)")
    p.add_argument("--markdown", metavar="FILE", help="write the results table to FILE")
    p.add_argument("--head", action="store_true", help="copy the committed HEAD, not the working tree")
    p.add_argument("--keep", action="store_true", help="keep the scratch copies")
    p.add_argument("--logs", help="directory for each mutant's pytest output (default: a new temporary one)")
    p.add_argument("--mutants", default=DATA, help="the mutant list (default: tools/mutants.json)")
    args = p.parse_args(argv)
    args.root = os.path.dirname(HERE)  # the checkout holding this tool
    mutants = load(args.mutants)
    if args.only:
        unknown = sorted(set(args.only) - {m["id"] for m in mutants})
        if unknown:
            p.error(f"unknown mutant ids {unknown}; --list shows them")
        mutants = [m for m in mutants if m["id"] in set(args.only)]
    if args.list:
        for m in mutants:
            print(f"{m['id']}  [{m['file']}]  {m['what']}")
            for t in m["tests"]:
                print(f"    {t}")
        return 0
    if args.check:
        problems = 0
        for m in mutants:
            why = stale(m, args.root, args.head)
            problems += why is not None
            print(f"{'STALE' if why else 'ok':5}  {m['id']}" + (f": {why}" if why else ""), flush=True)
            for line in [collect(e, args.root) for e in m["tests"]] if args.collect and not why else ():
                problems += line.startswith("0 tests") or "(exit 0)" not in line
                print(f"       {line}", flush=True)
        print(f"{len(mutants)} mutants checked, {problems} problems")
        return int(problems > 0)
    args.logs = args.logs or tempfile.mkdtemp(prefix="dflash-mutants-logs-")
    os.makedirs(args.logs, exist_ok=True)
    xla_cache = tempfile.mkdtemp(prefix="dflash-mutants-xla-")  # shared: unmutated programs compile once
    print(f"{len(mutants)} mutants, {args.jobs} at a time; pytest output in {args.logs}", flush=True)
    rows, pool = {}, concurrent.futures.ThreadPoolExecutor(max(1, args.jobs))
    try:
        futures = [pool.submit(run_mutant, m, args, xla_cache) for m in mutants]
        for fut in concurrent.futures.as_completed(futures):
            r = fut.result()
            rows[r["id"]] = r
            print(f"[{len(rows)}/{len(mutants)}] {r['outcome']:6} {r['id']}  {r['seconds']:.0f} s  {r['note']}",
                  flush=True)
    except KeyboardInterrupt:
        _STOP.set()
        with _LOCK:
            for proc in list(_RUNNING):
                kill(proc)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the running mutants remove their copies
        shutil.rmtree(xla_cache, ignore_errors=True)
    ordered = [rows[m["id"]] for m in mutants]
    counts = {o: sum(r["outcome"] == o for r in ordered) for o in ("CAUGHT", "MISSED", "STALE", "ERROR")}
    print(", ".join(f"{n} {o}" for o, n in counts.items()))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(ordered))
    return int(counts["CAUGHT"] != len(ordered))


if __name__ == "__main__":
    sys.exit(main())
