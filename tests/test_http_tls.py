"""``met serve`` over TLS, its key from ``METRALE_API_KEY`` (out of sight of ``ps``), its
observability behind the key, called with the ``openai`` client trusting a self-signed
certificate made for the test."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from metrale_bench.server_process import ServerProcess

API_KEY = "tls-test-key"
SERVED_NAME = "tiny-llama"


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key, made by ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed to make the test's certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def tls_server(
    tiny_model_factory: Callable[[int], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    files = tmp_path_factory.mktemp("tls")
    cert, key = self_signed_certificate(files)
    args = [
        str(tiny_model_factory(256)),
        "--served-model-name", SERVED_NAME,
        "--device", "cpu",
        "--dtype", "float32",
        "--max-batch-size", "4",
        "--num-kv-blocks", "64",
        "--ssl-certfile", str(cert),
        "--ssl-keyfile", str(key),
        "--protect-observability",
        "--no-tui",
    ]  # fmt: skip
    env = {**os.environ, "METRALE_API_KEY": API_KEY}
    process = ServerProcess.start(args, env=env, log_path=files / "server.log")
    try:
        wait_ready(f"https://127.0.0.1:{process.port}", cert, process)
        yield process, cert
    finally:
        exit_code = process.stop(timeout_s=30)
    assert exit_code == 0, process.log_text()


def trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def wait_ready(base_url: str, cert: Path, process: ServerProcess) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not process.is_running:
            pytest.fail(f"the server exited:\n{process.log_tail()}")
        try:
            if httpx.get(f"{base_url}/health", verify=trusting(cert), timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the server was not ready in 120 s:\n{process.log_tail()}")


def test_the_openai_client_calls_the_server_over_tls(
    tls_server: tuple[ServerProcess, Path],
) -> None:
    process, cert = tls_server
    base_url = f"https://127.0.0.1:{process.port}"
    with httpx.Client(verify=trusting(cert)) as http_client:
        client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key=API_KEY, http_client=http_client, max_retries=0
        )
        reply = client.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=4,
            temperature=0.0,
        )
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage is not None
        assert reply.usage.completion_tokens >= 1
        unkeyed = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="wrong", http_client=http_client, max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            unkeyed.models.list()
    with pytest.raises(httpx.ConnectError):  # the certificate is not in the default store
        httpx.get(f"{base_url}/health", timeout=5)
    with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP is not served
        httpx.get(f"http://127.0.0.1:{process.port}/health", timeout=5)
    assert f"address: https://127.0.0.1:{process.port}/" in process.log_text()


def test_observability_needs_the_key_from_the_environment(
    tls_server: tuple[ServerProcess, Path],
) -> None:
    process, cert = tls_server
    base_url = f"https://127.0.0.1:{process.port}"
    with httpx.Client(base_url=base_url, verify=trusting(cert)) as client:
        assert client.get("/health").status_code == 200
        for path in ("/metrics", "/memory"):
            assert client.get(path).status_code == 401
            keyed = client.get(path, headers={"Authorization": f"Bearer {API_KEY}"})
            assert keyed.status_code == 200
    command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    assert API_KEY.encode() not in command_line
