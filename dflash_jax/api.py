"""The public entry points: ``load_target`` and ``generate``."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.checkpoints import load_target_params, save_target_params
from dflash_jax.config import TargetConfig
from dflash_jax.decoding import autoregressive
from dflash_jax.decoding.sampling import SamplingParams
from dflash_jax.models.target import init_target_params

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclasses.dataclass
class Target:
    """A loaded target LM: static config, parameter pytree, optional tokenizer.

    ``max_len`` is the largest KV cache a ``generate`` call may allocate (prompt plus new
    tokens, per row); it defaults to the model's ``max_position_embeddings``.
    """

    config: TargetConfig
    params: Any
    tokenizer: Any = None
    max_len: int | None = None
    path: str | None = None

    def __post_init__(self):
        if self.max_len is None:
            self.max_len = self.config.max_position_embeddings
        if self.max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {self.max_len}")

    @property
    def dtype(self):
        return self.params["embed_tokens"]["embedding"].dtype

    @classmethod
    def random(cls, config: TargetConfig, seed: int = 0, dtype=jnp.float32,
               max_len: int | None = None, init_scale: float = 0.02) -> "Target":
        """A target with random weights (benchmarks, tests)."""
        return cls(config, init_target_params(config, jax.random.key(seed), dtype, init_scale),
                   max_len=max_len)

    def save(self, path: str | os.PathLike, max_shard_bytes: int | None = None) -> None:
        """Writes config.json + safetensors (and the tokenizer, when there is one)."""
        save_target_params(path, self.config, self.params, max_shard_bytes)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(os.fspath(path))


def load_target(path: str | os.PathLike, dtype=None, max_len: int | None = None) -> Target:
    """Loads a Hugging Face Qwen3 / Llama-3.x checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors (or a sharded index).
      dtype: cast the weights (e.g. ``jnp.bfloat16``); None keeps the stored dtype.
      max_len: KV cache capacity limit; default the config's max_position_embeddings.
    """
    path = os.fspath(path)
    config, params = load_target_params(path, dtype=dtype)
    tokenizer = None
    if any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return Target(config, params, tokenizer, max_len, path)


@dataclasses.dataclass
class GenerateResult:
    """What ``generate`` returns.

    sequences: per prompt, the generated token ids only (a stop token, when hit, is last).
    finish_reasons: per prompt, "stop" (hit a stop token) or "length" (used its budget).
    prefill_time_s / decode_time_s: wall time of the two device stages (the first call of a
      new shape includes compilation; benchmarks warm up first).
    num_steps: iterations of the decode loop (target forward passes after prefill).
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    prompt_lengths: list[int]
    prefill_time_s: float
    decode_time_s: float
    num_steps: int

    @property
    def num_generated(self) -> list[int]:
        return [len(s) for s in self.sequences]


# ---------------------------------------------------------------------------- input checks
def _as_prompt_list(prompts, vocab_size: int) -> list[np.ndarray]:
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim != 2:
            raise ValueError(
                f"a prompt array must have rank 2 [batch, length], got shape {arr.shape}; "
                "for one prompt pass [token_ids]")
        prompts = list(arr)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a list of token-id lists (one list per prompt)")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)):
            raise ValueError(f"prompt {i} is a string: tokenize it first (target.tokenizer.encode)")
        if isinstance(p, (int, np.integer)):
            raise ValueError("prompts must be a list of token-id lists; for one prompt pass [token_ids]")
        arr = np.asarray(p)
        if arr.ndim != 1:
            raise ValueError(f"prompt {i} must be a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompt {i} must hold integer token ids, got dtype {arr.dtype}")
        if arr.min() < 0 or arr.max() >= vocab_size:
            raise ValueError(
                f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): "
                f"min {arr.min()}, max {arr.max()}")
        out.append(arr.astype(np.int32))
    return out


def _per_row(value, batch: int, name: str) -> list:
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) and not np.isscalar(value):
        if len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries for {batch} prompts")
        return list(value)
    return [value] * batch


def _stop_array(stop_token_ids, batch: int, vocab_size: int) -> np.ndarray:
    """int32[B, S] stop ids, -1 padded; accepts one shared list or one list per row."""
    ids = list(stop_token_ids) if stop_token_ids is not None else []
    per_row = ids and all(isinstance(x, (list, tuple, np.ndarray)) for x in ids)
    rows = [list(x) for x in ids] if per_row else [ids] * batch
    if len(rows) != batch:
        raise ValueError(f"stop_token_ids has {len(rows)} per-row lists for {batch} prompts")
    width = max(1, max(len(r) for r in rows))
    out = np.full((batch, width), -1, np.int32)
    for b, r in enumerate(rows):
        for j, t in enumerate(r):
            if not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size:
                raise ValueError(f"stop token id {t!r} is not an id in the vocabulary [0, {vocab_size})")
            out[b, j] = t
    return out


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def plan_lengths(target: Target, prompt_lens: Sequence[int], max_new: Sequence[int],
                 extra: int = 0) -> tuple[int, int]:
    """Padded prompt width and cache length (bucketed so shapes, and compiles, repeat).

    ``extra`` reserves slots past the last token (the speculative block). Raises ValueError
    when a row's prompt + budget exceeds the target's ``max_len``.
    """
    need = [p + m for p, m in zip(prompt_lens, max_new)]
    worst = int(np.argmax(need))
    if need[worst] > target.max_len:
        raise ValueError(
            f"prompt {worst} has {prompt_lens[worst]} tokens and max_new_tokens is "
            f"{max_new[worst]}: {need[worst]} > the cache length max_len={target.max_len}. "
            "Shorten the prompt, lower max_new_tokens, or load the target with a larger max_len.")
    cache_len = min(round_up(max(need) + extra, 64), target.max_len + extra)
    prompt_width = min(round_up(max(prompt_lens), 16), cache_len)
    return prompt_width, cache_len


def generate(target: Target, prompts, max_new_tokens, *, drafter=None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, stop_token_ids=(),
             seed: int = 0) -> GenerateResult:
    """Generates continuations of a batch of (ragged) token-id prompts on device.

    Args:
      target: a loaded :class:`Target`.
      prompts: list of token-id lists (lengths may differ), or an int array [B, T].
      max_new_tokens: new-token budget, one int or one per prompt.
      drafter: a DFlash drafter for speculative decoding (None: autoregressive).
      temperature / top_k / top_p: 0 = greedy; otherwise sampling with these filters.
      stop_token_ids: ids that end a row (one list for all rows, or one list per row).
      seed: PRNG seed for sampling.
    """
    cfg = target.config
    rows = _as_prompt_list(prompts, cfg.vocab_size)
    B = len(rows)
    budgets = _per_row(max_new_tokens, B, "max_new_tokens")
    for m in budgets:
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {m!r}")
    sampling = SamplingParams(float(temperature), top_k, top_p)
    stops = _stop_array(stop_token_ids, B, cfg.vocab_size)
    if drafter is not None:
        raise NotImplementedError("speculative decoding (drafter=) is not implemented yet")

    lens = [len(r) for r in rows]
    width, cache_len = plan_lengths(target, lens, budgets)
    tokens = np.zeros((B, width), np.int32)
    for b, r in enumerate(rows):
        tokens[b, :len(r)] = r
    key_prefill, key_decode = jax.random.split(jax.random.key(seed))
    t0 = time.perf_counter()
    first, cache, _ = autoregressive.prefill(
        target.params, jnp.asarray(tokens), jnp.asarray(lens, jnp.int32), key_prefill,
        cfg=cfg, sampling=sampling, cache_len=cache_len)
    first.block_until_ready()
    t1 = time.perf_counter()
    out, n, steps = autoregressive.decode_loop(
        target.params, cache, first, jnp.asarray(budgets, jnp.int32), jnp.asarray(stops), key_decode,
        cfg=cfg, sampling=sampling, out_len=round_up(max(budgets), 16))
    out, n, steps = jax.device_get((out, n, steps))
    t2 = time.perf_counter()
    return _finish(out, n, stops, lens, t1 - t0, t2 - t1, int(steps))


def _finish(out, n, stops, lens, prefill_s, decode_s, steps) -> GenerateResult:
    seqs, reasons = [], []
    for b in range(out.shape[0]):
        seq = [int(t) for t in out[b, :n[b]]]
        seqs.append(seq)
        reasons.append("stop" if seq and seq[-1] in set(stops[b][stops[b] >= 0].tolist()) else "length")
    return GenerateResult(seqs, reasons, list(lens), prefill_s, decode_s, steps)
