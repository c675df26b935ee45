"""Block-attention kernel benchmark: the Pallas kernel (and the Triton one, ``--impl triton``)
vs the XLA path vs cuDNN (``jax.nn.dot_product_attention(implementation="cudnn")``, context
only, where it applies), for a T-row block against caches of S positions with Qwen3-8B head
shapes: microseconds and achieved GB/s (K/V bytes of the valid prefix + q + out) against the
measured copy bandwidth.

    python -m dflash_jax.tools.kernel_speed                          # on a GPU
    python -m dflash_jax.tools.kernel_speed --seq 256 --batch 1 --interpret   # CPU smoke run
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.bench.env import copy_bandwidth, time_in_program
from dflash_jax.cli import command_main, invocation, options, run_cli
from dflash_jax.reporting import command_line, environment, new_figure, write_report
from dflash_jax.kernels.block_attention import block_attention, block_attention_reference


def _cudnn(q, k, v, lens):
    return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lens, implementation="cudnn")


def _triton_kernel(causal: bool, interpret: bool):
    from dflash_jax.kernels.triton_block_attention import block_attention_triton  # needs triton

    return jax.jit(functools.partial(block_attention_triton, causal=causal, interpret=interpret))


def plot(report: dict):
    fig, ax = new_figure(figsize=(6, 3.5))
    for (batch, causal), rows in _group(report["results"]).items():
        for impl, style in (("pallas", "o-"), ("triton", "d-."), ("xla", "s--"), ("cudnn", "^:")):
            pts = [(r["seq"], r[f"{impl}_GBps"]) for r in rows if r.get(f"{impl}_GBps")]
            if pts:
                ax.plot(*zip(*pts), style, label=f"{impl} b{batch} {'causal' if causal else 'drafter'}")
    ax.axhline(report["copy_bandwidth_GBps"], color="k", lw=0.8, label="copy bandwidth")
    ax.set(xscale="log", xlabel="cache length S", ylabel="GB/s", title=report["env"]["device"])
    ax.legend(fontsize=6)
    return fig


def _group(rows):
    out = {}
    for r in rows:
        out.setdefault((r["batch"], r["causal"]), []).append(r)
    return out


def add_arguments(p) -> None:
    p.add_argument("--seq", type=int, nargs="+", default=[1024, 4096, 16384, 32768],
                   help="cache lengths S to time")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes to time")
    p.add_argument("--block", type=int, default=16, help="query rows T per sequence (the block size)")
    p.add_argument("--heads", type=int, default=32, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (grouped-query attention)")
    p.add_argument("--head-dim", type=int, default=128, help="dimension of a head")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                   help="compute dtype of the kernels (q, k, v)")
    p.add_argument("--impl", nargs="+", default=["pallas", "xla", "cudnn"],
                   choices=["pallas", "triton", "xla", "cudnn"],
                   help="block-attention kernel implementations to time")
    p.add_argument("--interpret", action="store_true",
                   help="Pallas / Triton interpreter (CPU smoke run)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each kernel, the median reported")
    p.add_argument("--out", default="runs/kernel_speed", help="output directory")


def run(args) -> dict:
    dtype = jnp.dtype(args.dtype)
    bandwidth = copy_bandwidth()
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batch:
        for S in args.seq:
            for causal in (True, False):
                T, H, Hkv, Dh = args.block, args.heads, args.kv_heads, args.head_dim
                mk = lambda *s: jnp.asarray(rng.normal(size=s), dtype)
                q, k, v = mk(batch, T, H, Dh), mk(batch, S, Hkv, Dh), mk(batch, S, Hkv, Dh)
                kb, vb = (None, None) if causal else (mk(batch, T, Hkv, Dh), mk(batch, T, Hkv, Dh))
                lens = jnp.full((batch,), S - T, jnp.int32)
                kern = jax.jit(functools.partial(block_attention, causal=causal, interpret=args.interpret))
                ref = jax.jit(functools.partial(block_attention_reference, causal=causal))
                err = float(jnp.max(jnp.abs(kern(q, k, v, lens, kb, vb).astype(jnp.float32)
                                            - ref(q, k, v, lens, kb, vb).astype(jnp.float32))))
                nbytes = (2 * batch * S * Hkv * Dh + 2 * q.size) * dtype.itemsize
                row = {"batch": batch, "seq": S, "causal": causal, "max_abs_err": err}
                tri = _triton_kernel(causal, args.interpret) if "triton" in args.impl else None
                if tri is not None:
                    row["triton_max_abs_err"] = float(jnp.max(jnp.abs(
                        tri(q, k, v, lens, kb, vb).astype(jnp.float32)
                        - ref(q, k, v, lens, kb, vb).astype(jnp.float32))))
                for name, fn, fargs in (("pallas", kern, (q, k, v, lens, kb, vb)),
                                        ("triton", tri, (q, k, v, lens, kb, vb)),
                                        ("xla", ref, (q, k, v, lens, kb, vb)),
                                        ("cudnn", jax.jit(_cudnn), (q, k, v, lens))):
                    if name not in args.impl or (
                            name == "cudnn" and (causal or jax.default_backend() != "gpu")):
                        continue
                    try:  # per call inside one program, as in the decode loop (no dispatch)
                        t = time_in_program(fn, *fargs, repeats=args.repeats)
                    except Exception as e:  # cuDNN may not support a shape
                        row[f"{name}_error"] = str(e).splitlines()[0][:200]
                        continue
                    row[f"{name}_us"] = 1e6 * t
                    row[f"{name}_GBps"] = nbytes / t / 1e9
                    row[f"{name}_bandwidth_fraction"] = nbytes / t / bandwidth
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    report = {"benchmark": "kernel_speed", "args": options(args), "copy_bandwidth_GBps": bandwidth / 1e9,
              "results": rows, "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": command_line("dflash_jax", invocation(args))}
    write_report(report, args.out, f"block_attention_{report['env']['platform']}_{args.dtype}", plot)
    return report


def main(argv=None) -> dict:
    return command_main("kernel-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
