"""``bench`` through click against the fake server: records, plots, exit codes, list, compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from metrale_bench.cli import bench
from metrale_bench.records import read_record
from metrale_bench.records_dir import default_records_dir


def _invoke(args: list[str], env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(bench, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _only_record(folder: Path) -> Path:
    (path,) = folder.glob("*.json")
    return path


def test_without_matplotlib_the_run_says_which_extra_draws_the_plot(
    fake_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "metrale_bench.plots", raising=False)
    code, out, _ = _invoke(
        ["serve", "--base-url", fake_server_url, "--num-prompts", "2", "--random-input-len", "4",
         "--random-output-len", "2", "--records-dir", str(tmp_path), "--no-progress"]
    )  # fmt: skip
    assert code == 0, out
    assert "not drawn: matplotlib is not installed" in out
    assert "metrale-bench[plots]" in out
    path = _only_record(tmp_path / "serve")
    assert not path.with_suffix(".png").exists()


def test_serve_writes_record_and_plot(fake_server_url: str, tmp_path: Path) -> None:
    code, out, _ = _invoke(
        ["serve", "--base-url", fake_server_url, "--num-prompts", "4", "--random-input-len", "8",
         "--random-output-len", "4", "--request-rate", "100", "--burstiness", "0.5",
         "--slo", "ttft:5000", "--records-dir", str(tmp_path), "--no-progress"]
    )  # fmt: skip
    assert code == 0, out
    path = _only_record(tmp_path / "serve")
    assert path.with_suffix(".png").exists()
    record = read_record(path)
    assert record.metrics["num_completed"] == 4
    assert record.params["load"] == {
        "request_rate": 100.0,
        "burstiness": 0.5,
        "max_concurrency": None,
        "seed": 0,
    }
    assert record.params["slo"]["ttft_ms"] == 5000
    assert "output_tok_s" in out
    assert str(path) in out


def test_failed_requests_exit_nonzero(fake_server_url: str, tmp_path: Path) -> None:
    code, _, err = _invoke(
        ["serve", "--base-url", fake_server_url, "--model", "no-usage", "--num-prompts", "2",
         "--random-output-len", "3", "--records-dir", str(tmp_path), "--no-progress", "--no-plot"]
    )  # fmt: skip
    assert code == 1
    assert "2 request(s) failed" in err
    assert "no usage" in err
    # The record is still written, with the failures in it.
    record = read_record(_only_record(tmp_path / "serve"))
    assert record.num_failed == 2


def test_sweep_decode_floor_ttft_tier_boot(fake_server_url: str, tmp_path: Path) -> None:
    common = ["--base-url", fake_server_url, "--records-dir", str(tmp_path), "--no-progress"]
    runs = [
        ["concurrency-sweep", "--concurrencies", "1,2", "--prompts-per-concurrency", "2",
         "--random-input-len", "8", "--random-output-len", "3"],
        ["decode-floor", "--input-len", "8", "--output-len", "6", "--runs", "2"],
        ["ttft", "--prefix-len", "8", "--suffix-len", "2", "--runs", "2"],
        ["default-tier-boot", "--num-chats", "2", "--prompt-words", "8", "--max-tokens", "3"],
    ]  # fmt: skip
    for args in runs:
        code, out, err = _invoke([*args, *common])
        assert code == 0, out + err
    names = {p.parent.name for p in tmp_path.rglob("*.json")}
    assert names == {"concurrency-sweep", "decode-floor", "ttft", "default-tier-boot"}
    assert len(list(tmp_path.rglob("*.png"))) == 4
    code, out, _ = _invoke(["list", str(tmp_path)])
    assert code == 0
    for name in names:
        assert name in out


def test_compare(fake_server_url: str, tmp_path: Path) -> None:
    args = [
        "decode-floor",
        "--base-url",
        fake_server_url,
        "--input-len",
        "4",
        "--output-len",
        "4",
        "--runs",
        "1",
        "--records-dir",
        str(tmp_path),
        "--no-progress",
        "--no-plot",
    ]
    assert _invoke(args)[0] == 0
    assert _invoke(args)[0] == 0
    a, b = sorted((tmp_path / "decode-floor").glob("*.json"))
    code, out, _ = _invoke(["compare", str(a), str(b)])
    assert code == 0
    assert "decode_tok_s" in out
    assert "B / A" in out


def test_compare_refuses_a_non_record(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": 99}))
    code, _, err = _invoke(["compare", str(path), str(path)])
    assert code == 1
    assert "schema" in err


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    assert _invoke(["serve", "--dataset", "sharegpt"])[0] == 2
    assert _invoke(["serve", "--slo", "speed:1"])[0] == 2
    assert _invoke(["concurrency-sweep", "--concurrencies", "1,x"])[0] == 2


def test_unreachable_server_is_an_error(tmp_path: Path) -> None:
    code, _, err = _invoke(
        ["decode-floor", "--base-url", "http://127.0.0.1:9", "--records-dir", str(tmp_path)]
    )
    assert code == 1
    assert "GET /v1/models" in err
    assert not tmp_path.exists() or not list(tmp_path.rglob("*.json"))


def test_serve_sharegpt_over_chat(fake_server_url: str, tmp_path: Path) -> None:
    dataset = tmp_path / "sharegpt.json"
    turns = [{"from": "human", "value": "Tell me a story."}, {"from": "gpt", "value": "Once."}]
    dataset.write_text(json.dumps([{"conversations": turns}] * 3))
    code, out, err = _invoke(
        ["serve", "--base-url", fake_server_url, "--api", "chat", "--dataset", "sharegpt",
         "--dataset-path", str(dataset), "--num-prompts", "3", "--records-dir",
         str(tmp_path / "records"), "--no-progress", "--no-plot"]
    )  # fmt: skip
    assert code == 0, out + err
    record = read_record(_only_record(tmp_path / "records" / "serve"))
    # "Once." is 5 characters → ceil(5 / 4) = 2 tokens asked for, and the fake makes them all.
    assert record.metrics["total_output_tokens"] == 3 * 2
    assert record.params["workload"]["dataset_path"] == str(dataset)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory, with no records directory set by the environment."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("METRALE_BENCH_DIR", raising=False)
    return work


def _quick_serve(fake_server_url: str, *extra: str) -> list[str]:
    return ["serve", "--base-url", fake_server_url, "--num-prompts", "2", "--random-input-len",
            "4", "--random-output-len", "2", "--no-progress", "--no-plot", *extra]  # fmt: skip


def test_records_go_to_the_user_data_dir_not_the_current_one(
    fake_server_url: str, workdir: Path, tmp_path: Path
) -> None:
    data_home = tmp_path / "data"
    env: dict[str, str | None] = {"XDG_DATA_HOME": str(data_home)}
    code, out, err = _invoke(_quick_serve(fake_server_url), env=env)
    assert code == 0, out + err
    assert list(workdir.iterdir()) == []
    path = _only_record(data_home / "metrale" / "bench" / "serve")
    assert f"record: {path}" in out
    code, out, _ = _invoke(["list"], env=env)  # list reads the same place
    assert code == 0
    assert path.name in out


def test_an_explicit_records_dir_wins(fake_server_url: str, workdir: Path, tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "METRALE_BENCH_DIR": str(tmp_path / "from-env"),
    }
    assert _invoke(_quick_serve(fake_server_url), env=env)[0] == 0
    _only_record(tmp_path / "from-env" / "serve")
    code, out, _ = _invoke(_quick_serve(fake_server_url, "--records-dir", "mine"), env=env)
    assert code == 0
    path = _only_record(workdir / "mine" / "serve")
    assert f"record: {path}" in out  # absolute, though the flag was relative
    assert not (tmp_path / "data").exists()


def test_the_default_records_dir_follows_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    fallback = tmp_path / ".local" / "share" / "metrale" / "bench"
    assert default_records_dir({}) == fallback
    assert default_records_dir({"XDG_DATA_HOME": ""}) == fallback
    assert default_records_dir({"XDG_DATA_HOME": "relative/dir"}) == fallback
    assert default_records_dir({"XDG_DATA_HOME": "/srv/data"}) == Path("/srv/data/metrale/bench")
