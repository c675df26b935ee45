"""On-device autoregressive generate against transformers' generate (greedy) and the model's
own next-token distribution (sampling)."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dflash_jax as dj
from support import exact_sampling
from support.tiers import tiered
from dflash_jax.targets import target_forward

pytestmark = pytest.mark.torch


def hf_greedy(model, prompt, max_new, stop=None):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, eos_token_id=stop,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_transformers_ragged_batch(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    V = target.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, V, size=n).tolist() for n in (5, 17, 1, 11)]
    result = dj.generate(target, prompts, 20)
    for p, seq in zip(prompts, result.sequences):
        assert seq == hf_greedy(model, p, 20)
    assert result.finish_reasons == ["length"] * 4


@pytest.mark.slow
def test_stop_tokens_per_row(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    V = target.config.vocab_size
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, V, size=n).tolist() for n in (6, 9, 3)]
    free = [hf_greedy(model, p, 24) for p in prompts]
    # stop each row on the token it emits 4th (row 0), 10th (row 1) and never (row 2)
    stop = [free[0][3], free[1][9]]
    result = dj.generate(target, prompts, 24, stop_token_ids=stop)
    for p, seq, reason in zip(prompts, result.sequences, result.finish_reasons):
        ref = hf_greedy(model, p, 24, stop=stop)
        assert seq == ref
        assert reason == ("stop" if seq[-1] in stop else "length")
    assert result.sequences[0][-1] == stop[0] and len(result.sequences[0]) <= 4
    # one stop list per row: row 0 stops on its own token, row 1 ignores it
    per_row = dj.generate(target, prompts[:2], 24, stop_token_ids=[[free[0][3]], [V - 1]])
    assert per_row.sequences[0] == result.sequences[0]
    assert per_row.sequences[1] == hf_greedy(model, prompts[1], 24, stop=[V - 1])


@pytest.mark.slow
def test_per_row_budgets(hf_checkpoint):
    name, model, path = hf_checkpoint
    target = dj.load_target(path)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    result = dj.generate(target, prompts, [3, 7])
    assert [len(s) for s in result.sequences] == [3, 7]
    assert result.sequences[0] == hf_greedy(model, prompts[0], 3)
    assert result.sequences[1] == hf_greedy(model, prompts[1], 7)


@pytest.fixture(scope="module")
def tiny_target():
    cfg = dj.TargetConfig("qwen3", vocab_size=16, hidden_size=32, intermediate_size=48, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    return dj.Target.random(cfg, seed=3, init_scale=0.3)


# The first two sampled tokens of many rows (one batched call) against the exact joint of the
# model with the filters written again in numpy (tests/support/exact_sampling.py): per-position and
# joint chi-squared, Bonferroni.
AR_PROMPT, AR_ROWS, AR_ALPHA = [3, 1, 4, 1, 5], 10000, 1e-4
AR_CASES = {  # top-k 5 and top-p 0.8 are clear of float32 rounding for this model (checked)
    "T1": dict(temperature=1.0),
    "T0.7-topk": dict(temperature=0.7, top_k=5),
    "T2-topp": dict(temperature=2.0, top_p=0.8),
}


@pytest.fixture(scope="module")
def tiny_prefix_logits(tiny_target):
    return exact_sampling.PrefixLogits.compute(tiny_target, AR_PROMPT, 2)


def ar_joint(prefix_logits, kw):
    joint, margin = prefix_logits.joint(kw["temperature"], kw.get("top_k"), kw.get("top_p"))
    assert margin > 1e-5, "a top-k/top-p decision is too close to call in float32"
    return joint


@pytest.mark.parametrize("case", tiered(AR_CASES, fast=["T0.7-topk"]))
def test_sampling_first_two_tokens_follow_the_model(tiny_target, tiny_prefix_logits, case):
    kw = AR_CASES[case]
    result = dj.generate(tiny_target, [AR_PROMPT] * AR_ROWS, 2, seed=11, **kw)
    report = exact_sampling.fit(result.sequences, ar_joint(tiny_prefix_logits, kw), AR_ALPHA)
    print(case, report)
    assert not report.rejected, report


def filter_mutant(real, bug):
    """``process_logits`` with one bug: "no_temperature" (temperature ignored), "top_k+1" /
    "top_k-1" (top-k off by one), "top_p+1" / "top_p-1" (top-p keeps one token too many / too
    few); None: the real one."""
    import dataclasses

    def process(logits, params):
        if bug == "no_temperature":
            return real(logits, dataclasses.replace(params, temperature=1.0))
        if bug in ("top_k+1", "top_k-1"):
            return real(logits, dataclasses.replace(params, top_k=params.top_k + (1 if bug == "top_k+1" else -1)))
        if bug in ("top_p+1", "top_p-1"):
            x = real(logits, dataclasses.replace(params, top_p=None))
            desc = jnp.sort(x, -1)[..., ::-1]
            probs = jnp.exp(desc)
            kept = jnp.sum(jnp.cumsum(probs, -1) - probs < params.top_p, -1, keepdims=True)
            kept = jnp.clip(kept + (1 if bug == "top_p+1" else -1), 1, x.shape[-1])
            cutoff = jnp.take_along_axis(desc, kept - 1, -1)
            return jax.nn.log_softmax(jnp.where(x >= cutoff, x, -jnp.inf), -1)
        return real(logits, params)

    return process


AR_MUTANTS = {  # case: rules run side by side, AR_ROWS rows each (None: the real filters)
    "T0.7-topk": [None, "no_temperature", "top_k+1", "top_k-1"],
    "T2-topp": [None, "no_temperature", "top_p+1", "top_p-1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(AR_MUTANTS))
def test_wrong_sampling_filters_are_rejected(tiny_target, tiny_prefix_logits, monkeypatch, case):
    """Negative controls: the library's filters replaced by plausible wrong ones (row group g
    uses AR_MUTANTS[case][g], one compiled run) must fail the check above; the real filters,
    called through the same patch, pass it."""
    from dflash_jax.verification import acceptance, sampling

    bugs, traced, real = AR_MUTANTS[case], [], sampling.process_logits
    variants = [filter_mutant(real, bug) for bug in bugs]

    def patched(logits, params, ops=None):  # one device: the local reductions
        assert ops is None or not ops.vocab_split
        traced.append(True)
        group = (jnp.arange(logits.shape[0]) // AR_ROWS).reshape((-1,) + (1,) * (logits.ndim - 1))
        outs = [v(logits, params) for v in variants]
        return jnp.select([group == g for g in range(len(bugs))], outs)

    monkeypatch.setattr(sampling, "process_logits", patched)
    monkeypatch.setattr(acceptance, "process_logits", patched)  # the rules import it by name
    jax.clear_caches()  # trace the engine again, with the patch
    try:
        kw = AR_CASES[case]
        result = dj.generate(tiny_target, [AR_PROMPT] * (AR_ROWS * len(bugs)), 2, seed=11, **kw)
    finally:
        monkeypatch.undo()
        jax.clear_caches()  # and forget the patched programs
    assert traced, "the patched filters were not traced"
    joint = ar_joint(tiny_prefix_logits, kw)
    for g, bug in enumerate(bugs):
        report = exact_sampling.fit(result.sequences[g * AR_ROWS:(g + 1) * AR_ROWS], joint, AR_ALPHA)
        print(case, bug, report)
        assert report.rejected == (bug is not None), (bug, str(report))


def test_seed_reproducible_and_changes(tiny_target):
    a = dj.generate(tiny_target, [[1, 2, 3]] * 4, 8, temperature=1.0, seed=5)
    b = dj.generate(tiny_target, [[1, 2, 3]] * 4, 8, temperature=1.0, seed=5)
    c = dj.generate(tiny_target, [[1, 2, 3]] * 4, 8, temperature=1.0, seed=6)
    assert a.sequences == b.sequences
    assert a.sequences != c.sequences


def test_result_fields(tiny_target):
    dj.generate(tiny_target, [[1, 2], [3, 4, 5]], 5)  # compiled: the next call's times are runs
    t0 = time.perf_counter()
    r = dj.generate(tiny_target, [[1, 2], [3, 4, 5]], 5)
    wall = time.perf_counter() - t0
    assert r.prompt_lengths == [2, 3]
    assert r.num_generated == [5, 5]
    # 1 token from prefill, then one loop iteration per token
    assert r.acceptance_lengths == [[1] * 4] * 2 and r.num_steps == 4
    # the two stages are timed inside the call, separately
    assert 0 < r.prefill_time_s and 0 < r.decode_time_s and r.prefill_time_s + r.decode_time_s <= wall


@pytest.mark.slow
def test_result_says_whether_its_times_include_compilation(tiny_target):
    """The first call with new shapes compiles inside its timed stages and says so; the same
    call again does not; a new seed (a traced argument) compiles nothing, a new cache length
    (a new shape) compiles again."""
    prompts = [[2, 7, 1]]
    first = dj.generate(tiny_target, prompts, 6, pad_to=(24, 136))  # shapes no other test here uses
    assert first.includes_compilation
    assert 0 < first.prefill_compile_s <= first.prefill_time_s
    assert 0 < first.decode_compile_s <= first.decode_time_s
    s = first.summary()
    assert s["includes_compilation"] is True and "decode_time_s includes" in s["timing"]
    again = dj.generate(tiny_target, prompts, 6, pad_to=(24, 136))
    assert again.sequences == first.sequences
    assert not again.includes_compilation and again.prefill_compile_s == again.decode_compile_s == 0
    assert again.summary()["includes_compilation"] is False and "no compilation" in again.summary()["timing"]
    assert not dj.generate(tiny_target, prompts, 6, pad_to=(24, 136), seed=9).includes_compilation
    other = dj.generate(tiny_target, prompts, 6, pad_to=(24, 200))  # control: a new cache length
    assert other.prefill_compile_s > 0 and other.decode_compile_s > 0


def test_the_compile_timer_hooks_jax_monitoring_at_the_first_call_not_at_import():
    """Importing the library registers no process-wide jax.monitoring listener; the first
    generate does (once), which is how its result knows the compile seconds above."""
    import subprocess
    import sys

    code = ("import dflash_jax as dj\n"
            "from jax._src import monitoring\n"
            "from dflash_jax.decoding import generation\n"
            "hooked = lambda: monitoring.get_event_duration_listeners().count(generation._on_duration)\n"
            "print(hooked())\n"
            "t = dj.Target.random(dj.TargetConfig('qwen3', vocab_size=32, hidden_size=16, intermediate_size=32,"
            " num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8))\n"
            "dj.generate(t, [[1, 2]], 2); dj.generate(t, [[3, 4]], 2)\n"
            "print(hooked())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]



def test_pad_to_shares_shapes_without_changing_results(tiny_target):
    from dflash_jax.decoding.prepare import plan_lengths

    a = dj.generate(tiny_target, [[1, 2], [3, 4, 5]], 5)
    b = dj.generate(tiny_target, [[1, 2], [3, 4, 5]], 5, pad_to=(48, 192))
    assert a.sequences == b.sequences
    assert plan_lengths(tiny_target, [3], [5], extra=1, pad_to=(48, 192)) == (48, 192)
    assert plan_lengths(tiny_target, [40], [5], extra=1, pad_to=(16, 64)) == (48, 64)
    with pytest.raises(ValueError, match="pad_to"):
        dj.generate(tiny_target, [[1, 2]], 5, pad_to=(64, 32))


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("prompts, match", [
    ([], "empty"),
    ([[]], "prompt 0 is empty"),
    ([[1, 2], []], "prompt 1 is empty"),
    ([[1.0, 2.0]], "integer token ids"),
    (np.ones((2, 3), np.float32), "integer token ids"),
    (np.ones((1, 2, 3), np.int32), "rank 2"),
    (np.ones(3, np.int32), "rank 2"),
    ([1, 2, 3], "list of token-id lists"),
    ("hello", "list of token-id lists"),
    (["hello"], "tokenize it first"),
    ([[[1, 2]]], "1-D sequence"),
    ([[1, 99]], "outside the vocabulary"),
    ([[-1, 2]], "outside the vocabulary"),
])
def test_bad_prompts(tiny_target, prompts, match):
    with pytest.raises(ValueError, match=match):
        dj.generate(tiny_target, prompts, 4)


def test_prompt_longer_than_cache(tiny_target):
    target = dj.Target(tiny_target.config, tiny_target.params, max_len=32)
    with pytest.raises(ValueError, match="max_len=32"):
        dj.generate(target, [[1] * 30], 3)
    with pytest.raises(ValueError, match="prompt 1 has 40 tokens"):
        dj.generate(target, [[1] * 5, [1] * 40], 1)
    assert dj.generate(target, [[1] * 29], 3).num_generated == [3]


@pytest.mark.parametrize("kw, match", [
    (dict(max_new_tokens=0), "positive integer"),
    (dict(max_new_tokens=2.5), "positive integer"),
    (dict(max_new_tokens=[2]), "1 entries for 2 prompts"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0, temperature=1.0), "top_k"),
    (dict(top_p=1.5, temperature=1.0), "top_p"),
    (dict(stop_token_ids=[16]), "stop token id"),
    (dict(stop_token_ids=[[1], [2], [3]]), "per-row lists"),
])
def test_bad_options(tiny_target, kw, match):
    kw.setdefault("max_new_tokens", 4)
    with pytest.raises(ValueError, match=match):
        dj.generate(tiny_target, [[1, 2], [3]], **kw)


def test_model_rejects_bad_token_arrays(tiny_target):
    cfg, params = tiny_target.config, tiny_target.params
    with pytest.raises(ValueError, match="rank 2"):
        target_forward(cfg, params, jnp.ones((4,), jnp.int32), jnp.arange(4))
    with pytest.raises(ValueError, match="integer"):
        target_forward(cfg, params, jnp.ones((1, 4)), jnp.arange(4)[None])
    with pytest.raises(ValueError, match="positions shape"):
        target_forward(cfg, params, jnp.ones((1, 4), jnp.int32), jnp.arange(3)[None])
    with pytest.raises(ValueError, match="tap layer id 5"):
        target_forward(cfg, params, jnp.ones((1, 4), jnp.int32), jnp.arange(4)[None], tap_layer_ids=(5,))
