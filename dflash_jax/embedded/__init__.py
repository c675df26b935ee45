"""The embedded default: a small Qwen3 target and its DFlash drafter, trained by this project
from offline sources and shipped in ``dflash_jax/assets`` (see ``corpus``, ``pretrain``)."""
