"""Executes the notebooks top to bottom with a real Jupyter kernel.

    python notebooks/execute.py                          # all, default budget: rewrites their outputs
    python notebooks/execute.py 02 --budget smoke --check   # the CI setting; writes nothing

With ``--budget smoke`` the notebooks read ``DFLASH_NOTEBOOK_BUDGET=smoke`` and run their tiny CI
setting. Without ``--check`` the executed notebook replaces the file (the committed outputs):
stream outputs are coalesced (progress bars keep their final state) and this machine's paths (the
checkout, the home and temporary directories) are replaced by placeholders. The kernel starts in
this directory, as a reader's would. ``tests/notebooks/test_notebooks.py`` executes copies with
:func:`execute` and never writes these files.

Needs the ``notebooks`` extra (``pip install -e ".[notebooks]"``; the test extra has what this
script uses: nbclient, nbformat, ipykernel).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUDGET_VARIABLE = "DFLASH_NOTEBOOK_BUDGET"


def notebooks() -> list[str]:
    """The notebooks, in order."""
    return sorted(glob.glob(os.path.join(HERE, "[0-9][0-9]_*.ipynb")))


def execute(path: str, *, budget: str | None = None, timeout: int = 600,
            cwd: str = HERE) -> tuple[nbformat.NotebookNode, float]:
    """Runs the notebook at ``path`` (read, not written) in a new kernel started in ``cwd`` with
    ``DFLASH_NOTEBOOK_BUDGET=budget`` (None: the default budget); returns the executed notebook and
    its wall time in seconds. A cell's error raises ``nbclient.exceptions.CellExecutionError``;
    ``timeout`` bounds each cell and the whole run."""
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env.pop(BUDGET_VARIABLE, None)
    if budget is not None:
        env[BUDGET_VARIABLE] = budget
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", coalesce_streams=True,
                            resources={"metadata": {"path": cwd}})
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    if seconds > timeout:
        raise TimeoutError(f"{os.path.basename(path)} took {seconds:.0f} s, over its {timeout} s")
    return nb, seconds


def machine_paths() -> list[str]:
    """Absolute paths of this machine that a committed notebook must not contain."""
    paths = {ROOT, os.path.realpath(ROOT), sys.prefix, os.path.expanduser("~"),
             os.path.realpath(tempfile.gettempdir())}
    return sorted((p for p in paths if p and p != os.sep), key=len, reverse=True)


def machine_names() -> dict[str, str]:
    """This machine's directories and the placeholder each is written as in a committed
    notebook: the checkout ``<repo>``, the environment ``<env>``, the home ``~`` and the
    temporary directory ``<tmp>`` (a run's own temporary directory, the first name under it,
    goes with it: ``<tmp>/run/...`` reads the same on every machine)."""
    names = {os.path.realpath(tempfile.gettempdir()): "<tmp>", os.path.expanduser("~"): "~",
             sys.prefix: "<env>", os.path.realpath(sys.prefix): "<env>", ROOT: "<repo>",
             os.path.realpath(ROOT): "<repo>"}
    return {p: n for p, n in names.items() if p and p != os.sep}


def scrub(nb: nbformat.NotebookNode, names: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Replaces this machine's paths in the outputs by placeholders (``names``: path ->
    placeholder, default :func:`machine_names`). The most specific path goes first (the
    longest), wherever the directories lie: an environment or a checkout inside the temporary
    or the home directory is still ``<env>`` or ``<repo>``, never ``<tmp>/lib`` or ``~/...``.
    Under the temporary directory the first name is dropped as well (the run's own directory)."""
    names = machine_names() if names is None else names
    order = sorted(names, key=len, reverse=True)
    # one alternative per path, longest first: at each position the most specific one matches
    pattern = re.compile("|".join(
        f"({re.escape(p)}" + (r"(?:/[\w.-]+)?" if names[p] == "<tmp>" else "") + r")(?![\w.-])" for p in order))

    def clean(text: str) -> str:
        return pattern.sub(lambda m: names[order[m.lastindex - 1]], text)

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = clean(out["text"])
            for key, value in out.get("data", {}).items():
                if key.startswith("text/") and isinstance(value, str):
                    out["data"][key] = clean(value)
            if "traceback" in out:
                out["traceback"] = [clean(x) for x in out["traceback"]]
    return nb


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="notebook name prefixes (default: all), e.g. 01 02_train")
    p.add_argument("--budget", choices=["default", "smoke"], default="default")
    p.add_argument("--check", action="store_true", help="execute only; write nothing")
    p.add_argument("--timeout", type=int, default=600, help="seconds per notebook")
    args = p.parse_args(argv)
    chosen = [n for n in notebooks() if not args.names or any(os.path.basename(n).startswith(x) for x in args.names)]
    for path in chosen:
        nb, seconds = execute(path, budget=None if args.budget == "default" else args.budget, timeout=args.timeout)
        nb.metadata["dflash_jax"] = {"budget": args.budget, "seconds": round(seconds)}
        if not args.check:
            nbformat.write(scrub(nb), path)
        print(f"{os.path.basename(path)}: {seconds:.0f} s" + ("" if args.check else f", {os.path.getsize(path) / 1e3:.0f} kB written"))


if __name__ == "__main__":
    main()
