"""The engine on a tiny random ``gpt_oss`` checkpoint (sinks, a 4-token window on every other
layer, the biased MoE): batching, preemption and chunked prefill never change greedy tokens;
plan == ledger byte for byte; ``met memory`` of the published gpt-oss-120b config."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrale_testing import save_random_model
from metrale_testing.engine_parity import (
    EngineGreedyChecks,
    assert_ledger_equals_plan,
    met_memory_plan,
    plan_weight_bytes,
)

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import KV_POOL, ROPE_TABLE

pytest.importorskip("transformers")

GPT_OSS_120B_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/gpt-oss-120b/config.json"
)
MAX_SEQ_LEN = 64
TINY = {
    "intermediate_size": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "swiglu_limit": 1.5,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "truncate": False,
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-gpt-oss")
    return save_random_model(path, default_tokenizer, "GptOssConfig", "GptOssForCausalLM", **TINY)


class TestGreedy(EngineGreedyChecks):
    max_seq_len = MAX_SEQ_LEN


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan(model_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(model_dir)
    # Every saved tensor at the serve dtype but the float32 router, by owner.
    engine = assert_ledger_equals_plan(
        model_dir, dtype, max_seq_len=MAX_SEQ_LEN, float32_names=".mlp.router."
    )
    allocated = engine.plan.allocated_by_owner()
    dtype_bytes = 4 if dtype == "float32" else 2
    # Both layers (one sliding, one full) cache K and V: 2 heads x 16 values each.
    assert engine.plan.kv_bytes_per_token == config.num_hidden_layers * 2 * 2 * 16 * dtype_bytes
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 16 * 4


def test_met_memory_of_the_published_gpt_oss_120b_config() -> None:
    plan = met_memory_plan(GPT_OSS_120B_CONFIG, device_memory_gib=400)
    assert plan["model_type"] == "gpt_oss"
    owners = plan["by_owner"]
    weights = plan_weight_bytes(plan)
    # 116.83e9 parameters (transformers' count on this config), the MXFP4 experts dequantized
    # to bfloat16 at load, the routers in float32.
    routers = 36 * 128 * (2880 + 1)
    assert weights == 2 * (116_829_156_672 - routers) + 4 * routers
    # 18 full layers x 8 KV heads x 64 x (K and V) x 2 bytes (the 18 sliding layers in rings
    # per sequence, 41 blocks of 16 tokens each).
    assert plan["kv_bytes_per_token"] == 18 * 8 * 64 * 2 * 2
    assert owners["sliding_window_kv"] == 8 * 18 * 2 * 41 * 16 * 8 * 64 * 2
    assert owners[ROPE_TABLE] == 16384 * 64 * 4
