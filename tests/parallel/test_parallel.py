"""Multi-device decoding (``dflash_jax.parallel`` + the engine inside ``shard_map``) against the
single-device run, on 8 host CPU devices in a subprocess (``tests/support/multidevice.py``), and two
processes with JAX's gloo CPU collectives.

Oracle: the single-device engine, itself proven equal to autoregressive decoding and to
transformers elsewhere. Greedy output must be equal token for token on every mesh; sampled
output too, since the sharded sampler draws the single-device random numbers
(``parallel.vocab``); logits within float32 tolerance.

qwen3 runs on every mesh; llama on the two with a model axis over 4 and 8 devices
(:data:`LLAMA_MESHES`): what llama adds (o_proj's bias added once after the psum, the tied
embedding as the vocabulary-sharded head) is sharded only along the model axis, and a bias or
a head shard counted wrongly shows at any model size above 1; the data axis (rows split) and
the pure data-parallel mesh do not depend on the family and are proven by qwen3's runs.

The subprocesses compile with ``support.fast_compile.FAST_COMPILE`` (see there): they compile some
thirty small programs and run each for a few steps, so compiling is nearly all their time. Every
oracle is computed under the same flags as what it checks: the single-device reference in the
same subprocess as the meshes, the two-process reference in a subprocess with the same flags.
One 8-device subprocess serves the module (the engine runs, then the refused meshes). The
weights are made once on one device and placed on each mesh by the constructors
(``Target(cfg, params, mesh=...)``, what ``Target.random(mesh=...)`` does after the same
one-device init); ``Target.random`` / ``Drafter.random`` with a mesh build qwen3's first mesh.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from support.multidevice import device_env, run_on_devices, shared_run

pytestmark = [pytest.mark.multidevice, pytest.mark.xdist_group("parallel"), pytest.mark.slow]

MESHES = [(1, 8), (2, 4), (4, 2), (8, 1)]
LLAMA_MESHES = [(1, 8), (2, 4)]

ENGINE_CODE = """
import json, re, sys
import numpy as np
import jax
import dflash_jax as dj
from dflash_jax import parallel
from dflash_jax.config import RopeConfig, TargetConfig
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import prepare_decode
from dflash_jax.verification.tree import TreeVerify
from support.multidevice import emit, error

assert jax.device_count() == 8, jax.devices()
CONFIGS = {
    # GQA (2 query heads per KV head), untied head, q/k norms
    "qwen3": TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=96,
                          num_layers=4, num_heads=16, num_kv_heads=8, head_dim=8,
                          max_position_embeddings=256),
    # attention biases (o_proj's bias added once after the psum), tied embeddings, llama3 rope
    "llama": TargetConfig(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_layers=4, num_heads=8, num_kv_heads=8, head_dim=8,
                          max_position_embeddings=256, tie_word_embeddings=True, attention_bias=True,
                          rope=RopeConfig(500000.0, "llama3", 8.0, 1.0, 4.0, 32)),
}
MESHES = {"qwen3": [(1, 8), (2, 4), (4, 2), (8, 1)], "llama": [(1, 8), (2, 4)]}  # (module docstring)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3, 3], [200, 17],
           [5] * 11, [9, 8, 7, 6], [42]]  # ragged
RUNS = {"dflash": dict(), "ar": None,
        "sampled": dict(temperature=1.0, sampled_draft=True, seed=11),
        "topk": dict(temperature=0.7, top_k=12, seed=5),
        "tree": dict(verify=TreeVerify(8, topk=3))}

# greedy DFlash and AR everywhere; the sampling and tree runs where they add a case (compile time)
ONLY_ON = {("qwen3", "sampled"): None, ("qwen3", "topk"): [(2, 4)], ("llama", "sampled"): [(1, 8)],
           ("qwen3", "tree"): [(2, 4), (1, 8)]}

COLLECTIVE = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* (all-reduce|all-gather|all-to-all|collective-permute|"
                        r"reduce-scatter)(?:-start)?\(")

def collective_shapes(target, drafter, opts):
    # (kind, dtype, dims) of every collective in the compiled decode loop of these options
    pre = prepare_decode(target, prompts, 24, drafter=drafter, **opts)
    hlo = engine.decode.lower(target.params, pre.drafter_params, pre.state, pre.max_new, pre.stop_ids,
                              np.int32(4), spec=pre.spec).compile().as_text()
    return [[m.group(3), m.group(1), [int(d) for d in m.group(2).split(",") if d]] for m in COLLECTIVE.finditer(hlo)]

def runs(target, drafter, name, mesh=None):
    out = {}
    for run, opts in RUNS.items():
        if run in ("sampled", "topk", "tree"):
            where = ONLY_ON.get((name, run), [])
            if where is not None and mesh is not None and mesh not in where or (name, run) not in ONLY_ON:
                continue
        r = (dj.generate(target, prompts, 24) if opts is None
             else dj.generate(target, prompts, 24, drafter=drafter, **opts))
        out[run] = [r.sequences, r.acceptance_lengths]
        if run == "tree" and mesh == (2, 4):  # what the tree's loop moves between devices
            out["tree_collectives"] = collective_shapes(target, drafter, opts)
    return out

result = {}
for name, cfg in CONFIGS.items():
    t = dj.Target.random(cfg, seed=1, init_scale=0.15)
    d = dj.Drafter.random(t, num_layers=2, block_size=6, seed=2, init_scale=0.15)
    ref = runs(t, d, name)
    two = [(p * 2)[:2] for p in prompts]
    ref_logits = np.asarray(parallel.target_logits(t, two))
    result[name] = {"single": ref, "meshes": {}}
    for data, model in MESHES[name]:
        mesh = parallel.make_mesh(data=data, model=model)
        if (name, data, model) == ("qwen3", 1, 8):  # Target.random / Drafter.random on a mesh
            tm = dj.Target.random(cfg, seed=1, init_scale=0.15, mesh=mesh)
            dm = dj.Drafter.random(tm, num_layers=2, block_size=6, seed=2, init_scale=0.15)
        else:  # the same weights placed by the constructors (what random(mesh=) does after its init)
            tm, dm = dj.Target(cfg, t.params, mesh=mesh), dj.Drafter(d.config, d.params, mesh=mesh)
        logits = parallel.target_logits(tm, two)
        shard = lambda x: list(x.sharding.shard_shape(x.shape))  # one device's block
        result[name]["meshes"][f"{data}x{model}"] = {
            **runs(tm, dm, name, (data, model)),
            "logits_err": float(np.max(np.abs(np.asarray(logits) - ref_logits))),
            "logits_scale": float(np.max(np.abs(ref_logits))),
            "shards": {"logits": shard(logits), "embed": shard(tm.params["embed_tokens"]["embedding"]),
                       "q": shard(tm.params["layers"]["self_attn"]["q_proj"]["kernel"]),
                       "kv": shard(tm.params["layers"]["self_attn"]["k_proj"]["kernel"]),
                       "down": shard(tm.params["layers"]["mlp"]["down_proj"]["kernel"]),
                       "drafter_q": shard(dm.params["layers"]["self_attn"]["q_proj"]["kernel"]),
                       "drafter_fc": shard(dm.params["fc"]["kernel"])},
            "full": {"embed": list(tm.params["embed_tokens"]["embedding"].shape),
                     "q": list(tm.params["layers"]["self_attn"]["q_proj"]["kernel"].shape),
                     "kv": list(tm.params["layers"]["self_attn"]["k_proj"]["kernel"].shape),
                     "down": list(tm.params["layers"]["mlp"]["down_proj"]["kernel"].shape),
                     "drafter_q": list(dm.params["layers"]["self_attn"]["q_proj"]["kernel"].shape),
                     "drafter_fc": list(dm.params["fc"]["kernel"].shape)},
        }
"""

ERRORS_CODE = """
cfg = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=32, intermediate_size=64,
                   num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
odd_vocab = TargetConfig(model_type="qwen3", vocab_size=250, hidden_size=32, intermediate_size=64,
                         num_layers=1, num_heads=4, num_kv_heads=4, head_dim=8, max_position_embeddings=128)
out = {}
# refused before any weight is placed (no parameters needed)
out["heads"] = error(lambda: dj.Target(cfg, None, mesh=parallel.make_mesh(data=2, model=4)))
out["vocab"] = error(lambda: dj.Target(odd_vocab, None, mesh=parallel.make_mesh(data=2, model=4)))
out["too_many"] = error(lambda: parallel.make_mesh(data=4, model=4))
t1 = dj.Target.random(cfg)
d1 = dj.Drafter.random(t1, num_layers=1, block_size=4)  # on one device
t = dj.Target(cfg, t1.params, mesh=parallel.make_mesh(data=4, model=2))  # the same weights, placed
d = dj.Drafter(d1.config, d1.params, mesh=t.mesh)
out["batch"] = error(lambda: dj.generate(t, [[1, 2], [3, 4]], 4, drafter=d))
out["drafter_mesh"] = error(lambda: dj.generate(t, [[1, 2]] * 4, 4, drafter=d1))
t2 = dj.Target(cfg, t1.params, mesh=parallel.make_mesh(data=2, model=2))
out["drafter_other_mesh"] = error(lambda: dj.generate(t2, [[1, 2]] * 4, 4, drafter=d))
out["parse"] = error(lambda: parallel.parse_mesh("data=2,tensor=4"))
result["errors"] = out
"""


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    # one subprocess for the module's 8-device checks: the engine runs, then the refused meshes
    return shared_run(tmp_path_factory, "engine_runs", ENGINE_CODE + ERRORS_CODE + "emit(result)\n",
                      fast_compile=True)


@pytest.mark.parametrize("model", ["qwen3", "llama"])
@pytest.mark.parametrize("run", ["dflash", "ar"])
def test_greedy_equal_to_single_device_on_every_mesh(engine_runs, model, run):
    single = engine_runs[model]["single"][run]
    want = MESHES if model == "qwen3" else LLAMA_MESHES
    assert sorted(engine_runs[model]["meshes"]) == sorted(f"{d}x{m}" for d, m in want)
    for mesh, res in engine_runs[model]["meshes"].items():
        assert res[run][0] == single[0], f"{model} {run} tokens differ on mesh {mesh}"
        assert res[run][1] == single[1], f"{model} {run} acceptance lengths differ on mesh {mesh}"


def test_trees_under_tensor_parallelism_equal_one_device_and_move_no_vocabulary(engine_runs):
    """A tree of 8 nodes (top-3 children) with the vocabulary split over the model axis (4 and 8
    shards): each depth's top-3 exchanged as 3 values and ids per shard, then ranked, gives the
    one device's tree, tokens and acceptance lengths. The compiled loop (data 2, model 4) moves
    no array with a vocabulary-wide axis (256), and holds the exchange: an all-gather of the
    shards' 3 candidates per depth (3 x 4 = 12), as float32 values and as int32 ids."""
    single = engine_runs["qwen3"]["single"]["tree"]
    assert single[0] == engine_runs["qwen3"]["single"]["ar"][0]  # a tree is exact
    assert any(a > 1 for row in single[1] for a in row)  # and accepts drafts
    for mesh in ("2x4", "1x8"):
        res = engine_runs["qwen3"]["meshes"][mesh]
        assert res["tree"] == single, f"the tree differs on mesh {mesh}"
    found = engine_runs["qwen3"]["meshes"]["2x4"]["tree_collectives"]
    assert found and not [c for c in found if 256 in c[2]], found
    exchange = {c[1] for c in found if c[0] == "all-gather" and c[2][-1:] == [12]}
    assert exchange == {"f32", "s32"}, found


def test_greedy_dflash_is_autoregressive_output(engine_runs):
    for model in ("qwen3", "llama"):
        single = engine_runs[model]["single"]
        assert single["dflash"][0] == single["ar"][0]
        # the drafter is random, but a run where nothing is accepted would test little
        assert any(a > 1 for row in single["dflash"][1] for a in row)


@pytest.mark.parametrize("run", ["sampled", "topk"])
def test_sampled_output_identical_for_the_same_seed(engine_runs, run):
    """The sharded sampler uses the single-device random numbers (rows x vocabulary blocks
    of the same Gumbel / uniform draws), so sampled tokens are identical, not only equal in
    distribution."""
    for model in ("qwen3", "llama"):
        if run not in engine_runs[model]["single"]:
            continue
        single = engine_runs[model]["single"][run]
        assert single[0] != engine_runs[model]["single"]["dflash"][0]  # it did sample
        checked = [mesh for mesh, res in engine_runs[model]["meshes"].items() if run in res]
        assert checked
        for mesh in checked:
            assert engine_runs[model]["meshes"][mesh][run] == single, f"{model} {run} differs on {mesh}"


def test_logits_within_float32_tolerance_and_layout(engine_runs):
    for model in ("qwen3", "llama"):
        for mesh, res in engine_runs[model]["meshes"].items():
            assert res["logits_err"] <= 1e-5 * max(1.0, res["logits_scale"]), (model, mesh, res["logits_err"])
            data, m = map(int, mesh.split("x"))
            shards, full = res["shards"], res["full"]
            assert shards["logits"] == [8 // data, 2, 256 // m]  # rows over data, vocabulary over model
            assert shards["embed"] == [full["embed"][0] // m, full["embed"][1]]  # vocabulary rows
            for name in ("q", "kv", "drafter_q"):  # heads (the columns) over model
                assert shards[name] == full[name][:2] + [full[name][2] // m], name
            assert shards["down"] == [full["down"][0], full["down"][1] // m, full["down"][2]]  # MLP rows
            assert shards["drafter_fc"] == full["drafter_fc"]  # replicated (parallel.rules)



def test_bad_meshes_and_batches_are_clear_errors_before_anything_runs(engine_runs):
    out = engine_runs["errors"]
    assert "num_key_value_heads=2" in out["heads"] and "not divisible by 4" in out["heads"]
    assert "Model-axis sizes that fit: [1, 2]" in out["heads"]
    assert "vocab_size=250" in out["vocab"]
    assert "needs 16 devices" in out["too_many"] and "8 are available" in out["too_many"]
    assert "2 prompts cannot be split" in out["batch"] and "data=4" in out["batch"]
    assert "one device" in out["drafter_mesh"] and "load_drafter(path, target)" in out["drafter_mesh"]
    assert "mesh {'data': 4, 'model': 2}" in out["drafter_other_mesh"]
    assert "data=2,model=4" in out["parse"]


# ---------------------------------------------------------------------------- two processes
PREPARE_CODE = """
import sys
import dflash_jax as dj
from dflash_jax.config import TargetConfig
from support.multidevice import emit

root = sys.argv[1]
cfg = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
                   num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
t = dj.Target.random(cfg, seed=1, init_scale=0.15)
t.save(root + "/target", max_shard_bytes=40_000)  # several safetensors files + an index
dj.save_drafter(dj.Drafter.random(t, num_layers=1, block_size=8, seed=2, init_scale=0.15), root + "/drafter")
t = dj.load_target(root + "/target")
d = dj.load_drafter(root + "/drafter", t)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3, 3]]
emit({"greedy": dj.generate(t, prompts, 20, drafter=d).sequences,
      "sampled": dj.generate(t, prompts, 20, drafter=d, temperature=1.0, seed=7).sequences})
"""

WORKER_CODE = """
import sys
from dflash_jax import parallel
root, pid, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
assert parallel.initialize(f"localhost:{port}", 2, pid)
import jax
import dflash_jax as dj
from support.multidevice import emit

mesh = parallel.make_mesh(data=2, model=2)  # 4 devices: 2 per process
t = dj.load_target(root + "/target", mesh=mesh)  # each process reads its devices' slices
d = dj.load_drafter(root + "/drafter", t)
local = {str(s.device) for s in t.params["layers"]["mlp"]["down_proj"]["kernel"].addressable_shards}
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3, 3]]
emit({"processes": jax.process_count(), "devices": jax.device_count(), "local_devices": len(local),
      "main": parallel.is_main_process(),
      "greedy": dj.generate(t, prompts, 20, drafter=d).sequences,
      "sampled": dj.generate(t, prompts, 20, drafter=d, temperature=1.0, seed=7).sequences})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_generate_like_one(tmp_path):
    """One ``generate`` across two processes (jax.distributed, gloo CPU collectives), each with
    2 host devices, mesh data=2 x model=2, equal to the single-process result."""
    ref = run_on_devices(PREPARE_CODE, devices=1, args=[tmp_path], fast_compile=True)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(tmp_path), str(i), str(port)],
                              env=device_env(2, fast_compile=True), cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, stderr[-6000:]
        outs.append(json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:]))
    for i, out in enumerate(outs):
        assert out["processes"] == 2 and out["devices"] == 4 and out["local_devices"] == 2
        assert out["main"] == (i == 0)
        assert out["greedy"] == ref["greedy"]
        assert out["sampled"] == ref["sampled"]
