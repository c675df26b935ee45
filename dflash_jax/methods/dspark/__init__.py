"""DSpark (``docs/dspark.md``; DeepSeek and Peking University, arXiv 2607.05147; SpecForge's
``DSparkDraftModel``): DFlash's drafter whose every block row drafts, with a low-rank Markov
head that biases each row's logits by the token drafted before it (vanilla, gated, rnn) and a
confidence head that predicts each row's acceptance, which the adaptive verify length reads.
The handle and its layout are in ``handle.py``, the Flax drafter in ``model.py``, the proposer
in ``proposer.py``."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.dspark import handle, size
from dflash_jax.methods.dspark.config import DSPARK_ARCHITECTURES, DSparkConfig
from dflash_jax.methods.dspark.handle import DSparkDrafter
from dflash_jax.methods.dspark.proposer import DSparkProposer


class DSparkMethod(DraftingMethod):
    name = "dspark"
    label = "DSpark"
    architectures = DSPARK_ARCHITECTURES
    automatic_adaptive = True
    training_module = "dflash_jax.methods.dspark.training"
    unsupported = {"tree": "a DSpark drafter drafts one path (its Markov head conditions each row on the "
                           "token drafted before it); trees are not implemented for it"}

    def claims(self, d: Mapping[str, Any]) -> bool:
        return (d.get("dflash_config") or {}).get("projector_type") == "dspark"

    def load(self, path: str, target, dtype=None) -> DSparkDrafter:
        return handle.load(path, target, dtype)

    def save(self, drafter: DSparkDrafter, path) -> None:
        handle.save(drafter, path)

    def config_from_hf(self, d: Mapping[str, Any]) -> DSparkConfig:
        return DSparkConfig.from_hf_dict(d)

    def from_run(self, run_dir: str, record: Mapping[str, Any], config: DSparkConfig, params) -> DSparkDrafter:
        return DSparkDrafter(config, params)

    def default_block_size(self, drafter: DSparkDrafter) -> int:
        """The drafter's rows plus the bonus (every row drafts)."""
        return drafter.config.block_size + 1

    def check_options(self, opt, block_size: int) -> None:
        if opt.num_denoise_steps != 1:
            raise ValueError("num_denoise_steps: a DSpark drafter drafts in one pass and its Markov head "
                             "(multi-pass denoising is DFlash's); leave it at 1")
        if block_size < 2:
            raise ValueError(f"block_size {block_size}: a DSpark verify block is the bonus and at least one "
                             "draft (>= 2)")

    def proposer(self, drafter: DSparkDrafter, block_size: int, opt, greedy: bool) -> DSparkProposer:
        return DSparkProposer(drafter.config, 1, bool(opt.sampled_draft) and not greedy)

    def with_depth(self, drafter: DSparkDrafter, layers: int, target) -> DSparkDrafter:
        c = drafter.config
        return DSparkDrafter.random(target, num_layers=layers, block_size=c.block_size, mask_token_id=c.mask_token_id,
                                    target_layer_ids=c.target_layer_ids, dtype=drafter.dtype,
                                    markov_rank=c.markov_rank, markov_head_type=c.markov_head_type,
                                    enable_confidence_head=c.enable_confidence_head,
                                    confidence_head_with_markov=c.confidence_head_with_markov)

    def num_params(self, config: DSparkConfig) -> int:
        return size.num_params(config)

    def draft_costs(self, config: DSparkConfig, target_config, block_size: int, context: int, *,
                    tree_topk: int | None = None, ctx_rows: int | None = None, batch: int = 1,
                    weight_bytes: int = 2, kv_bytes: int = 2) -> list:
        return size.draft_costs(config, target_config, block_size, context, ctx_rows, batch=batch,
                                weight_bytes=weight_bytes, kv_bytes=kv_bytes)


DSPARK = DSparkMethod()
