"""The notebooks' first cell, the Colab install (notebooks/README.md): the same cell in every
notebook, it picks the jax build from the GPU driver that ``nvidia-smi`` reports, and without a
checkout or a repository URL it stops with a message that says what to do."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _install_cell(path) -> str:
    nb = json.loads(path.read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def test_every_notebook_has_the_same_install_cell():
    assert len(NOTEBOOKS) == 3
    cells = {_install_cell(p) for p in NOTEBOOKS}
    assert len(cells) == 1
    ast.parse(cells.pop())


def _fake_nvidia_smi(tmp_path, output: str | None) -> dict:
    """An environment whose PATH holds only a fake ``nvidia-smi`` printing ``output`` (None:
    no such program, a CPU runtime)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if output is not None:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n/bin/cat <<'END'\n{output}\nEND\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": str(bin_dir)}


SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 575.57.08              Driver Version: 575.57.08      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+"""


@pytest.mark.parametrize("output, expect", [(None, None), (SMI.format(cuda="12.9"), 12),
                                            (SMI.format(cuda="13.0"), 13), ("no devices found", None)])
def test_the_install_cell_reads_the_cuda_driver_version(tmp_path, output, expect):
    cell = _install_cell(NOTEBOOKS[0])
    tree = ast.parse(cell)
    prelude = [n for n in tree.body if isinstance(n, (ast.Import, ast.FunctionDef))]
    program = ast.unparse(ast.Module(prelude, [])) + "\nprint(repr(cuda_driver_major()))\n"
    out = subprocess.run([sys.executable, "-c", program], env=_fake_nvidia_smi(tmp_path, output),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == repr(expect)


def test_the_install_cell_without_a_checkout_says_what_to_do(tmp_path):
    # a kernel where dflash_jax does not import (importlib.util.find_spec answers None for it),
    # no ./dflash-jax and no DFLASH_JAX_REPO: the cell must stop before installing anything
    block = ("import importlib.util as u\n_orig = u.find_spec\n"
             "u.find_spec = lambda name, *a: None if name == 'dflash_jax' else _orig(name, *a)\n")
    env = {k: v for k, v in _fake_nvidia_smi(tmp_path, None).items() if k != "DFLASH_JAX_REPO"}
    run = subprocess.run([sys.executable, "-c", block + _install_cell(NOTEBOOKS[0])], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "RuntimeError: no checkout to install" in last and "DFLASH_JAX_REPO" in last and "./dflash-jax" in last
