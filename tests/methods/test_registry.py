"""The drafting-method registry (``dflash_jax.methods``): a drafter checkpoint's method is found
by the architectures its config.json names (DFlash also by its fields, for configs under no or
another class name), a loaded drafter's by its handle; unknown ones are one-line errors listing
the known methods, raised before any weight is read; a name or an architecture cannot be taken
twice. ``load_drafter`` / ``save_drafter`` on each method are in
``tests/models/test_eagle3_checkpoints.py`` and ``tests/models/test_checkpoints.py``."""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import pytest

import dflash_jax as dj
from dflash_jax import methods
from dflash_jax.methods.base import DraftingMethod
from dflash_jax.methods.dflash import DFLASH
from dflash_jax.methods.eagle3 import EAGLE3, Eagle3Drafter

KNOWN = re.escape("the known methods are dflash (DFlashDraftModel), eagle3 (LlamaForCausalLMEagle3), dflash2 (DFlash2DraftModel), dspark (DSparkDraftModel, Qwen3DSparkModel), domino (DominoDraftModel)")


def test_the_builtin_methods_are_registered():
    assert methods.supported_methods() == ("dflash", "eagle3", "dflash2", "dspark", "domino")
    assert methods.method("dflash") is DFLASH and methods.method("eagle3") is EAGLE3
    with pytest.raises(ValueError, match=f"unknown drafting method 'medusa'; {KNOWN}$"):
        methods.method("medusa")


@pytest.mark.parametrize("d, found", [
    ({"architectures": ["DFlashDraftModel"], "block_size": 16}, "dflash"),
    ({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32}, "eagle3"),
    # the architecture decides, whatever the fields
    ({"architectures": ["LlamaForCausalLMEagle3"], "block_size": 16}, "eagle3"),
    # DFlash's fields under no class name, or under another one (its config reader then refuses
    # each field it does not implement, naming it)
    ({"block_size": 16, "dflash_config": {}}, "dflash"),
    ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {"target_layer_ids": [1]}}, "dflash"),
])
def test_a_checkpoint_names_its_method(d, found):
    assert methods.method_for_hf(d).name == found


@pytest.mark.parametrize("d, named", [
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "architectures ['Qwen3ForCausalLM']"),
    ({"model_type": "qwen3"}, "no architectures"),
    ({"architectures": ["MedusaModel"]}, "architectures ['MedusaModel']"),
])
def test_an_unknown_method_is_one_line_listing_the_known(d, named):
    with pytest.raises(ValueError) as e:
        methods.method_for_hf(d, " in some/dir")
    assert re.fullmatch(re.escape(f"config.json in some/dir names {named}, which no registered drafting "
                                  "method reads; ") + KNOWN, str(e.value))


def test_load_drafter_refuses_a_target_before_reading_weights(tmp_path):
    # a target's directory given as the drafter: config.json alone (no weights to read)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                       "model_type": "qwen3"}))
    target = dj.Target.random(dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                                              num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16))
    with pytest.raises(ValueError, match=rf"^config.json in {tmp_path} names architectures \['Qwen3ForCausalLM'\], "
                                         rf"which no registered drafting method reads; {KNOWN}$"):
        dj.load_drafter(tmp_path, target)


def test_a_loaded_drafter_knows_its_method():
    target = dj.Target.random(dj.TargetConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                                              num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16))
    assert methods.method_of(dj.Drafter.random(target)) is DFLASH
    assert methods.method_of(Eagle3Drafter.random(target, target_layer_ids=(0, 1, 2))) is EAGLE3
    for bad in (None, target, {"config": 1}):
        with pytest.raises(ValueError, match=r"drafter must be a drafter handle of a registered drafting "
                                             rf"method \(dflash .*\), as dflash_jax.load_drafter returns; got "
                                             rf"{type(bad).__name__}$"):
            methods.method_of(bad)
    with pytest.raises(ValueError, match="drafter must be a drafter handle"):
        dj.save_drafter(target, "never-written")
    with pytest.raises(ValueError, match="drafter must be a drafter handle"):
        dj.generate(target, [[1, 2]], 2, drafter=jnp.zeros(3))


class _Probe(DraftingMethod):
    def __init__(self, name, architectures, shipped_name=None):
        self.name, self.architectures, self.shipped_name = name, architectures, shipped_name


@pytest.fixture
def registry(monkeypatch):
    """The registry's tables, restored after the test."""
    for table in ("_METHODS", "_ARCHITECTURES", "_NAMED"):
        monkeypatch.setattr(methods, table, dict(getattr(methods, table)))


def test_register_one_line_and_no_name_taken_twice(registry):
    probe = methods.register(_Probe("probe", ("ProbeDraftModel", "ProbeDraftModelV2"), "embedded-probe"))
    assert methods.supported_methods() == ("dflash", "eagle3", "dflash2", "dspark", "domino", "probe")
    assert methods.method_for_hf({"architectures": ["ProbeDraftModelV2"]}) is probe
    assert methods.method_of_shipped_name("embedded-probe") is probe
    assert methods.register(probe) is probe  # the same method again: nothing changes
    for other, said in ((_Probe("probe", ("Else",)), "name 'probe' is already registered to the drafting method 'probe'"),
                        (_Probe("else", ("LlamaForCausalLMEagle3",)),
                         "architecture 'LlamaForCausalLMEagle3' is already registered to the drafting method 'eagle3'"),
                        (_Probe("else", ("Else",), "embedded"),
                         "shipped drafter name 'embedded' is already registered to the drafting method 'dflash'")):
        with pytest.raises(ValueError, match=said):
            methods.register(other)
    # a refused method adds nothing, not even the names that were free
    assert methods.supported_methods() == ("dflash", "eagle3", "dflash2", "dspark", "domino", "probe")
    with pytest.raises(ValueError, match="architectures \\['Else'\\], which no registered"):
        methods.method_for_hf({"architectures": ["Else"]})
    with pytest.raises(ValueError, match="needs a name and at least one architecture"):
        methods.register(_Probe("empty", ()))
    with pytest.raises(NotImplementedError, match="the drafting method 'probe' does not implement load"):
        probe.load("somewhere", None)
