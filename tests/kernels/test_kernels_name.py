"""Our ``kernels/`` folder has the name of Hugging Face's ``kernels`` package (hub kernels). It is
installed as ``dflash_jax.kernels``, so an installed dflash-jax has no top-level ``kernels``; but
a checkout on ``sys.path`` (running from a clone) still shows the folder, and transformers probes
for that name: transformers 5.x with ``is_kernels_available()``
(``importlib.util.find_spec("kernels")``, then the version of the distribution that ships it,
importing the package when no distribution is known), 4.5x by ``from kernels import Device,
LayerRepository, ...`` in ``transformers.integrations.hub_kernels`` (imported by the Qwen3 and
Llama models). Transformers must not take ours for theirs: the same tiny Qwen3 is saved, loaded
and run in a fresh process without our packages importable, with them installed (this
checkout), and from a checkout on ``sys.path`` with no installed distribution, and everything
transformers reports and computes must agree.
"""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r'''
import importlib.metadata, importlib.util, json, os, sys, tempfile

mode, repo = sys.argv[1], os.path.realpath(sys.argv[2])
if mode == "without":  # neither the editable install's finder nor the checkout on the path
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in (getattr(f, "__module__", "") or "")]
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != repo]
elif mode == "installed_only":  # the installed package, not the checkout's folders
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != repo]
else:
    sys.path.insert(0, repo)
if mode == "checkout":  # no distribution is known to ship `kernels` (a clone on sys.path)
    _all = importlib.metadata.packages_distributions
    importlib.metadata.packages_distributions = lambda: {k: v for k, v in _all().items() if k != "kernels"}
spec = importlib.util.find_spec("kernels")

import transformers
from transformers.utils import import_utils

facts = {"spec": os.path.dirname(spec.origin) if spec and spec.origin else None,
         "transformers": transformers.__version__}
if mode == "installed_only":
    import dflash_jax.kernels
    facts["ours"] = os.path.dirname(dflash_jax.kernels.__file__)
if hasattr(import_utils, "is_kernels_available"):
    facts["is_kernels_available"] = bool(import_utils.is_kernels_available())
try:
    from transformers.integrations import hub_kernels  # 4.5x: `try: from kernels import ...` at import
    facts["hub_kernels_available"] = bool(getattr(hub_kernels, "_hub_kernels_available", False))
except ImportError:
    pass
try:  # the probe of transformers 4.5x, as written there
    from kernels import Device, LayerRepository, register_kernel_mapping, replace_kernel_forward_from_hub  # noqa
    facts["probe_4_5x"] = True
except ImportError:
    facts["probe_4_5x"] = False

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=8, max_position_embeddings=64)
    with tempfile.TemporaryDirectory() as d:
        transformers.Qwen3ForCausalLM(config).save_pretrained(d)
        model = transformers.AutoModelForCausalLM.from_pretrained(d)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        facts["logits"] = model(ids).logits.tolist()
        facts["generated"] = model.generate(ids, max_new_tokens=4, do_sample=False).tolist()
    if hasattr(import_utils, "is_kernels_available"):  # asked again after a model has run
        facts["is_kernels_available_after"] = bool(import_utils.is_kernels_available())
print("FACTS " + json.dumps(facts))
'''


def _run(mode: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRANSFORMERS_VERBOSITY"] = "error"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, ROOT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{mode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    line = next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))
    return json.loads(line[len("FACTS "):])


@pytest.mark.slow
def test_transformers_does_not_take_our_kernels_for_hugging_faces(tmp_path):
    try:
        dist = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        pytest.skip(f"Hugging Face's kernels {dist} is installed: there ours and theirs shadow each "
                    "other by sys.path order")
    without = _run("without", tmp_path)
    assert without["spec"] is None  # the comparison below is against "no kernels at all"
    for mode in ("installed", "checkout"):
        facts = _run(mode, tmp_path)
        assert facts["spec"] == os.path.join(os.path.realpath(ROOT), "kernels"), mode  # ours is found
        for flag in ("is_kernels_available", "is_kernels_available_after", "hub_kernels_available",
                     "probe_4_5x"):
            assert facts.get(flag, False) is False, (mode, flag)
        assert facts == {**without, "spec": facts["spec"]}, mode  # the same flags, logits and tokens
    # installed, ours is dflash_jax.kernels and no top-level `kernels` exists at all
    installed = _run("installed_only", tmp_path)
    assert installed["ours"] == os.path.join(os.path.realpath(ROOT), "kernels")
    assert installed == {**without, "ours": installed["ours"]}
