"""What the bench says about its numbers: the machine and its load before the runs (with a
warning when busy), what one iteration cost in AR steps and what that implies, intervals only
where enough responses support them, and a figure with speedup and tau on axes of their own.
Hand-computed values throughout; no model runs."""

import json
import os

import numpy as np
import pytest

from dflash_jax import metrics, reporting
from dflash_jax.bench import harness
from dflash_jax.metrics import Response

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------- the machine
@pytest.mark.parametrize("flags, names", [
    # an AVX2-only EPYC (family 25 model 1)
    ("fpu sse4_2 avx f16c fma avx2 sha_ni", ["AVX", "AVX2", "FMA"]),
    # an AVX-512 EPYC with bf16 (family 25 model 17)
    ("avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16", ["AVX", "AVX2", "FMA", "AVX-512",
                                                              "AVX-512 VNNI", "AVX-512 BF16"]),
    # a Sapphire Rapids Xeon
    ("avx avx2 fma avx512f avx512_fp16 amx_bf16 amx_tile amx_int8",
     ["AVX", "AVX2", "FMA", "AVX-512", "AVX-512 FP16", "AMX", "AMX BF16", "AMX INT8"]),
    # an Arm server (/proc/cpuinfo "Features"); its "bf16" is not an x86 flag
    ("fp asimd evtstrm aes sve asimddp i8mm bf16", ["NEON", "NEON dot product", "BF16", "I8MM", "SVE"]),
    ("", []),
])
def test_vector_extensions_are_named(flags, names):
    assert reporting.vector_extensions(flags) == names


def test_cpu_description_names_model_family_cores_and_extensions():
    info = {"model": "AMD EPYC", "family": "25", "model_number": "1", "cores": 2,
            "vector_extensions": ["AVX", "AVX2", "FMA"]}
    assert reporting.cpu_description(info) == \
        "AMD EPYC (family 25 model 1), 2 cores; vector extensions: AVX, AVX2, FMA"
    bare = {"model": None, "family": None, "model_number": None, "cores": 4, "vector_extensions": []}
    assert reporting.cpu_description(bare) == "unknown CPU, 4 cores; vector extensions: none known"
    here = reporting.cpu_info()  # this machine: every field present, the cores os.cpu_count()'s
    assert here["cores"] == os.cpu_count() and set(here) == set(info)


def test_busy_warning_above_half_the_cores():
    assert reporting.BUSY_LOAD_PER_CORE == 0.5
    warning = reporting.busy_warning([1.2, 0.3, 0.1], cores=2)
    assert warning.startswith("warning:") and "\n" not in warning
    assert "1.20 on 2 cores" in warning and "speed ratios will be off" in warning
    assert reporting.busy_warning([1.0, 3.0, 3.0], cores=2) is None  # at the limit: quiet (1-minute load only)
    assert reporting.busy_warning([3.9, 0, 0], cores=8) is None
    assert reporting.busy_warning([], cores=2) is None  # no load average on this OS: no claim


def test_bench_prints_the_machine_and_warns_when_busy(capsys):
    busy = harness.machine_check(load=[1.9, 1.5, 1.2], cores=2)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("machine: ") and "vector extensions:" in err[0]
    assert "load average 1.90, 1.50, 1.20 (1, 5, 15 min)" in err[0]
    assert err[1].startswith("warning: the machine is busy") and len(err) == 2
    assert busy["load_average"] == [1.9, 1.5, 1.2] and busy["busy_warning"] == err[1]
    assert busy["cpu"]["cores"] == 2 and busy["cpu"]["vector_extensions"] == reporting.vector_extensions()
    quiet = harness.machine_check(load=[0.4, 0.5, 0.6], cores=2)
    assert len(capsys.readouterr().err.splitlines()) == 1 and quiet["busy_warning"] is None
    report = {"environment": {"device": "cpu"}, "cpu": busy["cpu"], "load_average_before": [1.9, 1.5, 1.2],
              "load_average_after": [2.0, 1.6, 1.3], "busy_warning": busy["busy_warning"]}
    text = harness.machine_text(report)
    assert text.startswith("Machine: ") and "1.90, 1.50, 1.20 (1, 5, 15 min) before the runs, 2.00, 1.60, 1.30 after" in text
    assert "Warning: the machine is busy" in text


# ---------------------------------------------------------------------------- the speedup explained
def _sample(ar: Response, dflash: Response) -> dict:
    return {"ar": ar.to_dict(), "dflash": dflash.to_dict()}


# set "a": AR 4 + 2 steps in 0.4 + 0.3 s (0.7/6 s a step); DFlash 2 + 1 iterations in 0.5 + 0.2 s
# (0.7/3 s an iteration): an iteration costs 2.0 AR steps; 6 tokens / 3 iterations = tau pooled 2.0.
# The third pair ran no loop (the prefill's token was the last): left out of both sides.
SET_A = [(Response(5, (1, 1, 1, 1), 0.1, 0.4), Response(5, (3, 1), 0.1, 0.5)),
         (Response(3, (1, 1), 0.1, 0.3), Response(3, (2,), 0.1, 0.2)),
         (Response(1, (), 0.1, 0.05), Response(1, (), 0.1, 0.9))]
# set "b": 0.1 s an AR step, one DFlash iteration of 3 tokens in 0.3 s: 3.0 AR steps, tau pooled 3.0
SET_B = [(Response(4, (1, 1, 1), 0.0, 0.3), Response(4, (3,), 0.0, 0.3))]


def _report(sets: dict) -> dict:
    datasets = {name: {"samples": [_sample(a, d) for a, d in pairs], "turns": len(pairs)}
                for name, pairs in sets.items()}
    for rec in datasets.values():
        rec["same_output"] = rec["turns"]
        harness.summarize_set(rec, block_size=4)
    return {"datasets": datasets, "average": harness.average(datasets),
            "settings": {"temperature": 0.0}, "environment": {"device": "cpu", "platform": "cpu"}}


def test_iteration_cost_and_the_speedups_it_implies_by_hand():
    ar, df = zip(*SET_A)
    assert harness.iteration_cost(ar, df) == pytest.approx((0.7 / 3) / (0.7 / 6))  # 2.0
    assert harness.iteration_cost(ar[:2], df[:2]) == pytest.approx(2.0)  # the loop-less pair adds nothing
    assert np.isnan(harness.iteration_cost(ar[2:], df[2:]))
    report = _report({"a": SET_A, "b": SET_B})
    a, b, av = report["datasets"]["a"], report["datasets"]["b"], report["average"]
    assert a["iteration_cost_ar_steps"] == pytest.approx(2.0) and b["iteration_cost_ar_steps"] == pytest.approx(3.0)
    assert a["tau_pooled"] == pytest.approx(2.0) and a["speedup_from_cost"] == pytest.approx(1.0)
    assert a["speedup_at_reference_cost"] == pytest.approx(2.0 / 1.305)
    # the average: mean cost 2.5, mean tau pooled 2.5
    assert av["iteration_cost_ar_steps"] == pytest.approx(2.5) and av["tau_pooled"] == pytest.approx(2.5)
    assert av["speedup_from_cost"] == pytest.approx(1.0)
    assert av["speedup_at_reference_cost"] == pytest.approx(2.5 / 1.305)
    text = harness.explanation(report)
    assert "cost 2.50 AR steps here" in text and "2.50 / 2.50 = 1.00x" in text
    assert "2.50 / 1.305 = 1.92x" in text and "results/gpu/h100/spec/" in text
    # the table carries the cost per set and on the average row
    table = harness.markdown(report)
    assert "| iteration, AR steps |" in table
    assert "| 2.00 |" in table.splitlines()[2] and "| 2.50 |" in table.splitlines()[-1]


def test_reference_iteration_cost_is_the_committed_h100_measurement():
    with open(os.path.join(ROOT, "results/gpu/h100/spec/qwen3-8b_gpu_bfloat16_pallas_b1_bs16.json")) as f:
        measured = json.load(f)["result"]
    assert measured["iteration_over_ar_step"] == pytest.approx(
        measured["dflash_ms_per_iteration"] / measured["ar_ms_per_step"])
    assert harness.REFERENCE_ITERATION_COST == pytest.approx(measured["iteration_over_ar_step"], abs=5e-4)
    assert measured["ar_ms_per_step"] and "H100" in harness.REFERENCE_ITERATION_SOURCE


def test_table_gives_no_interval_below_eight_responses():
    few = _report({"a": SET_A, "b": SET_B})  # 3 + 1 responses
    rows = harness.markdown(few).splitlines()
    assert all("(n < 8: no interval)" in row for row in rows[2:]) and "nan" not in "\n".join(rows)
    # 8 responses in a set: its interval is given
    eight = _report({"a": SET_A[:2] * 4})
    row = harness.markdown(eight).splitlines()[2]
    assert "no interval" not in row and metrics.interval_supported(8)
    lo, hi = eight["datasets"]["a"]["tau_ci"]
    assert f"[{lo:.2f}, {hi:.2f}]" in row


def test_rederive_recomputes_a_report_from_its_responses_and_keeps_the_runs_record(tmp_path):
    report = _report({"a": SET_A, "b": SET_B})
    report |= {"command": "python -m dflash_jax bench --out x", "load_average_before": [0.5, 0.4, 0.3],
               "wall_time_s": 12.5, "environment": report["environment"] | {"jax": "0.0"}}
    report["settings"] |= {"block_size": 4, "subset": "random", "enable_thinking": False,
                           "prompt_sources": {"a": os.path.join(ROOT, "dflash_jax", "bench", "data", "a.jsonl")}}
    expected = json.loads(json.dumps(report))
    old = json.loads(json.dumps(report))  # as written before the iteration cost existed
    for rec in [*old["datasets"].values(), old["average"]]:
        for key in ("iteration_cost_ar_steps", "speedup_from_cost", "speedup_at_reference_cost"):
            rec.pop(key)
    old["datasets"]["a"]["tau"] = 99.0  # a stale number is derived again too
    (tmp_path / "bench.json").write_text(json.dumps(old))
    cpu = {"model": "Test CPU", "family": None, "model_number": None, "cores": 2, "vector_extensions": ["AVX2"]}
    new = harness.rederive(str(tmp_path), cpu=cpu)
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(new))
    for name in ("a", "b"):
        for key in ("iteration_cost_ar_steps", "speedup_at_reference_cost", "tau"):
            assert new["datasets"][name][key] == pytest.approx(expected["datasets"][name][key])
    assert new["average"]["iteration_cost_ar_steps"] == pytest.approx(2.5)
    assert (new["command"], new["wall_time_s"], new["load_average_before"]) == (
        report["command"], 12.5, [0.5, 0.4, 0.3])
    assert new["cpu"] == cpu and "cpu=reporting.cpu_info()" in new["rederived"]["how"]
    assert new["settings"]["prompt_sources"] == {"a": os.path.join("dflash_jax", "bench", "data", "a.jsonl")}
    md = (tmp_path / "bench.md").read_text()
    assert "Test CPU, 2 cores; vector extensions: AVX2" in md and "derived again" in md
    assert "cost 2.50 AR steps here" in md and (tmp_path / "bench.png").stat().st_size > 1000


# ---------------------------------------------------------------------------- the figure
def test_plot_puts_speedup_and_tau_on_their_own_axes_and_legends_clear_of_bars():
    def entry(speedup, tau):
        return {"speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1], "tau": tau,
                "tau_ci": [float("nan")] * 2}

    sets = {"gsm8k": (1.2, 5.7, 1.3, 5.1), "mbpp": (0.9, 4.6, 1.1, 4.2)}
    report = {"environment": {"device": "cpu", "platform": "cpu"}, "settings": {"temperature": 0.0},
              "cpu": {"model": "Test CPU"},
              "datasets": {n: entry(s, t) | {"adaptive": entry(sa, ta), "histogram": [3, 2, 1, 1],
                                             "position_acceptance": [0.6, 0.3, 0.1]}
                           for n, (s, t, sa, ta) in sets.items()},
              "average": entry(1.05, 5.15) | {"iteration_cost_ar_steps": 3.5},
              "average_adaptive": entry(1.2, 4.65)}
    fig = harness.plot(report)  # laid out as it is written (figures.finish)
    fig.canvas.draw()
    by_label = {ax.get_ylabel(): ax for ax in fig.axes}
    speed = by_label["decode speedup over AR (x)"]
    tau = by_label["tau (accepted drafts + 1 per iteration)"]
    assert speed is not tau and "Test CPU" in speed.get_title() and "3.50 AR steps" in speed.get_title()
    heights = lambda ax: sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights(speed) == sorted([1.2, 0.9, 1.05, 1.3, 1.1, 1.2])  # fixed + adaptive, sets + average
    assert heights(tau) == sorted([5.7, 4.6, 5.15, 5.1, 4.2, 4.65])
    renderer = fig.canvas.get_renderer()
    for ax in (speed, tau):
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["fixed block", "adaptive block"]
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(p.get_window_extent(renderer)) for p in ax.patches)
        assert not box.overlaps(ax.get_window_extent(renderer))  # below the axes, clear of the bars
    import matplotlib.pyplot as plt

    plt.close(fig)
