"""XLA flags that dflash-jax sets on GPU machines, and why.

The target's decoder layers run under ``nn.scan`` over weights stacked as ``[layers, ...]``.
With XLA's default Triton GEMM fusions, every layer's weight slice was first copied out of the
stack (a dynamic-slice fusion: read, write, read again: three times the weight traffic of a
memory-bound decode step). With cuBLAS GEMMs and XLA's dynamic-slice fusion the product reads
the slice in place. Measured on an NVIDIA H100 80GB HBM3 (jax 0.11.2, Qwen3-8B shapes, bf16,
batch 1): 16.8 ms per decode step by default, 7.95 ms with these flags (results/gpu/README.md).

``import dflash_jax`` appends the flags to ``XLA_FLAGS`` when a CUDA plugin of jax is installed,
unless the user has set that flag either way, or has set ``DFLASH_XLA_FLAGS=0``. XLA reads
``XLA_FLAGS`` once, when jax creates its GPU backend: import dflash_jax before the first jax
computation (or set the flags yourself) for them to take effect. On a CPU-only install nothing
is changed.
"""

from __future__ import annotations

import importlib.util
import os

GPU_FLAGS = ("--xla_gpu_enable_triton_gemm=false", "--xla_gpu_enable_dynamic_slice_fusion=true")
OPT_OUT = "DFLASH_XLA_FLAGS"
CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13",
                "jax_plugins.xla_cuda12")


def cuda_plugin_installed() -> bool:
    for name in CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):  # a parent package that is absent
            continue
    return False


def add_gpu_flags(environ=os.environ, force: bool = False) -> list[str]:
    """Appends the ``GPU_FLAGS`` the user has not set (either way) to ``environ["XLA_FLAGS"]``;
    returns those added. Nothing is added without a CUDA plugin (unless ``force``) or with
    ``DFLASH_XLA_FLAGS=0``."""
    if environ.get(OPT_OUT, "1") == "0" or not (force or cuda_plugin_installed()):
        return []
    current = environ.get("XLA_FLAGS", "")
    set_names = {f.split("=")[0] for f in current.split()}
    added = [f for f in GPU_FLAGS if f.split("=")[0] not in set_names]
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return added
