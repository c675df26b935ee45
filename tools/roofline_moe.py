"""Roofline of mixture-of-experts (MoE) targets: one AR step against one DFlash iteration when
the verify's rows read more experts than one row does (``roofline --moe``).

The dense roofline (:mod:`dflash_jax.tools.roofline`) charges every weight once per forward,
whatever the rows. An MoE layer reads, besides its shared parts (attention, router, shared
expert, dense layers), only the experts its tokens route to. Under uniform routing, ``t``
tokens (rows x batch) each choosing ``k`` of ``E`` experts read on average

    E_read(t) = E * (1 - (1 - k/E) ** t)        (:func:`expected_experts`)

experts per MoE layer: 1 token reads k, a block of 16 rows ~82 of 128 for Qwen3-Coder-30B-A3B
(k = 8), ~51 of 128 for gpt-oss-120b (k = 4); ``TargetFamily.matrix_params_read`` is the same
formula. So the verify of a block costs several AR steps' worth of expert bytes, and
t_iter / t_AR grows with the block size where it hardly moves for a dense target.

What is counted, per forward (the dense module's rules otherwise: weights once, K/V of the
cached positions read, the new rows' K/V written, embedding rows in and taps out, float32
logits; a component's time is max(bytes / bandwidth, FLOPs / peak), the step the sum):

  target linears   q/k/v/o, the router (replicated), a shared expert and dense-MLP layers
                   where the model has them, norm vectors, q/k norms, biases and attention
                   sinks; FLOPs 2 x rows x their matrices.
  target experts   the routed experts: weight bytes of E_read(rows x batch) experts per MoE
                   layer (their biases included), FLOPs 2 x rows x k experts' matrices.
                   ``expert_bytes`` per parameter: 2 in bf16 (this project dequantizes
                   MXFP4 on load), or 17/32 for MXFP4 kept packed (a block of 32 e2m1 values
                   in 16 bytes + one u8 scale), what serving engines read for gpt-oss.
  target attention full layers: row i of the block sees S + i + 1 keys, S positions read;
                   sliding layers (a token sees W positions, itself included): row i sees
                   min(S + i + 1, W) keys, min(S, W - 1) cached positions read.
  target LM head   as the dense roofline.
  drafter          the dense roofline's drafter forward (the released MoE drafters are dense
                   Qwen3-style layers: fc over the taps, every layer on the block and the new
                   context rows, the target's LM head on bs - 1 rows).

Several GPUs (``tp`` devices on the ``model`` axis, NVLink; the collectives of
:mod:`dflash_jax.tools.parallel_comm`: one psum after the embedding, two per layer, one argmax
all-gather, per forward; ring formula, latency L per collective):

  tp   every expert split by its columns over the p devices (like the dense MLP): each device
       reads 1/p of every expert the tokens route to: E_read / p experts' bytes.
  ep   experts placed whole, E/p per device; attention still split by heads. The layer waits
       for the busiest device: it reads max over devices of the distinct experts routed to it
       (:func:`ep_load`, exact expectation by Monte Carlo over uniform routing, fixed seed).
       The tokens are replicated after the attention psum, so each device runs its experts
       on the rows routed to them and one psum combines the outputs: the same two psums
       per layer as tp (an all-to-all dispatch would move k x rows x D per layer instead).
  ep, attention replicated   this project's (expert = p, model = 1) mesh (``parallel``): the
       experts as ep, everything else (attention, LM head, the drafter) whole on every device,
       and one psum per MoE layer the only collective (36 for gpt-oss-120b instead of 74).

The counts come from the ``config.json`` alone (:func:`shape_from_hf`), so the model needs
no target family; they equal the registered families' size models (``qwen3_moe``, ``gpt_oss``:
``num_params``, ``matrix_params_read``, ``matrix_params_per_token``, tested).

Named configurations (:data:`MODELS`, :data:`DRAFTERS`) hold the published ``config.json``
values of the targets and of their released drafters; ``--moe PATH`` reads any qwen3_moe,
gpt_oss or deepseek_v3 (kimi_k2, kimi_k25) ``config.json`` (a drafter: ``--drafter``, else one
shaped like the target).

Latent attention (DeepSeek-V3, Kimi-K2.x: ``MoeShape.mla``): the per-head matrices (q_b, kv_b,
o) split by heads, the latent path (q_a, kv_a) read whole on every device; a cached position is
the latent and the rope key (r + dr numbers per layer), replicated; a (query, key) pair costs a
head 2 (2r + dr) FLOPs (the absorbed form, ``targets/mla/model.py``). Named scenarios on 8 x H200
and 8 x B200 with the released expert formats (FP8 blocks, INT4 groups).

    python -m dflash_jax roofline --moe gpt-oss-120b qwen3-coder-30b-a3b --out results/roofline/moe
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax import sizes
from dflash_jax.tools import roofline as dense
from dflash_jax.tools.roofline import Cost, DEVICES

MXFP4_BYTES = 17 / 32
"""Bytes per parameter of an MXFP4 tensor: 32 e2m1 values (16 bytes) and one u8 scale."""
FP8_BLOCK_BYTES = 1 + 4 / (128 * 128)
"""DeepSeek-V3's released FP8 weights: one byte each, one float32 scale per 128 x 128 block."""
INT4_G32_BYTES = 0.5 + 2 / 32
"""Kimi-K2.5's released INT4 experts: half a byte each, one bf16 scale per group of 32."""
CONTEXT = 1024
MOE_BLOCK_SIZES = (2, 4, 6, 8, 10, 12, 16, 24, 32)
"""Block sizes of the ratio curves and the best-block-size tables."""
SENSITIVITY_LATENCY_US = (2.0, 4.0, 8.0, 16.0)
"""Collective latencies (us) of the multi-GPU sensitivity table."""
EP_SAMPLES = 2000
"""Monte Carlo samples of :func:`ep_load` (seed 0)."""

# ---------------------------------------------------------------------------- named configs
MODELS: dict[str, dict] = {
    # openai/gpt-oss-120b config.json (transformers layout; the original/config.json agrees:
    # 36 layers, 128 experts, 4 per token, D = F = 2880, 64 heads / 8 KV heads of 64, vocab
    # 201088, sliding window 128 on every other layer starting with layer 0).
    "gpt-oss-120b": {
        "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
        "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True,
        "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention"] * 18},
    # openai/gpt-oss-20b: the same widths, 24 layers, 32 experts.
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
        "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True,
        "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention"] * 12},
    # Qwen/Qwen3-Coder-30B-A3B-Instruct config.json: 48 layers, all MoE (decoder_sparse_step
    # 1, no mlp_only_layers), 128 experts of width 768, 8 per token, D 2048, 32 heads / 4 KV
    # heads of 128, vocab 151936, no sliding window, no shared expert.
    "qwen3-coder-30b-a3b": {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 5472, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False},
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers (the first 3 dense, MLP 18432), 256 routed
    # experts of 2048, 8 per token in 4 of 8 groups, one shared expert, MLA with 128 heads
    # (q latent 1536, kv latent 512, rope 64, no-rope 128, value 128), vocab 129280; the MTP
    # layer (num_nextn_predict_layers 1) is not run and not counted.
    "deepseek-v3": {
        "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "tie_word_embeddings": False},
    # moonshotai/Kimi-K2.5 text_config (Kimi-K2's decoder): 61 layers (the first dense), 384
    # routed experts of 2048, 8 per token, one shared expert, MLA with 64 heads, vocab 163840.
    "kimi-k2.5": {
        "model_type": "deepseek_v3", "vocab_size": 163840, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "tie_word_embeddings": False},
}
"""The published ``config.json`` fields the roofline reads (results/roofline/moe/README.md
lists the sources)."""

DRAFTERS: dict[str, dict] = {
    # z-lab/gpt-oss-120b-DFlash: 8 Qwen3-style layers, D 2880, MLP 7680, 64 / 8 heads of 64,
    # block 10, taps [1, 9, 17, 25, 33] of 36 (0.78B parameters without embedding and head).
    "gpt-oss-120b": dict(num_layers=8, hidden_size=2880, intermediate_size=7680, num_heads=64,
                         num_kv_heads=8, head_dim=64, vocab_size=201088, block_size=10,
                         num_target_layers=36, target_layer_ids=(1, 9, 17, 25, 33),
                         mask_token_id=200000),
    # z-lab/gpt-oss-20b-DFlash: the same shapes, block 8, taps [1, 6, 11, 16, 21] of 24.
    "gpt-oss-20b": dict(num_layers=8, hidden_size=2880, intermediate_size=7680, num_heads=64,
                        num_kv_heads=8, head_dim=64, vocab_size=201088, block_size=8,
                        num_target_layers=24, target_layer_ids=(1, 6, 11, 16, 21),
                        mask_token_id=200000),
    # z-lab/Qwen3-Coder-30B-A3B-DFlash: 8 layers, D 2048, MLP 6144, 32 / 4 heads of 128,
    # block 16, taps [1, 12, 23, 34, 45] of 48 (0.47B parameters).
    "qwen3-coder-30b-a3b": dict(num_layers=8, hidden_size=2048, intermediate_size=6144,
                                num_heads=32, num_kv_heads=4, head_dim=128, vocab_size=151936,
                                block_size=16, num_target_layers=48,
                                target_layer_ids=(1, 12, 23, 34, 45),
                                mask_token_id=dense.QWEN3_MASK_TOKEN_ID),
    # z-lab/Kimi-K2.5-DFlash: 6 Qwen3-style layers, D 7168, MLP 18432, 64 / 8 heads, YaRN (its
    # published shapes); head dim 128, block 16 and the taps (the default rule for 61 layers)
    # are assumptions here, not read from its config.
    "kimi-k2.5": dict(num_layers=6, hidden_size=7168, intermediate_size=18432, num_heads=64,
                      num_kv_heads=8, head_dim=128, vocab_size=163840, block_size=16,
                      num_target_layers=61, target_layer_ids=(1, 12, 24, 35, 47, 58),
                      mask_token_id=163838),
    # no DFlash drafter is released for DeepSeek-V3: Kimi-K2.5-DFlash's shapes on its vocabulary
    "deepseek-v3": dict(num_layers=6, hidden_size=7168, intermediate_size=18432, num_heads=64,
                        num_kv_heads=8, head_dim=128, vocab_size=129280, block_size=16,
                        num_target_layers=61, target_layer_ids=(1, 12, 24, 35, 47, 58),
                        mask_token_id=128815),
}
"""The released drafters' shapes (their ``config.json``; mask ids only label the config)."""

TAUS = {
    "gpt-oss-120b": {"gsm8k": 5.3, "mt-bench": 3.7},
    "gpt-oss-20b": {"tau 4": 4.0},
    "qwen3-coder-30b-a3b": {"tau 4": 4.0, "tau 6.49 (paper, Qwen3-8B)": 6.49},
    "kimi-k2.5": {"tau 4": 4.0, "tau 6.49 (paper, Qwen3-8B)": 6.49},
    "deepseek-v3": {"tau 4": 4.0, "tau 6.49 (paper, Qwen3-8B)": 6.49},
}
"""Acceptance lengths to predict at: gpt-oss-120b's from its drafter's model card (block 10,
H200: about 5.3 on gsm8k down to 3.7 on mt-bench); the others are illustrations."""


# ---------------------------------------------------------------------------- the shape
@dataclasses.dataclass(frozen=True)
class MoeShape:
    """An MoE target as the roofline sees it, from its ``config.json`` alone (no family
    needed). Dimensions as ``TargetConfig``; ``moe_layers`` of the ``num_layers`` have routed
    experts (``num_experts`` = E, ``experts_per_token`` = k, each a SwiGLU of width
    ``expert_intermediate_size``), the others a dense SwiGLU of ``dense_intermediate_size``;
    ``sliding_layers`` of them attend within ``sliding_window`` positions."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    moe_layers: int
    dense_intermediate_size: int = 0
    shared_expert_size: int = 0
    router_bias: bool = False
    expert_bias: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    sliding_window: int | None = None
    sliding_layers: int = 0
    tie_word_embeddings: bool = False
    shared_gate: bool = True
    """The shared expert has a sigmoid gate [D] (Qwen's); DeepSeek's has none."""
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    """> 0: multi-head latent attention (DeepSeek-V3, Kimi-K2.x; :func:`attention_params`),
    ``head_dim`` then the rope dim and ``num_kv_heads`` = ``num_heads``."""
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "num_experts", "experts_per_token", "expert_intermediate_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"MoE config field {name} must be positive, got {getattr(self, name)}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts per token ({self.experts_per_token}) exceed the experts "
                             f"({self.num_experts})")
        if not 0 <= self.moe_layers <= self.num_layers:
            raise ValueError(f"moe_layers {self.moe_layers} must lie in 0..{self.num_layers}")
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("sliding layers need a positive sliding_window")

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers


def _field(d: Mapping[str, Any], *names: str, default=None):
    """The first of ``names`` present in ``d`` (a config may spell a field two ways)."""
    for n in names:
        if d.get(n) is not None:
            return d[n]
    if default is not None:
        return default
    raise ValueError(f"config.json has no {' / '.join(names)}: an MoE target needs it")


def shape_from_hf(d: Mapping[str, Any]) -> MoeShape:
    """The :class:`MoeShape` of a ``qwen3_moe`` or ``gpt_oss`` ``config.json`` dict; another
    model type, or a field the roofline does not model, is a ValueError naming it."""
    mt = d.get("model_type")
    if mt == "kimi_k25":  # the multimodal Kimi-K2.5: its text model
        return shape_from_hf({**_field(d, "text_config"), "model_type": "deepseek_v3"})
    D, L = int(_field(d, "hidden_size")), int(_field(d, "num_hidden_layers"))
    H = int(_field(d, "num_attention_heads"))
    common = dict(vocab_size=int(_field(d, "vocab_size")), hidden_size=D, num_layers=L,
                  num_heads=H, num_kv_heads=int(_field(d, "num_key_value_heads", default=H)),
                  head_dim=int(_field(d, "head_dim", default=D // H)),
                  tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                  attention_bias=bool(d.get("attention_bias", False)))
    if mt == "qwen3_moe":
        if d.get("use_sliding_window"):
            raise ValueError("config.json use_sliding_window: true is not modelled for qwen3_moe")
        E = int(_field(d, "num_experts", "num_local_experts"))  # transformers 5 writes the latter
        step, dense_ids = int(d.get("decoder_sparse_step", 1)), set(d.get("mlp_only_layers") or ())
        moe = sum(1 for i in range(L) if i not in dense_ids and E > 0 and (i + 1) % step == 0)
        return MoeShape(model_type=mt, num_experts=E,
                        experts_per_token=int(_field(d, "num_experts_per_tok")),
                        expert_intermediate_size=int(_field(d, "moe_intermediate_size")),
                        moe_layers=moe, dense_intermediate_size=int(d.get("intermediate_size") or 0),
                        qk_norm=True, **common)
    if mt == "gpt_oss":
        types = d.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                         for i in range(L)]
        unknown = set(types) - {"sliding_attention", "full_attention"}
        if unknown or len(types) != L:
            raise ValueError(f"config.json layer_types must be {L} of sliding_attention / "
                             f"full_attention, got {sorted(unknown) or len(types)}")
        sliding = sum(t == "sliding_attention" for t in types)
        return MoeShape(model_type=mt, num_experts=int(_field(d, "num_local_experts", "num_experts")),
                        experts_per_token=int(_field(d, "num_experts_per_tok", "experts_per_token")),
                        expert_intermediate_size=int(_field(d, "intermediate_size")),
                        moe_layers=L, router_bias=True, expert_bias=True, attention_sinks=True,
                        sliding_window=int(_field(d, "sliding_window")) if sliding else None,
                        sliding_layers=sliding, **common)
    if mt in ("deepseek_v3", "kimi_k2"):
        E = int(_field(d, "n_routed_experts"))
        dense_k = int(d.get("first_k_dense_replace") or 0)
        common.update(num_kv_heads=H, head_dim=int(_field(d, "qk_rope_head_dim")))
        return MoeShape(model_type=mt, num_experts=E, experts_per_token=int(_field(d, "num_experts_per_tok")),
                        expert_intermediate_size=int(_field(d, "moe_intermediate_size")),
                        moe_layers=L - dense_k, dense_intermediate_size=int(_field(d, "intermediate_size")),
                        shared_expert_size=int(d.get("n_shared_experts") or 0) * int(d["moe_intermediate_size"]),
                        shared_gate=False, router_bias=True,  # e_score_correction_bias [E]
                        q_lora_rank=int(d.get("q_lora_rank") or 0), kv_lora_rank=int(_field(d, "kv_lora_rank")),
                        qk_nope_head_dim=int(_field(d, "qk_nope_head_dim")), v_head_dim=int(_field(d, "v_head_dim")),
                        **common)
    raise ValueError(f"the MoE roofline reads model_type qwen3_moe, gpt_oss or deepseek_v3 (kimi_k2, "
                     f"kimi_k25), not {mt!r}")


# ---------------------------------------------------------------------------- parameters
def attention_params(s) -> int:
    """q, k, v and o of one layer (``s``: an MoeShape or a DrafterConfig); MLA's matrices
    (:func:`mla_split_params` + :func:`mla_latent_params`) for a latent-attention target."""
    if getattr(s, "kv_lora_rank", 0):
        return mla_split_params(s) + mla_latent_params(s)
    D, Dh = s.hidden_size, s.head_dim
    return 2 * D * s.num_heads * Dh + 2 * D * s.num_kv_heads * Dh


def mla_split_params(s: MoeShape) -> int:
    """MLA's per-head matrices, split by heads under tensor parallelism: the query's up
    projection (or its one projection without a q latent), ``kv_b_proj`` (each head's no-rope key
    and value from the latent; in the absorbed form the same matrix multiplies the queries and
    the attention output) and ``o_proj``."""
    D, H, r = s.hidden_size, s.num_heads, s.kv_lora_rank
    qk = s.qk_nope_head_dim + s.head_dim
    q = (s.q_lora_rank or D) * H * qk
    return q + r * H * (s.qk_nope_head_dim + s.v_head_dim) + H * s.v_head_dim * D


def mla_latent_params(s: MoeShape) -> int:
    """MLA's latent path, replicated under tensor parallelism: ``q_a_proj`` and
    ``kv_a_proj_with_mqa`` (the latent and the shared rope key)."""
    D = s.hidden_size
    return D * s.q_lora_rank + D * (s.kv_lora_rank + s.head_dim)


def attention_params_per_device(s: MoeShape, p: int) -> float:
    """One layer's attention matrices on one of ``p`` devices splitting the heads."""
    if s.mla:
        return mla_split_params(s) / p + mla_latent_params(s)
    return attention_params(s) / p


def kv_numbers_per_position(s: MoeShape, p: int) -> float:
    """Decode-state numbers one cached position of one layer holds on one of ``p`` devices: K and
    V of its KV heads, or MLA's latent and rope key (replicated: every head reads all of it)."""
    if s.mla:
        return s.kv_lora_rank + s.head_dim
    return 2 * (s.num_kv_heads // p) * s.head_dim


def layer_vectors(s: MoeShape) -> int:
    """One layer's vectors: two norms, q/k norms, q/k/v/o biases, attention sinks (MLA: the
    two norms and the q and kv latent norms)."""
    if s.mla:
        return 2 * s.hidden_size + s.q_lora_rank + s.kv_lora_rank
    D, Dh = s.hidden_size, s.head_dim
    bias = (s.num_heads + 2 * s.num_kv_heads) * Dh + D if s.attention_bias else 0
    return 2 * D + (2 * Dh if s.qk_norm else 0) + bias + (s.num_heads if s.attention_sinks else 0)


def expert_matrix_params(s: MoeShape) -> int:
    """One expert's gate, up and down matrices: 3 D F_e."""
    return 3 * s.hidden_size * s.expert_intermediate_size


def expert_vector_params(s: MoeShape) -> int:
    """One expert's biases (gpt-oss: gate_up [2 F_e], down [D])."""
    return 2 * s.expert_intermediate_size + s.hidden_size if s.expert_bias else 0


def router_params(s: MoeShape) -> int:
    return s.hidden_size * s.num_experts + (s.num_experts if s.router_bias else 0)


def shared_params(s: MoeShape) -> int:
    """A shared expert (3 D F_s) and its sigmoid gate [D] (Qwen's; DeepSeek's has none), where
    the model has one."""
    if not s.shared_expert_size:
        return 0
    return 3 * s.hidden_size * s.shared_expert_size + (s.hidden_size if s.shared_gate else 0)


def expected_experts(num_experts: int, k: int, tokens: float) -> float:
    """Distinct experts ``tokens`` tokens route to under uniform top-k routing:
    E (1 - (1 - k/E)^tokens) (each expert is missed by one token with probability 1 - k/E)."""
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def num_params(s: MoeShape) -> int:
    """Every parameter: embedding, LM head (unless tied), layers, final norm."""
    D, V = s.hidden_size, s.vocab_size
    per_moe = router_params(s) + s.num_experts * (expert_matrix_params(s) + expert_vector_params(s)) + shared_params(s)
    return (V * D * (1 if s.tie_word_embeddings else 2) + D
            + s.num_layers * (attention_params(s) + layer_vectors(s))
            + s.moe_layers * per_moe + s.dense_layers * 3 * D * s.dense_intermediate_size)


def active_params(s: MoeShape) -> int:
    """Matrix parameters one token multiplies with (the LM head included, the embedding not):
    what ``TargetFamily.matrix_params_per_token`` counts, less the embedding rows."""
    D = s.hidden_size
    return (s.vocab_size * D + s.num_layers * attention_params(s)
            + s.moe_layers * (s.hidden_size * s.num_experts + 3 * D * s.shared_expert_size
                              + s.experts_per_token * expert_matrix_params(s))
            + s.dense_layers * 3 * D * s.dense_intermediate_size)


def matrix_params_read(s: MoeShape, tokens: float) -> float:
    """Matrix parameters a forward over ``tokens`` tokens reads: the LM head, every layer's
    attention, router, shared and dense MLPs, and E_read(tokens) experts per MoE layer (the
    formula of ``TargetFamily.matrix_params_read``, embedding aside)."""
    D = s.hidden_size
    return (s.vocab_size * D + s.num_layers * attention_params(s)
            + s.moe_layers * (D * s.num_experts + 3 * D * s.shared_expert_size
                              + expected_experts(s.num_experts, s.experts_per_token, tokens)
                              * expert_matrix_params(s))
            + s.dense_layers * 3 * D * s.dense_intermediate_size)


@functools.lru_cache(maxsize=None)
def ep_load(num_experts: int, k: int, devices: int, tokens: int,
            samples: int = EP_SAMPLES, seed: int = 0) -> dict:
    """Expert parallelism's busiest device, by Monte Carlo over uniform top-k routing (each
    token picks k distinct experts; expert e lives on device e // (E / devices)):
    ``max_experts``: E[max over devices of the distinct experts routed to it];
    ``max_assignments``: E[max over devices of the (token, expert) pairs it computes];
    ``mean_experts``: E_read / devices, what tensor parallelism reads per device."""
    if num_experts % devices:
        raise ValueError(f"expert parallelism over {devices} devices needs E ({num_experts}) "
                         "divisible by it")
    rng = np.random.default_rng(seed)
    per = num_experts // devices
    max_e, max_a = [], []
    for _ in range(max(1, samples // 200)):  # chunks of 200 samples bound the memory
        n = min(200, samples)
        scores = rng.random((n, tokens, num_experts))
        chosen = np.argpartition(scores, k - 1, axis=-1)[..., :k]  # k distinct experts a token
        hits = np.zeros((n, tokens, num_experts), bool)
        np.put_along_axis(hits, chosen, True, axis=-1)
        by_dev = hits.reshape(n, tokens, devices, per)
        max_e.append(by_dev.any(axis=1).sum(-1).max(-1))
        max_a.append(by_dev.sum((1, 3)).max(-1))
    return {"max_experts": float(np.concatenate(max_e).mean()),
            "max_assignments": float(np.concatenate(max_a).mean()),
            "mean_experts": expected_experts(num_experts, k, tokens) / devices}


# ---------------------------------------------------------------------------- forwards
@dataclasses.dataclass(frozen=True)
class Layout:
    """How the pair runs: ``devices`` GPUs on the model axis, experts split by columns
    (``"tp"``) or placed whole (``"ep"``); ``expert_bytes`` per expert parameter."""

    devices: int = 1
    experts: str = "tp"
    expert_bytes: float = 2.0
    replicate_attention: bool = False
    """With ``experts="ep"``: this project's (expert = devices, model = 1) mesh, where
    everything but the experts (attention, LM head, the drafter) is whole on every device and
    the only collective is one psum per MoE layer; default: attention split by heads."""

    @property
    def model(self) -> int:
        """Devices that split the attention heads, dense MLPs, LM head and the drafter."""
        return 1 if self.replicate_attention else self.devices

    def __post_init__(self):
        if self.experts not in ("tp", "ep"):
            raise ValueError(f"experts layout must be 'tp' or 'ep', got {self.experts!r}")
        if self.devices < 1:
            raise ValueError(f"devices must be >= 1, got {self.devices}")
        if self.replicate_attention and self.experts != "ep":
            raise ValueError("replicate_attention is a layout of expert parallelism (experts='ep')")

    @property
    def label(self) -> str:
        fmt = {2: "bf16", MXFP4_BYTES: "MXFP4", FP8_BLOCK_BYTES: "FP8 (128 x 128 blocks)",
               INT4_G32_BYTES: "INT4 (groups of 32)"}.get(self.expert_bytes, f"{self.expert_bytes:g} B")
        par = "" if self.devices == 1 else f", {self.experts.upper()} {self.devices}"
        if self.replicate_attention:
            par += " (expert = 8, model = 1 mesh: attention replicated)".replace("8", str(self.devices))
        return f"{self.devices} GPU{'s' if self.devices > 1 else ''}{par}, experts {fmt}"


def check_layout(s: MoeShape, layout: Layout) -> None:
    """Refuses a device count that does not split the heads, KV heads and experts."""
    p, m = layout.devices, layout.model
    kv = () if s.mla else (("num_key_value_heads", s.num_kv_heads, m),)
    for what, n, d in kv + (("num_attention_heads", s.num_heads, m),
                       ("expert width", s.expert_intermediate_size, p), ("experts", s.num_experts, p)):
        if n % d:
            raise ValueError(f"{d} devices must divide {what} ({n})")


def moe_target_forward(s: MoeShape, rows: int, context: int, layout: Layout = Layout(), *,
                       taps: int = 0, batch: int = 1, weight_bytes: int = 2,
                       kv_bytes: int = 2) -> list[Cost]:
    """The target on ``rows`` new rows per sequence over ``context`` cached positions, on one
    device of ``layout`` (its share of the weights, heads and K/V; the busiest device under
    expert parallelism): linears, routed experts, attention, LM head (see the module doc)."""
    p, D, L = layout.model, s.hidden_size, s.num_layers
    t = rows * batch
    shared_mats = (L * attention_params_per_device(s, p) + s.moe_layers * 3 * D * s.shared_expert_size // p
                   + s.dense_layers * 3 * D * s.dense_intermediate_size // p)
    routers = s.moe_layers * D * s.num_experts
    vectors = L * layer_vectors(s) + s.moe_layers * (router_params(s) - D * s.num_experts
                                                     + (D if s.shared_expert_size and s.shared_gate else 0))
    linears = Cost("target linears", flops=2 * t * (shared_mats + routers),
                   weights=(shared_mats + routers + vectors) * weight_bytes,
                   activations=t * D * (1 + taps) * weight_bytes)
    em, ev, k = expert_matrix_params(s), expert_vector_params(s), s.experts_per_token
    if layout.experts == "tp" or layout.devices == 1:
        read, q = expected_experts(s.num_experts, k, t), layout.devices
        experts = Cost("target experts", flops=2 * t * k * s.moe_layers * em / q,
                       weights=s.moe_layers * read * (em / q * layout.expert_bytes + ev * weight_bytes))
    else:
        load = ep_load(s.num_experts, k, layout.devices, t)
        experts = Cost("target experts", flops=2 * load["max_assignments"] * s.moe_layers * em,
                       weights=s.moe_layers * load["max_experts"] * (em * layout.expert_bytes
                                                                     + ev * weight_bytes))
    Hp = s.num_heads // p
    per_pos = kv_numbers_per_position(s, p) * kv_bytes  # one position in one layer
    full_pairs = rows * context + rows * (rows + 1) / 2
    W = s.sliding_window or 1
    slide_pairs = sum(min(context + i + 1, W) for i in range(rows))
    pairs = s.full_layers * full_pairs + s.sliding_layers * slide_pairs
    kv_read = s.full_layers * context + s.sliding_layers * min(context, W - 1)
    # FLOPs per (query, key) pair and head: scores and weighted values, 2 Dh each; MLA's
    # absorbed form scores against the latent and the rope key (2 (r + dr)) and weighs the
    # latents (2 r); its per-row absorption is kv_b_proj's, counted with the linears
    per_pair = 2 * (2 * s.kv_lora_rank + s.head_dim) if s.mla else 4 * s.head_dim
    attention = Cost("target attention", flops=batch * Hp * per_pair * pairs,
                     kv_read=batch * kv_read * per_pos, kv_write=batch * rows * L * per_pos)
    Vp = -(-s.vocab_size // p)
    head = Cost("target LM head", flops=2 * t * D * Vp, weights=(Vp * D + D) * weight_bytes,
                activations=t * Vp * sizes.LOGIT_BYTES)
    return [linears, experts, attention, head]


@dataclasses.dataclass(frozen=True)
class _HeadShape:
    """What the dense drafter forward reads of the target for its LM head."""

    hidden_size: int
    vocab_size: int


def _head_shape(s: MoeShape, p: int) -> _HeadShape:
    """The target's LM head on one of p devices: D and ceil(V / p) rows."""
    return _HeadShape(s.hidden_size, -(-s.vocab_size // p))


def shard_drafter(drafter: DrafterConfig, p: int) -> DrafterConfig:
    """The drafter's share on one of p devices (heads, KV heads, MLP columns / p; fc whole)."""
    if p == 1:
        return drafter
    for what, n in (("num_key_value_heads", drafter.num_kv_heads),
                    ("intermediate_size", drafter.intermediate_size)):
        if n % p:
            raise ValueError(f"{p} devices must divide the drafter's {what} ({n})")
    return dataclasses.replace(drafter, num_heads=drafter.num_heads // p,
                               num_kv_heads=drafter.num_kv_heads // p,
                               intermediate_size=drafter.intermediate_size // p)


def ar_step(s: MoeShape, context: int, layout: Layout = Layout(), **kw) -> list[Cost]:
    """One AR step: the target on 1 row."""
    return moe_target_forward(s, 1, context, layout, **kw)


def dflash_iteration(s: MoeShape, drafter: DrafterConfig, block_size: int, context: int,
                     layout: Layout = Layout(), *, batch: int = 1, weight_bytes: int = 2,
                     kv_bytes: int = 2) -> list[Cost]:
    """One DFlash iteration: the (dense) drafter on the block, then the target verifying the
    ``block_size`` rows (which route to E_read(block_size x batch) experts per layer)."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    draft = dense.drafter_forward(shard_drafter(drafter, layout.model), _head_shape(s, layout.model),
                                  block_size, context, block_size, **kw)
    return draft + moe_target_forward(s, block_size, context, layout, taps=drafter.num_taps, **kw)


def collectives(s: MoeShape, drafter: DrafterConfig | None, rows: int, p: int,
                batch: int = 1, act_bytes: int = 2, replicate_attention: bool = False) -> list:
    """The psums and argmax all-gathers of one AR step (``drafter`` None, ``rows`` 1) or one
    iteration (:func:`dflash_jax.tools.parallel_comm.forward_collectives`); with
    ``replicate_attention`` only the target's psum of each MoE layer's [rows, D] output."""
    from dflash_jax.tools import parallel_comm as pc  # it imports roofline: not at module level

    if replicate_attention:
        return [pc.Collective("MoE layer psums", "all-reduce", s.moe_layers,
                              batch * rows * s.hidden_size * act_bytes)] if p > 1 else []
    out = pc.forward_collectives("target", s.num_layers, s.hidden_size, rows, rows, p, batch, act_bytes)
    if drafter is not None:
        out = pc.forward_collectives("drafter", drafter.num_layers, drafter.hidden_size, rows,
                                     rows - 1, p, batch, act_bytes) + out
    return out


def comm_seconds(colls, p: int, device: str, latency_us: float) -> float:
    from dflash_jax.tools import parallel_comm as pc

    if p == 1:
        return 0.0
    return pc.comm_totals(colls, p, pc.NODES[device].link_bandwidth, latency_us * 1e-6)["seconds"]


def step_times(s: MoeShape, drafter: DrafterConfig, block_size: int, context: int, device: str,
               layout: Layout = Layout(), *, batch: int = 1, latency_us: float | None = None) -> dict:
    """AR step and iteration on ``device`` under ``layout``: compute (roofline), comm, totals,
    ratio, and the bytes of both."""
    from dflash_jax.tools import parallel_comm as pc

    latency_us = pc.LATENCY_US if latency_us is None else latency_us
    dev, p = DEVICES[device], layout.devices
    ar = ar_step(s, context, layout, batch=batch)
    it = dflash_iteration(s, drafter, block_size, context, layout, batch=batch)
    rep = layout.replicate_attention
    c_ar = comm_seconds(collectives(s, None, 1, p, batch, replicate_attention=rep), p, device, latency_us)
    c_it = comm_seconds(collectives(s, drafter, block_size, p, batch, replicate_attention=rep), p,
                        device, latency_us)
    t_ar, t_it = dense.seconds(ar, dev) + c_ar, dense.seconds(it, dev) + c_it
    return {"t_ar_us": 1e6 * t_ar, "t_iter_us": 1e6 * t_it, "ratio": t_it / t_ar,
            "comm_ar_us": 1e6 * c_ar, "comm_iter_us": 1e6 * c_it,
            "ar_bytes": dense.total(ar, "bytes"), "iter_bytes": dense.total(it, "bytes"),
            "ar_expert_bytes": ar[1].bytes, "verify_expert_bytes": it[-3].bytes,
            "components_us": {"ar_step": {c.name: 1e6 * c.seconds(dev) for c in ar},
                              "iteration": {c.name: 1e6 * c.seconds(dev) for c in it}}}


# ---------------------------------------------------------------------------- scenarios
@dataclasses.dataclass(frozen=True)
class Scenario:
    """One prediction: a named model on ``device`` x layout, its acceptance lengths."""

    model: str
    device: str
    layout: Layout
    taus: Mapping[str, float]
    note: str = ""


SCENARIOS = (
    Scenario("qwen3-coder-30b-a3b", "h100", Layout(1), TAUS["qwen3-coder-30b-a3b"]),
    Scenario("gpt-oss-120b", "h200", Layout(1, expert_bytes=MXFP4_BYTES), TAUS["gpt-oss-120b"],
             "where the drafter's tau was measured (MXFP4 experts: 66 GB of weights)"),
    Scenario("gpt-oss-120b", "b200", Layout(8, "tp"), TAUS["gpt-oss-120b"]),
    Scenario("gpt-oss-120b", "b200", Layout(8, "ep"), TAUS["gpt-oss-120b"]),
    Scenario("gpt-oss-120b", "b200", Layout(8, "ep", replicate_attention=True), TAUS["gpt-oss-120b"],
             "this project's (expert = 8, model = 1) mesh"),
    Scenario("gpt-oss-120b", "b200", Layout(8, "tp", MXFP4_BYTES), TAUS["gpt-oss-120b"]),
    Scenario("gpt-oss-120b", "b200", Layout(8, "ep", MXFP4_BYTES), TAUS["gpt-oss-120b"]),
    Scenario("deepseek-v3", "h200", Layout(8, "tp", FP8_BLOCK_BYTES), TAUS["deepseek-v3"],
             "the released FP8 experts; illustrative drafter (none released)"),
    Scenario("deepseek-v3", "h200", Layout(8, "ep", FP8_BLOCK_BYTES), TAUS["deepseek-v3"]),
    Scenario("deepseek-v3", "b200", Layout(8, "ep", FP8_BLOCK_BYTES), TAUS["deepseek-v3"]),
    Scenario("kimi-k2.5", "h200", Layout(8, "tp", INT4_G32_BYTES), TAUS["kimi-k2.5"],
             "the released INT4 experts"),
    Scenario("kimi-k2.5", "h200", Layout(8, "ep", INT4_G32_BYTES), TAUS["kimi-k2.5"]),
    Scenario("kimi-k2.5", "b200", Layout(8, "ep", INT4_G32_BYTES), TAUS["kimi-k2.5"]),
)
"""The predictions the committed report makes (results/roofline/moe)."""


def pair(name_or_path: str, drafter_path: str | None = None) -> tuple[str, MoeShape, DrafterConfig]:
    """(name, shape, drafter) of a named model of :data:`MODELS` or a ``config.json`` path
    (directory or file); the drafter: its released one (named), ``drafter_path``, or an
    8-layer drafter shaped like the target, block 16."""
    if name_or_path in MODELS:
        name, d = name_or_path, MODELS[name_or_path]
    else:
        path = os.path.join(name_or_path, "config.json") if os.path.isdir(name_or_path) else name_or_path
        if not os.path.exists(path):
            raise ValueError(f"--moe {name_or_path!r} is neither a named MoE config "
                             f"({', '.join(MODELS)}) nor a config.json or its directory")
        with open(path) as f:
            d = json.load(f)
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    s = shape_from_hf(d)
    if drafter_path:
        drafter = DrafterConfig.from_pretrained(drafter_path)
    elif name in DRAFTERS:
        drafter = DrafterConfig(**DRAFTERS[name])
    else:
        ids = tuple(sorted({round(1 + i * (s.num_layers - 3) / 4) for i in range(5)}))
        drafter = DrafterConfig(num_layers=8, hidden_size=s.hidden_size,
                                intermediate_size=3 * s.hidden_size, num_heads=s.num_heads,
                                num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                                vocab_size=s.vocab_size, block_size=16, num_target_layers=s.num_layers,
                                target_layer_ids=ids, mask_token_id=0)
    if drafter.hidden_size != s.hidden_size or drafter.vocab_size != s.vocab_size:
        raise ValueError(f"the drafter's hidden_size / vocab_size ({drafter.hidden_size} / "
                         f"{drafter.vocab_size}) must equal the target's ({s.hidden_size} / {s.vocab_size})")
    return name, s, drafter


def analyse_scenario(sc: Scenario, s: MoeShape, drafter: DrafterConfig, context: int,
                     block_sizes: Sequence[int] = MOE_BLOCK_SIZES, batch: int = 1) -> dict:
    """One scenario: times at the drafter's block size, speedups at its taus, the ratio per
    block size, the best block size per tau (geometric acceptance from the drafter's block),
    and what reading E_read(bs) experts instead of k costs the speedup."""
    check_layout(s, sc.layout)
    bs0 = drafter.block_size
    at = lambda bs, shape=s: step_times(shape, drafter, bs, context, sc.device, sc.layout, batch=batch)
    main = at(bs0)
    sizes = sorted(set(block_sizes) | {bs0})
    ratios = {bs: at(bs)["ratio"] for bs in sizes}
    # the same pair if the verify read only k experts per layer (as if E_read stayed at k):
    # a model with k experts of which all k are used: what MoE's extra expert reads cost
    active_only = dataclasses.replace(s, num_experts=s.experts_per_token)
    if sc.layout.experts == "ep" and sc.layout.devices > 1:
        active_only = None  # k experts cannot be placed over the devices: not defined
    ratio_active_only = at(bs0, active_only)["ratio"] if active_only is not None else None
    taus = dict(sc.taus)
    latency = ({str(L): at_latency(s, drafter, bs0, context, sc, L, batch) for L in SENSITIVITY_LATENCY_US}
               if sc.layout.devices > 1 else None)
    best = dense.best_block_sizes(ratios, sorted(set(taus.values())), bs0)
    return {
        "model": sc.model, "device": sc.device, "device_name": DEVICES[sc.device].name,
        "layout": dataclasses.asdict(sc.layout), "label": f"{sc.model}, {DEVICES[sc.device].name.split(' (')[0]} x {sc.layout.label}",
        "note": sc.note, "block_size": bs0, "context": context, "batch": batch,
        **{k: v for k, v in main.items()},
        "speedup": {label: dense.predicted_speedup(t, main["t_ar_us"], main["t_iter_us"])
                    for label, t in taus.items()},
        "taus": taus,
        "experts_read": {"ar_step": expected_experts(s.num_experts, s.experts_per_token, batch),
                         "verify": expected_experts(s.num_experts, s.experts_per_token, bs0 * batch),
                         **({"ep_busiest_ar": ep_load(s.num_experts, s.experts_per_token, sc.layout.devices, batch)["max_experts"],
                             "ep_busiest_verify": ep_load(s.num_experts, s.experts_per_token, sc.layout.devices, bs0 * batch)["max_experts"]}
                            if sc.layout.experts == "ep" and sc.layout.devices > 1 else {})},
        "ratio_if_verify_read_k_experts": ratio_active_only,
        "latency_sensitivity": latency,
        "ratio_by_block_size": {str(bs): r for bs, r in ratios.items()},
        "best_block_size": best,
    }


def at_latency(s: MoeShape, drafter: DrafterConfig, bs: int, context: int, sc: Scenario,
               latency_us: float, batch: int = 1) -> dict:
    """t_AR, t_iter and their ratio with a collective latency of ``latency_us``."""
    r = step_times(s, drafter, bs, context, sc.device, sc.layout, batch=batch, latency_us=latency_us)
    return {k: r[k] for k in ("t_ar_us", "t_iter_us", "ratio")}


def dense_reference(context: int, devices: Sequence[str], taus: Mapping[str, float],
                    batch: int = 1) -> list[dict]:
    """The dense Qwen3-8B pair of the dense roofline (5-layer drafter, block 16), per device."""
    from dflash_jax.bench.decode_speed import PRESETS

    target = TargetConfig(**PRESETS["qwen3-8b"])
    drafter = DrafterConfig.for_target(target, 5, block_size=16, mask_token_id=dense.QWEN3_MASK_TOKEN_ID)
    out = []
    for dev in devices:
        r = dense.step_times(target, drafter, 16, context, DEVICES[dev], batch=batch)
        ratios = {bs: dense.step_times(target, drafter, bs, context, DEVICES[dev], batch=batch)["ratio"]
                  for bs in MOE_BLOCK_SIZES}
        out.append({"model": "qwen3-8b (dense)", "device": dev, "device_name": DEVICES[dev].name,
                    "label": f"qwen3-8b (dense), {DEVICES[dev].name.split(' (')[0]} x 1 GPU",
                    "block_size": 16, "t_ar_us": 1e6 * r["t_ar_s"], "t_iter_us": 1e6 * r["t_iter_s"],
                    "ratio": r["ratio"],
                    "speedup": {label: t / r["ratio"] for label, t in taus.items()},
                    "ratio_by_block_size": {str(bs): v for bs, v in ratios.items()},
                    "best_block_size": dense.best_block_sizes(ratios, sorted(set(taus.values())), 16)})
    return out


# ---------------------------------------------------------------------------- report
def run_moe(args) -> dict:
    """``roofline --moe``: the scenarios of the named models (or one config.json on
    ``--devices``), the dense reference, JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    context = args.context
    rows, shapes = [], {}
    for target in args.moe:
        name, s, drafter = pair(target, args.drafter)
        if args.block_size:
            drafter = dataclasses.replace(drafter, block_size=args.block_size)
        shapes[name] = (s, drafter)
        scenarios = [sc for sc in SCENARIOS if sc.model == name and not args.moe_devices]
        if not scenarios:  # a config.json, a named model without scenarios, or --moe-devices
            scenarios = [Scenario(name, dev, Layout(1), TAUS.get(name, {"tau 4": 4.0}))
                         for dev in (args.moe_devices or ["h100"])]
        for sc in scenarios:
            rows.append(analyse_scenario(sc, s, drafter, context, batch=args.batch))
    report = {
        "benchmark": "roofline_moe",
        "command": command_line("dflash_jax", invocation(args)),
        "settings": {"context": context, "batch": args.batch, "dtype": "bfloat16",
                     "block_sizes": list(MOE_BLOCK_SIZES), "ep_samples": EP_SAMPLES},
        "models": {name: {"shape": dataclasses.asdict(s), "drafter": drafter.to_hf_dict(),
                          "params": num_params(s), "active_params": active_params(s),
                          "drafter_params": dense._drafter_params(drafter),
                          "experts_read_by_rows": {str(r): expected_experts(s.num_experts, s.experts_per_token, r)
                                                   for r in (1, 2, 4, 8, 10, 16, 32)}}
                   for name, (s, drafter) in shapes.items()},
        "device_profiles": {k: dataclasses.asdict(v) for k, v in DEVICES.items()},
        "scenarios": rows,
        "dense_reference": dense_reference(context, ["h100", "b200"], {"tau 4": 4.0, "paper": dense.PAPER["tau"]},
                                           batch=args.batch),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    from dflash_jax.tools import parallel_comm as pc

    report["settings"] |= {"latency_us": pc.LATENCY_US,
                           "nvlink": {k: dataclasses.asdict(v) for k, v in pc.NODES.items()}}
    return publish_report(report, args.out, "moe", plot, markdown)


def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [f"`{report['command']}`", "",
             f"Batch {st['batch']}, context S = {st['context']}, bf16 weights and KV (experts as "
             "the layout says), the drafters' own block size; collectives on NVLink with "
             f"L = {st['latency_us']:g} us each.", "",
             "| model | params | active | experts / token | experts read: 1 row, 16 rows | drafter |",
             "|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        s = m["shape"]
        lines.append(f"| {name} | {m['params'] / 1e9:.1f}B | {m['active_params'] / 1e9:.2f}B | "
                     f"{s['experts_per_token']} of {s['num_experts']} | "
                     f"{m['experts_read_by_rows']['1']:.0f}, {m['experts_read_by_rows']['16']:.1f} | "
                     f"{m['drafter']['num_hidden_layers']} layers, {m['drafter_params'] / 1e6:.0f}M, "
                     f"block {m['drafter']['block_size']} |")
    lines += ["", "| scenario | bs | t_AR (us) | t_iter (us) | t_iter / t_AR | if the verify read k "
              "experts | comm AR / iter (us) | speedup at tau |", "|---|---|---|---|---|---|---|---|"]
    for r in report["scenarios"] + report["dense_reference"]:
        ko = r.get("ratio_if_verify_read_k_experts")
        comm = (f"{r['comm_ar_us']:.0f} / {r['comm_iter_us']:.0f}" if r.get("comm_ar_us") else "-")
        lines.append(f"| {r['label']} | {r['block_size']} | {r['t_ar_us']:.0f} | {r['t_iter_us']:.0f} | "
                     f"{r['ratio']:.3f} | {f'{ko:.3f}' if ko else '-'} | {comm} | "
                     + ", ".join(f"{v:.2f}x ({k})" for k, v in r["speedup"].items()) + " |")
    multi = [r for r in report["scenarios"] if r.get("latency_sensitivity")]
    if multi:
        Ls = list(multi[0]["latency_sensitivity"])
        lines += ["", "Multi-GPU: t_AR / t_iter (us) and their ratio against the latency L of one "
                  "collective (TP and EP: 2 per layer and 2 more per forward, the target's in an AR "
                  "step, the drafter's and the target's in an iteration; attention replicated: "
                  "1 per MoE layer of the target):", "", "| scenario | " + " | ".join(f"L = {L} us" for L in Ls) + " |",
                  "|---|" + "---|" * len(Ls)]
        for r in multi:
            lines.append(f"| {r['label']} | " + " | ".join(
                f"{v['t_ar_us']:.0f} / {v['t_iter_us']:.0f} = {v['ratio']:.3f}"
                for v in r["latency_sensitivity"].values()) + " |")
    lines += ["", "t_iter / t_AR by block size:", "",
              "| scenario | " + " | ".join(f"bs {b}" for b in st["block_sizes"]) + " |",
              "|---|" + "---|" * len(st["block_sizes"])]
    for r in report["scenarios"] + report["dense_reference"]:
        lines.append(f"| {r['label']} | " + " | ".join(f"{r['ratio_by_block_size'][str(b)]:.3f}"
                                                      for b in st["block_sizes"]) + " |")
    lines += ["", "Best block size per tau (geometric acceptance: tau measured at the drafter's "
              "block, per-row acceptance alpha fitted to it, tau(bs) = (1 - alpha^bs) / (1 - alpha)):",
              "", "| scenario | tau at its bs | alpha | best bs | speedup there | speedup at its bs |",
              "|---|---|---|---|---|---|"]
    for r in report["scenarios"] + report["dense_reference"]:
        for row in r["best_block_size"]:
            if "alpha" not in row:
                continue
            lines.append(f"| {r['label']} | {row['tau']:g} at bs {r['block_size']} | {row['alpha']:.3f} | "
                         f"{row['geometric_best_bs']} | {row['geometric_speedup']:.2f}x | "
                         f"{row['geometric_speedup_at_reference']:.2f}x |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Three panels: experts read against rows, t_iter / t_AR against block size, and the
    predicted speedup against block size under the geometric acceptance model (the lowest tau
    of each scenario); the scenarios' legend below them."""
    fig, axes = new_figure(2, 3, figsize=(17, 7.5), gridspec_kw={"height_ratios": [3, 1.1]})
    (a, b, c), bottom = axes[0], axes[1]
    for ax in bottom:
        ax.axis("off")
    rows = np.arange(1, 33)
    for name, m in report["models"].items():
        s = m["shape"]
        a.plot(rows, [expected_experts(s["num_experts"], s["experts_per_token"], r) for r in rows],
               label=f"{name} (k {s['experts_per_token']} of {s['num_experts']})")
    a.set(xlabel="rows (tokens) in the forward", ylabel="experts read per MoE layer",
          title="E (1 - (1 - k/E)^rows), uniform routing")
    a.legend(fontsize=8)
    top = 0.0
    for r in report["scenarios"] + report["dense_reference"]:
        items = sorted((int(k), v) for k, v in r["ratio_by_block_size"].items())
        style = "--" if "dense" in r["model"] else "-"
        first = r["best_block_size"][0]
        b.plot([k for k, _ in items], [v for _, v in items], style, marker="o", ms=3,
               label=f"{r['label']} (tau {first['tau']:g} at bs {r['block_size']} in panel 3)")
        if "alpha" in first:
            speed = [dense.geometric_tau(first["alpha"], k) / v for k, v in items]
            c.plot([k for k, _ in items], speed, style, marker="o", ms=3)
            top = max(top, *speed) if "dense" not in r["model"] else top
    b.set(xlabel="block size", ylabel="t_iter / t_AR", title="iteration cost against block size")
    c.set(xlabel="block size", ylabel="predicted speedup (x)", ylim=(0, 1.15 * top),
          title="speedup, geometric acceptance (dense: off the top)")
    handles, labels = b.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(f"MoE roofline: batch {report['settings']['batch']}, context S = {report['settings']['context']}")
    return fig
