"""Domino's size model: DFlash's (``methods/dflash/size.py``) plus, draft after draft, the GRU step
(x W_ih and g W_hh, 2 (D + H) 3H FLOPs) and the correction (2 (D + H) E + 2 E V), each step
reading their weights again (it waits for the token drafted before it)."""

from __future__ import annotations

from dflash_jax.methods.dflash import size as dflash_size
from dflash_jax.sizes import Cost


def head_params(cfg) -> int:
    D, H, E, V = cfg.hidden_size, cfg.gru_hidden_dim, cfg.emb_dim, cfg.vocab_size
    return (D + H) * 3 * H + (D + H) * E + E * V


def num_params(cfg) -> int:
    return dflash_size.num_params(cfg) + head_params(cfg)


def draft_costs(cfg, target, block_size: int, context: int, ctx_rows: int | None = None, *, batch: int = 1,
                weight_bytes: int = 2, kv_bytes: int = 2, dense_cache: int | None = None) -> list[Cost]:
    """DFlash's draft of the block, then per draft (``block_size - 1``, the first ``P``
    without the correction) the GRU step and the correction, their weights read each step."""
    D, H, E, V = cfg.hidden_size, cfg.gru_hidden_dim, cfg.emb_dim, cfg.vocab_size
    drafts = block_size - 1
    corrected = max(drafts - cfg.pure_draft_prefix_len, 0)
    gru = Cost("Domino GRU", flops=batch * drafts * 2 * (D + H) * 3 * H,
               weights=drafts * (D + H) * 3 * H * weight_bytes, activations=batch * drafts * D * weight_bytes)
    corr = Cost("Domino correction", flops=batch * corrected * (2 * (D + H) * E + 2 * E * V + V),
                weights=corrected * ((D + H) * E + E * V) * weight_bytes,
                activations=batch * corrected * 2 * V * 4)
    return dflash_size.draft_costs(cfg, target, block_size, context, ctx_rows, batch=batch,
                                   weight_bytes=weight_bytes, kv_bytes=kv_bytes, dense_cache=dense_cache) + [gru, corr]
