"""Wall time of the README's main command, cold and warm: how long a user waits.

    python -m tools.main_command_time --runs 3 --out results/main_command

Each of ``--runs`` rounds starts the command three times in a fresh project home (a new
temporary ``$DFLASH_JAX_HOME``, so an empty persistent compilation cache, and a new
measured-costs cache): ``cold`` (every program compiled, the adaptive block's costs measured),
``warm`` (the programs loaded from the compilation cache, the costs read back) and ``warm, no
compilation cache`` (the costs read back, every program compiled again:
``DFLASH_JAX_COMPILATION_CACHE=off``), which tells the cache's share of the difference from the
costs'. Each run is a
``python -m dflash_jax bench ...`` process of its own, timed from its start to its exit
(imports, loading, compiling, the runs, the report), and the bench's own warm-up lines ("ready in
N s": compiling or loading the programs) are summed; the load average before each run and the
CPU are recorded. Writes ``main_command.json`` and ``main_command.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

from dflash_jax.files import write_json, write_text
from dflash_jax.reporting import cpu_description, cpu_info, environment, load_average

DEFAULT_COMMAND = "python -m dflash_jax bench"


def time_run(command: list[str], env: dict, cwd: str) -> dict:
    """One run of ``command``: its wall time, the load average before it, its exit status."""
    load = load_average()
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed (status {done.returncode}):\n{done.stderr[-2000:]}")
    warm_up = [int(x) for x in re.findall(r"^ready in (\d+) s$", done.stderr, re.M)]
    return {"wall_s": wall, "warm_up_s": sum(warm_up), "load_average_before": load}


KINDS = {"cold": {}, "warm": {}, "warm, no compilation cache": {"DFLASH_JAX_COMPILATION_CACHE": "off"}}


def measure(command: str, runs: int) -> dict:
    args = shlex.split(command)
    if args[:1] == ["python"]:
        args[0] = sys.executable
    rounds = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="dflash-jax-home-") as home:
            env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "DFLASH_CACHE_DIR")}
            env |= {"DFLASH_JAX_HOME": home, "DFLASH_CACHE_DIR": os.path.join(home, "costs")}
            out = os.path.join(home, "out")
            one = {}
            for kind, extra in KINDS.items():
                one[kind] = time_run(args + ["--out", out], env | extra, home)
                print(f"round {i + 1}/{runs} {kind}: {one[kind]['wall_s']:.0f} s "
                      f"(load before {one[kind]['load_average_before']})", file=sys.stderr, flush=True)
            rounds.append(one)
    summary = {kind: {"median_s": float(np.median([r[kind]["wall_s"] for r in rounds])),
                      "min_s": float(min(r[kind]["wall_s"] for r in rounds)),
                      "max_s": float(max(r[kind]["wall_s"] for r in rounds)),
                      "warm_up_median_s": float(np.median([r[kind]["warm_up_s"] for r in rounds]))} for kind in KINDS}
    return {"command": command, "runs": rounds, "summary": summary, "cpu": cpu_info(),
            "environment": environment(), "load_average_after": load_average()}


def markdown(result: dict) -> str:
    s = result["summary"]
    rows = [f"| {kind} | {s[kind]['median_s']:.0f} s | {s[kind]['min_s']:.0f} - {s[kind]['max_s']:.0f} s | "
            f"{s[kind]['warm_up_median_s']:.0f} s | "
            + ", ".join(f"{r[kind]['load_average_before'][0]:.2f}" for r in result["runs"]) + " |"
            for kind in KINDS]
    return (f"# `{result['command']}`: wall time, cold and warm\n\n"
            f"{len(result['runs'])} rounds on {cpu_description(result['cpu'])}; each round a fresh "
            "`$DFLASH_JAX_HOME` (cold: empty compilation cache and costs; warm: the same home again; then "
            "the same home with the compilation cache off). Whole process, start to exit; warm-up: the "
            "bench's compile-or-load of its programs.\n\n"
            "| run | median | range | warm-up (median) | 1-minute load before each |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m tools.main_command_time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--command", default=DEFAULT_COMMAND, help=f"the command (default: {DEFAULT_COMMAND})")
    p.add_argument("--runs", type=int, default=3, help="rounds of a cold, a warm and an uncached warm run (default 3)")
    p.add_argument("--out", default="runs/main_command", help="where main_command.json / .md go")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("--runs must be >= 1")
    result = measure(a.command, a.runs)
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, "main_command.json"), result)
    text = markdown(result)
    write_text(os.path.join(a.out, "main_command.md"), text)
    print(text)
    return result


if __name__ == "__main__":
    main()
