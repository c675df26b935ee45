"""The static config of a hybrid linear-attention target (:class:`HybridConfig`): the decoder
fields of :class:`~dflash_jax.config.TargetConfig` plus the layer pattern, the Gated DeltaNet
shapes, partial RoPE, the optional MoE block and how the GDN state is rolled back.

Dimensions (``docs/targets.md``): N layers of which the ``linear_attention`` ones are GDN
layers (Lg) and the ``full_attention`` ones gated GQA attention (La); a GDN layer has Hk key
heads of dk dims and Hv value heads of dv dims (Hv a multiple of Hk), a causal conv of kernel K
over C = 2 Hk dk + Hv dv channels; attention layers rotate the first
``rotary_dim = int(head_dim * partial_rotary_factor)`` dims of each head.
"""

from __future__ import annotations

import dataclasses

from dflash_jax.config import TargetConfig
from dflash_jax.nn import gated_delta
from dflash_jax.nn.gated_delta import IMPLS as GDN_IMPLS, RECORD_MODES

LINEAR, FULL = "linear_attention", "full_attention"
LAYER_TYPES = (LINEAR, FULL)


@dataclasses.dataclass(frozen=True)
class HybridConfig(TargetConfig):
    """A hybrid target's config (module docstring). ``intermediate_size`` is the dense MLP's
    width (with ``moe`` set, the shared expert's, kept for the base class's checks).

    ``layer_types``: one of :data:`LAYER_TYPES` per layer. ``linear_*``: the GDN shapes
    (transformers' names). ``partial_rotary_factor``: the rotated fraction of each attention
    head. ``moe``: the MoE block's config (``targets.moe.qwen3_5_moe.MoeBlockConfig``) when
    every layer's MLP is that block, None for the dense SwiGLU MLP (:meth:`mlp_kind`).

    Not in config.json (run options of this implementation): ``gdn_rollback``, the record a
    forward keeps so that the decode state can roll back (``"replay"``: the chunk-boundary
    states and the block's inputs, the accepted prefix of a chunk recomputed on rollback;
    ``"snapshot"``: the state after every row, verify then runs the per-token recurrence;
    ``nn.gated_delta``), ``gdn_chunk``, the chunk length of the chunked form, and ``gdn_impl``,
    its implementation (``"xla"``: ``jnp``; ``"pallas"``: the kernels of ``kernels/gdn_chunk.py``).
    """

    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 1.0
    moe: object | None = None
    gdn_rollback: str = "replay"
    gdn_chunk: int = 64
    gdn_impl: str = "xla"

    # ------------------------------------------------------------------ layer pattern
    def is_gdn_layer(self, i: int) -> bool:
        return self.layer_types[i] == LINEAR

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """The GDN layers' indices, in order (their state's stacking order)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The full-attention layers' indices, in order (their KV cache's stacking order)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    def mlp_kind(self, i: int) -> str:
        """Layer i's MLP: ``"moe"`` (the block of :attr:`moe`) or ``"mlp"`` (dense SwiGLU). A
        family whose layers mix the two overrides this."""
        return "moe" if self.moe is not None else "mlp"

    def layer_kinds(self, i: int) -> tuple[str, str]:
        """(``"gdn"`` or ``"attn"``, :meth:`mlp_kind`) of layer i."""
        return ("gdn" if self.is_gdn_layer(i) else "attn", self.mlp_kind(i))

    def stack_index(self, i: int) -> tuple[int, int]:
        """Layer i's index in its mixer stack (GDN or attention) and in its MLP stack."""
        mixer, mlp = self.layer_kinds(i)
        a = sum(1 for j in range(i) if self.layer_kinds(j)[0] == mixer)
        b = sum(1 for j in range(i) if self.mlp_kind(j) == mlp)
        return a, b

    # ------------------------------------------------------------------ shapes
    @property
    def rotary_dim(self) -> int:
        """The rotated dims of each attention head: ``int(head_dim * partial_rotary_factor)``."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_channels(self) -> int:
        """C = 2 Hk dk + Hv dv: the conv runs over q, k and v concatenated."""
        return gated_delta.conv_channels(self.linear_num_key_heads, self.linear_key_head_dim,
                                         self.linear_num_value_heads, self.linear_value_head_dim)


def check_hybrid_config(cfg: HybridConfig) -> None:
    """Raises a one-line ValueError naming the field when ``cfg`` is inconsistent."""
    if not isinstance(cfg, HybridConfig):
        raise ValueError(f"a {cfg.model_type} target needs a HybridConfig "
                         "(dflash_jax.targets.hybrid), with layer_types and the linear_* fields")
    if len(cfg.layer_types) != cfg.num_layers:
        raise ValueError(f"layer_types has {len(cfg.layer_types)} entries but num_hidden_layers is "
                         f"{cfg.num_layers}: give one type per layer")
    for i, t in enumerate(cfg.layer_types):
        if t not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}]={t!r} is not a known layer type (known: "
                             f"{', '.join(LAYER_TYPES)})")
    for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim", "gdn_chunk"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ValueError(f"linear_num_value_heads ({cfg.linear_num_value_heads}) must be a multiple of "
                         f"linear_num_key_heads ({cfg.linear_num_key_heads}): value head h reads key "
                         "head h // (Hv / Hk)")
    if not 0 < cfg.partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {cfg.partial_rotary_factor}")
    if cfg.rotary_dim < 2 or cfg.rotary_dim % 2:
        raise ValueError(f"partial_rotary_factor={cfg.partial_rotary_factor} of head_dim={cfg.head_dim} "
                         f"rotates {cfg.rotary_dim} dims; it must be a positive even number")
    if cfg.rope.rope_type != "default":
        raise ValueError(f"rope type {cfg.rope.rope_type!r} is not implemented for {cfg.model_type} "
                         "(partial rotary with plain RoPE only: rope_parameters.rope_type 'default')")
    if cfg.gdn_impl not in GDN_IMPLS:
        raise ValueError(f"gdn_impl must be one of {', '.join(GDN_IMPLS)}, got {cfg.gdn_impl!r}")
    if cfg.gdn_rollback not in RECORD_MODES:
        raise ValueError(f"gdn_rollback must be one of {', '.join(RECORD_MODES)}, got {cfg.gdn_rollback!r}")
