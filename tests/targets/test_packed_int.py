"""Packed integer weights (``dflash_jax/targets/packed_int.py``, compressed-tensors'
``pack-quantized`` format of Kimi-K2.5's INT4 experts) against the ``compressed-tensors``
package's own compressor (``tests/fixtures/packed_int_reference.json``, written by
``tools/packed_int_reference.py``): 4-bit groups, 8-bit channels and 3-bit groups whose fields
straddle words dequantize to exactly the package's weights; bad schemes and tensors are one-line
errors naming the field or tensor."""

import json
import os

import numpy as np
import pytest

from dflash_jax.checkpoints import CheckpointError
from dflash_jax.targets import packed_int

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "packed_int_reference.json")


@pytest.fixture(scope="module")
def cases():
    with open(FIXTURE) as fh:
        fixture = json.load(fh)
    assert fixture["reference"] == "compressed-tensors==0.20.1"
    return fixture["cases"]


def scheme_config(**weights):
    w = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32, **weights}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}}


def test_dequantized_weights_equal_the_packages(cases):
    assert [(c["num_bits"], c["strategy"]) for c in cases] == [(4, "group"), (8, "channel"), (3, "group")]
    for c in cases:
        scheme = packed_int.read_scheme(scheme_config(num_bits=c["num_bits"], strategy=c["strategy"],
                                                      group_size=c["group_size"] or None), "cfg")
        tensors = {"w.weight_packed": np.array(c["weight_packed"], np.int32),
                   "w.weight_scale": np.array(c["weight_scale"], np.float32),
                   "w.weight_shape": np.array(c["weight_shape"], np.int64), "other": np.ones(3, np.float32)}
        out = packed_int.dequantize_tensors(tensors, scheme, "ckpt")
        assert sorted(out) == ["other", "w.weight"]
        np.testing.assert_array_equal(out["w.weight"], np.array(c["dequantized"], np.float32))


def test_bad_tensors_are_named(cases):
    c = cases[0]
    scheme = packed_int.PackedScheme(4, 32)
    good = {"w.weight_packed": np.array(c["weight_packed"], np.int32),
            "w.weight_scale": np.array(c["weight_scale"], np.float32),
            "w.weight_shape": np.array(c["weight_shape"], np.int64)}
    with pytest.raises(CheckpointError, match=r"w\.weight_scale is missing"):
        packed_int.dequantize_tensors({k: v for k, v in good.items() if "scale" not in k}, scheme, "ckpt")
    with pytest.raises(CheckpointError, match=r"w\.weight_packed is int32 \[6, 11\], but 4-bit weights of \[6, 96\] "
                                              r"pack into int32 \[6, 12\]"):
        packed_int.dequantize_tensors({**good, "w.weight_packed": good["w.weight_packed"][:, :11]}, scheme, "ckpt")
    with pytest.raises(CheckpointError, match=r"w\.weight_scale has shape \[6, 2\], but groups of 32"):
        packed_int.dequantize_tensors({**good, "w.weight_scale": good["w.weight_scale"][:, :2]}, scheme, "ckpt")
    with pytest.raises(CheckpointError, match=r"w\.weight is stored both packed and unpacked"):
        packed_int.dequantize_tensors({**good, "w.weight": np.zeros((6, 96), np.float32)}, scheme, "ckpt")


@pytest.mark.parametrize("change, match", [
    (dict(symmetric=False), r"weights\.symmetric=False: only symmetric"),
    (dict(type="float"), r"weights\.type='float': only integer"),
    (dict(strategy="tensor"), r"weights\.strategy='tensor': only the group and channel"),
    (dict(num_bits=16), r"weights\.num_bits=16: only 1- to 8-bit"),
    (dict(actorder="group"), r"weights\.actorder='group': activation-ordered"),
    (dict(group_size=None), r"weights\.group_size=None: a group strategy needs a positive group size"),
])
def test_schemes_not_read_are_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        packed_int.read_scheme(scheme_config(**change), "cfg")
    assert packed_int.read_scheme(scheme_config(), "cfg") == packed_int.PackedScheme(4, 32)
    with pytest.raises(ValueError, match=r"input_activations is set: only weight-only"):
        q = scheme_config()
        q["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8}
        packed_int.read_scheme(q, "cfg")
