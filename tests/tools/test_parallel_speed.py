"""The multi-device decode benchmark (``dflash_jax.tools.parallel_speed``): its ``--quick`` run
gets 8 host devices by itself, measures every mesh, finds the one-device greedy tokens on each,
and writes the json / md / png; and the small helpers it is built from."""

import json
import subprocess
import sys

import pytest

from dflash_jax.tools import parallel_speed as ps
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.reporting import portable_path
from support.multidevice import ROOT, device_env

pytestmark = [pytest.mark.slow, pytest.mark.multidevice]


def test_quick_run_measures_its_meshes_and_writes_its_files(tmp_path):
    """One device in the environment (device_env(1) sets the flag to 1): the command must set
    8 itself before jax starts, as ``python -m dflash_jax.tools.parallel_speed`` does. Two of
    the meshes (compile time; tests/parallel/test_parallel.py checks the outputs on all four).
    The command keeps the other XLA flags: multidevice's fast_compile ones here (the one-device
    reference it compares every mesh with is compiled in the same process, under the same
    flags; its times only need to be positive and consistent)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "dflash_jax.tools.parallel_speed", "--quick",
                           "--meshes", "1x1", "2x4", "--out", str(out)], env=device_env(1, fast_compile=True),
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    stem = "parallel_speed_quick"
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.{e}" for e in ("json", "md", "png")]
    report = json.loads((out / f"{stem}.json").read_text())
    assert report["env"]["num_devices"] == 8 and report["env"]["platform"] == "cpu"
    assert report["quick"] is True and report["cpu_sanity_check_only"] is True
    assert "not a prediction for GPUs" in report["caveat"]
    assert report["command"] == (f"python -m dflash_jax.tools.parallel_speed --quick --meshes 1x1 2x4 "
                                 f"--out {portable_path(out)}")  # recorded as the same on every machine
    assert len(report["load_average_start"]) == 3 and report["env"]["cpu_model"]
    rows = report["results"]
    assert [(r["data"], r["model"]) for r in rows] == [(1, 1), (2, 4)] and report["skipped"] == []
    for r in rows:
        assert r["ar_equals_single_device"] is True, r["mesh"]
        assert r["dflash_equals_single_device"] is True, r["mesh"]
        assert r["dflash_equals_ar"] is True, r["mesh"]
        assert r["ar_ms_per_step"] > 0 and r["dflash_ms_per_iteration"] > 0
        assert r["iteration_over_ar_step"] == pytest.approx(
            r["dflash_ms_per_iteration"] / r["ar_ms_per_step"])
        assert r["ar_tokens_per_s_per_row"] == pytest.approx(1e3 / r["ar_ms_per_step"])
        assert len(r["ar_step_times_ms"]) == report["settings"]["repeats"]
        # per step / iteration: a timed run is `iterations` of them in one call
        iterations = report["settings"]["iterations"]
        assert r["ar_loop_ms"] == pytest.approx(r["ar_ms_per_step"] * iterations)
        assert r["dflash_loop_ms"] == pytest.approx(r["dflash_ms_per_iteration"] * iterations)
        assert r["shard_map"] == ((r["data"], r["model"]) != (1, 1))
    assert report["all_equal"] is True
    md = (out / f"{stem}.md").read_text()
    assert "CPU sanity check only" in md and "| 2x4 |" in md and "**NO**" not in md
    assert (out / f"{stem}.png").stat().st_size > 1000
    assert "mesh 2x4:" in proc.stderr + proc.stdout  # progress lines per mesh


def test_too_late_for_more_devices_is_detected():
    """jax already started with one CPU device: ensure_devices says so (run() then re-runs the
    command in a subprocess with the flag)."""
    code = ("import jax; jax.devices(); from dflash_jax.tools import parallel_speed as ps; "
            "print('RESULT', ps.ensure_devices(8), jax.device_count())")
    proc = subprocess.run([sys.executable, "-c", code], env=device_env(1), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert "RESULT False 1" in proc.stdout, proc.stderr[-3000:]


def test_device_count_flag_replaces_an_existing_one():
    assert ps.with_device_count("", 8) == "--xla_force_host_platform_device_count=8"
    flags = "--xla_cpu_foo=1 --xla_force_host_platform_device_count=2"
    assert ps.with_device_count(flags, 8) == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8"


def test_parse_meshes():
    assert ps.parse_meshes(["1x1", "2X4"]) == [(1, 1), (2, 4)]
    for bad in ("2", "0x8", "ax2", "2x4x1"):
        with pytest.raises(ValueError, match="DATAxMODEL"):
            ps.parse_meshes([bad])


def test_skip_reasons():
    cfg = TargetConfig(**ps.MODEL)
    dcfg = DrafterConfig.for_target(cfg, 1, 16, cfg.vocab_size - 1)
    for data, model in ps.MESHES:
        assert ps.skip_reason(cfg, dcfg, data, model, batch=8, devices=8) is None
    assert "needs 8 devices" in ps.skip_reason(cfg, dcfg, 2, 4, batch=8, devices=4)
    assert "batch 6" in ps.skip_reason(cfg, dcfg, 4, 2, batch=6, devices=8)
    gqa = TargetConfig(**{**ps.MODEL, "num_kv_heads": 4})
    assert "num_key_value_heads=4" in ps.skip_reason(gqa, dcfg, 1, 8, batch=8, devices=8)
