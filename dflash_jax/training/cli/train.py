"""Train a DFlash drafter (or, --method eagle3, an EAGLE-3 drafter with the training-time test)
on a data directory written by train-data (optax AdamW, Orbax checkpoints; a run directory
that exists is resumed). The training settings are the fields of
TrainConfig (dflash_jax/training/trainer.py), one option each. --mesh data=D,model=M trains on
D*M devices (batch rows over data, the target tensor-parallel over model, --fsdp to split the
drafter and its optimizer state over data too); a run resumes on any mesh."""

from __future__ import annotations

import dataclasses
import os
import sys

from dflash_jax.cli import (add_dataclass_arguments, add_deprecated_alias, command_main, dataclass_from_args,
                            run_cli)
from dflash_jax.hub import CHECKPOINT_HELP, resolve_checkpoint
from dflash_jax.training.trainer import TrainConfig, Trainer
from dflash_jax.parallel.cli import add_arguments as add_parallel_arguments, mesh_from_args
from dflash_jax.training import sharding
from dflash_jax.models.handles import load_target
from dflash_jax.config import DrafterConfig
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.features import FeatureStore


# the options of one method only: (dest, flag) -> the value it has when not given
DFLASH_OPTIONS = {("features", "--features"): None, ("drafter_layers", "--drafter-layers"): 5,
                  ("block_size", "--block-size"): 16, ("taps", "--taps"): None,
                  ("mask_token_id", "--mask-token-id"): None, ("conditioning", "--conditioning"): "kv",
                  ("fsdp", "--fsdp"): False, ("mesh", "--mesh"): None}
EAGLE3_OPTIONS = {("draft_vocab_size", "--draft-vocab-size"): None, ("ttt_steps", "--ttt-steps"): None,
                  ("ttt_decay", "--ttt-decay"): None, ("eagle3_layers", "--eagle3-layers"): None}


def add_arguments(p) -> None:

    p.add_argument("--method", choices=["dflash", "eagle3"], default="dflash",
                   help="the drafter to train: dflash (a block-diffusion drafter) or eagle3 (an EAGLE-3 "
                        "drafter, training-time test; docs/eagle3.md)")
    p.add_argument("--target", required=True, metavar="CHECKPOINT", help=f"the target: {CHECKPOINT_HELP}")
    p.add_argument("--data", required=True, help="data directory written by train-data")
    p.add_argument("--run", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--features", help="offline features directory (default: online)")
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the drafter to train")
    p.add_argument("--block-size", type=int, default=16, help="block size of the drafter to train")
    p.add_argument("--taps", type=int, nargs="+", help="target layer ids (default: the formula of docs/method.md section 2)")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--conditioning", choices=["kv", "input", "none"], default="kv",
                   help="how the target's features reach the drafter: kv (the paper's injection into every "
                        "layer's keys and values), input (input rows of the first layer only), none (an "
                        "ablation: no target features)")
    p.add_argument("--eval-prompts", type=int, default=0,
                   help="hold out the last N sequences (not trained on) and evaluate tau on their prompts")
    p.add_argument("--stop-after", type=int, help="stop after this many steps (for testing resume)")
    p.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from this drafter (a directory, a hub repo id such as "
                   "z-lab/Qwen3-8B-DFlash-b16, or 'embedded'; released layout; its config "
                   "replaces --drafter-layers/--block-size/--taps) instead of random weights")
    p.add_argument("--target-dtype", choices=["float32", "bfloat16"],
                   help="dtype the target is loaded and computes in (default: the checkpoint's); the "
                        "drafter's is --compute-dtype")
    add_deprecated_alias(p, "--dtype", "--target-dtype")  # --dtype is the compute dtype elsewhere
    g = p.add_argument_group("EAGLE-3 (--method eagle3)")
    g.add_argument("--draft-vocab-size", type=int,
                   help="tokens of the EAGLE-3 draft vocabulary: the most frequent response tokens of "
                        "the training data (default: the target's whole vocabulary)")
    g.add_argument("--ttt-steps", type=int, help="drafting steps unrolled per position by the training-time "
                   "test (default 7); the held-out tau drafts chains of this length")
    g.add_argument("--ttt-decay", type=float, help="weight of training-time-test step s: ttt_decay**s "
                   "(default 0.8)")
    g.add_argument("--eagle3-layers", type=int, nargs=3, metavar="LAYER",
                   help="the three target layers whose outputs feed the EAGLE-3 drafter (default: "
                        "(1, N//2-1, N-4) of an N-layer target)")
    add_dataclass_arguments(p.add_argument_group("training settings (TrainConfig)"), TrainConfig,
                            exclusive=[("steps", "epochs")])

    add_parallel_arguments(p)
    p.add_argument("--fsdp", action="store_true",
                   help="with --mesh: split the drafter's parameters and optimizer state over the "
                        "mesh's data axis (FSDP) instead of replicating them; the target is always "
                        "split over model (tensor parallelism) and the batch rows over data")


def check_method_options(args) -> None:
    """Refuses the options of the other method than ``--method`` (one error naming them all)."""
    from dflash_jax.methods.eagle3.training import DFLASH_ONLY
    from dflash_jax.cli import flag

    if args.method == "eagle3":
        other = {**DFLASH_OPTIONS, **{(f.name, flag(f.name)): f.default for f in
                                      dataclasses.fields(TrainConfig) if f.name in DFLASH_ONLY}}
        what = "DFlash"
    else:
        other, what = EAGLE3_OPTIONS, "EAGLE-3"
    given = [name for (dest, name), unset in other.items() if getattr(args, dest, unset) != unset]
    if given:
        raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} {what}-only: drop "
                         f"{'it' if len(given) == 1 else 'them'} with --method {args.method}"
                         + ("" if args.method == "eagle3" else " (or pass --method eagle3)"))


def run(args) -> None:

    check_method_options(args)
    cfg = dataclass_from_args(TrainConfig, args)  # the settings are checked before anything is loaded
    if args.method == "eagle3":
        return run_eagle3(args, cfg)

    mesh = mesh_from_args(args)  # before any JAX computation (multi-host runtime)
    if args.fsdp and mesh is None:
        raise ValueError("--fsdp splits the drafter over the mesh's data axis: give --mesh too")
    if mesh is not None:
        sharding.check_batch(mesh, cfg.batch_size)  # the target's split: load_target checks it
    import jax.numpy as jnp


    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None,
                         mesh=mesh)
    mask = args.mask_token_id
    if mask is None:
        tok = target.tokenizer
        mask = getattr(tok, "mask_token_id", None) if tok is not None else None
        if mask is None:
            raise ValueError("the target's tokenizer has no mask token: pass --mask-token-id (a row "
                             "of the target's embedding that is not pad or eos)")
    init_from = os.fspath(resolve_checkpoint(args.init_from, kind="drafter")) if args.init_from else None
    if init_from:
        dcfg = DrafterConfig.from_pretrained(init_from)
    else:
        dcfg = DrafterConfig.for_target(target.config, args.drafter_layers, args.block_size, mask,
                                        tuple(args.taps) if args.taps else None, conditioning=args.conditioning)
    data = TokenDataset(args.data)
    eval_prompts = data.hold_out(args.eval_prompts) if args.eval_prompts else None
    feats = FeatureStore(args.features, dcfg.target_layer_ids) if args.features else None
    Trainer(target, dcfg, data, args.run, cfg, feats, eval_prompts, init_from=init_from,
            mesh=mesh, fsdp=args.fsdp).run(stop_after=args.stop_after)


def run_eagle3(args, cfg) -> None:
    """``train --method eagle3``: an EAGLE-3 drafter (``methods.eagle3.training``)."""
    from dflash_jax.methods.eagle3.training import Eagle3TrainConfig, Eagle3Trainer, select_draft_vocab
    from dflash_jax.methods.eagle3.config import Eagle3Config

    eagle = Eagle3TrainConfig(**{k: getattr(args, k) for k in ("ttt_steps", "ttt_decay")
                                 if getattr(args, k) is not None})
    import jax.numpy as jnp

    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None)
    data = TokenDataset(args.data)
    eval_prompts = data.hold_out(args.eval_prompts) if args.eval_prompts else None
    init_from = os.fspath(resolve_checkpoint(args.init_from, kind="eagle3")) if args.init_from else None
    if init_from:
        if args.draft_vocab_size is not None or args.eagle3_layers is not None:
            raise ValueError("--init-from gives the drafter's config and draft vocabulary: drop "
                             "--draft-vocab-size and --eagle3-layers")
        from dflash_jax.methods.eagle3 import EAGLE3

        start = EAGLE3.load(init_from, target)
        config, vocab = start.config, start.draft_vocab
    else:
        size = target.config.vocab_size if args.draft_vocab_size is None else args.draft_vocab_size
        vocab = select_draft_vocab(data, size, target.config.vocab_size)
        config = Eagle3Config.for_target(target.config, len(vocab), args.eagle3_layers)
    Eagle3Trainer(target, config, data, args.run, cfg, eagle, vocab, eval_prompts,
                  init_from=init_from).run(stop_after=args.stop_after)


def main(argv=None):
    return command_main("train", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
