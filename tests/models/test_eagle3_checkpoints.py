"""EAGLE-3 checkpoints (``dflash_jax.methods.eagle3.checkpoint``): the released layout round trip, a
checkpoint written by torch with SpecForge's tensor names, transformers reading the config, the
refusals, and atomic writes."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import dflash_jax as dj
from dflash_jax import checkpoints
from dflash_jax.checkpoints import CheckpointError, SINGLE_FILE, INDEX_FILE
from dflash_jax.methods.eagle3.checkpoint import eagle3_tensor_specs, load_eagle3_params, save_eagle3_params
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.methods.dflash import DFLASH
from dflash_jax.methods.dflash.checkpoint import drafter_tensor_specs
from dflash_jax.methods.eagle3 import EAGLE3
from dflash_jax.models.handles import (Eagle3Drafter, load_any_drafter, load_drafter, load_eagle3,
                                       save_drafter, save_eagle3)

pytestmark = [pytest.mark.xdist_group("test_eagle3_checkpoints"), pytest.mark.torch]

V, VD, D = 128, 48, 64
LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def target():
    cfg = dj.TargetConfig("qwen3", vocab_size=V, hidden_size=D, intermediate_size=96, num_layers=4,
                          num_heads=4, num_kv_heads=2, head_dim=16, rope=dj.RopeConfig(theta=1e6))
    return dj.Target.random(cfg, seed=0)


@pytest.fixture(scope="module")
def vocab():
    """A strict, non-contiguous draft vocabulary (sorted target ids)."""
    ids = np.sort(np.random.default_rng(0).choice(V, VD, replace=False))
    assert np.diff(ids).max() > 1 and ids[-1] - ids[0] >= VD
    return ids


@pytest.fixture(scope="module")
def drafter(target, vocab):
    return Eagle3Drafter.random(target, draft_vocab=vocab, target_layer_ids=LAYERS, seed=1,
                                init_scale=0.2)


@pytest.fixture(scope="module")
def saved(drafter, tmp_path_factory):
    path = tmp_path_factory.mktemp("eagle3") / "drafter"
    save_drafter(drafter, path)
    return path


def random_params(specs, seed=0):
    """A parameter tree of normal(0.1) tensors shaped by checkpoint ``specs`` (no jit)."""
    rng = np.random.default_rng(seed)
    return checkpoints.tensors_to_params(
        {n: (rng.standard_normal(s.shape) * 0.1).astype(np.float32) for n, s in specs.items()}, specs)


def tree_bytes(params):
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(p): (np.asarray(x).dtype, np.asarray(x).shape, np.asarray(x).tobytes())
            for p, x in flat}


def copy_dir(src, dst, drop=(), edit=None, config_edit=None):
    """A copy of checkpoint ``src`` with tensors dropped / edited (``edit(tensors)``) and its
    config.json edited (``config_edit(dict)``)."""
    from safetensors.numpy import save_file

    tensors = load_file(os.path.join(src, SINGLE_FILE))
    for name in drop:
        del tensors[name]
    if edit:
        edit(tensors)
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, SINGLE_FILE))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if config_edit:
        config_edit(config)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


# ---------------------------------------------------------------------------- round trips
def test_round_trip_bit_exact(target, drafter, saved, vocab):
    again = load_drafter(saved, target)
    assert again.config == drafter.config
    assert tree_bytes(again.params) == tree_bytes(drafter.params)
    np.testing.assert_array_equal(again.d2t, drafter.d2t)
    np.testing.assert_array_equal(again.draft_vocab, vocab)
    stored = load_file(os.path.join(saved, SINGLE_FILE))
    names = {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
             "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    names |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(stored) == names
    # SpecForge's buffers: d2t int64 offsets, t2d bool over the target vocabulary
    assert stored["d2t"].dtype == np.int64 and stored["t2d"].dtype == np.bool_
    np.testing.assert_array_equal(np.arange(VD) + stored["d2t"], vocab)
    np.testing.assert_array_equal(np.flatnonzero(stored["t2d"]), vocab)
    # torch Linear layout [out, in]
    assert stored["fc.weight"].shape == (D, 3 * D)
    assert stored["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * D)
    assert stored["lm_head.weight"].shape == (VD, D)
    np.testing.assert_array_equal(stored["lm_head.weight"], np.asarray(drafter.params["lm_head"]["kernel"]).T)
    with open(os.path.join(saved, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["dtype"] == config["torch_dtype"] == "float32"  # the weights', not d2t's int64
    assert config["draft_vocab_size"] == VD
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)


def test_round_trip_bf16_and_sharded(drafter, tmp_path):
    cfg = drafter.config
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), drafter.params)
    save_eagle3_params(tmp_path / "a", cfg, params, drafter.d2t, max_shard_bytes=20_000)
    assert os.path.exists(tmp_path / "a" / INDEX_FILE) and not os.path.exists(tmp_path / "a" / SINGLE_FILE)
    assert len([f for f in os.listdir(tmp_path / "a") if f.startswith("model-")]) > 1
    with open(tmp_path / "a" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    again, d2t = load_eagle3_params(tmp_path / "a", cfg)
    assert tree_bytes(again) == tree_bytes(params)
    np.testing.assert_array_equal(d2t, drafter.d2t)
    cast, _ = load_eagle3_params(tmp_path / "a", cfg, dtype=jnp.float32)
    assert cast["fc"]["kernel"].dtype == jnp.float32


def test_config_loads_in_transformers_as_llama(saved):
    from transformers import AutoConfig, LlamaConfig

    hf = AutoConfig.from_pretrained(saved)
    assert type(hf) is LlamaConfig
    assert hf.draft_vocab_size == VD and hf.vocab_size == V
    assert hf.num_hidden_layers == 1 and hf.hidden_size == D and hf.head_dim == 16
    assert hf.eagle_config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    # and transformers' own save of it reads back as the same drafter config
    hf.save_pretrained(saved.parent / "via-transformers")
    assert Eagle3Config.from_pretrained(saved.parent / "via-transformers") == Eagle3Config.from_pretrained(saved)


def specforge_checkpoint(path, target, vocab, with_t2d=True, seed=3):
    """A checkpoint as SpecForge's ``LlamaForCausalLMEagle3.save_pretrained`` leaves it, built
    here from a torch state dict: its tensor names, torch Linear weights [out, in], the frozen
    ``embed_tokens.weight`` copy, ``d2t`` int64 / ``t2d`` bool buffers; the config through
    transformers' LlamaConfig with SpecForge's extra fields. Returns the state dict (numpy)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.1
    H, Hkv, Dh, F = 4, 2, 16, 96
    sd = {"embed_tokens.weight": r(V, D), "fc.weight": r(D, 3 * D),
          "midlayer.hidden_norm.weight": 1 + r(D), "midlayer.input_layernorm.weight": 1 + r(D),
          "midlayer.post_attention_layernorm.weight": 1 + r(D),
          "midlayer.self_attn.q_proj.weight": r(H * Dh, 2 * D),
          "midlayer.self_attn.k_proj.weight": r(Hkv * Dh, 2 * D),
          "midlayer.self_attn.v_proj.weight": r(Hkv * Dh, 2 * D),
          "midlayer.self_attn.o_proj.weight": r(D, H * Dh),
          "midlayer.mlp.gate_proj.weight": r(F, D), "midlayer.mlp.up_proj.weight": r(F, D),
          "midlayer.mlp.down_proj.weight": r(D, F), "norm.weight": 1 + r(D),
          "lm_head.weight": r(len(vocab), D),
          "d2t": torch.tensor(vocab - np.arange(len(vocab)), dtype=torch.int64)}
    if with_t2d:
        sd["t2d"] = torch.zeros(V, dtype=torch.bool)
        sd["t2d"][torch.tensor(vocab)] = True
    os.makedirs(path, exist_ok=True)
    save_file(sd, os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
    tc = target.config
    LlamaConfig(architectures=["LlamaForCausalLMEagle3"], vocab_size=V, draft_vocab_size=len(vocab),
                hidden_size=D, intermediate_size=F, num_hidden_layers=1, num_attention_heads=H,
                num_key_value_heads=Hkv, head_dim=Dh, rms_norm_eps=tc.rms_norm_eps,
                rope_theta=tc.rope.theta, max_position_embeddings=tc.max_position_embeddings,
                target_hidden_size=D, tie_word_embeddings=False,
                eagle_config={"eagle_aux_hidden_state_layer_ids": list(LAYERS),
                              "use_aux_hidden_state": True}).save_pretrained(path)
    return {k: v.numpy() for k, v in sd.items()}


@pytest.mark.parametrize("with_t2d", [True, False])
def test_specforge_checkpoint_loads(target, vocab, tmp_path, with_t2d):
    sd = specforge_checkpoint(tmp_path, target, vocab, with_t2d)
    d = load_drafter(tmp_path, target)  # embed_tokens.weight ignored (the target's is used)
    assert d.config.draft_vocab_size == VD and d.config.target_layer_ids == LAYERS
    assert d.config.rope == target.config.rope
    p = d.params
    np.testing.assert_array_equal(np.asarray(p["fc"]["kernel"]), sd["fc.weight"].T)
    np.testing.assert_array_equal(np.asarray(p["lm_head"]["kernel"]), sd["lm_head.weight"].T)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        np.testing.assert_array_equal(np.asarray(p["midlayer"]["self_attn"][name]["kernel"]),
                                      sd[f"midlayer.self_attn.{name}.weight"].T)
    for name in ("gate_proj", "up_proj", "down_proj"):
        np.testing.assert_array_equal(np.asarray(p["midlayer"]["mlp"][name]["kernel"]),
                                      sd[f"midlayer.mlp.{name}.weight"].T)
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        np.testing.assert_array_equal(np.asarray(p["midlayer"][name]["weight"]), sd[f"midlayer.{name}.weight"])
    np.testing.assert_array_equal(np.asarray(p["norm"]["weight"]), sd["norm.weight"])
    np.testing.assert_array_equal(d.draft_vocab, vocab)


# ---------------------------------------------------------------------------- refusals
def refused(path, target, match):
    with pytest.raises(ValueError, match=match) as e:
        load_drafter(path, target)
    return str(e.value)


def test_missing_and_misshaped_tensors_listed(saved, target, tmp_path):
    def edit(t):
        t["lm_head.weight"] = np.zeros((VD + 1, D), np.float32)
        t["fc_norm.0.weight"] = np.ones(D, np.float32)

    copy_dir(saved, tmp_path, drop=("midlayer.mlp.up_proj.weight", "norm.weight"), edit=edit)
    msg = refused(tmp_path, target, "does not match its config")
    assert "missing tensors (2)" in msg and "midlayer.mlp.up_proj.weight" in msg and "norm.weight" in msg
    assert f"lm_head.weight: expected [{VD}, {D}], found [{VD + 1}, {D}]" in msg
    assert "unexpected tensors (1)" in msg and "fc_norm.0.weight" in msg


def test_t2d_disagreeing_with_d2t(saved, target, vocab, tmp_path):
    outside = int(np.setdiff1d(np.arange(V), vocab)[0])

    def edit(t):
        t["t2d"] = t["t2d"].copy()
        t["t2d"][[vocab[5], outside]] = [False, True]

    copy_dir(saved, tmp_path, edit=edit)
    msg = refused(tmp_path, target, "t2d disagrees with d2t at 2 target ids")
    assert f"(first: {min(outside, vocab[5])}, {max(outside, vocab[5])})" in msg


def test_t2d_of_the_wrong_shape(saved, target, tmp_path):
    copy_dir(saved, tmp_path, edit=lambda t: t.update(t2d=np.ones(V - 1, bool)))
    refused(tmp_path, target, rf"t2d must be a bool vector of vocab_size = {V} entries")


def test_d2t_missing(saved, target, tmp_path):
    copy_dir(saved, tmp_path / "sub", drop=("d2t", "t2d"))
    refused(tmp_path / "sub", target, rf"no d2t tensor.*draft_vocab_size {VD} < vocab_size {V}")
    # the whole vocabulary: the identity map
    cfg = Eagle3Config.for_target(target.config, V, LAYERS)
    full = Eagle3Drafter(cfg, random_params(eagle3_tensor_specs(cfg)), np.zeros(V, np.int32))
    save_drafter(full, tmp_path / "full-src")
    copy_dir(tmp_path / "full-src", tmp_path / "full", drop=("d2t", "t2d"))
    loaded = load_drafter(tmp_path / "full", target)
    np.testing.assert_array_equal(loaded.d2t, np.zeros(V, np.int32))
    np.testing.assert_array_equal(loaded.draft_vocab, np.arange(V))
    assert tree_bytes(loaded.params) == tree_bytes(full.params)


@pytest.mark.parametrize("bad, match", [
    ("outside", r"maps 1 draft ids outside the target vocabulary \[0, 128\) \(draft ids 47 -> target ids 128\)"),
    ("negative", r"maps 1 draft ids outside the target vocabulary .*draft ids 0 -> target ids -1\)"),
    ("duplicate", r"is not one-to-one: 1 draft ids map to a target id an earlier draft id already has"),
    ("shape", rf"must be an integer vector of draft_vocab_size = {VD} offsets, got int64 \[{VD - 1}\]"),
    ("float", rf"must be an integer vector .* got float32 \[{VD}\]"),
])
def test_bad_d2t(saved, target, vocab, tmp_path, bad, match):
    def edit(t):
        d2t = t["d2t"].copy()
        if bad == "outside":
            d2t[-1] = V - (VD - 1)
        elif bad == "negative":
            d2t[0] = -1
        elif bad == "duplicate":
            d2t[3] = d2t[2] - 1  # draft id 3 -> draft id 2's target id
        elif bad == "shape":
            d2t = d2t[:-1]
        else:
            d2t = d2t.astype(np.float32)
        t["d2t"] = d2t
        del t["t2d"]

    copy_dir(saved, tmp_path, edit=edit)
    refused(tmp_path, target, match)
    # the saver refuses the same map before writing anything
    if bad != "float":
        with pytest.raises(CheckpointError, match=match):
            save_eagle3_params(tmp_path / "new", load_drafter(saved, target).config,
                               load_drafter(saved, target).params, load_file(tmp_path / SINGLE_FILE)["d2t"])
        assert not os.path.exists(tmp_path / "new")


def test_wrong_loader(saved, target, tmp_path):
    dflash = tmp_path / "dflash"
    cfg = dj.DrafterConfig.for_target(target.config, 1, 4, V - 1)
    dj.save_drafter(dj.Drafter(cfg, random_params(drafter_tensor_specs(cfg))), dflash)
    # load_drafter picks the drafting method by the architectures config.json names
    assert isinstance(load_drafter(dflash, target), dj.Drafter)
    assert isinstance(load_drafter(saved, target), Eagle3Drafter)
    # a method's own reader refuses the other's directory, pointing at load_drafter
    with pytest.raises(ValueError, match=r"not an EAGLE-3 drafter config.*load_drafter"):
        EAGLE3.load(str(dflash), target)
    with pytest.raises(ValueError, match=r"a DFlash drafter; load_drafter picks the drafting method"):
        load_eagle3_params(dflash, load_drafter(saved, target).config)
    with pytest.raises(ValueError, match=r"an EAGLE-3 drafter config .*load it with load_drafter"):
        DFLASH.load(str(saved), target)


def test_the_old_loaders_are_deprecated_aliases(saved, target, tmp_path):
    new = load_drafter(saved, target)
    with pytest.warns(DeprecationWarning, match=r"load_eagle3 is deprecated: use dflash_jax.load_drafter"):
        old = load_eagle3(saved, target)
    with pytest.warns(DeprecationWarning, match=r"load_any_drafter is deprecated: use dflash_jax.load_drafter"):
        any_ = load_any_drafter(str(saved), target)
    for d in (old, any_):
        assert d.config == new.config and tree_bytes(d.params) == tree_bytes(new.params)
        np.testing.assert_array_equal(d.d2t, new.d2t)
    with pytest.warns(DeprecationWarning, match=r"save_eagle3 is deprecated: use dflash_jax.save_drafter"):
        save_eagle3(new, tmp_path / "old")
    save_drafter(new, tmp_path / "new")
    for f in ("config.json", SINGLE_FILE):
        assert (tmp_path / "old" / f).read_bytes() == (tmp_path / "new" / f).read_bytes()
    # load_eagle3 reads EAGLE-3 drafters only, as it did
    dflash = tmp_path / "dflash"
    cfg = dj.DrafterConfig.for_target(target.config, 1, 4, V - 1)
    dj.save_drafter(dj.Drafter(cfg, random_params(drafter_tensor_specs(cfg))), dflash)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"not an EAGLE-3 drafter config"):
        load_eagle3(dflash, target)


def test_config_refusals(saved, target, tmp_path):
    copy_dir(saved, tmp_path / "a", config_edit=lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[0, 1, 4]))
    refused(tmp_path / "a", target, r"feature layers \[4\] .* not layers of the 4-layer target")
    copy_dir(saved, tmp_path / "b", config_edit=lambda c: c.update(draft_vocab_size=V + 1))
    refused(tmp_path / "b", target, r"draft_vocab_size \(129\) is larger than the target's vocab_size")
    copy_dir(saved, tmp_path / "c", config_edit=lambda c: c.update(draft_vocab_size=VD - 1))
    msg = refused(tmp_path / "c", target, "does not match its config")
    assert f"lm_head.weight: expected [{VD - 1}, {D}], found [{VD}, {D}]" in msg


# ---------------------------------------------------------------------------- atomic writes
def snapshot(path):
    return {f: open(os.path.join(path, f), "rb").read() for f in sorted(os.listdir(path))}


def test_failed_saves_leave_the_directory_as_it_was(drafter, target, tmp_path, monkeypatch):
    dst = tmp_path / "drafter"
    save_drafter(drafter, dst)
    before = snapshot(dst)
    other = Eagle3Drafter(drafter.config, jax.tree_util.tree_map(lambda x: x + 1, drafter.params),
                          drafter.d2t)

    # a writer killed half-way through the weights file
    def dies(tensors, file, metadata=None):
        with open(file, "wb") as f:
            f.write(b"\0" * 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        save_drafter(other, dst)
    monkeypatch.undo()
    assert snapshot(dst) == before  # no half-written file, no .tmp left beside them
    # parameters of another shape are refused before anything is written
    wrong = jax.tree_util.tree_map(lambda x: x, other.params)
    wrong["midlayer"]["mlp"]["up_proj"]["kernel"] = jnp.zeros((D, 95))
    with pytest.raises(CheckpointError, match=r"midlayer.mlp.up_proj.weight: expected \[96, 64\], found \[95, 64\]"):
        save_eagle3_params(dst, drafter.config, wrong, drafter.d2t)
    del wrong["midlayer"]["mlp"]
    with pytest.raises(CheckpointError, match="not an EAGLE-3 parameter tree"):
        save_eagle3_params(dst, drafter.config, wrong, drafter.d2t)
    assert snapshot(dst) == before
    save_drafter(other, dst)  # a complete save replaces both files
    assert tree_bytes(load_drafter(dst, target).params) == tree_bytes(other.params)
