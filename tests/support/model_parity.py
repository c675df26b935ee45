"""Model parity helpers: transformers' forward as the targets' oracle (:func:`torch_forward`), and
the drafter half of the kernel-vs-XLA parity tests (tests/kernels/test_kernels.py for Pallas,
tests/kernels/test_triton_kernel.py for Triton): the same context and block through either attention."""

import jax.numpy as jnp
import numpy as np

from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import DrafterModel


def drafter_outputs(drafter, impls, rng) -> list[np.ndarray]:
    """Per attention implementation in ``impls``: the drafter's hidden states [2, 4, D] for a
    4-row block at positions 7.. / 12.. after 7 / 12 context rows projected through its cache
    (random taps and block embeddings from ``rng``, the same for every implementation)."""
    d = drafter.config
    taps = jnp.asarray(rng.normal(size=(2, 12, d.num_taps * d.hidden_size)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(2, 4, d.hidden_size)), jnp.float32)
    res = []
    for impl in impls:
        cache = KVCache.init(d.num_layers, 2, 32, d.num_kv_heads, d.head_dim)
        model = DrafterModel(d, attention_impl=impl)
        cache = model.apply({"params": drafter.params}, taps, jnp.broadcast_to(jnp.arange(12), (2, 12)),
                            cache, jnp.array([7, 12]), method=DrafterModel.project_context)
        h = model.apply({"params": drafter.params}, emb, jnp.array([[7], [12]]) + jnp.arange(4), cache,
                        method=DrafterModel.draft)
        res.append(np.asarray(h))
    return res


def torch_forward(model, ids):
    """A transformers model's (logits, every hidden state) on token ids [B, T], as numpy (torch
    is imported here: the kernel tests that use this module run without it)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor(ids), output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]
