"""Reading the data files the prompt sets (``bench/prompt_sets.py``) and the embedded
default's training data (``embedded/corpus.py``) come from: jsonl / json records, where the
local data directory is, which MBPP rows are its test split.

Of ``dflash_jax`` it imports only ``dflash_jax.files`` (standard library only).
"""

from __future__ import annotations

import gzip
import json
import os

from dflash_jax.files import HOME_ENV, home

DATA_DIR_ENV = "DFLASH_DATA_DIR"
DATASETS_DIR = "datasets"
"""The data directory's name under the project's home (:func:`dflash_jax.files.home`)."""
MBPP_TEST_IDS = range(11, 511)
"""The task ids of MBPP's test split (the rest of the full file is train / validation / few-shot)."""


def default_data_dir() -> str:
    """Where the recipes look for the training data that does not ship with the package (GSM8K
    train; see ``embedded/corpus.py``) when no ``--data-dir`` is given: ``$DFLASH_DATA_DIR``,
    else ``HOME/datasets`` with HOME the project's home (:func:`dflash_jax.files.home`:
    ``$DFLASH_JAX_HOME``, default ``~/.cache/dflash-jax``). Read at each call, never relative to
    the checkout or the working directory; the directory need not exist (what needs a file in it
    says which one, where to get it and where to put it: :func:`describe_data_dir`)."""
    return os.environ.get(DATA_DIR_ENV) or os.path.join(home(), DATASETS_DIR)


def describe_data_dir(given: str | None) -> str:
    """Where the data directory of a command came from, for messages: ``given`` (its
    ``--data-dir``) or the default's source (:func:`default_data_dir`)."""
    if given:
        return "--data-dir"
    if os.environ.get(DATA_DIR_ENV):
        return f"${DATA_DIR_ENV}"
    return f"the default, {DATASETS_DIR}/ under ${HOME_ENV}"


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
