"""The block-attention kernel compiled for NVIDIA GPUs without one (Triton's compiler and the
ptxas it ships, for sm_90a and sm_100a), the per-shape launch choice of kernels/tuning.py, and
the whole engine lowered for CUDA on the CPU (``python -m dflash_jax.tools.gpu_compile``)."""

import json

import jax
import jax.numpy as jnp
import pytest

from dflash_jax.tools import gpu_compile as gc
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.kernels import tuning
from dflash_jax.kernels.block_attention import block_attention

H100, B200 = gc.GPUS["h100"], gc.GPUS["b200"]
QWEN = gc.model_shape("qwen3-8b")


# ---------------------------------------------------------------------------- part 1
@pytest.mark.slow
def test_cli_compiles_every_engine_kernel_before_and_after_tuning(tmp_path):
    """Qwen3-8B at S = 4096, batch 1: verify, draft and decode, legacy and tuned launches, on
    both architectures. The legacy grid (8 KV heads x 8 splits = 64 programs) leaves most SMs
    idle and is flagged; the tuned one fills the device and nothing spills or exceeds a limit."""
    report = gc.main(["--model", "Qwen3-8B", "--seq", "4096", "--batch", "1", "--gpus", "h100", "b200",
                      "--out", str(tmp_path)])
    pairs = report["before_after"]
    assert {(p["after"]["kind"], p["after"]["arch"]) for p in pairs} == {
        (k, a) for k in ("verify", "draft", "decode") for a in ("sm_90a", "sm_100a")}
    for p in pairs:
        before, after = p["before"], p["after"]
        assert before["programs"] == 64 and before["grid"] == [1, 8, 8]
        assert any("most SMs idle" in f for f in before["flags"]), before["flags"]
        assert after["flags"] == [], after
        assert after["programs"] >= after["num_sms"] * 0.85 and after["waves"] == 1
        assert 0 < after["registers"] <= 255 and after["spill_bytes"] == 0
        assert 0 < after["shared_kib"] <= 227 and after["blocks_per_sm"] >= 1
        assert after["modeled_us"] < before["modeled_us"]
        # the grid in the lowered custom call is the tuner's (B, Hkv, splits)
        assert after["grid"] == [1, 8, after["num_splits"]]
    # the 16-query tiles (T = 16 x 4 heads per KV head = 64 rows) need many more registers
    # than decode's 16 rows; sm_100a gives them tensor memory
    regs = {(p["after"]["kind"], p["after"]["arch"]): p["after"]["registers"] for p in pairs}
    assert regs[("verify", "sm_90a")] > 1.5 * regs[("decode", "sm_90a")]
    assert all(p["after"]["tmem_columns"] > 0 for p in pairs
               if p["after"]["arch"] == "sm_100a" and p["after"]["kind"] != "decode")
    saved = json.loads((tmp_path / "qwen3-8b.json").read_text())
    assert saved["before_after"] == pairs and saved["env"]["triton"] == "3.9.0"
    md = (tmp_path / "qwen3-8b.md").read_text()
    assert "## B200 (sm_100a, 148 SMs, 8 TB/s)" in md and "verify T=16 B=1 S=4096" in md
    assert (tmp_path / "qwen3-8b.png").stat().st_size > 0


@pytest.mark.slow
def test_cli_reports_the_triton_kernel_before_and_after_tuning(tmp_path):
    """--impl triton: the Triton-language kernel compiled from its source with the legacy launch
    and plan_launch's tuned defaults, in the same columns under its own file stem. The drafter's
    grid has one extra program per KV head (its block rows); the legacy grids of 64 programs
    are flagged, the tuned ones fill the SMs without flags, and the bytes model leaves the block rows out of the cache programs."""
    report = gc.main(["--model", "qwen3-8b", "--seq", "4096", "--batch", "1", "--gpus", "h100",
                      "--impl", "triton", "--out", str(tmp_path)])
    assert report["impl"] == "triton"
    pairs = report["before_after"]
    assert [p["after"]["kind"] for p in pairs] == ["verify", "draft", "decode"]
    for p in pairs:
        before, after = p["before"], p["after"]
        extra = after["kind"] == "draft"
        assert before["grid"] == [1, 8, 8 + extra] and after["grid"] == [1, 8, 16 + extra]
        # 64 programs are under half the SMs; the drafter's 72 are not
        assert bool(before["flags"]) != extra and after["flags"] == [], (before, after)
        assert (after["block_k"], after["num_warps"], after["num_stages"]) == (64, 4, 2)
        assert after["spill_bytes"] == 0 and after["blocks_per_sm"] >= 2
        assert after["modeled_us"] < before["modeled_us"]
    verify, draft = pairs[0]["after"], pairs[1]["after"]
    assert verify["read_kib_per_program"] == draft["read_kib_per_program"]  # no block rows
    assert draft["total_mib"] > verify["total_mib"]  # ... but the block's programs move bytes
    md = (tmp_path / "triton_qwen3-8b.md").read_text()
    assert "Triton-language block-attention kernel" in md and "draft T=16 B=1 S=4096" in md
    assert (tmp_path / "triton_qwen3-8b.json").exists() and not (tmp_path / "qwen3-8b.json").exists()
    with pytest.raises(ValueError, match="--impl triton"):
        gc.main(["--impl", "triton", "--engine", "--out", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.triton  # compiles the kernels' Triton IR with Triton's compiler
def test_wide_cache_offsets_compile_on_both_architectures():
    """The drafter at batch 8 over a 32k cache and Llama-3.1-8B's verify (T = 10) over 16k:
    the tuned launches compile without spills, traps or an idle device on both architectures."""
    llama = gc.model_shape("llama-3.1-8b")
    configs = [gc.KernelConfig("draft", 8, 32768, 16, 32, 8, 128, QWEN.drafter_layers),
               gc.KernelConfig("verify", 1, 16384, llama.block_size, 32, 8, 128, llama.num_layers)]
    for cfg in configs:
        for gpu in (H100, B200):
            row = gc.compile_config(cfg, gc.tuned_launch(cfg, gpu), gpu)
            assert row["flags"] == [], (cfg.label, gpu.name, row)
            assert row["programs"] >= gpu.num_sms // 2


@pytest.mark.triton  # compiles the kernels' Triton IR with Triton's compiler
def test_tree_verify_kernel_compiles_for_sm_90a(tmp_path):
    """Tree verify of 32 nodes on Qwen3-8B's shapes (4 query heads per KV head: two query chunks
    of 16 nodes, one kernel): the Pallas kernel with the ancestor mask lowers for CUDA with the
    mask as its 8th operand (folded to 64 rows x 32 block rows) and compiles for sm_90a without
    spills, traps or limits exceeded, in the tuner's grid."""
    cfg = gc.tree_config(QWEN, 32, 1, 4096)
    assert (cfg.num_queries, cfg.block_rows, cfg.causal) == (16, 32, False)
    launch = gc.tuned_launch(cfg, H100)
    [call] = gc.triton_calls(gc.lower_kernel(cfg, launch))
    shape = gc.attention_call_shape(call)
    assert shape["has_mask"] and shape["block_rows"] == 32 and shape["rows"] == 64
    assert call.operand_shapes[7] == (1, 64, 32) and call.operand_dtypes[7] == "i8"
    row = gc.compile_config(cfg, launch, H100)
    assert row["flags"] == [] and row["spill_bytes"] == 0 and 0 < row["registers"] <= 255, row
    assert row["grid"] == [1, 8, launch.num_splits] and row["nodes"] == 32
    with pytest.raises(ValueError, match="--tree"):
        gc.main(["--tree", "16", "--impl", "triton", "--out", str(tmp_path)])


def test_flags_and_occupancy_follow_the_cuda_rules():
    """Hand-computed: 240 registers x 128 threads (7680 per warp, 8 warps per SM by registers)
    and 112 KiB shared memory (228 // 113) give 2 blocks per SM; 255 registers with 8 warps
    (8192 per warp) give 1; a kernel needing 230 KiB fits nowhere and is flagged; a ptxas -v
    log is read field by field."""
    kernel = gc.CompiledKernel("sm_90a", 240, 0, 0, 0, 1, 112 * 1024, 0, 4, 3, 0)
    occ = gc.occupancy(H100, kernel)
    assert occ["blocks_per_sm"] == 2 and occ["blocks_by_registers"] == 2
    assert gc.occupancy(H100, gc.CompiledKernel("sm_90a", 255, 0, 0, 0, 1, 0, 0, 8, 2, 0))[
        "blocks_per_sm"] == 1
    # 170 registers: 5440 per warp, allocated as 5632 (22 x 256): 11 warps, 2 blocks of 4
    assert gc.occupancy(H100, gc.CompiledKernel("sm_90a", 170, 0, 0, 0, 1, 0, 0, 4, 2, 0))[
        "blocks_by_registers"] == 2
    big = gc.CompiledKernel("sm_90a", 255, 96, 64, 160, 1, 230 * 1024, 0, 4, 2, 1)
    row = gc.kernel_row(H100, big, grid=(1, 8, 4), read_per_program=1 << 20,
                        written_per_program=1 << 10, total_bytes=32 << 20)
    assert row["flags"] == ["spills 160 B", "shared memory over the per-block limit",
                            "no block fits on an SM", "kernel compiled to a trap",
                            "most SMs idle (32/132)"]
    assert row["bound_us"] == pytest.approx(1e6 * (32 << 20) / 3.35e12)
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Function "
           "properties for k\n    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers\n")
    assert gc.parse_ptxas_log(log) == {"registers": 255, "spill_stores": 12, "spill_loads": 4,
                                       "stack_frame": 8, "barriers": 1}


@pytest.mark.parametrize("num_sms", [132, 148])
def test_tuner_fills_the_device_and_keeps_explicit_arguments(num_sms):
    for T, G, batch, seq in [(16, 4, 1, 1024), (16, 4, 1, 4096), (1, 4, 1, 32768), (16, 4, 8, 16384),
                             (10, 4, 8, 4096), (1, 4, 8, 1024)]:
        kw = dict(batch=batch, seq=seq, kv_heads=8, num_queries=T, group=G, head_dim=128, itemsize=2)
        launch = tuning.choose_launch(**kw, num_sms=num_sms)
        splits, _ = tuning.split_layout(seq, launch.block_k, launch.num_splits)
        assert seq % launch.block_k == 0 and splits == launch.num_splits
        assert batch * 8 * splits >= num_sms * 0.85  # at least ~one full wave
        rows = tuning.folded_rows(T, G)
        cost = lambda s: tuning.modeled_cost(batch=batch, kv_heads=8, seq=seq, rows=rows,
                                             head_dim=128, itemsize=2, block_k=launch.block_k,
                                             num_splits=s, num_sms=num_sms)
        # within the tuner's tolerance of every other count tried (legacy: seq // 512)
        assert cost(splits) <= (1 + tuning.COST_TOLERANCE) * min(
            cost(s) for s in (1, 2, 4, 8, 16, 64, seq // 512))
    explicit = tuning.choose_launch(batch=1, seq=4096, kv_heads=8, num_queries=16, group=4,
                                    head_dim=128, itemsize=2, block_k=32, num_splits=3,
                                    num_warps=8, num_stages=1)
    assert explicit == tuning.LaunchParams(32, 3, 8, 1)
    assert tuning.fitting_block_k(4160, 64) == 64 and tuning.fitting_block_k(4128, 64) == 32
    with pytest.raises(ValueError, match="seq must be >= 1"):
        tuning.choose_launch(batch=1, seq=0, kv_heads=8, num_queries=1, group=4, head_dim=128,
                             itemsize=2)


def test_kernel_defaults_come_from_the_tuner():
    """block_attention with no launch arguments, lowered for CUDA on this CPU host, launches what
    kernels/tuning.py chooses for an H100-sized device; explicit arguments still win."""
    cfg = gc.KernelConfig("verify", 1, 4096, 16, 32, 8, 128, 36)
    expected = tuning.choose_launch(batch=1, seq=4096, kv_heads=8, num_queries=16, group=4,
                                    head_dim=128, itemsize=2, num_sms=tuning.DEFAULT_NUM_SMS)

    def lower(**launch):
        fn = lambda q, k, v, lens, layer: block_attention(q, k, v, lens, causal=True, layer=layer,
                                                          **launch)
        [call] = gc.triton_calls(gc.lower_for_cuda(lambda: jax.jit(fn).trace(*gc.abstract_inputs(cfg))))
        return call

    call = lower()
    assert call.grid == (1, 8, expected.num_splits) and expected.num_splits == 16
    assert (call.num_warps, call.num_stages) == (expected.num_warps, expected.num_stages)
    call = lower(num_splits=5, num_warps=8, num_stages=3)
    assert call.grid == (1, 8, 5) and (call.num_warps, call.num_stages) == (8, 3)


# ---------------------------------------------------------------------------- part 2
SMALL = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=128, intermediate_size=256,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                     max_position_embeddings=1024)


def _engine_calls(target_cfg, drafter_cfg, cache_len):
    programs = gc.engine_programs(target_cfg, drafter_cfg, batch=2, prompt_len=16,
                                  cache_len=cache_len, dtype=jnp.bfloat16)
    return [(stage, gc.attention_call_shape(call), call) for stage, call in gc.engine_calls(programs)]


def _kinds(calls):
    """(stage, folded rows, cache layers, drafter mode) of every kernel in the programs."""
    return sorted((stage, s["rows"], s["num_layers"], s["has_block"]) for stage, s, _ in calls)


@pytest.mark.triton  # compiles the kernels' Triton IR with Triton's compiler
def test_small_engine_lowers_for_cuda_and_every_kernel_compiles():
    """AR and DFlash generate (prefill + decode loop, attention_impl="pallas") of a small model,
    lowered for CUDA with abstract parameters; every Triton kernel compiles for sm_90a and
    sm_100a without spills, traps or limits exceeded (a small model leaves SMs idle)."""
    drafter = DrafterConfig.for_target(SMALL, 1, 8, SMALL.vocab_size - 1)
    ar = _engine_calls(SMALL, None, 128)
    dflash = _engine_calls(SMALL, drafter, 128)
    # prefill: 16 prompt rows x 2 heads per KV head = 32 rows; decode: T = 1 (16 rows, padded);
    # DFlash: the drafter (1 layer, its own block rows) and the target's 8-row verify
    assert _kinds(ar) == [("decode", 16, 2, False), ("prefill", 32, 2, False)]
    assert _kinds(dflash) == [("decode", 16, 1, True), ("decode", 16, 2, False),
                              ("prefill", 32, 2, False)]
    assert all(s["seq"] == 128 and s["batch"] == 2 for _, s, _ in ar + dflash)
    rows = gc.engine_rows([(stage, call) for stage, _, call in ar + dflash], [H100, B200])
    assert len(rows) == 10
    for row in rows:
        problems = [f for f in row["flags"] if not f.startswith("most SMs idle")]
        assert problems == [] and 0 < row["registers"] <= 255, row


def test_8b_engine_lowers_for_cuda():
    """The same for a Qwen3-8B-shaped target and a 5-layer drafter (lowering only): no memory
    is allocated, and the kernels have the engine's shapes and the tuner's grids."""
    target, drafter = gc.engine_model_configs(QWEN)
    dflash = _engine_calls(target, drafter, 4096)
    assert _kinds(dflash) == [("decode", 64, 5, True), ("decode", 64, 36, False),
                              ("prefill", 64, 36, False)]
    ar = _engine_calls(target, None, 4096)
    assert _kinds(ar) == [("decode", 16, 36, False), ("prefill", 64, 36, False)]
    for _, shape, call in ar + dflash:
        assert shape["seq"] == 4096 and shape["head_dim"] == 128 and shape["itemsize"] == 2
        assert call.grid[:2] == (2, 8) and call.programs >= tuning.DEFAULT_NUM_SMS * 0.85
