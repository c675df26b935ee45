"""Peak device memory of one drafter training step: the dense block-sparse attention against the
chunked one (``nn.attention.chunked_block_sparse_attention``), measured at small scale and
computed at the paper's recipe on 8-device meshes.

(a) Measured (any machine, compile only, nothing runs): XLA's buffer assignment of the jitted
    programs, ``compile().memory_analysis().temp_size_in_bytes`` (temporaries: neither the
    arguments nor the outputs), for

    * one layer's training attention, forward + backward (gradients w.r.t. q, k_ctx, v_ctx,
      k_blk, v_blk), dense vs chunked, at a few (anchors, length) up to the paper's 512 and 3072,
      with 4 query heads on 1 KV head (Dh 128: an eighth of Qwen3-8B's drafter) and with all its
      32 heads on 8;
    * the whole drafter loss and its gradient (``methods.dflash.loss.drafter_loss``, as the trainer's
      step computes it: float32 master weights cast to bfloat16) for a small drafter, dense vs
      chunked, next to the formulas below evaluated at the same shapes (a check of the model).

(b) Computed for the paper's recipe: Qwen3-8B (D 4096, H 32, Hkv 8, Dh 128, MLP 12288, vocab
    151936, 36 layers), a 5-layer drafter reading 5 taps, 512 anchors of block 16 per sequence,
    length 3072, ``--batch`` sequences per step, bfloat16 compute, on meshes (data, model) with
    data * model = 8, in this project's training layout (``training.sharding``): the batch
    split over ``data``; the frozen target split by heads / MLP width / vocabulary over
    ``model`` (``parallel.rules``, Megatron; norms replicated); the drafter NOT split over
    ``model`` (every device of a model group computes the whole drafter on its data shard's
    sequences), its float32 master weights and Adam state replicated or split over ``data``
    (FSDP). ``--drafter-tp`` computes the alternative of a drafter split over ``model`` like the
    target (its ``fc`` and norms replicated), as the sharded decoding engine splits it.

Formulas, per device. b = batch / data sequences, m = model, d = data, m_d = 1 (m with
--drafter-tp); R = anchors * bs block rows and S context positions per sequence; c = 2 bytes
(bfloat16); P_t / P_d the target / drafter parameters, split into matrices M (heads, MLP,
vocabulary) and vectors (norms; and the drafter's ``fc``), which are replicated; L_d drafter
layers, k taps, I the MLP width, V the vocabulary; the drafter's heads are the target's.

  target_weights       c * (M_t / m + vectors_t)
  drafter_state        per parameter of the local shard (M_d / m_d + fc + vectors_d, / d with
                       FSDP): float32 master 4 + Adam moments 8 + bfloat16 compute copy 2 +
                       bfloat16 gradient 2 + float32 gradient 4 = 20 bytes; FSDP adds the
                       all-gathered compute copy of two layers 2 * c * M_d / (L_d m_d) (one in
                       use, one prefetched)
  taps                 k * b * S * D * c (the target's features; live until the loss is done)
  target_activations   the frozen target's forward, no gradient, one layer live at a time:
                       b * S * (3 D + (H + 2 Hkv) Dh / m + 3 I / m) * c, plus its dense causal
                       attention's scores and probabilities 2 * 4 * b * (H / m) * S^2
  drafter_activations  what the backward keeps (no layer remat), per layer
                       b * c * (R * (4 D + (3 H Dh + 3 Hkv Dh + 3 I) / m_d) + 3 S Hkv Dh / m_d),
                       plus b * c * (3 R D + 2 S D) once (embeddings, final norm, context rows)
  attention  dense     b * (H / m_d) * R * S score elements per layer, A of them:
                       A * (16 L_d + 10) bytes (XLA keeps about four float32 score-shaped arrays
                       per layer for the backward and needs about ten more bytes per element in
                       the layer being differentiated; constants fitted to XLA's CPU buffer
                       assignment of 1, 2 and 4 stacked layers at the paper's shape, bfloat16)
             chunked   one anchor chunk x context chunk at a time: 24 * b * (H / m_d)
                       * (ac * bs) * cc (the dense per-layer transient on a chunk pair), plus the
                       running output of every context chunk of one anchor chunk
                       2 * 4 * ceil(S / cc) * b * (H / m_d) * ac * bs * (Dh + 2), plus per layer
                       the chunked copies of q, k_blk, v_blk and the float32 output
                       b * R * ((H + 2 Hkv) Dh c + 4 H Dh) / m_d
  logits               9 * b * R * V / m: the LM head's float32 logits (the target's LM head,
                       vocabulary split over model), their gradient, and a bfloat16 copy (9
                       bytes per logit: XLA's CPU buffer assignment of the LM head +
                       cross-entropy gradient)

The step's peak is the largest of its phases:

  features  target_weights + drafter_state + taps + target_activations
  drafter   target_weights + drafter_state + taps + drafter_activations + attention + logits
  update    target_weights + (12 in + 12 out + 4 gradient) bytes per local drafter parameter
            (the trainer's step does not donate its state: old and new state live together)

Not modelled: XLA's workspace and fragmentation, collectives' buffers, the data loader; GPU
buffer assignment fuses more than the CPU's, so the dense attention's constants are upper-ish.

    python -m dflash_jax.tools.train_memory                        # writes results/parallel/
    python -m dflash_jax.tools.train_memory --batch 8 32 --skip-measure
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Sequence

from dflash_jax.cli import command_main, invocation, run_cli, status
from dflash_jax import targets
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.files import write_json, write_text
from dflash_jax.nn.attention import (DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK,
                                     block_sparse_attention, check_chunk,
                                     chunked_block_sparse_attention)
from dflash_jax.bench.decode_speed import PRESETS
from dflash_jax.tools.roofline import QWEN3_MASK_TOKEN_ID
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.targets import init_target_params
from dflash_jax.training.blocks import block_loss_weights
from dflash_jax.methods.dflash.loss import drafter_loss
from dflash_jax.reporting import command_line, environment

MESHES = ((1, 8), (2, 4), (4, 2), (8, 1))
"""(data, model) meshes of 8 devices."""
RECIPE = {"num_anchors": 512, "block_size": 16, "seq_len": 3072, "drafter_layers": 5, "taps": 5,
          "target": "qwen3-8b", "source": "docs/method.md section 5 (paper section 4.2, appendix A.1)"}
DEVICE_MEMORY_GB = {"H100 80GB": 80.0, "H200 141GB": 141.0}
"""Nominal HBM of the devices the table is read against (GB = 1e9 bytes)."""
COMPUTE_BYTES = 2  # bfloat16
STATE_BYTES = 20  # master 4 + Adam 8 + compute copy 2 + bf16 gradient 2 + fp32 gradient 4
UPDATE_BYTES = 28  # old state 12 + new state 12 + fp32 gradient 4 (no donation)
DENSE_SAVED, DENSE_TRANSIENT = 16, 10  # bytes per score element (see the module doc)
CHUNK_TRANSIENT = 24
LOGIT_BYTES = 9
GB = 1e9


# ---------------------------------------------------------------------------- shapes
def qwen3_8b() -> TargetConfig:

    return TargetConfig(**PRESETS["qwen3-8b"])


def paper_drafter(target: TargetConfig) -> DrafterConfig:

    return DrafterConfig.for_target(target, RECIPE["drafter_layers"], RECIPE["block_size"],
                                    QWEN3_MASK_TOKEN_ID)


def _layer_matrices(cfg) -> int:
    """Parameters of one decoder layer's matrices (q, k, v, o, gate, up, down)."""
    D, Dh = cfg.hidden_size, cfg.head_dim
    return D * Dh * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * D * cfg.intermediate_size


def _layer_vectors(cfg) -> int:
    """Two RMSNorm weights [D] and the q / k norms [Dh] of one layer (replicated)."""
    return 2 * cfg.hidden_size + 2 * cfg.head_dim


def target_params(target: TargetConfig) -> tuple[int, int]:
    """(matrices split over model: layers + embedding + LM head, replicated vectors), by the
    target family's size model."""
    family = targets.family_of(target)
    matrices = family.matrix_params(target)
    return matrices, family.num_params(target) - matrices


def drafter_params(drafter: DrafterConfig) -> tuple[int, int]:
    """(layer matrices split over model, replicated: fc [k*D, D] and every norm vector)."""
    D = drafter.hidden_size
    replicated = drafter.num_taps * D * D + drafter.num_layers * _layer_vectors(drafter) + 2 * D
    return drafter.num_layers * _layer_matrices(drafter), replicated


# ---------------------------------------------------------------------------- (b) the formulas
def attention_bytes(drafter: DrafterConfig, b: int, model: int, rows: int, seq_len: int,
                    impl: str, anchor_chunk: int = DEFAULT_ANCHOR_CHUNK,
                    context_chunk: int = DEFAULT_CONTEXT_CHUNK) -> float:
    """The training attention's memory over the drafter's forward + backward (module doc)."""
    H, Hkv, Dh, L = drafter.num_heads / model, drafter.num_kv_heads / model, drafter.head_dim, drafter.num_layers
    bs = drafter.block_size
    if impl == "dense":
        return b * H * rows * seq_len * (DENSE_SAVED * L + DENSE_TRANSIENT)
    ac_rows = min(anchor_chunk, rows // bs) * bs
    cc = min(context_chunk, seq_len)
    n_ctx = math.ceil(seq_len / cc)
    transient = CHUNK_TRANSIENT * b * H * ac_rows * cc + 2 * 4 * n_ctx * b * H * ac_rows * (Dh + 2)
    saved = L * b * rows * ((H + 2 * Hkv) * Dh * COMPUTE_BYTES + 4 * H * Dh)
    return transient + saved


def step_memory(target: TargetConfig, drafter: DrafterConfig, *, batch: int, data: int, model: int,
                num_anchors: int, seq_len: int, attention: str, fsdp: bool,
                anchor_chunk: int = DEFAULT_ANCHOR_CHUNK, context_chunk: int = DEFAULT_CONTEXT_CHUNK,
                drafter_tp: bool = False) -> dict:
    """Bytes per device of one training step: its components and phases (module doc).

    ``attention``: "dense" or "chunked"; ``fsdp``: the drafter's master weights and Adam state
    sharded over ``data`` (else replicated); ``drafter_tp``: the drafter split over ``model``
    like the target (else, as ``training.sharding`` does, not split over it)."""
    if batch % data:
        raise ValueError(f"batch {batch} does not split over data = {data}")
    if target.num_kv_heads % model:
        raise ValueError(f"model = {model} must divide the KV heads ({target.num_kv_heads})")
    c, b, m = COMPUTE_BYTES, batch // data, model
    md = model if drafter_tp else 1
    D, I, V = target.hidden_size, target.intermediate_size, target.vocab_size
    H, Hkv, Dh = target.num_heads, target.num_kv_heads, target.head_dim
    R, S = num_anchors * drafter.block_size, seq_len
    t_mat, t_vec = target_params(target)
    d_mat, d_rep = drafter_params(drafter)
    local = (d_mat / md + d_rep) / (data if fsdp else 1)
    gather = 2 * c * _layer_matrices(drafter) / md if fsdp and data > 1 else 0
    dD, dI = drafter.hidden_size, drafter.intermediate_size
    dH, dHkv, dDh = drafter.num_heads, drafter.num_kv_heads, drafter.head_dim
    per_layer = b * c * (R * (4 * dD + (3 * dH * dDh + 3 * dHkv * dDh + 3 * dI) / md)
                         + 3 * S * dHkv * dDh / md)
    comp = {
        "target_weights": c * (t_mat / m + t_vec),
        "drafter_state": STATE_BYTES * local + gather,
        "taps": drafter.num_taps * b * S * D * c,
        "target_activations": b * S * (3 * D + (H + 2 * Hkv) * Dh / m + 3 * I / m) * c
        + 2 * 4 * b * (H / m) * S * S,
        "drafter_activations": drafter.num_layers * per_layer + b * c * (3 * R * dD + 2 * S * dD),
        "attention": attention_bytes(drafter, b, md, R, S, attention, anchor_chunk, context_chunk),
        "logits": LOGIT_BYTES * b * R * V / m,
    }
    phases = {
        "features": comp["target_weights"] + comp["drafter_state"] + comp["taps"] + comp["target_activations"],
        "drafter": sum(comp[k] for k in ("target_weights", "drafter_state", "taps", "drafter_activations",
                                         "attention", "logits")),
        "update": comp["target_weights"] + UPDATE_BYTES * local,
    }
    peak_phase = max(phases, key=phases.get)
    return {"data": data, "model": model, "sequences_per_device": b, "attention_impl": attention,
            "drafter_sharding": "fsdp" if fsdp else "replicated", "drafter_tp": drafter_tp,
            "components": comp,
            "phases": phases, "peak": phases[peak_phase], "peak_phase": peak_phase,
            "fits": {name: phases[peak_phase] <= gb * GB for name, gb in DEVICE_MEMORY_GB.items()}}


def computed(batches: Sequence[int], anchor_chunk: int, context_chunk: int,
             drafter_tp: bool = False) -> dict:
    """(b): every mesh x attention x drafter sharding at the paper's recipe, per batch."""
    target = qwen3_8b()
    drafter = paper_drafter(target)
    rows = []
    for batch in batches:
        for data, model in MESHES:
            for fsdp in ((False, True) if data > 1 else (False,)):  # data 1: FSDP = replicated
                for impl in ("dense", "chunked"):
                    rows.append({"batch": batch} | step_memory(
                        target, drafter, batch=batch, data=data, model=model,
                        num_anchors=RECIPE["num_anchors"], seq_len=RECIPE["seq_len"], attention=impl,
                        fsdp=fsdp, anchor_chunk=anchor_chunk, context_chunk=context_chunk,
                        drafter_tp=drafter_tp))
    t_mat, t_vec = target_params(target)
    d_mat, d_rep = drafter_params(drafter)
    return {"recipe": RECIPE, "target": target.to_hf_dict(), "drafter": drafter.to_hf_dict(),
            "target_params": t_mat + t_vec, "drafter_params": d_mat + d_rep,
            "anchor_chunk": anchor_chunk, "context_chunk": context_chunk, "drafter_tp": drafter_tp,
            "rows": rows}


# ---------------------------------------------------------------------------- (a) measured
def _temp_bytes(fn, *shapes) -> int:
    import jax

    return int(jax.jit(fn).lower(*shapes).compile().memory_analysis().temp_size_in_bytes)


def attention_grad_bytes(B: int, N: int, T: int, H: int, Hkv: int, Dh: int, S: int, dtype,
                         impl: str, anchor_chunk: int, context_chunk: int) -> int:
    """Compiled temp bytes of one layer's training attention, forward + backward."""
    import jax
    import jax.numpy as jnp


    attn = block_sparse_attention if impl == "dense" else (
        lambda *a: chunked_block_sparse_attention(*a, anchor_chunk=anchor_chunk, context_chunk=context_chunk))
    sd = lambda *s: jax.ShapeDtypeStruct(s, dtype)

    def loss(q, kc, vc, kb, vb, anchors, valid):
        return jnp.sum(attn(q, kc, vc, kb, vb, anchors, valid).astype(jnp.float32) ** 2)

    return _temp_bytes(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), sd(B, N, T, H, Dh), sd(B, S, Hkv, Dh),
                       sd(B, S, Hkv, Dh), sd(B, N, T, Hkv, Dh), sd(B, N, T, Hkv, Dh),
                       jax.ShapeDtypeStruct((B, N), jnp.int32), jax.ShapeDtypeStruct((B, N), bool))


ATTENTION_SIZES = ((128, 1024, 4, 1), (256, 2048, 4, 1), (512, 3072, 4, 1), (512, 3072, 32, 8))
"""(anchors, length, H, Hkv) of the measured attention: an eighth of Qwen3-8B's drafter heads up
to the paper's shape, then all its heads at the paper's shape."""
SMALL_TARGET = dict(model_type="qwen3", vocab_size=8192, hidden_size=256, intermediate_size=768,
                    num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=4096)
SMALL_DRAFT = {"layers": 2, "block_size": 16, "num_anchors": 128, "seq_len": 1024, "batch": 1}


def measured_attention(anchor_chunk: int, context_chunk: int, status=print) -> list[dict]:
    import jax.numpy as jnp

    rows = []
    for N, S, H, Hkv in ATTENTION_SIZES:
        row = {"anchors": N, "block_size": 16, "seq_len": S, "heads": H, "kv_heads": Hkv, "head_dim": 128,
               "batch": 1, "dtype": "bfloat16", "score_elements": H * N * 16 * S}
        for impl in ("dense", "chunked"):
            status(f"compiling the {impl} attention gradient at {N} anchors, length {S}, {H} heads")
            row[impl] = attention_grad_bytes(1, N, 16, H, Hkv, 128, S, jnp.bfloat16, impl,
                                             anchor_chunk, context_chunk)
        row["ratio"] = row["dense"] / row["chunked"]
        rows.append(row)
    return rows


def measured_drafter_loss(anchor_chunk: int, context_chunk: int, status=print) -> dict:
    """Compiled temp bytes of the trainer's loss + gradient for a small drafter (SMALL_*), dense
    (one chunk covering everything) vs chunked, with the formulas' prediction of the same."""
    import jax
    import jax.numpy as jnp


    target = TargetConfig(**SMALL_TARGET)
    s = SMALL_DRAFT
    drafter = DrafterConfig.for_target(target, s["layers"], s["block_size"], target.vocab_size - 1)
    B, N, L = s["batch"], s["num_anchors"], s["seq_len"]
    key = jax.random.key(0)
    dparams = jax.eval_shape(lambda k: init_drafter_params(drafter, k, jnp.float32), key)
    tparams = jax.eval_shape(lambda k: init_target_params(target, k, jnp.bfloat16), key)
    weights = jnp.asarray(block_loss_weights(drafter.block_size, None, False))
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    inputs = (i32(B, L), jax.ShapeDtypeStruct((B, L), bool),
              jax.ShapeDtypeStruct((B, L, drafter.num_taps * target.hidden_size), jnp.bfloat16),
              i32(B, N), jax.ShapeDtypeStruct((B, N), bool))

    def program(chunks):
        def grad(p, tp, *batch):
            def loss(p):
                p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p)
                return drafter_loss(p, tp, *batch, weights, dcfg=drafter, tcfg=target, **chunks)[0]
            return jax.tree.map(lambda g: g.astype(jnp.float32), jax.grad(loss)(p))
        return grad

    out = {"target": SMALL_TARGET, "drafter_layers": s["layers"], "block_size": s["block_size"],
           "num_anchors": N, "seq_len": L, "batch": B, "compute_dtype": "bfloat16"}
    for impl, chunks in (("dense", {"anchor_chunk": N, "context_chunk": L}),
                         ("chunked", {"anchor_chunk": anchor_chunk, "context_chunk": context_chunk})):
        status(f"compiling the small drafter's loss gradient ({impl})")
        measured = _temp_bytes(program(chunks), dparams, tparams, *inputs)
        f = step_memory(target, drafter, batch=B, data=1, model=1, num_anchors=N, seq_len=L,
                        attention=impl, fsdp=False, **chunks)["components"]
        d_mat, d_rep = drafter_params(drafter)
        # what the program's temporaries hold: the compute copy and bf16 gradient of the drafter
        # (its float32 gradient is the output), activations, attention, logits
        predicted = 4 * (d_mat + d_rep) + f["drafter_activations"] + f["attention"] + f["logits"]
        out[impl] = {"measured": measured, "formula": predicted, "formula_attention": f["attention"],
                     "formula_logits": f["logits"], "formula_activations": f["drafter_activations"]}
    out["ratio"] = out["dense"]["measured"] / out["chunked"]["measured"]
    return out


# ---------------------------------------------------------------------------- the report
def _gb(x: float) -> str:
    return f"{x / GB:.2f}"


def markdown(report: dict) -> str:
    comp = report["computed"]
    lines = ["# Drafter training step: peak memory per device, dense vs chunked attention", "",
             f"Produced by `{report['command']}` on {report['env']['device']} "
             f"({report['env']['platform']}, {report['env']['cpu_count']} CPUs), jax {report['env']['jax']}, "
             f"jaxlib {report['env']['jaxlib']}, flax {report['env']['flax']}, {report['time']}.", "",
             f"Chunks: {comp['anchor_chunk']} anchors x {comp['context_chunk']} context positions "
             "(`TrainConfig.anchor_chunk` / `context_chunk`). GB = 1e9 bytes. Formulas: the module "
             "docstring of `tools/train_memory.py`.", ""]
    if report.get("measured"):
        m = report["measured"]
        lines += ["## (a) Measured: XLA's compiled temporaries (CPU buffer assignment, compile only)", "",
                  "One layer's training attention, forward + backward, bfloat16, one sequence, block 16, "
                  "Dh 128:", "",
                  "| anchors | length | heads (kv) | score elements | dense (GB) | chunked (GB) | dense / chunked |",
                  "|---|---|---|---|---|---|---|"]
        for r in m["attention"]:
            lines.append(f"| {r['anchors']} | {r['seq_len']} | {r['heads']} ({r['kv_heads']}) | "
                         f"{r['score_elements'] / 1e6:.0f}M | {_gb(r['dense'])} | {_gb(r['chunked'])} | "
                         f"{r['ratio']:.1f}x |")
        d = m["drafter_loss"]
        t = d["target"]
        lines += ["", f"The trainer's loss + gradient for a small drafter ({d['drafter_layers']} layers, D "
                  f"{t['hidden_size']}, {t['num_heads']} heads on {t['num_kv_heads']}, vocab {t['vocab_size']}; "
                  f"{d['num_anchors']} anchors of {d['block_size']}, length {d['seq_len']}, batch {d['batch']}, "
                  "bfloat16), against the formulas at the same shapes:", "",
                  "| attention | measured (GB) | formula (GB) | of which attention | logits | activations |",
                  "|---|---|---|---|---|---|"]
        for impl in ("dense", "chunked"):
            r = d[impl]
            lines.append(f"| {impl} | {_gb(r['measured'])} | {_gb(r['formula'])} | {_gb(r['formula_attention'])} | "
                         f"{_gb(r['formula_logits'])} | {_gb(r['formula_activations'])} |")
        lines += ["", f"Dense / chunked, measured: {d['ratio']:.2f}x.", ""]
    lines += ["## (b) Computed: the paper's recipe on 8 devices", "",
              f"Qwen3-8B target ({comp['target_params'] / 1e9:.2f}B parameters, frozen, bfloat16), "
              f"{comp['recipe']['drafter_layers']}-layer drafter ({comp['drafter_params'] / 1e9:.2f}B, "
              f"{comp['recipe']['taps']} taps), {comp['recipe']['num_anchors']} anchors x block "
              f"{comp['recipe']['block_size']}, length {comp['recipe']['seq_len']}, bfloat16 compute; the "
              "batch split over `data`, the target split over `model` (heads / MLP / vocabulary), "
              + ("the drafter split over `model` like the target (`--drafter-tp`)" if comp["drafter_tp"] else
                 "the drafter not split over `model` (`training.sharding`: every device of a model group "
                 "computes the whole drafter for its data shard)")
              + ", its float32 master weights and Adam state replicated or FSDP over `data` "
              "(with data = 1 the two are the same: one row).", ""]
    keys = ("target_weights", "drafter_state", "taps", "target_activations", "drafter_activations",
            "attention", "logits")
    for batch in sorted({r["batch"] for r in comp["rows"]}):
        lines += [f"Global batch {batch} sequences per step (GB per device):", "",
                  "| (data, model) | seqs/device | drafter state | attention impl | " + " | ".join(keys)
                  + " | peak | phase | fits 80 GB | fits 141 GB |",
                  "|" + "---|" * (len(keys) + 8)]
        for r in comp["rows"]:
            if r["batch"] != batch:
                continue
            c = r["components"]
            fits = ["yes" if r["fits"][k] else "no" for k in DEVICE_MEMORY_GB]
            lines.append(f"| ({r['data']}, {r['model']}) | {r['sequences_per_device']} | {r['drafter_sharding']} | "
                         f"{r['attention_impl']} | " + " | ".join(_gb(c[k]) for k in keys)
                         + f" | **{_gb(r['peak'])}** | {r['peak_phase']} | {fits[0]} | {fits[1]} |")
        lines.append("")
        lines += _findings([r for r in comp["rows"] if r["batch"] == batch]) + [""]
    lines += ["Phases: features = the frozen target's forward for the taps; drafter = the drafter's "
              "forward + backward and the loss; update = AdamW (the step's state is not donated, so "
              "old and new state live together).", ""]
    return "\n".join(lines)


def _findings(rows: list[dict]) -> list[str]:
    """One batch's rows in a few sentences: what chunking saves, the best layout, what is left."""
    chunked = [r for r in rows if r["attention_impl"] == "chunked"]
    pairs = [(d, c) for d in rows for c in chunked if d["attention_impl"] == "dense" and
             (d["data"], d["model"], d["drafter_sharding"]) == (c["data"], c["model"], c["drafter_sharding"])]
    best = min(chunked, key=lambda r: r["peak"])
    biggest = max((k for k in best["components"] if k != "attention"), key=best["components"].get)
    ratio = [d["peak"] / c["peak"] for d, c in pairs]
    att = [d["components"]["attention"] / c["components"]["attention"] for d, c in pairs]
    d, c = pairs[-1]
    spread = f"{min(att):.0f}x" if round(min(att)) == round(max(att)) else f"{min(att):.0f}x to {max(att):.0f}x"
    return [f"- Chunking cuts the attention {spread} (at ({d['data']}, {d['model']}): "
            f"{_gb(d['components']['attention'])} -> {_gb(c['components']['attention'])} GB per device) and "
            f"the peak {min(ratio):.1f}x to {max(ratio):.1f}x.",
            f"- Lowest peak: ({best['data']}, {best['model']}) with the drafter {best['drafter_sharding']}, "
            f"chunked: {_gb(best['peak'])} GB; its largest component is then {biggest} "
            f"({_gb(best['components'][biggest])} GB)."]


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32],
                   help="global batch sizes (training sequences per step) of the computed table")
    p.add_argument("--anchor-chunk", type=int, default=DEFAULT_ANCHOR_CHUNK,
                   help="blocks per anchor chunk of the chunked attention")
    p.add_argument("--context-chunk", type=int, default=DEFAULT_CONTEXT_CHUNK,
                   help="context positions per context chunk of the chunked attention")
    p.add_argument("--drafter-tp", action="store_true",
                   help="compute the drafter split over model like the target (the training layout, "
                        "training.sharding, does not split it)")
    p.add_argument("--skip-measure", action="store_true",
                   help="only the computed table (no compilation)")
    p.add_argument("--out", default=os.path.join("results", "parallel"), help="output directory")


def run(args) -> dict:

    check_chunk("--anchor-chunk", args.anchor_chunk)
    check_chunk("--context-chunk", args.context_chunk)
    for batch in args.batch:
        if batch < 1 or any(batch % d for d, _ in MESHES):
            raise ValueError(f"--batch {batch} must be a positive multiple of 8 (it splits over data "
                             "= 1, 2, 4, 8)")
    t0 = time.perf_counter()
    measured = None
    if not args.skip_measure:
        measured = {"attention": measured_attention(args.anchor_chunk, args.context_chunk, status),
                    "drafter_loss": measured_drafter_loss(args.anchor_chunk, args.context_chunk, status)}
    report = {"benchmark": "train_memory",
              "command": command_line("dflash_jax.tools.train_memory",
                                      (invocation(args) or ["train-memory"])[1:]).strip(),
              "measured": measured,
              "computed": computed(args.batch, args.anchor_chunk, args.context_chunk, args.drafter_tp),
              "constants": {"compute_bytes": COMPUTE_BYTES, "state_bytes_per_param": STATE_BYTES,
                            "update_bytes_per_param": UPDATE_BYTES, "dense_saved_per_score": DENSE_SAVED,
                            "dense_transient_per_score": DENSE_TRANSIENT,
                            "chunk_transient_per_score": CHUNK_TRANSIENT, "bytes_per_logit": LOGIT_BYTES},
              "seconds": round(time.perf_counter() - t0, 1),
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "train_memory.json"), report)  # atomic (os.replace)
    text = markdown(report)
    write_text(os.path.join(args.out, "train_memory.md"), text)
    print(text)
    return report


def main(argv=None) -> dict:
    return command_main("train-memory", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
