"""Throughput against interactivity of a random-weight pair with a trained pair's acceptance
emulated (``dflash_jax.proposers.emulated``): the GPU suite's ``throughput`` stage.

A random target and drafter give the cost of decoding at real shapes (Qwen3-8B's, a 5-layer
drafter); the emulated proposer gives the acceptance: per row and iteration, accepted drafts
drawn from a geometric model (per-position acceptance alpha, truncated at the block) with alpha
fitted to the paper's tau (MATH-500, Qwen3-8B, block 16), while the drafter's forward still runs
every iteration (its cost charged, its drafts discarded). For each batch size B the same B
random prompts (a stated length) are decoded with a fixed budget per row (stop tokens ignored):

* AR: a compiling run, then ``repeats`` timed runs; its output is the rows' continuation;
* emulated DFlash: the proposer built from that continuation, a compiling run, then
  ``repeats`` timed runs. In bfloat16 the 16-row verify and the 1-row AR step round
  differently, so the target may choose another token than AR did after a near-tie; the
  continuation is then replaced by the emulated run's own output and the run repeated (at
  most ``refine`` times; the continuation is an input of the compiled loop, so these do not
  compile) until the output is the continuation it was given, so the acceptance follows the
  model (the agreement with AR is recorded).

Each (method, B) is recorded with ``dflash_jax.bench.throughput.batch_record``; the speedup at a
fixed interactivity with ``fixed_interactivity``. The roofline's prediction for Qwen3-8B at the
same context and tau (``dflash_jax.tools.roofline_throughput``, H100 and B200), when that module
exists, is recorded beside.
"""

from __future__ import annotations

import numpy as np

from dflash_jax.bench import throughput as tp
from dflash_jax.bench.spec_speed import sequence_agreement
from dflash_jax.progress import Bar, progress
from dflash_jax.proposers.emulated import EmulatedProposer, alpha_for_tau, emulated_generate, geometric_tau

EMULATED = "emulated"
LABELS = {tp.AR: "AR", EMULATED: "DFlash, emulated acceptance"}


def paper_tau(prompt_set: str = "math500") -> float:
    """The paper's tau (Table 1, Qwen3-8B, block 16, T = 0) for a prompt set."""
    from dflash_jax.experiments import paper_numbers

    return float(paper_numbers.TABLE1[0.0][prompt_set][1])


def measure(target, drafter, prompts, batches, max_new: int, tau: float, repeats: int = 2,
            refine: int = 3, seed: int = 0) -> dict:
    """AR against the emulated proposer (acceptance fitted to ``tau`` at the drafter's block
    size) on the first B of ``prompts`` (int lists) for each B in ``batches``: {"rows":
    [batch_record ...], "alpha", "tau_model", "per_batch": {B: agreement, refine passes,
    speedup at the same batch}}."""
    from dflash_jax.decoding.generation import generate

    tp.check_settings(batches, max_new, (tp.AR,), repeats, len(prompts))
    bs = drafter.config.block_size
    alpha = alpha_for_tau(tau, bs)
    rows, per_batch = [], {}
    bar = progress(total=len(batches), desc="throughput (emulated acceptance)", unit="batch")
    for b in batches:
        p = [list(x) for x in prompts[:b]]
        ar_run = lambda: generate(target, p, max_new, stop_token_ids=())
        ar_run()  # compiles
        ar = [ar_run() for _ in range(repeats)]
        continuation = ar[-1].sequences
        passes = 0
        while True:
            proposer = EmulatedProposer.from_reference(p, continuation, alpha, drafter.config)
            em_run = lambda: emulated_generate(target, p, max_new, proposer, drafter=drafter,
                                               stop_token_ids=(), seed=seed, as_input=True)
            first = em_run()  # compiles (the first pass)
            if first.sequences == continuation or passes >= refine:
                break
            continuation, passes = first.sequences, passes + 1
        em = [em_run() for _ in range(repeats)]
        for name, results in ((tp.AR, ar), (EMULATED, em)):
            for r in results:
                if r.num_generated != [max_new] * b:
                    raise RuntimeError(f"{name} at batch {b}: rows generated {r.num_generated} tokens, "
                                       f"not {max_new} each")
            rows.append(tp.batch_record(name, b, results, max_new))
        agreement = sequence_agreement(ar[-1].sequences, em[-1].sequences)
        per_batch[str(b)] = {"refine_passes": passes,
                             "follows_its_continuation": em[-1].sequences == continuation,
                             "rows_equal_to_ar": agreement["rows_equal"],
                             "min_matching_prefix": agreement["min_matching_prefix"],
                             "speedup_same_batch": rows[-1]["aggregate_tokens_per_s"] / rows[-2]["aggregate_tokens_per_s"]}
        bar.update(1)
        Bar.write(f"batch {b:3d}: AR {rows[-2]['aggregate_tokens_per_s']:.1f} tok/s, emulated DFlash "
                  f"{rows[-1]['aggregate_tokens_per_s']:.1f} tok/s (tau {rows[-1]['tau']['mean']:.2f}, "
                  f"model {geometric_tau(alpha, bs):.2f}), {agreement['rows_equal']}/{b} rows equal to AR")
    bar.close()
    return {"rows": rows, "alpha": alpha, "tau_model": geometric_tau(alpha, bs), "block_size": bs,
            "per_batch": per_batch,
            "fixed_interactivity": tp.fixed_interactivity(rows, (tp.AR, EMULATED))}


def prediction(context: int, final_context: int, tau: float, batches, device_kind: str = "") -> dict:
    """The roofline's predicted curves for Qwen3-8B with its 5-layer drafter at this stage's
    context (``context``: the mean over the decode, ``final_context``: at its end) and tau,
    per GPU scenario of ``dflash_jax.tools.roofline_throughput`` (H100, B200), when that module
    exists; ``matches_this_device``: the scenario whose GPU is ``device_kind``. Else a note."""
    try:
        from dflash_jax.tools import roofline_throughput as rt
    except ImportError:
        return {"note": "no prediction: dflash_jax.tools.roofline_throughput is not in this checkout"}
    try:
        out = {}
        for sc in rt.scenarios(context, final_context):
            if not sc.key.startswith("qwen3-8b"):
                continue
            rows = rt.curves(sc, tau, batches)
            gpu = sc.key.split("_")[-1]
            out[sc.key] = {"label": sc.label, "matches_this_device": gpu in device_kind.lower().replace(" ", ""),
                           "rows": rows,
                           "speedup_same_batch": {str(b): (rt.speedup_at_batch(rows, b) or {}).get(rt.FIXED)
                                                  for b in batches}}
        return {"context": context, "final_context": final_context, "tau": tau, "scenarios": out}
    except Exception as e:  # the measurement stands without it
        return {"note": f"the prediction failed: {type(e).__name__}: {e}"[:500]}


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# Throughput against interactivity, emulated acceptance ({report['env']['device']})", "",
             f"Target {s['target']} (random weights), drafter: {s['drafter_layers']}-layer random DFlash drafter, "
             f"block {report['block_size']}, charged every iteration; {s['dtype']}; prompts of {s['prompt_len']} random "
             f"tokens, {s['max_new_tokens']} new tokens per row (stop tokens ignored), T = 0; {s['repeats']} timed "
             f"runs after a compiling one. Acceptance: geometric, P(a >= k) = alpha^k truncated at "
             f"{report['block_size'] - 1} drafts, alpha {report['alpha']:.4f} fitted to tau {s['tau']} "
             f"({s['tau_source']}); model tau {report['tau_model']:.2f}.", "",
             "| batch | method | aggregate tok/s | per-user tok/s mean [p10, p90] | tau mean | iteration ms | "
             "speedup at the same batch | rows equal to AR |", "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        u, pb = r["per_user_tokens_per_s"], report["per_batch"][str(r["batch"])]
        em = r["method"] == EMULATED
        lines.append(f"| {r['batch']} | {LABELS[r['method']]} | {r['aggregate_tokens_per_s']:.1f} | {u['mean']:.1f} "
                     f"[{u['p10']:.1f}, {u['p90']:.1f}] | {r['tau']['mean']:.2f} | {r['iteration_ms']:.2f} | "
                     + (f"{pb['speedup_same_batch']:.2f}x | {pb['rows_equal_to_ar']}/{r['batch']} |" if em else "| |"))
    lines += ["", "Speedup over AR at a fixed per-user speed (AR's per-user speed at each batch; the emulated "
              "curve interpolated there; '-': outside its measured range):", "",
              "| per-user tok/s (AR batch) | emulated DFlash |", "|---|---|"]
    for lv in report["fixed_interactivity"]:
        lines.append(f"| {lv['per_user_tokens_per_s']:.1f} ({lv['ar_batch']}) | "
                     + ("-" if lv[EMULATED] is None else f"{lv[EMULATED]:.2f}x") + " |")
    pred = report["prediction"]
    if "note" in pred:
        lines += ["", f"Prediction: {pred['note']}."]
    else:
        lines += ["", f"Predicted by the roofline (Qwen3-8B, 5-layer drafter, bf16, context {pred['context']} "
                  f"mean / {pred['final_context']} final, tau {pred['tau']}; `dflash_jax.tools.roofline_throughput`): "
                  "DFlash's aggregate over AR's at the same batch, beside the measured one:", "",
                  "| batch | measured | " + " | ".join(v["label"] + (" (this GPU)" if v["matches_this_device"] else "")
                                                  for v in pred["scenarios"].values()) + " |",
                  "|---|---|" + "---|" * len(pred["scenarios"])]
        for b, v in report["per_batch"].items():
            cells = [sc["speedup_same_batch"].get(b) for sc in pred["scenarios"].values()]
            lines.append(f"| {b} | {v['speedup_same_batch']:.2f}x | "
                         + " | ".join("-" if c is None else f"{c:.2f}x" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    from dflash_jax.reporting import new_figure

    fig, ax = new_figure(1, 1, figsize=(6, 4))
    for m in (tp.AR, EMULATED):
        pts = tp.curve(report["rows"], m)
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", label=LABELS[m])
        for x, y, b in pts:
            ax.annotate(str(b), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set(xlabel="per-user tokens / s (interactivity)", ylabel="aggregate tokens / s (throughput)",
           title=f"{report['settings']['target']}, tau {report['settings']['tau']} emulated (points: batch)")
    ax.legend(fontsize=7)
    return fig


def run_stage(out_dir: str, smoke: bool) -> dict:
    """The GPU suite's stage: a Qwen3-8B-shaped random bf16 target and a random 5-layer drafter,
    prompts of 512 tokens, 256 new tokens, batches 1..32 (``smoke``: the tiny preset and a
    1-layer drafter in float32 with full-precision products, prompts of 16, 24 new tokens,
    batches 1 and 2, where the
    emulated output must equal AR's). Writes ``out_dir/throughput_<platform>.{json,png,md}``."""
    import time

    import jax
    import jax.numpy as jnp

    from dflash_jax.bench.decode_speed import PRESETS
    from dflash_jax.config import TargetConfig
    from dflash_jax.models.handles import Drafter, Target
    from dflash_jax.reporting import environment, publish_report

    preset, dtype = ("tiny", "float32") if smoke else ("qwen3-8b", "bfloat16")
    prompt_len, max_new, batches = (16, 24, (1, 2)) if smoke else (512, 256, (1, 2, 4, 8, 16, 32))
    layers, tau = (1 if smoke else 5), paper_tau("math500")
    target = Target.random(TargetConfig(**PRESETS[preset]), dtype=jnp.dtype(dtype))
    target.max_len = max(target.max_len, prompt_len + max_new + 64)
    drafter = Drafter.random(target, num_layers=layers, block_size=16)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, target.config.vocab_size, size=(max(batches), prompt_len)).tolist()
    with jax.default_matmul_precision("highest" if smoke else None):
        measured = measure(target, drafter, prompts, batches, max_new, tau, repeats=1 if smoke else 2)
    if smoke and not all(v["rows_equal_to_ar"] == int(b) for b, v in measured["per_batch"].items()):
        raise RuntimeError(f"emulated DFlash differs from AR in float32: {measured['per_batch']}")
    report = {"benchmark": "throughput_emulated",
              "settings": {"target": preset, "drafter_layers": layers, "dtype": dtype, "prompt_len": prompt_len,
                           "max_new_tokens": max_new, "batch_sizes": list(batches), "repeats": 1 if smoke else 2,
                           "tau": tau, "tau_source": "the paper's MATH-500 tau, Qwen3-8B, block 16, T = 0"},
              **measured, "prediction": prediction(prompt_len + max_new // 2, prompt_len + max_new, tau, batches,
                                                 str(jax.devices()[0].device_kind)),
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, out_dir, f"throughput_{report['env']['platform']}", plot, markdown)
