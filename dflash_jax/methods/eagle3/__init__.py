"""EAGLE-3 (``docs/eagle3.md``): a one-layer autoregressive drafter over three of the target's
hidden features, drafting a chain or a dynamic tree step by step. The handle and its released
layout are in ``handle.py``; the Flax drafter is ``dflash_jax.methods.eagle3.model``, the tensor
names ``dflash_jax.methods.eagle3.checkpoint``, the proposer ``dflash_jax.methods.eagle3.proposer``."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_jax.methods.eagle3.config import EAGLE3_ARCHITECTURE, Eagle3Config
from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.eagle3 import handle, size
from dflash_jax.methods.eagle3.handle import (EAGLE3_DEFAULT_BLOCK, EMBEDDED_EAGLE3, EMBEDDED_EAGLE3_DIR,
                                              Eagle3Drafter, d2t_of_vocab)
from dflash_jax.methods.eagle3.proposer import Eagle3Proposer


class Eagle3Method(DraftingMethod):
    name = "eagle3"
    label = "EAGLE-3"
    unsupported = {"sampled_draft": "an EAGLE-3 drafter drafts greedily (its top tokens, verified losslessly "
                                    "at any temperature); sampled drafts are the DFlash drafter's"}
    architectures = (EAGLE3_ARCHITECTURE,)
    training_module = "dflash_jax.methods.eagle3.training"
    handle_exports = "dflash_jax.methods.eagle3.compat"
    profile_settings = (("chain, 7 steps", {"block_size": 8}),
                        ("tree 16", {"block_size": 8, "tree": 16, "tree_topk": 4}),
                        ("tree 60", {"block_size": 8, "tree": 60, "tree_topk": 10}))
    names_help = ("'embedded-eagle3' (the one shipped for the embedded target), an EAGLE-3 drafter directory in "
                  "the released layout, or 'random' (random weights, acceptance ~1: smoke runs only)")
    shipped_name = EMBEDDED_EAGLE3

    def shipped_dir(self) -> str:
        return EMBEDDED_EAGLE3_DIR

    def by_name(self, name: str, target, dtype=None) -> Eagle3Drafter:
        from dflash_jax.methods.eagle3.named import load_eagle3_drafter  # it loads through models.handles

        return load_eagle3_drafter(name, target, dtype)

    def load(self, path: str, target, dtype=None) -> Eagle3Drafter:
        return handle.load(path, target, dtype)

    def save(self, drafter: Eagle3Drafter, path) -> None:
        handle.save(drafter, path)

    def config_from_hf(self, d: Mapping[str, Any]) -> Eagle3Config:
        return Eagle3Config.from_hf_dict(d)

    def from_run(self, run_dir: str, record: Mapping[str, Any], config: Eagle3Config, params) -> Eagle3Drafter:
        return handle.from_run(run_dir, record, config, params)

    def default_block_size(self, drafter: Eagle3Drafter) -> int:
        return drafter.block_size

    def check_options(self, opt, block_size: int) -> None:
        """The options that belong to the DFlash drafter, refused with an EAGLE-3 one."""
        if opt.num_denoise_steps != 1:
            raise ValueError("num_denoise_steps belongs to the DFlash drafter (passes over one "
                             "block); an EAGLE-3 drafter drafts block_size - 1 sequential steps: "
                             "leave num_denoise_steps at 1")
        if block_size < 2:
            raise ValueError(f"block_size={block_size}: an EAGLE-3 drafter needs at least one drafting "
                             "step (block_size >= 2)")

    def proposer(self, drafter: Eagle3Drafter, block_size: int, opt, greedy: bool) -> Eagle3Proposer:
        return Eagle3Proposer(drafter.config)

    def num_params(self, config: Eagle3Config) -> int:
        return size.num_params(config)

    def draft_costs(self, config: Eagle3Config, target_config, block_size: int, context: int, *,
                    tree_topk: int | None = None, ctx_rows: int | None = None, batch: int = 1,
                    weight_bytes: int = 2, kv_bytes: int = 2) -> list:
        """``block_size - 1`` sequential drafting steps, each after the first on one row (a
        chain) or ``tree_topk`` rows (a tree's frontier); the committed rows default to
        ``block_size`` (a chain's whole verified block)."""
        return size.draft_costs(config, block_size - 1, tree_topk or 1, context, ctx_rows, batch=batch,
                                weight_bytes=weight_bytes, kv_bytes=kv_bytes)

    def proposer_params(self, drafter: Eagle3Drafter) -> dict:
        return drafter.proposer_params()


EAGLE3 = Eagle3Method()

__all__ = ["EAGLE3", "EAGLE3_DEFAULT_BLOCK", "EMBEDDED_EAGLE3", "Eagle3Drafter", "Eagle3Method", "d2t_of_vocab"]
