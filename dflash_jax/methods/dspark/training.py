"""DSpark's training objective in the shared trainer (:class:`DSparkTrainer`: DFlash's random
anchors and block pass, SpecForge's DSpark loss, ``methods/dspark/loss.py``; online target
features, which also give the target's distributions the L1 and confidence terms read), and
the `train` command's DSpark part (``--method dspark``).

``--init-from`` takes a DSpark drafter of the same config, or a DFlash drafter (e.g.
``embedded``): the DSpark drafter then starts on its backbone (``handle.from_dflash``: the
Markov head adding nothing, the confidence head at 1/2, the block one row shorter so that the
verify width stays the DFlash drafter's)."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from dflash_jax.methods.dflash.training import BackboneTrainer, backbone_run
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.handle import DSparkDrafter, from_dflash
from dflash_jax.methods.dspark.loss import DEFAULT_ALPHAS, dspark_loss
from dflash_jax.methods.dspark.model import init_dspark_params
from dflash_jax.models.handles import load_target
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.features import target_features
from dflash_jax.training.trainer import TrainConfig


class DSparkTrainer(BackboneTrainer):
    """Trains a DSpark drafter (``DSparkConfig``) in the shared loop, on one device, target
    features online (``BackboneTrainer``). ``alphas``: the loss terms' weights (``ce_alpha``,
    ``l1_alpha``, ``confidence_alpha``; SpecForge's defaults 0.1, 0.9, 1). ``cfg.gamma``: the
    rows' decay exp(-k / gamma), none when None (SpecForge's default); ``uniform_weights`` is
    not read."""

    method = "dspark"
    handle = DSparkDrafter

    def __init__(self, target, drafter_config: DSparkConfig, data: TokenDataset, run_dir: str, cfg: TrainConfig,
                 eval_prompts: Sequence[Sequence[int]] | None = None, init_from: str | None = None,
                 **alphas):
        unknown = set(alphas) - set(DEFAULT_ALPHAS)
        if unknown:
            raise TypeError(f"unknown DSpark loss weights {sorted(unknown)}; they are {', '.join(DEFAULT_ALPHAS)}")
        self.alphas = {**DEFAULT_ALPHAS, **{k: float(v) for k, v in alphas.items()}}
        for name, value in self.alphas.items():
            if value < 0:
                raise ValueError(f"DSpark's loss weight {name} must be >= 0, got {value}")
        super().__init__(target, drafter_config, data, run_dir, cfg, None, eval_prompts, init_from=init_from)

    def start_from(self, dflash, **fields):
        return from_dflash(dflash, **fields)

    def fields(self) -> dict:
        c = self.dcfg
        return {"markov_rank": c.markov_rank, "markov_head_type": c.markov_head_type,
                "enable_confidence_head": c.enable_confidence_head,
                "confidence_head_with_markov": c.confidence_head_with_markov}

    def init_params(self, key):
        return init_dspark_params(self.dcfg, key, jnp.float32)

    def record_settings(self) -> dict:
        return {"dspark_loss": dict(self.alphas)}

    def device_inputs(self, tparams, tokens, loss_mask, taps, anchors, valid):
        ids = self.dcfg.target_layer_ids + (self.target.config.num_layers - 1,)
        feats = target_features(self.target.config, tparams, tokens, ids)
        D = self.target.config.hidden_size
        return tokens, loss_mask, feats[..., :-D], feats[..., -D:], anchors, valid

    def loss(self, params, tparams, tokens, loss_mask, taps, last, anchors, valid):
        return dspark_loss(params, tparams, tokens, loss_mask, taps, last, anchors, valid, dcfg=self.dcfg,
                           tcfg=self.target.config, gamma=self.cfg.gamma, anchor_chunk=self.cfg.anchor_chunk,
                           context_chunk=self.cfg.context_chunk, **self.alphas)


TRAINER = DSparkTrainer  # DraftingMethod.trainer

DEFAULT_BLOCK_SIZE = 7  # SpecForge's released DSpark configs
TRAIN_OPTIONS = {("drafter_layers", "--drafter-layers"): 5, ("block_size", "--block-size"): None,
                 ("taps", "--taps"): None, ("mask_token_id", "--mask-token-id"): None,
                 ("markov_rank", "--markov-rank"): None, ("markov_head_type", "--markov-head-type"): None,
                 ("no_confidence_head", "--no-confidence-head"): False,
                 ("confidence_with_markov", "--confidence-with-markov"): None,
                 ("dspark_ce_alpha", "--dspark-ce-alpha"): None, ("dspark_l1_alpha", "--dspark-l1-alpha"): None,
                 ("dspark_confidence_alpha", "--dspark-confidence-alpha"): None}
IGNORED_SETTINGS = DSparkTrainer.ignored_settings


def add_train_arguments(p) -> None:
    g = p.add_argument_group("DSpark (--method dspark; also --drafter-layers, --block-size, --taps, --mask-token-id)")
    g.add_argument("--markov-rank", type=int, help="rank of the Markov head (default 256, at most the vocabulary)")
    g.add_argument("--markov-head-type", choices=["vanilla", "gated", "rnn"], help="the Markov head (default vanilla)")
    g.add_argument("--no-confidence-head", action="store_true", help="train without the confidence head")
    g.add_argument("--confidence-with-markov", choices=["true", "false"],
                   help="the confidence head reads the previous token's Markov embedding too (default true)")
    g.add_argument("--dspark-ce-alpha", type=float, help="weight of the cross-entropy term (default 0.1)")
    g.add_argument("--dspark-l1-alpha", type=float, help="weight of the L1-to-the-target term (default 0.9)")
    g.add_argument("--dspark-confidence-alpha", type=float, help="weight of the confidence term (default 1)")


def fields_from_args(args, vocab_size: int) -> dict:
    return {"markov_rank": args.markov_rank if args.markov_rank is not None else min(256, vocab_size),
            "markov_head_type": args.markov_head_type or "vanilla",
            "enable_confidence_head": not args.no_confidence_head,
            "confidence_head_with_markov": args.confidence_with_markov != "false"}


def train_from_args(args, cfg: TrainConfig) -> None:
    """``train --method dspark``: a DSpark drafter, on one device."""
    alphas = {name: value for name, value in (("ce_alpha", args.dspark_ce_alpha), ("l1_alpha", args.dspark_l1_alpha),
                                              ("confidence_alpha", args.dspark_confidence_alpha)) if value is not None}
    if args.markov_rank is not None and args.markov_rank < 1:
        raise ValueError(f"--markov-rank {args.markov_rank}: the Markov head's rank must be >= 1")
    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None,
                         quantize=getattr(args, "quantize", None))
    fields = fields_from_args(args, target.config.vocab_size)
    init_from, dcfg, data, eval_prompts = backbone_run(args, target, DSparkConfig, from_dflash, lambda _: fields,
                                                       DEFAULT_BLOCK_SIZE)
    DSparkTrainer(target, dcfg, data, args.run, cfg, eval_prompts, init_from=init_from,
                  **alphas).run(stop_after=args.stop_after)
