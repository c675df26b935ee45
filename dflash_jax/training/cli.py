"""Command-line entry points: train-data, features, train, export."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from dflash_jax.cli import command_parser


def _dtype(name):
    return jnp.dtype(name) if name else None


def train_data(argv):
    p = command_parser("train-data", "Regenerate responses to prompts with the target.")
    p.add_argument("--target", required=True)
    p.add_argument("--prompts", required=True, nargs="+", help="jsonl prompt files")
    p.add_argument("--out", required=True)
    p.add_argument("--max-prompts", type=int)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thinking", action="store_true",
                   help="render text prompts with the chat template's thinking switch on (Qwen3's "
                        "enable_thinking=True); default off, as the DFlash reference (train and use a "
                        "drafter in the same mode); recorded in metadata.json")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: the checkpoint's)")
    a = p.parse_args(argv)
    from dflash_jax.api import load_target
    from dflash_jax.training.data import read_prompt_file, regenerate

    target = load_target(a.target, dtype=_dtype(a.dtype), max_len=a.max_len)
    prompts = [q for f in a.prompts for q in read_prompt_file(f)][:a.max_prompts]
    meta = regenerate(target, prompts, a.out, max_new_tokens=a.max_new_tokens, max_len=a.max_len,
                      batch_size=a.batch_size, shard_size=a.shard_size, temperature=a.temperature,
                      top_k=a.top_k, top_p=a.top_p, seed=a.seed, source=",".join(a.prompts),
                      enable_thinking=a.thinking)
    print(f"{meta['sequences']} sequences, {meta['response_tokens']} response tokens in {a.out}")


def features(argv):
    p = command_parser("features", "Write offline target features for a data directory.")
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--taps", type=int, nargs="+", required=True, help="target layer ids")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: the checkpoint's)")
    a = p.parse_args(argv)
    from dflash_jax.api import load_target
    from dflash_jax.training.features import write_features

    write_features(load_target(a.target, dtype=_dtype(a.dtype)), a.data, a.out, a.taps, a.batch_size)


def train(argv):
    from dflash_jax.training.trainer import DEFAULT_STEPS, TrainConfig

    d = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    p = command_parser("train", "Train a DFlash drafter.")
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--features", help="offline features directory (default: online)")
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--taps", type=int, nargs="+", help="target layer ids (default: SPEC formula)")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--eval-prompts", type=int, default=0,
                   help="hold out the last N sequences (not trained on) and evaluate tau on their prompts")
    p.add_argument("--stop-after", type=int, help="stop after this many steps (for testing resume)")
    p.add_argument("--init-from", help="start from this drafter directory (released layout; its config "
                   "replaces --drafter-layers/--block-size/--taps) instead of random weights")
    p.add_argument("--dtype")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help=f"training steps (default: {DEFAULT_STEPS} "
                        "when --epochs is not given)")
    length.add_argument("--epochs", type=float,
                        help="train for this many epochs instead of --steps (the recipe's unit; fractions "
                             "allowed): ceil(epochs * (training sequences // batch size)) steps, every "
                             "epoch a new order of the sequences and new anchors")
    p.add_argument("--gamma", type=float,
                   help="loss decay: block row k weighs exp(-(k-1)/gamma), gamma > 0 (default: the paper's "
                        "for the block size: 7 for 16, 5 for 10, 4 for 8)")
    p.add_argument("--uniform-weights", action="store_true",
                   help="weigh every predicted block row the same (instead of the decay; excludes --gamma)")
    for name in ("batch_size", "learning_rate", "num_anchors", "seed",
                 "checkpoint_every", "keep_checkpoints", "eval_every", "eval_max_new_tokens",
                 "weight_decay", "warmup_fraction"):
        kind = float if isinstance(d[name], float) else int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=d[name])
    a = p.parse_args(argv)
    from dflash_jax.training.trainer import Trainer

    # the training settings are checked before anything is loaded
    cfg = TrainConfig(**{k: getattr(a, k) for k in (
        "steps", "epochs", "batch_size", "learning_rate", "num_anchors", "gamma", "uniform_weights", "seed",
        "checkpoint_every", "keep_checkpoints", "eval_every", "eval_max_new_tokens", "weight_decay",
        "warmup_fraction")})
    from dflash_jax.api import load_target
    from dflash_jax.config import DrafterConfig
    from dflash_jax.training.data import TokenDataset
    from dflash_jax.training.features import FeatureStore

    target = load_target(a.target, dtype=_dtype(a.dtype))
    mask = a.mask_token_id
    if mask is None:
        tok = target.tokenizer
        mask = getattr(tok, "mask_token_id", None) if tok is not None else None
        if mask is None:
            raise ValueError("the target's tokenizer has no mask token: pass --mask-token-id (a row "
                             "of the target's embedding that is not pad or eos)")
    if a.init_from:
        dcfg = DrafterConfig.from_pretrained(a.init_from)
    else:
        dcfg = DrafterConfig.for_target(target.config, a.drafter_layers, a.block_size, mask,
                                        tuple(a.taps) if a.taps else None)
    data = TokenDataset(a.data)
    eval_prompts = data.hold_out(a.eval_prompts) if a.eval_prompts else None
    feats = FeatureStore(a.features, dcfg.target_layer_ids) if a.features else None
    Trainer(target, dcfg, data, a.run, cfg, feats, eval_prompts, init_from=a.init_from).run(stop_after=a.stop_after)


def export(argv):
    p = command_parser("export", "Write a run's latest drafter in the released layout.")
    p.add_argument("--run", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="cast the weights (default: the float32 master weights)")
    a = p.parse_args(argv)
    from dflash_jax.training.trainer import export_run

    export_run(a.run, a.out, _dtype(a.dtype))
    print(f"wrote {a.out}")
