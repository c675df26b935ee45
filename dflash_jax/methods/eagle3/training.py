"""Training an EAGLE-3 drafter (``docs/eagle3.md``) with the training-time test, in the drafter
trainer's loop (``training.trainer``): the same data, optimizer, schedule, clipping, Orbax
checkpoints, exact resume, metrics and held-out tau; the drafter, its loss and its export are
what differ (:class:`Eagle3Trainer` is the objective: the method's parts of :class:`Trainer`).

The objective (SpecForge's, the EAGLE-3 paper's "training-time test"): one teacher-forced target
pass gives the three feature taps and the target's logits; the drafter unrolls ``steps`` drafting
steps over every position at once (``Eagle3Model.unroll``), step s feeding back step s-1's hidden
states. Step s at position j predicts token x_{j+2+s}; its soft label is the target's
distribution at position j+1+s restricted to the draft vocabulary and renormalised. The pair
(j, s) counts iff x_{j+2+s} is a response token and the target's argmax at j+1+s is in the draft
vocabulary (SpecForge's position mask). loss_s = mean soft cross-entropy over the counted pairs;
the loss is sum_s decay^s loss_s.

The draft vocabulary (:func:`select_draft_vocab`): the most frequent target tokens among the
training data's response tokens, recorded in the run directory (``draft_vocab.json``; its
digest in ``run.json``) and exported as ``d2t`` / ``t2d``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.config import TargetConfig
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.files import write_json
from dflash_jax.methods.eagle3.model import Eagle3Model, init_eagle3_params
from dflash_jax.methods.eagle3 import handle
from dflash_jax.methods.eagle3.handle import VOCAB_FILE, Eagle3Drafter, d2t_of_vocab, vocab_digest
from dflash_jax.models.handles import load_target
from dflash_jax.targets import family_of, target_forward
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.trainer import TrainConfig, Trainer


# TrainConfig fields that only DFlash's block training reads (an EAGLE-3 run refuses them)
DFLASH_ONLY = ("num_anchors", "anchors", "gamma", "uniform_weights", "anchor_chunk", "context_chunk")
IGNORED_SETTINGS = DFLASH_ONLY  # what the train command refuses with --method eagle3

# the train command's options of this method: (dest, flag) -> the value it has when not given
TRAIN_OPTIONS = {("draft_vocab_size", "--draft-vocab-size"): None, ("ttt_steps", "--ttt-steps"): None,
                 ("ttt_decay", "--ttt-decay"): None, ("eagle3_layers", "--eagle3-layers"): None}


@dataclasses.dataclass(frozen=True)
class Eagle3TrainConfig:
    """The training-time test's settings (SpecForge's defaults).

    Attributes:
        ttt_steps: drafting steps unrolled per position in training (EAGLE-3's training-time
            test; the held-out evaluation drafts chains of this length)
        ttt_decay: weight of the training-time test's step s is ttt_decay**s
    """

    ttt_steps: int = 7
    ttt_decay: float = 0.8

    def __post_init__(self):
        if isinstance(self.ttt_steps, bool) or int(self.ttt_steps) != self.ttt_steps or self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be an integer >= 1, got {self.ttt_steps!r} (--ttt-steps)")
        if not 0 < float(self.ttt_decay) <= 1:
            raise ValueError(f"ttt_decay must be in (0, 1], got {self.ttt_decay!r} (--ttt-decay)")

    def weights(self) -> np.ndarray:
        """float32[ttt_steps]: ttt_decay**s."""
        return (float(self.ttt_decay) ** np.arange(int(self.ttt_steps))).astype(np.float32)


# ------------------------------------------------------------------ the draft vocabulary
def select_draft_vocab(data: TokenDataset, size: int, vocab_size: int) -> np.ndarray:
    """The ``size`` most frequent target tokens among ``data``'s response tokens (its
    ``loss_mask``), ties broken by the lower id (tokens never seen rank by id after all seen
    ones): int32[size] target ids, sorted. ``vocab_size``: the target's."""
    if isinstance(size, bool) or int(size) != size or not 1 <= size <= vocab_size:
        raise ValueError(f"the draft vocabulary size must be an integer in [1, {vocab_size}] (the "
                         f"target's vocabulary), got {size!r} (--draft-vocab-size)")
    tokens = np.asarray(data.tokens)[np.asarray(data.loss_mask, bool)]
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"the training data holds token ids outside the target's vocabulary "
                         f"[0, {vocab_size}): it was not made for this target")
    counts = np.bincount(tokens.astype(np.int64), minlength=vocab_size)
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep the lower id first
    return np.sort(order[:int(size)]).astype(np.int32)


def teacher(tcfg: TargetConfig, tparams, tokens, tap_layer_ids):
    """One teacher-forced target pass: (logits float32[B, L, V], taps [B, L, 3*Dt]), both
    without gradient."""
    B, L = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    logits, taps, _ = target_forward(tcfg, tparams, tokens, positions, tap_layer_ids=tuple(tap_layer_ids),
                                     compute_logits=True)
    return jax.lax.stop_gradient(logits.astype(jnp.float32)), jax.lax.stop_gradient(taps)


def shift_left(x, n: int, fill=0):
    """x[:, n:] padded back to x's length with ``fill`` along axis 1 (x[:, j + n] at j)."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, n)
    return jnp.pad(x[:, n:], pad, constant_values=fill)


def ttt_targets(target_logits, loss_mask, vocab, steps: int):
    """The soft labels and the counted pairs of every step.

    Args:
      target_logits: float32[B, L, V] the target's logits (position i predicts x_{i+1}).
      loss_mask: bool[B, L] response tokens.
      vocab: int32[Vd] the draft vocabulary's target ids.
    Returns (log_p float32[steps, B, L, Vd], counted bool[steps, B, L], label int32[steps, B, L]):
    step s at position j: the log of softmax(target_logits[j+1+s][vocab]), whether (j, s)
    counts, and the draft id of the target's argmax there.
    """
    restricted = jnp.take(target_logits, vocab, axis=-1)  # [B, L, Vd]
    log_p = jax.nn.log_softmax(restricted, -1)
    top = jnp.argmax(target_logits, -1)  # [B, L]
    in_vocab = jnp.zeros(target_logits.shape[-1], bool).at[vocab].set(True)[top]  # t2d[argmax]
    label = jnp.argmax(restricted, -1)
    out = [], [], []
    for s in range(int(steps)):
        out[0].append(shift_left(log_p, 1 + s))
        out[1].append(shift_left(loss_mask, 2 + s, False) & shift_left(in_vocab, 1 + s, False))
        out[2].append(shift_left(label, 1 + s))
    return tuple(jnp.stack(x) for x in out)


def step_ce(model: Eagle3Model, params, hidden, log_p, counted, label):
    """(sum of the soft cross-entropy over the counted pairs, count of correct top-1 drafts) of
    one step: hidden [B, L, D], log_p float32[B, L, Vd], counted bool[B, L], label int32[B, L]."""
    logits = model.apply({"params": params}, hidden, method=Eagle3Model.logits).astype(jnp.float32)
    log_q = jax.nn.log_softmax(logits, -1)
    ce = -jnp.sum(jnp.exp(log_p) * log_q, -1)  # [B, L]
    correct = (jnp.argmax(logits, -1) == label) & counted
    return jnp.sum(jnp.where(counted, ce, 0.0)), jnp.sum(correct)


def eagle3_loss(params, tparams, tokens, loss_mask, valid, vocab, weights, rows=None, *,
                cfg: Eagle3Config, tcfg: TargetConfig):
    """The training-time-test loss (module docstring) and metrics.

    Args:
      params: the drafter's (``Eagle3Model``) parameters.
      tparams: the frozen target's parameters.
      tokens: int32[B, L] prompt + response, right-padded.
      loss_mask: bool[B, L] response tokens.
      valid: bool[B, L] real tokens (False: padding).
      vocab: int32[Vd] the draft vocabulary's target ids (sorted; draft id = index).
      weights: float32[k] the weight of each unrolled step (k = the steps unrolled).
      rows: int32[B, W] the positions the drafter runs at (``Eagle3Model.unroll``; default all);
        they must include every position of a counted pair (:func:`loss_rows` gives them), and
        entries >= L are padding (never counted).
    Returns (loss, metrics): ``loss`` = sum_s weights[s] * loss_s; metrics ``loss``,
    ``step_loss`` float32[k], ``accuracy_per_pos`` float32[k] (top-1 agreement with the
    target's argmax at step s, over the counted pairs) and ``num_labels`` (step 0's count).
    """
    steps = int(weights.shape[0])
    target_logits, taps = teacher(tcfg, tparams, tokens, cfg.target_layer_ids)
    log_p, counted, label = ttt_targets(target_logits, loss_mask, vocab, steps)
    if rows is not None:
        B, L = tokens.shape
        inside = rows < L
        rows = jnp.minimum(rows, L - 1)
        at = lambda x: jnp.take_along_axis(x, rows.reshape(1, *rows.shape, *([1] * (x.ndim - 3))), axis=2)
        log_p, counted, label = at(log_p), at(counted) & inside[None], at(label)
    model = Eagle3Model(cfg)
    emb = family_of(tcfg).embed(tparams, tokens)
    dtype = jax.tree.leaves(params)[0].dtype
    hidden = model.apply({"params": params}, emb.astype(dtype), taps.astype(dtype), valid, steps,
                         rows, method=Eagle3Model.unroll)  # [k, B, W, D]
    # rematerialised: the backward pass keeps no [B, L, Vd] logits per step
    ce_of = jax.checkpoint(functools.partial(step_ce, model))
    losses, accs = [], []
    for s in range(steps):
        total, correct = ce_of(params, hidden[s], log_p[s], counted[s], label[s])
        n = jnp.sum(counted[s])
        losses.append(total / jnp.maximum(n, 1))
        accs.append(correct / jnp.maximum(n, 1))
    step_loss = jnp.stack(losses)
    loss = jnp.sum(weights * step_loss)
    return loss, {"loss": loss, "step_loss": step_loss, "accuracy_per_pos": jnp.stack(accs),
                  "num_labels": jnp.sum(counted[0])}


@functools.partial(jax.jit, static_argnames=("cfg", "tcfg"))
def eval_eagle3_loss(params, tparams, tokens, loss_mask, valid, vocab, weights, rows=None, *, cfg, tcfg):
    """Jitted :func:`eagle3_loss` (tests and evaluation)."""
    return eagle3_loss(params, tparams, tokens, loss_mask, valid, vocab, weights, rows, cfg=cfg, tcfg=tcfg)


def loss_rows(loss_mask: np.ndarray, lengths: np.ndarray, steps: int, bucket: int = 32) -> np.ndarray:
    """The positions the training-time test must run at (host side): a pair (j, s) counts only
    when x_{j+2+s} is a response token, so a row needs the positions from ``steps + 1`` before its
    first response token to its end. int32[B, W], W the longest such span rounded up to
    ``bucket`` (fewer shapes to compile); entries past a row's span run on past it (>= L: padding).

    loss_mask: bool[B, L]; lengths: int[B] real tokens per row."""
    mask = np.asarray(loss_mask, bool)
    B, L = mask.shape
    first = np.where(mask.any(1), mask.argmax(1), np.asarray(lengths))
    start = np.maximum(first - 1 - int(steps), 0)
    span = int(np.max(np.asarray(lengths) - start, initial=1))
    W = min(L, max(bucket, -(-span // bucket) * bucket))
    start = np.minimum(start, L - W)  # keep every row's window inside the sequence
    return (start[:, None] + np.arange(W)[None, :]).astype(np.int32)


# ------------------------------------------------------------------ the trainer
class Eagle3Trainer(Trainer):
    """EAGLE-3's objective in the shared trainer (:class:`~dflash_jax.training.trainer.Trainer`:
    data order, optimizer, checkpoints, resume, metrics, tau): the EAGLE-3 model's initial
    state, the training-time-test step, the held-out tau of its chain and its own run record
    (``method: eagle3``, the TTT settings and the draft vocabulary's digest).

    ``draft_vocab``: the target ids of the draft vocabulary (sorted), e.g.
    :func:`select_draft_vocab` of the training data; a resume must give the same ones. Offline
    features and meshes are not supported (the loss needs the target's logits; the drafter runs
    on one device).
    """

    method = "eagle3"
    ignored_settings = DFLASH_ONLY

    def __init__(self, target, config: Eagle3Config, data: TokenDataset, run_dir: str, cfg: TrainConfig,
                 eagle: Eagle3TrainConfig, draft_vocab, eval_prompts: Sequence[Sequence[int]] | None = None,
                 init_from: str | None = None, mesh=None):
        if mesh is not None:
            raise ValueError("EAGLE-3 training runs on one device (drop --mesh)")
        vocab = np.asarray(draft_vocab)
        if vocab.shape != (config.draft_vocab_size,) or not np.all(np.diff(vocab) > 0):
            raise ValueError(f"the draft vocabulary must be {config.draft_vocab_size} distinct sorted "
                             f"target ids (draft_vocab_size), got shape {vocab.shape}")
        config.check_target(target.config)
        self.ecfg, self.vocab = eagle, vocab.astype(np.int32)
        super().__init__(target, config, data, run_dir, cfg, eval_prompts, init_from=init_from)
        self._vocab_dev = jnp.asarray(self.vocab)
        path = os.path.join(self.run_dir, VOCAB_FILE)
        if jax.process_index() == 0 and not os.path.exists(path):
            write_json(path, self.vocab.tolist())

    # ------------------------------------------------------------------ the objective
    def _check_init_from(self, init_from: str) -> None:
        loaded = Eagle3Config.from_pretrained(init_from, self.target.config)
        if loaded != self.dcfg:
            raise ValueError(f"{init_from} holds an EAGLE-3 drafter with another config ({loaded}); "
                             f"expected {self.dcfg}")

    def _loss_weights(self) -> jax.Array:
        return jnp.asarray(self.ecfg.weights())

    def record_settings(self) -> dict:
        return {"eagle3": dataclasses.asdict(self.ecfg), "draft_vocab_sha256": vocab_digest(self.vocab)}

    def init_params(self, key):
        return init_eagle3_params(self.dcfg, key, jnp.float32)

    def load_params(self, init_from: str):
        loaded = handle.load(init_from, self.target, dtype=jnp.float32)
        if not np.array_equal(loaded.draft_vocab, self.vocab):
            raise ValueError(f"{init_from} has another draft vocabulary than this run's: give "
                             "--draft-vocab-size and data that select the same one")
        return loaded.params

    def batch(self, step: int):
        """(tokens int32[B, W], loss_mask bool[B, W], valid bool[B, W], rows int32[B, R]) of
        training step ``step``: the shared rows (``step_rows``, the same data order as every
        method), W its longest row rounded up; ``rows`` (:func:`loss_rows`): the positions the
        drafter runs at."""
        _, ids, width = self.step_rows(step)
        tokens, mask = self.data.tokens[ids, :width], self.data.loss_mask[ids, :width]
        valid = np.arange(width)[None, :] < self.data.lengths[ids][:, None]
        rows = loss_rows(mask, np.minimum(self.data.lengths[ids], width), int(self.ecfg.ttt_steps))
        return tokens, mask, valid, rows

    def loss(self, params, tparams, tokens, loss_mask, valid, rows):
        return eagle3_loss(params, tparams, tokens, loss_mask, valid, self._vocab_dev, self.weights,
                           rows, cfg=self.dcfg, tcfg=self.target.config)

    def drafter(self, params) -> Eagle3Drafter:
        """The drafter of ``params`` in the target's dtype, with this run's vocabulary."""
        return Eagle3Drafter(self.dcfg, jax.tree.map(lambda x: x.astype(self.target.dtype), params),
                             d2t_of_vocab(self.vocab))

    def eval_options(self) -> dict:
        """The held-out tau drafts chains of ``ttt_steps`` drafts."""
        return {"block_size": int(self.ecfg.ttt_steps) + 1}

    def row_metrics(self, done: int, m: dict) -> dict:
        return super().row_metrics(done, m) | {"step_loss": [round(float(x), 4) for x in m["step_loss"]]}


TRAINER = Eagle3Trainer  # DraftingMethod.trainer


# ------------------------------------------------------------------ the train command's part
def add_train_arguments(p) -> None:
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


def train_from_args(args, cfg: TrainConfig) -> None:
    """``train --method eagle3``: an EAGLE-3 drafter, on one device."""
    eagle = Eagle3TrainConfig(**{k: getattr(args, k) for k in ("ttt_steps", "ttt_decay")
                                 if getattr(args, k) is not None})
    target = load_target(args.target, dtype=jnp.dtype(args.target_dtype) if args.target_dtype else None,
                         quantize=getattr(args, "quantize", None))
    data = TokenDataset(args.data)
    eval_prompts = data.hold_out(args.eval_prompts) if args.eval_prompts else None
    init_from = handle.resolve(args.init_from) if args.init_from else None
    if init_from:
        if args.draft_vocab_size is not None or args.eagle3_layers is not None:
            raise ValueError("--init-from gives the drafter's config and draft vocabulary: drop "
                             "--draft-vocab-size and --eagle3-layers")
        start = handle.load(init_from, target)
        config, vocab = start.config, start.draft_vocab
    else:
        size = target.config.vocab_size if args.draft_vocab_size is None else args.draft_vocab_size
        vocab = select_draft_vocab(data, size, target.config.vocab_size)
        config = Eagle3Config.for_target(target.config, len(vocab), args.eagle3_layers)
    Eagle3Trainer(target, config, data, args.run, cfg, eagle, vocab, eval_prompts,
                  init_from=init_from).run(stop_after=args.stop_after)
