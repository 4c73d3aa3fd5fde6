"""The engine on a tiny random ``glm4_moe`` checkpoint that carries its MTP layer: batching,
preemption and chunked prefill never change greedy tokens; plan == ledger byte for byte with
the MTP layer owned by ``weights.mtp``; ``met memory`` of the published GLM-4.5 config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.engine_parity import (
    MTP_SPECULATION,
    EngineGreedyChecks,
    assert_ledger_equals_plan,
    met_memory_plan,
    plan_weight_bytes,
)
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import MTP, ROPE_TABLE, RUNTIME_HEADROOM

transformers = pytest.importorskip("transformers")

GLM_4_5_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/glm-4.5/config.json"
)
MAX_SEQ_LEN = 64
TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.0,
    "use_qk_norm": True,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """Every parameter and correction bias random; an MTP layer (layer 2: the last layer's
    tensors renumbered and randomized, plus enorm, hnorm, eh_proj, shared_head.norm)."""
    path = tmp_path_factory.mktemp("tiny-glm4_moe")
    hf_config = transformers.Glm4MoeConfig(
        vocab_size=default_tokenizer.vocab_size,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        **TINY,
    )
    model = transformers.Glm4MoeForCausalLM(hf_config)
    generator = torch.Generator().manual_seed(0)

    def random(name: str, shape: torch.Size) -> torch.Tensor:
        noise = torch.randn(shape, generator=generator)
        return 1.0 + 0.2 * noise if "norm" in name else 0.2 * noise

    randomize_weights(model, generator, buffers=True)
    model.save_pretrained(path, safe_serialization=True)
    file = path / "model.safetensors"
    tensors = load_file(file)
    hidden, last = TINY["hidden_size"], "model.layers.1."
    shapes = {
        "model.layers.2." + name[len(last) :]: tensor.shape
        for name, tensor in tensors.items()
        if name.startswith(last)
    }
    for name in ("enorm", "hnorm", "shared_head.norm"):
        shapes[f"model.layers.2.{name}.weight"] = torch.Size([hidden])
    shapes["model.layers.2.eh_proj.weight"] = torch.Size([hidden, 2 * hidden])
    tensors.update((name, random(name, shape)) for name, shape in shapes.items())
    save_file(tensors, file, metadata={"format": "pt"})
    default_tokenizer.save(path)
    return path


class TestGreedy(EngineGreedyChecks):
    max_seq_len = MAX_SEQ_LEN


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan_with_the_mtp_owner(model_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(model_dir)
    # Every saved tensor but the router's float32 ones at the serve dtype, by owner.
    engine = assert_ledger_equals_plan(
        model_dir,
        dtype,
        max_seq_len=MAX_SEQ_LEN,
        float32_names=".mlp.gate.",
        mtp_prefix="model.layers.2.",
    )
    allocated = engine.plan.allocated_by_owner()
    assert allocated[MTP] > 0
    # Half of each 16-wide head is rotated: an 8-wide float32 table per position.
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 8 * 4
    assert config.mtp is not None
    assert RUNTIME_HEADROOM not in allocated


def test_met_memory_of_the_published_glm_4_5_config() -> None:
    # Its MTP layer is loaded, and planned, only to speculate with it.
    without = met_memory_plan(GLM_4_5_CONFIG, device_memory_gib=1200)["by_owner"]
    assert MTP not in without
    plan = met_memory_plan(GLM_4_5_CONFIG, 1200, "--speculative-config", MTP_SPECULATION)
    assert plan["model_type"] == "glm4_moe"
    owners = plan["by_owner"]
    weights = plan_weight_bytes(plan)
    # The published checkpoint: ~716 GB in bfloat16 (its MTP layer's copies of the embedding
    # and head are not loaded: MTP shares the target's).
    assert abs(weights / 716e9 - 1) < 0.01
    assert owners[MTP] == 7_977_778_304
    # 92 layers x (K + V) x 8 heads x 128 dims x 2 bytes.
    assert plan["kv_bytes_per_token"] == 92 * 2 * 8 * 128 * 2
