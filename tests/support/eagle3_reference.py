"""A dense float64 numpy reference of what an EAGLE-3 drafter proposes (``docs/eagle3.md``),
written from the method, not from ``dflash_jax.methods.eagle3.model`` or the proposer: no Flax module,
no KV cache, no engine. Every drafted entry is recomputed from scratch, by a causal pass over
the whole entry sequence.

The drafter's sequence (entry j, RoPE position j):

  * committed entries j = 0 .. start-1: the feature ``fc(taps_j)`` (taps_j: the target's three
    tapped layer outputs at position j, [3 * Dt]) and the embedding of the NEXT committed token
    ``x_{j+1}`` (entry start-1 pairs the last verified feature with the bonus ``x_start``);
  * a drafted token t (one drafting step past entry e): the feature ``h_e`` (the drafter's own
    output at entry e, which predicted t) and the embedding of t, at position ``pos(e) + 1``.

One decoder layer over entries (features f [T, D], embeddings e [T, D], positions [T]):

  x2 = [input_layernorm(e) ; hidden_norm(f)]                       [T, 2D]  (embedding first)
  q, k, v = x2 Wq, x2 Wk, x2 Wv; rotate-half RoPE of q, k; causal GQA, scale 1/sqrt(Dh)
  u = f + attn Wo;   h = u + down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(u)
  logits = norm(h) W_lm_head                                       [Vd]  (h itself when the
                                                                          config has norm_output False)

Draft id i is target id ``i + d2t[i]``. The chain: k times, the argmax of the last entry's
logits, appended as a drafted entry. The dynamic tree (EAGLE-2, used by EAGLE-3), depth k,
K children: depth 1's candidates are the root's top-K (path log-probability = the
log-softmax); for d = 1 .. k-1 the K best candidates of depth d (the frontier, best first) each
run as a drafted entry after their ancestors and give their top-K children, depth d + 1's
candidates, frontier by frontier; the tree is the N - 1 best candidates of every depth by path
log-probability (ties: lower depth, then candidate order). All of it in plain Python loops over
nodes. ``node_logps`` scores given nodes one by one (their token at their parent's output), for
checking a tree node by node whichever nodes it chose.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def _np(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def rms_norm(x, weight, eps):
    return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def log_softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def silu(x):
    return x / (1.0 + np.exp(-x))


@dataclasses.dataclass
class Node:
    """A drafted tree node: its root path of target ids (``path[-1]`` its own token), path
    log-probability, rank among its siblings, and the candidate it was expanded from."""

    path: tuple
    score: float
    rank: int
    index: int  # candidate order (depth by depth, frontier by frontier, child rank)

    @property
    def depth(self) -> int:
        return len(self.path)


class Eagle3Reference:
    """The drafter from its parameters.

    Args:
      config: the drafter's ``Eagle3Config`` (only its shapes, eps, RoPE theta, norm_output).
      params: its parameter tree (``methods.eagle3.model``'s names, kernels [in, out]).
      d2t: int[Vd] the draft-to-target offsets.
      embedding: [V, D] the target's token embedding.
    """

    def __init__(self, config, params, d2t, embedding):
        if config.rope.rope_type != "default":
            raise ValueError("the reference implements the default RoPE only")
        self.cfg = config
        lay = params["midlayer"]
        att, mlp = lay["self_attn"], lay["mlp"]
        self.fc = _np(params["fc"]["kernel"])
        self.hidden_norm = _np(lay["hidden_norm"]["weight"])
        self.input_norm = _np(lay["input_layernorm"]["weight"])
        self.post_norm = _np(lay["post_attention_layernorm"]["weight"])
        self.wq, self.wk, self.wv, self.wo = (_np(att[n]["kernel"]) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.gate, self.up, self.down = (_np(mlp[n]["kernel"]) for n in ("gate_proj", "up_proj", "down_proj"))
        self.norm = _np(params["norm"]["weight"])
        self.head = _np(params["lm_head"]["kernel"])
        self.d2t = np.asarray(d2t, np.int64)
        self.embedding = _np(embedding)

    # ------------------------------------------------------------------ the layer
    def rope(self, x, positions):
        """x [T, heads, Dh] rotated (rotate-half) at integer positions [T]."""
        dh = x.shape[-1]
        inv = 1.0 / self.cfg.rope.theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh)
        ang = np.asarray(positions, np.float64)[:, None] * inv[None]
        cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None]
        sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None]
        rot = np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1)
        return x * cos + rot * sin

    def layer(self, feats, embeds, positions):
        """Output hidden states [T, D] of the entries (features [T, D], embeddings [T, D],
        positions [T]), each attending causally to the entries before it and itself."""
        c, eps = self.cfg, self.cfg.rms_norm_eps
        T = feats.shape[0]
        H, Hkv, Dh = c.num_heads, c.num_kv_heads, c.head_dim
        x2 = np.concatenate([rms_norm(embeds, self.input_norm, eps), rms_norm(feats, self.hidden_norm, eps)], -1)
        q = self.rope((x2 @ self.wq).reshape(T, H, Dh), positions)
        k = self.rope((x2 @ self.wk).reshape(T, Hkv, Dh), positions)
        v = (x2 @ self.wv).reshape(T, Hkv, Dh)
        out = np.zeros((T, H, Dh))
        causal = np.tril(np.ones((T, T), bool))
        for h in range(H):  # query head h reads kv head h // (H / Hkv)
            kv = h // (H // Hkv)
            s = q[:, h] @ k[:, kv].T / np.sqrt(Dh)
            s = np.where(causal, s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
        u = feats + out.reshape(T, H * Dh) @ self.wo
        n = rms_norm(u, self.post_norm, eps)
        return u + (silu(n @ self.gate) * (n @ self.up)) @ self.down

    def logits(self, h):
        """Draft-vocabulary logits [..., Vd] of output hidden states [..., D]."""
        return (rms_norm(h, self.norm, self.cfg.rms_norm_eps) if self.cfg.norm_output else h) @ self.head

    def to_target(self, draft_id: int) -> int:
        return int(draft_id + self.d2t[draft_id])

    # ------------------------------------------------------------------ entries
    def committed(self, taps, tokens):
        """The committed entries: (features [start, D], embeddings [start, D], positions
        [start]) from taps [start, 3*Dt] (positions 0 .. start-1) and the committed tokens
        int[start + 1] (x_0 .. x_start, the bonus last)."""
        taps, tokens = _np(taps), np.asarray(tokens)
        start = taps.shape[0]
        assert tokens.shape == (start + 1,), (tokens.shape, start)
        return taps @ self.fc, self.embedding[tokens[1:]], np.arange(start)

    def extend(self, run, token):
        """One drafting step past ``run`` = (features, embeddings, positions, outputs h [T, D])
        (or the committed entries alone): the drafted ``token`` (a target id) as a new entry,
        fed by the output of the last entry, at the next position; the layer recomputed from
        scratch over every entry."""
        feats, embeds, pos, h = run
        feats = np.concatenate([feats, h[-1:]])
        embeds = np.concatenate([embeds, self.embedding[token][None]])
        pos = np.concatenate([pos, pos[-1:] + 1])
        return feats, embeds, pos, self.layer(feats, embeds, pos)

    def start(self, taps, tokens):
        """The committed entries (:meth:`committed`) and their outputs, the last one the root's."""
        feats, embeds, pos = self.committed(taps, tokens)
        return feats, embeds, pos, self.layer(feats, embeds, pos)

    # ------------------------------------------------------------------ proposals
    def chain(self, taps, tokens, steps: int):
        """(tokens int[steps] target ids, margins float[steps] the top-2 logit gap of each
        step's argmax)."""
        run = self.start(taps, tokens)
        out, margins = [], []
        for _ in range(steps):
            lg = self.logits(run[3][-1])
            top = np.sort(lg)[-2:]
            margins.append(top[1] - top[0])
            out.append(self.to_target(int(np.argmax(lg))))
            run = self.extend(run, out[-1])
        return np.array(out), np.array(margins)

    def node_logps(self, taps, tokens, paths):
        """Node by node, whatever tree they came from: {root path of target ids: (logp, rank,
        gap)} of each path's last token at the output of its parent path (the root's: the last
        committed entry; else the parent path's last drafted entry, every entry rerun from
        scratch): its log-softmax over the draft vocabulary, its place among the draft ids by
        that output's logits (descending, stable; the sibling rank) and its logit's distance to
        its neighbours in that order (how clear the rank is). A token outside the draft
        vocabulary is a KeyError."""
        t2d = {self.to_target(i): i for i in range(self.cfg.draft_vocab_size)}
        runs = {(): self.start(taps, tokens)}

        def run(path):
            if path not in runs:
                runs[path] = self.extend(run(path[:-1]), path[-1])
            return runs[path]

        out = {}
        for path in map(tuple, paths):
            lg = self.logits(run(path[:-1])[3][-1])
            i = t2d[path[-1]]
            order = list(np.argsort(-lg, kind="stable"))
            r = order.index(i)
            near = [order[j] for j in (r - 1, r + 1) if 0 <= j < len(order)]
            out[path] = (float(log_softmax(lg)[i]), r, min(abs(lg[i] - lg[j]) for j in near))
        return out

    def tree(self, taps, tokens, depth: int, nodes: int, topk: int):
        """The dynamic tree: (the chosen nodes, a list of :class:`Node` in choice order; the
        smallest gap of any decision it took: consecutive sorted logits down to the (K+1)-th
        at every expanded entry, the frontier cuts and the final cut by score)."""
        runs = {(): self.start(taps, tokens)}  # root path -> its entries and outputs
        K = min(topk, self.cfg.draft_vocab_size)
        gaps = []

        def children(parent_path, parent_score):
            if parent_path not in runs:
                runs[parent_path] = self.extend(runs[parent_path[:-1]], parent_path[-1])
            lg = self.logits(runs[parent_path][3][-1])
            lp = log_softmax(lg)
            order = np.argsort(-lg, kind="stable")
            top = lg[order[:K + 1]]
            gaps.extend(top[:-1] - top[1:])
            return [(parent_path + (self.to_target(int(i)),), parent_score + lp[i], r)
                    for r, i in enumerate(order[:K])]

        def cut(values, n):
            """Records the gap at the boundary of the n best of ``values``."""
            v = np.sort(np.asarray(values))[::-1]
            if 0 < n < len(v):
                gaps.append(v[n - 1] - v[n])

        cands = []
        level = [Node(p, s, r, r) for p, s, r in children((), 0.0)]
        cands += level
        for _ in range(1, depth):
            frontier = sorted(level, key=lambda nd: -nd.score)[:K]  # stable: candidate order on ties
            cut([nd.score for nd in level], K)
            level = []
            for f in frontier:
                for p, s, r in children(f.path, f.score):
                    level.append(Node(p, s, r, len(cands) + len(level)))
            cands += level
        n = min(nodes - 1, len(cands))
        cut([nd.score for nd in cands], n)
        chosen = sorted(cands, key=lambda nd: (-nd.score, nd.depth, nd.index))[:n]
        return chosen, min(gaps, default=np.inf)
