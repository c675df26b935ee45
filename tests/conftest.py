"""Shared fixtures: tiny Hugging Face checkpoints made by transformers with random weights."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the whole run, this process and the command-line
# subprocesses it starts (they inherit the environment): the same engine programs are compiled
# by many test modules (each module ends with jax.clear_caches(), below) and by every `python -m
# dflash_jax ...` the tests run. Entries are keyed by the program and the jax/XLA version, so a
# hit is the same executable; a fresh directory per run keeps runs independent.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflash-jax-tests-xla-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


# The adaptive block size's measured cost tables (dflash_jax.decoding.adaptive) go to a fresh
# directory per run too, not to the user's ~/.cache.
_OWN_COSTS = None
if "DFLASH_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_COSTS = os.environ["DFLASH_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflash-jax-tests-costs-")


def pytest_unconfigure(config):
    import shutil

    for own in (_OWN_CACHE, _OWN_COSTS):
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)

import pytest

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
             max_position_embeddings=256, initializer_range=0.08)


def make_hf_model(kind: str, **overrides):
    """A transformers model with random weights (fp32, eager attention)."""
    import torch  # imported here: the torch-free tests run without it (.ci/newest-jax)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(overrides.pop("seed", 0))
    kw = {**SMALL, **overrides}
    if kind == "qwen3":
        cfg, cls = Qwen3Config(**kw), Qwen3ForCausalLM
    elif kind == "llama":
        kw.setdefault("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                                       "rope_theta": 500000.0})
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    # norms are initialised to ones by transformers; randomise them so norm weights are tested
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


# (name, kind, overrides): the parity grid of the foundation issue
HF_VARIANTS = {
    "qwen3": ("qwen3", {}),
    "qwen3-tied-bias": ("qwen3", {"tie_word_embeddings": True, "attention_bias": True}),
    "llama3-untied": ("llama", {"tie_word_embeddings": False}),
    "llama3-tied": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
}


@pytest.fixture(scope="session", params=sorted(HF_VARIANTS))
def hf_checkpoint(request, tmp_path_factory):
    """(name, torch model, checkpoint directory) for each variant of the parity grid."""
    kind, overrides = HF_VARIANTS[request.param]
    model = make_hf_model(kind, **overrides)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, str(path)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jit caches after each test module. A full run compiles hundreds of programs (the
    Pallas interpreter's are large); keeping them all made XLA's CPU compiler crash late in the
    suite (segfault while compiling, never in a module run alone)."""
    yield
    import jax

    jax.clear_caches()


# A chat template with Qwen3's thinking switch, written like Qwen3's own generation prompt: with
# ``enable_thinking`` false the assistant header is followed by an empty think block; with it
# true or unset (Qwen3's default: thinking) by nothing.
QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}")
QWEN3_ASSISTANT = "<|im_start|>assistant\n"  # the prompt's end with thinking on
QWEN3_NO_THINK = QWEN3_ASSISTANT + "<think>\n\n</think>\n\n"  # and with thinking off


def save_chat_target(root, chat_template: str, drafter: bool = True):
    """A tiny random Qwen3 target with the embedded model's tokenizer and ``chat_template``,
    saved in ``root/target`` (and a random 1-layer block-4 drafter in ``root/drafter``).
    Returns (target dir, drafter dir or None)."""
    import dflash_jax as dj
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dj.EMBEDDED_TARGET_DIR)
    tok.chat_template = chat_template
    cfg = dj.TargetConfig("qwen3", vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=1024,
                          eos_token_id=(tok.eos_token_id,))
    target = dj.Target.random(cfg, seed=0, init_scale=0.3)
    target.tokenizer = tok
    target.save(os.path.join(root, "target"))
    if not drafter:
        return os.path.join(root, "target"), None
    dj.save_drafter(dj.Drafter.random(target, num_layers=1, block_size=4, seed=1), os.path.join(root, "drafter"))
    return os.path.join(root, "target"), os.path.join(root, "drafter")


@pytest.fixture(scope="session")
def paper_all(tmp_path_factory):
    """``python -m experiments.paper all --preset smoke`` (every table, figure and ablation, real
    training and evaluation) into one directory: (root, work, results by item and ablation);
    ``root/paper`` and ``root/ablations/<name>`` hold the outputs, ``work`` the shared data,
    drafters, cells and measurements. Session scope: tests/test_experiments.py and
    tests/test_paper.py share it on one xdist worker (their xdist_group)."""
    from dflash_jax.experiments import paper

    # pytest-xdist tears session fixtures down whenever a worker's queue runs dry and builds them
    # again for its next test (the last CI built this one twice, 410 + 497 s): the run is kept for
    # the life of the process, its directory outlives the teardown
    # Should a second xdist worker need it anyway (seen in CI: the groups of test_paper.py and
    # test_experiments.py did not keep it on one worker), the workers share one directory under
    # the run's base temp: the second waits for the first's run, then runs it again from the
    # cached data, drafters, cells and measurements (the resume path, minutes instead of 15).
    if "run" not in _PAPER_ALL:
        from dflash_jax.files import exclusive

        if os.environ.get("PYTEST_XDIST_WORKER"):
            root = tmp_path_factory.getbasetemp().parent / "experiments-shared"
            root.mkdir(exist_ok=True)
        else:
            root = tmp_path_factory.mktemp("experiments")
        work = str(root / "work")
        with exclusive(str(root / "build.lock")):
            results = paper.run("all", "smoke", out=str(root / "paper"), work=work,
                                ablations_out=str(root / "ablations"))
        _PAPER_ALL["run"] = (root, work, results)
    return _PAPER_ALL["run"]


_PAPER_ALL: dict = {}


@pytest.fixture(scope="session")
def smoke(paper_all):
    """(root, work, the depth ablation's Table, the block-size ablation's Table) of ``paper_all``."""
    root, work, results = paper_all
    return root, work, results["ablate_depth"], results["ablate_block_size"]
