"""The notebooks (notebooks/*.ipynb): each runs top to bottom in a real Jupyter kernel in its CI
setting (DFLASH_NOTEBOOK_BUDGET=smoke) within its time limit, from a copy (the committed file is
never written); and the committed files carry the outputs of a default-budget run, without
errors, small, with no path of the machine that ran them and no private imports."""

from __future__ import annotations

import ast
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil

import pytest

pytestmark = [pytest.mark.xdist_group("test_notebooks"), pytest.mark.slow, pytest.mark.notebooks]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
NAMES = ["01_quickstart.ipynb", "02_train_a_drafter.ipynb", "03_ablations.ipynb"]
SMOKE_LIMIT_S = 300  # per notebook in CI (2 CPU cores); each is well under it
MAX_BYTES = 1_500_000
MAX_IMAGE_BYTES = 120_000  # base64 of one PNG: figures are drawn at a low dpi


def _executor():
    spec = importlib.util.spec_from_file_location("notebook_execute", os.path.join(NOTEBOOKS, "execute.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _load(name: str) -> dict:
    with open(os.path.join(NOTEBOOKS, name)) as f:
        return json.load(f)


def _text(output: dict) -> str:
    parts = [output.get("text", "")] + [v for k, v in output.get("data", {}).items() if k.startswith("text/")]
    parts += output.get("traceback", [])
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def test_every_notebook_is_listed():
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_its_ci_setting(name, tmp_path):
    """Executes a copy in a new kernel (started in notebooks/, as a reader's) with the smoke
    budget; any cell error fails. The committed file and the directory are left as they were."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    execute = _executor()
    committed = os.path.join(NOTEBOOKS, name)
    before, listing = _digest(committed), sorted(os.listdir(NOTEBOOKS))
    copy = tmp_path / name
    shutil.copyfile(committed, copy)
    nb, seconds = execute.execute(str(copy), budget="smoke", timeout=SMOKE_LIMIT_S)
    assert seconds < SMOKE_LIMIT_S
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
    assert _digest(committed) == before and sorted(os.listdir(NOTEBOOKS)) == listing


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_has_clean_outputs(name):
    nbformat = pytest.importorskip("nbformat")
    path = os.path.join(NOTEBOOKS, name)
    nbformat.validate(nbformat.read(path, as_version=4))
    assert os.path.getsize(path) < MAX_BYTES
    nb = _load(name)
    assert nb["metadata"]["dflash_jax"]["budget"] == "default", "commit the outputs of a default-budget run"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    # every cell ran, in order, in one session
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert not [o for o in outputs if "Traceback (most recent call last)" in _text(o)]
    images = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert images and all(len(i) < MAX_IMAGE_BYTES for i in images), [len(i) for i in images]
    assert sum(bool(c["outputs"]) for c in code) >= len(code) // 2
    # no path of the machine that ran it (checkout, environment, home, temporary directories)
    text = json.dumps(nb)
    for p in _executor().machine_paths():
        assert p not in text, p
    # no library warning (Orbax's read-only notices) and no terminal codes from progress bars
    streams = "".join(_text(o) for o in outputs if o["output_type"] == "stream")
    assert "WARNING:absl" not in streams and "read only" not in streams
    assert "\x1b[" not in streams and "\r" not in streams


@pytest.mark.parametrize("name", NAMES)
def test_notebook_sources_install_first_pick_the_budget_and_use_public_names(name):
    nb = _load(name)
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    install = sources[0]
    # Colab: installs the project when it is missing, a no-op where dflash_jax imports
    assert 'find_spec("dflash_jax") is None' in install and '"pip", "install"' in install
    assert 'os.environ.get("DFLASH_NOTEBOOK_BUDGET", "default")' in sources[1]
    for src in sources:
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith("%")))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = node.module.split(".") + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [part for a in node.names for part in a.name.split(".")]
            else:
                continue
            assert not [n for n in names if n.startswith("_")], ast.unparse(node)  # no private modules or names
        assert not re.search(r"\w\._[a-z]", src), src  # no private attributes (obj._x)


def test_scrub_replaces_the_machines_paths():
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    execute = _executor()

    def scrubbed(text: str, names=None) -> list[str]:
        nb = new_notebook(cells=[new_code_cell("x", outputs=[
            new_output("stream", name="stderr", text=text),
            new_output("display_data", data={"text/plain": text, "image/png": "iVBOR"})])])
        clean = execute.scrub(nb, names)
        assert "iVBOR" in json.dumps(clean)
        return [clean.cells[0].outputs[0]["text"], clean.cells[0].outputs[1]["data"]["text/plain"]]

    # this machine's paths, wherever the environment lies (under the temporary directory or not)
    names = execute.machine_names()
    tmp = next(p for p, n in names.items() if n == "<tmp>")
    text = f"wrote {tmp}/dflash-train-x1_y/run/metrics.jsonl\nfrom {execute.ROOT}/dflash_jax/viz.py and {execute.sys.prefix}/lib\n"
    expected = "wrote <tmp>/run/metrics.jsonl\nfrom <repo>/dflash_jax/viz.py and <env>/lib\n"
    assert scrubbed(text) == [expected, expected]
    assert not [p for p in execute.machine_paths() if p in json.dumps(scrubbed(text))]
    # the most specific path first, whatever the order of the directories: an environment or a
    # checkout inside the temporary directory, a temporary directory inside the home, a home
    # that is a prefix of a sibling's name
    layouts = [
        {"/tmp": "<tmp>", "/tmp/venv": "<env>", "/home/me/src/repo": "<repo>", "/home/me": "~"},
        {"/tmp": "<tmp>", "/tmp/ci/env": "<env>", "/tmp/ci/checkout": "<repo>", "/root": "~"},
        {"/home/me/tmp": "<tmp>", "/home/me": "~", "/opt/env": "<env>", "/srv/repo": "<repo>"},
    ]
    for layout in layouts:
        by = {n: p for p, n in layout.items()}
        text = (f"wrote {by['<tmp>']}/run-1a/x.json\nfrom {by['<repo>']}/dflash_jax/viz.py and {by['<env>']}/lib "
                f"in {by['~']}/.cache and {by['~']}x/other\n")
        out = scrubbed(text, layout)[0]
        assert out == (f"wrote <tmp>/x.json\nfrom <repo>/dflash_jax/viz.py and <env>/lib in ~/.cache and "
                       f"{by['~']}x/other\n"), (layout, out)
    # negative control: the order-dependent replacement (temporary directory first) gets the
    # first layout wrong, as the old scrub did when the environment lay under the temporary one
    wrong = re.sub(r"/tmp/[\w.-]+", "<tmp>", "and /tmp/venv/lib")
    assert wrong == "and <tmp>/lib" != scrubbed("and /tmp/venv/lib", layouts[0])[0]
