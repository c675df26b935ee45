"""The reference numbers for a DFlash drafter on a Gemma 4 target: z-lab's own package
(``dflash==0.1.0``: its ``DFlashDraftModel`` and ``dflash_generate``) run with transformers'
``Gemma4ForCausalLM`` on a tiny pair, written to a committed fixture that
``tests/targets/test_gemma4.py`` checks this project against.

The drafter sets the three fields Gemma 4's released drafters need and the reference reads:
``input_embedding_scale`` (the block rows are the target's raw embedding rows times it; Gemma 4's
own embedding scales by sqrt(D) inside the target), ``output_multiplier`` and
``final_logit_softcapping`` (on the draft logits). The pair is not stored: :func:`write_pair`
rebuilds it from numpy seeds (a 6-layer Gemma 4 target with sliding and full layers, keys as
values on the full layers, a soft-capped head; a 2-layer Qwen3-layout drafter), so the fixture
holds what the reference computed: per prompt, its greedy output and, per iteration, the anchor,
the drafted tokens, the acceptance length and each draft row's five largest logits (ids and
values: the multiplier and the cap change the values, never the argmax).

Regenerate (needs torch, transformers and the reference package, installed alone as in
``tools/dflash2_reference.py``)::

    pip install --no-deps dflash==0.1.0
    python -m dflash_jax.tools.gemma4_dflash_reference --out tests/fixtures/gemma4_dflash_reference.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np

from dflash_jax.checkpoints import target_tensor_specs, write_safetensors
from dflash_jax.config import TargetConfig
from dflash_jax.files import write_json
from dflash_jax.tools.dflash2_reference import write_fixture
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs
from dflash_jax.methods.dflash.config import DrafterConfig

SEED = 2611
TARGET_HF = {
    "model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "global_head_dim": 16, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 4,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "hidden_size_per_layer_input": 0, "final_logit_softcapping": 10.0, "max_position_embeddings": 256,
    "tie_word_embeddings": True, "eos_token_id": 1, "bos_token_id": 2, "pad_token_id": 0}
TARGET = TargetConfig.from_hf_dict(TARGET_HF)
DRAFTER = dataclasses.replace(
    DrafterConfig.for_target(TARGET, num_layers=2, block_size=5, mask_token_id=63, target_layer_ids=(1, 4)),
    input_embedding_scale=4.0, output_multiplier=0.75, final_logit_softcapping=2.5)
PROMPTS = ([5, 9, 2, 7, 7, 3], [3, 3, 8, 41, 17], [12, 60, 33, 2, 2, 2, 9, 50])
MAX_NEW_TOKENS = 24
TOP = 5
STD = {"target": 0.12, "drafter": 0.5}
"""The weights' noise: the drafter's larger, so that its layers, not the mask row's embedding
carried by the residual, decide its drafts."""


def seeded_tensors(specs, rng, std: float) -> dict[str, np.ndarray]:
    """float32 weights for ``specs``, one draw per tensor in name order: norms and the layer
    scalars 1 + 0.1 noise, the rest ``std`` noise."""
    out = {}
    for name in sorted(specs):
        shape = specs[name].shape
        if name.endswith(("norm.weight", "layer_scalar")):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_pair(root: str) -> tuple[str, str]:
    """(target directory, drafter directory) under ``root``: the tiny pair, weights from
    :data:`SEED` (float32), config.json as this project writes it."""
    rng = np.random.default_rng(SEED)
    dirs = []
    for name, cfg, specs in (("target", TARGET, target_tensor_specs(TARGET)),
                             ("drafter", DRAFTER, drafter_tensor_specs(DRAFTER))):
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        write_safetensors(path, seeded_tensors(specs, rng, STD[name]))
        write_json(os.path.join(path, "config.json"), {**cfg.to_hf_dict(), "torch_dtype": "float32"})
        dirs.append(path)
    return dirs[0], dirs[1]


def reference_run(target_dir: str, drafter_dir: str) -> list[dict]:
    """The reference's greedy decoding of :data:`PROMPTS`, every iteration recorded."""
    import time

    import torch
    from dflash import model as reference
    from dflash.model import DFlashDraftModel, dflash_generate
    from transformers import AutoModelForCausalLM

    reference._cuda_time = time.perf_counter  # its statistics time with CUDA syncs; this runs on the CPU
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="eager").eval()
    drafter, info = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32, output_loading_info=True)
    left = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if left:
        raise SystemExit(f"the reference does not read the drafter's layout exactly: {left}")
    drafter.eval()
    compute = drafter.compute_logits
    out = []
    for prompt in PROMPTS:
        iterations = []

        def recorded(hidden, head):
            logits = compute(hidden, head)
            values, ids = torch.topk(logits[0], TOP, dim=-1)
            iterations.append({"draft": logits[0].argmax(-1).tolist(), "top_ids": ids.tolist(),
                               "top_logits": values.tolist()})
            return logits

        drafter.compute_logits = recorded
        with torch.no_grad():
            r = dflash_generate(drafter, target, torch.tensor([prompt]), MAX_NEW_TOKENS, None, return_stats=True)
        for it, a in zip(iterations, r.acceptance_lengths):
            it["acceptance_length"] = int(a)
        out.append({"prompt": list(prompt), "output": r.output_ids[0, len(prompt):].tolist(),
                    "iterations": iterations})
    drafter.compute_logits = compute
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="tests/fixtures/gemma4_dflash_reference.json", help="the fixture to write")
    args = p.parse_args(argv)
    return write_fixture(args.out, write_pair, reference_run, SEED, TARGET, DRAFTER, MAX_NEW_TOKENS)


if __name__ == "__main__":
    main()
