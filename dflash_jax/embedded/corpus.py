"""A deterministic offline corpus and byte-level BPE tokenizer for the embedded model.

Sources (nothing is downloaded):
  * the running interpreter's standard library (``.py`` files in sorted order, test suites
    and site-packages excluded, byte-identical files kept once) as plain documents, and its
    documented top-level functions as HumanEval-style instruction examples;
  * GSM8K train (question -> step-by-step solution with ``\\boxed{}``), read from the data
    directory (``--data-dir``, else :func:`dflash_jax.datasets.default_data_dir`), and MBPP
    tasks outside the test split (task ids 11..510), from the data directory when it holds
    MBPP sanitized, else from the package's copy (the same file, shipped for the benchmark).
The drafter's training prompts (:func:`training_prompts`) add synthetic competition math and
chat requests written from templates (``synthetic``) and stdlib methods in the HumanEval format.
Test splits stay held out; 2 % of documents (chosen by content hash) are the held-out set
for the pretraining loss.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import os
import sysconfig
from typing import Iterator

import numpy as np
from dflash_jax.progress import progress

from dflash_jax.checkpoints import save_tokenizer
from dflash_jax.datasets import DATA_DIR_ENV, MBPP_TEST_IDS, default_data_dir, describe_data_dir, read_records
from dflash_jax.prompts import (CHAT_TEMPLATE, EOT, HUMANEVAL_FORMAT, MASK, MATH_SUFFIX, SPECIAL_TOKENS,
                                gsm8k_solution, humaneval_prompt, math_prompt, render_chat)
from dflash_jax.bench.prompt_sets import DATASETS, load_prompt_set, shipped_data_dir
from dflash_jax.embedded import synthetic

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


def function_examples(files: list[tuple[str, str]], max_lines: int = 40,
                      methods: bool = False) -> Iterator[tuple[str, str]]:
    """(signature + docstring, full function) of documented top-level functions; with
    ``methods``, also of the documented methods of top-level classes (in source order), each
    under its class line (``class C(Base):`` then the indented method)."""
    for _, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                ex = _function_example(node, lines, max_lines)
                if ex:
                    yield ex
            elif methods and isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                header = lines[node.lineno - 1]
                if not header.rstrip().endswith(":"):  # a class line continued over lines
                    continue
                for item in node.body:
                    ex = isinstance(item, ast.FunctionDef) and _function_example(item, lines, max_lines)
                    if ex:
                        yield f"{header}\n{ex[0]}", f"{header}\n{ex[1]}"


def _function_example(node, lines: list[str], max_lines: int) -> tuple[str, str] | None:
    if node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node, clean=False)
    if not doc or not node.body or node.end_lineno - node.lineno + 1 > max_lines:
        return None
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    head_end = node.body[0].end_lineno
    if len(node.body) < 2:
        return None
    head = "\n".join(lines[first - 1:head_end])
    full = "\n".join(lines[first - 1:node.end_lineno])
    return head, full


GSM8K_TRAIN = "gsm8k/train.jsonl"
MBPP_SANITIZED = "mbpp/sanitized-mbpp.json"
TRAINING_FILES = {
    GSM8K_TRAIN: ("GSM8K train", "grade_school_math/data/train.jsonl from https://github.com/openai/"
                  "grade-school-math (or the hub's openai/gsm8k, config main, split train, saved as jsonl)"),
    MBPP_SANITIZED: ("MBPP sanitized", "sanitized-mbpp.json from https://github.com/google-research/"
                     "google-research/tree/master/mbpp (or the hub's google-research-datasets/mbpp, config "
                     "sanitized, all splits as one JSON list)"),
}
"""The training files of the embedded recipe, by their place under the data directory: (name,
what to download)."""
SHIPPED_TRAINING_FILES = (MBPP_SANITIZED,)
"""Those the package ships (with the benchmark's data): used when the data directory lacks them."""


def training_file(data_dir: str | None, name: str) -> str | None:
    """The file ``name`` (a key of :data:`TRAINING_FILES`) the recipe reads: ``data_dir/name``
    when it exists, else the package's copy of a shipped one, else None."""
    if data_dir is not None and os.path.exists(os.path.join(data_dir, name)):
        return os.path.join(data_dir, name)
    if name in SHIPPED_TRAINING_FILES:
        return os.path.join(shipped_data_dir(), name)
    return None


def gsm8k_train(data_dir: str) -> list[tuple[str, str]]:
    path = training_file(data_dir, GSM8K_TRAIN) or os.path.join(data_dir, GSM8K_TRAIN)
    return [(math_prompt(r["question"]), gsm8k_solution(r["answer"])) for r in read_records(path)]


def mbpp_train(data_dir: str | None) -> list[tuple[str, str]]:
    path = training_file(data_dir, MBPP_SANITIZED)
    return [(r["prompt"], f"```python\n{r['code'].strip()}\n```") for r in read_records(path)
            if int(r["task_id"]) not in MBPP_TEST_IDS]


def check_training_data(data_dir: str | None) -> str:
    """The data directory the embedded recipe trains from: ``data_dir`` (``--data-dir``), else
    :func:`dflash_jax.datasets.default_data_dir`, checked to hold the files of
    :data:`TRAINING_FILES` that do not ship (the benchmark's test splits are never trained on).
    Raises FileNotFoundError, in one line, naming each missing file's path, what to download
    and where to put it."""
    resolved = data_dir or default_data_dir()
    missing = [f for f in TRAINING_FILES if training_file(resolved, f) is None]
    if missing:
        paths = [os.path.join(resolved, f) for f in missing]
        raise FileNotFoundError(
            f"{' and '.join(paths)} not found: the embedded recipe trains on "
            f"{' and '.join(TRAINING_FILES[f][0] for f in missing)}, which the package does not ship. "
            + "; ".join(f"Download {TRAINING_FILES[f][1]} to {p}" for f, p in zip(missing, paths))
            + f" (data directory: {describe_data_dir(data_dir)}), or give another data directory holding "
            f"{' and '.join(missing)} with --data-dir DIR or ${DATA_DIR_ENV}")
    return resolved


SOURCES = ("stdlib", "stdlib_functions", "gsm8k_train", "mbpp_train")
"""The corpus's document sources, in the order they are packed."""


def check_sources(sources=None) -> tuple[str, ...]:
    """The chosen ``sources`` (default all of :data:`SOURCES`), in :data:`SOURCES` order;
    ValueError, in one line, for an unknown or empty choice."""
    chosen = SOURCES if sources is None else tuple(sources)
    bad = [x for x in chosen if x not in SOURCES]
    if bad or not chosen:
        raise ValueError(f"unknown corpus source(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                         f"choose from {', '.join(SOURCES)}")
    return tuple(x for x in SOURCES if x in chosen)


def build_documents(data_dir: str, stdlib_root: str | None = None, instruct_repeats: int = 2,
                    sources=None) -> dict:
    """The documents of ``sources`` (default all) as text, tagged by source. Instruction
    examples use the chat format and appear ``instruct_repeats`` times."""
    sources = check_sources(sources)
    data_dir = check_training_data(data_dir)
    chat = lambda u, a: render_chat([{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                                    add_generation_prompt=False)
    files = stdlib_files(stdlib_root) if {"stdlib", "stdlib_functions"} & set(sources) else []
    make = {"stdlib": lambda: [t for _, t in files],
            "stdlib_functions": lambda: [chat(humaneval_prompt(h), f"```python\n{f}\n```")
                                         for h, f in function_examples(files)],
            "gsm8k_train": lambda: [chat(u, a) for u, a in gsm8k_train(data_dir)],
            "mbpp_train": lambda: [chat(u, a) for u, a in mbpp_train(data_dir)]}
    docs = {k: make[k]() for k in sources}
    for k in ("stdlib_functions", "gsm8k_train", "mbpp_train"):
        if k in docs:
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
                 stdlib_root: str | None = None, sources=None, tokenizer_dir: str | None = None) -> dict:
    """Writes ``out_dir/tokenizer`` and ``out_dir/{train,heldout}.npy`` (uint16 [n, seq_len]
    packed token rows, documents joined by ``<|endoftext|>``) and ``corpus.json``.

    ``sources``: the document sources to pack (default all of :data:`SOURCES`).
    ``tokenizer_dir``: an existing target's directory whose tokenizer is copied and used instead
    of training one (``vocab_size`` is then the tokenizer's): the corpus for fine-tuning that
    target (``pretrain --init-from``)."""
    sources = check_sources(sources)
    data_dir = check_training_data(data_dir)  # before anything is written
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        if EOT not in tok.get_vocab():
            raise ValueError(f"the tokenizer of {tokenizer_dir} has no {EOT!r} token to join documents with; "
                             f"give a target whose tokenizer the embedded recipe made")
        if len(tok) > 65536:
            raise ValueError(f"the tokenizer of {tokenizer_dir} has {len(tok)} tokens; the corpus stores "
                             f"tokens as uint16 (at most 65536)")
    os.makedirs(out_dir, exist_ok=True)
    docs = build_documents(data_dir, stdlib_root, sources=sources)
    train = [(k, t) for k in docs for t in docs[k] if not is_held_out(t)]
    held = [(k, t) for k in docs for t in docs[k] if is_held_out(t)]
    if tokenizer_dir is None:
        tok = train_tokenizer([t for _, t in train], vocab_size, os.path.join(out_dir, "tokenizer"))
    else:
        save_tokenizer(tok, os.path.join(out_dir, "tokenizer"))
    eot = tok.convert_tokens_to_ids(EOT)
    stats = {}
    for name, part in (("train", train), ("heldout", held)):
        ids, counts = [], {}
        for k, t in progress(part, desc=f"tokenizing {name}", unit="doc"):
            e = tok.encode(t) + [eot]
            ids += e
            counts[k] = counts.get(k, 0) + len(e)
        n = len(ids) // seq_len
        rows = np.asarray(ids[:n * seq_len], np.uint16).reshape(n, seq_len)
        np.save(os.path.join(out_dir, f"{name}.npy"), rows)
        stats[name] = {"documents": len(part), "tokens": len(ids), "rows": n, "tokens_by_source": counts}
    # sources by content, not by this machine's paths
    data_files = {f: _sha256(training_file(data_dir, f)) for f in TRAINING_FILES}
    meta = {"vocab_size": len(tok), "seq_len": seq_len, "sources": list(sources),
            "tokenizer": "trained" if tokenizer_dir is None else "an existing target's",
            "data_files_sha256": data_files,
            **({"stdlib": "given directory" if stdlib_root else "the running Python's standard library"}
               if {"stdlib", "stdlib_functions"} & set(sources) else {}),
            "python": ".".join(map(str, __import__("sys").version_info[:3])), **stats}
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


STYLES = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
"""The drafter-training prompt styles, one per benchmark prompt set, each rendered in that
set's format: GSM8K train questions (``math_prompt``), synthetic competition math
(``math_prompt``, ``synthetic.math_problems``), stdlib functions and methods (``humaneval_prompt``),
MBPP non-test tasks (as they are), synthetic single-turn chat requests (``synthetic.chat_requests``)."""
SYNTHETIC_SIZE = 20_000
"""Prompts generated for each synthetic style (math500, mt-bench; mt-bench adds a few per
standard library module)."""


def check_styles(styles=None, weights: dict | None = None) -> dict[str, float]:
    """{style: weight} of the chosen ``styles`` (default: all of :data:`STYLES`), in
    :data:`STYLES` order; ``weights`` (default 1 each) must name chosen styles and be > 0."""
    styles = list(STYLES if styles is None else [styles] if isinstance(styles, str) else styles)
    bad = [x for x in styles if x not in STYLES]
    if bad or not styles:
        raise ValueError(f"unknown prompt style(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                         f"choose from {', '.join(STYLES)}")
    weights = dict(weights or {})
    extra = [x for x in weights if x not in styles]
    if extra:
        raise ValueError(f"weights for style(s) not chosen: {', '.join(map(repr, extra))} "
                         f"(chosen: {', '.join(s for s in STYLES if s in styles)})")
    out = {x: float(weights.get(x, 1.0)) for x in STYLES if x in styles}
    bad_w = {k: v for k, v in out.items() if not v > 0 or v == float("inf")}
    if bad_w:
        raise ValueError(f"style weights must be positive numbers, got {bad_w}")
    return out


def benchmark_test_prompts() -> set[str]:
    """Every user turn of the benchmark's test splits as the benchmark renders it (gsm8k,
    math500, mbpp, mt-bench shipped in ``dflash_jax/bench/data``; HumanEval from its package)."""
    return {t for name in DATASETS for smp in load_prompt_set(name, shipped_data_dir()) for t in smp.turns}


def benchmark_overlaps(prompts: list[str]) -> list[tuple[str, str]]:
    """(prompt, test question) for each prompt that equals or contains the question text of a
    benchmark test-split prompt (:func:`benchmark_test_prompts` without the math suffix or the
    HumanEval frame); under a second for 50,000 prompts."""
    by_words, short = _benchmark_questions()
    out = []
    for p in prompts:
        w = p.split()
        for key in by_words.keys() & set(zip(w, w[1:])):
            out += [(p, q) for q in by_words[key] if q in p]
    joined = "\0".join(prompts)
    for q in short:
        if q and q in joined:
            out += [(p, q) for p in prompts if q in p]
    return out


@functools.lru_cache(maxsize=1)
def _benchmark_questions() -> tuple[dict, list]:
    head, tail = HUMANEVAL_FORMAT.split("{prompt}")
    questions = set()
    for t in benchmark_test_prompts():
        if t.endswith(MATH_SUFFIX):
            t = t[:-len(MATH_SUFFIX)]
        elif t.startswith(head) and t.endswith(tail):
            t = t[len(head):-len(tail)]
        questions.add(t.strip())
    # a question inside a prompt has its inner words as whole words of the prompt: look the
    # prompts up by the question's 2nd and 3rd words; search the few short questions directly
    by_words, short = {}, []
    for q in questions:
        w = q.split()
        if len(w) >= 4:
            by_words.setdefault((w[1], w[2]), []).append(q)
        else:
            short.append(q)
    return by_words, sorted(short)


@functools.lru_cache(maxsize=4)
def _synthetic_pool(style: str, size: int) -> tuple[str, ...]:
    """The synthetic math500 / mt-bench prompts, rendered, without benchmark overlaps (cached:
    the same for every call)."""
    texts = ([math_prompt(q) for q in synthetic.math_problems(size)] if style == "math500"
             else synthetic.chat_requests(size))
    leaks = {p for p, _ in benchmark_overlaps(texts)}
    return tuple(p for p in texts if p not in leaks)


def training_prompt_pools(data_dir: str | None, styles=None, stdlib_root: str | None = None) -> dict[str, list[str]]:
    """{style: every prompt it can give}, for the chosen ``styles`` (:func:`check_styles`),
    each in its benchmark's format; a prompt is kept once (by the first style in :data:`STYLES`
    order that has it) and never when it holds a benchmark test-split question
    (:func:`benchmark_overlaps`; one MBPP non-test task, 569, repeats test task 104's text).
    ``data_dir`` is read for gsm8k (and mbpp, when it holds MBPP sanitized) only."""
    chosen = check_styles(styles)
    if "gsm8k" in chosen:
        data_dir = check_training_data(data_dir)
    files = stdlib_files(stdlib_root) if "humaneval" in chosen or "mt-bench" in chosen else []
    make = {
        "gsm8k": lambda: [u for u, _ in gsm8k_train(data_dir)],
        "math500": lambda: _synthetic_pool("math500", SYNTHETIC_SIZE),
        "humaneval": lambda: [humaneval_prompt(h) for h, _ in function_examples(files, methods=True)],
        "mbpp": lambda: [u for u, _ in mbpp_train(data_dir)],
        "mt-bench": lambda: (*_synthetic_pool("mt-bench", SYNTHETIC_SIZE),
                             *synthetic.stdlib_requests(synthetic.stdlib_topics(files))),
    }
    seen, pools = set(), {}
    for name in chosen:
        pools[name] = []
        for p in make[name]():
            if p not in seen:
                seen.add(p)
                pools[name].append(p)
    checked = set().union(*(_synthetic_pool(x, SYNTHETIC_SIZE) for x in ("math500", "mt-bench") if x in chosen))
    leaks = {p for p, _ in benchmark_overlaps([p for p in seen if p not in checked])}
    return {name: [p for p in pool if p not in leaks] for name, pool in pools.items()}


def available_training_prompts(data_dir: str | None, num: int, styles=None, stdlib_root: str | None = None) -> int:
    """How many of ``num`` prompts :func:`training_prompts` gives (min(num, all the pools
    hold)); the standard library's functions (seconds to parse) are scanned only when the
    other styles fall short."""
    chosen = check_styles(styles)
    if "humaneval" in chosen and len(chosen) > 1:
        rest = sum(map(len, training_prompt_pools(data_dir, [s for s in chosen if s != "humaneval"],
                                                  stdlib_root).values()))
        if rest >= num:  # adding a style never shrinks the union
            return num
    return min(num, sum(map(len, training_prompt_pools(data_dir, chosen, stdlib_root).values())))


def training_prompts(data_dir: str | None, num: int, seed: int = 0, stdlib_root: str | None = None, *,
                     styles=None, weights: dict | None = None) -> list[str]:
    """Drafter-training prompts (user texts in the benchmarks' formats), mixed from the
    ``styles`` (default all of :data:`STYLES`, see :func:`training_prompt_pools`) in shares
    proportional to ``weights`` (default equal); a style with fewer prompts than its share gives
    all it has and the rest is shared among the others. Sampled without replacement and
    shuffled with ``seed``; min(num, available) prompts, all distinct. No test split is used.

    What each style can give (Python 3.11's standard library, GSM8K train and the MBPP
    sanitized file the package ships): gsm8k 7473, math500 20000 (:data:`SYNTHETIC_SIZE`),
    humaneval about 3800 (1075 functions, the rest methods), mbpp 169, mt-bench 20000 + 3 per documented stdlib
    module (about 21200): about 52600 in all. ``num=40000`` takes all of gsm8k, humaneval and
    mbpp and about 14300 each of math500 and mt-bench."""
    pools = training_prompt_pools(data_dir, styles, stdlib_root)
    w = check_styles(list(pools), weights)
    rng = np.random.default_rng(seed)
    out, left = [], sum(w.values())
    names = sorted(pools, key=lambda n: len(pools[n]) / w[n])  # the most constrained first
    for i, name in enumerate(names):
        pool = pools[name]
        share = num - len(out) if i == len(names) - 1 else math.floor((num - len(out)) * w[name] / left)
        k = min(len(pool), share)
        out += [pool[j] for j in rng.choice(len(pool), k, replace=False)]
        left -= w[name]
    rng.shuffle(out)
    return out
