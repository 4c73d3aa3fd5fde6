"""``ServeArgs`` and the files ``met serve`` reads: API keys, chat templates, model names."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metrale_model_arch import ModelSource, resolve_model
from metrale_server import EngineArgs
from metrale_server.cli.serve_args import (
    ServeArgs,
    default_served_model_name,
    read_api_key_file,
    read_chat_template_file,
)


def _args(host: str, port: int = 8888) -> ServeArgs:
    return ServeArgs(engine_args=EngineArgs(), served_model_name="m", host=host, port=port)


@pytest.mark.parametrize(
    ("host", "bind", "is_all"),
    [
        ("127.0.0.1", "127.0.0.1:8888", False),
        ("localhost", "localhost:8888", False),
        ("0.0.0.0", "0.0.0.0:8888", True),
        ("::", "[::]:8888", True),
        ("[::]", "[::]:8888", True),
        ("::1", "[::1]:8888", False),
    ],
)
def test_bind_address_and_all_interfaces(host: str, bind: str, is_all: bool) -> None:
    args = _args(host)
    assert args.bind == bind
    assert args.is_all_interfaces is is_all


def test_api_keys_never_show_in_repr() -> None:
    args = ServeArgs(engine_args=EngineArgs(), served_model_name="m", api_keys=("sk-secret",))
    assert "sk-secret" not in repr(args)


def test_api_key_file_one_key_per_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("  alpha \n\nbeta\r\n\t\n")
    assert read_api_key_file(path) == ("alpha", "beta")


@pytest.mark.parametrize("content", ["", "\n \n", "   "])
def test_api_key_file_without_keys_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "keys"
    path.write_text(content)
    with pytest.raises(ValueError, match="no API key"):
        read_api_key_file(path)


def test_missing_api_key_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        read_api_key_file(tmp_path / "absent")


def test_chat_template_file_renders(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    template = read_chat_template_file(path)
    assert template.origin == str(path)
    assert template.render([{"role": "user", "content": "hi"}]) == "[user] hi\n"


def test_chat_template_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.jinja"
    path.write_text("{% if %}")
    with pytest.raises(ValueError, match=str(path)):
        read_chat_template_file(path)


def test_chat_template_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jinja"
    path.write_bytes(b"\xff\xfe{{ x }}\xff")
    with pytest.raises(ValueError, match="cannot read"):
        read_chat_template_file(path)


def test_served_name_of_a_gguf_is_its_stem() -> None:
    assert default_served_model_name(resolve_model(None)) == "SmolLM2-135M-Instruct.Q4_1"


def test_served_name_of_a_directory_is_the_name_asked_for(tmp_path: Path) -> None:
    source = ModelSource(kind="dir", path=tmp_path, name="org/my-model")
    assert default_served_model_name(source) == "org/my-model"


@pytest.mark.parametrize(
    ("host", "is_warned"), [("0.0.0.0", True), ("::", True), ("127.0.0.1", False)]
)
def test_all_interfaces_are_warned_about(
    host: str, is_warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from metrale_server.cli.serve_runtime import warn_if_exposed

    with caplog.at_level(logging.WARNING):
        warn_if_exposed(_args(host))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warnings) is is_warned
    if is_warned:
        assert f"bound to all interfaces ({host})" in warnings[0]
        assert "--api-key" in warnings[0]


def test_engine_args_refuse_an_unknown_kernel_backend() -> None:
    assert EngineArgs().kernel_backend == "auto"
    with pytest.raises(ValueError, match="kernel_backend must be one of auto, torch, cpu, cupy"):
        EngineArgs(kernel_backend="triton")
