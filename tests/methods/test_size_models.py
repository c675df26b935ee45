"""Each built-in drafting method's size model (``DraftingMethod.num_params`` / ``draft_costs``,
the numbers the rooflines time) against independent counts: the parameters against the
drafter's real parameter tree, one draft's FLOPs against XLA's cost analysis of the method's
own compiled proposer (1-layer drafters: XLA counts a loop body once), and what XLA cannot
see (sliding windows, the depth of input fusion, trees) by hand."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax import methods
from dflash_jax.config import TargetConfig
from dflash_jax.decoding import engine
from dflash_jax.decoding.prepare import GenerateOptions
from dflash_jax.methods.dflash import DFLASH
from dflash_jax.methods.dflash.config import DrafterConfig
from dflash_jax.methods.dflash.handle import Drafter
from dflash_jax.methods.dflash.model import init_drafter_params
from dflash_jax.methods.dflash2 import DFLASH2
from dflash_jax.methods.dflash2.config import DFlash2Config
from dflash_jax.methods.dflash2.handle import DFlash2Drafter
from dflash_jax.methods.dflash2.model import init_dflash2_params
from dflash_jax.methods.domino import DOMINO
from dflash_jax.methods.domino.config import DominoConfig
from dflash_jax.methods.domino.handle import DominoDrafter
from dflash_jax.methods.domino.model import init_domino_params
from dflash_jax.methods.dspark import DSPARK
from dflash_jax.methods.dspark.config import DSparkConfig
from dflash_jax.methods.dspark.handle import DSparkDrafter
from dflash_jax.methods.dspark.model import init_dspark_params
from dflash_jax.methods.eagle3 import EAGLE3
from dflash_jax.methods.eagle3.config import Eagle3Config
from dflash_jax.methods.eagle3.handle import Eagle3Drafter
from dflash_jax.methods.eagle3.model import init_eagle3_params
from dflash_jax.targets import init_target_params
from dflash_jax.tools.roofline import xla_cost
from dflash_jax.verification.sampling import SamplingParams

T1 = TargetConfig(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16)
KEY = jax.random.key(0)
M = 32  # the draft cache's slots (the dense XLA path reads all of them)


def _dflash(conditioning="kv", layers=1, **kw) -> DrafterConfig:
    cfg = DrafterConfig.for_target(T1, num_layers=layers, block_size=4, mask_token_id=1, target_layer_ids=(0, 0))
    return dataclasses.replace(cfg, conditioning=conditioning, **kw)


def _eagle3() -> Eagle3Config:
    return Eagle3Config.for_target(T1, draft_vocab_size=100, target_layer_ids=(0, 0, 0))


def _dspark(kind="vanilla", confidence=True, with_markov=True) -> DSparkConfig:
    return DSparkConfig.for_target(T1, num_layers=1, block_size=3, mask_token_id=1, target_layer_ids=(0, 0),
                                   markov_rank=8, markov_head_type=kind, enable_confidence_head=confidence,
                                   confidence_head_with_markov=with_markov)


def _dflash2() -> DFlash2Config:
    return DFlash2Config.for_target(T1, num_layers=1, block_size=4, mask_token_id=1, target_layer_ids=(0, 0),
                                    conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=4)


def _domino() -> DominoConfig:
    return DominoConfig.for_target(T1, num_layers=1, block_size=4, mask_token_id=1, target_layer_ids=(0, 0),
                                   emb_dim=8, gru_hidden_dim=16, shift_label=True, pure_draft_prefix_len=1)


def _tree_size(init, cfg) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(jax.eval_shape(lambda k: init(cfg, k), KEY)))


def test_every_builtin_method_has_a_size_model():
    for m in methods.registered():
        assert type(m).num_params is not methods.base.DraftingMethod.num_params, m
        assert type(m).draft_costs is not methods.base.DraftingMethod.draft_costs, m


@pytest.mark.parametrize("cfg", [_dflash("kv", 2), _dflash("input", 2), _dflash("none", 2),
                                 _dflash("kv", 2, layer_types=("sliding_attention", "full_attention"),
                                         sliding_window=8)], ids=["kv", "input", "none", "sliding"])
def test_dflash_parameters_equal_the_tree(cfg):
    assert DFLASH.num_params(cfg) == _tree_size(init_drafter_params, cfg)


def test_eagle3_parameters_equal_the_tree():
    assert EAGLE3.num_params(_eagle3()) == _tree_size(init_eagle3_params, _eagle3())


@pytest.mark.parametrize("cfg", [_dspark("vanilla"), _dspark("gated", with_markov=False), _dspark("rnn", False)],
                         ids=["vanilla", "gated", "rnn"])
def test_dspark_parameters_equal_the_tree(cfg):
    assert DSPARK.num_params(cfg) == _tree_size(init_dspark_params, cfg)


def test_domino_parameters_equal_the_tree():
    assert DOMINO.num_params(_domino()) == _tree_size(init_domino_params, _domino())


def test_dflash2_parameters_equal_the_tree():
    assert DFLASH2.num_params(_dflash2()) == _tree_size(init_dflash2_params, _dflash2())


def _xla_draft_flops(method, drafter, block_size: int) -> float:
    """XLA's FLOPs of the method's own proposer drafting one block at a loop state shaped by
    ``engine.prefill`` (float32, nothing run)."""
    proposer = method.proposer(drafter, block_size, GenerateOptions(block_size=block_size), True)
    spec = engine.EngineSpec(target=T1, proposer=proposer, block_size=block_size, sampling=SamplingParams())
    tparams = jax.eval_shape(lambda k: init_target_params(T1, k), KEY)
    dparams = method.proposer_params(drafter)
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    state = jax.eval_shape(functools.partial(engine.prefill, spec=spec, cache_len=M),
                           tparams, dparams, ints(1, 8), ints(1), ints(1), ints(1, 1), KEY)

    def draft(tp, dp, state, key):
        return proposer.propose(spec, tp, dp, state.proposer, engine.committed(state), key)

    return xla_cost(draft, tparams, dparams, state, KEY)["flops"]


@pytest.mark.parametrize("method,block_size,make", [
    (DFLASH, 4, lambda: _dflash("kv")), (DFLASH, 4, lambda: _dflash("input")), (DFLASH, 4, lambda: _dflash("none")),
    (EAGLE3, 2, _eagle3), (EAGLE3, 3, _eagle3), (DSPARK, 4, _dspark), (DSPARK, 4, lambda: _dspark("rnn")),
    (DFLASH2, 4, _dflash2), (DOMINO, 4, _domino)],
    ids=["dflash-kv", "dflash-input", "dflash-none", "eagle3-1-step", "eagle3-2-steps", "dspark", "dspark-rnn",
         "dflash2", "domino"])
def test_draft_flops_agree_with_xla(method, block_size, make):
    """Within a few percent above (XLA adds the norms, softmax, RoPE and elementwise ops the
    model leaves out), never below; the dense path's context is all M slots."""
    cfg = make()
    if method is DFLASH:
        drafter = Drafter(cfg, jax.eval_shape(lambda k: init_drafter_params(cfg, k), KEY))
    elif method is DFLASH2:
        drafter = DFlash2Drafter(cfg, jax.eval_shape(lambda k: init_dflash2_params(cfg, k), KEY))
    elif method is DOMINO:
        drafter = DominoDrafter(cfg, jax.eval_shape(lambda k: init_domino_params(cfg, k), KEY))
    elif method is DSPARK:
        drafter = DSparkDrafter(cfg, jax.eval_shape(lambda k: init_dspark_params(cfg, k), KEY))
    else:
        drafter = Eagle3Drafter(cfg, jax.eval_shape(lambda k: init_eagle3_params(cfg, k), KEY), np.arange(100))
    ratio = _xla_draft_flops(method, drafter, block_size) / method.draft_flops(
        cfg, T1, block_size, M, weight_bytes=4, kv_bytes=4)
    assert 1.0 <= ratio < 1.06, ratio


def test_what_xla_cannot_see_by_hand():
    D, F, H, Dh, bs, S = 64, 128, 4, 16, 4, 100
    qomlp, kv = 2 * D * H * Dh + 3 * D * F, 2 * D * 2 * Dh
    kv_cfg = _dflash("kv", 2)
    base = DFLASH.draft_costs(kv_cfg, T1, bs, S)
    # input fusion: the bs context rows also pass q, o and the MLP of the first layer and attend
    # causally there (S - bs earlier rows, then themselves)
    fused = DFLASH.draft_costs(_dflash("input", 2), T1, bs, S)
    extra = 2 * bs * qomlp + 4 * H * Dh * (bs * (S - bs) + bs * (bs + 1) / 2)
    assert sum(c.flops for c in fused) - sum(c.flops for c in base) == extra
    # a sliding layer of window 8 sees 8 context keys instead of S: fewer pairs and K/V reads
    slide = DFLASH.draft_costs(_dflash("kv", 2, layer_types=("sliding_attention", "full_attention"),
                                       sliding_window=8), T1, bs, S)
    att = {c.name: c for c in base}["drafter attention"], {c.name: c for c in slide}["drafter attention"]
    assert att[0].flops - att[1].flops == 4 * H * Dh * bs * (S - 8)
    assert att[0].kv_read - att[1].kv_read == (S - 8) * 2 * 2 * Dh * 2
    # no conditioning: no fc, no context rows projected, the block attends to itself alone
    none = {c.name: c for c in DFLASH.draft_costs(_dflash("none", 2), T1, bs, S)}
    assert "drafter fc" not in none and none["drafter attention"].kv_read == 0
    assert none["drafter attention"].flops == 2 * 4 * H * Dh * bs * bs
    assert none["drafter linears"].flops == 2 * 2 * bs * (qomlp + kv)
    # an EAGLE-3 tree: every step after the first runs its top-k frontier instead of one row
    e = _eagle3()
    chain, tree = EAGLE3.draft_costs(e, T1, 4, S), EAGLE3.draft_costs(e, T1, 4, S, tree_topk=3)
    layer = lambda costs, s: {c.name: c for c in costs}[f"eagle3 step {s} layer"].flops  # noqa: E731
    assert layer(chain, 1) == layer(tree, 1) and [layer(tree, s) / layer(chain, s) for s in (2, 3)] == [3, 3]
    assert EAGLE3.draft_bytes(e, T1, 4, S) == sum(c.bytes for c in chain)
    # DSpark's Markov head drafts row after row: each of the block's 3 rows reads w2 [r, V] again
    # (and, rnn, the recurrence [2r + D, 3r]), and the target's LM head runs on all 3 rows
    for kind, own in (("vanilla", 0), ("rnn", (2 * 8 + 64) * 3 * 8)):
        costs = {c.name: c for c in DSPARK.draft_costs(_dspark(kind), T1, 4, S)}
        assert costs["Markov head"].weights == 3 * (8 * 256 + own) * 2
        assert costs["drafter LM head"].flops == 2 * 3 * 64 * 256
