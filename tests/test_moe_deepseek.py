"""The engine on tiny random ``deepseek_v2`` (V2-Lite's shape: q_proj, greedy routing) and
``deepseek_v3`` checkpoints: batching, preemption and chunked prefill never change greedy
tokens; plan == ledger byte for byte with the latent KV pool; ``met memory`` of the published
DeepSeek-V3 config."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrale_testing import save_random_model
from metrale_testing.engine_parity import (
    MTP_SPECULATION,
    EngineGreedyChecks,
    assert_ledger_equals_plan,
    met_memory_plan,
    plan_weight_bytes,
)

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import KV_POOL, MTP, ROPE_TABLE, RUNTIME_HEADROOM

pytest.importorskip("transformers")

DEEPSEEK_V3_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/deepseek-v3/config.json"
)
MAX_SEQ_LEN = 64
MLA = {
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
}
# model type -> (transformers config class, model class, fields beyond MLA's)
TINY: dict[str, tuple[str, str, dict[str, object]]] = {
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        {"q_lora_rank": None, "topk_method": "greedy", "n_shared_experts": 2},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        # No MTP layer in a transformers save: served without (MTP: metrale-server's
        # tests/engine/test_mtp_deepseek_engine.py).
        {
            "q_lora_rank": 24,
            "n_group": 2,
            "topk_group": 1,
            "n_shared_experts": 1,
            "num_nextn_predict_layers": 0,
        },
    ),
}


@pytest.fixture(scope="module", params=list(TINY))
def model_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    default_tokenizer: Tokenizer,
) -> Path:
    config_name, model_name, extra = TINY[request.param]
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return save_random_model(path, default_tokenizer, config_name, model_name, **MLA, **extra)


class TestGreedy(EngineGreedyChecks):
    max_seq_len = MAX_SEQ_LEN


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan_with_the_latent_pool(model_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(model_dir)
    # Every saved tensor at the serve dtype but the float32 router (and V3's bias), by owner.
    engine = assert_ledger_equals_plan(
        model_dir, dtype, max_seq_len=MAX_SEQ_LEN, float32_names=".mlp.gate."
    )
    allocated = engine.plan.allocated_by_owner()
    dtype_bytes = 4 if dtype == "float32" else 2
    # Each layer caches 32 latent + 8 RoPE-key values a token, once for all heads.
    per_token = config.num_hidden_layers * (32 + 8) * dtype_bytes
    assert engine.plan.kv_bytes_per_token == per_token
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    # An 8-wide float32 RoPE table per position (qk_rope_head_dim).
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 8 * 4
    assert RUNTIME_HEADROOM not in allocated


def test_met_memory_of_the_published_deepseek_v3_config() -> None:
    # Its MTP layer is loaded, and planned, only to speculate with it.
    without = met_memory_plan(DEEPSEEK_V3_CONFIG, device_memory_gib=1600)["by_owner"]
    assert MTP not in without
    plan = met_memory_plan(DEEPSEEK_V3_CONFIG, 1600, "--speculative-config", MTP_SPECULATION)
    assert plan["model_type"] == "deepseek_v3"
    owners = plan["by_owner"]
    weights = plan_weight_bytes(plan)
    # 671.03e9 parameters (transformers' count on this config) and the MTP layer's 11.61e9
    # (a sparse layer, enorm, hnorm, eh_proj, shared_head.norm) in bfloat16, the routers and
    # correction biases (58 + 1 sparse layers) in float32.
    stack = 2 * 671_026_419_200 + 2 * 58 * 256 * (7168 + 1)
    assert weights == stack + 2 * 11_610_068_224 + 2 * 256 * (7168 + 1)
    assert owners[MTP] == 2 * 11_610_068_224 + 2 * 256 * (7168 + 1)
    # 61 layers x (512 latent + 64 RoPE key) x 2 bytes: one row per token for all 128 heads.
    assert plan["kv_bytes_per_token"] == 61 * 576 * 2
    assert owners[ROPE_TABLE] == 16384 * 64 * 4
