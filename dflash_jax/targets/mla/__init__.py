"""Targets with multi-head latent attention (MLA): DeepSeek-V3 and the decoders built on it
(``deepseek_v3.py``; the forward is ``model.py``)."""
