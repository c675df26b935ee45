"""The target-family interface, :class:`TargetFamily` (what the registry in
``dflash_jax.targets`` maps a Hugging Face ``model_type`` to; ``docs/targets.md``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax

from dflash_jax.nn import head
from dflash_jax.quantization import is_quantized

SPLIT_MAX_BYTES = 2 << 30
"""Layer weights above this many bytes keep the stacked layout in the CPU decode loop
(:meth:`TargetFamily.loop_params`)."""


class TargetFamily:
    """One target architecture family. Subclass it, set :attr:`model_types`, implement the
    methods that raise ``NotImplementedError`` here, and register an instance
    (``dflash_jax.targets.register``, one line in ``dflash_jax/targets/builtin.py``).

    The methods every family implements (the engine calls them): :meth:`config_from_hf`,
    :meth:`init_params`, :meth:`init_state`, :meth:`forward`. The ones that default here:
    :meth:`embed` / :meth:`lm_head` (the shared ``nn.head`` layout), :meth:`loop_params` (the
    parameters as given). The ones a family needs for checkpoints, meshes and the cost models
    (:meth:`config_to_hf`, :meth:`tensor_specs`, :meth:`param_axes`, :meth:`state_axes`,
    :meth:`split_dims`, :meth:`local_config`, :meth:`num_params`, :meth:`state_bytes_per_token`) raise a clear error
    until the family defines them.
    """

    model_types: tuple[str, ...] = ()
    """The Hugging Face ``model_type`` values this family reads (registry keys)."""

    name: str = ""
    """A short name for messages (default: the first model type)."""

    tree_refusal: str | None = ("its forward takes no tree block (``tree=``, "
                                "``nn.tree_attention``)")
    """None when the family verifies trees of drafts (``verification.tree``: its ``forward`` takes
    ``tree=TreeAttention(...)`` and its decode state has ``compact(start, source)``); otherwise
    why not, the reason the engine gives when a tree is asked for."""

    # ------------------------------------------------------------------ config
    def config_from_hf(self, d: Mapping[str, Any]):
        """The family's static config (a frozen, hashable dataclass with ``model_type``,
        ``vocab_size``, ``hidden_size``, ``num_layers``, ``max_position_embeddings``,
        ``eos_token_id``, ``tie_word_embeddings``) from a ``config.json`` dict; fields it
        does not implement are refused with the field named."""
        raise NotImplementedError(self._missing("config_from_hf"))

    def config_to_hf(self, cfg) -> dict:
        """The ``config.json`` dict transformers loads as the same model."""
        raise NotImplementedError(self._missing("config_to_hf"))

    def check_config(self, cfg) -> None:
        """Raises ValueError when ``cfg`` asks for something the family does not implement
        (called when a config is built)."""

    # ------------------------------------------------------------------ checkpoints
    def tensor_specs(self, cfg) -> dict:
        """{Hugging Face tensor name: ``checkpoints.TensorSpec``}: the checkpoint layout
        in both directions (names, parameter paths, shapes, transposes, layer stacking)."""
        raise NotImplementedError(self._missing("tensor_specs"))

    convert_checkpoint_tensors = None
    """Optional: ``convert_checkpoint_tensors(cfg, tensors, what) -> tensors``, for a family
    whose checkpoints may store other layouts than :meth:`tensor_specs` names (experts fused into
    one tensor per layer, MXFP4 blocks): maps the tensors as read to the ``tensor_specs`` names,
    raising ``checkpoints.CheckpointError`` naming a bad tensor. ``load_target_params`` calls it
    when a checkpoint holds names outside the specs; None (the default): no other layout."""

    export_checkpoint_tensors = None
    """Optional: ``export_checkpoint_tensors(cfg, tensors) -> tensors``, for a family whose
    checkpoints store a layout :meth:`tensor_specs` cannot name (projections packed per head,
    ``qwen3_next``): maps the tensors named as the specs name them to the ones written to disk
    (the inverse of :attr:`convert_checkpoint_tensors`). ``save_target_params`` calls it; None
    (the default): the tensors are written as the specs name them."""

    check_checkpoint_tensors = None
    """Optional: ``check_checkpoint_tensors(cfg, shapes, what)``, a family's own one-line
    ``CheckpointError`` for a checkpoint in its ``tensor_specs`` layout ({name: shape} from the
    file headers) before the loader's generic listing of missing and mis-shaped tensors (e.g.
    "GDN tensor ... is missing (layer 3 is a linear_attention layer)"). None: no such check."""

    # ------------------------------------------------------------------ the model
    def init_params(self, cfg, key, dtype, init_scale: float = 0.02):
        """Random parameters of ``cfg`` (normal(init_scale) matrices, unit norms)."""
        raise NotImplementedError(self._missing("init_params"))

    def init_state(self, cfg, batch: int, max_len: int, dtype):
        """An empty decode state for ``batch`` rows of up to ``max_len`` positions (lengths 0)."""
        raise NotImplementedError(self._missing("init_state"))

    def forward(self, cfg, params, tokens, positions, state=None, *, tap_layer_ids: Sequence[int] = (),
                logit_index=None, compute_logits: bool = True, attention_impl: str = "xla",
                model_axis: str | None = None):
        """One causal pass over a block of tokens int32[B, T] at positions int32[B, T]
        (``state.lengths + arange(T)`` when decoding; no state: the block alone).

        Returns ``(logits float32[B, T, V] (or [B, 1, V] at ``logit_index``, None without
        ``compute_logits``), taps [B, T, k*D] (None without tap ids), state)``. The taps are
        the outputs of decoder layers ``tap_layer_ids`` (0-based) concatenated in that order,
        the last layer's after the final norm (transformers' ``hidden_states[i + 1]``,
        ``docs/method.md``). The returned state holds the whole block (``lengths =
        positions[:, -1] + 1``) and can be rolled back to any length from the one it had on
        entry up to that one (``state.rollback``).

        ``model_axis``: inside ``shard_map``, the mesh axis of the tensor-parallel psums (``cfg``
        is then the shard's config, ``parallel.local_config``). A family with experts
        (:meth:`expert_dims` not empty) also takes ``expert_axis``: the mesh axis its experts
        are split over (expert parallelism, ``parallel.rules``); the engine passes it only
        when that axis has more than one device, so a family without experts never sees it."""
        raise NotImplementedError(self._missing("forward"))

    def exact_positions(self, cfg) -> int | None:
        """The longest sequence (positions per row) the family computes exactly, when it is
        shorter than any context the model allows (``glm_moe_dsa``: its sparse attention runs
        dense, exact up to ``index_topk``); None: no such bound. ``Target`` caps its ``max_len``
        at it (the default) and refuses a longer one."""
        return None

    def embed(self, params, tokens, model_axis: str | None = None):
        """The token embedding [..., D] (drafters share it)."""
        return head.embed(params, tokens, model_axis)

    def lm_head(self, cfg, params, h):
        """Logits float32[..., V] of already-normed hidden states (drafters share it)."""
        return head.lm_head(cfg, params, h)

    split_layers = None
    """Optional: ``split_layers(params) -> params``, the stacked ``layers`` tree replaced by one
    tree per layer (``dense.model.split_layer_params``), which :meth:`loop_params` uses on CPU."""

    def loop_params(self, params):
        """The parameters in the layout the decode loop runs (computed once per decode call,
        outside the loop). As given, except on CPU for a family with :attr:`split_layers`: the
        layers split into one tree each, because XLA:CPU copies a stacked layer's weights out of
        the stack at every use inside a loop (a ``dynamic-slice`` per weight per step; measured
        on the embedded target, 2 cores: AR step 4.1 -> 3.3-3.6 ms, DFlash block-16 iteration
        14.7 -> 13.1-13.5 ms). The split holds a second copy of the layer weights during the
        call, so targets whose layer weights exceed :data:`SPLIT_MAX_BYTES` keep the stacked
        layout (and the copies). On GPU, XLA reads the slices in place (``xla_flags``). Quantized
        layers (``dflash_jax.quantization``) stay stacked: the fusion that dequantizes a layer's
        matrices reads their slice of the stack itself, so there is no copy for the split to save,
        and split layers would let XLA hoist every layer's dequantization out of the loop."""
        if self.split_layers is None or jax.default_backend() != "cpu" or "layers" not in params:
            return params
        if is_quantized(params["layers"]):  # its dequantization reads the slice in place already
            return params
        size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params["layers"]))
        return self.split_layers(params) if size <= SPLIT_MAX_BYTES else params

    # ------------------------------------------------------------------ partitioning
    def param_axes(self, cfg) -> Mapping[tuple[str, str], tuple[str, ...]]:
        """(module, parameter) -> logical axes (``parallel.rules``) of every parameter;
        parameters under ``layers/`` get the stacked ``layers`` axis first."""
        raise NotImplementedError(self._missing("param_axes", "run on a mesh"))

    def state_axes(self, cfg):
        """The decode state's pytree with a tuple of logical axis names at every leaf."""
        raise NotImplementedError(self._missing("state_axes", "run on a mesh"))

    def split_dims(self, cfg) -> list[tuple[str, int, str]]:
        """(config field, size, what it is) of every dimension split over the ``model`` mesh
        axis; each must be divisible by the axis size."""
        raise NotImplementedError(self._missing("split_dims", "run on a mesh"))

    def local_config(self, cfg, model: int):
        """The config one of ``model`` tensor-parallel shards computes with."""
        raise NotImplementedError(self._missing("local_config", "run on a mesh"))

    def expert_dims(self, cfg) -> list[tuple[str, int, str]]:
        """(config field, size, what it is) of every dimension split over the ``expert`` mesh
        axis (expert parallelism); each must be divisible by the axis size. Empty (the
        default): the family has no experts, and a mesh with an expert axis is refused."""
        return []

    def expert_local_config(self, cfg, expert: int):
        """The config one of ``expert`` expert-parallel shards computes with: its ``E / expert``
        local experts (the router still scores all of them)."""
        raise NotImplementedError(self._missing("expert_local_config", "split experts over a mesh"))

    # ------------------------------------------------------------------ size model
    def num_params(self, cfg) -> int:
        """Parameter count (embedding, head, layers, norms)."""
        raise NotImplementedError(self._missing("num_params", "be sized"))

    def matrix_params(self, cfg) -> int:
        """The parameters in matrices (layers, embedding, LM head): what tensor parallelism
        splits; the rest (norm vectors) is replicated."""
        raise NotImplementedError(self._missing("matrix_params", "be sized"))

    def matrix_params_read(self, cfg, rows: int) -> float:
        """Expected matrix parameters one forward pass over ``rows`` tokens of ONE sequence
        reads from memory (embedding rows aside: the LM head and the layers). A dense family
        reads all of them whatever ``rows`` is (the default: :meth:`matrix_params`); a
        mixture-of-experts family reads its shared parts plus, in each MoE layer, the experts
        the rows route to: ``E * (1 - (1 - k/E) ** rows)`` of ``E`` under uniform routing
        (1 row: k experts; a block of 16 rows: up to ``min(E, 16k)``). The roofline and the
        communication model charge weight traffic with this."""
        return float(self.matrix_params(cfg))

    def matrix_params_per_token(self, cfg) -> int:
        """Matrix parameters one token multiplies with (a forward costs about twice this in
        FLOPs per token): all of them for a dense family, the router, the shared parts and the
        k routed experts for an MoE family (the default: :meth:`matrix_params`)."""
        return self.matrix_params(cfg)

    def state_bytes_per_token(self, cfg, itemsize: int) -> float:
        """Decode-state bytes one more position of one row costs (KV of every attention layer)."""
        raise NotImplementedError(self._missing("state_bytes_per_token", "be sized"))

    # ------------------------------------------------------------------ helpers
    def _missing(self, method: str, to: str = "do this") -> str:
        return (f"the {self.name or self.model_types[0]!r} target family does not define "
                f"{method}(), which is needed to {to}")

    def __repr__(self) -> str:
        return f"<target family {self.name or self.model_types[0]!r}: {', '.join(self.model_types)}>"
