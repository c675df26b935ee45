"""What a user reads first: the README, the pages under docs/, the results' and notebooks'
READMEs and the model cards. Every command they show parses with the command line as it is
(no removed command, misspelt or deprecated option); every relative link resolves; they cite
nothing a user does not have (the developers' notes, internal issue numbers); and the README's
headline numbers are the committed run's (results/bench/bench.json)."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from support.doc_commands import commands_in, parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
PAGES = sorted([README, *glob.glob(os.path.join(ROOT, "docs", "*.md")),
                os.path.join(ROOT, "notebooks", "README.md"), os.path.join(ROOT, "tests", "README.md"),
                *glob.glob(os.path.join(ROOT, "results", "**", "README.md"), recursive=True),
                *glob.glob(os.path.join(ROOT, "dflash_jax", "assets", "*", "README.md")),
                os.path.join(ROOT, "dflash_jax", "bench", "data", "README.md")])
# pages written by the commands they describe keep the command as it was run: only the
# READMEs and docs are checked for commands (results/*/README.md are hand-written)
COMMAND_PAGES = [p for p in PAGES if "/assets/" not in p]


def _read(path):
    with open(path) as f:
        return f.read()


def _rel(path):
    return os.path.relpath(path, ROOT)


DEVELOPER_ONLY = re.compile(r"SPEC section|SPEC\.md|DESIGN\.md|\.\./shared|\bshared/(SPEC|DESIGN|datasets)|"
                            r"\b[Ii]ssues? #?\d+\b")


def developer_references(text: str) -> list[str]:
    return DEVELOPER_ONLY.findall(text) and [m.group(0) for m in DEVELOPER_ONLY.finditer(text)]


def test_the_pages_cite_nothing_a_user_does_not_have():
    assert len(PAGES) >= 20
    bad = {_rel(p): developer_references(_read(p)) for p in PAGES}
    assert not {k: v for k, v in bad.items() if v}
    # negative control: what the old README said is caught
    assert developer_references("(SPEC section 6), issue 18 and ../shared/datasets")


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: str) -> list[str]:
    out = []
    for target in LINK.findall(_read(path)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not os.path.exists(os.path.join(os.path.dirname(path), target.split("#")[0])):
            out.append(target)
    return out


def test_relative_links_resolve(tmp_path):
    bad = {_rel(p): broken_links(p) for p in PAGES}
    assert not {k: v for k, v in bad.items() if v}
    planted = tmp_path / "page.md"
    planted.write_text("[fine](page.md) [gone](docs/nothing.md) [web](https://arxiv.org/abs/2602.06036)")
    assert broken_links(str(planted)) == ["docs/nothing.md"]


def _all_commands():
    out = []
    for page in COMMAND_PAGES:
        for program, argv in commands_in(_read(page)):
            out.append(pytest.param(program, argv, id=f"{_rel(page)}: {program} {' '.join(argv)}"[:110]))
    return out


COMMANDS = _all_commands()


def test_the_readme_shows_the_main_commands():
    shown = {(p, tuple(a[:1])) for page in [README] for p, a in commands_in(_read(page))}
    for name in ("bench", "generate", "train-data", "train", "export"):
        assert ("dflash_jax", (name,)) in shown, name
    assert any(p == "experiments.ablate_depth" for p, _ in shown)
    assert any(p == "experiments.paper" for p, _ in shown)


@pytest.mark.parametrize("program, argv", COMMANDS)
def test_every_command_shown_parses(program, argv, capsys):
    try:
        parse(program, argv)
    except SystemExit as e:
        pytest.fail(f"`{program} {' '.join(argv)}` does not parse: {e} {capsys.readouterr().err}")
    err = capsys.readouterr().err
    assert "deprecated" not in err.lower(), err


def test_a_wrong_command_would_be_caught(capsys):
    """Negative controls: an option a command does not have, a removed command, an old spelling."""
    text = "```bash\ndflash-jax bench --samples-max 2 && python -m dflash_jax gpu_compile\n```\n" \
           "`python -m experiments.ablate_depth --preset tiny`"
    found = commands_in(text)
    assert found == [("dflash_jax", ["bench", "--samples-max", "2"]), ("dflash_jax", ["gpu_compile"]),
                     ("experiments.ablate_depth", ["--preset", "tiny"])]
    for program, argv in found:
        with pytest.raises(SystemExit):
            parse(program, argv)


# ------------------------------------------------------------------ the headline numbers
def _fmt(x, digits=2):
    return f"{x:.{digits}f}"


@pytest.mark.parametrize("run, marker", [("bench.json", "bench table"),
                                         ("avx2/bench.json", "bench table avx2")])
def test_the_readme_headline_numbers_are_the_committed_runs(run, marker):
    """The README's bench tables (the AVX-512 run and the AVX2 run) are the committed runs'."""
    bench = json.loads(_read(os.path.join(ROOT, "results", "bench", run)))
    text = _read(README)
    table = re.search(rf"<!-- {marker} -->\n(.*?)<!-- end {marker} -->", text, re.S)
    assert table, f"the README's results table is marked <!-- {marker} --> ... <!-- end {marker} -->"
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in table.group(1).strip().splitlines()[2:]}
    fixed, adaptive = bench["average"], bench["average_adaptive"]
    assert rows["fixed block 16"][0] == _fmt(fixed["tau"])
    assert rows["fixed block 16"][1].startswith(_fmt(fixed["speedup"]) + "x")
    assert rows["adaptive block"][0] == _fmt(adaptive["tau"])
    assert rows["adaptive block"][1].startswith(_fmt(adaptive["speedup"]) + "x")
    for row, d in (("fixed block 16", fixed), ("adaptive block", adaptive)):
        lo, hi = d["speedup_ci"]
        assert rows[row][1] == f"{_fmt(d['speedup'])}x [{_fmt(lo)}, {_fmt(hi)}]"
        assert rows[row][2] == _fmt(d["iteration_cost_ar_steps"])
    # the machine it names is the one the run recorded
    cpu = bench["cpu"]
    assert re.search(rf"family {cpu['family']} model {cpu['model_number']}\b", text)
    assert f"{cpu['cores']}-core" in text
    assert f"load average\n{bench['load_average_before'][0]:.1f}" in text or \
        f"load average {bench['load_average_before'][0]:.1f}" in text.replace("\n", " ")
