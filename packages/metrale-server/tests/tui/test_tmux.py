"""``met serve``, ``met top`` and ``met chat`` in a real terminal: tmux runs them, sends keys
and reads the screen back with ``capture-pane``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from metrale_bench.server_process import ServerProcess, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

WIDTH, HEIGHT = 80, 24


class Tmux:
    """A private tmux server (its own socket); each window's command writes its exit status
    to a file when it ends (tmux 3.3 sometimes never reaps a pane's process, so
    ``#{pane_dead_status}`` cannot be trusted)."""

    def __init__(self, name: str, status_dir: Path) -> None:
        self.socket = name
        self.status_dir = status_dir

    def run(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def open(self, window: str, command: list[str]) -> None:
        status_file = shlex.quote(str(self.status_dir / window))
        shell = f"env -u METRALE_NO_TUI {shlex.join(command)}; echo $? > {status_file}"
        if window == "0":
            self.run("new-session", "-d", "-s", "t", "-x", str(WIDTH), "-y", str(HEIGHT), shell)
            self.run("set-option", "-g", "remain-on-exit", "on")
        else:
            self.run("new-window", "-t", "t", "-n", window, shell)

    def screen(self, window: str) -> str:
        return self.run("capture-pane", "-p", "-t", f"t:{window}")

    def keys(self, window: str, *keys: str) -> None:
        self.run("send-keys", "-t", f"t:{window}", *keys)

    def wait_for(self, window: str, check: Callable[[str], bool], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen(window)
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"window {window} never showed it; screen:\n{screen}")
            time.sleep(0.05)

    def exit_status(self, window: str, timeout_s: float) -> int:
        status_file = self.status_dir / window
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = status_file.read_text() if status_file.exists() else ""
            if text.endswith("\n"):
                return int(text)
            time.sleep(0.05)
        raise AssertionError(f"window {window} still runs:\n{self.screen(window)}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    session = Tmux(f"metrale-test-{os.getpid()}", tmp_path)
    try:
        yield session
    finally:
        session.kill()


def met(*args: str) -> list[str]:
    return [sys.executable, "-m", "metrale_server", *args]


def finished_count(screen: str) -> int:
    match = re.search(r"finished\s+(\d+)", screen)
    return int(match.group(1)) if match else -1


def complete(base_url: str, num_requests: int) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for _ in range(num_requests):
            body = {"model": "tiny", "prompt": "a secret prompt", "max_tokens": 8}
            assert client.post("/v1/completions", json=body).status_code == 200


def test_serve_and_top_show_the_server_and_quit_on_q(tmux: Tmux, tiny_model_dir: Path) -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    tmux.open(
        "0",
        met("serve", str(tiny_model_dir), "--port", str(port), "--served-model-name", "tiny",
            "--max-batch-size", "4", "--max-seq-len", "256"),
    )  # fmt: skip
    tmux.wait_for("0", lambda s: " LOADING " in s, timeout_s=30)
    screen = tmux.wait_for("0", lambda s: " SERVING " in s, timeout_s=60)
    assert finished_count(screen) == 0
    assert "kv " in screen
    assert "batch 4" in screen

    tmux.open("top", met("top", "--url", base_url, "--interval", "0.25"))
    tmux.wait_for("top", lambda s: " SERVING " in s and finished_count(s) == 0, timeout_s=30)

    complete(base_url, 3)
    served = tmux.wait_for("0", lambda s: finished_count(s) == 3, timeout_s=15)
    watched = tmux.wait_for("top", lambda s: finished_count(s) == 3, timeout_s=15)
    for screen in (served, watched):
        assert "a secret prompt" not in screen
        assert all(len(line) <= WIDTH for line in screen.splitlines())

    tmux.keys("top", "Tab")
    tmux.wait_for("top", lambda s: "Last requests" in s and "length" in s, timeout_s=10)
    tmux.keys("top", "q")
    assert tmux.exit_status("top", timeout_s=10) == 0

    tmux.keys("0", "?")
    tmux.wait_for("0", lambda s: "show or hide this help" in s, timeout_s=10)
    tmux.keys("0", "q")
    assert tmux.exit_status("0", timeout_s=30) == 0
    assert "stopped" in tmux.screen("0")  # the log's last lines are left on the terminal


def test_chat_streams_resets_and_exits(tmux: Tmux, tiny_model_dir: Path) -> None:
    server = ServerProcess.start([str(tiny_model_dir), "--max-seq-len", "256"])
    try:
        server.wait_ready(timeout_s=60)
        tmux.open("0", met("chat", "--url", server.base_url, "--max-tokens", "8"))
        tmux.wait_for("0", lambda s: s.rstrip().endswith("you>"), timeout_s=30)
        tmux.keys("0", "hello there", "Enter")
        tmux.wait_for("0", lambda s: s.count("you>") == 2 and "assistant> " in s, timeout_s=30)
        tmux.keys("0", "/reset", "Enter")
        tmux.wait_for("0", lambda s: "(conversation cleared)" in s, timeout_s=10)
        tmux.keys("0", "/exit", "Enter")
        assert tmux.exit_status("0", timeout_s=10) == 0
    finally:
        assert server.stop(timeout_s=30) == 0
