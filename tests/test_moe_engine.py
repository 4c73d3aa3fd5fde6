"""The engine on tiny random MoE models (qwen3_moe, mixtral): batching, preemption and chunked
prefill never change greedy tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from metrale_testing.engine_parity import PROMPTS, EngineGreedyChecks

from metrale_config import model_config_from_hf_file

MODEL_TYPES = ("qwen3_moe", "mixtral")


@pytest.fixture(scope="module", params=MODEL_TYPES)
def model_dir(request: pytest.FixtureRequest, tiny_moe_factory: Callable[[str], Path]) -> Path:
    path = tiny_moe_factory(request.param)
    config = model_config_from_hf_file(path)
    assert config.model_type == request.param
    assert config.moe is not None
    return path


class TestGreedy(EngineGreedyChecks):
    prompts = (
        *PROMPTS[:5],
        "Water boils at a temperature of",
        PROMPTS[5],
        "SELECT name FROM users WHERE",
    )
    max_seq_len = 128
    preemption_num_kv_blocks = 8
    chunk_max_batch_tokens = 7
    is_alone_one_engine_per_prompt = True
