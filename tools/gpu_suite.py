"""Every GPU measurement of the project in one command, for the day a GPU is lent.

    python -m dflash_jax.tools.gpu_suite --out DIR            # on a GPU machine (~10 min)
    python -m dflash_jax.tools.gpu_suite --smoke --out DIR    # tiny shapes, any machine (CI)

It runs, in one process, writing each stage's JSON/PNG/markdown under ``DIR/<stage>/`` and a
summary ``DIR/suite.json`` + ``DIR/suite.md`` with the device name and versions:

1. ``exactness``: greedy DFlash == autoregressive decoding, token for token, on the device in
   float32 with full-precision products, for every attention implementation available
   (``xla``, ``pallas``, and ``triton`` where jax-triton is installed) on a random-weight
   model, and for the embedded trained pair on real prompts: the engine's correctness on this
   hardware, kernels included. (In bfloat16 the 16-row verify and the 1-row AR step round
   differently, so outputs may part after a near-tie; the later stages report how often.)
2. ``kernel``: the block-attention kernels against the XLA path and cuDNN attention at
   Qwen3-8B head shapes (``dflash_jax.tools.kernel_speed``).
3. ``decode``: AR decode speed of an 8B-shaped random bf16 target
   (``dflash_jax.bench.decode_speed``).
4. ``spec``: one DFlash iteration against one AR step for the same target with a random
   5-layer drafter, per attention implementation (``dflash_jax.bench.spec_speed``).
5. ``bench``: the end-to-end benchmark of the embedded target + drafter on the prompt sets
   (``python -m dflash_jax bench``; ``--smoke``: one prompt, the fixed block only).
6. ``moe``: each mixture-of-experts family (``qwen3_moe``, ``gpt_oss``, ``deepseek_v3``,
   ``gemma4_text`` with its MoE block, per-layer inputs and KV-shared layers) on a small random
   target (:data:`MOE_TINY`, saved and loaded back): its logits on the device against the same
   forward on the host CPU (float32, full precision), greedy DFlash == AR in float32 on a
   ragged batch with a random drafter (a difference fails the stage), and (not ``--smoke``)
   the iteration's cost against an AR step (``spec_speed``).
7. ``moe_layer``: one MoE layer (gather and ragged_dot paths) against dense layers with the
   active and with all experts' parameters, decode (1 row) and verify (16 rows), at
   Qwen3-Coder-30B-A3B's layer shapes in bf16 (``dflash_jax.tools.moe_layer_speed``).
8. ``hybrid``: the hybrid (Gated DeltaNet) family: greedy DFlash == AR in float32 on a ragged
   batch of the tiny random ``qwen3_5_text`` target with each GDN rollback mode (a difference
   fails the stage), the rollback's timing, snapshot against replay, on Qwen3.5-4B's GDN
   layer (``dflash_jax.tools.gdn_rollback``; ``--smoke``: a tiny layer), and the chunked form's
   Pallas kernels against its ``jnp`` form at Qwen3.5's GDN heads for a verify block and
   prefills (``dflash_jax.tools.gdn_kernel_speed``; a difference over 1 % of the rms fails the
   stage; ``--smoke``: tiny and interpreted).
9. ``tree``: tree verification (``docs/trees.md``): greedy DFlash with a tree of 32 nodes ==
   AR in float32 with every attention implementation (the kernels' tree mask compiled for the
   device), then at Qwen3-8B shapes in bf16 with a 5-layer drafter, per implementation
   (``xla``, ``pallas``), the chain (block 16) against trees of 16, 32 and 64 nodes: draft ms,
   verify ms of the tree beside a causal verify of as many plain rows, the iteration against an
   AR step (``spec_speed --tree``).
10. ``throughput``: throughput against interactivity at Qwen3-8B shapes in bf16 (random
   weights, a random 5-layer drafter charged every iteration), prompts of 512 tokens, 256 new
   tokens per row, batches 1..32: AR against DFlash with a trained pair's acceptance emulated
   (``dflash_jax.proposers.emulated``: geometric, alpha fitted to the paper's MATH-500 tau),
   beside the roofline's prediction where ``dflash_jax.tools.roofline_throughput`` exists
   (``dflash_jax.tools.emulated_throughput``; ``--smoke``: tiny, float32, batches 1 and 2,
   the output must equal AR's).

A stage that fails is recorded with its error and the suite goes on; the exit status is 1
when any stage failed. Nothing needs the network: the prompt sets and the embedded model ship
with the package. jax-triton (for ``attention_impl="triton"``) is optional: on a machine
without it, carry its wheel in the working tree and put it on ``PYTHONPATH`` (docs/performance.md, "GPUs").
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import jax

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.files import write_text
from dflash_jax.reporting import command_line, environment
from dflash_jax.nn.attention import ATTENTION_IMPLS
from dflash_jax.bench import decode_speed, harness, spec_speed
from dflash_jax.tools import emulated_throughput, gdn_kernel_speed, gdn_rollback, kernel_speed, moe_layer_speed

MOE_TINY = {
    "qwen3_moe": {"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
                  "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 3,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                  "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                  "mlp_only_layers": [1], "norm_topk_prob": True, "max_position_embeddings": 512,
                  "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "gpt_oss": {"model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64,
                "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 8,
                "num_experts_per_tok": 2, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
                "max_position_embeddings": 512, "rope_theta": 150000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                                 "truncate": False},
                "attention_bias": True, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0,
                "tie_word_embeddings": False},
    "deepseek_v3": {"model_type": "deepseek_v3", "vocab_size": 256, "hidden_size": 64,
                    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 3,
                    "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
                    "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
                    "n_shared_experts": 1, "first_k_dense_replace": 1, "max_position_embeddings": 512},
    "gemma4_text": {"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64,
                    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
                    "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 8,
                    "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2,
                    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 256,
                    "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
                    "moe_intermediate_size": 32, "final_logit_softcapping": 30.0,
                    "max_position_embeddings": 512},
}
"""Small random targets of the MoE families (``config.json`` dicts) for the ``moe`` stage."""


def available_impls() -> list[str]:
    """Attention implementations this machine can run compiled (not interpreted)."""
    impls = ["xla", "pallas"]
    if jax.default_backend() == "gpu":
        try:
            import jax_triton  # noqa: F401
            if "triton" in ATTENTION_IMPLS:
                impls.append("triton")
        except ImportError:
            pass
    return impls


def moe_family_check(model_type: str, out: str, smoke: bool) -> dict:
    """One MoE family on the device: a random target of :data:`MOE_TINY` saved to
    ``out/<type>_target`` and loaded back, its float32 logits on a fixed prompt against the
    same forward on the host CPU, greedy DFlash == AR in float32 on a ragged batch (a random
    1-layer drafter, block 8), and off ``smoke`` the iteration's cost (``spec_speed``)."""
    import numpy as np

    from dflash_jax.config import TargetConfig
    from dflash_jax.decoding.generation import generate
    from dflash_jax.models.handles import Drafter, Target, load_target
    from dflash_jax.targets import target_forward

    path = os.path.join(out, f"{model_type}_target")
    Target.random(TargetConfig.from_hf_dict(MOE_TINY[model_type]), seed=1).save(path)
    target = load_target(path, dtype=jax.numpy.float32)
    tokens = jax.numpy.asarray(np.random.default_rng(0).integers(0, 256, size=(2, 24)), jax.numpy.int32)
    positions = jax.numpy.broadcast_to(jax.numpy.arange(24, dtype=jax.numpy.int32), (2, 24))
    fwd = jax.jit(lambda p, t, q: target_forward(target.config, p, t, q)[0])
    with jax.default_matmul_precision("highest"):
        here = np.asarray(fwd(target.params, tokens, positions))
        cpu = jax.devices("cpu")[0]
        host = np.asarray(fwd(*jax.device_put((target.params, tokens, positions), cpu)))
    diff = float(np.max(np.abs(here - host)))
    if not diff < 1e-3:
        raise RuntimeError(f"{model_type}: logits on {jax.default_backend()} differ from the host "
                           f"CPU's by {diff:.3g} (float32, full precision)")
    # greedy DFlash against AR on a ragged batch, float32, full precision: must be equal
    prompts = [list(range(3, 19)), list(range(40, 51))]
    new = 16 if smoke else 64
    drafter = Drafter.random(target, num_layers=1, block_size=8, seed=2)
    with jax.default_matmul_precision("highest"):
        ar = generate(target, prompts, new)
        df = generate(target, prompts, new, drafter=drafter, block_size=8)
    agreement = spec_speed.sequence_agreement(ar.sequences, df.sequences)
    if not agreement["dflash_equals_ar"]:
        raise RuntimeError(f"{model_type}: greedy DFlash differs from AR in float32: {agreement}")
    row = {"logits_max_abs_diff_vs_host_cpu": diff, "dflash_equals_ar": True,
           "rows_equal": f"{agreement['rows_equal']}/{len(prompts)}"}
    if not smoke:  # the iteration's cost against an AR step (spec_speed: its own exactness check)
        r = spec_speed.main(["--target", path, "--dtype", "float32", "--drafter-layers", "1",
                             "--block-size", "8", "--prompt-len", "16", "--new-tokens", "64",
                             "--repeats", "2", "--out", out])["result"]
        row["iteration_over_ar_step"] = round(r["iteration_over_ar_step"], 3)
    return row


def stages(out: str, smoke: bool) -> list[tuple[str, callable]]:
    """(name, thunk) per stage; each thunk returns a small dict of headline numbers."""
    impls = available_impls()
    d = lambda name: os.path.join(out, name)

    def exactness():
        rows = {}
        # (smoke: the spec stage runs the same float32 check on the tiny model, exact=True)
        for impl in [] if smoke else impls:
            argv = ["--preset", "small", "--new-tokens", "64", "--batch", "2"]
            r = spec_speed.main(argv + ["--dtype", "float32", "--attention-impl", impl,
                                        "--repeats", "1", "--out", d("exactness")])["result"]
            rows[impl] = {"dflash_equals_ar": r["dflash_equals_ar"], "rows_equal": r["rows_equal"]}
        # the embedded (trained) pair on real prompts, float32, full-precision products
        argv = ["--dtype", "float32", "--max-samples", "1" if smoke else "2", "--max-new-tokens",
                "8" if smoke else "128", "--out", d("exactness_bench")] + (["--datasets", "gsm8k", "--no-adaptive"] if smoke else [])
        with jax.default_matmul_precision("highest"):
            rep = harness.main(argv)
        same = sum(r["same_output"] for r in rep["datasets"].values())
        turns = sum(r["turns"] for r in rep["datasets"].values())
        rows["embedded_float32"] = {"dflash_equals_ar": same == turns, "responses_equal": f"{same}/{turns}"}
        bad = [k for k, v in rows.items() if not v["dflash_equals_ar"]]
        if bad:
            raise RuntimeError(f"greedy DFlash differs from AR in float32 with {bad}: {rows}")
        return rows

    def kernel():
        argv = (["--seq", "128", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--head-dim",
                 "16", "--repeats", "1", "--interpret"] if smoke else
                ["--seq", "1024", "4096", "16384", "32768", "--batch", "1", "8", "--repeats", "5",
                 "--impl", *[i for i in impls if i != "xla"], "xla", "cudnn"])
        rep = kernel_speed.main(argv + ["--out", d("kernel")])
        keys = [k for k in rep["results"][0] if k.endswith("_us")]
        return {f"b{r['batch']}_S{r['seq']}_{'verify' if r['causal'] else 'draft'}":
                {k: round(r[k], 1) for k in keys if k in r} for r in rep["results"]}

    def decode():
        argv = (["--preset", "tiny", "--batch", "1", "--new-tokens", "8", "--repeats", "1"] if smoke
                else ["--preset", "qwen3-8b", "--dtype", "bfloat16", "--batch", "1", "8"])
        rep = decode_speed.main(argv + ["--out", d("decode")])
        return {f"b{r['batch']}": {"ms_per_step": round(r["ms_per_step"], 3),
                                   "bandwidth_fraction": round(r["bandwidth_fraction"], 3)}
                for r in rep["results"]}

    def spec():
        rows = {}
        for impl in impls:
            argv = (["--preset", "tiny", "--new-tokens", "16", "--prompt-len", "16", "--repeats", "1"]
                    if smoke else ["--preset", "qwen3-8b", "--dtype", "bfloat16",
                                   "--drafter-layers", "5", "--new-tokens", "128", "--prompt-len", "512",
                                   "--repeats", "2"])
            r = spec_speed.main(argv + ["--attention-impl", impl, "--out", d("spec")])["result"]
            rows[impl] = {k: round(r[k], 3) for k in ("ar_ms_per_step", "draft_ms", "verify_ms",
                                                      "dflash_ms_per_iteration", "iteration_over_ar_step",
                                                      "projected_speedup_at_paper_tau")}
        return rows

    def bench():
        # (smoke: the fixed block only; the adaptive one's cost table and programs are the
        # embedded bench test's, tests/embedded/test_embedded_default.py)
        argv = (["--max-samples", "1", "--max-new-tokens", "8", "--datasets", "gsm8k", "--no-adaptive"] if smoke
                else ["--max-samples", "8", "--max-new-tokens", "256"])
        rep = harness.main(argv + ["--out", d("bench")])
        avg = rep.get("average", {})
        return {k: avg[k] for k in avg if isinstance(avg[k], (int, float))}

    def moe():
        return {t: moe_family_check(t, d("moe"), smoke) for t in MOE_TINY}

    def moe_layer():
        argv = (["--hidden", "64", "--experts", "8", "--experts-per-token", "2", "--expert-width", "32",
                 "--rows", "1", "4", "--repeats", "1", "--dispatch-calls", "2", "--program-calls", "1"] if smoke else
                ["--hidden", "2048", "--experts", "128", "--experts-per-token", "8", "--expert-width", "768",
                 "--rows", "1", "16", "--dtype", "bfloat16"])
        rep = moe_layer_speed.main(argv + ["--out", d("moe_layer")])
        return {f"{r['rows']} rows, {r['variant']}": round(r["median_us"], 1) for r in rep["results"]}

    def hybrid():
        argv = (["--layer", "tiny", "--block-size", "4", "--batch", "1", "--repeats", "1",
                 "--calls-per-run", "1", "--model-new-tokens", "8"] if smoke else
                ["--block-size", "4", "8", "16", "--batch", "1", "4", "--model-new-tokens", "96"])
        rep = gdn_rollback.main(argv + ["--out", d("hybrid")])
        if not isinstance(rep["model"], list):
            raise RuntimeError(f"the tiny hybrid model was not run: {rep['model']}")
        bad = [r["mode"] for r in rep["model"] if not r["dflash_equals_ar"]]
        if bad:
            raise RuntimeError(f"hybrid target: greedy DFlash differs from AR in float32 with rollback {bad}")
        row = {f"model {r['mode']}": {"dflash_equals_ar": True, "ms_per_iteration": round(r["median_ms"], 3)}
               for r in rep["model"]}
        row |= {f"layer T{r['block']} B{r['batch']} {r['mode']}": round(r["median_ms"], 3)
                for r in rep["layer"] if r["mode"] in ("snapshot", "replay")}
        # the chunked form's Pallas kernels against its jnp form (smoke: tiny, interpreted)
        argv = (["--tokens", "40", "--batch", "1", "--value-heads", "2", "--dk", "16", "--dv", "16", "--chunk", "16",
                 "--repeats", "1", "--interpret"] if smoke else [])
        rep = gdn_kernel_speed.main(argv + ["--out", d("hybrid")])
        bad = [r for r in rep["results"] if not r["max_abs_err_over_rms"] < (1e-4 if smoke else 1e-2)]
        if bad:
            raise RuntimeError(f"the GDN kernels differ from the jnp form: {bad}")
        row |= {f"gdn kernel T{r['tokens']} B{r['batch']}": {
            "pallas_ms": round(r["pallas_ms"], 3), "xla_ms": round(r["xla_ms"], 3),
            "err_over_rms": float(f"{r['max_abs_err_over_rms']:.2g}")} for r in rep["results"]}
        return row

    def tree():
        rows = {}
        small = (["--preset", "tiny", "--new-tokens", "16", "--prompt-len", "16", "--block-size", "8"]
                 if smoke else ["--preset", "small", "--new-tokens", "64", "--batch", "2"])
        for impl in ["xla"] if smoke else impls:  # float32, full-precision products, 32 nodes
            r = spec_speed.main(small + ["--dtype", "float32", "--attention-impl", impl, "--tree", "32",
                                         "--repeats", "1", "--out", d("tree")])["result"]
            rows[f"{impl} float32 tree32"] = {"dflash_equals_ar": r["dflash_equals_ar"],
                                              "rows_equal": r["rows_equal"]}
        if smoke:
            return rows
        big = ["--preset", "qwen3-8b", "--dtype", "bfloat16", "--drafter-layers", "5",
               "--new-tokens", "64", "--prompt-len", "512", "--repeats", "1"]
        keys = ("draft_ms", "verify_ms", "verify_chain_ms", "dflash_ms_per_iteration",
                "iteration_over_ar_step", "ar_ms_per_step")
        for impl in [i for i in impls if i != "triton"]:
            for nodes in (None, 16, 32, 64):
                tree_args = ["--tree", str(nodes)] if nodes else []
                r = spec_speed.main(big + tree_args + ["--attention-impl", impl, "--out", d("tree")])["result"]
                rows[f"{impl} {'chain16' if nodes is None else f'tree{nodes}'}"] = {
                    k: round(r[k], 3) for k in keys if r.get(k) is not None}
        return rows

    def throughput():
        rep = emulated_throughput.run_stage(d("throughput"), smoke)
        return {"alpha": round(rep["alpha"], 4), "tau_model": round(rep["tau_model"], 3),
                **{f"b{b}": {"speedup_same_batch": round(v["speedup_same_batch"], 3),
                             "rows_equal_to_ar": v["rows_equal_to_ar"], "refine_passes": v["refine_passes"]}
                   for b, v in rep["per_batch"].items()},
                "predicted_speedup_same_batch": rep["prediction"].get("note") or {
                    k: v["speedup_same_batch"] for k, v in rep["prediction"]["scenarios"].items()}}

    return [("exactness", exactness), ("kernel", kernel), ("decode", decode), ("spec", spec),
            ("bench", bench), ("moe", moe), ("moe_layer", moe_layer), ("hybrid", hybrid),
            ("tree", tree), ("throughput", throughput)]


def markdown(summary: dict) -> str:
    env = summary["env"]
    lines = [f"# GPU suite on {env['device']} ({env['platform']}, jax {env['jax']})", "",
             f"`{summary['command']}`, {summary['time']}, {summary['total_s']:.0f} s in all", "",
             "| stage | status | seconds | headline |", "|---|---|---|---|"]
    for s in summary["stages"]:
        head = json.dumps(s.get("result", s.get("error", "")))[:300].replace("|", "/")
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | `{head}` |")
    return "\n".join(lines) + "\n"


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output directory (made if missing)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: checks that the suite runs (CPU, CI)")
    p.add_argument("--only", nargs="+", help="run only these stages, in this order")


def run(args) -> dict:
    if not args.smoke and jax.default_backend() != "gpu":
        raise ValueError(f"no GPU: jax's default backend is {jax.default_backend()!r}; run with "
                         "--smoke on a machine without one, or install jax with CUDA "
                         '(pip install -e ".[gpu]")')
    os.makedirs(args.out, exist_ok=True)
    t_all = time.perf_counter()
    results = []
    all_stages = stages(args.out, args.smoke)
    unknown = set(args.only or []) - {n for n, _ in all_stages}
    if unknown:
        raise ValueError(f"unknown stage(s) {sorted(unknown)}; stages: {[n for n, _ in all_stages]}")
    by_name = dict(all_stages)
    for name in args.only or by_name:  # --only also sets the order
        thunk = by_name[name]
        print(f"=== gpu_suite: {name}", flush=True)
        t0 = time.perf_counter()
        try:
            row = {"name": name, "status": "ok", "result": thunk()}
        except Exception as e:  # a failed stage is recorded; the others still run
            traceback.print_exc()
            row = {"name": name, "status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        row["seconds"] = time.perf_counter() - t0
        results.append(row)
        _write(args.out, results, invocation(args), t_all)
    summary = _write(args.out, results, invocation(args), t_all)
    print(markdown(summary))
    if any(r["status"] != "ok" for r in results):
        raise SystemExit(1)
    return summary


def _write(out: str, results: list, command: list[str] | None, t_all: float) -> dict:
    """suite.json and suite.md, rewritten (atomically) after every stage."""
    summary = {"benchmark": "gpu_suite", "env": environment(), "stages": results,
               "impls": available_impls(), "total_s": time.perf_counter() - t_all,
               "time": time.strftime("%Y-%m-%d %H:%M:%S"),
               "command": command_line("dflash_jax", command)}
    for name, text in (("suite.json", json.dumps(summary, indent=2)), ("suite.md", markdown(summary))):
        write_text(os.path.join(out, name), text)
    return summary


def main(argv=None) -> dict:
    return command_main("gpu-suite", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
