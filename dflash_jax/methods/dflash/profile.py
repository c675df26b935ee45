"""The parts of a DFlash draft, each timed inside one compiled loop, for ``iteration-profile``
(``bench.iteration_profile``, ``DraftingMethod.profile_parts``):

  * draft, context: the deferred update, the last verified block's taps through the drafter's
    ``fc`` / ``hidden_norm`` and every layer's K/V into its cache;
  * draft, layers: the drafter's layers over ``[bonus, MASK, ...]`` (the block);
  * draft, LM head + argmax: the target's LM head on the draft rows and their argmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.model import DrafterModel
from dflash_jax.nn.head import embed, lm_head


def draft_parts(target, drafter, pre, tparams, n: int, repeats: int, in_loop) -> dict:
    """Seconds per call of each part (module docstring) at the loop state of ``pre``."""
    V, bs = target.config.vocab_size, drafter.config.block_size
    dcfg, dp, state = drafter.config, pre.drafter_params, pre.state
    model = DrafterModel(dcfg)
    start = state.tcache.lengths
    positions = start[:, None] + jnp.arange(bs, dtype=jnp.int32)
    block = jnp.concatenate([state.bonus[:, None], jnp.full((1, bs - 1), dcfg.mask_token_id, jnp.int32)], 1)
    taps = jax.random.normal(jax.random.key(0), (1, bs, dcfg.num_taps * target.config.hidden_size),
                             state.proposer.pending_taps.dtype)
    dcache = model.apply({"params": dp}, taps, positions, state.proposer.cache, start,
                         method=DrafterModel.project_context)
    h = model.apply({"params": dp}, embed(tparams, block), positions, dcache, method=DrafterModel.draft)
    shift = lambda i, toks: (toks + i) % V

    def context_update(i, dp, taps, cache):
        cache = model.apply({"params": dp}, taps * (1 + i.astype(taps.dtype) * 1e-3), positions, cache, start,
                            method=DrafterModel.project_context)
        return cache.k[:, :, start[0]], cache  # the rows written (the cache itself is carried)

    return {
        "draft, context": in_loop(context_update, (dp, taps, state.proposer.cache), n, repeats, carried=2),
        "draft, layers": in_loop(
            lambda i, tp, dp, cache: model.apply({"params": dp}, embed(tp, shift(i, block)), positions, cache,
                                                 method=DrafterModel.draft),
            (tparams, dp, dcache), n, repeats),
        "draft, LM head + argmax": in_loop(
            lambda i, tp, h: jnp.argmax(lm_head(target.config, tp, h[:, 1:] * (1 + i.astype(h.dtype) * 1e-3)), -1),
            (tparams, h), n, repeats),
    }
