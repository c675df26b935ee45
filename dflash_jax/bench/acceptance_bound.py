"""How much of a greedy draft a sampling target can accept, measured on the target alone.

With rejection sampling at temperature T, a draft token d proposed deterministically (the
drafter's argmax: the paper's greedy draft) is accepted with probability p_T(d | prefix), and
p_T(d | prefix) <= max_x p_T(x | prefix) whatever the drafter. Along the target's own samples at
T this gives, per generated position i, m_i = max_x p_T(x | prompt, tokens before i):

- ``mean_max_prob``: the mean of m_i, an upper bound on the acceptance rate of any greedy draft
  token at T (a drafter equal to the target's argmax reaches it);
- ``ceiling``: the mean over start positions s of 1 + sum_{k=1}^{bs-1} prod_{j=1}^{k} m_{s+j},
  the acceptance length a block of size bs could reach if each draft token were the target's
  most likely one (its tau ceiling).

So a low tau next to a low ceiling says the target is flat at that temperature, not that the
drafter is weak; a sampled draft q is accepted with probability 1 - TV(p_T, q) instead, up to 1
when q = p_T. Both numbers are estimates along the target's samples (an iteration of
speculative decoding starts only where the previous one ended).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def max_probs(target, prompt: Sequence[int], tokens: Sequence[int], temperature: float) -> np.ndarray:
    """float[len(tokens)]: for each token i of ``tokens`` (a continuation of ``prompt``), the
    largest probability the target at ``temperature`` gives any token at that place, given the
    prompt and ``tokens[:i]`` (one teacher-forced pass)."""
    import jax
    import jax.numpy as jnp

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (at T = 0 the target is deterministic), got {temperature}")
    if not len(prompt) or not len(tokens):
        raise ValueError("max_probs needs a non-empty prompt and continuation")
    seq = list(prompt) + list(tokens)
    width = -(-len(seq) // 64) * 64  # a few shapes: padding after the sequence changes nothing (causal)
    ids = np.zeros((1, width), np.int32)
    ids[0, :len(seq)] = seq
    logits = _forward(target, width)(target.params, jnp.asarray(ids))
    rows = np.asarray(jax.device_get(logits[0, len(prompt) - 1:len(seq) - 1]), np.float64) / temperature
    rows -= rows.max(-1, keepdims=True)
    return 1.0 / np.exp(rows).sum(-1)  # max_x softmax = exp(0) / sum


_FORWARDS: dict = {}


def _forward(target, width: int):
    import jax
    import jax.numpy as jnp

    from dflash_jax.targets import target_forward

    key = (id(target.params), width)
    if key not in _FORWARDS:
        positions = jnp.arange(width, dtype=jnp.int32)[None]
        _FORWARDS[key] = jax.jit(lambda p, t: target_forward(target.config, p, t, positions)[0])
    return _FORWARDS[key]


def ceiling(m: Sequence[float], block_size: int) -> float:
    """The mean over start positions s of 1 + sum_{k=1}^{bs-1} prod_{j=1}^{k} m[s+j] (terms past
    the end of ``m`` left out): the tau of a greedy draft whose every token is the target's most
    likely one, along this sample."""
    m = np.asarray(m, np.float64)
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    n = len(m)
    total = np.ones(n)
    run = np.ones(n)
    for k in range(1, min(block_size, n)):  # a term k needs a token k places after its start
        nxt = np.zeros(n)
        nxt[:n - k] = m[k:]
        run = run * nxt
        total += run
    return float(total.mean()) if n else float("nan")


def measure(target, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
            block_size: int, seed: int = 0) -> list[dict]:
    """Per prompt, the target's own sample at ``temperature`` (``generate`` with no drafter,
    seed ``seed + i``) and its ``mean_max_prob`` and ``ceiling`` (module doc)."""
    from dflash_jax.decoding.generation import generate

    out = []
    for i, p in enumerate(prompts):
        r = generate(target, [list(p)], max_new_tokens, temperature=temperature, seed=seed + i)
        tokens = list(r.sequences[0])
        if not tokens:
            continue
        m = max_probs(target, p, tokens, temperature)
        out.append({"tokens": len(tokens), "mean_max_prob": float(m.mean()), "ceiling": ceiling(m, block_size)})
    return out
