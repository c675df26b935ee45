"""Build the embedded model's corpus and byte-level BPE tokenizer."""

from __future__ import annotations

import json
import sys

from dflash_jax.cli import command_main, run_cli
from dflash_jax.embedded.cli import add_data_dir_argument
from dflash_jax.embedded.corpus import SOURCES, build_corpus, check_sources, check_training_data


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="corpus directory to write")
    add_data_dir_argument(p)
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per packed training row")
    p.add_argument("--sources", nargs="+", default=None, metavar="SOURCE",
                   help=f"document sources to pack: {', '.join(SOURCES)} (default all)")
    p.add_argument("--tokenizer", default=None, metavar="TARGET",
                   help="the target (a checkpoint directory or 'embedded') whose tokenizer tokenizes the corpus, "
                        "instead of one trained on it: the corpus for fine-tuning that target with pretrain "
                        "--init-from")


def run(args) -> dict:

    data_dir = check_training_data(args.data_dir)
    sources = check_sources(args.sources)
    tokenizer_dir = None
    if args.tokenizer is not None:
        from dflash_jax.hub import resolve_checkpoint

        tokenizer_dir = str(resolve_checkpoint(args.tokenizer))
    elif not 1024 <= args.vocab_size <= 65535:
        raise ValueError("--vocab-size must be within 1024..65535 (tokens are stored as uint16)")
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2 (a row predicts its next tokens), got {args.seq_len}")
    meta = build_corpus(args.out, data_dir, args.vocab_size, args.seq_len, sources=sources,
                        tokenizer_dir=tokenizer_dir)
    print(json.dumps({k: meta[k] for k in ("vocab_size", "train", "heldout")}, indent=2))
    return meta


def main(argv=None):
    return command_main("build-corpus", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
