"""EAGLE-3 training (methods.eagle3.training): the training-time-test loss against the drafter's own
inference path step by step, the draft vocabulary against a Counter, the step weights, the
trainer (loss goes down, SIGKILL + resume bitwise equal to an uninterrupted run, other settings
refused), the command line's method options, and export -> load_eagle3 -> generate == AR."""

import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.methods.eagle3.model import Eagle3Model
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.models.handles import Eagle3Drafter, load_eagle3
from dflash_jax.nn.cache import KVCache
from dflash_jax.targets import family_of, target_forward
from dflash_jax.methods.eagle3 import training as e3
from dflash_jax.training.data import TokenDataset
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.training.trainer import TrainConfig, latest_params
from support.processes import kill_after_lines

pytestmark = [pytest.mark.xdist_group("test_eagle3_training"), pytest.mark.slow]

CFG = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
VOCAB = np.array(sorted({0, 2, 3, 5, 7, 8, 11, 12, 13, 15, 17, 19, 20, 22, 23, 26, 28, 29, 30, 31}), np.int32)
LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def pair():
    target = dj.Target.random(CFG, seed=0, init_scale=0.35)
    drafter = Eagle3Drafter.random(target, VOCAB, LAYERS, seed=1, dtype=jnp.float32, init_scale=0.3)
    return target, drafter


def _batch(L=14):
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 32, size=(2, L)).astype(np.int32)
    lengths = np.array([L, L - 3])
    tokens[1, lengths[1]:] = 0
    mask = np.zeros((2, L), bool)
    mask[0, 4:] = True
    mask[1, 3:lengths[1]] = True
    mask[0, 9] = False  # a hole inside the response
    valid = np.arange(L)[None] < lengths[:, None]
    return tokens, mask, valid


def _reference(target, drafter, tokens, mask, valid, steps):
    """Per step s: (mean soft CE, top-1 accuracy, count) over the counted (b, j), each drafted
    with the model's inference path: the committed entries 0..j in a cache, then s entries
    feeding back the previous output hidden state (token x_{j+1+s'}, position / slot j + s'),
    and the soft cross-entropy against softmax(target logits at j+1+s over the vocabulary)."""
    cfg, params = drafter.config, drafter.params
    model = Eagle3Model(cfg)
    B, L = tokens.shape
    tl, taps, _ = target_forward(CFG, target.params, jnp.asarray(tokens),
                                 jnp.broadcast_to(jnp.arange(L), (B, L)), tap_layer_ids=LAYERS)
    tl = np.asarray(tl, np.float64)
    emb = family_of(CFG).embed(target.params, jnp.asarray(tokens))
    feats = model.apply({"params": params}, taps, method=Eagle3Model.project)
    decode = jax.jit(lambda e, f, p, cache, m: model.apply({"params": params}, e, f, p, p, cache, m,
                                                           method=Eagle3Model.decode))
    head = jax.jit(lambda h: jax.nn.log_softmax(model.apply({"params": params}, h, method=Eagle3Model.logits)))
    S = L + steps
    ce = collections.defaultdict(list)
    acc = collections.defaultdict(list)
    for b in range(B):
        # the committed entries i = 0 .. L-1 (feature f_i, token x_{i+1}) at slots / positions i
        cache = KVCache.init(1, 1, S, cfg.num_kv_heads, cfg.head_dim)
        nxt = jnp.pad(emb[b:b + 1, 1:], ((0, 0), (0, 1), (0, 0)))
        causal = jnp.arange(S)[None, None, :] <= jnp.arange(L)[None, :, None]
        committed, cache = decode(nxt, feats[b:b + 1], jnp.arange(L)[None], cache, causal)
        for j in range(L - 2):
            # drafting past j sees slots 0..j; its s-th entry overwrites slot j + s (scratch)
            h, chain = committed[:, j:j + 1], cache
            for s in range(steps):
                if s:  # entry j + s: token x_{j+1+s}, the previous output as its feature
                    if j + 1 + s >= L:
                        break
                    seen = (jnp.arange(S) <= j + s)[None, None, :]
                    h, chain = decode(emb[b:b + 1, j + 1 + s:j + 2 + s], h, jnp.array([[j + s]]), chain, seen)
                t = j + 2 + s  # the token this step predicts
                if t >= L or not mask[b, t] or not valid[b, t]:
                    continue
                row = tl[b, j + 1 + s]  # the target's distribution of x_{j+2+s}
                if row.argmax() not in VOCAB:
                    continue
                logq = np.asarray(head(h)[0, 0], np.float64)
                r = row[VOCAB]
                p_soft = np.exp(r - r.max())
                p_soft /= p_soft.sum()
                ce[s].append(-(p_soft * logq).sum())
                acc[s].append(logq.argmax() == r.argmax())
    return ([np.mean(ce[s]) for s in range(steps)], [np.mean(acc[s]) for s in range(steps)],
            [len(ce[s]) for s in range(steps)])


def _loss(target, drafter, tokens, mask, valid, weights):
    return e3.eval_eagle3_loss(drafter.params, target.params, jnp.asarray(tokens), jnp.asarray(mask),
                               jnp.asarray(valid), jnp.asarray(VOCAB), jnp.asarray(weights, jnp.float32),
                               cfg=drafter.config, tcfg=CFG)


def test_ttt_loss_equals_the_inference_path_step_by_step(pair, monkeypatch):
    """The unrolled training-time test's per-step loss and accuracy equal those of drafting with
    Eagle3Model.decode over a cache, chain by chain; a label shifted by one position breaks it."""
    target, drafter = pair
    tokens, mask, valid = _batch()
    steps = 4
    w = 0.8 ** np.arange(steps)
    loss, m = _loss(target, drafter, tokens, mask, valid, w)
    ref_ce, ref_acc, counts = _reference(target, drafter, tokens, mask, valid, steps)
    np.testing.assert_allclose(np.asarray(m["step_loss"]), ref_ce, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(m["accuracy_per_pos"]), ref_acc, atol=1e-6)
    assert int(m["num_labels"]) == counts[0]
    assert float(loss) == pytest.approx(float(np.sum(w * np.asarray(ref_ce))), rel=1e-5)
    # the position mask excluded some response tokens (the target's argmax not in the vocabulary)
    responses = sum(int(mask[b, j + 2] and valid[b, j + 2]) for b in range(2) for j in range(12))
    assert 0 < counts[0] < responses
    # a mutant loss whose labels come one position late fails the comparison
    real = e3.ttt_targets

    def late(target_logits, loss_mask, vocab, steps):
        log_p, counted, label = real(target_logits, loss_mask, vocab, steps)
        return jnp.pad(log_p[:, :, 1:], ((0, 0), (0, 0), (0, 1), (0, 0))), counted, label

    monkeypatch.setattr(e3, "ttt_targets", late)
    mutant = jax.jit(e3.eagle3_loss, static_argnames=("cfg", "tcfg"))
    _, bad = mutant(drafter.params, target.params, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(valid),
                    jnp.asarray(VOCAB), jnp.asarray(w, jnp.float32), cfg=drafter.config, tcfg=CFG)
    assert np.abs(np.asarray(bad["step_loss"]) - np.asarray(ref_ce)).max() > 1e-2


def test_step_weights_are_decay_powers(pair):
    target, drafter = pair
    tokens, mask, valid = _batch()
    l8, m8 = _loss(target, drafter, tokens, mask, valid, 0.8 ** np.arange(3))
    l5, m5 = _loss(target, drafter, tokens, mask, valid, 0.5 ** np.arange(3))
    np.testing.assert_allclose(np.asarray(m8["step_loss"]), np.asarray(m5["step_loss"]), rtol=1e-6)
    sl = np.asarray(m8["step_loss"], np.float64)
    assert float(l8) == pytest.approx(sl[0] + 0.8 * sl[1] + 0.64 * sl[2], rel=1e-6)
    assert float(l5) == pytest.approx(sl[0] + 0.5 * sl[1] + 0.25 * sl[2], rel=1e-6)
    np.testing.assert_allclose(e3.Eagle3TrainConfig(ttt_steps=3, ttt_decay=0.5).weights(), [1, 0.5, 0.25])
    with pytest.raises(ValueError, match="ttt_decay must be in"):
        e3.Eagle3TrainConfig(ttt_decay=0.0)
    with pytest.raises(ValueError, match="ttt_steps must be an integer >= 1"):
        e3.Eagle3TrainConfig(ttt_steps=0)


def test_draft_vocab_is_the_most_frequent_response_tokens():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=(30, 20)) ** 2 % 40  # skewed, with ties and unseen ids
    mask = rng.random((30, 20)) < 0.6
    data = types.SimpleNamespace(tokens=tokens, loss_mask=mask)
    counts = collections.Counter(tokens[mask].tolist())
    ranked = sorted(range(40), key=lambda t: (-counts.get(t, 0), t))
    for size in (1, 7, 13, len(counts), 40):
        got = e3.select_draft_vocab(data, size, 40)
        assert got.dtype == np.int32 and got.tolist() == sorted(ranked[:size])
    # prompt tokens do not count: a token only in prompts ranks like an unseen one
    only_prompt = np.full((1, 20), 39)
    data2 = types.SimpleNamespace(tokens=np.concatenate([tokens, only_prompt]),
                                  loss_mask=np.concatenate([mask, np.zeros((1, 20), bool)]))
    assert e3.select_draft_vocab(data2, 13, 40).tolist() == e3.select_draft_vocab(data, 13, 40).tolist()
    with pytest.raises(ValueError, match=r"integer in \[1, 40\].*--draft-vocab-size"):
        e3.select_draft_vocab(data, 41, 40)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        e3.select_draft_vocab(data, 5, 30)


# ------------------------------------------------------------------ the trainer
@pytest.fixture(scope="module")
def run_inputs(pair, tmp_path_factory):
    """A saved target and a data directory of 24 rows (prompt + response shards)."""
    target, _ = pair
    root = tmp_path_factory.mktemp("e3train")
    target.save(root / "target")
    rng = np.random.default_rng(1)
    n, L = 24, 32
    tokens = np.zeros((n, L), np.int32)
    mask = np.zeros((n, L), bool)
    lengths = rng.integers(18, L + 1, size=n).astype(np.int32)
    for i in range(n):
        p = int(rng.integers(3, 8))
        tokens[i, :lengths[i]] = rng.integers(1, 32, size=lengths[i])
        mask[i, p:lengths[i]] = True
    os.makedirs(root / "data")
    np.savez(root / "data" / "shard-00000.npz", tokens=tokens, loss_mask=mask, lengths=lengths)
    return root


def _cmd(root, run, steps, *extra):
    return [sys.executable, "-m", "dflash_jax", "train", "--method", "eagle3", "--target",
            str(root / "target"), "--data", str(root / "data"), "--run", str(run), "--draft-vocab-size", "20",
            "--eagle3-layers", "0", "1", "2", "--ttt-steps", "3", "--steps", str(steps), "--batch-size", "4",
            "--learning-rate", "3e-3", "--checkpoint-every", "3", "--keep-checkpoints", "2", *extra]


def _trainer(root, run, steps, vocab_size=20):
    target = dj.load_target(str(root / "target"))
    data = TokenDataset(str(root / "data"))
    vocab = e3.select_draft_vocab(data, vocab_size, CFG.vocab_size)
    config = Eagle3Config.for_target(CFG, vocab_size, LAYERS)
    cfg = TrainConfig(steps=steps, batch_size=4, learning_rate=3e-3, checkpoint_every=3, keep_checkpoints=2)
    return e3.Eagle3Trainer(target, config, data, str(run), cfg, e3.Eagle3TrainConfig(ttt_steps=3), vocab)


def test_training_lowers_the_loss_and_resume_after_sigkill_is_bitwise(run_inputs, tmp_path):
    root, steps = run_inputs, 12
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(_cmd(root, tmp_path / "killed", steps), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the uninterrupted run meanwhile, here
        killing = pool.submit(kill_after_lines, proc, metrics, 7, 600)
        full = _trainer(root, tmp_path / "full", steps)
        full_state = full.run()
        killed_at = killing.result()
    assert 7 <= killed_at < steps, "the run was not killed mid-way"
    resumed = _trainer(root, tmp_path / "killed", steps)  # the same settings as the command line's
    state = resumed.run()
    for a, b in zip(jax.tree.leaves(full_state["params"]), jax.tree.leaves(state["params"])):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    full_rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["loss"] for r in rows] == [r["loss"] for r in full_rows]
    assert len(rows[0]["step_loss"]) == len(rows[0]["accuracy_per_pos"]) == 3
    losses = [r["loss"] for r in full_rows]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses
    record = json.loads((tmp_path / "full" / "run.json").read_text())
    assert record["method"] == "eagle3" and record["eagle3"] == {"ttt_steps": 3, "ttt_decay": 0.8}
    assert json.loads((tmp_path / "full" / e3.VOCAB_FILE).read_text()) == \
        e3.select_draft_vocab(TokenDataset(str(root / "data")), 20, 32).tolist()
    # other settings are refused: another draft vocabulary, or the DFlash trainer on this run
    with pytest.raises(ValueError, match="other settings.*draft_vocab_size"):
        _trainer(root, tmp_path / "full", steps, vocab_size=21)
    with pytest.raises(ValueError, match="other settings"):
        DFlashTrainer(dj.load_target(str(root / "target")), dj.DrafterConfig.for_target(CFG, 1, 4, 31),
                   TokenDataset(str(root / "data")), str(tmp_path / "full"), TrainConfig(steps=steps, batch_size=4))
    assert latest_params(str(tmp_path / "full"))[2] == steps
    # export -> load_eagle3: the same weights and vocabulary
    from dflash_jax.training.trainer import export_run

    export_run(str(tmp_path / "full"), str(tmp_path / "export"))
    target = dj.load_target(str(root / "target"))
    loaded = load_eagle3(tmp_path / "export", target, dtype=jnp.float32)
    assert loaded.config == full.dcfg and loaded.draft_vocab.tolist() == full.vocab.tolist()
    for a, b in zip(jax.tree.leaves(full_state["params"]), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    prompts = [TokenDataset(str(root / "data")).prompt(i) for i in (0, 5)]
    n = full.cfg.eval_max_new_tokens
    r = dj.generate(target, prompts, n, drafter=loaded, block_size=4)
    assert r.sequences == dj.generate(target, prompts, n).sequences
    # the trainer's held-out tau is that of the chain of ttt_steps drafts
    full.eval_prompts = prompts
    assert full.evaluate_tau(full_state["params"]) == pytest.approx(r.tau)


def test_each_methods_options_are_refused_with_the_other(tmp_path):
    from dflash_jax.training.cli.train import main

    base = ["--target", "embedded", "--data", str(tmp_path), "--run", str(tmp_path / "r")]
    with pytest.raises(ValueError, match="--block-size, --num-anchors are DFlash / DSpark / Domino-only: drop them with "
                                         "--method eagle3"):
        main(["--method", "eagle3", *base, "--block-size", "8", "--num-anchors", "8"])
    with pytest.raises(ValueError, match="--ttt-steps is EAGLE-3-only: drop it with --method dflash"):
        main([*base, "--ttt-steps", "3"])
    with pytest.raises(ValueError, match="ttt_decay must be in"):
        main(["--method", "eagle3", *base, "--ttt-decay", "1.5"])


def test_loss_at_the_trainers_rows_equals_the_whole_sequence(pair):
    """The trainer runs the drafter only at ``loss_rows`` (the positions from ttt_steps + 1
    before each response on): the loss and metrics equal those over every position; rows that
    start too late (one position after the needed start) change them."""
    target, drafter = pair
    L, steps = 40, 4
    rng = np.random.default_rng(9)
    tokens = rng.integers(0, 32, size=(2, L)).astype(np.int32)
    lengths = np.array([L, 31])
    tokens[1, lengths[1]:] = 0
    mask = np.zeros((2, L), bool)
    mask[0, 22:] = True
    mask[1, 12:lengths[1]] = True
    valid = np.arange(L)[None] < lengths[:, None]
    w = jnp.asarray(0.8 ** np.arange(steps), jnp.float32)
    args = (drafter.params, target.params, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(valid),
            jnp.asarray(VOCAB), w)
    full, mf = e3.eval_eagle3_loss(*args, cfg=drafter.config, tcfg=CFG)
    rows = e3.loss_rows(mask, lengths, steps, bucket=8)
    assert rows.shape[1] < L  # the prompt's positions are skipped
    part, mp = e3.eval_eagle3_loss(*args, jnp.asarray(rows), cfg=drafter.config, tcfg=CFG)
    assert float(part) == pytest.approx(float(full), rel=1e-5)
    np.testing.assert_allclose(np.asarray(mp["step_loss"]), np.asarray(mf["step_loss"]), rtol=1e-5)
    assert int(mp["num_labels"]) == int(mf["num_labels"])
    late, _ = e3.eval_eagle3_loss(*args, jnp.asarray(np.minimum(rows + 1, L)), cfg=drafter.config, tcfg=CFG)
    assert float(late) != pytest.approx(float(full), rel=1e-4)
