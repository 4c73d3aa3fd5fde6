"""Parity of ``qwen3_next`` (Qwen3-Next) with transformers on a tiny random checkpoint (every
parameter randomized, float32): Gated DeltaNet layers with fewer key than value heads and a
value dim unlike the key dim, gated attention with partial rotary and biases, a dense layer
beside sparse ones; a prompt past one 64-token delta-rule chunk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.family_parity import (
    FamilyCheckpoint,
    FamilyParityChecks,
    assert_counts_equal_transformers,
)

from metrale_model_arch.cache_spec import FullAttentionSpec, LinearAttentionSpec
from metrale_model_arch.counts.qwen3_next import qwen3_next_param_counts
from metrale_model_arch.families.qwen3_next import Qwen3NextForCausalLM
from metrale_model_arch.registry import cache_specs, family_for

transformers = pytest.importorskip("transformers")

PROMPT_LENS = (1, 7, 13, 70)
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.25,
    "rope_theta": 500.0,
    "attention_bias": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 12,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "norm_topk_prob": False,
    "mlp_only_layers": [2],
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def save_tiny_qwen3_next(path: Path) -> object:
    hf_model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**TINY))
    generator = torch.Generator().manual_seed(0)
    randomize_weights(hf_model, generator)
    # The (1 + w) norms (all but the gated one) centred as checkpoints hold them: w near 0.
    with torch.no_grad():
        for name, weight in hf_model.named_parameters():
            if "norm" in name and "linear_attn" not in name:
                weight.copy_(0.2 * torch.randn(weight.shape, generator=generator))
    hf_model.eval()
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp("tiny-qwen3_next")
    return FamilyCheckpoint.saved("tiny", path, save_tiny_qwen3_next(path), PROMPT_LENS)


class TestParity(FamilyParityChecks):
    family = Qwen3NextForCausalLM
    num_greedy_tokens = 24


def test_config_and_cache_specs(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    assert family_for(config) is Qwen3NextForCausalLM
    assert config.partial_rotary_factor == 0.25
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("sparse", "sparse", "dense", "sparse")
    linear = LinearAttentionSpec(
        num_heads=4, head_dim=12, conv_kernel_dim=3, num_key_heads=2, value_head_dim=8
    )
    full = FullAttentionSpec(num_kv_heads=2, head_dim=16)
    assert cache_specs(config, indexer_paged=True) == (linear, full, linear, full)
    # (value heads, key dim, value dim) float32, and q | k | v channels of the last 2 inputs.
    recurrent, conv = linear.state(256)
    assert recurrent.shape == (4, 12, 8)
    assert conv.shape == (2 * 2 * 12 + 4 * 8, 2)


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    counts = qwen3_next_param_counts(checkpoint.config)
    assert_counts_equal_transformers(checkpoint, counts, Qwen3NextForCausalLM)
