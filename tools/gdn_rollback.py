"""The Gated DeltaNet rollback's two record modes measured: time of a verify + rollback and the
bytes it keeps, ``snapshot`` against ``replay`` (``dflash_jax.nn.gated_delta``).

    python -m dflash_jax gdn-rollback --out results/hybrid                  # Qwen3.5-4B's GDN layer
    python -m dflash_jax gdn-rollback --layer tiny --block-size 4 --batch 1 --repeats 1 \\
        --calls-per-run 1 --model-new-tokens 8 --out runs/gdn_rollback            # smoke size

Layer (``--layer``): one random GDN layer's token mixing, from its projections' outputs
(qkv [B, T, C], a, b [B, T, Hv]) to the core output, over a block of T rows from a random state,
then each row's state rolled back to a random kept length n in 0..T:

  snapshot   ``gated_delta.mix(form="recurrent", record=True)``: the recurrence keeping the state
             after every row ([B, T + 1, Hv, dk, dv] per layer); rollback selects row n;
  replay     ``mix(form="chunked", record=True)``: the chunked form keeping the chunk-boundary
             states and the block's prepared k, v, g, beta; rollback re-runs one chunk's state
             update with the rows from n on masked.

``qwen3.5-4b`` is Qwen3.5-4B's GDN layer (:data:`LAYERS`: 16 key heads and 32 value heads of 128,
conv kernel 4; the config.json of ``Qwen/Qwen3.5-4B``, ``text_config``); ``tiny`` a smoke size.
The layer's projections (in_proj_qkv, in_proj_z, in_proj_a, in_proj_b [D, .], out_proj [Hv dv, D])
are timed on the same B T rows for scale ("projections"): the modes differ only in the mixing.

Recorded per (mode, block size, batch): seconds per call (``--repeats`` runs of ``--calls-per-run``
compiled calls dispatched back to back, the runs of the two modes alternating so that a change
of the machine's load hits both; median and spread min..max over the runs), the record's
bytes (from ``jax.eval_shape``: what the mode keeps between the verify and the rollback, per
layer), and XLA's compiled memory analysis of the verify + rollback program (arguments, outputs
and temporaries: its peak on this backend). Before timing, the two modes' rolled-back states are
compared (max abs difference).

Model (``--model-new-tokens`` > 0, once the hybrid family is registered): the tiny random
hybrid target of :data:`TINY_HYBRID` with a random 1-layer drafter, greedy DFlash with each
``gdn_rollback`` mode: decode seconds per iteration (median of ``--repeats`` runs after a
compiling one) and DFlash == AR token for token.

Recorded beside: the machine (CPU model, family, vector extensions; load averages before and
after, with ``reporting.busy_warning``), versions, the command. Writes ``gdn_rollback.json``,
``.md`` and ``.png`` under ``--out``.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.nn import gated_delta as gd
from dflash_jax.progress import progress
from dflash_jax.reporting import (command_line, environment, machine_fields, machine_sentence,
                                  new_figure, publish_report, start_measurement)

MODES = ("snapshot", "replay")

# Qwen/Qwen3.5-4B config.json, text_config: hidden_size 2560, 32 layers (layer_types
# 3 x linear_attention + full_attention, repeated: 24 GDN layers), linear_num_key_heads 16,
# linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128,
# linear_conv_kernel_dim 4 (results/hybrid/README.md gives the sources).
LAYERS = {
    "qwen3.5-4b": dict(hidden=2560, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                       head_v_dim=128, conv_kernel=4, gdn_layers=24),
    "tiny": dict(hidden=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8,
                 conv_kernel=4, gdn_layers=3),
}
"""GDN layer shapes: D, Hk, Hv, dk, dv, K, and the model's number of GDN layers (to scale the
per-layer record to a whole model)."""

TINY_HYBRID = {
    "model_type": "qwen3_5_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
"""The tiny random hybrid target of the model measurement (``config.json`` of a
``qwen3_5_text`` model: 3 GDN layers and one gated attention layer)."""


# ---------------------------------------------------------------------------- the layer
@dataclasses.dataclass(frozen=True)
class Shape:
    hidden: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    gdn_layers: int = 1

    @property
    def channels(self) -> int:
        """C: the conv channels (q, k, v concatenated)."""
        return gd.conv_channels(self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim)

    @property
    def state_elems(self) -> int:
        """Elements of one row's recurrent state: Hv dk dv."""
        return gd.state_elems(self.num_v_heads, self.head_k_dim, self.head_v_dim)


def record_bytes(shape: Shape, mode: str, batch: int, block: int, chunk: int = gd.DEFAULT_CHUNK,
                 itemsize: int = 4) -> int:
    """Bytes one layer keeps between the verify of a block of ``block`` rows and the rollback
    (float32 states; the conv inputs in ``itemsize``), by formula:

    snapshot: the conv window and block inputs B (K-1+T) C and B (T+1) states;
    replay: the same inputs, B (N+1) chunk-boundary states (N = ceil(T / Cs), Cs = min(chunk, T))
    and the block's k, v, g, beta padded to N Cs rows: B N Cs Hv (dk + dv + 2) floats."""
    inputs = batch * (shape.conv_kernel - 1 + block) * shape.channels * itemsize
    if mode == "snapshot":
        return inputs + batch * (block + 1) * shape.state_elems * 4
    cs = min(chunk, block)
    n = -(-block // cs)
    per_row = shape.num_v_heads * (shape.head_k_dim + shape.head_v_dim + 2)
    return inputs + batch * (n + 1) * shape.state_elems * 4 + batch * n * cs * per_row * 4


def layer_inputs(shape: Shape, batch: int, block: int, seed: int = 0) -> dict:
    """Random weights and block inputs of one GDN layer (float32): conv_weight [K, C], A_log and
    dt_bias [Hv], qkv [B, T, C], a, b [B, T, Hv], the conv window [B, K-1, C], a state0
    [B, Hv, dk, dv] and kept lengths keep int32[B] in 0..T."""
    ks = iter(jax.random.split(jax.random.key(seed), 9))
    C, Hv = shape.channels, shape.num_v_heads
    n = lambda *s: jax.random.normal(next(ks), s, jnp.float32)
    return {"conv_weight": 0.5 * n(shape.conv_kernel, C), "A_log": 0.1 * n(Hv), "dt_bias": 0.1 * n(Hv),
            "qkv": n(batch, block, C), "a": n(batch, block, Hv), "b": n(batch, block, Hv),
            "window": n(batch, shape.conv_kernel - 1, C),
            "state0": 0.1 * n(batch, Hv, shape.head_k_dim, shape.head_v_dim),
            "keep": jax.random.randint(next(ks), (batch,), 0, block + 1, jnp.int32)}


def verify_rollback(shape: Shape, mode: str, chunk: int = gd.DEFAULT_CHUNK):
    """fn(inputs) -> (o [B, T, Hv, dv], conv [B, K-1, C], ssm [B, Hv, dk, dv]): the layer's
    verify of the block and each row's state rolled back to ``keep`` through
    ``GatedDeltaState`` (one layer, start 0)."""
    dims = dict(num_k_heads=shape.num_k_heads, head_k_dim=shape.head_k_dim,
                num_v_heads=shape.num_v_heads, head_v_dim=shape.head_v_dim)

    def fn(x):
        form = "recurrent" if mode == "snapshot" else "chunked"
        o, rec = gd.mix(x["qkv"], x["a"], x["b"], conv_weight=x["conv_weight"], A_log=x["A_log"],
                        dt_bias=x["dt_bias"], window=x["window"], state0=x["state0"], form=form,
                        record=True, chunk_size=chunk, **dims)
        B, T = x["qkv"].shape[:2]
        zero = jnp.zeros((B,), jnp.int32)
        state = gd.GatedDeltaState(x["window"][None], x["state0"][None], zero, zero)
        state = state.after_block(gd.stack_records([rec]), zero, zero + T).rollback(x["keep"])
        return o, state.conv[0], state.ssm[0]

    return fn


def projections(shape: Shape, batch: int, block: int, seed: int = 1):
    """(fn(x, w) -> [B T, D], x, w): the layer's projections on B T rows (in_proj_qkv, _z, _a,
    _b as one [D, C + Hv dv + 2 Hv] matrix, out_proj [Hv dv, D]), for scale."""
    D, vd = shape.hidden, shape.num_v_heads * shape.head_v_dim
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    w = {"in": 0.02 * jax.random.normal(k1, (D, shape.channels + vd + 2 * shape.num_v_heads)),
         "out": 0.02 * jax.random.normal(k2, (vd, D))}
    x = jax.random.normal(k3, (batch * block, D))
    return (lambda x, w: (x @ w["in"])[:, :vd] @ w["out"]), x, w


def time_calls(fns: dict, args, *, calls: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each compiled ``fns[name](*args)``: ``repeats`` runs (after a
    compiling warm-up) of ``calls`` calls dispatched back to back with one wait at the end, the
    functions' runs alternating. Returns {name: [seconds per call of each run]}."""
    progs = {k: jax.jit(f) for k, f in fns.items()}
    for prog in progs.values():
        jax.block_until_ready(prog(*args))
    out = {k: [] for k in fns}
    for _ in range(repeats):
        for k, prog in progs.items():
            t0 = time.perf_counter()
            jax.block_until_ready([prog(*args) for _ in range(calls)])
            out[k].append((time.perf_counter() - t0) / calls)
    return out


def compiled_memory(fn, *args) -> dict | None:
    """XLA's memory analysis of ``jax.jit(fn)`` compiled for ``args``: argument, output and
    temporary bytes, and their sum (the program's peak on this backend, aliasing aside);
    None where the backend gives none."""
    try:
        m = jax.jit(fn).lower(*args).compile().memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if m is None:
        return None
    d = {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp")}
    return d | {"peak": d["argument"] + d["output"] + d["temp"]}


def summary(times: list[float]) -> dict:
    return {"times_s": times, "median_ms": 1e3 * float(np.median(times)),
            "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times)}


def measure_layer(shape: Shape, blocks, batches, *, calls: int, repeats: int, chunk: int,
                  seed: int = 0) -> list[dict]:
    """One row per (block, batch, mode) and per (block, batch) for the projections."""
    rows = []
    cases = [(t, b) for t in blocks for b in batches]
    for t, b in progress(cases, desc="gdn layer (block, batch)", unit="case"):
        x = layer_inputs(shape, b, t, seed)
        fns = {m: verify_rollback(shape, m, chunk) for m in MODES}
        with jax.default_matmul_precision("highest"):
            ssm = {m: jax.jit(fns[m])(x)[2] for m in ("snapshot", "replay")}
        diff = float(jnp.max(jnp.abs(ssm["snapshot"] - ssm["replay"])))
        times = time_calls(fns, (x,), calls=calls, repeats=repeats)
        for m in MODES:
            rows.append({"block": t, "batch": b, "mode": m, **summary(times[m]),
                         "record_bytes": record_bytes(shape, m, b, t, chunk),
                         "record_bytes_eval_shape": _record_nbytes(shape, m, x, chunk),
                         "memory": compiled_memory(fns[m], x),
                         "snapshot_vs_replay_max_abs_diff": diff})
        pf, px, pw = projections(shape, b, t)
        rows.append({"block": t, "batch": b, "mode": "projections",
                     **summary(time_calls({"p": pf}, (px, pw), calls=calls, repeats=repeats)["p"]),
                     "weight_bytes": int(sum(v.nbytes for v in pw.values()))})
    return rows


def _record_nbytes(shape: Shape, mode: str, x: dict, chunk: int) -> int:
    """Bytes of the record ``mix`` returns for ``mode``, from ``jax.eval_shape`` (nothing runs)."""
    dims = dict(num_k_heads=shape.num_k_heads, head_k_dim=shape.head_k_dim,
                num_v_heads=shape.num_v_heads, head_v_dim=shape.head_v_dim)
    form = "recurrent" if mode == "snapshot" else "chunked"
    _, rec = jax.eval_shape(lambda x: gd.mix(
        x["qkv"], x["a"], x["b"], conv_weight=x["conv_weight"], A_log=x["A_log"],
        dt_bias=x["dt_bias"], window=x["window"], state0=x["state0"], form=form, record=True,
        chunk_size=chunk, **dims), x)
    return int(sum(np.prod(l.shape) * l.dtype.itemsize for l in jax.tree_util.tree_leaves(rec)))


# ---------------------------------------------------------------------------- the model
def hybrid_available() -> str | None:
    """None when the ``qwen3_5_text`` family is registered, else why not (one line)."""
    from dflash_jax import targets

    try:
        targets.family("qwen3_5_text")
    except Exception as e:  # noqa: BLE001 - the reason is recorded in the report
        return f"the hybrid family is not registered here: {type(e).__name__}: {e}"[:300]
    return None


def tiny_hybrid_config(mode: str | None = None, config: dict | None = None):
    """The TargetConfig of ``config`` (default :data:`TINY_HYBRID`) with ``gdn_rollback`` ``mode``."""
    from dflash_jax.config import TargetConfig

    cfg = TargetConfig.from_hf_dict(dict(config or TINY_HYBRID))
    return cfg if mode is None else dataclasses.replace(cfg, gdn_rollback=mode)


def measure_model(new_tokens: int, block: int, batch: int, repeats: int, seed: int = 0) -> list[dict]:
    """Per rollback mode: greedy DFlash on the tiny hybrid target with a random 1-layer drafter;
    seconds per iteration (decode time / iterations; median of ``repeats`` runs after a
    compiling one) and whether DFlash == AR token for token."""
    from dflash_jax.decoding.generation import generate
    from dflash_jax.models.handles import Drafter, Target

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, TINY_HYBRID["vocab_size"], size=16 - 3 * i).tolist() for i in range(batch)]
    pairs, ar, runs = {}, {}, {m: [] for m in MODES}
    with jax.default_matmul_precision("highest"):
        for mode in MODES:  # the same random weights: the mode changes no parameter
            target = Target.random(tiny_hybrid_config(mode), seed=seed + 1, dtype=jnp.float32)
            drafter = Drafter.random(target, num_layers=1, block_size=block, seed=seed + 2)
            pairs[mode] = (target, drafter)
            generate(target, prompts, new_tokens)  # compiles
            ar[mode] = generate(target, prompts, new_tokens)
            generate(target, prompts, new_tokens, drafter=drafter, block_size=block)  # compiles
        for _ in progress(range(repeats), desc="tiny hybrid model (runs of both modes)", unit="run"):
            for mode, (target, drafter) in pairs.items():
                runs[mode].append(generate(target, prompts, new_tokens, drafter=drafter, block_size=block))
    rows = []
    for mode in MODES:
        per_iter = [r.decode_time_s / r.num_steps for r in runs[mode]]
        rows.append({"mode": mode, **summary(per_iter), "iterations": runs[mode][0].num_steps,
                     "dflash_equals_ar": all(r.sequences == ar[mode].sequences for r in runs[mode]),
                     "ar_ms_per_step": 1e3 * ar[mode].decode_time_s / ar[mode].num_steps})
    return rows


# ---------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    s = report["settings"]
    sh = Shape(**report["layer_shape"])
    lines = [f"`{report['command']}`", "",
             f"One random GDN layer `{s['layer']}` (D {sh.hidden}, Hk {sh.num_k_heads}, Hv "
             f"{sh.num_v_heads}, dk {sh.head_k_dim}, dv {sh.head_v_dim}, conv {sh.conv_kernel}; "
             f"float32) on {report['env']['device']}: verify of a block + rollback of every row to a "
             f"random kept length. {s['repeats']} runs of {s['calls']} compiled calls each; median "
             "and spread (min..max over the runs) per call. Record: bytes kept per layer between "
             "verify and rollback; peak: XLA's compiled memory analysis (arguments + outputs + "
             "temporaries) of the verify + rollback program.", "",
             machine_sentence(report),
             "", "| block | batch | mode | median ms | spread ms | record MB / layer | record MB / "
             f"model ({sh.gdn_layers} GDN layers) | peak MB (XLA) | median / replay's |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {(r["block"], r["batch"]): r["median_ms"] for r in report["layer"] if r["mode"] == "replay"}
    for r in report["layer"]:
        if r["mode"] == "projections":
            continue
        mem = r["memory"]["peak"] / 1e6 if r.get("memory") else float("nan")
        lines.append(f"| {r['block']} | {r['batch']} | {r['mode']} | {r['median_ms']:.3f} | "
                     f"{r['min_ms']:.3f}..{r['max_ms']:.3f} | {r['record_bytes'] / 1e6:.4g} | "
                     f"{r['record_bytes'] * sh.gdn_layers / 1e6:.4g} | {mem:.4g} | "
                     f"{r['median_ms'] / base[(r['block'], r['batch'])]:.2f}x |")
    proj = [r for r in report["layer"] if r["mode"] == "projections"]
    if proj:
        lines += ["", "The layer's projections on the same rows, for scale (median ms): "
                  + ", ".join(f"block {r['block']} batch {r['batch']}: {r['median_ms']:.3f}" for r in proj)
                  + f" ({proj[0]['weight_bytes'] / 1e6:.4g} MB of float32 weights)."]
    diffs = [r["snapshot_vs_replay_max_abs_diff"] for r in report["layer"] if r["mode"] == "snapshot"]
    lines += ["", f"Snapshot vs replay rolled-back state, max abs difference over the cases: {max(diffs):.2e}."]
    model = report.get("model")
    if isinstance(model, list):
        ms = report["settings"]
        lines += ["", f"Tiny hybrid model (`{TINY_HYBRID['model_type']}`, {TINY_HYBRID['num_hidden_layers']} "
                  f"layers: 3 GDN + 1 attention, D {TINY_HYBRID['hidden_size']}), random 1-layer drafter, "
                  f"block {ms['model_block_size']}, batch {ms['model_batch']}, {ms['model_new_tokens']} new "
                  "tokens, greedy, float32:", "",
                  "| mode | ms / iteration (median) | spread | iterations | DFlash == AR | AR ms / step |",
                  "|---|---|---|---|---|---|"]
        for r in model:
            lines.append(f"| {r['mode']} | {r['median_ms']:.2f} | {r['min_ms']:.2f}..{r['max_ms']:.2f} | "
                         f"{r['iterations']} | {r['dflash_equals_ar']} | {r['ar_ms_per_step']:.2f} |")
    elif model:
        lines += ["", f"Tiny hybrid model: not measured ({model})."]
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Median ms per verify + rollback (left) and record MB per layer (right) against the block
    size, one line per (mode, batch)."""
    fig, (a, b) = new_figure(1, 2, figsize=(11, 4))
    rows = [r for r in report["layer"] if r["mode"] != "projections"]
    for mode, style in zip(MODES, ("o-", "s--")):
        for batch in report["settings"]["batch"]:
            rs = sorted((r for r in rows if r["mode"] == mode and r["batch"] == batch), key=lambda r: r["block"])
            x = [r["block"] for r in rs]
            a.errorbar(x, [r["median_ms"] for r in rs],
                       yerr=[[r["median_ms"] - r["min_ms"] for r in rs], [r["max_ms"] - r["median_ms"] for r in rs]],
                       fmt=style, ms=4, capsize=2, label=f"{mode}, batch {batch}")
            b.plot(x, [r["record_bytes"] / 1e6 for r in rs], style, ms=4, label=f"{mode}, batch {batch}")
    a.set(xlabel="block size T", ylabel="ms per call (median, min..max)", yscale="log",
          title="verify + rollback, one GDN layer")
    b.set(xlabel="block size T", ylabel="MB kept per layer", yscale="log", title="rollback record")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.suptitle(f"GDN rollback, layer {report['settings']['layer']}, float32, {report['env']['device']}")
    return fig


# ---------------------------------------------------------------------------- command line
def add_arguments(p) -> None:
    p.add_argument("--layer", default="qwen3.5-4b", choices=sorted(LAYERS), help="the GDN layer's shape")
    p.add_argument("--block-size", type=int, nargs="+", default=[4, 8, 16], help="verify block sizes T")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="batch sizes (rows per call)")
    p.add_argument("--chunk", type=int, default=gd.DEFAULT_CHUNK,
                   help="chunk size of the chunked form (replay; a block shorter than it is one chunk)")
    p.add_argument("--calls-per-run", type=int, default=4, help="compiled calls dispatched back to back per timed run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs (median and spread)")
    p.add_argument("--model-new-tokens", type=int, default=96,
                   help="new tokens per row of the tiny hybrid model run (0: no model run)")
    p.add_argument("--model-block-size", type=int, default=8, help="block size of the model run")
    p.add_argument("--model-batch", type=int, default=2, help="rows of the model run")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--out", default="runs/gdn_rollback", help="output directory")


def check_args(args) -> None:
    for name in ("calls_per_run", "repeats", "chunk", "model_block_size", "model_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.model_new_tokens < 0:
        raise ValueError(f"--model-new-tokens must be >= 0, got {args.model_new_tokens}")
    if any(t < 1 for t in args.block_size) or any(b < 1 for b in args.batch):
        raise ValueError(f"--block-size and --batch must be >= 1, got {args.block_size} and {args.batch}")


def run(args) -> dict:
    check_args(args)
    load_before, cpu, warning = start_measurement()
    shape = Shape(**LAYERS[args.layer])
    layer = measure_layer(shape, args.block_size, args.batch, calls=args.calls_per_run, repeats=args.repeats,
                          chunk=args.chunk, seed=args.seed)
    model = None
    if args.model_new_tokens:
        model = hybrid_available() or measure_model(args.model_new_tokens, args.model_block_size,
                                                    args.model_batch, args.repeats, args.seed)
    report = {
        "benchmark": "gdn_rollback",
        "command": command_line("dflash_jax", invocation(args)),
        "settings": {"layer": args.layer, "block_size": list(args.block_size), "batch": list(args.batch),
                     "chunk": args.chunk, "calls": args.calls_per_run, "repeats": args.repeats,
                     "model_new_tokens": args.model_new_tokens, "model_block_size": args.model_block_size,
                     "model_batch": args.model_batch, "seed": args.seed},
        "layer_shape": dataclasses.asdict(shape),
        "layer": layer,
        "model": model,
        "machine": machine_fields(cpu, load_before, warning),
        "env": environment(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return publish_report(report, args.out, "gdn_rollback", plot, markdown)


def main(argv=None) -> dict:
    return command_main("gdn-rollback", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
