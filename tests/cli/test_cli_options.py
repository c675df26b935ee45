"""The command line as a whole: the commands grouped under headings in the top-level help,
the ``dflash-jax`` console script beside ``python -m dflash_jax``, help text on every option,
one meaning per option name across the commands, and the old spellings of renamed options
kept as deprecated aliases."""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points

import numpy as np
import pytest

import dflash_jax as dj
from dflash_jax import experiments
from dflash_jax.__main__ import COMMANDS, EXPERIMENTS, GROUPS, SCRIPT, main, parser, usage
from dflash_jax.cli import PROG, DeprecatedAlias, add_deprecated_alias


def command_parser_of(name: str) -> argparse.ArgumentParser:
    """The subparser of ``name`` on the parser of ``python -m dflash_jax``."""
    (sub,) = [a for a in parser(name)._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def options_of(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of a command's parser that a user sees (not -h, not a hidden old spelling)."""
    return [a for a in p._actions if a.option_strings and not isinstance(a, (argparse._HelpAction, DeprecatedAlias))]


# ------------------------------------------------------------------ the grouped top-level help
def test_every_command_is_under_exactly_one_heading():
    listed = [name for names in GROUPS.values() for name in names]
    assert sorted(listed) == sorted(COMMANDS), (set(listed) ^ set(COMMANDS))
    assert len(listed) == len(set(listed)), [n for n, c in collections.Counter(listed).items() if c > 1]
    assert GROUPS[EXPERIMENTS] == []  # the experiments are modules, not commands


def test_the_top_level_help_lists_the_commands_under_their_headings():
    text = usage()
    assert text.startswith(f"usage: {PROG} ")
    # each heading once, in GROUPS' order; each command's line between its heading and the next
    starts = [text.index("\n  " + title.split(" (")[0]) for title in GROUPS]
    assert starts == sorted(starts)
    bounds = dict(zip(GROUPS, zip(starts, starts[1:] + [len(text)])))
    for title, names in GROUPS.items():
        lo, hi = bounds[title]
        for name in names:
            (line,) = [m.start() for m in re.finditer(rf"^    {re.escape(name)} ", text, re.M)]
            assert lo < line < hi, (name, title)
    # the experiments' heading names every ablation module on disk and the paper's figures
    lo, hi = bounds[EXPERIMENTS]
    ablations = {m[len("ablate_"):-3] for m in os.listdir(experiments.__path__[0]) if m.startswith("ablate_")}
    assert len(ablations) >= 8 and all(a in text[lo:hi] for a in ablations), text[lo:hi]
    assert "python -m experiments.<name>" in text[lo:hi] and "\n    paper " in text[lo:hi]


def test_every_command_still_runs_by_its_name(capsys):
    for name in COMMANDS:  # --help of each command through the grouped parser
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and out.startswith(f"usage: {PROG} {name} "), (name, out[:100])


# ------------------------------------------------------------------ the console script
@pytest.mark.slow
def test_the_console_script_is_installed_and_names_itself():
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == SCRIPT] or [None]
    assert ep is not None, (f"no {SCRIPT!r} console script in the installed metadata: re-run "
                            "`pip install -e .` after pulling the [project.scripts] entry")
    assert ep.value == "dflash_jax.__main__:main" and ep.load() is main
    script = shutil.which(SCRIPT, path=sysconfig.get_path("scripts"))
    assert script, f"{SCRIPT} is not in {sysconfig.get_path('scripts')}: re-run `pip install -e .`"
    top = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert top.returncode == 0 and top.stdout.startswith(f"usage: {SCRIPT} [-h]"), top.stdout[:200] + top.stderr
    assert all(f"\n  {title.split(' (')[0]}" in top.stdout for title in GROUPS)
    assert f"'{SCRIPT} <command> --help'" in top.stdout
    sub = subprocess.run([script, "export", "--help"], capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0 and sub.stdout.startswith(f"usage: {SCRIPT} export "), sub.stdout[:200]
    # python -m dflash_jax keeps its own name
    module = subprocess.run([sys.executable, "-m", "dflash_jax", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert module.returncode == 0 and module.stdout.startswith(f"usage: {PROG} [-h]"), module.stdout[:200]


# ------------------------------------------------------------------ help on every option
def options_without_help(p: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in options_of(p)
            if a.help is None or a.help is argparse.SUPPRESS or not a.help.strip()]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_text(name):
    assert options_without_help(command_parser_of(name)) == [], name


def test_the_help_check_finds_an_option_without_help():
    p = argparse.ArgumentParser()
    p.add_argument("--said", help="a text")
    p.add_argument("--silent", type=int)
    p.add_argument("--blank", help="  ")
    p.add_argument("--hidden", help=argparse.SUPPRESS)
    assert options_without_help(p) == ["--silent", "--blank", "--hidden"]
    assert options_without_help(parser()) == []  # the top-level options too


# ------------------------------------------------------------------ one meaning per option name
# Every option name that several commands have, with its one meaning: the dest it sets and a
# pattern its help text matches in every one of them. A name taken by a second command must be
# added here with the meaning it has everywhere (or the new option renamed).
MEANINGS = {
    "--anchor-chunk": ("anchor_chunk", r"blocks per (anchor )?chunk"),
    "--batch": ("batch", r"batch size"),
    "--batch-size": ("batch_size", r"(sequences|rows|prompts) per "),
    "--block-size": ("block_size", r"block size"),
    "--calls": ("calls", r"calls per compiled timing loop"),
    "--checkpoint-every": ("checkpoint_every", r"save a checkpoint every"),
    "--chunk": ("chunk", r"chunk (size|length) of the chunked form"),
    "--context": ("context", r"cached positions S"),
    "--context-chunk": ("context_chunk", r"context positions per (context )?chunk"),
    "--coordinator": ("coordinator", r"multi-host: host:port"),
    "--corpus": ("corpus", r"written by build-corpus"),
    "--data": ("data", r"written by train-data"),
    "--data-dir": ("data_dir", r"DFLASH_DATA_DIR"),
    "--datasets": ("datasets", r"prompt sets"),
    "--devices": ("devices", r"profiles"),
    "--drafter": ("drafter", r"drafter"),
    "--drafter-layers": ("drafter_layers", r"layers of the"),
    # the dtype the models (or kernels) compute in; what is loaded or written in another dtype
    # has its own name: train --target-dtype, export --out-dtype
    "--dtype": ("dtype", r"^compute dtype\b"),
    "--eval-every": ("eval_every", r"every this many steps"),
    "--grad-clip": ("grad_clip", r"global norm"),
    "--impl": ("impl", r"kernel implementation"),
    "--iterations": ("iterations", r"iterations per tim"),
    "--keep-checkpoints": ("keep_checkpoints", r"newest checkpoints"),
    "--learning-rate": ("learning_rate", r"learning rate"),
    "--latency-us": ("latency_us", r"latency of one collective"),
    "--max-len": ("max_len", r"KV cache length"),
    "--max-new-tokens": ("max_new_tokens", r"tokens generated per prompt at most"),
    "--max-samples": ("max_samples", r"prompts per set"),
    "--memory-fraction": ("memory_fraction", r"share of HBM"),
    "--mesh": ("mesh", r"device mesh"),
    "--models": ("models", r"target shapes to model"),
    "--new-tokens": ("new_tokens", r"tokens generated per sequence"),
    "--nodes": ("nodes", r"tree node budgets N"),
    "--init-from": ("init_from", r"start from this .* instead of random weights"),
    "--num-anchors": ("num_anchors", r"anchors .*per training sequence"),
    "--num-processes": ("num_processes", r"multi-host: number of processes"),
    "--out": ("out", r"output director|to write"),
    "--preset": ("preset", r"model (shape|size)"),
    "--process-id": ("process_id", r"multi-host: this process's id"),
    "--quantize": ("quantize", r"weight-only quantized on load"),
    "--prompt-len": ("prompt_len", r"prompt tokens"),
    "--repeats": ("repeats", r"timed runs"),
    "--run": ("run", r"run directory"),
    "--seed": ("seed", r"seed"),
    "--seq": ("seq", r"cache lengths S"),
    "--seq-len": ("seq_len", r"tokens per (training sequence|packed training row)"),
    "--steps": ("steps", r"steps"),
    "--stop-after": ("stop_after", r"stop after this many"),
    "--target": ("target", r"target"),
    "--taps": ("taps", r"target layer"),
    "--tau": ("tau", r"acceptance length"),
    "--temperature": ("temperature", r"sampling temperature \(0: greedy\)"),
    "--thinking": ("thinking", r"thinking switch on"),
    "--tokenizer": ("tokenizer", r"target.* whose tokenizer"),
    "--top-k": ("top_k", r"k most likely tokens"),
    "--top-p": ("top_p", r"nucleus sampling"),
    "--tree": ("tree", r"tree of N draft nodes"),
    "--verify": ("verify", r"the verify policy"),
    "--tree-topk": ("tree_topk", r"children per tree node"),
    "--warmup-fraction": ("warmup_fraction", r"warm the learning rate up"),
    "--weight-decay": ("weight_decay", r"weight decay"),
    "--interpret": ("interpret", r"(Pallas|Pallas / Triton) interpreter \(CPU smoke run\)"),
}
# the value types a name may take besides int/float/str: the block size also takes 'adaptive'
TYPE_EXCEPTIONS = {"--block-size"}


def option_table(commands=None) -> dict[str, list[tuple[str, argparse.Action]]]:
    """option name -> [(command, its action)] over ``commands`` (name -> parser; default all)."""
    commands = commands or {name: command_parser_of(name) for name in COMMANDS}
    table = collections.defaultdict(list)
    for name, p in commands.items():
        for action in options_of(p):
            for option in action.option_strings:
                if not option.startswith("--no-"):  # the negation of a BooleanOptionalAction
                    table[option].append((name, action))
    return table


def meaning_conflicts(table, meanings=MEANINGS) -> list[str]:
    """Where an option name shared by several commands has no declared meaning, sets another
    dest, takes another type, or has a help text without the meaning's pattern."""
    problems = []
    for option, uses in sorted(table.items()):
        if len(uses) < 2:
            continue
        if option not in meanings:
            problems.append(f"{option} is in {[c for c, _ in uses]}: declare its one meaning in MEANINGS")
            continue
        dest, pattern = meanings[option]
        for command, action in uses:
            if action.dest != dest:
                problems.append(f"{command} {option}: dest {action.dest!r}, elsewhere {dest!r}")
            if not re.search(pattern, action.help or "", re.I):
                problems.append(f"{command} {option}: help {action.help!r} does not say {pattern!r}")
        types = {getattr(a.type, "__name__", a.type) for _, a in uses if not isinstance(a, argparse._StoreTrueAction)}
        if len(types) > 1 and option not in TYPE_EXCEPTIONS:
            problems.append(f"{option}: value types {sorted(map(str, types))} in {[c for c, _ in uses]}")
    return problems


def test_an_option_name_means_the_same_in_every_command():
    table = option_table()
    assert meaning_conflicts(table) == []
    shared = {option for option, uses in table.items() if len(uses) > 1}
    assert set(MEANINGS) - shared == set(), "MEANINGS lists names no two commands share any more"


def test_the_meaning_check_finds_the_old_dtype_conflict():
    """Negative control: --dtype as train and export had it (the target's load dtype, the
    written weights' dtype) beside generate's compute dtype is reported; so are another dest
    and a shared name without a declared meaning."""
    def command(*specs):
        p = argparse.ArgumentParser()
        for option, kwargs in specs:
            p.add_argument(option, **kwargs)
        return p

    generate = command(("--dtype", dict(help="compute dtype of the target and drafter")))
    train = command(("--dtype", dict(help="dtype the target is loaded in (default: the checkpoint's)")))
    export = command(("--dtype", dict(help="cast the weights (default: the float32 master weights)")))
    problems = meaning_conflicts(option_table({"generate": generate, "train": train, "export": export}))
    assert len(problems) == 2 and all("does not say" in p for p in problems), problems
    assert "train --dtype" in problems[0] and "export --dtype" in problems[1] or \
        "export --dtype" in problems[0] and "train --dtype" in problems[1]
    other_dest = command(("--dtype", dict(dest="load_dtype", help="compute dtype")))
    assert meaning_conflicts(option_table({"generate": generate, "x": other_dest})) == [
        "x --dtype: dest 'load_dtype', elsewhere 'dtype'"]
    other_type = command(("--seed", dict(type=float, help="seed")))
    seed = command(("--seed", dict(type=int, help="seed")))
    assert "value types" in meaning_conflicts(option_table({"a": seed, "b": other_type}))[0]
    undeclared = command(("--colour", dict(help="a")))
    assert "declare its one meaning" in meaning_conflicts(option_table({"a": undeclared, "b": undeclared}))[0]


# ------------------------------------------------------------------ renamed options
RENAMED = [("train", "--dtype", "--target-dtype", "target_dtype"),
           ("export", "--dtype", "--out-dtype", "out_dtype")]
REQUIRED = {"train": ["--target", "t", "--data", "d", "--run", "r"], "export": ["--run", "r", "--out", "o"]}


@pytest.mark.parametrize("name, old, new, dest", RENAMED)
def test_an_old_spelling_still_works_with_one_note(name, old, new, dest, capsys):
    p = parser(name)
    renamed = vars(p.parse_args([name, *REQUIRED[name], old, "bfloat16"]))
    assert capsys.readouterr().err == f"note: {old} is deprecated here; use {new}\n"
    assert renamed == vars(p.parse_args([name, *REQUIRED[name], new, "bfloat16"]))
    assert renamed[dest] == "bfloat16" and "dtype" not in renamed
    assert capsys.readouterr().err == ""  # the new spelling: no note
    with pytest.raises(SystemExit):  # the old spelling takes the same values only
        p.parse_args([name, *REQUIRED[name], old, "int8"])
    capsys.readouterr()
    # the help shows the new name only
    help_text = command_parser_of(name).format_help()
    assert new in help_text and not re.search(rf"(?<![\w-]){re.escape(old)}\b", help_text)


def test_add_deprecated_alias_copies_the_option():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", choices=[1, 2, 3], help="x")
    add_deprecated_alias(p, "--size", "--sizes")
    assert p.parse_args(["--size", "1", "3"]).sizes == [1, 3]
    assert p.parse_args([]).sizes is None  # the alias sets no default of its own
    with pytest.raises(SystemExit):
        p.parse_args(["--size", "4"])
    with pytest.raises(ValueError):  # no such option to alias
        add_deprecated_alias(p, "--old", "--missing")


def test_train_and_export_run_with_the_old_dtype_spelling(tmp_path, capsys):
    """The commands read the renamed options: ``train --dtype`` loads the target (and stops at
    the missing data directory, a user's error, not at an unknown attribute); ``export --dtype``
    writes a run's checkpoint in the asked dtype. The run is a real one (the embedded pair),
    its initial state saved by its own checkpoint manager: no compilation, no training step."""
    import orbax.checkpoint as ocp

    from dflash_jax.training.data import TokenDataset
    from dflash_jax.methods.dflash.training import DFlashTrainer
    from dflash_jax.training.trainer import TrainConfig

    with pytest.raises(SystemExit) as e:
        main(["train", "--target", dj.EMBEDDED_TARGET_DIR, "--data", str(tmp_path / "no-data"),
              "--run", str(tmp_path / "r"), "--dtype", "bfloat16"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("note: --dtype is deprecated here; use --target-dtype\n"), err
    assert "error:" in err and "no-data" in err, err

    rng = np.random.default_rng(0)
    mask = np.zeros((4, 16), bool)
    mask[:, 4:14] = True
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "shard-00000.npz", tokens=rng.integers(1, 100, size=(4, 16)).astype(np.int32),
             loss_mask=mask, lengths=np.full(4, 14, np.int32))
    target = dj.load_target(dj.EMBEDDED_TARGET_DIR)
    trainer = DFlashTrainer(target, dj.DrafterConfig.from_pretrained(dj.EMBEDDED_DRAFTER_DIR),
                      TokenDataset(str(tmp_path / "data")), str(tmp_path / "run"),
                      TrainConfig(steps=1, batch_size=2, num_anchors=2), init_from=dj.EMBEDDED_DRAFTER_DIR)
    trainer.manager.save(0, args=ocp.args.StandardSave(trainer.init_state()))
    trainer.manager.wait_until_finished()
    for option, dtype, note in (("--dtype", "bfloat16", True), ("--out-dtype", "float32", False)):
        out = tmp_path / f"drafter-{dtype}"
        main(["export", "--run", str(tmp_path / "run"), "--out", str(out), option, dtype])
        assert ("note: --dtype is deprecated here; use --out-dtype" in capsys.readouterr().err) == note
        data = (out / "model.safetensors").read_bytes()
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        stored = {t["dtype"] for k, t in header.items() if k != "__metadata__"}
        assert stored == {{"bfloat16": "BF16", "float32": "F32"}[dtype]}, (option, stored)
