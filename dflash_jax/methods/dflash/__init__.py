"""DFlash (``docs/method.md``): a block-diffusion drafter that fills a whole block in one
forward pass, conditioned on the target's tapped hidden features injected into the K/V of every
drafter layer. The handle and its released layout are in ``handle.py``; the Flax drafter is
``dflash_jax.methods.dflash.model``, the proposer ``dflash_jax.methods.dflash.proposer``."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_jax.methods.dflash.config import DFLASH_ARCHITECTURE, DrafterConfig
from dflash_jax.hub import EMBEDDED, EMBEDDED_DRAFTER_DIR
from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.dflash import handle, profile, size
from dflash_jax.methods.dflash.handle import Drafter
from dflash_jax.methods.dflash.proposer import DFlashProposer


class DFlashMethod(DraftingMethod):
    name = "dflash"
    label = "DFlash"
    automatic_adaptive = True
    architectures = (DFLASH_ARCHITECTURE,)
    training_module = "dflash_jax.methods.dflash.training"
    shipped_name = EMBEDDED
    profile_settings = (("chain", {}), ("tree 16", {"tree": 16, "tree_topk": 4}))

    def claims(self, d: Mapping[str, Any]) -> bool:
        # the DFlash fields, under no class name or another one (its variants: the config
        # reader refuses each field it does not implement, naming it)
        # (a DSpark or Domino projector is that method's: its package claims it)
        return ("dflash_config" in d or "block_size" in d) and \
            (d.get("dflash_config") or {}).get("projector_type") not in ("dspark", "domino")

    def shipped_dir(self) -> str:
        return EMBEDDED_DRAFTER_DIR

    def load(self, path: str, target, dtype=None) -> Drafter:
        return handle.load(path, target, dtype)

    def save(self, drafter: Drafter, path) -> None:
        handle.save(drafter, path)

    def config_from_hf(self, d: Mapping[str, Any]) -> DrafterConfig:
        return DrafterConfig.from_hf_dict(d)

    def from_run(self, run_dir: str, record: Mapping[str, Any], config: DrafterConfig, params) -> Drafter:
        return Drafter(config, params)

    def default_block_size(self, drafter: Drafter) -> int:
        return drafter.config.block_size

    def proposer(self, drafter: Drafter, block_size: int, opt, greedy: bool) -> DFlashProposer:
        return DFlashProposer(drafter.config, int(opt.num_denoise_steps), bool(opt.sampled_draft) and not greedy)

    def with_depth(self, drafter: Drafter, layers: int, target) -> Drafter:
        c = drafter.config
        return Drafter.random(target, num_layers=layers, block_size=c.block_size, mask_token_id=c.mask_token_id,
                              target_layer_ids=c.target_layer_ids, dtype=drafter.dtype)

    def num_params(self, config: DrafterConfig) -> int:
        return size.num_params(config)

    def draft_costs(self, config: DrafterConfig, target_config, block_size: int, context: int, *,
                    tree_topk: int | None = None, ctx_rows: int | None = None, batch: int = 1,
                    weight_bytes: int = 2, kv_bytes: int = 2) -> list:
        """One pass of the drafter over the block (a tree draft is the same pass, its top-k
        read from the same logits), the committed rows (default the whole block: this engine
        projects every verified row, the rejected ones masked) taken in first."""
        return size.draft_costs(config, target_config, block_size, context, ctx_rows, batch=batch,
                                weight_bytes=weight_bytes, kv_bytes=kv_bytes)

    def profile_parts(self, target, drafter: Drafter, pre, tparams, n: int, repeats: int, in_loop) -> dict:
        return profile.draft_parts(target, drafter, pre, tparams, n, repeats, in_loop)


DFLASH = DFlashMethod()

__all__ = ["DFLASH", "DFlashMethod", "Drafter"]
