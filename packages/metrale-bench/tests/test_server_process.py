from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from metrale_bench.server_process import (
    ServerProcess,
    ServerStartError,
    free_port,
    running_server,
    serve_command,
)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_serve_command_runs_this_interpreter() -> None:
    assert serve_command(["tiny", "--device", "cpu"], host="127.0.0.1", port=8123) == [
        sys.executable, "-m", "metrale_server", "serve", "tiny", "--device", "cpu",
        "--host", "127.0.0.1", "--port", "8123",
    ]  # fmt: skip


def test_a_child_that_exits_raises_with_its_log(tmp_path: Path) -> None:
    """Refused flag (or, in the bench's own environment, no metrale_server): the child exits
    before it is ready and the error carries its log."""
    log_path = tmp_path / "serve.log"
    with (
        pytest.raises(ServerStartError, match=r"the server exited with [12]") as error,
        running_server(["--no-such-flag"], ready_timeout_s=120, log_path=log_path),
    ):
        pass
    log = log_path.read_text()
    assert log
    assert log[-200:] in str(error.value)
    assert error.value.returncode in (1, 2)


def test_a_child_ended_by_a_signal_reports_it(tmp_path: Path) -> None:
    """A server that dies from a signal (llama.cpp's crash the peer bench retries) carries
    the negative status ``subprocess`` gives it."""
    log_path = tmp_path / "crash.log"
    crash = "import os, signal; print('crashing', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", crash], stdout=log, stderr=log)
    server = ServerProcess(process=process, host="127.0.0.1", port=free_port(), log_path=log_path)
    with pytest.raises(ServerStartError, match="exited with -11") as error:
        server.wait_ready(timeout_s=60)
    assert error.value.returncode == -signal.SIGSEGV
    assert "crashing" in str(error.value)
