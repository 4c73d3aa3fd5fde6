"""Plan == ledger byte for byte on the routed-expert families (qwen3_moe, mixtral).

As the dense families' check in metrale-server: after an ``Engine`` is built, the ledger's live
bytes by owner equal the plan's allocated owners, and the plan's weights equal the Hugging Face
model's own parameter count, so a mistake shared by plan and loader still shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch.memory import BUFFER_ARENA, KV_POOL, ROPE_TABLE, RUNTIME_HEADROOM
from metrale_server import EngineArgs, build_engine

MAX_SEQ_LEN = 64
BLOCK_SIZE = 16
MAX_BATCH_SIZE = 2
MAX_BATCH_TOKENS = 128


def hf_weight_bytes_fp32(path: Path, config: ModelConfig) -> dict[str, int]:
    """Weight bytes by owner at float32, from the saved tensors (a tied head is not saved)."""
    owners = {
        "weights.embeddings": 0,
        "weights.layers": 0,
        "weights.final_norm": 0,
        "weights.lm_head": 0,
    }
    with safe_open(str(path / "model.safetensors"), framework="pt") as saved:
        for name in saved.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            numel = saved.get_slice(name).get_shape()
            size = int(torch.Size(numel).numel())
            if name.startswith("lm_head."):
                if not config.tie_word_embeddings:
                    owners["weights.lm_head"] += size
            elif name.startswith("model.embed_tokens."):
                owners["weights.embeddings"] += size
            elif name.startswith("model.norm."):
                owners["weights.final_norm"] += size
            else:
                owners["weights.layers"] += size
    return {owner: count * 4 for owner, count in owners.items() if count}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_ledger_equals_plan_by_owner(
    tiny_moe_factory: Callable[[str], Path], model_type: str, dtype: str
) -> None:
    path = tiny_moe_factory(model_type)
    config = model_config_from_hf_file(path)
    assert config.model_type == model_type
    assert config.moe is not None
    engine = build_engine(
        EngineArgs(
            model=str(path),
            dtype=dtype,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=MAX_BATCH_SIZE,
            max_batch_tokens=MAX_BATCH_TOKENS,
        )
    )
    plan = engine.plan
    dtype_bytes = 4 if dtype == "float32" else 2
    allocated = plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner() == allocated
    assert engine.ledger.live_bytes() == sum(allocated.values())

    hf_weights = {o: s * dtype_bytes // 4 for o, s in hf_weight_bytes_fp32(path, config).items()}
    assert {o: s for o, s in allocated.items() if o.startswith("weights.")} == hf_weights
    kv_bytes_per_token = (
        config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * dtype_bytes
    )
    assert plan.kv_bytes_per_token == kv_bytes_per_token
    assert engine.num_kv_blocks == MAX_BATCH_SIZE * (MAX_SEQ_LEN // BLOCK_SIZE)
    assert allocated[KV_POOL] == engine.num_kv_blocks * BLOCK_SIZE * kv_bytes_per_token
    kv_tensor_bytes = sum(k.nbytes + v.nbytes for k, v in engine.core.runner.kv_caches)
    assert kv_tensor_bytes == allocated[KV_POOL]
    # ids, positions and KV slots per token; a block-table row and a logits row per slot
    blocks_per_seq = MAX_SEQ_LEN // BLOCK_SIZE
    assert allocated[BUFFER_ARENA] == 3 * MAX_BATCH_TOKENS * 8 + MAX_BATCH_SIZE * (
        blocks_per_seq * 8 + config.vocab_size * dtype_bytes
    )
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * config.head_dim * 4
    assert RUNTIME_HEADROOM not in allocated
