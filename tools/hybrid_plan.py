"""Memory and communication plans for hybrid targets on GPU meshes (``hybrid-plan``): Qwen3.5-27B
on 1 and 2 GPUs, Qwen3.5-122B-A10B and 397B-A17B on 8 x B200 and 8 x H200.

Per (model, device, mesh (data, expert, model)), batch 1, bf16 weights and activations:

  weights / device   every parameter of the family's tree (``targets.hybrid.model.param_shapes``)
                     divided along the dims its partition rules put on a mesh axis
                     (``family.param_axes`` -> ``parallel.rules.LOGICAL_RULES``): what the
                     engine places, not a second size model (checked against the 8-device
                     test's shards, ``tests/parallel/test_hybrid_parallel.py``).
  GDN state / row    conv windows and float32 recurrent states of the shard's key heads
                     (``fixed_state_bytes`` of ``parallel.local_config``).
  KV / token         the attention layers' K and V of the shard's KV heads.
  context that fits  positions of one row whose K/V fit beside the weights, the GDN state and a
                     tree-free verify, in ``--memory-fraction`` of the device's memory.
  collectives        what one AR step and one DFlash iteration (the drafter's block, then the
                     target's verify) run, by the forward's code: an all-reduce of [rows, D]
                     after the embedding and after every row-parallel projection (each layer's
                     mixer, GDN or attention, and its MLP) within ``model``; an MoE block's one
                     all-reduce over ``expert x model``; the split vocabulary's argmax
                     exchange (values and ids of each shard's best, per row). Counted per
                     device, ring formula (``2 (g-1)/g`` of the payload per all-reduce of a
                     group of g), at ``--latency-us`` each (checked against the compiled loop).
  t_iter / t_AR      the roofline of one device's share (``sizes.Cost``: max(bytes / HBM
                     bandwidth, FLOPs / peak) per component, summed) plus the collectives'
                     time. The verify reads the experts its 16 rows reach: under uniform
                     routing ``E (1 - (1 - k/E)^16)`` per MoE layer (``uniform``, the project's
                     MoE roofline), or only the k one row reaches (``shared``: every row of the
                     block routed alike), spread over the expert axis. Real routing lies
                     between; the published speedup (SGLang, 8 x B200) is given beside.

The DFlash drafter of 27B is the published one (``roofline_hybrid.DRAFTERS``); the MoE models'
are assumed: 5 Qwen3-style layers at the target's width, MLP 3 D, 32 / 8 heads of 128, block 16.

    python -m dflash_jax hybrid-plan --out results/hybrid/plans
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import jax
import numpy as np

from dflash_jax.cli import command_main, invocation, run_cli
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.parallel import rules
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.sizes import Cost, lm_head
from dflash_jax.targets import family_of
from dflash_jax.targets.hybrid import model as hybrid_model
from dflash_jax.targets.moe.qwen3_5_moe import expected_active_experts
from dflash_jax.tools import roofline as dense
from dflash_jax.tools import roofline_hybrid as rh
from dflash_jax.tools.parallel_comm import LATENCY_US, MEMORY_FRACTION, NODES, Collective, shard

_MOE_HF = dict(model_type="qwen3_5_moe_text", vocab_size=248320, head_dim=256, full_attention_interval=4,
               linear_num_key_heads=16, linear_num_value_heads=64, linear_key_head_dim=128,
               linear_value_head_dim=128, linear_conv_kernel_dim=4, num_key_value_heads=2,
               moe_intermediate_size=1024, shared_expert_intermediate_size=1024,
               max_position_embeddings=262144, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
MODELS: dict[str, dict] = {
    "qwen3.5-27b": {**rh.MODELS["qwen3.5-27b"], "max_position_embeddings": 262144},
    # Qwen/Qwen3.5-122B-A10B text_config: hidden 3072, 48 layers, 32 heads / 2 KV heads of 256,
    # GDN 16 key / 64 value heads of 128, 256 experts (top 8) of width 1024, shared expert 1024
    "qwen3.5-122b-a10b": {**_MOE_HF, "hidden_size": 3072, "num_hidden_layers": 48, "num_attention_heads": 32,
                          "num_experts": 256, "num_experts_per_tok": 8},
    # Qwen/Qwen3.5-397B-A17B text_config: hidden 4096, 60 layers, 32 heads / 2 KV heads of 256,
    # GDN 16 key / 64 value heads of 128, 512 experts (top 10) of width 1024, shared expert 1024
    "qwen3.5-397b-a17b": {**_MOE_HF, "hidden_size": 4096, "num_hidden_layers": 60, "num_attention_heads": 32,
                          "num_experts": 512, "num_experts_per_tok": 10},
}
"""The published ``config.json`` text fields (results/hybrid/plans/README.md lists the sources)."""

PLANS: dict[str, tuple[tuple[str, ...], tuple[tuple[int, int, int], ...]]] = {
    "qwen3.5-27b": (("h100", "b200"), ((1, 1, 1), (1, 1, 2))),
    "qwen3.5-122b-a10b": (("b200", "h200"), ((1, 8, 1), (1, 4, 2))),
    "qwen3.5-397b-a17b": (("b200", "h200"), ((1, 8, 1), (1, 4, 2))),
}
"""model -> (devices, meshes (data, expert, model)). Two KV heads cap the model axis of the MoE
models at 2 (a GQA group is never split); the experts take the rest."""

PUBLISHED = {"qwen3.5-397b-a17b": ">4.3x over AR at concurrency 1 (HumanEval), SGLang, 8 x B200, "
                                  "TP 8, block 8 (LMSYS blog, 2026-06)"}
PUBLISHED_SPEEDUP = {("qwen3.5-397b-a17b", "b200"): 4.3}
"""The published speedup as a number, per (model, device), for the figure."""
BLOCK_SIZE = 16
ROUTINGS = ("uniform", "shared")


def config(name: str):
    """The family's config of a named model (the family reads the config.json fields)."""
    from dflash_jax.targets import family

    d = MODELS[name]
    return family(d["model_type"]).config_from_hf(d)


def drafter_for(name: str, cfg, block_size: int = BLOCK_SIZE) -> DrafterConfig:
    """The published 27B drafter, or the assumed recipe (module docstring) for the others."""
    if name in rh.DRAFTERS:
        return dataclasses.replace(DrafterConfig(**rh.DRAFTERS[name]), block_size=block_size)
    n = cfg.num_layers
    taps = tuple(int(round(1 + i * (n - 4) / 4)) for i in range(5))
    return DrafterConfig(num_layers=5, hidden_size=cfg.hidden_size, intermediate_size=3 * cfg.hidden_size,
                         num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=cfg.vocab_size,
                         block_size=block_size, num_target_layers=n, target_layer_ids=taps,
                         mask_token_id=248070)


# ---------------------------------------------------------------------------- memory
def sizes_of(mesh: tuple[int, int, int]) -> dict[str, int]:
    data, expert, model = mesh
    return {rules.DATA: data, rules.EXPERT: expert, rules.MODEL: model}


def weight_bytes_per_device(cfg, mesh: tuple[int, int, int], itemsize: int = 2) -> int:
    """Bytes of the parameters one device holds: each leaf of the family's parameter tree with
    every dim divided by the size of the mesh axis its PartitionSpec (``rules.param_specs``, as
    the engine places them) puts it on."""
    shapes = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, np.int8), hybrid_model.param_shapes(cfg),
                                    is_leaf=lambda v: isinstance(v, tuple))
    specs = rules.param_specs(shapes, family_of(cfg).param_axes(cfg))
    size = sizes_of(mesh)
    per_leaf = jax.tree_util.tree_map(
        lambda x, spec: math.prod(n // size[a] if a else n for n, a in zip(x.shape, spec)), shapes, specs)
    return sum(jax.tree_util.tree_leaves(per_leaf)) * itemsize


def local(cfg, mesh: tuple[int, int, int]):
    return rules.local_config(cfg, mesh[2], mesh[1])


def state_bytes(cfg, mesh: tuple[int, int, int], itemsize: int = 2) -> dict:
    """{"gdn_per_row", "kv_per_token"} on one device (its key heads and KV heads)."""
    fam, loc = family_of(cfg), local(cfg, mesh)
    return {"gdn_per_row": fam.fixed_state_bytes(loc, 1, itemsize),
            "kv_per_token": fam.state_bytes_per_token(loc, itemsize)}


# ---------------------------------------------------------------------------- collectives
@dataclasses.dataclass(frozen=True)
class Coll(Collective):
    """A ``parallel_comm.Collective`` over a group of ``group`` devices (the model axis, or the
    expert x model group of an MoE block)."""

    group: int = 1

    def link_bytes(self, p: int | None = None) -> float:
        return super().link_bytes(self.group if p is None else p)

    def seconds(self, link_bandwidth: float, latency: float) -> float:
        return super().seconds(self.group, link_bandwidth, latency)


def _argmax(prefix: str, rows: int, m: int, batch: int) -> list[Coll]:
    """The split vocabulary's argmax: each shard's best value (f32) and id (s32) per row, gathered."""
    if m == 1:
        return []
    return [Coll(f"{prefix} argmax values", "all-gather", 1, m * batch * rows * 4, m),
            Coll(f"{prefix} argmax ids", "all-gather", 1, m * batch * rows * 4, m)]


def target_collectives(cfg, rows: int, mesh: tuple[int, int, int], batch: int = 1,
                       act_bytes: int = 2) -> list[Coll]:
    """One target forward on ``rows`` rows of ``batch`` sequences per data shard."""
    _, e, m = mesh
    act = batch * rows * cfg.hidden_size * act_bytes
    kinds = [cfg.mlp_kind(i) for i in range(cfg.num_layers)]
    out = []
    if m > 1:
        out += [Coll("target embedding", "all-reduce", 1, act, m),
                Coll("target mixers (GDN out_proj, attention o_proj)", "all-reduce", cfg.num_layers, act, m)]
        if kinds.count("mlp"):
            out.append(Coll("target dense MLPs", "all-reduce", kinds.count("mlp"), act, m))
    if kinds.count("moe") and e * m > 1:
        out.append(Coll("target MoE blocks", "all-reduce", kinds.count("moe"), act, e * m))
    return out + _argmax("target", rows, m, batch)


def drafter_collectives(drafter: DrafterConfig, mesh: tuple[int, int, int], batch: int = 1,
                        act_bytes: int = 2) -> list[Coll]:
    """One draft: the block embedded (the target's split table), two per layer, the argmax of
    the bs - 1 draft rows; the context rows' K/V projections need none."""
    m, bs = mesh[2], drafter.block_size
    if m == 1:
        return []
    act = batch * bs * drafter.hidden_size * act_bytes
    return [Coll("drafter embedding", "all-reduce", 1, act, m),
            Coll("drafter layers", "all-reduce", 2 * drafter.num_layers, act, m)] + _argmax("drafter", bs - 1, m, batch)


def comm(colls, node, latency: float) -> dict:
    return {"collectives": sum(c.count for c in colls),
            "payload_bytes": sum(c.count * c.payload for c in colls),
            "link_bytes": sum(c.count * c.link_bytes() for c in colls),
            "seconds": sum(c.seconds(node.link_bandwidth, latency) for c in colls)}


# ---------------------------------------------------------------------------- time
def target_costs(cfg, mesh: tuple[int, int, int], rows: int, context: int, step: str, routing: str,
                 mode: str = "replay", taps: int = 0, wb: int = 2) -> list[Cost]:
    """One device's share of a target forward (module docstring); ``step`` "ar" or "verify"."""
    loc, e = local(cfg, mesh), mesh[1]
    D, H, Hkv, Dh = loc.hidden_size, loc.num_heads, loc.num_kv_heads, loc.head_dim
    La, Lg = len(loc.attention_layers), len(loc.gdn_layers)
    kinds = [loc.mlp_kind(i) for i in range(loc.num_layers)]
    fam = family_of(loc)
    shared = (La * fam.attention_matrix_params(loc) + Lg * fam.gdn_matrix_params(loc)
              + kinds.count("mlp") * 3 * D * loc.intermediate_size)
    costs = []
    if loc.moe is not None:
        mo, Lm = loc.moe, kinds.count("moe")
        shared += Lm * (D * mo.num_experts + 3 * D * mo.shared_expert_intermediate_size + D)
        expert = 3 * D * mo.moe_intermediate_size
        reached = (expected_active_experts(mo.num_experts, mo.num_experts_per_tok, rows)
                   if routing == "uniform" else mo.num_experts_per_tok)
        costs.append(Cost("target experts", flops=2 * rows * Lm * mo.num_experts_per_tok * expert / e,
                          weights=Lm * reached / e * expert * wb))
    costs.insert(0, Cost("target linears", flops=2 * rows * shared, weights=shared * wb,
                         activations=rows * D * (1 + taps) * wb))
    per_pos = 2 * La * Hkv * Dh * wb
    pairs = rows * context + rows * (rows + 1) / 2
    costs.append(Cost("target attention", flops=4 * La * H * Dh * pairs, kv_read=context * per_pos,
                      kv_write=rows * per_pos))
    g = rh.gdn_bytes(gdn_shape(loc), step, mode, rows)
    costs.append(Cost("target GDN", flops=g["flops"], kv_read=g["read"], kv_write=g["write"]))
    costs.append(lm_head("target LM head", rh._Head(D, loc.vocab_size), rows, weight_bytes=wb))
    return costs


def gdn_shape(loc) -> rh.HybridShape:
    """The roofline's GDN shape of a (local) config (what ``roofline_hybrid.gdn_bytes`` reads)."""
    return rh.HybridShape(vocab_size=loc.vocab_size, hidden_size=loc.hidden_size,
                          intermediate_size=loc.intermediate_size, num_layers=loc.num_layers,
                          attention_layers=len(loc.attention_layers), num_heads=loc.num_heads,
                          num_kv_heads=loc.num_kv_heads, head_dim=loc.head_dim,
                          num_k_heads=loc.linear_num_key_heads, num_v_heads=loc.linear_num_value_heads,
                          head_k_dim=loc.linear_key_head_dim, head_v_dim=loc.linear_value_head_dim,
                          conv_kernel=loc.linear_conv_kernel_dim)


def step_times(cfg, drafter: DrafterConfig, mesh, device: str, context: int, routing: str,
               latency: float) -> dict:
    """Seconds of one AR step and one DFlash iteration on one device of ``mesh``."""
    dev, node, m = dense.DEVICES[device], NODES[device], mesh[2]
    bs = drafter.block_size
    t = lambda costs: sum(c.seconds(dev) for c in costs)
    ar = t(target_costs(cfg, mesh, 1, context, "ar", routing))
    verify = target_costs(cfg, mesh, bs, context, "verify", routing, taps=drafter.num_taps)
    rollback = rh.rollback_cost(gdn_shape(local(cfg, mesh)), "replay", bs)
    draft = dense.drafter_forward(shard(drafter, m), rh._Head(cfg.hidden_size, cfg.vocab_size // m), bs,
                                  context, bs)
    it = t(verify) + rollback.seconds(dev) + t(draft)
    ar_comm = comm(target_collectives(cfg, 1, mesh), node, latency)
    it_comm = comm(drafter_collectives(drafter, mesh) + target_collectives(cfg, bs, mesh), node, latency)
    t_ar, t_it = ar + ar_comm["seconds"], it + it_comm["seconds"]
    return {"t_ar_us": 1e6 * t_ar, "t_iter_us": 1e6 * t_it, "ratio": t_it / t_ar,
            "ar_comm": ar_comm, "iteration_comm": it_comm}


def plan_rows(models, context: int, tau: float, latency: float, memory_fraction: float,
              block_size: int = BLOCK_SIZE) -> list[dict]:
    rows = []
    for name in models:
        cfg = config(name)
        drafter = drafter_for(name, cfg, block_size)
        devices, meshes = PLANS[name]
        for device in devices:
            for mesh in meshes:
                rules.check_model_split(cfg, mesh[2])
                rules.check_expert_split(cfg, mesh[1])
                w = weight_bytes_per_device(cfg, mesh)
                dw = weight_bytes_per_device_drafter(drafter, mesh[2])
                st = state_bytes(cfg, mesh)
                room = memory_fraction * NODES[device].memory - w - dw - st["gdn_per_row"]
                row = {"model": name, "device": device, "mesh": list(mesh), "devices": math.prod(mesh),
                       "weights_bytes": w, "drafter_bytes": dw, **st,
                       "fits": room > 0, "context_fits": max(0, int(room // st["kv_per_token"])) if room > 0 else 0,
                       "routing": {}}
                for routing in ROUTINGS:
                    s = step_times(cfg, drafter, mesh, device, context, routing, latency)
                    row["routing"][routing] = {**s, "speedup": tau / s["ratio"]}
                rows.append(row)
    return rows


def weight_bytes_per_device_drafter(drafter: DrafterConfig, m: int, itemsize: int = 2) -> int:
    """The drafter's parameters on one device (its method's size model of the ``model`` shard:
    its layers split, its fc and norms whole; it shares the target's embedding and head)."""
    return itemsize * dense._drafter_params(shard(drafter, m))


# ---------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [f"`{report['command']}`", "",
             f"Batch 1, bf16 weights, K/V and activations, float32 GDN states; context S = {st['context']}; "
             f"block {st['block_size']}; {st['latency_us']} us per collective; tau {st['tau']} "
             "(the paper's Qwen3-8B average) for the speedup. Mesh = (data, expert, model).", "",
             "| model | device | mesh | weights / device | drafter / device | GDN state / row | KV / token | "
             "context that fits |", "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['model']} | {r['device']} | {'x'.join(map(str, r['mesh']))} | "
                     f"{r['weights_bytes'] / 1e9:.1f} GB | {r['drafter_bytes'] / 1e9:.2f} GB | "
                     f"{r['gdn_per_row'] / 1e6:.1f} MB | {r['kv_per_token'] / 1e3:.1f} KB | "
                     + (f"{r['context_fits']:,}" if r["fits"] else "does not fit") + " |")
    lines += ["", "| model | device | mesh | collectives AR / iter | link bytes AR / iter | routing | "
              "t_AR (us) | t_iter (us) | t_iter / t_AR | speedup at tau | published |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        for routing, s in r["routing"].items():
            lines.append(f"| {r['model']} | {r['device']} | {'x'.join(map(str, r['mesh']))} | "
                         f"{s['ar_comm']['collectives']} / {s['iteration_comm']['collectives']} | "
                         f"{s['ar_comm']['link_bytes'] / 1e3:.0f} KB / {s['iteration_comm']['link_bytes'] / 1e3:.0f} KB | "
                         f"{routing} | {s['t_ar_us']:.0f} | {s['t_iter_us']:.0f} | {s['ratio']:.2f} | "
                         f"{s['speedup']:.2f}x | {report['published'].get(r['model'], '')} |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Predicted speedup at tau per plan, both routings (bars: uniform; markers: shared)."""
    fig, ax = new_figure(figsize=(13, 5))
    rows = report["rows"]
    labels = [f"{r['model'].replace('qwen3.5-', '')}\n{r['device']} {'x'.join(map(str, r['mesh']))}" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x, [r["routing"]["uniform"]["speedup"] for r in rows], 0.6, label="uniform routing (upper cost)")
    ax.plot(x, [r["routing"]["shared"]["speedup"] for r in rows], "k^", label="rows share experts (lower cost)")
    published = [(i, PUBLISHED_SPEEDUP[(r["model"], r["device"])]) for i, r in enumerate(rows)
                 if (r["model"], r["device"]) in PUBLISHED_SPEEDUP]
    if published:
        ax.plot(*zip(*published), "r*", ms=9, label="published: SGLang measured >4.3x (TP 8, block 8)")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks(x, labels, fontsize=7, rotation=30, ha="right")
    ax.set(ylabel=f"predicted speedup at tau {report['settings']['tau']}",
           title="predicted DFlash speedup of hybrid targets on GPU meshes (batch 1)")
    ax.legend(fontsize=7)
    return fig


def add_arguments(p) -> None:
    p.add_argument("--models", nargs="+", default=list(PLANS), choices=list(PLANS),
                   help="target shapes to model, each with a drafter shaped for it, on its meshes")
    p.add_argument("--context", type=int, default=rh.CONTEXT, help="cached positions S for the time")
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE, help="DFlash block size")
    p.add_argument("--tau", type=float, default=dense.PAPER["tau"],
                   help="acceptance length of the speedup (default: the paper's, Qwen3-8B)")
    p.add_argument("--latency-us", type=float, default=LATENCY_US,
                   help="fixed latency of one collective on NVLink, microseconds")
    p.add_argument("--memory-fraction", type=float, default=MEMORY_FRACTION,
                   help="share of HBM for weights + KV cache")
    p.add_argument("--out", default="results/hybrid/plans", help="output directory (plans.json, .md, .png)")


def check_args(args) -> None:
    if args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    if args.block_size < 2:
        raise ValueError(f"--block-size must be >= 2, got {args.block_size}")
    if not 1 <= args.tau <= args.block_size:
        raise ValueError(f"--tau must lie between 1 and the block size {args.block_size}, got {args.tau}")
    if args.latency_us < 0:
        raise ValueError(f"--latency-us must be >= 0, got {args.latency_us}")
    if not 0 < args.memory_fraction <= 1:
        raise ValueError(f"--memory-fraction must lie in (0, 1], got {args.memory_fraction}")


def run(args) -> dict:
    check_args(args)
    report = {"benchmark": "hybrid_plan", "computed_on_paper": True,
              "command": command_line("dflash_jax", invocation(args)),
              "settings": {"models": args.models, "context": args.context, "block_size": args.block_size,
                           "tau": args.tau, "latency_us": args.latency_us,
                           "memory_fraction": args.memory_fraction},
              "published": PUBLISHED,
              "device_profiles": {k: dataclasses.asdict(dense.DEVICES[k]) | {"node": dataclasses.asdict(NODES[k])}
                                  for k in sorted({d for m in args.models for d in PLANS[m][0]})},
              "rows": plan_rows(args.models, args.context, args.tau, args.latency_us * 1e-6,
                                args.memory_fraction, args.block_size),
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, args.out, "plans", plot, markdown)


def main(argv=None) -> dict:
    return command_main("hybrid-plan", sys.modules[__name__], argv)


if __name__ == "__main__":
    run_cli(main)
