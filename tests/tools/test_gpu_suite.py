"""`python -m dflash_jax.tools.gpu_suite --smoke` runs every stage of the GPU suite on tiny
shapes (CPU, CI) so that the one-command GPU run does not rot."""

import json

import jax
import pytest

from dflash_jax.tools import gpu_suite, moe_layer_speed

pytestmark = pytest.mark.slow


def test_smoke_suite_runs_every_stage(tmp_path):
    summary = gpu_suite.main(["--smoke", "--out", str(tmp_path)])
    assert [s["name"] for s in summary["stages"]] == ["exactness", "kernel", "decode", "spec", "bench",
                                                      "moe", "moe_layer", "hybrid", "tree", "throughput"]
    assert all(s["status"] == "ok" for s in summary["stages"]), summary["stages"]
    on_disk = json.loads((tmp_path / "suite.json").read_text())
    assert on_disk["stages"] == json.loads(json.dumps(summary["stages"]))
    assert "| exactness | ok |" in (tmp_path / "suite.md").read_text()
    exact = summary["stages"][0]["result"]
    assert exact == {"embedded_float32": {"dflash_equals_ar": True, "responses_equal": "1/1"}}
    # the smoke spec stage runs in float32, where DFlash must equal AR, for each implementation
    for impl in ("xla", "pallas"):
        spec = json.loads(next((tmp_path / "spec").glob(f"*_{impl}_*.json")).read_text())
        assert spec["dtype"] == "float32" and spec["result"]["dflash_equals_ar"]
    # the kernel stage compared each kernel with the jnp reference (bf16 here) before timing it
    kernel = json.loads(next((tmp_path / "kernel").glob("*.json")).read_text())
    assert kernel["results"] and all(r["max_abs_err"] < 2e-2 for r in kernel["results"])
    assert all(r["pallas_us"] > 0 and r["xla_us"] > 0 for r in kernel["results"])
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert bench["command"].startswith("python -m dflash_jax bench --max-samples 1")
    # each MoE family: logits equal to the host CPU's, greedy DFlash == AR in float32; the MoE
    # layer benchmark timed every variant at 1 and 4 rows
    moe = summary["stages"][5]["result"]
    assert set(moe) == {"qwen3_moe", "gpt_oss", "deepseek_v3", "gemma4_text"}
    assert all(r["dflash_equals_ar"] and r["rows_equal"] == "2/2" for r in moe.values())
    layer = json.loads((tmp_path / "moe_layer" / "moe_layer.json").read_text())
    assert {(r["rows"], r["variant"]) for r in layer["results"]} == {
        (r, v) for r in (1, 4) for v in moe_layer_speed.VARIANTS}
    assert {"moe gather", "moe ragged", "moe dense", "dense active", "dense all"} == set(
        moe_layer_speed.VARIANTS)
    # the hybrid (GDN) target: greedy DFlash == AR in float32 with each rollback mode
    hybrid = summary["stages"][7]["result"]
    assert {k: v["dflash_equals_ar"] for k, v in hybrid.items() if k.startswith("model")} == {
        "model snapshot": True, "model replay": True}
    # and the chunked form's Pallas kernels (interpreted) against its jnp form, with their files
    assert hybrid["gdn kernel T40 B1"]["err_over_rms"] < 1e-4
    gdn = json.loads((tmp_path / "hybrid" / "gdn_kernel_cpu.json").read_text())
    assert [(r["tokens"], r["batch"]) for r in gdn["results"]] == [(40, 1)] and gdn["args"]["interpret"]
    assert gdn["results"][0]["pallas_ms"] > 0 and (tmp_path / "hybrid" / "gdn_kernel_cpu.png").stat().st_size > 0
    # a tree of 32 nodes: greedy DFlash == AR in float32 (smoke: the XLA path)
    assert summary["stages"][8]["result"] == {"xla float32 tree32": {"dflash_equals_ar": True,
                                                                     "rows_equal": 1}}
    # throughput: AR and the emulated-acceptance proposer at batches 1 and 2, float32, where the
    # emulated output equals AR's (no refinement pass needed), recorded with the harness's rows
    tp = summary["stages"][9]["result"]
    assert tp["tau_model"] == pytest.approx(7.87, abs=1e-3)  # the paper's MATH-500 tau
    assert {b: (tp[b]["rows_equal_to_ar"], tp[b]["refine_passes"]) for b in ("b1", "b2")} == {
        "b1": (1, 0), "b2": (2, 0)}
    rep = json.loads(next((tmp_path / "throughput").glob("throughput_*.json")).read_text())
    assert {(r["method"], r["batch"]) for r in rep["rows"]} == {(m, b) for m in ("ar", "emulated") for b in (1, 2)}
    assert all(r["tau"]["mean"] == 1.0 for r in rep["rows"] if r["method"] == "ar")
    assert (tmp_path / "throughput" / f"{next((tmp_path / 'throughput').glob('*.json')).stem}.md").exists()


def test_refusals(tmp_path):
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="--smoke"):
            gpu_suite.main(["--out", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown stage"):
        gpu_suite.main(["--smoke", "--only", "kernels", "--out", str(tmp_path)])
