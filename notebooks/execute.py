"""Executes the notebooks top to bottom with a real Jupyter kernel.

    python notebooks/execute.py                          # all, default budget: rewrites their outputs
    python notebooks/execute.py 02 --budget smoke --check   # the CI setting; writes nothing

With ``--budget smoke`` the notebooks read ``DFLASH_NOTEBOOK_BUDGET=smoke`` and run their tiny CI
setting. Without ``--check`` the executed notebook replaces the file (the committed outputs):
stream outputs are coalesced (progress bars keep their final state) and this machine's paths (the
checkout, the home and temporary directories) are replaced by placeholders. The kernel starts in
this directory, as a reader's would. ``tests/test_notebooks.py`` executes copies with
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


def scrub(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Replaces this machine's paths in the outputs: temporary directories by ``<tmp>/...``, the
    checkout by ``<repo>``, the environment and home by ``<env>`` and ``~``."""
    tmp = re.escape(os.path.realpath(tempfile.gettempdir()))
    names = {ROOT: "<repo>", os.path.realpath(ROOT): "<repo>", sys.prefix: "<env>",
             os.path.expanduser("~"): "~"}

    def clean(text: str) -> str:
        text = re.sub(tmp + r"/[\w.-]+", "<tmp>", text)
        for path in sorted(names, key=len, reverse=True):
            if path and path != os.sep:
                text = text.replace(path, names[path])
        return text

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
