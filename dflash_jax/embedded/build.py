"""The whole embedded-default recipe in one resumable command:

    python -m dflash_jax build-embedded --work runs/embedded --assets dflash_jax/assets

corpus + tokenizer -> pretrain the target -> export it (bf16, Hugging Face layout) -> training
prompts -> target-regenerated responses -> train the drafter -> export it (released layout)
-> ``bench`` -> model cards. Every stage skips work that is already done (the two training
stages resume from their last Orbax checkpoint), so the command can be rerun after a kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys


def _run(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "dflash_jax", *args]
    print("+ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dflash_jax build-embedded", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="runs/embedded", help="working directory (corpus, runs, data)")
    p.add_argument("--assets", default=os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets"))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--preset", default="cpu", choices=["cpu", "gpu", "tiny"])
    p.add_argument("--target-steps", type=int, default=1200)
    p.add_argument("--num-prompts", type=int, default=4000)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--drafter-layers", type=int, default=1)
    p.add_argument("--taps", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--drafter-steps", type=int, default=2200)
    p.add_argument("--drafter-batch", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=32)
    p.add_argument("--drafter-lr", type=float, default=1e-3)
    p.add_argument("--bench-args", default="", help="extra arguments for the final bench run")
    a = p.parse_args(argv)
    w = os.path.abspath(a.work)
    data = ["--data-dir", a.data_dir] if a.data_dir else []
    os.makedirs(w, exist_ok=True)
    corpus, trun = os.path.join(w, "corpus"), os.path.join(w, "target-run")
    target, drafter = os.path.join(a.assets, "target"), os.path.join(a.assets, "drafter")
    if not os.path.exists(os.path.join(corpus, "corpus.json")):
        _run(["build-corpus", "--out", corpus, *data])
    _run(["pretrain", "--corpus", corpus, "--run", trun, "--preset", a.preset, "--steps", str(a.target_steps)])
    _run(["export-target", "--corpus", corpus, "--run", trun, "--out", target])
    prompts = os.path.join(w, "prompts.jsonl")
    if not os.path.exists(prompts):
        _run(["embedded-prompts", "--out", prompts, "--num", str(a.num_prompts), *data])
    regen = os.path.join(w, "drafter-data")
    _run(["train-data", "--target", target, "--prompts", prompts, "--out", regen, "--dtype", "float32",
          "--max-new-tokens", str(a.max_new_tokens), "--max-len", "512", "--batch-size", "32"])
    drun = os.path.join(w, "drafter-run")
    recipe = {"num_prompts": a.num_prompts, "max_new_tokens": a.max_new_tokens, "steps": a.drafter_steps,
              "batch_size": a.drafter_batch, "num_anchors": a.num_anchors, "learning_rate": a.drafter_lr,
              "gamma": 7.0, "commands": f"`python -m dflash_jax build-embedded {' '.join(argv or sys.argv[2:])}`"}
    _run(["train", "--target", target, "--data", regen, "--run", drun, "--dtype", "float32",
          "--drafter-layers", str(a.drafter_layers), "--block-size", "16", "--taps", *map(str, a.taps),
          "--steps", str(a.drafter_steps), "--batch-size", str(a.drafter_batch),
          "--num-anchors", str(a.num_anchors), "--learning-rate", str(a.drafter_lr),
          "--checkpoint-every", "50", "--eval-prompts", "16", "--eval-every", "200"])
    _run(["export", "--run", drun, "--out", drafter, "--dtype", "bfloat16"])
    shutil.copy(os.path.join(drun, "metrics.jsonl"), os.path.join(drafter, "training_metrics.jsonl"))
    with open(os.path.join(drafter, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=2)
    bench_out = os.path.join(w, "bench")
    _run(["bench", "--target", target, "--drafter", drafter, "--out", bench_out, *data, *a.bench_args.split()])
    from dflash_jax.embedded.cards import write_cards

    write_cards(a.assets, recipe, os.path.join(bench_out, "bench.json"))
    print(f"embedded default written to {a.assets}")


if __name__ == "__main__":
    main()
