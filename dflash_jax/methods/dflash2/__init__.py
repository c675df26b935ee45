"""DFlash2 (``docs/dflash2.md``; z-lab, the reference package ``dflash==0.1.0``): DFlash's
drafter with a grouped dynamic causal convolution around every layer's attention and MLP, and a
low-rank candidate selector that re-scores each block row's top-k candidates given the token
chosen before it. The handle and its layout are in ``handle.py``, the Flax drafter in
``model.py``, the proposer in ``proposer.py``."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.dflash2 import handle, size
from dflash_jax.methods.dflash2.config import DFLASH2_ARCHITECTURE, DFlash2Config
from dflash_jax.methods.dflash2.handle import DFlash2Drafter
from dflash_jax.methods.dflash2.proposer import DFlash2Proposer


class DFlash2Method(DraftingMethod):
    name = "dflash2"
    label = "DFlash2"
    architectures = (DFLASH2_ARCHITECTURE,)
    unsupported = {"tree": "a DFlash2 drafter drafts one path through its candidates (the selector "
                           "conditions each row on the token chosen before it); trees are not "
                           "implemented for it"}

    def load(self, path: str, target, dtype=None) -> DFlash2Drafter:
        return handle.load(path, target, dtype)

    def save(self, drafter: DFlash2Drafter, path) -> None:
        handle.save(drafter, path)

    def config_from_hf(self, d: Mapping[str, Any]) -> DFlash2Config:
        return DFlash2Config.from_hf_dict(d)

    def from_run(self, run_dir: str, record: Mapping[str, Any], config: DFlash2Config, params) -> DFlash2Drafter:
        return DFlash2Drafter(config, params)

    def default_block_size(self, drafter: DFlash2Drafter) -> int:
        return drafter.config.block_size

    def check_options(self, opt, block_size: int) -> None:
        if opt.num_denoise_steps != 1:
            raise ValueError("num_denoise_steps: a DFlash2 drafter drafts in one pass and its selector "
                             "(multi-pass denoising is DFlash's); leave it at 1")

    def proposer(self, drafter: DFlash2Drafter, block_size: int, opt, greedy: bool) -> DFlash2Proposer:
        return DFlash2Proposer(drafter.config, 1, bool(opt.sampled_draft) and not greedy)

    def with_depth(self, drafter: DFlash2Drafter, layers: int, target) -> DFlash2Drafter:
        c = drafter.config
        return DFlash2Drafter.random(target, num_layers=layers, block_size=c.block_size, mask_token_id=c.mask_token_id,
                                     target_layer_ids=c.target_layer_ids, dtype=drafter.dtype,
                                     conv_kernel_size=c.conv_kernel_size, conv_group_size=c.conv_group_size,
                                     selector_rank=c.selector_rank, selector_top_k=c.selector_top_k)

    def num_params(self, config: DFlash2Config) -> int:
        return size.num_params(config)

    def draft_costs(self, config: DFlash2Config, target_config, block_size: int, context: int, *,
                    tree_topk: int | None = None, ctx_rows: int | None = None, batch: int = 1,
                    weight_bytes: int = 2, kv_bytes: int = 2) -> list:
        return size.draft_costs(config, target_config, block_size, context, ctx_rows, batch=batch,
                                weight_bytes=weight_bytes, kv_bytes=kv_bytes)


DFLASH2 = DFlash2Method()
