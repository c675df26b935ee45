"""The run directory's entries (experiments.framework.work_entry and WorkLog): a finished entry
is reused and said so, naming where it is, when it was finished and the settings that define
it; ``fresh`` recomputes and writes the new entry over the old one only when it is whole; two
processes asking for one entry compute it once, the second waiting (and saying for what and
whom) and then reusing it. The machinery runs on cheap entries written by the test (the
``make`` callable work_entry takes); the last test runs a tiny experiment end to end
(``--steps 0``: the shipped drafter measured as it is, no data, no training)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from dflash_jax.experiments import ablate_depth, framework, paper

pytestmark = [pytest.mark.experiments]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _drafter(calls: list, tag: str = "first"):
    """A cheap directory entry like a drafter's: key.json, then a part, then train.json (the
    file that says it is finished, with its time); each call recorded in ``calls``."""
    def make(dest):
        calls.append(dest)
        os.makedirs(dest, exist_ok=True)
        framework.write_json(os.path.join(dest, "key.json"), {"layers": 1})
        with open(os.path.join(dest, "weights"), "w") as f:
            f.write(tag)
        framework.write_json(os.path.join(dest, "train.json"), {"tag": tag, "finished": framework.made_now()})
    return make


def _cell(calls: list, tag: str = "first"):
    """A cheap file entry like a cell's cell.json (written atomically, with its time)."""
    def make(dest):
        calls.append(dest)
        framework.write_json(dest, {"tag": tag, "finished": framework.made_now()})
    return make


def _ask(log, work, calls, tag="first", **kw):
    """(drafter reused?, cell reused?) of the two cheap entries under ``work``."""
    d = framework.work_entry(log, "drafter", os.path.join(work, "drafters", "d1"), _drafter(calls, tag),
                             done="train.json", about="layers=1 steps=8",
                             settings=os.path.join(work, "drafters", "d1", "key.json"), **kw)
    c = framework.work_entry(log, "cell", os.path.join(work, "cells", "c1", "cell.json"), _cell(calls, tag),
                             about="layers 1; block_size=16", settings=os.path.join(work, "cells", "c1", "cell.json"),
                             **kw)
    return d, c


def _finished(path: str) -> str:
    with open(path) as f:
        return json.load(f)["finished"]


def test_a_second_invocation_names_every_entry_it_reuses_with_its_time_and_settings(tmp_path, capsys):
    work = str(tmp_path / "work")
    calls = []
    assert _ask(framework.WorkLog(work), work, calls) == (False, False) and len(calls) == 2
    first = capsys.readouterr().err
    assert "reused" not in first
    # a second invocation (a log of its own, as a second command has): both reused, none made
    log = framework.WorkLog(work)
    assert _ask(log, work, calls) == (True, True) and len(calls) == 2
    err = capsys.readouterr().err
    drafter_made = _finished(os.path.join(work, "drafters", "d1", "train.json"))
    cell_made = _finished(os.path.join(work, "cells", "c1", "cell.json"))
    assert (f"reused drafter drafters/d1 (layers=1 steps=8): finished {drafter_made}; "
            "settings drafters/d1/key.json") in err, err
    assert f"reused cell cells/c1/cell.json (layers 1; block_size=16): finished {cell_made}; settings recorded in it" \
        in err, err
    assert re.fullmatch(STAMP, drafter_made) and re.fullmatch(STAMP, cell_made)
    # asked again in the same invocation: not said twice
    _ask(log, work, calls)
    assert capsys.readouterr().err == ""
    assert log.summary() == (f"reused from {os.path.abspath(work)}: 1 drafter (finished {drafter_made}), "
                             f"1 cell (finished {cell_made}); --fresh recomputes them")


def test_an_entry_without_a_recorded_time_gives_its_files_time_and_many_are_summarised(tmp_path, capsys):
    work = str(tmp_path / "work")
    old = os.path.join(work, "cells", "old", "cell.json")
    os.makedirs(os.path.dirname(old))
    framework.write_json(old, {"label": {}})  # written before entries recorded their time
    when = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    os.utime(old, (when, when))
    log = framework.WorkLog(work)
    assert framework.work_entry(log, "cell", old, _cell([]))
    assert ("reused cell cells/old/cell.json: finished 2026-01-02 03:04:05 (the file's time: no time recorded)"
            in capsys.readouterr().err)
    # many of a kind: the first few said one line each, then one line saying the rest are counted
    n = framework.WorkLog.SHOWN + 3
    for i in range(n):
        framework.work_entry(framework.WorkLog(work), "cell", os.path.join(work, "cells", f"c{i}", "cell.json"),
                             _cell([]))
    capsys.readouterr()
    for verbose in (False, True):
        log = framework.WorkLog(work, verbose=verbose)
        for i in range(n):
            framework.work_entry(log, "cell", os.path.join(work, "cells", f"c{i}", "cell.json"), _cell([]))
        lines = capsys.readouterr().err.splitlines()
        said = [x for x in lines if x.startswith("reused cell ")]
        assert len(said) == (n if verbose else framework.WorkLog.SHOWN), lines
        assert any("reusing more cells" in x for x in lines) != verbose
        assert re.fullmatch(rf"reused from .*: {n} cells \(finished {STAMP}( to [\d :-]+)?\); --fresh recomputes them",
                            log.summary())


def test_fresh_recomputes_and_replaces_each_entry_only_when_it_is_whole(tmp_path, capsys):
    work = str(tmp_path / "work")
    calls = []
    _ask(framework.WorkLog(work), work, calls)
    other = os.path.join(work, "drafters", "other")  # another experiment's entry, not asked for
    _drafter([], "other")(other)
    untouched = open(os.path.join(other, "train.json")).read()
    capsys.readouterr()

    drafter = os.path.join(work, "drafters", "d1")
    seen = []

    def make(dest):  # the new entry is made beside the old one, which stays whole meanwhile
        seen.append((dest, open(os.path.join(drafter, "weights")).read(),
                     os.path.exists(os.path.join(drafter, "train.json"))))
        _drafter(calls, "second")(dest)

    log = framework.WorkLog(work, fresh=True)
    assert not framework.work_entry(log, "drafter", drafter, make, done="train.json")
    assert not framework.work_entry(log, "cell", os.path.join(work, "cells", "c1", "cell.json"), _cell(calls, "second"))
    (dest, old_weights, old_done), = seen
    assert dest != drafter and old_weights == "first" and old_done
    assert len(calls) == 4  # both made again
    assert open(os.path.join(drafter, "weights")).read() == "second"
    assert json.load(open(os.path.join(drafter, "train.json")))["tag"] == "second"
    assert json.load(open(os.path.join(work, "cells", "c1", "cell.json")))["tag"] == "second"
    assert open(os.path.join(other, "train.json")).read() == untouched  # left alone
    assert sorted(os.listdir(os.path.join(work, "drafters"))) == [".d1.lock", "d1", "other"]  # no temporary left
    # what this invocation made is reused by it (cells sharing a drafter), silently
    n = len(calls)
    assert _ask(log, work, calls) == (True, True) and len(calls) == n
    assert "reused" not in capsys.readouterr().err
    # a recomputation that fails leaves the old entry as it was
    def broken(dest):
        _drafter([], "half")(dest)
        raise RuntimeError("killed half-way")
    with pytest.raises(RuntimeError):
        framework.work_entry(framework.WorkLog(work, fresh=True), "drafter", drafter, broken, done="train.json")
    assert open(os.path.join(drafter, "weights")).read() == "second"
    assert sorted(os.listdir(os.path.join(work, "drafters"))) == [".d1.lock", "d1", "other"]


def test_fresh_and_verbose_are_options_checked_before_anything_runs(tmp_path):
    args = framework.parser(ablate_depth.EXPERIMENT).parse_args(["--fresh", "--verbose"])
    assert args.fresh and args.verbose
    assert not framework.parser(ablate_depth.EXPERIMENT).parse_args([]).fresh
    args = paper.parser().parse_args(["table1", "--fresh", "--verbose"])
    assert args.fresh and args.verbose
    with pytest.raises(ValueError, match="readme .* computes nothing: --fresh does not apply"):
        paper.run("readme", "smoke", out=str(tmp_path / "out"), fresh=True)
    assert not (tmp_path / "out").exists()


ASKER = """
import json, os, sys, time
from dflash_jax.experiments import framework

work, tag, count, go = sys.argv[1:5]
log = framework.WorkLog(work)


def make(dest):
    with open(count, "a") as f:  # who computed it
        f.write(tag + "\\n")
    print("computing", flush=True)
    while not os.path.exists(go):  # held until the test lets it finish
        time.sleep(0.05)
    os.makedirs(dest, exist_ok=True)
    for i in range(4):  # written in parts: a reader that did not wait would find some missing
        with open(os.path.join(dest, f"part-{i}"), "w") as f:
            f.write(tag)
        time.sleep(0.1)
    framework.write_json(os.path.join(dest, "train.json"), {"tag": tag, "finished": framework.made_now()})


path = os.path.join(work, "drafters", "d1")
reused = framework.work_entry(log, "drafter", path, make, done="train.json", about="layers=1")
parts = sorted(n for n in os.listdir(path) if n.startswith("part-"))
print(json.dumps({"reused": reused, "parts": parts, "tag": json.load(open(os.path.join(path, "train.json")))["tag"]}),
      flush=True)
"""


def _lines(stream) -> list:
    """The lines of ``stream``, appended as they come by a thread of their own."""
    got = []

    def read():
        for line in stream:
            got.append(line)
    threading.Thread(target=read, daemon=True).start()
    return got


@pytest.mark.slow  # two processes that import the framework: about 5 s
def test_two_processes_asking_for_one_entry_compute_it_once(tmp_path):
    """The first computes; the second waits, saying for which entry and which process, then
    reuses the whole entry; it is computed once."""
    work, count, go = str(tmp_path / "work"), str(tmp_path / "count"), str(tmp_path / "go")
    script = tmp_path / "asker.py"
    script.write_text(ASKER)

    def start(tag):
        return subprocess.Popen([sys.executable, str(script), work, tag, count, go], cwd=str(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = start("first")
    second = None
    try:
        assert first.stdout.readline().strip() == "computing"
        second = start("second")
        err = _lines(second.stderr)
        deadline = time.monotonic() + 60
        while not any(x.startswith("waiting for") for x in err) and second.poll() is None:
            assert time.monotonic() < deadline, err
            assert open(count).read() == "first\n", "the second process computes the entry too"
            time.sleep(0.05)
        (line,) = [x for x in err if x.startswith("waiting for")]  # said once, before the first finished
        assert line.startswith(f"waiting for drafter drafters/d1 (layers=1): process {first.pid} holds its lock "
                               "drafters/.d1.lock and is computing it"), line
        open(go, "w").close()
        out_second = second.stdout.read()
        second.wait(timeout=60)
        out_first, _ = first.communicate(timeout=60)
    finally:
        open(go, "w").close()
        for p in (first, second):
            if p is not None:
                p.kill()
    err_second = "".join(err)
    assert first.returncode == 0 and second.returncode == 0, err_second
    parts = [f"part-{i}" for i in range(4)]
    assert json.loads(out_first.splitlines()[-1]) == {"reused": False, "parts": parts, "tag": "first"}
    assert json.loads(out_second) == {"reused": True, "parts": parts, "tag": "first"}
    assert re.search(rf"reused drafter drafters/d1 \(layers=1\): finished {STAMP}, by another process while this "
                     "one waited", err_second), err_second
    assert open(count).read() == "first\n"  # computed once


@pytest.mark.slow
def test_a_tiny_experiment_run_again_reuses_and_says_so_and_fresh_recomputes(tmp_path, capsys):
    """ablate_depth at the test preset's size, one cell measuring the shipped drafter as it is:
    the second run names the drafter and the cell it reuses, with the times their files
    record; ``--fresh`` makes both again (new times), saying it recomputes."""
    work = tmp_path / "work"
    with pytest.raises(ValueError, match="0-layer drafter"):  # a fresh run checks its settings first too
        ablate_depth.run("test", out=str(tmp_path / "out"), work=str(work), fresh=True, depths=(0,))
    assert not (tmp_path / "out").exists() and not work.exists()
    argv = ["--preset", "test", "--depths", "1", "--init-from", "embedded", "--steps", "0", "--timing-repeats", "0",
            "--work", str(work), "--out", str(tmp_path / "out")]
    ablate_depth.main(argv)
    capsys.readouterr()
    (drafter,) = [d for d in os.listdir(work / "drafters") if not d.startswith(".")]
    (cell,) = [c for c in os.listdir(work / "cells") if not c.startswith(".")]
    made = {"drafter": _finished(work / "drafters" / drafter / "train.json"),
            "cell": _finished(work / "cells" / cell / "cell.json")}
    ablate_depth.main(argv)
    err = capsys.readouterr().err
    assert "finished there already: 1 of the cells, 1 of the drafters, reused" in err
    assert re.search(rf"reused drafter drafters/{drafter} \(layers=1 block_size=16 .*init_from=embedded\): "
                     rf"finished {made['drafter']}; settings drafters/{drafter}/key.json", err), err
    assert re.search(rf"reused cell cells/{cell}/cell.json \(layers 1, seed 0; block_size=16 .*\): "
                     rf"finished {made['cell']}; settings recorded in it", err), err
    assert f"1 drafter (finished {made['drafter']}), 1 cell (finished {made['cell']})" in err
    time.sleep(1.1)  # the recorded times have whole seconds
    ablate_depth.main(argv + ["--fresh"])
    err = capsys.readouterr().err
    assert "recomputed (--fresh)" in err and "reused" not in err
    assert _finished(work / "drafters" / drafter / "train.json") > made["drafter"]
    assert _finished(work / "cells" / cell / "cell.json") > made["cell"]
