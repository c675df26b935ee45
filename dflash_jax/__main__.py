"""Command line: ``python -m dflash_jax <command>``.

  bench          AR vs DFlash on the paper's prompt sets (default: the embedded model)
  generate       generate from a Hugging Face target directory (text or token ids)
  decode-speed   autoregressive decode benchmark on a random-weight target
  spec-speed     DFlash vs autoregressive: ms/iteration, draft/verify times, tau, speedup
  train-data     regenerate responses to prompt files with the target (token shards)
  features       write offline target features for a data directory
  train          train a DFlash drafter (optax + Orbax, resumable)
  export         write a training run's drafter in the released layout
  train-speed    drafter training throughput benchmark
  build-corpus   the embedded model's offline corpus and BPE tokenizer
  pretrain       pretrain the embedded target on that corpus (resumable)
  export-target  write a pretraining run as a Hugging Face directory
  embedded-prompts  the embedded drafter's training prompts (jsonl)
  build-embedded the whole embedded-default recipe (resumable)
"""

from __future__ import annotations

import argparse
import sys


def _generate(argv):
    p = argparse.ArgumentParser(prog="python -m dflash_jax generate")
    p.add_argument("--target", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text (needs a tokenizer in the directory) or comma-separated ids; repeatable")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    args = p.parse_args(argv)
    import jax.numpy as jnp

    from dflash_jax import generate, load_target

    target = load_target(args.target, dtype=jnp.dtype(args.dtype) if args.dtype else None)
    tok = target.tokenizer
    prompts = []
    for text in args.prompt:
        if all(part.strip().isdigit() for part in text.split(",")):
            prompts.append([int(x) for x in text.split(",")])
        elif tok is None:
            p.error(f"{args.target} has no tokenizer: pass prompts as comma-separated token ids")
        else:
            prompts.append(tok.encode(text))
    stops = list(target.config.eos_token_id)
    r = generate(target, prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                 top_p=args.top_p, stop_token_ids=stops, seed=args.seed)
    for seq in r.sequences:
        print(tok.decode(seq) if tok is not None else ",".join(map(str, seq)))
    print(f"[prefill {1e3 * r.prefill_time_s:.1f} ms, decode {1e3 * r.decode_time_s:.1f} ms "
          f"for {r.num_steps} steps]", file=sys.stderr)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from dflash_jax.embedded import cli as embedded_cli
    from dflash_jax.training import cli as training_cli

    commands = {"generate": _generate, "train-data": training_cli.train_data,
                "features": training_cli.features, "train": training_cli.train,
                "export": training_cli.export, "build-corpus": embedded_cli.build_corpus,
                "pretrain": embedded_cli.pretrain, "export-target": embedded_cli.export_target,
                "embedded-prompts": embedded_cli.training_prompts}
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "build-embedded":
        from dflash_jax.embedded.build import main as build_embedded

        build_embedded(rest)
    elif cmd == "bench":
        from dflash_jax.bench.harness import main as bench

        bench(rest)
    elif cmd == "decode-speed":
        from dflash_jax.bench.decode_speed import main as decode_speed

        decode_speed(rest)
    elif cmd == "train-speed":
        from dflash_jax.bench.train_speed import main as train_speed

        train_speed(rest)
    elif cmd == "spec-speed":
        from dflash_jax.bench.spec_speed import main as spec_speed

        spec_speed(rest)
    elif cmd in commands:
        commands[cmd](rest)
    else:
        print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
