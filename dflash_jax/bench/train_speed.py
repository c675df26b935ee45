"""Drafter training throughput: tokens/s (sequence tokens through the frozen target and the
drafter, forward + backward + AdamW) for a random-weight target and synthetic sequences.

    python -m dflash_jax.bench.train_speed --preset small
    python -m dflash_jax.bench.train_speed --preset qwen3-8b --dtype bfloat16 --seq-len 3072 --batch 1
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import jax.numpy as jnp
import numpy as np

from dflash_jax.bench.decode_speed import PRESETS
from dflash_jax.bench.env import add_preset_argument
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.models.handles import Target
from dflash_jax.reporting import command_line, environment, new_figure, write_report
from dflash_jax.training.data import TokenDataset, pack_rows, shard_path, write_npz_atomic
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.training.trainer import TrainConfig


def plot(report: dict):
    t = report["step_times_s"]
    fig, ax = new_figure(figsize=(5, 3.2))
    ax.plot(range(1, len(t) + 1), t, ".-")
    ax.set(xlabel="step", ylabel="seconds", yscale="log",
           title=f"{report['tokens_per_s']:.0f} tokens/s on {report['env']['device']}")
    return fig


def add_arguments(p) -> None:
    add_preset_argument(p, PRESETS)
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the random drafter")
    p.add_argument("--block-size", type=int, default=16, help="block size of the drafter")
    p.add_argument("--seq-len", type=int, default=256,
                   help="tokens per training sequence (a quarter of them prompt)")
    p.add_argument("--batch", type=int, default=4, help="batch size: training sequences per step")
    p.add_argument("--num-anchors", type=int, default=64, help="anchors (block starts) per training sequence")
    p.add_argument("--steps", type=int, default=12, help="timed steps (the first, compiling, is excluded)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute dtype of the random-weight target (and of the drafter's training)")
    p.add_argument("--out", default="runs/train_speed", help="output directory")


def run(args) -> dict:
    cfg = TargetConfig(**PRESETS[args.preset])
    target = Target.random(cfg, dtype=jnp.dtype(args.dtype))
    dcfg = DrafterConfig.for_target(cfg, args.drafter_layers, args.block_size, cfg.vocab_size - 1)
    rng = np.random.default_rng(0)
    n = args.batch * (args.steps + 1)
    prompt_len = args.seq_len // 4
    prompts = rng.integers(0, cfg.vocab_size - 1, size=(n, prompt_len)).tolist()
    responses = rng.integers(0, cfg.vocab_size - 1, size=(n, args.seq_len - prompt_len)).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "data"))
        tokens, mask, lengths = pack_rows(prompts, responses, args.seq_len)
        write_npz_atomic(shard_path(os.path.join(tmp, "data"), 0), tokens=tokens, loss_mask=mask,
                         lengths=lengths, stopped=np.array(0))
        tcfg = TrainConfig(steps=args.steps + 1, batch_size=args.batch, num_anchors=args.num_anchors,
                           checkpoint_every=10 ** 9)
        trainer = DFlashTrainer(target, dcfg, TokenDataset(os.path.join(tmp, "data")), os.path.join(tmp, "run"), tcfg)
        t0 = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - t0
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            rows = [json.loads(x) for x in f]
    times = [r["time_s"] for r in rows]
    steady = float(np.median(times[1:]))
    report = {
        "benchmark": "train_speed", "target": cfg.to_hf_dict(), "drafter": dcfg.to_hf_dict(),
        "dtype": args.dtype, "batch": args.batch, "seq_len": args.seq_len,
        "num_anchors": args.num_anchors, "step_times_s": times, "median_step_s": steady,
        "tokens_per_s": args.batch * args.seq_len / steady,
        "block_rows_per_s": args.batch * args.num_anchors * args.block_size / steady,
        "wall_s_including_compile_and_checkpoint": wall, "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command_line("dflash_jax", invocation(args))}
    print(f"median step {steady:.3f} s: {report['tokens_per_s']:.0f} tokens/s, "
          f"{report['block_rows_per_s']:.0f} block rows/s")
    write_report(report, args.out, f"{args.preset}_{report['env']['platform']}_{args.dtype}_"
                 f"b{args.batch}_L{args.seq_len}", plot)
    return report


def main(argv=None) -> dict:
    return command_main("train-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
