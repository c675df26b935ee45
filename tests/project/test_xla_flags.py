"""The XLA flags dflash_jax sets on GPU installs (dflash_jax/xla_flags.py)."""

import os
import subprocess
import sys

from dflash_jax.xla_flags import GPU_FLAGS, add_gpu_flags


def test_flags_are_added_once_and_a_users_choice_wins():
    env = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_dump_to=/tmp/x"}
    added = add_gpu_flags(env, force=True)
    assert added == ["--xla_gpu_enable_dynamic_slice_fusion=true"]
    assert env["XLA_FLAGS"].split() == ["--xla_gpu_enable_triton_gemm=true", "--xla_dump_to=/tmp/x",
                                        "--xla_gpu_enable_dynamic_slice_fusion=true"]
    assert add_gpu_flags(env, force=True) == []  # a second import adds nothing
    empty = {}
    assert add_gpu_flags(empty, force=True) == list(GPU_FLAGS)
    assert empty["XLA_FLAGS"] == " ".join(GPU_FLAGS)


def test_opt_out_and_cpu_installs_are_left_alone():
    env = {"DFLASH_XLA_FLAGS": "0"}
    assert add_gpu_flags(env, force=True) == [] and "XLA_FLAGS" not in env
    from dflash_jax.xla_flags import cuda_plugin_installed

    if not cuda_plugin_installed():  # CI: a CPU-only jax, where XLA_FLAGS is not touched
        env = {}
        assert add_gpu_flags(env) == [] and env == {}


def test_this_xla_accepts_the_flags():
    """XLA aborts on a flag it does not know: the flags must exist in the installed jaxlib."""
    env = dict(os.environ, XLA_FLAGS=" ".join(GPU_FLAGS), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "3.0", out.stderr[-2000:]
