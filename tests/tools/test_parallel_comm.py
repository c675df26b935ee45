"""The tensor-parallel communication model (``dflash_jax.tools.parallel_comm``): collective
counts and bytes against hand-computed values for a tiny config, no communication at TP 1,
the comm share growing with TP, the memory per device, and the command's files."""

import json

import pytest

from dflash_jax.tools import parallel_comm as pc
from dflash_jax.tools import roofline
from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig

# D 8, 2 layers, 2 heads / 2 KV heads of 4, F 16, vocab 32; a 1-layer drafter (1 tap), block 4
TINY = TargetConfig(model_type="qwen3", vocab_size=32, hidden_size=8, intermediate_size=16,
                    num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4)
TINY_DRAFTER = DrafterConfig.for_target(TINY, num_layers=1, block_size=4, mask_token_id=1)


def test_ar_step_bytes_by_hand():
    """TP 2, one row, bf16: 2 psums per layer * 2 layers + the embedding's = 5 all-reduces of
    1 * 8 * 2 = 16 B; the argmax all-gathers one 8-byte (max, index) pair per device."""
    c = pc.comm_totals(pc.ar_step_collectives(TINY, 2), 2, link_bandwidth=1.0, latency=0.0)
    assert (c["collectives"], c["allreduces"]) == (6, 5)
    assert c["allreduce_bytes"] == 5 * 16 and c["allgather_bytes"] == 2 * 8
    # ring: each all-reduce sends 2 (p - 1) / p = 1 x its bytes, the all-gather (p - 1) / p
    assert c["link_bytes"] == 80 + 8
    # 1 byte/s and no latency: the link bytes in seconds; with latency L, 6 L more
    assert c["seconds"] == 88
    with_latency = pc.comm_totals(pc.ar_step_collectives(TINY, 2), 2, 1.0, latency=0.5)
    assert with_latency["seconds"] == 88 + 6 * 0.5
    # batch 3: three times the bytes, the same number of collectives
    b3 = pc.comm_totals(pc.ar_step_collectives(TINY, 2, batch=3), 2, 1.0, 0.0)
    assert (b3["collectives"], b3["allreduce_bytes"], b3["allgather_bytes"]) == (6, 240, 48)


def test_iteration_bytes_by_hand():
    """Block 4 at TP 2: the drafter's 2 * 1 + 1 and the target's 2 * 2 + 1 all-reduces of
    4 * 8 * 2 = 64 B; argmax all-gathers on 3 draft rows and 4 verified rows."""
    c = pc.comm_totals(pc.iteration_collectives(TINY, TINY_DRAFTER, 4, 2), 2, 1.0, 0.0)
    assert c["collectives"] == 2 * 1 + 2 * 2 + 4 == 10
    assert c["allreduces"] == 8 and c["allreduce_bytes"] == 8 * 64
    assert c["allgather_bytes"] == (3 + 4) * 2 * 8
    # TP 4 on a model with 4 KV heads: ring factors 2 * 3 / 4 and 3 / 4; TINY refuses it
    wide = TargetConfig(model_type="llama", vocab_size=32, hidden_size=8, intermediate_size=16,
                        num_layers=2, num_heads=4, num_kv_heads=4, head_dim=2)
    c4 = pc.comm_totals(pc.ar_step_collectives(wide, 4), 4, 1.0, 0.0)
    assert c4["allgather_bytes"] == 4 * 8  # one pair per device
    assert c4["link_bytes"] == pytest.approx(5 * 16 * 1.5 + 32 * 0.75)
    with pytest.raises(ValueError, match="must divide num_key_value_heads"):
        pc.shard(TINY, 4)


def test_tp1_has_no_communication_and_is_the_roofline():
    assert pc.ar_step_collectives(TINY, 1) == []
    assert pc.iteration_collectives(TINY, TINY_DRAFTER, 4, 1) == []
    target, drafter = pc.pair("qwen3-8b")
    r = pc.analyse_mesh(target, drafter, "h200", 1, 1, block_size=16, context=1024,
                        budget_context=8192, latency=8e-6, tau=6.49)
    assert r["ar_step"]["comm_us"] == r["iteration"]["comm_us"] == 0
    assert r["ar_step"]["comm_share"] == r["iteration"]["comm_share"] == 0
    assert r["ar_step"]["link_bytes"] == r["iteration"]["allreduce_bytes"] == 0
    times = roofline.step_times(target, drafter, 16, 1024, roofline.DEVICES["h200"])
    assert r["iteration"]["total_us"] == pytest.approx(1e6 * times["t_iter_s"])
    assert r["speedup"] == pytest.approx(6.49 / times["ratio"])


def test_sharded_roofline_divides_the_sharded_parts():
    """At TP 2 the layers' matrices, the KV heads and the LM head are halved on each device;
    norms stay whole."""
    half = pc.shard(TINY, 2)
    assert (half.num_heads, half.num_kv_heads, half.intermediate_size, half.vocab_size) == (1, 1, 8, 16)
    full, part = roofline.ar_step(TINY, 10), roofline.ar_step(half, 10)
    # layers: matrices 640 -> 320 per layer, vectors 2 * 8 + 2 * 4 = 24 kept; bf16
    assert part[0].weights == 2 * (320 + 24) * 2 and full[0].weights == 2 * (640 + 24) * 2
    assert part[1].kv_read == full[1].kv_read / 2 and part[1].flops == full[1].flops / 2
    assert part[2].weights == (16 * 8 + 8) * 2 and part[2].flops == full[2].flops / 2


def test_memory_per_device_by_hand():
    one = pc.memory_per_device(TINY, TINY_DRAFTER, 1, batch=1, context=10)
    assert one["weights"] == 2 * (TINY.num_params() + roofline._drafter_params(TINY_DRAFTER))
    two = pc.memory_per_device(TINY, TINY_DRAFTER, 2, batch=1, context=10)
    # target: 2 layers * (320 + 24) + 2 tables * 16 * 8 + 8 = 952; drafter: fc 1 * 8 * 8 (whole)
    # + hidden_norm and norm 16 + one layer 344 = 424; bf16
    assert two["weights"] == 2 * (952 + 424)
    # K and V, 2 + 1 layers, 1 KV head of 4 per device, bf16, 10 positions
    assert two["kv"] == 2 * 3 * 1 * 4 * 2 * 10 and two["total"] == two["weights"] + two["kv"]


@pytest.mark.parametrize("name", list(pc.MODELS))
@pytest.mark.parametrize("batch", [1, 8])
def test_comm_share_grows_with_tp(name, batch):
    target, drafter = pc.pair(name)
    for device in pc.NODES:
        rows = [pc.analyse_mesh(target, drafter, device, p, batch, block_size=16, context=1024,
                                budget_context=8192, latency=8e-6, tau=6.49) for p in (1, 2, 4, 8)]
        for step in ("ar_step", "iteration"):
            shares = [r[step]["comm_share"] for r in rows]
            assert shares[0] == 0 and all(a < b for a, b in zip(shares, shares[1:])), (device, step)
            # and the iteration itself gets faster: communication never cancels the sharding
            times = [r[step]["total_us"] for r in rows]
            assert all(a > b for a, b in zip(times, times[1:])), (device, step)


def test_recommendation():
    target, drafter = pc.pair("llama-3.3-70b")
    rows = [pc.analyse_mesh(target, drafter, "h100", p, 1, block_size=16, context=1024,
                            budget_context=8192, latency=8e-6, tau=6.49) for p in (1, 2, 4, 8)]
    # 141 GB of bf16 weights: neither 1 nor 2 H100s (72 GB usable each) hold them
    assert [r["fits"] for r in rows] == [False, False, True, True]
    rec = pc.recommend(rows)
    assert rec["min_tp"] == 4 and rec["fastest_tp"] == 8 and set(rec["iteration_us"]) == {"4", "8"}
    assert rec["efficiency"]["4"] == 1.0
    assert pc.recommend([dict(rows[0])])["min_tp"] is None


def test_command_writes_its_files_into_out(tmp_path):
    out = tmp_path / "out"
    report = pc.main(["--models", "qwen3-8b", "--devices", "h200", "b200", "--tp", "1", "2",
                      "--batch", "1", "4", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["comm.json", "comm.md"]
    saved = json.loads((out / "comm.json").read_text())
    assert saved["computed_on_paper"] is True
    assert saved["command"].startswith("python -m dflash_jax.tools.parallel_comm --models")
    assert len(saved["analysis"]["rows"]) == len(report["analysis"]["rows"]) == 2 * 2 * 2
    md = (out / "comm.md").read_text()
    assert "### Batch 4" in md and "Recommended model-axis size" in md and "Sensitivity" in md
    with pytest.raises(ValueError, match="--tp 3 for qwen3-8b"):
        pc.main(["--tp", "3", "--out", str(out)])
