"""Communication model of tensor-parallel DFlash decoding, on paper (no device is measured).

Layout (Megatron tensor parallelism over the ``model`` mesh axis of size p, via shard_map):

  attention   q/k/v split by heads, GQA groups kept together (each device holds Hkv/p KV heads
              and their H/Hkv query heads each; p must divide Hkv), o_proj split by its input;
              one all-reduce (psum) of the [rows, D] output.
  MLP         gate/up split by the intermediate dim F, down_proj by its input; one psum of
              [rows, D].
  embedding   split by vocabulary: each device gathers the rows of its tokens (zeros for the
              others), one psum of [rows, D].
  LM head     split by vocabulary; greedy argmax without gathering logits: each device takes the
              max and its index over its V/p logits, one all-gather of a (float32 max, int32
              index) pair per row per device (8 p bytes per row), the global argmax on every
              device.
  norms       replicated (so is the o_proj / down_proj bias where there is one).
  drafter     its layers split like the target's (2 psums per layer on the block rows); the
              target's embedding and LM head serve it (one psum of the block's embeddings, one
              argmax all-gather for the bs - 1 draft rows); fc and hidden_norm are replicated,
              so projecting the new verified rows into the draft K/V cache needs no
              communication (the taps are replicated after the target's psums; fc runs in full
              on every device, its FLOPs and weight bytes are NOT divided by p).
  data        data parallelism splits the batch rows over a ``data`` axis and adds no
              communication in decoding: a mesh (data = G / p, model = p) on G devices.

Per forward of r rows per sequence at batch b (activations a bytes: 2 for bf16), N layers:

  all-reduces    2 N + 1 (two per layer, one after the embedding), each of b r D a bytes
  all-gathers    1 (the argmax), of 8 b r' p bytes (r' = rows through the LM head)

  AR step        the target on r = 1 row:                       2 N + 2 collectives
  DFlash iter.   drafter on r = bs rows (its n layers, the embedding, argmax on bs - 1 rows)
                 + target verifying r = bs rows:                2 n + 2 N + 4 collectives

Time of one collective on p > 1 devices (ring, bandwidth term on the per-direction link
bandwidth B of one GPU, plus a fixed latency L per collective; p = 1: no collective, 0):

  all-reduce of S bytes    L + 2 (p - 1) / p * S / B
  all-gather to S bytes    L + (p - 1) / p * S / B

  comm        sum over the step's collectives (they are on the critical path: every layer
              waits for its psum; no overlap with compute is assumed)
  compute     the roofline (:mod:`dflash_jax.tools.roofline`) of the sharded forward on one
              device: every sharded matrix, the KV heads, the LM head and the embedding / p,
              norms and fc in full; sum over components of max(bytes / HBM bandwidth,
              FLOPs / peak)
  t           compute + comm;   comm share = comm / t
  speedup     tau * t_AR(p) / t_iter(p)   (DFlash against AR on the same mesh)

L defaults to 8 us (``--latency-us``): H100, 8 GPUs on NVLink, the latency of vLLM's custom
all-reduce kernel for 512 B - 32 KB messages at TP 2/4/8 is 8.5-11.8 us, that of SGLang's
TensorRT-LLM-derived kernel 3.7-7.8 us (sgl-project/sglang PR #2904, "unit test performance
in H100 (without cuda graph)"); XLA's psum goes through NCCL, whose small-message all-reduce
is of this order. The same L is assumed on a B200 (no measured number here): the model's
sensitivity to L is in the report.

Expert parallelism (mixture-of-experts targets, a mesh ``(data, expert = e, model = m)``;
``parallel.rules``): the rows are replicated over ``expert``; each device runs the replicated
router and its E / e local experts (each split over ``model`` by its intermediate dim) on the
rows routed to them, and ONE all-reduce over the e m devices of its ``(expert, model)`` group
sums experts and model shards, in place of the dense MLP's psum over ``model``:

  psum pattern (implemented; decode and verify)   per MoE layer: 1 all-reduce of b r D a bytes
                                                  over g = e m devices, link bytes
                                                  2 (g - 1) / g * b r D a
  all-to-all pattern (not implemented; prefill,   per MoE layer: 2 all-to-alls (dispatch and
  training: rows split over ``expert``)           combine) over e devices, each device sending
                                                  its ceil(b r / e) rows' k copies: link bytes
                                                  2 (e - 1) / e * ceil(b r / e) k D a (uniform
                                                  routing), + a psum of the received rows over
                                                  ``model`` when m > 1

At m = 1 the all-reduce moves e / k times the all-to-all's bytes (1x for Qwen3-Coder's k = 8 on
e = 8, 2x for gpt-oss's k = 4) but is one collective instead of two (the latency term decides at
1..16 rows), needs no capacity limit or token permutation, and works at batch 1, where the
all-to-all has one row to split over e devices. The all-to-all pays off where the rows are
many and the attention should not run e times (prefill, training): :func:`expert_parallel`
counts both (the ``--moe-models`` table).

Memory per device (the mesh must fit): weights (sharded parts / p, replicated parts in full,
the drafter included) + K/V of the target's and the drafter's layers for b sequences of
``--budget-context`` positions (Hkv / p heads each), against ``--memory-fraction`` of the HBM
(0.9: the default of vLLM's gpu_memory_utilization; the rest is left to activations and
workspace).

Device numbers: HBM bandwidth and dense bf16 FLOPs are the roofline's datasheet profiles
(``roofline.DEVICES``, sources there); memory and NVLink are in :data:`NODES` below, with
their sources.

    python -m dflash_jax.tools.parallel_comm              # writes results/parallel/comm.{json,md}
    python -m dflash_jax.tools.parallel_comm --latency-us 4 --out runs/parallel_comm
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Sequence

from dflash_jax.tools import roofline
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax import targets
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.files import write_json, write_text
from dflash_jax.reporting import command_line, environment
import math

ARGMAX_PAIR_BYTES = 8  # float32 max + int32 index, per row per device
TP_SIZES = (1, 2, 4, 8)
BATCHES = (1, 8, 32)
LATENCY_US = 8.0
SENSITIVITY_LATENCY_US = (2.0, 4.0, 8.0, 16.0)
MEMORY_FRACTION = 0.9
LLAMA3_RESERVED_TOKEN = 128002  # <|reserved_special_token_0|>: a mask id for the cost model only

MODELS = {
    # Qwen3-8B: the roofline's shapes (decode_speed.PRESETS["qwen3-8b"]), the paper's pair
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                     head_dim=128, max_position_embeddings=40960),
    # Llama-3.3-70B-Instruct's config.json shapes (the same as Llama-3.1-70B)
    "llama-3.3-70b": dict(model_type="llama", vocab_size=128256, hidden_size=8192,
                          intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8,
                          head_dim=128, max_position_embeddings=131072),
}
MASK_TOKEN_IDS = {"qwen3-8b": roofline.QWEN3_MASK_TOKEN_ID, "llama-3.3-70b": LLAMA3_RESERVED_TOKEN}


# ---------------------------------------------------------------------------- devices
@dataclasses.dataclass(frozen=True)
class Node:
    """What tensor parallelism adds to a roofline ``Device``: HBM ``memory`` in bytes and the
    NVLink ``link_bandwidth`` of one GPU in bytes/s in EACH direction (half the bidirectional
    figure of the datasheets); ``source`` says where they come from."""

    memory: float
    link_bandwidth: float
    source: str


NODES = {
    "h100": Node(80e9, 450e9,
                 "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: 80 GB GPU memory; "
                 "NVIDIA NVLink 900 GB/s (4th generation, bidirectional: 450 GB/s each way)"),
    "h200": Node(141e9, 450e9,
                 "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: 141 GB GPU memory; "
                 "NVIDIA NVLink 900 GB/s (bidirectional: 450 GB/s each way)"),
    "b200": Node(180e9, 900e9,
                 "NVIDIA DGX B200 datasheet: 1,440 GB GPU memory for 8 GPUs = 180 GB each; "
                 "5th-generation NVLink 1.8 TB/s per GPU (14.4 TB/s for 8; bidirectional: "
                 "900 GB/s each way)"),
}
"""Memory and NVLink of the datasheet profiles of ``roofline.DEVICES`` (same keys)."""


# ---------------------------------------------------------------------------- sharding
def check_tp(cfg, p: int) -> None:
    """Refuses a model-axis size that does not split ``cfg`` (a TargetConfig or DrafterConfig)
    by whole KV heads (GQA groups kept together) and whole MLP columns."""
    if p < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {p}")
    if cfg.num_kv_heads % p:
        raise ValueError(f"tensor parallel size {p} must divide num_key_value_heads "
                         f"({cfg.num_kv_heads}): heads are split by whole GQA groups")
    if cfg.intermediate_size % p:
        raise ValueError(f"tensor parallel size {p} must divide intermediate_size "
                         f"({cfg.intermediate_size})")


def shard(cfg, p: int):
    """The part of ``cfg`` one of p devices holds, as a config of the same class: H / p and
    Hkv / p heads, F / p MLP columns, ceil(V / p) vocabulary rows (the last shard padded);
    D, Dh, the layers (and a drafter's taps) unchanged. The roofline of this config is the
    per-device roofline of the sharded model (its norms, fc and hidden_norm stay whole)."""
    check_tp(cfg, p)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // p,
                               num_kv_heads=cfg.num_kv_heads // p,
                               intermediate_size=cfg.intermediate_size // p,
                               vocab_size=-(-cfg.vocab_size // p))


# ---------------------------------------------------------------------------- collectives
@dataclasses.dataclass(frozen=True)
class Collective:
    """``count`` collectives of one ``kind`` ("all-reduce" or "all-gather"), each with a
    result buffer of ``payload`` bytes on every device."""

    name: str
    kind: str
    count: int
    payload: float

    def link_bytes(self, p: int) -> float:
        """Bytes one device sends (and receives) for one of them, ring algorithm."""
        factor = 2 * (p - 1) / p if self.kind == "all-reduce" else (p - 1) / p
        return factor * self.payload

    def seconds(self, p: int, link_bandwidth: float, latency: float) -> float:
        """All ``count`` of them, one after the other: count * (L + link bytes / B)."""
        if p == 1:
            return 0.0
        return self.count * (latency + self.link_bytes(p) / link_bandwidth)


def forward_collectives(prefix: str, layers: int, D: int, rows: int, logit_rows: int, p: int,
                        batch: int = 1, act_bytes: int = 2) -> list[Collective]:
    """The collectives of one tensor-parallel forward of ``layers`` layers on ``rows`` rows
    per sequence (``logit_rows`` through the LM head and its argmax): none when p = 1."""
    if p == 1:
        return []
    act = batch * rows * D * act_bytes
    return [Collective(f"{prefix} embedding psum", "all-reduce", 1, act),
            Collective(f"{prefix} layer psums", "all-reduce", 2 * layers, act),
            Collective(f"{prefix} argmax all-gather", "all-gather", 1,
                       batch * logit_rows * p * ARGMAX_PAIR_BYTES)]


def ar_step_collectives(target: TargetConfig, p: int, batch: int = 1,
                        act_bytes: int = 2) -> list[Collective]:
    """One AR step: the target on 1 row."""
    return forward_collectives("target", target.num_layers, target.hidden_size, 1, 1, p,
                               batch, act_bytes)


def iteration_collectives(target: TargetConfig, drafter: DrafterConfig, block_size: int, p: int,
                          batch: int = 1, act_bytes: int = 2) -> list[Collective]:
    """One DFlash iteration: the drafter on the block (argmax on its bs - 1 draft rows; the
    context rows' K/V projection needs none), then the target verifying the bs rows."""
    return (forward_collectives("drafter", drafter.num_layers, drafter.hidden_size, block_size,
                                block_size - 1, p, batch, act_bytes)
            + forward_collectives("target", target.num_layers, target.hidden_size, block_size,
                                  block_size, p, batch, act_bytes))


def comm_totals(collectives: Sequence[Collective], p: int, link_bandwidth: float,
                latency: float) -> dict:
    """Counts, payload and link bytes, and seconds of a step's collectives."""
    by_kind = lambda kind: [c for c in collectives if c.kind == kind]
    return {
        "collectives": sum(c.count for c in collectives),
        "allreduces": sum(c.count for c in by_kind("all-reduce")),
        "allreduce_bytes": sum(c.count * c.payload for c in by_kind("all-reduce")),
        "allgather_bytes": sum(c.count * c.payload for c in by_kind("all-gather")),
        "link_bytes": sum(c.count * c.link_bytes(p) for c in collectives) if p > 1 else 0.0,
        "seconds": sum(c.seconds(p, link_bandwidth, latency) for c in collectives),
    }


# ---------------------------------------------------------------------------- expert parallelism
@dataclasses.dataclass(frozen=True)
class MoeShape:
    """What expert parallelism's communication depends on in an MoE target: hidden size D,
    decoder layers, how many of them are MoE layers, E routed experts of which k per token."""

    hidden_size: int
    num_layers: int
    moe_layers: int
    num_experts: int
    experts_per_token: int


MOE_MODELS = {
    # Qwen3-Coder-30B-A3B-Instruct's config.json: hidden 2048, 48 layers all sparse
    # (decoder_sparse_step 1, no mlp_only_layers), num_experts 128, num_experts_per_tok 8
    "qwen3-coder-30b-a3b": MoeShape(2048, 48, 48, 128, 8),
    # gpt-oss-120b's config.json: hidden 2880, 36 layers all MoE, num_local_experts 128,
    # experts_per_token 4
    "gpt-oss-120b": MoeShape(2880, 36, 36, 128, 4),
}
EP_MESHES = ((8, 1), (4, 2), (2, 4))
"""(expert, model) sizes of the 8-device EP table."""
EP_ROWS = (1, 16, 2048)
"""Rows per sequence of the EP table: an AR step, a block-16 verify, a 2048-token prefill."""


def check_ep(shape: MoeShape, expert: int) -> None:
    """Refuses an expert-axis size that does not divide the routed experts."""
    if expert < 1 or shape.num_experts % expert:
        raise ValueError(f"expert parallel size {expert} must divide num_experts "
                         f"({shape.num_experts})")


def moe_psum_collectives(shape: MoeShape, rows: int, expert: int, model: int, batch: int = 1,
                         act_bytes: int = 2) -> list[Collective]:
    """The implemented pattern: one all-reduce of the [b r, D] MoE output per MoE layer over
    the ``expert x model`` group (none on one device). Ring link bytes: use group size
    ``expert * model``."""
    check_ep(shape, expert)
    if expert * model == 1:
        return []
    return [Collective("MoE layer psum over (expert, model)", "all-reduce", shape.moe_layers,
                       batch * rows * shape.hidden_size * act_bytes)]


def moe_all_to_all_collectives(shape: MoeShape, rows: int, expert: int, batch: int = 1,
                               act_bytes: int = 2) -> list[Collective]:
    """The alternative for many rows: rows split over ``expert`` (ceil(b r / e) per device),
    each row's k expert inputs sent to their experts' devices and the k outputs sent back:
    two all-to-alls per MoE layer, each a send buffer of ceil(b r / e) k D a bytes per
    device, of which (e - 1) / e leaves it under uniform routing. Group size ``expert``."""
    check_ep(shape, expert)
    if expert == 1:
        return []
    per_device = math.ceil(batch * rows / expert) * shape.experts_per_token
    return [Collective("MoE dispatch + combine all-to-alls", "all-to-all", 2 * shape.moe_layers,
                       per_device * shape.hidden_size * act_bytes)]


def expert_parallel(shape: MoeShape, rows: int, expert: int, model: int, batch: int = 1,
                    act_bytes: int = 2, link_bandwidth: float = NODES["b200"].link_bandwidth,
                    latency: float = LATENCY_US * 1e-6) -> dict:
    """Both patterns' collectives of the MoE layers of one forward over ``rows`` rows per
    sequence on an ``expert x model`` group: per layer and per forward, payload and ring link
    bytes per device, and their time (count x (L + link bytes / B)). The attention's own
    psums over ``model`` (as for a dense target) are not included."""
    g = expert * model
    psum = moe_psum_collectives(shape, rows, expert, model, batch, act_bytes)
    a2a = moe_all_to_all_collectives(shape, rows, expert, batch, act_bytes)
    out = {"expert": expert, "model": model, "rows": rows, "batch": batch}
    for name, colls, group in (("psum", psum, g), ("all_to_all", a2a, expert)):
        count = sum(c.count for c in colls)
        link = sum(c.count * c.link_bytes(group) for c in colls) if colls else 0.0
        out[name] = {"collectives": count, "group": group,
                     "payload_bytes": sum(c.count * c.payload for c in colls),
                     "link_bytes": link,
                     "link_bytes_per_layer": link / shape.moe_layers,
                     "us": 1e6 * sum(c.seconds(group, link_bandwidth, latency) for c in colls)}
    if model > 1 and a2a:  # the experts' partial sums over model, on the received rows
        recv = batch * rows * shape.experts_per_token / expert
        extra = Collective("received rows psum over model", "all-reduce", shape.moe_layers,
                           recv * shape.hidden_size * act_bytes)
        out["all_to_all"]["collectives"] += extra.count
        out["all_to_all"]["link_bytes"] += extra.count * extra.link_bytes(model)
        out["all_to_all"]["link_bytes_per_layer"] = out["all_to_all"]["link_bytes"] / shape.moe_layers
        out["all_to_all"]["us"] += 1e6 * extra.seconds(model, link_bandwidth, latency)
    return out


def expert_parallel_rows(models: Sequence[str], meshes=EP_MESHES, rows=EP_ROWS,
                         act_bytes: int = 2, latency: float = LATENCY_US * 1e-6,
                         device: str = "b200") -> list[dict]:
    """:func:`expert_parallel` for every MoE model, (expert, model) mesh and row count."""
    return [expert_parallel(MOE_MODELS[name], r, e, m, 1, act_bytes, NODES[device].link_bandwidth,
                            latency) | {"model_name": name, "device": device}
            for name in models for e, m in meshes for r in rows]


def expert_parallel_markdown(rows: Sequence[dict]) -> list[str]:
    """The EP table of the report."""
    if not rows:
        return []
    dev = roofline.DEVICES[rows[0]["device"]].name.replace(" (datasheet)", "")
    lines = ["", f"### Expert parallelism: the MoE layers' collectives per forward ({dev} NVLink, batch 1)",
             "", "Implemented: rows replicated over `expert`, one all-reduce of [rows, D] per MoE "
             "layer over the expert x model group. Alternative (not implemented): rows split over "
             "`expert`, dispatch + combine all-to-alls. Link bytes: what one device sends (ring "
             "all-reduce 2 (g-1)/g of the payload, all-to-all (e-1)/e).", "",
             "| model | expert x model | rows | psum: collectives | link KB per layer | us | "
             "all-to-all: collectives | link KB per layer | us |", "|" + "---|" * 9]
    for r in rows:
        p, a = r["psum"], r["all_to_all"]
        lines.append(f"| {r['model_name']} | {r['expert']} x {r['model']} | {r['rows']} | "
                     f"{p['collectives']} | {p['link_bytes_per_layer'] / 1e3:.2f} | {p['us']:.0f} | "
                     f"{a['collectives']} | {a['link_bytes_per_layer'] / 1e3:.2f} | {a['us']:.0f} |")
    return lines


# ---------------------------------------------------------------------------- memory
def target_weight_params(target: TargetConfig) -> int:
    """Parameters of a (sharded) target config (the family's size model): its layers, the
    embedding table, the LM head (not when tied), the final norm."""
    return targets.family_of(target).num_params(target)


def memory_per_device(target: TargetConfig, drafter: DrafterConfig, p: int, batch: int,
                      context: int, weight_bytes: int = 2, kv_bytes: int = 2) -> dict:
    """Bytes one of p devices holds: the pair's weights and the K/V of ``batch`` sequences of
    ``context`` positions in the target's and the drafter's layers."""
    ts, ds = shard(target, p), shard(drafter, p)
    weights = (target_weight_params(ts) + roofline._drafter_params(ds)) * weight_bytes
    kv = (targets.family_of(ts).state_bytes_per_token(ts, kv_bytes)
          + 2 * ds.num_layers * ds.num_kv_heads * ds.head_dim * kv_bytes) * batch * context
    return {"weights": weights, "kv": kv, "total": weights + kv}


# ---------------------------------------------------------------------------- one mesh
def analyse_mesh(target: TargetConfig, drafter: DrafterConfig, device: str, p: int, batch: int,
                 *, block_size: int, context: int, budget_context: int, latency: float,
                 tau: float, memory_fraction: float = MEMORY_FRACTION,
                 dtype_bytes: int = 2) -> dict:
    """AR step and DFlash iteration of the pair on a model axis of p ``device`` GPUs at batch
    ``batch``: collectives, their time, the roofline time of the sharded forward, the comm
    share, the speedup at ``tau``, and the memory per device against the budget."""
    dev, node = roofline.DEVICES[device], NODES[device]
    ts, ds = shard(target, p), shard(drafter, p)
    kw = dict(batch=batch, weight_bytes=dtype_bytes, kv_bytes=dtype_bytes)
    out = {"device": device, "tp": p, "batch": batch}
    steps = {
        "ar_step": (roofline.ar_step(ts, context, **kw),
                    ar_step_collectives(target, p, batch, dtype_bytes)),
        "iteration": (roofline.dflash_iteration(ts, ds, block_size, context, **kw),
                      iteration_collectives(target, drafter, block_size, p, batch, dtype_bytes)),
    }
    for name, (costs, colls) in steps.items():
        comm = comm_totals(colls, p, node.link_bandwidth, latency)
        compute = roofline.seconds(costs, dev)
        t = compute + comm["seconds"]
        out[name] = {**{k: v for k, v in comm.items() if k != "seconds"},
                     "hbm_bytes": roofline.total(costs, "bytes"),
                     "compute_us": 1e6 * compute, "comm_us": 1e6 * comm["seconds"],
                     "total_us": 1e6 * t, "comm_share": comm["seconds"] / t}
    t_ar, t_iter = out["ar_step"]["total_us"], out["iteration"]["total_us"]
    mem = memory_per_device(target, drafter, p, batch, budget_context, dtype_bytes, dtype_bytes)
    budget = memory_fraction * node.memory
    out |= {"speedup": roofline.predicted_speedup(tau, t_ar, t_iter),
            "speedup_without_comm": roofline.predicted_speedup(
                tau, out["ar_step"]["compute_us"], out["iteration"]["compute_us"]),
            "ar_tokens_per_s": batch * 1e6 / t_ar,
            "dflash_tokens_per_s": batch * tau * 1e6 / t_iter,
            "dflash_tokens_per_s_per_gpu": batch * tau * 1e6 / t_iter / p,
            "memory": mem | {"budget": budget}, "fits": mem["total"] <= budget}
    return out


def recommend(rows: Sequence[dict], near: float = 1.10, efficiency: float = 0.5) -> dict:
    """For one model, device and batch (``rows``: one per TP size), among the TP sizes that fit:

    * ``min_tp``: the smallest (the throughput choice: every further GPU goes to the data axis,
      which adds no communication; tokens/s per GPU is highest there);
    * ``fastest_tp``: the lowest t_iter;
    * ``latency_tp``: the smallest whose t_iter is within ``near`` (10 %) of the fastest;
    * ``balanced_tp``: the largest whose per-GPU efficiency, (t_iter p) at min_tp over
      (t_iter p), is at least ``efficiency`` (half of each added GPU still buys speed).
    """
    fit = sorted((r for r in rows if r["fits"]), key=lambda r: r["tp"])
    if not fit:
        return {"min_tp": None, "fastest_tp": None, "latency_tp": None, "balanced_tp": None}
    t = {r["tp"]: r["iteration"]["total_us"] for r in fit}
    share = {r["tp"]: r["iteration"]["comm_share"] for r in fit}
    p0 = fit[0]["tp"]
    eff = {p: t[p0] * p0 / (t[p] * p) for p in t}
    fastest = min(t, key=t.get)
    latency = next(p for p in t if t[p] <= near * t[fastest])
    balanced = max(p for p in t if eff[p] >= efficiency)
    return {"min_tp": p0, "fastest_tp": fastest, "latency_tp": latency, "balanced_tp": balanced,
            "iteration_us": {str(p): v for p, v in t.items()},
            "gain_over_min_tp": {str(p): t[p0] / v for p, v in t.items()},
            "efficiency": {str(p): v for p, v in eff.items()},
            "comm_share": {str(p): v for p, v in share.items()}}


def pair(name: str, block_size: int = 16, drafter_layers: int = 5):
    """(target, drafter) of a model of :data:`MODELS` with a drafter of its width."""
    target = TargetConfig(**MODELS[name])
    drafter = DrafterConfig.for_target(target, drafter_layers, block_size=block_size,
                                       mask_token_id=MASK_TOKEN_IDS[name])
    return target, drafter


def analyse(models: Sequence[str], devices: Sequence[str], tps: Sequence[int],
            batches: Sequence[int], *, block_size: int, drafter_layers: int, context: int,
            budget_context: int, latency: float, tau: float, memory_fraction: float,
            sensitivity_latencies: Sequence[float] = SENSITIVITY_LATENCY_US,
            dtype_bytes: int = 2) -> dict:
    """Every (model, device, TP, batch), the recommendation per (model, device, batch) and the
    sensitivity of the batch-1 comm share to the latency L (on the paper's H200 when among
    ``devices``, else the first)."""
    kw = dict(block_size=block_size, context=context, budget_context=budget_context, tau=tau,
              memory_fraction=memory_fraction, dtype_bytes=dtype_bytes)
    out = {"models": {}, "rows": [], "recommendations": [], "sensitivity": []}
    for name in models:
        target, drafter = pair(name, block_size, drafter_layers)
        out["models"][name] = {
            "target": target.to_hf_dict(), "drafter_layers": drafter.num_layers,
            "taps": list(drafter.target_layer_ids), "target_params": target_weight_params(target),
            "drafter_params": roofline._drafter_params(drafter)}
        for device in devices:
            for batch in batches:
                rows = [analyse_mesh(target, drafter, device, p, batch, latency=latency, **kw)
                        | {"model": name} for p in tps]
                out["rows"] += rows
                out["recommendations"].append({"model": name, "device": device, "batch": batch}
                                              | recommend(rows))
        sens_device = roofline.PAPER["device"] if roofline.PAPER["device"] in devices else devices[0]
        for p in tps:
            if p == 1:
                continue
            cells = {f"{us:g}": analyse_mesh(target, drafter, sens_device, p, 1,
                                             latency=us * 1e-6, **kw) for us in sensitivity_latencies}
            out["sensitivity"].append({
                "model": name, "device": sens_device, "tp": p, "batch": 1,
                "iteration_comm_share": {k: c["iteration"]["comm_share"] for k, c in cells.items()},
                "ar_comm_share": {k: c["ar_step"]["comm_share"] for k, c in cells.items()},
                "speedup": {k: c["speedup"] for k, c in cells.items()},
                "iteration_us": {k: c["iteration"]["total_us"] for k, c in cells.items()}})
    return out


# ---------------------------------------------------------------------------- the report
def _kb(x: float) -> str:
    return f"{x / 1e3:.1f}" if x < 1e6 else f"{x / 1e3:,.0f}"


def markdown(report: dict) -> str:
    """The report's tables: one per batch (every model, device and TP), the recommendations,
    the sensitivity to the latency L."""
    s = report["settings"]
    a = report["analysis"]
    names = {k: roofline.DEVICES[k].name.replace(" (datasheet)", "") for k in s["devices"]}
    lines = [f"`{report['command']}`", "",
             "Computed on paper from the model shapes (no GPU measured). "
             f"Block {s['block_size']}, {s['drafter_layers']}-layer drafters of the target's "
             f"width, context S = {s['context']} for the time, {s['dtype']}, all-reduce latency "
             f"L = {s['latency_us']:g} us, ring all-reduce on NVLink, tau {s['tau']:g}; memory: "
             f"weights + K/V of batch x {s['budget_context']} positions <= "
             f"{s['memory_fraction']:g} x HBM.", ""]
    for batch in s["batches"]:
        lines += [f"### Batch {batch}", "",
                  "| model | device | TP | GB/GPU | fits | AR step: all-reduced KB | "
                  "collectives | comm us | t_AR us | comm share | DFlash iteration: "
                  "all-reduced KB | collectives | comm us | t_iter us | comm share | "
                  f"speedup at tau {s['tau']:g} | DFlash tok/s | tok/s per GPU |",
                  "|" + "---|" * 18]
        for r in a["rows"]:
            if r["batch"] != batch:
                continue
            ar, it = r["ar_step"], r["iteration"]
            lines.append(
                f"| {r['model']} | {names[r['device']]} | {r['tp']} | "
                f"{r['memory']['total'] / 1e9:.1f} | {'yes' if r['fits'] else 'no'} | "
                f"{_kb(ar['allreduce_bytes'])} | {ar['collectives']} | {ar['comm_us']:.0f} | "
                f"{ar['total_us']:.0f} | {100 * ar['comm_share']:.0f} % | "
                f"{_kb(it['allreduce_bytes'])} | {it['collectives']} | {it['comm_us']:.0f} | "
                f"{it['total_us']:.0f} | {100 * it['comm_share']:.0f} % | {r['speedup']:.2f}x | "
                f"{r['dflash_tokens_per_s']:,.0f} | {r['dflash_tokens_per_s_per_gpu']:,.0f} |")
        lines.append("")
    lines += ["### Recommended model-axis size", "",
              "Among the TP sizes that fit: min TP, the smallest (the throughput choice: further "
              "GPUs go to the data axis); latency TP, the smallest whose DFlash iteration is within "
              "10 % of the fastest; balanced TP, the largest whose per-GPU efficiency (t_iter x TP "
              "at min TP over t_iter x TP) is >= 50 %. Per TP: t_iter in us (gain over min TP, "
              "per-GPU efficiency, comm share).", "",
              "| model | device | batch | min TP | latency TP | balanced TP | "
              + " | ".join(f"TP {p}" for p in s["tp"]) + " |",
              "|" + "---|" * (6 + len(s["tp"]))]
    for r in a["recommendations"]:
        head = f"| {r['model']} | {names[r['device']]} | {r['batch']} | "
        if r["min_tp"] is None:
            lines.append(head + "does not fit | - | - | " + " | ".join("-" for _ in s["tp"]) + " |")
            continue
        cells = []
        for p in map(str, s["tp"]):
            if p not in r["iteration_us"]:
                cells.append("does not fit")
                continue
            cells.append(f"{r['iteration_us'][p]:.0f} ({r['gain_over_min_tp'][p]:.2f}x, "
                         f"{100 * r['efficiency'][p]:.0f} %, {100 * r['comm_share'][p]:.0f} %)")
        lines.append(head + f"{r['min_tp']} | {r['latency_tp']} | {r['balanced_tp']} | "
                     + " | ".join(cells) + " |")
    if a["sensitivity"]:
        lats = list(a["sensitivity"][0]["iteration_comm_share"])
        dev = names[a["sensitivity"][0]["device"]]
        lines += ["", f"### Sensitivity to the latency L ({dev}, batch 1)", "",
                  "| model | TP | " + " | ".join(f"L = {x} us: iteration comm share, speedup"
                                                  for x in lats) + " |",
                  "|" + "---|" * (2 + len(lats))]
        for r in a["sensitivity"]:
            lines.append(f"| {r['model']} | {r['tp']} | " + " | ".join(
                f"{100 * r['iteration_comm_share'][x]:.0f} %, {r['speedup'][x]:.2f}x"
                for x in lats) + " |")
    lines += expert_parallel_markdown(a.get("expert_parallel", []))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line
def add_arguments(p) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                   help="target shapes to model, each with a drafter shaped for it")
    p.add_argument("--devices", nargs="+", default=list(NODES), choices=list(NODES),
                   help="datasheet profiles (roofline.DEVICES for HBM and FLOPs, NODES for "
                   "memory and NVLink)")
    p.add_argument("--tp", type=int, nargs="+", default=list(TP_SIZES),
                   help="model-axis sizes (must divide num_key_value_heads)")
    p.add_argument("--batch", type=int, nargs="+", default=list(BATCHES),
                   help="batch sizes (sequences decoded together)")
    p.add_argument("--block-size", type=int, default=16, help="DFlash block size")
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the drafter")
    p.add_argument("--context", type=int, default=1024, help="cached positions S for the time")
    p.add_argument("--budget-context", type=int, default=8192,
                   help="positions per sequence whose K/V must fit in memory")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(roofline.DTYPE_BYTES),
                   help="compute dtype: bytes of the weights, the KV cache and the all-reduced activations")
    p.add_argument("--latency-us", type=float, default=LATENCY_US,
                   help="fixed latency of one collective on NVLink, microseconds")
    p.add_argument("--tau", type=float, default=roofline.PAPER["tau"],
                   help="acceptance length of the speedup (default: the paper's, Qwen3-8B)")
    p.add_argument("--memory-fraction", type=float, default=MEMORY_FRACTION,
                   help="share of HBM for weights + KV cache")
    p.add_argument("--moe-models", nargs="*", default=list(MOE_MODELS), choices=list(MOE_MODELS),
                   help="MoE shapes of the expert-parallelism table (8 devices: expert x model "
                   "= 8x1, 4x2, 2x4; rows 1, 16, 2048); none: no table")
    p.add_argument("--out", default="results/parallel",
                   help="output directory (comm.json and comm.md)")


def check_args(args) -> None:
    """Refuses settings the model cannot describe, naming the option."""
    for name in ("context", "budget_context", "drafter_layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.batch):
        raise ValueError(f"--batch values must be >= 1: {args.batch}")
    if args.block_size < 2:
        raise ValueError(f"--block-size must be >= 2, got {args.block_size}")
    if args.latency_us < 0:
        raise ValueError(f"--latency-us must be >= 0, got {args.latency_us}")
    if args.tau < 1 or args.tau > args.block_size:
        raise ValueError(f"--tau must lie between 1 and the block size {args.block_size}, "
                         f"got {args.tau}")
    if not 0 < args.memory_fraction <= 1:
        raise ValueError(f"--memory-fraction must lie in (0, 1], got {args.memory_fraction}")
    for name in args.models:
        for p in args.tp:
            try:
                check_tp(TargetConfig(**MODELS[name]), p)
            except ValueError as e:
                raise ValueError(f"--tp {p} for {name}: {e}") from None


def run(args) -> dict:
    check_args(args)
    args.tp, args.batch = sorted(set(args.tp)), sorted(set(args.batch))
    inv = invocation(args)
    report = {
        "benchmark": "parallel_comm",
        "computed_on_paper": True,
        "command": command_line("dflash_jax.tools.parallel_comm", inv[1:] if inv else None).rstrip(),
        "settings": {"models": args.models, "devices": args.devices, "tp": args.tp,
                     "batches": args.batch, "block_size": args.block_size,
                     "drafter_layers": args.drafter_layers, "context": args.context,
                     "budget_context": args.budget_context, "dtype": args.dtype,
                     "latency_us": args.latency_us, "tau": args.tau,
                     "memory_fraction": args.memory_fraction},
        "latency_source": "sgl-project/sglang PR #2904: H100, without CUDA graph, 512 B - 32 KB "
                          "at TP 2/4/8: vLLM custom all-reduce 8.5-11.8 us, SGLang 3.7-7.8 us",
        "device_profiles": {k: dataclasses.asdict(roofline.DEVICES[k])
                            | {"node": dataclasses.asdict(NODES[k])} for k in args.devices},
        "paper": roofline.PAPER,
        "analysis": analyse(args.models, args.devices, args.tp, args.batch,
                            block_size=args.block_size, drafter_layers=args.drafter_layers,
                            context=args.context, budget_context=args.budget_context,
                            latency=args.latency_us * 1e-6, tau=args.tau,
                            memory_fraction=args.memory_fraction,
                            dtype_bytes=roofline.DTYPE_BYTES[args.dtype])
                    | {"expert_parallel": expert_parallel_rows(
                        getattr(args, "moe_models", list(MOE_MODELS)),
                        act_bytes=roofline.DTYPE_BYTES[args.dtype],
                        latency=args.latency_us * 1e-6)},
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "comm")
    write_json(path + ".json", report)
    table = markdown(report)
    write_text(path + ".md", table)
    print(table)
    print(f"wrote {path}.json and {path}.md", file=sys.stderr)
    return report


def main(argv=None) -> dict:
    return command_main("parallel-comm", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
