"""Tensor and expert parallelism for the hybrid targets (``parallel.rules``,
``targets.hybrid``): Gated DeltaNet (GDN) layers split over ``model`` by key heads, each with its
value heads (the fused q/k/v projection's and the conv's channels kept grouped by key head,
``nn.gated_delta.group_order``), gated attention by heads, the dense MLP by width, the MoE block's
experts over ``expert``; on 8 host CPU devices in ONE subprocess (``tests/support/multidevice.py``).

Oracle: the single-device engine on the same weights (itself checked against transformers and
against AR decoding in ``tests/targets/test_hybrid_exact.py``). Tiny random ``qwen3_5_text``
(4 key heads, 8 value heads, 4 KV heads) on (data, model) = (2, 4); ``qwen3_5_moe_text`` (every
MLP the MoE block, 4 experts) and ``qwen3_next`` (dense and MoE MLPs mixed,
``gdn_rollback="snapshot"``) on (data, expert, model) = (2, 2, 2) and (4, 1, 2): greedy AR,
DFlash and tree (6 nodes, top 2) tokens and acceptance lengths equal to one device (and DFlash
on the expert-only mesh (2, 4, 1) for ``qwen3_5_moe_text``), drafts
accepted (so both rollback records are undone per shard), logits within float32 tolerance, the
GDN parameters and decode state held 1 / m per device by head. The compiled DFlash loop's
collectives are the stated ones: all-reduces of [rows, block, D] float32 within ``model`` (or
``expert x model`` for the MoE block), one per row-parallel projection, counted; none crosses
``data``; nothing gathers a GDN state or a conv window. Bad meshes: key heads the model axis does
not divide are a one-line error naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.multidevice import shared_run

pytestmark = [pytest.mark.multidevice, pytest.mark.xdist_group("hybrid_parallel"), pytest.mark.slow]

CODE = r"""
import numpy as np
import jax
import dflash_jax as dj
from dflash_jax import parallel
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.verification.tree import TreeVerify
from support.hybrid_targets import LAYER_TYPES, hybrid_config, moe_hybrid, random_drafter, random_target
from support.hlo_collectives import collectives
from support.multidevice import emit, error

assert jax.device_count() == 8, jax.devices()
V, BLOCK = 16, 4  # a small vocabulary: random drafters get drafts accepted
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 0], [3, 3]]  # ragged
TREE = TreeVerify(6, topk=2)

def loop_collectives(target, drafter):
    # every collective of the compiled DFlash decode loop (support.hlo_collectives)
    pre = prepare_decode(target, prompts, 12, drafter=drafter)
    hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                              np.int32(4), spec=pre.spec).compile().as_text()
    return collectives(hlo, target.mesh)

ALL = ("ar", "dflash", "tree")

def runs(target, drafter, which=ALL):
    out = {}
    if "ar" in which:
        out["ar"] = dj.generate(target, prompts, 12).sequences
    for run, opts in (("dflash", {}), ("tree", {"verify": TREE})):
        if run in which:
            r = dj.generate(target, prompts, 12, drafter=drafter, **opts)
            out[run] = [r.sequences, r.acceptance_lengths]
    return out

shard = lambda x: list(x.sharding.shard_shape(x.shape))
MODELS = {
    "qwen3_5_text": (lambda: random_target(hybrid_config(vocab_size=V, linear_num_key_heads=4,
                                                          linear_num_value_heads=8, num_kv_heads=4), seed=3),
                     [(dict(data=2, model=4), ALL)]),
    # layers of alternating kinds: no run of one kind is a scan, so each collective of the
    # compiled loop is one instruction per layer (what test_plan_collectives counts)
    "qwen3_5_moe_text": (lambda: moe_hybrid("qwen3_5_moe_text", vocab_size=V, layer_types=LAYER_TYPES),
                         [(dict(data=2, expert=2, model=2), ALL), (dict(data=4, model=2), ALL),
                          (dict(data=2, expert=4), ("dflash",))]),
    "qwen3_next": (lambda: moe_hybrid("qwen3_next", vocab_size=V, gdn_rollback="snapshot"),
                   [(dict(data=2, expert=2, model=2), ALL), (dict(data=4, model=2), ALL)]),
}
few = [p[:2] for p in prompts]
result = {}
for name, (make, meshes) in MODELS.items():
    single = make()
    drafter = random_drafter(single, BLOCK, seed=0)
    ref_logits = np.asarray(parallel.target_logits(single, few))
    result[name] = {"single": runs(single, drafter), "meshes": {}}
    for i, (sizes, which) in enumerate(meshes):
        mesh = parallel.make_mesh(**sizes)
        target = dj.Target(single.config, single.params, mesh=mesh)
        d = dj.Drafter(drafter.config, drafter.params, mesh=mesh)
        key = "x".join(str(sizes.get(a, 1)) for a in ("data", "expert", "model"))
        res = runs(target, d, which)
        la = target.params["gdn"]["linear_attn"]
        res["shards"] = {n: [shard(la[n]["kernel"]), list(la[n]["kernel"].shape)]
                         for n in ("in_proj_qkv", "conv1d", "in_proj_z", "out_proj")}
        res["device_bytes"] = sum(int(np.prod(shard(x))) * x.dtype.itemsize
                                  for x in jax.tree_util.tree_leaves(target.params))
        if i == 0:
            logits = np.asarray(parallel.target_logits(target, few))
            res["logits_err"] = float(np.max(np.abs(logits - ref_logits)))
            res["logits_scale"] = float(np.max(np.abs(ref_logits)))
            pre = prepare_decode(target, prompts, 12, drafter=d)
            gdn = pre.state.tcache.gdn
            res["state"] = {"conv": [shard(gdn.conv), list(gdn.conv.shape)],
                            "ssm": [shard(gdn.ssm), list(gdn.ssm.shape)]}
        if name != "qwen3_next" and i == 0:
            res["collectives"] = loop_collectives(target, d)
        if name == "qwen3_5_text":
            # a checkpoint read straight onto the mesh, each device reading its own slices of the
            # stored q/k/v-ordered tensors (checkpoints.read_sharded_params, TensorSpec.order)
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                single.save(tmp)
                loaded = dj.load_target(tmp, mesh=mesh)
                res["loaded_equal"] = bool(jax.tree_util.tree_all(jax.tree_util.tree_map(
                    lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), loaded.params, single.params)))
                res["loaded_sharding_equal"] = bool(jax.tree_util.tree_all(jax.tree_util.tree_map(
                    lambda a, b: a.sharding == b.sharding, loaded.params, target.params)))
        result[name]["meshes"][key] = res

odd = hybrid_config(linear_num_key_heads=2, linear_num_value_heads=4, num_kv_heads=4)
result["errors"] = {"key_heads": error(lambda: dj.Target(odd, None, mesh=parallel.make_mesh(data=2, model=4)))}
emit(result)
"""

RUNS = ("ar", "dflash", "tree")
CASES = [(model, mesh, run) for model, mesh in (("qwen3_5_text", "2x1x4"), ("qwen3_5_moe_text", "2x2x2"),
                                                ("qwen3_5_moe_text", "4x1x2"), ("qwen3_next", "2x2x2"),
                                                ("qwen3_next", "4x1x2")) for run in RUNS] + \
        [("qwen3_5_moe_text", "2x4x1", "dflash")]


@pytest.fixture(scope="module")
def hp(tmp_path_factory):
    # fast_compile (multidevice): the one-device oracle runs in the same subprocess, under the same flags
    return shared_run(tmp_path_factory, "hybrid_parallel", CODE, fast_compile=True)


@pytest.mark.parametrize("model,mesh,run", CASES)
def test_greedy_equal_to_one_device(hp, model, mesh, run):
    single, res = hp[model]["single"][run], hp[model]["meshes"][mesh]
    assert res[run] == single, f"{model} {run} differs on mesh {mesh}"


def test_cases_cover_every_mesh_run(hp):
    ran = {(m, mesh, run) for m in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
           for mesh, res in hp[m]["meshes"].items() for run in RUNS if run in res}
    assert ran == set(CASES)


def test_one_device_runs_are_ar_and_accept_drafts(hp):
    """The oracle runs are exact (DFlash and the tree give AR's tokens) and accept drafts in some
    row, so the mesh runs roll back partly accepted blocks (replay for qwen3_5_text and
    qwen3_5_moe_text, snapshot for qwen3_next) on every shard."""
    for model in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"):
        single = hp[model]["single"]
        for run in ("dflash", "tree"):
            assert single[run][0] == single["ar"], (model, run)
            assert any(a > 1 for row in single[run][1] for a in row), (model, run)


@pytest.mark.parametrize("model", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_logits_and_gdn_layout(hp, model):
    """Logits within float32 tolerance of one device; every GDN parameter split by heads over
    ``model`` (in_proj_qkv's and the conv's channels, z's columns, out_proj's rows) and the
    decode state's conv windows and recurrent states likewise."""
    for mesh, res in hp[model]["meshes"].items():
        m = int(mesh.split("x")[2])
        for name, (got, full) in res["shards"].items():
            axis = -2 if name == "out_proj" else -1
            want = list(full)
            want[axis] //= m
            assert got == want, (mesh, name, got, full)
        if "logits_err" in res:
            assert res["logits_err"] <= 1e-5 * max(1.0, res["logits_scale"]), (mesh, res["logits_err"])
            data = int(mesh.split("x")[0])
            conv, ssm = res["state"]["conv"], res["state"]["ssm"]  # [Lg, B, K-1, C], [Lg, B, Hv, dk, dv]
            assert conv[0] == [conv[1][0], conv[1][1] // data, conv[1][2], conv[1][3] // m], conv
            assert ssm[0] == [ssm[1][0], ssm[1][1] // data, ssm[1][2] // m] + ssm[1][3:], ssm


def test_compiled_loop_collectives(hp):
    """qwen3_5_text on (data 2, model 4), block 4, D 32: nothing crosses ``data``; every
    all-reduce of the loop is within ``model``; the row-parallel projections' all-reduces are of
    [rows per data shard (2), 4, 32] float32: per iteration the target's verify has one for the
    embedding and two per layer (the mixer's output projection, GDN or attention, and the MLP's),
    7 for 3 layers; the drafter's block one for the embedding and two for its layer: 10 x 1 KiB.
    Beside them only the split vocabulary's argmax exchange: per shard (4) and row (2) the best
    value (f32) and id (s32) of the drafter's 3 draft rows and of the verify's 4 rows. So no
    collective moves a GDN state or conv window."""
    found = hp["qwen3_5_text"]["meshes"]["2x1x4"]["collectives"]
    assert found and all(c["spans"] == ["model"] for c in found), found
    key = lambda c: (c["kind"], c["dtype"], tuple(c["dims"]))
    want = [("all-reduce", "f32", (2, 4, 32))] * 10 + [("all-gather", t, (4, 2, n)) for t in ("f32", "s32")
                                                     for n in (3, 4)]
    assert sorted(map(key, found)) == sorted(want), found


def test_a_checkpoint_reads_straight_onto_the_mesh(hp):
    """``load_target(path, mesh=...)`` of a saved qwen3_5_text reads each device's slices of the
    stored (q, k, v ordered) tensors into the grouped layout: the same parameters as one device's,
    placed as ``Target(cfg, params, mesh=...)`` places them."""
    res = hp["qwen3_5_text"]["meshes"]["2x1x4"]
    assert res["loaded_equal"] and res["loaded_sharding_equal"]


def test_bad_mesh_is_a_clear_error(hp):
    e = hp["errors"]["key_heads"]
    assert "linear_num_key_heads=2" in e and "not divisible by 4" in e and "Model-axis sizes that fit: [1, 2]" in e


# ---------------------------------------------------------------------------- the plan model
def _tiny(model):
    """The subprocess's configs and drafter config, rebuilt here (shapes only, no weights)."""
    from dflash_jax.methods.dflash.config import DrafterConfig
    from support.hybrid_targets import LAYER_TYPES, hybrid_config, moe_hybrid_config

    if model == "qwen3_5_text":
        cfg = hybrid_config(vocab_size=16, linear_num_key_heads=4, linear_num_value_heads=8, num_kv_heads=4)
    elif model == "qwen3_5_moe_text":
        cfg = moe_hybrid_config(model, vocab_size=16, layer_types=LAYER_TYPES)
    else:
        cfg = moe_hybrid_config(model, vocab_size=16, gdn_rollback="snapshot")
    return cfg, DrafterConfig.for_target(cfg, 1, 4, cfg.vocab_size - 1)


@pytest.mark.parametrize("model", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_plan_weights_per_device_are_the_placed_shards(hp, model):
    """``hybrid-plan``'s weights per device (``tools/hybrid_plan.py``, from the partition rules)
    equal the bytes one device of each mesh holds in the engine (float32 here)."""
    from dflash_jax.tools import hybrid_plan

    cfg, _ = _tiny(model)
    for mesh, res in hp[model]["meshes"].items():
        sizes = tuple(map(int, mesh.split("x")))
        assert hybrid_plan.weight_bytes_per_device(cfg, sizes, itemsize=4) == res["device_bytes"], mesh


@pytest.mark.parametrize("model,mesh", [("qwen3_5_text", "2x1x4"), ("qwen3_5_moe_text", "2x2x2")])
def test_plan_collectives_are_the_compiled_loops(hp, model, mesh):
    """``hybrid-plan``'s collectives of one DFlash iteration (the drafter's, then the verify's),
    per kind, payload and group, equal those of the compiled decode loop: 2 rows per data shard,
    block 4, float32; the MoE block's all-reduce over the 4 devices of expert x model. (The
    layers alternate kinds, so the loop holds one instruction per layer's collective.)"""
    from dflash_jax.tools import hybrid_plan

    cfg, drafter = _tiny(model)
    sizes = tuple(map(int, mesh.split("x")))
    modelled = hybrid_plan.drafter_collectives(drafter, sizes, batch=2, act_bytes=4) + \
        hybrid_plan.target_collectives(cfg, 4, sizes, batch=2, act_bytes=4)
    want = sorted((c.kind, c.payload, c.group) for c in modelled for _ in range(c.count))
    found = hp[model]["meshes"][mesh]["collectives"]
    got = sorted((c["kind"], 4 * int(np.prod(c["dims"])), c["group"]) for c in found)
    assert got == want
