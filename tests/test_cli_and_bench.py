"""The command line and the decode benchmark run end to end on tiny inputs."""

import json
import subprocess
import sys

from conftest import make_hf_model

from dflash_jax.bench import decode_speed


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
    for r in report["results"]:
        assert r["decode_steps"] == 4 and r["ms_per_step"] > 0 and r["bandwidth_fraction"] > 0
    saved = json.loads((tmp_path / "out" / "tiny_cpu_float32.json").read_text())
    assert saved["env"]["jax"] and saved["copy_bandwidth_GBps"] > 0
    assert (tmp_path / "out" / "tiny_cpu_float32.png").stat().st_size > 1000


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
    assert r["draft_ms"] > 0 and r["verify_ms"] > 0 and r["dflash_ms_per_iteration"] > 0
    assert len(r["histogram"]) == 4 and 1.0 <= r["tau"] <= 4.0
    assert (tmp_path / "out" / "t_cpu_float32_xla_b1_bs4.png").exists()


def test_train_speed_runs(tmp_path):
    from dflash_jax.bench import train_speed

    report = train_speed.main(["--preset", "tiny", "--drafter-layers", "1", "--block-size", "4",
                               "--seq-len", "32", "--batch", "2", "--num-anchors", "4", "--steps", "2",
                               "--out", str(tmp_path)])
    assert len(report["step_times_s"]) == 3 and report["tokens_per_s"] > 0
    assert (tmp_path / "tiny_cpu_float32_b2_L32.png").exists()


def test_kernel_speed_smoke(tmp_path):
    from dflash_jax.bench import kernel_speed

    report = kernel_speed.main(["--seq", "128", "--batch", "1", "--block", "4", "--heads", "4",
                                "--kv-heads", "2", "--head-dim", "32", "--dtype", "float32",
                                "--interpret", "--repeats", "1", "--out", str(tmp_path)])
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["max_abs_err"] < 1e-4 and r["pallas_us"] > 0 and r["xla_us"] > 0


def test_bench_prompts_thinking_switch_and_reference_subset(tmp_path, monkeypatch):
    """bench renders every prompt (both turns of mt-bench too) with a Qwen3-style template's
    thinking switch off, ending in its non-thinking assistant prefix; --thinking renders them
    without it; --subset reference runs the reference's prompts; bench.json records both."""
    import random
    import types

    from conftest import QWEN3_ASSISTANT, QWEN3_LIKE_TEMPLATE, QWEN3_NO_THINK, save_chat_target
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
              "--max-new-tokens", "3"]
    report = harness.main([*common, "--datasets", "gsm8k", "mt-bench", "--subset", "reference",
                           "--out", str(tmp_path / "off")])
    assert len(seen) == 2 * (1 + 2) + 2 * (1 + 4)  # AR + DFlash: warm-up and 2 gsm8k / 2x2 mt-bench turns
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
