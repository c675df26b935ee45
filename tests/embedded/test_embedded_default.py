"""The shipped embedded default (dflash_jax/assets): it loads (in transformers too), its
drafter is trained and lossless, and the bench harness runs on it."""

import json
import os

import numpy as np
import pytest

from support.bench_checks import check_report
from dflash_jax.bench import harness

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def pair():
    import jax.numpy as jnp

    from dflash_jax import load_drafter, load_target

    target = load_target(harness.EMBEDDED_TARGET, dtype=jnp.float32)
    return target, load_drafter(harness.EMBEDDED_DRAFTER, target, dtype=jnp.float32)


def test_embedded_default_loads(pair):
    from safetensors import safe_open

    target, drafter = pair
    n = sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(target.params))
    assert n >= 16_000_000
    for d in (harness.EMBEDDED_TARGET, harness.EMBEDDED_DRAFTER):
        with safe_open(os.path.join(d, "model.safetensors"), "np") as f:
            assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
        card = open(os.path.join(d, "README.md")).read()
        assert "Command" in card or "Commands" in card
    facts = json.load(open(os.path.join(harness.EMBEDDED_TARGET, "training.json")))
    assert facts["heldout_loss"] < 4.0 and "held-out" in open(os.path.join(harness.EMBEDDED_TARGET, "README.md")).read().lower()
    tok = target.tokenizer
    assert tok.mask_token_id == drafter.config.mask_token_id and tok.eos_token_id in target.config.eos_token_id
    drafter.config.check_target(target.config)


def test_transformers_agrees_with_the_shipped_target(pair):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_jax.targets import target_forward

    target, _ = pair
    model = AutoModelForCausalLM.from_pretrained(harness.EMBEDDED_TARGET, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(harness.EMBEDDED_TARGET)
    ids = np.array([tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th number.\"\"\"\n")])
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours, _, _ = target_forward(target.config, target.params, ids, np.arange(ids.shape[1])[None])
    np.testing.assert_allclose(np.asarray(ours), ref, atol=2e-3, rtol=2e-3)


def test_greedy_dflash_equals_autoregressive_on_the_embedded_pair(pair):
    from dflash_jax import generate
    from dflash_jax.bench.prompt_sets import load_prompt_set
    from dflash_jax.prompts import encode_prompt

    target, drafter = pair
    turns = [s.turns[0] for name in ("gsm8k", "humaneval", "math500")
             for s in load_prompt_set(name, max_samples=2, seed=1)]
    prompts = [encode_prompt(t, target.tokenizer) for t in turns]
    stops = list(target.config.eos_token_id)
    ar = generate(target, prompts, 96, stop_token_ids=stops)
    df = generate(target, prompts, 96, drafter=drafter, stop_token_ids=stops)
    assert df.sequences == ar.sequences
    assert df.tau > 2.0  # the shipped drafter is trained (a random one gives ~1.0)


@pytest.mark.slow
def test_bench_on_two_prompts_per_set(tmp_path):
    # every set at one program shape: its programs compile once, not once per set (each set at
    # its own shape, the default, is bench/test_cli_and_bench.py's thinking-switch test)
    report = harness.main(["--max-samples", "2", "--max-new-tokens", "24", "--program-shape", "one",
                           "--out", str(tmp_path)])
    assert set(report["datasets"]) == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench"}
    for name, r in report["datasets"].items():
        assert r["turns"] == (4 if name == "mt-bench" else 2)
        assert r["same_output"] == r["turns"]
        assert len(r["histogram"]) == 16
    # docs/method.md section 6's metrics, recomputed with numpy from the per-response records saved in
    # bench.json (tau per response then over responses, decode-only speedup, ...)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["settings"]["block_size"] == 16 and saved["complete"]
    check_report(saved)
    assert saved["average"]["tau"] == pytest.approx(report["average"]["tau"])
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"bench.{ext}").stat().st_size > 100
    table = (tmp_path / "bench.md").read_text()
    assert "| **average** |" in table and "tau [95% CI]" in table and "decode phase only" in table


def test_bench_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="--drafter is required"):
        harness.main(["--target", str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        harness.main(["--target", str(tmp_path / "none"), "--drafter", str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="prompt set 'gsm8k'.*--data-dir"):
        harness.main(["--datasets", "gsm8k", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="must be >= 1"):
        harness.main(["--max-samples", "0", "--out", str(tmp_path)])
