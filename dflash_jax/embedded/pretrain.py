"""Pretraining of the embedded target: next-token cross-entropy on the packed corpus in the
drafter trainer's loop (``dflash_jax/training/loop.py``: optax AdamW + warmup/cosine, Orbax
checkpoints, exact resume, JSONL metrics; the run directory of ``training/run_dir.py``). The
batch of step s depends only on (seed, s), so a killed run resumes without repeating or losing
a step.

    python -m dflash_jax build-corpus --out runs/corpus
    python -m dflash_jax pretrain --corpus runs/corpus --run runs/target --preset cpu
    python -m dflash_jax export-target --corpus runs/corpus --run runs/target --out DIR

Fine-tuning an existing target instead (e.g. the embedded one on GSM8K train alone): the corpus
is built with that target's tokenizer and the run starts from its weights:

    python -m dflash_jax build-corpus --out runs/gsm8k --sources gsm8k_train --tokenizer embedded
    python -m dflash_jax pretrain --corpus runs/gsm8k --run runs/ft --init-from embedded --steps 150
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dflash_jax.checkpoints import save_tokenizer
from dflash_jax.config import TargetConfig
from dflash_jax.files import atomic_path, write_json
from dflash_jax.targets import init_target_params, target_forward
from dflash_jax.training.loop import batch_rows, make_optimizer, make_schedule, run_loop
from dflash_jax.training.run_dir import (METRICS_FILE, RUN_FILE, START_EVAL_FILE, check_run_file,
                                         checkpoint_manager, restore_latest)
from dflash_jax.models.handles import Target

# Model shapes: "cpu" (16.8M parameters, 4 layers: ~1550 tokens/s on 2 CPU cores, so the
# default 1200 steps of 16 x 256 tokens take about 55 minutes; 2600 steps fit in two hours);
# "gpu" (~89M parameters) is for a single accelerator.
MODEL_PRESETS = {
    "cpu": dict(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8,
                num_kv_heads=4, head_dim=64),
    "gpu": dict(hidden_size=768, intermediate_size=2304, num_layers=12, num_heads=12,
                num_kv_heads=4, head_dim=64),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=8),  # tests
    # a small hybrid (Qwen3.5-shaped) target: three Gated DeltaNet layers and one gated
    # attention layer, GDN 4 key / 8 value heads of 32, partial RoPE; for a trained hybrid pair
    # (tree-bench and the tree ablation on a hybrid target, results/hybrid/pair)
    "hybrid-cpu": dict(model_type="qwen3_5_text", hidden_size=256, intermediate_size=768, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=64,
                       layer_types=["linear_attention"] * 3 + ["full_attention"],
                       linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
                       linear_value_head_dim=32, linear_conv_kernel_dim=4, partial_rotary_factor=0.25),
}


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """The pretraining settings; every field is an option of ``python -m dflash_jax pretrain``.

    Attributes:
        steps: training steps of the whole run
        batch_size: packed corpus rows per step
        learning_rate: peak AdamW learning rate (linear warmup, then cosine decay to 0)
        warmup_fraction: fraction of the run's steps that warm the learning rate up
        grad_clip: clip the gradients to this global norm
        weight_decay: AdamW weight decay
        seed: seed of the initial weights and the order of the rows
        checkpoint_every: save a checkpoint every this many steps (and at the end)
        keep_checkpoints: how many of the newest checkpoints to keep
        eval_every: held-out loss every this many steps (0: only at the end)
        eval_rows: held-out rows the loss is measured on
    """

    steps: int = 1200
    batch_size: int = 16
    learning_rate: float = 2e-3
    warmup_fraction: float = 0.03
    grad_clip: float = 1.0
    weight_decay: float = 0.1
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    eval_every: int = 100
    eval_rows: int = 64


def model_config(preset: str, vocab_size: int, eos_id: int, max_len: int = 2048) -> TargetConfig:
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    fields = dict(MODEL_PRESETS[preset])
    model_type = fields.pop("model_type", "qwen3")
    if model_type != "qwen3":  # a hybrid preset: its family's config class
        from dflash_jax.targets.hybrid import HybridConfig

        return HybridConfig(model_type=model_type, vocab_size=vocab_size, max_position_embeddings=max_len,
                            tie_word_embeddings=True, eos_token_id=(eos_id,),
                            **{**fields, "layer_types": tuple(fields["layer_types"])})
    return TargetConfig(model_type="qwen3", vocab_size=vocab_size, max_position_embeddings=max_len,
                        tie_word_embeddings=True, eos_token_id=(eos_id,), **fields)


def lm_loss(params, cfg: TargetConfig, tokens):
    """Mean next-token cross-entropy of packed rows tokens [B, L]."""
    B, L = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(L - 1, dtype=jnp.int32), (B, L - 1))
    logits, _, _ = target_forward(cfg, params, tokens[:, :-1], pos)
    return jnp.mean(optax.losses.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:].astype(jnp.int32)))


BATCH_STREAM = 11  # pretraining's stream of batch orders (training.loop.batch_rows)


class Pretrainer:
    """Trains ``cfg`` on ``corpus_dir`` in ``run_dir`` (run.json, checkpoints/, metrics.jsonl)."""

    def __init__(self, corpus_dir: str, run_dir: str, preset: str, pcfg: PretrainConfig,
                 init_from: str | None = None):
        """``init_from``: a target (checkpoint directory or ``"embedded"``) whose weights the run
        starts from instead of ``preset``'s random ones; the corpus must have been tokenized with
        its tokenizer (``build-corpus --tokenizer``)."""
        with open(os.path.join(corpus_dir, "corpus.json")) as f:
            self.corpus = json.load(f)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(os.path.join(corpus_dir, "tokenizer"))
        self.train = np.load(os.path.join(corpus_dir, "train.npy"))
        self.heldout = np.load(os.path.join(corpus_dir, "heldout.npy"))
        if len(self.train) < pcfg.batch_size:
            raise ValueError(f"the corpus has {len(self.train)} rows, fewer than batch_size {pcfg.batch_size}")
        self.corpus_dir, self.preset, self.pcfg = os.path.realpath(corpus_dir), preset, pcfg
        self.init_from, self._init_params = init_from, None
        init_path = None if init_from is None else self._check_init(init_from)
        self.run_dir = os.path.abspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        check_run_file(self.run_dir, self._run_record())
        if init_path is None:
            self.cfg = model_config(preset, self.corpus["vocab_size"], self.tokenizer.eos_token_id)
        else:
            from dflash_jax.checkpoints import load_target_params

            # float32 weights to train (a released FP8 file dequantized, not kept as stored)
            self.cfg, self._init_params = load_target_params(init_path, dtype=jnp.float32, keep_fp8=False)
        self.tx = make_optimizer(pcfg)
        self.schedule = make_schedule(pcfg)
        self.manager = checkpoint_manager(self.run_dir, pcfg.keep_checkpoints)

        def step_fn(state, tokens):
            loss, grads = jax.value_and_grad(lm_loss)(state["params"], self.cfg, tokens)
            updates, opt = self.tx.update(grads, state["opt_state"], state["params"])
            m = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": self.schedule(state["step"])}
            return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt,
                    "step": state["step"] + 1}, m

        self._step = jax.jit(step_fn, donate_argnums=0)
        self._eval = jax.jit(lambda p, t: lm_loss(p, self.cfg, t))

    def _check_init(self, init_from: str):
        """The directory of the target ``init_from``, checked to share the corpus's tokenizer
        (before any weight is read or the run directory is written)."""
        from transformers import AutoTokenizer

        from dflash_jax.hub import resolve_checkpoint

        path = resolve_checkpoint(init_from)
        if AutoTokenizer.from_pretrained(path).get_vocab() != self.tokenizer.get_vocab():
            raise ValueError(f"the corpus {self.corpus_dir} was tokenized with another tokenizer than "
                             f"{init_from}'s; build it with build-corpus --tokenizer {init_from}")
        return path

    def _run_record(self) -> dict:
        train = {"train": dataclasses.asdict(self.pcfg), "corpus": self.corpus_dir}
        if self.init_from is not None:  # the started target's shapes, not a preset's
            return {"preset": None, "model": None, **train, "init_from": self.init_from}
        return {"preset": self.preset, "model": MODEL_PRESETS[self.preset], **train}

    def restore_or_init(self) -> dict:
        params = (self._init_params if self._init_params is not None
                  else init_target_params(self.cfg, jax.random.key(self.pcfg.seed), jnp.float32))
        return restore_latest(self.manager, {"params": params, "opt_state": self.tx.init(params),
                                             "step": jnp.int32(0)})

    def heldout_loss(self, params) -> float:
        rows = self.heldout[: self.pcfg.eval_rows]
        losses = [float(self._eval(params, jnp.asarray(rows[i:i + 16], jnp.int32)))
                  for i in range(0, len(rows) - 15, 16)]
        return float(np.mean(losses))

    def batch(self, step: int) -> tuple[jax.Array]:
        """(tokens int32[batch_size, L],): the packed rows of training step ``step``."""
        _, rows = batch_rows(step, len(self.train), self.pcfg.batch_size, self.pcfg.seed, BATCH_STREAM)
        return (jnp.asarray(self.train[rows], jnp.int32),)

    def run(self, stop_after: int | None = None, max_minutes: float | None = None) -> dict:
        """Trains to ``steps`` (or ``stop_after`` more steps, or until ``max_minutes`` pass,
        ending on a checkpoint); :func:`~dflash_jax.training.loop.run_loop`. A run started
        ``init_from`` a target first records that target's held-out loss (``start_eval.json``)."""
        L = self.train.shape[1]
        start = os.path.join(self.run_dir, START_EVAL_FILE)
        if self._init_params is not None and not os.path.exists(start):
            write_json(start, {"heldout_loss": self.heldout_loss(self._init_params), "step": 0})

        def evaluate(state, done, last):
            if (self.pcfg.eval_every and done % self.pcfg.eval_every == 0) or last:
                return {"heldout_loss": self.heldout_loss(state["params"])}
            return {}

        return run_loop(
            self.restore_or_init(), self._step, self.batch, self.manager,
            os.path.join(self.run_dir, METRICS_FILE), num_steps=self.pcfg.steps,
            checkpoint_every=self.pcfg.checkpoint_every, tokens_per_step=self.pcfg.batch_size * L,
            row_metrics=lambda done, m: {"tokens_seen": done * self.pcfg.batch_size * L},
            evaluate=evaluate, stop_after=stop_after, max_minutes=max_minutes,
            desc="pretraining target",
            postfix=lambda row: {"loss": f"{row['loss']:.3f}", "tok_s": f"{row['tokens_per_s']:.0f}"})


def export_target(run_dir: str, corpus_dir: str, out_dir: str, dtype=jnp.bfloat16,
                  command: str = "") -> dict:
    """Writes the run's newest target as a Hugging Face directory (config, bf16 safetensors,
    tokenizer, README model card) and returns the card's facts."""
    with open(os.path.join(run_dir, RUN_FILE)) as f:
        record = json.load(f)
    pcfg = PretrainConfig(**record["train"])
    pre = Pretrainer(corpus_dir, run_dir, record["preset"], pcfg, init_from=record.get("init_from"))
    state = pre.restore_or_init()
    step = int(state["step"])
    if step == 0:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints yet")
    held = pre.heldout_loss(state["params"])
    start = os.path.join(run_dir, START_EVAL_FILE)
    if os.path.exists(start):  # a fine-tune: the held-out loss of the target it started from
        with open(start) as f:
            record["start_heldout_loss"] = round(json.load(f)["heldout_loss"], 4)
    params = jax.tree.map(lambda x: x.astype(dtype), state["params"])
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    facts = {"parameters": n_params, "steps": step, "tokens_seen": step * pcfg.batch_size * pre.train.shape[1],
             "heldout_loss": round(held, 4), "heldout_loss_bf16": round(pre.heldout_loss(
                 jax.tree.map(lambda x: x.astype(jnp.float32), params)), 4),
             "preset": record["preset"],
             **{k: record[k] for k in ("init_from", "start_heldout_loss") if k in record},
             "train": record["train"], "corpus": pre.corpus,
             "command": command}
    with atomic_path(out_dir) as tmp:  # the directory appears complete or not at all
        Target(pre.cfg, params).save(tmp)
        save_tokenizer(pre.tokenizer, tmp)
        write_json(os.path.join(tmp, "training.json"), facts)
    return facts
