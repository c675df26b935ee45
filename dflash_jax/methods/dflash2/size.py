"""DFlash2's size model: DFlash's (``methods/dflash/size.py``) plus the convolutions around every
layer's attention and MLP and the candidate selector, in the terms of ``dflash_jax.sizes``."""

from __future__ import annotations

from dflash_jax.methods.dflash import size as dflash_size
from dflash_jax.sizes import Cost


def conv_params(cfg) -> int:
    """One layer's two convolution pairs: base kernels [2, K, D] and projections [D, 2*K*G]."""
    K, D, G = cfg.conv_kernel_size, cfg.hidden_size, cfg.conv_groups
    return 2 * (2 * K * D + D * 2 * K * G)


def selector_params(cfg) -> int:
    """The codebooks [V, r] x 2 and the projection [D, r]."""
    return (2 * cfg.vocab_size + cfg.hidden_size) * cfg.selector_rank


def num_params(cfg) -> int:
    return dflash_size.num_params(cfg) + cfg.num_layers * conv_params(cfg) + selector_params(cfg)


def draft_costs(cfg, target, block_size: int, context: int, ctx_rows: int | None = None, *, batch: int = 1,
                weight_bytes: int = 2, kv_bytes: int = 2, dense_cache: int | None = None) -> list[Cost]:
    """DFlash's draft of the block, then per layer the two convolution pairs on the block rows
    (the kernel projection, 2 * D * 2KG FLOPs a row, and two K-tap convolutions, 2 * 2 * K * D),
    then the selector on the ``block_size - 1`` draft rows: the projection of each row (2 * D * r)
    and, row after row, the top-k candidates' scores (the predecessor's code times the row's,
    against k successor codes: about 2 * k * r), the k + 1 codebook rows gathered."""
    K, D, G, r, k = cfg.conv_kernel_size, cfg.hidden_size, cfg.conv_groups, cfg.selector_rank, cfg.selector_top_k
    rows = block_size - 1
    per_row = 2 * (2 * D * 2 * K * G + 2 * 2 * K * D)  # two pairs, each a projection and two convolutions
    convs = Cost("drafter convolutions", flops=batch * cfg.num_layers * block_size * per_row,
                 weights=cfg.num_layers * conv_params(cfg) * weight_bytes)
    selector = Cost("candidate selector", flops=batch * rows * (2 * D * r + k * 3 * r),
                    weights=D * r * weight_bytes, activations=batch * rows * (k + 1) * r * weight_bytes)
    return dflash_size.draft_costs(cfg, target, block_size, context, ctx_rows, batch=batch,
                                   weight_bytes=weight_bytes, kv_bytes=kv_bytes, dense_cache=dense_cache) + [
        convs, selector]
