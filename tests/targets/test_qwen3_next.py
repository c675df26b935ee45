"""The ``qwen3_next`` target family (Qwen3-Next, Qwen3-Coder-Next) against transformers'
PyTorch modules (float32, tiny random configs with Hv = 2 Hk and dv != dk):

* the packed projections (``in_proj_qkvz``, ``in_proj_ba``) converted to the Qwen3.5 layout
  give the q, k, v, z, b, a of transformers' ``fix_query_key_value_ordering`` (r = Hv / Hk of
  1, 2 and 3), and packing them back is exact;
* the MoE block with and without ``norm_topk_prob`` equals ``Qwen3NextSparseMoeBlock``;
* end to end against ``Qwen3NextForCausalLM`` saved by ``save_pretrained`` and loaded by our
  ``load_target`` (GDN and gated-attention layers, the MoE block in one layer picked by
  ``decoder_sparse_step`` and ``mlp_only_layers``, unnormalised routing, partial RoPE): the
  layer layout and parameter count, logits and every layer's tap, the decode state through
  prefill, one-token steps, a verify block and a ragged rollback, and ``Target.save`` writing
  back transformers' own tensors bit for bit (transformers loads them as the same model);
* bad input: a missing or mis-shaped packed tensor and other bad checkpoints, and config
  fields the family does not implement, are one-line errors naming the tensor or field; the
  MTP head is ignored by name; transformers' config defaults.
"""

import numpy as np
import pytest
import torch

import jax.numpy as jnp

from dflash_jax.targets.hybrid import qwen3_next_layout as layout
from support.model_parity import torch_forward
from support.moe_oracles import separated_router

pytestmark = [pytest.mark.xdist_group("qwen3_next"), pytest.mark.torch]

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


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_moe_block_matches_transformers(norm_topk_prob):
    """transformers' ``Qwen3NextSparseMoeBlock`` (router, top k renormalised or not, shared
    expert with its sigmoid gate) equals ``qwen3_5_moe.moe_block`` with ``norm_topk_prob``; the
    routing weights differ between the two settings (the option is not a no-op)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    from dflash_jax.targets.moe import qwen3_5_moe

    cfg = hf_config(norm_topk_prob=norm_topk_prob)
    torch.manual_seed(2)
    block = Qwen3NextSparseMoeBlock(cfg).eval()
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.normal_(0.0, 0.2)
        block.gate.weight.copy_(torch.from_numpy(separated_router(rng, cfg.num_experts, cfg.hidden_size, 2.0)))
    x = torch.randn(3, 5, cfg.hidden_size)
    with torch.no_grad():
        ref = block(x).numpy()
    tensors = {n: t.detach().numpy() for n, t in block.state_dict().items()}
    bcfg = qwen3_5_moe.MoeBlockConfig(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                                      cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size,
                                      norm_topk_prob=norm_topk_prob)
    params = qwen3_5_moe.mlp_params_from_tensors(tensors, bcfg, "")
    y, weights, _ = qwen3_5_moe.moe_block(bcfg, params, jnp.asarray(x.numpy()), return_routing=True)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=TOL, atol=TOL)
    sums = np.asarray(weights).sum(-1)
    assert np.allclose(sums, 1.0, atol=1e-6) == norm_topk_prob, sums


# ---------------------------------------------------------------------------- the family end to end
# five layers: a run of two GDN layers (a scan), gated attention, GDN; the MoE block only in
# layer 3 ((i + 1) % 2 == 0, layer 1 in mlp_only_layers); routing weights not renormalised
E2E = dict(layer_types=["linear_attention", "linear_attention", "full_attention",
                        "linear_attention", "linear_attention"], num_hidden_layers=5,
           decoder_sparse_step=2, mlp_only_layers=[1], norm_topk_prob=False,
           partial_rotary_factor=0.5, rope_theta=1000.0)


def random_hf_model(seed=0, **overrides):
    """A transformers ``Qwen3NextForCausalLM`` (float32, eager) with random norms, GDN
    parameters and experts, and routers whose logits are well separated."""
    from transformers import Qwen3NextForCausalLM

    cfg = hf_config(**{**E2E, **overrides})
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn_like(p))  # zero-centred: the scale is 1 + w
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.from_numpy(separated_router(rng, cfg.num_experts, cfg.hidden_size, 2.0)))
            elif "experts" in name:
                p.normal_(0.0, 0.15)
    return model


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model, its save_pretrained directory, our loaded Target)."""
    import dflash_jax as dj

    model = random_hf_model()
    path = tmp_path_factory.mktemp("qwen3_next") / "ckpt"
    model.save_pretrained(path)
    return model, path, dj.load_target(path)


def test_config_reads_transformers_layout(hf):
    """The loaded config: every layer's mixer and MLP kind as transformers built them; the
    checkpoint's GDN projections are stored packed (no unpacked name on disk)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    from dflash_jax.checkpoints import read_tensors
    from dflash_jax.targets.hybrid.qwen3_next import Qwen3NextConfig

    model, path, t = hf
    cfg = t.config
    assert isinstance(cfg, Qwen3NextConfig) and cfg.model_type == "qwen3_next"
    assert [cfg.mlp_kind(i) for i in range(5)] == [
        "moe" if isinstance(layer.mlp, Qwen3NextSparseMoeBlock) else "mlp" for layer in model.model.layers]
    assert [cfg.mlp_kind(i) for i in range(5)] == ["mlp", "mlp", "mlp", "moe", "mlp"]
    assert cfg.layer_types == tuple(model.config.layer_types)
    assert cfg.rotary_dim == 4 and cfg.moe.norm_topk_prob is False
    names = read_tensors(path).keys()
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in names
    assert not any("in_proj_qkv." in n or "in_proj_z." in n for n in names)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def run(hf):
    """(forward(tokens, positions, state) -> (logits, taps of every layer, state), rollback):
    our target jitted once for the module (two block lengths, 4 and 1, are compiled)."""
    import jax

    from dflash_jax import targets

    t = hf[2]
    cfg = t.config
    taps = tuple(range(cfg.num_layers))
    fwd = jax.jit(lambda p, x, q, s: targets.target_forward(cfg, p, x, q, s, tap_layer_ids=taps))
    return (lambda x, q, s: fwd(t.params, jnp.asarray(x), jnp.asarray(q), s),
            jax.jit(lambda s, n: s.rollback(n)))


def new_state(t, batch=2):
    from dflash_jax import targets

    return targets.family_of(t.config).init_state(t.config, batch, 32, jnp.float32)


def test_logits_and_taps_equal_transformers(hf, run):
    """Logits and every layer's tap (``hidden_states[i + 1]``, the last after the final norm)
    of a 4-token prefill of a batch of two equal transformers' ``Qwen3NextForCausalLM``."""
    model, _, t = hf
    forward, _ = run
    D = t.config.hidden_size
    ids = np.random.default_rng(0).integers(0, t.config.vocab_size, size=(2, 4))
    ref_logits, ref_hidden = torch_forward(model, ids)
    logits, taps, state = forward(ids, np.broadcast_to(np.arange(4), (2, 4)), new_state(t))
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=TOL, rtol=0)
    for i in range(t.config.num_layers):
        np.testing.assert_allclose(np.asarray(taps[..., i * D:(i + 1) * D]), ref_hidden[i + 1],
                                   atol=TOL, rtol=0, err_msg=f"layer {i}")
    np.testing.assert_array_equal(np.asarray(state.lengths), [4, 4])


def test_decode_state_steps_and_ragged_rollback(hf, run):
    """Through the decode state, as the engine drives it (each forward followed by a rollback
    to the lengths it keeps): a 4-token prefill, two one-token steps and a 4-row verify block
    give transformers' one-pass logits and taps; the block rolled back to a different length
    per row (1 and 3 of its rows kept) and continued by one token gives, in each row,
    transformers' logits and taps over that row's kept tokens."""
    model, _, t = hf
    forward, rollback = run
    ids = np.random.default_rng(1).integers(0, t.config.vocab_size, size=(2, 10))
    ref_logits, ref_hidden = torch_forward(model, ids)
    state = new_state(t)
    for lo, hi in [(0, 4), (4, 5), (5, 6), (6, 10)]:
        if lo:
            state = rollback(state, jnp.full((2,), lo, jnp.int32))
        logits, taps, state = forward(ids[:, lo:hi], np.broadcast_to(np.arange(lo, hi), (2, hi - lo)), state)
        np.testing.assert_allclose(np.asarray(logits), ref_logits[:, lo:hi], atol=TOL, rtol=0,
                                   err_msg=f"rows {lo}:{hi}")
        np.testing.assert_allclose(np.asarray(taps[..., -t.config.hidden_size:]),
                                   ref_hidden[-1][:, lo:hi], atol=TOL, rtol=0, err_msg=f"rows {lo}:{hi}")
    keep = np.array([1, 3])
    state = rollback(state, jnp.asarray(6 + keep))
    nxt = np.array([[5], [17]])
    logits, taps, state = forward(nxt, (6 + keep)[:, None], state)
    for b in range(2):
        ref, hidden = torch_forward(model, np.concatenate([ids[b, :6 + keep[b]], nxt[b]])[None])
        np.testing.assert_allclose(np.asarray(logits[b, 0]), ref[0, -1], atol=TOL, rtol=0,
                                   err_msg=f"row {b}")
        np.testing.assert_allclose(np.asarray(taps[b, 0, :t.config.hidden_size]), hidden[1][0, -1],
                                   atol=TOL, rtol=0, err_msg=f"row {b}")
    np.testing.assert_array_equal(np.asarray(state.lengths), 7 + keep)


def test_save_writes_the_hub_layout_transformers_loads(hf, tmp_path):
    """``Target.save`` writes back exactly transformers' tensors (packed projections, experts
    per expert: same names, bit for bit), and transformers loads the directory as the same
    model (its logits equal the original's)."""
    from transformers import Qwen3NextForCausalLM

    from dflash_jax.checkpoints import read_tensors

    model, path, t = hf
    t.save(tmp_path)
    ours, theirs = read_tensors(tmp_path), read_tensors(path)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    back = Qwen3NextForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    for key in ("layer_types", "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob",
                "rope_parameters", "head_dim", "linear_num_value_heads"):
        assert getattr(back.config, key) == getattr(model.config, key), key
    ids = np.random.default_rng(2).integers(0, 96, size=(1, 9))
    # the same tensors, so the same logits up to float32 rounding: torch's CPU kernels may block
    # the two copies' products differently (bitwise equal on AVX2, a few ulps apart on AVX-512)
    again, ref = torch_forward(back, ids)[0], torch_forward(model, ids)[0]
    np.testing.assert_allclose(again, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def _with_tensors(src, dst, edit):
    """A copy of checkpoint ``src`` at ``dst`` with its tensors passed through ``edit``."""
    import shutil

    from dflash_jax.checkpoints import read_tensors, write_safetensors

    tensors = edit(dict(read_tensors(src)))
    write_safetensors(dst, tensors)
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


@pytest.mark.parametrize("case, edit, message", [
    ("missing", lambda t: {n: v for n, v in t.items() if n != "model.layers.3.linear_attn.in_proj_ba.weight"},
     "tensor model.layers.3.linear_attn.in_proj_ba.weight is missing"),
    ("width", lambda t: {**t, "model.layers.0.linear_attn.in_proj_qkvz.weight":
                         t["model.layers.0.linear_attn.in_proj_qkvz.weight"][:-2]},
     r"tensor model.layers.0.linear_attn.in_proj_qkvz.weight has shape \[78, 32\], expected \[80, 32\]"),
    ("both", lambda t: {**t, "model.layers.4.linear_attn.in_proj_z.weight": np.zeros((24, 32), np.float32)},
     "model.layers.4.linear_attn.in_proj_z.weight is stored beside"),
    ("dense-experts", lambda t: {**t, "model.layers.0.mlp.experts.0.up_proj.weight": np.zeros((16, 32), np.float32)},
     "layer 0 stores experts"),
])
def test_bad_checkpoints_are_one_line_errors(hf, tmp_path, case, edit, message):
    import dflash_jax as dj
    from dflash_jax.checkpoints import CheckpointError

    path = _with_tensors(hf[1], tmp_path, edit)
    with pytest.raises(CheckpointError, match=message) as err:
        dj.load_target(path)
    assert "\n" not in str(err.value)


def test_mtp_head_is_ignored_by_name(hf, tmp_path, caplog):
    """The released checkpoints' multi-token-prediction tensors (``mtp.*``) are dropped with a
    log line counting them; the rest loads to the same parameters."""
    import jax

    import dflash_jax as dj

    path = _with_tensors(hf[1], tmp_path, lambda t: {**t, "mtp.fc.weight": np.ones((32, 64), np.float32),
                                                     "mtp.norm.weight": np.ones(32, np.float32)})
    with caplog.at_level("WARNING"):
        t = dj.load_target(path)
    assert "ignored 2 multi-token-prediction tensors" in caplog.text
    for a, b in zip(jax.tree_util.tree_leaves(t.params), jax.tree_util.tree_leaves(hf[2].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("change, message", [
    (dict(routed_scaling_factor=2.5), "routed_scaling_factor=2.5"),
    (dict(norm_topk_prob="yes"), "norm_topk_prob must be true or false"),
    (dict(mlp_only_layers="1"), "mlp_only_layers must be a list of layer indices"),
    (dict(mlp_only_layers=[7]), r"mlp_only_layers \[7\] are outside layers 0..4"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be >= 1"),
    (dict(num_experts=2.5), "num_experts must be an integer"),
    (dict(layer_types=["linear_attention", "sliding_attention"] + ["full_attention"] * 3),
     r"layer_types\[1\]='sliding_attention'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                           "original_max_position_embeddings": 64}), "rope type 'yarn'"),
])
def test_bad_configs_are_refused_naming_the_field(hf, change, message):
    from dflash_jax.config import TargetConfig

    d = {**hf[0].config.to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        TargetConfig.from_hf_dict(d)


def test_config_defaults_and_dense_variant():
    """Fields a config.json leaves out take transformers' ``Qwen3NextConfig`` defaults (the
    80B-A3B shapes); ``num_experts`` 0 makes every MLP dense, and the written config loads in
    transformers as the same layer layout."""
    from transformers import Qwen3NextConfig

    from dflash_jax.config import TargetConfig

    ours = TargetConfig.from_hf_dict({"model_type": "qwen3_next"})
    ref = Qwen3NextConfig()
    assert (ours.head_dim, ours.num_kv_heads, ours.num_layers, ours.moe.num_experts,
            ours.partial_rotary_factor, ours.linear_num_value_heads) == (
        ref.head_dim, ref.num_key_value_heads, ref.num_hidden_layers, ref.num_experts,
        ref.rope_parameters["partial_rotary_factor"], ref.linear_num_value_heads)
    assert ours.layer_types == tuple(ref.layer_types)
    dense = TargetConfig.from_hf_dict({**hf_config(**E2E).to_dict(), "num_experts": 0})
    assert dense.moe is None and {dense.mlp_kind(i) for i in range(5)} == {"mlp"}
    back = Qwen3NextConfig.from_dict(dense.to_hf_dict())
    assert back.num_experts == 0 and back.layer_types == list(dense.layer_types)
    assert back.rope_parameters["partial_rotary_factor"] == 0.5
