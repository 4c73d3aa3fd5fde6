"""GLM-5.3 served: ``met serve`` on a tiny glm5_next checkpoint answers the ``openai`` client,
and ``GET /memory`` shows the flat indexer's per-sequence state allocated exactly as planned
(the seed's formula times the batch), and none with the paged default."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from metrale_bench.server_process import ServerProcess
from metrale_config import model_config_from_hf_file
from metrale_model_arch.memory.seq_state_reserve import per_sequence_state_bytes
from metrale_model_arch.owners import LINEAR_STATE_POOL, PER_SEQUENCE_STATE
from metrale_server import EngineArgs, build_engine

openai = pytest.importorskip("openai")

MAX_SEQ_LEN = 256
MAX_BATCH_SIZE = 3


def test_met_serve_answers_openai_with_the_flat_indexer_as_planned(tiny_glm5_dir: Path) -> None:
    env = {**os.environ, "METRALE_GLM_DSA_INDEXER_FLAT": "1"}
    server = ServerProcess.start(
        [str(tiny_glm5_dir), "--max-seq-len", str(MAX_SEQ_LEN),
         "--max-batch-size", str(MAX_BATCH_SIZE), "--no-tui"],
        env=env,
    )  # fmt: skip
    try:
        server.wait_ready(timeout_s=120)
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=60)
        model = client.models.list().data[0].id
        completion = client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=8, temperature=0
        )
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
        memory = httpx.get(f"{server.base_url}/memory", timeout=30).json()
        log = server.log_text()
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)
    assert completion.usage.completion_tokens == 8
    assert completion.choices[0].finish_reason == "length"
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens > 0
    seed = per_sequence_state_bytes(model_config_from_hf_file(tiny_glm5_dir), MAX_SEQ_LEN, False)
    expected = seed.for_batch(MAX_BATCH_SIZE)
    assert expected > 0
    assert memory["ledger_by_owner"][PER_SEQUENCE_STATE] == expected
    assert memory["plan_by_owner"][PER_SEQUENCE_STATE] == expected
    assert (
        memory["ledger_by_owner"][LINEAR_STATE_POOL] == memory["plan_by_owner"][LINEAR_STATE_POOL]
    )
    assert "prefix caching off (the model keeps per-sequence state" in log
    assert "Per-sequence state reserve" in log


def test_memory_shows_no_sequence_indexer_state_with_the_paged_default(
    tiny_glm5_dir: Path,
    serve_engine: Callable[..., AbstractContextManager[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("METRALE_GLM_DSA_INDEXER_FLAT", raising=False)
    engine = build_engine(
        EngineArgs(
            model=str(tiny_glm5_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=MAX_BATCH_SIZE,
        )
    )
    with serve_engine(engine, "tiny-glm5") as server:
        response = server.client.post(
            "/v1/completions",
            json={"model": "tiny-glm5", "prompt": "Hello", "max_tokens": 4, "temperature": 0},
        )
        memory = server.client.get("/memory").json()
    assert response.status_code == 200, response.text
    assert memory["plan_by_owner"].get(PER_SEQUENCE_STATE, 0) == 0
    assert PER_SEQUENCE_STATE not in memory["ledger_by_owner"]
    assert memory["ledger_by_owner"][LINEAR_STATE_POOL] > 0
