"""``tools/roofline_quantized.py``: the quantized rows against the bf16 ones recomputed from the
target family's own parameter counts (the layers' matrices at 1 byte instead of 2, nothing else
changed), the bf16 rows against the dense roofline's own step times, memory against device
capacity."""

import json

import pytest

from dflash_jax.config import TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.targets import family_of
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_quantized as rq


@pytest.fixture(scope="module")
def rows():
    return {(r["model"], r["device"], r["format"]): r for r in rq.analyse()}


def test_qwen3_8b_fp8_saves_exactly_the_layer_matrices_half_bytes(rows):
    target = TargetConfig(**dense.PRESETS["qwen3-8b"])
    fam = family_of(target)
    layer_bytes = target.num_layers * fam.layer_matrix_params(target) * 2.0  # bf16 layer matrices
    for device in rq.DEVICES:
        dev = dense.DEVICES[device]
        bf16, fp8 = rows[("qwen3-8b", device, "bf16")], rows[("qwen3-8b", device, "fp8")]
        drafter = DrafterConfig.for_target(target, 5, block_size=16, mask_token_id=dense.QWEN3_MASK_TOKEN_ID)
        t = dense.step_times(target, drafter, 16, rq.CONTEXT, dev)
        assert bf16["t_ar_us"] == pytest.approx(1e6 * t["t_ar_s"]) and bf16["ratio"] == pytest.approx(t["ratio"])
        # an AR step of Qwen3-8B is memory-bound: it saves half the layer matrices' bytes (their
        # norm vectors too: under 0.01 %), in the AR step and in the verify alike
        saved_us = 1e6 * layer_bytes / 2 / dev.bandwidth
        assert bf16["t_ar_us"] - fp8["t_ar_us"] == pytest.approx(saved_us, rel=1e-3)
        assert bf16["t_iter_us"] - fp8["t_iter_us"] == pytest.approx(saved_us, rel=1e-3)
        assert fp8["speedup"] < bf16["speedup"] and fp8["tau_for_bf16_speedup"] > bf16["tau"]
        assert fp8["speedup"] == pytest.approx(fp8["tau"] / fp8["ratio"])
        assert fp8["weights_gb"] == pytest.approx((fam.num_params(target) * 2 - layer_bytes / 2) / 1e9, rel=1e-4)


def test_memory_decides_what_fits_one_device(rows):
    assert rows[("qwen3-8b", "h100", "fp8")]["fits"]
    oss = {f: rows[("gpt-oss-120b", "h100", f)] for f in ("bf16", "fp8", "mxfp4 experts")}
    assert [oss[f]["fits"] for f in oss] == [False, False, True]  # 234 GB, 118 GB, 65 GB on 80 GB
    assert rows[("gpt-oss-120b", "b200", "fp8")]["fits"]
    assert oss["mxfp4 experts"]["weights_gb"] < oss["fp8"]["weights_gb"] < oss["bf16"]["weights_gb"]
    for model in ("qwen3.5-27b", "gpt-oss-120b"):
        for device in rq.DEVICES:
            assert rows[(model, device, "fp8")]["t_ar_us"] < rows[(model, device, "bf16")]["t_ar_us"]


def test_the_command_writes_its_report(tmp_path):
    rq.main(["--out", str(tmp_path)])
    report = json.loads((tmp_path / "quantized.json").read_text())
    assert len(report["rows"]) == 14 and (tmp_path / "quantized.png").exists()
    assert "| qwen3-8b | h100 | fp8 |" in (tmp_path / "quantized.md").read_text()
