"""EAGLE-3 drafting steps vs a PyTorch forward written here from the published architecture
(EAGLE-3's ``LlamaForCausalLMEagle3``: ``fc`` over three concatenated target features; one
Llama decoder layer ``midlayer`` whose attention reads ``[input_layernorm(embed) ;
hidden_norm(feature)]``, residual = the feature; ``norm`` + ``lm_head`` over a draft
vocabulary; draft id -> target id through ``d2t`` offsets). The torch model reads its weights
by name from the ``model.safetensors`` that ``save_eagle3_params`` wrote, and ours is loaded
back by ``load_eagle3_params``, so the tensor names and layouts are under test too.

Compared, float32: (a) a 12-position prompt: ``Eagle3Model.project`` + ``decode`` into a fresh
cache (slot = position, causal mask) vs a causal torch pass: hidden states and draft logits;
(b) chain steps past the prompt through the cache (feature = the previous entry's hidden state,
position + 1, token = the previous step's draft) vs torch with its own K/V cache; (c) the target
ids of the argmaxes through ``d2t``. Negative controls: torch references with the embedding
after the feature in the layer input, or the chain entry's RoPE position not advanced, differ.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dflash_jax.checkpoints import SINGLE_FILE
from dflash_jax.methods.eagle3.checkpoint import load_eagle3_params, save_eagle3_params
from dflash_jax.config import RopeConfig
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.methods.eagle3.model import Eagle3Model
from dflash_jax.nn.cache import KVCache

pytestmark = [pytest.mark.xdist_group("test_eagle3_parity"), pytest.mark.torch]

V, VD, D, DT, F, H, HKV, DH = 128, 48, 64, 32, 96, 4, 2, 16
T, STEPS, SLOTS = 12, 3, 16
ATOL = 1e-5


# ---------------------------------------------------------------------------- the torch reference
def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class TorchEagle3:
    """One EAGLE-3 drafting layer in PyTorch, from the architecture (module docstring), over a
    K/V cache of its own. ``bug``: None, or a plausible mistake for the negative controls:
    ``"hidden_first"`` (layer input [hidden_norm(feature) ; input_layernorm(embed)]) or
    ``"stale_position"`` (a chain entry keeps its parent's RoPE position)."""

    def __init__(self, sd, config, bug=None):
        self.w = sd
        self.eps = config["rms_norm_eps"]
        self.theta = config["rope_theta"]
        self.H, self.Hkv, self.Dh = (config["num_attention_heads"], config["num_key_value_heads"],
                                     config["head_dim"])
        self.bug = bug
        self.k = self.v = self.pos = None  # the cache: [S, Hkv, Dh] x2, positions [S]

    def lin(self, x, name):
        return x @ self.w[name].T  # torch Linear: weight [out, in]

    def rope(self, x, positions):
        inv = 1.0 / self.theta ** (torch.arange(0, self.Dh, 2, dtype=torch.float32) / self.Dh)
        ang = positions.to(torch.float32)[:, None] * inv[None]
        emb = torch.cat([ang, ang], -1)
        return x * emb.cos()[:, None] + rotate_half(x) * emb.sin()[:, None]

    def project(self, taps):
        """taps [T, 3*Dt] -> features [T, D]."""
        return self.lin(taps, "fc.weight")

    def layer(self, embeds, feats, positions):
        """Entries (embeds [T, D], feats [T, D], positions int[T]) appended to the cache;
        returns their output hidden states [T, D]."""
        w, n = self.w, len(positions)
        e = rms_norm(embeds, w["midlayer.input_layernorm.weight"], self.eps)
        f = rms_norm(feats, w["midlayer.hidden_norm.weight"], self.eps)
        x2 = torch.cat([f, e] if self.bug == "hidden_first" else [e, f], -1)  # [T, 2D]
        q = self.rope(self.lin(x2, "midlayer.self_attn.q_proj.weight").view(n, self.H, self.Dh), positions)
        k = self.rope(self.lin(x2, "midlayer.self_attn.k_proj.weight").view(n, self.Hkv, self.Dh), positions)
        v = self.lin(x2, "midlayer.self_attn.v_proj.weight").view(n, self.Hkv, self.Dh)
        if self.k is None:
            self.k, self.v, self.pos = k, v, positions
        else:
            self.k, self.v = torch.cat([self.k, k]), torch.cat([self.v, v])
            self.pos = torch.cat([self.pos, positions])
        G = self.H // self.Hkv
        keys, values = self.k.repeat_interleave(G, 1), self.v.repeat_interleave(G, 1)  # [S, H, Dh]
        scores = torch.einsum("thd,shd->hts", q, keys) / self.Dh ** 0.5
        scores = scores.masked_fill(self.pos[None, None, :] > positions[None, :, None], float("-inf"))
        attn = torch.einsum("hts,shd->thd", scores.softmax(-1), values).reshape(n, self.H * self.Dh)
        u = feats + self.lin(attn, "midlayer.self_attn.o_proj.weight")  # residual: the raw feature
        m = rms_norm(u, w["midlayer.post_attention_layernorm.weight"], self.eps)
        mlp = self.lin(torch.nn.functional.silu(self.lin(m, "midlayer.mlp.gate_proj.weight"))
                       * self.lin(m, "midlayer.mlp.up_proj.weight"), "midlayer.mlp.down_proj.weight")
        return u + mlp

    def logits(self, hidden):
        return self.lin(rms_norm(hidden, self.w["norm.weight"], self.eps), "lm_head.weight")

    def target_id(self, logits):
        draft = int(logits.argmax())
        return draft + int(self.w["d2t"][draft])

    def run(self, taps, tokens, embed, steps):
        """The prompt pass, then ``steps`` chain steps: hidden [T + steps, D], logits
        [T + steps, Vd], the chain's target ids [steps]."""
        feats = self.project(taps)
        hidden = [self.layer(embed[tokens[1:T + 1]], feats, torch.arange(T))]
        logits = [self.logits(hidden[0])]
        pos, ids = T - 1, []
        for _ in range(steps):
            tok = self.target_id(logits[-1][-1])
            ids.append(tok)
            pos += self.bug != "stale_position"
            hidden.append(self.layer(embed[tok][None], hidden[-1][-1:], torch.tensor([pos])))
            logits.append(self.logits(hidden[-1]))
        return torch.cat(hidden).numpy(), torch.cat(logits).numpy(), ids


# ---------------------------------------------------------------------------- ours
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random float32 drafter (non-unit norms) with a strict, non-contiguous draft
    vocabulary, saved and loaded back; random taps, tokens and embedding table."""
    rng = np.random.default_rng(0)
    cfg = Eagle3Config(vocab_size=V, draft_vocab_size=VD, hidden_size=D, intermediate_size=F,
                       num_heads=H, num_kv_heads=HKV, head_dim=DH, target_hidden_size=DT,
                       target_layer_ids=(1, 3, 5), num_target_layers=8, rms_norm_eps=1e-5,
                       rope=RopeConfig(theta=5e5))
    tree = jax.eval_shape(lambda k: Eagle3Model(cfg).init(  # the model's own tree, shapes only
        k, jnp.zeros((1, 2, D)), jnp.zeros((1, 2, 3 * DT)), jnp.ones((1, 2), bool),
        method=Eagle3Model.init_all)["params"], jax.random.key(0))

    def fill(path, x):  # kernels ~ 1/sqrt(fan in), norm weights around 1
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return (1 + 0.3 * rng.standard_normal(x.shape)).astype(np.float32)
        return (rng.standard_normal(x.shape) / np.sqrt(x.shape[0])).astype(np.float32)

    params = jax.tree_util.tree_map_with_path(fill, tree)
    vocab = np.sort(rng.choice(V, VD, replace=False))
    assert np.diff(vocab).max() > 1 and vocab[-1] - vocab[0] >= VD
    path = tmp_path_factory.mktemp("eagle3-parity")
    save_eagle3_params(path, cfg, params, vocab - np.arange(VD))
    loaded_cfg = Eagle3Config.from_pretrained(path)
    assert loaded_cfg == cfg
    loaded, d2t = load_eagle3_params(path, loaded_cfg)
    np.testing.assert_array_equal(np.arange(VD) + d2t, vocab)
    from safetensors.torch import load_file

    with open(path / "config.json") as f:
        config = json.load(f)
    sd = load_file(os.path.join(path, SINGLE_FILE))
    data = dict(taps=rng.standard_normal((T, 3 * DT)).astype(np.float32),
                tokens=rng.integers(0, V, T + 1), embed=rng.standard_normal((V, D)).astype(np.float32))
    return cfg, loaded, d2t, sd, config, data


def ours(cfg, params, d2t, data, steps):
    """Our prompt pass through a fresh cache and ``steps`` chain steps: (hidden [T + steps, D],
    logits [T + steps, Vd], the chain's target ids)."""
    model = Eagle3Model(cfg)
    slots = jnp.arange(SLOTS)

    @jax.jit
    def run(params, d2t, taps, tokens, embed):
        apply = lambda method, *a: model.apply({"params": params}, *a, method=method)
        cache = KVCache.init(1, 1, SLOTS, cfg.num_kv_heads, cfg.head_dim)
        feats = apply(Eagle3Model.project, taps[None])
        pos = jnp.arange(T, dtype=jnp.int32)[None]
        hidden, cache = apply(Eagle3Model.decode, embed[tokens[1:T + 1]][None], feats, pos, pos,
                              cache, slots[None, None, :] <= pos[..., None])
        hs, ls, ids = [hidden[0]], [apply(Eagle3Model.logits, hidden)[0]], []
        for s in range(steps):
            draft = jnp.argmax(ls[-1][-1])
            tok = draft + d2t[draft]  # the draft's target id
            ids.append(tok)
            p = jnp.full((1, 1), T + s, jnp.int32)
            h, cache = apply(Eagle3Model.decode, embed[tok][None, None], hs[-1][-1:][None], p, p,
                             cache, slots[None, None, :] <= p[..., None])
            hs.append(h[0])
            ls.append(apply(Eagle3Model.logits, h)[0])
        return jnp.concatenate(hs), jnp.concatenate(ls), jnp.stack(ids)

    h, lg, ids = run(params, jnp.asarray(d2t), *(jnp.asarray(data[k]) for k in ("taps", "tokens", "embed")))
    return np.asarray(h), np.asarray(lg), [int(i) for i in ids]


@pytest.fixture(scope="module")
def both(setup):
    cfg, params, d2t, sd, config, data = setup
    mine = ours(cfg, params, d2t, data, STEPS)
    ref = TorchEagle3(sd, config).run(*(torch.as_tensor(data[k]) for k in ("taps", "tokens", "embed")), STEPS)
    return mine, ref


def test_prompt_pass_matches_torch(both):
    (h, lg, _), (rh, rlg, _) = both
    assert np.abs(rh[:T]).max() > 1 and rlg[:T].std() > 0.3  # not a degenerate forward
    np.testing.assert_allclose(h[:T], rh[:T], atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(lg[:T], rlg[:T], atol=ATOL, rtol=ATOL)


def test_chain_steps_match_torch(both):
    (h, lg, ids), (rh, rlg, rids) = both
    np.testing.assert_allclose(h[T:], rh[T:], atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(lg[T:], rlg[T:], atol=ATOL, rtol=ATOL)
    assert ids == rids


def test_argmax_target_ids_through_d2t(setup, both):
    cfg, _, d2t, sd, _, _ = setup
    (_, lg, ids), (_, rlg, rids) = both
    draft = lg.argmax(-1)
    np.testing.assert_array_equal(draft, rlg.argmax(-1))
    target = draft + d2t[draft]
    np.testing.assert_array_equal(target, draft + sd["d2t"].numpy()[draft])
    assert (target != draft).mean() > 0.5  # the offsets matter: most draft ids are not target ids
    assert sd["t2d"].numpy()[target].all()
    assert list(target[T - 1:T - 1 + STEPS]) == ids  # the chain's tokens are the drafts' target ids
    assert len(set(draft.tolist())) > 3  # not one constant argmax


@pytest.mark.parametrize("bug", ["hidden_first", "stale_position"])
def test_negative_controls_differ(setup, both, bug):
    """A torch reference with a plausible mistake does not match ours: the comparison above can
    fail."""
    _, _, _, sd, config, data = setup
    (h, lg, _), _ = both
    bh, blg, _ = TorchEagle3(sd, config, bug).run(
        *(torch.as_tensor(data[k]) for k in ("taps", "tokens", "embed")), STEPS)
    if bug == "hidden_first":
        assert np.abs(h[:T] - bh[:T]).max() > 100 * ATOL
    else:  # the prompt is unchanged, the chain entries differ
        np.testing.assert_allclose(h[:T], bh[:T], atol=ATOL, rtol=ATOL)
        assert np.abs(h[T:] - bh[T:]).max() > 100 * ATOL
