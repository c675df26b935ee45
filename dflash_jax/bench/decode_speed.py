"""Autoregressive decode speed of a random-weight target: ms/token, tokens/s, and the fraction
of memory bandwidth reached (bytes of weights + KV read per step / step time / measured copy
bandwidth, all from the same run).

    python -m dflash_jax.bench.decode_speed --preset small            # CPU-sized
    python -m dflash_jax.bench.decode_speed --preset qwen3-8b --dtype bfloat16 --batch 1
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax.numpy as jnp
import numpy as np

from dflash_jax import targets
from dflash_jax.progress import Bar, progress
from dflash_jax.config import TargetConfig
from dflash_jax.decoding.generation import generate
from dflash_jax.models.handles import Target
from dflash_jax.bench.env import add_preset_argument, copy_bandwidth, read_bandwidth
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.reporting import command_line, environment, new_figure, write_report

PRESETS = {
    # a smoke-test size
    "tiny": dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                 num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=512),
    # a 33M-parameter Qwen3 whose fp32 weights (134 MB) are far larger than CPU caches
    "small": dict(model_type="qwen3", vocab_size=8192, hidden_size=512, intermediate_size=1536,
                  num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
                  max_position_embeddings=4096),
    # Qwen3-8B's shapes (8.2B parameters)
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                     head_dim=128, max_position_embeddings=40960),
}


def weight_and_kv_bytes(target: TargetConfig, batch: int, kv_len: float, itemsize: int) -> dict:
    """Bytes an AR decode step must read: ``{"weights", "kv"}`` (every weight once but the
    untied embedding table, of which it gathers one row; the decode state of ``kv_len``
    positions per row), by the target family's size model; what ``decode_speed`` divides by
    the step time."""
    family = targets.family_of(target)
    table = 0 if target.tie_word_embeddings else target.vocab_size * target.hidden_size
    return {"weights": int((family.num_params(target) - table) * itemsize),
            "kv": int(batch * kv_len * family.state_bytes_per_token(target, itemsize))}


def step_bytes(cfg: TargetConfig, params, batch: int, kv_len: float) -> dict:
    """Bytes a decode step must read: every weight once (the LM head in full; the input
    embedding table is only gathered), plus the decode state of ``kv_len`` positions per row,
    in the params' dtype (:func:`weight_and_kv_bytes`)."""
    itemsize = jnp.dtype(params["embed_tokens"]["embedding"].dtype).itemsize
    return weight_and_kv_bytes(cfg, batch, kv_len, itemsize)


def measure(cfg: TargetConfig, batches, prompt_len: int, new_tokens: int, dtype, repeats: int,
            seed: int = 0) -> dict:
    """The decode benchmark of a random-weight target of config ``cfg`` at each batch size."""
    target = Target.random(cfg, seed=seed, dtype=dtype, max_len=prompt_len + new_tokens + 64)
    bandwidth = copy_bandwidth()
    read_bw = read_bandwidth()
    rng = np.random.default_rng(seed)
    rows = []
    for batch in progress(batches, desc="batch sizes"):
        prompts = rng.integers(0, cfg.vocab_size, size=(batch, prompt_len)).tolist()
        generate(target, prompts, new_tokens)  # compile + warm-up
        best = None
        for _ in range(repeats):
            r = generate(target, prompts, new_tokens)
            if best is None or r.decode_time_s < best.decode_time_s:
                best = r
        step_s = best.decode_time_s / best.num_steps
        nbytes = step_bytes(cfg, target.params, batch, prompt_len + new_tokens / 2)
        moved = nbytes["weights"] + nbytes["kv"]
        rows.append({
            "batch": batch,
            "prefill_ms": 1e3 * best.prefill_time_s,
            "decode_steps": best.num_steps,
            "ms_per_step": 1e3 * step_s,
            "tokens_per_s": batch / step_s,
            "bytes_per_step": nbytes,
            "achieved_GBps": moved / step_s / 1e9,
            "bandwidth_fraction": moved / step_s / bandwidth,
            "read_bandwidth_fraction": moved / step_s / read_bw,
        })
        Bar.write(f"batch {batch:3d}: {rows[-1]['ms_per_step']:.2f} ms/step, "
                   f"{rows[-1]['tokens_per_s']:.1f} tok/s, "
                   f"{100 * rows[-1]['bandwidth_fraction']:.1f}% of copy bandwidth, "
                   f"{100 * rows[-1]['read_bandwidth_fraction']:.1f}% of read bandwidth")
    return {
        "benchmark": "decode_speed",
        "config": cfg.to_hf_dict(),
        "num_params": cfg.num_params(),
        "dtype": jnp.dtype(dtype).name,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "read_bandwidth_GBps": read_bw / 1e9,
        "results": rows,
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def plot(report: dict):
    rows = report["results"]
    fig, (a, b) = new_figure(1, 2, figsize=(9, 3.5))
    bs = [r["batch"] for r in rows]
    a.plot(bs, [r["tokens_per_s"] for r in rows], "o-")
    a.set(xscale="log", xlabel="batch", ylabel="tokens / s", title="AR decode throughput")
    b.plot(bs, [100 * r["bandwidth_fraction"] for r in rows], "o-", label="of copy bandwidth")
    b.plot(bs, [100 * r["read_bandwidth_fraction"] for r in rows], "s--", label="of read bandwidth")
    b.legend()
    b.set(xscale="log", xlabel="batch", ylabel="% of measured bandwidth",
          title=f"{report['env']['device']}")
    fig.suptitle(f"{report['num_params'] / 1e6:.0f}M params, {report['dtype']}, "
                 f"prompt {report['prompt_len']}, {report['new_tokens']} new tokens")
    return fig


def add_arguments(p) -> None:
    add_preset_argument(p, PRESETS)
    p.add_argument("--config", help="a Hugging Face config.json (overrides --preset)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16],
                   help="batch sizes (sequences decoded together) to time")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (random ids) per sequence")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence in a timed run")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute dtype of the random-weight target")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs after a compiling one, the fastest reported")
    p.add_argument("--out", default="runs/decode_speed", help="output directory")


def run(args) -> dict:
    if args.config:
        with open(args.config) as f:
            cfg = TargetConfig.from_hf_dict(json.load(f))
        name = os.path.basename(os.path.dirname(os.path.abspath(args.config))) or "config"
    else:
        cfg = TargetConfig(**PRESETS[args.preset])
        name = args.preset
    report = measure(cfg, args.batch, args.prompt_len, args.new_tokens, jnp.dtype(args.dtype), args.repeats)
    report["command"] = command_line("dflash_jax", invocation(args))
    write_report(report, args.out, f"{name}_{report['env']['platform']}_{args.dtype}", plot)
    return report


def main(argv=None) -> dict:
    return command_main("decode-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
