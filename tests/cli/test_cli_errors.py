"""The command line as a user meets it: one line ``error: ...`` and exit status 2 for a user's
mistake (the traceback only with --debug), real program names and defaults in every --help,
--version, and the generate command's output equal to the library's."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax.__main__ import COMMANDS, main, usage
from support.tiers import tiered

# one pytest-xdist worker runs the whole module: its module fixture writes the bad inputs once
pytestmark = pytest.mark.xdist_group("test_cli_errors")

EMBEDDED = dj.EMBEDDED_TARGET_DIR


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """Directories and files holding the bad inputs of the parametrised test."""
    root = tmp_path_factory.mktemp("bad")
    target = dj.load_target(EMBEDDED)
    # a drafter shaped for another target (hidden size 64 instead of 512)
    other = dj.Target.random(dj.TargetConfig(model_type="qwen3", vocab_size=target.config.vocab_size,
                                              hidden_size=64, intermediate_size=96, num_layers=4,
                                              num_heads=4, num_kv_heads=2, head_dim=16,
                                              max_position_embeddings=256, eos_token_id=(0,)))
    dj.save_drafter(dj.Drafter.random(other, num_layers=1, block_size=4), root / "mismatched")
    # a truncated drafter checkpoint
    shutil.copytree(dj.EMBEDDED_DRAFTER_DIR, root / "truncated")
    data = (root / "truncated" / "model.safetensors").read_bytes()
    (root / "truncated" / "model.safetensors").write_bytes(data[:len(data) // 3])
    # a corrupt one: the header overwritten
    shutil.copytree(dj.EMBEDDED_DRAFTER_DIR, root / "corrupt")
    with open(root / "corrupt" / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 64)
    # a malformed dataset line
    (root / "data" / "gsm8k").mkdir(parents=True)
    (root / "data" / "gsm8k" / "test.jsonl").write_text('{"question": "ok"}\n{"question": \n')
    del target
    return root


BAD = {
    "mismatched drafter": (["generate", "--prompt", "hi", "--drafter", "{root}/mismatched"], "hidden_size"),
    "truncated safetensors": (["generate", "--prompt", "hi", "--drafter", "{root}/truncated"],
                              "truncated/model.safetensors is damaged"),
    "corrupt safetensors": (["generate", "--prompt", "hi", "--drafter", "{root}/corrupt"],
                            "corrupt/model.safetensors is damaged"),
    "negative temperature": (["generate", "--prompt", "hi", "--temperature", "-1"], "--temperature must be >= 0"),
    "top-p above 1": (["generate", "--prompt", "hi", "--temperature", "1", "--top-p", "2"], r"--top-p must be in \(0, 1\]"),
    "top-k zero": (["generate", "--prompt", "hi", "--temperature", "1", "--top-k", "0"], "--top-k must be >= 1"),
    "over-long max-new-tokens": (["generate", "--prompt", "hi", "--max-new-tokens", "5000"],
                                 "5001 > the cache length max_len=2048.*--max-len"),
    "max-len above the model": (["generate", "--prompt", "hi", "--max-len", "4096"],
                                "above the model's max_position_embeddings=2048.*allow_extrapolation"),
    "token ids that are not": (["generate", "--prompt", "1,x", "--token-ids"], "not a list of integers"),
    "block size without drafter": (["generate", "--prompt", "hi", "--block-size", "4"], "--block-size needs --drafter"),
    "missing target": (["generate", "--prompt", "hi", "--target", "{root}/none"], "does not exist"),
    "malformed dataset line": (["bench", "--datasets", "gsm8k", "--data-dir", "{root}/data"],
                               r"gsm8k/test.jsonl:2: not valid JSON"),
    "dataset missing from data dir": (["bench", "--datasets", "mbpp", "--data-dir", "{root}/data"],
                                      "prompt set 'mbpp' not found in the data directory"),
    "bench without a drafter": (["bench", "--target", "{root}/mismatched"], "--drafter is required"),
    "bench zero samples": (["bench", "--max-samples", "0"], r"^error: --max-samples must be >= 1, got 0"),
    "bench negative new tokens": (["bench", "--max-new-tokens", "-5"], r"--max-new-tokens must be >= 1, got -5"),
    "generate zero new tokens": (["generate", "--prompt", "hi", "--max-new-tokens", "0"],
                                 r"--max-new-tokens must be >= 1, got 0"),
    "export of a missing run": (["export", "--run", "{root}/none", "--out", "{root}/x"], "{root}/none"),
    "thinking without chat": (["generate", "--prompt", "hi", "--thinking"], "--thinking needs --chat"),
    "train with gamma 0": (["train", "--target", "{root}/none", "--data", "{root}/none", "--run", "{root}/run",
                            "--gamma", "0"], r"gamma must be a number > 0, got 0.0.*--uniform-weights"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_user_errors_are_one_line_and_status_2(case, bad_inputs, capsys):
    argv, pattern = BAD[case]
    argv = [a.format(root=bad_inputs) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert e.value.code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(pattern.format(root=bad_inputs), lines[0]), lines[0]


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "hi", "--max-new-tokens", "0"],
    ["generate", "--prompt", "hi", "--max-len", "0"],
    ["generate", "--prompt", "hi", "--temperature", "1", "--top-p", "2"],
    ["bench", "--max-new-tokens", "-5"],
], ids=["new-tokens", "max-len", "top-p", "bench"])
def test_bad_options_are_refused_before_anything_is_loaded(argv, monkeypatch, capsys):
    """The option checks run first: no model is looked up or loaded, and the bench prints no
    machine line before its one error line (issue 53)."""
    from dflash_jax.bench import harness
    from dflash_jax.decoding import cli as generate_cli

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(generate_cli, "load_target", loaded)
    monkeypatch.setattr(harness, "resolve_checkpoint", loaded)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --"), err


@pytest.mark.parametrize("extra, named", [
    ([], "no-data"), (["--init-from", "no-drafter"], "no-drafter"), (["--features", "no-features"], "no-features"),
], ids=["data", "init-from", "features"])
def test_train_finds_its_files_before_it_loads_the_target(extra, named, tmp_path, monkeypatch, capsys):
    """A missing --data, --init-from or --features directory is one error line naming it, before
    the target (minutes for a large one) is loaded."""
    from dflash_jax.methods.dflash import training

    def loaded(*args, **kwargs):
        raise AssertionError("the target was loaded before the files were found")

    monkeypatch.setattr(training, "load_target", loaded)
    monkeypatch.chdir(tmp_path)
    if named != "no-data":  # a data directory (one shard), so that the later path is the one missing
        from dflash_jax.training.data import shard_path, write_npz_atomic

        os.makedirs("data")
        write_npz_atomic(shard_path("data", 0), tokens=np.ones((4, 8), np.int32),
                         loss_mask=np.ones((4, 8), bool), lengths=np.full(4, 8))
    with pytest.raises(SystemExit) as e:
        main(["train", "--target", "embedded", "--data", "no-data" if named == "no-data" else "data",
              "--run", "run", *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and named in err, err


def test_debug_shows_the_exception_instead(bad_inputs):
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        main(["generate", "--prompt", "hi", "--temperature", "-1", "--debug"])
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        main(["--debug", "generate", "--prompt", "hi", "--temperature", "-1"])


@pytest.mark.slow
def test_a_real_process_prints_one_line_and_exits_2(bad_inputs):
    out = subprocess.run([sys.executable, "-m", "dflash_jax", "generate", "--prompt", "x", "--drafter",
                          str(bad_inputs / "truncated")], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error: "), out.stderr
    assert "PyTorch was not found" not in out.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_its_real_name_and_shows_defaults(name, capsys, monkeypatch):
    import argparse

    parsers = []
    real = argparse.ArgumentParser.parse_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        lambda self, *a, **k: (parsers.append(self), real(self, *a, **k))[1])
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert out.startswith(f"usage: python -m dflash_jax {name}"), out[:200]
    assert "__main__.py" not in out and "``" not in out
    (parser,) = parsers

    for action in parser._actions:  # every option with a default (other than None / a flag's False)
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in parser._get_formatter()._format_action(action), action.option_strings



def test_top_level_help_and_version(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert out == usage() + "\n" and "``" not in out and all(n in out for n in COMMANDS)
    main(["--version"])
    assert capsys.readouterr().out.strip() == f"dflash-jax {dj.__version__}"
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2 and "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("module", tiered(["dflash_jax.bench.harness", "dflash_jax.tools.kernel_speed",
                                           "dflash_jax.bench.decode_speed"], fast=["dflash_jax.bench.harness"]))
def test_modules_run_with_dash_m_show_their_help(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m "), out.stdout[:200] + out.stderr


@pytest.mark.slow
def test_generate_command_equals_the_library(capsys):
    """Text prompts (digits included: text unless --token-ids), --chat, --token-ids and a
    drafter: the printed ids are dj.generate's on the same inputs."""
    from dflash_jax.prompts import encode_prompt

    target, drafter = dj.load_embedded()
    tok = target.tokenizer
    main(["generate", "--prompt", "12345", "--max-new-tokens", "6"])
    out = capsys.readouterr()
    ref = dj.generate(target, [tok.encode("12345")], 6, stop_token_ids=target.stop_token_ids)
    assert out.out == tok.decode(ref.sequences[0]) + "\n"

    ids = encode_prompt("Add 2 and 3.", tok)
    main(["generate", "--prompt", ",".join(map(str, ids)), "--token-ids", "--max-new-tokens", "12",
          "--drafter", dj.EMBEDDED_DRAFTER_DIR, "--block-size", "8"])
    out = capsys.readouterr()
    ref = dj.generate(target, [ids], 12, drafter=drafter, block_size=8, stop_token_ids=target.stop_token_ids)
    assert out.out.strip() == ",".join(map(str, ref.sequences[0]))
    assert f"tau {ref.tau:.2f}" in out.err and "compiling" in out.err and "including compilation" in out.err

    main(["generate", "--prompt", "Add 2 and 3.", "--chat", "--max-new-tokens", "12"])
    assert capsys.readouterr().out == tok.decode(ref.sequences[0]) + "\n"  # greedy AR == DFlash


