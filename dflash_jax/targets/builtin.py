"""The built-in target families, one registry line each (``dflash_jax`` imports this module,
so they are registered before any config is read). A new family: its module (or folder) under
``dflash_jax/targets/`` and one line here (``docs/targets.md``)."""

from dflash_jax.targets import register
from dflash_jax.targets import dense
from dflash_jax.targets.moe import qwen3_moe
from dflash_jax.targets.moe import gpt_oss
from dflash_jax.targets.hybrid import qwen3_5
from dflash_jax.targets.hybrid import qwen3_next
from dflash_jax.targets.mla import deepseek_v3
from dflash_jax.targets.mla import glm_moe_dsa
from dflash_jax.targets import gemma4

register(dense.QWEN3)
register(dense.LLAMA)
register(qwen3_moe.QWEN3_MOE)
register(gpt_oss.GPT_OSS)
register(qwen3_5.QWEN3_5)
register(qwen3_5.QWEN3_5_MOE)
register(qwen3_next.QWEN3_NEXT)
register(deepseek_v3.DEEPSEEK_V3)
register(glm_moe_dsa.GLM_MOE_DSA)
register(gemma4.GEMMA4)
