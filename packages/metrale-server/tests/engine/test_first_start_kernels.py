"""On a first start on a CPU, ``met serve`` says ready, and ``LLM()`` and ``met generate``
start, only once the native kernels are built: the engine waits for the background build (the
reference ops it would serve with meanwhile are tens of times slower on q4 weights)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from metrale_server.engine.engine import Engine


def _engine(*, builds_kernels: bool) -> Any:
    compiler = SimpleNamespace(builds_kernels=builds_kernels, prepared=threading.Event())
    return SimpleNamespace(core=SimpleNamespace(compiler=compiler))


def test_the_engine_waits_until_the_native_kernels_are_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _engine(builds_kernels=True)
    prepared = engine.core.compiler.prepared
    threading.Timer(0.2, prepared.set).start()
    with caplog.at_level(logging.INFO, logger="metrale.engine"):
        assert Engine.wait_for_native_kernels(engine)
    assert prepared.is_set()
    assert "building the native CPU kernels" in caplog.text


@pytest.mark.parametrize(
    "engine", [_engine(builds_kernels=False), SimpleNamespace(core=SimpleNamespace(compiler=None))]
)
def test_nothing_to_build_does_not_wait(caplog: pytest.LogCaptureFixture, engine: Any) -> None:
    with caplog.at_level(logging.INFO, logger="metrale.engine"):
        assert not Engine.wait_for_native_kernels(engine)
    assert "native CPU kernels" not in caplog.text
