"""One MoE layer against dense SwiGLU layers: decode (1 row) and verify (16 rows) times.

    python -m dflash_jax moe-layer-speed --out results/moe_layer       # D 1024, E 32, k 4, F 256
    python -m dflash_jax moe-layer-speed --hidden 64 --experts 8 --experts-per-token 2 --expert-width 32 \\
        --rows 1 4 --repeats 1 --dispatch-calls 2 --out runs/moe_layer       # smoke size

For each row count it times, on this machine's default device:

  moe gather   the router (x @ W_r [D, E], softmax, top-k, renormalised: Qwen3-MoE's
               ``route_softmax_topk``) and ``nn.moe.moe_ffn(impl="gather")``: every
               token-expert pair's matrices gathered (w[ids]) and batched matvecs;
  moe ragged   the same router and ``moe_ffn(impl="ragged")``: the pairs sorted by expert and
               one ``jax.lax.ragged_dot`` per projection (on CPU it lowers to a masked dense
               product over all E experts);
  moe dense    the same router and ``moe_ffn(impl="dense")``: every row through every expert,
               each expert read once, combined with the routing weights (what ``impl="auto"``
               runs on CPU once the pairs ``rows * k`` reach E);
  dense active a dense SwiGLU of width k F: the same parameters a token multiplies with
               (what the MoE layer would cost if it read only one token's k experts);
  dense all    a dense SwiGLU of width E F: all the experts' parameters.

Timing: ``--repeats`` runs (after a warm-up that compiles) of ``--dispatch-calls`` calls of the compiled
layer dispatched back to back with one wait at the end: min and median seconds per call (the
host dispatch, tens of microseconds, is included). A second timing runs ``--program-calls``
calls inside ONE compiled program (each on a differently scaled input, the outputs summed; the
scheme of ``bench.env.time_in_program``), as the layer runs inside the decode loop: XLA may
compile the layer differently there (on CPU the gather path is much slower inside the larger
program, see results/moe_layer). Beside the times, the weight bytes each variant must read per
call (gather: every pair's expert, duplicates included, ``rows * k`` experts; ragged on CPU:
all E experts; dense: its matrices; the router in the MoE variants) and the expected distinct
experts the rows route to under uniform routing, E (1 - (1 - k/E)^rows), the floor an
implementation reading each active expert once would reach.
The gather output is compared with the ragged and dense ones (the larger max abs difference) before timing.

Recorded: the machine (CPU model, family, vector extensions such as AVX-512; load averages
before and after, with the busy warning of ``reporting.busy_warning``), versions, the command.
Writes ``moe_layer.json``, ``.md`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.nn import moe
from dflash_jax.progress import progress
from dflash_jax.reporting import (command_line, cpu_description, environment, machine_fields,
                                  new_figure, publish_report, start_measurement)

VARIANTS = ("moe gather", "moe ragged", "moe dense", "dense active", "dense all")


# ---------------------------------------------------------------------------- the layers
def init_weights(D: int, E: int, F: int, k: int, dtype, seed: int = 0) -> dict:
    """Random weights: the router [D, E], the experts' gate_up [E, D, 2F] and down [E, F, D],
    and two dense SwiGLUs: ``active`` of width k F and ``all`` of width E F ({gate_up
    [D, 2W], down [W, D]})."""
    keys = iter(jax.random.split(jax.random.key(seed), 7))
    # drawn on the device in ``dtype`` (a GPU-sized layer would not fit the host in float64)
    w = lambda *s: 0.02 * jax.random.normal(next(keys), s, dtype)
    return {"router": w(D, E),
            "experts": {"gate_up": w(E, D, 2 * F), "down": w(E, F, D)},
            "active": {"gate_up": w(D, 2 * k * F), "down": w(k * F, D)},
            "all": {"gate_up": w(D, 2 * E * F), "down": w(E * F, D)}}


def moe_layer(x, router, experts, *, k: int, impl: str):
    """Router + routed experts on x [N, D] (softmax top-k, renormalised) -> [N, D]."""
    weights, ids = moe.route_softmax_topk(x @ router, k, normalize=True)
    return moe.moe_ffn(x, weights, ids, gate_up=experts["gate_up"], down=experts["down"], impl=impl)


def dense_layer(x, p):
    """A dense SwiGLU: swiglu(x @ gate_up) @ down, x [N, D] -> [N, D]."""
    return moe.swiglu(x @ p["gate_up"]) @ p["down"]


def layer_fns(weights: dict, k: int) -> dict:
    """{variant: fn(x) -> [N, D]} over ``weights`` (closed over: arguments of the program)."""
    return {"moe gather": lambda x, w: moe_layer(x, w["router"], w["experts"], k=k, impl="gather"),
            "moe ragged": lambda x, w: moe_layer(x, w["router"], w["experts"], k=k, impl="ragged"),
            "moe dense": lambda x, w: moe_layer(x, w["router"], w["experts"], k=k, impl="dense"),
            "dense active": lambda x, w: dense_layer(x, w["active"]),
            "dense all": lambda x, w: dense_layer(x, w["all"])}


# ---------------------------------------------------------------------------- bytes
def expected_experts(E: int, k: int, rows: int) -> float:
    """Distinct experts ``rows`` tokens route to under uniform top-k routing."""
    return E * (1.0 - (1.0 - k / E) ** rows)


def weight_bytes(variant: str, D: int, E: int, F: int, k: int, rows: int, itemsize: int) -> float:
    """Weight bytes one call of ``variant`` reads on ``rows`` rows (module doc): an expert is
    3 D F parameters; the MoE variants add the router D E."""
    expert = 3 * D * F
    router = D * E
    params = {"moe gather": router + rows * k * expert,
              "moe ragged": router + E * expert,
              "moe dense": router + E * expert,
              "dense active": k * expert,
              "dense all": E * expert}[variant]
    return float(params * itemsize)


# ---------------------------------------------------------------------------- timing
def time_dispatched(fn, x, w, *, calls: int, repeats: int) -> list[float]:
    """Seconds per call of the compiled ``fn(x, w)`` called ``calls`` times back to back (each
    call dispatched from the host, one wait at the end), once per repeat after a warm-up:
    ``repeats`` values."""
    prog = jax.jit(fn)
    jax.block_until_ready(prog(x, w))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = [prog(x, w) for _ in range(calls)]
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - t0) / calls)
    return times


def time_in_program(fn, x, w, *, calls: int, repeats: int) -> list[float]:
    """Seconds per call of ``fn(x, w)``, ``calls`` calls inside one compiled program (each on
    a differently scaled input, all outputs summed), once per repeat after a warm-up."""

    def many(x, w):
        total = jnp.zeros((), jnp.float32)
        for i in range(calls):
            out = fn(x * jnp.asarray(1 + i / 64, x.dtype), w)
            total = total + jnp.sum(out[..., :1].astype(jnp.float32))
        return total

    prog = jax.jit(many)
    jax.block_until_ready(prog(x, w))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(prog(x, w))
        times.append((time.perf_counter() - t0) / calls)
    return times


def measure(args) -> list[dict]:
    """One row per (rows, variant): times (every repeat, min, median), bytes, GB/s."""
    D, E, F, k = args.hidden, args.experts, args.expert_width, args.experts_per_token
    dtype = jnp.dtype(args.dtype)
    weights = init_weights(D, E, F, k, dtype, args.seed)
    fns = layer_fns(weights, k)
    out = []
    cases = [(r, v) for r in args.rows for v in VARIANTS]
    xs = {r: jax.random.normal(jax.random.key(args.seed + r), (r, D), dtype) for r in args.rows}
    check = {}
    for r in args.rows:  # the MoE paths must agree before they are timed
        g = jax.jit(functools.partial(fns["moe gather"]))(xs[r], weights).astype(jnp.float32)
        check[r] = max(float(jnp.max(jnp.abs(g - jax.jit(fns[v])(xs[r], weights).astype(jnp.float32))))
                       for v in ("moe ragged", "moe dense"))
    for r, variant in progress(cases, desc="moe layer (rows, variant)", unit="case"):
        times = time_dispatched(fns[variant], xs[r], weights, calls=args.dispatch_calls, repeats=args.repeats)
        inside = time_in_program(fns[variant], xs[r], weights, calls=args.program_calls,
                                 repeats=args.repeats)
        nbytes = weight_bytes(variant, D, E, F, k, r, dtype.itemsize)
        med = float(np.median(times))
        out.append({"rows": r, "variant": variant, "times_s": times, "min_us": 1e6 * min(times),
                    "median_us": 1e6 * med, "in_program_times_s": inside,
                    "in_program_median_us": 1e6 * float(np.median(inside)),
                    "weight_bytes": nbytes, "GBps_median": nbytes / med / 1e9,
                    "distinct_experts": expected_experts(E, k, r),
                    "gather_vs_ragged_max_abs_diff": check[r] if variant.startswith("moe") else None})
    return out


# ---------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    s = report["settings"]
    D, E, F, k = s["hidden"], s["experts"], s["expert_width"], s["top_k"]
    m = report["machine"]
    load = lambda x: ", ".join(f"{v:.2f}" for v in x) if x else "unknown"
    lines = [f"`{report['command']}`", "",
             f"One MoE layer (D {D}, E {E} experts of width {F}, top-{k}, {s['dtype']}) against "
             f"dense SwiGLUs of width k F = {k * F} (the active parameters) and E F = {E * F} (all "
             f"experts); {s['repeats']} timed runs of {s['calls']} compiled calls dispatched back "
             f"to back (min / median per call), and the median of {s['repeats']} runs of "
             f"{s['program_calls']} calls inside one compiled program.", "",
             f"Machine: {cpu_description(m['cpu'])}; jax {report['env']['jax']} on "
             f"{report['env']['device']}; load average {load(m['load_average_before'])} (1, 5, 15 "
             f"min) before, {load(m['load_average_after'])} after."
             + (f" {m['busy_warning']}." if m.get("busy_warning") else ""), "",
             "| rows | variant | min (us) | median (us) | in one program, median (us) | weight MB read "
             "| GB/s (median) | vs dense active | vs dense all |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        base = {v["variant"]: v["median_us"] for v in report["results"] if v["rows"] == r["rows"]}
        lines.append(f"| {r['rows']} | {r['variant']} | {r['min_us']:.1f} | {r['median_us']:.1f} | "
                     f"{r['in_program_median_us']:.1f} | {r['weight_bytes'] / 1e6:.2f} | {r['GBps_median']:.1f} | "
                     f"{r['median_us'] / base['dense active']:.2f}x | "
                     f"{r['median_us'] / base['dense all']:.2f}x |")
    lines += ["", "Distinct experts the rows route to (uniform routing, E (1 - (1 - k/E)^rows)): "
              + ", ".join(f"{r} row{'s' if r > 1 else ''}: {expected_experts(E, k, r):.1f} of {E}" for r in s["rows"])
              + "; the gather path reads rows x k experts (duplicates included), the ragged path "
              "on CPU all E. Gather vs ragged output, max abs difference: "
              + ", ".join(f"{r} row(s) {v:.2e}" for r, v in report["gather_vs_ragged"].items()) + "."]
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Median time per call (bars; the min as a tick, the in-program median as a cross) per
    variant and row count."""
    rows = report["settings"]["rows"]
    fig, axes = new_figure(1, len(rows), figsize=(5.5 * len(rows), 4), squeeze=False)
    for ax, r in zip(axes[0], rows):
        res = [x for x in report["results"] if x["rows"] == r]
        pos = np.arange(len(res))
        ax.bar(pos, [x["median_us"] / 1e3 for x in res], color=["C0", "C1", "C2", "C3"][:len(res)])
        ax.plot(pos, [x["min_us"] / 1e3 for x in res], "k_", ms=20, label="min")
        ax.plot(pos, [x["in_program_median_us"] / 1e3 for x in res], "kx", label="in one program")
        ax.set_xticks(pos, [x["variant"] for x in res], fontsize=8)
        ax.set(yscale="log", ylabel="ms per call (median; log scale)", title=f"{r} row{'s' if r > 1 else ''}")
        ax.legend(fontsize=7)
    s = report["settings"]
    fig.suptitle(f"MoE layer D {s['hidden']}, E {s['experts']} x F {s['expert_width']}, top-{s['top_k']}, "
                 f"{s['dtype']}, {report['env']['device']}")
    return fig


def add_arguments(p) -> None:
    p.add_argument("--hidden", type=int, default=1024, help="hidden size D")
    p.add_argument("--experts", type=int, default=32, help="routed experts E")
    p.add_argument("--experts-per-token", type=int, default=4, help="experts per token k")
    p.add_argument("--expert-width", type=int, default=256, help="an expert's SwiGLU width F")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16],
                   help="rows per call: 1 (a decode step), 16 (a verify block)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute dtype of the weights and activations")
    p.add_argument("--dispatch-calls", type=int, default=16,
                   help="compiled calls dispatched back to back per timed run")
    p.add_argument("--program-calls", type=int, default=4,
                   help="calls inside one compiled program (the second timing)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each program (min and median)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--out", default="runs/moe_layer", help="output directory")


def check_args(args) -> None:
    for name in ("hidden", "experts", "experts_per_token", "expert_width", "dispatch_calls",
                 "program_calls", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.experts_per_token > args.experts:
        raise ValueError(f"--experts-per-token {args.experts_per_token} exceeds --experts {args.experts}")
    if any(r < 1 for r in args.rows):
        raise ValueError(f"--rows must be >= 1, got {args.rows}")


def run(args) -> dict:
    check_args(args)
    load_before, cpu, warning = start_measurement()
    results = measure(args)
    report = {
        "benchmark": "moe_layer_speed",
        "command": command_line("dflash_jax", invocation(args)),
        "settings": {"hidden": args.hidden, "experts": args.experts, "top_k": args.experts_per_token,
                     "expert_width": args.expert_width, "rows": list(args.rows), "dtype": args.dtype,
                     "calls": args.dispatch_calls, "program_calls": args.program_calls,
                     "repeats": args.repeats, "seed": args.seed},
        "results": results,
        "gather_vs_ragged": {str(r["rows"]): r["gather_vs_ragged_max_abs_diff"]
                             for r in results if r["variant"] == "moe gather"},
        "machine": machine_fields(cpu, load_before, warning),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return publish_report(report, args.out, "moe_layer", plot, markdown)


def main(argv=None) -> dict:
    return command_main("moe-layer-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
