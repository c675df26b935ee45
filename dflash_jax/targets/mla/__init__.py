"""Targets with multi-head latent attention (MLA): DeepSeek-V3 and the decoders built on it
(``deepseek_v3.py``: Kimi-K2.x too), GLM-5 (``glm_moe_dsa.py``); the forward is ``model.py``."""
