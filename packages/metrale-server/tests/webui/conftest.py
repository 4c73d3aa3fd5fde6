"""Real servers for the web UI's tests (``met serve`` on the tiny random Llama, one per flag set,
shared by the session) and a headless Chromium driven by Playwright.

The browser is Debian's ``chromium`` package (Playwright's own download is never used): the
browser tests skip, saying why, where it or the ``playwright`` package is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from metrale_testing import served

if TYPE_CHECKING:
    from metrale_bench.server_process import ServerProcess

MODEL_NAME = "tiny"
API_KEY = "webui-test-key"
SERVE_FLAGS = ("--served-model-name", MODEL_NAME, "--max-batch-size", "8", "--no-tui")
# Where the browser tests leave their screenshots (docs/images/ holds a copy).
SCREENSHOT_DIR_ENV = "WEBUI_SCREENSHOT_DIR"


def serve(tiny_model_dir: Path, log_dir: Path, *flags: str) -> Any:
    return served([str(tiny_model_dir), *SERVE_FLAGS, *flags], log_dir)


@pytest.fixture(scope="session")
def webui_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with serve(tiny_model_dir, tmp_path_factory.mktemp("webui-server")) as server:
        yield server


@pytest.fixture(scope="session")
def keyed_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server started with ``--api-key`` and ``--protect-observability`` (the dashboard's
    ``/metrics`` and ``/memory`` need the key too)."""
    log_dir = tmp_path_factory.mktemp("webui-keyed")
    flags = ("--api-key", API_KEY, "--protect-observability")
    with serve(tiny_model_dir, log_dir, *flags) as server:
        yield server


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get(SCREENSHOT_DIR_ENV)
    path = Path(configured) if configured else tmp_path_factory.getbasetemp() / "webui-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Module scope, not session: while Playwright's sync API is open its event loop runs on this
# thread, so a later test of the same worker that calls asyncio.run would fail.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed"
    )
    executable = chromium_path()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            yield browser
        finally:
            browser.close()


def metric(base_url: str, *names: str) -> float:
    """The sum of these samples from ``/metrics`` (``metrale_num_requests_running``...)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(tuple(f"{name}{{" for name in names)):
            total += float(line.rsplit(" ", 1)[1])
    return total
