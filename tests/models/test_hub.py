"""Checkpoints by name (dflash_jax/hub.py): a Hugging Face repo id resolves through a hub cache
laid out as huggingface_hub writes it (blobs/, refs/, snapshots/<commit>/ of relative symlinks,
trees/<commit>.json), offline; a revision picks its snapshot; a local directory wins over a repo
id of the same spelling; ``embedded`` works from any directory; the errors are one line and say
what was tried. No network: every test runs with HF_HUB_OFFLINE=1 (or refuses before the hub)."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import huggingface_hub
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from huggingface_hub.utils import filter_repo_objects

import dflash_jax as dj
from dflash_jax import hub
from dflash_jax.__main__ import main

TARGET_REPO, DRAFTER_REPO = "acme/tiny-qwen3", "acme/tiny-qwen3-dflash"
COMMIT_A = hashlib.sha1(b"first").hexdigest()
COMMIT_B = hashlib.sha1(b"second").hexdigest()
PROMPT = [306, 376, 13, 21]


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_hub_repo(cache, repo_id: str, commit: str, files: dict[str, bytes], refs=("main",),
                   listed_only: dict[str, int] | None = None):
    """``repo_id`` at ``commit`` in the hub cache ``cache``, laid out as huggingface_hub's
    snapshot_download leaves it: each file's content once under blobs/ (named by its sha256 for
    LFS files, by its git blob id otherwise), snapshots/<commit>/<path> a relative symlink to it,
    refs/<ref> holding the commit, and trees/<commit>.json the repo's file listing.
    ``listed_only``: files the repo has (in the listing) but the download skipped."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    listing = {}
    for name, data in files.items():
        lfs = name.endswith(".safetensors")
        blob = root / "blobs" / (hashlib.sha256(data).hexdigest() if lfs else _git_blob_id(data))
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        listing[name] = {"size": len(data), "blob_id": _git_blob_id(data)}
        if lfs:
            listing[name] |= {"lfs_sha256": blob.name, "lfs_size": len(data)}
    for name, size in (listed_only or {}).items():
        listing[name] = {"size": size, "blob_id": _git_blob_id(name.encode())}
    for ref in refs:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)  # no newline, as the hub writes it
    (root / "trees").mkdir(exist_ok=True)
    (root / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    return root


def _files(directory, names=None) -> dict[str, bytes]:
    return {n: open(os.path.join(directory, n), "rb").read()
            for n in sorted(names or os.listdir(directory)) if os.path.isfile(os.path.join(directory, n))}


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory):
    """HF_HOME with a hub cache holding the embedded pair as two repos (commit A, ref main), a
    second snapshot of the target (commit B, ref v2: a different, tiny random target), and a
    repo of which only config.json was downloaded."""
    home = tmp_path_factory.mktemp("hf_home")
    cache = home / "hub"
    target_files = _files(dj.EMBEDDED_TARGET_DIR, ["config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json", "chat_template.jinja"])
    # what a real repo also holds and resolve_checkpoint does not fetch
    skipped = {"README.md": 1634, "pytorch_model.bin": 33_600_000, "original/consolidated.00.pth": 33_600_000}
    write_hub_repo(cache, TARGET_REPO, COMMIT_A, target_files, listed_only=skipped)
    write_hub_repo(cache, DRAFTER_REPO, COMMIT_A, _files(dj.EMBEDDED_DRAFTER_DIR, ["config.json", "model.safetensors"]),
                   listed_only={"README.md": 7194, "dflash.py": 9000})
    tiny = tmp_path_factory.mktemp("tiny")
    dj.Target.random(dj.TargetConfig(model_type="qwen3", vocab_size=8192, hidden_size=64, intermediate_size=96,
                                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                     max_position_embeddings=256, eos_token_id=(0,))).save(tiny)
    write_hub_repo(cache, TARGET_REPO, COMMIT_B, _files(tiny), refs=("v2",))
    write_hub_repo(cache, "acme/config-only", COMMIT_A, _files(tiny, ["config.json"]),
                   listed_only={"model.safetensors": 1000})
    return home


@pytest.fixture
def offline(hub_home, monkeypatch):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE at the test cache, for this test only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_home / "hub"))
    return hub_home / "hub"


def _snapshot(cache, repo, commit):
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


@pytest.mark.slow
def test_a_repo_id_loads_and_generates_as_the_directory(offline):
    """load_target / load_drafter by repo id give the snapshot's weights, tokenizer and the
    same greedy tokens as the plain directories."""
    target = dj.load_target(TARGET_REPO, dtype=jnp.float32)
    drafter = dj.load_drafter(DRAFTER_REPO, target)
    assert target.path == str(_snapshot(offline, TARGET_REPO, COMMIT_A))
    assert drafter.path == str(_snapshot(offline, DRAFTER_REPO, COMMIT_A))
    plain = dj.load_target(dj.EMBEDDED_TARGET_DIR, dtype=jnp.float32)
    plain_drafter = dj.load_drafter(dj.EMBEDDED_DRAFTER_DIR, plain)
    assert target.config == plain.config and drafter.config == plain_drafter.config
    for a, b in ((target.params, plain.params), (drafter.params, plain_drafter.params)):
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    text = "The cat sat on the mat."
    assert target.tokenizer.encode(text) == plain.tokenizer.encode(text)
    kw = dict(stop_token_ids=target.stop_token_ids, seed=0)
    ours = dj.generate(target, [PROMPT], 8, drafter=drafter, **kw)
    theirs = dj.generate(plain, [PROMPT], 8, drafter=plain_drafter, **kw)
    assert ours.sequences == theirs.sequences and len(ours.sequences[0]) == 8


@pytest.mark.slow
def test_the_command_line_takes_repo_ids(offline, capsys, monkeypatch, tmp_path):
    """`generate --target org/name --drafter org/drafter` (from another working directory)
    prints the tokens the library gives for the plain directories."""
    plain = dj.load_target(dj.EMBEDDED_TARGET_DIR, dtype=jnp.float32)
    expected = dj.generate(plain, [PROMPT], 8, drafter=dj.load_drafter(dj.EMBEDDED_DRAFTER_DIR, plain),
                           stop_token_ids=plain.stop_token_ids, seed=0).sequences[0]
    monkeypatch.chdir(tmp_path)
    for pair in ([TARGET_REPO, DRAFTER_REPO], ["embedded", "embedded"]):
        main(["generate", "--target", pair[0], "--drafter", pair[1], "--token-ids",
              "--prompt", ",".join(map(str, PROMPT)), "--max-new-tokens", "8", "--dtype", "float32"])
        out = capsys.readouterr().out.strip()
        assert out == ",".join(map(str, expected)), (pair, out)


def test_a_revision_picks_its_snapshot(offline):
    v2 = _snapshot(offline, TARGET_REPO, COMMIT_B)
    assert hub.resolve_checkpoint(f"{TARGET_REPO}@v2") == v2
    assert hub.resolve_checkpoint(TARGET_REPO, revision="v2") == v2
    assert hub.resolve_checkpoint(f"{TARGET_REPO}@{COMMIT_A}") == _snapshot(offline, TARGET_REPO, COMMIT_A)
    assert hub.resolve_checkpoint(TARGET_REPO) == _snapshot(offline, TARGET_REPO, COMMIT_A)  # main
    target = dj.load_target(f"{TARGET_REPO}@v2")
    assert target.config.hidden_size == 64 and target.path == str(v2) and target.tokenizer is None
    with pytest.raises(FileNotFoundError, match="is in the Hugging Face cache .* but not at revision 'v3'.*HF_HUB_OFFLINE"):
        hub.resolve_checkpoint(f"{TARGET_REPO}@v3")
    with pytest.raises(ValueError, match="names revision 'v2' but revision='main'"):
        hub.resolve_checkpoint(f"{TARGET_REPO}@v2", revision="main")
    with pytest.raises(ValueError, match="revision after '@'"):
        hub.resolve_checkpoint(f"{TARGET_REPO}@")


def test_a_resolved_directory_is_named_as_the_commands_take_it(offline, tmp_path):
    """checkpoint_name, the way back from resolve_checkpoint (export's bench command names the
    run's target so): a snapshot is its repo id at its commit, the shipped model 'embedded', any
    other directory its path; each resolves to the same directory again."""
    for name in (TARGET_REPO, f"{TARGET_REPO}@v2", "embedded", str(tmp_path)):
        path = hub.resolve_checkpoint(name)
        shown = hub.checkpoint_name(path)
        assert hub.resolve_checkpoint(shown) == path, (name, shown)
    assert hub.checkpoint_name(_snapshot(offline, TARGET_REPO, COMMIT_B)) == f"{TARGET_REPO}@{COMMIT_B}"
    assert hub.checkpoint_name(dj.EMBEDDED_TARGET_DIR) == "embedded"
    assert hub.checkpoint_name(dj.EMBEDDED_DRAFTER_DIR, kind="drafter") == "embedded"
    assert hub.checkpoint_name(dj.EMBEDDED_DRAFTER_DIR) == dj.EMBEDDED_DRAFTER_DIR  # not the target
    inside = _snapshot(offline, TARGET_REPO, COMMIT_A) / "sub"
    assert hub.checkpoint_name(inside) == str(inside)


def test_only_what_a_checkpoint_needs_is_fetched(offline):
    """The download patterns take configs, tokenizer files and safetensors of real repos'
    listings, and nothing else; a cached snapshot that lacks the skipped files resolves offline
    (huggingface_hub checks a snapshot against the listing with the same patterns), one that
    lacks a needed file does not, and files="config" needs config.json alone."""
    llama = ["LICENSE", "README.md", "USE_POLICY.md", "config.json", "generation_config.json",
             *[f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)], "model.safetensors.index.json",
             "original/consolidated.00.pth", "original/params.json", "original/tokenizer.model",
             "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", ".gitattributes"]
    wanted = ["config.json", "generation_config.json", *[f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)],
              "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    take = lambda names: sorted(filter_repo_objects(names, allow_patterns=hub.CHECKPOINT_FILES,  # noqa: E731
                                                    ignore_patterns=hub.SKIPPED_FILES))
    assert take(llama) == sorted(wanted)
    qwen = ["LICENSE", "README.md", "config.json", "generation_config.json", "merges.txt", "vocab.json",
            "model-00001-of-00005.safetensors", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "pytorch_model.bin", "consolidated.safetensors", "chat_template.jinja"]
    assert take(qwen) == sorted(["config.json", "generation_config.json", "merges.txt", "vocab.json",
                                 "model-00001-of-00005.safetensors", "model.safetensors.index.json",
                                 "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
    # the target repo's listing has README.md, pytorch_model.bin, original/...: not needed, not cached
    assert hub.resolve_checkpoint(TARGET_REPO).is_dir()
    assert hub.resolve_checkpoint("acme/config-only", files="config") == _snapshot(offline, "acme/config-only", COMMIT_A)
    # huggingface_hub 2.4 checks the cached snapshot against the listing (the files it lacks: go
    # online); 0.36 (transformers 4.51's, .ci/newest-jax) hands the snapshot back, and the reader
    # finds no weights in it: a one-line error either way
    lacking = ("lacks files the checkpoint needs.*network" if int(huggingface_hub.__version__.split(".")[0]) >= 1
               else r"has no \*\.safetensors weights")
    with pytest.raises(FileNotFoundError, match=lacking):
        hub.resolve_checkpoint("acme/config-only")


def test_a_local_directory_wins_and_embedded_works_anywhere(offline, monkeypatch, tmp_path):
    local = tmp_path / TARGET_REPO  # a directory spelled like the repo id
    shutil.copytree(_snapshot(offline, TARGET_REPO, COMMIT_B), local)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve_checkpoint(TARGET_REPO) == Path(TARGET_REPO)
    assert dj.load_target(TARGET_REPO).config.hidden_size == 64  # the local one, not the cache's main
    assert hub.resolve_checkpoint("embedded") == Path(dj.EMBEDDED_TARGET_DIR)
    assert hub.resolve_checkpoint("embedded", kind="drafter") == Path(dj.EMBEDDED_DRAFTER_DIR)
    target = dj.load_target("embedded")
    assert target.path == dj.EMBEDDED_TARGET_DIR
    assert dj.load_drafter("embedded", target).path == dj.EMBEDDED_DRAFTER_DIR
    with pytest.raises(ValueError, match="no revision"):
        hub.resolve_checkpoint("embedded", revision="v2")


def test_the_cache_is_found_through_hf_home(hub_home, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(hub_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_cache_dir() == str(hub_home / "hub")
    assert hub.resolve_checkpoint(DRAFTER_REPO, kind="drafter") == _snapshot(hub_home / "hub", DRAFTER_REPO, COMMIT_A)


def test_errors_are_one_line_and_say_what_was_tried(offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        dj.load_target("acme/missing")
    message = str(e.value)
    assert "\n" not in message
    assert "not a local directory" in message and "not in the Hugging Face cache" in message
    assert str(offline) in message and "HF_HUB_OFFLINE" in message
    for bad in ("no/such/dir", "./nothing", str(tmp_path / "none"), "bad--name/x"):
        with pytest.raises(FileNotFoundError) as e:
            dj.load_drafter(bad, None)
        message = str(e.value)
        assert "\n" not in message and "does not exist" in message and "not a Hugging Face repo id" in message
        assert "org/name" in message and "'embedded'" in message, message
    with pytest.raises(FileNotFoundError, match="is a file"):
        hub.resolve_checkpoint(os.path.join(dj.EMBEDDED_TARGET_DIR, "config.json"))
    assert hub.resolve_checkpoint(os.path.join(dj.EMBEDDED_TARGET_DIR, "config.json"), files="config").is_file()


def test_the_command_line_error_and_help(offline, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "hi", "--target", "acme/missing"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: target 'acme/missing'")
    assert "HF_HUB_OFFLINE" in err
    for command in ("bench", "generate", "train", "features", "train-data", "spec-speed"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "Qwen3-8B-dir" not in out and "dflash-dir" not in out, command  # the old placeholders
        assert "repo id" in out and "'embedded'" in out, command
