"""The command line's persistent compilation cache (dflash_jax/compilation_cache.py): on by default
under the project's home, bounded, off on request, never over a cache the user gave JAX; a second
run of a command loads every program the first one stored."""

import os
import subprocess
import sys

import pytest

from dflash_jax import compilation_cache as cc


def test_where_it_goes_and_when_it_is_off(tmp_path):
    env = {"DFLASH_JAX_HOME": str(tmp_path / "home")}
    path = cc.configure(env)
    assert path == str(tmp_path / "home" / "xla-cache") and os.path.isdir(path)
    assert env["JAX_COMPILATION_CACHE_DIR"] == path
    assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) == cc.DEFAULT_MAX_BYTES  # a bound: eviction + lock
    assert float(env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == cc.MIN_COMPILE_SECONDS

    env = {"DFLASH_JAX_HOME": str(tmp_path / "h2"), cc.MAX_GB_ENV: "0.5",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert cc.configure(env) == str(tmp_path / "h2" / "xla-cache")
    assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) == 1024 ** 3 // 2
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.0"  # the user's threshold kept

    for off in ("off", "0", "false", "No"):
        env = {"DFLASH_JAX_HOME": str(tmp_path / "h3"), cc.CACHE_ENV: off}
        assert cc.configure(env) is None and "JAX_COMPILATION_CACHE_DIR" not in env
    assert not (tmp_path / "h3").exists()

    env = {cc.CACHE_ENV: str(tmp_path / "elsewhere")}
    assert cc.configure(env) == str(tmp_path / "elsewhere")

    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "users"), "DFLASH_JAX_HOME": str(tmp_path / "h4")}
    assert cc.configure(env) == str(tmp_path / "users") and not (tmp_path / "h4").exists()

    with pytest.raises(ValueError, match=r"DFLASH_JAX_COMPILATION_CACHE_MAX_GB='-1'.*> 0"):
        cc.configure({"DFLASH_JAX_HOME": str(tmp_path / "h5"), cc.MAX_GB_ENV: "-1"})
    with pytest.raises(ValueError, match=r"MIN_COMPILE_TIME_SECS='soon': give the shortest compile time"):
        cc.configure({"DFLASH_JAX_HOME": str(tmp_path / "h6"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "soon"})


def _accesses(cache: str) -> dict[str, int]:
    """Per stored program, the last time JAX read or wrote it (its ``-atime`` file: kept when the
    cache has a size bound)."""
    out = {}
    for name in os.listdir(cache):
        if name.endswith("-atime"):
            with open(os.path.join(cache, name), "rb") as f:
                out[name[:-len("-atime")]] = int.from_bytes(f.read(), "little")
    return out


@pytest.mark.slow
def test_a_second_command_loads_what_the_first_compiled(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the suite's own
    env |= {"DFLASH_JAX_HOME": str(home), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    command = [sys.executable, "-m", "dflash_jax", "generate", "--drafter", "embedded", "--prompt", "2+2=",
               "--max-new-tokens", "4"]
    outputs = []
    for _ in range(2):
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
        if not outputs[1:]:
            first = _accesses(str(home / "xla-cache"))
    second = _accesses(str(home / "xla-cache"))
    assert len(first) >= 2, first  # the AR prefill and the speculative loop at least
    assert second.keys() == first.keys()  # nothing compiled anew ...
    assert all(second[k] > first[k] for k in first)  # ... and every program read back
    assert outputs[0] == outputs[1]


@pytest.mark.slow
@pytest.mark.parametrize("module", ["experiments.ablate_depth", "experiments.paper", "experiments.ablate_tree",
                                    "experiments.ablate_budget"])
def test_an_experiment_run_from_the_command_line_uses_it_too(tmp_path, module):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["DFLASH_JAX_HOME"] = str(tmp_path / "home")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", module, "--help"], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "home" / "xla-cache").is_dir()  # configured before the options were parsed
