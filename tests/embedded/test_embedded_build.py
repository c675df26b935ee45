"""The embedded model's build pipeline on tiny inputs: corpus + tokenizer, pretraining with
exact resume, export to a Hugging Face directory that transformers loads."""

import json
import os

import jax
import numpy as np
import pytest

from dflash_jax.embedded import corpus
from dflash_jax.embedded.pretrain import PretrainConfig, Pretrainer, export_target

# one pytest-xdist worker runs the whole module: its module fixtures run the build recipe once
pytestmark = [pytest.mark.xdist_group("test_embedded_build"), pytest.mark.torch, pytest.mark.slow]

MODULE = '''"""A module."""


def add(a, b):
    """Return a + b."""
    c = a + b
    return c


def _private(x):
    """Hidden."""
    y = x
    return y
'''


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    lib = root / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "test").mkdir()
    (lib / "a.py").write_text(MODULE)
    (lib / "pkg" / "copy_of_a.py").write_text(MODULE)  # byte-identical: kept once
    (lib / "pkg" / "b.py").write_text("import os\n\nVALUE = os.sep * 3\n" * 20)
    (lib / "test" / "test_x.py").write_text("SHOULD_NOT_APPEAR = 1\n")
    data = root / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "mbpp").mkdir()
    with open(data / "gsm8k" / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"question": f"Tom has {i} apples and buys {i + 2}. How many?",
                                "answer": f"He has {i}+{i + 2}=<<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}.\n#### {2 * i + 2}"}) + "\n")
    mbpp = [{"task_id": t, "prompt": f"Write a function number {t}.", "code": f"def f{t}():\n  return {t}"}
            for t in (5, 50, 600, 700)]
    (data / "mbpp" / "sanitized-mbpp.json").write_text(json.dumps(mbpp))
    return str(lib), str(data)


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    lib, data = sources
    out = tmp_path_factory.mktemp("corpus")
    meta = corpus.build_corpus(str(out), data, vocab_size=300, seq_len=32, stdlib_root=lib)
    return str(out), meta


def test_sources_exclude_tests_duplicates_and_test_splits(sources):
    lib, data = sources
    files = corpus.stdlib_files(lib)
    assert [p for p, _ in files] == ["a.py", os.path.join("pkg", "b.py")]
    assert list(corpus.function_examples(files))[0][0] == 'def add(a, b):\n    """Return a + b."""'
    ids = [u for u, _ in corpus.mbpp_train(data)]
    assert ids == ["Write a function number 5.", "Write a function number 600.", "Write a function number 700."]
    prompts = corpus.training_prompts(data, 20, seed=0, stdlib_root=lib)
    assert len(prompts) == 20 and prompts == corpus.training_prompts(data, 20, seed=0, stdlib_root=lib)
    assert not any("number 50." in p for p in prompts)


def test_corpus_and_tokenizer(built, sources):
    from transformers import AutoTokenizer

    out, meta = built
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    assert len(tok) == meta["vocab_size"] == 300
    assert tok.eos_token == "<|endoftext|>" and tok.mask_token == "<|mask|>"
    assert tok.convert_tokens_to_ids("<|mask|>") != tok.eos_token_id
    text = "def add(a, b):\n    return a + b  # ünïcode"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|user|>\nhi\n<|assistant|>\n"
    train = np.load(os.path.join(out, "train.npy"))
    assert train.dtype == np.uint16 and train.shape[1] == 32 and train.max() < 300
    assert meta["train"]["tokens_by_source"]["gsm8k_train"] > 0
    # deterministic: a second build is identical
    lib, data = sources
    out2 = os.path.join(out, "again")
    corpus.build_corpus(out2, data, vocab_size=300, seq_len=32, stdlib_root=lib)
    assert np.array_equal(np.load(os.path.join(out2, "train.npy")), train)


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k/train.jsonl not found.*--data-dir"):
        corpus.build_documents(str(tmp_path))


def test_pretrain_learns_resumes_exactly_and_exports(built, tmp_path):
    from dflash_jax import load_target

    out, _ = built
    cfg = PretrainConfig(steps=12, batch_size=4, learning_rate=3e-3, checkpoint_every=4, eval_every=6,
                         eval_rows=16)
    full = Pretrainer(out, str(tmp_path / "a"), "tiny", cfg).run()
    pre = Pretrainer(out, str(tmp_path / "b"), "tiny", cfg)
    pre.run(stop_after=5)  # stops at step 5; step 4 is the last checkpoint
    resumed = Pretrainer(out, str(tmp_path / "b"), "tiny", cfg).run()
    assert int(resumed["step"]) == 12
    for x, y in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["loss"] < rows[0]["loss"] and "heldout_loss" in rows[5]
    with pytest.raises(ValueError, match="other settings"):
        Pretrainer(out, str(tmp_path / "b"), "tiny", PretrainConfig(steps=13))

    facts = export_target(str(tmp_path / "b"), out, str(tmp_path / "hf"), dtype=np.float32)
    assert facts["steps"] == 12 and facts["tokens_seen"] == 12 * 4 * 32
    target = load_target(tmp_path / "hf")
    assert target.tokenizer is not None and target.tokenizer.mask_token == "<|mask|>"
    assert_transformers_computes_the_same(target, tmp_path / "hf")


def assert_transformers_computes_the_same(target, hf_dir):
    """transformers' model of the exported directory gives our target's logits on a few tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_jax.targets import target_forward

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    ids = np.array([[3, 50, 7, 120, 9, 33]])
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours, _, _ = target_forward(target.config, target.params, ids, np.arange(6)[None])
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=1e-4)


def test_the_hybrid_preset_pretrains_and_exports_what_transformers_loads(built, tmp_path):
    """``--preset hybrid-cpu`` (a Qwen3.5-shaped target: three Gated DeltaNet layers, one gated
    attention layer) trains in the same loop and exports a ``qwen3_5_text`` directory that
    transformers loads as the same model (its GDN channels regrouped on reading, restored on
    writing)."""
    from dflash_jax import load_target

    out, _ = built
    cfg = PretrainConfig(steps=2, batch_size=2, learning_rate=3e-3, checkpoint_every=2, eval_every=0, eval_rows=4)
    Pretrainer(out, str(tmp_path / "h"), "hybrid-cpu", cfg).run()
    export_target(str(tmp_path / "h"), out, str(tmp_path / "hf"), dtype=np.float32)
    target = load_target(tmp_path / "hf")
    assert target.config.model_type == "qwen3_5_text" and target.config.gdn_layers == (0, 1, 2)
    assert_transformers_computes_the_same(target, tmp_path / "hf")


def test_finetune_corpus_and_pretrain_init_from(built, sources, tmp_path):
    """A corpus of one source tokenized with an existing target's tokenizer, and a run that
    starts from that target's weights (``pretrain --init-from``): its step 0 is the target
    itself, its steps lower the held-out loss, and its export loads as a target."""
    from dflash_jax import load_target

    out, _ = built
    lib, data = sources
    base = Pretrainer(out, str(tmp_path / "base"), "tiny", PretrainConfig(steps=4, batch_size=4,
                                                                          checkpoint_every=4, eval_every=0))
    base.run()
    export_target(str(tmp_path / "base"), out, str(tmp_path / "base-hf"), dtype=np.float32)
    with pytest.raises(ValueError, match="unknown corpus source.*'gsm8k'.*choose from"):
        corpus.build_corpus(str(tmp_path / "bad"), data, sources=["gsm8k"], tokenizer_dir=str(tmp_path / "base-hf"))
    ft = str(tmp_path / "ft-corpus")
    meta = corpus.build_corpus(ft, data, seq_len=32, stdlib_root=lib, sources=["gsm8k_train"],
                               tokenizer_dir=str(tmp_path / "base-hf"))
    assert meta["sources"] == ["gsm8k_train"] and list(meta["train"]["tokens_by_source"]) == ["gsm8k_train"]
    assert meta["vocab_size"] == 300 and "stdlib" not in meta
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(ft, "tokenizer"))
    assert "apples" in tok.decode(np.load(os.path.join(ft, "train.npy"))[0].tolist())
    # the corpus built with its own trained tokenizer is refused, before the run directory is written
    with pytest.raises(ValueError, match="another tokenizer.*build-corpus --tokenizer"):
        _refuse_other_tokenizer(data, lib, tmp_path, str(tmp_path / "base-hf"))
    assert not os.path.exists(tmp_path / "refused" / "run.json")

    cfg = PretrainConfig(steps=6, batch_size=4, learning_rate=3e-3, checkpoint_every=3, eval_every=0)
    pre = Pretrainer(ft, str(tmp_path / "ft"), "tiny", cfg, init_from=str(tmp_path / "base-hf"))
    start = pre.restore_or_init()
    target = load_target(tmp_path / "base-hf")
    for (kx, x), (ky, y) in zip(jax.tree_util.tree_leaves_with_path(start["params"]),
                                jax.tree_util.tree_leaves_with_path(target.params)):
        assert kx == ky
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    before = pre.heldout_loss(start["params"])
    done = pre.run()
    assert pre.heldout_loss(done["params"]) < before
    assert json.load(open(tmp_path / "ft" / "start_eval.json"))["heldout_loss"] == pytest.approx(before, rel=1e-6)
    assert json.load(open(tmp_path / "ft" / "run.json"))["init_from"] == str(tmp_path / "base-hf")
    with pytest.raises(ValueError, match="other settings"):
        Pretrainer(ft, str(tmp_path / "ft"), "tiny", cfg)  # the same run, from random weights
    facts = export_target(str(tmp_path / "ft"), ft, str(tmp_path / "ft-hf"), dtype=np.float32)
    assert facts["init_from"] == str(tmp_path / "base-hf") and facts["steps"] == 6
    assert facts["start_heldout_loss"] == round(before, 4) and facts["heldout_loss"] < before
    tuned = load_target(tmp_path / "ft-hf")
    for x, y in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(done["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # a released block-FP8 target starts the run dequantized to float32 (its weights are trained)
    from dflash_jax.tools import fp8_checkpoint

    fp8_checkpoint.main([str(tmp_path / "base-hf"), str(tmp_path / "base-fp8"), "--block", "16", "16"])
    fp8 = Pretrainer(ft, str(tmp_path / "ft8"), "tiny", cfg, init_from=str(tmp_path / "base-fp8"))
    want = load_target(tmp_path / "base-fp8", quantize="none").params
    for x, y in zip(jax.tree.leaves(fp8.restore_or_init()["params"]), jax.tree.leaves(want)):
        assert x.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _refuse_other_tokenizer(data, lib, tmp_path, target_dir):
    other = str(tmp_path / "other-corpus")
    corpus.build_corpus(other, data, vocab_size=280, seq_len=32, stdlib_root=lib, sources=["gsm8k_train"])
    Pretrainer(other, str(tmp_path / "refused"), "tiny", PretrainConfig(), init_from=target_dir)


# ---------------------------------------------------------------------------- build-embedded
def _tree_digest(root):
    """{relative path: sha256} of every file under root."""
    import hashlib

    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


class FakeStages:
    """Stands in for the pipeline's subprocess runner (`build._run`): the expensive stages
    (corpus, pretraining, regeneration, drafter training) write placeholders, the exports copy
    the shipped pair, and `bench` runs for real, in process, on the exported pair."""

    def __init__(self, fail_at=None, real_bench=True):
        self.calls, self.fail_at, self.real_bench = [], fail_at, real_bench

    def __call__(self, args, cwd):
        import shutil
        import subprocess

        from dflash_jax.bench import harness
        from dflash_jax.models.handles import EMBEDDED_DRAFTER_DIR, EMBEDDED_TARGET_DIR

        cmd = args[0]
        self.calls.append(cmd)
        if cmd == self.fail_at:
            raise subprocess.CalledProcessError(1, ["python", "-m", "dflash_jax", *args])
        opt = {args[i]: os.path.join(cwd, args[i + 1]) for i in range(1, len(args) - 1) if args[i].startswith("--")}
        if cmd == "build-corpus":
            os.makedirs(opt["--out"])
            open(os.path.join(opt["--out"], "corpus.json"), "w").write("{}")
        elif cmd in ("pretrain", "train-data"):
            os.makedirs(opt.get("--run") or opt["--out"], exist_ok=True)
        elif cmd == "train":
            os.makedirs(opt["--run"], exist_ok=True)
            open(os.path.join(opt["--run"], "metrics.jsonl"), "w").write('{"step": 1}\n')
        elif cmd == "embedded-prompts":
            open(opt["--out"], "w").write('{"prompt": "hi"}\n')
        elif cmd in ("export-target", "export"):
            shutil.rmtree(opt["--out"], ignore_errors=True)
            shutil.copytree(EMBEDDED_TARGET_DIR if cmd == "export-target" else EMBEDDED_DRAFTER_DIR, opt["--out"])
        elif cmd == "bench" and not self.real_bench:
            pass
        elif cmd == "bench":
            here = os.getcwd()
            os.chdir(cwd)
            try:
                harness.main(args[1:])
            finally:
                os.chdir(here)
        else:
            raise AssertionError(f"unexpected stage {cmd}")


# small enough for the test data (43 prompts) and a bench of seconds (the fixed block only: the
# card's adaptive rows are the shipped card's, tests/embedded/test_model_cards.py)
FAST_ARGS = ["--num-prompts", "40", "--bench-args",
             "--datasets gsm8k --max-samples 1 --max-new-tokens 4 --no-adaptive"]


@pytest.fixture
def fake_stages(monkeypatch, tmp_path_factory):
    """Installs FakeStages as the stage runner; the build's idea of the package's assets
    directory points to a scratch copy, so that no bug under test can touch the real one."""
    from dflash_jax.embedded import build

    scratch = tmp_path_factory.mktemp("package") / "assets"
    (scratch / "target").mkdir(parents=True)
    monkeypatch.setattr(build, "PACKAGE_ASSETS", str(scratch))

    def install(fail_at=None, real_bench=True):
        stages = FakeStages(fail_at, real_bench)
        monkeypatch.setattr(build, "_run", stages)
        return stages

    return install


def test_build_embedded_installs_into_the_work_dir_never_the_package(tmp_path, sources, fake_stages):
    from dflash_jax.embedded import build
    from dflash_jax.models.handles import ASSETS_DIR as real_package_assets
    from dflash_jax.models.handles import load_drafter, load_target

    _, data = sources
    package_before = _tree_digest(real_package_assets)
    stages = fake_stages()
    work = str(tmp_path / "work")
    build.main(["--work", work, "--data-dir", data, *FAST_ARGS])
    assert stages.calls == ["build-corpus", "pretrain", "export-target", "embedded-prompts", "train-data",
                            "train", "export", "bench"]
    assert _tree_digest(real_package_assets) == package_before
    assert os.listdir(build.PACKAGE_ASSETS) == ["target"]
    assets = os.path.join(work, "assets")
    target = load_target(os.path.join(assets, "target"))
    load_drafter(os.path.join(assets, "drafter"), target)  # a matching pair, with its cards
    for d in ("target", "drafter"):
        card = open(os.path.join(assets, d, "README.md")).read()
        assert str(tmp_path) not in card and "/root/" not in card
    recipe = json.load(open(os.path.join(assets, "drafter", "recipe.json")))
    assert recipe["commands"].startswith("`python -m dflash_jax build-embedded --work")
    assert [n for n in os.listdir(work) if n.startswith(".")] == []  # no staging leftovers
    # an existing assets directory is replaced only when asked, and the refusal comes first
    stages.calls.clear()
    with pytest.raises(ValueError, match="exists and is not empty: pass --overwrite"):
        build.main(["--work", work, "--data-dir", data, *FAST_ARGS])
    assert stages.calls == []
    build.main(["--work", work, "--data-dir", data, "--overwrite", *FAST_ARGS])
    assert stages.calls[-1] == "bench"


@pytest.mark.parametrize("stage", ["train", "export", "bench"])
def test_a_failed_stage_leaves_the_installed_pair_as_it_was(tmp_path, sources, fake_stages, stage):
    import subprocess

    from dflash_jax.embedded import build

    _, data = sources
    assets = tmp_path / "assets"
    (assets / "target").mkdir(parents=True)
    (assets / "target" / "config.json").write_text('{"old": true}')
    before = _tree_digest(assets)
    fake_stages(fail_at=stage)
    with pytest.raises(subprocess.CalledProcessError):
        build.main(["--work", str(tmp_path / "work"), "--assets", str(assets), "--overwrite",
                    "--data-dir", data, *FAST_ARGS])
    assert _tree_digest(assets) == before
    assert sorted(os.listdir(tmp_path)) == ["assets", "work"]


def test_install_keeps_the_old_pair_when_copying_the_new_one_fails(tmp_path, monkeypatch):
    import shutil

    from dflash_jax.embedded import build

    staged, assets = tmp_path / "staged", tmp_path / "assets"
    for d, text in ((staged, "new"), (assets, "old")):
        (d / "target").mkdir(parents=True)
        (d / "target" / "w").write_text(text)
    real = shutil.copytree

    def copy_half(src, dst, **kw):
        os.makedirs(dst)
        open(os.path.join(dst, "partial"), "w").close()
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copytree", copy_half)
    with pytest.raises(OSError, match="disk full"):
        build.install(str(staged), str(assets))
    assert (assets / "target" / "w").read_text() == "old" and not (assets / "partial").exists()
    monkeypatch.setattr(shutil, "copytree", real)
    build.install(str(staged), str(assets))
    assert (assets / "target" / "w").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["assets", "staged"]


@pytest.mark.parametrize("argv,match", [
    (["--taps", "1", "4"], "taps must be distinct layer ids in 0..3"),
    (["--num-prompts", "16"], "--num-prompts 16 is too few"),
    (["--drafter-steps", "0"], "--drafter-steps must be >= 1"),
    (["--assets", "PACKAGE"], "is the package's shipped embedded default: pass --into-package"),
    (["--into-package", "--assets", "elsewhere"], "leave --assets unset"),
    (["--data-dir", "MISSING"], r"gsm8k/train.jsonl.*not found.*github.com/openai/grade-school-math"),
    (["--taps", "1", "1"], "taps must be distinct"),
    (["--num-prompts", "16"], "cannot hold out 16 of 16 sequences"),  # the trainer's own check
    (["--num-prompts", "23"], "7 sequences are left to train on, fewer than --drafter-batch 8.*--num-prompts 24"),
    (["--max-new-tokens", "512"], "--max-new-tokens 512"),
    (["--drafter-lr", "0"], "--drafter-lr must be > 0"),
    (["--bench-args", "--out elsewhere"], "leave out --out"),
    (["--bench-args", "--targ x"], "leave out --target"),  # an abbreviation too
    (["--bench-args=--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--bench-args", "--max-samples many"], "invalid int value"),
    (["--bench-args=--help"], "asks for help"),
    (["--bench-args", "'unclosed"], "No closing quotation"),
])
def test_bad_settings_are_refused_before_any_stage_runs(tmp_path, sources, fake_stages, argv, match):
    from dflash_jax.embedded import build

    _, data = sources
    argv = [build.PACKAGE_ASSETS if a == "PACKAGE" else str(tmp_path / "none") if a == "MISSING" else a
            for a in argv]
    if "--data-dir" not in argv:
        argv += ["--data-dir", data]
    stages = fake_stages()
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        build.main(["--work", str(tmp_path / "work"), *argv])
    assert stages.calls == [] and not (tmp_path / "work").exists()


GSM8K_DOWNLOAD = ("github.com/openai/grade-school-math", "grade_school_math/data/train.jsonl",
                  "openai/gsm8k, config main, split train")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer load in this process fails the test (the data check comes first)."""
    from dflash_jax.embedded.cli import embedded_prompts
    from dflash_jax.models import handles

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the training data was checked")

    monkeypatch.setattr(handles, "load_target", loaded)
    monkeypatch.setattr(embedded_prompts, "drop_long", loaded)  # embedded-prompts' tokenizer


def test_training_data_commands_say_where_to_get_the_data(tmp_path, monkeypatch, capsys, no_model_loads):
    """A missing GSM8K train is one line naming the file, what to download and the path to put
    it at (under --data-dir, $DFLASH_DATA_DIR or the default), before anything is loaded or
    written; MBPP ships with the package and is never asked for."""
    from dflash_jax.__main__ import main

    monkeypatch.setenv("DFLASH_JAX_HOME", str(tmp_path / "home"))
    for env, given, where in ((None, "none", tmp_path / "none"), ("env", None, tmp_path / "env"),
                              (None, None, tmp_path / "home" / "datasets")):
        if env:
            monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / env))
        else:
            monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
        for cmd in (["build-corpus", "--out", str(tmp_path / "c")],
                    ["embedded-prompts", "--out", str(tmp_path / "p"), "--max-prompt-tokens", "10"]):
            with pytest.raises(SystemExit) as e:
                main(cmd + (["--data-dir", str(tmp_path / given)] if given else []))
            err = capsys.readouterr().err
            assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
            path = str(where / "gsm8k" / "train.jsonl")
            assert err.startswith(f"error: {path} not found") and f"to {path} " in err, err
            assert all(x in err for x in GSM8K_DOWNLOAD) and "mbpp" not in err.lower(), err
    assert os.listdir(tmp_path) == []  # nothing written



def test_the_shipped_package_assets_are_never_a_destination_by_accident(tmp_path, sources, monkeypatch):
    """Not patched here: the build's idea of the package directory is the real one, and every
    way of pointing --assets at it (or around it) is refused before any stage runs."""
    from dflash_jax.models.handles import ASSETS_DIR
    from dflash_jax.embedded import build

    _, data = sources
    assert build.PACKAGE_ASSETS == ASSETS_DIR
    before = _tree_digest(ASSETS_DIR)
    calls = []
    monkeypatch.setattr(build, "_run", lambda args, cwd: calls.append(args))
    work = str(tmp_path / "work")
    for assets, match in ((ASSETS_DIR, "shipped embedded default: pass --into-package"),
                          (os.path.join(ASSETS_DIR, "target"), "overlaps the package's shipped"),
                          (os.path.dirname(ASSETS_DIR), "overlaps the package's shipped"),
                          (os.path.relpath(ASSETS_DIR), "shipped embedded default")):
        for extra in ([], ["--overwrite"]):
            with pytest.raises(ValueError, match=match):
                build.main(["--work", work, "--assets", assets, "--data-dir", data, *extra, *FAST_ARGS])
    # the default destination is WORK/assets, whatever the current directory
    monkeypatch.chdir(os.path.dirname(ASSETS_DIR))
    a = build.parser().parse_args([])
    assert not a.into_package and a.assets is None and a.work == os.path.join("runs", "embedded")
    assert calls == [] and not os.path.exists(work) and _tree_digest(ASSETS_DIR) == before


def test_the_destination_may_not_swallow_the_work_directory(tmp_path, sources, fake_stages):
    from dflash_jax.embedded import build

    _, data = sources
    work = tmp_path / "work"
    (work / "export").mkdir(parents=True)
    stages = fake_stages()
    for assets, match in ((work, "would replace the work directory"),
                          (tmp_path, "would replace the work directory"),
                          (work / "export" / "pair", "inside the stage output"),
                          (work / "corpus", "inside the stage output")):
        with pytest.raises(ValueError, match=match):
            build.main(["--work", str(work), "--assets", str(assets), "--overwrite", "--data-dir", data,
                        *FAST_ARGS])
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        build.main(["--work", str(work), "--assets", str(tmp_path / "a-file"), "--overwrite",
                    "--data-dir", data, *FAST_ARGS])
    assert stages.calls == [] and os.listdir(work) == ["export"]


def test_a_work_directory_resumes_only_with_its_settings(tmp_path, sources, fake_stages):
    from dflash_jax.embedded import build

    _, data = sources
    work = tmp_path / "work"
    work.mkdir()
    first = build.parser().parse_args(["--work", str(work), *FAST_ARGS])
    (work / build.SETTINGS).write_text(json.dumps(build.recipe_settings(first)))
    stages = fake_stages()
    with pytest.raises(ValueError, match=r"other settings: --taps 1 2 3 \(now 1 2\), "
                                         r"--drafter-steps 2200 \(now 3000\); rerun with those"):
        build.main(["--work", str(work), "--data-dir", data, "--drafter-steps", "3000", "--taps", "1", "2",
                    *FAST_ARGS])
    assert stages.calls == [] and os.listdir(work) == [build.SETTINGS]


def test_num_prompts_is_checked_against_the_training_data(tmp_path, sources, fake_stages, monkeypatch):
    from dflash_jax.embedded import build

    lib, data = sources
    real = corpus.stdlib_files
    monkeypatch.setattr(corpus, "stdlib_files", lambda root=None: real(root or lib))  # 1 function
    monkeypatch.setattr(corpus, "SYNTHETIC_SIZE", 10)  # 40 gsm8k + 10 math + 1 function + 3 mbpp + 10 chat
    for n in (10, 63, 64, 100):  # the same count as the stage that draws them
        assert build.available_prompts(data, n) == len(corpus.training_prompts(data, n)) == min(n, 64)
    stages = fake_stages()
    with pytest.raises(ValueError, match=r"--num-prompts 100: the training data .* give only 64 prompts"):
        build.main(["--work", str(tmp_path / "work"), "--data-dir", data, "--num-prompts", "100"])
    assert stages.calls == [] and not (tmp_path / "work").exists()
    # the stage itself refuses to write fewer prompts than asked for
    from dflash_jax.embedded.cli import training_prompts

    with pytest.raises(ValueError, match="--num 100: .* give only 64 prompts"):
        training_prompts(["--out", str(tmp_path / "p.jsonl"), "--num", "100", "--data-dir", data])
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("old_pair", [True, False])
def test_a_failure_after_the_last_stage_installs_nothing(tmp_path, sources, fake_stages, monkeypatch, old_pair):
    """The model cards are the last step before the install: when they fail, the destination
    holds the old complete pair, or nothing at all."""
    from dflash_jax.embedded import build, cards

    _, data = sources
    assets = tmp_path / "assets"
    if old_pair:
        for d in ("target", "drafter"):
            (assets / d).mkdir(parents=True)
            (assets / d / "config.json").write_text(f'{{"old": "{d}"}}')
    before = _tree_digest(assets) if old_pair else None

    def broken(*args):
        raise OSError("cards: disk full")

    monkeypatch.setattr(cards, "write_cards", broken)
    stages = fake_stages(real_bench=False)
    with pytest.raises(OSError, match="disk full"):
        build.main(["--work", str(tmp_path / "work"), "--assets", str(assets), "--overwrite",
                    "--data-dir", data, *FAST_ARGS])
    assert stages.calls[-1] == "bench"  # every stage ran
    if old_pair:
        assert _tree_digest(assets) == before
    else:
        assert not assets.exists()
    assert sorted(os.listdir(tmp_path)) == (["assets", "work"] if old_pair else ["work"])


def test_the_recorded_rebuild_command_is_portable(tmp_path):
    from dflash_jax.embedded import build

    p = build.parser()
    a = p.parse_args(["--work", str(tmp_path / "w"), "--ass", str(tmp_path / "a"), "--data", "/data/x",
                      "--overwrite", "--into-package", "--drafter-st", "300", "--taps", "0", "2",
                      "--bench-args", "--datasets gsm8k --data-dir /srv/data"])
    cmd = build.portable_command(a, p)
    assert cmd == ("`python -m dflash_jax build-embedded --work WORK --assets ASSETS --into-package "
                   "--data-dir DATA_DIR --taps 0 2 --drafter-steps 300 "
                   "--bench-args '--datasets gsm8k --data-dir PATH'`")
    a = p.parse_args(["--work", "runs/e", "--data-dir", "../datasets"])  # relative: as given
    assert build.portable_command(a, p) == ("`python -m dflash_jax build-embedded --work runs/e "
                                            "--data-dir ../datasets`")
    assert build.portable_command(p.parse_args([]), p) == "`python -m dflash_jax build-embedded`"


def test_shipped_cards_record_no_machine_paths():
    import re

    from dflash_jax.models.handles import ASSETS_DIR

    for name in ("target/README.md", "target/training.json", "drafter/README.md", "drafter/recipe.json"):
        text = open(os.path.join(ASSETS_DIR, name)).read()
        assert not re.search(r"(^|[\s`'\"(=])/(root|home|work|tmp|usr|opt|mnt|srv|Users)\b", text), name


def test_build_embedded_without_any_data_says_what_to_get(tmp_path, monkeypatch, capsys, fake_stages,
                                                         no_model_loads):
    """A user's clone with nothing placed: the build stops before any stage (the stages load and
    compile the models) with one line naming the missing file, the download and its destination
    under the project's home."""
    from dflash_jax.__main__ import main

    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    monkeypatch.setenv("DFLASH_JAX_HOME", str(tmp_path / "home"))
    stages = fake_stages()
    with pytest.raises(SystemExit) as e:
        main(["build-embedded", "--work", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    destination = str(tmp_path / "home" / "datasets" / "gsm8k" / "train.jsonl")
    for needed in (f"{destination} not found", f"to {destination} ", "$DFLASH_JAX_HOME", "--data-dir DIR",
                   "$DFLASH_DATA_DIR", *GSM8K_DOWNLOAD):
        assert needed in err, needed
    assert stages.calls == [] and not (tmp_path / "w").exists() and not (tmp_path / "home").exists()


def test_the_default_data_directory_is_under_the_project_home(tmp_path, sources, fake_stages, monkeypatch):
    """$DFLASH_DATA_DIR unset: the recipes read HOME/datasets ($DFLASH_JAX_HOME), nothing beside
    the checkout; MBPP sanitized, absent there, is the package's copy."""
    import shutil

    from dflash_jax import datasets
    from dflash_jax.bench.prompt_sets import shipped_data_dir
    from dflash_jax.embedded import build
    from dflash_jax.embedded.cli import training_prompts

    lib, data = sources
    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    monkeypatch.setenv("DFLASH_JAX_HOME", str(tmp_path / "home"))
    home_data = str(tmp_path / "home" / "datasets")
    shutil.copytree(os.path.join(data, "gsm8k"), os.path.join(home_data, "gsm8k"))
    assert datasets.default_data_dir() == home_data == corpus.check_training_data(None)
    assert corpus.training_file(home_data, corpus.GSM8K_TRAIN) == os.path.join(home_data, "gsm8k", "train.jsonl")
    assert corpus.training_file(home_data, corpus.MBPP_SANITIZED) == \
        os.path.join(shipped_data_dir(), "mbpp", "sanitized-mbpp.json")
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "elsewhere"))  # the variable comes first
    assert datasets.default_data_dir() == str(tmp_path / "elsewhere")
    monkeypatch.delenv("DFLASH_DATA_DIR")
    # embedded-prompts draws GSM8K's questions from there
    rows = training_prompts(["--out", str(tmp_path / "p.jsonl"), "--num", "5", "--styles", "gsm8k"])
    assert len(rows) == 5 and all("apples" in r for r in rows)
    # build-embedded checks it and hands it to its stages
    real = corpus.stdlib_files
    monkeypatch.setattr(corpus, "stdlib_files", lambda root=None: real(root or lib))
    monkeypatch.setattr(corpus, "SYNTHETIC_SIZE", 10)
    stages, given = fake_stages(), {}

    def run(args, cwd):
        given[args[0]] = args
        if args[0] == "train-data":  # the stages that read the data have run
            raise KeyboardInterrupt
        stages(args, cwd)

    monkeypatch.setattr(build, "_run", run)
    with pytest.raises(KeyboardInterrupt):
        build.main(["--work", str(tmp_path / "w"), *FAST_ARGS])
    assert given["build-corpus"][-2:] == given["embedded-prompts"][-2:] == ["--data-dir", home_data]


def test_the_held_out_split_check_is_the_trainers(tmp_path):
    """build-embedded checks --num-prompts with the function TokenDataset.hold_out itself calls."""
    from dflash_jax.training.data import TokenDataset, check_hold_out

    np.savez(tmp_path / "shard-00000.npz", tokens=np.ones((3, 4), np.int32),
             loss_mask=np.array([[0, 1, 1, 0]] * 3, bool), lengths=np.full(3, 3, np.int32))
    for n in (3, 4, -1):
        with pytest.raises(ValueError, match=f"^cannot hold out {n} of 3 sequences$"):
            check_hold_out(n, 3)
        with pytest.raises(ValueError, match=f"^cannot hold out {n} of 3 sequences$"):
            TokenDataset(str(tmp_path)).hold_out(n)
    data = TokenDataset(str(tmp_path))
    assert data.hold_out(2) == [[1], [1]] and len(data) == 1
