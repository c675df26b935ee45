"""The embedded model's build pipeline on tiny inputs: corpus + tokenizer, pretraining with
exact resume, export to a Hugging Face directory that transformers loads."""

import json
import os

import jax
import numpy as np
import pytest

from dflash_jax.embedded import corpus
from dflash_jax.embedded.pretrain import PretrainConfig, Pretrainer, export_target

MODULE = '''"""A module."""


def add(a, b):
    """Return a + b."""
    c = a + b
    return c


def _private(x):
    """Hidden."""
    y = x
    return y
'''


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    lib = root / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "test").mkdir()
    (lib / "a.py").write_text(MODULE)
    (lib / "pkg" / "copy_of_a.py").write_text(MODULE)  # byte-identical: kept once
    (lib / "pkg" / "b.py").write_text("import os\n\nVALUE = os.sep * 3\n" * 20)
    (lib / "test" / "test_x.py").write_text("SHOULD_NOT_APPEAR = 1\n")
    data = root / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "mbpp").mkdir()
    with open(data / "gsm8k" / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"question": f"Tom has {i} apples and buys {i + 2}. How many?",
                                "answer": f"He has {i}+{i + 2}=<<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}.\n#### {2 * i + 2}"}) + "\n")
    mbpp = [{"task_id": t, "prompt": f"Write a function number {t}.", "code": f"def f{t}():\n  return {t}"}
            for t in (5, 50, 600, 700)]
    (data / "mbpp" / "sanitized-mbpp.json").write_text(json.dumps(mbpp))
    return str(lib), str(data)


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    lib, data = sources
    out = tmp_path_factory.mktemp("corpus")
    meta = corpus.build_corpus(str(out), data, vocab_size=300, seq_len=32, stdlib_root=lib)
    return str(out), meta


def test_sources_exclude_tests_duplicates_and_test_splits(sources):
    lib, data = sources
    files = corpus.stdlib_files(lib)
    assert [p for p, _ in files] == ["a.py", os.path.join("pkg", "b.py")]
    assert list(corpus.function_examples(files))[0][0] == 'def add(a, b):\n    """Return a + b."""'
    ids = [u for u, _ in corpus.mbpp_train(data)]
    assert ids == ["Write a function number 5.", "Write a function number 600.", "Write a function number 700."]
    prompts = corpus.training_prompts(data, 20, seed=0, stdlib_root=lib)
    assert len(prompts) == 20 and prompts == corpus.training_prompts(data, 20, seed=0, stdlib_root=lib)
    assert not any("number 50." in p for p in prompts)


def test_corpus_and_tokenizer(built, sources):
    from transformers import AutoTokenizer

    out, meta = built
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    assert len(tok) == meta["vocab_size"] == 300
    assert tok.eos_token == "<|endoftext|>" and tok.mask_token == "<|mask|>"
    assert tok.convert_tokens_to_ids("<|mask|>") != tok.eos_token_id
    text = "def add(a, b):\n    return a + b  # ünïcode"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|user|>\nhi\n<|assistant|>\n"
    train = np.load(os.path.join(out, "train.npy"))
    assert train.dtype == np.uint16 and train.shape[1] == 32 and train.max() < 300
    assert meta["train"]["tokens_by_source"]["gsm8k_train"] > 0
    # deterministic: a second build is identical
    lib, data = sources
    out2 = os.path.join(out, "again")
    corpus.build_corpus(out2, data, vocab_size=300, seq_len=32, stdlib_root=lib)
    assert np.array_equal(np.load(os.path.join(out2, "train.npy")), train)


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k/train.jsonl not found.*--data-dir"):
        corpus.build_documents(str(tmp_path))


def test_pretrain_learns_resumes_exactly_and_exports(built, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_jax import load_target
    from dflash_jax.models.target import target_forward

    out, _ = built
    cfg = PretrainConfig(steps=12, batch_size=4, learning_rate=3e-3, checkpoint_every=4, eval_every=6,
                         eval_rows=16)
    full = Pretrainer(out, str(tmp_path / "a"), "tiny", cfg).run()
    pre = Pretrainer(out, str(tmp_path / "b"), "tiny", cfg)
    pre.run(stop_after=5)  # stops at step 5; step 4 is the last checkpoint
    resumed = Pretrainer(out, str(tmp_path / "b"), "tiny", cfg).run()
    assert int(resumed["step"]) == 12
    for x, y in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["loss"] < rows[0]["loss"] and "heldout_loss" in rows[5]
    with pytest.raises(ValueError, match="other settings"):
        Pretrainer(out, str(tmp_path / "b"), "tiny", PretrainConfig(steps=13))

    facts = export_target(str(tmp_path / "b"), out, str(tmp_path / "hf"), dtype=np.float32)
    assert facts["steps"] == 12 and facts["tokens_seen"] == 12 * 4 * 32
    target = load_target(tmp_path / "hf")
    assert target.tokenizer is not None and target.tokenizer.mask_token == "<|mask|>"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    ids = np.array([[3, 50, 7, 120, 9, 33]])
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours, _, _ = target_forward(target.config, target.params, ids, np.arange(6)[None])
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=1e-4)
