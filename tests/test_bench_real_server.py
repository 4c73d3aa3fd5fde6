"""``met bench``: every driver briefly against the real ``met serve`` on a tiny random Llama.

Small request counts and short outputs keep the whole file well under a minute on two cores;
each record is read back and checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from metrale_testing import served

from metrale_bench.cli import bench
from metrale_bench.records import BenchRecord, read_record
from metrale_bench.server_process import ServerProcess, running_server

SERVED_NAME = "tiny-llama"
MAX_SEQ_LEN = 512
SERVE_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-batch-size", "8"]


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_model_factory: Callable[[int], Path]) -> Path:
    return tiny_model_factory(MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("bench-serve")
    with served(
        [
            str(tiny_model_dir),
            "--served-model-name",
            SERVED_NAME,
            *SERVE_ARGS,
            "--num-kv-blocks",
            "256",
            "--enable-prefix-caching",
        ],
        logs,
        ready_timeout_s=120,
    ) as process:
        yield process


def _bench(args: list[str], records_dir: Path) -> BenchRecord:
    result = CliRunner().invoke(
        bench, [*args, "--records-dir", str(records_dir), "--no-progress"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    (path,) = records_dir.rglob("*.json")
    assert path.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    return read_record(path)


def _check_identity(record: BenchRecord, server: ServerProcess) -> None:
    assert record.model == SERVED_NAME
    assert record.base_url == server.base_url
    assert record.server_version is not None
    assert "version" in record.server_version
    assert record.num_failed == 0
    assert record.errors == ()


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_serve(server: ServerProcess, tmp_path: Path, api: str) -> None:
    record = _bench(
        ["serve", "--base-url", server.base_url, "--api", api, "--num-prompts", "6",
         "--random-input-len", "24", "--random-output-len", "8", "--ignore-eos",
         "--max-concurrency", "3", "--request-rate", "50", "--slo", "ttft:60000"],
        tmp_path,
    )  # fmt: skip
    _check_identity(record, server)
    assert record.metrics["num_completed"] == 6
    # ignore_eos: every request makes exactly its 8 tokens, as the server's usage reports.
    assert record.metrics["total_output_tokens"] == 6 * 8
    # Text prompts sized through the server's /tokenize: SmolLM2 spells each word as one token.
    assert record.params["prompts"]["sized_by"] == "/tokenize"
    assert record.params["prompts"]["tokens_per_word"] == pytest.approx(1.0, abs=0.05)
    if api == "completions":
        assert record.metrics["mean_input_tokens"] == pytest.approx(24, abs=2)
    for name in ("ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms", "e2e_p99_ms", "output_tok_s"):
        value = record.metrics[name]
        assert value is not None
        assert value > 0
    assert record.metrics["max_concurrent_requests"] <= 3
    assert record.metrics["goodput_request_s"] == pytest.approx(record.metrics["request_s"])


def test_concurrency_sweep(server: ServerProcess, tmp_path: Path) -> None:
    record = _bench(
        ["concurrency-sweep", "--base-url", server.base_url, "--concurrencies", "1,4",
         "--prompts-per-concurrency", "2", "--random-input-len", "16", "--random-output-len",
         "6", "--ignore-eos"],
        tmp_path,
    )  # fmt: skip
    _check_identity(record, server)
    assert record.metrics["c1_num_completed"] == 4  # at least min_prompts
    assert record.metrics["c4_num_completed"] == 8
    assert record.metrics["c4_total_output_tokens"] == 8 * 6
    assert record.metrics["peak_output_concurrency"] in (1, 4)
    assert len(record.samples["c4_ttft_ms"]) == 8


def test_decode_floor(server: ServerProcess, tmp_path: Path) -> None:
    record = _bench(
        ["decode-floor", "--base-url", server.base_url, "--input-len", "16", "--output-len",
         "24", "--runs", "2"],
        tmp_path,
    )  # fmt: skip
    _check_identity(record, server)
    assert record.metrics["runs"] == 2
    assert record.metrics["min_output_tokens"] == 24
    decode = record.metrics["decode_tok_s"]
    assert decode is not None
    assert decode > 1


def test_ttft(server: ServerProcess, tmp_path: Path) -> None:
    record = _bench(
        ["ttft", "--base-url", server.base_url, "--prefix-len", "256", "--suffix-len", "8",
         "--runs", "2"],
        tmp_path,
    )  # fmt: skip
    _check_identity(record, server)
    assert record.metrics["ttft_cold_p50_ms"] is not None
    assert record.metrics["ttft_warm_p50_ms"] is not None
    assert record.metrics["warm_over_cold"] is not None


@pytest.mark.slow
def test_default_tier_boot_boots_met_serve(tiny_model_dir: Path, tmp_path: Path) -> None:
    record = _bench(
        ["default-tier-boot", str(tiny_model_dir), *(f"--serve-arg={a}" for a in SERVE_ARGS),
         "--max-tokens", "16", "--ready-timeout", "120"],
        tmp_path,
    )  # fmt: skip
    assert record.num_failed == 0
    assert record.params["spec"]["num_chats"] == 8
    assert record.metrics["chat_num_completed"] == 8
    assert record.metrics["max_batch_size"] == 8
    kv_blocks = record.metrics["kv_blocks"]
    assert isinstance(kv_blocks, int)
    assert kv_blocks > 0
    budget = record.metrics["budget_mib"]
    assert budget is not None
    assert budget > 0
    memory = record.details["memory"]
    assert memory["kv_blocks"] == kv_blocks
    assert record.details["verdict"] in ("info", "inconclusive")
    assert (record.details["verdict"] == "info") == (
        record.metrics["device_footprint_mib"] is not None
    )
    boot = record.details["boot"]
    assert str(tiny_model_dir) in boot["command"]
    assert boot["boot_s"] > 0


@pytest.fixture(scope="module")
def byte_server(
    tiny_byte_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The tiny Llama over a 258-token byte vocabulary: token ids past 257 are refused."""
    logs = tmp_path_factory.mktemp("bench-byte-serve")
    with running_server(
        [str(tiny_byte_model_dir), "--served-model-name", "bytes", *SERVE_ARGS],
        ready_timeout_s=120,
        log_path=logs / "server.log",
    ) as server:
        yield server


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_serve_on_a_small_vocabulary(byte_server: ServerProcess, tmp_path: Path, api: str) -> None:
    record = _bench(
        ["serve", "--base-url", byte_server.base_url, "--api", api, "--num-prompts", "4",
         "--random-input-len", "96", "--random-output-len", "4", "--ignore-eos"],
        tmp_path,
    )  # fmt: skip
    assert record.num_failed == 0, record.errors
    assert record.metrics["num_completed"] == 4
    prompts = record.params["prompts"]
    assert prompts["sized_by"] == "/tokenize"
    assert 4 < prompts["tokens_per_word"] < 8  # one token a byte: a word and its space
    mean_input = record.metrics["mean_input_tokens"]
    assert isinstance(mean_input, float)
    if api == "completions":  # the prompt and <s>; chat adds its template's tokens
        assert mean_input == pytest.approx(96, rel=0.15)
    else:
        assert mean_input > 96


def test_decode_floor_and_ttft_on_a_small_vocabulary(
    byte_server: ServerProcess, tmp_path: Path
) -> None:
    floor = _bench(
        ["decode-floor", "--base-url", byte_server.base_url, "--input-len", "32",
         "--output-len", "8", "--runs", "1", "--num-warmups", "0"],
        tmp_path / "floor",
    )  # fmt: skip
    assert floor.num_failed == 0, floor.errors
    ttft = _bench(
        ["ttft", "--base-url", byte_server.base_url, "--prefix-len", "64", "--suffix-len", "8",
         "--runs", "1"],
        tmp_path / "ttft",
    )  # fmt: skip
    assert ttft.num_failed == 0, ttft.errors
