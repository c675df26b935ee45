"""Domino's training objective in the shared trainer (:class:`DominoTrainer`: DFlash's random
anchors and block pass, SpecForge's Domino loss with its decaying base-loss weight,
``methods/domino/loss.py``; online target features), and the `train` command's Domino part
(``--method domino``).

``--init-from`` takes a Domino drafter of the same config, or a DFlash drafter (e.g.
``embedded``): the Domino drafter then starts on its backbone with DFlash's rows and the
correction adding nothing (``handle.from_dflash``), so its first drafts are the DFlash
drafter's."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from dflash_jax.methods.dflash.training import BackboneTrainer, backbone_run
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.handle import DominoDrafter, from_dflash, start_fields
from dflash_jax.methods.domino.loss import LAMBDA_DECAY_RATIO, LAMBDA_START, domino_loss, lambda_base
from dflash_jax.methods.domino.model import init_domino_params
from dflash_jax.models.handles import load_target
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.trainer import TrainConfig


def check_schedule(start: float, decay_ratio: float) -> None:
    if not 0.0 <= start <= 1.0:
        raise ValueError(f"Domino's lambda_base_start must be in [0, 1] (the base loss's first weight), got {start}")
    if decay_ratio < 0:
        raise ValueError(f"Domino's lambda_base_decay_ratio must be >= 0 (the fraction of the run over which the "
                         f"base loss's weight falls to 0), got {decay_ratio}")


class DominoTrainer(BackboneTrainer):
    """Trains a Domino drafter (``DominoConfig``) in the shared loop, on one device, target
    features online (``BackboneTrainer``). The base loss's weight at step s is
    ``lambda_base(s, steps, start, decay_ratio)`` (SpecForge's defaults 1 and 0.5).
    ``cfg.gamma``: the rows' decay, none when None (SpecForge's default); ``uniform_weights`` is
    not read."""

    method = "domino"
    handle = DominoDrafter

    def __init__(self, target, drafter_config: DominoConfig, data: TokenDataset, run_dir: str, cfg: TrainConfig,
                 eval_prompts: Sequence[Sequence[int]] | None = None, init_from: str | None = None,
                 lambda_base_start: float = LAMBDA_START, lambda_base_decay_ratio: float = LAMBDA_DECAY_RATIO):
        check_schedule(lambda_base_start, lambda_base_decay_ratio)
        self.lambda_start, self.decay_ratio = float(lambda_base_start), float(lambda_base_decay_ratio)
        super().__init__(target, drafter_config, data, run_dir, cfg, None, eval_prompts, init_from=init_from)

    def start_from(self, dflash, **fields):
        return from_dflash(dflash, **fields)

    def fields(self) -> dict:
        c = self.dcfg
        return {"emb_dim": c.emb_dim, "gru_hidden_dim": c.gru_hidden_dim, "shift_label": c.shift_label,
                "pure_draft_prefix_len": c.pure_draft_prefix_len}

    def init_params(self, key):
        return init_domino_params(self.dcfg, key, jnp.float32)

    def record_settings(self) -> dict:
        return {"domino_loss": {"lambda_base_start": self.lambda_start, "lambda_base_decay_ratio": self.decay_ratio}}

    def schedule_inputs(self, step) -> tuple:
        return (lambda_base(step, self.num_steps, self.lambda_start, self.decay_ratio),)

    def row_metrics(self, done: int, m: dict) -> dict:
        return super().row_metrics(done, m) | {name: round(float(m[name]), 6) for name in ("lambda_base", "final", "base")}

    def loss(self, params, tparams, tokens, loss_mask, taps, anchors, valid, lam):
        return domino_loss(params, tparams, tokens, loss_mask, taps, anchors, valid, lam, dcfg=self.dcfg,
                           tcfg=self.target.config, gamma=self.cfg.gamma, anchor_chunk=self.cfg.anchor_chunk,
                           context_chunk=self.cfg.context_chunk)


TRAINER = DominoTrainer  # DraftingMethod.trainer

DEFAULT_BLOCK_SIZE = 16  # SpecForge's released Domino config
TRAIN_OPTIONS = {("drafter_layers", "--drafter-layers"): 5, ("block_size", "--block-size"): None,
                 ("taps", "--taps"): None, ("mask_token_id", "--mask-token-id"): None,
                 ("gru_hidden_dim", "--gru-hidden-dim"): None, ("emb_dim", "--emb-dim"): None,
                 ("shift_label", "--shift-label"): None, ("pure_draft_prefix_len", "--pure-draft-prefix-len"): None,
                 ("lambda_base_start", "--lambda-base-start"): None,
                 ("lambda_base_decay_ratio", "--lambda-base-decay-ratio"): None}
IGNORED_SETTINGS = DominoTrainer.ignored_settings


def add_train_arguments(p) -> None:
    g = p.add_argument_group("Domino (--method domino; also --drafter-layers, --block-size, --taps, --mask-token-id)")
    g.add_argument("--gru-hidden-dim", type=int, help="the GRU's state width (default min(1024, hidden size))")
    g.add_argument("--emb-dim", type=int, help="the correction's bottleneck width (default min(256, hidden size))")
    g.add_argument("--shift-label", choices=["true", "false"],
                   help="row k drafts the token after its position (true, the released config; the default from "
                        "scratch) or DFlash's rows (false; the default --init-from a DFlash drafter)")
    g.add_argument("--pure-draft-prefix-len", type=int, help="the first drafts left uncorrected (default 1)")
    g.add_argument("--lambda-base-start", type=float,
                   help="the backbone's cross-entropy's first weight in the loss, in [0, 1] (default 1)")
    g.add_argument("--lambda-base-decay-ratio", type=float,
                   help="the fraction of the run over which that weight falls linearly to 0 (default 0.5)")


def fields_from_args(args, hidden_size: int, from_dflash_start: bool) -> dict:
    """The Domino fields: the options given, else :func:`~dflash_jax.methods.domino.handle.start_fields`
    (``shift_label`` true from scratch, as released)."""
    given = {"gru_hidden_dim": args.gru_hidden_dim, "emb_dim": args.emb_dim,
             "pure_draft_prefix_len": args.pure_draft_prefix_len,
             "shift_label": None if args.shift_label is None else args.shift_label == "true"}
    return start_fields(hidden_size) | {"shift_label": not from_dflash_start} | {
        k: v for k, v in given.items() if v is not None}


def _check_args(args) -> None:
    """The Domino options' values, before anything is loaded."""
    for name, flag in (("gru_hidden_dim", "--gru-hidden-dim"), ("emb_dim", "--emb-dim")):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"{flag} {v}: a width must be >= 1")
    if args.pure_draft_prefix_len is not None and args.pure_draft_prefix_len < 0:
        raise ValueError(f"--pure-draft-prefix-len {args.pure_draft_prefix_len}: the uncorrected drafts must be >= 0")
    check_schedule(LAMBDA_START if args.lambda_base_start is None else args.lambda_base_start,
                   LAMBDA_DECAY_RATIO if args.lambda_base_decay_ratio is None else args.lambda_base_decay_ratio)


def train_from_args(args, cfg: TrainConfig) -> None:
    """``train --method domino``: a Domino drafter, on one device."""
    _check_args(args)
    schedule = {k: v for k, v in (("lambda_base_start", args.lambda_base_start),
                                  ("lambda_base_decay_ratio", args.lambda_base_decay_ratio)) if v is not None}
    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None,
                         quantize=getattr(args, "quantize", None))
    init_from, dcfg, data, eval_prompts = backbone_run(
        args, target, DominoConfig, from_dflash, lambda on_dflash: fields_from_args(args, target.config.hidden_size,
                                                                                   on_dflash), DEFAULT_BLOCK_SIZE)
    DominoTrainer(target, dcfg, data, args.run, cfg, eval_prompts, init_from=init_from,
                  **schedule).run(stop_after=args.stop_after)
