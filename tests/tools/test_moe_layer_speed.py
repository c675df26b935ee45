"""``moe-layer-speed`` (``tools/moe_layer_speed.py``): the weight bytes each variant reads, by
hand; the dense layers against a plain jnp SwiGLU; the command on a smoke size writes its
files with the machine and load recorded and the gather and ragged paths agreeing. No timing
is asserted."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax.tools import moe_layer_speed as mls

pytestmark = [pytest.mark.xdist_group("test_moe_layer_speed"), pytest.mark.slow]


def test_weight_bytes_by_hand():
    """D 8, E 4, F 2, k 2, 3 rows, float32: an expert is 3 * 8 * 2 = 48 parameters, the router
    32. gather reads every pair's expert (3 rows x 2), ragged all 4, dense active k experts'
    worth, dense all E."""
    b = lambda v: mls.weight_bytes(v, 8, 4, 2, 2, 3, 4)
    assert b("moe gather") == (32 + 6 * 48) * 4
    assert b("moe ragged") == (32 + 4 * 48) * 4
    assert b("dense active") == 2 * 48 * 4 and b("dense all") == 4 * 48 * 4
    assert mls.expected_experts(4, 2, 3) == pytest.approx(3.5)


def test_layers_match_plain_references():
    """The dense variant is swiglu(x W1) W2; an MoE layer whose router sends every row to the
    same k experts with equal weight equals the mean of those experts' SwiGLUs."""
    w = mls.init_weights(8, 4, 2, 2, jnp.float32, seed=0)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 8)), jnp.float32)
    h = np.asarray(x) @ np.asarray(w["all"]["gate_up"])
    g, u = np.split(h, 2, axis=-1)
    ref = (g / (1 + np.exp(-g)) * u) @ np.asarray(w["all"]["down"])
    np.testing.assert_allclose(jax.jit(mls.dense_layer)(x, w["all"]), ref, rtol=1e-5, atol=1e-6)
    # input column 0 set to 1 and a router reading only it: logits 50 for experts 1 and 3, 0
    # for the others, on every row (softmax top-2, renormalised: weights 1/2 and 1/2)
    xb = x.at[:, 0].set(1.0)
    router = jnp.zeros((8, 4)).at[0, 1].set(50.0).at[0, 3].set(50.0)
    gu, down, xn = (np.asarray(a) for a in (w["experts"]["gate_up"], w["experts"]["down"], xb))
    ex = []
    for e in (1, 3):
        g, u = np.split(xn @ gu[e], 2, axis=-1)
        ex.append((g / (1 + np.exp(-g)) * u) @ down[e])
    for impl in ("gather", "ragged"):
        out = jax.jit(functools.partial(mls.moe_layer, k=2, impl=impl))(xb, router, w["experts"])
        np.testing.assert_allclose(out, (ex[0] + ex[1]) / 2, rtol=1e-4, atol=1e-6)


def test_command_writes_its_files(tmp_path):
    rep = mls.main(["--hidden", "16", "--experts", "4", "--experts-per-token", "2", "--expert-width", "8",
                    "--rows", "1", "3", "--repeats", "3", "--dispatch-calls", "1", "--program-calls", "1",
                    "--out", str(tmp_path)])
    assert [(r["rows"], r["variant"]) for r in rep["results"]] == [
        (r, v) for r in (1, 3) for v in mls.VARIANTS]
    assert all(len(r["times_s"]) == 3 and r["min_us"] <= r["median_us"] for r in rep["results"])
    assert all(v < 1e-5 for v in rep["gather_vs_ragged"].values())
    m = rep["machine"]
    assert m["cpu"]["cores"] >= 1 and len(m["load_average_before"]) == 3
    on_disk = json.loads((tmp_path / "moe_layer.json").read_text())
    assert on_disk["command"].startswith("python -m dflash_jax moe-layer-speed --hidden 16")
    assert "load average" in (tmp_path / "moe_layer.md").read_text()
    assert (tmp_path / "moe_layer.png").stat().st_size > 0
    with pytest.raises(ValueError, match="--experts-per-token 5 exceeds --experts 4"):
        mls.main(["--experts", "4", "--experts-per-token", "5", "--out", str(tmp_path)])
