"""Load time and peak host memory of mixture-of-experts checkpoints on this machine: for every
MoE target family (``qwen3_moe``, ``gpt_oss``, ``deepseek_v3``, ``gemma4_text`` with its MoE block) and the Qwen3.5 MoE block on its own
(``qwen3_5_moe_block``: the MoE half of a ``qwen3_5_moe_text`` checkpoint, until its hybrid
family lands), a tiny and a mid-size (0.5-1B parameters) random checkpoint.

Each checkpoint is written in bfloat16 by this project's save path (``Target.random(...).save``;
the block: ``qwen3_5_moe.save_block_layers`` in the released, fused expert layout) under a
scratch directory (never the repository; deleted after its measurements), then loaded
``--repeats`` times, each time in a fresh Python process (so that one load's peak cannot hide
another's) that starts jax, then times ``load_target(path)`` (the block:
``load_block_layers(path)``) until every parameter is on the device, and reads the process's
peak resident memory (``VmHWM``) against its resident memory before the load.
The report gives the min and median of both, the weights' own size and the peak over it (how
many copies of the weights the loader holds at once), the machine and its load average.

The files were just written, so they are in the page cache: the times are warm-cache loads (the
disk's speed is not measured), and the resident memory counts the file pages the safetensors
reader maps while it reads.

    python -m dflash_jax load-report                                   # writes results/moe_load/
    python -m dflash_jax load-report --sizes tiny --repeats 1 --out /tmp/x   # smoke
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from dflash_jax.cli import command_main, invocation, run_cli, status
from dflash_jax.files import write_json, write_text
from dflash_jax.reporting import (busy_warning, command_line, cpu_description, cpu_info,
                                  environment, load_average)

MB = 1e6
SIZES = ("tiny", "mid")

# config.json dicts of each family at each size (mid: 0.5-1B parameters)
CONFIGS = {
    "qwen3_moe": {
        "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
        # Qwen3-30B-A3B's shape scaled down: 64 experts of width 320, k 8, D 1024, 8 layers
        "mid": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=64,
                    num_experts_per_tok=8, moe_intermediate_size=320, norm_topk_prob=True),
    },
    "gpt_oss": {
        "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                     num_experts_per_tok=2, sliding_window=16),
        # gpt-oss-20b's layout scaled down: 64 experts of width 320, k 4, D 1024, 8 layers
        "mid": dict(vocab_size=32000, hidden_size=1024, intermediate_size=320, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_local_experts=64,
                    num_experts_per_tok=4, sliding_window=128),
    },
    "deepseek_v3": {
        "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
                     qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8,
                     num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                     moe_intermediate_size=32, first_k_dense_replace=1),
        # DeepSeek-V3's layout scaled down: latent attention (16 heads, kv latent 256, q latent
        # 384), 64 experts of width 320 in 8 groups, k 8, a shared expert, the first layer dense
        "mid": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=256, q_lora_rank=384,
                    qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=64,
                    num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
                    moe_intermediate_size=320, first_k_dense_replace=1),
    },
    "gemma4_text": {
        "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                     num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                     enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32),
        # Gemma 4 26B-A4B's layout scaled down: sliding (8 KV heads of 128) and full layers (2 of
        # 256, keys as values), a dense MLP beside 64 experts of width 320, k 8, D 1024, 8 layers
        "mid": dict(vocab_size=32000, hidden_size=1024, intermediate_size=768, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=128, global_head_dim=256,
                    num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=128,
                    layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3
                    + ["full_attention"], hidden_size_per_layer_input=0, enable_moe_block=True,
                    num_experts=64, top_k_experts=8, moe_intermediate_size=320),
    },
    "qwen3_5_moe_block": {
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32, shared_expert_intermediate_size=64),
        # Qwen3.5-35B-A3B's block (D 2048, experts of width 512, shared expert 512) with 64 of
        # its 256 experts, 3 layers
        "mid": dict(hidden_size=2048, num_hidden_layers=3, num_experts=64, num_experts_per_tok=8,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512),
    },
}
FAMILIES = tuple(CONFIGS)
BLOCK = "qwen3_5_moe_block"


# ---------------------------------------------------------------------------- writing
def write_checkpoint(family: str, size: str, path: str, seed: int = 0) -> dict:
    """Writes the random bfloat16 checkpoint of ``family`` at ``size`` to ``path``; returns
    its parameter count and bytes on disk."""
    import jax
    import jax.numpy as jnp

    d = CONFIGS[family][size]
    if family == BLOCK:
        from dflash_jax.targets.moe import qwen3_5_moe as q

        cfg = q.block_config_from_hf(d)
        n = d["num_hidden_layers"]
        params = q.init_block_params(cfg, jax.random.key(seed), jnp.bfloat16, num_layers=n)
        q.save_block_layers(path, cfg, params, q.FUSED)
        num_params = n * q.block_num_params(cfg)
    else:
        from dflash_jax.config import TargetConfig
        from dflash_jax.models.handles import Target

        cfg = TargetConfig.from_hf_dict({"model_type": family, **d})
        target = Target.random(cfg, seed=seed, dtype=jnp.bfloat16)
        target.save(path)
        num_params = cfg.num_params()
        params = target.params
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
    del params
    disk = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"params": int(num_params), "weight_bytes": int(weight_bytes), "disk_bytes": int(disk)}


# ---------------------------------------------------------------------------- measuring
def _rss_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    """This process's peak resident memory so far: ``VmHWM`` of ``/proc/self/status`` (the
    high-water mark of this program's own address space). ``getrusage``'s ``ru_maxrss`` is
    the fallback only: on Linux it keeps the parent's resident size at the ``fork`` that
    started this process (a parent holding a checkpoint's weights would hide the load's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def measure_once(family: str, path: str) -> dict:
    """One load of the checkpoint at ``path`` in THIS process (run it in a fresh one:
    :func:`measure`): seconds until every parameter is ready, resident memory before, after and
    at the peak."""
    import jax

    import jax.numpy as jnp

    jax.devices()  # the backend and its first buffer belong to the baseline, not to the load
    jax.block_until_ready(jnp.ones(8, jnp.bfloat16))
    if family == BLOCK:
        from dflash_jax.targets.moe.qwen3_5_moe import load_block_layers as load
    else:
        from dflash_jax.models.handles import load_target as load
    before, peak_before = _rss_bytes(), _peak_rss_bytes()
    t0 = time.perf_counter()
    loaded = load(path)
    params = loaded[1] if family == BLOCK else loaded.params
    jax.block_until_ready(jax.tree_util.tree_leaves(params))
    seconds = time.perf_counter() - t0
    peak = _peak_rss_bytes()
    return {"seconds": seconds, "rss_before": before, "rss_after": _rss_bytes(), "peak_rss": peak,
            "peak_before_load": peak_before, "peak_delta": max(peak - before, 0)}


_CHILD = """
    import json, sys
    from dflash_jax.tools.load_report import measure_once
    print("RESULT " + json.dumps(measure_once(sys.argv[1], sys.argv[2])), flush=True)
"""


def measure(family: str, path: str) -> dict:
    """:func:`measure_once` in a fresh Python process; adds the load average before and after."""
    load_before = load_average()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), family, path],
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the load of {family} ({path}) failed in its subprocess (exit "
                           f"{proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return {**json.loads(lines[-1][len("RESULT "):]), "load_average_before": load_before,
            "load_average_after": load_average()}


def summarize(runs: list[dict], weight_bytes: int) -> dict:
    """Min and median over the runs of the load seconds and the peak resident delta, the
    median resident memory the load left (after minus before) and the median peak delta over
    the weights' own bytes."""
    secs = [r["seconds"] for r in runs]
    peaks = [r["peak_delta"] for r in runs]
    return {"seconds_min": min(secs), "seconds_median": statistics.median(secs),
            "peak_delta_min": min(peaks), "peak_delta_median": statistics.median(peaks),
            "kept_median": statistics.median(r["rss_after"] - r["rss_before"] for r in runs),
            "peak_over_weights": statistics.median(peaks) / weight_bytes if weight_bytes else None}


# ---------------------------------------------------------------------------- the report
def markdown(report: dict) -> str:
    env, cpu = report["env"], report["cpu"]
    loads = [r[k] for row in report["rows"] for r in row["runs"]
             for k in ("load_average_before", "load_average_after") if r.get(k)]
    load_text = (f"1-minute load average during the loads {min(l[0] for l in loads):.2f} to "
                 f"{max(l[0] for l in loads):.2f} on {cpu['cores']} cores" if loads else "load average unknown")
    lines = ["# MoE checkpoints: load time and peak host memory", "",
             f"Produced by `{report['command']}` on {cpu_description(cpu)} ({env['platform']}, "
             f"jax {env['jax']}, jaxlib {env['jaxlib']}), {report['time']}; {load_text}.", "",
             f"bfloat16 random checkpoints written by this project's save path; each load in a fresh "
             f"process, {report['repeats']} loads per checkpoint (min / median). Peak = the process's "
             "peak resident memory minus its resident memory before the load; peak / weights = "
             "the median peak over the weights' bytes (for the tiny checkpoints a fixed cost of the "
             "loader dominates it); kept = resident memory after the load minus before (median). Warm page cache (the files were just written). MB = 1e6 bytes.", "",
             "| family | size | parameters | on disk (MB) | load s (min / median) | "
             "peak MB (min / median) | peak / weights | kept MB |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        s = row["summary"]
        ratio = "" if s["peak_over_weights"] is None else f"{s['peak_over_weights']:.2f}"
        lines.append(f"| {row['family']} | {row['size']} | {_count(row['params'])} | "
                     f"{row['disk_bytes'] / MB:.1f} | {s['seconds_min']:.2f} / {s['seconds_median']:.2f} | "
                     f"{s['peak_delta_min'] / MB:.0f} / {s['peak_delta_median'] / MB:.0f} | {ratio} | "
                     f"{s['kept_median'] / MB:.0f} |")
    if report.get("warning"):
        lines += ["", report["warning"]]
    return "\n".join(lines) + "\n"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else (f"{n / 1e6:.2f}M" if n >= 1e5 else str(n))


def add_arguments(p) -> None:
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                   help="which MoE families to measure (qwen3_5_moe_block: the Qwen3.5 MoE block alone)")
    p.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES),
                   help="checkpoint sizes: tiny (thousands of parameters) and mid (0.5-1B parameters)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs (loads) per checkpoint, each in a fresh process")
    p.add_argument("--scratch", default=None,
                   help="directory for the random checkpoints, each deleted after its loads (default: "
                        "a new temporary directory, removed at the end)")
    p.add_argument("--out", default=os.path.join("results", "moe_load"), help="output directory")


def run(args) -> dict:
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    scratch = args.scratch or tempfile.mkdtemp(prefix="dflash-load-report-")
    os.makedirs(scratch, exist_ok=True)
    report = {"benchmark": "moe_load",
              "command": command_line("dflash_jax.tools.load_report",
                                      (invocation(args) or ["load-report"])[1:]).strip(),
              "repeats": args.repeats, "rows": [], "env": environment(), "cpu": cpu_info(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "configs": {}}
    try:
        for family in args.families:
            for size in args.sizes:
                path = os.path.join(scratch, f"{family}-{size}")
                status(f"writing the {size} {family} checkpoint")
                written = write_checkpoint(family, size, path)
                runs = []
                for i in range(args.repeats):
                    status(f"loading the {size} {family} checkpoint ({i + 1}/{args.repeats})")
                    runs.append(measure(family, path))
                shutil.rmtree(path, ignore_errors=True)
                report["configs"].setdefault(family, {})[size] = CONFIGS[family][size]
                report["rows"].append({"family": family, "size": size, **written, "runs": runs,
                                       "summary": summarize(runs, written["weight_bytes"])})
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    loads = [r[k] for row in report["rows"] for r in row["runs"]
             for k in ("load_average_before", "load_average_after") if r.get(k)]
    report["warning"] = busy_warning(max(loads, key=lambda l: l[0])) if loads else None
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "load_report.json"), report)
    text = markdown(report)
    write_text(os.path.join(args.out, "load_report.md"), text)
    print(text)
    return report


def main(argv=None) -> dict:
    return command_main("load-report", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
