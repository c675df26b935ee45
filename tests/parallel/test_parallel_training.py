"""Multi-device drafter training (``DFlashTrainer(mesh=...)``, ``train --mesh``), on 8 host devices in
a subprocess (``tests/support/multidevice.py``): the sharded steps equal the single-device ones, with the
drafter replicated and with FSDP, and so are offline features; a sharded checkpoint written on a (2, 4) mesh resumes on
(8, 1) and on one device; bad meshes and batch sizes are refused before any work."""

import json

import jax
import numpy as np
import pytest

from support.multidevice import run_on_devices

# one worker runs the module's subprocess (8 host devices; the refused meshes, then the runs)
pytestmark = [pytest.mark.multidevice, pytest.mark.xdist_group("test_parallel_training"), pytest.mark.slow]

SETUP = """
import json, os, sys
import jax, numpy as np
import dflash_jax as dj
from dflash_jax.parallel import make_mesh
from dflash_jax.training.data import TokenDataset, pack_rows, shard_path, write_npz_atomic
from dflash_jax.methods.dflash.training import DFlashTrainer
from dflash_jax.training.trainer import TrainConfig, latest_params
from support.multidevice import emit

root = sys.argv[1]
# 8 query / 4 KV heads, MLP 64, vocabulary 32: model=4 splits it, model=8 does not
CFG = dj.TargetConfig("qwen3", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=8, num_kv_heads=4, head_dim=8, max_position_embeddings=64)
target = dj.Target.random(CFG, seed=0, init_scale=0.35)
dcfg = dj.DrafterConfig.for_target(CFG, 1, 4, 31)
rng = np.random.default_rng(0)
prompts = [rng.integers(0, 30, size=int(rng.integers(3, 8))).tolist() for _ in range(16)]
responses = [rng.integers(0, 30, size=int(rng.integers(10, 18))).tolist() for _ in range(16)]
tokens, mask, lengths = pack_rows(prompts, responses, 24)
data_dir = os.path.join(root, "data")
os.makedirs(data_dir, exist_ok=True)
write_npz_atomic(shard_path(data_dir, 0), tokens=tokens, loss_mask=mask, lengths=lengths)
data = TokenDataset(data_dir)

def losses(run):
    return [json.loads(x)["loss"] for x in open(os.path.join(root, run, "metrics.jsonl"))]

def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]

def spec(x):  # a PartitionSpec as a JSON list ([] = replicated)
    return list(getattr(x, "sharding", x).spec if hasattr(x, "sharding") else x)

def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(leaves(a), leaves(b)))
"""

REFUSED = """
# refused before any work: run directories under their own root (data and target are shared)
refused_root = os.path.join(root, "refused")
os.makedirs(refused_root)
errors = {}
def refused(name, fn):
    try:
        fn()
    except ValueError as e:
        errors[name] = str(e)

cfg = TrainConfig(steps=2, batch_size=6, num_anchors=6)
refused("batch", lambda: DFlashTrainer(target, dcfg, data, os.path.join(refused_root, "batch"), cfg,
                                 mesh=make_mesh(data=4, model=2)))
refused("heads", lambda: DFlashTrainer(target, dcfg, data, os.path.join(refused_root, "heads"),
                                 TrainConfig(steps=2, batch_size=8), mesh=make_mesh(data=1, model=8)))
refused("fsdp", lambda: DFlashTrainer(target, dcfg, data, os.path.join(refused_root, "fsdp"), cfg, fsdp=True))
from dflash_jax.training.cli.train import main as train_main  # without its exit-on-error wrapper
refused("cli", lambda: train_main(["--target", os.path.join(refused_root, "none"), "--data", data_dir,
                                   "--run", os.path.join(refused_root, "cli"), "--mesh", "data=8",
                                   "--batch-size", "4"]))
refused_result = {"errors": errors, "dirs": sorted(os.listdir(refused_root))}
"""

TRAIN = SETUP + REFUSED + """
from dflash_jax.__main__ import main
from dflash_jax.training.sharding import fsdp_spec

target.path = os.path.join(root, "target")
target.save(target.path)
cfg = TrainConfig(steps=4, batch_size=8, num_anchors=6, learning_rate=3e-3, checkpoint_every=2)

# one device: 2 steps (checkpoint), then the rest of the run
single = DFlashTrainer(target, dcfg, data, os.path.join(root, "single"), cfg)
s2 = single.run(stop_after=2)
s4 = single.run()
np.savez(os.path.join(root, "single.npz"), *leaves(s4["params"]))

# (2, 4), drafter replicated: the target split over model by the rules, rows over data
tp = DFlashTrainer(target, dcfg, data, os.path.join(root, "tp"), cfg, mesh=make_mesh(data=2, model=4))
t2 = tp.run(stop_after=2)
q = tp.target.params["layers"]["self_attn"]["q_proj"]["kernel"]
# offline features from the target on the mesh (chunks of 5 rows padded to a multiple of data)
from dflash_jax.training.features import write_features
for name, t in (("f1", target), ("f8", tp.target)):
    write_features(t, data_dir, os.path.join(root, name), dcfg.target_layer_ids, batch_size=5)
features = [np.load(os.path.join(root, name, "features-00000.npy")) for name in ("f1", "f8")]
emb = tp.target.params["embed_tokens"]["embedding"]

# (2, 4) with FSDP, by the command, 2 steps: the checkpoint at step 2 is written sharded
args = ["train", "--target", target.path, "--data", data_dir, "--drafter-layers", "1",
        "--block-size", "4", "--mask-token-id", "31", "--steps", "4", "--batch-size", "8",
        "--num-anchors", "6", "--learning-rate", "3e-3", "--checkpoint-every", "2", "--fsdp"]
fsdp_run = os.path.join(root, "fsdp")
main(args + ["--run", fsdp_run, "--mesh", "data=2,model=4", "--stop-after", "2"])
_, f2, step = latest_params(fsdp_run)  # same devices: restored with the saved layout
saved_specs = sorted({json.dumps(spec(x)) for x in jax.tree.leaves(f2)})
# ... and resumed on (8, 1) (the FSDP layout of data=8 this time) to the end of the run
main(args + ["--run", fsdp_run, "--mesh", "data=8,model=1"])
_, f4, end = latest_params(fsdp_run)

emit({
    "refused": refused_result,
    "single": losses("single"), "tp": losses("tp"), "fsdp": losses("fsdp"),
    "tp_param_diff": max_diff(s2["params"], t2["params"]),
    "tp_opt_diff": max_diff(s2["opt_state"], t2["opt_state"]),
    "fsdp_param_diff": max_diff(s2["params"], f2), "resumed_param_diff": max_diff(s4["params"], f4),
    "moved": max_diff(s2["params"], s4["params"]), "steps": [step, end],
    "features_diff": float(np.abs(features[0] - features[1]).max()),
    "features_scale": float(np.abs(features[0]).max()),
    "q_spec": spec(q), "emb_spec": spec(emb),
    "q_shard": list(q.addressable_shards[0].data.shape),
    "tp_specs": sorted({json.dumps(spec(x)) for x in jax.tree.leaves(t2)}),
    "saved_specs": saved_specs,
    "fsdp_spec": [spec(fsdp_spec((1, 32, 48), 2)), spec(fsdp_spec((32,), 8)), spec(fsdp_spec((3, 5), 2)),
                  spec(fsdp_spec((), 2)), spec(fsdp_spec((1, 48, 48), 8))],
})
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel_training")
    # one subprocess for the module. fast_compile (multidevice): the single-device steps the
    # meshes are held to run in the same subprocess, under the same flags
    return root, run_on_devices(TRAIN, devices=8, args=[root], fast_compile=True)


def test_sharded_steps_equal_the_single_device_steps(trained):
    """Two steps on (2, 4), the drafter replicated (Trainer) and FSDP (the command): the same
    losses and updated parameters (and AdamW moments) as on one device, up to fp32 rounding;
    the target is tensor-parallel by the rules, the drafter replicated or split over data."""
    _, r = trained
    np.testing.assert_allclose(r["tp"], r["single"][:2], rtol=2e-6)
    np.testing.assert_allclose(r["fsdp"], r["single"], rtol=2e-6)
    assert r["moved"] > 1e-3  # the steps do change the weights ...
    assert r["tp_param_diff"] < 1e-6 and r["tp_opt_diff"] < 1e-6  # ... the same way on the mesh
    assert r["fsdp_param_diff"] < 1e-6
    # offline features written by the sharded target are the one-device ones
    assert r["features_diff"] < 1e-5 * max(1.0, r["features_scale"])
    # q_proj [layers, D, H*Dh] split by heads over model, the embedding by vocabulary
    assert r["q_spec"] == [None, None, "model"] and r["q_shard"] == [2, 32, 16]
    assert r["emb_spec"] == ["model", None]
    assert r["tp_specs"] == ["[]"]  # the replicated drafter and optimizer state
    assert '[null, "data", null]' in r["saved_specs"]  # FSDP, saved sharded
    # the largest dim data divides (the first on a tie); none: replicated
    assert r["fsdp_spec"] == [[None, None, "data"], ["data"], [], [], [None, "data", None]]


def test_checkpoint_from_one_mesh_resumes_on_another(trained):
    """The FSDP run's sharded checkpoint at step 2 of (2, 4) resumed on (8, 1): its last two
    steps and final weights are the uninterrupted single-device run's, the metrics have every
    step once; the checkpoint also loads in this one-device process (export)."""
    from dflash_jax.training.trainer import latest_params

    root, r = trained
    assert r["steps"] == [2, 4]
    np.testing.assert_allclose(r["fsdp"], r["single"], rtol=2e-6)
    assert r["resumed_param_diff"] < 2e-6
    rows = [json.loads(x) for x in (root / "fsdp" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    _, params, step = latest_params(str(root / "fsdp"))  # written on 8 devices, read on 1
    assert step == 4
    with np.load(root / "single.npz") as z:
        single = [z[f"arr_{i}"] for i in range(len(z.files))]
    got = [np.asarray(x) for x in jax.tree.leaves(params)]
    assert len(got) == len(single)
    for a, b in zip(got, single):
        np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)


def test_bad_meshes_are_refused_before_any_work(trained):
    """A batch that data does not divide, a model axis that does not divide the target's KV
    heads, FSDP without a mesh: clear errors, before the run directory exists (the command
    refuses the batch before it loads the target, which here does not even exist)."""
    r = trained[1]["refused"]
    e = r["errors"]
    assert set(e) == {"batch", "heads", "fsdp", "cli"}, e
    assert e["batch"].startswith("batch_size 6 cannot be split over the mesh's data=4 shards")
    assert "multiple of 4" in e["batch"]
    assert e["heads"].startswith("a mesh with model=8 cannot split the target: "
                                 "num_key_value_heads=4 (KV heads")
    assert e["heads"].endswith("that fit: [1, 2, 4]")
    assert "give a mesh too" in e["fsdp"]
    assert e["cli"].startswith("batch_size 4 cannot be split over the mesh's data=8 shards")
    assert r["dirs"] == []  # no run directory was made (under the refused runs' own root)
