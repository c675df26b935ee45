"""The DSpark reference numbers: SpecForge's own modules (``specforge/modeling/draft/dspark.py``
and the DFlash backbone under it, from a fetched snapshot; SpecForge is not on PyPI) run on a
tiny target/drafter pair, written to a committed fixture that ``tests/methods/test_dspark.py``
checks this project's DSpark against.

The pair is not stored: :func:`write_pair` rebuilds it from numpy seeds (a 3-layer Qwen3 target
with 64 tokens, and one 2-layer DSpark drafter per Markov head type, in the Hugging Face and
SpecForge layouts), so the fixture holds only what the reference computed (a few KB).

The decoding loop is this script's, on SpecForge's modules: SpecForge's ``spec_generate`` is
DFlash's and drafts from block rows 1..b-1, while SpecForge trains a DSpark drafter's row k on
the token after anchor + k (``OnlineDSparkModel``: label offsets 1..b) and DeepSpec's evaluator
and SGLang draft from all b rows; the loop here does that: the drafter over ``[bonus, MASK *
(b-1)]``, the Markov head's ``sample_block_tokens`` (greedy), ``predict_confidence`` on the rows
with the tokens before them, the target verifying ``[bonus, b drafts]`` greedily, the caches
cropped to the committed length. Per iteration it records the anchor, the backbone's argmax per
row, the drafted tokens, the confidence logits and the acceptance length.

Regenerate (needs torch and transformers; the snapshot from ``fetch github:sgl-project/SpecForge``)::

    git -C <SpecForge git dir> archive a6b6b023 specforge/modeling/draft | tar -x -C /tmp/specforge
    python -m dflash_jax.tools.dspark_reference --specforge /tmp/specforge --out tests/fixtures/dspark_reference.json
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import types

import numpy as np

from dflash_jax.checkpoints import target_tensor_specs, write_safetensors
from dflash_jax.config import TargetConfig
from dflash_jax.files import write_json
from dflash_jax.methods.dspark.checkpoint import dspark_tensor_specs
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.tools.dflash2_reference import seeded_tensors

SPECFORGE_COMMIT = "a6b6b023"
SEED = 2027
TARGET = TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256)
DRAFTERS = {
    "vanilla": DSparkConfig.for_target(TARGET, num_layers=2, block_size=4, mask_token_id=63, target_layer_ids=(0, 2),
                                       markov_rank=6, markov_head_type="vanilla", enable_confidence_head=True,
                                       confidence_head_with_markov=True),
    "gated": DSparkConfig.for_target(TARGET, num_layers=2, block_size=4, mask_token_id=63, target_layer_ids=(0, 2),
                                     markov_rank=6, markov_head_type="gated", enable_confidence_head=True,
                                     confidence_head_with_markov=False),
    "rnn": DSparkConfig.for_target(TARGET, num_layers=2, block_size=4, mask_token_id=63, target_layer_ids=(0, 2),
                                   markov_rank=6, markov_head_type="rnn", enable_confidence_head=False),
}
PROMPTS = ([5, 9, 2, 7, 7, 1], [3, 3, 8, 41, 17], [12, 60, 33, 2, 2, 2, 9, 50])
MAX_NEW_TOKENS = 24
SCALES = {"markov": 1.0, "matrix": 0.3, "norm": 0.1}
"""Standard deviations of the pair's weights: matrices 0.3, norms 1 + 0.1 noise, the Markov
head's 1 (large enough that it overrules the backbone's argmax on some rows)."""


def _tensors(specs, rng) -> dict[str, np.ndarray]:
    return seeded_tensors(specs, rng, "markov_head.", {**SCALES, "head": SCALES["markov"]})


def write_pair(root: str) -> tuple[str, dict[str, str]]:
    """(target directory, {head type: drafter directory}) under ``root``: the tiny target and
    the drafters, weights from :data:`SEED` (float32)."""
    rng = np.random.default_rng(SEED)
    made = {}
    for name, cfg, specs in [("target", TARGET, target_tensor_specs(TARGET))] + [
            (f"dspark-{kind}", cfg, dspark_tensor_specs(cfg)) for kind, cfg in DRAFTERS.items()]:
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        write_safetensors(path, _tensors(specs, rng))
        write_json(os.path.join(path, "config.json"), {**cfg.to_hf_dict(), "torch_dtype": "float32"})
        made[name] = path
    return made.pop("target"), {k.split("-", 1)[1]: v for k, v in made.items()}


def specforge_dspark(root: str):
    """SpecForge's ``specforge/modeling/draft/dspark.py`` module from the snapshot under ``root``
    (its package ``__init__`` is not run: it imports the whole training stack)."""
    draft = os.path.join(root, "specforge", "modeling", "draft")
    if not os.path.isfile(os.path.join(draft, "dspark.py")):
        raise SystemExit(f"--specforge {root!r} holds no specforge/modeling/draft/dspark.py (module docstring)")
    pkg = types.ModuleType("_specforge_draft")
    pkg.__path__ = [draft]
    sys.modules["_specforge_draft"] = pkg
    return importlib.import_module("_specforge_draft.dspark")


def reference_run(dspark, target_dir: str, drafter_dir: str) -> list[dict]:
    """The module-docstring loop over :data:`PROMPTS` with SpecForge's DSpark drafter."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, DynamicCache, Qwen3Config

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with open(os.path.join(drafter_dir, "config.json")) as f:
        d = json.load(f)
    config = Qwen3Config(**{k: v for k, v in d.items() if k != "architectures"})
    config._attn_implementation = "eager"
    drafter = dspark.DSparkDraftModel(config).eval()
    state = load_file(os.path.join(drafter_dir, "model.safetensors"))
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"SpecForge does not read the drafter's layout exactly: missing {missing}, "
                         f"unexpected {unexpected}")
    b, ids = drafter.block_size, drafter.target_layer_ids
    mask = drafter.mask_token_id

    def keep(cache, n):  # transformers 5.24's crop takes the rows to drop, negative
        extra = cache.get_seq_length() - n
        if extra > 0:
            cache.crop(-extra)

    def taps(hidden_states):
        return torch.cat([hidden_states[i + 1] for i in ids], -1)

    out = []
    for prompt in PROMPTS:
        with torch.no_grad():
            tcache, dcache = DynamicCache(), DynamicCache()
            x = torch.tensor([prompt])
            o = target(x, past_key_values=tcache, use_cache=True, output_hidden_states=True)
            tokens = list(prompt) + [int(o.logits[0, -1].argmax())]
            context = taps(o.hidden_states)
            iterations = []
            while len(tokens) - len(prompt) < MAX_NEW_TOKENS:
                start = len(tokens) - 1  # the bonus's position
                block = torch.tensor([[tokens[-1]] + [mask] * (b - 1)])
                positions = torch.arange(dcache.get_seq_length(), start + b)[None]
                hidden = drafter(position_ids=positions, noise_embedding=target.model.embed_tokens(block),
                                 target_hidden=context, past_key_values=dcache, use_cache=True, is_causal=False)
                keep(dcache, start)
                hidden = hidden[:, -b:]
                base = target.lm_head(hidden)
                draft, _ = drafter.markov_head.sample_block_tokens(base, first_prev_token_ids=block[:, 0],
                                                                   hidden_states=hidden)
                prev = torch.cat([block[:, :1], draft[:, :-1]], 1)
                conf = drafter.predict_confidence(hidden, prev_token_ids=prev)
                verify = torch.cat([block[:, :1], draft], 1)
                o = target(verify, position_ids=torch.arange(start, start + b + 1)[None], past_key_values=tcache,
                           use_cache=True, output_hidden_states=True)
                choice = o.logits[0].argmax(-1)
                a = int((draft[0] == choice[:-1]).long().cumprod(0).sum())
                tokens += draft[0, :a].tolist() + [int(choice[a])]
                keep(tcache, start + a + 1)
                context = taps(o.hidden_states)[:, :a + 1]
                iterations.append({"anchor": int(block[0, 0]), "draft": draft[0].tolist(),
                                   "backbone_argmax": base[0].argmax(-1).tolist(),
                                   "confidence": None if conf is None else [round(float(c), 5) for c in conf[0]],
                                   "acceptance_length": a + 1})
        out.append({"prompt": list(prompt), "output": tokens[len(prompt):len(prompt) + MAX_NEW_TOKENS],
                    "iterations": iterations})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specforge", required=True, help="a directory holding SpecForge's specforge/ package")
    p.add_argument("--out", default="tests/fixtures/dspark_reference.json", help="the fixture to write")
    args = p.parse_args(argv)
    dspark = specforge_dspark(args.specforge)
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, drafters = write_pair(tmp)
        runs = {kind: reference_run(dspark, target_dir, path) for kind, path in drafters.items()}
    fixture = {"reference": f"sgl-project/SpecForge@{SPECFORGE_COMMIT}", "seed": SEED, "target": TARGET.to_hf_dict(),
               "drafters": {k: c.to_hf_dict() for k, c in DRAFTERS.items()}, "max_new_tokens": MAX_NEW_TOKENS,
               "runs": runs}
    write_json(args.out, fixture, indent=None)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {sum(len(r['iterations']) for r in v)} iterations"
                                           for k, v in runs.items()))
    return fixture


if __name__ == "__main__":
    main()
