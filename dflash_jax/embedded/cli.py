"""Commands that build the embedded default: ``build-corpus``, ``pretrain``, ``export-target``."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from dflash_jax.bench.env import command_line
from dflash_jax.cli import command_parser


def build_corpus(argv):
    from dflash_jax.embedded.corpus import build_corpus as build, check_training_data

    p = command_parser("build-corpus", "Build the embedded model's corpus and byte-level BPE tokenizer.")
    p.add_argument("--out", required=True, help="corpus directory to write")
    _data_dir_argument(p)
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per packed training row")
    args = p.parse_args(argv)
    check_training_data(args.data_dir)
    if not 1024 <= args.vocab_size <= 65535:
        raise ValueError("--vocab-size must be within 1024..65535 (tokens are stored as uint16)")
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2 (a row predicts its next tokens), got {args.seq_len}")
    meta = build(args.out, args.data_dir, args.vocab_size, args.seq_len)
    print(json.dumps({k: meta[k] for k in ("vocab_size", "train", "heldout")}, indent=2))


def pretrain(argv):
    from dflash_jax.embedded.pretrain import MODEL_PRESETS, PretrainConfig, Pretrainer

    p = command_parser("pretrain", "Pretrain the embedded target on a build-corpus corpus (resumable).")
    p.add_argument("--corpus", required=True, help="directory written by build-corpus")
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), default="cpu", help="model size")
    for f in dataclasses.fields(PretrainConfig):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"PretrainConfig.{f.name}")
    p.add_argument("--stop-after", type=int, help="stop after this many more steps (resume later)")
    p.add_argument("--max-minutes", type=float, help="stop (on a checkpoint) after this much time")
    args = p.parse_args(argv)
    pcfg = PretrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConfig)})
    Pretrainer(args.corpus, args.run, args.preset, pcfg).run(args.stop_after, args.max_minutes)


def export_target(argv):
    from dflash_jax.embedded.pretrain import export_target as export

    p = command_parser("export-target", "Write a pretraining run's target as a Hugging Face directory.")
    p.add_argument("--corpus", required=True, help="directory written by build-corpus")
    p.add_argument("--run", required=True, help="pretraining run directory")
    p.add_argument("--out", required=True, help="Hugging Face directory to write")
    args = p.parse_args(argv)
    facts = export(args.run, args.corpus, args.out, command=command_line("dflash_jax", None))
    print(json.dumps({k: facts[k] for k in ("parameters", "steps", "tokens_seen", "heldout_loss")}),
          file=sys.stderr)


def training_prompts(argv):
    from dflash_jax.embedded.corpus import check_training_data, training_prompts as make

    p = command_parser("embedded-prompts", "Write the embedded drafter's training prompts (jsonl).")
    p.add_argument("--out", required=True, help="jsonl file to write")
    p.add_argument("--num", type=int, default=4000, help="number of prompts")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    _data_dir_argument(p)
    args = p.parse_args(argv)
    data_dir = check_training_data(args.data_dir)
    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    rows = make(data_dir, args.num, args.seed)
    if len(rows) < args.num:
        raise ValueError(f"--num {args.num}: the training data in {data_dir} and the standard library "
                         f"give only {len(rows)} prompts; ask for {len(rows)} or fewer")
    with open(args.out + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r}) + "\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {len(rows)} prompts to {args.out}")


def _data_dir_argument(p) -> None:
    from dflash_jax.bench.prompt_sets import default_data_dir

    p.add_argument("--data-dir", default=default_data_dir(),
                   help="training data (DIR/gsm8k/train.jsonl, DIR/mbpp/sanitized-mbpp.json); default "
                        "$DFLASH_DATA_DIR, else ../shared/datasets beside the checkout")
