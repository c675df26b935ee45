"""Domino (``docs/domino.md``; arXiv 2605.29707; SpecForge's ``DominoDraftModel``): DFlash's
drafter whose drafts, one after another, get a logit correction from a GRU over the block's
tokens before them. The handle and its layout are in ``handle.py``, the Flax drafter in
``model.py``, the proposer in ``proposer.py``, the training objective in ``loss.py`` and
``training.py``."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.domino import handle, size
from dflash_jax.methods.domino.config import DOMINO_ARCHITECTURE, DominoConfig
from dflash_jax.methods.domino.handle import DominoDrafter
from dflash_jax.methods.domino.proposer import DominoProposer


class DominoMethod(DraftingMethod):
    name = "domino"
    label = "Domino"
    architectures = (DOMINO_ARCHITECTURE,)
    training_module = "dflash_jax.methods.domino.training"
    unsupported = {"tree": "a Domino drafter drafts one path (its GRU conditions each draft on the tokens "
                           "drafted before it); trees are not implemented for it"}

    def claims(self, d: Mapping[str, Any]) -> bool:
        return (d.get("dflash_config") or {}).get("projector_type") == "domino"

    def load(self, path: str, target, dtype=None) -> DominoDrafter:
        return handle.load(path, target, dtype)

    def save(self, drafter: DominoDrafter, path) -> None:
        handle.save(drafter, path)

    def config_from_hf(self, d: Mapping[str, Any]) -> DominoConfig:
        return DominoConfig.from_hf_dict(d)

    def from_run(self, run_dir: str, record: Mapping[str, Any], config: DominoConfig, params) -> DominoDrafter:
        return DominoDrafter(config, params)

    def default_block_size(self, drafter: DominoDrafter) -> int:
        return drafter.config.block_size

    def check_options(self, opt, block_size: int) -> None:
        if opt.num_denoise_steps != 1:
            raise ValueError("num_denoise_steps: a Domino drafter drafts in one pass and its GRU (multi-pass "
                             "denoising is DFlash's); leave it at 1")

    def proposer(self, drafter: DominoDrafter, block_size: int, opt, greedy: bool) -> DominoProposer:
        return DominoProposer(drafter.config, 1, bool(opt.sampled_draft) and not greedy)

    def num_params(self, config: DominoConfig) -> int:
        return size.num_params(config)

    def draft_costs(self, config: DominoConfig, target_config, block_size: int, context: int, *,
                    tree_topk: int | None = None, ctx_rows: int | None = None, batch: int = 1,
                    weight_bytes: int = 2, kv_bytes: int = 2) -> list:
        return size.draft_costs(config, target_config, block_size, context, ctx_rows, batch=batch,
                                weight_bytes=weight_bytes, kv_bytes=kv_bytes)


DOMINO = DominoMethod()
