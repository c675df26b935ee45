"""A deterministic offline corpus and byte-level BPE tokenizer for the embedded model.

Sources (nothing is downloaded):
  * the running interpreter's standard library (``.py`` files in sorted order, test suites
    and site-packages excluded, byte-identical files kept once) as plain documents, and its
    documented top-level functions as HumanEval-style instruction examples;
  * GSM8K train (question -> step-by-step solution with ``\\boxed{}``) and MBPP tasks outside
    the test split (task ids 11..510), read from ``--data-dir``.
Test splits stay held out; 2 % of documents (chosen by content hash) are the held-out set
for the pretraining loss.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
from typing import Iterator

import numpy as np
from tqdm import tqdm

from dflash_jax.checkpoints import save_tokenizer
from dflash_jax.datasets import MBPP_TEST_IDS, read_records
from dflash_jax.prompts import (CHAT_TEMPLATE, EOT, MASK, SPECIAL_TOKENS, gsm8k_solution,
                                humaneval_prompt, math_prompt, render_chat)

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
             "turtledemo", "lib2to3", "idlelib", "ensurepip", "config-3.11-x86_64-linux-gnu"}
MAX_FILE_BYTES = 200_000


def stdlib_files(root: str | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's Python files, sorted, deduplicated."""
    root = root or sysconfig.get_paths()["stdlib"]
    seen, out = set(), []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(d, name)
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, "rb") as f:
                raw = f.read()
            digest = hashlib.sha256(raw).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.append((os.path.relpath(path, root), text))
    out.sort()
    return out


def function_examples(files: list[tuple[str, str]], max_lines: int = 40) -> Iterator[tuple[str, str]]:
    """(signature + docstring, full function) of documented top-level functions."""
    for _, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=False)
            if not doc or not node.body or node.end_lineno - node.lineno + 1 > max_lines:
                continue
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            head_end = node.body[0].end_lineno
            if len(node.body) < 2:
                continue
            head = "\n".join(lines[first - 1:head_end])
            full = "\n".join(lines[first - 1:node.end_lineno])
            yield head, full


def gsm8k_train(data_dir: str) -> list[tuple[str, str]]:
    path = os.path.join(data_dir, "gsm8k", "train.jsonl")
    return [(math_prompt(r["question"]), gsm8k_solution(r["answer"])) for r in read_records(path)]


def mbpp_train(data_dir: str) -> list[tuple[str, str]]:
    path = os.path.join(data_dir, "mbpp", "sanitized-mbpp.json")
    return [(r["prompt"], f"```python\n{r['code'].strip()}\n```") for r in read_records(path)
            if int(r["task_id"]) not in MBPP_TEST_IDS]


TRAINING_FILES = {
    "gsm8k/train.jsonl": "GSM8K train: https://github.com/openai/grade-school-math "
                         "(grade_school_math/data/train.jsonl), or the hub's openai/gsm8k, config main, "
                         "split train, saved as jsonl",
    "mbpp/sanitized-mbpp.json": "MBPP sanitized: https://github.com/google-research/google-research/"
                                "tree/master/mbpp (sanitized-mbpp.json), or the hub's "
                                "google-research-datasets/mbpp, config sanitized, all splits as one JSON list",
}


def check_training_data(data_dir: str | None) -> str:
    """The data directory the embedded build trains from, checked: it must hold the files of
    :data:`TRAINING_FILES` (the benchmark's test splits, shipped in the package, are never
    trained on). Raises FileNotFoundError saying what is missing and where to get it."""
    if data_dir is None:
        missing = list(TRAINING_FILES)
        where = "no data directory was given (--data-dir), $DFLASH_DATA_DIR is unset and there is no ../shared/datasets beside the checkout"
    else:
        missing = [f for f in TRAINING_FILES if not os.path.exists(os.path.join(data_dir, f))]
        where = ", ".join(f"{os.path.join(data_dir, f)} not found" for f in missing)
    if missing:
        raise FileNotFoundError(
            f"{where}. The embedded build trains on {', '.join(missing)} from a data directory "
            f"(--data-dir DIR or $DFLASH_DATA_DIR) laid out as DIR/{' and DIR/'.join(missing)}. "
            "Get them from: " + "; ".join(TRAINING_FILES[f] for f in missing) + ".")
    return data_dir


def build_documents(data_dir: str, stdlib_root: str | None = None, instruct_repeats: int = 2) -> dict:
    """All documents as text, tagged by source. Instruction examples use the chat format."""
    check_training_data(data_dir)
    files = stdlib_files(stdlib_root)
    chat = lambda u, a: render_chat([{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                                    add_generation_prompt=False)
    funcs = [chat(humaneval_prompt(h), f"```python\n{f}\n```") for h, f in function_examples(files)]
    docs = {"stdlib": [t for _, t in files], "stdlib_functions": funcs,
            "gsm8k_train": [chat(u, a) for u, a in gsm8k_train(data_dir)],
            "mbpp_train": [chat(u, a) for u, a in mbpp_train(data_dir)]}
    for k in ("stdlib_functions", "gsm8k_train", "mbpp_train"):
        docs[k] = docs[k] * instruct_repeats
    return docs


def is_held_out(text: str, percent: int = 2) -> bool:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 100 < percent


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: str):
    """Byte-level BPE (Hugging Face ``tokenizers``) saved for ``AutoTokenizer.from_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, pad_token=EOT,
                                   mask_token=MASK, additional_special_tokens=SPECIAL_TOKENS[2:])
    fast.chat_template = CHAT_TEMPLATE
    save_tokenizer(fast, out_dir)
    return fast


def build_corpus(out_dir: str, data_dir: str, vocab_size: int = 8192, seq_len: int = 256,
                 stdlib_root: str | None = None) -> dict:
    """Writes ``out_dir/tokenizer`` and ``out_dir/{train,heldout}.npy`` (uint16 [n, seq_len]
    packed token rows, documents joined by ``<|endoftext|>``) and ``corpus.json``."""
    os.makedirs(out_dir, exist_ok=True)
    docs = build_documents(data_dir, stdlib_root)
    train = [(k, t) for k in docs for t in docs[k] if not is_held_out(t)]
    held = [(k, t) for k in docs for t in docs[k] if is_held_out(t)]
    tok = train_tokenizer([t for _, t in train], vocab_size, os.path.join(out_dir, "tokenizer"))
    eot = tok.convert_tokens_to_ids(EOT)
    stats = {}
    for name, part in (("train", train), ("heldout", held)):
        ids, counts = [], {}
        for k, t in tqdm(part, desc=f"tokenizing {name}", unit="doc"):
            e = tok.encode(t) + [eot]
            ids += e
            counts[k] = counts.get(k, 0) + len(e)
        n = len(ids) // seq_len
        rows = np.asarray(ids[:n * seq_len], np.uint16).reshape(n, seq_len)
        np.save(os.path.join(out_dir, f"{name}.npy"), rows)
        stats[name] = {"documents": len(part), "tokens": len(ids), "rows": n, "tokens_by_source": counts}
    # sources by content, not by this machine's paths
    data_files = {f: _sha256(os.path.join(data_dir, f)) for f in TRAINING_FILES}
    meta = {"vocab_size": len(tok), "seq_len": seq_len, "data_files_sha256": data_files,
            "stdlib": "given directory" if stdlib_root else "the running Python's standard library",
            "python": ".".join(map(str, __import__("sys").version_info[:3])), **stats}
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def training_prompts(data_dir: str, num: int, seed: int = 0, stdlib_root: str | None = None) -> list[str]:
    """Drafter-training prompts (user texts, benchmark formats): GSM8K train questions, MBPP
    non-test tasks and documented stdlib functions in the HumanEval format, mixed in equal
    parts where they have enough rows, shuffled with ``seed``. No test split is used."""
    check_training_data(data_dir)
    files = stdlib_files(stdlib_root)
    pools = [[u for u, _ in gsm8k_train(data_dir)], [u for u, _ in mbpp_train(data_dir)],
             [humaneval_prompt(h) for h, _ in function_examples(files)]]
    rng = np.random.default_rng(seed)
    out, share = [], num // len(pools)
    for i, pool in enumerate(sorted(pools, key=len)):
        k = min(len(pool), share if i < len(pools) - 1 else num - len(out))
        out += [pool[j] for j in rng.choice(len(pool), k, replace=False)]
        share = (num - len(out)) // max(1, len(pools) - i - 1)
    rng.shuffle(out)
    return out
