"""The ``qwen3_next`` target family (Qwen3-Next, Qwen3-Coder-Next) against transformers'
``Qwen3NextForCausalLM`` / ``Qwen3NextGatedDeltaNet`` (float32, tiny random configs with
Hv != Hk):

* the packed projections (``in_proj_qkvz``, ``in_proj_ba``) converted to the Qwen3.5 layout
  give the q, k, v, z, b, a transformers' ``fix_query_key_value_ordering`` gives, and the
  layer's output through ``nn.gated_delta`` equals transformers' layer; packing is the exact
  inverse;
"""

import numpy as np
import pytest
import torch

import jax.numpy as jnp

from dflash_jax.nn import gated_delta
from dflash_jax.targets.hybrid import qwen3_next_layout as layout

pytestmark = pytest.mark.xdist_group("qwen3_next")

TOL = 1e-4
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
           linear_value_head_dim=6, linear_conv_kernel_dim=4)


def hf_config(**overrides):
    from transformers import Qwen3NextConfig

    base = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, **GDN,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=24, max_position_embeddings=256,
                initializer_range=0.1)
    cfg = Qwen3NextConfig(**{**base, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def dims_of(cfg) -> layout.GdnDims:
    return layout.GdnDims(cfg.linear_num_key_heads, cfg.linear_key_head_dim,
                          cfg.linear_num_value_heads, cfg.linear_value_head_dim)


def random_gdn_layer(cfg, seed=0):
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(seed)
    layer = Qwen3NextGatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "norm.weight":
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name in ("A_log", "dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return layer


@pytest.mark.parametrize("heads", [(2, 4), (2, 2), (1, 3)])
def test_unpacked_projections_match_transformers(heads):
    """q, k, v, z, b, a from our unpacked weights equal transformers' from the packed ones
    (``fix_query_key_value_ordering``), for r = Hv / Hk of 2, 1 and 3; packing back is exact."""
    cfg = hf_config(linear_num_key_heads=heads[0], linear_num_value_heads=heads[1])
    layer = random_gdn_layer(cfg)
    d = dims_of(cfg)
    wqkvz = layer.in_proj_qkvz.weight.detach().numpy()
    wba = layer.in_proj_ba.weight.detach().numpy()
    assert wqkvz.shape == d.packed_shapes(cfg.hidden_size)["in_proj_qkvz"]
    assert wba.shape == d.packed_shapes(cfg.hidden_size)["in_proj_ba"]
    x = torch.randn(2, 5, cfg.hidden_size)
    with torch.no_grad():
        ref = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
    ref = [t.numpy() for t in ref]  # q, k [B,T,Hk,dk]; v, z [B,T,Hv,dv]; b, a [B,T,Hv]
    qkv_w, z_w = layout.unpack_qkvz(wqkvz, d)
    b_w, a_w = layout.unpack_ba(wba, d)
    xn = x.numpy()
    qkv = xn @ qkv_w.T
    kd = d.num_k_heads * d.head_k_dim
    ours = [qkv[..., :kd].reshape(2, 5, d.num_k_heads, d.head_k_dim),
            qkv[..., kd:2 * kd].reshape(2, 5, d.num_k_heads, d.head_k_dim),
            qkv[..., 2 * kd:].reshape(2, 5, d.num_v_heads, d.head_v_dim),
            (xn @ z_w.T).reshape(2, 5, d.num_v_heads, d.head_v_dim), xn @ b_w.T, xn @ a_w.T]
    for name, r, o in zip("qkvzba", ref, ours):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(layout.pack_qkvz(qkv_w, z_w, d), wqkvz)
    np.testing.assert_array_equal(layout.pack_ba(b_w, a_w, d), wba)


def test_gdn_layer_matches_transformers():
    """transformers' whole ``Qwen3NextGatedDeltaNet`` (packed weights, its chunked rule) equals
    the unpacked weights through ``gated_delta.mix`` (chunked and recurrent forms), the gated
    output norm and ``out_proj``."""
    cfg = hf_config()
    layer = random_gdn_layer(cfg, seed=1)
    d = dims_of(cfg)
    x = torch.randn(2, 11, cfg.hidden_size)
    with torch.no_grad():
        ref = layer(x).numpy()
    w = lambda m: jnp.asarray(m.weight.detach().numpy().T)
    qkv_w, z_w = layout.unpack_qkvz(layer.in_proj_qkvz.weight.detach().numpy(), d)
    b_w, a_w = layout.unpack_ba(layer.in_proj_ba.weight.detach().numpy(), d)
    xj = jnp.asarray(x.numpy())
    for form in ("chunked", "recurrent"):
        o, _ = gated_delta.mix(xj @ qkv_w.T, xj @ a_w.T, xj @ b_w.T,
                               conv_weight=jnp.asarray(layer.conv1d.weight.detach().numpy()[:, 0].T),
                               A_log=jnp.asarray(layer.A_log.detach().numpy()),
                               dt_bias=jnp.asarray(layer.dt_bias.detach().numpy()),
                               num_k_heads=d.num_k_heads, head_k_dim=d.head_k_dim,
                               num_v_heads=d.num_v_heads, head_v_dim=d.head_v_dim, form=form,
                               chunk_size=4)
        z = (xj @ z_w.T).reshape(2, 11, d.num_v_heads, d.head_v_dim)
        y = gated_delta.gated_rms_norm(o, z, jnp.asarray(layer.norm.weight.detach().numpy()),
                                       cfg.rms_norm_eps)
        y = y.reshape(2, 11, -1) @ w(layer.out_proj)
        np.testing.assert_allclose(np.asarray(y), ref, rtol=TOL, atol=TOL, err_msg=form)
