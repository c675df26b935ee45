"""The size model's vocabulary: a forward pass cut into components (:class:`Cost`: the FLOPs
it must do and the bytes it must move through HBM, by kind) and the counts of the decoder
layers every family and drafting method is made of. A target family's size model
(``targets.base.TargetFamily.num_params`` ...) and a drafting method's
(``methods.base.DraftingMethod.num_params`` / ``draft_costs``) are written in these terms;
the rooflines (``tools/roofline*.py``) turn them into time on a device.

What is counted: ``weights`` (every matrix and norm vector of the forward, once, whatever the
batch), ``kv_read`` / ``kv_write`` (K and V of cached positions read, of new rows written),
``activations`` (what crosses HBM between kernels and is not a weight: embedding rows
gathered, target taps, float32 logits). FLOPs: 2 * rows * (parameters of each matrix the rows
pass through), plus attention 4 * H * Dh per (query, key) pair per layer (QK^T and PV); norms,
RoPE, softmax and the SwiGLU product are not counted.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

LOGIT_BYTES = 4  # logits are float32 in both the target and the draft


@dataclasses.dataclass(frozen=True)
class Cost:
    """One component of a step: ``flops`` it must do and the bytes it must move through HBM,
    by kind (``weights``, ``kv_read``, ``kv_write``, ``activations``; see the module doc)."""

    name: str
    flops: float
    weights: float = 0.0
    kv_read: float = 0.0
    kv_write: float = 0.0
    activations: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weights + self.kv_read + self.kv_write + self.activations

    def seconds(self, device) -> float:
        """max(bytes / bandwidth, flops / peak): the component's time at the roofline of
        ``device`` (anything with ``bandwidth`` in bytes/s and ``peak_flops``)."""
        return max(self.bytes / device.bandwidth, self.flops / device.peak_flops)

    def bound(self, device) -> str:
        """"memory" or "compute": which side of the roofline sets the time."""
        return "memory" if self.bytes / device.bandwidth >= self.flops / device.peak_flops else "compute"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"bytes": self.bytes}


def total(costs: Sequence[Cost], field: str) -> float:
    """Sum of one field (``flops``, ``bytes``, ``weights``, ...) over components."""
    return sum(getattr(c, field) for c in costs)


# ---------------------------------------------------------------------------- experts
def expected_experts(num_experts: int, k: int, rows: int) -> float:
    """Distinct experts ``rows`` tokens of one sequence route to under uniform routing, k each of
    E: ``E (1 - (1 - k/E) ** rows)``, capped at ``min(E, rows k)`` (0 for no rows)."""
    E = num_experts
    return 0.0 if rows <= 0 else min(E * (1.0 - (1.0 - k / E) ** rows), float(min(E, rows * k)))


# ---------------------------------------------------------------------------- decoder layers
def projection_params(cfg) -> dict:
    """Parameters of one decoder layer's matrices: ``q``, ``k``, ``v``, ``o`` (attention) and
    ``mlp`` (gate + up + down). ``cfg``: a TargetConfig or DrafterConfig."""
    D, Dh = cfg.hidden_size, cfg.head_dim
    return {"q": D * cfg.num_heads * Dh, "k": D * cfg.num_kv_heads * Dh,
            "v": D * cfg.num_kv_heads * Dh, "o": cfg.num_heads * Dh * D,
            "mlp": 3 * D * cfg.intermediate_size}


def vector_params(cfg, qk_norm: bool, attention_bias: bool = False) -> int:
    """Parameters of one decoder layer that are vectors: two RMSNorm weights [D], the
    per-head q/k norms [Dh] (Qwen3), and q/k/v/o biases when the config has them."""
    D, Dh = cfg.hidden_size, cfg.head_dim
    bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh + D if attention_bias else 0
    return 2 * D + (2 * Dh if qk_norm else 0) + bias


def kv_bytes_per_position(cfg, layers: int, kv_bytes: int) -> int:
    """Bytes of K and V of one position in ``layers`` layers."""
    return 2 * layers * cfg.num_kv_heads * cfg.head_dim * kv_bytes


def decoder_linears(name: str, cfg, layers: int, rows: int, kv_rows: int, *, qk_norm: bool,
                    attention_bias: bool = False, batch: int = 1, weight_bytes: int = 2) -> Cost:
    """The matrices of ``layers`` decoder layers: q, o and the MLP on ``rows`` rows per
    sequence, k and v on ``kv_rows`` rows (the drafter also projects its context rows)."""
    p = projection_params(cfg)
    per_layer = sum(p.values()) + vector_params(cfg, qk_norm, attention_bias)
    flops = 2 * batch * layers * (rows * (p["q"] + p["o"] + p["mlp"]) + kv_rows * (p["k"] + p["v"]))
    return Cost(name, flops=flops, weights=layers * per_layer * weight_bytes)


def decoder_attention(name: str, cfg, layers: int, query_key_pairs: float, kv_read_rows: float,
                      kv_write_rows: float, *, batch: int = 1, kv_bytes: int = 2) -> Cost:
    """Attention of ``layers`` layers: 4 * H * Dh FLOPs per (query, key) pair (QK^T and PV),
    K/V of ``kv_read_rows`` cached positions read and of ``kv_write_rows`` rows written."""
    per_pos = kv_bytes_per_position(cfg, layers, kv_bytes)
    return Cost(name, flops=4 * batch * layers * cfg.num_heads * cfg.head_dim * query_key_pairs,
                kv_read=batch * kv_read_rows * per_pos, kv_write=batch * kv_write_rows * per_pos)


def lm_head(name: str, target, rows: int, *, batch: int = 1,
            weight_bytes: int = 2) -> Cost:
    """The final norm and the target's LM head [D, V] on ``rows`` rows, float32 logits written."""
    D, V = target.hidden_size, target.vocab_size
    return Cost(name, flops=2 * batch * rows * D * V, weights=(V * D + D) * weight_bytes,
                activations=batch * rows * V * LOGIT_BYTES)
