"""A drafting method added from outside the library (``support/tap_mlp_method.py``: a Medusa-like
set of heads over one target feature), registered by one line, goes through the library's own
paths: ``load_drafter`` / ``save_drafter`` in its own layout, the shared trainer (loss falls,
resume, ``export``), ``generate`` with every verify policy it declares (greedy == AR) and a
refusal, before anything compiles, of each one it declares it does not do. What it proposes is
checked against an independent float64 reference, iteration by iteration: a wrong feature row or
a wrong anchor would keep the output equal to AR and change only the proposals."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.decoding import engine
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.targets import target_forward
from dflash_jax.training.data import TokenDataset, regenerate
from dflash_jax.training.trainer import TrainConfig, export_run, latest_params
from support.drafter_reference import recording
from support.tap_mlp_method import TAP_MLP, TapMlpDrafter, TapMlpProposer, TapMlpTrainer

pytestmark = pytest.mark.xdist_group("test_tap_mlp_method")

CFG_FIELDS = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
CFG = dj.TargetConfig(**CFG_FIELDS)


@pytest.fixture(scope="module")
def registered():
    """The method registered by its one line, for this module only."""
    saved = {t: dict(getattr(methods, t)) for t in ("_METHODS", "_ARCHITECTURES", "_NAMED")}
    methods.register(TAP_MLP)
    yield TAP_MLP
    for t, table in saved.items():
        setattr(methods, t, table)


@pytest.fixture(scope="module")
def target():
    return dj.Target.random(CFG, seed=3, init_scale=0.3)


def test_loads_and_saves_in_its_own_layout(registered, target, tmp_path):
    d = TapMlpDrafter.random(target, tap=1, seed=1)
    dj.save_drafter(d, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["architectures"] == ["TestTapMlpDrafter"]
    back = dj.load_drafter(tmp_path / "d", target)
    assert isinstance(back, TapMlpDrafter) and back.config == d.config
    for k in ("w_in", "w_out"):
        np.testing.assert_array_equal(np.asarray(back.params[k]), np.asarray(d.params[k]))
    assert methods.method_of(back) is TAP_MLP


def _generate(target, prompts, drafter, **options):
    return dj.generate(target, prompts, 20, drafter=drafter, **options)


def test_every_declared_policy_equals_ar_and_the_others_are_refused(registered, target, monkeypatch):
    prompts = [[5, 9, 2, 7, 7, 1], [3, 3, 8], [11, 4, 6, 2, 9]]
    drafter = TapMlpDrafter.random(target, tap=1, block_size=5, seed=2)
    ar = dj.generate(target, prompts, 20).sequences
    chain = _generate(target, prompts, drafter)
    assert chain.sequences == ar and max(max(a) for a in chain.acceptance_lengths) <= 5
    assert _generate(target, prompts, drafter, block_size=3).sequences == ar
    adaptive = _generate(target, prompts, drafter, block_size="adaptive", verify_lengths=(3, 5),
                         cost_table={3: 1.0, 5: 1.2})
    assert adaptive.sequences == ar and set(np.concatenate(adaptive.verify_lengths).tolist()) <= {3, 5}
    # the target sampling at T > 0 verifies the greedy heads too (lossless by the acceptance rule)
    assert len(_generate(target, prompts, drafter, temperature=1.0, seed=4).sequences) == 3

    def compiled(*args, **kwargs):
        raise AssertionError("the engine ran before the refusal")

    monkeypatch.setattr(engine, "prefill", compiled)
    with pytest.raises(ValueError, match="^tree=8: the tap-MLP drafter drafts one chain"):
        _generate(target, prompts, drafter, tree=8)
    with pytest.raises(ValueError, match="^sampled_draft=True: the tap-MLP drafter drafts greedily"):
        _generate(target, prompts, drafter, temperature=1.0, sampled_draft=True)
    with pytest.raises(ValueError, match="has 4 heads"):
        _generate(target, prompts, drafter, block_size=6)


RecordingTapMlp = recording(TapMlpProposer)


def causal_taps(target, tap: int, tokens: list[int]) -> np.ndarray:
    """float64[L, D] the target's tap-layer outputs over ``tokens`` from one fresh causal forward
    (no cache): the row at t depends on tokens 0..t only."""
    toks = jnp.asarray([tokens], jnp.int32)
    _, taps, _ = target_forward(target.config, target.params, toks, jnp.arange(len(tokens))[None],
                                tap_layer_ids=(tap,), compute_logits=False)
    return np.asarray(taps[0], np.float64)


def reference_draft(target, drafter, feature, anchor: int) -> tuple[np.ndarray, float]:
    """(draft int[K], its smallest top-2 logit margin) of the heads, in float64 numpy, for the
    block anchored at ``anchor`` after the committed row whose tap is ``feature``."""
    table = np.asarray(target.params["embed_tokens"]["embedding"], np.float64)
    w_in, w_out = (np.asarray(drafter.params[k], np.float64) for k in ("w_in", "w_out"))
    x = np.concatenate([feature, table[anchor]]) @ w_in
    x = x / (1 + np.exp(-x))  # silu
    head = table.T if target.config.tie_word_embeddings else np.asarray(target.params["lm_head"]["kernel"], np.float64)
    logits = np.einsum("f,kfd->kd", x, w_out) @ head  # [K, V]
    top2 = np.sort(logits, -1)[:, -2:]
    return logits.argmax(-1), float(np.min(top2[:, 1] - top2[:, 0]))


def test_proposals_equal_an_independent_reference(registered, target):
    prompts = [[5, 9, 2, 7, 7, 1], [3, 3, 8]]
    drafter = TapMlpDrafter.random(target, tap=1, block_size=4, seed=5)
    recorder = RecordingTapMlp(drafter.config, 4)
    res = dj.generate(target, prompts, 16, drafter=drafter, proposer=recorder)
    checked = 0
    for b, prompt in enumerate(prompts):
        seq = prompt + res.sequences[b]
        taps = causal_taps(target, drafter.config.tap, seq)
        start = len(prompt)  # the bonus of the prefill sits at len(prompt)
        for i, a in enumerate(res.acceptance_lengths[b]):
            rec_start, rec_anchor, rec_draft = (r[b] for r in recorder.records[i])
            assert rec_start == start and rec_anchor == seq[start]
            draft, margin = reference_draft(target, drafter, taps[start - 1], seq[start])
            if margin > 1e-4:
                np.testing.assert_array_equal(rec_draft, draft)
                checked += 1
            start += a
    assert checked >= 10


KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.training.data import TokenDataset
from dflash_jax.training.trainer import TrainConfig
from support.tap_mlp_method import TAP_MLP, TapMlpDrafter, TapMlpTrainer

methods.register(TAP_MLP)
target = dj.Target.random(dj.TargetConfig(**{cfg!r}), seed=3, init_scale=0.3)
target.path = {target!r}
cfg = TrainConfig(steps=5, batch_size=8, learning_rate=3e-2, warmup_fraction=0.0, checkpoint_every=1,
                  eval_max_new_tokens=8)
config = TapMlpDrafter.random(target, tap=1, block_size=4).config
trainer = TapMlpTrainer(target, config, TokenDataset({data!r}), {run!r}, cfg)
step, calls = trainer._step_fn, []


def killed_in_step_4(*args):
    calls.append(1)
    if len(calls) == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(*args)


trainer._step_fn = killed_in_step_4
trainer.run()
"""


def test_trains_with_the_shared_trainer_resumes_and_exports(registered, target, tmp_path):
    target.path = str(tmp_path / "target")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 20, size=int(rng.integers(3, 7))).tolist() for _ in range(24)]
    regenerate(target, prompts, str(tmp_path / "data"), max_new_tokens=10, max_len=24, batch_size=8, shard_size=24)
    data = TokenDataset(str(tmp_path / "data"))
    cfg = TrainConfig(steps=5, batch_size=8, learning_rate=3e-2, warmup_fraction=0.0, checkpoint_every=1,
                      eval_every=5, eval_max_new_tokens=8)
    config = TapMlpDrafter.random(target, tap=1, block_size=4).config
    TapMlpTrainer(target, config, data, str(tmp_path / "full"), cfg, eval_prompts=prompts[:2]).run()
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows]
    assert len(losses) == 5 and losses[-1] < losses[0] - 0.2, losses
    # the held-out tau ran the trained drafter through generate (the trainer's drafter())
    assert [("eval_tau" in r) for r in rows] == [False] * 4 + [True] and 1.0 <= rows[-1]["eval_tau"] <= 4.0
    # interrupted after 3 steps, then resumed from its checkpoint by a new trainer: the same weights
    cfg = dataclasses.replace(cfg, eval_every=0)
    # killed (SIGKILL, in a process of its own) in the middle of step 4, after step 3's
    # checkpoint, then resumed here by a new trainer: the same weights
    script = KILLED_RUN.format(tests=os.path.dirname(os.path.dirname(__file__)), cfg=CFG_FIELDS,
                               target=target.path,
                               data=str(tmp_path / "data"), run=str(tmp_path / "cut"))
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, "JAX_PLATFORMS": "cpu"},
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert latest_params(str(tmp_path / "cut"))[2] == 3
    TapMlpTrainer(target, config, data, str(tmp_path / "cut"), cfg).run()
    (c1, full, s1), (c2, cut, s2) = latest_params(str(tmp_path / "full")), latest_params(str(tmp_path / "cut"))
    assert s1 == s2 == 5 and c1 == c2 == config
    for k in ("w_in", "w_out"):
        np.testing.assert_array_equal(np.asarray(full[k]), np.asarray(cut[k]))
    # export writes the method's layout through the registry; load_drafter reads it back
    export_run(str(tmp_path / "full"), str(tmp_path / "export"))
    exported = dj.load_drafter(tmp_path / "export", target)
    assert isinstance(exported, TapMlpDrafter)
    np.testing.assert_array_equal(np.asarray(exported.params["w_out"]), np.asarray(full["w_out"]))
    assert json.loads((tmp_path / "full" / "run.json").read_text())["method"] == "tap-mlp"
    # a new run started from the export (the shared trainer's init_from: config check, the
    # method's loader) starts from its weights; one of another config is refused
    cont = TapMlpTrainer(target, config, data, str(tmp_path / "cont"), cfg, init_from=str(tmp_path / "export"))
    np.testing.assert_array_equal(np.asarray(cont.init_state()["params"]["w_out"]), np.asarray(full["w_out"]))
    other = dataclasses.replace(config, width=config.width + 1)
    with pytest.raises(ValueError, match="holds a drafter with another config"):
        TapMlpTrainer(target, other, data, str(tmp_path / "other"), cfg, init_from=str(tmp_path / "export"))
    # every method's steps walk the same rows in the same order (the shared step_rows), so methods
    # compared head to head train on equal terms: DFlash's steps and this method's hold the same rows
    dflash = DFlashTrainer(target, dj.DrafterConfig.for_target(CFG, 1, 4, 60), data, str(tmp_path / "dflash"), cfg)
    for step in range(7):  # past the first epoch (3 steps of 8 of the 24 sequences)
        np.testing.assert_array_equal(dflash.batch(step)[0], cont.batch(step)[0])
