"""A bounded load test, kind by kind: ten adversarial requests of one kind at once, three rounds,
sent from a process of their own. Meanwhile /health, asked from a third process as any client
would, answers at once (p99 under 50 ms), a normal request takes at most twice what it takes
under the same load of benign twins (the same work without the adversarial part; a cheap GET
for a request that is refused), and afterwards nothing is left running or held. A kind over
either bound is measured a second time and fails only if it is over again.

All kinds at once (90 requests in one burst, the attacker on the same two cores) is not held
to 50 ms: the event loop then queues ~90 requests' HTTP work, and /health waited 19-87 ms at
p99 behind it (two runs, measured), with no single request blocking the loop."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "tiny-llama"
NUM_EACH = 10
ROUNDS = 3  # each attacker sends its request this many times
HEALTH_P99_S = 0.05
MAX_SLOWDOWN = 2.0  # a normal request under the kind, against under its benign twin
ATTEMPTS = 2
PAUSE_S = 0.25  # between an answer and the attacker's next request

ATTACKER = """
import json, sys, threading, time
import httpx

base_url, rounds, pause_s, num_each, path = sys.argv[1:6]
kinds = json.load(open(path))
statuses = {index: [] for index in range(len(kinds))}
threads_per_round = len(kinds) * int(num_each)
clients = [httpx.Client(base_url=base_url, timeout=120) for _ in range(threads_per_round)]
barrier = threading.Barrier(threads_per_round + 1)

def attack(index, kind, client):
    body = kind["body"].encode() or None
    barrier.wait()
    for _ in range(int(rounds)):
        response = client.request(
            kind["method"], kind["path"], content=body, headers=kind["headers"]
        )
        statuses[index].append(response.status_code)
        time.sleep(float(pause_s))

pairs = [(i, kind) for i, kind in enumerate(kinds) for _ in range(int(num_each))]
threads = [threading.Thread(target=attack, args=(i, kind, client))
           for (i, kind), client in zip(pairs, clients)]
for thread in threads:
    thread.start()
barrier.wait()
print("started", flush=True)
for thread in threads:
    thread.join()
print(json.dumps(statuses), flush=True)
"""


# Asks /health every 10 ms, and a normal request every tenth time, until its stdin closes;
# then prints both lists of latencies.
PROBER = """
import json, sys, threading, time
import httpx

base_url, chat, model = sys.argv[1:4]
normal = {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
          "max_tokens": 8, "temperature": 0.0}
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
health_s, normal_s = [], []
with httpx.Client(base_url=base_url, timeout=120) as client:
    print("probing", flush=True)
    while not done.is_set():
        asked = time.monotonic()
        assert client.get("/health").status_code == 200
        health_s.append(time.monotonic() - asked)
        if len(health_s) % 10 == 0:
            asked = time.monotonic()
            assert client.post(chat, json=normal).status_code == 200
            normal_s.append(time.monotonic() - asked)
        time.sleep(0.01)
print(json.dumps({"health_s": health_s, "normal_s": normal_s}), flush=True)
"""


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    text = body if isinstance(body, str) else json.dumps(body)
    headers = headers or {"content-type": "application/json"}
    return {"method": "POST", "path": path, "body": text, "headers": headers}


CHEAP = {"method": "GET", "path": "/health/live", "body": "", "headers": {}}


def adversaries(server: Any) -> list[tuple[dict[str, Any], dict[str, Any], set[int]]]:
    """Each kind: the adversarial request, its benign twin, the statuses it may get."""
    engine = server.engine
    limit = engine.max_seq_len * engine.loaded.tokenizer.max_token_bytes()
    huge_text = "a" * (limit + 1)
    properties = {f"p{i}": {"type": "integer"} for i in range(10_000)}
    schema = {"name": "big", "schema": {"type": "object", "properties": properties}}
    user = [{"role": "user", "content": "x"}]
    served = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "n": 4}
    bias = {str(i): 5.0 for i in range(300)}
    return [
        (post(COMPLETIONS, {"model": MODEL, "prompt": huge_text}), CHEAP, {400}),
        (post("/tokenize", {"model": MODEL, "prompt": huge_text * 16}), CHEAP, {400}),
        (post(COMPLETIONS, {**served, "logit_bias": bias}), post(COMPLETIONS, served), {200, 429}),
        (
            post(COMPLETIONS, {**served, "stop_token_ids": list(range(256))}),
            post(COMPLETIONS, served),
            {200, 429},
        ),
        (post(COMPLETIONS, {**served, "logit_bias": {**bias, "300": 1.0}}), CHEAP, {400}),
        (
            post(CHAT, {"model": MODEL, "messages": user,
                        "response_format": {"type": "json_schema", "json_schema": schema}}),
            CHEAP,
            {400},
        ),
        (post(CHAT, {"model": MODEL, "messages": user, "chat_template_kwargs": {"self": 1}}),
         CHEAP, {400}),
        (post(COMPLETIONS, '{"prompt": "x"}', {"content-type": "text/plain"}), CHEAP, {415}),
        ({**CHEAP, "path": "/v1/models", "headers": {"host": "evil.example"}}, CHEAP, {400}),
    ]  # fmt: skip


def under_load(
    server: Any, kinds: list[dict[str, Any]], path: Path
) -> tuple[list[float], list[float], dict[str, list[int]]]:
    """/health latencies, normal request latencies and each kind's statuses while ``kinds``
    are sent."""
    path.write_text(json.dumps(kinds))
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBER, server.base_url, CHAT, MODEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert prober.stdout is not None
    assert prober.stdout.readline().strip() == "probing"
    args = [server.base_url, str(ROUNDS), str(PAUSE_S), str(NUM_EACH), str(path)]
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, *args], stdout=subprocess.PIPE, text=True
    )
    assert attacker.stdout is not None
    assert attacker.stdout.readline().strip() == "started"
    output, _ = attacker.communicate(timeout=120)
    assert attacker.returncode == 0
    probed, _ = prober.communicate(input="", timeout=60)
    assert prober.returncode == 0
    latencies = json.loads(probed.strip().splitlines()[-1])
    return (
        latencies["health_s"],
        latencies["normal_s"],
        json.loads(output.strip().splitlines()[-1]),
    )


def measured(
    server: Any, index: int, kind: dict[str, Any], twin: dict[str, Any], tmp_path: Path
) -> tuple[float, float, set[int]]:
    """/health p99 and the normal request's slowdown under ``kind`` (against its twin), and
    the statuses ``kind`` got."""
    _, benign_s, _ = under_load(server, [twin], tmp_path / f"twin-{index}.json")
    health_s, normal_s, statuses = under_load(server, [kind], tmp_path / f"{index}.json")
    assert len(statuses["0"]) == ROUNDS * NUM_EACH
    assert len(health_s) >= 10, kind["path"]
    assert benign_s, kind["path"]
    assert normal_s, kind["path"]
    p99 = statistics.quantiles(health_s, n=100)[98]
    ratio = statistics.median(normal_s) / statistics.median(benign_s)
    return p99, ratio, set(statuses["0"])


@pytest.mark.serial
def test_adversarial_requests_do_not_stall_the_server(server: Any, tmp_path: Path) -> None:
    """A kind over the bounds is measured once more: a request that blocks the loop does so
    every time, while the shared machine's own hiccups (a 70 ms one was seen once in CI on a
    cheap refused kind) do not repeat."""
    warm = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    assert server.client.post(CHAT, json=warm).status_code == 200
    kinds = adversaries(server)
    report: list[str] = []
    with server.overridden(
        max_body_bytes=8 << 20, allowed_hosts=frozenset({"127.0.0.1", "localhost"})
    ):
        for index, (kind, twin, allowed) in enumerate(kinds):
            for attempt in range(ATTEMPTS):
                p99, ratio, seen = measured(server, index, kind, twin, tmp_path)
                assert seen <= allowed, (kind["path"], seen, allowed)
                if 200 in allowed:
                    assert 200 in seen, kind["path"]  # the served kinds ran
                report.append(
                    f"{kind['path']} #{index}.{attempt}: /health p99 {p99 * 1e3:.0f} ms, "
                    f"x{ratio:.2f}"
                )
                if p99 < HEALTH_P99_S and ratio <= MAX_SLOWDOWN:
                    break
            assert p99 < HEALTH_P99_S, report
            assert ratio <= MAX_SLOWDOWN, report
    server.wait_idle()
