"""Training data: prompts in, target-regenerated token shards out (docs/method.md section 5).

A dataset directory holds ``shard-00000.npz`` ... with ``tokens`` int32[n, L] (prompt +
response, right-padded with 0), ``loss_mask`` bool[n, L] (True on response tokens) and
``lengths`` int32[n], plus ``metadata.json`` (target, settings, counts). Shards are written
atomically; a rerun skips shards that are already complete.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np
from dflash_jax.progress import progress

from dflash_jax.files import atomic_path, check_settings, write_json
from dflash_jax.prompts import encode_prompt, has_thinking_switch
from dflash_jax.decoding.generation import generate


def read_prompt_file(path: str) -> list[Any]:
    """Reads a jsonl file of prompts. Each line is a JSON object with one of:
    ``prompt`` (text), ``messages`` / ``conversations`` (chat turns ``{role, content}``; the
    last assistant turn, if any, is dropped), ``turns`` (user texts; the first is used), or
    ``prompt_ids`` (token ids, used as they are). A bare JSON string is a text prompt."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if isinstance(row, str):
                out.append(row)
            elif isinstance(row, dict) and "prompt_ids" in row:
                out.append([int(t) for t in row["prompt_ids"]])
            elif isinstance(row, dict) and "prompt" in row:
                out.append(str(row["prompt"]))
            elif isinstance(row, dict) and ("messages" in row or "conversations" in row):
                turns = [dict(role=t.get("role", t.get("from")), content=t.get("content", t.get("value")))
                         for t in row.get("messages", row.get("conversations"))]
                if turns and turns[-1]["role"] in ("assistant", "gpt"):
                    turns = turns[:-1]
                out.append(turns)
            elif isinstance(row, dict) and "turns" in row:
                out.append(str(row["turns"][0]))
            else:
                raise ValueError(f"{path}:{n}: expected a 'prompt', 'messages', 'conversations', "
                                 "'turns' or 'prompt_ids' field")
    if not out:
        raise ValueError(f"{path}: no prompts found")
    return out


def pack_rows(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], max_len: int):
    """(tokens, loss_mask, lengths) arrays for prompt + response rows, truncated to max_len."""
    n = len(prompts)
    tokens = np.zeros((n, max_len), np.int32)
    mask = np.zeros((n, max_len), bool)
    lengths = np.zeros(n, np.int32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seq = (list(p) + list(r))[:max_len]
        tokens[i, :len(seq)] = seq
        mask[i, len(p):len(seq)] = True
        lengths[i] = len(seq)
    return tokens, mask, lengths


def shard_path(out_dir: str, i: int) -> str:
    return os.path.join(out_dir, f"shard-{i:05d}.npz")


def write_npz_atomic(path: str, **arrays) -> None:
    """``np.savez`` to ``path`` atomically (:func:`dflash_jax.files.atomic_path`)."""
    with atomic_path(path, keep_extension=True) as tmp:
        np.savez(tmp, **arrays)


def regenerate(target, prompts: Sequence[Any], out_dir: str, *, max_new_tokens: int = 256,
               max_len: int = 1024, batch_size: int = 16, shard_size: int = 256,
               temperature: float = 0.0, top_k=None, top_p=None, seed: int = 0,
               stop_token_ids: Iterable[int] | None = None, source: str = "",
               enable_thinking: bool = False) -> dict:
    """Has ``target`` answer every prompt with our batched on-device ``generate`` and writes
    token shards. Finished shards (from an earlier, interrupted run with the same settings)
    are skipped. Returns the metadata.

    Text and chat prompts go through the target's chat template with the thinking switch
    ``enable_thinking`` (Qwen3's; off by default, as the DFlash reference renders prompts:
    a drafter trained on thinking-mode data and used without it, or the other way round,
    loses most of its acceptance). The setting is recorded in ``metadata.json``. A response
    ends at one of ``stop_token_ids`` (default: the target's, ``Target.stop_token_ids``)."""
    os.makedirs(out_dir, exist_ok=True)
    tok = target.tokenizer
    stops = target.stop_token_ids if stop_token_ids is None else list(stop_token_ids)
    settings = dict(max_new_tokens=max_new_tokens, max_len=max_len, temperature=temperature,
                    top_k=top_k, top_p=top_p, seed=seed, stop_token_ids=stops, shard_size=shard_size,
                    num_prompts=len(prompts), target=target.path, source=source,
                    enable_thinking=bool(enable_thinking))
    if getattr(target, "quantization", None):  # answers of a quantized target are other data
        settings["target_quantization"] = target.quantization
    meta_file = os.path.join(out_dir, "metadata.json")
    # data written before enable_thinking was recorded resumes when the template has no such
    # switch: the prompts are the same either way
    added = None if has_thinking_switch(tok) else {"enable_thinking": settings["enable_thinking"]}
    check_settings(meta_file, settings, section="settings", added=added,
                   holder=f"{out_dir} holds data made",
                   remedy="use a new output directory, or rerun with the same settings")
    write_json(meta_file, {"settings": settings, "complete": False})

    encoded = [encode_prompt(p, tok, enable_thinking=enable_thinking) for p in prompts]
    for i, p in enumerate(encoded):
        if len(p) + 2 > max_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens, too long for max_len={max_len}")
    num_shards = -(-len(encoded) // shard_size)
    counts = {"sequences": 0, "response_tokens": 0, "stopped": 0}
    bar = progress(total=len(encoded), desc="regenerating responses", unit="prompt")
    bar.write("compiling generation for the first batch (later batches of the same shape reuse it) ...")
    for s in range(num_shards):
        lo, hi = s * shard_size, min((s + 1) * shard_size, len(encoded))
        path = shard_path(out_dir, s)
        if not os.path.exists(path):
            responses, stopped = [], 0
            for b in range(lo, hi, batch_size):
                batch = encoded[b:min(b + batch_size, hi)]
                budget = [min(max_new_tokens, max_len - len(p)) for p in batch]
                r = generate(target, batch, budget, temperature=temperature, top_k=top_k,
                             top_p=top_p, stop_token_ids=stops, seed=seed + b)
                responses += r.sequences
                stopped += r.finish_reasons.count("stop")
                bar.update(len(batch))
            tokens, mask, lengths = pack_rows(encoded[lo:hi], responses, max_len)
            write_npz_atomic(path, tokens=tokens, loss_mask=mask, lengths=lengths,
                             stopped=np.array(stopped))
        else:
            bar.update(hi - lo)
        with np.load(path) as z:
            counts["sequences"] += int(z["tokens"].shape[0])
            counts["response_tokens"] += int(z["loss_mask"].sum())
            counts["stopped"] += int(z["stopped"])
    bar.close()
    meta = {"settings": settings, "complete": True, "num_shards": num_shards, **counts}
    write_json(meta_file, meta)
    return meta


def check_hold_out(n: int, num_sequences: int) -> None:
    """The check of :meth:`TokenDataset.hold_out`: ``n`` held-out sequences must leave at least
    one of ``num_sequences`` to train on (callers can check their settings before any data exists)."""
    if not 0 <= n < num_sequences:
        raise ValueError(f"cannot hold out {n} of {num_sequences} sequences")


class TokenDataset:
    """All shards of a data directory in memory: tokens [n, L], loss_mask [n, L], lengths [n]."""

    def __init__(self, data_dir: str):
        files = sorted(glob.glob(os.path.join(data_dir, "shard-*.npz")))
        files = [f for f in files if not f.endswith(".tmp.npz")]
        if not files:
            raise FileNotFoundError(f"no shard-*.npz files in {data_dir!r}: run `python -m dflash_jax "
                                    "train-data` first")
        parts = [np.load(f) for f in files]
        self.tokens = np.concatenate([p["tokens"] for p in parts])
        self.loss_mask = np.concatenate([p["loss_mask"] for p in parts])
        self.lengths = np.concatenate([p["lengths"] for p in parts])
        self.data_dir = data_dir

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def prompt(self, i: int) -> list[int]:
        """The prompt of row i: its tokens before the first response token."""
        resp = np.nonzero(self.loss_mask[i])[0]
        end = int(resp[0]) if resp.size else int(self.lengths[i])
        return self.tokens[i, :end].tolist()

    def hold_out(self, n: int) -> list[list[int]]:
        """Removes the last n rows from training and returns their prompts (for tau evaluation)."""
        check_hold_out(n, len(self))
        prompts = [self.prompt(i) for i in range(len(self) - n, len(self))]
        keep = len(self) - n
        self.tokens, self.loss_mask, self.lengths = self.tokens[:keep], self.loss_mask[:keep], self.lengths[:keep]
        return prompts
