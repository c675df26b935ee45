"""Compiles the block-attention kernel for NVIDIA GPUs on a machine without one, and reports
what each launch would use: registers, spills, shared memory, grid size against the SMs,
occupancy, bytes per program and the bandwidth-bound time.

How: ``jax.jit(f).trace(*abstract_args).lower(lowering_platforms=("cuda",))`` lowers the Pallas
kernel for CUDA on the CPU (jax 0.12 and later: under an abstract mesh with an H100 as its device,
:func:`lower_for_cuda`); the kernel is a ``__gpu$xla.gpu.triton`` custom call whose backend
config carries the Triton IR (MLIR bytecode, printed as text with jaxlib's Triton dialect);
the ``triton`` package compiles that IR to PTX and cubin for sm_90a (H100, H200) and sm_100a
(B200), and the ``ptxas`` it ships (``ptxas -v``) reports registers, spills and barriers.

For every kernel configuration the engine launches for a model (target verify: T = block,
causal; drafter: T = block, non-causal with the block's own K/V; autoregressive decode: T = 1;
each against the engine's stacked ``[L, B, S, Hkv, Dh]`` cache) it compiles the launch
parameters the kernel used before tuning (``block_k`` 64, ``num_splits`` = S / 512, 4 warps,
2 stages) and the ones ``kernels/tuning.py`` chooses per shape and device, and flags spills,
limits exceeded, traps and grids that leave most SMs idle.

    python -m dflash_jax.tools.gpu_compile --model qwen3-8b            # before/after tables
    python -m dflash_jax.tools.gpu_compile --model llama-3.1-8b --seq 4096 --batch 1
    python -m dflash_jax.tools.gpu_compile --model path/to/hf_model_dir --block-size 16
    python -m dflash_jax.tools.gpu_compile --model qwen3-8b --search   # tile/warp/stage search
    python -m dflash_jax.tools.gpu_compile --model qwen3-8b --engine   # the whole engine
    python -m dflash_jax.tools.gpu_compile --model qwen3-8b --impl triton   # the Triton kernel
    python -m dflash_jax.tools.gpu_compile --engine --hybrid-target qwen3.5-4b   # a hybrid (GDN) target
    python -m dflash_jax.tools.gpu_compile --engine --hybrid-target qwen3.5-4b --gdn-impl pallas
    python -m dflash_jax.tools.gpu_compile --model qwen3-8b --tree 16 32 64   # + tree verify

``--tree N ...`` adds the target's tree verify of N nodes (docs/trees.md) to the before/after
tables: the non-causal mode with the tree's own K/V rows and its ancestor mask ``blk_mask``
(Pallas only). A tree of N nodes with G query heads per KV head runs as query chunks of
``64 // G`` nodes when N * G > 64 (``kernels.block_attention.in_query_chunks``); the row is
one chunk's kernel (the first, full-size one), each chunk reading all N block rows.

``--impl triton`` makes the before/after tables for ``kernels/triton_block_attention.py`` (the
same kernel in the Triton language, called through jax-triton) instead: each configuration is
compiled from its Triton source (``compile_for_gpu``) with the launch ``plan_launch`` makes
(tuned: its defaults for the GPU's SM count) and reported with the same columns and bytes model;
its grid has one more program per (batch row, KV head) for the drafter's block rows.

``--engine`` lowers AR and DFlash generation (prefill and the decode loop, the two programs
``generate`` runs) with ``attention_impl="pallas"`` and abstract parameters
(``jax.ShapeDtypeStruct``: nothing is allocated) for CUDA, and compiles every Triton kernel in
them. Needs the ``triton`` package (the ``test`` extra) and jaxlib <= 0.10.2, whose Pallas
lowering emits the uncompiled Triton IR (later jaxlibs compile it while lowering, which needs a
GPU's compilation handler).

``--engine --hybrid-target MODEL`` does the same for a hybrid Qwen3.5 target (``qwen3.5-4b``,
``qwen3.5-27b``: the shapes of ``tools/roofline_hybrid.py``; ``tiny``: the tiny target of
``tools/gdn_rollback.py``) with its drafter, once per GDN rollback mode (``snapshot``,
``replay``): the decode loop holds the verify through the GDN layers and the rollback. The GDN
layers are XLA operations, lowered for CUDA here (the report gives each program's size); the
Triton kernels in the programs (the attention layers' block attention, the drafter's) are
compiled per architecture as above. With ``--gdn-impl pallas`` the GDN layers' chunked form
(the prefill's, and the verify's with the replay rollback) is the two Pallas kernels of
``kernels/gdn_chunk.py``, compiled and reported with the others (``kernel_name``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from dflash_jax import files
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.reporting import command_line, environment, new_figure, write_report
from dflash_jax.kernels import tuning
from dflash_jax.kernels.block_attention import block_attention
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import round_up
from dflash_jax.verification.sampling import SamplingParams
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.methods.dflash.proposer import DFlashProposer
from dflash_jax.targets import init_target_params

KIB = 1024


# ---------------------------------------------------------------------------- devices
@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What a launch is measured against. Per-SM limits are compute-capability facts (CUDA C++
    Programming Guide, "Technical Specifications per Compute Capability"; the Hopper and
    Blackwell tuning guides); SM count and bandwidth are product facts (``sources``)."""

    name: str
    arch: str                      # ptxas --gpu-name
    capability: int                # triton GPUTarget arch
    num_sms: int
    hbm_bytes_per_s: float
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256      # registers are allocated per warp in units of 256
    smem_per_sm: int = 228 * KIB
    smem_per_block: int = 227 * KIB
    smem_reserved_per_block: int = 1 * KIB  # the CUDA runtime's own use, per resident block
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    tmem_columns_per_sm: int = 0   # Blackwell tensor memory: 512 columns x 128 lanes x 32 bit
    sources: tuple[str, ...] = ()


CUDA_GUIDE = ("CUDA C++ Programming Guide, Technical Specifications per Compute Capability "
              "(https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
              "#features-and-technical-specifications): 64K 32-bit registers per SM, 255 per "
              "thread, 2048 threads and 32 blocks per SM, 228 KB shared memory per SM, 227 KB "
              "per block, 1 KB reserved per block, for compute capabilities 9.0 and 10.0")
GPUS = {
    "h100": GpuSpec(
        "H100 SXM", "sm_90a", 90, 132, 3.35e12, sources=(
            "NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/): "
            "H100 SXM memory bandwidth 3.35 TB/s",
            "NVIDIA H100 Tensor Core GPU Architecture whitepaper: H100 SXM5 has 132 SMs",
            "NVIDIA Hopper Tuning Guide (https://docs.nvidia.com/cuda/hopper-tuning-guide/): "
            "228 KB shared memory per SM, up to 227 KB per thread block", CUDA_GUIDE)),
    "h200": GpuSpec(
        "H200 SXM", "sm_90a", 90, 132, 4.8e12, sources=(
            "NVIDIA H200 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h200/): "
            "H200 SXM memory bandwidth 4.8 TB/s; the same GH100 GPU (132 SMs) as H100 SXM",
            CUDA_GUIDE)),
    "b200": GpuSpec(
        "B200", "sm_100a", 100, 148, 8.0e12, tmem_columns_per_sm=512, sources=(
            "NVIDIA DGX B200 / HGX B200 datasheets (https://www.nvidia.com/en-us/data-center/dgx-b200/): "
            "HBM3e, 8 TB/s per GPU",
            "148 SMs: the multiprocessor count CUDA reports for B200 (cudaDevAttrMultiProcessorCount)",
            "NVIDIA Blackwell Tuning Guide (https://docs.nvidia.com/cuda/blackwell-tuning-guide/): "
            "228 KB shared memory per SM, up to 227 KB per thread block",
            "PTX ISA, Tensor Memory (tcgen05): 128 lanes x 512 columns of 32-bit cells per CTA's SM",
            CUDA_GUIDE)),
}
ARCH_GPUS = {"sm_90a": ("h100", "h200"), "sm_100a": ("b200",)}


# ---------------------------------------------------------------------------- model shapes
@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The attention shapes of a target and its drafter that the kernel sees."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    block_size: int
    drafter_layers: int = 5


NAMED_SHAPES = {  # Hugging Face config.json values; block sizes of the released drafters (docs/method.md section 1)
    "qwen3-8b": ModelShape("Qwen3-8B", 32, 8, 128, 36, 16),
    "llama-3.1-8b": ModelShape("Llama-3.1-8B", 32, 8, 128, 32, 10),
}


def model_shape(model: str, block_size: int | None = None, drafter_layers: int = 5) -> ModelShape:
    """A named shape (``qwen3-8b``, ``llama-3.1-8b``, any case) or a Hugging Face model directory
    (its ``config.json``); ``block_size`` overrides the named default (16 for a directory)."""
    key = model.lower()
    if key in NAMED_SHAPES:
        shape = NAMED_SHAPES[key]
    elif os.path.isdir(model):

        cfg = TargetConfig.from_pretrained(model)
        shape = ModelShape(os.path.basename(os.path.abspath(model)), cfg.num_heads,
                           cfg.num_kv_heads, cfg.head_dim, cfg.num_layers, 16)
    else:
        raise ValueError(f"--model {model!r} is neither a named shape ({', '.join(NAMED_SHAPES)}) "
                         "nor a directory with a config.json")
    return dataclasses.replace(shape, block_size=block_size or shape.block_size,
                               drafter_layers=drafter_layers)


# ---------------------------------------------------------------------------- configurations
@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One kernel call of the engine: q [batch, num_queries, heads, head_dim] against the stacked
    cache [num_layers, batch, seq, kv_heads, head_dim]; ``kind`` is verify / draft / decode, or
    tree (tree verify of ``nodes`` nodes: non-causal with the tree's own rows and ancestor mask;
    ``num_queries`` is then one query chunk's nodes, :func:`tree_config`)."""

    kind: str
    batch: int
    seq: int
    num_queries: int
    heads: int
    kv_heads: int
    head_dim: int
    num_layers: int
    dtype: str = "bfloat16"
    nodes: int = 0

    @property
    def causal(self) -> bool:
        return self.kind not in ("draft", "tree")

    @property
    def tree(self) -> bool:
        return self.kind == "tree"

    @property
    def block_len(self) -> int:
        """Rows of the block's own K/V (non-causal): the tree's nodes, else the queries."""
        return self.nodes if self.tree else self.num_queries

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rows(self) -> int:
        return tuning.folded_rows(self.num_queries, self.group)

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def block_rows(self) -> int:
        """Rows of the block's own K/V the kernel loads (drafter only)."""
        return 0 if self.causal else max(16, tuning.next_pow2(self.block_len))

    @property
    def label(self) -> str:
        nodes = f" N={self.nodes}" if self.tree else ""
        return f"{self.kind}{nodes} T={self.num_queries} B={self.batch} S={self.seq}"


def tree_config(shape: ModelShape, nodes: int, batch: int, seq: int,
                dtype: str = "bfloat16") -> KernelConfig:
    """The target's tree verify of ``nodes`` nodes as the kernel runs it: query chunks of
    ``64 // G`` nodes when nodes * G > 64 (``in_query_chunks``), each against all the nodes'
    K/V rows and the chunk's rows of the ancestor mask."""
    from dflash_jax.kernels.block_attention import MAX_ROWS

    if nodes < 2:
        raise ValueError(f"--tree: a tree has at least 2 nodes, got {nodes}")
    G = shape.num_heads // shape.num_kv_heads
    chunk = nodes if nodes * G <= MAX_ROWS else max(1, MAX_ROWS // G)
    return KernelConfig("tree", batch, seq, chunk, shape.num_heads, shape.num_kv_heads,
                        shape.head_dim, shape.num_layers, dtype, nodes=nodes)


def engine_configs(shape: ModelShape, seqs: Sequence[int], batches: Sequence[int],
                   dtype: str = "bfloat16", trees: Sequence[int] = ()) -> list[KernelConfig]:
    """The calls the engine makes per decode step: verify and draft (T = block size) for
    DFlash, decode (T = 1) for autoregressive decoding, and tree verify of each node budget in
    ``trees`` (:func:`tree_config`), for every cache length and batch."""
    out = []
    for kind, T, layers in (("verify", shape.block_size, shape.num_layers),
                            ("draft", shape.block_size, shape.drafter_layers),
                            ("decode", 1, shape.num_layers)):
        for batch in batches:
            for seq in seqs:
                out.append(KernelConfig(kind, batch, seq, T, shape.num_heads, shape.num_kv_heads,
                                        shape.head_dim, layers, dtype))
    out += [tree_config(shape, n, batch, seq, dtype) for n in trees for batch in batches
            for seq in seqs]
    return out


def legacy_launch(cfg: KernelConfig) -> tuning.LaunchParams:
    """The kernel's defaults before per-shape tuning: 64-row tiles (or the largest of 32/16
    dividing S), ~S / 512 splits, 4 warps, 2 stages."""
    block_k = next((b for b in (64, 32, 16) if cfg.seq % b == 0), 64)
    return tuning.LaunchParams(block_k, max(1, -(-cfg.seq // 512)), 4, 2)


def tuned_launch(cfg: KernelConfig, gpu: GpuSpec, impl: str = "pallas") -> tuning.LaunchParams:
    """What ``kernels/tuning.py`` chooses for ``cfg`` on ``gpu`` (the kernel's default when it
    runs on that device); for ``impl="triton"``, the defaults of the Triton kernel's
    ``plan_launch``."""
    if impl == "triton":
        return triton_plan(cfg, None, gpu).launch
    return tuning.choose_launch(batch=cfg.batch, seq=cfg.seq, kv_heads=cfg.kv_heads,
                                num_queries=cfg.num_queries, group=cfg.group,
                                head_dim=cfg.head_dim, itemsize=cfg.itemsize,
                                block_rows=0 if cfg.causal else cfg.block_len,
                                num_sms=gpu.num_sms)


# ---------------------------------------------------------------------------- lowering
@dataclasses.dataclass(frozen=True)
class TritonCall:
    """A Triton kernel found in a lowered StableHLO module: its IR as text, the launch it was
    lowered with, and its operand shapes (for the block-attention kernel: layer, kv_lens,
    folded q [B, Hkv, R, Dh], k, v [L, B, S, Hkv, Dh], and in drafter mode the block's K/V)."""

    name: str
    ir: str
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]
    operand_shapes: tuple[tuple[int, ...], ...]
    operand_dtypes: tuple[str, ...]

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def abstract_inputs(cfg: KernelConfig) -> tuple:
    """ShapeDtypeStructs of one call's arguments (q, k, v, kv_lens, layer[, k_blk, v_blk[,
    blk_mask]]); a tree's q holds all its nodes (the kernel cuts it into query chunks)."""
    sd, dt = jax.ShapeDtypeStruct, jnp.dtype(cfg.dtype)
    cache = (cfg.num_layers, cfg.batch, cfg.seq, cfg.kv_heads, cfg.head_dim)
    args = (sd((cfg.batch, cfg.block_len, cfg.heads, cfg.head_dim), dt), sd(cache, dt),
            sd(cache, dt), sd((cfg.batch,), jnp.int32), sd((), jnp.int32))
    if not cfg.causal:
        blk = sd((cfg.batch, cfg.block_len, cfg.kv_heads, cfg.head_dim), dt)
        args += (blk, blk)
    if cfg.tree:
        args += (sd((cfg.batch, cfg.nodes, cfg.nodes), jnp.bool_),)
    return args


# the GPU the Pallas kernels are lowered for where no GPU is attached: jax 0.12 and later look the
# device's compute capability up while lowering a Pallas call for Triton, and without a GPU
# backend they take it from the abstract mesh's device (jax 0.10 lowered without one). The
# Triton IR is then compiled for each target GPU by ``triton.compile`` (:func:`_compile`).
LOWERING_DEVICE_KIND = "NVIDIA H100"


def lower_for_cuda(trace):
    """``trace().lower(lowering_platforms=("cuda",))`` (``trace`` makes a ``jax.stages.Traced``);
    on a host without a GPU backend, traced and lowered under an abstract mesh whose device is
    :data:`LOWERING_DEVICE_KIND` (a traced program keeps the mesh it was traced under)."""
    if jax.default_backend() == "gpu" or not hasattr(jax.sharding, "AbstractDevice"):
        return trace().lower(lowering_platforms=("cuda",))
    device = jax.sharding.AbstractDevice(device_kind=LOWERING_DEVICE_KIND, num_cores=None, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
        return trace().lower(lowering_platforms=("cuda",))


def lower_kernel(cfg: KernelConfig, launch: tuning.LaunchParams):
    """The kernel call of ``cfg`` with ``launch``, lowered for CUDA (a ``jax.stages.Lowered``)."""

    def call(q, k, v, lens, layer, kb=None, vb=None, mask=None):
        return block_attention(q, k, v, lens, kb, vb, causal=cfg.causal, blk_mask=mask, layer=layer,
                               block_k=launch.block_k, num_splits=launch.num_splits,
                               num_warps=launch.num_warps, num_stages=launch.num_stages)

    return lower_for_cuda(lambda: jax.jit(call).trace(*abstract_inputs(cfg)))


def triton_calls(lowered) -> list[TritonCall]:
    """Every ``__gpu$xla.gpu.triton`` custom call in a lowered module, in program order."""
    module = lowered.compiler_ir("stablehlo")
    ops = _custom_calls(module.operation, [])
    targets = [str(op.attributes["call_target_name"]).strip('"') for op in ops]
    if any(t.startswith("triton_kernel_call") for t in targets):
        raise RuntimeError(
            "this jaxlib compiles Pallas Triton kernels while lowering (custom call "
            "triton_kernel_call_ffi), so the module holds no Triton IR to compile here; "
            "gpu_compile needs jaxlib <= 0.10.2")
    return [_triton_call(op) for op, t in zip(ops, targets) if t == "__gpu$xla.gpu.triton"]


def _custom_calls(op, found: list) -> list:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name == "stablehlo.custom_call":
                    found.append(inner.operation)
                _custom_calls(inner.operation, found)
    return found


def _triton_call(op) -> TritonCall:
    cfg = op.attributes["mhlo.backend_config"]
    integer = lambda key: int(cfg[key].value)
    shapes, dtypes = [], []
    for operand in op.operands:
        shapes.append(tuple(operand.type.shape))
        dtypes.append(str(operand.type.element_type))
    return TritonCall(name=str(cfg["name"].value), ir=ir_text(cfg["ir"].value_bytes),
                      num_warps=integer("num_warps"), num_stages=integer("num_stages"),
                      grid=(integer("grid_x"), integer("grid_y"), integer("grid_z")),
                      operand_shapes=tuple(shapes), operand_dtypes=tuple(dtypes))


def ir_text(bytecode: bytes) -> str:
    """Triton IR as MLIR text, from the bytecode in a custom call's backend config."""
    from jax._src.lib.mlir import ir
    from jax._src.lib import triton as jax_triton_dialect  # jaxlib's Triton dialect bindings

    with ir.Context() as ctx:
        jax_triton_dialect.dialect.register_dialect(ctx)
        return str(ir.Module.parse(bytecode))


# ---------------------------------------------------------------------------- compiling
@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What the compiler and ptxas report for one kernel on one architecture."""

    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    barriers: int
    shared_bytes: int
    tmem_columns: int
    num_warps: int
    num_stages: int
    traps: int  # PTX trap instructions: Triton emits a lone trap for a kernel it cannot build
    ptx_target: str = ""  # the PTX ``.target`` (sm_90a, sm_100a)
    tensor_core_ops: tuple[str, ...] = ()  # distinct PTX matrix instructions (wgmma, tcgen05, mma)

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


_COMPILED: dict[tuple, CompiledKernel] = {}


def compile_triton(ir: str, gpu: GpuSpec, num_warps: int, num_stages: int) -> CompiledKernel:
    """Compiles Triton IR text for ``gpu``'s architecture with the ``triton`` package and reads
    the resources with its ptxas (memoised by IR, architecture, warps and stages)."""
    key = (hashlib.sha256(ir.encode()).hexdigest(), gpu.arch, num_warps, num_stages)
    if key not in _COMPILED:
        _COMPILED[key] = _compile(ir, gpu, num_warps, num_stages)
    return _COMPILED[key]


def _compile(ir: str, gpu: GpuSpec, num_warps: int, num_stages: int) -> CompiledKernel:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # XLA's Triton fuses mul-adds too
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ttir")
        with open(path, "w") as f:
            f.write(ir)
        kernel = triton.compile(path, target=GPUTarget("cuda", gpu.capability, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
        return compiled_kernel(kernel, gpu, num_warps, num_stages)


TENSOR_CORE_OPS = r"\b(?:wgmma\.mma_async|mma\.sync|tcgen05\.mma)\S*"  # PTX matrix instructions


def compiled_kernel(kernel, gpu: GpuSpec, num_warps: int, num_stages: int) -> CompiledKernel:
    """The resources of a kernel ``triton.compile`` built for ``gpu``: its metadata (shared and
    tensor memory), its PTX (target, traps, tensor-core instructions) and ``ptxas -v``."""
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        usage = ptxas_usage(ptx, gpu, tmp)
    meta = kernel.metadata
    target = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M)
    return CompiledKernel(arch=gpu.arch, shared_bytes=int(meta.shared),
                          tmem_columns=int(getattr(meta, "tmem_size", 0) or 0),
                          num_warps=num_warps, num_stages=num_stages,
                          traps=len(re.findall(r"^\s*trap;", ptx, re.M)),
                          ptx_target=target.group(1) if target else "",
                          tensor_core_ops=tuple(sorted(set(re.findall(TENSOR_CORE_OPS, ptx)))),
                          **usage)


def ptxas_path(gpu: GpuSpec) -> str:
    """The ptxas that ``triton`` ships for ``gpu``'s architecture (``ptxas-blackwell`` from
    sm_90 on, as Triton itself uses)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(gpu.capability).path


def ptxas_usage(ptx: str, gpu: GpuSpec, tmp: str) -> dict:
    """``ptxas -v`` on ``ptx`` (the flags Triton uses): registers, spills, stack, barriers."""
    src, obj = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
    with open(src, "w") as f:
        f.write(ptx)
    proc = subprocess.run([ptxas_path(gpu), "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu.arch}",
                           src, "-o", obj], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas failed for {gpu.arch}: {proc.stderr.strip()[-2000:]}")
    return parse_ptxas_log(proc.stderr)


def parse_ptxas_log(log: str) -> dict:
    """Registers, spill bytes, stack frame and barriers of the one entry function in a
    ``ptxas -v`` log."""
    if len(re.findall(r"Compiling entry function", log)) != 1:
        raise ValueError(f"expected one entry function in the ptxas log:\n{log}")

    def number(pattern: str, default: int | None = None) -> int:
        m = re.search(pattern, log)
        if m is None:
            if default is None:
                raise ValueError(f"no {pattern!r} in the ptxas log:\n{log}")
            return default
        return int(m.group(1))

    return {"registers": number(r"Used (\d+) registers"),
            "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"),
            "stack_frame": number(r"(\d+) bytes stack frame"),
            "barriers": number(r"used (\d+) barriers", 0)}


# ---------------------------------------------------------------------------- report rows
def occupancy(gpu: GpuSpec, kernel: CompiledKernel) -> dict:
    """Resident blocks per SM from registers, shared memory, tensor memory and threads (the
    CUDA occupancy rules: registers allocated per warp in units of 256), and which limits."""
    threads = 32 * kernel.num_warps
    per_warp = -(-kernel.registers * 32 // gpu.reg_alloc_unit) * gpu.reg_alloc_unit
    limits = {
        "registers": (gpu.regs_per_sm // max(per_warp, 1)) // kernel.num_warps,
        "threads": gpu.max_threads_per_sm // threads,
        "blocks": gpu.max_blocks_per_sm,
    }
    if kernel.shared_bytes:
        limits["shared memory"] = gpu.smem_per_sm // (kernel.shared_bytes + gpu.smem_reserved_per_block)
    if kernel.tmem_columns and gpu.tmem_columns_per_sm:
        limits["tensor memory"] = gpu.tmem_columns_per_sm // kernel.tmem_columns
    blocks = min(limits.values())
    return {"blocks_per_sm": blocks, "limited_by": [k for k, v in limits.items() if v == blocks],
            "blocks_by_registers": limits["registers"],
            "blocks_by_shared_memory": limits.get("shared memory")}


def kernel_row(gpu: GpuSpec, kernel: CompiledKernel, *, grid: Sequence[int], read_per_program: int,
               written_per_program: int, total_bytes: int, modeled_bytes_per_sm: float | None = None,
               **extra) -> dict:
    """One report row: a compiled kernel's resources and its launch against ``gpu``.

    Args:
      kernel: :func:`compile_triton`'s result (any Triton kernel: registers, spills, shared
        memory, warps).
      grid: the launch grid; read_per_program / written_per_program: bytes one program moves;
      total_bytes: every byte the call moves (all programs and any combine step), for the
        bandwidth-bound lower time; modeled_bytes_per_sm: ``kernels.tuning.modeled_cost`` (the
        busiest SM's bytes at its share of bandwidth), or None.
      extra: more columns (configuration, launch parameters), placed first.
    Returns a dict with ``flags``: the problems found (:func:`row_flags`).
    """
    programs = math.prod(int(g) for g in grid)
    occ = occupancy(gpu, kernel)
    slots = gpu.num_sms * max(occ["blocks_per_sm"], 1)
    row = dict(extra)
    row.update({
        "gpu": gpu.name, "arch": gpu.arch, "registers": kernel.registers,
        "spill_bytes": kernel.spills, "stack_frame": kernel.stack_frame, "barriers": kernel.barriers,
        "shared_kib": kernel.shared_bytes / KIB, "shared_limit_kib": gpu.smem_per_block / KIB,
        "tmem_columns": kernel.tmem_columns, "traps": kernel.traps,
        "num_warps": kernel.num_warps, "num_stages": kernel.num_stages,
        "grid": list(grid), "programs": programs, "num_sms": gpu.num_sms,
        "sm_fill": min(programs, gpu.num_sms) / gpu.num_sms,
        "blocks_per_sm": occ["blocks_per_sm"], "occupancy_limited_by": occ["limited_by"],
        "waves": -(-programs // slots),
        "read_kib_per_program": read_per_program / KIB,
        "written_kib_per_program": written_per_program / KIB,
        "total_mib": total_bytes / KIB ** 2,
        "bound_us": 1e6 * total_bytes / gpu.hbm_bytes_per_s,
    })
    if modeled_bytes_per_sm is not None:
        row["modeled_us"] = 1e6 * modeled_bytes_per_sm / (gpu.hbm_bytes_per_s / gpu.num_sms)
    row["flags"] = row_flags(row, gpu)
    return row


def row_flags(row: dict, gpu: GpuSpec) -> list[str]:
    """Problems in a report row: spills, over a limit, a trapping kernel, most SMs idle."""
    flags = []
    if row["spill_bytes"]:
        flags.append(f"spills {row['spill_bytes']} B")
    if row["shared_kib"] * KIB > gpu.smem_per_block:
        flags.append("shared memory over the per-block limit")
    if row["registers"] > gpu.max_regs_per_thread:
        flags.append("registers over the limit")
    if row["blocks_per_sm"] < 1:
        flags.append("no block fits on an SM")
    if row["traps"]:
        flags.append("kernel compiled to a trap")
    if row["programs"] < gpu.num_sms / 2:
        flags.append(f"most SMs idle ({row['programs']}/{gpu.num_sms})")
    return flags


def config_row(cfg: KernelConfig, launch: tuning.LaunchParams, gpu: GpuSpec,
               kernel: CompiledKernel, grid: Sequence[int], *, block_program: bool = False) -> dict:
    """The report row of one engine kernel configuration with one launch on ``grid``.

    block_program: the drafter's block rows are extra programs (the grid's programs beyond
    ``B * Hkv * splits``; the Triton kernel) rather than loaded by every cache program (the
    Pallas kernel); the cache programs' bytes and the modeled cost then leave them out.
    """
    splits, per = tuning.split_layout(cfg.seq, launch.block_k, launch.num_splits)
    block_rows = 0 if block_program else cfg.block_rows
    size = dict(rows=cfg.rows, head_dim=cfg.head_dim, itemsize=cfg.itemsize, block_k=launch.block_k)
    moved = tuning.program_bytes(**size, tiles_per_split=per, block_rows=block_rows)
    own = tuning.program_bytes(**size, tiles_per_split=0, block_rows=cfg.block_rows)  # no cache
    if cfg.tree:  # every program also loads the folded int8 mask tile [rows, block rows]
        moved = dict(moved, read=moved["read"] + cfg.rows * cfg.block_rows)
    programs = math.prod(grid)
    extra = programs - cfg.batch * cfg.kv_heads * splits  # block-row programs (0 for Pallas)
    out_bytes = cfg.batch * cfg.num_queries * cfg.heads * cfg.head_dim * cfg.itemsize
    total = ((programs - extra) * (moved["read"] + 2 * moved["written"])  # combine reads partials
             + extra * (own["read"] + 2 * own["written"]) + out_bytes)
    cost = tuning.modeled_cost(batch=cfg.batch, kv_heads=cfg.kv_heads, seq=cfg.seq, rows=cfg.rows,
                               head_dim=cfg.head_dim, itemsize=cfg.itemsize, block_k=launch.block_k,
                               num_splits=launch.num_splits, num_sms=gpu.num_sms,
                               block_rows=block_rows)
    return kernel_row(gpu, kernel, grid=grid, read_per_program=moved["read"],
                      written_per_program=moved["written"], total_bytes=total,
                      modeled_bytes_per_sm=cost, kind=cfg.kind, batch=cfg.batch, seq=cfg.seq,
                      num_queries=cfg.num_queries, rows=cfg.rows, block_k=launch.block_k,
                      num_splits=splits, **({"nodes": cfg.nodes} if cfg.tree else {}))


def compile_config(cfg: KernelConfig, launch: tuning.LaunchParams, gpu: GpuSpec,
                   impl: str = "pallas") -> dict:
    """Compiles ``cfg`` with ``launch`` for ``gpu`` and returns its row: ``impl="pallas"``
    lowers the Pallas kernel for CUDA and compiles its Triton IR; ``"triton"`` compiles the
    Triton-language kernel (:func:`compile_triton_plan`)."""
    if impl == "triton":
        if cfg.tree:
            raise ValueError("the tree rows compile the Pallas kernel: drop --impl triton or --tree")
        plan = triton_plan(cfg, launch, gpu)
        kernel = compile_triton_plan(plan, gpu, cfg.dtype)
        return config_row(cfg, plan.launch, gpu, kernel, plan.grid, block_program=True)
    if impl != "pallas":
        raise ValueError(f"impl must be 'pallas' or 'triton', got {impl!r}")
    calls = triton_calls(lower_kernel(cfg, launch))
    if len(calls) != 1 and not cfg.tree:
        raise RuntimeError(f"{cfg.label}: expected one kernel call, found {len(calls)}")
    call = calls[0]  # a tree: the first query chunk (the full-size one)
    kernel = compile_triton(call.ir, gpu, call.num_warps, call.num_stages)
    return config_row(cfg, launch, gpu, kernel, call.grid)


# ---------------------------------------------------------------------------- the Triton kernel
def triton_plan(cfg: KernelConfig, launch: tuning.LaunchParams | None, gpu: GpuSpec):
    """The Triton kernel's ``LaunchPlan`` for ``cfg`` with ``launch`` (None: ``plan_launch``'s
    own defaults for ``gpu``'s SM count): grid (B, Hkv, splits + 1 in drafter mode)."""
    from dflash_jax.kernels.triton_block_attention import plan_launch

    chosen = {} if launch is None else dataclasses.asdict(launch)
    return plan_launch((cfg.batch, cfg.num_queries, cfg.heads, cfg.head_dim),
                       (cfg.num_layers, cfg.batch, cfg.seq, cfg.kv_heads, cfg.head_dim),
                       cfg.dtype, causal=cfg.causal, has_blk=not cfg.causal,
                       num_sms=gpu.num_sms, **chosen)


def compile_triton_plan(plan, gpu: GpuSpec, dtype: str) -> CompiledKernel:
    """Compiles the Triton-language kernel with ``plan`` (a ``LaunchPlan``) for ``gpu``'s
    architecture (``kernels.triton_block_attention.compile_for_gpu``) and reads its resources
    (memoised by plan, dtype and architecture)."""
    from dflash_jax.kernels.triton_block_attention import compile_for_gpu

    key = ("triton", tuple(sorted(plan.constexprs.items())), jnp.dtype(dtype).name, gpu.arch,
           plan.num_warps, plan.num_stages)
    if key not in _COMPILED:
        kernel = compile_for_gpu(gpu.capability, plan, dtype)
        _COMPILED[key] = compiled_kernel(kernel, gpu, plan.num_warps, plan.num_stages)
    return _COMPILED[key]


# ---------------------------------------------------------------------------- tuning search
SEARCH_SPACE = {"block_k": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)}


def search_tiles(cfg: KernelConfig, gpu: GpuSpec, progress=None) -> list[dict]:
    """Compiles every (block_k, num_warps, num_stages) of :data:`SEARCH_SPACE` for ``cfg`` on
    ``gpu`` (splits chosen by the tuner for each tile); rows marked ``usable`` (no flag) and
    ``chosen`` (what ``kernels/tuning.py`` picks)."""
    chosen = tuned_launch(cfg, gpu)
    rows = []
    for block_k in SEARCH_SPACE["block_k"]:
        for warps in SEARCH_SPACE["num_warps"]:
            for stages in SEARCH_SPACE["num_stages"]:
                splits = tuning.choose_num_splits(
                    batch=cfg.batch, kv_heads=cfg.kv_heads, seq=cfg.seq, rows=cfg.rows,
                    head_dim=cfg.head_dim, itemsize=cfg.itemsize, block_k=block_k,
                    num_sms=gpu.num_sms, block_rows=cfg.block_rows)
                launch = tuning.LaunchParams(block_k, splits, warps, stages)
                row = compile_config(cfg, launch, gpu)
                row["usable"] = not row["flags"]
                row["chosen"] = launch == chosen
                rows.append(row)
                if progress is not None:
                    progress.update(1)
    return rows


# ---------------------------------------------------------------------------- the engine
def engine_programs(target_cfg, drafter_cfg, *, batch: int, prompt_len: int, cache_len: int,
                    max_new_tokens: int = 64, dtype=jnp.bfloat16) -> dict:
    """The two programs ``generate(..., attention_impl="pallas")`` runs (prefill, then the
    decode loop), lowered for CUDA with abstract parameters: {"prefill": Lowered,
    "decode": Lowered}. ``drafter_cfg`` None is autoregressive decoding (block size 1)."""
    key = jax.random.key(0)
    tparams = jax.eval_shape(lambda: init_target_params(target_cfg, key, dtype))
    dparams = None if drafter_cfg is None else jax.eval_shape(
        lambda: init_drafter_params(drafter_cfg, key, dtype))
    spec = engine.EngineSpec(  # as api.prepare_decode builds it
        target=target_cfg, proposer=None if drafter_cfg is None else DFlashProposer(drafter_cfg),
        block_size=1 if drafter_cfg is None else drafter_cfg.block_size,
        sampling=SamplingParams(0.0, None, None), out_len=round_up(max_new_tokens, 16),
        attention_impl="pallas")
    sd = jax.ShapeDtypeStruct
    args = (tparams, dparams, sd((batch, prompt_len), jnp.int32), sd((batch,), jnp.int32),
            sd((batch,), jnp.int32), sd((batch, 1), jnp.int32), jax.eval_shape(lambda: key))
    prefill = lower_for_cuda(lambda: engine.prefill.trace(*args, spec=spec, cache_len=cache_len))
    state = jax.eval_shape(functools.partial(engine.prefill, spec=spec, cache_len=cache_len), *args)
    decode = lower_for_cuda(lambda: engine.decode.trace(tparams, dparams, state, args[4], args[5],
                                                        sd((), jnp.int32), spec=spec))
    return {"prefill": prefill, "decode": decode}


def attention_call_shape(call: TritonCall) -> dict:
    """Reads a block-attention call's configuration from its operands (see :class:`TritonCall`;
    a tree verify's call has an 8th, the folded ancestor mask)."""
    B, Hkv, R, Dh = call.operand_shapes[2]
    L, _, S = call.operand_shapes[3][:3]
    has_block = len(call.operand_shapes) >= 7
    return {"batch": B, "kv_heads": Hkv, "rows": R, "head_dim": Dh, "seq": S, "num_layers": L,
            "has_block": has_block, "has_mask": len(call.operand_shapes) == 8,
            "block_rows": call.operand_shapes[5][1] if has_block else 0,
            "itemsize": int(re.search(r"(\d+)$", call.operand_dtypes[2]).group(1)) // 8}  # bf16, f32


def engine_calls(programs: dict) -> list[tuple[str, TritonCall]]:
    """(stage, call) for every distinct Triton kernel in the lowered engine programs (a kernel
    called in every layer, or in every query chunk, appears once)."""
    found = []
    for stage, lowered in programs.items():
        calls = triton_calls(lowered)
        if not calls:
            raise RuntimeError(
                f"the engine's {stage} program lowered for CUDA holds no Triton kernel: the "
                "Pallas call was traced in interpret mode (chosen from the host's backend at "
                "trace time, not from the lowering platform)")
        found += [(stage, call) for call in calls]
    return found


def engine_rows(calls: Sequence[tuple[str, TritonCall]], gpus: Sequence[GpuSpec],
                progress=None) -> list[dict]:
    """Compiles every engine kernel (:func:`engine_calls`) for each GPU's architecture."""
    rows = []
    for stage, call in calls:
        if call.name.startswith("dflash_gdn_chunk"):
            rows += gdn_rows(stage, call, gpus, progress)
            continue
        shape = attention_call_shape(call)
        splits = call.grid[2]
        kv = 2 * -(-shape["seq"] // splits) * shape["head_dim"] * shape["itemsize"]
        read = kv + (shape["rows"] + 2 * shape["block_rows"]) * shape["head_dim"] * shape["itemsize"]
        written = shape["rows"] * (shape["head_dim"] + 2) * 4
        for gpu in gpus:
            kernel = compile_triton(call.ir, gpu, call.num_warps, call.num_stages)
            rows.append(kernel_row(gpu, kernel, grid=call.grid, read_per_program=read,
                                   written_per_program=written,
                                   total_bytes=call.programs * (read + 2 * written),
                                   stage=stage, kernel_name=call.name, **shape))
            if progress is not None:
                progress.update(1)
    return rows


def gdn_call_shape(call: TritonCall) -> dict:
    """A GDN kernel call's configuration from its operands (``kernels/gdn_chunk.py``, all
    float32, padded to the kernel's tiles): the inverse kernel's (k [B, Hv, N, P, dk], g, beta)
    or the scan's (g, W, U [B, Hv, N, P, dv], att, qg, kw, s0), and the bytes one program
    reads and writes."""
    if call.name == "dflash_gdn_chunk_inverse":
        B, Hv, n, P, dk = call.operand_shapes[0]
        return {"batch": B, "v_heads": Hv, "chunks": n, "rows": P, "dk": dk, "dv": None,
                "read": 4 * (P * dk + 2 * P), "written": 4 * P * P}
    B, Hv, n, P, dk = call.operand_shapes[1]
    dv = call.operand_shapes[2][4]
    bv = dv // call.grid[2]
    per_chunk = 4 * (P + 3 * P * dk + P * bv + P * P)  # g, W, qg, kw, U's columns, att
    return {"batch": B, "v_heads": Hv, "chunks": n, "rows": P, "dk": dk, "dv": dv, "block_v": bv,
            "read": n * per_chunk + 4 * dk * bv, "written": 4 * (n * P * bv + (n + 1) * dk * bv)}


def gdn_rows(stage: str, call: TritonCall, gpus: Sequence[GpuSpec], progress=None) -> list[dict]:
    """A GDN kernel call (:func:`gdn_call_shape`) compiled for each GPU, one row each."""
    shape = gdn_call_shape(call)
    read, written = shape.pop("read"), shape.pop("written")
    rows = []
    for gpu in gpus:
        kernel = compile_triton(call.ir, gpu, call.num_warps, call.num_stages)
        rows.append(kernel_row(gpu, kernel, grid=call.grid, read_per_program=read, written_per_program=written,
                               total_bytes=call.programs * (read + written), stage=stage,
                               kernel_name=call.name, **shape))
        if progress is not None:
            progress.update(1)
    return rows


# ---------------------------------------------------------------------------- markdown
COLUMNS = (("config", "{}"), ("launch", "{}"), ("registers", "{}"), ("spill_bytes", "{}"),
           ("shared", "{}"), ("programs", "{}"), ("waves", "{}"), ("blocks_per_sm", "{}"),
           ("read_kib_per_program", "{:.0f}"), ("bound_us", "{:.1f}"), ("modeled_us", "{:.1f}"),
           ("flags", "{}"))


def _cells(row: dict) -> dict:
    cells = dict(row)
    nodes = f" N={row['nodes']}" if row.get("nodes") else ""
    cells["config"] = f"{row['kind']}{nodes} T={row['num_queries']} B={row['batch']} S={row['seq']}"
    cells["launch"] = f"{row['block_k']}/{row['num_splits']}/{row['num_warps']}/{row['num_stages']}"
    cells["shared"] = f"{row['shared_kib']:.0f}/{row['shared_limit_kib']:.0f}"
    cells["programs"] = f"{row['programs']}/{row['num_sms']}"
    cells["flags"] = "; ".join(row["flags"]) or "-"
    return cells


def markdown_table(rows: Sequence[dict], columns=COLUMNS) -> str:
    head = [name for name, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = _cells(row)
        lines.append("| " + " | ".join(fmt.format(cells.get(name, "")) for name, fmt in columns) + " |")
    return "\n".join(lines)


def before_after_table(pairs: Sequence[tuple[dict, dict]]) -> str:
    """One line per configuration: the legacy launch against the tuned one."""
    lines = ["| config | launch before | launch after | regs | spills | shared KiB | programs | "
             "waves | KiB/program | bound µs | modeled µs | flags before | flags after |",
             "|" + "---|" * 13]
    for b, a in pairs:
        cb, ca = _cells(b), _cells(a)
        pair = lambda key, fmt="{}": f"{fmt.format(b[key])} → {fmt.format(a[key])}"
        lines.append(" | ".join([
            f"| {cb['config']}", cb["launch"], ca["launch"], pair("registers"),
            pair("spill_bytes"), pair("shared_kib", "{:.0f}"),
            f"{b['programs']} → {a['programs']} /{a['num_sms']}", pair("waves"),
            pair("read_kib_per_program", "{:.0f}"), pair("bound_us", "{:.1f}"),
            pair("modeled_us", "{:.1f}"), cb["flags"], ca["flags"] + " |"]))
    return "\n".join(lines)


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (a temporary file renamed into place)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    files.write_text(path, text)


def sources_markdown(gpus: Sequence[GpuSpec]) -> str:
    lines = ["## Device facts and their sources", ""]
    for gpu in gpus:
        lines.append(f"- **{gpu.name}** ({gpu.arch}): {gpu.num_sms} SMs, "
                     f"{gpu.hbm_bytes_per_s / 1e12:g} TB/s HBM, {gpu.regs_per_sm} registers/SM, "
                     f"{gpu.smem_per_sm // KIB} KiB shared memory/SM, {gpu.smem_per_block // KIB} "
                     "KiB/block.")
        lines += [f"  - {s}" for s in gpu.sources]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plots
def plot_before_after(report: dict):
    pairs = report["before_after"]
    gpus = list(dict.fromkeys(p["after"]["gpu"] for p in pairs))  # in the order run
    fig, axes = new_figure(len(gpus), 1, figsize=(10, 2.8 * len(gpus)), squeeze=False)
    for ax, name in zip(axes[:, 0], gpus):
        sel = [p for p in pairs if p["after"]["gpu"] == name]
        x = range(len(sel))
        ax.bar([i - 0.2 for i in x], [p["before"]["modeled_us"] for p in sel], 0.4, label="before")
        ax.bar([i + 0.2 for i in x], [p["after"]["modeled_us"] for p in sel], 0.4, label="tuned")
        ax.plot(list(x), [p["after"]["bound_us"] for p in sel], "k_", ms=12,
                label="all bytes at HBM bandwidth (tuned)")
        ax.set_xticks(list(x), [_cells(p["after"])["config"] for p in sel], rotation=70, fontsize=6)
        ax.set(yscale="log", ylabel="µs", title=f"{name}: modeled time (busiest SM at its bandwidth share)")
        ax.legend(fontsize=7)
    return fig


def plot_rows(report: dict):
    rows = report["rows"]
    fig, ax = new_figure(figsize=(8, 3.5))
    labels = [f"{r.get('stage', r.get('kind'))} R={r['rows']} S={r['seq']} {r['arch']}" for r in rows]
    ax.bar(range(len(rows)), [r["registers"] for r in rows],
           color=["tab:red" if r["flags"] else "tab:blue" for r in rows])
    ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=6)
    ax.set(ylabel="registers per thread (red: flagged)", title=report["title"])
    return fig


# ---------------------------------------------------------------------------- commands
def run_before_after(configs: Sequence[KernelConfig], gpus: Sequence[GpuSpec],
                     impl: str = "pallas") -> list[dict]:
    """Compiles every configuration with the legacy and the tuned launch on every GPU, for the
    Pallas kernel or (``impl="triton"``) the Triton-language one."""
    from dflash_jax.progress import progress

    pairs = []
    with progress(total=2 * len(configs) * len(gpus), desc="compiling", unit="kernel") as bar:
        for gpu in gpus:
            for cfg in configs:
                before = compile_config(cfg, legacy_launch(cfg), gpu, impl)
                bar.update(1)
                after = compile_config(cfg, tuned_launch(cfg, gpu, impl), gpu, impl)
                bar.update(1)
                pairs.append({"before": before, "after": after})
    return pairs


def run_engine(shape: ModelShape, gpus: Sequence[GpuSpec], *, batch: int, prompt_len: int,
               cache_len: int, dtype) -> list[dict]:
    """AR and DFlash engines of ``shape`` (random-shaped Qwen3 target and drafter) lowered for
    CUDA, every Triton kernel compiled for every GPU."""
    from dflash_jax.progress import progress

    target_cfg, drafter_cfg = engine_model_configs(shape)
    rows = []
    for mode, dcfg in (("ar", None), ("dflash", drafter_cfg)):
        calls = engine_calls(engine_programs(target_cfg, dcfg, batch=batch, prompt_len=prompt_len,
                                             cache_len=cache_len, dtype=dtype))
        with progress(total=len(calls) * len(gpus), desc=f"engine {mode}", unit="kernel") as bar:
            for row in engine_rows(calls, gpus, bar):
                rows.append({"mode": mode, **row})
    return rows


HYBRID_ROLLBACKS = ("snapshot", "replay")


def hybrid_engine_configs(name: str, rollback: str, gdn_impl: str = "xla"):
    """(target, drafter) of the hybrid model ``name`` (``--hybrid-target``) with ``gdn_rollback``
    ``rollback`` and ``gdn_impl``."""
    from dflash_jax.tools import gdn_rollback, roofline_hybrid

    if name == "tiny":
        target = dataclasses.replace(gdn_rollback.tiny_hybrid_config(rollback), gdn_impl=gdn_impl)
        return target, DrafterConfig.for_target(target, 1, 8, target.vocab_size - 1)
    if name not in roofline_hybrid.MODELS:
        raise ValueError(f"--hybrid-target {name!r}: choose one of tiny, {', '.join(roofline_hybrid.MODELS)}")
    target = dataclasses.replace(TargetConfig.from_hf_dict(roofline_hybrid.MODELS[name]), gdn_rollback=rollback,
                                 gdn_impl=gdn_impl)
    return target, DrafterConfig(**roofline_hybrid.DRAFTERS[name])


def run_hybrid_engine(name: str, gpus: Sequence[GpuSpec], *, batch: int, prompt_len: int,
                      cache_len: int, dtype, gdn_impl: str = "xla") -> list[dict]:
    """AR and DFlash engines of the hybrid model ``name`` lowered for CUDA, DFlash once per
    rollback mode; every Triton kernel compiled for every GPU (with ``gdn_impl="pallas"`` the
    GDN layers' kernels too). Each row also gives its program's lowered size (StableHLO
    characters) and mode (``ar``, ``dflash snapshot``, ...)."""
    from dflash_jax.progress import progress

    rows = []
    for mode in ("ar",) + tuple(f"dflash {r}" for r in HYBRID_ROLLBACKS):
        target, drafter = hybrid_engine_configs(name, mode.split()[-1] if mode != "ar" else "replay", gdn_impl)
        programs = engine_programs(target, None if mode == "ar" else drafter, batch=batch,
                                   prompt_len=prompt_len, cache_len=cache_len, dtype=dtype)
        sizes = {stage: len(lowered.as_text()) for stage, lowered in programs.items()}
        calls = engine_calls(programs)
        with progress(total=len(calls) * len(gpus), desc=f"hybrid engine {mode}", unit="kernel") as bar:
            for row in engine_rows(calls, gpus, bar):
                rows.append({"mode": mode, "lowered_chars": sizes[row["stage"]], **row})
    return rows


def engine_model_configs(shape: ModelShape):
    """A Qwen3 target with ``shape``'s attention (8B-sized MLP and vocabulary) and its drafter."""
    target = TargetConfig(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                          intermediate_size=12288, num_layers=shape.num_layers,
                          num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                          head_dim=shape.head_dim, max_position_embeddings=40960)
    drafter = DrafterConfig.for_target(target, shape.drafter_layers, shape.block_size,
                                       target.vocab_size - 1)
    return target, drafter


def add_arguments(p) -> None:
    p.add_argument("--model", default="qwen3-8b",
                   help=f"a named shape ({', '.join(NAMED_SHAPES)}) or a Hugging Face model directory")
    p.add_argument("--block-size", type=int, default=None,
                   help="DFlash block size (default: the named shape's, 16 for a directory)")
    p.add_argument("--drafter-layers", type=int, default=5, help="layers of the drafter")
    p.add_argument("--seq", type=int, nargs="+", default=[1024, 4096, 16384, 32768],
                   help="cache lengths S")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes to compile for")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="compute dtype of the kernels (and of the models with --engine)")
    p.add_argument("--gpus", nargs="+", default=list(GPUS), choices=list(GPUS), help="GPUs to compile for")
    p.add_argument("--search", action="store_true",
                   help="also compile every tile/warp/stage candidate (at the largest S and batch)")
    p.add_argument("--engine", action="store_true",
                   help="instead: lower AR and DFlash generate for CUDA and compile every kernel")
    p.add_argument("--prompt-len", type=int, default=16, help="--engine: prompt tokens (the prefill's width)")
    p.add_argument("--tree", type=int, nargs="+", default=[], metavar="N",
                   help="also the verify of a tree of N draft nodes (the target's layers; Pallas only)")
    p.add_argument("--impl", default="pallas", choices=["pallas", "triton"],
                   help="block-attention kernel implementation of the before/after tables: the Pallas "
                        "one, or the Triton-language one (kernels/triton_block_attention.py; not with --search, "
                        "--engine)")
    p.add_argument("--hybrid-target", metavar="MODEL",
                   help="with --engine: a hybrid (GDN) Qwen3.5 target instead (qwen3.5-4b, qwen3.5-27b, "
                        "tiny), AR and DFlash with each GDN rollback mode")
    p.add_argument("--gdn-impl", default="xla", choices=["xla", "pallas"],
                   help="with --hybrid-target: the GDN layers' chunked form in XLA, or as the Pallas kernels "
                        "of kernels/gdn_chunk.py (compiled per architecture like the attention kernels)")
    p.add_argument("--out", default="results/gpu_compile", help="output directory")


def run(args) -> dict:
    for name, values in (("--seq", args.seq), ("--batch", args.batch)):
        if min(values) < 1:
            raise ValueError(f"{name} values must be >= 1, got {values}")
    if args.impl != "pallas" and (args.search or args.engine):
        raise ValueError("--search and --engine compile the Pallas kernel; drop --impl triton")
    if args.hybrid_target and not args.engine:
        raise ValueError("--hybrid-target lowers the engine: add --engine")
    if args.gdn_impl != "xla" and not args.hybrid_target:
        raise ValueError("--gdn-impl chooses a hybrid target's GDN implementation: add --engine --hybrid-target MODEL")
    if args.tree and (args.impl != "pallas" or args.engine):
        raise ValueError("--tree adds tree-verify rows to the Pallas kernel's tables: drop "
                         "--impl triton / --engine")
    shape = model_shape(args.model, args.block_size, args.drafter_layers)
    if args.hybrid_target:
        shape = dataclasses.replace(shape, name=f"hybrid-{args.hybrid_target}")
    gpus = [GPUS[g] for g in args.gpus]
    stem = re.sub(r"[^a-z0-9.]+", "-", shape.name.lower())
    base = {"model": dataclasses.asdict(shape), "dtype": args.dtype, "impl": args.impl,
            "gpus": [dataclasses.asdict(g) for g in gpus], "env": _environment(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command_line("dflash_jax", invocation(args))}
    if args.engine:
        return _engine_report(args, shape, gpus, stem, base)
    configs = engine_configs(shape, args.seq, args.batch, args.dtype, args.tree)
    report = dict(base, benchmark="gpu_compile",
                  before_after=run_before_after(configs, gpus, args.impl))
    if args.search:
        report["search"] = _search(configs, gpus)
    prefix = "" if args.impl == "pallas" else f"{args.impl}_"
    path = write_report(report, args.out, prefix + stem, plot_before_after)
    write_text(path + ".md", _before_after_markdown(report, shape, gpus))
    _print_flags([p["after"] for p in report["before_after"]], "after tuning")
    return report


def _search(configs: Sequence[KernelConfig], gpus: Sequence[GpuSpec]) -> list[dict]:
    from dflash_jax.progress import progress

    largest = {}
    for cfg in configs:  # per kind: the largest batch and cache (the widest offsets, most work)
        if cfg.kind not in largest or (cfg.batch, cfg.seq) > (largest[cfg.kind].batch, largest[cfg.kind].seq):
            largest[cfg.kind] = cfg
    archs = {g.arch: g for g in gpus}  # the compile depends on the architecture only
    n = len(largest) * len(archs) * len(SEARCH_SPACE["block_k"]) * len(SEARCH_SPACE["num_warps"]) \
        * len(SEARCH_SPACE["num_stages"])
    rows = []
    with progress(total=n, desc="tile search", unit="kernel") as bar:
        for cfg in largest.values():
            for gpu in archs.values():
                rows += search_tiles(cfg, gpu, bar)
    return rows


def _engine_report(args, shape: ModelShape, gpus, stem: str, base: dict) -> dict:
    cache_len = max(args.seq)
    run = (functools.partial(run_hybrid_engine, args.hybrid_target, gdn_impl=args.gdn_impl) if args.hybrid_target
           else functools.partial(run_engine, shape))
    rows = run(gpus, batch=max(args.batch), prompt_len=args.prompt_len, cache_len=cache_len,
               dtype=jnp.dtype(args.dtype))
    report = dict(base, benchmark="gpu_compile_engine", rows=rows, prompt_len=args.prompt_len,
                  cache_len=cache_len, batch=max(args.batch),
                  title=f"{shape.name} engine, batch {max(args.batch)}, cache {cache_len}")
    path = write_report(report, args.out, f"engine_{stem}", plot_rows)
    cols = (("mode", "{}"), ("stage", "{}"), ("kernel_name", "{}"), ("rows", "{}"), ("num_layers", "{}"), ("seq", "{}"),
            ("has_block", "{}"), ("gpu", "{}"), ("grid", "{}"), ("registers", "{}"),
            ("spill_bytes", "{}"), ("shared_kib", "{:.0f}"), ("programs", "{}"),
            ("blocks_per_sm", "{}"), ("flags", "{}"))
    table = [dict(r, kind=r["stage"], num_queries="", block_k="", num_splits="") for r in rows]
    text = "\n".join([
        f"# {report['title']}: the engine lowered for CUDA", "",
        f"`{report['command']}` ({report['time']}, jax {report['env']['jax']}, "
        f"triton {report['env'].get('triton')}).", "",
        "Every Triton kernel in AR and DFlash `generate(..., attention_impl=\"pallas\")` "
        "(prefill and the decode loop), compiled per architecture:", "",
        markdown_table(table, cols), "", sources_markdown(gpus), ""])
    write_text(path + ".md", text)
    _print_flags(rows, "engine")
    return report


def _before_after_markdown(report: dict, shape: ModelShape, gpus) -> str:
    kernel = {"pallas": "the block-attention kernel (Pallas)",
              "triton": "the Triton-language block-attention kernel "
                        "(`kernels/triton_block_attention.py`)"}[report.get("impl", "pallas")]
    parts = [f"# {shape.name}: {kernel} compiled for NVIDIA GPUs", "",
             f"`{report['command']}` ({report['time']}, jax {report['env']['jax']}, "
             f"triton {report['env'].get('triton')}, compiled on {report['env']['host']} without a GPU).",
             "", "Launch = block_k / num_splits / num_warps / num_stages. *bound*: every byte the "
             "call moves (K/V, q, partials written and read back by the combine step, output) at "
             "the HBM bandwidth. *modeled*: the busiest SM's bytes at its 1/SMs share of that "
             "bandwidth (`kernels/tuning.py`, what the tuner minimises). Flags: spills, limits, "
             "traps, fewer programs than half the SMs.", ""]
    for gpu in gpus:
        pairs = [(p["before"], p["after"]) for p in report["before_after"] if p["after"]["gpu"] == gpu.name]
        parts += [f"## {gpu.name} ({gpu.arch}, {gpu.num_sms} SMs, {gpu.hbm_bytes_per_s / 1e12:g} TB/s)",
                  "", before_after_table(pairs), ""]
    if report.get("search"):
        parts += ["## Tile search (largest batch and cache per kind)", "",
                  markdown_table([dict(r, flags=r["flags"] + (["chosen"] if r["chosen"] else []))
                                  for r in report["search"]]), ""]
    parts += [sources_markdown(gpus), ""]
    return "\n".join(parts)


def _print_flags(rows: Sequence[dict], what: str) -> None:
    flagged = [r for r in rows if r["flags"]]
    print(f"{what}: {len(flagged)} of {len(rows)} kernel launches flagged")
    for r in flagged:
        name = r.get("stage") or r.get("kind")
        print(f"  {r['gpu']} {name} rows={r['rows']} S={r['seq']} B={r['batch']}: {'; '.join(r['flags'])}")


def _environment() -> dict:
    env = environment()
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def main(argv=None) -> dict:
    return command_main("gpu-compile", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
