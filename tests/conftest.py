"""Shared fixtures: tiny Hugging Face checkpoints made by transformers with random weights."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# XLA:CPU compiles fast rather than well for the whole run, this process and every subprocess
# (tests/support/fast_compile.py: compiling is nearly all of the suite's time)
from support import fast_compile  # noqa: E402

fast_compile.apply()
# One persistent compilation cache for the whole run, this process and the command-line
# subprocesses it starts (they inherit the environment): the same engine programs are compiled
# by many test modules (each module ends with jax.clear_caches(), below) and by every `python -m
# dflash_jax ...` the tests run. Entries are keyed by the program and the jax/XLA version, so a
# hit is the same executable; a fresh directory per run keeps runs independent.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflash-jax-tests-xla-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


# The adaptive block size's measured cost tables (dflash_jax.verification.adaptive) go to a fresh
# directory per run too, not to the user's ~/.cache.
_OWN_COSTS = None
if "DFLASH_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_COSTS = os.environ["DFLASH_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflash-jax-tests-costs-")


def pytest_unconfigure(config):
    import shutil

    for own in (_OWN_CACHE, _OWN_COSTS):
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)

import importlib.util
import re

import pytest

from support.tiers import tiered
from support.tiny_models import HF_VARIANTS, make_hf_model

FAST_VARIANT = "qwen3-tied-bias"

# Modules marked `torch` (transformers' PyTorch models as the oracle) or `triton` (the Triton kernel
# in Triton's interpreter) import those packages at module level. In an environment without them
# (.ci/newest-jax: Python 3.12, no PyTorch) they are not collected, and the header says how many;
# `-m "not torch and not triton"` selects the same tests wherever the packages are installed.
_MISSING = {m for m in ("torch", "triton") if importlib.util.find_spec(m) is None}
_NOT_COLLECTED: list = []


def pytest_ignore_collect(collection_path, config):
    if not _MISSING or not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    header = re.search(r"^pytestmark = (.+)$", collection_path.read_text(), re.M)
    needs = set(re.findall(r"pytest\.mark\.(\w+)", header.group(1))) & _MISSING if header else set()
    if needs:
        _NOT_COLLECTED.append(collection_path.name)
        return True
    return None


# The longest work units first. Under `--dist loadgroup` pytest-xdist hands each worker the next
# unit (an xdist_group, else one test) in collection order, so a long unit collected late runs on
# one worker while the other has finished and waits: the suite's tail. Listed here (from CI's
# `--durations`: 60-175 s each, with their groups' other tests), they start first and the short
# tests fill in around them. The order within each part is unchanged.
LONGEST_FIRST = (
    "tests/experiments/test_experiments.py",
    "tests/tools/test_gpu_suite.py",
    "tests/parallel/test_parallel.py",
    "tests/parallel/test_expert_parallel.py",
    "tests/experiments/test_ablation_budget.py",
    "tests/experiments/test_compare_methods.py",
    "tests/embedded/test_embedded_default.py",
    "tests/notebooks/test_notebooks.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item):
        path = item.nodeid.split("::")[0]
        path = path if path.startswith("tests/") else "tests/" + path
        return rank.get(path, len(LONGEST_FIRST))

    items[:] = sorted(items, key=key)  # stable: the rest keeps its order


def pytest_report_header(config):
    if _MISSING:
        return (f"{', '.join(sorted(_MISSING))} not installed: modules marked so are not collected "
                f"(tests/conftest.py)")


def pytest_terminal_summary(terminalreporter):
    if _NOT_COLLECTED:
        terminalreporter.write_line(f"not collected ({', '.join(sorted(_MISSING))} not installed): "
                                    f"{len(_NOT_COLLECTED)} modules")


@pytest.fixture(scope="session", params=tiered(sorted(HF_VARIANTS), fast=[FAST_VARIANT]))
def hf_checkpoint(request, tmp_path_factory):
    """(name, torch model, checkpoint directory) for each variant of the parity grid (the fast
    tier runs one: qwen3 with tied embeddings and attention biases; the whole suite all four)."""
    kind, overrides = HF_VARIANTS[request.param]
    model = make_hf_model(kind, **overrides)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, str(path)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jit caches after each test module. A full run compiles hundreds of programs (the
    Pallas interpreter's are large); keeping them all made XLA's CPU compiler crash late in the
    suite (segfault while compiling, never in a module run alone)."""
    yield
    import jax

    jax.clear_caches()


@pytest.fixture(scope="session")
def paper_all(tmp_path_factory):
    """``python -m experiments.paper all --preset test`` (every table, figure and ablation, real
    training and evaluation; the smoke preset's grids and budget at the test suite's size: short
    training sequences and prompts of one program shape, so each program compiles once for every
    cell and item that runs it) into one directory: (root, work, results by item and ablation);
    ``root/paper`` and ``root/ablations/<name>`` hold the outputs, ``work`` the shared data,
    drafters, cells and measurements. Session scope: tests/experiments/test_experiments.py and
    tests/experiments/test_paper.py share it on one xdist worker (their xdist_group)."""
    from dflash_jax.experiments import paper

    # pytest-xdist tears session fixtures down whenever a worker's queue runs dry and builds them
    # again for its next test (the last CI built this one twice, 410 + 497 s): the run is kept for
    # the life of the process, its directory outlives the teardown
    # Should a second xdist worker need it anyway (seen in CI: the groups of test_paper.py and
    # test_experiments.py did not keep it on one worker), the workers share one directory under
    # the run's base temp: the second waits for the first's run, then runs it again from the
    # cached data, drafters, cells and measurements (the resume path, minutes instead of 15).
    if "run" not in _PAPER_ALL:
        from dflash_jax.files import exclusive

        if os.environ.get("PYTEST_XDIST_WORKER"):
            root = tmp_path_factory.getbasetemp().parent / "experiments-shared"
            root.mkdir(exist_ok=True)
        else:
            root = tmp_path_factory.mktemp("experiments")
        work = str(root / "work")
        with exclusive(str(root / "build.lock")):
            results = paper.run("all", "test", out=str(root / "paper"), work=work,
                                ablations_out=str(root / "ablations"))
        _PAPER_ALL["run"] = (root, work, results)
    return _PAPER_ALL["run"]


_PAPER_ALL: dict = {}


@pytest.fixture(scope="session")
def smoke(paper_all):
    """(root, work, the depth ablation's Table, the block-size ablation's Table) of ``paper_all``."""
    root, work, results = paper_all
    return root, work, results["ablate_depth"], results["ablate_block_size"]
