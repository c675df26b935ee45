"""Tiny random hybrid (Qwen3.5-shaped) targets for the exactness tests (test_hybrid_exact.py),
and a test-only family with the rollback bug those tests must catch.

The configs: Gated DeltaNet (GDN) and full-attention layers mixed (``layer_types``), value
heads Hv = 2 Hk (a key-head tiling bug changes the output), partial RoPE, float32.
:func:`long_memory` sets every GDN layer's decay close to 1 (``A_log`` small), so that a state
left wrong by a rollback is still read many tokens later (transformers' init, ``A_log`` in
``log [1, 16]``, forgets within a token or two).

``WRONG_ROLLBACK`` (model type ``test_qwen3_5_wrong_rollback``) is the ``qwen3_5_text`` family
(``dflash_jax/targets/hybrid``) with :class:`WholeBlockState`: after a verified block its
rollback crops the KV cache right but keeps every GDN layer's conv window and recurrent state
after the WHOLE block instead of after the accepted row. After the prompt (the first forward,
``start == 0``) it rolls back correctly, so autoregressive decoding (which keeps every row it
verifies) is unaffected; speculative decoding with rejected drafts is not.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.targets.hybrid import HybridConfig, HybridState
from dflash_jax.targets.hybrid.config import FULL, LINEAR
from dflash_jax.targets.hybrid.qwen3_5 import Qwen3_5Family

WRONG_TYPE = "test_qwen3_5_wrong_rollback"

# GDN first, attention in the middle, GDN last (the last tap is a GDN layer's, after the final norm)
LAYER_TYPES = (LINEAR, FULL, LINEAR)
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
           linear_value_head_dim=8, linear_conv_kernel_dim=4, partial_rotary_factor=0.5)


def hybrid_config(model_type: str = "qwen3_5_text", *, vocab_size: int = 48, hidden_size: int = 32,
                  layer_types=LAYER_TYPES, max_position_embeddings: int = 512, **overrides) -> HybridConfig:
    """A tiny hybrid config (``overrides``: any other field, e.g. ``gdn_rollback``,
    ``gdn_chunk``)."""
    fields = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=48,
                  num_layers=len(layer_types), num_heads=4, num_kv_heads=2, head_dim=8,
                  max_position_embeddings=max_position_embeddings, layer_types=tuple(layer_types),
                  **GDN)
    fields.update(overrides)
    return HybridConfig(model_type, **fields)


def long_memory(params, seed: int = 0, decay=(0.85, 0.98)):
    """``params`` with every GDN layer's per-token decay ``exp(g)`` at ``a = 0`` drawn in
    ``decay`` (``g = -exp(A_log) softplus(dt_bias)``, ``dt_bias`` kept): a memory of tens of
    tokens."""
    lin = params["gdn"]["linear_attn"]
    lo, hi = decay
    u = jax.random.uniform(jax.random.key(seed), lin["A_log"].shape, jnp.float32, lo, hi)
    rate = -jnp.log(u) / jax.nn.softplus(lin["dt_bias"].astype(jnp.float32))  # exp(A_log)
    lin = {**lin, "A_log": jnp.log(rate).astype(lin["A_log"].dtype)}
    return {**params, "gdn": {**params["gdn"], "linear_attn": lin}}


def random_target(cfg: HybridConfig, seed: int, init_scale: float = 0.35, max_len=None,
                  memory_seed: int | None = 0) -> dj.Target:
    """A random target of ``cfg`` (with :func:`long_memory` unless ``memory_seed`` is None);
    the same weights for the same seed whatever the family of ``cfg`` (correct or not)."""
    t = dj.Target.random(cfg, seed=seed, init_scale=init_scale)
    params = t.params if memory_seed is None else long_memory(t.params, memory_seed)
    return dj.Target(cfg, params, max_len=max_len)


@flax.struct.dataclass
class WholeBlockState(HybridState):
    """The bug: after a verified block (not after the prompt), rollback keeps every GDN
    layer's conv window and recurrent state after the whole block; the KV cache is cropped
    right and the lengths are right."""

    def rollback(self, lengths):
        good = super().rollback(lengths)
        g = self.gdn
        if g.record is None:
            return good
        decoding = g.start > 0  # [B]: False after the prompt
        conv = jnp.where(decoding[None, :, None, None], g.conv, good.gdn.conv)
        ssm = jnp.where(decoding[None, :, None, None, None], g.ssm, good.gdn.ssm)
        return good.replace(gdn=good.gdn.replace(conv=conv, ssm=ssm))


class WrongRollbackFamily(Qwen3_5Family):
    """``qwen3_5_text`` under another model type, its state :class:`WholeBlockState`."""

    state_class = WholeBlockState

    def __init__(self):
        super().__init__(moe=False)
        self.model_types = (WRONG_TYPE,)
        self.name = WRONG_TYPE


WRONG_ROLLBACK = WrongRollbackFamily()
targets.register(WRONG_ROLLBACK)  # the negative control's registry line
