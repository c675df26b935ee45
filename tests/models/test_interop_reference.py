"""A drafter exported by this project, run by an independent PyTorch DFlash forward.

The oracle is written here from docs/method.md section 3 with transformers' own Qwen3 building blocks
(RMSNorm, rotary embedding, MLP) and reads only what a user of the reference or a serving
engine would have: the exported ``config.json`` (through transformers' ``Qwen3Config``), the
exported ``model.safetensors`` (by its released tensor names, strictly) and the target's
``hidden_states`` from transformers. The draft distribution of the first block must equal the
one this project's engine computes after its own prefill. The drafter taps the target's last
layer, so this also pins the tap convention (``hidden_states[i + 1]``, final norm included).
"""

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

import dflash_jax as dj
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from support.tiny_models import make_hf_model

pytestmark = pytest.mark.torch

TOL = 1e-4


class RefAttention(torch.nn.Module):
    def __init__(self, c: Qwen3Config):
        super().__init__()
        H, Hkv, Dh, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
        self.H, self.Hkv, self.Dh = H, Hkv, Dh
        self.q_proj = torch.nn.Linear(D, H * Dh, bias=False)
        self.k_proj = torch.nn.Linear(D, Hkv * Dh, bias=False)
        self.v_proj = torch.nn.Linear(D, Hkv * Dh, bias=False)
        self.o_proj = torch.nn.Linear(H * Dh, D, bias=False)
        self.q_norm = Qwen3RMSNorm(Dh, eps=c.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(Dh, eps=c.rms_norm_eps)

    def forward(self, x, ctx, rope_block, rope_all):
        """x [1, T, D] normed block rows; ctx [1, C, D] projected context (KV injection)."""
        T, C = x.shape[1], ctx.shape[1]
        heads = lambda t, n: t.view(1, t.shape[1], n, self.Dh).transpose(1, 2)  # noqa: E731
        q = self.q_norm(heads(self.q_proj(x), self.H))
        kv_in = torch.cat([ctx, x], dim=1)  # context rows and block rows, same projections
        k = self.k_norm(heads(self.k_proj(kv_in), self.Hkv))
        v = heads(self.v_proj(kv_in), self.Hkv)
        q, k = rotate(q, *rope_block), rotate(k, *rope_all)
        rep = self.H // self.Hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # non-causal, no mask
        assert out.shape == (1, self.H, T, self.Dh) and k.shape[2] == C + T
        return self.o_proj(out.transpose(1, 2).reshape(1, T, self.H * self.Dh))


def rotate(x, cos, sin):
    """Rotate-half RoPE, x [1, heads, T, Dh], cos/sin [1, T, Dh] from Qwen3RotaryEmbedding."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RefLayer(torch.nn.Module):
    def __init__(self, c: Qwen3Config):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = RefAttention(c)
        self.post_attention_layernorm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = Qwen3MLP(c)

    def forward(self, h, ctx, rope_block, rope_all):
        h = h + self.self_attn(self.input_layernorm(h), ctx, rope_block, rope_all)
        return h + self.mlp(self.post_attention_layernorm(h))


class RefDrafter(torch.nn.Module):
    """docs/method.md section 3, with the released parameter names (so ``load_state_dict`` is strict)."""

    def __init__(self, c: Qwen3Config, num_taps: int):
        super().__init__()
        self.fc = torch.nn.Linear(num_taps * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = torch.nn.ModuleList(RefLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(c)

    def forward(self, features, block_embeds, start):
        """features [1, C, k*D] target taps of positions 0..C-1; block at start..start+T-1."""
        C, T = features.shape[1], block_embeds.shape[1]
        ctx = self.hidden_norm(self.fc(features))
        pos = torch.arange(start + T)[None]
        pos = torch.cat([pos[:, :C], pos[:, start:]], dim=1)
        cos, sin = self.rotary(block_embeds, pos)
        rope_all, rope_block = (cos, sin), (cos[:, C:], sin[:, C:])
        h = block_embeds
        for layer in self.layers:
            h = layer(h, ctx, rope_block, rope_all)
        return self.norm(h)


@pytest.mark.slow
@pytest.mark.parametrize("taps", [(0, 2), (1, 2, 0)])
def test_exported_drafter_matches_an_independent_pytorch_dflash_forward(tmp_path, taps):
    torch.manual_seed(0)
    hf_target = make_hf_model("qwen3", rope_theta=50000.0, seed=3)
    N = hf_target.config.num_hidden_layers
    assert N - 1 in taps  # the last layer's tap is where the conventions differ
    hf_target.save_pretrained(tmp_path / "target")
    target = dj.load_target(tmp_path / "target")
    drafter = dj.Drafter.random(target, num_layers=2, block_size=6, seed=1, init_scale=0.2,
                                target_layer_ids=taps)
    dj.save_drafter(drafter, tmp_path / "drafter")

    # what the reference and the serving engines read: the files, through transformers
    with open(os.path.join(tmp_path, "drafter", "config.json")) as f:
        raw = json.load(f)
    cfg = Qwen3Config.from_pretrained(tmp_path / "drafter")
    assert cfg.num_hidden_layers == 2 and raw["block_size"] == 6
    taps_read = raw["dflash_config"]["target_layer_ids"]
    mask_id = raw["dflash_config"]["mask_token_id"]
    ref = RefDrafter(cfg, len(taps_read)).eval()
    state = {k: v.float() for k, v in load_file(tmp_path / "drafter" / "model.safetensors").items()}
    rotary_buffers = {k: v for k, v in ref.state_dict().items() if k.startswith("rotary.")}
    ref.load_state_dict({**state, **rotary_buffers}, strict=True)

    prompt = [5, 17, 99, 3, 42, 8, 77, 23, 61, 12, 4]
    P, bs = len(prompt), 6
    prepared = prepare_decode(target, [prompt], 8, drafter=dj.load_drafter(tmp_path / "drafter", target),
                                 temperature=1.0, sampled_draft=True, seed=0)
    st = prepared.state
    q_logp = prepared.spec.proposer.propose(prepared.spec, target.params, prepared.drafter_params,
                                            st.proposer, engine.committed(st), st.key)[0].q_logp
    anchor = int(st.bonus[0])

    with torch.no_grad():
        hidden = hf_target(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        features = torch.cat([hidden[i + 1] for i in taps_read], dim=-1)
        block = torch.tensor([[anchor] + [mask_id] * (bs - 1)])
        h = ref(features, hf_target.model.embed_tokens(block), start=P)
        want = torch.log_softmax(hf_target.lm_head(h[:, 1:]), dim=-1).numpy()
    np.testing.assert_allclose(np.asarray(q_logp), want, atol=TOL, rtol=0)

    # negative control: the raw (pre-norm) output of the last layer, the convention this
    # project used before, gives a different draft distribution
    with torch.no_grad():
        raw_last = []
        handle = hf_target.model.layers[-1].register_forward_hook(
            lambda m, i, o: raw_last.append(o[0] if isinstance(o, tuple) else o))
        hf_target(torch.tensor([prompt]))
        handle.remove()
        hidden = list(hidden)
        hidden[N] = raw_last[0]
        features = torch.cat([hidden[i + 1] for i in taps_read], dim=-1)
        wrong = torch.log_softmax(hf_target.lm_head(ref(features, hf_target.model.embed_tokens(block),
                                                        start=P)[:, 1:]), dim=-1).numpy()
    assert np.abs(np.asarray(q_logp) - wrong).max() > 100 * TOL
