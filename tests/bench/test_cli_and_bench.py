"""The command line and the decode benchmark run end to end on tiny inputs."""

import json
import subprocess
import sys

import numpy as np
import pytest

from support.tiny_models import make_hf_model

from dflash_jax.bench import decode_speed

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_decode_speed_writes_json_and_plot(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128}
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(cfg))
    report = decode_speed.main(["--config", str(tmp_path / "tiny" / "config.json"), "--batch", "1", "2",
                                "--prompt-len", "8", "--new-tokens", "5", "--repeats", "1",
                                "--out", str(tmp_path / "out")])
    assert [r["batch"] for r in report["results"]] == [1, 2]
    saved = json.loads((tmp_path / "out" / "tiny_cpu_float32.json").read_text())
    assert saved["env"]["jax"] and saved["results"] == report["results"]
    for r in report["results"]:  # 5 new tokens: 1 from prefill, 4 loop steps
        assert r["decode_steps"] == 4
        step_s = r["ms_per_step"] / 1e3
        moved = r["bytes_per_step"]["weights"] + r["bytes_per_step"]["kv"]
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / step_s)
        assert r["achieved_GBps"] == pytest.approx(moved / step_s / 1e9)
        assert r["bandwidth_fraction"] == pytest.approx(r["achieved_GBps"] / saved["copy_bandwidth_GBps"])
    assert (tmp_path / "out" / "tiny_cpu_float32.png").stat().st_size > 1000


@pytest.mark.slow
def test_generate_command_with_token_ids(tmp_path):
    """The command's ids are the library's (a target without a tokenizer takes --token-ids)."""
    import dflash_jax as dj

    model = make_hf_model("qwen3")
    model.save_pretrained(tmp_path)
    out = subprocess.run([sys.executable, "-m", "dflash_jax", "generate", "--target", str(tmp_path),
                          "--prompt", "1,2,3", "--prompt", "7 8", "--token-ids", "--max-new-tokens", "6"],
                         capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    target = dj.load_target(tmp_path)
    ref = dj.generate(target, [[1, 2, 3], [7, 8]], 6, stop_token_ids=target.stop_token_ids)
    assert lines == [",".join(map(str, s)) for s in ref.sequences]
    out = subprocess.run([sys.executable, "-m", "dflash_jax", "generate", "--target", str(tmp_path),
                          "--prompt", "1,2,3"], capture_output=True, text=True)
    assert out.returncode == 2 and "has no tokenizer: pass --token-ids" in out.stderr


def test_unknown_command_fails():
    out = subprocess.run([sys.executable, "-m", "dflash_jax", "frobnicate"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown command" in out.stderr


@pytest.mark.slow
def test_spec_speed_with_saved_target_and_drafter(tmp_path):
    """The DFlash benchmark on a saved target + drafter pair: files written, stats consistent."""
    import dflash_jax as dj
    from dflash_jax.bench import spec_speed

    model = make_hf_model("qwen3", num_hidden_layers=4)
    model.save_pretrained(tmp_path / "t")
    target = dj.load_target(tmp_path / "t")
    dj.save_drafter(dj.Drafter.random(target, num_layers=1, block_size=4), tmp_path / "d")
    report = spec_speed.main(["--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"),
                              "--block-size", "4", "--prompt-len", "8", "--new-tokens", "9",
                              "--repeats", "1", "--out", str(tmp_path / "out")])
    r = report["result"]
    # the library on the same prompts (seed 0, batch 1, length 8) gives the same acceptance
    prompts = np.random.default_rng(0).integers(0, target.config.vocab_size, size=(1, 8)).tolist()
    ref = dj.generate(target, prompts, 9, drafter=dj.load_drafter(tmp_path / "d", target), block_size=4)
    assert r["tau"] == pytest.approx(ref.tau) and r["histogram"] == ref.acceptance_histogram.tolist()
    assert r["dflash_equals_ar"] and r["min_matching_prefix"] == 9
    # the derived numbers follow from the measured ones
    assert r["iteration_over_ar_step"] == pytest.approx(r["dflash_ms_per_iteration"] / r["ar_ms_per_step"])
    assert r["speedup"] == pytest.approx(r["ar_ms_per_token"] / r["dflash_ms_per_token"])
    assert r["projected_speedup_at_paper_tau"] == pytest.approx(spec_speed.PAPER_TAU / r["iteration_over_ar_step"])
    assert (tmp_path / "out" / "t_cpu_float32_xla_b1_bs4.png").exists()


@pytest.mark.slow
def test_iteration_profile_with_saved_target_and_drafter(tmp_path):
    """``iteration-profile`` on a saved pair: every part and loop timed, the derived ratios
    follow from them, the report and table written."""
    import dflash_jax as dj
    from dflash_jax.bench import iteration_profile

    make_hf_model("qwen3", num_hidden_layers=2).save_pretrained(tmp_path / "t")
    target = dj.load_target(tmp_path / "t")
    dj.save_drafter(dj.Drafter.random(target, num_layers=1, block_size=8), tmp_path / "d")
    report = iteration_profile.main(["--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"),
                                     "--context", "8", "--calls", "2", "--iterations", "2", "--repeats", "1",
                                     "--out", str(tmp_path / "out")])
    r = report["result"]
    assert list(r["parts_ms"]) == ["draft, context", "draft, layers", "draft, LM head + argmax",
                                   "verify 1", "verify 4", "verify 8", "accept + commit"]
    assert list(r["loops_ms"]) == ["AR step", "DFlash iteration, block 8", "DFlash iteration, verify 4"]
    assert all(v > 0 for v in [*r["parts_ms"].values(), *r["loops_ms"].values()])
    assert r["iteration_over_ar_step"] == pytest.approx(r["loops_ms"]["DFlash iteration, block 8"]
                                                        / r["loops_ms"]["AR step"])
    assert (tmp_path / "out" / "iteration_profile_cpu_float32.md").read_text().count("| verify") == 3


@pytest.mark.slow
def test_iteration_profile_per_depth(tmp_path):
    """``--depths``: one profile per drafter depth, each a drafter of that many layers (its
    parameters grow by one layer's worth per layer) with the drafter's block size; the table has
    a row per depth; a depth below 1 is refused."""
    import jax

    import dflash_jax as dj
    from dflash_jax.bench import iteration_profile

    make_hf_model("qwen3", num_hidden_layers=2).save_pretrained(tmp_path / "t")
    target = dj.load_target(tmp_path / "t")
    one = dj.Drafter.random(target, num_layers=1, block_size=4)
    dj.save_drafter(one, tmp_path / "d")
    args = ["--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"), "--context", "8", "--calls", "1",
            "--iterations", "1", "--repeats", "1", "--out", str(tmp_path / "out")]
    report = iteration_profile.main(args + ["--depths", "1", "2"])
    d = report["depths"]
    assert list(d) == ["1", "2"] and all(r["block_size"] == 4 for r in d.values())
    p = [d[k]["drafter_params"] for k in d]
    layer = sum(x.size for x in jax.tree_util.tree_leaves(one.params["layers"]))  # one layer's, counted here
    assert p[1] - p[0] == layer > 0
    md = (tmp_path / "out" / "iteration_profile_cpu_float32.md").read_text()
    assert "| drafter layers |" in md and all(f"\n| {k} | " in md for k in d)
    with pytest.raises(ValueError, match="--depths must be >= 1"):
        iteration_profile.main(args + ["--depths", "0"])


@pytest.mark.slow
def test_train_speed_runs(tmp_path):
    from dflash_jax.bench import train_speed

    report = train_speed.main(["--preset", "tiny", "--drafter-layers", "1", "--block-size", "4",
                               "--seq-len", "32", "--batch", "2", "--num-anchors", "4", "--steps", "2",
                               "--out", str(tmp_path)])
    assert len(report["step_times_s"]) == 3
    assert report["tokens_per_s"] == pytest.approx(2 * 32 / np.median(report["step_times_s"][1:]))
    assert (tmp_path / "tiny_cpu_float32_b2_L32.png").exists()


@pytest.mark.slow
def test_kernel_speed_smoke(tmp_path):
    from dflash_jax.tools import kernel_speed

    report = kernel_speed.main(["--seq", "128", "--batch", "1", "--block", "4", "--heads", "4",
                                "--kv-heads", "2", "--head-dim", "32", "--dtype", "float32",
                                "--interpret", "--repeats", "1", "--out", str(tmp_path)])
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["max_abs_err"] < 1e-4 and r["pallas_us"] > 0 and r["xla_us"] > 0


def test_one_program_shape_serves_every_set_and_fits_the_target():
    """Runner.program_shape: the longest prompt over every set and turn (a later turn carries the
    earlier answers, max_new_tokens + 8 each) rounded up to 16, its cache with the new tokens and
    the verified block rounded up to 64, never past the target's max_len + block."""
    import types

    from dflash_jax.bench import harness
    from dflash_jax.bench.prompt_sets import Sample

    encode = lambda turns: [0] * sum(len(t["content"]) for t in turns)  # a token per character
    args = types.SimpleNamespace(max_new_tokens=20, block_size=4, tree=None, thinking=False)
    runner = harness.Runner(types.SimpleNamespace(tokenizer=None, stop_token_ids=[0], max_len=1000), None, args)
    runner.encode = encode
    one = [Sample("a/0", ["x" * 30]), Sample("a/1", ["x" * 50])]
    two = [Sample("b/0", ["y" * 10, "z" * 12])]  # 10 + 1 ("x" answer) + 12 = 23, + 28 for turn 1's answer
    assert runner.program_shape([one]) == (64, 128)  # 50 -> 64; 50 + 20 + 4 = 74 -> 128
    assert runner.program_shape([one, two]) == (64, 128)
    assert runner.program_shape([two]) == (64, 128)  # 23 + 28 = 51 -> 64; 51 + 24 = 75 -> 128
    args.max_new_tokens = 2000  # past the target's cache: capped there
    assert runner.program_shape([one]) == (64, 1004)
    args.max_new_tokens, args.tree = 20, 32  # a tree's nodes, not the block, are the rows past the tokens
    assert runner.program_shape([one]) == (64, 128)
    runner.target.max_len = 80
    assert runner.program_shape([one]) == (64, 112)  # 80 + 32 rows; the width fits beside the rows


@pytest.mark.slow
def test_bench_prompts_thinking_switch_and_reference_subset(tmp_path, monkeypatch):
    """bench renders every prompt (both turns of mt-bench too) with a Qwen3-style template's
    thinking switch off, ending in its non-thinking assistant prefix; --thinking renders them
    without it; --subset reference runs the reference's prompts; bench.json records both."""
    import random
    import types

    from support.bench_checks import check_report
    from support.tiny_models import QWEN3_ASSISTANT, QWEN3_LIKE_TEMPLATE, QWEN3_NO_THINK, save_chat_target
    from transformers import AutoTokenizer

    from dflash_jax.bench import harness
    from dflash_jax.bench.prompt_sets import load_prompt_set

    target_dir, drafter_dir = save_chat_target(str(tmp_path), QWEN3_LIKE_TEMPLATE)
    tok = AutoTokenizer.from_pretrained(target_dir)
    seen = []
    real = harness.Runner.run
    monkeypatch.setattr(harness.Runner, "run", lambda self, ids, drafter, pad_to: (
        seen.append(list(ids)), real(self, ids, drafter, pad_to))[1])
    common = ["--target", target_dir, "--drafter", drafter_dir, "--max-samples", "2",
              "--max-new-tokens", "3", "--no-adaptive"]
    report = harness.main([*common, "--datasets", "gsm8k", "mt-bench", "--subset", "reference",
                           "--out", str(tmp_path / "off")])
    # AR + DFlash: a warm-up per set (each at its own program shape), 2 gsm8k and 2x2 mt-bench turns
    assert len(seen) == 2 * (1 + 2) + 2 * (1 + 4)
    # docs/method.md section 6's metrics, recomputed with numpy from the saved per-response records
    check_report(json.loads((tmp_path / "off" / "bench.json").read_text()))
    texts = [tok.decode(ids) for ids in seen]
    assert all(t.endswith(QWEN3_NO_THINK) for t in texts), texts
    assert any(t.count("<|im_start|>user") == 2 for t in texts)  # mt-bench turn 2 went through it
    saved = json.loads((tmp_path / "off" / "bench.json").read_text())
    st = saved["settings"]
    assert st["subset"] == "reference" and st["enable_thinking"] is False
    assert st["chat_template_has_thinking_switch"] is True
    assert "--subset reference, thinking off" in (tmp_path / "off" / "bench.md").read_text()
    ids = [s.id for s in load_prompt_set("gsm8k")]
    random.seed(0)
    random.shuffle(ids)
    ran = [r["id"] for r in report["datasets"]["gsm8k"]["samples"]]
    assert ran == ids[:2] and ran != ["gsm8k/0", "gsm8k/1"]

    shapes = {n: (r["program_shape"]["prompt_width"], r["program_shape"]["cache_length"])
              for n, r in report["datasets"].items()}
    assert shapes["mt-bench"][1] > shapes["gsm8k"][1]  # turn 2 carries turn 1's answer
    # --program-shape one: one warm-up, every set at the longest set's shape
    seen.clear()
    one = harness.main([*common, "--datasets", "gsm8k", "mt-bench", "--subset", "reference", "--program-shape", "one",
                        "--out", str(tmp_path / "one")])
    assert len(seen) == 2 * (1 + 2 + 4)
    assert {(r["program_shape"]["prompt_width"], r["program_shape"]["cache_length"])
            for r in one["datasets"].values()} == {shapes["mt-bench"]}
    assert all(a["dflash"]["acceptance_lengths"] == b["dflash"]["acceptance_lengths"] and b["same_output"]
               for n in shapes for a, b in zip(report["datasets"][n]["samples"], one["datasets"][n]["samples"]))

    seen.clear()
    harness.main([*common, "--datasets", "gsm8k", "--max-samples", "1", "--thinking",
                  "--out", str(tmp_path / "on")])
    texts = [tok.decode(ids) for ids in seen]
    assert texts and all(t.endswith(QWEN3_ASSISTANT) and not t.endswith(QWEN3_NO_THINK) for t in texts)
    st = json.loads((tmp_path / "on" / "bench.json").read_text())["settings"]
    assert st["enable_thinking"] is True and st["subset"] == "random"
    # the Runner alone (what bench encodes with), both settings
    for flag, end in (([], QWEN3_NO_THINK), (["--thinking"], QWEN3_ASSISTANT)):
        args = harness.parser().parse_args(flag)
        runner = harness.Runner(types.SimpleNamespace(tokenizer=tok, stop_token_ids=[0]), None, args)
        text = tok.decode(runner.encode(harness.chat(["q", "r"], ["a"])))
        assert text.endswith(end) and text.endswith(QWEN3_NO_THINK) == (end == QWEN3_NO_THINK)


@pytest.mark.slow
def test_spec_speed_raises_when_dflash_differs_from_ar(monkeypatch):
    """The exactness check is an exception (python -O keeps it), with what differed."""
    import dflash_jax as dj
    from dflash_jax.bench import spec_speed

    cfg = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    target = dj.Target.random(cfg, seed=0)
    drafter = dj.Drafter.random(target, num_layers=1, block_size=4)
    real = spec_speed.generate

    def off_by_one(target, prompts, n, **kw):  # a DFlash that changes the last token
        r = real(target, prompts, n, **kw)
        if kw.get("drafter") is not None:
            r.sequences[0][-1] = (r.sequences[0][-1] + 1) % cfg.vocab_size
        return r

    monkeypatch.setattr(spec_speed, "generate", off_by_one)
    with pytest.raises(RuntimeError, match="differs from autoregressive.*'min_matching_prefix': 4"):
        spec_speed.measure(target, drafter, batch=1, prompt_len=4, new_tokens=5, block_size=4, repeats=1)
