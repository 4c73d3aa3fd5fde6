"""``met serve --tensor-parallel-size 2`` (workers it starts) and ``torchrun --nproc-per-node
2 -m metrale_server serve`` serve the ``openai`` client what one rank would; a killed worker
ends the server, non-zero, naming the rank, and leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from metrale_bench.server_process import ServerProcess, free_port
from metrale_server import LLM, SamplingParams

PROMPT = "The capital of France is"
MAX_TOKENS = 8
SERVE_FLAGS = ("--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "1100")
SERVE_FLAGS += ("--max-batch-size", "4", "--max-seq-len", "4096", "--no-tui")


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[int], Path]) -> Path:
    return tiny_model_factory(4096)


@pytest.fixture(scope="module")
def expected_text(model_dir: Path) -> str:
    with LLM(str(model_dir), dtype="float32", quantization="none", num_kv_blocks=64) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        return llm.generate(PROMPT, params)[0].outputs[0].text


def _start(command: list[str], port: int, log_path: Path) -> ServerProcess:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: what is left of it can be seen
        )
    server = ServerProcess(process=process, host="127.0.0.1", port=port, log_path=log_path)
    try:
        server.wait_ready(timeout_s=120)
    except BaseException:
        _kill_group(server)
        raise
    return server


def _kill_group(server: ServerProcess) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.process.wait()


def _group_is_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        _kill_group(server)


def _complete(server: ServerProcess) -> str:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    return completion.choices[0].text


def test_serve_starts_its_workers_and_a_killed_one_ends_it(
    model_dir: Path, expected_text: str, servers: list[ServerProcess], tmp_path: Path
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "metrale_server", "serve", str(model_dir), *SERVE_FLAGS]
    command += ["--served-model-name", "tiny", "--tensor-parallel-size", "2"]
    command += ["--port", str(port)]
    server = _start(command, port, tmp_path / "serve.log")
    servers.append(server)
    assert _complete(server) == expected_text
    memory = httpx.get(f"{server.base_url}/memory", timeout=10).json()
    assert [rank["rank"] for rank in memory["ranks"]] == [0, 1]
    for rank in memory["ranks"]:
        assert rank["ledger_by_owner"] == rank["planned_by_owner"]
    match = re.search(r"rank 1 pid (\d+)", server.log_text())
    assert match is not None, server.log_tail()
    worker_pid = int(match[1])

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    os.kill(worker_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in stream:
            pass
    exit_code = server.process.wait(30)
    assert time.monotonic() - killed_at < 30
    assert exit_code != 0
    assert f"rank 1 (pid {worker_pid}) exited with code -9" in server.log_text()
    assert _group_is_gone(server.pid, 10), "a process of the server outlived it"


def test_torchrun_ranks_serve_on_rank_zero(
    model_dir: Path, expected_text: str, servers: list[ServerProcess], tmp_path: Path
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command += ["-m", "metrale_server", "serve", str(model_dir), *SERVE_FLAGS]
    command += ["--served-model-name", "tiny", "--port", str(port)]
    server = _start(command, port, tmp_path / "torchrun.log")
    servers.append(server)
    assert _complete(server) == expected_text
    assert "tensor parallel: 2 ranks over gloo (started by the launcher)" in server.log_text()
    server.terminate()
    server.process.wait(60)
    assert _group_is_gone(server.pid, 10), "a rank outlived torchrun"
