"""What a fresh `pip install -e .` needs is declared: every module imports, every third-party
package the code imports is a dependency in pyproject.toml (or an extra, where the code asks for
it by name), the shipped files are package data, and the embedded pair loads from any
directory as the README's snippet shows."""

import ast
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import tomllib

import pytest
from support.tiers import tiered

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# installed package -> its folder in the repository (pyproject.toml's package-dir)
PACKAGES = {"dflash_jax": "dflash_jax", "dflash_jax.kernels": "kernels",
            "dflash_jax.experiments": "experiments", "dflash_jax.tools": "tools"}
# imports that are optional by design, and the extra that declares each
# modules imported only by optional paths -> the extras that must provide them: the Triton
# kernel and the GPU compile report (triton, jax-triton; torch for the Triton interpreter)
OPTIONAL = {"datasets": ("hub",), "triton": ("test", "gpu"), "jax_triton": ("test", "gpu"),
            "torch": ("test",), "dflash": ("reference",), "compressed_tensors": ("reference",)}
# pinned on purpose: the compile reports (registers, spills) depend on the Triton version
PINNED = {"triton", "jax-triton"}


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _modules():
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        yield pkg
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            yield info.name


def _third_party_imports() -> dict[str, set[str]]:
    """top-level module name -> files importing it, for every import in our packages."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, set[str]] = {}
    for pkg, folder in PACKAGES.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                for node in ast.walk(ast.parse(open(path).read(), path)):
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names = [node.module]
                    else:
                        continue
                    for n in names:
                        top = n.split(".")[0]
                        if top not in stdlib and top != "dflash_jax" and top != "__future__":
                            found.setdefault(top, set()).add(os.path.relpath(path, ROOT))
    return found


def test_every_module_imports():
    """Every module imports; one that needs an optional package which is not installed (CI's
    Python 3.12 environment has no triton) fails with an error naming the extra to install."""
    failures = {}
    for name in _modules():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if not (e.name in OPTIONAL and importlib.util.find_spec(e.name) is None
                    and any(f"[{extra}]" in str(e) for extra in OPTIONAL[e.name])):
                failures[name] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - report all of them
            failures[name] = f"{type(e).__name__}: {e}"
    assert not failures, failures


def test_every_package_is_installed_under_the_project_name():
    """pyproject.toml lists every package folder (with its package-dir mapping), and every
    installed package sits under ``dflash_jax``: no top-level name that another distribution has
    (Hugging Face's ``kernels``)."""
    cfg = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"]
    listed = set(cfg["packages"])
    assert all(p == "dflash_jax" or p.startswith("dflash_jax.") for p in listed), listed
    assert cfg["package-dir"] == {k: v for k, v in PACKAGES.items() if k != "dflash_jax"}
    found = set()
    for pkg, folder in PACKAGES.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(pkg if rel == "." else pkg + "." + rel.replace(os.sep, "."))
    assert found == listed, {"not listed": sorted(found - listed), "no folder": sorted(listed - found)}


def test_every_third_party_import_is_declared():
    project = _pyproject()
    declared = {_requirement_name(r) for r in project["dependencies"]}
    extras = {k: {_requirement_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for module, files in _third_party_imports().items():
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if module in OPTIONAL:
            ok = all(names & extras[extra] for extra in OPTIONAL[module])
        else:
            ok = names & declared
        if not ok:
            missing[module] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    # used without an import statement: transformers renders chat templates with jinja2
    assert "jinja2" in declared
    # the test extra is not pinned to one machine's wheel; the gpu extra carries jax-triton
    assert all("==" not in r for r in project["optional-dependencies"]["test"]
               if _requirement_name(r) not in PINNED)
    assert "jax-triton" in extras["gpu"]


def test_shipped_files_are_package_data():
    """Every file under assets/ and bench/data/ matches a package-data pattern, so a
    non-editable install carries them too."""
    import fnmatch

    cfg = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
    patterns = cfg["tool"]["setuptools"]["package-data"]["dflash_jax"]
    base = os.path.join(ROOT, "dflash_jax")
    unmatched = []
    for sub in ("assets", os.path.join("bench", "data")):
        for dirpath, _, files in os.walk(os.path.join(base, sub)):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), base)
                if not any(fnmatch.fnmatch(rel, p) for p in patterns):
                    unmatched.append(rel)
    assert not unmatched, unmatched


@pytest.mark.slow
def test_readme_snippet_runs_from_any_directory(tmp_path):
    """The README's first Python block, run as written in a directory outside the checkout."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert "load_embedded" in snippet
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tau" in out.stdout
    assert "PyTorch was not found" not in out.stderr


@pytest.mark.parametrize("flat", tiered([True, False], fast=[True]))
def test_load_embedded_and_chat_prompts(flat):
    """load_embedded returns the shipped pair; generate takes what apply_chat_template returns
    (a BatchEncoding in transformers 5, a list in 4.x) and one int as stop id."""
    import jax.numpy as jnp
    import numpy as np

    import dflash_jax as dj

    target, drafter = dj.load_embedded(dtype=jnp.float32)
    assert target.path == dj.EMBEDDED_TARGET_DIR and drafter.path == dj.EMBEDDED_DRAFTER_DIR
    assert target.dtype == jnp.float32 and drafter.dtype == jnp.float32
    tok = target.tokenizer
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    enc = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
    ids = list(enc["input_ids"])
    if flat:  # one conversation: a flat input_ids list is one prompt
        prompts = enc
    else:  # a padded batch from the tokenizer, as numpy: padding is dropped with attention_mask
        prompts = tok([tok.decode(ids), "def f(x):"], padding=True, return_tensors="np",
                      add_special_tokens=False)
        assert np.asarray(prompts["attention_mask"]).min() == 0  # really padded
    r = dj.generate(target, prompts, 8, drafter=drafter, stop_token_ids=target.config.eos_token_id[0])
    ref = dj.generate(target, [ids] if flat else [ids, tok.encode("def f(x):")], 8,
                      stop_token_ids=[target.config.eos_token_id[0]])
    assert r.sequences == ref.sequences and r.prompt_lengths == ref.prompt_lengths


def test_generate_rejects_what_it_cannot_use():
    import dflash_jax as dj

    target, drafter = dj.load_embedded()
    with pytest.raises(ValueError, match="max_len=4096 is above the model's max_position_embeddings=2048"):
        dj.load_target(dj.EMBEDDED_TARGET_DIR, max_len=4096)
    assert dj.load_target(dj.EMBEDDED_TARGET_DIR, max_len=4096, allow_extrapolation=True).max_len == 4096
    small = dj.load_target(dj.EMBEDDED_TARGET_DIR, max_len=64)
    with pytest.raises(ValueError, match="block_size=128 is larger than the target's cache"):
        dj.generate(small, [[5, 6]], 4, drafter=drafter, block_size=128)
    with pytest.raises(ValueError, match="without 'input_ids'"):
        dj.generate(target, {"ids": [1, 2]}, 4)


@pytest.mark.slow
def test_stream_after_generate_reuses_the_compiled_loop():
    """generate_stream with the shapes of an earlier generate compiles nothing new."""
    import dflash_jax as dj
    from dflash_jax.decoding import engine

    target, drafter = dj.load_embedded()
    ids = target.tokenizer.encode("def add(a, b):")
    full = dj.generate(target, [ids], 24, drafter=drafter)
    sizes = engine.decode._cache_size(), engine.prefill._cache_size()
    chunks = list(dj.generate_stream(target, [ids], 24, drafter=drafter, iterations_per_chunk=2))
    assert (engine.decode._cache_size(), engine.prefill._cache_size()) == sizes
    assert [t for c in chunks for t in c.tokens[0]] == full.sequences[0]


def test_shipped_cards_record_no_machine_paths():
    """Model cards and training records name commands and sources portably (no absolute paths
    of the machine that built them)."""
    import dflash_jax as dj

    found = []
    for d in (dj.EMBEDDED_TARGET_DIR, dj.EMBEDDED_DRAFTER_DIR):
        for f in os.listdir(d):
            if f.endswith((".md", ".json")) and f != "tokenizer.json":
                text = open(os.path.join(d, f)).read()
                found += [(f, m) for m in re.findall(r"(?<![\w.:])/(?:work|root|home|tmp|Users|opt)/\S*", text)]
    assert not found, found


DEVELOPER_DATA = re.compile(r"\.\./shared\b|\bshared/datasets\b|[\"']shared[\"'],\s*[\"']datasets[\"']")


def developer_data_references(text: str) -> list[str]:
    """The places in ``text`` that point at the developers' data directory beside the checkout."""
    return DEVELOPER_DATA.findall(text)


def test_the_installed_code_names_no_developer_data_directory():
    """A clone holds no ``../shared/datasets``: no installed module looks there or tells the user
    to (the data the recipes need is under --data-dir, $DFLASH_DATA_DIR or the project's home)."""
    found = {}
    for folder in PACKAGES.values():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    hits = developer_data_references(open(path, encoding="utf-8").read())
                    if hits:
                        found[os.path.relpath(path, ROOT)] = hits
    assert not found, found
    # negative controls: what the library said before is caught
    assert developer_data_references('"$DFLASH_DATA_DIR, else ../shared/datasets beside the checkout"')
    assert developer_data_references("os.path.join(repo, 'shared/datasets')")
    assert developer_data_references('os.path.join(os.path.dirname(repo), "shared", "datasets")')
    assert not developer_data_references("shared experts, shared_run, $DFLASH_JAX_HOME/datasets")
