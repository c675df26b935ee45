"""Drafter training: blocks and labels, the visibility rule, train/inference agreement,
online vs offline features, resume after SIGKILL, and a tiny end-to-end run."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.nn.cache import KVCache
from dflash_jax.methods.dflash.model import DrafterModel
from dflash_jax.nn.head import embed, lm_head
from dflash_jax.training.blocks import (block_boundaries, build_blocks, default_gamma, epoch_anchors,
                                        fixed_anchors, loss_weights, sample_anchors)
from dflash_jax.training.data import TokenDataset, read_prompt_file, regenerate
from dflash_jax.training.features import FeatureStore, write_features
from dflash_jax.methods.dflash.loss import block_logits, eval_loss
from dflash_jax.training.features import target_features
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.training.trainer import TrainConfig, latest_params
from support.processes import kill_after_lines

# one pytest-xdist worker runs the whole module: its module fixtures regenerate training data once
pytestmark = [pytest.mark.xdist_group("test_training"), pytest.mark.slow]

CFG = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)


@pytest.fixture(scope="module")
def pair():
    target = dj.Target.random(CFG, seed=0, init_scale=0.35)
    drafter = dj.Drafter.random(target, num_layers=2, block_size=4, seed=1, init_scale=0.2)
    return target, drafter


def test_blocks_labels_and_weights_by_hand():
    tokens = jnp.array([[10, 11, 12, 13, 14, 15, 16, 0]])
    mask = jnp.array([[0, 0, 1, 1, 1, 1, 1, 0]], bool)  # response = positions 2..6, length 7
    anchors = jnp.array([[2, 5, 0]])
    valid = jnp.array([[True, True, False]])
    inputs, pos, labels, lmask = build_blocks(tokens, mask, anchors, valid, 4, mask_token_id=31)
    assert inputs.tolist() == [[[12, 31, 31, 31], [15, 31, 31, 31], [10, 31, 31, 31]]]
    assert pos.tolist() == [[[2, 3, 4, 5], [5, 6, 7, 8], [0, 1, 2, 3]]]
    # row k predicts tokens[a + k]; row 0, positions outside the response / sequence: no loss
    assert labels[0, 0].tolist() == [12, 13, 14, 15]
    assert lmask.tolist() == [[[False, True, True, True], [False, True, False, False],
                               [False, False, False, False]]]
    np.testing.assert_allclose(loss_weights(4, 2.0), [0, 1, np.exp(-0.5), np.exp(-1.0)], rtol=1e-6)
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)


def test_anchor_sampling():
    mask = np.zeros(40, bool)
    mask[10:30] = True
    mask[20] = False  # 19 and 20 are not valid anchors (the next token must be a response token)
    rng = np.random.default_rng(0)
    a, v = sample_anchors(mask, 8, rng)
    assert v.all() and len(set(a.tolist())) == 8 and list(a) == sorted(a)
    assert all(mask[x] and mask[x + 1] for x in a)
    a, v = sample_anchors(mask, 64, rng)
    assert v.sum() == 17 and set(a[v].tolist()) == set(range(10, 19)) | set(range(21, 29))
    e0 = epoch_anchors(mask[None], [5], 8, seed=1, epoch=0)[0]
    assert np.array_equal(e0, epoch_anchors(mask[None], [5], 8, seed=1, epoch=0)[0])
    assert not np.array_equal(e0, epoch_anchors(mask[None], [5], 8, seed=1, epoch=1)[0])


def test_fixed_anchors_are_the_consecutive_blocks():
    mask = np.zeros(60, bool)
    mask[10:30] = True  # a response of 20 tokens: blocks start at 10, 14, 18, 22, 26
    mask[40:47] = True  # a second turn of 7 tokens: 40, 44 (46 is not a valid anchor: 47 is no response)
    assert block_boundaries(mask, 4).tolist() == [10, 14, 18, 22, 26, 40, 44]
    mask[46] = False  # a run of 6 ending at 46: 40, 44 valid (44+1 = 45 is a response token)
    assert block_boundaries(mask, 4).tolist() == [10, 14, 18, 22, 26, 40, 44]
    mask[44:46] = False  # 44's next token is no longer a response token
    assert block_boundaries(mask, 4).tolist() == [10, 14, 18, 22, 26, 40]
    # written out independently: every anchor is a run start + a multiple of the block size
    rng = np.random.default_rng(3)
    for _ in range(20):
        m = rng.random(80) < 0.8
        got = block_boundaries(m, 5).tolist()
        want, run_start = [], None
        for i in range(80):
            if m[i] and (i == 0 or not m[i - 1]):
                run_start = i
            if m[i] and (i - run_start) % 5 == 0 and i + 1 < 80 and m[i + 1]:
                want.append(i)
        assert got == want
    a, v = fixed_anchors(mask, 4, 16, rng)
    assert a[v].tolist() == [10, 14, 18, 22, 26, 40] and not v[6:].any()
    a, v = fixed_anchors(mask, 4, 3, np.random.default_rng(0))  # more blocks than anchors: a subset
    assert v.all() and set(a.tolist()) <= {10, 14, 18, 22, 26, 40} and list(a) == sorted(a)
    e = epoch_anchors(mask[None], [0], 16, seed=0, epoch=0, strategy="fixed", block_size=4)
    assert e[0][0][e[1][0]].tolist() == [10, 14, 18, 22, 26, 40]
    with pytest.raises(ValueError, match="unknown anchor strategy 'aligned'; choose from random, fixed"):
        epoch_anchors(mask[None], [0], 16, seed=0, epoch=0, strategy="aligned")
    with pytest.raises(ValueError, match="unknown anchor strategy"):
        TrainConfig(anchors="aligned")


def test_fixed_anchor_blocks_never_see_the_future(pair):
    """With fixed anchors the training blocks tile the response, and block j still sees only the
    features before its anchor: changing the features from its anchor on leaves it unchanged."""
    target, drafter = pair
    tokens, mask, taps, _, _ = _batch(pair)
    anchors, valid = epoch_anchors(np.asarray(mask), [0, 1], 6, seed=0, epoch=0, strategy="fixed", block_size=4)
    assert anchors[0][valid[0]].tolist() == [5, 9, 13, 17]  # the response is 5..21: 21 is its last token
    inputs, positions, labels, label_mask = build_blocks(tokens, mask, jnp.asarray(anchors), jnp.asarray(valid),
                                                         4, 31)
    # the labelled rows of consecutive blocks cover the response once, without overlap
    covered = np.asarray(positions)[0][np.asarray(label_mask)[0]]
    assert sorted(covered.tolist()) == [p for p in range(6, 21) if (p - 5) % 4 != 0]
    args = (drafter.config, CFG, drafter.params, target.params, tokens, mask)
    anchors, valid = jnp.asarray(anchors), jnp.asarray(valid)
    base = np.asarray(block_logits(*args, taps, anchors, valid)[0])
    for j, a in enumerate([5, 9, 13, 17]):
        out = np.asarray(block_logits(*args, taps.at[0, a:].add(3.0), anchors, valid)[0])
        np.testing.assert_array_equal(out[0, j], base[0, j])
        if j:  # and every earlier block's features matter
            out = np.asarray(block_logits(*args, taps.at[0, a - 1].add(3.0), anchors, valid)[0])
            assert np.abs(out[0, j] - base[0, j]).max() > 1e-3


def _batch(pair, seed=0):
    target, drafter = pair
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, 30, size=(2, 24)), jnp.int32)
    mask = np.zeros((2, 24), bool)
    mask[:, 5:22] = True
    anchors, valid = epoch_anchors(mask, [0, 1], 6, seed=seed, epoch=0)
    valid[1, -1] = False  # one padding block
    taps = target_features(CFG, target.params, tokens, drafter.config.target_layer_ids)
    return tokens, jnp.asarray(mask), taps, jnp.asarray(anchors), jnp.asarray(valid)


def test_no_leak_past_the_anchor(pair):
    target, drafter = pair
    tokens, mask, taps, anchors, valid = _batch(pair)
    args = (drafter.config, CFG, drafter.params, target.params, tokens, mask)
    base = np.asarray(block_logits(*args, taps, anchors, valid)[0])
    b, j = 0, 2
    a = int(anchors[b, j])
    later = taps.at[b, a:].add(3.0)  # features at positions >= the anchor
    out = np.asarray(block_logits(*args, later, anchors, valid)[0])
    np.testing.assert_array_equal(out[b, j], base[b, j])
    earlier = taps.at[b, a - 1].add(3.0)  # the position just before the anchor
    out = np.asarray(block_logits(*args, earlier, anchors, valid)[0])
    assert np.abs(out[b, j] - base[b, j]).max() > 1e-3


def test_training_blocks_equal_inference_drafts(pair):
    """Each training block equals the inference drafter with context taps[:anchor] (cache path)."""
    target, drafter = pair
    tokens, mask, taps, anchors, valid = _batch(pair, seed=3)
    logits = np.asarray(block_logits(drafter.config, CFG, drafter.params, target.params, tokens,
                                     mask, taps, anchors, valid)[0])
    d = drafter.config
    bs = d.block_size
    model = DrafterModel(d)
    for b in range(2):
        for j in range(anchors.shape[1]):
            if not valid[b, j]:
                assert np.all(np.isfinite(logits[b, j]))
                continue
            a = int(anchors[b, j])
            cache = KVCache.init(d.num_layers, 1, 32, d.num_kv_heads, d.head_dim)
            block = jnp.concatenate([tokens[b:b + 1, a:a + 1], jnp.full((1, bs - 1), d.mask_token_id)], 1)
            cache = model.apply({"params": drafter.params}, taps[b:b + 1], jnp.arange(24)[None],
                                cache, jnp.array([a]), method=DrafterModel.project_context)
            h = model.apply({"params": drafter.params}, embed(target.params, block),
                            a + jnp.arange(bs)[None], cache, method=DrafterModel.draft)
            ref = np.asarray(lm_head(CFG, target.params, h))[0]
            np.testing.assert_allclose(logits[b, j], ref, atol=2e-4, rtol=1e-4)


def test_all_padding_is_finite(pair):
    target, drafter = pair
    tokens, mask, taps, anchors, _ = _batch(pair)
    none = jnp.zeros_like(anchors, bool)
    w = jnp.asarray(loss_weights(4, 2.0))
    loss, m = eval_loss(drafter.params, target.params, tokens, mask, taps, anchors, none, w,
                        dcfg=drafter.config, tcfg=CFG)
    assert float(loss) == 0.0 and int(m["num_labels"]) == 0
    from dflash_jax.methods.dflash.loss import drafter_loss

    g = jax.grad(lambda p: drafter_loss(p, target.params, tokens, mask, taps, anchors, none, w,
                                        dcfg=drafter.config, tcfg=CFG)[0])(drafter.params)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g))


@pytest.fixture(scope="module")
def data_dir(pair, tmp_path_factory):
    target, _ = pair
    root = tmp_path_factory.mktemp("train")
    target.path = str(root / "target")
    target.save(root / "target")
    rng = np.random.default_rng(0)
    prompts = [{"prompt_ids": rng.integers(0, 30, size=int(rng.integers(3, 9))).tolist()} for _ in range(200)]
    with open(root / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in prompts)
    return root


def test_regenerate_skips_finished_shards(pair, data_dir, tmp_path):
    target, _ = pair
    prompts = read_prompt_file(str(data_dir / "prompts.jsonl"))[:10]
    meta = regenerate(target, prompts, str(tmp_path / "d"), max_new_tokens=12, max_len=32,
                      batch_size=4, shard_size=4)
    assert meta["num_shards"] == 3 and meta["sequences"] == 10 and meta["complete"]
    ds = TokenDataset(str(tmp_path / "d"))
    assert ds.tokens.shape == (10, 32) and ds.prompt(0) == prompts[0]
    # the response is the target's own greedy continuation
    assert ds.tokens[0, len(prompts[0]):ds.lengths[0]].tolist() == dj.generate(target, [prompts[0]], 12).sequences[0]
    first = os.path.getmtime(tmp_path / "d" / "shard-00001.npz")
    os.remove(tmp_path / "d" / "shard-00002.npz")
    regenerate(target, prompts, str(tmp_path / "d"), max_new_tokens=12, max_len=32, batch_size=4, shard_size=4)
    assert os.path.getmtime(tmp_path / "d" / "shard-00001.npz") == first
    assert os.path.exists(tmp_path / "d" / "shard-00002.npz")
    with pytest.raises(ValueError, match="other settings"):
        regenerate(target, prompts, str(tmp_path / "d"), max_new_tokens=13, max_len=32)
    # the thinking switch is recorded; data written before it was (no key) resumes when the
    # prompts cannot depend on it (here token ids, no tokenizer), and another value is refused
    meta_file = tmp_path / "d" / "metadata.json"
    assert json.loads(meta_file.read_text())["settings"]["enable_thinking"] is False
    old = json.loads(meta_file.read_text())
    del old["settings"]["enable_thinking"]
    meta_file.write_text(json.dumps(old))
    regenerate(target, prompts, str(tmp_path / "d"), max_new_tokens=12, max_len=32, batch_size=4, shard_size=4)
    with pytest.raises(ValueError, match="differs in enable_thinking"):
        regenerate(target, prompts, str(tmp_path / "d"), max_new_tokens=12, max_len=32, batch_size=4,
                   shard_size=4, enable_thinking=True)


def test_bad_prompt_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "x"}\n{oops\n')
    with pytest.raises(ValueError, match="a.jsonl:2: not valid JSON"):
        read_prompt_file(str(tmp_path / "a.jsonl"))
    (tmp_path / "b.jsonl").write_text('{"question": "x"}\n')
    with pytest.raises(ValueError, match="expected a 'prompt'"):
        read_prompt_file(str(tmp_path / "b.jsonl"))
    with pytest.raises(FileNotFoundError, match="train-data"):
        TokenDataset(str(tmp_path))


@pytest.fixture(scope="module")
def regenerated(pair, data_dir):
    target, _ = pair
    out = str(data_dir / "data")
    regenerate(target, read_prompt_file(str(data_dir / "prompts.jsonl")), out, max_new_tokens=40,
               max_len=48, batch_size=100, shard_size=100)
    return out


def test_online_and_offline_features_give_the_same_loss(pair, regenerated, tmp_path):
    target, drafter = pair
    data = TokenDataset(regenerated)
    write_features(target, regenerated, str(tmp_path / "f"), drafter.config.target_layer_ids, batch_size=7)
    store = FeatureStore(str(tmp_path / "f"), drafter.config.target_layer_ids)
    ids = [3, 17, 125, 199]
    tokens, mask = jnp.asarray(data.tokens[ids]), jnp.asarray(data.loss_mask[ids])
    anchors, valid = epoch_anchors(data.loss_mask[ids], ids, 8, 0, 0)
    online = target_features(CFG, target.params, tokens, drafter.config.target_layer_ids)
    offline = jnp.asarray(store.take(ids))
    np.testing.assert_allclose(np.asarray(offline), np.asarray(online), atol=1e-5, rtol=1e-5)
    w = jnp.asarray(loss_weights(4, 2.0))
    args = (jnp.asarray(anchors), jnp.asarray(valid), w)
    l_on = eval_loss(drafter.params, target.params, tokens, mask, online, *args, dcfg=drafter.config, tcfg=CFG)[0]
    l_off = eval_loss(drafter.params, target.params, tokens, mask, offline, *args, dcfg=drafter.config, tcfg=CFG)[0]
    assert abs(float(l_on) - float(l_off)) < 1e-5 * abs(float(l_on))
    with pytest.raises(ValueError, match="tap layers"):
        FeatureStore(str(tmp_path / "f"), (0,))
    # a cache from before the tap convention (no tap_convention recorded) is refused
    meta_file = tmp_path / "f" / "features.json"
    meta = json.loads(meta_file.read_text())
    del meta["tap_convention"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="hidden_states\\[i \\+ 1\\]"):
        FeatureStore(str(tmp_path / "f"), drafter.config.target_layer_ids)


def _train_cmd(data_dir, regenerated, run, steps):
    return [sys.executable, "-m", "dflash_jax", "train", "--target", str(data_dir / "target"),
            "--data", regenerated, "--run", str(run), "--drafter-layers", "1", "--block-size", "4",
            "--mask-token-id", "31", "--steps", str(steps), "--batch-size", "4", "--num-anchors", "8",
            "--checkpoint-every", "3", "--keep-checkpoints", "2"]


def test_resume_after_sigkill_is_bitwise_identical(data_dir, regenerated, tmp_path):
    steps = 14
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run(_train_cmd(data_dir, regenerated, tmp_path / "full", steps), check=True, env=env,
                   capture_output=True)
    proc = subprocess.Popen(_train_cmd(data_dir, regenerated, tmp_path / "killed", steps), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    killed_at = kill_after_lines(proc, metrics, 8, timeout=300)
    assert 8 <= killed_at < steps, "the run was not killed mid-way"
    subprocess.run(_train_cmd(data_dir, regenerated, tmp_path / "killed", steps), check=True, env=env,
                   capture_output=True)
    _, full, s1 = latest_params(str(tmp_path / "full"))
    _, resumed, s2 = latest_params(str(tmp_path / "killed"))
    assert s1 == s2 == steps
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # no step lost or repeated
    full_rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [r["loss"] for r in full_rows]
    # a resume with other settings is refused and leaves the run untouched
    bad = _train_cmd(data_dir, regenerated, tmp_path / "killed", steps + 1)
    out = subprocess.run(bad, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "other settings" in out.stderr
    assert latest_params(str(tmp_path / "killed"))[2] == steps


def test_tiny_end_to_end_training_raises_tau(pair, regenerated, tmp_path):
    target, _ = pair
    data = TokenDataset(regenerated)
    held = data.hold_out(8)
    dcfg = dj.DrafterConfig.for_target(CFG, 2, 4, 31)
    cfg = TrainConfig(steps=300, batch_size=8, learning_rate=3e-3, num_anchors=16, checkpoint_every=150,
                      eval_every=150, eval_max_new_tokens=32)
    trainer = DFlashTrainer(target, dcfg, data, str(tmp_path / "run"), cfg, eval_prompts=held)
    untrained = trainer.evaluate_tau(trainer.init_state()["params"])
    state = trainer.run()
    trained = trainer.evaluate_tau(state["params"])
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert "eval_tau" in rows[149] and rows[-1]["eval_tau"] == pytest.approx(trained)
    assert trained > untrained + 0.5, (untrained, trained)
    # export in the released layout and use it
    from dflash_jax.training.trainer import export_run

    export_run(str(tmp_path / "run"), str(tmp_path / "export"))
    drafter = dj.load_drafter(tmp_path / "export", target)
    r = dj.generate(target, held, 32, drafter=drafter)
    assert r.sequences == dj.generate(target, held, 32).sequences
    assert r.tau == pytest.approx(trained)
    # continued training starts from the exported weights; a different config is refused
    cont = DFlashTrainer(target, dcfg, data, str(tmp_path / "cont"), cfg, init_from=str(tmp_path / "export"),
                         eval_prompts=held)
    for x, y in zip(jax.tree.leaves(cont.init_state()["params"]), jax.tree.leaves(state["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # ... and, with held-out prompts, first measures its starting drafter's tau (once)
    from dflash_jax.training.run_dir import start_tau

    cont.run(stop_after=0)
    assert start_tau(str(tmp_path / "cont")) == pytest.approx(trained)
    other = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
    with pytest.raises(ValueError, match="another config"):
        DFlashTrainer(target, other, data, str(tmp_path / "cont2"), cfg, init_from=str(tmp_path / "export"))


def test_train_data_renders_prompts_without_thinking(tmp_path, capsys):
    """train-data's prompts (text and chat) end in a Qwen3-style template's non-thinking
    assistant prefix, or with --thinking in the bare assistant header; metadata records it. The
    command ends with what it wrote and a train command that train's parser takes as printed."""
    import shlex

    from support.doc_commands import parse
    from support.tiny_models import QWEN3_ASSISTANT, QWEN3_LIKE_TEMPLATE, QWEN3_NO_THINK, save_chat_target
    from transformers import AutoTokenizer

    from dflash_jax.__main__ import main

    target_dir, _ = save_chat_target(str(tmp_path), QWEN3_LIKE_TEMPLATE, drafter=False)
    tok = AutoTokenizer.from_pretrained(target_dir)
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n" + json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                      {"role": "user", "content": "Add 1 and 2."}]}) + "\n")
    for flag, thinking in (([], False), (["--thinking"], True)):
        out = tmp_path / f"data-{thinking}"
        main(["train-data", "--target", target_dir, "--prompts", str(tmp_path / "p.jsonl"), "--out", str(out),
              "--max-new-tokens", "2", "--max-len", "96", "--batch-size", "2", "--dtype", "float32", *flag])
        ds = TokenDataset(str(out))
        texts = [tok.decode(ds.prompt(i)) for i in range(len(ds))]
        assert len(texts) == 2 and texts[1].count("<|im_start|>user") == 2
        end = QWEN3_ASSISTANT if thinking else QWEN3_NO_THINK
        assert all(t.endswith(end) and t.endswith(QWEN3_NO_THINK) != thinking for t in texts), texts
        settings = json.loads((out / "metadata.json").read_text())["settings"]
        assert settings["enable_thinking"] is thinking and "target_quantization" not in settings  # none asked
        closing = capsys.readouterr().out.splitlines()
        i = next(i for i, line in enumerate(closing) if line.startswith(f"wrote {out}: "))
        responses = int(ds.loss_mask.sum())
        assert closing[i].startswith(f"wrote {out}: 2 sequences, {responses} response tokens ("), closing[i]
        assert closing[i].endswith(f"in 1 shard (shard-*.npz, up to 256 sequences of 96 tokens each) and "
                                   f"{out / 'metadata.json'}"), closing[i]
        assert closing[i + 1].startswith("next: train a drafter on it")
        train_cmd = closing[i + 2].strip()
        assert train_cmd == shlex.join(["python", "-m", "dflash_jax", "train", "--target", target_dir, "--data",
                                        str(out), "--run", f"{out}-run", "--target-dtype", "float32"])
        args = parse("dflash_jax", shlex.split(train_cmd)[3:])
        assert (args.target, args.data, args.run, args.target_dtype) == (target_dir, str(out), f"{out}-run", "float32")
        mask = tok.mask_token_id is not None
        assert ("add --mask-token-id" in "\n".join(closing[i + 3:])) != mask


def test_gamma_must_be_positive_and_uniform_weights_are_explicit(pair, regenerated, tmp_path, capsys):
    from dflash_jax.__main__ import main
    from dflash_jax.training.blocks import block_loss_weights, uniform_loss_weights

    for bad in (0, 0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="gamma must be a number > 0.*--uniform-weights"):
            TrainConfig(gamma=bad)
        with pytest.raises(ValueError, match="gamma must be a number > 0"):
            loss_weights(16, bad)
    with pytest.raises(ValueError, match="exclude each other"):
        TrainConfig(gamma=3.0, uniform_weights=True)
    # the command refuses --gamma 0 before loading anything (the target does not even exist)
    with pytest.raises(SystemExit) as e:
        main(["train", "--target", str(tmp_path / "none"), "--data", "x", "--run", str(tmp_path / "r"),
              "--gamma", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: gamma must be a number > 0, got 0.0"), err
    assert not (tmp_path / "r").exists()

    w = uniform_loss_weights(8)
    assert w.dtype == np.float32 and w[0] == 0 and np.all(w[1:] == w[1]) and w[1] == 1
    np.testing.assert_array_equal(block_loss_weights(8, uniform=True), w)
    np.testing.assert_array_equal(block_loss_weights(8), loss_weights(8, 4.0))
    np.testing.assert_array_equal(block_loss_weights(8, 2.5), loss_weights(8, 2.5))
    target, _ = pair
    dcfg = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
    data = TokenDataset(regenerated)
    t = DFlashTrainer(target, dcfg, data, str(tmp_path / "u"), TrainConfig(steps=2, uniform_weights=True))
    assert np.asarray(t.weights).tolist() == [0.0, 1.0, 1.0, 1.0]
    assert json.loads((tmp_path / "u" / "run.json").read_text())["train"]["uniform_weights"] is True
    t = DFlashTrainer(target, dcfg, data, str(tmp_path / "g"), TrainConfig(steps=2))
    np.testing.assert_array_equal(np.asarray(t.weights), loss_weights(4, default_gamma(4)))
    # the old spelling, Trainer(...), is DFlash's trainer with a deprecation note; the shared
    # loop alone has no objective
    from dflash_jax.training.trainer import Trainer

    with pytest.warns(DeprecationWarning, match="DFlashTrainer"):
        old = Trainer(target, dcfg, data, str(tmp_path / "g"), TrainConfig(steps=2))
    assert type(old) is DFlashTrainer and old._run_record() == t._run_record()

    class NoObjective(Trainer):
        method = "dflash"

    with pytest.raises(NotImplementedError, match="NoObjective must implement init_params"):
        NoObjective(target, dcfg, data, str(tmp_path / "n"), TrainConfig(steps=2)).init_state()


def test_uniform_weights_change_only_the_weights(pair, regenerated, tmp_path):
    """The uniform-weights trainer sees the same batches, anchors and initial weights as the
    decayed one; its first loss is the weighted mean with weights 1 instead of the decay (checked
    against eval_loss with each weight vector), and per-position accuracy is the same."""
    target, _ = pair
    dcfg = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
    data = TokenDataset(regenerated)
    runs = {u: DFlashTrainer(target, dcfg, data, str(tmp_path / str(u)), TrainConfig(steps=2, uniform_weights=u,
                                                                              num_anchors=6, batch_size=4))
            for u in (False, True)}
    for step in range(3):
        a, b = runs[False].step_inputs(step), runs[True].step_inputs(step)
        for x, y in zip(a, b):
            assert (x is None and y is None) or np.array_equal(np.asarray(x), np.asarray(y))
    states = {u: t.init_state() for u, t in runs.items()}
    jax.tree.map(np.testing.assert_array_equal, states[False]["params"], states[True]["params"])
    tokens, mask, taps, anchors, valid = runs[True].step_inputs(0)
    taps = target_features(CFG, target.params, tokens, dcfg.target_layer_ids)
    losses = {}
    for u, t in runs.items():
        _, m = t._step_fn(states[u], target.params, *t.step_inputs(0))
        # the weighted mean written out in numpy over the block logits, with the weights by hand
        logits, labels, lmask = (np.asarray(x, np.float64) for x in block_logits(
            dcfg, CFG, states[u]["params"], target.params, tokens, mask, taps, anchors, valid))
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        ce = -np.take_along_axis(logp, labels.astype(int)[..., None], -1)[..., 0]
        w = (np.array([0.0, 1.0, 1.0, 1.0]) if u else np.array([0.0, 1.0, np.exp(-1 / 2), np.exp(-2 / 2)]))
        w = w[None, None, :] * lmask
        np.testing.assert_allclose(float(m["loss"]), (w * ce).sum() / w.sum(), rtol=1e-5)
        losses[u] = (float(m["loss"]), np.asarray(m["accuracy_per_pos"]))
    np.testing.assert_allclose(losses[False][1], losses[True][1])
    assert abs(losses[False][0] - losses[True][0]) > 1e-4  # the weights do change the loss


def test_epochs_set_the_length_of_the_run(pair, regenerated, tmp_path, capsys):
    """--epochs E runs ceil(E * (sequences // batch)) steps (an epoch as batch_for_step walks the
    data); with --steps it is refused; run.json records both; old run.json files resume."""
    from dflash_jax.__main__ import main
    from dflash_jax.methods.dflash.training import batch_for_step
    from dflash_jax.training.trainer import DEFAULT_STEPS

    target, _ = pair
    dcfg = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
    data = TokenDataset(regenerated)
    assert len(data) == 200
    for epochs, batch, steps in ((2, 8, 50), (0.5, 8, 13), (1, 7, 28), (0.1, 10, 2), (6, 200, 6)):
        assert TrainConfig(epochs=epochs, batch_size=batch).total_steps(len(data)) == steps
    assert TrainConfig().total_steps(200) == DEFAULT_STEPS and TrainConfig(steps=7).total_steps(200) == 7
    # one epoch (25 steps of 8) visits 200 // 8 * 8 distinct sequences; the next one another order
    cfg = TrainConfig(epochs=1, batch_size=8)
    first = np.concatenate([batch_for_step(s, data, cfg)[0] for s in range(25)])
    assert len(set(first.tolist())) == 200
    assert not np.array_equal(batch_for_step(25, data, cfg)[0], batch_for_step(0, data, cfg)[0])
    for bad in (dict(steps=10, epochs=1.0), dict(epochs=0), dict(epochs=-1.0), dict(steps=0)):
        with pytest.raises(ValueError, match="not both|epochs must be|steps must be"):
            TrainConfig(**bad)

    held = TokenDataset(regenerated)
    held.hold_out(8)  # epochs count the sequences trained on: 192 // 8 = 24 steps each
    t = DFlashTrainer(target, dcfg, held, str(tmp_path / "e"), TrainConfig(epochs=0.125, batch_size=8, num_anchors=8))
    assert t.num_steps == 3
    state = t.run()
    assert int(state["step"]) == 3
    rows = [json.loads(x) for x in (tmp_path / "e" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["epoch"] == 0.125
    train = json.loads((tmp_path / "e" / "run.json").read_text())["train"]
    assert train["steps"] == 3 and train["epochs"] == 0.125
    # a run.json written before epochs / uniform_weights existed resumes with their defaults
    DFlashTrainer(target, dcfg, data, str(tmp_path / "old"), TrainConfig(steps=4, num_anchors=8))
    record = json.loads((tmp_path / "old" / "run.json").read_text())
    del record["train"]["epochs"], record["train"]["uniform_weights"]
    (tmp_path / "old" / "run.json").write_text(json.dumps(record))
    DFlashTrainer(target, dcfg, data, str(tmp_path / "old"), TrainConfig(steps=4, num_anchors=8))
    with pytest.raises(ValueError, match="other settings.*train"):
        DFlashTrainer(target, dcfg, data, str(tmp_path / "old"), TrainConfig(steps=4, num_anchors=8, uniform_weights=True))
    # the command: --epochs with --steps is refused before anything is loaded
    with pytest.raises(SystemExit) as e:
        main(["train", "--target", str(tmp_path / "none"), "--data", "x", "--run", str(tmp_path / "r"),
              "--steps", "10", "--epochs", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --epochs: not allowed with argument --steps" in err, err
    assert not (tmp_path / "r").exists()


def test_a_step_pays_only_for_its_longest_row(pair, regenerated, tmp_path):
    """Data padded far past its rows (train-data's --max-len is a bound, not the usual length):
    a step's arrays are cut to its longest row rounded up to 64 columns, and the loss on the
    cut batch equals the loss on the whole width (the padding after the rows is never seen)."""
    from dflash_jax.methods.dflash.training import batch_for_step
    from dflash_jax.training.trainer import batch_width

    assert [batch_width(np.array(x), 512) for x in ([1], [64], [65, 3], [200, 130], [600])] == [64, 64, 128, 256, 512]
    assert batch_width(np.array([40]), 48) == 48  # never wider than the data
    target, drafter = pair
    data = TokenDataset(regenerated)
    padded = tmp_path / "padded"
    padded.mkdir()
    width = 200
    np.savez(padded / "shard-00000.npz", tokens=np.pad(data.tokens, ((0, 0), (0, width - data.seq_len))),
             loss_mask=np.pad(data.loss_mask, ((0, 0), (0, width - data.seq_len))), lengths=data.lengths)
    wide = TokenDataset(str(padded))
    cfg = TrainConfig(steps=4, batch_size=4, num_anchors=8, seed=3)
    trainer = DFlashTrainer(target, drafter.config, wide, str(tmp_path / "run"), cfg)
    w = jnp.asarray(loss_weights(4, 2.0))
    for step in range(3):
        tokens, mask, taps, anchors, valid = trainer.step_inputs(step)
        ids = batch_for_step(step, wide, cfg, drafter.config.block_size)[0]
        assert tokens.shape == mask.shape == (4, 64) and taps is None  # the rows are <= 48 long
        assert (np.asarray(tokens) == wide.tokens[ids, :64]).all()
        full_t, full_m = jnp.asarray(wide.tokens[ids]), jnp.asarray(wide.loss_mask[ids])
        losses = []
        for t, m in ((tokens, mask), (full_t, full_m)):
            f = target_features(CFG, target.params, t, drafter.config.target_layer_ids)
            losses.append(float(eval_loss(drafter.params, target.params, t, m, f, anchors, valid, w,
                                          dcfg=drafter.config, tcfg=CFG)[0]))
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def _tree_snapshot(root):
    """{relative path: (bytes, mtime_ns)} of every file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_train_ends_with_the_checkpoint_the_held_out_tau_and_the_next_commands(tmp_path, monkeypatch):
    """train's closing lines from what the run directory holds: the newest checkpoint (and
    whether the run is finished), the last held-out tau with its step or why none was measured,
    and the export / bench commands for that checkpoint with the paths as the user gave them."""
    import argparse

    from dflash_jax.training.cli.train import closing_lines

    monkeypatch.chdir(tmp_path)
    for step in (40, 80):
        (tmp_path / "r" / "checkpoints" / str(step)).mkdir(parents=True)
    (tmp_path / "r" / "run.json").write_text(json.dumps({"train": {"steps": 100}}))
    rows = [{"step": 40, "loss": 2.0, "eval_tau": 1.5}, {"step": 80, "loss": 1.0, "eval_tau": 2.3456},
            {"step": 81, "loss": 1.0}]
    (tmp_path / "r" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8')
    args = argparse.Namespace(run="r/", target="Qwen/Qwen3-8B", eval_prompts=8)
    assert closing_lines(args, TrainConfig(eval_every=40))[1:] == [
        "last checkpoint: r/checkpoints/80 (step 80 of 100; the same command continues the run)",
        "held-out tau: 2.35 at step 80 (metrics.jsonl, eval_tau)",
        "next: export the drafter, then benchmark it against the target alone:",
        "  python -m dflash_jax export --run r --out r-step80",
        "  python -m dflash_jax bench --target Qwen/Qwen3-8B --drafter r-step80"]
    # a run started --init-from measured its starting drafter too: both ends of the curve
    (tmp_path / "r" / "start_eval.json").write_text(json.dumps({"eval_tau": 2.014, "step": 0}))
    assert closing_lines(args, TrainConfig(eval_every=40))[2] == (
        "held-out tau: 2.01 at the start (the --init-from drafter) -> 2.35 at step 80 (metrics.jsonl, eval_tau)")
    # no held-out tau in the metrics: each reason
    (tmp_path / "r" / "metrics.jsonl").write_text(json.dumps(rows[2]) + "\n")
    for eval_prompts, every, why in ((0, 40, "--eval-prompts N --eval-every K"), (8, 0, "--eval-every N measures"),
                                     (8, 1000, "multiples of --eval-every 1000; none yet")):
        args.eval_prompts = eval_prompts
        line = closing_lines(args, TrainConfig(eval_every=every))[2]
        assert line.startswith("held-out tau: no held-out evaluation ran (") and why in line, line
    # a path with a space is quoted so that the commands run as printed
    (tmp_path / "r" / "checkpoints" / "100").mkdir()
    args.run = "my runs/r"
    os.makedirs("my runs")
    os.rename("r", "my runs/r")
    lines = closing_lines(args, TrainConfig())
    assert lines[1] == "last checkpoint: my runs/r/checkpoints/100 (step 100 of 100)"
    assert lines[-2] == "  python -m dflash_jax export --run 'my runs/r' --out 'my runs/r-step100'"


def test_finished_run_says_so_and_extending_it_points_to_init_from(data_dir, regenerated, tmp_path,
                                                                   monkeypatch, capsys):
    """`train` on a run that has done all its steps prints one line (step, checkpoint, how to
    export, evaluate and train on) and leaves every file of the run as it was; asking that run
    for more steps is refused with the export + --init-from commands, and those commands run;
    a changed drafter shape, or a run without a checkpoint, is told to use a new directory."""
    import re
    import shlex

    from support.doc_commands import parse

    from dflash_jax.__main__ import main

    monkeypatch.chdir(tmp_path)  # the run directory as a user types it: relative
    target = dj.load_target(data_dir / "target")

    def train(run, steps, *extra):
        cmd = _train_cmd(data_dir, regenerated, run, steps)[3:]  # after "python -m dflash_jax"
        main(cmd + ["--checkpoint-every", "2", *extra])

    train("run", 3)
    # it ends with what the run holds and the commands that come next, with the paths as given
    closing = capsys.readouterr().out.splitlines()[-6:]
    target_dir = str(data_dir / "target")
    assert closing[0].startswith("run directory: run (run.json") and "metrics.jsonl" in closing[0], closing
    assert closing[1:3] == ["last checkpoint: run/checkpoints/3 (step 3 of 3)",
                            "held-out tau: no held-out evaluation ran (--eval-prompts N --eval-every K hold out "
                            "N sequences and measure tau on their prompts every K steps)"], closing
    assert closing[3].startswith("next: export the drafter, then benchmark it")
    export_cmd, bench_cmd = closing[4:]
    assert export_cmd == "  python -m dflash_jax export --run run --out run-step3"
    assert bench_cmd == f"  python -m dflash_jax bench --target {shlex.quote(target_dir)} --drafter run-step3"
    before = _tree_snapshot(tmp_path / "run")
    assert {"run.json", "metrics.jsonl"} <= set(before) and any(k.startswith("checkpoints/3/") for k in before)

    train("run", 3)  # the same command again: complete, nothing trained or written
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("run run is complete at step 3 of 3 (checkpoint run/checkpoints/3)"), lines[0]
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "3")
    assert f"bench --target {data_dir / 'target'} --drafter run-step3" in lines[0]
    assert _tree_snapshot(tmp_path / "run") == before  # same files, same bytes, same mtimes

    # more steps on the finished run: refused, with the commands that train on from its weights
    with pytest.raises(SystemExit) as e:
        train("run", 5)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "other settings: differs in train.steps 3 (now 5)" in err, err
    commands = re.findall(r"`python -m dflash_jax ([^`]*)`", err)
    assert commands == ["export --run run --out run-step3", "train --init-from run-step3 --run NEW_RUN_DIR ..."], err
    assert _tree_snapshot(tmp_path / "run") == before
    # ... and they work: the export (the one train printed), then a new run from it (--init-from's
    # config replaces the shape options)
    assert export_cmd.strip() == f"python -m dflash_jax {commands[0]}"
    main(shlex.split(export_cmd)[3:])
    exported = capsys.readouterr().out.splitlines()
    assert exported[0] == ("wrote run-step3: the DFlash drafter of run run at step 3 (architecture "
                           "DFlashDraftModel: 1 layer, block size 4, weights in float32)"), exported
    assert exported[1].startswith("files: config.json (") and "model.safetensors (" in exported[1], exported
    assert exported[2:] == ["next: benchmark it against the target alone:", bench_cmd], exported
    bench = parse("dflash_jax", shlex.split(bench_cmd)[3:])  # the options bench has, as printed
    assert (bench.target, bench.drafter) == (target_dir, "run-step3")
    dj.load_drafter(bench.drafter, dj.load_target(bench.target))  # what bench --drafter loads
    cont = shlex.split(commands[1].replace("NEW_RUN_DIR ...", "cont"))
    main(cont + ["--target", str(data_dir / "target"), "--data", regenerated, "--mask-token-id", "31",
                 "--steps", "5", "--batch-size", "4", "--num-anchors", "8", "--stop-after", "0"])
    closing = capsys.readouterr().out.splitlines()[-3:]
    assert closing[0].startswith("run directory: cont (")  # stopped before any checkpoint: nothing to export
    assert closing[1].startswith("last checkpoint: none yet") and "export" not in "\n".join(closing), closing
    record = json.loads((tmp_path / "cont" / "run.json").read_text())
    assert record["init_from"] == str(tmp_path / "run-step3") and record["train"]["steps"] == 5
    _, params, _ = latest_params("run")
    start = DFlashTrainer(target, dj.DrafterConfig.from_pretrained("run-step3"), TokenDataset(regenerated), "cont",
                    TrainConfig(steps=5, batch_size=4, num_anchors=8), init_from="run-step3").init_state()
    for x, y in zip(jax.tree.leaves(start["params"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # it starts from the run's weights

    # negative controls: another drafter shape cannot start from these weights; a run with no
    # checkpoint yet has nothing to start from: both are told to use a new run directory
    with pytest.raises(SystemExit):
        train("run", 3, "--drafter-layers", "2")
    err = capsys.readouterr().err
    assert "other settings: differs in drafter.num_hidden_layers 1 (now 2)" in err and "another shape" in err, err
    assert "--init-from" not in err and "use a new run directory" in err
    dcfg = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
    DFlashTrainer(target, dcfg, TokenDataset(regenerated), "fresh", TrainConfig(steps=3, batch_size=4))
    with pytest.raises(ValueError, match="other settings: differs in train.steps 3 \\(now 4\\); resume with the same "
                                         "settings or use a new run directory$"):
        DFlashTrainer(target, dcfg, TokenDataset(regenerated), "fresh", TrainConfig(steps=4, batch_size=4))
