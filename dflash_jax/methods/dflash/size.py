"""DFlash's size model (docs/method.md section 3): the drafter's parameters and what one draft
costs, in the terms of ``dflash_jax.sizes``; the rooflines (``tools/roofline*.py``) read it
through the method (``DraftingMethod.num_params`` / ``draft_costs``).

Every conditioning of ``DrafterConfig`` is modelled: ``"kv"`` (the paper's), ``"input"`` (the
context rows run through every layer like a prefix, so they cost q, o, the MLP and causal
attention too) and ``"none"`` (no fc, no context: the block attends to itself). Sliding layers
(``layer_types``) see at most their window of context keys (on the ideal path; the dense
``dense_cache`` path reads every slot whatever the window)."""

from __future__ import annotations

import dataclasses

from dflash_jax.sizes import Cost, decoder_attention, decoder_linears, lm_head, projection_params, vector_params


def num_params(drafter) -> int:
    """The drafter's own parameters (``DrafterConfig``): fc [k*D, D] and hidden_norm [D] (not
    with conditioning "none"), its layers, the final norm [D]; the embedding and LM head are
    the target's."""
    D = drafter.hidden_size
    per_layer = sum(projection_params(drafter).values()) + vector_params(drafter, qk_norm=True)
    projector = 0 if drafter.conditioning == "none" else drafter.num_taps * D * D + D
    return projector + D + drafter.num_layers * per_layer


def _sliding_layers(drafter) -> int:
    return sum(t == "sliding_attention" for t in (drafter.layer_types or ()))


def _add(name: str, *costs: Cost) -> Cost:
    """The components ``costs`` as one."""
    fields = ("flops", "weights", "kv_read", "kv_write", "activations")
    return Cost(name, **{f: sum(getattr(c, f) for c in costs) for f in fields})


def draft_costs(drafter, target, block_size: int, context: int, ctx_rows: int | None = None, *, batch: int = 1,
                weight_bytes: int = 2, kv_bytes: int = 2, dense_cache: int | None = None) -> list[Cost]:
    """One draft: ``ctx_rows`` new context rows through fc + hidden_norm and every layer's k/v
    into the draft cache; the block of ``block_size`` rows through every layer, attending
    non-causally to ``context`` cached rows (the new ones included) and to itself; the target's LM head on the
    ``block_size - 1`` draft rows. ``ctx_rows`` defaults to ``block_size``. ``dense_cache=M``: this project's XLA path (all M slots
    read, M + block_size keys per query). Components: fc, linears, attention, LM head (no fc
    with conditioning "none")."""
    D, k, n = drafter.hidden_size, drafter.num_taps, drafter.num_layers
    cond = drafter.conditioning
    if ctx_rows is None:  # this engine projects every verified row (the rejected ones masked)
        ctx_rows = block_size
    if cond == "none":  # no context: the block alone through the layers
        ctx_rows, keys = 0, 0
    else:
        keys = context if dense_cache is None else dense_cache
    linears = decoder_linears("drafter linears", drafter, n, block_size, block_size + ctx_rows,
                              qk_norm=True, batch=batch, weight_bytes=weight_bytes)
    sliding = _sliding_layers(drafter) if dense_cache is None else 0
    attention = [decoder_attention("drafter attention", drafter, layers, block_size * (seen + block_size), seen,
                                   ctx_rows, batch=batch, kv_bytes=kv_bytes)
                 for layers, seen in ((n - sliding, keys), (sliding, min(keys, drafter.sliding_window or 0))) if layers]
    if cond == "input" and n > 1:
        # the new context rows are rows of the layers too: in layers 0 .. n-2 they attend
        # causally to the context and go through o and the MLP, feeding the next layer's K/V
        # (the last layer needs only their K/V, counted above)
        p = projection_params(drafter)
        flops = 2 * batch * (n - 1) * ctx_rows * (p["q"] + p["o"] + p["mlp"])
        linears = dataclasses.replace(linears, flops=linears.flops + flops)
        pairs = ctx_rows * keys if dense_cache is not None else \
            ctx_rows * (keys - ctx_rows) + ctx_rows * (ctx_rows + 1) / 2
        attention.append(decoder_attention("drafter attention", drafter, n - 1, pairs, 0, 0, batch=batch))
    costs = [dataclasses.replace(linears, activations=batch * block_size * D * weight_bytes),
             _add("drafter attention", *attention),
             lm_head("drafter LM head", target, block_size - 1, batch=batch, weight_bytes=weight_bytes)]
    if cond != "none":
        costs.insert(0, Cost("drafter fc", flops=2 * batch * ctx_rows * k * D * D,
                             weights=(k * D * D + D) * weight_bytes,
                             activations=batch * ctx_rows * k * D * weight_bytes))  # taps read
    return costs
