"""The `train` command's DFlash part (``--method dflash``, the default): its options and the run
they start (``training.trainer.Trainer``, the block-diffusion objective of docs/method.md
section 5). The command (``training/cli/train.py``) finds this module through the method
(``DraftingMethod.training_module``)."""

from __future__ import annotations

import os

import jax.numpy as jnp

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.hub import resolve_checkpoint
from dflash_jax.models.handles import load_target
from dflash_jax.parallel.cli import mesh_from_args
from dflash_jax.training import sharding
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.features import FeatureStore
from dflash_jax.training.trainer import Trainer

# this method's own options: (dest, flag) -> the value it has when not given (--fsdp is added by
# the command after the mesh options it goes with)
TRAIN_OPTIONS = {("features", "--features"): None, ("drafter_layers", "--drafter-layers"): 5,
                 ("block_size", "--block-size"): 16, ("taps", "--taps"): None,
                 ("mask_token_id", "--mask-token-id"): None, ("conditioning", "--conditioning"): "kv",
                 ("fsdp", "--fsdp"): False, ("mesh", "--mesh"): None}
IGNORED_SETTINGS: tuple[str, ...] = ()  # it reads every TrainConfig field


def add_train_arguments(p) -> None:
    p.add_argument("--features", help="offline features directory (default: online)")
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the drafter to train")
    p.add_argument("--block-size", type=int, default=16, help="block size of the drafter to train")
    p.add_argument("--taps", type=int, nargs="+", help="target layer ids (default: the formula of docs/method.md section 2)")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--conditioning", choices=["kv", "input", "none"], default="kv",
                   help="how the target's features reach the drafter: kv (the paper's injection into every "
                        "layer's keys and values), input (input rows of the first layer only), none (an "
                        "ablation: no target features)")


def train_from_args(args, cfg) -> None:
    """``train --method dflash``: a DFlash drafter, on a mesh with ``--mesh``."""
    mesh = mesh_from_args(args)  # before any JAX computation (multi-host runtime)
    if args.fsdp and mesh is None:
        raise ValueError("--fsdp splits the drafter over the mesh's data axis: give --mesh too")
    if mesh is not None:
        sharding.check_batch(mesh, cfg.batch_size)  # the target's split: load_target checks it
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
