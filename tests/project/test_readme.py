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


HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation other than - and _
    dropped, spaces as -, a repeated heading numbered -1, -2, ... (headings in code blocks
    are not headings)."""
    out, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_anchors(path: str) -> list[str]:
    """Links to a heading of a Markdown page (`page.md#heading`, `#heading`) whose page has
    no such heading."""
    out = []
    for target in LINK.findall(_read(path)):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        page, anchor = target.split("#", 1)
        page = os.path.join(os.path.dirname(path), page) if page else path
        if page.endswith(".md") and os.path.exists(page) and anchor not in heading_anchors(_read(page)):
            out.append(target)
    return out


def test_links_to_headings_resolve(tmp_path):
    bad = {_rel(p): broken_anchors(p) for p in PAGES}
    assert not {k: v for k, v in bad.items() if v}
    # negative control: a heading that is not there (or only inside a code block) is caught
    planted = tmp_path / "page.md"
    planted.write_text("## Tree verification (`results/tree`)\n\n```\n# not a heading\n```\n"
                       "[ok](#tree-verification-resultstree) [gone](#trees) [code](#not-a-heading)")
    assert broken_anchors(str(planted)) == ["#trees", "#not-a-heading"]


def test_the_readme_stays_short():
    """The README is what a first reader reads: under 250 lines, the analyses in docs/."""
    assert len(_read(README).splitlines()) < 250


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


@pytest.mark.parametrize("run, cpu_label", [("bench.json", "AVX-512"), ("avx2/bench.json", "AVX2")])
def test_the_readme_headline_numbers_are_the_committed_runs(run, cpu_label):
    """The README's bench table (its AVX-512 rows and its AVX2 rows) is the committed runs'."""
    bench = json.loads(_read(os.path.join(ROOT, "results", "bench", run)))
    text = _read(README)
    table = re.search(r"<!-- bench table -->\n(.*?)<!-- end bench table -->", text, re.S)
    assert table, "the README's results table is marked <!-- bench table --> ... <!-- end bench table -->"
    rows = {(r.split("|")[1].strip(), r.split("|")[2].strip()): [c.strip() for c in r.split("|")[3:-1]]
            for r in table.group(1).strip().splitlines()[2:]}
    fixed, adaptive = bench["average"], bench["average_adaptive"]
    for row, d in (("fixed block 16", fixed), ("adaptive block", adaptive)):
        cells = rows[(row, cpu_label)]
        lo, hi = d["speedup_ci"]
        assert cells[0] == _fmt(d["tau"])
        assert cells[1] == f"{_fmt(d['speedup'])}x [{_fmt(lo)}, {_fmt(hi)}]"
        assert cells[2] == _fmt(d["iteration_cost_ar_steps"])
    # the machine it names is the one the run recorded
    cpu = bench["cpu"]
    assert re.search(rf"family {cpu['family']} model {cpu['model_number']}\b", text)
    assert f"{cpu['cores']}-core" in text
    assert f"load average {bench['load_average_before'][0]:.1f}" in text.replace("\n", " ")
