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
