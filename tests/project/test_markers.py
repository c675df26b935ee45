"""The test tiers stay true as tests are added: the marks that select them (registered in
pyproject.toml, `--strict-markers`) are on the modules that need them, and the layout is the
code's. In an environment without PyTorch or Triton (.ci/newest-jax's), tests/conftest.py does not
collect the modules marked torch / triton: a module that needs either without its mark fails
there; this finds it first."""

from __future__ import annotations

import os
import re
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")
# (a transformers ``...ForCausalLM`` class used, not the name written as a string, e.g. the
# architectures of a config.json)
NEEDS_TORCH = re.compile(r"^\s*import torch\b|make_hf_model\(|hf_checkpoint\b|ForCausalLM\b(?!['\"])|ROPE_INIT_FUNCTIONS",
                         re.M)
NEEDS_TRITON = re.compile(r"^\s*(import|from) (triton|jax_triton)\b|triton_block_attention import", re.M)
USES_DEVICES = re.compile(r"\b(run_on_devices|shared_run)\(")


def _test_modules():
    """(path relative to tests/, source) of every test module."""
    out = []
    for d, _, files in os.walk(TESTS):
        for f in files:
            if f.startswith("test_") and f.endswith(".py") and f != os.path.basename(__file__):
                path = os.path.join(d, f)
                out.append((os.path.relpath(path, TESTS), open(path).read()))
    return sorted(out)


MODULES = _test_modules()


def module_marks(source: str) -> set[str]:
    m = re.search(r"^pytestmark = (.+)$", source, re.M)
    return set(re.findall(r"pytest\.mark\.(\w+)", m.group(1))) if m else set()


def test_pytorch_users_carry_the_torch_mark():
    missing = [rel for rel, source in MODULES if NEEDS_TORCH.search(source) and "torch" not in module_marks(source)]
    assert not missing, (f"{missing} use PyTorch (transformers' models as an oracle): add pytest.mark.torch "
                         f"to their pytestmark, or .ci/newest-jax (no PyTorch) fails on them")


def test_triton_users_carry_the_triton_mark():
    missing = [rel for rel, source in MODULES if NEEDS_TRITON.search(source) and "triton" not in module_marks(source)]
    assert not missing, f"{missing} import Triton: add pytest.mark.triton to their pytestmark"


def test_subprocess_meshes_carry_the_multidevice_and_slow_marks():
    missing = [rel for rel, source in MODULES if USES_DEVICES.search(source)
               and not ({"multidevice", "slow"} <= module_marks(source)
                        or "pytest.mark.multidevice\n@pytest.mark.slow" in source)]
    assert not missing, f"{missing} run code on several host devices: mark them (or those tests) multidevice and slow"


def test_every_area_keeps_tests_in_the_fast_tier():
    """The fast tier covers every part of the code: no area is slow as a whole, but two. The
    experiments run end to end by nature; `parallel/`'s checks are subprocess meshes (a fresh
    jax process with 8 host devices each), while the partition tables and the communication
    model they rest on are in the fast tier (targets' partition-table tests,
    tools/test_parallel_comm.py)."""
    fast = {rel.split(os.sep)[0] for rel, source in MODULES if "slow" not in module_marks(source)}
    areas = {rel.split(os.sep)[0] for rel, _ in MODULES}
    assert areas - fast <= {"experiments", "parallel"}, areas - fast


def test_layout_follows_the_code():
    """Test modules sit in a folder named after the code they test (tests/<area>/), helpers in
    tests/support/; no test module at the top of tests/."""
    areas = {rel.split(os.sep)[0] for rel, _ in MODULES}
    assert all(os.sep in rel for rel, _ in MODULES), [rel for rel, _ in MODULES if os.sep not in rel]
    library = set(os.listdir(os.path.join(ROOT, "dflash_jax"))) | {"kernels", "experiments", "tools"}
    project_level = {"cli", "notebooks", "project", "models"}  # the command line, notebooks, packaging and docs
    assert areas - library - project_level == set(), areas - library - project_level
    assert not [f for f in os.listdir(os.path.join(TESTS, "support")) if f.startswith("test_")]


def test_every_mark_used_is_registered():
    registered = {m.split(":")[0] for m in tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
                  ["tool"]["pytest"]["ini_options"]["markers"]}
    used = set()
    for _, source in MODULES:
        used |= set(re.findall(r"pytest\.mark\.(\w+)", source))
    builtin = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
    assert used - builtin <= registered, used - builtin - registered
    assert {"slow", "torch", "multidevice"} <= registered
