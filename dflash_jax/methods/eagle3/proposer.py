"""The EAGLE-3 proposer: one decoder layer drafting autoregressively from the target's features
(``models.eagle3``; ``docs/eagle3.md``), as a chain or as EAGLE-2/3's dynamic tree.

Entry j of the drafter's cache holds the K/V of (feature f_j, token x_{j+1}) at slot j and RoPE
position j (``models.eagle3``). With the bonus token at position ``start``, the committed
entries are j < start: entry start - 1 pairs the last committed feature with the bonus, and its
output predicts the first draft.

State: the drafter's cache (``lengths`` = the committed entries) and the verified rows' taps,
not yet in it. As for DFlash (``proposers.dflash``) the update is deferred: ``observe`` keeps the
verified rows' taps; the next ``propose`` knows the committed length and the tokens after each
row (the committed tokens, the bonus last, from ``Committed.generated``), runs the layer over
those rows (writing their K/V; rows past the committed ones write slots past the committed
length, which nothing reads before they are written again) and drafts from the output of the
row at ``start - 1``.

Drafting writes scratch entries past ``start``: the chain's entry for its i-th token at slot
``start + i - 1`` (position ``start + i - 1``); the tree's frontier node r at depth d at slot
``start + (d - 1) * K + r`` (position ``start + d - 1``), seen by its descendants only.

The dynamic tree (EAGLE-2, used by EAGLE-3), depth D = block size - 1, K = ``policy.topk``:
depth 1's candidates are the root's top-K tokens; at each depth d < D the K best candidates of
depth d (by path log-probability, the frontier) are run through the layer and each gives its
top-K children, the candidates of depth d + 1. The tree is the N - 1 best candidates of all
depths by path log-probability (ties: lower depth first, then candidate order), which contains
each chosen node's parent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.verification.tree import Tree, TreeVerify
from dflash_jax.methods.eagle3.model import Eagle3Model
from dflash_jax.nn.cache import KVCache
from dflash_jax.nn.partitioning import CACHE_AXES
from dflash_jax.proposers.base import Committed, Proposal, Proposer


@flax.struct.dataclass
class Eagle3State:
    """B rows, T = block size, 3*Dt = width of the target's taps."""

    cache: KVCache  # one layer; lengths = the committed entries
    pending_taps: jax.Array  # [B, T, 3*Dt] taps of rows not yet in the cache
    pending_pos: jax.Array  # int32[B, T] their positions (contiguous per row)


@dataclasses.dataclass(frozen=True)
class Eagle3Proposer(Proposer):
    """config: the drafter (``Eagle3Config``); its parameters are
    ``Eagle3Drafter.proposer_params()`` (``{"model": ..., "d2t": int32[Vd]}``)."""

    config: Eagle3Config

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    def model(self) -> Eagle3Model:
        return Eagle3Model(self.config)

    def scratch(self, spec) -> int:
        """Cache slots past the committed ones that one draft writes."""
        steps = spec.block_size - 1
        if isinstance(spec.verify, TreeVerify):
            return max(steps, (steps - 1) * spec.verify.topk) + 1
        return steps + 1

    def init(self, spec, params, taps, positions, lengths, cache_len, dtype, *, tokens=None,
             tparams=None) -> Eagle3State:
        """The prompt's entries j = 0 .. len-2 (feature j, prompt token j+1) into a fresh cache;
        the last prompt position waits for the bonus (the first generated token)."""
        if params is not None and (tokens is None or tparams is None):
            raise ValueError("the EAGLE-3 proposer pairs each feature with the next token's "
                             "embedding: init needs the prompt's tokens and the target's "
                             "parameters (tokens=, tparams=)")
        c = self.config
        B, P = tokens.shape
        T = spec.block_size
        cache = KVCache.init(1, B, cache_len + self.scratch(spec), c.num_kv_heads, c.head_dim, dtype)
        last = lengths - 1
        rows = jnp.arange(B)
        pending_taps = jnp.zeros((B, T, taps.shape[-1]), taps.dtype).at[:, 0].set(taps[rows, last])
        pending_pos = last[:, None] + jnp.arange(T, dtype=jnp.int32)
        if params is None:  # shape-only uses (compile reports)
            return Eagle3State(cache.crop(last), pending_taps, pending_pos)
        nxt = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
        embeds = spec.family.embed(tparams, nxt)
        model = self.model()
        feats = model.apply({"params": params["model"]}, taps, method=Eagle3Model.project)
        slots = jnp.arange(cache.max_len, dtype=jnp.int32)
        mask = (slots[None, None, :] <= positions[:, :, None]) & (slots[None, None, :] < last[:, None, None])
        _, cache = model.apply({"params": params["model"]}, embeds, feats, positions,
                               jnp.where(positions < last[:, None], positions, cache.max_len),
                               cache, mask, method=Eagle3Model.decode)
        return Eagle3State(cache.crop(last), pending_taps, pending_pos)

    def _commit_rows(self, spec, tparams, params, state: Eagle3State, committed: Committed):
        """The deferred update (module docstring): the pending rows into the cache, and the
        output hidden state [B, D] of the row at ``start - 1`` (the root's)."""
        model, start = self.model(), committed.start
        B, T = state.pending_pos.shape
        out_len = committed.generated.shape[1]
        # the token after row position p: generated index p + 1 - start + (num_generated - 1)
        idx = state.pending_pos + 1 - start[:, None] + committed.num_generated[:, None] - 1
        nxt = jnp.take_along_axis(committed.generated, jnp.clip(idx, 0, out_len - 1), axis=1)
        nxt = jnp.maximum(nxt, 0)  # -1 (not generated) only in rows that are not committed
        embeds = spec.family.embed(tparams, nxt)
        feats = model.apply({"params": params["model"]}, state.pending_taps, method=Eagle3Model.project)
        cache = state.cache
        slots = jnp.arange(cache.max_len, dtype=jnp.int32)
        pos = state.pending_pos
        mask = (slots[None, None, :] <= pos[:, :, None]) & (slots[None, None, :] < start[:, None, None])
        h, cache = model.apply({"params": params["model"]}, embeds, feats.astype(embeds.dtype), pos,
                               jnp.where(pos < start[:, None], pos, cache.max_len), cache, mask,
                               method=Eagle3Model.decode)
        root = jnp.clip(start - 1 - pos[:, 0], 0, T - 1)
        h_root = h[jnp.arange(B), root]  # [B, D]
        return h_root, cache.crop(start)

    def _logp(self, params, h):
        """Draft-vocabulary log-probabilities (float32) of hidden states [..., D]."""
        logits = self.model().apply({"params": params["model"]}, h, method=Eagle3Model.logits)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

    def propose(self, spec, tparams, params, state: Eagle3State, committed: Committed, key,
                want_logp: bool = False) -> tuple[Proposal, Eagle3State]:
        """The chain: ``block_size - 1`` greedy drafting steps from the root's output, each
        feeding its hidden state and token back as the next entry."""
        model, start = self.model(), committed.start
        h, cache = self._commit_rows(spec, tparams, params, state, committed)
        steps = spec.block_size - 1
        d2t = params["d2t"]
        slots = jnp.arange(cache.max_len, dtype=jnp.int32)

        def step(carry, i):
            h, scratch = carry
            logp = self._logp(params, h)  # [B, Vd]
            draft_id = jnp.argmax(logp, axis=-1).astype(jnp.int32)
            tok = draft_id + d2t[draft_id]
            lp = jnp.max(logp, axis=-1)
            pos = (start + i)[:, None]  # this token's entry: slot = position = start + i
            mask = (slots[None, None, :] < pos[:, :, None] + 1)
            h_new, scratch = model.apply({"params": params["model"]},
                                         spec.family.embed(tparams, tok[:, None]), h[:, None], pos,
                                         pos, scratch, mask, method=Eagle3Model.decode)
            return (h_new[:, 0], scratch), (tok, lp)

        # the last step's entry is not needed (nothing drafts from it), but one scan keeps one
        # compiled body; its write lands in scratch slots
        (_, _), (toks, lps) = jax.lax.scan(step, (h, cache), jnp.arange(steps, dtype=jnp.int32))
        tokens, logp = toks.T, lps.T  # [B, steps]
        return (Proposal(tokens, None, logp if want_logp else None),
                state.replace(cache=cache))

    def propose_tree(self, spec, tparams, params, state: Eagle3State, committed: Committed, key,
                     policy) -> tuple[Tree, Eagle3State]:
        """EAGLE-2/3's dynamic tree of ``policy.nodes`` nodes (module docstring)."""
        if spec.ops.vocab_split:
            raise ValueError("tree drafting needs each node's top-k tokens over the whole "
                             "vocabulary, which is split over the mesh's model axis here: run "
                             "trees without tensor parallelism (model=1), or verify a chain")
        model, start = self.model(), committed.start
        h_root, cache = self._commit_rows(spec, tparams, params, state, committed)
        B = start.shape[0]
        D = spec.block_size - 1
        N = policy.nodes
        K = min(policy.topk, self.config.draft_vocab_size)
        d2t = params["d2t"]
        rows = jnp.arange(B)
        slots = jnp.arange(cache.max_len, dtype=jnp.int32)
        S = max(D - 1, 1) * K  # scratch slots of the frontier entries
        # candidates: depth 1: K (parent -1 = the root); depth d >= 2: K*K (frontier r, child c)
        vals, ids = jax.lax.top_k(self._logp(params, h_root), K)  # [B, K]
        c_tok, c_score = [ids + d2t[ids]], [vals]
        c_par = [jnp.full((B, K), -1, jnp.int32)]
        c_depth = [jnp.ones((B, K), jnp.int32)]
        c_rank = [jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (B, K))]
        # the frontier: candidate ids, tokens, scores, features (parents' outputs), ancestors
        f_id = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (B, K))
        f_tok, f_score = c_tok[0], vals
        f_feat = jnp.broadcast_to(h_root[:, None], (B, K, h_root.shape[-1]))
        f_anc = jnp.zeros((B, K, S), bool)  # scratch entries of its strict ancestors
        base = K
        for d in range(1, D):  # run the depth-d frontier; its children are depth d + 1
            own = (d - 1) * K + jnp.arange(K, dtype=jnp.int32)  # scratch offsets [K]
            anc = f_anc | (jnp.arange(S)[None, None, :] == own[None, :, None])
            rel = slots[None, None, :] - start[:, None, None]  # [B, 1, S_cache]
            in_scratch = (rel >= 0) & (rel < S)
            seen = jnp.take_along_axis(anc, jnp.broadcast_to(jnp.clip(rel, 0, S - 1), (B, K, cache.max_len)),
                                       axis=2)
            mask = (rel < 0) | (in_scratch & seen)
            pos = jnp.broadcast_to((start + d - 1)[:, None], (B, K))
            h, cache = model.apply({"params": params["model"]}, spec.family.embed(tparams, f_tok),
                                   f_feat, pos, start[:, None] + own[None, :], cache, mask,
                                   method=Eagle3Model.decode)
            v, i = jax.lax.top_k(self._logp(params, h), K)  # [B, K(frontier), K(children)]
            score = (f_score[:, :, None] + v).reshape(B, K * K)
            c_tok.append((i + d2t[i]).reshape(B, K * K))
            c_score.append(score)
            c_par.append(jnp.repeat(f_id, K, axis=1))
            c_depth.append(jnp.full((B, K * K), d + 1, jnp.int32))
            c_rank.append(jnp.tile(jnp.arange(K, dtype=jnp.int32), (B, K)))
            if d + 1 < D:  # the next frontier: the K best children
                fv, fi = jax.lax.top_k(score, K)
                f_id = base + fi.astype(jnp.int32)
                f_tok = jnp.take_along_axis(c_tok[-1], fi, axis=1)
                f_score = fv
                f_feat = jnp.take_along_axis(h, (fi // K)[:, :, None], axis=1)
                f_anc = jnp.take_along_axis(anc, (fi // K)[:, :, None], axis=1)
            base += K * K
        tok, score, par, depth, rank = (jnp.concatenate(x, axis=1)
                                        for x in (c_tok, c_score, c_par, c_depth, c_rank))
        M = tok.shape[1]
        # the best N - 1 candidates: score descending, then depth, then candidate order
        order = jnp.lexsort((jnp.broadcast_to(jnp.arange(M), (B, M)), depth, -score), axis=-1)
        n = min(N - 1, M)  # a budget beyond the candidates (K = 1: the chain) leaves invalid nodes
        take = order[:, :n]
        node_of = jnp.zeros((B, M), jnp.int32).at[rows[:, None], take].set(
            jnp.arange(1, n + 1, dtype=jnp.int32)[None])
        p = jnp.take_along_axis(par, take, axis=1)
        parents = jnp.where(p < 0, 0, jnp.take_along_axis(node_of, jnp.maximum(p, 0), axis=1))
        g = lambda x: jnp.take_along_axis(x, take, axis=1)
        valid = jnp.isfinite(g(score))
        pad = lambda x, v: jnp.pad(x, ((0, 0), (1, N - 1 - n)), constant_values=v)
        tree = Tree(pad(jnp.where(valid, g(tok), 0), 0).at[:, 0].set(committed.bonus.astype(jnp.int32)),
                    pad(jnp.where(valid, parents, 0), 0), pad(jnp.where(valid, g(depth), 0), 0),
                    pad(jnp.where(valid, g(rank), 0), 0), pad(valid, False).at[:, 0].set(True),
                    pad(jnp.where(valid, g(score), -jnp.inf), -jnp.inf).at[:, 0].set(0.0))
        return tree, state.replace(cache=cache.crop(start))

    def observe(self, spec, params, state: Eagle3State, taps, positions) -> Eagle3State:
        """The verified rows' taps wait for the next :meth:`propose` (module docstring)."""
        T = state.pending_taps.shape[1]
        if taps.shape[1] < T:
            taps = jnp.pad(taps, ((0, 0), (0, T - taps.shape[1]), (0, 0)))
            positions = positions[:, :1] + jnp.arange(T, dtype=jnp.int32)
        return state.replace(pending_taps=taps.astype(state.pending_taps.dtype), pending_pos=positions)

    def state_axes(self) -> Any:
        return Eagle3State(KVCache(k=CACHE_AXES, v=CACHE_AXES, lengths=("batch",)),
                           ("batch", "time", "embed"), ("batch", "time"))

