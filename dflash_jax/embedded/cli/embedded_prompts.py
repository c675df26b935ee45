"""Write the embedded drafter's training prompts (jsonl)."""

from __future__ import annotations

import json
import sys

from dflash_jax.cli import command_main, run_cli
from dflash_jax.embedded.cli import add_data_dir_argument
from dflash_jax.files import write_text


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="jsonl file to write")
    p.add_argument("--num", type=int, default=4000, help="number of prompts")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    add_data_dir_argument(p)


def run(args) -> list[str]:
    from dflash_jax.embedded.corpus import check_training_data, training_prompts

    data_dir = check_training_data(args.data_dir)
    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    rows = training_prompts(data_dir, args.num, args.seed)
    if len(rows) < args.num:
        raise ValueError(f"--num {args.num}: the training data in {data_dir} and the standard library "
                         f"give only {len(rows)} prompts; ask for {len(rows)} or fewer")
    write_text(args.out, "".join(json.dumps({"prompt": r}) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")
    return rows


def main(argv=None):
    return command_main("embedded-prompts", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
