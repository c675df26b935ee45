"""How a command is declared: every command of ``python -m dflash_jax`` is a module with
``add_arguments(parser)`` and ``run(args)`` registered on one parser; the options of
``train`` and ``pretrain`` are their config dataclasses' fields, one option each."""

import argparse
import dataclasses
import subprocess
import sys
from typing import Literal

import pytest

from dflash_jax.__main__ import COMMANDS, command_module, main, parser
from dflash_jax.cli import (PROG, add_dataclass_arguments, command_parser, dataclass_from_args,
                            field_help, invocation, options, parse_command)


def command_parser_of(name: str) -> argparse.ArgumentParser:
    """The subparser of ``name`` on the parser of ``python -m dflash_jax``."""
    (sub,) = [a for a in parser(name)._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_a_module_with_add_arguments_and_run(name):
    module = command_module(name)
    assert callable(module.add_arguments) and callable(module.run), name
    assert callable(module.main), name  # python -m <module>: the same parser and run
    assert module.__doc__ and module.__doc__.strip(), f"{name}: the docstring is its description"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_shows_its_default_and_the_real_name(name):
    p = command_parser_of(name)
    assert p.prog == f"{PROG} {name}"
    formatter = p._get_formatter()
    for action in p._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in formatter._format_action(action), (name, action.option_strings)
    # the module's own parser (python -m <module>) has the same options
    alone = command_parser(name, command_module(name).__doc__)
    command_module(name).add_arguments(alone)
    assert ([a.option_strings for a in alone._actions] == [a.option_strings for a in p._actions])


@pytest.mark.parametrize("name, config", [("train", "dflash_jax.training.trainer.TrainConfig"),
                                          ("pretrain", "dflash_jax.embedded.pretrain.PretrainConfig")])
def test_train_and_pretrain_have_an_option_for_every_config_field(name, config):
    """Adding a field to the config without an option (or without help text) fails here."""
    import importlib

    module, cls_name = config.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), cls_name)
    p = command_parser_of(name)
    by_dest = {a.dest: a for a in p._actions if a.option_strings}
    helps = field_help(cls)
    for f in dataclasses.fields(cls):
        assert f.name in by_dest, f"{name}: no option for {cls_name}.{f.name}"
        action = by_dest[f.name]
        assert "--" + f.name.replace("_", "-") in action.option_strings
        assert action.default == f.default, f.name
        assert helps.get(f.name) and action.help, f"{cls_name}.{f.name} has no help text"
    required = {"train": ["--target", "t", "--data", "d", "--run", "r"],
                "pretrain": ["--corpus", "c", "--run", "r"]}[name]
    args = p.parse_args(required)
    assert dataclass_from_args(cls, args) == cls()  # the options' defaults are the config's


def test_train_options_reach_the_config_grad_clip_and_compute_dtype_included():
    from dflash_jax.training.trainer import TrainConfig

    p = command_parser_of("train")
    base = ["--target", "t", "--data", "d", "--run", "r"]
    cfg = dataclass_from_args(TrainConfig, p.parse_args(
        base + ["--grad-clip", "0.5", "--compute-dtype", "bfloat16", "--epochs", "1.5", "--uniform-weights",
                "--batch-size", "4", "--anchors", "fixed"]))
    assert cfg == TrainConfig(grad_clip=0.5, compute_dtype="bfloat16", epochs=1.5, uniform_weights=True,
                              batch_size=4, anchors="fixed")
    with pytest.raises(SystemExit):  # not a dtype the trainer computes in
        p.parse_args(base + ["--compute-dtype", "int8"])
    with pytest.raises(SystemExit):  # not an anchor strategy / a conditioning
        p.parse_args(base + ["--anchors", "aligned"])
    with pytest.raises(SystemExit):
        p.parse_args(base + ["--conditioning", "cross"])
    assert p.parse_args(base + ["--conditioning", "input"]).conditioning == "input"


@dataclasses.dataclass(frozen=True)
class Toy:
    """A config for the mechanism's test.

    Attributes:
        count: how many
        scale: a factor, explained on
            two lines
        name: a name
        flag: a switch
        on: a switch that is on
        kind: one of two
        sizes: several sizes
    """

    count: int | None = None
    scale: float = 1.5
    name: str = "x"
    flag: bool = False
    on: bool = True
    kind: Literal["a", "b"] = "a"
    sizes: tuple[int, ...] = (1, 2)
    hidden: int = dataclasses.field(default=3, metadata={"help": "from the metadata"})


def test_add_dataclass_arguments_reads_types_defaults_and_help():
    p = argparse.ArgumentParser()
    added = add_dataclass_arguments(p, Toy, skip=("hidden",), exclusive=[("count", "scale")])
    assert added == ["count", "scale", "name", "flag", "on", "kind", "sizes"]
    by_dest = {a.dest: a for a in p._actions if a.option_strings}
    assert by_dest["scale"].help == "a factor, explained on two lines"
    assert by_dest["kind"].choices == ["a", "b"] and by_dest["count"].type is int
    assert field_help(Toy)["hidden"] == "from the metadata"
    assert dataclass_from_args(Toy, p.parse_args([]), skip=("hidden",)) == Toy()
    args = p.parse_args(["--count", "3", "--name", "y", "--flag", "--no-on", "--kind", "b", "--sizes", "4", "5"])
    assert dataclass_from_args(Toy, args, skip=("hidden",)) == Toy(count=3, name="y", flag=True, on=False,
                                                                   kind="b", sizes=[4, 5])
    with pytest.raises(SystemExit):
        p.parse_args(["--count", "1", "--scale", "2"])  # exclusive

    @dataclasses.dataclass
    class Unsupported:
        mapping: dict = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="mapping"):
        add_dataclass_arguments(argparse.ArgumentParser(), Unsupported)


def test_parsed_args_record_their_invocation():
    from dflash_jax.training.cli import export

    args = parse_command("export", export, ["--run", "r", "--out", "o"])
    assert invocation(args) == ["export", "--run", "r", "--out", "o"]
    assert options(args) == {"run": "r", "out": "o", "out_dtype": None}
    assert invocation(argparse.Namespace(run="r")) is None


@pytest.mark.parametrize("name, argv", [("bench", ["--max-samples", "2"]), ("export", ["--run", "r", "--out", "o"])])
def test_the_top_level_parser_gives_the_commands_own_options(name, argv):
    """Parsed by ``python -m dflash_jax`` or by the module alone: the same namespace (nothing of
    the top-level parser leaks into it, e.g. into bench.json's settings)."""
    alone = parse_command(name, command_module(name), argv)
    assert vars(parse_command(name, None, argv, parser(name))) == vars(alone)
    assert invocation(alone) == [name, *argv]


def test_no_command_and_unknown_commands(capsys):
    main([])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG}") and all(n in out for n in COMMANDS)
    with pytest.raises(SystemExit) as e:
        main(["trian", "--steps", "3"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: unknown command 'trian'") and "train" in err
    # the experiments are listed in --help but run as their own modules: the error says how
    for name in ("paper", "ablate_depth"):
        with pytest.raises(SystemExit) as e:
            main([name, "all"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"python -m experiments.{name}" in err and "unknown" not in err


@pytest.mark.parametrize("module, name", [("dflash_jax.tools.gpu_compile", "gpu-compile"),
                                          ("dflash_jax.training.cli.train", "train"),
                                          ("dflash_jax.embedded.cli.pretrain", "pretrain")])
def test_modules_run_alone_with_the_same_parser(module, name):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: {PROG} {name}"), out.stdout[:200] + out.stderr
    for action in command_parser_of(name)._actions:
        if action.help is not argparse.SUPPRESS:  # (a renamed option's old spelling is hidden)
            assert all(option in out.stdout for option in action.option_strings), action.option_strings
