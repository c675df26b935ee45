"""The DFlash family's training losses as SpecForge computes them, on one fixed batch: its
``OnlineDFlashModel`` (loss types ``dflash``, ``dpace``, ``dpace-cumulative-confidence-only``,
``dpace-continuation-value-only``) on a DFlash drafter and its ``OnlineDSparkModel`` on a DSpark
drafter (``specforge/algorithms/common/dflash_family_model.py`` at a6b6b023, run from a fetched
snapshot; SpecForge is not on PyPI). Written to a committed fixture that the training tests
check this project's objectives against: each loss and, per drafter tensor, its gradient's
norm.

The pair is :mod:`dspark_reference`'s target and vanilla DSpark drafter (the DFlash drafter is
its backbone); the batch (two sequences of 20 tokens, the second padded, the first with an
unlabelled position inside its response, as a second turn makes one) and its anchors are fixed
here (:data:`TOKENS`, :data:`LOSS_MASK`, :data:`ANCHORS`, :data:`VALID`): SpecForge's anchor
sampler is replaced by one returning them. Target features as SpecForge's trainers take
them: the taps ``hidden_states[i + 1]`` concatenated, and the last hidden state (after the
final norm) for DSpark's distillation terms. Attention ``eager`` (the dense boolean mask).

Regenerate (needs torch and transformers)::

    git -C <SpecForge git dir> archive a6b6b023 specforge | tar -x -C /tmp/specforge
    python -m dflash_jax.tools.specforge_loss_reference --specforge /tmp/specforge \\
        --out tests/fixtures/specforge_losses.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import types


from dflash_jax.files import write_json
from dflash_jax.tools import dspark_reference as pair

TOKENS = [[5, 9, 2, 7, 7, 1, 30, 11, 4, 4, 52, 18, 3, 60, 27, 8, 8, 19, 40, 2],
          [12, 60, 33, 2, 2, 2, 9, 50, 14, 6, 21, 37, 44, 0, 0, 0, 0, 0, 0, 0]]
LOSS_MASK = [[0] * 5 + [1] * 7 + [0] + [1] * 7, [0] * 4 + [1] * 9 + [0] * 7]  # a hole at 12 (a second turn)
ANCHORS = [[5, 9, 14, 17], [4, 8, 11, 0]]
VALID = [[True, True, True, True], [True, True, True, False]]
DFLASH_GAMMA = 7.0
DPACE_ALPHA = 0.3
DSPARK_SETTINGS = ({"loss_decay_gamma": None}, {"loss_decay_gamma": 4.0, "dspark_ce_loss_alpha": 0.5,
                                                "dspark_l1_loss_alpha": 0.7, "dspark_confidence_head_alpha": 2.0})


def specforge(root: str):
    """SpecForge's DFlash-family training module from the snapshot under ``root``, its packages'
    ``__init__`` files not run (they import the whole training stack)."""
    base = os.path.join(root, "specforge")
    if not os.path.isfile(os.path.join(base, "algorithms", "common", "dflash_family_model.py")):
        raise SystemExit(f"--specforge {root!r} holds no specforge/algorithms/common/dflash_family_model.py")
    for name in ("specforge", "specforge.core", "specforge.modeling", "specforge.modeling.draft",
                 "specforge.algorithms", "specforge.algorithms.common"):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = pkg
    return (importlib.import_module("specforge.algorithms.common.dflash_family_model"),
            importlib.import_module("specforge.modeling.draft.dspark"))


def _drafter(cls, path: str, backbone_only: bool):
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    if backbone_only:
        d["dflash_config"] = {k: d["dflash_config"][k] for k in ("target_layer_ids", "mask_token_id")}
    config = Qwen3Config(**{k: v for k, v in d.items() if k != "architectures"})
    config._attn_implementation = "eager"
    model = cls(config).float()
    state = {k: v for k, v in load_file(os.path.join(path, "model.safetensors")).items()
             if not (backbone_only and k.startswith(("markov_head.", "confidence_head.")))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"SpecForge does not read the drafter exactly: missing {missing}, unexpected {unexpected}")
    return model.train(), torch


def _grad_norms(model) -> dict:
    return {n: round(float(p.grad.norm()), 7) for n, p in sorted(model.named_parameters()) if p.grad is not None}


def reference(family, dspark, target_dir: str, drafter_dir: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    ids = torch.tensor(TOKENS)
    loss_mask = torch.tensor(LOSS_MASK, dtype=torch.float32)
    anchors, keep = torch.tensor(ANCHORS), torch.tensor(VALID)
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    taps = torch.cat([hs[i + 1] for i in pair.DRAFTERS["vanilla"].target_layer_ids], -1)
    last = hs[-1]
    out = {"dflash": {}, "dspark": []}
    b = pair.DRAFTERS["vanilla"].block_size

    def fixed(model):
        model._sample_anchor_positions = lambda seq_len, loss_mask, device: (anchors.clone(), keep.clone())
        return model

    for loss_type in ("dflash", "dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only"):
        drafter, _ = _drafter(dspark.DFlashDraftModel, drafter_dir, backbone_only=True)
        online = fixed(family.OnlineDFlashModel(
            drafter, target.lm_head, target.model.embed_tokens, pair.DRAFTERS["vanilla"].mask_token_id,
            block_size=b, attention_backend="sdpa", num_anchors=4, objective_chunk_blocks=0,
            loss_decay_gamma=DFLASH_GAMMA if loss_type == "dflash" else None, loss_type=loss_type,
            dpace_alpha=DPACE_ALPHA))
        loss, _, _ = online(ids, taps, loss_mask)
        loss.backward()
        out["dflash"][loss_type] = {"loss": round(float(loss), 7), "grad_norms": _grad_norms(drafter)}
    for settings in DSPARK_SETTINGS:
        drafter, _ = _drafter(dspark.DSparkDraftModel, drafter_dir, backbone_only=False)
        online = fixed(family.OnlineDSparkModel(
            drafter, target.lm_head, target.model.embed_tokens, pair.DRAFTERS["vanilla"].mask_token_id,
            block_size=b, attention_backend="sdpa", num_anchors=4, objective_chunk_blocks=0, **settings))
        loss, _, metrics = online(ids, taps, loss_mask, target_last_hidden_states=last)
        loss.backward()
        parts = {k: round(float(n) / float(d), 7) for k, (n, d) in metrics["ratio_metrics"].items()
                 if k in ("ce_loss", "l1_loss", "confidence_loss")}
        out["dspark"].append({"settings": settings, "loss": round(float(loss), 7), "parts": parts,
                              "grad_norms": _grad_norms(drafter)})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specforge", required=True, help="a directory holding SpecForge's specforge/ package")
    p.add_argument("--out", default="tests/fixtures/specforge_losses.json", help="the fixture to write")
    args = p.parse_args(argv)
    family, dspark = specforge(args.specforge)
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, drafters = pair.write_pair(tmp)
        numbers = reference(family, dspark, target_dir, drafters["vanilla"])
    fixture = {"reference": f"sgl-project/SpecForge@{pair.SPECFORGE_COMMIT}", "seed": pair.SEED,
               "tokens": TOKENS, "loss_mask": LOSS_MASK, "anchors": ANCHORS, "valid": VALID,
               "dflash_gamma": DFLASH_GAMMA, "dpace_alpha": DPACE_ALPHA, **numbers}
    write_json(args.out, fixture)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v['loss']}" for k, v in numbers["dflash"].items()) +
          ", dspark " + ", ".join(str(r["loss"]) for r in numbers["dspark"]))
    return fixture


if __name__ == "__main__":
    main()
