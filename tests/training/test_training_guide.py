"""docs/train-your-drafter.md: every `python -m dflash_jax` command in its shell blocks parses
with the command line as it is (no unknown, misspelt or deprecated option), the prompt script
writes files that train-data reads, and the shell lines that split prompts and gather shards
give one data directory the trainer reads."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from dflash_jax.__main__ import COMMANDS, parser
from support.doc_commands import commands_in
from dflash_jax.training.data import TokenDataset, pack_rows, read_prompt_file, write_npz_atomic

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "train-your-drafter.md")


def _blocks(language: str) -> list[str]:
    with open(GUIDE) as f:
        text = f.read()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def guide_commands() -> list[list[str]]:
    """The arguments after `python -m dflash_jax` of every command in the guide's bash blocks,
    and of every one quoted in its text (those with "..." are the messages' templates, left
    open for the user's options): tests/support/doc_commands.py."""
    with open(GUIDE) as f:
        text = f.read()
    return [argv for program, argv in commands_in(text) if program == "dflash_jax"]


def test_the_guide_has_the_pipeline():
    names = [c[0] for c in guide_commands()]
    for step in ("embedded-prompts", "train-data", "features", "train", "export", "bench", "train-memory",
                 "train-speed"):
        assert step in names, step
    assert len(names) >= 15


@pytest.mark.parametrize("argv", guide_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_command_parses(argv, capsys):
    name, rest = argv[0], argv[1:]
    assert name in COMMANDS, f"unknown command {name!r}"
    try:
        parser(name).parse_args([name, *rest])
    except SystemExit as e:  # argparse's error: the message is on stderr
        pytest.fail(f"`{' '.join(argv)}` does not parse: {capsys.readouterr().err}")
        raise AssertionError from e
    err = capsys.readouterr().err
    assert "deprecated" not in err.lower(), err


def test_a_misspelt_option_would_be_caught(capsys):
    """Negative control: the parse above does reject an option the command does not have."""
    with pytest.raises(SystemExit):
        parser("train").parse_args(["train", "--target", "t", "--data", "d", "--run", "r", "--learning-rates", "1"])
    assert "error" in capsys.readouterr().err


class _Rows(list):
    """What the script uses of a `datasets` streaming dataset: shuffle(...) and take(n)."""

    def shuffle(self, seed, buffer_size):
        return _Rows(self[::-1])

    def take(self, n):
        return _Rows(self[:n])


def test_the_prompt_script_writes_what_train_data_reads(tmp_path, monkeypatch):
    """The guide's make_prompts.py, run on a few rows shaped as the two datasets' cards say (the
    hub is not reachable here: a stand-in `datasets` module serves them), writes prompt files
    that read_prompt_file accepts: conversations without the dataset's answer, and CodeAlpaca's
    instruction with its input."""
    (script,) = [b for b in _blocks("python") if "make_prompts.py" in b]
    nemotron = [{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": f"q{i}"},
                              {"role": "assistant", "content": f"a{i}"}], "uuid": str(i)} for i in range(5)]
    alpaca = _Rows([{"instruction": "Reverse a list.", "input": "", "output": "x[::-1]"},
                    {"instruction": "Sum these.", "input": "[1, 2]", "output": "3"}])
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, split, streaming=False: (
        _Rows(nemotron) if name == "nvidia/Nemotron-Post-Training-Dataset-v2" else alpaca)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "make_prompts.py", "exec"), {"__name__": "__main__"})
    chats = read_prompt_file("nemotron.jsonl")
    assert len(chats) == 4 * 5  # every split asks for more rows than the stand-in has
    assert chats[0] == [{"role": "system", "content": ""}, {"role": "user", "content": "q4"}]
    assert all(t["role"] != "assistant" for c in chats for t in c)
    assert read_prompt_file("codealpaca.jsonl") == ["Reverse a list.", "Sum these.\n\n[1, 2]"]


def test_splitting_prompts_and_gathering_shards(tmp_path):
    """The guide's `split` line cuts the prompt file into 8 whole-line parts named part-00 ..
    part-07, and its gather lines put every part's shards into one directory that
    TokenDataset reads whole, in order."""
    (block,) = [b for b in _blocks("bash") if "split -n l/8" in b]
    lines = block.splitlines()
    split_line = next(x for x in lines if x.startswith("split "))
    gather = "\n".join(lines[lines.index(next(x for x in lines if x.startswith("mkdir -p data/"))):])
    rows = [json.dumps({"prompt": f"p{i}"}) for i in range(21)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    subprocess.run(["bash", "-c", split_line], cwd=tmp_path, check=True)
    parts = sorted(p for p in os.listdir(tmp_path) if p.startswith("part-"))
    assert parts == [f"part-0{i}" for i in range(8)]
    assert "".join((tmp_path / p).read_text() for p in parts) == (tmp_path / "prompts.jsonl").read_text()
    # stand-ins for the eight train-data outputs: two parts with two shards each, one with one
    rng = np.random.default_rng(0)
    expected = []
    for part, shards in ((0, 2), (1, 1), (7, 2)):
        os.makedirs(tmp_path / "data" / f"part-{part}")
        for s in range(shards):
            prompts = [rng.integers(1, 50, 3).tolist() for _ in range(2)]
            responses = [rng.integers(1, 50, 4).tolist() for _ in range(2)]
            tokens, mask, lengths = pack_rows(prompts, responses, 12)
            write_npz_atomic(str(tmp_path / "data" / f"part-{part}" / f"shard-{s:05d}.npz"),
                             tokens=tokens, loss_mask=mask, lengths=lengths, stopped=np.array(0))
            expected.append(tokens)
    subprocess.run(["bash", "-c", gather], cwd=tmp_path, check=True)
    (out_dir,) = re.findall(r"mkdir -p (\S+)", gather)
    assert sorted(os.listdir(tmp_path / out_dir)) == [f"shard-{i:05d}.npz" for i in range(5)]
    ds = TokenDataset(str(tmp_path / out_dir))
    np.testing.assert_array_equal(ds.tokens, np.concatenate(expected))
