"""``hybrid-plan`` (``tools/hybrid_plan.py``): memory and communication plans of the Qwen3.5
hybrid targets on GPU meshes. Its per-device weights and collectives are checked against the
engine on 8 host devices in ``tests/parallel/test_hybrid_parallel.py``; here, by hand, the
published shapes and what the report says."""

from __future__ import annotations

import json

import pytest

from dflash_jax.tools import hybrid_plan as hp
from dflash_jax.targets import family_of


def test_the_published_shapes_and_their_sizes():
    """27B has 27B parameters on one device and half its layers' on each of two; 397B-A17B holds
    397B (its vision tower and MTP head aside) and 17B per token; 122B-A10B 122B and 10B."""
    for name, total, active in (("qwen3.5-27b", 26.9e9, 26.9e9), ("qwen3.5-122b-a10b", 122e9, 10e9),
                                ("qwen3.5-397b-a17b", 397e9, 17e9)):
        cfg = hp.config(name)
        fam = family_of(cfg)
        assert fam.num_params(cfg) == pytest.approx(total, rel=0.03), name
        assert fam.matrix_params_per_token(cfg) == pytest.approx(active, rel=0.12), name
        assert hp.weight_bytes_per_device(cfg, (1, 1, 1)) == 2 * fam.num_params(cfg), name


def test_per_device_memory_by_hand():
    """397B-A17B on (data 1, expert 4, model 2): the experts' 3 E D F of 60 layers over 8
    devices, the rest over the 2 model shards but the norms, the routers [D, E] and the shared
    experts' gates [D, 1] (whole on every device); its GDN state per row: 45
    layers of 32 of the 64 value heads' 128 x 128 float32 state and the conv window of half the
    12288 channels; K/V per token: 15 attention layers, 1 of 2 KV heads of 256."""
    cfg = hp.config("qwen3.5-397b-a17b")
    experts = 60 * 512 * 3 * 4096 * 1024
    rest = family_of(cfg).num_params(cfg) - experts
    w = hp.weight_bytes_per_device(cfg, (1, 4, 2))
    whole = 2 * (60 * 2 * 4096 + 4096 + 15 * 2 * 256 + 45 * 128  # the norms' vectors
                 + 60 * 4096 * 512 + 60 * 4096)  # routers, shared-expert gates (bytes)
    assert w == 2 * experts // 8 + (2 * rest - whole) // 2 + whole
    st = hp.state_bytes(cfg, (1, 4, 2))
    assert st["gdn_per_row"] == 45 * (32 * 128 * 128 * 4 + 3 * 6144 * 2)
    assert st["kv_per_token"] == 2 * 15 * 1 * 256 * 2


def test_collectives_by_hand():
    """27B on (1, 1, 2), an AR step: the embedding and every layer's mixer and MLP all-reduce
    [1, 5120] bf16 (129), and the argmax exchange (2); 397B on (1, 8, 1): only the MoE blocks'
    60, over the 8 experts' devices."""
    c = hp.target_collectives(hp.config("qwen3.5-27b"), 1, (1, 1, 2))
    assert sum(x.count for x in c if x.kind == "all-reduce") == 1 + 64 + 64
    assert {x.payload for x in c if x.kind == "all-reduce"} == {5120 * 2}
    assert sum(x.count for x in c if x.kind == "all-gather") == 2
    c = hp.target_collectives(hp.config("qwen3.5-397b-a17b"), 16, (1, 8, 1))
    assert [(x.kind, x.count, x.group, x.payload) for x in c] == [("all-reduce", 60, 8, 16 * 4096 * 2)]


def test_the_command_writes_a_plan(tmp_path, capsys):
    rep = hp.main(["--models", "qwen3.5-27b", "--out", str(tmp_path)])
    rows = rep["rows"]
    assert [(r["device"], r["mesh"]) for r in rows] == [("h100", [1, 1, 1]), ("h100", [1, 1, 2]),
                                                         ("b200", [1, 1, 1]), ("b200", [1, 1, 2])]
    assert all(r["fits"] for r in rows)
    one, two = rows[0], rows[1]
    assert two["gdn_per_row"] * 2 == one["gdn_per_row"] and two["kv_per_token"] * 2 == one["kv_per_token"]
    # a dense target: both routings are the same; the model axis costs collectives and saves bytes
    assert one["routing"]["uniform"] == one["routing"]["shared"]
    assert one["routing"]["uniform"]["iteration_comm"]["collectives"] == 0
    assert two["routing"]["uniform"]["t_ar_us"] < one["routing"]["uniform"]["t_ar_us"]
    saved = json.loads((tmp_path / "plans.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    assert (tmp_path / "plans.png").exists() and "| qwen3.5-27b | h100 | 1x1x2 |" in (tmp_path / "plans.md").read_text()


@pytest.mark.parametrize("argv,message", [
    (["--tau", "20"], "--tau must lie between 1 and the block size 16"),
    (["--memory-fraction", "0"], "--memory-fraction must lie in (0, 1]"),
    (["--context", "0"], "--context must be >= 1"),
])
def test_bad_options_are_one_line_errors(tmp_path, argv, message):
    with pytest.raises(ValueError) as e:
        hp.main(argv + ["--out", str(tmp_path)])
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())
