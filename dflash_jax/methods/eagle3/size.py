"""EAGLE-3's size model (docs/eagle3.md): the drafter's parameters and what one iteration's
drafting steps cost, in the terms of ``dflash_jax.sizes``; the rooflines
(``tools/roofline_eagle3.py``) read it through the method (``DraftingMethod.num_params`` /
``draft_costs``)."""

from __future__ import annotations

from dflash_jax.sizes import LOGIT_BYTES, Cost


def layer_params(cfg) -> dict:
    """Parameters of the decoder layer's matrices (``Eagle3Config``): q/k/v read the 2D-wide
    input [embedding ; hidden]."""
    D, Dh = cfg.hidden_size, cfg.head_dim
    return {"q": 2 * D * cfg.num_heads * Dh, "k": 2 * D * cfg.num_kv_heads * Dh,
            "v": 2 * D * cfg.num_kv_heads * Dh, "o": cfg.num_heads * Dh * D,
            "mlp": 3 * D * cfg.intermediate_size}


def num_params(cfg) -> int:
    """Every parameter of the drafter: fc, the layer (matrices + 3 norms), norm, the head over
    the draft vocabulary (the embedding is the target's)."""
    D = cfg.hidden_size
    return cfg.feature_size * D + sum(layer_params(cfg).values()) + 3 * D + D + D * cfg.draft_vocab_size


def step_costs(name: str, cfg, rows: int, pairs: float, kv_read_rows: float, head_rows: int, *,
               batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """One pass of the layer on ``rows`` rows per sequence (embeddings gathered, the 2D input,
    K/V of the rows written), attention over ``pairs`` (query, key) pairs with
    ``kv_read_rows`` cached entries read, then norm + head on ``head_rows`` rows (float32
    draft-vocabulary logits written)."""
    D, Vd = cfg.hidden_size, cfg.draft_vocab_size
    p = layer_params(cfg)
    layer = Cost(f"{name} layer", flops=2 * batch * rows * sum(p.values()),
                 weights=(sum(p.values()) + 3 * D) * weight_bytes,
                 activations=batch * rows * D * weight_bytes)  # the embedding rows gathered
    per_pos = 2 * cfg.num_kv_heads * cfg.head_dim * kv_bytes
    attention = Cost(f"{name} attention", flops=4 * batch * cfg.num_heads * cfg.head_dim * pairs,
                     kv_read=batch * kv_read_rows * per_pos, kv_write=batch * rows * per_pos)
    head = Cost(f"{name} head", flops=2 * batch * head_rows * D * Vd, weights=(Vd * D + D) * weight_bytes,
                activations=batch * head_rows * Vd * LOGIT_BYTES)
    return [layer, attention, head]


def draft_costs(cfg, steps: int, frontier: int, context: int, ctx_rows: int | None = None, *,
                batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The ``steps`` drafting steps of one iteration at ``context`` cached drafter entries:
    step 1 projects the ``ctx_rows`` committed rows (default steps + 1) through fc and the
    layer and drafts from the last; every later step runs the layer on ``frontier`` rows (1 for
    a chain, the tree's top-k for a tree) over the entries before it."""
    c = steps + 1 if ctx_rows is None else ctx_rows
    D = cfg.hidden_size
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    fc = Cost("eagle3 fc", flops=2 * batch * c * cfg.feature_size * D, weights=cfg.feature_size * D * weight_bytes,
              activations=batch * c * cfg.feature_size * weight_bytes)  # the taps read
    costs = [fc] + step_costs("eagle3 step 1", cfg, c, c * context + c * (c + 1) / 2, context, 1, **kw)
    for s in range(2, steps + 1):
        seen = context + c + s - 1  # the committed entries and its own s - 1 drafted ones
        costs += step_costs(f"eagle3 step {s}", cfg, frontier, frontier * seen,
                            context + c + (s - 2) * frontier, frontier, **kw)
    return costs
