"""The embedded drafter's training prompts (``corpus.training_prompts``, ``embedded-prompts``):
five styles in the benchmarks' formats, mixed by weight, deterministic, distinct, and never
holding a benchmark test-split question."""

import ast
import collections
import json
import os

import pytest

from dflash_jax.embedded import corpus, synthetic
from dflash_jax.embedded.cli import training_prompts as embedded_prompts_cli
from dflash_jax.prompts import HUMANEVAL_FORMAT, MATH_SUFFIX, math_prompt

HEAD, TAIL = HUMANEVAL_FORMAT.split("{prompt}")
MBPP_TEST_104 = "Write a function to sort each sublist of strings in a given list of lists."  # = task 569's text

TOOLS = '''"""Tools for the training-prompt tests."""


def scale(x, k):
    """Return x times k."""
    y = x * k
    return y


class Box:
    """A box."""

    def put(self, item):
        """Put an item in the box."""
        self.items.append(item)
        return self

    def _hidden(self):
        """Not a prompt."""
        a = 1
        return a
'''
AGAIN = '''"""The same function again, in another module."""


def scale(x, k):
    """Return x times k."""
    y = x * k
    return y
'''


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    lib = root / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "tools.py").write_text(TOOLS)
    (lib / "pkg" / "again.py").write_text(AGAIN)
    data = root / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "mbpp").mkdir()
    rows = [{"question": f"Sam has {i} pears and eats {i // 2}. How many are left?", "answer": f"#### {i - i // 2}"}
            for i in range(60)]
    rows += rows[:2]  # duplicates: kept once
    (data / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mbpp = [{"task_id": t, "prompt": f"Write a function called task_{t}.", "code": "pass"} for t in (5, 50, 600, 700)]
    mbpp.append({"task_id": 569, "prompt": MBPP_TEST_104, "code": "pass"})  # a non-test row with a test text
    (data / "mbpp" / "sanitized-mbpp.json").write_text(json.dumps(mbpp))
    return str(lib), str(data)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(corpus, "SYNTHETIC_SIZE", 300)


def styles_of(prompts, lib, data):
    where = {p: s for s, pool in corpus.training_prompt_pools(data, stdlib_root=lib).items() for p in pool}
    return collections.Counter(where[p] for p in prompts)


def test_pools_formats_and_dedup(sources, small):
    lib, data = sources
    pools = corpus.training_prompt_pools(data, stdlib_root=lib)
    assert list(pools) == list(corpus.STYLES)
    every = [p for pool in pools.values() for p in pool]
    assert len(every) == len(set(every))  # within and across styles
    # gsm8k: the 60 distinct train questions, as the gsm8k benchmark renders its questions
    assert pools["gsm8k"] == [math_prompt(f"Sam has {i} pears and eats {i // 2}. How many are left?")
                              for i in range(60)]
    # math500: synthetic LaTeX problems in the math500 frame
    assert len(pools["math500"]) == 300
    for p in pools["math500"]:
        body = p[:-len(MATH_SUFFIX)]
        assert p == math_prompt(body)
        plain = body.replace("\\{", "").replace("\\}", "").replace("\\$", "")
        assert plain.count("$") % 2 == 0 and plain.count("{") == plain.count("}"), body
    assert sum("$" in p for p in pools["math500"]) > 0.95 * 300  # LaTeX (a word's letters need none)
    # humaneval: signature + docstring of functions and methods (class line kept), once each
    heads = []
    for p in pools["humaneval"]:
        assert p.startswith(HEAD) and p.endswith(TAIL)
        code = p[len(HEAD):-len(TAIL)]
        fn = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef)]
        assert len(fn) == 1 and ast.get_docstring(fn[0]) and len(fn[0].body) == 1  # the body is the answer
        heads.append(code.splitlines()[0])
    assert heads == ["def scale(x, k):", "class Box:"]
    # mbpp: the non-test tasks as they are, less the one repeating a test task's text
    assert pools["mbpp"] == ["Write a function called task_5.", "Write a function called task_600.",
                             "Write a function called task_700."]
    # mt-bench: plain single-turn requests, some about the given library's modules
    assert len(pools["mt-bench"]) > 300
    assert not any(p.endswith(MATH_SUFFIX) or p.startswith(HEAD) for p in pools["mt-bench"])
    assert any("`tools`" in p for p in pools["mt-bench"]) and any("`pkg.again`" in p for p in pools["mt-bench"])


def test_mix_is_deterministic_and_fills_shares(sources, small):
    lib, data = sources
    a = corpus.training_prompts(data, 200, seed=3, stdlib_root=lib)
    assert a == corpus.training_prompts(data, 200, seed=3, stdlib_root=lib)
    assert a != corpus.training_prompts(data, 200, seed=4, stdlib_root=lib)
    assert len(a) == len(set(a)) == 200
    # equal shares of 40; humaneval has 2, mbpp 3, gsm8k 60: the rest goes to the others
    assert styles_of(a, lib, data) == {"mbpp": 3, "humaneval": 2, "gsm8k": 60, "math500": 67, "mt-bench": 68}
    b = corpus.training_prompts(data, 150, seed=0, stdlib_root=lib, styles=["math500", "mt-bench", "gsm8k"])
    assert styles_of(b, lib, data) == {"math500": 50, "mt-bench": 50, "gsm8k": 50}
    c = corpus.training_prompts(data, 200, seed=0, stdlib_root=lib, styles=["math500", "mt-bench"],
                                weights={"math500": 3})
    assert styles_of(c, lib, data) == {"math500": 150, "mt-bench": 50}
    # asking for more than there is gives all of it, once each
    every = corpus.training_prompts(data, 10**6, seed=0, stdlib_root=lib)
    assert len(every) == len(set(every)) == corpus.available_training_prompts(data, 10**6, stdlib_root=lib)
    assert corpus.available_training_prompts(data, 100, stdlib_root=lib) == 100


@pytest.mark.parametrize("styles, weights, match", [
    (["gsm8k", "bogus"], None, "unknown prompt style.*'bogus'.*choose from gsm8k, math500, humaneval, mbpp, mt-bench"),
    ([], None, r"unknown prompt style.*\(none given\)"),
    (["mbpp"], {"gsm8k": 1}, r"weights for style.*not chosen: 'gsm8k' \(chosen: mbpp\)"),
    (["mbpp"], {"mbpp": 0}, "positive"),
])
def test_bad_styles_and_weights(sources, styles, weights, match):
    lib, data = sources
    with pytest.raises(ValueError, match=match):
        corpus.training_prompts(data, 10, stdlib_root=lib, styles=styles, weights=weights)


def test_embedded_prompts_styles(sources, small, tmp_path):
    lib, data = sources
    out = tmp_path / "p.jsonl"
    # the synthetic styles need no data directory
    rows = embedded_prompts_cli(["--out", str(out), "--num", "40", "--styles", "math500,mt-bench",
                                 "--weights", "math500=3", "--data-dir", str(tmp_path / "none")])
    assert [json.loads(line)["prompt"] for line in open(out)] == rows
    assert sum(r.endswith(MATH_SUFFIX) for r in rows) == 30
    with pytest.raises(ValueError, match="unknown prompt style.*'humaneva'.*choose from gsm8k, math500, humaneval"):
        embedded_prompts_cli(["--out", str(out), "--num", "4", "--styles", "mbpp", "humaneva", "--data-dir", data])
    with pytest.raises(ValueError, match="--weights 'math500:2': expected STYLE=NUMBER"):
        embedded_prompts_cli(["--out", str(out), "--num", "4", "--weights", "math500:2", "--data-dir", data])
    with pytest.raises(ValueError, match="--num 10: .* give only 3 prompts .styles mbpp.; ask for 3 or fewer"):
        embedded_prompts_cli(["--out", str(tmp_path / "q.jsonl"), "--num", "10", "--styles", "mbpp",
                              "--data-dir", data])
    assert not (tmp_path / "q.jsonl").exists()


def test_the_overlap_check_finds_test_questions():
    from dflash_jax.bench.prompt_sets import load_prompt_set

    gsm, math500 = load_prompt_set("gsm8k")[7].turns[0], load_prompt_set("math500")
    shortest = min((s.turns[0][:-len(MATH_SUFFIX)] for s in math500), key=len)  # a few words
    planted = [gsm,  # a test prompt as it is
               "Before we start: " + math500[3].turns[0][:-len(MATH_SUFFIX)] + " Thanks!",  # a question inside
               "Please check:\n" + load_prompt_set("humaneval")[2].turns[0][len(HEAD):-len(TAIL)],
               "First this. " + load_prompt_set("mt-bench")[5].turns[1],  # a second turn counts too
               f"Warm-up: {shortest} Then rest.",
               MBPP_TEST_104]
    found = corpus.benchmark_overlaps(planted + ["What is $2 + 2$?"])
    assert sorted({p for p, _ in found}) == sorted(planted)


@pytest.mark.slow
def test_no_prompt_holds_a_benchmark_test_question():
    """The synthetic generators at their full size hold no test question before any filtering;
    nor does any pool built from the real training data and this interpreter's stdlib."""
    from dflash_jax.datasets import default_data_dir

    size = corpus.SYNTHETIC_SIZE
    for style in ("math500", "mt-bench"):  # the generators' own output, less overlaps: none dropped
        assert len(corpus._synthetic_pool(style, size)) == size
    assert corpus.benchmark_overlaps(synthetic.stdlib_requests(synthetic.stdlib_topics(corpus.stdlib_files()))) == []
    # the real GSM8K train (not shipped): the user's data directory, else the copy CI keeps beside
    # the checkout (a test-only place; the library never looks there)
    ci_copy = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "datasets")
    data = next((d for d in (default_data_dir(), ci_copy)
                 if os.path.exists(os.path.join(d, "gsm8k", "train.jsonl"))), None)
    if data is None:
        pytest.skip(f"needs the real GSM8K train in the data directory ({default_data_dir()}/gsm8k/train.jsonl; "
                    "$DFLASH_DATA_DIR or $DFLASH_JAX_HOME/datasets)")
    pools = corpus.training_prompt_pools(data)
    every = [p for pool in pools.values() for p in pool]
    assert corpus.benchmark_overlaps(every) == [] and not set(every) & corpus.benchmark_test_prompts()
    assert MBPP_TEST_104 in [u for u, _ in corpus.mbpp_train(data)] and MBPP_TEST_104 not in pools["mbpp"]
    # the capacity the docstring of training_prompts states
    assert {s: len(p) for s, p in pools.items() if s in ("gsm8k", "mbpp", "math500")} == \
        {"gsm8k": 7473, "math500": size, "mbpp": 169}
    assert len(pools["humaneval"]) > 3000 and len(pools["mt-bench"]) > size and len(every) > 40_000


def test_embedded_prompts_drop_the_ones_too_long_for_the_data(tmp_path):
    """--max-prompt-tokens keeps exactly the prompts whose chat-rendered length (the embedded
    target's tokenizer, as train-data renders them) is within the bound, in their order."""
    from transformers import AutoTokenizer

    from dflash_jax.models.handles import EMBEDDED_TARGET_DIR
    from dflash_jax.prompts import encode_prompt

    args = ["--num", "60", "--styles", "math500,mt-bench", "--seed", "5", "--data-dir", str(tmp_path / "none")]
    every = embedded_prompts_cli(["--out", str(tmp_path / "all.jsonl"), *args])
    tok = AutoTokenizer.from_pretrained(EMBEDDED_TARGET_DIR)
    lengths = [len(encode_prompt(r, tok)) for r in every]
    bound = sorted(lengths)[len(lengths) // 2]  # about half are longer
    kept = embedded_prompts_cli(["--out", str(tmp_path / "short.jsonl"), *args, "--max-prompt-tokens", str(bound)])
    assert kept == [r for r, n in zip(every, lengths) if n <= bound] and 0 < len(kept) < len(every)
    assert [json.loads(line)["prompt"] for line in open(tmp_path / "short.jsonl")] == kept
    with pytest.raises(ValueError, match="--max-prompt-tokens must be >= 1, got 0"):
        embedded_prompts_cli(["--out", str(tmp_path / "z.jsonl"), *args, "--max-prompt-tokens", "0"])
    assert not (tmp_path / "z.jsonl").exists()
