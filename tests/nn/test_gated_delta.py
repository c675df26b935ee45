"""The Gated DeltaNet maths (``dflash_jax.nn.gated_delta``) against transformers' pure-PyTorch
reference functions (``models/qwen3_5/modeling_qwen3_5.py``: the chunked and the per-token
gated delta rule, the causal conv1d, the gated output norm), and the decode state's rollback
against a fresh recurrence over the kept prefix, in both record modes, at every kept length."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from dflash_jax.nn import gated_delta as gd

pytestmark = [pytest.mark.xdist_group("gated_delta"), pytest.mark.torch]

B, HK, HV, DK, DV, K = 2, 2, 4, 8, 6, 4
C = 2 * HK * DK + HV * DV


def _inputs(T, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, HK, DK)).astype(np.float32)
    k = rng.normal(size=(B, T, HK, DK)).astype(np.float32)
    v = rng.normal(size=(B, T, HV, DV)).astype(np.float32)
    a = rng.normal(size=(B, T, HV)).astype(np.float32)
    b = rng.normal(size=(B, T, HV)).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 4.0, size=HV)).astype(np.float32)
    dt_bias = rng.normal(size=HV).astype(np.float32)
    s0 = rng.normal(size=(B, HV, DK, DV)).astype(np.float32) * 0.3
    return q, k, v, a, b, A_log, dt_bias, s0


def _torch_gates(a, b, A_log, dt_bias):
    g = -torch.tensor(A_log).exp() * torch.nn.functional.softplus(torch.tensor(a) + torch.tensor(dt_bias))
    return g, torch.tensor(b).sigmoid()


def _ours(q, k, v, a, b, A_log, dt_bias):
    g, beta = gd.gates(jnp.asarray(a), jnp.asarray(b), jnp.asarray(A_log), jnp.asarray(dt_bias))
    qp, kp, vp = gd.prepare(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    return qp, kp, vp, g, beta


@pytest.mark.parametrize("T,chunk", [(10, 4), (70, 64), (16, 64)])
def test_chunked_matches_transformers_chunked_rule(T, chunk):
    q, k, v, a, b, A_log, dt_bias, s0 = _inputs(T)
    g_t, beta_t = _torch_gates(a, b, A_log, dt_bias)
    o_ref, s_ref = hf.torch_chunk_gated_delta_rule(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), g_t, beta_t, chunk_size=chunk,
        initial_state=torch.tensor(s0), output_final_state=True, use_qk_l2norm_in_kernel=True)
    qp, kp, vp, g, beta = _ours(q, k, v, a, b, A_log, dt_bias)
    o, bounds = gd.chunked(qp, kp, vp, g, beta, jnp.asarray(s0), chunk)
    np.testing.assert_allclose(np.asarray(o), o_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(bounds[:, -1]), s_ref.numpy(), rtol=1e-4, atol=1e-5)
    assert bounds.shape[1] == -(-T // min(chunk, T)) + 1


def test_recurrent_matches_transformers_recurrent_rule_and_keeps_every_state():
    T = 9
    q, k, v, a, b, A_log, dt_bias, s0 = _inputs(T, seed=1)
    g_t, beta_t = _torch_gates(a, b, A_log, dt_bias)
    o_ref, s_ref = hf.torch_recurrent_gated_delta_rule(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), g_t, beta_t,
        initial_state=torch.tensor(s0), output_final_state=True, use_qk_l2norm_in_kernel=True)
    qp, kp, vp, g, beta = _ours(q, k, v, a, b, A_log, dt_bias)
    o, states = gd.recurrent(qp, kp, vp, g, beta, jnp.asarray(s0))
    np.testing.assert_allclose(np.asarray(o), o_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(states[:, -1]), s_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(states[:, 0]), s0)
    # the state after row 4 is the reference's final state over the first 5 rows
    _, s5 = hf.torch_recurrent_gated_delta_rule(
        *(torch.tensor(x[:, :5]) for x in (q, k, v)), g_t[:, :5], beta_t[:, :5],
        initial_state=torch.tensor(s0), output_final_state=True, use_qk_l2norm_in_kernel=True)
    np.testing.assert_allclose(np.asarray(states[:, 5]), s5.numpy(), rtol=1e-4, atol=1e-5)


def test_repeat_is_interleaved_not_tiled():
    """Value head h reads key head h // (Hv / Hk): with Hk=2, Hv=4, heads 0,1 read key 0."""
    q, k, v, *_ = _inputs(3)
    _, kp, _ = gd.prepare(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(kp[:, :, 1]), np.asarray(kp[:, :, 0]))
    assert not np.allclose(np.asarray(kp[:, :, 2]), np.asarray(kp[:, :, 0]))


def test_conv_matches_transformers_with_and_without_state():
    rng = np.random.default_rng(2)
    T = 7
    x = rng.normal(size=(B, T, C)).astype(np.float32)
    w = rng.normal(size=(C, 1, K)).astype(np.float32)
    ref = hf.causal_conv1d_fn(torch.tensor(x).transpose(1, 2), torch.tensor(w).squeeze(1), None,
                              activation="silu").transpose(1, 2)
    y, inputs = gd.causal_conv1d(jnp.asarray(x), None, jnp.asarray(w[:, 0].T))
    np.testing.assert_allclose(np.asarray(y), ref.numpy(), rtol=1e-5, atol=1e-6)
    # continuing one token at a time from the last K-1 inputs (transformers' update path)
    state = torch.tensor(np.concatenate([np.zeros((B, 1, C), np.float32), x[:, :4]], 1)[:, -K:]).transpose(1, 2).contiguous()
    step = hf.causal_conv1d_update(torch.tensor(x[:, 4:5]).transpose(1, 2), state,
                                   torch.tensor(w).squeeze(1), None, "silu").transpose(1, 2)
    y1, _ = gd.causal_conv1d(jnp.asarray(x[:, 4:5]), inputs[:, 4:4 + K - 1], jnp.asarray(w[:, 0].T))
    np.testing.assert_allclose(np.asarray(y1), step.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(y1), np.asarray(y[:, 4:5]), rtol=1e-5, atol=1e-6)


def test_gated_norm_matches_transformers():
    rng = np.random.default_rng(3)
    x, z = (rng.normal(size=(3, 5, DV)).astype(np.float32) for _ in range(2))
    w = rng.normal(size=DV).astype(np.float32)
    norm = hf.Qwen3_5RMSNormGated(DV, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(w))
        ref = norm(torch.tensor(x), torch.tensor(z)).numpy()
    np.testing.assert_allclose(np.asarray(gd.gated_rms_norm(jnp.asarray(x), jnp.asarray(z), jnp.asarray(w), 1e-6)),
                               ref, rtol=1e-5, atol=1e-6)


_mix = jax.jit(gd.mix, static_argnames=("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim",
                                        "form", "record", "chunk_size"))


def _layer(T, seed, form, window, s0):
    rng = np.random.default_rng(seed)
    qkv = jnp.asarray(rng.normal(size=(B, T, C)).astype(np.float32))
    a = jnp.asarray(rng.normal(size=(B, T, HV)).astype(np.float32))
    b = jnp.asarray(rng.normal(size=(B, T, HV)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(K, C)).astype(np.float32) * 0.5)
    kw = dict(conv_weight=w, A_log=jnp.zeros(HV), dt_bias=jnp.zeros(HV), num_k_heads=HK,
              head_k_dim=DK, num_v_heads=HV, head_v_dim=DV)
    o, rec = _mix(qkv, a, b, window=window, state0=s0, form=form, record=True, chunk_size=4, **kw)
    return (qkv, a, b, kw), o, rec


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_rollback_to_every_length_equals_a_fresh_run_over_the_kept_rows(form):
    """A 2-layer state runs a 5-row prefix, then a 10-row block (chunks of 4 in the replay mode:
    a partial last chunk); rolled back to every n in 0..10 (ragged: row 1 keeps 10 - n), the
    conv window and recurrent state equal the per-token recurrence's (checked against
    transformers' above) after prefix + the kept rows."""
    L, P, T = 2, 5, 10
    state = gd.GatedDeltaState.init(L, B, K, C, HV, DK, DV)
    recs = [_layer(P, 10 + layer, "chunked", None, None)[2] for layer in range(L)]
    state = state.after_block(gd.stack_records(recs), jnp.zeros(B, jnp.int32), jnp.full(B, P, jnp.int32))
    rollback = jax.jit(lambda s, n: s.rollback(n))
    state = rollback(state, jnp.full(B, P, jnp.int32))
    recs, refs = [], []
    for layer in range(L):
        window, s0 = state.layer(layer)
        args, _, rec = _layer(T, 20 + layer, form, window, s0)
        recs.append(rec)
        qkv, a, b, kw = args  # the reference: every state of the recurrence over the block
        refs.append(_mix(qkv, a, b, window=window, state0=s0, form="recurrent", record=True, **kw)[1])
    after = state.after_block(gd.stack_records(recs), state.lengths, state.lengths + T)
    for n in range(T + 1):
        kept = jnp.asarray([P + n, P + T - n], jnp.int32)
        rolled = jax.device_get(rollback(after, kept))
        assert rolled.record is None
        np.testing.assert_array_equal(np.asarray(rolled.lengths), np.asarray(kept))
        for layer, ref in enumerate(refs):
            for row, m in enumerate((n, T - n)):
                np.testing.assert_allclose(np.asarray(rolled.ssm[layer, row]), np.asarray(ref.snapshots[row, m]),
                                           rtol=1e-4, atol=1e-5, err_msg=f"n={m} layer {layer}")
                np.testing.assert_array_equal(np.asarray(rolled.conv[layer, row]),
                                              np.asarray(ref.inputs[row, m:m + K - 1]))


def test_rollback_negative_control_whole_block_state_differs():
    """The bug the engine tests must catch: keeping the state after the whole block. It differs
    from the state after n < T rows by far more than the tolerance used above."""
    T = 6
    args, _, rec = _layer(T, 5, "chunked", None, None)
    state = gd.GatedDeltaState.init(1, B, K, C, HV, DK, DV).after_block(
        gd.stack_records([rec]), jnp.zeros(B, jnp.int32), jnp.full(B, T, jnp.int32))
    rolled = jax.jit(lambda s: s.rollback(jnp.full(B, 3, jnp.int32)))(state)
    gap = np.abs(np.asarray(rolled.ssm) - np.asarray(state.ssm)).max()
    assert gap > 1e-2, gap


def test_mix_refuses_a_channel_count_that_does_not_match_the_heads():
    with pytest.raises(ValueError, match="channels"):
        gd.mix(jnp.zeros((1, 2, C + 1)), jnp.zeros((1, 2, HV)), jnp.zeros((1, 2, HV)),
               conv_weight=jnp.zeros((K, C + 1)), A_log=jnp.zeros(HV), dt_bias=jnp.zeros(HV),
               num_k_heads=HK, head_k_dim=DK, num_v_heads=HV, head_v_dim=DV)


@pytest.mark.parametrize("n", [1, 5, 64])
def test_unit_lower_inverse_inverts(n):
    """(I + A)^-1 by forward substitution against numpy's inverse, for random A and for the
    all-ones strictly lower A (identical keys, beta 1, no decay) whose inverse is bidiagonal:
    there a power series would cancel catastrophically."""
    rng = np.random.default_rng(n)
    A = np.tril(rng.uniform(-1, 1, size=(3, n, n)), -1).astype(np.float32)
    T = np.asarray(gd.unit_lower_inverse(jnp.asarray(A)))
    np.testing.assert_allclose(T, np.linalg.inv(np.eye(n) + A.astype(np.float64)), rtol=1e-4, atol=1e-4)
    ones = np.tril(np.ones((n, n), np.float32), -1)
    want = np.eye(n) - np.eye(n, k=-1)
    np.testing.assert_array_equal(np.asarray(gd.unit_lower_inverse(jnp.asarray(ones))), want)
