"""DSpark's size model: DFlash's (``methods/dflash/size.py``) over the drafter's rows (the verify
block minus one, every row drafting) plus the Markov head, row after row, and the confidence
head, in the terms of ``dflash_jax.sizes``."""

from __future__ import annotations

from dflash_jax.methods.dflash import size as dflash_size
from dflash_jax.sizes import Cost, lm_head


def head_params(cfg) -> int:
    """The Markov head (w1 and w2, [V, r] each; the gate [D + r, r] or the recurrence
    [2r + D, 3r] with their biases) and the confidence head ([D (+ r)] + 1)."""
    D, V, r = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank
    own = {"gated": (D + r + 1) * r, "rnn": (2 * r + D + 1) * 3 * r}.get(cfg.markov_head_type, 0)
    confidence = cfg.confidence_width + 1 if cfg.enable_confidence_head else 0
    return 2 * V * r + own + confidence


def num_params(cfg) -> int:
    return dflash_size.num_params(cfg) + head_params(cfg)


def draft_costs(cfg, target, block_size: int, context: int, ctx_rows: int | None = None, *, batch: int = 1,
                weight_bytes: int = 2, kv_bytes: int = 2, dense_cache: int | None = None) -> list[Cost]:
    """A verify block of ``block_size``: DFlash's draft of ``block_size - 1`` rows (``ctx_rows``
    new context rows, by default ``block_size``), the target's LM head on every one of those
    rows, then the Markov head on them one after another (per row: w1's row gathered, the gate or
    the recurrence, w2 [r, V], 2 r V FLOPs; each row's step waits for the token drafted before
    it, so every step reads w2 and the gate's or recurrence's weights again: ``rows`` reads, as
    EAGLE-3's sequential steps read its layer) and the confidence head."""
    D, V, r = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank
    rows = block_size - 1
    costs = dflash_size.draft_costs(cfg, target, rows, context, block_size if ctx_rows is None else ctx_rows,
                                    batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
                                    dense_cache=dense_cache)
    costs = [c for c in costs if c.name != "drafter LM head"]
    own = {"gated": 2 * (D + r) * r, "rnn": 2 * (2 * r + D) * 3 * r}.get(cfg.markov_head_type, 0)
    markov = Cost("Markov head", flops=batch * rows * (2 * r * V + own + V),
                  weights=rows * (V * r + own // 2) * weight_bytes,
                  activations=batch * rows * (r + 2 * V) * weight_bytes)
    confidence = Cost("confidence head", flops=batch * rows * 2 * cfg.confidence_width,
                      weights=cfg.confidence_width * weight_bytes) if cfg.enable_confidence_head else None
    return costs + [lm_head("drafter LM head", target, rows, batch=batch, weight_bytes=weight_bytes), markov] + (
        [confidence] if confidence else [])
