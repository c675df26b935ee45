"""Roofline of Gemma 4 targets (``roofline --gemma4``): one AR step against one DFlash iteration,
per context length, where the sliding layers read only their window of the KV cache.

The dense roofline (:mod:`dflash_jax.tools.roofline`) charges every weight once per forward and
the K/V of the cached positions in every layer. A Gemma 4 target differs in what it reads:

  target linears   the family's own size model (``targets.gemma4``): every matrix a forward over
                   ``rows`` rows reads (``matrix_params_read``: the MoE layers' routed experts
                   counted for the experts the rows route to, the per-layer-input table only
                   gathered) and its vectors; FLOPs 2 x rows x the matrices one token passes
                   through (``matrix_params_per_token``); the embedding and head tables are the
                   LM head's.
  target attention per layer: a sliding layer reads the K/V of the last ``min(S, W - 1)`` positions
                   (its own or, KV-shared, its producer's), a full layer all S; each layer its
                   own head dim and KV heads (full layers: ``global_head_dim``,
                   ``num_global_key_value_heads``); only layers with their own K/V write the new
                   rows' K/V. 4 H Dh FLOPs per (query, key) pair.
  target LM head   as the dense roofline (V x D, float32 logits); soft-capping is elementwise.
  drafter          the dense roofline's DFlash drafter (Qwen3-layout layers over the taps).

Time: a component takes max(bytes / bandwidth, FLOPs / peak); a step the sum (the dense
module's rules). The named shapes are the released ``config.json`` text fields
(``results/roofline/gemma4/README.md`` lists the sources); a ``config.json`` path reads any
other. The counts equal the family's size model (``tests/tools/test_roofline_gemma4.py``).

    python -m dflash_jax roofline --gemma4 gemma-4-31b gemma-4-26b-a4b --out results/roofline/gemma4
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Mapping, Sequence

import numpy as np

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.targets import gemma4
from dflash_jax.targets.gemma4.model import SLIDING
from dflash_jax.tools import roofline as dense
from dflash_jax.tools.roofline import DEVICES, Cost

GEMMA4_DEVICES = ("h100", "b200")
CONTEXTS = (1024, 8192, 32768)
BLOCK_SIZES = (2, 4, 8, 10, 16, 32)

_SL, _FL = "sliding_attention", "full_attention"
_ROPE = {_SL: {"rope_type": "default", "rope_theta": 10000.0},
         _FL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
MODELS: dict[str, dict] = {
    # google/gemma-4-31B-it text_config: 60 layers (5 sliding : 1 full), hidden 5376, MLP 21504,
    # 32 heads; sliding layers 16 KV heads of 256, window 1024; full layers 4 KV heads of 512 with
    # keys as values; vocab 262144, tied, soft-cap 30, no per-layer inputs or KV sharing.
    "gemma-4-31b": {
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 5376, "intermediate_size": 21504,
        "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
        "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
        "sliding_window": 1024, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0,
        "tie_word_embeddings": True, "rope_parameters": _ROPE, "max_position_embeddings": 262144},
    # google/gemma-4-26B-A4B-it text_config: 30 layers, hidden 2816, MLP 2112 beside a MoE block of
    # 128 experts of 704, top 8; 16 heads; sliding 8 KV heads of 256, full 2 of 512 (keys as values).
    "gemma-4-26b-a4b": {
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
        "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "global_head_dim": 512, "num_global_key_value_heads": 2, "attention_k_eq_v": True,
        "sliding_window": 1024, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0,
        "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
        "tie_word_embeddings": True, "rope_parameters": _ROPE, "max_position_embeddings": 262144},
}
DRAFTERS: dict[str, dict] = {
    # z-lab/gemma-4-31B-it-DFlash (its model card and a published conversion of it): 5 layers,
    # hidden 5376, 64 heads / 8 KV heads of 128, MLP 10752, taps [1, 12, 23, 35, 46, 57], block 16,
    # mask id 4 (its sliding window of 2048 is above the contexts' draft context here only at 1024;
    # modelled as full attention)
    "gemma-4-31b": dict(num_layers=5, hidden_size=5376, intermediate_size=10752, num_heads=64, num_kv_heads=8,
                        head_dim=128, vocab_size=262144, block_size=16, num_target_layers=60,
                        target_layer_ids=(1, 12, 23, 35, 46, 57), mask_token_id=4),
    # an assumption: the 31B drafter's recipe at the 26B-A4B's widths (5 layers, MLP 2 D, 32 / 8
    # heads of 128, block 16, taps spread over 30 layers)
    "gemma-4-26b-a4b": dict(num_layers=5, hidden_size=2816, intermediate_size=5632, num_heads=32, num_kv_heads=8,
                            head_dim=128, vocab_size=262144, block_size=16, num_target_layers=30,
                            target_layer_ids=(1, 6, 12, 17, 23, 28), mask_token_id=4),
}
TAUS = {"model card, MATH-500 (31B)": 8.59, "paper, Qwen3-8B average": dense.PAPER["tau"]}
"""Acceptance lengths to predict at: ``z-lab/gemma-4-31B-it-DFlash``'s model card (8.59 of 16 on
MATH-500) and the paper's Qwen3-8B average (6.49)."""
PUBLISHED = {"gemma-4-31b": "NVIDIA: up to 5.8x on MATH-500, 5.6x on HumanEval (vLLM, concurrency 1)"}


# ---------------------------------------------------------------------------- counts
def config_of(d: Mapping[str, Any]) -> gemma4.Gemma4Config:
    return TargetConfig.from_hf_dict(d)


def tables(cfg) -> int:
    """Embedding and head table parameters (the LM head component charges V x D once)."""
    return cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)


def vector_params(cfg) -> int:
    fam = gemma4.GEMMA4
    return fam.num_params(cfg) - fam.matrix_params(cfg)


def kv_read_positions(cfg, layer: int, context: int) -> int:
    """Cached positions layer ``layer`` reads at ``context``: for a sliding layer the W - 1 before
    the query (which sees W positions, itself included)."""
    return min(context, cfg.sliding_window - 1) if cfg.layer_types[layer] == SLIDING else context


def kv_position_bytes(cfg, layer: int, kv_bytes: int) -> int:
    return 2 * cfg.layer_kv_heads(layer) * cfg.layer_head_dim(layer) * kv_bytes


def target_forward(cfg, rows: int, context: int, *, taps: int = 0, batch: int = 1, weight_bytes: int = 2,
                   kv_bytes: int = 2, windowed: bool = True) -> list[Cost]:
    """The target on ``rows`` new rows per sequence over ``context`` cached positions (module
    doc). ``windowed=False``: every layer reads all positions (what a cache without the window's
    read would cost; for comparison)."""
    fam = gemma4.GEMMA4
    D = cfg.hidden_size
    read = fam.matrix_params_read(cfg, rows) - tables(cfg)
    per_token = fam.matrix_params_per_token(cfg) - tables(cfg)
    ple = batch * rows * cfg.num_layers * cfg.hidden_size_per_layer_input * weight_bytes
    linears = Cost("target linears", flops=2 * batch * rows * per_token,
                   weights=(read + vector_params(cfg)) * weight_bytes,
                   activations=batch * rows * D * (1 + taps) * weight_bytes + ple)
    flops = kv_read = kv_write = 0.0
    for i in range(cfg.num_layers):
        seen = kv_read_positions(cfg, i, context) if windowed else context
        pairs = rows * seen + rows * (rows + 1) / 2
        per_pos = kv_position_bytes(cfg, i, kv_bytes)
        flops += 4 * batch * cfg.num_heads * cfg.layer_head_dim(i) * pairs
        kv_read += batch * seen * per_pos
        if i in cfg.kv_layers:
            kv_write += batch * rows * per_pos
    attn = Cost("target attention", flops=flops, kv_read=kv_read, kv_write=kv_write)
    return [linears, attn, dense.lm_head("target LM head", cfg, rows, batch=batch, weight_bytes=weight_bytes)]


def ar_step(cfg, context: int, **kw) -> list[Cost]:
    return target_forward(cfg, 1, context, **kw)


def dflash_iteration(cfg, drafter: DrafterConfig, block_size: int, context: int, *, batch: int = 1,
                     weight_bytes: int = 2, kv_bytes: int = 2, windowed: bool = True) -> list[Cost]:
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    return (dense.drafter_forward(drafter, cfg, block_size, context, block_size, **kw)
            + target_forward(cfg, block_size, context, taps=drafter.num_taps, windowed=windowed, **kw))


def step_times(cfg, drafter: DrafterConfig, block_size: int, context: int, device: str, **kw) -> dict:
    dev = DEVICES[device]
    t_ar = dense.seconds(ar_step(cfg, context, **kw), dev)
    t_iter = dense.seconds(dflash_iteration(cfg, drafter, block_size, context, **kw), dev)
    return {"t_ar_s": t_ar, "t_iter_s": t_iter, "ratio": t_iter / t_ar}


# ---------------------------------------------------------------------------- analysis
def analyse(name: str, cfg, drafter: DrafterConfig, contexts: Sequence[int], devices: Sequence[str],
            taus: Mapping[str, float], *, batch: int = 1) -> list[dict]:
    """One row per (device, context) at the drafter's block size: times, ratio, speedups, the KV
    bytes read per AR step with and without the sliding windows, the ratio per block size and the
    best block size per tau (``roofline.best_block_sizes``)."""
    bs = drafter.block_size
    rows = []
    for device in devices:
        for context in contexts:
            t = step_times(cfg, drafter, bs, context, device, batch=batch)
            ar = {c.name: c for c in ar_step(cfg, context, batch=batch)}
            ar_full = {c.name: c for c in ar_step(cfg, context, batch=batch, windowed=False)}
            ratios = {b: step_times(cfg, dataclasses.replace(drafter, block_size=b), b, context, device,
                                    batch=batch)["ratio"] for b in BLOCK_SIZES}
            rows.append({
                "model": name, "device": device, "context": context, "block_size": bs, "batch": batch,
                "t_ar_us": 1e6 * t["t_ar_s"], "t_iter_us": 1e6 * t["t_iter_s"], "ratio": t["ratio"],
                "speedup": {k: tau / t["ratio"] for k, tau in taus.items()},
                "ar_weight_bytes": ar["target linears"].weights + ar["target LM head"].weights,
                "ar_kv_read_bytes": ar["target attention"].kv_read,
                "ar_kv_read_bytes_without_window": ar_full["target attention"].kv_read,
                "ratio_by_block_size": {str(b): r for b, r in ratios.items()},
                "best_block": dense.best_block_sizes(ratios, list(taus.values()), bs),
            })
    return rows


def pair(name_or_path: str) -> tuple[str, Any, DrafterConfig]:
    """A named model of :data:`MODELS` with its drafter, or a config.json path (a drafter of
    :data:`DRAFTERS`' recipe at its widths)."""
    if name_or_path in MODELS:
        return name_or_path, config_of(MODELS[name_or_path]), DrafterConfig(**DRAFTERS[name_or_path])
    try:
        with open(name_or_path) as f:
            d = json.load(f)
    except OSError as e:
        raise ValueError(f"--gemma4 {name_or_path!r} is neither a named model ({', '.join(MODELS)}) nor a "
                         f"readable config.json: {e}") from None
    cfg = config_of(d)
    if cfg.model_type != "gemma4_text":
        raise ValueError(f"--gemma4 {name_or_path!r} is a {cfg.model_type} config, not Gemma 4")
    n = cfg.num_layers
    drafter = DrafterConfig(num_layers=5, hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
                            num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=cfg.vocab_size, block_size=16,
                            num_target_layers=n, target_layer_ids=tuple(int(x) for x in np.linspace(1, n - 3, 6)),
                            mask_token_id=0)
    return name_or_path, cfg, drafter


def run_gemma4(args) -> dict:
    """``roofline --gemma4``: each model on H100 and B200 (or ``--devices`` when given other than
    the default) at :data:`CONTEXTS` (or ``--context`` when given other than the default);
    JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    devices = list(GEMMA4_DEVICES) if list(args.devices) == list(DEVICES) else list(args.devices)
    contexts = list(CONTEXTS) if args.context == 1024 else [args.context]
    models, rows = {}, []
    for target in args.gemma4:
        name, cfg, drafter = pair(target)
        if args.block_size:
            drafter = dataclasses.replace(drafter, block_size=args.block_size)
        fam = gemma4.GEMMA4
        models[name] = {"config": fam.config_to_hf(cfg), "drafter": drafter.to_hf_dict(),
                        "params": fam.num_params(cfg), "active_params": fam.matrix_params_per_token(cfg),
                        "drafter_params": dense._drafter_params(drafter),
                        "kv_bytes_per_token": fam.state_bytes_per_token(cfg, 2),
                        "sliding_layers": cfg.layer_types.count(_SL), "full_layers": cfg.layer_types.count(_FL),
                        "window": cfg.sliding_window, "published": PUBLISHED.get(name)}
        rows += analyse(name, cfg, drafter, contexts, devices, TAUS, batch=args.batch)
    report = {"benchmark": "roofline_gemma4", "command": command_line("dflash_jax", invocation(args)),
              "settings": {"contexts": contexts, "batch": args.batch, "dtype": "bfloat16", "devices": devices},
              "taus": TAUS, "models": models, "results": rows,
              "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, args.out, "roofline_gemma4", plot, markdown)


def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [f"`{report['command']}`", "",
             f"Batch {st['batch']}, bf16 weights and KV, each drafter's block size; a roofline (no launch "
             "overheads, perfect kernels), not a measurement.", "",
             "| model | params (active / token) | sliding : full layers, window | KV per token | drafter | published |",
             "|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        lines.append(f"| {name} | {m['params'] / 1e9:.1f}B ({m['active_params'] / 1e9:.1f}B) | "
                     f"{m['sliding_layers']} : {m['full_layers']}, {m['window']} | "
                     f"{m['kv_bytes_per_token'] / 1e3:.0f} KB | {m['drafter']['num_hidden_layers']} layers, "
                     f"{m['drafter_params'] / 1e6:.0f}M, block {m['drafter']['block_size']} | {m['published'] or '-'} |")
    lines += ["", "| model | device | context | weight GB / AR step | KV GB read / AR step (no window) | "
              "t_AR (us) | t_iter (us) | t_iter / t_AR | speedup at tau | best block (fixed tau) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        best = ", ".join(f"{b['fixed_best_bs']} at tau {b['tau']}" for b in r["best_block"])
        lines.append(f"| {r['model']} | {r['device']} | {r['context']} | {r['ar_weight_bytes'] / 1e9:.2f} | "
                     f"{r['ar_kv_read_bytes'] / 1e9:.3f} ({r['ar_kv_read_bytes_without_window'] / 1e9:.3f}) | "
                     f"{r['t_ar_us']:.0f} | {r['t_iter_us']:.0f} | {r['ratio']:.3f} | "
                     + ", ".join(f"{v:.2f}x (tau {report['taus'][k]})" for k, v in r["speedup"].items())
                     + f" | {best} |")
    lines += ["", "t_iter / t_AR by block size:", "", "| model | device | context | "
              + " | ".join(f"bs {b}" for b in BLOCK_SIZES) + " |", "|---|---|---|" + "---|" * len(BLOCK_SIZES)]
    for r in report["results"]:
        lines.append(f"| {r['model']} | {r['device']} | {r['context']} | "
                     + " | ".join(f"{r['ratio_by_block_size'][str(b)]:.3f}" for b in BLOCK_SIZES) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Left: t_iter / t_AR against block size per (model, device) at each context. Right: KV bytes
    read per AR step against context, with and without the sliding windows (first device)."""
    fig, (a, b) = new_figure(1, 2, figsize=(12, 4.4))
    for r in report["results"]:
        xs = [int(k) for k in r["ratio_by_block_size"]]
        a.plot(xs, list(r["ratio_by_block_size"].values()), "o-", ms=3,
               label=f"{r['model']}, {r['device']}, S={r['context']}")
    a.axhline(dense.PAPER_IMPLIED_RATIO, color="r", lw=0.8, ls=":", label="paper's implied ratio (Qwen3-8B)")
    a.set(xscale="log", xlabel="block size", ylabel="t_iter / t_AR", title="iteration cost (roofline)")
    a.legend(fontsize=5)
    first = report["settings"]["devices"][0]
    for name in report["models"]:
        rs = [r for r in report["results"] if r["model"] == name and r["device"] == first]
        ctx = [r["context"] for r in rs]
        line, = b.plot(ctx, [r["ar_kv_read_bytes"] / 1e9 for r in rs], "o-", label=f"{name}, windowed")
        b.plot(ctx, [r["ar_kv_read_bytes_without_window"] / 1e9 for r in rs], "s--", color=line.get_color(),
               label=f"{name}, every layer reads all S")
        b.plot(ctx, [r["ar_weight_bytes"] / 1e9 for r in rs], ":", color=line.get_color(), label=f"{name}, weights")
    b.set(xscale="log", yscale="log", xlabel="context S", ylabel="GB per AR step",
          title=f"bytes per AR step ({first}), batch {report['settings']['batch']}")
    b.legend(fontsize=6)
    fig.suptitle("Gemma 4 roofline, bf16")
    return fig
