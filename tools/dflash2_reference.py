"""The DFlash2 reference numbers: z-lab's own package (``dflash==0.1.0``, its ``DFlash2DraftModel``
and ``dflash_generate``) run on a tiny target/drafter pair, written to a committed fixture that
``tests/methods/test_dflash2.py`` checks this project's DFlash2 against.

The pair is not stored: :func:`write_pair` rebuilds it from numpy seeds (a 3-layer Qwen3 target
with 64 tokens and a 2-layer DFlash2 drafter, their ``config.json`` and ``model.safetensors``
in the Hugging Face / reference layouts), so the fixture holds only what the reference computed
(a few KB): per prompt, the reference's greedy output and, per iteration, the anchor, the
selector's candidates per block row, the drafted tokens, their scores and the acceptance length.

Regenerate (needs torch, transformers and the reference package, which pins old versions of
``datasets`` and ``huggingface_hub`` that this project does not use, so install it alone)::

    pip install --no-deps dflash==0.1.0
    python -m dflash_jax.tools.dflash2_reference --out tests/fixtures/dflash2_reference.json
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from dflash_jax.checkpoints import target_tensor_specs, write_safetensors
from dflash_jax.config import TargetConfig
from dflash_jax.files import write_json
from dflash_jax.methods.dflash2.checkpoint import dflash2_tensor_specs
from dflash_jax.methods.dflash2.config import DFlash2Config

SEED = 2026
TARGET = TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256)
DRAFTER = DFlash2Config.for_target(TARGET, num_layers=2, block_size=5, mask_token_id=63, target_layer_ids=(0, 2),
                                   conv_kernel_size=3, conv_group_size=8, selector_rank=6, selector_top_k=4)
PROMPTS = ([5, 9, 2, 7, 7, 1], [3, 3, 8, 41, 17], [12, 60, 33, 2, 2, 2, 9, 50])
MAX_NEW_TOKENS = 24
SCALES = {"codebook": 1.0, "matrix": 0.3, "norm": 0.1}
"""Standard deviations of the pair's weights: matrices 0.3, norms 1 + 0.1 noise, the selector's
codebooks 1 (large enough that the selector overrules the logits' argmax on some rows)."""


def seeded_tensors(specs, rng, head, scales) -> dict[str, np.ndarray]:
    """float32 weights for ``specs``, one draw per tensor in name order: norms 1 + noise, the
    tensors whose name contains ``head`` (a string, or any of a tuple) at ``scales["head"]``, the
    rest at ``scales["matrix"]``."""
    heads = (head,) if isinstance(head, str) else tuple(head)
    out = {}
    for name in sorted(specs):
        shape = specs[name].shape
        if name.endswith("norm.weight"):
            out[name] = (1.0 + scales["norm"] * rng.standard_normal(shape)).astype(np.float32)
        else:
            std = scales["head"] if any(h in name for h in heads) else scales["matrix"]
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out


def _tensors(specs, rng) -> dict[str, np.ndarray]:
    return seeded_tensors(specs, rng, "codebook", {**SCALES, "head": SCALES["codebook"]})


def write_pair(root: str) -> tuple[str, str]:
    """(target directory, drafter directory) under ``root``: the tiny pair, weights from
    :data:`SEED` (float32)."""
    rng = np.random.default_rng(SEED)
    dirs = []
    for name, cfg, specs in (("target", TARGET, target_tensor_specs(TARGET)),
                             ("drafter", DRAFTER, dflash2_tensor_specs(DRAFTER))):
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        write_safetensors(path, _tensors(specs, rng))
        write_json(os.path.join(path, "config.json"), {**cfg.to_hf_dict(), "torch_dtype": "float32"})
        dirs.append(path)
    return dirs[0], dirs[1]


def reference_run(target_dir: str, drafter_dir: str) -> list[dict]:
    """The reference's greedy decoding of :data:`PROMPTS`, every iteration's proposal recorded."""
    import time

    import torch
    from dflash import model as reference
    from dflash.model import DFlash2DraftModel, dflash_generate
    from transformers import AutoModelForCausalLM

    reference._cuda_time = time.perf_counter  # its statistics time with CUDA syncs; this runs on the CPU

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    drafter, info = DFlash2DraftModel.from_pretrained(drafter_dir, dtype=torch.float32, output_loading_info=True)
    left = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if left:
        raise SystemExit(f"the reference does not read the drafter's layout exactly: {left}")
    drafter.eval()
    select = drafter.candidate_selector.select
    out = []
    for prompt in PROMPTS:
        iterations = []

        def recorded(hidden, logits, anchor_ids, temperature):
            path, candidates, q = select(hidden, logits, anchor_ids, temperature)
            iterations.append({"anchor": int(anchor_ids[0]), "draft": path[0].tolist(),
                               "candidates": [sorted(row) for row in candidates[0].tolist()],
                               "logits_argmax": logits[0].argmax(-1).tolist()})
            return path, candidates, q

        drafter.candidate_selector.select = recorded
        with torch.no_grad():
            r = dflash_generate(drafter, target, torch.tensor([prompt]), MAX_NEW_TOKENS, None, return_stats=True)
        for it, a in zip(iterations, r.acceptance_lengths):
            it["acceptance_length"] = int(a)
        out.append({"prompt": list(prompt), "output": r.output_ids[0, len(prompt):].tolist(),
                    "iterations": iterations})
    drafter.candidate_selector.select = select
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="tests/fixtures/dflash2_reference.json", help="the fixture to write")
    args = p.parse_args(argv)
    return write_fixture(args.out, write_pair, reference_run, SEED, TARGET, DRAFTER, MAX_NEW_TOKENS)


def write_fixture(out: str, write_pair, reference_run, seed: int, target, drafter, max_new_tokens: int) -> dict:
    """The reference package's runs (``reference_run`` over the pair ``write_pair`` rebuilds in a
    scratch directory) written to ``out`` with what made them: the package's version, the seed,
    both configs and the token budget. Shared by the reference scripts that run ``dflash``."""
    import dflash  # noqa: F401  (the reference: fail here, before any work, when it is missing)
    from importlib.metadata import version

    with tempfile.TemporaryDirectory() as tmp:
        runs = reference_run(*write_pair(tmp))
    fixture = {"reference": f"dflash=={version('dflash')}", "seed": seed, "target": target.to_hf_dict(),
               "drafter": drafter.to_hf_dict(), "max_new_tokens": max_new_tokens, "runs": runs}
    write_json(out, fixture)
    print(f"wrote {out}: {sum(len(r['iterations']) for r in runs)} iterations over {len(runs)} prompts")
    return fixture


if __name__ == "__main__":
    main()
