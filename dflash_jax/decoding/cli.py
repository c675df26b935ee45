"""Generate continuations of text prompts (or token ids) with a target, autoregressively or
with a DFlash drafter (``python -m dflash_jax generate``)."""

from __future__ import annotations

import sys

from dflash_jax.cli import check_minimum, check_sampling_options, command_main, run_cli, status
from dflash_jax.parallel import cli as parallel_cli, is_main_process
from dflash_jax.hub import CHECKPOINT_HELP, EMBEDDED
from dflash_jax.models.handles import load_drafter, load_target
from dflash_jax.verification.adaptive import ADAPTIVE, Adaptive, block_size_arg
from dflash_jax.decoding.generation import generate as run_generate
from dflash_jax.decoding import tree_args
from dflash_jax.prompts import encode_prompt
from dflash_jax import quantization


def _parse_token_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--token-ids: {text!r} is not a list of integers (e.g. '12,7,99')") from None
    if not ids:
        raise ValueError("--token-ids: empty prompt")
    return ids


def add_arguments(p) -> None:

    p.add_argument("--target", default=EMBEDDED, metavar="CHECKPOINT",
                   help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--drafter", metavar="CHECKPOINT",
                   help=f"the DFlash drafter (speculative decoding), named the same way, e.g. "
                        f"z-lab/Qwen3-8B-DFlash-b16 with Qwen/Qwen3-8B (default: none, autoregressive)")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeatable")
    p.add_argument("--token-ids", action="store_true",
                   help="read each --prompt as comma- or space-separated token ids instead of text")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to each prompt "
                   "(with Qwen3's thinking switch off, enable_thinking=False, unless --thinking)")
    p.add_argument("--thinking", action="store_true",
                   help="with --chat: render the chat template with its thinking switch on "
                        "(enable_thinking=True; templates without the switch are unaffected)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens generated per prompt at most (fewer at a stop token)")
    p.add_argument("--max-len", type=int, help="KV cache length (default: the model's max_position_embeddings)")
    p.add_argument("--allow-extrapolation", action="store_true",
                   help="allow --max-len above the model's max_position_embeddings")

    p.add_argument("--block-size", type=block_size_arg,
                   help="speculative block size (default: the drafter's); 'adaptive' is deprecated: "
                        "--verify adaptive")
    p.add_argument("--verify-per-row", action="store_true",
                   help="deprecated: --verify adaptive-per-row")
    tree_args.add_arguments(p)
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (default: no threshold)")
    p.add_argument("--seed", type=int, default=0, help="random seed of sampling (with --temperature > 0)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="compute dtype of the target and drafter (default: the checkpoint's)")
    quantization.add_argument(p)
    parallel_cli.add_arguments(p)


def run(args):
    """The command: loads the target (and drafter), prints one continuation per prompt on
    stdout and the statistics on stderr; returns the ``GenerateResult``."""
    if args.thinking and not args.chat:
        raise ValueError("--thinking needs --chat (it is the chat template's thinking switch)")
    tree_args.check(args, has_drafter=args.drafter is not None)  # before anything is loaded
    check_minimum(args, 1, "max_new_tokens", "max_len")
    check_sampling_options(args)
    if args.verify_per_row and args.block_size != ADAPTIVE:
        raise ValueError("--verify-per-row needs --block-size adaptive (it chooses the adaptive length per row)")
    import jax.numpy as jnp


    dtype = jnp.dtype(args.dtype) if args.dtype else None
    mesh = parallel_cli.mesh_from_args(args)
    target = load_target(args.target, dtype=dtype, max_len=args.max_len,
                         allow_extrapolation=args.allow_extrapolation, mesh=mesh, quantize=args.quantize)
    drafter = load_drafter(args.drafter, target, dtype=dtype) if args.drafter else None
    if args.block_size is not None and drafter is None:
        raise ValueError("--block-size needs --drafter (autoregressive decoding has block size 1)")
    tok = target.tokenizer
    if tok is None and not args.token_ids:
        raise ValueError(f"{args.target} has no tokenizer: pass --token-ids and prompts as token ids")
    if args.chat and (tok is None or not getattr(tok, "chat_template", None)):
        raise ValueError(f"--chat: the tokenizer in {args.target} has no chat template")
    prompts = []
    for text in args.prompt:
        if args.token_ids:
            prompts.append(_parse_token_ids(text))
        elif args.chat:
            prompts.append(encode_prompt(text, tok, enable_thinking=args.thinking))
        else:
            prompts.append(tok.encode(text))
    status(f"compiling and running {tree_args.label(args) if drafter else 'autoregressive'} generation for "
           f"{len(prompts)} prompt(s) ...")
    adaptive = args.block_size == ADAPTIVE
    verify = Adaptive(per_row=args.verify_per_row) if adaptive else tree_args.policy(args)
    r = run_generate(target, prompts, args.max_new_tokens, drafter=drafter,
                     block_size=None if adaptive else args.block_size, verify=verify,
                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                     stop_token_ids=target.stop_token_ids, seed=args.seed)

    if not is_main_process():  # every process holds the whole result; one prints it
        return r
    for seq in r.sequences:
        print(tok.decode(seq) if tok is not None and not args.token_ids else ",".join(map(str, seq)))
    line = (f"[{sum(r.num_generated)} tokens; prefill {1e3 * r.prefill_time_s:.1f} ms, decode "
            f"{1e3 * r.decode_time_s:.1f} ms for {r.num_steps} steps" + (
                f", the times including compilation ({r.prefill_compile_s + r.decode_compile_s:.1f} s of them)"
                if r.includes_compilation else ", no compilation in these times"))
    if drafter is not None:
        shape = f"tree of {args.tree} nodes" if args.tree else f"block {r.block_size}"
        line += f"; tau {r.tau:.2f} (mean acceptance length, {shape})"

        if args.block_size == ADAPTIVE:
            chosen = [v for row in r.verify_lengths for v in row]
            line += f"; verified {sum(chosen) / max(len(chosen), 1):.1f} rows per iteration on average"
    print(line + "]", file=sys.stderr)
    return r


def main(argv=None):
    return command_main("generate", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
