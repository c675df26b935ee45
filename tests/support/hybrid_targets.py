"""Tiny random hybrid (Qwen3.5-shaped) targets for the exactness tests (test_hybrid_exact.py,
the tree tests), and a test-only family with the rollback bug those tests must catch.

The configs (and :func:`moe_hybrid`'s MoE families): Gated DeltaNet (GDN) and full-attention
layers mixed (``layer_types``), value heads Hv = 2 Hk (a key-head tiling bug changes the output), partial RoPE, float32.
:func:`random_target` draws every GDN layer's decay close to 1 (``A_log`` small), so that a
state left wrong by a rollback is still read many tokens later (transformers' init, ``A_log``
in ``log [1, 16]``, forgets within a token or two). Weights are drawn on the host (numpy): the
jitted ``Target.random`` / ``Drafter.random`` init programs cost 5-10 s each to compile on CPU.

``WRONG_ROLLBACK`` (model type ``test_qwen3_5_wrong_rollback``) is the ``qwen3_5_text`` family
(``dflash_jax/targets/hybrid``) with :class:`WholeBlockState`: after a verified block its
rollback crops the KV cache right but keeps every GDN layer's conv window and recurrent state
after the WHOLE block instead of after the accepted row. After the prompt (the first forward,
``start == 0``) it rolls back correctly, so autoregressive decoding (which keeps every row it
verifies) is unaffected; speculative decoding with rejected drafts is not.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import dflash_jax as dj
from dflash_jax import targets
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.targets.hybrid import model as hybrid_model
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


def draw(shapes, seed: int, rule):
    """A parameter tree of float32 arrays drawn on the host (numpy; no init program to
    compile): ``shapes`` a tree of shape tuples or ``jax.ShapeDtypeStruct`` s, ``rule(name,
    shape, rng)`` the array of the leaf at path ``name`` (``jax.tree_util.keystr``)."""
    rng = np.random.default_rng(seed)
    is_leaf = lambda v: isinstance(v, tuple)
    leaves, tree = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_leaf)
    return jax.tree_util.tree_unflatten(tree, [
        jnp.asarray(rule(jax.tree_util.keystr(path), tuple(getattr(leaf, "shape", leaf)), rng), jnp.float32)
        for path, leaf in leaves])


def random_target(cfg: HybridConfig, seed: int, init_scale: float = 0.35, max_len=None,
                  decay=(0.85, 0.98)) -> dj.Target:
    """A random target of ``cfg`` (any family with the qwen3_5_text parameter tree), drawn as
    the family's ``init_params`` draws (matrices normal(``init_scale``), conv filters
    normal(``K ** -0.5``), zero-centred norms 0, the GDN output norm 1, ``dt_bias`` 1) except
    ``A_log``: each GDN head's per-token decay ``exp(g)`` at ``a = 0`` drawn in ``decay`` (a
    memory of tens of tokens). The same weights for the same seed whatever the family."""
    K = cfg.linear_conv_kernel_dim
    lo, hi = decay

    def rule(name, shape, rng):
        if "linear_attn']['norm" in name or "dt_bias" in name:
            return np.ones(shape)
        if name.endswith("['weight']") or name.endswith("['bias']"):
            return np.zeros(shape)
        if "A_log" in name:  # exp(A_log) softplus(dt_bias = 1) = -log(decay)
            return np.log(-np.log(rng.uniform(lo, hi, shape)) / np.log1p(np.e))
        scale = K ** -0.5 if "conv1d" in name else init_scale
        return scale * rng.standard_normal(shape)

    return dj.Target(cfg, draw(hybrid_model.param_shapes(cfg), seed, rule), max_len=max_len)


def moe_hybrid_config(model_type: str, **overrides) -> HybridConfig:
    """A tiny MoE hybrid's config: ``qwen3_5_moe_text`` (every MLP the Qwen3.5 MoE block, shared
    expert included) or ``qwen3_next`` (the MoE block in layer 1 only, by ``decoder_sparse_step``
    2, top-k weights not renormalised), GDN layers first and last (``overrides``: other config
    fields, as :func:`hybrid_config`'s)."""
    from dflash_jax.targets.hybrid.qwen3_next import Qwen3NextConfig
    from dflash_jax.targets.moe.qwen3_5_moe import MoeBlockConfig

    next_ = model_type == "qwen3_next"
    moe = MoeBlockConfig(hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=48, norm_topk_prob=not next_)
    layers = (LINEAR, LINEAR, FULL)
    cfg = hybrid_config("qwen3_5_moe_text", **{"layer_types": layers, "moe": moe, "gdn_chunk": 3, **overrides})
    if next_:
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        cfg = Qwen3NextConfig(**{**fields, "model_type": model_type}, decoder_sparse_step=2)
        assert [cfg.mlp_kind(i) for i in range(3)] == ["mlp", "moe", "mlp"]
    return cfg


def moe_hybrid(model_type: str, **overrides) -> dj.Target:
    """A random target of :func:`moe_hybrid_config`."""
    return random_target(moe_hybrid_config(model_type, **overrides), seed=3)


def random_drafter(target: dj.Target, block_size: int, seed: int, init_scale: float = 0.35,
                   target_layer_ids=None) -> dj.Drafter:
    """A one-layer DFlash drafter for ``target`` drawn as ``Drafter.random`` draws (kernels
    normal(``init_scale``), norms 1), on the host."""
    cfg = DrafterConfig.for_target(target.config, 1, block_size, target.config.vocab_size - 1,
                                   target_layer_ids)
    cfg.check_target(target.config)
    shapes = jax.eval_shape(lambda: init_drafter_params(cfg, jax.random.key(0)))

    def rule(name, shape, rng):
        if "weight" in name:
            return np.ones(shape)
        if "bias" in name:
            return np.zeros(shape)
        return init_scale * rng.standard_normal(shape)

    return dj.Drafter(cfg, draw(shapes, seed, rule))


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
