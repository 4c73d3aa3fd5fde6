"""The routes the dashboard reads (``/v1/server``, ``/v1/requests/recent``), and ``met top``'s
poller and plain-text snapshot against the real server."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from typing import Any

from metrale_bench.server_process import free_port
from metrale_server.api.recent_requests import FinishedRequest, RecentRequests
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.snapshot import Status


def test_server_info_reports_the_engine_shape(server: Any) -> None:
    body = server.client.get("/v1/server").json()
    engine = server.engine
    assert body["model"] == "tiny-llama"
    assert body["task"] == "generate"
    assert body["dtype"] == "float32"
    assert body["quantization"] == str(engine.loaded.quantization)
    # The suite sets METRALE_ENFORCE_EAGER: no torch.compile; int8 runs the native segments.
    assert body["layer_steps"] == LayerCompiler.state(engine.core.compiler, engine.loaded.model)
    assert body["layer_steps"] in {"eager", "native"}
    assert body["kernels"] == engine.loaded.model.backend.describe()
    assert body["device"] == "cpu"
    assert body["num_kv_blocks"] == engine.num_kv_blocks
    assert body["block_size"] == engine.args.block_size
    assert body["max_batch_size"] == 32
    assert body["max_seq_len"] == engine.max_seq_len
    assert body["started_at"] == server.state.started_at


def test_recent_requests_list_counts_and_never_text(server: Any) -> None:
    secret = "my very secret prompt"
    response = server.client.post(
        "/v1/completions",
        json={"model": "tiny-llama", "prompt": secret, "max_tokens": 5, "ignore_eos": True},
    )
    assert response.status_code == 200
    request_id = response.json()["id"]
    recent = server.client.get("/v1/requests/recent")
    assert recent.status_code == 200
    assert secret not in recent.text
    assert response.json()["choices"][0]["text"] not in recent.text
    newest = recent.json()["data"][0]
    assert newest["request_id"].startswith(request_id)
    assert newest["num_completion_tokens"] == 5
    assert newest["num_prompt_tokens"] == response.json()["usage"]["prompt_tokens"]
    assert newest["finish_reason"] == "length"
    assert newest["latency_s"] > 0


def test_the_ring_keeps_the_newest() -> None:
    ring = RecentRequests(num_kept=2)
    for i in range(3):
        ring.add(
            FinishedRequest(
                request_id=str(i),
                num_prompt_tokens=1,
                num_completion_tokens=1,
                latency_s=0.1,
                finish_reason="stop",
                finished_at=float(i),
            )
        )
    assert [r.request_id for r in ring.newest_first()] == ["2", "1"]


def test_the_poller_reads_a_real_server(server: Any) -> None:
    server.client.post(
        "/v1/completions",
        json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 3, "ignore_eos": True},
    )
    snapshot = HttpPoller(server.base_url).poll()
    assert snapshot.status is Status.SERVING
    assert snapshot.error is None or "/memory" not in snapshot.error
    assert snapshot.model == "tiny-llama"
    assert snapshot.server is not None
    assert snapshot.server.num_kv_blocks == server.engine.num_kv_blocks
    assert snapshot.metrics is not None
    assert snapshot.metrics.num_generation_tokens >= 3
    assert snapshot.metrics.num_finished >= 1
    assert snapshot.recent_requests
    assert snapshot.version is not None


def test_the_poller_sees_draining(server: Any) -> None:
    with server.overridden(is_draining=True):
        assert HttpPoller(server.base_url).poll().status is Status.DRAINING


# Seconds ``met top`` may take to print one snapshot: an interpreter start on a busy machine.
TOP_TIMEOUT_S = 120


def _met_top(*args: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metrale_server", "top", *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=TOP_TIMEOUT_S,
    )


def _finished_requests(server: Any) -> int:
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in server.client.get("/metrics").text.splitlines()
        if line.startswith("metrale_request_success_total{")
    )


def test_met_top_without_a_terminal_prints_one_snapshot_and_exits(server: Any) -> None:
    server.client.post(
        "/v1/completions",
        json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 3, "ignore_eos": True},
    )
    server.wait_idle()
    finished = _finished_requests(server)
    result = _met_top("--url", server.base_url)  # stdout is a pipe
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"metrale SERVING at {server.base_url}"
    fields = {line.split(" ", 1)[0]: line.split(" ", 1)[1].strip() for line in lines[1:]}
    assert fields["model"] == "tiny-llama (float32 on cpu)"
    assert fields["requests"].startswith(f"running 0, waiting 0, finished {finished} (")
    assert "prompt" in fields["tokens"]
    assert f"of {server.engine.num_kv_blocks} blocks" in fields["KV"]
    assert "\x1b" not in result.stdout  # plain text: no terminal control sequences


def test_met_top_once_on_a_terminal_prints_the_snapshot_too(server: Any) -> None:
    primary, secondary = pty.openpty()
    try:
        result = _met_top("--url", server.base_url, "--once", stdout=secondary)
        os.close(secondary)
        secondary = -1
        output = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert result.returncode == 0, result.stderr
    assert output.decode().startswith(f"metrale SERVING at {server.base_url}")


def test_met_top_without_a_server_says_so_and_exits_one() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = _met_top("--url", url)
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"met top: no server answers at {url}" in result.stderr
