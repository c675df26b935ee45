"""Roofline of the DFlash family (``roofline --family``): one iteration's predicted draft and
verify time, and the speedup over autoregressive decoding, for DFlash, DFlash2, DSpark and Domino on
Qwen3-8B's shapes (or ``--target`` with its DFlash ``--drafter``) on an H100 and a B200, bf16.

Each method's draft is its own size model (``DraftingMethod.draft_costs``; ``docs/methods.md``):

  DFlash     the drafter's one pass over the block of b rows, the LM head on b - 1
  DFlash2    DFlash's, plus two convolution pairs per layer and the candidate selector, row after
             row over its top-k candidates (this project's DFlash2Config defaults: K 4, groups of 64,
             rank 64, top-8)
  DSpark     the drafter over b - 1 rows, every one drafting, the LM head on all of them, then the
             Markov head row after row (each step reads w2 [r, V] again: its rows wait for the token
             before them) and the confidence head; SpecForge's released shape (block 7: a verify of
             8) and one with DFlash's verify width (block 15)
  Domino     DFlash's pass, then draft after draft the GRU step and the correction (W1 [D + H, E],
             W2 [E, V], read again each step); SpecForge's released shape (GRU 1024, E 256, one
             uncorrected draft)

The verify is the target on the verify block (the dense roofline's ``target_forward``), each
component's time max(bytes / bandwidth, FLOPs / peak), summed:

    speedup = tau * t_AR / (t_draft + t_verify)

at the published tau: DFlash's paper, 6.49 (Qwen3-8B, T = 0, average); the DSpark paper's GSM8K
at T = 1, DSpark 6.17 against its DFlash baseline's 5.33 (each method's own numbers on its own
engine). DFlash2 and Domino publish no Qwen3-8B tau we know of; their rows give the tau each needs to match DFlash's
predicted speedup.

    python -m dflash_jax roofline --family --out results/roofline/methods
"""

from __future__ import annotations

import dataclasses
import time

from dflash_jax.methods.dflash import DFLASH
from dflash_jax.methods.dflash2 import DFLASH2
from dflash_jax.methods.dflash2.config import DFlash2Config
from dflash_jax.methods.domino import DOMINO
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.dspark import DSPARK
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.tools import roofline as dense
from dflash_jax.tools.roofline import DEVICES

PUBLISHED = {
    "dflash": {"tau": 6.49, "setting": "T = 0, average of 7 sets", "source": "DFlash paper (arXiv 2602.06036), Table 1"},
    "dflash gsm8k T=1": {"tau": 5.33, "setting": "T = 1, GSM8K", "source": "DSpark paper (arXiv 2607.05147), its DFlash baseline"},
    "dspark gsm8k T=1": {"tau": 6.17, "setting": "T = 1, GSM8K", "source": "DSpark paper (arXiv 2607.05147)"},
}
METHODS_DEVICES = ("h100", "b200")


def drafters(dflash) -> dict:
    """{label: (method, config, verify block)} of the compared drafters on ``dflash``'s backbone."""
    b = dflash.block_size
    dspark = lambda rows: DSparkConfig.from_backbone(dataclasses.replace(dflash, block_size=rows),  # noqa: E731
                                                     markov_rank=min(256, dflash.vocab_size))
    return {"dflash": (DFLASH, dflash, b),
            "dflash2": (DFLASH2, DFlash2Config.from_backbone(dflash, selector_top_k=min(8, dflash.vocab_size)), b),
            "dspark b7": (DSPARK, dspark(7), 8),
            f"dspark b{b - 1}": (DSPARK, dspark(b - 1), b),
            "domino": (DOMINO, DominoConfig.from_backbone(dflash, emb_dim=min(256, dflash.vocab_size),
                                                          gru_hidden_dim=1024, shift_label=True,
                                                          pure_draft_prefix_len=1), b)}


def analyse(target, dflash, context: int, devices, *, batch: int = 1, weight_bytes: int = 2) -> dict:
    out = {}
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=weight_bytes)
    for dev in devices:
        device = DEVICES[dev]
        t_ar = dense.seconds(dense.ar_step(target, context, **kw), device)
        rows = {}
        for label, (method, cfg, verify) in drafters(dflash).items():
            draft = method.draft_costs(cfg, target, verify, context, **kw)
            check = dense.target_forward(target, verify, context, taps=cfg.num_taps, **kw)
            t_draft, t_verify = dense.seconds(draft, device), dense.seconds(check, device)
            rows[label] = {"verify_block": verify, "drafter_params": method.num_params(cfg),
                           "components_ms": {c.name: c.seconds(device) * 1e3 for c in draft},
                           "t_draft_ms": t_draft * 1e3, "t_verify_ms": t_verify * 1e3,
                           "ratio": (t_draft + t_verify) / t_ar}
        speed = lambda label, tau: tau / rows[label]["ratio"]  # noqa: E731
        predicted = {"dflash at 6.49 (T = 0)": speed("dflash", 6.49),
                     "dflash at 5.33 (GSM8K, T = 1)": speed("dflash", 5.33),
                     "dspark b7 at 6.17 (GSM8K, T = 1)": speed("dspark b7", 6.17)}
        needed = {label: predicted["dflash at 6.49 (T = 0)"] * rows[label]["ratio"] for label in rows}
        out[dev] = {"t_ar_ms": t_ar * 1e3, "methods": rows, "predicted_speedup": predicted,
                    "tau_to_match_dflash": needed}
    return out


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# Roofline of the DFlash family: {report['pair']['name']}, context {s['context']}, batch {s['batch']}, "
             f"{s['dtype']}", "",
             "Predicted, not measured: each component's time is max(bytes / bandwidth, FLOPs / peak). The "
             "published tau values are each method's authors' own (Qwen3-8B, their engines): "
             + "; ".join(f"{k} {v['tau']} ({v['setting']}, {v['source']})" for k, v in report["published"].items())
             + ".", ""]
    for dev, a in report["analysis"].items():
        lines += [f"## {report['device_profiles'][dev]['name']}", "", f"AR step {a['t_ar_ms']:.3f} ms.", "",
                  "| method | verify block | drafter params | draft ms | verify ms | iteration / AR step | "
                  "tau to match DFlash at 6.49 |", "|---|---|---|---|---|---|---|"]
        for label, r in a["methods"].items():
            lines.append(f"| {label} | {r['verify_block']} | {r['drafter_params'] / 1e6:.0f}M | {r['t_draft_ms']:.3f} | "
                         f"{r['t_verify_ms']:.3f} | {r['ratio']:.3f} | {a['tau_to_match_dflash'][label]:.2f} |")
        lines += ["", "Draft components (ms): " + "; ".join(
            f"{label}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["components_ms"].items())
            for label, r in a["methods"].items()), "",
            "Predicted speedup: " + ", ".join(f"{k} {v:.2f}x" for k, v in a["predicted_speedup"].items()), ""]
    lines += [f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def plot(report: dict):
    devs = list(report["analysis"])
    fig, axes = new_figure(1, len(devs), figsize=(6 * len(devs), 4.5))
    axes = axes if len(devs) > 1 else [axes]
    for ax, dev in zip(axes, devs):
        a = report["analysis"][dev]
        labels = list(a["methods"])
        bottom = [0.0] * len(labels)
        names = list(dict.fromkeys(k for r in a["methods"].values() for k in r["components_ms"]))
        for name in names + ["verify"]:
            v = [(a["methods"][m]["t_verify_ms"] if name == "verify" else a["methods"][m]["components_ms"].get(name, 0.0))
                 for m in labels]
            ax.bar(labels, v, bottom=bottom, label=name)
            bottom = [b + x for b, x in zip(bottom, v)]
        ax.axhline(a["t_ar_ms"], color="k", linestyle=":", label="one AR step")
        ax.set_ylabel("predicted ms per iteration")
        ax.set_title(f"{report['device_profiles'][dev]['name']}: draft parts and verify (roofline)")
        ax.legend(fontsize=7)
    return fig


def run_methods(args) -> dict:
    """``roofline --family``: JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    for name in ("context", "batch", "drafter_layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    name, target, dflash = dense.load_pair(args)
    if args.block_size:
        dflash = dataclasses.replace(dflash, block_size=args.block_size)
    if dflash.block_size < 3:
        raise ValueError(f"--block-size {dflash.block_size}: the family's drafters need a block of at least 3")
    devices = list(METHODS_DEVICES) if list(args.devices) == list(DEVICES) else list(args.devices)
    report = {
        "benchmark": "roofline_methods",
        "command": command_line("dflash_jax", invocation(args)),
        "pair": {"name": name, "target": target.to_hf_dict(), "dflash": dflash.to_hf_dict()},
        "settings": {"context": args.context, "batch": args.batch, "dtype": args.dtype, "devices": devices},
        "published": PUBLISHED,
        "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
        "analysis": analyse(target, dflash, args.context, devices, batch=args.batch,
                            weight_bytes=dense.DTYPE_BYTES[args.dtype]),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return publish_report(report, args.out, f"methods_{name}_S{args.context}_b{args.batch}", plot, markdown)
