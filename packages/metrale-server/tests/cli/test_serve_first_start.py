"""On a first start on a CPU, ``met serve`` says ready only once the native kernels are built:
the loading thread waits for the background build (the reference ops it would serve with
meanwhile are tens of times slower on q4 weights)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from metrale_server.cli import serve_runtime


def _engine(*, builds_kernels: bool) -> Any:
    compiler = SimpleNamespace(builds_kernels=builds_kernels, prepared=threading.Event())
    return SimpleNamespace(core=SimpleNamespace(compiler=compiler))


def test_loading_ends_once_the_native_kernels_are_built(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(builds_kernels=True)
    prepared = engine.core.compiler.prepared
    monkeypatch.setattr(serve_runtime, "build_engine", lambda *args: engine)
    threading.Timer(0.2, prepared.set).start()
    with caplog.at_level(logging.INFO, logger="metrale.serve"):
        assert serve_runtime.load_engine(None, None) is engine  # type: ignore[arg-type]
    assert prepared.is_set()
    assert "building the native CPU kernels" in caplog.text


@pytest.mark.parametrize(
    "engine", [_engine(builds_kernels=False), SimpleNamespace(core=SimpleNamespace(compiler=None))]
)
def test_nothing_to_build_does_not_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, engine: Any
) -> None:
    monkeypatch.setattr(serve_runtime, "build_engine", lambda *args: engine)
    with caplog.at_level(logging.INFO, logger="metrale.serve"):
        assert serve_runtime.load_engine(None, None) is engine  # type: ignore[arg-type]
    assert "native CPU kernels" not in caplog.text
