"""The GLM-5 target family (``model_type`` ``glm_moe_dsa``; transformers' ``GlmMoeDsaForCausalLM``):
DeepSeek-V3's decoder (``deepseek_v3``: multi-head latent attention with interleaved rope dims,
the sigmoid group-limited MoE with shared experts) with DeepSeek Sparse Attention: in each
layer a lightning indexer scores the visible keys and the attention sees only its ``index_topk``
best (``indexer_types``: a ``"shared"`` layer reuses the previous ``"full"`` layer's choice).

This family runs the attention dense, which is exact while no query sees more than
``index_topk`` keys: the indexer then keeps every visible key (transformers takes the top
``min(index_topk, keys)``). So a ``Target`` of it holds at most ``index_topk`` positions per
row (``exact_positions``: its default ``max_len``, a larger one refused with one line, and
``generate`` refuses a prompt plus budget above ``max_len``), and a cache-less pass over more
is refused; the indexer's weights are loaded,
kept and saved (the checkpoint round-trips) but not computed. Released GLM-5 models have
``index_topk`` 2048: prompt plus output up to 2048 tokens run exactly here.

Which layers are MoE follows ``mlp_layer_types`` (``"dense"`` / ``"sparse"``), as transformers
builds them (default: the first ``first_k_dense_replace`` dense).

Indexer tensors of a ``"full"`` layer i (``model.layers.{i}.self_attn.indexer.``): ``wq_b.weight``
[Hi Di, rq], ``wk.weight`` [Di, D], ``k_norm.weight`` / ``k_norm.bias`` [Di] (a LayerNorm),
``weights_proj.weight`` [Hi, D]; in the parameter tree under ``layers/indexer/`` stacked over the
full layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dflash_jax.checkpoints import TensorSpec
from dflash_jax.targets.mla.deepseek_v3 import DeepseekV3Config, DeepseekV3Family

MODEL_TYPE = "glm_moe_dsa"
INDEXER_TYPES = ("full", "shared")
MLP_TYPES = ("dense", "sparse")


@dataclasses.dataclass(frozen=True)
class GlmMoeDsaConfig(DeepseekV3Config):
    """:class:`DeepseekV3Config` plus the sparse attention's indexer (``index_topk`` keys per
    query, ``index_n_heads`` heads of ``index_head_dim``; ``indexer_types`` per layer) and the
    per-layer MLP kinds (``mlp_layer_types``)."""

    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 32
    indexer_types: tuple[str, ...] = ()
    mlp_layer_types: tuple[str, ...] = ()

    def is_moe_layer(self, i: int) -> bool:
        return self.mlp_layer_types[i] == "sparse"

    @property
    def indexer_layers(self) -> tuple[int, ...]:
        """The layers that run (and hold) their own indexer."""
        return tuple(i for i, t in enumerate(self.indexer_types) if t == "full")


def _types(d: Mapping[str, Any], field: str, allowed: tuple[str, ...], n: int, default, what: str) -> tuple[str, ...]:
    v = d.get(field)
    if v is None:
        return tuple(default)
    if not isinstance(v, (list, tuple)) or len(v) != n or any(t not in allowed for t in v):
        raise ValueError(f"{what}: {field} must list {n} of {' / '.join(allowed)}, got {v!r}")
    return tuple(v)


class GlmMoeDsaFamily(DeepseekV3Family):
    """The ``glm_moe_dsa`` family (module docstring)."""

    model_types = (MODEL_TYPE,)
    name = MODEL_TYPE
    architecture = "GlmMoeDsaForCausalLM"

    def config_from_hf(self, d: Mapping[str, Any]) -> GlmMoeDsaConfig:
        """DeepSeek-V3's fields (``deepseek_v3.DeepseekV3Family.config_from_hf``; the rope dims
        always interleaved) plus the indexer's and the per-layer types; ``indexer_types``
        defaults as transformers derives it (``index_topk_freq``, ``index_skip_topk_offset``)."""
        what = f"target config.json ({MODEL_TYPE})"
        if not d.get("q_lora_rank"):
            raise ValueError(f"{what}: q_lora_rank must be set (the indexer reads the query latent)")
        base = DeepseekV3Family.config_from_hf(self, {**d, "rope_interleave": True, "model_type": "deepseek_v3"})
        n = base.num_layers
        freq = max(int(d.get("index_topk_freq") or 1), 1)
        offset = int(d.get("index_skip_topk_offset", 2))
        pattern = d.get("index_topk_pattern")
        if d.get("indexer_types") is None and isinstance(pattern, str):
            d = {**d, "indexer_types": [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]}
        indexer = _types(d, "indexer_types", INDEXER_TYPES, n,
                         ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)], what)
        if indexer and indexer[0] != "full":
            raise ValueError(f"{what}: indexer_types[0] must be 'full' (a shared layer reuses an earlier "
                             f"full layer's choice), got {indexer[0]!r}")
        dense_k = min(base.first_k_dense_replace, n)
        mlp = _types(d, "mlp_layer_types", MLP_TYPES, n, ["dense"] * dense_k + ["sparse"] * (n - dense_k), what)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["model_type"] = MODEL_TYPE
        return GlmMoeDsaConfig(**fields, index_topk=int(d.get("index_topk", 2048)),
                               index_head_dim=int(d.get("index_head_dim", 128)),
                               index_n_heads=int(d.get("index_n_heads", 32)),
                               indexer_types=indexer, mlp_layer_types=mlp)

    def check_config(self, cfg) -> None:
        if not isinstance(cfg, GlmMoeDsaConfig):
            raise ValueError("a glm_moe_dsa target needs a GlmMoeDsaConfig (dflash_jax.targets.mla.glm_moe_dsa)")
        if len(cfg.mlp_layer_types) != cfg.num_layers or len(cfg.indexer_types) != cfg.num_layers:
            raise ValueError(f"mlp_layer_types and indexer_types need {cfg.num_layers} entries each")
        if cfg.index_topk < 1:
            raise ValueError(f"index_topk must be positive, got {cfg.index_topk}")
        super().check_config(cfg)

    def config_to_hf(self, cfg: GlmMoeDsaConfig) -> dict:
        d = super().config_to_hf(cfg)
        d.pop("rope_interleave", None)
        d.pop("num_nextn_predict_layers", None)
        return {**d, "architectures": [self.architecture], "model_type": MODEL_TYPE,
                "index_topk": cfg.index_topk, "index_head_dim": cfg.index_head_dim,
                "index_n_heads": cfg.index_n_heads, "indexer_types": list(cfg.indexer_types),
                "mlp_layer_types": list(cfg.mlp_layer_types)}

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg: GlmMoeDsaConfig) -> dict[str, TensorSpec]:
        """DeepSeek-V3's tensors plus each full layer's indexer (module docstring)."""
        specs = super().tensor_specs(cfg)
        D, rq, Hi, Di = cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim
        for j, i in enumerate(cfg.indexer_layers):
            pre = f"model.layers.{i}.self_attn.indexer."
            for name, path, t, shape in (("wq_b.weight", ("wq_b", "kernel"), True, (Hi * Di, rq)),
                                         ("wk.weight", ("wk", "kernel"), True, (Di, D)),
                                         ("k_norm.weight", ("k_norm", "weight"), False, (Di,)),
                                         ("k_norm.bias", ("k_norm", "bias"), False, (Di,)),
                                         ("weights_proj.weight", ("weights_proj", "kernel"), True, (Hi, D))):
                specs[pre + name] = TensorSpec(("layers", "indexer") + path, j, t, shape)
        return specs

    def stack_size(self, cfg, kind: str) -> int:
        return len(cfg.indexer_layers) if kind == "indexer" else super().stack_size(cfg, kind)

    # ------------------------------------------------------------------ the model
    def check_length(self, cfg: GlmMoeDsaConfig, positions: int, what: str) -> None:
        """Refuses more than ``index_topk`` positions: the dense attention is exact only up to it."""
        if positions > cfg.index_topk:
            raise ValueError(f"glm_moe_dsa runs its sparse attention dense, exact only while a sequence "
                             f"holds at most index_topk={cfg.index_topk} positions: {what} {positions} "
                             f"exceeds it (shorten prompt + max_new_tokens)")

    def exact_positions(self, cfg) -> int:
        """``index_topk``: a ``Target`` keeps its ``max_len`` (prompt plus new tokens) within it
        (the slots of a last speculative block past it hold drafts that are never emitted)."""
        return cfg.index_topk

    def forward(self, cfg, params, tokens, positions, state=None, **kw):
        if state is None:
            self.check_length(cfg, tokens.shape[1], "a pass over")
        return super().forward(cfg, params, tokens, positions, state, **kw)

    def param_axes(self, cfg):
        """DeepSeek-V3's, and the indexer replicated (it is not computed)."""
        return {**super().param_axes(cfg),
                ("wq_b", "kernel"): ("latent", "latent"), ("wk", "kernel"): ("embed", "latent"),
                ("k_norm", "weight"): ("latent",), ("k_norm", "bias"): ("latent",),
                ("weights_proj", "kernel"): ("embed", "latent")}

    # ------------------------------------------------------------------ size model
    def num_params(self, cfg) -> int:
        """DeepSeek-V3's count plus the indexers'."""
        D, rq, Hi, Di = cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim
        return super().num_params(cfg) + len(cfg.indexer_layers) * (Hi * Di * rq + Di * D + 2 * Di + Hi * D)


GLM_MOE_DSA = GlmMoeDsaFamily()
