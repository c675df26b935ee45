"""Reading the data files the prompt sets (``bench/prompt_sets.py``) and the embedded
default's training data (``embedded/corpus.py``) come from: jsonl / json records, where the
local data directory is, which MBPP rows are its test split.

It imports nothing of ``dflash_jax``.
"""

from __future__ import annotations

import gzip
import json
import os

DATA_DIR_ENV = "DFLASH_DATA_DIR"
MBPP_TEST_IDS = range(11, 511)
"""The task ids of MBPP's test split (the rest of the full file is train / validation / few-shot)."""


def default_data_dir() -> str | None:
    """Where the *training* data (GSM8K train, MBPP) is looked for when no directory is given:
    ``$DFLASH_DATA_DIR``, else ``../shared/datasets`` beside the repository checkout (resolved
    from the package's location, not the working directory) when it exists, else None."""
    if os.environ.get(DATA_DIR_ENV):
        return os.environ[DATA_DIR_ENV]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cand = os.path.join(os.path.dirname(repo), "shared", "datasets")
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
