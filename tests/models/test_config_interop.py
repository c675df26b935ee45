"""Configs that every reader reads the same way (issue 11, part 2).

Every ``config.json`` this project writes (targets: Qwen3 with default RoPE, Qwen3 with theta
1e6, Llama with llama3 scaling, tied and untied; drafters) is read back by the INSTALLED
transformers' own config class (``AutoConfig``: 5.x in the main CI run, 4.51 in
``.ci/newest-jax``), and must give the same RoPE theta and scaling, head dim, tie flag, eos ids
and attention layout as this project's own reader. transformers 4.x reads only the hub's
top-level ``rope_theta`` / ``rope_scaling`` (without them it silently uses theta 10000);
5.x reads ``rope_parameters``. Torch-free: configs only.

Also: the drafter fields the public serving implementations read (vLLM, SGLang, tpu-inference),
hub-style and transformers-5-style files still read, and the refusals of what this project does
not implement or of files whose two RoPE spellings disagree.
"""

import json
import os

import jax.numpy as jnp
import pytest
import transformers
from transformers import AutoConfig

import dflash_jax as dj
from dflash_jax.config import RopeConfig, TargetConfig
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.models.handles import EMBEDDED_TARGET_DIR

# one pytest-xdist worker runs the whole module: its module fixture saves ten checkpoints once
pytestmark = pytest.mark.xdist_group("test_config_interop")

TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=256)
LLAMA3_ROPE = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=32)
TARGETS = {
    "qwen3-default-rope-tied": TargetConfig("qwen3", **TINY, tie_word_embeddings=True,
                                            eos_token_id=(0,)),
    "qwen3-theta1e6-untied": TargetConfig("qwen3", **TINY, rope=RopeConfig(theta=1e6),
                                          bos_token_id=1, eos_token_id=(2,)),
    "llama3-scaling-untied": TargetConfig("llama", **TINY, rope=LLAMA3_ROPE, bos_token_id=1,
                                          eos_token_id=(2, 3, 4)),
    "llama3-scaling-tied-bias": TargetConfig("llama", **TINY, rope=LLAMA3_ROPE, attention_bias=True,
                                             tie_word_embeddings=True, eos_token_id=(5,)),
    "llama-theta5e5-no-eos": TargetConfig("llama", **TINY, rope=RopeConfig(theta=500000.0)),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{name: (directory, our config)} for every kind of config.json this project writes: each
    target above saved by ``Target.save`` (bfloat16 or float32 weights), and a drafter for each
    saved by ``save_drafter``."""
    root = tmp_path_factory.mktemp("written")
    out = {}
    for name, cfg in TARGETS.items():
        dtype = jnp.bfloat16 if "tied" in name else jnp.float32
        target = dj.Target.random(cfg, dtype=dtype)
        target.save(root / name)
        out[name] = (str(root / name), cfg)
        drafter = dj.Drafter.random(target, num_layers=2, block_size=8, mask_token_id=63,
                                    target_layer_ids=(1, 3))
        dj.save_drafter(drafter, root / f"drafter-for-{name}")
        out[f"drafter-for-{name}"] = (str(root / f"drafter-for-{name}"), drafter.config)
    return out


ALL_WRITTEN = sorted(TARGETS) + sorted(f"drafter-for-{n}" for n in TARGETS)


def read_json(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def transformers_reading(path):
    """What the installed transformers makes of a config.json: (rope theta, rope type, llama3
    fields or None, head_dim, tie flag, eos ids, sliding-window layers, dtype name), each as
    that version's model code reads it (4.x: rope_theta / rope_scaling / use_sliding_window;
    5.x: rope_parameters / layer_types)."""
    c = AutoConfig.from_pretrained(path)
    if TRANSFORMERS_MAJOR >= 5:
        rope = dict(c.rope_parameters)
        theta = rope["rope_theta"]
        sliding = [i for i, t in enumerate(getattr(c, "layer_types", None) or [])
                   if t != "full_attention"]
        dtype = str(c.dtype)
    else:
        rope = dict(c.rope_scaling or {})
        theta = c.rope_theta
        sliding = ([i for i in range(c.num_hidden_layers) if i >= c.max_window_layers]
                   if getattr(c, "use_sliding_window", False) and c.sliding_window is not None else [])
        dtype = str(c.torch_dtype)
    kind = rope.get("rope_type", rope.get("type", "default"))
    llama3 = None if kind == "default" else tuple(
        float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings"))
    eos = c.eos_token_id
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return dict(theta=float(theta), rope_type=kind, llama3=llama3, head_dim=c.head_dim,
                tie=bool(c.tie_word_embeddings), eos=eos, sliding_layers=sliding,
                dtype=dtype.replace("torch.", ""))


def our_reading(cfg, raw):
    r = cfg.rope
    llama3 = None if r.rope_type == "default" else (
        r.factor, r.low_freq_factor, r.high_freq_factor, float(r.original_max_position_embeddings))
    is_target = isinstance(cfg, TargetConfig)
    return dict(theta=r.theta, rope_type=r.rope_type, llama3=llama3, head_dim=cfg.head_dim,
                tie=cfg.tie_word_embeddings if is_target else False,
                eos=cfg.eos_token_id if is_target else (), sliding_layers=[], dtype=raw["dtype"])


@pytest.mark.parametrize("name", ALL_WRITTEN)
def test_transformers_reads_what_we_read(written, name):
    path, cfg = written[name]
    ours = (TargetConfig if name in TARGETS else DrafterConfig).from_pretrained(path)
    assert ours == cfg
    assert transformers_reading(path) == our_reading(ours, read_json(path))


@pytest.mark.parametrize("name", ALL_WRITTEN)
def test_written_configs_spell_rope_and_dtype_for_both_generations(written, name):
    """The fields transformers 4.x needs are top level, beside 5.x's, with equal values: this
    fails if ``rope_theta`` is missing from a written config (4.x would then use 10000)."""
    path, cfg = written[name]
    raw = read_json(path)
    assert "rope_theta" in raw and raw["rope_theta"] == cfg.rope.theta
    assert "rope_scaling" in raw and raw["rope_scaling"] == cfg.rope.to_hf_scaling()
    assert raw["rope_parameters"]["rope_theta"] == raw["rope_theta"]
    if cfg.rope.rope_type == "llama3":  # the hub's Llama-3.1 rope_scaling layout
        assert raw["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 32}
    else:
        assert raw["rope_scaling"] is None
    assert raw["torch_dtype"] == raw["dtype"] in ("bfloat16", "float32")
    assert raw["head_dim"] == cfg.head_dim and raw["hidden_act"] == "silu"
    if raw["model_type"] == "qwen3":
        assert raw["use_sliding_window"] is False and raw["sliding_window"] is None
        assert raw["layer_types"] == ["full_attention"] * raw["num_hidden_layers"]


def test_shipped_target_config_reads_the_same_everywhere():
    raw = read_json(EMBEDDED_TARGET_DIR)
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 10000.0
    assert "rope_scaling" in raw and raw["torch_dtype"] == raw["dtype"] == "bfloat16"
    ours = TargetConfig.from_pretrained(EMBEDDED_TARGET_DIR)
    assert raw == {**ours.to_hf_dict(), "dtype": "bfloat16", "torch_dtype": "bfloat16"}
    assert transformers_reading(EMBEDDED_TARGET_DIR) == our_reading(ours, raw)


def test_theta_1e6_reaches_this_transformers_and_the_bug_it_fixes(written):
    """The issue's case: theta 1e6 is read as 1e6. Without the top-level ``rope_theta`` (the
    old writer's output) transformers 4.x falls back to 10000, 5.x still reads 1e6."""
    path, _ = written["qwen3-theta1e6-untied"]
    assert transformers_reading(path)["theta"] == 1e6
    raw = read_json(path)
    old_style = {k: v for k, v in raw.items() if k not in ("rope_theta", "rope_scaling")}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(old_style, f)
    try:
        assert transformers_reading(path)["theta"] == (1e6 if TRANSFORMERS_MAJOR >= 5 else 10000.0)
        assert TargetConfig.from_pretrained(path).rope.theta == 1e6  # our reader: 5.x's reading
    finally:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(raw, f)


def test_drafter_config_has_what_the_reference_and_serving_engines_read(written):
    """Fields the public DFlash implementations read from a drafter's config.json, and their
    fallbacks when a field is missing (which would silently change the drafter there):

    - reference (z-lab/dflash ``dflash/model.py``): ``Qwen3Config`` + ``dflash_config``
      (``target_layer_ids``, ``mask_token_id``), ``block_size``, ``num_target_layers``,
      ``layer_types[i]`` (sliding if "sliding_attention"), ``attention_bias``;
    - vLLM (``model_executor/models/qwen3_dflash.py``, ``eagle3_utils.py``): architecture
      ``DFlashDraftModel``; rope theta defaults to 1e6; ``eagle_aux_hidden_state_layer_ids``
      overrides ``dflash_config.target_layer_ids``; ``layer_types``, ``dflash_config.use_swa``,
      ``is_causal`` / ``dflash_config.causal``, sink biases, ``target_hidden_size``,
      ``draft_vocab_size``;
    - SGLang (``speculative/dflash_utils.py``, ``models/dflash.py``): ``block_size`` and
      ``num_target_layers`` at the top level or in ``dflash_config``, ``mask_token_id`` in
      ``dflash_config``, ``layer_types``, ``hidden_act`` must be silu;
    - tpu-inference (``models/jax/dflash.py``): ``rope_theta`` defaults to 1e6,
      ``block_size`` to 8, ``dflash_config.mask_token_id`` to 0.
    """
    path, cfg = written["drafter-for-qwen3-default-rope-tied"]
    raw = read_json(path)
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    assert raw["rope_theta"] == 10000.0  # not the engines' 1e6 default
    assert raw["block_size"] == 8 and raw["num_target_layers"] == 4
    assert raw["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": 63}
    assert raw["layer_types"] == ["full_attention", "full_attention"]
    assert raw["attention_bias"] is False and raw["hidden_act"] == "silu"
    for absent in ("eagle_aux_hidden_state_layer_ids", "is_causal", "target_hidden_size",
                   "draft_vocab_size", "auto_map"):
        assert absent not in raw
    c = AutoConfig.from_pretrained(path)  # as the reference reads it (through Qwen3Config)
    assert c.dflash_config["target_layer_ids"] == [1, 3] and c.dflash_config["mask_token_id"] == 63
    assert c.block_size == 8 and c.num_target_layers == 4 and c.num_hidden_layers == 2
    assert list(c.layer_types) == ["full_attention"] * 2 and c.attention_bias is False


# ---------------------------------------------------------------------------- other layouts
RELEASED_DRAFTER = {  # the layout of z-lab's released Qwen3-4B drafter config (transformers 4.57)
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16, "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
    "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960,
    "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32,
    "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "transformers_version": "4.57.3", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def test_both_generations_layouts_still_read():
    """Hub files (top-level rope_theta only) and transformers-5 files (rope_parameters only)
    read as the same drafter; so does SGLang's nested block_size / num_target_layers."""
    hub = DrafterConfig.from_hf_dict(RELEASED_DRAFTER)
    assert hub.rope == RopeConfig(theta=1e6) and hub.num_target_layers == 36
    assert hub.target_layer_ids == (1, 9, 17, 25, 33) and hub.block_size == 16
    v5 = {k: v for k, v in RELEASED_DRAFTER.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    assert DrafterConfig.from_hf_dict(v5) == hub
    nested = {k: v for k, v in RELEASED_DRAFTER.items() if k not in ("block_size", "num_target_layers")}
    nested["dflash_config"] = {**nested["dflash_config"], "block_size": 16, "num_target_layers": 36}
    assert DrafterConfig.from_hf_dict(nested) == hub


QWEN3_TARGET = TargetConfig("qwen3", **TINY).to_hf_dict()
LLAMA3_TARGET = TargetConfig("llama", **TINY, rope=LLAMA3_ROPE).to_hf_dict()


@pytest.mark.parametrize("base, edit", [
    (QWEN3_TARGET, {"use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 28,
                    "layer_types": None}),                             # Qwen3 hub style
    (QWEN3_TARGET, {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 4,
                    "layer_types": None}),                             # no layer >= 4: no effect
    (QWEN3_TARGET, {"rope_scaling": {"rope_type": "default"}}),
    (QWEN3_TARGET, {"rope_theta": 10000}),                             # int == float
    (LLAMA3_TARGET, {"sliding_window": 4096, "use_sliding_window": True}),  # Llama ignores them
    (LLAMA3_TARGET, {"rope_parameters": None}),                        # hub Llama-3.1 layout
])
def test_accepted_target_configs(base, edit):
    cfg = TargetConfig.from_hf_dict({k: v for k, v in {**base, **edit}.items() if v is not None or
                                     k in ("sliding_window", "rope_scaling")})
    assert cfg.num_layers == 4


@pytest.mark.parametrize("base, edit, match", [
    (QWEN3_TARGET, {"rope_theta": 1e6}, r"contradictory RoPE theta.*rope_theta=1e\+06.*"
                                        r"rope_parameters.rope_theta=10000"),
    (LLAMA3_TARGET, {"rope_scaling": None}, r"contradictory RoPE types.*'llama3'.*rope_scaling='default'"),
    (LLAMA3_TARGET, {"rope_scaling": {**LLAMA3_ROPE.to_hf_scaling(), "factor": 4.0}},
     r"contradictory llama3 factor"),
    (QWEN3_TARGET, {"layer_types": ["full_attention"] * 3 + ["sliding_attention"]},
     r"layer_types contains 'sliding_attention'"),
    (QWEN3_TARGET, {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 2},
     r"use_sliding_window=true with sliding_window=4096: layers 2..3"),
    (QWEN3_TARGET, {"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    (LLAMA3_TARGET, {"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5"),
    (LLAMA3_TARGET, {"mlp_bias": True}, r"mlp_bias=true"),
])
def test_refused_target_configs(base, edit, match):
    d = {k: v for k, v in {**base, **edit}.items() if v is not None or k == "rope_scaling"}
    with pytest.raises(ValueError, match=match):
        TargetConfig.from_hf_dict(d)


def test_default_max_window_layers_follows_transformers():
    """Without max_window_layers transformers' Qwen3 default (28) decides which layers slide."""
    d = {**QWEN3_TARGET, "use_sliding_window": True, "sliding_window": 4096}
    del d["max_window_layers"], d["layer_types"]
    TargetConfig.from_hf_dict(d)  # 4 layers, none >= 28: full attention everywhere
    with pytest.raises(ValueError, match=r"layers 28..35"):
        TargetConfig.from_hf_dict({**d, "num_hidden_layers": 36})


DRAFTER = RELEASED_DRAFTER


@pytest.mark.parametrize("edit, match", [
    ({"attention_bias": True}, r"attention_bias=true: the drafter has no attention biases"),
    ({"layer_types": ["sliding_attention"] * 5}, r"layer_types contains 'sliding_attention'"),
    ({"use_sliding_window": True, "sliding_window": 0, "max_window_layers": 0, "layer_types": None},
     r"sliding_window=0: a sliding window must be an integer >= 1"),  # (tests/models/test_drafter_shapes.py)
    ({"dflash_config": {**DRAFTER["dflash_config"], "use_swa": True, "swa_window_size": 2048}},
     r"dflash_config.use_swa=true"),
    ({"is_causal": True}, r"is_causal=true: the drafter's block attention is non-causal"),
    ({"dflash_config": {**DRAFTER["dflash_config"], "causal": True}}, r"dflash_config.causal=true"),
    ({"dflash_config": {**DRAFTER["dflash_config"], "attention_sink_bias": True}},
     r"dflash_config.attention_sink_bias=true"),
    ({"has_embed_tokens": True}, r"has_embed_tokens=true: the drafter uses the target's embedding"),
    ({"dflash_config": {**DRAFTER["dflash_config"], "projector_type": "domino"}},
     r'dflash_config.projector_type="domino"'),
    ({"draft_vocab_size": 32000}, r"draft_vocab_size=32000 differs from vocab_size=151936"),
    ({"target_hidden_size": 4096}, r"target_hidden_size=4096 differs from hidden_size=2560"),
    ({"use_aux_hidden_state": False}, r"use_aux_hidden_state=false"),
    ({"mlp_bias": True}, r"mlp_bias=true"),
    ({"rope_theta": None}, r"states no rope_theta.*10000.*1e6"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 9, 17, 25, 33]},
     r"eagle_aux_hidden_state_layer_ids=\[1, 9, 17, 25, 33\].*plus one \(\[2, 10, 18, 26, 34\]\)"),
    ({"dflash_config": {**DRAFTER["dflash_config"], "block_size": 10}},
     r"contradictory block_size values \(block_size=16, dflash_config.block_size=10\)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
     r"contradictory RoPE theta"),
])
def test_refused_drafter_configs(edit, match):
    d = {k: v for k, v in {**DRAFTER, **edit}.items() if v is not None or k == "sliding_window"}
    with pytest.raises(ValueError, match=match):
        DrafterConfig.from_hf_dict(d)


def test_drafter_refusals_are_listed_together_and_reach_load_drafter(written):
    path, _ = written["drafter-for-qwen3-default-rope-tied"]
    target = dj.load_target(written["qwen3-default-rope-tied"][0])
    raw = read_json(path)
    bad = {**raw, "attention_bias": True, "layer_types": ["sliding_attention", "full_attention"]}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(bad, f)
    try:
        with pytest.raises(ValueError) as e:
            dj.load_drafter(path, target)
        msg = str(e.value)
        assert "drafter config.json asks for what dflash-jax does not implement" in msg
        assert "attention_bias=true" in msg and "layer_types contains 'sliding_attention'" in msg
    finally:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(raw, f)
    assert dj.load_drafter(path, target).config.target_layer_ids == (1, 3)
