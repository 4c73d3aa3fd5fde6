"""``met serve`` / ``metrale-serve`` flags: documented, bad values refused naming the flag."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from click.testing import CliRunner

from metrale_server.cli.main import main
from metrale_server.cli.serve_args import ServeArgs

SERVE_FLAGS = (
    "--host",
    "--bind",
    "--port",
    "--served-model-name",
    "--model-name",
    "--max-seq-len",
    "--block-size",
    "--gpu-memory-utilization",
    "--max-batch-size",
    "--max-prefill-tokens",
    "--num-kv-blocks",
    "--enable-prefix-caching",
    "--dtype",
    "--quantization",
    "--enforce-eager",
    "--kernel-backend",
    "--device",
    "--api-key",
    "--api-key-file",
    "--protect-observability",
    "--allowed-hosts",
    "--allowed-origins",
    "--ssl-certfile",
    "--ssl-keyfile",
    "--max-body-bytes",
    "--max-queued-requests",
    "--max-connections",
    "--request-timeout",
    "--drain-timeout",
    "--seed",
    "--task",
    "--chat-template",
    "--no-tui",
    "--log-level",
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text))


def test_help_documents_every_flag(runner: CliRunner) -> None:
    result = runner.invoke(main, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    assert set(SERVE_FLAGS) <= _options(result.output)
    assert "[MODEL]" in result.output
    assert "or the cgroup limit" in result.output  # --gpu-memory-utilization sizes the plan
    assert "auto" in result.output  # --max-batch-size auto


def test_metrale_serve_is_the_same_command(runner: CliRunner) -> None:
    met = runner.invoke(main, ["serve", "--help"])
    standalone = subprocess.run(
        [
            sys.executable,
            "-c",
            "from metrale_server.cli.main import serve_main; serve_main()",
            "-h",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert standalone.returncode == 0, standalone.stderr
    assert standalone.stdout.startswith("Usage: metrale-serve [OPTIONS] [MODEL]")
    assert _options(standalone.stdout) == _options(met.output)


def test_metrale_serve_script_is_declared() -> None:
    (script,) = entry_points(group="console_scripts", name="metrale-serve")
    assert script.value == "metrale_server.cli.main:serve_main"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--port", "http"], "--port"),
        (["--max-seq-len", "0"], "--max-seq-len"),
        (["--block-size", "0"], "--block-size"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--max-batch-size", "0"], "--max-batch-size"),
        (["--max-batch-size", "two"], "--max-batch-size"),
        (["--max-prefill-tokens", "-1"], "--max-prefill-tokens"),
        (["--num-kv-blocks", "0"], "--num-kv-blocks"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
        (["--dtype", "int3"], "--dtype"),
        (["--quantization", "int4"], "--quantization"),
        (["--device", "tpu"], "--device"),
        (["--kernel-backend", "triton"], "--kernel-backend"),
        (["--kernel-backend", "cupy", "--device", "cpu"], "--kernel-backend"),
        (["--device", "nonsense:x"], "--device"),
        (["--request-timeout", "-1"], "--request-timeout"),
        (["--drain-timeout", "soon"], "--drain-timeout"),
        (["--seed", "abc"], "--seed"),
        (["--seed", "-3"], "--seed"),
        (["--log-level", "loud"], "--log-level"),
        (["--task", "classify"], "--task"),
        (["--api-key", ""], "--api-key"),
        (["--api-key", "  "], "--api-key"),
        (["--served-model-name", ""], "--served-model-name"),
        (["--chat-template", "/no/such/template.jinja"], "--chat-template"),
        (["--api-key-file", "/no/such/keys.txt"], "--api-key-file"),
        (["--protect-observability"], "--protect-observability"),
        (["--ssl-certfile", "/no/such/cert.pem"], "--ssl-certfile"),
        (["--max-body-bytes", "10"], "--max-body-bytes"),
        (["--max-queued-requests", "-1"], "--max-queued-requests"),
        (["--max-connections", "-1"], "--max-connections"),
        (["--tool-call-parser", "pythonic"], "--tool-call-parser"),
        (["--tool-call-parser", "openai_required"], "--tool-call-parser"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice"),
        (["--reasoning-parser", "gpt_oss"], "--reasoning-parser"),
        (["--speculative-config", "ngram"], "--speculative-config"),
        (
            ["--speculative-config", '{"method": "ngram"}', "--tensor-parallel-size", "3"],
            "--speculative-config",
        ),
    ],
)
def test_bad_values_name_the_flag(runner: CliRunner, args: list[str], flag: str) -> None:
    result = runner.invoke(main, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_mtp_on_a_model_without_mtp_layers_is_refused_naming_the_flag(runner: CliRunner) -> None:
    result = runner.invoke(main, ["serve", "--speculative-config", '{"method": "mtp"}'])
    assert result.exit_code == 1, result.output
    assert "--speculative-config method mtp: llama" in result.output
    assert "has no MTP layers" in result.output


@pytest.mark.parametrize(("flags", "task"), [([], "auto"), (["--task", "embed"], "embed")])
def test_task_reaches_the_engine(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, flags: list[str], task: str
) -> None:
    served: list[ServeArgs] = []

    def fake_run_serve(args: ServeArgs, *, show_dashboard: bool = False) -> int:
        served.append(args)
        return 0

    monkeypatch.delenv("METRALE_DEFAULT_MODEL", raising=False)
    monkeypatch.setattr("metrale_server.cli.serve_runtime.run_serve", fake_run_serve)
    result = runner.invoke(main, ["serve", "--no-tui", *flags])
    assert result.exit_code == 0, result.output
    assert [args.engine_args.task for args in served] == [task]


def test_a_tls_key_without_its_certificate_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not read: the flags are checked first")
    result = runner.invoke(main, ["serve", "--ssl-keyfile", str(key)])
    assert result.exit_code == 2
    assert "--ssl-keyfile" in result.output
    assert "needs --ssl-certfile" in result.output


def test_empty_api_key_file_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("\n   \n\n")
    result = runner.invoke(main, ["serve", "--api-key-file", str(keys)])
    assert result.exit_code == 2
    assert "--api-key-file" in result.output
    assert "no API key" in result.output


def test_api_key_file_that_is_a_directory_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["serve", "--api-key-file", str(tmp_path)])
    assert result.exit_code == 2
    assert "--api-key-file" in result.output


def test_broken_chat_template_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{% for message in messages %}{{ message['content'] }")
    result = runner.invoke(main, ["serve", "--chat-template", str(template)])
    assert result.exit_code == 2
    assert "--chat-template" in result.output
    assert str(template) in result.output


def test_empty_chat_template_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("\n")
    result = runner.invoke(main, ["serve", "--chat-template", str(template)])
    assert result.exit_code == 2
    assert "--chat-template" in result.output


def test_missing_model_says_where_it_looked(runner: CliRunner) -> None:
    result = runner.invoke(main, ["serve", "no/such-model", "--offline"])
    assert result.exit_code == 1
    assert "no/such-model" in result.output
    assert "Looked at" in result.output


def test_undeclared_lever_is_refused(runner: CliRunner) -> None:
    result = runner.invoke(main, ["serve"], env={"METRALE_MAX_BODY_BYTE": "1"})
    assert result.exit_code == 2
    assert "METRALE_MAX_BODY_BYTE" in result.output


def test_port_in_use_names_the_flags(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "metrale_server", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert "--host/--port" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr


def test_int8_for_a_model_type_without_it_is_refused_before_loading(
    runner: CliRunner, tmp_path: Path
) -> None:
    from transformers import Qwen3MoeConfig

    Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
    ).save_pretrained(tmp_path)  # a config alone: the refusal comes before any weight is read
    result = runner.invoke(main, ["serve", str(tmp_path), "--quantization", "int8", "--no-tui"])
    assert result.exit_code == 1
    assert "cannot plan this serve: qwen3_moe: int8 weights are not supported" in result.output


def test_a_tensor_parallel_size_the_model_cannot_split_is_refused(runner: CliRunner) -> None:
    # The bundled SmolLM2 has 9 attention heads.
    result = runner.invoke(main, ["serve", "--tensor-parallel-size", "2", "--no-tui"])
    assert result.exit_code == 1, result.output
    assert "--tensor-parallel-size 2 does not divide num_attention_heads (9)" in result.output


def test_torchrun_world_size_must_match_the_flag(runner: CliRunner) -> None:
    launcher = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    result = runner.invoke(
        main,
        ["serve", "--tensor-parallel-size", "2"],
        env={**launcher, "MASTER_PORT": "29500"},
    )
    assert result.exit_code == 2, result.output
    assert "'--tensor-parallel-size': 2, but the launcher started WORLD_SIZE=4" in result.output
    half_set = runner.invoke(main, ["serve"], env={"RANK": "0", "WORLD_SIZE": "2"})
    assert half_set.exit_code == 1
    assert "LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not" in half_set.output
