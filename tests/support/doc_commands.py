"""The commands a page of the documentation shows, as argument lists, and their parse by the
command line as it is: `python -m dflash_jax <command> ...` and `dflash-jax <command> ...`
(the console script), and `python -m experiments.<name> ...`, in ```bash blocks (continuation
lines joined, comments dropped, several commands on a line split at ``&&``, ``;`` and ``&``) and
in inline code. Used by the tests of the README and of docs/ (test_readme.py,
test_training_guide.py)."""

from __future__ import annotations

import importlib
import re
import shlex

from dflash_jax.__main__ import COMMANDS, parser

SEPARATORS = {"&&", ";", "&", "||", "|"}


def _split_commands(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w in SEPARATORS:
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return [c for c in out + [cur] if c]


def _program(words: list[str]) -> tuple[str, list[str]] | None:
    """``("dflash_jax" | "experiments.<name>", argv)`` of one shell command, or None."""
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words[:1] == ["dflash-jax"]:
        return "dflash_jax", words[1:]
    for i in range(len(words) - 2):
        if re.fullmatch(r"python3?", words[i]) and words[i + 1] == "-m":
            module = words[i + 2]
            if module == "dflash_jax" or module.startswith("experiments."):
                return module, words[i + 3:]
            return None
    return None


def commands_in(text: str) -> list[tuple[str, list[str]]]:
    """Every command of ``text`` (a markdown page): its program and arguments. Inline commands
    with ``...`` or ``<placeholder>`` (templates left open for the reader) are skipped."""
    found = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.lstrip("$ ").replace("; do", " ; ")
            for cmd in _split_commands(shlex.split(line.replace("&&", " && ").replace(";", " ; "), comments=True)):
                prog = _program(cmd)
                if prog:
                    found.append(prog)
    for code in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text):
        if "..." in code or "<" in code or not re.match(r"(python3? -m (dflash_jax|experiments\.)|dflash-jax )", code):
            continue
        for cmd in _split_commands(shlex.split(code.replace("&&", " && "))):
            prog = _program(cmd)
            if prog:
                found.append(prog)
    return found


def parse(program: str, argv: list[str]):
    """Parses ``argv`` as ``program`` would (argparse's SystemExit on an error, its message on
    stderr). ``--help`` and ``--version`` parse as themselves."""
    if argv[:1] in (["--help"], ["-h"], ["--version"]) or argv == []:
        return None
    if program == "dflash_jax":
        name = argv[0]
        if name not in COMMANDS:
            raise SystemExit(f"unknown command {name!r}")
        return parser(name).parse_args(argv)
    module = importlib.import_module(program)
    if not hasattr(module, "EXPERIMENT"):  # experiments.paper, experiments.ablate_tree: their own parser
        return module.parser().parse_args(argv)
    from experiments import framework

    return framework.parser(module.EXPERIMENT).parse_args(argv)
