"""Roofline of hybrid linear-attention targets (Qwen3.5 / 3.6: Gated DeltaNet layers and gated
full-attention layers): one AR step against one DFlash iteration, and the bytes the GDN
rollback moves in either record mode (``roofline --hybrid``).

The dense roofline (:mod:`dflash_jax.tools.roofline`) charges every weight once per forward
and the K/V of the cached positions. A hybrid target keeps a KV cache only in its attention
layers (one in four); each GDN layer keeps instead a fixed float32 state per row,
``S = Hv dk dv`` floats (2 MB for Qwen3.5-4B's 32 value heads of 128, 3.1 MB for Qwen3.5-27B's
48), and a conv window of K-1 inputs of C = 2 Hk dk + Hv dv channels. A step reads the state and
writes it back; a verify of T rows must also keep what the rollback needs to return each row
to the state after its accepted rows (``dflash_jax.nn.gated_delta``):

  snapshot   the recurrence writes the state after every row: T + 1 states written per GDN
             layer and row (index 0 the state before the block); the rollback reads the
             selected state and writes it as the row's state;
  replay     the chunked form writes the chunk-boundary states (N + 1, N = ceil(T / Cs), one
             chunk of Cs = min(64, T) rows for a block) and the block's prepared k, v, g, beta
             (T Hv (dk + dv + 2) floats); the rollback reads the boundary state and one chunk's
             k, v, g, beta, recomputes the chunk's state update with the rows past the kept
             length masked (FLOPs ``4 Cs Hv dk dv + 2 Cs^2 Hv (dk + dv)``) and writes the state.

Both modes also keep the conv window and the block's conv inputs ((K - 1 + T) C values in the
compute dtype) and cut the window at the kept row. What is counted per forward (the dense
module's rules otherwise: weights once, bf16; a component's time is max(bytes / bandwidth,
FLOPs / peak), the step the sum):

  target linears   every matrix and vector of every layer: attention layers' q_proj (doubled
                   width: query and gate), k, v, o, q/k norms; GDN layers' in_proj_qkv,
                   in_proj_z, in_proj_a, in_proj_b, out_proj, conv1d, A_log, dt_bias and the
                   output norm; the MLPs and norms; FLOPs 2 x rows x matrices.
  target attention the attention layers only: K/V of S positions read, the new rows' written,
                   4 H Dh FLOPs per (query, key) pair.
  target GDN       the GDN layers' state read and written (the per-row states of the mode) and
                   their conv windows; FLOPs 6 Hv dk dv per row and layer (S^T k, k u^T, S^T q).
  GDN rollback     the iteration only: the mode's rollback reads and writes (above).
  target LM head   as the dense roofline (tied or not, the head reads V D).
  drafter          the dense roofline's drafter forward (the DFlash drafters of Qwen3.5 targets
                   are Qwen3-style dense layers over the taps).

The shapes come from the ``config.json`` (a multimodal one's ``text_config``) alone
(:func:`shape_from_hf`); the numbers equal the hybrid family's size model
(``num_params``, ``state_bytes_per_token``, ``fixed_state_bytes``) where it is registered
(tests/tools/test_hybrid_bench.py).

    python -m dflash_jax roofline --hybrid qwen3.5-27b qwen3.5-4b --out results/hybrid
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Mapping, Sequence

import numpy as np

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.nn import gated_delta
from dflash_jax.reporting import command_line, environment, new_figure, publish_report
from dflash_jax.tools import roofline as dense
from dflash_jax.tools.roofline import Cost, DEVICES

MODES = ("snapshot", "replay")
CHUNK = 64
"""The chunked form's chunk size (``gated_delta.DEFAULT_CHUNK``): a verify block is one chunk."""
CONTEXT = 1024
HYBRID_BLOCK_SIZES = (2, 4, 8, 10, 16, 32)
STATE_BYTES = 4  # GDN recurrent states are float32 (transformers' mamba_ssm_dtype)
HYBRID_DEVICES = ("h100", "b200")

# ---------------------------------------------------------------------------- named configs
MODELS: dict[str, dict] = {
    # Qwen/Qwen3.5-27B config.json, text_config: hidden 5120, 64 layers (3 GDN : 1 attention,
    # full_attention_interval 4), intermediate 17408, 24 attention heads / 4 KV heads of 256
    # (q_proj doubled: attn_output_gate), linear_num_key_heads 16, linear_num_value_heads 48,
    # linear_key_head_dim = linear_value_head_dim = 128, conv kernel 4, vocab 248320, untied.
    "qwen3.5-27b": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120,
        "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "tie_word_embeddings": False},
    # Qwen/Qwen3.5-4B: hidden 2560, 32 layers, intermediate 9216, 16 / 4 heads of 256,
    # linear heads 16 key / 32 value of 128, conv 4, vocab 248320; embeddings tied.
    "qwen3.5-4b": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 2560,
        "intermediate_size": 9216, "num_hidden_layers": 32, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "tie_word_embeddings": True},
}
"""The published ``config.json`` text fields the roofline reads (results/hybrid/README.md
lists the sources)."""

DRAFTERS: dict[str, dict] = {
    # a DFlash drafter for a 64-layer, vocab-248320, D-5120 target (5 Qwen3-style layers, MLP
    # 17408, 32 / 8 heads of 128, block 16, taps [1, 16, 31, 46, 61]): the published config of
    # such a drafter (results/hybrid/README.md)
    "qwen3.5-27b": dict(num_layers=5, hidden_size=5120, intermediate_size=17408, num_heads=32,
                        num_kv_heads=8, head_dim=128, vocab_size=248320, block_size=16,
                        num_target_layers=64, target_layer_ids=(1, 16, 31, 46, 61),
                        mask_token_id=248070),
    # the same recipe at the 4B's widths (an assumption: 5 layers, MLP 9216, 32 / 8 heads of
    # 128, block 16, taps spread over 32 layers)
    "qwen3.5-4b": dict(num_layers=5, hidden_size=2560, intermediate_size=9216, num_heads=32,
                       num_kv_heads=8, head_dim=128, vocab_size=248320, block_size=16,
                       num_target_layers=32, target_layer_ids=(1, 8, 15, 22, 29),
                       mask_token_id=248070),
}

TAUS = {"paper, Qwen3-8B average": dense.PAPER["tau"], "paper, Qwen3-4B": 6.54}
"""Acceptance lengths to predict at (docs/method.md section 6: T = 0, Qwen3-8B 6.49 averaged over
seven sets, Qwen3-4B 6.54): no paper number exists for a Qwen3.5 target."""


# ---------------------------------------------------------------------------- the shape
@dataclasses.dataclass(frozen=True)
class HybridShape:
    """A hybrid target as the roofline sees it: ``attention_layers`` of the ``num_layers`` are
    gated full attention (H heads, Hkv KV heads of Dh, q_proj of width 2 H Dh), the others GDN
    (Hk key heads of dk, Hv value heads of dv, conv kernel K); every layer an MLP of width F."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    attention_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    tie_word_embeddings: bool = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.type in ("int", int) and int(getattr(self, f.name)) <= 0 and f.name != "attention_layers":
                raise ValueError(f"hybrid config field {f.name} must be positive, got {getattr(self, f.name)}")
        if not 0 <= self.attention_layers <= self.num_layers:
            raise ValueError(f"attention layers {self.attention_layers} must lie in 0..{self.num_layers}")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"linear_num_value_heads ({self.num_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.num_k_heads})")

    @property
    def gdn_layers(self) -> int:
        return self.num_layers - self.attention_layers

    @property
    def channels(self) -> int:
        """C = 2 Hk dk + Hv dv, the GDN conv channels."""
        return gated_delta.conv_channels(self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim)

    @property
    def state_elems(self) -> int:
        """Hv dk dv: one GDN layer's recurrent state per row."""
        return gated_delta.state_elems(self.num_v_heads, self.head_k_dim, self.head_v_dim)


def shape_from_hf(d: Mapping[str, Any]) -> HybridShape:
    """The shape of a ``qwen3_5_text`` / ``qwen3_5_moe_text``-style dense hybrid ``config.json``
    dict (a multimodal config's ``text_config``): ``layer_types``, else every
    ``full_attention_interval``-th layer attention."""
    tie = d.get("tie_word_embeddings")
    if "text_config" in d:
        d = {**d["text_config"], **({"tie_word_embeddings": tie} if tie is not None else {})}
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                           "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
               if k not in d]
    if missing:
        raise ValueError(f"hybrid config.json lacks {', '.join(missing)} (a qwen3_5_text config has them)")
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None:
        every = int(d.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    bad = sorted(set(types) - {"full_attention", "linear_attention"})
    if bad or len(types) != n:
        raise ValueError(f"layer_types must be {n} entries of 'linear_attention' / 'full_attention', "
                         f"got {len(types)} with {bad}")
    return HybridShape(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_layers=n, attention_layers=types.count("full_attention"), num_heads=d["num_attention_heads"],
        num_kv_heads=d["num_key_value_heads"],
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        num_k_heads=d["linear_num_key_heads"], num_v_heads=d["linear_num_value_heads"],
        head_k_dim=d["linear_key_head_dim"], head_v_dim=d["linear_value_head_dim"],
        conv_kernel=d.get("linear_conv_kernel_dim", 4), tie_word_embeddings=bool(d.get("tie_word_embeddings", False)))


# ---------------------------------------------------------------------------- sizes
def attention_layer_params(s: HybridShape) -> tuple[int, int]:
    """(matrix, vector) parameters of one gated attention layer's token mixer."""
    D, H, Hkv, Dh = s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim
    return D * 2 * H * Dh + 2 * D * Hkv * Dh + H * Dh * D, 2 * Dh


def gdn_layer_params(s: HybridShape) -> tuple[int, int]:
    """(matrix, vector) parameters of one GDN layer's token mixer: in_proj_qkv [D, C],
    in_proj_z [D, Hv dv], in_proj_b and in_proj_a [D, Hv], out_proj [Hv dv, D]; conv1d K C,
    A_log and dt_bias Hv, the output norm dv."""
    D, C, Hv, vd = s.hidden_size, s.channels, s.num_v_heads, s.num_v_heads * s.head_v_dim
    return D * C + D * vd + 2 * D * Hv + vd * D, s.conv_kernel * C + 2 * Hv + s.head_v_dim


def layer_params(s: HybridShape) -> tuple[int, int]:
    """(matrix, vector) parameters of all decoder layers (MLP 3 D F and two norms D each)."""
    am, av = attention_layer_params(s)
    gm, gv = gdn_layer_params(s)
    mlp, norms = 3 * s.hidden_size * s.intermediate_size, 2 * s.hidden_size
    return (s.attention_layers * am + s.gdn_layers * gm + s.num_layers * mlp,
            s.attention_layers * av + s.gdn_layers * gv + s.num_layers * norms)


def num_params(s: HybridShape) -> int:
    """All parameters: layers, final norm, embedding table, and an untied LM head."""
    m, v = layer_params(s)
    table = s.vocab_size * s.hidden_size
    return m + v + s.hidden_size + table * (1 if s.tie_word_embeddings else 2)


def kv_bytes_per_token(s: HybridShape, itemsize: int = 2) -> int:
    """K and V of one position in the attention layers."""
    return 2 * s.attention_layers * s.num_kv_heads * s.head_dim * itemsize


def fixed_state_bytes(s: HybridShape, batch: int = 1, conv_itemsize: int = 2) -> int:
    """The GDN layers' decode state: float32 recurrent states and the conv windows."""
    return batch * s.gdn_layers * (s.state_elems * STATE_BYTES + (s.conv_kernel - 1) * s.channels * conv_itemsize)


def gdn_bytes(s: HybridShape, step: str, mode: str, rows: int, *, batch: int = 1,
              conv_itemsize: int = 2, chunk: int = CHUNK) -> dict:
    """{"read", "write", "flops"} of the GDN layers' state in ``step``: ``"ar"`` (one row),
    ``"verify"`` (a block of ``rows``, keeping the ``mode``'s record) or ``"rollback"`` (module
    doc), for ``batch`` sequences."""
    L, S = s.gdn_layers, s.state_elems * STATE_BYTES
    Hv, dk, dv = s.num_v_heads, s.head_k_dim, s.head_v_dim
    window = (s.conv_kernel - 1) * s.channels * conv_itemsize
    cs = min(chunk, rows)
    n = math.ceil(rows / cs)
    prepared = lambda r: r * Hv * (dk + dv + 2) * STATE_BYTES
    if step == "ar":
        read, write, flops = S + window, S + window, 6 * Hv * dk * dv
    elif step == "verify":
        read, flops = S + window, 6 * rows * Hv * dk * dv
        record = (rows + 1) * S if mode == "snapshot" else (n + 1) * S + prepared(n * cs)
        write = record + (s.conv_kernel - 1 + rows) * s.channels * conv_itemsize
    elif step == "rollback":
        if mode == "snapshot":
            read, write, flops = S + window, S + window, 0
        else:
            read, write = S + prepared(cs) + window, S + window
            flops = 4 * cs * Hv * dk * dv + 2 * cs * cs * Hv * (dk + dv)
    else:
        raise ValueError(f"step must be 'ar', 'verify' or 'rollback', got {step!r}")
    return {"read": batch * L * read, "write": batch * L * write, "flops": batch * L * flops}


# ---------------------------------------------------------------------------- forwards
def target_forward(s: HybridShape, rows: int, context: int, *, step: str, mode: str = "replay",
                   taps: int = 0, batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The target on ``rows`` new rows per sequence over ``context`` cached positions (module
    doc); ``step`` ``"ar"`` or ``"verify"`` (the GDN record of ``mode``)."""
    D = s.hidden_size
    m, v = layer_params(s)
    linears = Cost("target linears", flops=2 * batch * rows * m, weights=(m + v) * weight_bytes,
                   activations=batch * rows * D * (1 + taps) * weight_bytes)
    pairs = rows * context + rows * (rows + 1) / 2
    per_pos = 2 * s.attention_layers * s.num_kv_heads * s.head_dim * kv_bytes
    attn = Cost("target attention", flops=4 * batch * s.attention_layers * s.num_heads * s.head_dim * pairs,
                kv_read=batch * context * per_pos, kv_write=batch * rows * per_pos)
    g = gdn_bytes(s, step, mode, rows, batch=batch, conv_itemsize=kv_bytes)
    gdn = Cost("target GDN", flops=g["flops"], kv_read=g["read"], kv_write=g["write"])
    return [linears, attn, gdn, dense.lm_head("target LM head", _Head(D, s.vocab_size), rows,
                                              batch=batch, weight_bytes=weight_bytes)]


@dataclasses.dataclass(frozen=True)
class _Head:
    """What ``roofline.lm_head`` and ``drafter_forward`` read of a target: D and V."""

    hidden_size: int
    vocab_size: int


def rollback_cost(s: HybridShape, mode: str, block_size: int, *, batch: int = 1, kv_bytes: int = 2) -> Cost:
    g = gdn_bytes(s, "rollback", mode, block_size, batch=batch, conv_itemsize=kv_bytes)
    return Cost("GDN rollback", flops=g["flops"], kv_read=g["read"], kv_write=g["write"])


def ar_step(s: HybridShape, context: int, **kw) -> list[Cost]:
    return target_forward(s, 1, context, step="ar", **kw)


def dflash_iteration(s: HybridShape, drafter: DrafterConfig, block_size: int, context: int,
                     mode: str, *, batch: int = 1, weight_bytes: int = 2, kv_bytes: int = 2) -> list[Cost]:
    """The draft, the verify of the block (keeping ``mode``'s record) and the GDN rollback."""
    kw = dict(batch=batch, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    return (dense.drafter_forward(drafter, _Head(s.hidden_size, s.vocab_size), block_size, context,
                                  block_size, **kw)
            + target_forward(s, block_size, context, step="verify", mode=mode, taps=drafter.num_taps, **kw)
            + [rollback_cost(s, mode, block_size, batch=batch, kv_bytes=kv_bytes)])


def step_times(s: HybridShape, drafter: DrafterConfig, block_size: int, context: int, device: str,
               mode: str, **kw) -> dict:
    dev = DEVICES[device]
    t_ar = dense.seconds(ar_step(s, context, **kw), dev)
    t_iter = dense.seconds(dflash_iteration(s, drafter, block_size, context, mode, **kw), dev)
    return {"t_ar_s": t_ar, "t_iter_s": t_iter, "ratio": t_iter / t_ar}


# ---------------------------------------------------------------------------- analysis
def analyse(name: str, s: HybridShape, drafter: DrafterConfig, context: int, devices: Sequence[str],
            taus: Mapping[str, float], *, batch: int = 1) -> list[dict]:
    """One row per (device, mode) at the drafter's block size: times, ratio, speedups, the
    iteration's GDN bytes (record + rollback) beside the weight bytes, and the ratio per
    block size."""
    bs = drafter.block_size
    rows = []
    for device in devices:
        for mode in MODES:
            kw = dict(batch=batch)
            t = step_times(s, drafter, bs, context, device, mode, **kw)
            it = dflash_iteration(s, drafter, bs, context, mode, **kw)
            ar = ar_step(s, context, **kw)
            by = {c.name: c for c in it}
            gdn_it = by["target GDN"].bytes + by["GDN rollback"].bytes
            rows.append({
                "model": name, "device": device, "mode": mode, "block_size": bs, "context": context,
                "batch": batch, "t_ar_us": 1e6 * t["t_ar_s"], "t_iter_us": 1e6 * t["t_iter_s"],
                "ratio": t["ratio"],
                "speedup": {k: tau / t["ratio"] for k, tau in taus.items()},
                "iteration_weight_bytes": dense.total(it, "weights"),
                "iteration_kv_bytes": by["target attention"].bytes,
                "iteration_gdn_bytes": gdn_it,
                "verify_gdn_bytes": by["target GDN"].bytes, "rollback_gdn_bytes": by["GDN rollback"].bytes,
                "ar_gdn_bytes": {c.name: c for c in ar}["target GDN"].bytes,
                "ar_weight_bytes": dense.total(ar, "weights"),
                "component_us": {c.name: 1e6 * c.seconds(DEVICES[device]) for c in it},
                "ratio_by_block_size": {str(b): step_times(s, dataclasses.replace(drafter, block_size=b), b,
                                                           context, device, mode, **kw)["ratio"]
                                        for b in HYBRID_BLOCK_SIZES},
            })
    return rows


def pair(name_or_path: str) -> tuple[str, HybridShape, DrafterConfig]:
    """A named model of :data:`MODELS` with its drafter, or a config.json path (a drafter
    shaped like :data:`DRAFTERS`' recipe at its widths)."""
    if name_or_path in MODELS:
        return name_or_path, shape_from_hf(MODELS[name_or_path]), DrafterConfig(**DRAFTERS[name_or_path])
    try:
        with open(name_or_path) as f:
            d = json.load(f)
    except OSError as e:
        raise ValueError(f"--hybrid {name_or_path!r} is neither a named model ({', '.join(MODELS)}) "
                         f"nor a readable config.json: {e}") from None
    s = shape_from_hf(d)
    n = s.num_layers
    drafter = DrafterConfig(num_layers=5, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                            num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=s.vocab_size,
                            block_size=16, num_target_layers=n,
                            target_layer_ids=tuple(int(x) for x in np.linspace(1, n - 3, 5)), mask_token_id=0)
    return name_or_path, s, drafter


def run_hybrid(args) -> dict:
    """``roofline --hybrid``: each model on H100 and B200 (or ``--devices`` when given other than
    the default), both rollback modes; JSON + markdown + plot under ``--out``."""
    from dflash_jax.cli import invocation

    devices = list(HYBRID_DEVICES) if list(args.devices) == list(DEVICES) else list(args.devices)
    models, rows = {}, []
    for target in args.hybrid:
        name, s, drafter = pair(target)
        if args.block_size:
            drafter = dataclasses.replace(drafter, block_size=args.block_size)
        models[name] = {"shape": dataclasses.asdict(s), "drafter": drafter.to_hf_dict(),
                        "params": num_params(s), "drafter_params": dense._drafter_params(drafter),
                        "gdn_layers": s.gdn_layers, "attention_layers": s.attention_layers,
                        "state_bytes_per_row": fixed_state_bytes(s),
                        "kv_bytes_per_token": kv_bytes_per_token(s)}
        rows += analyse(name, s, drafter, args.context, devices, TAUS, batch=args.batch)
    report = {"benchmark": "roofline_hybrid", "command": command_line("dflash_jax", invocation(args)),
              "settings": {"context": args.context, "batch": args.batch, "dtype": "bfloat16",
                           "state_dtype": "float32", "chunk": CHUNK, "devices": devices},
              "taus": TAUS, "models": models, "results": rows,
              "device_profiles": {k: dataclasses.asdict(DEVICES[k]) for k in devices},
              "env": environment(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    return publish_report(report, args.out, "roofline_hybrid", plot, markdown)


def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [f"`{report['command']}`", "",
             f"Batch {st['batch']}, context S = {st['context']}, bf16 weights, KV and conv inputs, "
             "float32 GDN states; the drafter's block size. GDN bytes / iteration: the verify's state "
             "traffic (the state read, the mode's record written) and the rollback's.", "",
             "| model | params | GDN / attention layers | GDN state per row | KV per token | drafter |",
             "|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        lines.append(f"| {name} | {m['params'] / 1e9:.2f}B | {m['gdn_layers']} / {m['attention_layers']} | "
                     f"{m['state_bytes_per_row'] / 1e6:.1f} MB | {m['kv_bytes_per_token'] / 1e3:.0f} KB | "
                     f"{m['drafter']['num_hidden_layers']} layers, {m['drafter_params'] / 1e6:.0f}M, "
                     f"block {m['drafter']['block_size']} |")
    lines += ["", "| model | device | mode | bs | weight GB / iter | GDN GB / iter (verify + rollback) | "
              "GDN / weights | t_AR (us) | t_iter (us) | t_iter / t_AR | speedup at tau |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['model']} | {r['device']} | {r['mode']} | {r['block_size']} | "
                     f"{r['iteration_weight_bytes'] / 1e9:.2f} | {r['iteration_gdn_bytes'] / 1e9:.3f} "
                     f"({r['verify_gdn_bytes'] / 1e9:.3f} + {r['rollback_gdn_bytes'] / 1e9:.3f}) | "
                     f"{100 * r['iteration_gdn_bytes'] / r['iteration_weight_bytes']:.1f}% | "
                     f"{r['t_ar_us']:.0f} | {r['t_iter_us']:.0f} | {r['ratio']:.3f} | "
                     + ", ".join(f"{v:.2f}x ({k}, tau {report['taus'][k]})" for k, v in r["speedup"].items()) + " |")
    lines += ["", "t_iter / t_AR by block size:", "", "| model | device | mode | "
              + " | ".join(f"bs {b}" for b in HYBRID_BLOCK_SIZES) + " |", "|---|---|---|" + "---|" * len(HYBRID_BLOCK_SIZES)]
    for r in report["results"]:
        lines.append(f"| {r['model']} | {r['device']} | {r['mode']} | "
                     + " | ".join(f"{r['ratio_by_block_size'][str(b)]:.3f}" for b in HYBRID_BLOCK_SIZES) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict):
    """Left: t_iter / t_AR against block size per (model, device, mode). Right: bytes per
    iteration, weights against the GDN traffic of each mode, per model (first device)."""
    fig, (a, b) = new_figure(1, 2, figsize=(12, 4.4))
    for r in report["results"]:
        xs = [int(k) for k in r["ratio_by_block_size"]]
        a.plot(xs, list(r["ratio_by_block_size"].values()), "o-" if r["mode"] == "snapshot" else "s--", ms=3,
               label=f"{r['model']}, {r['device']}, {r['mode']}")
    a.axhline(dense.PAPER_IMPLIED_RATIO, color="r", lw=0.8, ls=":", label="paper's implied ratio (Qwen3-8B)")
    a.set(xscale="log", xlabel="block size", ylabel="t_iter / t_AR", title="iteration cost (roofline)")
    a.legend(fontsize=6)
    first = report["settings"]["devices"][0]
    rs = [r for r in report["results"] if r["device"] == first]
    labels = [f"{r['model']}\n{r['mode']}" for r in rs]
    pos = np.arange(len(rs))
    a_w = [r["iteration_weight_bytes"] / 1e9 for r in rs]
    a_g = [r["iteration_gdn_bytes"] / 1e9 for r in rs]
    b.bar(pos - 0.2, a_w, 0.4, label="weights")
    b.bar(pos + 0.2, a_g, 0.4, label="GDN state (verify + rollback)")
    b.set_xticks(pos, labels, fontsize=7)
    b.set(yscale="log", ylabel="GB per iteration", title=f"bytes per iteration, batch {report['settings']['batch']}")
    b.legend(fontsize=7)
    fig.suptitle(f"hybrid roofline, context {report['settings']['context']}, bf16")
    return fig
