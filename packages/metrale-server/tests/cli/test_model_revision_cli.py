"""``--revision`` and ``--offline`` on the commands that take a model, and the download of a
hub model missing from the cache (faked: this machine cannot reach the hub)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from metrale_model_arch import resolve_model
from metrale_server.cli.main import main
from metrale_server.cli.serve_args import ServeArgs

COMMIT_MAIN = "0123456789abcdef0123456789abcdef01234567"
COMMIT_DEV = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding org/smol-GGUF (the bundled GGUF, as a symlink like the cache's own
    links into blobs/): main and dev at two commits. The working directory is elsewhere."""
    path = tmp_path / "hub"
    bundled = resolve_model(None).path
    repo = path / "models--org--smol-GGUF"
    for commit, ref in ((COMMIT_MAIN, "main"), (COMMIT_DEV, "dev")):
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / bundled.name).symlink_to(bundled)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "METRALE_DEFAULT_MODEL"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return path


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["serve"], {"--revision", "--offline"}),
        (["generate", "hi"], {"--revision", "--offline"}),
        (["chat"], {"--revision", "--offline"}),
        (["memory"], {"--revision"}),
    ],
)
def test_model_commands_document_the_flags(
    runner: CliRunner, command: list[str], flags: set[str]
) -> None:
    result = runner.invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    for flag in flags:
        assert flag in result.output


def test_serve_hands_the_engine_the_revision_it_found(
    runner: CliRunner, hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[ServeArgs] = []

    def fake_run_serve(args: ServeArgs, *, show_dashboard: bool = False) -> int:
        served.append(args)
        return 0

    monkeypatch.setattr("metrale_server.cli.serve_runtime.run_serve", fake_run_serve)
    result = runner.invoke(
        main, ["serve", "org/smol-GGUF", "--revision", COMMIT_DEV[:8], "--offline", "--no-tui"]
    )
    assert result.exit_code == 0, result.output
    (args,) = served
    gguf = resolve_model(None).path
    snapshot = hub / "models--org--smol-GGUF" / "snapshots" / COMMIT_DEV
    assert args.engine_args.model == str(snapshot / gguf.name)
    assert args.served_model_name == gguf.stem

    result = runner.invoke(main, ["serve", "org/smol-GGUF", "--offline", "--no-tui"])
    assert result.exit_code == 0, result.output
    assert served[1].engine_args.model == str(snapshot.parent / COMMIT_MAIN / gguf.name)


def test_serve_offline_names_the_places_looked_at(runner: CliRunner, hub: Path) -> None:
    result = runner.invoke(main, ["serve", "org/smol-GGUF", "--revision", "v9", "--offline"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback
    assert "model 'org/smol-GGUF' not found (offline: --offline, nothing is downloaded)" in (
        result.output
    )
    assert str(hub / "models--org--smol-GGUF" / "refs" / "v9") in result.output
    assert "Traceback" not in result.output


def test_serve_failed_download_is_a_clear_error(
    runner: CliRunner, hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls: list[dict[str, Any]] = []

    def no_network(repo_id: str, **kwargs: Any) -> Any:
        calls.append({"repo_id": repo_id, **kwargs})
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    result = runner.invoke(main, ["serve", "org/absent", "--revision", "dev", "--no-tui"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert (
        "listing org/absent at revision 'dev' on the Hugging Face hub failed: ConnectionError: "
        "[Errno -2] Name or service not known" in result.output
    )
    assert f"local path {Path.cwd() / 'org' / 'absent'} (does not exist)" in result.output
    assert str(hub / "models--org--absent" / "refs" / "dev") in result.output
    assert [(call["repo_id"], call["revision"], call["cache_dir"]) for call in calls] == [
        ("org/absent", "dev", hub)
    ]

    calls.clear()
    result = runner.invoke(main, ["serve", "org/absent"], env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 1, result.output
    assert "offline: HF_HUB_OFFLINE is set, nothing is downloaded" in result.output
    assert calls == []


def test_memory_at_a_revision(runner: CliRunner, hub: Path) -> None:
    result = runner.invoke(main, ["memory", "org/smol-GGUF", "--revision", "dev", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)

    missing = runner.invoke(main, ["memory", "org/smol-GGUF", "--revision", "nope"])
    assert missing.exit_code == 1
    assert "(nothing is downloaded)" in missing.output
    assert str(hub / "models--org--smol-GGUF" / "refs" / "nope") in missing.output


def test_memory_revision_of_a_config_file_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = runner.invoke(main, ["memory", str(config), "--revision", "dev"])
    assert result.exit_code == 2
    assert "applies to a Hugging Face repo id" in result.output


def test_chat_revision_needs_a_model(runner: CliRunner) -> None:
    result = runner.invoke(main, ["chat", "--revision", "dev"])
    assert result.exit_code == 2
    assert "--revision and --offline go with --model" in result.output


def test_generate_offline_miss_is_a_clear_error(runner: CliRunner, hub: Path) -> None:
    result = runner.invoke(main, ["generate", "hi", "--model", "org/absent", "--offline"])
    assert result.exit_code == 1
    assert "offline: --offline, nothing is downloaded" in result.output
    assert os.fspath(hub / "models--org--absent" / "refs" / "main") in result.output
