"""Plan == ledger on the bundled default model (SmolLM2-135M, a tied-head GGUF dequantized at
load): what the preflight computed from the GGUF header is, owner by owner, what was allocated."""

from __future__ import annotations

import pytest
import torch

from metrale_model_arch import LoadOptions, load_model, read_model_config, resolve_model
from metrale_model_arch.memory import KV_POOL, ROPE_TABLE
from metrale_server import EngineArgs, build_engine

pytestmark = pytest.mark.slow

MAX_SEQ_LEN = 128
MAX_BATCH_SIZE = 2


def weight_storage_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter's storage and every buffer's but the RoPE table's, once each."""
    tensors = [*model.parameters()]
    tensors += [b for name, b in model.named_buffers() if not name.endswith("cos_sin_cache")]
    storages = {t.untyped_storage().data_ptr(): t for t in tensors}
    return sum(t.untyped_storage().nbytes() for t in storages.values())


@pytest.mark.parametrize(
    ("dtype", "quantization"),
    [("float32", "none"), ("bfloat16", "none"), ("float32", "int8"), ("float32", "q4")],
)
def test_default_model_ledger_equals_plan(dtype: str, quantization: str) -> None:
    engine = build_engine(
        EngineArgs(
            dtype=dtype,
            quantization=quantization,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=MAX_BATCH_SIZE,
        )
    )
    plan = engine.plan
    live = engine.ledger.live_bytes_by_owner()
    assert live == plan.allocated_by_owner()
    assert engine.ledger.live_bytes() == sum(live.values())

    config = read_model_config(resolve_model(None))
    dtype_bytes = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    assert config.tie_word_embeddings
    assert "weights.lm_head" not in live
    if quantization in ("int8", "q4"):  # an int8 byte per value, a float32 scale per row
        assert live["weights.embeddings"] == config.vocab_size * (config.hidden_size + 4)
    else:
        assert live["weights.embeddings"] == config.vocab_size * config.hidden_size * dtype_bytes
    weights = sum(size for owner, size in live.items() if owner.startswith("weights."))
    assert weights == weight_storage_bytes(engine.loaded.model)
    kv_per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim
    assert live[KV_POOL] == (
        MAX_BATCH_SIZE * MAX_SEQ_LEN * kv_per_token * dtype_bytes
    )  # a small pool: the slots' full-length sequences, no more
    assert live[ROPE_TABLE] == MAX_SEQ_LEN * config.head_dim * 4


@pytest.mark.parametrize("quantization", ["none", "int8", "q4"])
def test_an_engine_over_the_loaded_default_model_adopts_its_parameters(quantization: str) -> None:
    loaded = load_model(
        None,
        LoadOptions(
            dtype=torch.float32, device="cpu", max_seq_len=MAX_SEQ_LEN, quantization=quantization
        ),
    )
    engine = build_engine(
        EngineArgs(device="cpu", max_seq_len=MAX_SEQ_LEN, max_batch_size=1), loaded
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    assert "weights.lm_head" not in live  # the tied head is counted once, as the embeddings
    weights = sum(size for owner, size in live.items() if owner.startswith("weights."))
    assert weights == weight_storage_bytes(loaded.model)
