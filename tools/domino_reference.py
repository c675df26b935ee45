"""The Domino reference numbers: SpecForge's own ``DominoDraftModel``
(``specforge/modeling/draft/domino.py`` at a6b6b023, from a fetched snapshot) run on a tiny
target/drafter pair, written to a committed fixture that ``tests/methods/test_domino.py`` checks
this project's Domino against.

The pair is rebuilt from numpy seeds (:func:`write_pair`): the target of
:mod:`dspark_reference` and two Domino drafters, the released variant (``shift_label`` true,
one uncorrected draft) and DFlash's rows (``shift_label`` false, none uncorrected). The greedy
loop is :mod:`dspark_reference`'s, with SpecForge's own drafting: its drafter forward over
``[bonus, MASK * (b-1)]`` and its ``_sample_draft_tokens`` (the GRU's correction, draft by
draft), the target verifying ``[bonus, b-1 drafts]``. Per iteration: the anchor, the drafts, the
backbone's argmax at the drafting rows, the acceptance length.

The training objective: SpecForge's ``OnlineDominoModel``
(``specforge/algorithms/common/dflash_family_model.py``) on both drafters, on
:mod:`specforge_loss_reference`'s fixed batch and anchors, at :data:`LOSS_SETTINGS` (gamma, the
base loss's weight lambda): the loss, its two cross-entropies and, per drafter tensor, its
gradient's norm.

Regenerate (needs torch and transformers)::

    git -C <SpecForge git dir> archive a6b6b023 specforge | tar -x -C /tmp/specforge
    python -m dflash_jax.tools.domino_reference --specforge /tmp/specforge --out tests/fixtures/domino_reference.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile

import numpy as np

from dflash_jax.checkpoints import target_tensor_specs, write_safetensors
from dflash_jax.files import write_json
from dflash_jax.methods.domino.checkpoint import domino_tensor_specs
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.tools import dspark_reference as pair
from dflash_jax.tools.dflash2_reference import seeded_tensors
from dflash_jax.tools import specforge_loss_reference as batch
from dflash_jax.tools.specforge_loss_reference import specforge

SEED = 2028
DRAFTERS = {
    "shifted": DominoConfig.for_target(pair.TARGET, num_layers=2, block_size=5, mask_token_id=63,
                                       target_layer_ids=(0, 2), emb_dim=8, gru_hidden_dim=12, shift_label=True,
                                       pure_draft_prefix_len=1),
    "unshifted": DominoConfig.for_target(pair.TARGET, num_layers=2, block_size=5, mask_token_id=63,
                                         target_layer_ids=(0, 2), emb_dim=8, gru_hidden_dim=12, shift_label=False,
                                         pure_draft_prefix_len=0),
}
LOSS_SETTINGS = ({"loss_decay_gamma": None, "lambda_base": 0.0}, {"loss_decay_gamma": 4.0, "lambda_base": 0.35})
SCALES = {"matrix": 0.3, "norm": 0.1, "head": 1.0}
"""The correction's and GRU's weights at standard deviation 1, so that it overrules the
backbone's argmax on some rows."""


def write_pair(root: str) -> tuple[str, dict[str, str]]:
    rng = np.random.default_rng(SEED)
    target = os.path.join(root, "target")
    os.makedirs(target, exist_ok=True)
    write_safetensors(target, seeded_tensors(target_tensor_specs(pair.TARGET), rng, (), SCALES))
    write_json(os.path.join(target, "config.json"), {**pair.TARGET.to_hf_dict(), "torch_dtype": "float32"})
    made = {}
    for kind, cfg in DRAFTERS.items():
        path = os.path.join(root, f"domino-{kind}")
        os.makedirs(path, exist_ok=True)
        write_safetensors(path, seeded_tensors(domino_tensor_specs(cfg), rng, ("embed_proj", "prefix_gru"), SCALES))
        write_json(os.path.join(path, "config.json"), {**cfg.to_hf_dict(), "torch_dtype": "float32"})
        made[kind] = path
    return target, made


def reference_run(domino, target_dir: str, drafter_dir: str) -> list[dict]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, DynamicCache, Qwen3Config

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with open(os.path.join(drafter_dir, "config.json")) as f:
        d = json.load(f)
    config = Qwen3Config(**{k: v for k, v in d.items() if k != "architectures"})
    config._attn_implementation = "eager"
    drafter = domino.DominoDraftModel(config).float().eval()
    missing, unexpected = drafter.load_state_dict(load_file(os.path.join(drafter_dir, "model.safetensors")),
                                                  strict=False)
    if missing or unexpected:
        raise SystemExit(f"SpecForge does not read the drafter exactly: missing {missing}, unexpected {unexpected}")
    b, ids, mask = drafter.block_size, drafter.target_layer_ids, drafter.mask_token_id
    rows = slice(0, b - 1) if drafter.shift_label else slice(1, b)

    def keep(cache, n):
        extra = cache.get_seq_length() - n
        if extra > 0:
            cache.crop(-extra)

    out = []
    for prompt in pair.PROMPTS:
        with torch.no_grad():
            tcache, dcache = DynamicCache(), DynamicCache()
            o = target(torch.tensor([prompt]), past_key_values=tcache, use_cache=True, output_hidden_states=True)
            tokens = list(prompt) + [int(o.logits[0, -1].argmax())]
            context = torch.cat([o.hidden_states[i + 1] for i in ids], -1)
            iterations = []
            while len(tokens) - len(prompt) < pair.MAX_NEW_TOKENS:
                start = len(tokens) - 1
                block = torch.tensor([[tokens[-1]] + [mask] * (b - 1)])
                hidden = drafter(position_ids=torch.arange(dcache.get_seq_length(), start + b)[None],
                                 noise_embedding=target.model.embed_tokens(block), target_hidden=context,
                                 past_key_values=dcache, use_cache=True, is_causal=False)
                keep(dcache, start)
                hidden = hidden[:, -b:]
                draft = drafter._sample_draft_tokens(target, hidden, block)
                verify = torch.cat([block[:, :1], draft], 1)
                o = target(verify, position_ids=torch.arange(start, start + b)[None], past_key_values=tcache,
                           use_cache=True, output_hidden_states=True)
                choice = o.logits[0].argmax(-1)
                a = int((draft[0] == choice[:-1]).long().cumprod(0).sum())
                tokens += draft[0, :a].tolist() + [int(choice[a])]
                keep(tcache, start + a + 1)
                context = torch.cat([o.hidden_states[i + 1] for i in ids], -1)[:, :a + 1]
                iterations.append({"anchor": int(block[0, 0]), "draft": draft[0].tolist(),
                                   "backbone_argmax": target.lm_head(hidden[:, rows])[0].argmax(-1).tolist(),
                                   "acceptance_length": a + 1})
        out.append({"prompt": list(prompt), "output": tokens[len(prompt):len(prompt) + pair.MAX_NEW_TOKENS],
                    "iterations": iterations})
    return out


def reference_losses(family, domino, target_dir: str, drafter_dir: str) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    ids = torch.tensor(batch.TOKENS)
    loss_mask = torch.tensor(batch.LOSS_MASK, dtype=torch.float32)
    anchors, keep = torch.tensor(batch.ANCHORS), torch.tensor(batch.VALID)
    out = []
    for settings in LOSS_SETTINGS:
        drafter, _ = batch._drafter(domino.DominoDraftModel, drafter_dir, backbone_only=False)
        with torch.no_grad():
            hs = target(ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1] for i in drafter.target_layer_ids], -1)
        online = family.OnlineDominoModel(
            drafter, target.lm_head, target.model.embed_tokens, drafter.mask_token_id, block_size=drafter.block_size,
            attention_backend="sdpa", num_anchors=len(batch.ANCHORS[0]), objective_chunk_blocks=0,
            loss_decay_gamma=settings["loss_decay_gamma"], shift_label=drafter.shift_label)
        online._sample_anchor_positions = lambda seq_len, loss_mask, device: (anchors.clone(), keep.clone())
        loss, _, metrics = online(ids, taps, loss_mask, lambda_base=settings["lambda_base"])
        loss.backward()
        out.append({"settings": settings, "loss": round(float(loss), 7),
                    "final": round(float(metrics["final_loss"]), 7), "base": round(float(metrics["base_loss"]), 7),
                    "grad_norms": batch._grad_norms(drafter)})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specforge", required=True, help="a directory holding SpecForge's specforge/ package")
    p.add_argument("--out", default="tests/fixtures/domino_reference.json", help="the fixture to write")
    args = p.parse_args(argv)
    family, _ = specforge(args.specforge)
    domino = importlib.import_module("specforge.modeling.draft.domino")
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, drafters = write_pair(tmp)
        runs = {kind: reference_run(domino, target_dir, path) for kind, path in drafters.items()}
        losses = {kind: reference_losses(family, domino, target_dir, path) for kind, path in drafters.items()}
    fixture = {"reference": f"sgl-project/SpecForge@{pair.SPECFORGE_COMMIT}", "seed": SEED,
               "target": pair.TARGET.to_hf_dict(), "drafters": {k: c.to_hf_dict() for k, c in DRAFTERS.items()},
               "max_new_tokens": pair.MAX_NEW_TOKENS, "runs": runs,
               "loss_batch": {"tokens": batch.TOKENS, "loss_mask": batch.LOSS_MASK, "anchors": batch.ANCHORS,
                              "valid": batch.VALID},
               "losses": losses}
    write_json(args.out, fixture, indent=None)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {sum(len(r['iterations']) for r in v)} iterations"
                                           for k, v in runs.items()))
    return fixture


if __name__ == "__main__":
    main()
