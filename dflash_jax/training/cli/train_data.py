"""Regenerate responses to prompts with the target: token shards for training a drafter. It
ends with what it wrote (the directory, sequences, tokens, shards) and the train command that
reads it."""

from __future__ import annotations

import os
import shlex
import sys

from dflash_jax import quantization
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
    quantization.add_argument(p)


def run(args) -> dict:
    import jax.numpy as jnp


    target = load_target(args.target, dtype=jnp.dtype(args.dtype) if args.dtype else None, max_len=args.max_len,
                         quantize=args.quantize)
    prompts = [q for f in args.prompts for q in read_prompt_file(f)][:args.max_prompts]
    meta = regenerate(target, prompts, args.out, max_new_tokens=args.max_new_tokens, max_len=args.max_len,
                      batch_size=args.batch_size, shard_size=args.shard_size, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, source=",".join(args.prompts),
                      enable_thinking=args.thinking)
    print("\n".join(closing_lines(args, meta, has_mask_token=_mask_token(target) is not None)), flush=True)
    return meta


def _mask_token(target) -> int | None:
    tok = target.tokenizer
    return getattr(tok, "mask_token_id", None) if tok is not None else None


def closing_lines(args, meta: dict, has_mask_token: bool = True) -> list[str]:
    """What ``train-data`` prints when it has written ``args.out`` (``meta``: its metadata.json):
    the directory, the sequences and tokens, the shards, and the ``train`` command that reads it
    (this target and compute dtype; a run directory beside the data; ``--mask-token-id`` named
    when the target's tokenizer has no mask token, which train then needs)."""
    out = args.out.rstrip("/\\") or args.out
    shards = meta["num_shards"]
    train = ["python", "-m", "dflash_jax", "train", "--target", args.target, "--data", out, "--run", f"{out}-run"]
    if args.dtype:
        train += ["--target-dtype", args.dtype]
    if getattr(args, "quantize", None):
        train += ["--quantize", args.quantize]
    lines = [f"wrote {out}: {meta['sequences']:,} sequences, {meta['response_tokens']:,} response tokens "
             f"({meta['stopped']:,} responses ended at a stop token) in {shards} shard{'s' if shards != 1 else ''} "
             f"(shard-*.npz, up to {args.shard_size} sequences of {args.max_len} tokens each) and "
             f"{os.path.join(out, 'metadata.json')}",
             "next: train a drafter on it (train --help: the drafter's size, the steps, a held-out evaluation "
             "with --eval-prompts and --eval-every):",
             "  " + shlex.join(train)]
    if not has_mask_token:
        lines.append("  (the target's tokenizer has no mask token: add --mask-token-id ID, a row of its "
                     "embedding that is not pad or eos)")
    return lines


def main(argv=None):
    return command_main("train-data", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
