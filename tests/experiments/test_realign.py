"""experiments.realign's report: the paired tau differences from step 0 (per prompt set, over the
same prompts) against a hand computation, the held-out curve with its step-0 start, refusals.
The branches' stages are the CLI commands, each tested where it lives."""

import json
import os

import numpy as np
import pytest

from dflash_jax.experiments import realign

CPU = {"model": "a CPU", "cores": 2}


def _bench(path, taus: dict[str, list[list[int]]], same=None):
    """A bench.json whose set ``name`` has one response per acceptance-length list."""
    datasets, means = {}, []
    for name, responses in taus.items():
        per = [float(np.mean(r)) for r in responses]
        means.append(np.mean(per))
        datasets[name] = {"samples": [{"id": i, "turn": 0, "dflash": {"acceptance_lengths": r}}
                                      for i, r in enumerate(responses)],
                          "same_output": len(responses) if same is None else same, "turns": len(responses)}
    avg = float(np.mean(means))
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "bench.json"), "w") as f:
        json.dump({"command": f"python -m dflash_jax bench --out {path}", "cpu": CPU,
                   "load_average_before": [0.5, 0.5, 0.5], "busy_warning": None, "datasets": datasets,
                   "average": {"tau": avg, "tau_ci": [avg - 1, avg + 1]}}, f)


def _work(tmp_path):
    rng = np.random.default_rng(0)
    w = tmp_path / "work"
    _bench(w / "reference" / "bench-step0", {"gsm8k": [[5, 6]] * 10})
    start = {"gsm8k": [rng.integers(1, 8, 4).tolist() for _ in range(10)],
             "mt-bench": [rng.integers(1, 8, 3).tolist() for _ in range(8)]}
    later = {k: [[x + 1 for x in r] for r in v] for k, v in start.items()}
    later["mt-bench"][0] = [x + 5 for x in start["mt-bench"][0]]  # one response gains 5, the others 1
    _bench(w / "int8" / "bench-step0", start)
    _bench(w / "int8" / "bench-step100", later, same=8)
    run = w / "int8" / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"train": {"steps": 100}}))
    (run / "start_eval.json").write_text(json.dumps({"eval_tau": 3.25, "step": 0}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0, **({"eval_tau": 4.5} if s == 100
                                                                                     else {})}) + "\n"
                                               for s in range(1, 101)))
    return str(w)


def test_paired_differences_and_curve(tmp_path):
    rep = realign.report(_work(tmp_path), [100], ["int8"])
    rows = rep["branches"]["int8"]["rows"]
    assert [r["step"] for r in rows] == [0, 100] and rows[0]["tau_diff"] == 0 and rows[0]["tau_diff_ci"] is None
    # per set: gsm8k +1 for every response; mt-bench +1 except one response's +5 -> mean over sets of set means
    expect = np.mean([1.0, (7 * 1.0 + 5.0) / 8])
    assert rows[1]["tau_diff"] == pytest.approx(expect)
    lo, hi = rows[1]["tau_diff_ci"]
    assert 1.0 <= lo <= expect <= hi <= np.mean([1.0, 5.0]) and hi > lo
    assert rows[1]["same_output"] == 16 and rows[1]["turns"] == 18
    assert rep["branches"]["int8"]["held_out"] == [{"step": 0, "tau": 3.25}, {"step": 100, "tau": 4.5, "loss": 1.0}]
    text = realign.markdown(rep)
    assert "| 100 |" in text and f"{expect:.2f} [" in text and "| 4.50 |" in text and "| 3.25 |" in text
    assert f"re-aligning won back {expect:.2f} [" in text and "by step 100 (interval above 0)" in text
    realign.main(["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--branches", "int8",
                  "--steps", "100", "--report-only"])
    assert {"realign.json", "README.md", "realign.png"} <= set(os.listdir(tmp_path / "out"))
    saved = json.load(open(tmp_path / "out" / "realign.json"))
    assert saved["command"].startswith("python -m dflash_jax.experiments.realign --work WORK ")
    assert str(tmp_path / "work") not in json.dumps(saved)  # the work directory written as WORK
    from dflash_jax.tools import replot  # the committed figure is drawn again from its JSON

    assert [p for p, _ in replot.figures_of(str(tmp_path / "out" / "realign.json"))] == \
        [str(tmp_path / "out" / "realign.png")]


def test_other_prompts_and_bad_steps_are_refused(tmp_path, capsys):
    w = _work(tmp_path)
    _bench(os.path.join(w, "int8", "bench-step100"), {"gsm8k": [[2]] * 9, "mt-bench": [[2]] * 8})
    with pytest.raises(ValueError, match="int8 step 100: its bench answered other prompts than step 0's"):
        realign.report(w, [100], ["int8"])
    with pytest.raises(SystemExit):
        realign.main(["--work", w, "--out", str(tmp_path / "o"), "--steps", "150", "--report-only"])
    assert "--steps must be positive multiples of --eval-every 100" in capsys.readouterr().err
