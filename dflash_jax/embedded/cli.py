"""Commands that build the embedded default: ``build-corpus``, ``pretrain``, ``export-target``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dflash_jax.bench.env import command_line


def build_corpus(argv):
    from dflash_jax.bench.prompt_sets import default_data_dir
    from dflash_jax.embedded.corpus import build_corpus as build

    p = argparse.ArgumentParser(prog="python -m dflash_jax build-corpus")
    p.add_argument("--out", required=True, help="corpus directory to write")
    p.add_argument("--data-dir", default=default_data_dir(),
                   help="offline datasets (gsm8k/, mbpp/); default $DFLASH_DATA_DIR or ../shared/datasets")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=256)
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("no --data-dir given, DFLASH_DATA_DIR unset and ../shared/datasets missing")
    if not 1024 <= args.vocab_size <= 65535:
        p.error("--vocab-size must be within 1024..65535 (tokens are stored as uint16)")
    meta = build(args.out, args.data_dir, args.vocab_size, args.seq_len)
    print(json.dumps({k: meta[k] for k in ("vocab_size", "train", "heldout")}, indent=2))


def pretrain(argv):
    from dflash_jax.embedded.pretrain import MODEL_PRESETS, PretrainConfig, Pretrainer

    p = argparse.ArgumentParser(prog="python -m dflash_jax pretrain")
    p.add_argument("--corpus", required=True, help="directory written by build-corpus")
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), default="cpu")
    for f in dataclasses.fields(PretrainConfig):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--stop-after", type=int, help="stop after this many more steps (resume later)")
    p.add_argument("--max-minutes", type=float, help="stop (on a checkpoint) after this much time")
    args = p.parse_args(argv)
    pcfg = PretrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConfig)})
    Pretrainer(args.corpus, args.run, args.preset, pcfg).run(args.stop_after, args.max_minutes)


def export_target(argv):
    from dflash_jax.embedded.pretrain import export_target as export

    p = argparse.ArgumentParser(prog="python -m dflash_jax export-target")
    p.add_argument("--corpus", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--out", required=True, help="Hugging Face directory to write")
    args = p.parse_args(argv)
    facts = export(args.run, args.corpus, args.out, command=command_line("dflash_jax", None))
    print(json.dumps({k: facts[k] for k in ("parameters", "steps", "tokens_seen", "heldout_loss")}),
          file=sys.stderr)


def training_prompts(argv):
    from dflash_jax.bench.prompt_sets import default_data_dir
    from dflash_jax.embedded.corpus import training_prompts as make

    p = argparse.ArgumentParser(prog="python -m dflash_jax embedded-prompts",
                                description="Write the embedded drafter's training prompts (jsonl).")
    p.add_argument("--out", required=True)
    p.add_argument("--num", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=default_data_dir())
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("no --data-dir given, DFLASH_DATA_DIR unset and ../shared/datasets missing")
    rows = make(args.data_dir, args.num, args.seed)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r}) + "\n")
    print(f"wrote {len(rows)} prompts to {args.out}")
