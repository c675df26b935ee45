"""``load-report`` (``tools/load_report.py``), smoke-sized: every MoE family's tiny checkpoint
written, loaded in a fresh process and reported (JSON + markdown), the scratch checkpoints
deleted; the peak-memory reading is the process's own (not the parent's at fork). No timing is
asserted."""

import json
import os
import sys

import pytest

from dflash_jax.__main__ import main
from dflash_jax.tools import load_report

pytestmark = [pytest.mark.xdist_group("load_report"), pytest.mark.slow]


def test_smoke_run_writes_its_files(tmp_path):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    main(["load-report", "--sizes", "tiny", "--repeats", "1", "--out", str(out),
          "--scratch", str(scratch)])
    report = json.loads((out / "load_report.json").read_text())
    assert [(r["family"], r["size"]) for r in report["rows"]] == [(f, "tiny") for f in load_report.FAMILIES]
    for row in report["rows"]:
        assert len(row["runs"]) == 1 and row["params"] > 0 and row["disk_bytes"] > 0
        run = row["runs"][0]
        assert run["seconds"] > 0 and run["rss_before"] > 0 and run["peak_rss"] >= run["rss_before"]
        assert run["load_average_before"] is not None
    assert report["command"].startswith("python -m dflash_jax.tools.load_report --sizes tiny")
    assert report["cpu"]["cores"] == os.cpu_count()
    table = (out / "load_report.md").read_text()
    assert all(f"| {f} | tiny |" in table for f in load_report.FAMILIES)
    assert os.listdir(scratch) == []  # the checkpoints are deleted after their loads


def test_the_peak_is_the_measured_process_own(tmp_path):
    """A parent holding a large buffer when it starts the measuring process does not raise
    the child's peak (``ru_maxrss`` would: Linux keeps the parent's size at fork)."""
    import numpy as np

    path = tmp_path / "ckpt"
    load_report.write_checkpoint("qwen3_5_moe_block", "tiny", str(path))
    ballast = np.ones(300_000_000 // 8)  # 300 MB resident in this process
    run = load_report.measure("qwen3_5_moe_block", str(path))
    assert run["peak_delta"] < 150e6, run
    del ballast


def test_bad_repeats(tmp_path):
    with pytest.raises(ValueError, match="--repeats must be at least 1"):
        load_report.main(["--repeats", "0", "--out", str(tmp_path)])
