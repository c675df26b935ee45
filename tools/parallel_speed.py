"""Tensor- and data-parallel decoding on 8 devices: the AR step time and the DFlash iteration
time on every (data, model) mesh of 8 devices, and a check that greedy outputs on every mesh
equal the single-device ones.

A random Qwen3-shaped target whose head counts, MLP width and vocabulary divide 8 (4 layers,
D 256, 8 query and 8 KV heads of 32, F 768, vocabulary 4096, float32) and a 1-layer drafter
(block 16), batch 8 (divisible by every data size). For each mesh (data, model) in (1, 1) (one
device, no shard_map), (1, 8), (2, 4), (4, 2), (8, 1) (one the model cannot split, or that
needs more devices than there are, is skipped with a note): the prefilled loop state
(``prepare_decode``), then the engine's jitted decode loop (``engine.decode``, the whole
``while_loop`` inside one ``shard_map`` on a mesh) for ``--iterations`` iterations per call,
timed after a warm-up: ``--repeats`` runs of each loop, AR and DFlash alternating so that both
see the same load of a shared machine; the median per step / iteration (and the minimum). Both
loops get the same cache length and a token budget that no row can exhaust, so every run is
exactly ``--iterations`` iterations.

Reported per mesh: ms per AR step, ms per DFlash iteration, their ratio, per-row throughput
(AR: 1 token per step; DFlash: the measured tokens per iteration, about 1 with random weights,
and the projection at the paper's tau 6.49), and whether the greedy tokens of both loops equal
those of the one-device run (and DFlash's equal AR's on the same mesh). That check reads the
tokens of the timed runs; it is not timed itself.

**On a CPU these figures are only a sanity check of the sharded program, not a prediction for
GPUs**: the 8 "devices" are virtual (``XLA_FLAGS=--xla_force_host_platform_device_count=8``)
and share the machine's cores, so sharding adds no compute (a mesh that beats one device does
so by keeping more of those cores busy, not by scaling), every device reads its weights from
the same memory, and an all-reduce is a memory copy between threads. What a GPU mesh would gain is modelled in ``parallel_comm``
(results/parallel/README.md).

On a CPU with fewer than 8 devices the command gets them itself: before jax has started its
CPU backend it sets the XLA flag for this process; when the backend is already running (a
caller that used jax first) it re-runs itself in a subprocess with the flag.

    python -m dflash_jax.tools.parallel_speed            # results/parallel/parallel_speed.{json,md,png}
    python -m dflash_jax.tools.parallel_speed --quick --out runs/parallel_speed   # smoke size
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from dflash_jax import parallel
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode, round_up
from dflash_jax.models.handles import Drafter, Target
from dflash_jax.config import TargetConfig
from dflash_jax.reporting import (command_line, cpu_model, environment, load_average, new_figure, report_figure,
                                  save_figure)
from dflash_jax.files import write_json, write_text
from dflash_jax.cli import command_main, invocation

DEVICES = 8
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
CHILD_ENV = "DFLASH_PARALLEL_SPEED_CHILD"  # set in the re-run subprocess: no second re-run
MESHES = ((1, 1), (1, 8), (2, 4), (4, 2), (8, 1))
PAPER_TAU = 6.49
STEM = "parallel_speed"

# heads, KV heads, F and vocabulary all divide 8
MODEL = dict(model_type="qwen3", vocab_size=4096, hidden_size=256, intermediate_size=768,
             num_layers=4, num_heads=8, num_kv_heads=8, head_dim=32, max_position_embeddings=4096)
QUICK_MODEL = dict(model_type="qwen3", vocab_size=1024, hidden_size=128, intermediate_size=256,
                   num_layers=2, num_heads=8, num_kv_heads=8, head_dim=16,
                   max_position_embeddings=1024)
SETTINGS = dict(batch=8, prompt_len=64, iterations=32, repeats=7, block_size=16, drafter_layers=1)
QUICK_SETTINGS = dict(batch=8, prompt_len=16, iterations=4, repeats=2, block_size=16, drafter_layers=1)

CAVEAT = ("CPU sanity check only: the {n} devices are virtual host devices (XLA_FLAGS="
          "--xla_force_host_platform_device_count={n}) sharing this machine's {cores} cores and "
          "its memory, so sharding adds no compute (a mesh that beats one device does so by "
          "keeping more of those cores busy, not by scaling) and every all-reduce is a memory "
          "copy between threads. "
          "These times check that the sharded program runs and gives the one-device tokens; "
          "they are not a prediction for GPUs (see parallel_comm / comm.md for that).")


# ---------------------------------------------------------------------------- devices
def _backends_started() -> bool:
    """Whether jax has created its backends (after which XLA_FLAGS is no longer read)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # a private API: assume started (the safe answer)
        return True


def with_device_count(flags: str, n: int) -> str:
    """``flags`` (an XLA_FLAGS value) with the host device count set to ``n``."""
    kept = [f for f in flags.split() if not f.startswith(DEVICE_COUNT_FLAG)]
    return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={n}"])


@contextlib.contextmanager
def _device_count_flag(n: int):
    """XLA_FLAGS with ``n`` host devices while the body starts the backends; restored after
    (the backend has read it; subprocesses started later do not inherit it)."""
    old = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = with_device_count(old or "", n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = old


def ensure_devices(n: int = DEVICES) -> bool:
    """True when this process has ``n`` devices or is not on a CPU (then meshes that need more
    devices than there are are skipped); False when it runs on fewer than ``n`` CPU devices
    and it is too late to add more (the caller re-runs in a subprocess). Before the backends
    start, the host device count is set to ``n`` here."""
    import jax

    if not _backends_started():
        with _device_count_flag(n):
            jax.devices()
    return jax.device_count() >= n or jax.default_backend() != "cpu"


def rerun_in_subprocess(argv: list[str], out_dir: str) -> dict:
    """Runs this command again in a fresh Python with ``DEVICES`` host devices (its output
    shown as it comes); returns the report it wrote."""
    import json

    env = dict(os.environ)
    env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), DEVICES)
    env["JAX_PLATFORMS"] = "cpu"
    env[CHILD_ENV] = "1"
    print(f"jax started its CPU backend with fewer than {DEVICES} devices: running again with "
          f"XLA_FLAGS={env['XLA_FLAGS']}", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, "-m", __name__ if __name__ != "__main__"
                           else "dflash_jax.tools.parallel_speed", *argv], env=env)
    if proc.returncode:
        raise SystemExit(proc.returncode)
    stem = STEM + ("_quick" if "--quick" in argv else "")
    with open(os.path.join(out_dir, stem + ".json")) as f:
        return json.load(f)


# ---------------------------------------------------------------------------- measuring
def mesh_name(data: int, model: int) -> str:
    return f"{data}x{model}"


def parse_meshes(values) -> list[tuple[int, int]]:
    """``["1x1", "2x4"]`` -> [(1, 1), (2, 4)] (data x model)."""
    out = []
    for v in values:
        parts = str(v).lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise ValueError(f"--meshes {v!r}: expected DATAxMODEL with positive sizes, like 2x4")
        out.append((int(parts[0]), int(parts[1])))
    return out


def skip_reason(cfg, drafter_cfg, data: int, model: int, batch: int, devices: int) -> str | None:
    """Why the mesh (data, model) cannot run this benchmark, or None."""
    if data * model > devices:
        return f"needs {data * model} devices, {devices} available"
    if batch % data:
        return f"batch {batch} is not divisible by data={data}"
    try:
        parallel.check_model_split(cfg, model)
        parallel.check_model_split(drafter_cfg, model, "drafter")
    except ValueError as e:
        return str(e)
    return None


def time_loops(target, drafter, prompts, iterations: int, budget: int, pad_to, repeats: int,
               block_size: int) -> dict:
    """Seconds per iteration of the jitted decode loop, AR (one step per iteration) and DFlash:
    each run times ``iterations`` iterations in one call (a fresh prefilled state each time);
    one warm-up run of each (it compiles), then ``repeats`` runs of each, AR and DFlash
    alternating so that both see the same load of a shared machine. Median and minimum over the
    runs, and the tokens of the last run."""
    import jax
    import jax.numpy as jnp
    import numpy as np


    kinds = {"ar": {}, "dflash": {"drafter": drafter, "block_size": block_size}}
    times = {k: [] for k in kinds}
    states = {}
    for r in range(repeats + 1):  # run 0 compiles
        for kind, kw in kinds.items():
            pre = prepare_decode(target, prompts, budget, attention_impl="xla", pad_to=pad_to, **kw)
            t0 = time.perf_counter()
            state = engine.decode(target.params, pre.drafter_params, pre.state, pre.max_new,
                                  pre.stop_ids, jnp.int32(iterations), spec=pre.spec)
            jax.block_until_ready(state)
            if r:
                times[kind].append(time.perf_counter() - t0)
            states[kind] = state
    results = {}
    for kind, state in states.items():
        out, n, iters, accept = jax.device_get((state.out, state.n, state.iters, state.accept_lens))
        if not (iters == iterations).all():
            raise RuntimeError(f"a row stopped after {iters.min()} of {iterations} iterations: the "
                               "token budget should make every run exactly as long")
        made = n - 1  # tokens committed inside the loop (the prefill made the first)
        per_iteration = [t / iterations for t in times[kind]]
        results[kind] = {
            "seconds_per_iteration": statistics.median(per_iteration),
            "min_seconds_per_iteration": min(per_iteration),
            "loop_seconds": statistics.median(times[kind]), "per_iteration_s": per_iteration,
            "sequences": [out[b, :n[b]].tolist() for b in range(len(n))],
            "tokens_per_iteration": float(np.mean(made) / iterations),
            "tau": float(np.mean(accept[:, :iterations]))}
    return results


def loop_shape(settings: dict) -> dict:
    """Token budget, prompt width and cache length of both loops: the same cache for AR and
    DFlash, and a budget no row can use up, so that every run is exactly ``iterations`` long."""
    bs = settings["block_size"]
    budget = settings["iterations"] * bs + 1
    return {"budget": budget, "width": round_up(settings["prompt_len"], 16),
            "cache_len": round_up(settings["prompt_len"] + budget + bs, 64)}


def measure_mesh(target, drafter, data: int | None, model: int | None, settings: dict) -> dict:
    """AR and DFlash loops on one mesh (``data`` None: one device, no shard_map), with the
    one-device ``target`` and ``drafter``'s weights placed on it (the same weights everywhere)."""
    import numpy as np


    s, shape = settings, loop_shape(settings)
    if data is not None:
        mesh = parallel.make_mesh(data=data, model=model)
        target = Target(target.config, target.params, max_len=target.max_len, mesh=mesh)
        drafter = Drafter(drafter.config, drafter.params, mesh=mesh)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, target.config.vocab_size, size=(s["batch"], s["prompt_len"])).tolist()
    args = (prompts, s["iterations"], shape["budget"], (shape["width"], shape["cache_len"]),
            s["repeats"], s["block_size"])
    return {**time_loops(target, drafter, *args), "cache_len": shape["cache_len"]}


def summarise(name: str, data: int, model: int, m: dict, single: dict | None, batch: int) -> dict:
    ar, df = m["ar"], m["dflash"]
    ar_s, df_s = ar["seconds_per_iteration"], df["seconds_per_iteration"]
    ref = single or m
    prefix = [a[:len(d)] == d[:len(a)] for a, d in zip(ar["sequences"], df["sequences"])]
    return {
        "mesh": name, "data": data, "model": model, "devices": data * model,
        "shard_map": (data, model) != (1, 1),  # 1x1 is the one-device path
        "ar_ms_per_step": 1e3 * ar_s,
        "dflash_ms_per_iteration": 1e3 * df_s,
        "iteration_over_ar_step": df_s / ar_s,
        "ar_tokens_per_s_per_row": 1.0 / ar_s,
        "dflash_tokens_per_iteration": df["tokens_per_iteration"],
        "dflash_tokens_per_s_per_row": df["tokens_per_iteration"] / df_s,
        "dflash_tokens_per_s_per_row_at_paper_tau": PAPER_TAU / df_s,
        "ar_tokens_per_s": batch / ar_s,
        "dflash_tokens_per_s": batch * df["tokens_per_iteration"] / df_s,
        "ar_ms_per_step_min": 1e3 * ar["min_seconds_per_iteration"],
        "dflash_ms_per_iteration_min": 1e3 * df["min_seconds_per_iteration"],
        "ar_step_times_ms": [1e3 * t for t in ar["per_iteration_s"]],  # one per run
        "dflash_iteration_times_ms": [1e3 * t for t in df["per_iteration_s"]],
        "ar_loop_ms": 1e3 * ar["loop_seconds"], "dflash_loop_ms": 1e3 * df["loop_seconds"],
        "ar_equals_single_device": ar["sequences"] == ref["ar"]["sequences"],
        "dflash_equals_single_device": df["sequences"] == ref["dflash"]["sequences"],
        "dflash_equals_ar": all(prefix),
        "tau": df["tau"],
        "cache_len": m["cache_len"],
    }


def measure(meshes, quick: bool = False, settings: dict | None = None) -> dict:
    import jax
    import jax.numpy as jnp

    from dflash_jax.progress import Bar, progress

    s = dict(QUICK_SETTINGS if quick else SETTINGS, **(settings or {}))
    cfg = TargetConfig(**(QUICK_MODEL if quick else MODEL))
    # random weights made once, on one device; each mesh gets them placed sharded
    target = Target.random(cfg, seed=0, dtype=jnp.float32, max_len=loop_shape(s)["cache_len"])
    drafter = Drafter.random(target, num_layers=s["drafter_layers"], block_size=s["block_size"],
                             seed=1)
    dcfg = drafter.config
    load_start = load_average()
    rows, skipped, single = [], [], None
    meshes = list(meshes)
    if (1, 1) in meshes:  # the reference first
        meshes.remove((1, 1))
        meshes.insert(0, (1, 1))
    with jax.default_matmul_precision("highest"):
        for data, model in progress(meshes, desc="meshes"):
            name = mesh_name(data, model)
            reason = skip_reason(cfg, dcfg, data, model, s["batch"], jax.device_count())
            if reason:
                skipped.append({"mesh": name, "data": data, "model": model, "reason": reason})
                Bar.write(f"mesh {name}: skipped ({reason})")
                continue
            t0 = time.perf_counter()
            if (data, model) == (1, 1):
                m = measure_mesh(target, drafter, None, None, s)
                single = m
                row = summarise(f"{name} (one device)", 1, 1, m, None, s["batch"])
            else:
                m = measure_mesh(target, drafter, data, model, s)
                row = summarise(name, data, model, m, single, s["batch"])
                if single is None:  # no one-device reference was measured
                    row["ar_equals_single_device"] = row["dflash_equals_single_device"] = None
            row["wall_s"] = time.perf_counter() - t0
            row["load_average"] = load_average()
            rows.append(row)
            eq = lambda v: "n/a" if v is None else ("yes" if v else "NO")
            Bar.write(f"mesh {row['mesh']}: AR {row['ar_ms_per_step']:.2f} ms/step, DFlash "
                       f"{row['dflash_ms_per_iteration']:.2f} ms/iteration (x{row['iteration_over_ar_step']:.2f}); "
                       f"greedy = one device: AR {eq(row['ar_equals_single_device'])}, DFlash "
                       f"{eq(row['dflash_equals_single_device'])}; DFlash = AR: {eq(row['dflash_equals_ar'])}"
                       f"  (load {row['load_average']})")
    cores = os.cpu_count()
    env = environment_info()
    return {
        "benchmark": STEM, "quick": quick,
        "cpu_sanity_check_only": env["platform"] == "cpu",
        "caveat": CAVEAT.format(n=DEVICES, cores=cores) if env["platform"] == "cpu" else None,
        "target": cfg.to_hf_dict(), "drafter": dcfg.to_hf_dict(), "dtype": "float32",
        "settings": s, "results": rows, "skipped": skipped,
        "all_equal": all(r[k] is not False for r in rows for k in
                         ("ar_equals_single_device", "dflash_equals_single_device", "dflash_equals_ar")),
        "env": env, "load_average_start": load_start, "load_average_end": load_average(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def environment_info() -> dict:

    return {**environment(), "cpu_model": cpu_model(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


# ---------------------------------------------------------------------------- reporting
def plot(report: dict):
    import numpy as np


    rows = report["results"]
    fig, (a, b) = new_figure(1, 2, figsize=(10, 3.8))
    x = np.arange(len(rows))
    names = [r["mesh"].replace(" (one device)", "\n(1 device)") for r in rows]
    a.bar(x - 0.2, [r["ar_ms_per_step"] for r in rows], 0.4, label="AR step")
    a.bar(x + 0.2, [r["dflash_ms_per_iteration"] for r in rows], 0.4,
          label=f"DFlash iteration (block {report['settings']['block_size']})")
    a.set_xticks(x, names)
    a.set(xlabel="mesh (data x model)", ylabel="ms", title="time per step / iteration")
    a.legend(fontsize=8)
    b.bar(x, [r["iteration_over_ar_step"] for r in rows], 0.5, color="tab:green")
    b.set_xticks(x, names)
    b.set(xlabel="mesh (data x model)", ylabel="DFlash iteration / AR step", title="ratio")
    env = report["env"]
    what = ("CPU sanity check, NOT a GPU prediction: " if report["cpu_sanity_check_only"] else "")
    fig.suptitle(f"{what}{env['num_devices']} {env['platform']} devices on {env['cpu_count']} cores"
                 f"{' (quick)' if report['quick'] else ''}, batch {report['settings']['batch']}",
                 fontsize=10)
    return fig


def markdown(report: dict) -> str:
    s, env = report["settings"], report["env"]
    t = report["target"]
    yes = lambda v: "n/a" if v is None else ("yes" if v else "**NO**")
    lines = [f"# Tensor- and data-parallel decoding on {env['num_devices']} {env['platform']} devices"
             + (" (quick)" if report["quick"] else ""), ""]
    if report["caveat"]:
        lines += [f"**{report['caveat']}**", ""]
    lines += [
        f"Command: `{report['command']}` ({report['time']})", "",
        f"Machine: {env.get('cpu_model') or env['device']}, {env['cpu_count']} cores, "
        f"{env['num_devices']} {env['platform']} devices; load average (1, 5, 15 min) "
        f"{report['load_average_start']} at the start, {report['load_average_end']} at the end; "
        f"jax {env['jax']}, jaxlib {env['jaxlib']}, Python {env['python']}.", "",
        f"Target: random Qwen3-shaped, {t['num_hidden_layers']} layers, D {t['hidden_size']}, "
        f"{t['num_attention_heads']} heads / {t['num_key_value_heads']} KV heads of {t['head_dim']}, "
        f"F {t['intermediate_size']}, vocabulary {t['vocab_size']}, {report['dtype']}; drafter "
        f"{s['drafter_layers']} layer, block {s['block_size']}. Batch {s['batch']}, prompts of "
        f"{s['prompt_len']} tokens; each loop runs {s['iterations']} iterations (jitted "
        f"`engine.decode`, inside one `shard_map` on a mesh); after a warm-up, {s['repeats']} "
        "runs of each loop, AR and DFlash alternating (both see the same load); the median over "
        "the runs (the minimum in brackets), the ratio of the medians. Per-row tokens/s: AR 1 token per step; DFlash the measured tokens per "
        "iteration (random weights: about 1) and the projection at the paper's tau "
        f"{PAPER_TAU}.", "",
        "| mesh (data x model) | ms / AR step, median (min) | ms / DFlash iteration, median (min) | iteration / AR step | "
        "AR tok/s per row | DFlash tok/s per row (measured tau) | DFlash tok/s per row at tau "
        f"{PAPER_TAU} | greedy AR = 1 device | greedy DFlash = 1 device | DFlash = AR | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(
            f"| {r['mesh']} | {r['ar_ms_per_step']:.1f} ({r['ar_ms_per_step_min']:.1f}) | "
            f"{r['dflash_ms_per_iteration']:.1f} ({r['dflash_ms_per_iteration_min']:.1f}) | "
            f"{r['iteration_over_ar_step']:.2f} | {r['ar_tokens_per_s_per_row']:.0f} | "
            f"{r['dflash_tokens_per_s_per_row']:.0f} ({r['dflash_tokens_per_iteration']:.2f}) | "
            f"{r['dflash_tokens_per_s_per_row_at_paper_tau']:.0f} | "
            f"{yes(r['ar_equals_single_device'])} | {yes(r['dflash_equals_single_device'])} | "
            f"{yes(r['dflash_equals_ar'])} | {r['load_average']} |")
    for sk in report["skipped"]:
        lines.append(f"| {sk['mesh']} | skipped: {sk['reason']} | | | | | | | | | |")
    lines += ["", "Greedy outputs: " + ("every mesh gives the one-device tokens, and DFlash the "
                                         "AR tokens." if report["all_equal"] else
                                         "**some mesh differs from the one-device run** (table).")]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, STEM + ("_quick" if report["quick"] else ""))
    write_json(path + ".json", report)
    write_text(path + ".md", markdown(report))
    save_figure(report_figure(report, plot), path + ".png")
    print(f"wrote {path}.json, {path}.md and {path}.png")
    return path


# ---------------------------------------------------------------------------- command
def add_arguments(p) -> None:
    p.add_argument("--meshes", nargs="+", default=[mesh_name(*m) for m in MESHES],
                   help="meshes DATAxMODEL to measure (1x1: one device, no shard_map)")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"loop iterations per timed run (default {SETTINGS['iterations']}; "
                        f"--quick {QUICK_SETTINGS['iterations']})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed runs per loop, the median reported (default {SETTINGS['repeats']}; "
                        f"--quick {QUICK_SETTINGS['repeats']})")
    p.add_argument("--quick", action="store_true",
                   help="a smoke-sized run (smaller model, fewer iterations); writes "
                        f"{STEM}_quick.* so that it never replaces a full run's files")
    p.add_argument("--out", default="results/parallel", help="output directory")


def run(args) -> dict:

    meshes = parse_meshes(args.meshes)
    overrides = {}
    for key in ("iterations", "repeats"):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{key} must be >= 1, got {value}")
            overrides[key] = value
    inv = invocation(args)
    argv = inv[1:] if inv is not None else _argv(args)
    if not ensure_devices(DEVICES):
        if os.environ.get(CHILD_ENV):
            raise RuntimeError(f"the re-run still has fewer than {DEVICES} devices")
        return rerun_in_subprocess(argv, args.out)
    report = measure(meshes, quick=args.quick, settings=overrides)
    report["command"] = command_line("dflash_jax.tools.parallel_speed", argv).rstrip()
    write_outputs(report, args.out)
    if not report["all_equal"]:
        print("warning: greedy outputs differ between meshes (see the table)", file=sys.stderr)
    return report


def _argv(args) -> list[str]:
    """Options reproducing ``args`` (when they were not parsed by ``parse_command``)."""
    argv = ["--meshes", *map(str, args.meshes), "--out", str(args.out)]
    for key in ("iterations", "repeats"):
        if getattr(args, key) is not None:
            argv += [f"--{key}", str(getattr(args, key))]
    return argv + (["--quick"] if args.quick else [])


def main(argv=None) -> dict:

    return command_main("parallel-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    from dflash_jax.cli import run_cli

    run_cli(main)
