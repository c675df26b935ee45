"""Write the embedded drafter's training prompts (jsonl)."""

from __future__ import annotations

import json
import sys

from dflash_jax.cli import command_main, run_cli
from dflash_jax.embedded.cli import add_data_dir_argument
from dflash_jax.files import write_text
from dflash_jax.embedded.corpus import check_styles, check_training_data, training_prompts
from dflash_jax.models.handles import EMBEDDED_TARGET_DIR
from dflash_jax.prompts import encode_prompt


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="jsonl file to write")
    p.add_argument("--num", type=int, default=4000, help="number of prompts")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--styles", nargs="+", default=None, metavar="STYLE",
                   help="prompt styles to mix (space- or comma-separated): gsm8k, math500, humaneval, mbpp, "
                        "mt-bench; default all five")
    p.add_argument("--weights", nargs="+", default=None, metavar="STYLE=W",
                   help="relative shares of the styles, e.g. math500=2 mbpp=0.5 (default equal)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                   help="drop the drawn prompts longer than N tokens as the target's chat template renders "
                        "them (so that train-data's --max-len fits every prompt and its answer); the number "
                        "dropped is printed (default: keep all)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="with --max-prompt-tokens: the target directory whose tokenizer counts the tokens "
                        "(default: the embedded target)")
    add_data_dir_argument(p)


def parse_styles(values) -> list[str] | None:
    """``--styles`` values (each may hold comma-separated names) as a list, checked."""
    if values is None:
        return None
    styles = [x for v in values for x in v.split(",") if x]
    check_styles(styles)
    return styles


def parse_weights(values) -> dict[str, float] | None:
    """``--weights`` values (``STYLE=W``, each may hold comma-separated pairs) as a dict."""
    if values is None:
        return None
    out = {}
    for v in (x for v in values for x in v.split(",") if x):
        name, eq, w = v.partition("=")
        try:
            if not eq:
                raise ValueError
            out[name] = float(w)
        except ValueError:
            raise ValueError(f"--weights {v!r}: expected STYLE=NUMBER, e.g. math500=2") from None
    return out


def run(args) -> list[str]:

    styles, weights = parse_styles(args.styles), parse_weights(args.weights)
    check_styles(styles, weights)
    data_dir = args.data_dir
    if styles is None or "gsm8k" in styles:  # the style that needs a file from the data directory
        data_dir = check_training_data(args.data_dir)
    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise ValueError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    rows = training_prompts(data_dir, args.num, args.seed, styles=styles, weights=weights)
    if len(rows) < args.num:
        raise ValueError(f"--num {args.num}: the training data in {data_dir}, the standard library and "
                         f"the synthetic generators give only {len(rows)} prompts (styles "
                         f"{', '.join(check_styles(styles))}); ask for {len(rows)} or fewer")
    if args.max_prompt_tokens is not None:
        rows = drop_long(rows, args.max_prompt_tokens, args.tokenizer)
    write_text(args.out, "".join(json.dumps({"prompt": r}) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")
    return rows


def drop_long(rows: list[str], max_tokens: int, tokenizer_dir: str | None) -> list[str]:
    """The prompts of ``rows`` whose chat-rendered token count is at most ``max_tokens``."""
    from transformers import AutoTokenizer


    tok = AutoTokenizer.from_pretrained(tokenizer_dir or EMBEDDED_TARGET_DIR)
    kept = [r for r in rows if len(encode_prompt(r, tok)) <= max_tokens]
    print(f"dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than {max_tokens} tokens")
    return kept


def main(argv=None):
    return command_main("embedded-prompts", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
