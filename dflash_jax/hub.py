"""Checkpoints by name: a local directory, a Hugging Face hub repo id, or ``embedded``.

``resolve_checkpoint(name)`` turns what a user writes after ``--target`` / ``--drafter`` (or
passes to ``load_target`` / ``load_drafter``) into a directory on this machine:

* an existing path: used as it is (a local directory always wins over a repo id of the same
  spelling);
* ``embedded``: the model shipped in the package (``dflash_jax/assets/target`` or
  ``.../drafter``, by ``kind``), from any working directory (a directory that is really called
  ``embedded`` is reached as ``./embedded``);
* ``org/name`` or ``org/name@revision`` (a branch, tag or commit of the repo): the repo's
  snapshot in the Hugging Face cache, downloaded through ``huggingface_hub.snapshot_download``
  when it is not there yet. Only what a checkpoint needs is fetched (configs, tokenizer files,
  ``*.safetensors`` and their index, ``generation_config.json``), never ``*.bin`` / ``*.pth``
  weights or an ``original/`` folder.

The hub's own settings apply, read when a checkpoint is resolved (so a change after import
takes effect): ``HF_HUB_CACHE`` (or ``HF_HOME``/hub) is where snapshots live,
``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) uses the cache only, ``HF_TOKEN`` (or
``hf auth login``) opens gated repos such as meta-llama's, ``HF_ENDPOINT`` names a mirror.
docs/checkpoints.md is the user's guide.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import (GatedRepoError, HFValidationError, LocalEntryNotFoundError,
                                   RepositoryNotFoundError, RevisionNotFoundError, validate_repo_id)

EMBEDDED = "embedded"
"""The name of the shipped model: ``--target embedded`` / ``--drafter embedded``."""
ASSETS_DIR = os.fspath(importlib.resources.files("dflash_jax") / "assets")
"""The package's shipped assets: the embedded pair (``target/``, ``drafter/``) and the drafters
other drafting methods ship for the embedded target (each method's ``shipped_dir``)."""
EMBEDDED_TARGET_DIR = os.path.join(ASSETS_DIR, "target")
"""The embedded default target shipped in the package (a Hugging Face Qwen3 directory)."""
EMBEDDED_DRAFTER_DIR = os.path.join(ASSETS_DIR, "drafter")
"""Its DFlash drafter (the released drafter layout)."""

KINDS = {"target": EMBEDDED_TARGET_DIR, "drafter": EMBEDDED_DRAFTER_DIR}
"""What a checkpoint is for -> the embedded one of that kind."""

CHECKPOINT_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt",
                    "vocab.txt", "*.jinja"]
"""What ``resolve_checkpoint`` downloads of a repo (``snapshot_download``'s allow_patterns):
config.json, generation_config.json, the safetensors and their index, the tokenizer files, the
chat template."""
SKIPPED_FILES = ["original/*", "*/original/*", "consolidated*.safetensors"]
"""...and what it never downloads even where a pattern above matches: the original-format
copies of the weights some repos carry beside the transformers ones (meta-llama's
``original/``, Mistral's ``consolidated.safetensors``)."""
CONFIG_FILES = ["config.json"]
"""What ``files="config"`` downloads (commands that read only the shapes: ``roofline``)."""

CHECKPOINT_HELP = ("a checkpoint directory, a Hugging Face repo id org/name (e.g. Qwen/Qwen3-8B; "
                   "org/name@revision for a branch, tag or commit; downloaded once into the hub "
                   "cache, HF_HUB_CACHE; HF_HUB_OFFLINE=1: the cache only), or 'embedded' (the "
                   "model shipped in the package)")
"""The help text of every command's ``--target`` / ``--drafter`` (docs/checkpoints.md)."""

_TRUE = {"1", "ON", "YES", "TRUE"}
_REVISION = re.compile(r"[^\s@]+")


def is_embedded(name) -> bool:
    """Whether ``name`` is the shortcut ``embedded``."""
    return isinstance(name, str) and name == EMBEDDED


def expand_embedded(name, kind: str = "target"):
    """``embedded`` -> the shipped directory of ``kind``; anything else unchanged (for code that
    compares a name with the embedded directory before resolving it)."""
    _check_kind(kind)
    return KINDS[kind] if is_embedded(name) else name


def hub_cache_dir() -> str:
    """Where the Hugging Face cache is now: ``HF_HUB_CACHE`` (or the older
    ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME``/hub, else ``XDG_CACHE_HOME``/huggingface/hub,
    else huggingface_hub's default (~/.cache/huggingface/hub)."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return _expand(env[var])
    if env.get("HF_HOME"):
        return os.path.join(_expand(env["HF_HOME"]), "hub")
    if env.get("XDG_CACHE_HOME"):
        return os.path.join(_expand(env["XDG_CACHE_HOME"]), "huggingface", "hub")
    return hub_constants.HF_HUB_CACHE


def hub_offline() -> bool:
    """Whether the hub may not be contacted: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``)
    set to 1/on/yes/true now, or when huggingface_hub was imported."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE or bool(hub_constants.HF_HUB_OFFLINE)


def is_repo_id(name: str) -> bool:
    """Whether ``name`` is spelled as a hub repo id ``org/name`` (the hub's own rules: letters,
    digits, ``-``, ``_``, ``.``; no ``--`` or ``..``). A bare ``name`` without an organisation
    is refused: it is far more often a mistyped local directory."""
    if name.count("/") != 1 or name.startswith(("/", "./", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def split_revision(name: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; ``"org/name"`` -> ``("org/name", None)``.
    A repo id never holds ``@``, so the first one separates the revision."""
    repo, at, revision = name.partition("@")
    return repo, (revision if at else None)


def checkpoint_name(path: str | os.PathLike, kind: str = "target") -> str:
    """What a command's ``--target`` / ``--drafter`` takes for ``path``, a directory
    :func:`resolve_checkpoint` gave (a run's record holds that): ``embedded`` for the shipped
    model of ``kind``, ``org/name@commit`` for a snapshot in the hub cache, else ``path``."""
    _check_kind(kind)
    path = os.fspath(path)
    full = os.path.abspath(path)
    if full == os.path.abspath(KINDS[kind]):
        return EMBEDDED
    parts = os.path.relpath(full, os.path.abspath(hub_cache_dir())).split(os.sep)
    if len(parts) == 3 and parts[0].startswith("models--") and parts[1] == "snapshots":
        repo = parts[0][len("models--"):].replace("--", "/", 1)  # a repo id never holds "--"
        if is_repo_id(repo):
            return f"{repo}@{parts[2]}"
    return path


def resolve_checkpoint(name_or_path: str | os.PathLike, revision: str | None = None,
                       kind: str = "target", files: str = "checkpoint") -> Path:
    """The directory of a checkpoint named by ``name_or_path`` (see the module doc).

    Args:
      name_or_path: an existing directory (or, with ``files="config"``, a config.json file),
        ``embedded``, or a hub repo id ``org/name`` with an optional ``@revision``.
      revision: the repo's branch, tag or commit (instead of ``@revision``; giving both is an
        error unless they agree). Default: the repo's ``main``.
      kind: ``"target"`` or ``"drafter"``: which embedded model ``embedded`` means, and the
        word the error messages use.
      files: ``"checkpoint"`` (configs, tokenizer, weights) or ``"config"`` (config.json only).

    Raises:
      FileNotFoundError: neither an existing path nor a repo id; a repo the hub does not have,
        or one that is not in the cache while ``HF_HUB_OFFLINE`` is set or the hub cannot be
        reached; a downloaded snapshot without config.json or safetensors weights.
      ValueError: a malformed revision, or ``revision`` disagreeing with ``@revision``.
    """
    _check_kind(kind)
    if files not in ("checkpoint", "config"):
        raise ValueError(f"files must be 'checkpoint' or 'config', got {files!r}")
    if not isinstance(name_or_path, str):  # a PathLike is a path, never a repo id
        name_or_path = os.fspath(name_or_path)
        if not os.path.exists(name_or_path):
            raise FileNotFoundError(f"{kind} directory {name_or_path!r} does not exist")
    name = name_or_path
    if is_embedded(name):
        if revision is not None:
            raise ValueError(f"{kind} 'embedded' is the model shipped in the package: it has no revision")
        return Path(KINDS[kind])
    if os.path.exists(name):
        if files == "checkpoint" and not os.path.isdir(name):
            raise FileNotFoundError(f"{kind} {name!r} is a file: give the checkpoint's directory "
                                    "(config.json + *.safetensors)")
        return Path(name)
    repo, at_revision = split_revision(name)
    if not is_repo_id(repo):
        raise FileNotFoundError(
            f"{kind} {name!r} does not exist (no such directory: {os.path.abspath(name)}) and is not a "
            "Hugging Face repo id: give a checkpoint directory, a repo id org/name[@revision] "
            f"(e.g. Qwen/Qwen3-8B), or '{EMBEDDED}' for the shipped model")
    if at_revision is not None and (not at_revision or not _REVISION.fullmatch(at_revision)):
        raise ValueError(f"{kind} {name!r}: the revision after '@' must be a branch, tag or commit "
                         "(one word, e.g. Qwen/Qwen3-8B@main)")
    if revision is not None and at_revision is not None and revision != at_revision:
        raise ValueError(f"{kind} {name!r} names revision {at_revision!r} but revision={revision!r} "
                         "was given too: give one")
    return _snapshot(repo, revision if revision is not None else at_revision, kind, files)


def _snapshot(repo: str, revision: str | None, kind: str, files: str) -> Path:
    """``repo`` at ``revision`` from the cache, downloaded first where allowed."""
    cache, offline = hub_cache_dir(), hub_offline()
    shown = repo + (f"@{revision}" if revision else "")
    what = f"{kind} {shown!r} (not a local directory, so a Hugging Face repo id)"
    try:
        folder = huggingface_hub.snapshot_download(
            repo, revision=revision, cache_dir=cache, local_files_only=offline,
            allow_patterns=CHECKPOINT_FILES if files == "checkpoint" else CONFIG_FILES,
            ignore_patterns=SKIPPED_FILES)
    except GatedRepoError:
        raise FileNotFoundError(
            f"{what}: the repo is gated: accept its licence on https://huggingface.co/{repo} "
            "and log in here (`hf auth login`, or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{what}: the hub has no repo {repo!r} that you can see (check the spelling; a private "
            "repo needs `hf auth login` or HF_TOKEN), and no such local directory exists") from None
    except RevisionNotFoundError:
        raise FileNotFoundError(
            f"{what}: the repo has no revision {revision!r}: give one of its branches, tags or "
            "commits after '@'") from None
    except LocalEntryNotFoundError as e:
        if "incomplete" in str(e).lower():  # huggingface_hub's IncompleteSnapshotError
            raise FileNotFoundError(
                f"{what}: its snapshot in the cache ({cache}) lacks files the checkpoint needs and the "
                "hub cannot be reached to complete it: run once with a network (HF_HUB_OFFLINE unset)") from None
        cached = os.path.isdir(os.path.join(cache, f"models--{repo.replace('/', '--')}"))
        where = (f"is in the Hugging Face cache ({cache}), but not at revision {revision or 'main'!r}"
                 if cached else f"is not in the Hugging Face cache ({cache})")
        if offline:
            raise FileNotFoundError(
                f"{what} {where}, and HF_HUB_OFFLINE is set, so it cannot be downloaded: unset "
                "HF_HUB_OFFLINE to download it (or download it where there is a network and point "
                "HF_HUB_CACHE at that cache), or give a local directory") from None
        raise FileNotFoundError(
            f"{what} {where}, and the hub cannot be reached ({_cause(e)}): check the network (or "
            "HF_ENDPOINT), or give a local directory") from None
    except huggingface_hub.utils.HfHubHTTPError as e:
        raise FileNotFoundError(f"{what}: the hub refused the download ({_cause(e)})") from None
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{what}: the repo has no config.json, so it is not a Hugging Face "
                                "transformers checkpoint (a GGUF or original-format repo?)")
    if files == "checkpoint" and not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"{what}: the repo has no *.safetensors weights (dflash-jax reads "
                                "safetensors, not *.bin or *.pth): use a repo that has them")
    return path


def _cause(error: BaseException) -> str:
    """The innermost cause of ``error``, on one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
