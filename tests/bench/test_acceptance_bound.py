"""The greedy-draft acceptance ceiling (dflash_jax.bench.acceptance_bound) against
independent oracles: the max probabilities against transformers' softmax of the same
sequence, the ceiling against a direct sum of products, and the bound against the acceptance
a drafter equal to the target's argmax really gets when the target samples."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_jax.bench import acceptance_bound as ab

pytestmark = [pytest.mark.xdist_group("test_acceptance_bound"), pytest.mark.torch]


def _ceiling_by_hand(m, bs):
    out = []
    for s in range(len(m)):
        acc, prod = 1.0, 1.0
        for k in range(1, bs):
            if s + k >= len(m):
                break
            prod *= m[s + k]
            acc += prod
        out.append(acc)
    return float(np.mean(out))


@pytest.mark.parametrize("bs", [2, 4, 16])
def test_ceiling_is_the_mean_sum_of_products(bs):
    rng = np.random.default_rng(bs)
    for n in (1, 3, 40):
        m = rng.uniform(0.05, 1.0, n)
        assert ab.ceiling(m, bs) == pytest.approx(_ceiling_by_hand(m, bs), rel=1e-12)
    assert ab.ceiling(np.ones(40), bs) == pytest.approx(np.mean([min(bs, 40 - s) for s in range(40)]))
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        ab.ceiling([0.5], 1)


@pytest.mark.slow
def test_max_probs_are_transformers_softmax_maxima_at_the_temperature():
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_jax.models.handles import EMBEDDED_TARGET_DIR, load_target

    target = load_target(EMBEDDED_TARGET_DIR, dtype=jnp.float32)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET_DIR, torch_dtype=torch.float32).eval()
    prompt = target.tokenizer("def add(a, b):\n    return")["input_ids"]
    r = ab.measure(target, [prompt], 24, 0.7, 8, seed=3)
    from dflash_jax.decoding.generation import generate

    tokens = list(generate(target, [prompt], 24, temperature=0.7, seed=3).sequences[0])
    got = ab.max_probs(target, prompt, tokens, 0.7)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].double()
    want = torch.softmax(logits[len(prompt) - 1:-1] / 0.7, -1).max(-1).values.numpy()
    np.testing.assert_allclose(got, want, rtol=2e-4)
    # the wrong temperature (or the wrong offset) is not it
    assert np.abs(ab.max_probs(target, prompt, tokens, 1.0) - want).max() > 1e-2
    assert np.abs(got[1:] - want[:-1]).max() > 1e-2
    assert r[0]["mean_max_prob"] == pytest.approx(float(got.mean()), rel=1e-9)
    assert r[0]["ceiling"] == pytest.approx(_ceiling_by_hand(got, 8), rel=1e-9)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ab.max_probs(target, prompt, tokens, 0.0)
