"""A test-only drafting method, written outside the library to show that a method is an addition:
its config, drafter, checkpoint layout, proposer, training objective and method object are all
here, and one line registers it (``dflash_jax.methods.register(TAP_MLP)``).

The *tap MLP* drafter (Medusa-like heads over one target feature): at an iteration whose anchor
(the bonus token ``b``) sits at position ``s``, it reads the target's feature of the last
committed row (tap ``tap``, position ``s - 1``) and the target's embedding of ``b``, and drafts
the ``K = block_size - 1`` tokens after the anchor in one pass:

    x = silu([feature ; embed(b)] @ w_in)          # [2D] -> [F]
    z_k = x @ w_out[k]                             # [F] -> [D], k = 0 .. K-1
    draft_k = argmax(lm_head(z_k))                 # the target's frozen LM head

Its layout: ``config.json`` (architectures ``["TestTapMlpDrafter"]``, ``hidden_size``,
``vocab_size``, ``num_target_layers``, ``tap``, ``width``, ``block_size``) and
``model.safetensors`` with ``mlp.w_in`` [2D, F] and ``mlp.w_out`` [K, F, D].

It declares what it does not do: trees (one chain of heads) and sampled drafts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from dflash_jax.methods.base import DraftingMethod
from dflash_jax.proposers import Proposal, Proposer
from dflash_jax.targets import family_of
from dflash_jax.training.features import target_features
from dflash_jax.training.trainer import Trainer

ARCHITECTURE = "TestTapMlpDrafter"


@dataclasses.dataclass(frozen=True)
class TapMlpConfig:
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    tap: int
    width: int
    block_size: int

    @property
    def num_heads(self) -> int:
        return self.block_size - 1

    def check_target(self, target) -> None:
        wrong = [f"{f}: drafter {getattr(self, f)}, target {getattr(target, g)}"
                 for f, g in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"),
                              ("num_target_layers", "num_layers")) if getattr(self, f) != getattr(target, g)]
        if not 0 <= self.tap < target.num_layers:
            wrong.append(f"tap {self.tap} is not a layer of the {target.num_layers}-layer target")
        if wrong:
            raise ValueError("tap-MLP drafter and target do not match: " + "; ".join(wrong))

    def to_hf_dict(self) -> dict:
        return {"architectures": [ARCHITECTURE], **dataclasses.asdict(self)}

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "TapMlpConfig":
        return cls(**{f.name: int(d[f.name]) for f in dataclasses.fields(cls)})


def init_params(cfg: TapMlpConfig, key, scale: float = 0.1) -> dict:
    k1, k2 = jax.random.split(key)
    D, F, K = cfg.hidden_size, cfg.width, cfg.num_heads
    return {"w_in": scale * jax.random.normal(k1, (2 * D, F), jnp.float32),
            "w_out": scale * jax.random.normal(k2, (K, F, D), jnp.float32)}


def heads(params, feature, emb):
    """z float32[..., K, D] from the feature [..., D] and the anchor's embedding [..., D]."""
    x = jax.nn.silu(jnp.concatenate([feature, emb], -1).astype(jnp.float32) @ params["w_in"])
    return jnp.einsum("...f,kfd->...kd", x, params["w_out"])


@dataclasses.dataclass
class TapMlpDrafter:
    method_name = "tap-mlp"

    config: TapMlpConfig
    params: Any
    path: str | None = None
    mesh: Any = None

    @classmethod
    def random(cls, target, tap: int, width: int = 48, block_size: int = 4, seed: int = 0) -> "TapMlpDrafter":
        c = target.config
        cfg = TapMlpConfig(c.hidden_size, c.vocab_size, c.num_layers, tap, width, block_size)
        cfg.check_target(c)
        return cls(cfg, init_params(cfg, jax.random.key(seed)))


# ---------------------------------------------------------------------------- the proposer
@dataclasses.dataclass(frozen=True)
class TapMlpProposer(Proposer):
    """State: the last observed rows' features [B, bs, D] and positions [B, bs] (-1: none); a
    proposal reads the row at ``start - 1``, which is always a committed one."""

    cfg: TapMlpConfig
    block_size: int

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return (self.cfg.tap,)

    def _state(self, taps, positions):
        B, T, D = taps.shape
        T = min(T, self.block_size)
        feats = jnp.zeros((B, self.block_size, D), jnp.float32).at[:, :T].set(taps[:, :T])
        pos = jnp.full((B, self.block_size), -1, jnp.int32).at[:, :T].set(positions[:, :T])
        return {"taps": feats, "pos": pos}

    def init(self, spec, params, taps, positions, lengths, cache_len, dtype, *, tokens=None, tparams=None):
        last = jnp.maximum(lengths - 1, 0)
        rows = jnp.arange(taps.shape[0])
        return self._state(taps[rows, last][:, None], positions[rows, last][:, None])

    def observe(self, spec, params, state, taps, positions):
        return self._state(taps, positions)

    def propose(self, spec, tparams, params, state, committed, key, want_logp=False):
        here = state["pos"] == (committed.start - 1)[:, None]  # [B, bs]
        feature = jnp.sum(jnp.where(here[..., None], state["taps"], 0.0), 1)
        emb = spec.family.embed(tparams, committed.bonus)
        logits = spec.family.lm_head(spec.target, tparams, heads(params, feature, emb.astype(jnp.float32))
                                     .astype(emb.dtype))[:, :self.block_size - 1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
        tokens = jnp.argmax(logits, -1).astype(jnp.int32)
        return Proposal(tokens, None, jnp.max(logp, -1) if want_logp else None), state


# ---------------------------------------------------------------------------- training
def tap_mlp_loss(params, tparams, tokens, loss_mask, *, cfg: TapMlpConfig, family, tcfg):
    """Cross-entropy of head k at every position t: from the feature of t and the embedding of
    token t + 1, the token at t + 2 + k, where that token is a response token."""
    taps = target_features(tcfg, tparams, tokens, (cfg.tap,))  # [B, L, D]
    L, K = tokens.shape[1], cfg.num_heads
    emb = family.embed(tparams, tokens[:, 1:]).astype(jnp.float32)  # [B, L-1, D]
    logits = family.lm_head(tcfg, tparams, heads(params, taps[:, :-1].astype(jnp.float32), emb)
                            .astype(taps.dtype)).astype(jnp.float32)  # [B, L-1, K, V]
    t = jnp.arange(L - 1)[:, None] + 2 + jnp.arange(K)[None, :]  # [L-1, K] the label positions
    inside = t < L
    labels = jnp.take(tokens, jnp.minimum(t, L - 1), axis=1)  # [B, L-1, K]
    counted = jnp.take(loss_mask, jnp.minimum(t, L - 1), axis=1) & inside
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    n = jnp.maximum(jnp.sum(counted), 1)
    loss = jnp.sum(jnp.where(counted, nll, 0.0)) / n
    hit = (jnp.argmax(logits, -1) == labels) & counted
    per_head = jnp.sum(hit, (0, 1)) / jnp.maximum(jnp.sum(counted, (0, 1)), 1)
    return loss, {"loss": loss, "accuracy_per_pos": per_head}


class TapMlpTrainer(Trainer):
    """This method's objective in the shared trainer (data order, optimizer, checkpoints,
    resume, metrics, held-out tau): its initial weights, a step's inputs, its loss, its drafter."""

    method = "tap-mlp"
    ignored_settings = ("num_anchors", "anchors", "gamma", "uniform_weights", "anchor_chunk", "context_chunk")

    def init_params(self, key):
        return init_params(self.dcfg, key)

    def batch(self, step: int):
        _, ids, width = self.step_rows(step)
        return self.data.tokens[ids, :width], self.data.loss_mask[ids, :width]

    def loss(self, params, tparams, tokens, loss_mask):
        return tap_mlp_loss(params, tparams, tokens, loss_mask, cfg=self.dcfg,
                            family=family_of(self.target.config), tcfg=self.target.config)

    def drafter(self, params) -> TapMlpDrafter:
        return TapMlpDrafter(self.dcfg, params)


# ---------------------------------------------------------------------------- the method
class TapMlpMethod(DraftingMethod):
    name = "tap-mlp"
    architectures = (ARCHITECTURE,)
    label = "tap MLP"
    unsupported = {"tree": "the tap-MLP drafter drafts one chain (its K heads); it proposes no tree",
                   "sampled_draft": "the tap-MLP drafter drafts greedily (its heads' argmax)"}

    def load(self, path: str, target, dtype=None) -> TapMlpDrafter:
        with open(os.path.join(path, "config.json")) as f:
            cfg = TapMlpConfig.from_hf_dict(json.load(f))
        cfg.check_target(target.config)
        tensors = load_file(os.path.join(path, "model.safetensors"))
        want = {"mlp.w_in": (2 * cfg.hidden_size, cfg.width),
                "mlp.w_out": (cfg.num_heads, cfg.width, cfg.hidden_size)}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if got != want:
            raise ValueError(f"{path}: tensors {got}, expected {want}")
        return TapMlpDrafter(cfg, {k.split(".")[1]: jnp.asarray(v) for k, v in tensors.items()}, path)

    def save(self, drafter: TapMlpDrafter, path) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(drafter.config.to_hf_dict(), f)
        save_file({f"mlp.{k}": np.asarray(v, np.float32) for k, v in drafter.params.items()},
                  os.path.join(path, "model.safetensors"))

    def default_block_size(self, drafter: TapMlpDrafter) -> int:
        return drafter.config.block_size

    def check_options(self, opt, block_size: int) -> None:
        if opt.num_denoise_steps != 1:
            raise ValueError("num_denoise_steps belongs to the DFlash drafter: the tap-MLP drafter drafts in one pass")

    def proposer(self, drafter: TapMlpDrafter, block_size: int, opt, greedy: bool) -> TapMlpProposer:
        if block_size > drafter.config.block_size:
            raise ValueError(f"block_size={block_size}: the tap-MLP drafter has {drafter.config.num_heads} "
                             f"heads (block_size <= {drafter.config.block_size})")
        return TapMlpProposer(drafter.config, block_size)

    def config_from_hf(self, d: Mapping[str, Any]) -> TapMlpConfig:
        return TapMlpConfig.from_hf_dict(d)

    def from_run(self, run_dir: str, record, config: TapMlpConfig, params) -> TapMlpDrafter:
        return TapMlpDrafter(config, params)


TAP_MLP = TapMlpMethod()
