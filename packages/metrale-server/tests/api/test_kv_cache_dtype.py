"""``--kv-cache-dtype`` served: ``/memory`` says the format and prices the smaller rows, the pool
allocated equals the plan byte for byte, the same KV budget holds more tokens, requests run, and
a model whose cache cannot be quantized is refused naming the flag."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_model_arch.memory import KV_POOL, RUNTIME_HEADROOM
from metrale_server import EngineArgs, build_engine

MAX_SEQ_LEN = 128
# The pool's cap binds (many batch slots, a small budget): the bytes are the same, the tokens not.
KV_GIB = 0.002


def engine_args(model: Path, kv_cache_dtype: str) -> EngineArgs:
    return EngineArgs(
        model=str(model),
        dtype="float32",
        device="cpu",
        max_seq_len=MAX_SEQ_LEN,
        max_batch_size=256,
        kv_cache_memory_gib=KV_GIB,
        kv_cache_dtype=kv_cache_dtype,
    )


@pytest.fixture(scope="module")
def int8_server(
    tiny_model_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    with serve_engine(build_engine(engine_args(tiny_model_dir, "int8"))) as running:
        yield running


def test_memory_reports_the_format_and_its_price(int8_server: Any, tiny_model_dir: Path) -> None:
    document = int8_server.client.get("/memory").json()
    assert document["kv_cache_dtype"] == "int8"
    config = int8_server.engine.loaded.config
    heads, dim = config.num_key_value_heads, config.head_dim
    # Per layer, K and V: a row of head_dim int8 values and a float16 scale per kv head.
    assert document["kv_bytes_per_token"] == config.num_hidden_layers * 2 * heads * (dim + 2)
    assert document["ledger_by_owner"][KV_POOL] == document["plan_by_owner"][KV_POOL]
    assert document["ledger_by_owner"] == {
        owner: size
        for owner, size in document["plan_by_owner"].items()
        if size > 0 and owner != RUNTIME_HEADROOM
    }
    k_cache, v_cache = int8_server.engine.core.runner.kv_caches[0]
    assert k_cache.dtype == v_cache.dtype == torch.int8
    assert k_cache.shape[-1] == dim + 2

    auto = build_engine(engine_args(tiny_model_dir, "auto"))
    assert auto.plan.inputs.kv_cache_dtype == "auto"
    # float32 rows of 16 values against 16 bytes and a scale: 64 / 18 the tokens.
    assert document["kv_blocks"] >= 3.5 * auto.num_kv_blocks
    assert abs(document["plan_by_owner"][KV_POOL] - auto.plan.by_owner()[KV_POOL]) < (
        auto.plan.kv_block_bytes
    )


def test_requests_run_and_leave_the_ledger_unchanged(int8_server: Any) -> None:
    before = int8_server.client.get("/memory").json()
    for prompt in ("Hello", "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12"):
        response = int8_server.client.post(
            "/v1/completions",
            json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 24, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 24
    int8_server.wait_idle()
    after = int8_server.client.get("/memory").json()
    assert after["ledger_by_owner"] == before["ledger_by_owner"]


def test_an_mla_model_is_refused_naming_the_flag(tiny_glm5_dir: Path) -> None:
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8_e4m3: glm5_next's MLA latent"):
        build_engine(
            EngineArgs(model=str(tiny_glm5_dir), device="cpu", max_seq_len=64, kv_cache_dtype="fp8")
        )


def test_an_unknown_format_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3"):
        EngineArgs(kv_cache_dtype="fp4")
