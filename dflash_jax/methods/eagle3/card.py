"""The shipped EAGLE-3 drafter's model card (README.md), from its ``config.json`` and its build's
``recipe.json`` (which carries the DFlash drafter's budget beside its own:
``embedded.cards.dflash_budget``)."""

from __future__ import annotations

import json
import os


def eagle3_card(eagle3_dir: str, recipe: dict) -> str:
    """The EAGLE-3 drafter's model card (README.md) from its ``config.json`` and ``recipe``."""
    with open(os.path.join(eagle3_dir, "config.json")) as f:
        c = json.load(f)
    r, d = recipe, recipe["dflash_budget"]
    curve = "\n".join(f"| {x['step']} | {x['eval_tau']:.2f} | {x['train_loss_last_50']:.3f} |" for x in r["curve"])
    acc = r.get("final_accuracy_per_step")
    acc_text = (" Training accuracy of the last step by drafting step (step 1 = the first draft token): "
                + ", ".join(f"{a:.2f}" for a in acc) + "." if acc else "")
    stopped = (f" The schedule was set for {r['steps_scheduled']} steps (warmup and cosine decay over those); "
               f"it was stopped at step {r['steps']}: {r['why_stopped']}" if r["steps"] < r["steps_scheduled"] else "")
    return f"""# dflash-jax embedded EAGLE-3 drafter

The EAGLE-3 drafter of the embedded target (`../target`), the baseline the shipped DFlash
drafter (`../drafter`) is compared with (docs/eagle3.md). It is stored in the released EAGLE-3
layout: `config.json` (`LlamaForCausalLMEagle3`, `eagle_config`) and `model.safetensors`
(bfloat16, with `d2t` and `t2d`). Load it with `load_drafter("embedded-eagle3", target)`,
or use `bench --drafter embedded-eagle3`.

- **Architecture.** One decoder layer, hidden {c['hidden_size']}, SwiGLU {c['intermediate_size']},
  {c['num_attention_heads']} query and {c['num_key_value_heads']} KV heads of {c['head_dim']}.
  The features are the outputs of target layers {r['feature_layers']}, joined and projected by `fc`.
  The drafter has its own LM head over a draft vocabulary of {r['draft_vocab_size']} tokens: the
  most frequent response tokens of the training data. The embedding is the target's.
  It has {r['parameters'] / 1e6:.2f}M parameters without the embedding. The DFlash drafter has
  {r['dflash_parameters'] / 1e6:.2f}M, with neither embedding nor LM head (it uses the target's).
- **Data.** {r['prompts']} These prompts were answered greedily by the target:
  {r['sequences']} sequences with {r['response_tokens'] / 1e3:.0f}K response tokens. The DFlash
  drafter's last stages were trained on the same kind of data, in more of it.
- **Recipe** (`train --method eagle3`, the DFlash trainer's loop). Training-time test of
  {r['ttt_steps']} steps, step losses weighted {r['ttt_decay']}^s. Soft labels: the target's
  distribution over the draft vocabulary. Batch {r['batch_size']}, AdamW lr {r['learning_rate']}
  (warmup {r['warmup_fraction']:.0%}, cosine), weight decay {r['weight_decay']}, float32 on
  2 CPU cores.{stopped}
- **Commands:** {r['commands']}

## Budget, beside the DFlash drafter's

| | EAGLE-3 (this drafter) | DFlash (`../drafter`) |
|---|---|---|
| parameters (without the target's embedding and head) | {r['parameters'] / 1e6:.2f}M | {r['dflash_parameters'] / 1e6:.2f}M |
| optimiser steps (batch 8) | {r['steps']} | {d['steps']} over {d['stages']} stages |
| sequences seen | {r['sequences_seen']} ({r['sequences_seen'] / r['sequences']:.1f} epochs of {r['sequences']}) | {d['sequences_seen']} |
| response tokens in the sequences seen | {r['response_tokens_seen'] / 1e6:.2f}M | {d['timed_response_tokens_seen'] / 1e6:.2f}M in the {d['timed_stages']} timed stages alone |
| minutes of steps on 2 CPU cores | {r['minutes']} | {d['timed_minutes']} for the {d['timed_stages']} timed stages ({d['timed_steps']} steps); more before them |

The budgets are **not** equal. The EAGLE-3 drafter had about {d['sequences_seen'] / max(r['sequences_seen'], 1):.0f}x
fewer sequences. A step took {60 * r['minutes'] / max(r['steps'], 1):.1f} s for EAGLE-3 against
{60 * d['timed_minutes'] / max(d['timed_steps'], 1):.1f} s for DFlash (the timed stages). EAGLE-3 unrolls
{r['ttt_steps']} drafting steps at every response position, where DFlash trains one pass per
block at its anchors. A comparison drawn from these two drafters is therefore a comparison at
these budgets. The held-out curve below shows how far the EAGLE-3 drafter had got.

## Held-out tau against steps

These are 16 prompts held out of the training data, 64 new tokens, greedy, a chain of
{r['ttt_steps']} drafting steps (so tau is at most {r['ttt_steps'] + 1}).{acc_text}

| step | held-out tau | training loss, mean of the last 50 steps |
|---|---|---|
{curve}
"""
