"""Tensor parallelism stays a layer around the algorithm: the acceptance rules and the sampling
filters are given the vocabulary reductions (``parallel.vocab.VocabOps``) and never gather the
logits. Checked on the compiled multi-device decode loop (2 host devices, vocabulary split in
two, in a subprocess: ``tests/support/multidevice.py``): no all-gather in it moves anything as wide as
a vocabulary slice, for greedy DFlash, sampling with a greedy draft, top-k, and sampled drafts
(rejection sampling). Control: top-p, which does gather the whole vocabulary to sort it, is
found by the same check."""

from __future__ import annotations

import pytest

from support.multidevice import run_on_devices

pytestmark = [pytest.mark.multidevice, pytest.mark.xdist_group("vocab_parallel"), pytest.mark.slow]

CODE = """
import re
import jax
import numpy as np
import dflash_jax as dj
from dflash_jax import parallel
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.targets import init_target_params
from support.multidevice import emit

V = 512  # a vocabulary slice of 256 is wider than any other dimension of the program
cfg = dj.TargetConfig("qwen3", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
mesh = parallel.make_mesh(data=1, model=2)
# the compiled program depends on the parameters' shapes and placement, not their values: zeros
# of the init's shapes (traced, not compiled), placed on the mesh by the constructors
zeros = lambda tree: jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), tree)
target = dj.Target(cfg, zeros(jax.eval_shape(lambda: init_target_params(cfg, jax.random.key(0)))), mesh=mesh)
dcfg = dj.DrafterConfig.for_target(cfg, 1, 6, V - 1)
drafter = dj.Drafter(dcfg, zeros(jax.eval_shape(lambda: init_drafter_params(dcfg, jax.random.key(1)))), mesh=mesh)
RUNS = {"greedy": {}, "sampled-T1": dict(temperature=1.0), "top-k": dict(temperature=0.8, top_k=20),
        "sampled-draft": dict(temperature=1.0, sampled_draft=True), "top-p": dict(temperature=1.0, top_p=0.9)}
pattern = re.compile(r"= \\w+\\[([\\d,]*)\\][^ ]* all-gather(?:-start)?\\(")
out = {}
for name, opts in RUNS.items():
    pre = prepare_decode(target, [[1, 2, 3, 4]], 8, drafter=drafter, **opts)
    hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new,
                              pre.stop_ids, np.int32(4), spec=pre.spec).compile().as_text()
    shapes = [[int(d) for d in m.group(1).split(",") if d] for m in pattern.finditer(hlo)]
    out[name] = {"all_gathers": len(shapes), "widest": max((max(s, default=0) for s in shapes), default=0)}
emit(out)
"""


def test_the_decode_loop_gathers_no_logits():
    # fast_compile (multidevice): the same HLO passes, so the same collectives (checked: the
    # all-gathers found and their widths are the default level's, for all five runs)
    out = run_on_devices(CODE, devices=2, fast_compile=True)
    slice_width = 512 // 2
    for name in ("greedy", "sampled-T1", "top-k", "sampled-draft"):
        assert out[name]["all_gathers"] > 0, out  # the argmax's (max, index) pairs are gathered
        assert out[name]["widest"] < slice_width, (name, out[name])
    assert out["top-p"]["widest"] >= slice_width, out  # the control: top-p gathers the vocabulary
