"""DFlash vs autoregressive decoding for one target + drafter, same prompts, same run:
AR ms/token, DFlash ms/iteration (and draft / verify steps timed separately, outside the loop),
tau, the acceptance histogram and the speedup.

With random weights (the presets) acceptance is ~1, so the number that matters is the cost
of one iteration relative to one AR step: at acceptance tau the speedup is about
``tau / (iteration time / AR step time)``; the report includes that projection at the paper's
tau (6.49, Qwen3-8B).

    python -m dflash_jax.bench.spec_speed --preset small
    python -m dflash_jax.bench.spec_speed --preset qwen3-8b --dtype bfloat16 --drafter-layers 5
    python -m dflash_jax.bench.spec_speed --target DIR --drafter DIR
    python -m dflash_jax.bench.spec_speed --preset qwen3-8b --dtype bfloat16 --tree 32

With ``--tree N`` DFlash verifies a tree of N nodes per iteration (``docs/trees.md``): the draft
step is the drafter pass plus the best-first tree, the verify step the target over the N nodes
under the ancestor mask, timed beside a plain causal verify of the same N rows
(``verify_chain_ms``: what the mask costs).
"""

from __future__ import annotations

import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.bench.decode_speed import PRESETS
from dflash_jax.bench.env import add_preset_argument, time_fn
from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.config import TargetConfig
from dflash_jax.decoding import engine
from dflash_jax.verification import policy, tree as trees
from dflash_jax.decoding.generation import generate
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.hub import CHECKPOINT_HELP
from dflash_jax.models.handles import Drafter, Target, load_drafter, load_target
from dflash_jax.reporting import command_line, environment, new_figure, write_report

PAPER_TAU = 6.49


def step_times(target: Target, drafter: Drafter, prompts, block_size: int, repeats: int,
               attention_impl: str = "xla", num_denoise_steps: int = 1, tree: int | None = None,
               tree_topk: int = 4) -> dict:
    """Median seconds of one draft (``num_denoise_steps`` drafter passes) and one verify at the
    prompts' context length; with ``tree`` (N nodes), :func:`tree_step_times`."""
    pre = prepare_decode(target, prompts, 8, drafter=drafter, block_size=block_size,
                         attention_impl=attention_impl, num_denoise_steps=num_denoise_steps,
                         tree=tree, tree_topk=tree_topk if tree else 4)
    spec, dparams, state = pre.spec, pre.drafter_params, pre.state
    key = jax.random.key(0)
    if tree:
        return tree_step_times(target, spec, dparams, state, key, repeats)
    draft = jax.jit(lambda tp, dp, st, k: spec.proposer.propose(
        spec, tp, dp, st.proposer, engine.committed(st), k))
    tokens = draft(target.params, dparams, state, key)[0].tokens
    block = jnp.concatenate([state.bonus[:, None], tokens], axis=1)
    positions = state.tcache.lengths[:, None] + jnp.arange(block_size)

    verify = jax.jit(functools.partial(policy.verify, spec))  # spec carries attention_impl

    return {"draft_ms": 1e3 * time_fn(draft, target.params, dparams, state, key, repeats=repeats),
            "verify_ms": 1e3 * time_fn(verify, target.params, block, positions, state.tcache,
                                       repeats=repeats)}


def tree_step_times(target: Target, spec: engine.EngineSpec, dparams, state, key, repeats: int) -> dict:
    """Median milliseconds of the tree draft (drafter pass + best-first tree), the tree verify
    (N nodes under the ancestor mask) and a causal verify of N plain rows at the same slots."""
    tree_policy, N = spec.verify, spec.verify.nodes
    draft = jax.jit(lambda tp, dp, st, k: spec.proposer.propose_tree(
        spec, tp, dp, st.proposer, engine.committed(st), k, tree_policy))
    tree = draft(target.params, dparams, state, key)[0]
    mask = trees.ancestor_mask(tree, spec.block_size - 1)
    slots = state.tcache.lengths[:, None] + jnp.arange(N, dtype=jnp.int32)
    verify_tree = jax.jit(functools.partial(trees.verify_tree, spec))
    verify_chain = jax.jit(functools.partial(policy.verify, spec))
    return {"draft_ms": 1e3 * time_fn(draft, target.params, dparams, state, key, repeats=repeats),
            "verify_ms": 1e3 * time_fn(verify_tree, target.params, tree, mask, state.tcache,
                                       repeats=repeats),
            "verify_chain_ms": 1e3 * time_fn(verify_chain, target.params, tree.tokens, slots,
                                             state.tcache, repeats=repeats)}


def sequence_agreement(ar_sequences, dflash_sequences) -> dict:
    """How far two batches of generated token lists agree: every row equal, rows equal, and
    the shortest common prefix over rows."""
    prefixes = []
    for a, d in zip(ar_sequences, dflash_sequences):
        n = next((i for i, (x, y) in enumerate(zip(a, d)) if x != y), min(len(a), len(d)))
        prefixes.append(n if (n < min(len(a), len(d)) or len(a) != len(d)) else len(a))
    rows_equal = sum(a == d for a, d in zip(ar_sequences, dflash_sequences))
    return {"dflash_equals_ar": rows_equal == len(ar_sequences), "rows_equal": rows_equal,
            "min_matching_prefix": min(prefixes)}


def measure(target: Target, drafter: Drafter, batch: int, prompt_len: int, new_tokens: int,
            block_size: int, repeats: int, seed: int = 0, attention_impl: str = "xla",
            exact: bool = True, tree: int | None = None, tree_topk: int = 4) -> dict:
    """AR and DFlash (``tree``: verifying trees of that many nodes) on the same random
    prompts. ``exact``: the run is in float32 with full-
    precision matrix products, where greedy DFlash must equal AR token for token (a mismatch
    raises). In bfloat16 (or TF32) the 16-row verify and the 1-row AR step round differently,
    so near-tied argmaxes of a random-weight model can flip; then agreement is reported."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, target.config.vocab_size, size=(batch, prompt_len)).tolist()
    best = {}
    for name, kw in (("ar", {"attention_impl": attention_impl}),
                     ("dflash", {"drafter": drafter, "block_size": block_size,
                                 "attention_impl": attention_impl,
                                 **({"tree": tree, "tree_topk": tree_topk} if tree else {})})):
        generate(target, prompts, new_tokens, **kw)  # compile
        for _ in range(repeats):
            r = generate(target, prompts, new_tokens, **kw)
            if name not in best or r.decode_time_s < best[name].decode_time_s:
                best[name] = r
    ar, df = best["ar"], best["dflash"]
    agreement = sequence_agreement(ar.sequences, df.sequences)
    if exact and not agreement["dflash_equals_ar"]:
        raise RuntimeError("greedy DFlash output differs from autoregressive output in an exact "
                           f"(float32, full-precision) run: {agreement} (a bug: please report it)")
    if not agreement["dflash_equals_ar"]:
        print(f"note: in {jnp.dtype(target.dtype).name} greedy DFlash and AR agree on "
              f"{agreement['rows_equal']}/{batch} rows, first difference after "
              f"{agreement['min_matching_prefix']} tokens (rounding of the {block_size}-row verify "
              "differs from the 1-row step; the float32 exactness check is the correctness test)")
    ar_step = ar.decode_time_s / ar.num_steps
    df_iter = df.decode_time_s / df.num_steps
    tokens = sum(df.num_generated) - batch  # tokens made inside the decode loop
    ar_tokens = sum(ar.num_generated) - batch
    steps = step_times(target, drafter, prompts, block_size, max(3, repeats), attention_impl,
                       tree=tree, tree_topk=tree_topk)
    return {
        "batch": batch, "attention_impl": attention_impl, "prompt_len": prompt_len, "new_tokens": new_tokens, "block_size": block_size,
        "tree": tree, "tree_topk": tree_topk if tree else None,
        "ar_ms_per_token": 1e3 * ar.decode_time_s / ar_tokens * batch,
        "ar_ms_per_step": 1e3 * ar_step,
        "dflash_ms_per_iteration": 1e3 * df_iter,
        "dflash_ms_per_token": 1e3 * df.decode_time_s / tokens * batch,
        **steps,
        "iteration_over_ar_step": df_iter / ar_step,
        **agreement,
        "tau": df.tau,
        "histogram": df.acceptance_histogram.tolist(),
        "position_acceptance_rate": df.position_acceptance_rate.tolist(),
        "speedup": (ar.decode_time_s / ar_tokens) / (df.decode_time_s / tokens),
        "projected_speedup_at_paper_tau": PAPER_TAU / (df_iter / ar_step),
    }


def plot(report: dict):
    r = report["result"]
    fig, (a, b) = new_figure(1, 2, figsize=(9, 3.5))
    a.bar(["AR step", "draft", "verify", "DFlash iter"],
          [r["ar_ms_per_step"], r["draft_ms"], r["verify_ms"], r["dflash_ms_per_iteration"]])
    a.set(ylabel="ms", title=f"{report['env']['device']}, batch {r['batch']}")
    b.bar(range(1, len(r["histogram"]) + 1), r["histogram"])
    b.set(xlabel="acceptance length", ylabel="iterations", title=f"tau {r['tau']:.2f}")
    return fig


def add_arguments(p) -> None:
    add_preset_argument(p, PRESETS)
    p.add_argument("--target", metavar="CHECKPOINT",
                   help=f"the target, instead of a random preset: {CHECKPOINT_HELP}")
    p.add_argument("--drafter", metavar="CHECKPOINT",
                   help="the DFlash drafter, named the same way (default: random, shaped for the target)")
    p.add_argument("--drafter-layers", type=int, default=5,
                   help="layers of the random drafter (without --drafter)")
    p.add_argument("--block-size", type=int, default=16, help="speculative block size")
    p.add_argument("--batch", type=int, default=1, help="batch size (sequences decoded together)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (random ids) per sequence")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence in a timed run")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute dtype of the target and drafter (float32: DFlash must equal AR token for "
                        "token)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs after a compiling one, the fastest reported")
    p.add_argument("--attention-impl", default="xla", choices=["xla", "pallas", "triton"],
                   help="attention of the decode loops: XLA, or the Pallas or Triton block-attention kernel")
    p.add_argument("--tree", type=int, default=None, metavar="N",
                   help="verify a tree of N draft nodes per iteration (root included) instead of the chain")
    p.add_argument("--tree-topk", type=int, default=4, metavar="K", help="with --tree: children per tree node at most")
    p.add_argument("--out", default="runs/spec_speed", help="output directory")


def run(args) -> dict:
    dtype = jnp.dtype(args.dtype)
    if args.target:
        target = load_target(args.target, dtype=dtype)
        name = os.path.basename(os.path.normpath(args.target))
    else:
        target = Target.random(TargetConfig(**PRESETS[args.preset]), dtype=dtype)
        name = args.preset
    target.max_len = max(target.max_len, args.prompt_len + args.new_tokens + 64)
    drafter = (load_drafter(args.drafter, target) if args.drafter else
               Drafter.random(target, num_layers=args.drafter_layers, block_size=args.block_size))
    exact = args.dtype == "float32"  # full-precision products (no TF32 on a GPU): must equal AR
    with jax.default_matmul_precision("highest" if exact else None):
        result = measure(target, drafter, args.batch, args.prompt_len, args.new_tokens,
                         args.block_size, args.repeats, attention_impl=args.attention_impl, exact=exact,
                         tree=args.tree, tree_topk=args.tree_topk)
    report = {"benchmark": "spec_speed", "target": target.config.to_hf_dict(),
              "drafter": drafter.config.to_hf_dict(), "dtype": args.dtype, "result": result,
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": command_line("dflash_jax", invocation(args))}
    for k in ("ar_ms_per_step", "draft_ms", "verify_ms", "dflash_ms_per_iteration",
              "iteration_over_ar_step", "tau", "speedup", "projected_speedup_at_paper_tau"):
        print(f"{k:>32}: {result[k]:.3f}")
    print(f"{'histogram':>32}: {result['histogram']}")
    write_report(report, args.out, f"{name}_{report['env']['platform']}_{args.dtype}_{args.attention_impl}_b{args.batch}"
                 f"_bs{args.block_size}" + (f"_tree{args.tree}" if args.tree else ""), plot)
    return report


def main(argv=None) -> dict:
    return command_main("spec-speed", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
