"""Gated DeltaNet chunked-form benchmark: the Pallas kernels of ``kernels/gdn_chunk.py``
against the ``jnp`` form ``nn.gated_delta.chunked`` that XLA compiles, on prepared inputs of
Qwen3.5's GDN head shapes (32 value heads of dk = dv = 128 per layer, chunks of 64) for a
prefill of T tokens and for a verify block: milliseconds per layer call (inside one
program, as in the engine), the kernels' largest difference from the ``jnp`` form relative
to its rms (of the outputs and of the chunk-boundary states, the worse), and the recurrent
state's bytes.

    python -m dflash_jax.tools.gdn_kernel_speed                  # on a GPU
    python -m dflash_jax.tools.gdn_kernel_speed --tokens 64 --value-heads 2 --dk 16 --dv 16 --chunk 16 \\
        --batch 1 --repeats 1 --interpret                        # CPU smoke run

On a GPU the kernels' products are TF32 (``gdn_chunked``'s default) and the ``jnp`` form's
are full float32 (``Precision.HIGHEST``, as the engine runs it), so the difference column
is the price of TF32 as well as of the kernels' different order of operations.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.bench.env import time_in_program
from dflash_jax.cli import command_main, invocation, options, run_cli
from dflash_jax.kernels.gdn_chunk import gdn_chunked
from dflash_jax.nn import gated_delta
from dflash_jax.reporting import command_line, environment, new_figure, write_report


def prepared_inputs(batch: int, tokens: int, heads: int, dk: int, dv: int, seed: int = 0):
    """q, k, v, g, beta as a GDN layer prepares them (unit q and k, decays near 1), and a state."""
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.standard_normal(s), jnp.float32)
    q, k, v = gated_delta.prepare(f(batch, tokens, heads, dk), f(batch, tokens, heads, dk),
                                  f(batch, tokens, heads, dv))
    g, beta = gated_delta.gates(f(batch, tokens, heads), f(batch, tokens, heads), jnp.full((heads,), -3.0),
                                jnp.zeros((heads,)))
    return q, k, v, g, beta, 0.3 * f(batch, heads, dk, dv)


def _with_state(fn):
    """``fn``'s output with its last state folded in (times 0: XLA keeps a float product by 0),
    so that neither form's state work is dropped from the timed program."""
    def call(*xs):
        o, bounds = fn(*xs)
        return o + 0.0 * jnp.sum(bounds[:, -1])
    return call


def plot(report: dict):
    fig, ax = new_figure(figsize=(6, 3.5))
    rows = report["results"]
    labels = [f"T={r['tokens']} B={r['batch']}" for r in rows]
    x = np.arange(len(rows))
    for i, (impl, name) in enumerate((("pallas", "Pallas kernels"), ("xla", "jnp form (XLA)"))):
        ax.bar(x + (i - 0.5) * 0.4, [r[f"{impl}_ms"] for r in rows], 0.4, label=name)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set(ylabel="ms per layer call (median)",
           title=f"GDN chunked form, {report['args']['value_heads']} heads of {report['args']['dk']}x"
                 f"{report['args']['dv']}, chunks of {report['args']['chunk']} ({report['env']['device']})")
    ax.legend(fontsize=7)
    return fig


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 512, 4096],
                   help="rows per call: a verify block, prefills")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes")
    p.add_argument("--value-heads", type=int, default=32, help="value heads of the layer (keys tiled onto them)")
    p.add_argument("--dk", type=int, default=128, help="key head dimension")
    p.add_argument("--dv", type=int, default=128, help="value head dimension")
    p.add_argument("--chunk", type=int, default=64, help="chunk length of the chunked form")
    p.add_argument("--interpret", action="store_true", help="the Pallas interpreter (CPU smoke run)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs of each form, the median reported")
    p.add_argument("--out", default="runs/gdn_kernel_speed", help="output directory")


def run(args) -> dict:
    for name in ("tokens", "batch"):
        if min(getattr(args, name)) < 1:
            raise ValueError(f"--{name} values must be >= 1, got {getattr(args, name)}")
    for name in ("value_heads", "dk", "dv", "chunk", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    kernel_full = jax.jit(lambda *xs: gdn_chunked(*xs, args.chunk, interpret=args.interpret))
    ref_full = jax.jit(lambda *xs: gated_delta.chunked(*xs, args.chunk))
    kernel, ref = jax.jit(_with_state(kernel_full)), jax.jit(_with_state(ref_full))
    rows = []
    for batch in args.batch:
        for tokens in args.tokens:
            xs = prepared_inputs(batch, tokens, args.value_heads, args.dk, args.dv)
            # the outputs and every chunk-boundary state (the replay rollback reads those)
            err = max(float(jnp.max(jnp.abs(got - want)) / jnp.sqrt(jnp.mean(want ** 2)))
                      for got, want in zip(kernel_full(*xs), ref_full(*xs)))
            row = {"batch": batch, "tokens": tokens, "max_abs_err_over_rms": err,
                   "state_bytes": 4 * batch * args.value_heads * args.dk * args.dv}
            for name, fn in (("pallas", kernel), ("xla", ref)):
                row[f"{name}_ms"] = 1e3 * time_in_program(fn, *xs, calls=4, repeats=args.repeats)
            row["xla_over_pallas"] = row["xla_ms"] / row["pallas_ms"]
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    report = {"benchmark": "gdn_kernel_speed", "args": options(args), "results": rows, "env": environment(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command_line("dflash_jax", invocation(args))}
    write_report(report, args.out, f"gdn_kernel_{report['env']['platform']}", plot)
    return report


def main(argv=None) -> dict:
    return command_main("gdn-kernel-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
