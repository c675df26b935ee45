"""Regenerate responses to prompts with the target: token shards for training a drafter."""

from __future__ import annotations

import sys

from dflash_jax.cli import command_main, run_cli
from dflash_jax.hub import CHECKPOINT_HELP
from dflash_jax.models.handles import load_target
from dflash_jax.training.data import read_prompt_file, regenerate


def add_arguments(p) -> None:
    p.add_argument("--target", required=True, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--prompts", required=True, nargs="+", help="jsonl prompt files")
    p.add_argument("--out", required=True, help="data directory to write (resumed when it exists)")
    p.add_argument("--max-prompts", type=int, help="use the first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="tokens generated per prompt at most: the response (fewer at a stop token)")
    p.add_argument("--max-len", type=int, default=1024,
                   help="KV cache length: tokens per sequence, prompt included")
    p.add_argument("--batch-size", type=int, default=16,
                   help="prompts per generate call (regenerated together)")
    p.add_argument("--shard-size", type=int, default=256, help="sequences per shard file")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (default: no threshold)")
    p.add_argument("--seed", type=int, default=0, help="random seed of sampling (with --temperature > 0)")
    p.add_argument("--thinking", action="store_true",
                   help="render text prompts with the chat template's thinking switch on (Qwen3's "
                        "enable_thinking=True); default off, as the DFlash reference (train and use a "
                        "drafter in the same mode); recorded in metadata.json")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="compute dtype of the target (default: the checkpoint's)")


def run(args) -> dict:
    import jax.numpy as jnp


    target = load_target(args.target, dtype=jnp.dtype(args.dtype) if args.dtype else None, max_len=args.max_len)
    prompts = [q for f in args.prompts for q in read_prompt_file(f)][:args.max_prompts]
    meta = regenerate(target, prompts, args.out, max_new_tokens=args.max_new_tokens, max_len=args.max_len,
                      batch_size=args.batch_size, shard_size=args.shard_size, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, source=",".join(args.prompts),
                      enable_thinking=args.thinking)
    print(f"{meta['sequences']} sequences, {meta['response_tokens']} response tokens in {args.out}")
    return meta


def main(argv=None):
    return command_main("train-data", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
