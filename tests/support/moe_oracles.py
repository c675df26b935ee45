"""Dense references for the mixture-of-experts tests: every expert run on every row with plain
``jnp`` (no sorting, gathering or grouped matmul), and router weights with spread-out logits
(random tiny routers have near-ties, so top-k could flip between implementations)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dflash_jax.nn import moe


def dense_moe_reference(x, weights, expert_ids, *, down, gate_up=None, gate=None, up=None,
                        gate_up_bias=None, down_bias=None, activation=moe.swiglu,
                        expert_offset=0):
    """``sum_j weights[n, j] * FFN_{ids[n, j]}(x[n])`` by a Python loop over the local experts,
    each run on all rows and masked by the routing. x: [N, D]; weights / expert_ids: [N, k];
    weights as :func:`dflash_jax.nn.moe.moe_ffn` takes them. Returns float32[N, D]."""
    x = jnp.asarray(x, jnp.float32)
    out = jnp.zeros(x.shape, jnp.float32)
    for e in range(down.shape[0]):
        if gate_up is not None:
            h = x @ gate_up[e]
        else:
            h = jnp.concatenate([x @ gate[e], x @ up[e]], axis=-1)
        if gate_up_bias is not None:
            h = h + gate_up_bias[e]
        y = activation(h) @ down[e]
        if down_bias is not None:
            y = y + down_bias[e]
        coef = jnp.sum(jnp.where(expert_ids == e + expert_offset, weights, 0.0), axis=-1)
        out = out + coef[:, None] * y
    return out


def separated_router(rng: np.random.Generator, num_experts: int, hidden: int,
                     scale: float = 1.0) -> np.ndarray:
    """A router matrix float32[E, D] (torch ``nn.Linear`` layout) whose logits are spread
    apart: unit random directions scaled by distinct factors ``scale * (1 + 0.5 * e)``, so the
    experts' logits differ in magnitude as well as direction and near-ties between the k-th and
    the next expert are rare (the tests assert the margin on the tokens they route)."""
    w = rng.standard_normal((num_experts, hidden)).astype(np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    return (w * (scale * (1.0 + 0.5 * np.arange(num_experts, dtype=np.float32)))[:, None]).astype(np.float32)
