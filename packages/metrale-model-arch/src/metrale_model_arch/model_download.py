"""Download a Hugging Face hub model into the hub cache when :func:`resolve_model` finds none.

Needs the optional ``huggingface_hub`` (``pip install 'metrale-model-arch[hub]'``). Only what a
checkpoint is read from is fetched: the JSON files, ``*.jinja`` chat templates,
``tokenizer.model`` and ``model.safetensors`` / ``model-*.safetensors``, or, for a repo of GGUF
files, the one GGUF file named (``org/name/file.gguf``), or the only one the repo holds. The files
land where :func:`~metrale_model_arch.model_source.hub_cache_dir` points, as
``huggingface_hub`` lays them out, so the next :func:`resolve_model` finds them offline.
``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) turns downloading off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatch
from pathlib import Path

from metrale_model_arch.model_source import (
    GGUF_SUFFIX,
    ModelNotFoundError,
    ModelSource,
    default_model_name,
    hub_cache_dir,
    model_in_snapshot,
    not_found_message,
    resolve_model,
    split_hub_name,
)

HUB_EXTRA = "pip install 'metrale-model-arch[hub]'"
OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# What a safetensors checkpoint directory is read from (never pickles, never other folders'
# weights such as a second, consolidated copy).
CHECKPOINT_PATTERNS = (
    "*.json",
    "*.jinja",
    "tokenizer.model",
    "model.safetensors",
    "model-*.safetensors",
)
# The hub's repo ids: org/name, each part starting with a letter or digit, at most 96 long.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})

Announce = Callable[[str], None]


class ModelDownloadError(ModelNotFoundError):
    """A model in neither a local path nor the hub cache that could not be downloaded either;
    the message says why and lists every place looked at."""


def hub_offline() -> bool:
    """Whether the environment forbids downloads (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``,
    read as ``huggingface_hub`` reads them)."""
    return any(os.environ.get(name, "").strip().upper() in _TRUE for name in OFFLINE_ENVS)


def downloadable_repo(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, file_in_repo)`` when ``name`` is shaped like a hub model (``org/name`` or
    ``org/name/file.gguf``); ``None`` for anything else (a path such as ``./x/y`` or ``/x/y``,
    a bare ``name``)."""
    if name != name.strip() or name.startswith(("/", ".", "~")):
        return None
    split = split_hub_name(name)
    if split is None:
        return None
    repo_id, file_in_repo = split
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        return None
    if file_in_repo is not None and ".." in file_in_repo.split("/"):
        return None
    return repo_id, file_in_repo


def find_or_download_model(
    name: str | None,
    revision: str | None = None,
    *,
    offline: bool = False,
    announce: Announce | None = None,
) -> ModelSource:
    """:func:`resolve_model`, and when a hub-shaped name (``org/name``) is found nowhere, its
    download into the hub cache (unless ``offline`` or :func:`hub_offline`).

    Raises ``ModelNotFoundError`` (``ModelDownloadError`` when the download failed) naming every
    place looked at and why nothing was downloaded; never anything else for a failed download.
    """
    try:
        return resolve_model(name, revision)
    except ModelNotFoundError as error:
        missing = error
    asked = missing.name if missing.name is not None else (name or default_model_name())
    if not missing.looked_at or asked is None or downloadable_repo(asked) is None:
        raise missing
    if offline or hub_offline():
        why = "offline: HF_HUB_OFFLINE is set" if hub_offline() else "offline: --offline"
        raise ModelNotFoundError(
            not_found_message(asked, f"{why}, nothing is downloaded", missing.looked_at),
            name=asked,
            looked_at=missing.looked_at,
        ) from None
    return download_model(asked, revision, looked_at=missing.looked_at, announce=announce)


def download_model(
    name: str,
    revision: str | None = None,
    *,
    looked_at: Sequence[str] = (),
    announce: Announce | None = None,
) -> ModelSource:
    """Download the hub model ``name`` (``org/name`` or ``org/name/file.gguf``) at ``revision``
    (default: ``main``) into the hub cache and return it, as :func:`resolve_model` would.

    ``announce`` hears one line before the transfer (``huggingface_hub`` draws the progress
    bars). Raises ``ModelDownloadError`` saying what failed, after ``looked_at``.
    """
    hub = downloadable_repo(name)
    if hub is None:
        raise ModelNotFoundError(
            not_found_message(name, "not a Hugging Face repo id (org/name) to download", looked_at),
            name=name,
            looked_at=looked_at,
        )
    repo_id, file_in_repo = hub
    at = f" at revision {revision!r}" if revision is not None else ""

    def failed(why: str) -> ModelDownloadError:
        return ModelDownloadError(
            not_found_message(name, why, looked_at), name=name, looked_at=looked_at
        )

    try:
        import huggingface_hub
    except ImportError:
        raise failed(f"downloading it needs huggingface_hub: {HUB_EXTRA}") from None

    cache = hub_cache_dir()
    try:
        listing = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            allow_patterns=[file_in_repo] if file_in_repo else [*CHECKPOINT_PATTERNS, "*.gguf"],
            dry_run=True,
        )
    except Exception as error:
        raise failed(
            f"listing {repo_id}{at} on the Hugging Face hub failed: {_describe(error)}"
        ) from error
    files = [entry for entry in listing if isinstance(getattr(entry, "filename", None), str)]
    choice = _choose_files(repo_id, file_in_repo, [entry.filename for entry in files])
    if isinstance(choice, str):
        raise failed(f"{repo_id}{at} on the Hugging Face hub {choice}")
    patterns, gguf_file = choice
    if announce is not None:
        wanted = [entry for entry in files if _matches(entry.filename, patterns)]
        size = sum(entry.file_size or 0 for entry in wanted if entry.will_download)
        announce(
            f"downloading {repo_id}{at} from the Hugging Face hub into {cache}: "
            f"{len(wanted)} files, {_size(size)} to fetch"
        )
    try:
        snapshot = huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=cache, allow_patterns=list(patterns)
        )
    except Exception as error:
        raise failed(
            f"downloading {repo_id}{at} from the Hugging Face hub failed: {_describe(error)}"
        ) from error
    return model_in_snapshot(Path(snapshot), name, gguf_file)


def _choose_files(
    repo_id: str, file_in_repo: str | None, names: Sequence[str]
) -> tuple[tuple[str, ...], str | None] | str:
    """The allow patterns to fetch and the GGUF file among them (``None``: a checkpoint
    directory), or why the repo holds no model to fetch."""
    if file_in_repo is not None:
        if file_in_repo not in names:
            return f"has no file {file_in_repo}"
        return (file_in_repo,), file_in_repo
    if "config.json" in names:
        return CHECKPOINT_PATTERNS, None
    gguf_files = sorted(name for name in names if name.lower().endswith(GGUF_SUFFIX))
    if len(gguf_files) == 1:
        return (gguf_files[0],), gguf_files[0]
    if gguf_files:
        listed = ", ".join(gguf_files)
        return f"holds several .gguf files ({listed}); name one, as {repo_id}/{gguf_files[0]}"
    return "holds neither config.json nor a .gguf file"


def _matches(filename: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch(filename, pattern) for pattern in patterns)


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _describe(error: BaseException) -> str:
    """``Type: message`` on one line, and the cause's when the message does not hold it."""
    text = f"{type(error).__name__}: {_one_line(error)}"
    cause = error.__cause__ or error.__context__
    if cause is not None and str(cause) and str(cause) not in str(error):
        text += f" ({type(cause).__name__}: {_one_line(cause)})"
    return text


def _one_line(error: BaseException) -> str:
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())
