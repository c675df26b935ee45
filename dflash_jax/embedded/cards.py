"""Model cards (README.md) of the embedded target and drafter, from their training records
and a ``bench`` report. They record commands as the build gives them: its own command without
this machine's absolute paths, its stages' with paths relative to the work directory."""

from __future__ import annotations

import json
import os

from dflash_jax.training.blocks import default_gamma
from dflash_jax.training.run_dir import held_out_curve


def _load(path):
    with open(path) as f:
        return json.load(f)


def target_card(target_dir: str, recipe: dict | None = None) -> str:
    """``recipe``: the build's recipe (``recipe.json`` of the drafter), whose ``commands`` is the
    portable rebuild command."""
    t = _load(os.path.join(target_dir, "training.json"))
    c = _load(os.path.join(target_dir, "config.json"))
    tr, corpus = t["train"], t["corpus"]
    src = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in corpus["train"]["tokens_by_source"].items())
    return f"""# dflash-jax embedded target (Qwen3 architecture, {t['parameters'] / 1e6:.1f}M parameters)

A small Qwen3-architecture language model trained from scratch by this project's own code
(`dflash_jax.embedded.pretrain`) so that DFlash can be shown on a real, trained model without
a GPU or a network. It is weak as a language model; it exists to be drafted for.

- Architecture: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, SwiGLU {c['intermediate_size']},
  {c['num_attention_heads']} query / {c['num_key_value_heads']} KV heads of {c['head_dim']}, tied embeddings,
  vocabulary {c['vocab_size']} (byte-level BPE trained on the corpus; `<|endoftext|>` = eos,
  `<|mask|>` = the drafter's mask token, chat format `<|user|>` / `<|assistant|>`).
- Weights: bfloat16 safetensors (trained in float32).
- Corpus (`python -m dflash_jax build-corpus`): Python {corpus['python']} standard library sources
  (tests excluded, deduplicated) and its documented functions as HumanEval-style tasks, GSM8K
  train solutions and MBPP non-test tasks (instruction examples repeated twice). Test splits
  are held out. Training tokens by source: {src}.
- Training: {t['steps']} steps of {tr['batch_size']} x {corpus['seq_len']} tokens
  ({t['tokens_seen'] / 1e6:.2f}M tokens seen, {t['tokens_seen'] / corpus['train']['tokens']:.2f} epochs),
  AdamW lr {tr['learning_rate']} (warmup {tr['warmup_fraction']:.0%}, cosine to 0), weight decay
  {tr['weight_decay']}, clip {tr['grad_clip']}, float32 on 2 CPU cores.
- Held-out loss (2 % of documents, {corpus['heldout']['tokens'] / 1e3:.0f}k tokens): {t['heldout_loss']:.3f} nats/token
  (float32 weights; {t['heldout_loss_bf16']:.3f} with the shipped bfloat16 weights).
- Commands: {_commands(t, recipe)}.
"""


def _commands(t: dict, recipe: dict | None) -> str:
    """How the target was made: the build command and its stages (paths relative to the
    build's work directory, as the stages record them)."""
    stages = (f"`python -m dflash_jax build-corpus --out corpus`, `python -m dflash_jax pretrain --corpus "
              f"corpus --run target-run --preset {t.get('preset', 'cpu')} --steps {t['train']['steps']}` "
              f"and `{t['command']}`")
    if recipe and recipe.get("commands"):
        return f"{recipe['commands']}, whose stages (in its work directory) were {stages}"
    return stages


def drafter_card(drafter_dir: str, recipe: dict, bench: dict | None) -> str:
    c = _load(os.path.join(drafter_dir, "config.json"))
    d = c["dflash_config"]
    lines = [f"""# dflash-jax embedded DFlash drafter

The DFlash block-diffusion drafter of the embedded target (`../target`), in the released
layout (`config.json` with `dflash_config`, `model.safetensors`, bfloat16).

- {c['num_hidden_layers']} drafter layer(s), block size {c['block_size']}, target taps
  {d['target_layer_ids']}, mask token {d['mask_token_id']}; embedding and LM head are the target's.
- Recipe (`dflash_jax.training`): {recipe.get('num_prompts')} training prompts (GSM8K train, MBPP
  non-test, stdlib functions in the HumanEval format; `python -m dflash_jax embedded-prompts`),
  answered greedily by the target (up to {recipe.get('max_new_tokens')} new tokens; `train-data`),
  {recipe.get('steps')} steps of batch {recipe.get('batch_size')} with {recipe.get('num_anchors')} random anchors per
  sequence, loss decay gamma {recipe.get('gamma')}, AdamW lr {recipe.get('learning_rate')}.
- Commands: {recipe.get('commands', '')}
"""]
    ft = recipe.get("finetune")
    if ft:
        lines.append(f"""- Then fine-tuned ({ft['date']}): {ft['why']} {ft['steps']} steps of batch {ft['batch_size']}
  with {ft['num_anchors']} anchors per sequence, AdamW lr {ft['learning_rate']} (warmup 4 %, cosine),
  weight decay {ft['weight_decay']}, on the same data; held-out tau {ft['eval_tau_before']:.2f} before,
  {ft['eval_tau_after']:.2f} after. Commands: {ft['commands']}
""")
    for st in recipe.get("continued", []):
        lines.append(continued_text(st))
    if bench:
        s = bench["settings"]
        lines.append(f"## Acceptance (temperature {s['temperature']}, block {s['block_size']}, "
                     f"{s['max_new_tokens']} new tokens, {s['max_samples']} prompts per set)\n")
        lines.append("| prompt set | tau | speedup vs AR, decode only (CPU) |\n|---|---|---|")
        for name, r in bench["datasets"].items():
            lines.append(f"| {name} | {r['tau']:.2f} | {r['speedup']:.2f}x |")
        lines.append(f"| average | {bench['average']['tau']:.2f} | {bench['average']['speedup']:.2f}x |\n")
        if "average_adaptive" in bench:
            lines.append("With the adaptive block size (`block_size=\"adaptive\"`, the verify length chosen "
                         "per iteration), the same prompts:\n")
            lines.append("| prompt set | tau | speedup vs AR, decode only (CPU) | mean verify length |\n|---|---|---|---|")
            for name, r in bench["datasets"].items():
                a = r["adaptive"]
                lines.append(f"| {name} | {a['tau']:.2f} | {a['speedup']:.2f}x | {a['mean_verify_length']:.1f} |")
            av = bench["average_adaptive"]
            lines.append(f"| average | {av['tau']:.2f} | {av['speedup']:.2f}x | |\n")
        load = bench.get("load_average_before")
        lines.append(f"Measured by `{bench['command']}` on {bench['environment']['device']} "
                     f"({bench['environment']['cpu_count']} cores, jax {bench['environment']['jax']}"
                     + (f", load average {load[0]:.2f} before the run" if load else "") + ").\n")
    return "\n".join(lines)


def write_cards(assets_dir: str, recipe: dict, bench_json: str | None) -> None:
    bench = _load(bench_json) if bench_json else None
    with open(os.path.join(assets_dir, "target", "README.md"), "w") as f:
        f.write(target_card(os.path.join(assets_dir, "target"), recipe))
    with open(os.path.join(assets_dir, "drafter", "README.md"), "w") as f:
        f.write(drafter_card(os.path.join(assets_dir, "drafter"), recipe, bench))


def training_stage(run_dir: str, data_dir: str, **record) -> dict:
    """A continued-training stage of the drafter for ``recipe.json``'s ``continued`` list,
    from a ``train`` run directory (its settings, ``metrics.jsonl``: held-out tau and loss
    against steps, minutes) and its ``train-data`` directory (sequences, response tokens);
    ``record``: what the run directory does not know (date, why, prompts, commands, the
    held-out tau of the starting weights as ``eval_tau_before``)."""
    run = _load(os.path.join(run_dir, "run.json"))
    data = _load(os.path.join(data_dir, "metadata.json"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    train = run["train"]
    curve = tau_curve(rows)
    return {**record, "steps": train["steps"], "batch_size": train["batch_size"],
            "num_anchors": train["num_anchors"], "learning_rate": train["learning_rate"],
            "warmup_fraction": train["warmup_fraction"], "weight_decay": train["weight_decay"],
            "gamma": train.get("gamma") or default_gamma(run["drafter"]["block_size"]),  # None: the default
            "sequences": data["sequences"],
            "response_tokens": data["response_tokens"],
            "minutes": round(sum(r.get("time_s", 0.0) for r in rows) / 60, 1), "curve": curve}


def tau_curve(rows: list[dict]) -> list[dict]:
    """The held-out tau of a run's ``metrics.jsonl`` rows against steps, each with the mean
    training loss of the 50 steps up to it (:func:`~dflash_jax.training.run_dir.held_out_curve`,
    rounded and named as the model cards record it)."""
    return [{"step": c["step"], "eval_tau": round(c["tau"], 4), "train_loss_last_50": round(c["loss"], 4)}
            for c in held_out_curve(rows)]


def continued_text(st: dict) -> str:
    """A continued-training stage as model-card text, with its held-out tau curve."""
    seen = st["steps"] * st["batch_size"] / st["sequences"]
    rows = "\n".join(f"| {c['step']} | {c['eval_tau']:.2f} | {c['train_loss_last_50']:.3f} |" for c in st["curve"])
    return f"""- Then trained further ({st['date']}): {st['why']} Data: {st['prompts']}, answered greedily by
  the target ({st['sequences']} sequences, {st['response_tokens'] / 1e3:.0f}K response tokens). {st['steps']} steps of
  batch {st['batch_size']} with {st['num_anchors']} anchors per sequence ({seen:.1f} epochs), AdamW lr
  {st['learning_rate']} (warmup {st['warmup_fraction']:.0%}, cosine), weight decay {st['weight_decay']},
  loss decay gamma {st['gamma']}; {st['minutes']} minutes of steps on 2 CPU cores. Commands: {st['commands']}

  Held-out tau ({st['eval_prompts']} prompts held out of this data, {st['eval_max_new_tokens']} new tokens,
  greedy, block 16) against steps (step 0: the weights it started from):

  | step | held-out tau | training loss, mean of the last 50 steps |
  |---|---|---|
  | 0 | {st['eval_tau_before']:.2f} | |
{chr(10).join('  ' + r for r in rows.splitlines())}
"""


# ---------------------------------------------------------------------------- budgets, for other drafters' cards
def safetensors_params(path: str, skip: tuple[str, ...] = ()) -> int:
    """The number of parameters in a safetensors file (from its header: any dtype), leaving out
    the tensors named in ``skip``."""
    import math
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__" and k not in skip)


def dflash_budget(recipe: dict) -> dict:
    """The shipped DFlash drafter's training budget, summed over its stages in ``recipe.json``:
    steps, sequences seen (steps x batch), response tokens in them (at each stage's data's mean
    response length), and the minutes where a stage recorded them."""
    stages = [{"steps": recipe["steps"], "batch_size": recipe["batch_size"], "minutes": None, "tokens_per_seq": None}]
    if recipe.get("finetune"):
        stages.append({"steps": recipe["finetune"]["steps"], "batch_size": recipe["finetune"]["batch_size"],
                       "minutes": None, "tokens_per_seq": None})
    stages += [{"steps": c["steps"], "batch_size": c["batch_size"], "minutes": c.get("minutes"),
                "tokens_per_seq": c["response_tokens"] / c["sequences"]} for c in recipe.get("continued", [])]
    timed = [s for s in stages if s["minutes"] is not None]
    return {"stages": len(stages), "steps": sum(s["steps"] for s in stages),
            "sequences_seen": sum(s["steps"] * s["batch_size"] for s in stages),
            "timed_stages": len(timed), "timed_steps": sum(s["steps"] for s in timed),
            "timed_minutes": round(sum(s["minutes"] for s in timed), 1),
            "timed_response_tokens_seen": round(sum(s["steps"] * s["batch_size"] * s["tokens_per_seq"] for s in timed))}
