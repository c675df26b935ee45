"""Roofline predictions for quantized targets (docs/quantization.md): the AR step, the DFlash
iteration and the speedup of Qwen3-8B (dense), gpt-oss-120b (MoE) and Qwen3.5-27B (hybrid GDN)
with their linear layers in bf16, FP8 / int8 (1 byte per weight plus the scales) and, for
gpt-oss, its released MXFP4 experts kept packed, on an H100 and a B200.

The costs are the roofline modules' own (``roofline``, ``roofline_moe``, ``roofline_hybrid``:
each component max(bytes / bandwidth, FLOPs / peak), the step the sum) computed in bf16; a
quantized format then changes only the weight bytes of the target's linear layers and experts
(the components ``target linears`` and ``target experts``): ``bytes_per_weight / 2`` of them.
The LM head, the embedding, the KV cache, the recurrent state and the drafter stay bf16, and the
FLOPs are the bf16 matmuls' (weight-only quantization computes in bf16). This is the step a
fused dequantization reaches; an engine that writes the dequantized weights back to memory first
(XLA on CPU does: docs/quantization.md) reads more. Whether the weights fit on one device is
checked against its memory.

  python -m dflash_jax.tools.roofline_quantized --out results/roofline/quantized
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.figures import finish
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_hybrid as hybrid
from dflash_jax.tools import roofline_moe as moe

CONTEXT, BLOCK_SIZE = 1024, 16
DEVICES = ("h100", "b200")
MEMORY_GB = {"h100": (80, "NVIDIA H100 SXM datasheet: 80 GB HBM3"),
             "b200": (180, "NVIDIA DGX B200 datasheet: 1,440 GB HBM3e for 8 GPUs")}
PER_CHANNEL = 1.0  # FP8 / int8 per output channel: the float32 scales add 4 / in_dim bytes (< 0.1 %)
FORMATS = {"bf16": 2.0, "fp8": PER_CHANNEL, "mxfp4 experts": None}
QUANTIZED_COMPONENTS = ("target linears", "target experts")


def _quantized(costs, bytes_per_weight: float, components=QUANTIZED_COMPONENTS):
    return [dataclasses.replace(c, weights=c.weights * bytes_per_weight / 2.0) if c.name in components else c
            for c in costs]


def _linears_in(fmt: str, ar, it, weights: float):
    """(AR step, iteration, weight bytes) with the target's linear layers in ``fmt`` (from bf16)."""
    b = FORMATS[fmt]
    if b == 2.0:
        return ar, it, weights
    linear = dense.total([c for c in ar if c.name == "target linears"], "weights")
    return _quantized(ar, b), _quantized(it, b), weights - linear * (1 - b / 2.0)


def _dense_costs(fmt: str):
    target = TargetConfig(**dense.PRESETS["qwen3-8b"])
    drafter = DrafterConfig.for_target(target, dense.PAPER["drafter_layers"], block_size=BLOCK_SIZE,
                                       mask_token_id=dense.QWEN3_MASK_TOKEN_ID)
    ar, it, weights = _linears_in(fmt, dense.ar_step(target, CONTEXT),
                                  dense.dflash_iteration(target, drafter, BLOCK_SIZE, CONTEXT),
                                  target.num_params() * 2.0)
    return ar, it, weights, {"tau": dense.PAPER["tau"], "source": dense.PAPER["source"]}


def _moe_costs(fmt: str):
    _, s, drafter = moe.pair("gpt-oss-120b")
    layout = moe.Layout(1, expert_bytes=moe.MXFP4_BYTES if fmt == "mxfp4 experts" else 2.0)
    ar = moe.ar_step(s, CONTEXT, layout)
    it = moe.dflash_iteration(s, drafter, drafter.block_size, CONTEXT, layout)
    if fmt == "fp8":
        ar, it = _quantized(ar, PER_CHANNEL), _quantized(it, PER_CHANNEL)
    experts = s.moe_layers * s.num_experts * moe.expert_matrix_params(s)
    attention = s.num_layers * moe.attention_params(s)
    rest = moe.num_params(s) - experts - attention  # embedding, LM head, routers, norms, biases: bf16
    per_expert_byte = {"bf16": 2.0, "fp8": PER_CHANNEL, "mxfp4 experts": moe.MXFP4_BYTES}[fmt]
    weights = experts * per_expert_byte + attention * (PER_CHANNEL if fmt == "fp8" else 2.0) + rest * 2.0
    tau = moe.TAUS["gpt-oss-120b"]["gsm8k"]
    return ar, it, weights, {"tau": tau, "source": "the released drafter's GSM8K tau (roofline_moe.TAUS)"}


def _hybrid_costs(fmt: str):
    _, s, drafter = hybrid.pair("qwen3.5-27b")
    ar, it, weights = _linears_in(fmt, hybrid.ar_step(s, CONTEXT),
                                  hybrid.dflash_iteration(s, drafter, drafter.block_size, CONTEXT, "replay"),
                                  hybrid.num_params(s) * 2.0)
    return ar, it, weights, {"tau": dense.PAPER["tau"], "source": "the paper's Qwen3-8B average (no Qwen3.5-27B "
                                                                    "tau measured here)"}


MODELS = {"qwen3-8b": (_dense_costs, ("bf16", "fp8")),
          "gpt-oss-120b": (_moe_costs, ("bf16", "fp8", "mxfp4 experts")),
          "qwen3.5-27b": (_hybrid_costs, ("bf16", "fp8"))}


def analyse() -> list[dict]:
    rows = []
    for model, (costs, formats) in MODELS.items():
        for device in DEVICES:
            dev = dense.DEVICES[device]
            base = None
            for fmt in formats:
                ar, it, weights, tau = costs(fmt)
                t_ar, t_it = dense.seconds(ar, dev), dense.seconds(it, dev)
                speedup = tau["tau"] * t_ar / t_it
                row = {"model": model, "device": device, "format": fmt, "t_ar_us": 1e6 * t_ar,
                       "t_iter_us": 1e6 * t_it, "ratio": t_it / t_ar, "tau": tau["tau"], "tau_source": tau["source"],
                       "speedup": speedup, "weights_gb": weights / 1e9,
                       "fits": weights / 1e9 < MEMORY_GB[device][0],
                       "drafter_share": sum(c.seconds(dev) for c in it if not c.name.startswith("target")) / t_it}
                if base is None:
                    base = row
                row["ar_vs_bf16"] = row["t_ar_us"] / base["t_ar_us"]
                row["tau_for_bf16_speedup"] = base["speedup"] * row["ratio"]
                rows.append(row)
    return rows


def markdown(report: dict) -> str:
    lines = ["# Roofline: quantized targets", "",
             f"Batch 1, context {CONTEXT}, block 16 (the released drafters' shapes), bf16 activations, KV and "
             "drafter; a format changes the target's linear and expert weight bytes only (module doc). Speedup "
             "= tau x t_AR / t_iter at the tau named; 'tau for the bf16 speedup': what the quantized pair needs "
             "to match the bf16 pair's predicted speedup.", "",
             "| model | device | weights | GB | fits | AR step us | vs bf16 | iteration us | iteration / AR | "
             "drafter share | tau | speedup | tau for the bf16 speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['model']} | {r['device']} | {r['format']} | {r['weights_gb']:.1f} | "
                     f"{'yes' if r['fits'] else 'no'} | {r['t_ar_us']:.0f} | {r['ar_vs_bf16']:.2f}x | "
                     f"{r['t_iter_us']:.0f} | {r['ratio']:.2f} | {100 * r['drafter_share']:.0f} % | {r['tau']:.2f} | "
                     f"{r['speedup']:.2f}x | {r['tau_for_bf16_speedup']:.2f} |")
    lines += ["", "Taus: " + "; ".join(sorted({f"{r['model']}: {r['tau_source']}" for r in report["rows"]})) + ".",
              "Device memory: " + "; ".join(f"{d}: {MEMORY_GB[d][1]}" for d in DEVICES) + ".",
              "Rows that do not fit one device are predicted as if they did (a mesh adds its collectives: "
              "`roofline --moe`).", ""]
    return "\n".join(lines)


def plot(report: dict):
    rows = report["rows"]
    fig, ax = new_figure(figsize=(10, 4))
    labels = [f"{r['model']}\n{r['device']}, {r['format']}" for r in rows]
    ax.bar(range(len(rows)), [r["speedup"] for r in rows],
           color=["tab:blue" if r["format"] == "bf16" else "tab:orange" if r["format"] == "fp8" else "tab:green"
                  for r in rows])
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("predicted speedup (roofline, no interval)")
    ax.set_title("DFlash's predicted speedup with the target in bf16, FP8 and MXFP4 experts (batch 1)")
    return finish(fig)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m dflash_jax.tools.roofline_quantized",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/roofline_quantized", help="output directory")
    args = p.parse_args(argv)
    report = {"benchmark": "roofline_quantized",
              "command": command_line("dflash_jax.tools.roofline_quantized", argv if argv is not None else []),
              "context": CONTEXT, "rows": analyse(), "memory_gb": MEMORY_GB, "env": environment()}
    os.makedirs(args.out, exist_ok=True)
    return publish_report(report, args.out, "quantized", plot, markdown)


if __name__ == "__main__":
    main()
