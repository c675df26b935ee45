"""Mixture-of-experts target families (``docs/targets.md``, "Mixture-of-experts targets"):
``qwen3_moe`` (:mod:`.qwen3_moe`; Qwen3-30B-A3B, Qwen3-Coder-30B-A3B). The routers and the
routed-expert FFN they share are ``dflash_jax.nn.moe``."""

from dflash_jax.targets.moe.qwen3_moe import QWEN3_MOE, Qwen3MoeConfig, Qwen3MoeFamily

__all__ = ["QWEN3_MOE", "Qwen3MoeConfig", "Qwen3MoeFamily"]
