"""Temperature: one trained drafter at T = 0 (greedy) and T = 1 (lossless rejection sampling),
with the greedy draft the paper uses and, at T > 0, with drafts sampled from the drafter's
distribution; inference only.

    python -m experiments.ablate_temperature               # cpu preset, embedded target
    experiments.ablate_temperature.run(preset="smoke") -> Table

At T > 0 AR and DFlash both sample (the same seed, different random streams), so the
outputs differ while following the same distribution (tests/decoding/test_speculative.py checks the
distribution). The paper's Table 1 (Qwen3-8B): tau 6.49 / speedup 4.86x on average at T = 0,
5.48 / 4.03x at T = 1.

Two more things separate a weak drafter from a flat target at T > 0:

- every T > 0 cell also measures, on the target alone, how much of a greedy draft could be
  accepted (``dflash_jax.bench.acceptance_bound``): along the target's own samples at T (the
  first turn of each evaluation prompt), the mean of max_x p_T(x), which bounds the acceptance
  rate of any greedy draft token, and the tau ceiling of a drafter whose every token is the
  target's most likely one. Both are in each row's ``extra`` and in the findings;
- ``--train-temperatures 0 1`` (the cpu-full preset's default) trains a second drafter on the
  same prompts answered by the target at T = 1 instead of greedily (the paper trains on greedy
  answers only), and measures both drafters at every temperature.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dflash_jax import metrics
from dflash_jax.bench import acceptance_bound
from dflash_jax.bench.harness import chat
from dflash_jax.experiments import framework, paper_numbers as paper
from dflash_jax.files import write_json
from dflash_jax.prompts import encode_prompt


def cells(settings, train, axes) -> list[dict]:
    out = []
    trains = [float(x) for x in axes["train_temperatures"]]
    if settings.regen_temperature:
        raise ValueError("ablate_temperature sets the training data's temperature per drafter: give "
                         f"--train-temperatures {settings.regen_temperature:g} instead of --regen-temperature")
    for tt in trains:
        for t in axes["temperatures"]:
            for draft in (("greedy",) if t == 0 else ("greedy", "sampled")):
                # the training data's temperature is a label only where the grid varies it (so the
                # one-drafter tables keep their columns)
                label = ({"train_T": tt} if trains != [0.0] else {}) | {"temperature": float(t), "draft": draft}
                out.append({"label": label, "data": {"regen_temperature": tt},
                            "evaluation": {"temperature": float(t), "sampled_draft": draft == "sampled"}})
    return out


def ceiling(work, cell) -> dict | None:
    """A T > 0 cell's acceptance ceiling (module doc), measured once per target, prompts,
    temperature and block size (it does not depend on the drafter) under ``WORK/measures``."""
    ev = cell.evaluation
    if not ev["temperature"]:
        return None
    block = ev["block_size"] if isinstance(ev["block_size"], int) else cell.drafter["block_size"]
    key = {"measure": "greedy_acceptance_ceiling", "target": work.target_id, "dtype": work.settings.dtype,
           "block_size": block,
           **{k: ev[k] for k in ("datasets", "max_samples", "max_new_tokens", "temperature", "subset", "seed")}}
    path = os.path.join(work.root, "measures", framework.stable_hash(key) + ".json")
    made = {}

    def make(dest):
        per_set = {}
        for name in ev["datasets"]:
            samples = framework.load_prompt_set(name, None, ev["max_samples"], ev["seed"], subset=ev["subset"])
            prompts = [encode_prompt(chat(s.turns[:1], []), work.target.tokenizer) for s in samples]
            per_set[name] = acceptance_bound.measure(work.target, prompts, ev["max_new_tokens"], ev["temperature"],
                                                     block, seed=ev["seed"])
        made["result"] = summarize_ceiling(per_set, block)
        write_json(dest, {"key": key, "result": made["result"], "finished": framework.made_now()})

    # a second process measuring the same waits for it and reuses it (framework.work_entry)
    framework.work_entry(work.log, "measurement", path, make, settings=path,
                         about=framework.brief(ev | {"measure": key["measure"], "block_size": block},
                                               ("measure", "temperature", "block_size", "datasets", "max_samples",
                                                "max_new_tokens")))
    if "result" in made:
        return made["result"]
    with open(path) as f:
        return json.load(f)["result"]


def summarize_ceiling(per_set: dict, block_size: int) -> dict:
    """Means over responses (all sets) of ``mean_max_prob`` and ``ceiling``, with 95 % bootstrap
    intervals stratified by set (none below metrics.MIN_DISTINCT_SAMPLES responses)."""
    out = {"block_size": block_size, "responses": sum(len(v) for v in per_set.values()), "per_set": per_set}
    for k in ("mean_max_prob", "ceiling"):
        groups = [([r[k] for r in v],) for v in per_set.values() if v]
        flat = [x for (g,) in groups for x in g]
        out[k] = float(np.mean(flat)) if flat else float("nan")
        out[k + "_ci"] = list(metrics.bootstrap_interval(
            lambda xs: float(np.mean([x for g in xs for x in g])), groups)) if flat else [float("nan")] * 2
    return out


def findings(table) -> list[str]:
    out = []
    trains = sorted({r["label"].get("train_T", 0.0) for r in table.rows})
    for tt in trains:
        rows = sorted([r for r in table.rows if r["label"].get("train_T", 0.0) == tt],
                      key=lambda r: (r["label"]["temperature"], r["label"]["draft"]))
        name = lambda r: (f"T={r['label']['temperature']:g} ({r['label']['draft']} draft"
                          + (f", trained on T={tt:g} data)" if len(trains) > 1 else ")"))
        out += framework.compare(rows, name, "tau") + framework.compare(rows, name, "speedup")
        greedy = [r for r in rows if r["label"]["draft"] == "greedy"]
        if len(greedy) >= 2:
            out.append(framework.paper_direction(greedy[0], greedy[-1], name,
                                                 "tau falls from T = 0 to T = 1, 6.49 -> 5.48 on average"))
        out += [ceiling_sentence(r, name) for r in rows if (r.get("extra") or [None])[0]]
    if len(trains) > 1:  # the same evaluation, drafters trained on greedy and on sampled answers
        for r in (r for r in table.rows if r["label"].get("train_T", 0.0) == trains[0]):
            other = [o for o in table.rows if o["label"].get("train_T", 0.0) == trains[-1]
                     and o["label"]["temperature"] == r["label"]["temperature"]
                     and o["label"]["draft"] == r["label"]["draft"]]
            if other:
                o = other[0]
                out.append(f"training data at T={trains[0]:g} -> T={trains[-1]:g}, evaluated at "
                           f"T={r['label']['temperature']:g} with the {r['label']['draft']} draft: tau "
                           f"{r['average']['tau']:.2f} -> {o['average']['tau']:.2f} ({framework.verdict(r, o)})")
    return out


def ceiling_sentence(row: dict, name) -> str:
    """The row's tau beside the acceptance ceiling its temperature allows (module doc)."""
    c = row["extra"][0]
    pa = float(np.mean([d["position_acceptance"][0] for d in row["datasets"].values()]))
    head = (f"{name(row)}: tau {metrics.interval_text(row['average']['tau'], row['average']['tau_ci'])} against a "
            f"ceiling of {metrics.interval_text(c['ceiling'], c['ceiling_ci'])} for a greedy draft of the target's "
            f"most likely tokens (block {c['block_size']}); the first draft token is accepted {pa:.2f} of the time, ")
    bound = (f"E[max_x p_T(x)] = {metrics.interval_text(c['mean_max_prob'], c['mean_max_prob_ci'])} along the "
             f"target's own samples ({c['responses']} responses)")
    if row["label"]["draft"] == "greedy":
        return head + "where any greedy draft is bounded by " + bound
    return (head + "a sampled draft is not held to the greedy bound " + bound
            + " (its token is accepted with probability 1 - TV(p_T, q), up to 1 when q = p_T)")


EXPERIMENT = framework.Experiment(
    name="ablate_temperature",
    description=__doc__.split("\n\n")[0],
    axes={"temperatures": {"smoke": (0.0, 1.0), "cpu": (0.0, 1.0), "gpu": (0.0, 1.0)},
          "train_temperatures": {"smoke": (0.0,), "cpu": (0.0,), "cpu-full": (0.0, 1.0), "gpu": (0.0,)}},
    axis_help={"temperatures": "evaluation temperatures (greedy draft at each; also a sampled draft when T > 0)",
               "train_temperatures": "temperatures the target answers the training prompts at, one drafter "
                                     "(and one data set) each"},
    axis_types={"train_temperatures": float},
    cells=cells, paper_rows=paper.TEMPERATURE, paper_keys=["temperature", "draft"], plot=framework.plot_beside_paper,
    findings=findings, measure=ceiling)


def run(preset: str = "smoke", **overrides) -> framework.Table:
    """Runs the ablation (see :func:`experiments.framework.run_experiment`); ``overrides``:
    any option by field name, e.g. ``temperatures=(0.0, 1.0)``, ``out=...``."""
    return framework.run_experiment(EXPERIMENT, preset, **overrides)


def main(argv=None) -> framework.Table:
    return framework.main(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
