"""Hybrid linear-attention target families: decoders whose layers are Gated DeltaNet (GDN)
linear-attention layers or gated full-attention layers (``layer_types``), e.g. Qwen3.5 /
Qwen3.6 (``qwen3_5``; ``docs/targets.md``).

* ``config``: :class:`HybridConfig`, the static config every hybrid family shares (the GDN
  shapes, ``layer_types``, partial RoPE, the MoE block, the rollback mode);
* ``model``: the forward pass over the two layer kinds and :class:`HybridState`, the decode
  state (a KV cache for the attention layers, ``nn.gated_delta.GatedDeltaState`` for the GDN
  layers) that rolls back exactly;
* ``qwen3_5``: the ``qwen3_5_text`` / ``qwen3_5_moe_text`` families (config.json, tensor
  names, sizes), registered in ``dflash_jax/targets/builtin.py``.
"""

from dflash_jax.targets.hybrid.config import HybridConfig
from dflash_jax.targets.hybrid.model import HybridState

__all__ = ["HybridConfig", "HybridState"]
