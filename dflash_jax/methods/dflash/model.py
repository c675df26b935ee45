"""The DFlash drafter (docs/method.md section 3), in Flax Linen, used functionally.

One forward pass fills a block ``[anchor, MASK, ..., MASK]`` at positions ``start ..
start+T-1``. The target's tapped features are projected once per context position
(``c = hidden_norm(fc(taps))``) and injected into every layer's keys and values: layer j
projects the context rows ``c`` and its own normed block rows ``x`` with the SAME k/v
projections, and the block queries attend, non-causally, to every valid context row and every
block row. The per-layer K/V of context rows live in a KVCache (``lengths`` = number of valid
context positions); the block's own K/V are never stored.

``DrafterModel`` has one method per use, called with ``apply(..., method=...)``:

  project_context(taps [B, C, k*D], positions int32[B, C], cache, ctx_len int32[B]) -> cache
      the K/V of new context rows (the prompt at prefill, then each verified block) written
      into every layer's cache slots;
  draft(block_embeds [B, T, D], block_positions int32[B, T], cache) -> hidden [B, T, D]
      one block against the cached context (decoding);
  train_blocks(block_embeds [B, N*T, D], block_positions int32[B, N*T], taps [B, S, k*D],
               anchors int32[B, N], valid bool[B, N]) -> hidden [B, N*T, D]
      all training blocks of whole sequences, each seeing the context before its anchor.

Parameter tree (kernels [in, out]):

  fc/kernel                          [k*D, D]   (not with conditioning "none")
  hidden_norm/weight                 [D]        (not with conditioning "none")
  layers/...                         like the target's decoder layers, stacked on axis 0,
                                     with q_norm / k_norm (Qwen3 structure), no biases
  norm/weight                        [D]

The embedding and LM head are the target's (``nn.head.embed`` / ``lm_head``, through the target family).

``cfg.conditioning`` chooses how the target's features enter (the paper's comparison):

  "kv"     (above; the paper's method, the released drafters).
  "input"  input fusion: the sequence is ``[c_0 .. c_{S-1}; block rows]`` and the drafter is
           an ordinary pre-norm transformer over it. Context rows are normed by each layer's
           ``input_layernorm`` like any row, attend causally (by position) to context rows only,
           and go through the residual and MLP, so layer j's context K/V come from the context
           rows' hidden state after layers < j (not from ``c`` itself). Block rows attend, as in
           kv, non-causally to the visible context rows (layer j's K/V) and to their own block.
           ``project_context`` runs the new rows through the layer stack (per layer: write their
           K/V at their positions, then attend to cache slots ``<= own position`` and
           ``< ctx_len``); since committed rows precede uncommitted ones (padding of ragged
           prompts, rejected rows of a verified block), uncommitted rows never reach committed
           ones, and their slots (``>= ctx_len``) are rewritten before anything reads them.
           ``draft`` is the kv one; same parameters as kv.
  "none"   no target features: block rows attend only to their own block; ``project_context``
           only sets the context length, ``train_blocks`` ignores the taps; no ``fc`` or
           ``hidden_norm`` parameters.

Attention shapes (heads, KV heads, head_dim) and the MLP width are the drafter's own
(``cfg``), independent of the target's: only the hidden size and vocabulary are shared.

Sliding-window layers (``cfg.layer_types``, conditioning "kv"): a ``"sliding_attention"`` layer
with window W masks exactly as SpecForge trained the released sliding drafters
(``create_dflash_sdpa_mask`` / ``create_dflash_block_mask`` with ``sliding_window``): the block
row at position ``p`` (offset o from the anchor / block start a) sees the context positions
``p - (W - 1) <= t < a`` (the window counts the row itself) and the block rows at offsets
``<= o`` (causal within the block; those rows are not windowed, which matters only for
W < block size). Full layers are unchanged. ``draft`` and ``train_blocks`` apply it with the
same per-layer window (``cfg.layer_windows``, scanned as a traced value: 0 = full); the context
cache keeps every position (the window is a mask, not a ring buffer), and a sliding drafter
always drafts with the XLA attention (the kernels have no window; ``attention_impl`` then
applies to nothing in the drafter).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn import MLP, RMSNorm, apply_rope, rope_cos_sin, segmented_attention
from dflash_jax.nn.attention import (BLOCK_ATTENTION, DEFAULT_ANCHOR_CHUNK, DEFAULT_CONTEXT_CHUNK,
                                     check_attention_impl, check_chunk, training_block_attention)
from dflash_jax.nn.layers import out_projection, random_module_params


class DrafterAttention(nn.Module):
    """One layer's attention (docs/method.md section 3): q/k/v/o projections with q_norm / k_norm per head.

    Context rows and block rows go through the SAME k/v projections; the block's queries attend,
    non-causally, to the visible context rows and to every row of their own block.
    """

    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None
    anchor_chunk: int = DEFAULT_ANCHOR_CHUNK  # the training attention's chunks (train_blocks)
    context_chunk: int = DEFAULT_CONTEXT_CHUNK

    def setup(self):
        cfg = self.cfg
        dense = lambda n: nn.Dense(n, use_bias=False, param_dtype=self.param_dtype)
        self.q_proj = dense(cfg.num_heads * cfg.head_dim)
        self.k_proj = dense(cfg.num_kv_heads * cfg.head_dim)
        self.v_proj = dense(cfg.num_kv_heads * cfg.head_dim)
        self.o_proj = out_projection(cfg.hidden_size, False, self.param_dtype, self.model_axis)
        self.q_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
        self.k_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)

    def queries(self, x_BxTxD: jax.Array, rope) -> jax.Array:
        """Normed, rotated queries [B, T, H, Dh] of rows x (rope: cos, sin [B, T, Dh])."""
        B, T, _ = x_BxTxD.shape
        q = self.q_proj(x_BxTxD).reshape(B, T, self.cfg.num_heads, self.cfg.head_dim)
        return apply_rope(self.q_norm(q), *rope)

    def keys_values(self, x_BxTxD: jax.Array, rope) -> tuple[jax.Array, jax.Array]:
        """Normed, rotated keys and values [B, T, Hkv, Dh] of rows x (context or block rows)."""
        B, T, _ = x_BxTxD.shape
        heads = (B, T, self.cfg.num_kv_heads, self.cfg.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(x_BxTxD).reshape(heads)), *rope)
        return k, self.v_proj(x_BxTxD).reshape(heads)

    def over_cache(self, x_BxTxD: jax.Array, rope, cache: KVCache, layer: jax.Array,
                   positions_BxT: jax.Array | None = None, window: jax.Array | None = None
                   ) -> jax.Array:
        """Inference: the block's rows see context slots ``< cache.lengths[b]`` of this layer's
        cache ``cache.k[layer], cache.v[layer]`` [B, S, Hkv, Dh] and every block row
        (conditioning "none": only the block rows; the cache is not read).

        ``window`` (int32 scalar, a drafter with sliding layers; 0 = this layer is full): a
        sliding layer's row at ``positions[b, t]`` sees only the slots ``>= position - (W - 1)``
        and the block rows ``<= t`` (module docstring). Returns [B, T, D]."""
        B, T, _ = x_BxTxD.shape
        q_BxTxHxDh = self.queries(x_BxTxD, rope)
        k_blk, v_blk = self.keys_values(x_BxTxD, rope)  # never stored in the cache
        if self.cfg.conditioning == "none":  # no context: XLA attention over the block alone
            out = segmented_attention(q_BxTxHxDh, [(k_blk, v_blk, jnp.ones((1, 1, T), bool))])
        elif window is not None:  # sliding layers: XLA attention with the window's masks
            slots = jnp.arange(cache.max_len, dtype=jnp.int32)[None, None, :]
            full = window <= 0
            ctx_BxTxS = (slots < cache.lengths[:, None, None]) & (
                full | (slots >= positions_BxT[:, :, None] - (window - 1)))
            rows = jnp.arange(T, dtype=jnp.int32)
            blk_1xTxT = (full | (rows[None, :] <= rows[:, None]))[None]
            out = segmented_attention(q_BxTxHxDh, [(cache.k[layer], cache.v[layer], ctx_BxTxS),
                                                   (k_blk, v_blk, blk_1xTxT)])
        elif self.attention_impl in BLOCK_ATTENTION:  # a kernel ("pallas" or "triton")
            out = BLOCK_ATTENTION[self.attention_impl](q_BxTxHxDh, cache.k, cache.v, cache.lengths,
                                                       causal=False, layer=layer, k_blk=k_blk,
                                                       v_blk=v_blk)
        else:
            ctx_visible_Bx1xS = (jnp.arange(cache.max_len)[None, :] < cache.lengths[:, None])[:, None, :]
            out = segmented_attention(q_BxTxHxDh, [(cache.k[layer], cache.v[layer], ctx_visible_Bx1xS),
                                                   (k_blk, v_blk, jnp.ones((1, 1, T), bool))])
        return self.o_proj(out.reshape(B, T, -1))

    def over_blocks(self, x_BxNTxD: jax.Array, rope, ctx_BxSxD: jax.Array | None, ctx_rope,
                    anchors_BxN: jax.Array, valid_BxN: jax.Array, ctx_kv=None,
                    window: jax.Array | None = None) -> jax.Array:
        """Training: N blocks of T rows each (``x`` [B, N*T, D]); block j sees the context rows
        at positions ``< anchors[b, j]`` and its own rows (``nn.attention.training_block_attention``:
        dense when one chunk covers all blocks and context positions, else chunked with an
        online softmax; ``anchor_chunk`` / ``context_chunk``).

        The context keys/values are this layer's projections of the rows ``ctx`` [B, S, D]
        (conditioning "kv"), or given as ``ctx_kv`` = (k, v) [B, S, Hkv, Dh] ("input"); with
        neither ("none") each block sees only its own rows (a padding block: nothing).
        ``window``: as in :meth:`over_cache` (``training_block_attention``'s ``window``).

        Returns [B, N*T, D]."""
        B, NT, _ = x_BxNTxD.shape
        N = anchors_BxN.shape[1]
        blocks = lambda a: a.reshape(B, N, NT // N, *a.shape[2:])  # [B, N*T, ...] -> [B, N, T, ...]
        q = self.queries(x_BxNTxD, rope)
        k_blk, v_blk = self.keys_values(x_BxNTxD, rope)
        if ctx_BxSxD is None and ctx_kv is None:  # "none": one attention per block, B*N of them
            per_block = lambda a: a.reshape(B * N, NT // N, *a.shape[2:])
            out = segmented_attention(per_block(q), [(per_block(k_blk), per_block(v_blk),
                                                      valid_BxN.reshape(B * N, 1, 1))])
            return self.o_proj(out.reshape(B, NT, -1))
        k_ctx, v_ctx = ctx_kv if ctx_kv is not None else self.keys_values(ctx_BxSxD, ctx_rope)
        out = training_block_attention(blocks(q), k_ctx, v_ctx, blocks(k_blk), blocks(v_blk),
                                       anchors_BxN, valid_BxN, anchor_chunk=self.anchor_chunk,
                                       context_chunk=self.context_chunk, window=window)
        return self.o_proj(out.reshape(B, NT, -1))

    def context_through_cache(self, x_BxCxD: jax.Array, rope, cache: KVCache, layer: jax.Array,
                              positions_BxC: jax.Array, ctx_len_B: jax.Array):
        """Inference, conditioning "input": new context rows (``x`` [B, C, D], this layer's normed
        input) write their K/V into this layer's cache at ``positions`` (outside the cache:
        dropped), then attend to the slots ``<= their position`` and ``< ctx_len[b]``.

        Returns (out [B, C, D], cache)."""
        B, C, _ = x_BxCxD.shape
        k, v = self.keys_values(x_BxCxD, rope)
        cache = cache.write(layer, k, v, positions_BxC)
        slots = jnp.arange(cache.max_len)[None, None, :]
        visible_BxCxS = (slots <= positions_BxC[:, :, None]) & (slots < ctx_len_B[:, None, None])
        out = segmented_attention(self.queries(x_BxCxD, rope),
                                  [(cache.k[layer], cache.v[layer], visible_BxCxS)])
        return self.o_proj(out.reshape(B, C, -1)), cache

    def causal_context(self, x_BxSxD: jax.Array, rope):
        """Training, conditioning "input": the context rows at positions 0..S-1 attend causally
        to each other. Returns (out [B, S, D], (k, v) [B, S, Hkv, Dh] for the blocks)."""
        B, S, _ = x_BxSxD.shape
        k, v = self.keys_values(x_BxSxD, rope)
        causal_1xSxS = jnp.tril(jnp.ones((S, S), bool))[None]
        out = segmented_attention(self.queries(x_BxSxD, rope), [(k, v, causal_1xSxS)])
        return self.o_proj(out.reshape(B, S, -1)), (k, v)


class DrafterLayer(nn.Module):
    """One pre-norm layer (attention + SwiGLU MLP, the target's layer layout). ``DrafterModel``
    scans it over the layers (parameters and cache stacked on axis 0); each method is one use of
    the drafter, with the scan carry first and the inputs shared by every layer after it."""

    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None
    anchor_chunk: int = DEFAULT_ANCHOR_CHUNK  # the training attention's chunks (train_blocks)
    context_chunk: int = DEFAULT_CONTEXT_CHUNK

    def setup(self):
        cfg = self.cfg
        self.input_layernorm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
        self.self_attn = DrafterAttention(cfg, self.param_dtype, self.attention_impl,
                                          self.model_axis, anchor_chunk=self.anchor_chunk,
                                          context_chunk=self.context_chunk)
        self.post_attention_layernorm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
        self.mlp = MLP(cfg.intermediate_size, self.param_dtype, self.model_axis)

    def _residual(self, h: jax.Array, attention, blocks: int = 1) -> jax.Array:
        """The layer on the block rows ``h`` [B, blocks*T, D] (``blocks`` blocks of T rows each,
        for a layer that mixes the rows of a block: ``methods/dflash2``)."""
        h = h + attention(self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))

    def _mlp_residual(self, h: jax.Array) -> jax.Array:
        return h + self.mlp(self.post_attention_layernorm(h))

    def _window(self, layer: jax.Array) -> jax.Array | None:
        """Layer ``layer``'s sliding window (int32; 0 = full), None when no layer slides."""
        windows = self.cfg.layer_windows
        return None if windows is None else jnp.asarray(windows, jnp.int32)[layer]

    def project_context(self, carry, ctx_BxCxD, ctx_rope, ctx_positions_BxC):
        """carry = (cache, layer index): writes this layer's K/V of the context rows at slots
        ``ctx_positions`` (positions outside the cache are dropped)."""
        cache, layer = carry
        k, v = self.self_attn.keys_values(ctx_BxCxD, ctx_rope)
        return (cache.write(layer, k, v, ctx_positions_BxC), layer + 1), None

    def project_context_input(self, carry, ctx_rope, ctx_positions_BxC, ctx_len_B):
        """Conditioning "input": carry = (cache, layer index, h [B, C, D] of the new context
        rows); their K/V enter this layer's cache, they attend causally through it, then the
        residual and MLP give their input to the next layer."""
        cache, layer, h = carry
        out, cache = self.self_attn.context_through_cache(self.input_layernorm(h), ctx_rope, cache,
                                                          layer, ctx_positions_BxC, ctx_len_B)
        return (cache, layer + 1, self._mlp_residual(h + out)), None

    def draft(self, carry, rope, cache: KVCache, positions_BxT):
        """carry = (h [B, T, D], layer index); the block (rows at ``positions``) attends to this
        layer's cached context."""
        h, layer = carry
        h = self._residual(h, lambda x: self.self_attn.over_cache(
            x, rope, cache, layer, positions_BxT, self._window(layer)))
        return (h, layer + 1), None

    def train_blocks(self, carry, rope, ctx_BxSxD, ctx_rope, anchors_BxN, valid_BxN):
        """carry = (h [B, N*T, D], layer index); every block attends to its own context prefix
        (``ctx`` None, conditioning "none": to nothing but itself)."""
        h, layer = carry
        h = self._residual(h, lambda x: self.self_attn.over_blocks(
            x, rope, ctx_BxSxD, ctx_rope, anchors_BxN, valid_BxN, window=self._window(layer)),
            blocks=anchors_BxN.shape[1])
        return (h, layer + 1), None

    def train_blocks_input(self, carry, rope, ctx_rope, anchors_BxN, valid_BxN):
        """Conditioning "input": carry = (h [B, N*T, D] of the blocks, h [B, S, D] of the
        context rows); the context rows go through the layer causally, every block attends to
        this layer's K/V of its context prefix."""
        h, h_ctx = carry
        out_ctx, ctx_kv = self.self_attn.causal_context(self.input_layernorm(h_ctx), ctx_rope)
        h = self._residual(h, lambda x: self.self_attn.over_blocks(
            x, rope, None, None, anchors_BxN, valid_BxN, ctx_kv=ctx_kv), blocks=anchors_BxN.shape[1])
        return (h, self._mlp_residual(h_ctx + out_ctx)), None


class DrafterModel(nn.Module):
    """The drafter, with one method per use (call them with ``apply(..., method=...)``):

      ``project_context``  target taps of new context rows -> their K/V in the drafter cache
      ``draft``            one block ``[anchor, MASK, ...]`` against the cached context
      ``train_blocks``     all training blocks of whole sequences, context from all taps

    ``attention_impl``: "xla", "pallas" or "triton" for the block attention over the context
    cache in ``draft`` (``train_blocks`` always uses the XLA block-sparse path; so do
    ``project_context`` with conditioning "input", ``draft`` with "none", and ``draft`` of a
    drafter with sliding layers).

    ``cfg.conditioning`` ("kv", "input", "none") selects how the taps enter (module docstring).

    ``anchor_chunk`` / ``context_chunk`` (integers >= 1): ``train_blocks``' attention is dense
    when the blocks fit in one anchor chunk and the context in one context chunk, else chunked
    with an online softmax and rematerialised (memory-efficient;
    ``nn.attention.training_block_attention``). No parameter depends on them.

    ``model_axis``: tensor parallelism inside ``shard_map`` (``parallel.rules``): ``cfg`` is the
    shard's config, heads and MLP width are split over that axis (a psum after o_proj and
    down_proj); ``fc`` and ``hidden_norm`` are replicated.
    """

    cfg: DrafterConfig
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"
    model_axis: str | None = None
    anchor_chunk: int = DEFAULT_ANCHOR_CHUNK  # the training attention's chunks (train_blocks)
    context_chunk: int = DEFAULT_CONTEXT_CHUNK

    layer_class = DrafterLayer  # the layer scanned over the depth (a subclass: methods/dflash2)

    def setup(self):
        cfg = self.cfg
        check_attention_impl(self.attention_impl)
        check_chunk("anchor_chunk", self.anchor_chunk)
        check_chunk("context_chunk", self.context_chunk)
        if cfg.conditioning != "none":  # "none" has no projector parameters
            self.fc = nn.Dense(cfg.hidden_size, use_bias=False, param_dtype=self.param_dtype)
            self.hidden_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
        self.layers = nn.scan(self.layer_class, variable_axes={"params": 0}, split_rngs={"params": True},
                              in_axes=nn.broadcast, length=cfg.num_layers,
                              methods=("project_context", "project_context_input", "draft",
                                       "train_blocks", "train_blocks_input"),
                              )(cfg, self.param_dtype, self.attention_impl, self.model_axis,
                                anchor_chunk=self.anchor_chunk, context_chunk=self.context_chunk)
        self.norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)

    def context_rows(self, taps_BxCxKD: jax.Array) -> jax.Array:
        """``c = hidden_norm(fc(taps))`` [B, C, D]: the target's k tapped features of each
        context position (``taps`` [B, C, k*D]) projected to one drafter row."""
        cfg = self.cfg
        if taps_BxCxKD.shape[-1] != cfg.num_taps * cfg.hidden_size:
            raise ValueError(f"taps last dim {taps_BxCxKD.shape[-1]} != {cfg.num_taps} taps x "
                             f"hidden {cfg.hidden_size}")
        return self.hidden_norm(self.fc(taps_BxCxKD))

    def project_context(self, taps: jax.Array, positions: jax.Array, cache: KVCache,
                        ctx_len: jax.Array) -> KVCache:
        """Projects new context rows into every layer's cache.

        Args:
          taps: [B, C, k*D] target features of the new context rows.
          positions: int32[B, C] their positions (= cache slots); rows at positions outside
            the cache (e.g. ``S``) are dropped.
          cache: the drafter's context KVCache (k, v [n, B, S, Hkv, Dh]).
          ctx_len: int32[B] number of valid context positions after this update.

        Returns:
          the cache with the rows' K/V written and ``lengths = ctx_len``. Conditioning "input":
          every layer's K/V of the rows after the layers before it (the rows attend causally
          through the cache, seeing slots ``< ctx_len``); "none": nothing written.
        """
        if self.cfg.conditioning == "none":
            return cache.crop(ctx_len)
        ctx_rope = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope)
        if self.cfg.conditioning == "input":
            (cache, _, _), _ = self.layers.project_context_input(
                (cache, jnp.int32(0), self.context_rows(taps)), ctx_rope, positions,
                jnp.broadcast_to(jnp.asarray(ctx_len, jnp.int32), positions.shape[:1]))
            return cache.crop(ctx_len)
        (cache, _), _ = self.layers.project_context((cache, jnp.int32(0)), self.context_rows(taps),
                                                    ctx_rope, positions)
        return cache.crop(ctx_len)

    def draft(self, block_embeds: jax.Array, block_positions: jax.Array, cache: KVCache) -> jax.Array:
        """One forward pass over a block against the cached context (read only).

        Args:
          block_embeds: [B, T, D] target embeddings of ``[anchor, MASK, ...]`` (or of partly
            filled blocks when denoising in several steps).
          block_positions: int32[B, T] absolute positions of the block rows.
          cache: the drafter's context KVCache; the block sees slots ``< cache.lengths[b]``.

        Returns:
          hidden [B, T, D] after the final norm (the target's ``lm_head`` gives the logits).
        """
        rope = rope_cos_sin(block_positions, self.cfg.head_dim, self.cfg.rope)
        (h, _), _ = self.layers.draft((block_embeds, jnp.int32(0)), rope, cache,
                                      jnp.asarray(block_positions, jnp.int32))
        return self.norm(h)

    def train_blocks(self, block_embeds: jax.Array, block_positions: jax.Array, taps: jax.Array,
                     anchors: jax.Array, valid: jax.Array) -> jax.Array:
        """All training blocks of whole sequences in one pass, no cache (docs/method.md section 5).

        Args:
          block_embeds: [B, N*bs, D] target embeddings of the N blocks ``[x_a, MASK, ...]``.
          block_positions: int32[B, N*bs] = ``a_j + k``.
          taps: [B, S, k*D] target features of every position of the clean sequences
            (ignored with conditioning "none").
          anchors: int32[B, N] anchor positions; valid: bool[B, N] (False = padding block).
        Returns:
          hidden [B, N*bs, D] after the final norm.
        """
        cfg = self.cfg
        if cfg.conditioning == "none":
            rope = rope_cos_sin(block_positions, cfg.head_dim, cfg.rope)
            (h, _), _ = self.layers.train_blocks((block_embeds, jnp.int32(0)), rope, None, None,
                                                 anchors, valid)
            return self.norm(h)
        S = taps.shape[1]
        ctx_rope = rope_cos_sin(jnp.broadcast_to(jnp.arange(S), taps.shape[:2]), cfg.head_dim, cfg.rope)
        rope = rope_cos_sin(block_positions, cfg.head_dim, cfg.rope)
        if cfg.conditioning == "input":
            (h, _), _ = self.layers.train_blocks_input((block_embeds, self.context_rows(taps)), rope,
                                                       ctx_rope, anchors, valid)
            return self.norm(h)
        (h, _), _ = self.layers.train_blocks((block_embeds, jnp.int32(0)), rope,
                                             self.context_rows(taps), ctx_rope, anchors, valid)
        return self.norm(h)

    def init_everything(self, block_embeds, block_positions, taps, anchors, valid):
        """Touches every parameter (for ``init``): :meth:`train_blocks`."""
        return self.train_blocks(block_embeds, block_positions, taps, anchors, valid)


def init_drafter_params(cfg: DrafterConfig, key: jax.Array, dtype=jnp.float32,
                        init_scale: float = 0.02, model_class=None):
    """Random drafter parameters (normal(init_scale) kernels, unit norms), built under jit;
    ``model_class``: a subclass of :class:`DrafterModel` (its ``init_everything`` touches every
    parameter)."""
    model_class = model_class or DrafterModel
    model = model_class(cfg, param_dtype=dtype)
    B, T = 1, 2  # one block of two rows, anchored at 0 (train_blocks touches every parameter)
    emb = jnp.zeros((B, T, cfg.hidden_size), dtype)
    pos = jnp.zeros((B, T), jnp.int32)
    taps = jnp.zeros((B, T, cfg.num_taps * cfg.hidden_size), dtype)
    anchors, valid = jnp.zeros((B, 1), jnp.int32), jnp.ones((B, 1), bool)

    return random_module_params(
        lambda k: model.init(k, emb, pos, taps, anchors, valid, method=model_class.init_everything)["params"],
        key, init_scale, dtype)


def block_embedding(cfg: DrafterConfig, family, tparams, tokens: jax.Array, model_axis=None) -> jax.Array:
    """The drafter's input rows for ``tokens``: the target's raw embedding (``family.embed``)
    times ``input_embedding_scale`` (the reference's ``_raw_input_embeddings``)."""
    e = family.embed(tparams, tokens, model_axis)
    if cfg.input_embedding_scale == 1.0:
        return e
    return e * jnp.asarray(cfg.input_embedding_scale, e.dtype)


def draft_logits(cfg: DrafterConfig, family, target_cfg, tparams, h: jax.Array) -> jax.Array:
    """Draft logits float32[..., V] of the drafter's normed hidden states: the target's raw LM
    head (``family.lm_head``) times ``output_multiplier``, soft-capped by
    ``final_logit_softcapping`` (the reference's ``compute_logits``)."""
    logits = family.lm_head(target_cfg, tparams, h)
    if cfg.output_multiplier != 1.0:
        logits = logits * cfg.output_multiplier
    if cfg.final_logit_softcapping:
        c = cfg.final_logit_softcapping
        logits = jnp.tanh(logits / c) * c
    return logits
