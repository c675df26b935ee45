"""DFlash's training objective (docs/method.md section 5) in the shared trainer
(:class:`DFlashTrainer`: random anchors, every block of a sequence in one pass with the sparse
mask, the weighted cross-entropy of ``loss.drafter_loss``; online or offline target features),
and the `train` command's DFlash part (``--method dflash``, the default): its options and the
run they start. The command (``training/cli/train.py``) finds this module through the method
(``DraftingMethod.training_module``)."""

from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp

from dflash_jax import methods
from dflash_jax.config import read_config_json
from dflash_jax.hub import resolve_checkpoint
from dflash_jax.methods.dflash.checkpoint import check_drafter_conditioning, load_drafter_params
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.grow import grow_params, start_difference
from dflash_jax.methods.dflash.handle import Drafter
from dflash_jax.methods.dflash.loss import LOSS_TYPES, check_loss_type, drafter_loss
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.models.handles import load_target
from dflash_jax.nn.attention import DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK
from dflash_jax.parallel.cli import mesh_from_args
from dflash_jax.training import sharding
from dflash_jax.training.blocks import block_loss_weights, epoch_anchors
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.features import FeatureStore, target_features
from dflash_jax.training.loop import batch_rows
from dflash_jax.training.trainer import BATCH_STREAM, TrainConfig, Trainer, batch_width

# settings added to TrainConfig after runs were started, with the value those runs had
# (the attention chunks: runs before them computed dense attention, which their shapes, <= 64
# anchors and length <= 1024, still get at the defaults; a longer run resumed now computes the
# same attention chunked, equal up to float rounding)
RECORD_ADDED = {"train": {"epochs": None, "uniform_weights": False, "anchors": "random",
                          "anchor_chunk": DEFAULT_ANCHOR_CHUNK, "context_chunk": DEFAULT_CONTEXT_CHUNK}}


def batch_for_step(step: int, data: TokenDataset, cfg: TrainConfig, block_size: int | None = None):
    """(sequence ids, anchors, valid) of a step: the step's rows of the epoch's permutation
    (:func:`~dflash_jax.training.loop.batch_rows`) and their anchors of that epoch
    (``block_size``: the drafter's, needed by fixed anchors)."""
    epoch, ids = batch_rows(step, len(data), cfg.batch_size, cfg.seed, BATCH_STREAM)
    anchors, valid = epoch_anchors(data.loss_mask[ids], ids, cfg.num_anchors, cfg.seed, epoch,
                                   strategy=cfg.anchors, block_size=block_size)
    return ids, anchors, valid


class DFlashTrainer(Trainer):
    """Trains a DFlash drafter (``DrafterConfig``) in the shared loop; on a mesh too.

    ``features``: offline target features (``training.features.FeatureStore``, one row per
    sequence of ``data``); None computes them online in every step (a teacher-forced target
    pass over the batch, outside the differentiated loss). ``loss``: DFlash's weighted
    cross-entropy ("dflash") or one of D-PACE's weightings (``methods.dflash.loss.LOSS_TYPES``,
    ``docs/dpace.md``) with ``dpace_alpha``."""

    method = "dflash"
    record_added = RECORD_ADDED
    record_names_method = False  # DFlash runs were recorded before runs named their method
    supports_mesh = True

    def __init__(self, target, drafter_config: DrafterConfig, data: TokenDataset, run_dir: str,
                 cfg: TrainConfig, features: FeatureStore | None = None,
                 eval_prompts: Sequence[Sequence[int]] | None = None, init_from: str | None = None,
                 mesh=None, fsdp: bool = False, loss: str = "dflash", dpace_alpha: float = 0.5,
                 grow: bool = False):
        """``init_from`` may hold a drafter trained at another block size (its weights do not
        depend on it), and with ``grow`` one of fewer layers, grown to ``drafter_config``'s with
        new layers that change no draft at step 0 (``methods.dflash.grow``)."""
        check_loss_type(loss, dpace_alpha)
        if grow and init_from is None:
            raise ValueError("--grow adds layers to a trained drafter: give --init-from DRAFTER too")
        self.grow = bool(grow)
        self.loss_type, self.dpace_alpha = loss, float(dpace_alpha)
        if features is not None and len(features) != len(data):
            raise ValueError(f"offline features have {len(features)} rows but the dataset has {len(data)}")
        self.features = features
        super().__init__(target, drafter_config, data, run_dir, cfg, eval_prompts, init_from=init_from,
                         mesh=mesh, fsdp=fsdp)

    def _check_init_from(self, init_from: str) -> None:
        check_drafter_conditioning(init_from, self.dcfg)  # before the config: it names the conditioning
        why = start_difference(self._start_config(init_from), self.dcfg, self.grow)
        if why is not None:
            raise ValueError(f"{init_from} holds a drafter with another config than this run trains: {why}")

    def init_params(self, key):
        return init_drafter_params(self.dcfg, key, jnp.float32)

    def _start_config(self, init_from: str) -> DrafterConfig:
        """The config of the drafter in ``init_from``, read as this method reads its own."""
        return methods.method(self.method).config_from_hf(read_config_json(init_from))

    def load_params(self, init_from: str):
        params = load_drafter_params(init_from, self._start_config(init_from), dtype=jnp.float32)
        return grow_params(params, self.dcfg.num_layers) if self.grow else params

    def _loss_weights(self) -> jax.Array:
        """The loss's weights: float32[bs] of the block rows."""
        return jnp.asarray(block_loss_weights(self.dcfg.block_size, self.cfg.gamma, self.cfg.uniform_weights))

    def record_settings(self) -> dict:
        # a D-PACE run records its loss (DFlash's runs, recorded before it, name none)
        loss = {} if self.loss_type == "dflash" else {"loss": {"type": self.loss_type, "dpace_alpha": self.dpace_alpha}}
        grown = {"grow": True} if self.grow else {}  # (runs before --grow record none)
        return {"features": None if self.features is None else "offline"} | loss | grown

    def batch(self, step: int):
        """(tokens int32[B, W], loss_mask bool[B, W], taps [B, W, k*D] or None (online),
        anchors int32[B, A], valid bool[B, A]) of training step ``step``."""
        ids, anchors, valid = batch_for_step(step, self.data, self.cfg, self.dcfg.block_size)
        width = batch_width(self.data.lengths[ids], self.data.seq_len)  # as Trainer.step_rows
        taps = None if self.features is None else self.features.take(ids)[:, :width]
        return self.data.tokens[ids, :width], self.data.loss_mask[ids, :width], taps, anchors, valid

    def device_inputs(self, tparams, tokens, loss_mask, taps, anchors, valid):
        if taps is None:  # online: the target's teacher-forced pass over the batch
            taps = target_features(self.target.config, tparams, tokens, self.dcfg.target_layer_ids)
        return tokens, loss_mask, taps, anchors, valid

    def loss(self, params, tparams, tokens, loss_mask, taps, anchors, valid):
        return drafter_loss(params, tparams, tokens, loss_mask, taps, anchors, valid, self.weights,
                            dcfg=self.dcfg, tcfg=self.target.config,
                            anchor_chunk=self.cfg.anchor_chunk, context_chunk=self.cfg.context_chunk,
                            loss_type=self.loss_type, dpace_alpha=self.dpace_alpha)

    def drafter(self, params) -> Drafter:
        # on a mesh the drafter is placed by the rules next to the target, as generate needs
        return Drafter(self.dcfg, jax.tree.map(lambda x: x.astype(self.target.dtype), params),
                       mesh=self.target.mesh)


def holds_dflash_drafter(path: str) -> bool:
    """Whether the drafter directory ``path`` is a DFlash drafter (by its config's method)."""
    return methods.method_for_hf(read_config_json(path)).name == "dflash"


class BackboneTrainer(DFlashTrainer):
    """The trainer of a method whose drafter is DFlash's plus heads (DSpark, Domino): DFlash's
    anchors and block pass, on one device, target features online, and ``--init-from`` either
    a drafter of the method of the same config or a DFlash drafter, whose backbone it then
    starts on (:meth:`start_from`). A subclass gives ``method``, ``handle`` (the drafter handle
    class), ``init_params``, ``loss``, ``start_from`` and ``fields``."""

    record_added: dict = {}
    record_names_method = True
    supports_mesh = False
    ignored_settings = ("uniform_weights",)
    handle: type = Drafter

    def start_from(self, dflash, **fields):
        """The method's drafter on the DFlash drafter ``dflash``'s backbone (``handle.from_dflash``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement start_from")

    def fields(self) -> dict:
        """The method's own fields of ``self.dcfg`` (what ``start_from`` takes)."""
        raise NotImplementedError(f"{type(self).__name__} must implement fields")

    def _check_init_from(self, init_from: str) -> None:
        if holds_dflash_drafter(init_from):
            start = self.start_from(methods.method("dflash").load(init_from, self.target), **self.fields())
            if start.config != self.dcfg:
                raise ValueError(f"{init_from} holds a DFlash drafter whose {self.handle.label} start "
                                 f"({start.config}) is not the drafter trained here ({self.dcfg})")
            return
        check_drafter_conditioning(init_from, self.dcfg)
        Trainer._check_init_from(self, init_from)  # the method's own drafter: the same config

    def load_params(self, init_from: str):
        if holds_dflash_drafter(init_from):
            dflash = methods.method("dflash").load(init_from, self.target, dtype=jnp.float32)
            return self.start_from(dflash, seed=self.cfg.seed, **self.fields()).params
        return Trainer.load_params(self, init_from)

    def _loss_weights(self):
        return None

    def drafter(self, params):
        return self.handle(self.dcfg, jax.tree.map(lambda x: x.astype(self.target.dtype), params))


def backbone_run(args, target, config_class, start_from, fields_of, default_block_size: int):
    """What `train --method M` of a :class:`BackboneTrainer` method trains: (init_from, the
    drafter config, the data, the held-out prompts). ``--init-from`` a DFlash drafter: the
    method's drafter on its backbone (``start_from(dflash, **fields_of(True))``); a drafter of
    the method: its config; none: ``config_class.for_target`` from the options and
    ``fields_of(False)``."""
    init_from = os.fspath(resolve_checkpoint(args.init_from, kind="drafter")) if args.init_from else None
    on_dflash = bool(init_from) and holds_dflash_drafter(init_from)
    if on_dflash:
        dcfg = start_from(methods.method("dflash").load(init_from, target), **fields_of(True)).config
    elif init_from:
        dcfg = config_class.from_pretrained(init_from)
    else:
        dcfg = config_class.for_target(target.config, args.drafter_layers, args.block_size or default_block_size,
                                       mask_token(args, target), tuple(args.taps) if args.taps else None,
                                       **fields_of(False))
    data = TokenDataset(args.data)
    return init_from, dcfg, data, data.hold_out(args.eval_prompts) if args.eval_prompts else None


TRAINER = DFlashTrainer  # DraftingMethod.trainer

# this method's own options: (dest, flag) -> the value it has when not given (--fsdp is added by
# the command after the mesh options it goes with)
TRAIN_OPTIONS = {("features", "--features"): None, ("drafter_layers", "--drafter-layers"): 5,
                 ("block_size", "--block-size"): None, ("taps", "--taps"): None,
                 ("mask_token_id", "--mask-token-id"): None, ("conditioning", "--conditioning"): "kv",
                 ("fsdp", "--fsdp"): False, ("mesh", "--mesh"): None, ("loss", "--loss"): "dflash",
                 ("dpace_alpha", "--dpace-alpha"): None}
DEFAULT_BLOCK_SIZE = 16
IGNORED_SETTINGS: tuple[str, ...] = ()  # it reads every TrainConfig field


def add_train_arguments(p) -> None:
    p.add_argument("--features", help="offline features directory (default: online)")
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the drafter to train")
    p.add_argument("--block-size", type=int, help="block size of the drafter to train (default: DFlash 16, "
                                                  "DSpark 7)")
    p.add_argument("--taps", type=int, nargs="+", help="target layer ids (default: the formula of docs/method.md section 2)")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--conditioning", choices=["kv", "input", "none"], default="kv",
                   help="how the target's features reach the drafter: kv (the paper's injection into every "
                        "layer's keys and values), input (input rows of the first layer only), none (an "
                        "ablation: no target features)")
    p.add_argument("--loss", choices=list(LOSS_TYPES), default="dflash",
                   help="the block loss: dflash (the paper's weighted cross-entropy) or one of D-PACE's "
                        "weightings (docs/dpace.md)")
    p.add_argument("--dpace-alpha", type=float, help="D-PACE's smoothing alpha in [0, 1] (default 0.5)")


def mask_token(args, target) -> int:
    """--mask-token-id, else the target's tokenizer's mask token (refused when it has none)."""
    if args.mask_token_id is not None:
        return args.mask_token_id
    tok = target.tokenizer
    mask = getattr(tok, "mask_token_id", None) if tok is not None else None
    if mask is None:
        raise ValueError("the target's tokenizer has no mask token: pass --mask-token-id (a row "
                         "of the target's embedding that is not pad or eos)")
    return mask


def loss_from_args(args) -> tuple[str, float]:
    """(--loss, --dpace-alpha), checked; --dpace-alpha without a D-PACE loss is refused."""
    if args.dpace_alpha is not None and args.loss == "dflash":
        raise ValueError("--dpace-alpha weights D-PACE's loss: give --loss dpace (or another D-PACE weighting) "
                         "or drop it")
    alpha = 0.5 if args.dpace_alpha is None else args.dpace_alpha
    check_loss_type(args.loss, alpha)
    return args.loss, alpha


def train_from_args(args, cfg) -> None:
    """``train --method dflash``: a DFlash drafter, on a mesh with ``--mesh``."""
    loss, dpace_alpha = loss_from_args(args)  # before anything is loaded
    mesh = mesh_from_args(args)  # before any JAX computation (multi-host runtime)
    if args.fsdp and mesh is None:
        raise ValueError("--fsdp splits the drafter over the mesh's data axis: give --mesh too")
    if mesh is not None:
        sharding.check_batch(mesh, cfg.batch_size)  # the target's split: load_target checks it
    # the data, the held-out split, the starting drafter and the feature store are found (or
    # refused) before the target loads, which takes minutes for a large one
    init_from = os.fspath(resolve_checkpoint(args.init_from, kind="drafter")) if args.init_from else None
    data = TokenDataset(args.data)
    eval_prompts = data.hold_out(args.eval_prompts) if args.eval_prompts else None
    dcfg = DrafterConfig.from_pretrained(init_from) if init_from else None
    feats = FeatureStore(args.features, dcfg.target_layer_ids if dcfg else None) if args.features else None
    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None,
                         quantize=getattr(args, "quantize", None), mesh=mesh)
    if dcfg is None:  # a drafter started --init-from brings its own mask token
        mask = mask_token(args, target)
        dcfg = DrafterConfig.for_target(target.config, args.drafter_layers, args.block_size or DEFAULT_BLOCK_SIZE, mask,
                                        tuple(args.taps) if args.taps else None, conditioning=args.conditioning)
        if feats is not None:
            feats = FeatureStore(args.features, dcfg.target_layer_ids)  # its taps checked against the drafter's
    DFlashTrainer(target, dcfg, data, args.run, cfg, feats, eval_prompts, init_from=init_from,
                  mesh=mesh, fsdp=args.fsdp, loss=loss, dpace_alpha=dpace_alpha).run(stop_after=args.stop_after)
