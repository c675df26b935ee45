"""A hybrid (Gated DeltaNet) target against a dense target of the same size on this machine:
prefill and decode time per token, same run.

    python -m dflash_jax hybrid-speed --out results/hybrid                  # the small preset
    python -m dflash_jax hybrid-speed --preset tiny --prompt-len 16 --new-tokens 8 \\
        --repeats 1 --out runs/hybrid_speed                                 # smoke size

The hybrid target is a random ``qwen3_5_text`` model (:data:`PRESETS`: three GDN layers to one
gated attention layer); the dense one a random ``qwen3`` model with the same hidden size,
layers, vocabulary, MLP width and attention heads (:func:`dense_twin`). Both decode the same
random prompts greedily with ``generation.generate`` (float32): prefill seconds per prompt
token and decode seconds per generated token (decode time / steps / batch). After one
compiling run each, ``--repeats`` runs alternate between the two models (so a change of the
machine's load hits both); the report gives the median and spread (min..max) of each and the
ratios hybrid / dense.

Recorded beside: the machine (CPU model, family, vector extensions; load averages before and
after, with ``reporting.busy_warning``), the parameter counts (the families' size models),
versions, the command. Writes ``hybrid_speed_<preset>.json``, ``.md`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.progress import progress
from dflash_jax.reporting import (command_line, environment, machine_fields, machine_sentence,
                                  new_figure, publish_report, start_measurement)
from dflash_jax.tools.gdn_rollback import TINY_HYBRID

PRESETS = {
    "tiny": TINY_HYBRID,
    # a 20M-parameter hybrid: D 512, 8 layers (6 GDN, 2 attention), GDN heads 4 key / 8 value
    # of 64, attention 8 / 4 heads of 64, vocab 8192 (decode_speed's "small" widths)
    "small": {**TINY_HYBRID, "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536,
              "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 64, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
              "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
              "linear_value_head_dim": 64, "max_position_embeddings": 4096},
}
"""``config.json`` dicts of the random hybrid targets."""


def dense_twin(cfg):
    """A ``qwen3`` TargetConfig with ``cfg``'s vocabulary, hidden size, MLP width, layers and
    attention heads."""
    from dflash_jax.config import TargetConfig

    return TargetConfig(model_type="qwen3", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                        intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers,
                        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        max_position_embeddings=cfg.max_position_embeddings)


def _params(cfg) -> int:
    from dflash_jax import targets

    return int(targets.family_of(cfg).num_params(cfg))


def measure(hybrid_cfg, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int = 0) -> dict:
    """{"hybrid": {...}, "dense": {...}}: per model the prefill ms per prompt token and decode
    ms per generated token of every run, median and spread."""
    from dflash_jax.decoding.generation import generate
    from dflash_jax.models.handles import Target

    cfgs = {"hybrid": hybrid_cfg, "dense": dense_twin(hybrid_cfg)}
    models = {k: Target.random(c, seed=seed + 1, dtype=jnp.float32, max_len=prompt_len + new_tokens + 64)
              for k, c in cfgs.items()}
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, hybrid_cfg.vocab_size, size=(batch, prompt_len)).tolist()
    runs = {k: [] for k in cfgs}
    for k, m in models.items():  # compile
        generate(m, prompts, new_tokens)
    for _ in progress(range(repeats), desc="runs (hybrid, dense)", unit="run"):
        for k, m in models.items():
            runs[k].append(generate(m, prompts, new_tokens))
    out = {}
    for k, rs in runs.items():
        pre = [1e3 * r.prefill_time_s / (batch * prompt_len) for r in rs]
        dec = [1e3 * r.decode_time_s / r.num_steps / batch for r in rs]
        out[k] = {"config": cfgs[k].to_hf_dict(), "params": _params(cfgs[k]),
                  "prefill_ms_per_token": _spread(pre), "decode_ms_per_token": _spread(dec),
                  "decode_steps": rs[0].num_steps}
    out["ratio"] = {f: out["hybrid"][f]["median"] / out["dense"][f]["median"]
                    for f in ("prefill_ms_per_token", "decode_ms_per_token")}
    return out


def _spread(xs: list[float]) -> dict:
    return {"runs": xs, "median": float(np.median(xs)), "min": min(xs), "max": max(xs)}


def markdown(report: dict) -> str:
    s, r = report["settings"], report["results"]
    h = r["hybrid"]["config"]
    lines = [f"`{report['command']}`", "",
             f"Random `{h['model_type']}` target `{s['preset']}` (D {h['hidden_size']}, "
             f"{h['num_hidden_layers']} layers: {h['layer_types'].count('linear_attention')} GDN, "
             f"{h['layer_types'].count('full_attention')} attention; vocab {h['vocab_size']}) against a "
             "random `qwen3` target of the same hidden size, layers, vocabulary, MLP and attention "
             f"heads; float32 on {report['env']['device']}, batch {s['batch']}, prompt {s['prompt_len']}, "
             f"{s['new_tokens']} new tokens, greedy; {s['repeats']} runs alternating between the "
             "two after a compiling one (median, min..max).", "",
             machine_sentence(report), "",
             "| model | params | prefill ms / token | spread | decode ms / token | spread |",
             "|---|---|---|---|---|---|"]
    for k in ("hybrid", "dense"):
        p, d = r[k]["prefill_ms_per_token"], r[k]["decode_ms_per_token"]
        lines.append(f"| {k} | {r[k]['params'] / 1e6:.2f}M | {p['median']:.4f} | {p['min']:.4f}..{p['max']:.4f} | "
                     f"{d['median']:.3f} | {d['min']:.3f}..{d['max']:.3f} |")
    lines += ["", f"Hybrid / dense: prefill {r['ratio']['prefill_ms_per_token']:.2f}x, decode "
              f"{r['ratio']['decode_ms_per_token']:.2f}x per token."]
    return "\n".join(lines) + "\n"


def plot(report: dict):
    fig, axes = new_figure(1, 2, figsize=(9, 3.6))
    for ax, f, title in zip(axes, ("prefill_ms_per_token", "decode_ms_per_token"), ("prefill", "decode")):
        r = report["results"]
        for i, k in enumerate(("hybrid", "dense")):
            v = r[k][f]
            ax.bar(i, v["median"], color=f"C{i}")
            ax.plot([i] * len(v["runs"]), v["runs"], "k.", ms=4)
        ax.set_xticks([0, 1], ["hybrid (GDN)", "dense (qwen3)"])
        ax.set(ylabel="ms per token (median; dots: runs)", title=title)
    fig.suptitle(f"{report['settings']['preset']} hybrid vs dense, float32, {report['env']['device']}")
    return fig


def add_arguments(p) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model shape of the random hybrid target")
    p.add_argument("--batch", type=int, default=1, help="batch size (sequences decoded together)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (random ids) per sequence")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each model (median and spread)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts")
    p.add_argument("--out", default="runs/hybrid_speed", help="output directory")


def run(args) -> dict:
    for name in ("batch", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from dflash_jax.config import TargetConfig

    load_before, cpu, warning = start_measurement()
    cfg = TargetConfig.from_hf_dict(dict(PRESETS[args.preset]))
    with jax.default_matmul_precision("highest"):
        results = measure(cfg, args.batch, args.prompt_len, args.new_tokens, args.repeats, args.seed)
    report = {"benchmark": "hybrid_speed", "command": command_line("dflash_jax", invocation(args)),
              "settings": {"preset": args.preset, "batch": args.batch, "prompt_len": args.prompt_len,
                           "new_tokens": args.new_tokens, "repeats": args.repeats, "seed": args.seed},
              "results": results,
              "machine": machine_fields(cpu, load_before, warning),
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, args.out, f"hybrid_speed_{args.preset}", plot, markdown)


def main(argv=None) -> dict:
    return command_main("hybrid-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
