"""The engine on a tiny random ``deepseek_v32`` checkpoint (``index_topk`` 8, shorter than the
prompts and their continuations): batching, preemption (recompute) and chunked prefill never
change greedy tokens; plan == ledger byte for byte with the latent and the indexer keys in the
KV pool, whatever the GLM-5.3 flat-indexer lever says; ``met memory`` of DeepSeek-V3's
published config made V3.2 (its ``index_*`` fields added)."""

from __future__ import annotations

import json
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
from metrale_model_arch.memory import KV_POOL, PER_SEQUENCE_STATE

pytest.importorskip("transformers")

DEEPSEEK_V3_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/deepseek-v3/config.json"
)
MAX_SEQ_LEN = 64
TINY_V32 = {
    "kv_lora_rank": 32,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "index_topk": 8,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-deepseek-v32")
    return save_random_model(
        path, default_tokenizer, "DeepseekV32Config", "DeepseekV32ForCausalLM", **TINY_V32
    )


class TestGreedy(EngineGreedyChecks):
    max_seq_len = MAX_SEQ_LEN


@pytest.mark.parametrize("flat_lever", ["0", "1"])
def test_ledger_equals_plan_with_the_indexer_keys_in_the_pool(
    model_dir: Path, flat_lever: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METRALE_GLM_DSA_INDEXER_FLAT", flat_lever)
    config = model_config_from_hf_file(model_dir)
    engine = assert_ledger_equals_plan(
        model_dir, "float32", max_seq_len=MAX_SEQ_LEN, float32_names=".mlp.gate."
    )
    allocated = engine.plan.allocated_by_owner()
    # Each layer caches 32 latent + 8 RoPE-key values and a 16-wide float32 indexer key.
    assert engine.plan.kv_bytes_per_token == config.num_hidden_layers * (32 + 8 + 16) * 4
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    assert PER_SEQUENCE_STATE not in allocated


def test_met_memory_of_deepseek_v3_made_v32(tmp_path: Path) -> None:
    config = json.loads(DEEPSEEK_V3_CONFIG.read_text())
    config.update(
        model_type="deepseek_v32",
        architectures=["DeepseekV32ForCausalLM"],
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = met_memory_plan(tmp_path, device_memory_gib=1600)
    assert plan["model_type"] == "deepseek_v32"
    # transformers' DeepseekV32ForCausalLM on this config: 671,877,944,064 parameters and
    # correction biases, of which the 58 routers and biases stay float32 (no MTP layer).
    fp32 = 58 * 256 * (7168 + 1)
    assert plan_weight_bytes(plan) == 2 * (671_877_944_064 - fp32) + 4 * fp32
    # 61 layers x (512 latent + 64 RoPE key values in bfloat16, a 128-wide float32 key).
    assert plan["kv_bytes_per_token"] == 61 * (576 * 2 + 128 * 4)
