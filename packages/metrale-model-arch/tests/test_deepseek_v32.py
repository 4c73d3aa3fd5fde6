"""Parity of ``deepseek_v32`` (DeepSeek-V3.2: MLA attending where a lightning indexer selects)
with transformers on a tiny random float32 checkpoint whose ``index_topk`` (8) is shorter than
most prompts, so the sparse selection decides the logits (plain RoPE, and YaRN whose
``mscale != mscale_all_dim`` scales the cos/sin the indexer's RoPE shares); the same weights
with an ``index_topk`` past every prompt (dense attention) give other logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.family_parity import (
    Bfloat16ParityChecks,
    FamilyCheckpoint,
    assert_counts_equal_transformers,
    hf_logits,
    load_checkpoint,
)

from metrale_model_arch.cache_spec import MlaLatentSpec, PagedIndexerSpec, SparseAttentionSpec
from metrale_model_arch.counts.deepseek import deepseek_param_counts
from metrale_model_arch.families.deepseek import DeepseekForCausalLM
from metrale_model_arch.families.deepseek.sparse_attention import SparseMlaAttention
from metrale_model_arch.registry import ARCHITECTURES, cache_specs, family_for

transformers = pytest.importorskip("transformers")

INDEX_TOPK = 8
PROMPT_LENS = (5, 21, 30, 38)
TINY_V32 = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
# name -> config fields beyond TINY_V32
CASES: dict[str, dict[str, Any]] = {"plain-rope": {}, "yarn": {"rope_parameters": YARN}}


def save_tiny_v32(path: Path, index_topk: int, **kwargs: Any) -> Any:
    """The same random weights whatever ``index_topk`` (it shapes no parameter)."""
    hf_config = transformers.DeepseekV32Config(**TINY_V32, index_topk=index_topk, **kwargs)
    hf_config._attn_implementation = "eager"
    hf_model = transformers.DeepseekV32ForCausalLM(hf_config).eval()
    randomize_weights(hf_model, torch.Generator().manual_seed(0), buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_v32(path, INDEX_TOPK, **CASES[request.param])
    return FamilyCheckpoint.saved(request.param, path, hf_model, PROMPT_LENS)


class TestParity(Bfloat16ParityChecks):
    """Logits within 1e-4 of transformers' eager attention (float32)."""

    family = DeepseekForCausalLM


def test_config_parses_the_indexer(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    assert config.model_type == "deepseek_v32"
    assert family_for(config) is DeepseekForCausalLM
    assert ARCHITECTURES["deepseek_v32"].gguf_names is None
    assert config.dsa is not None
    assert (config.dsa.index_n_heads, config.dsa.index_head_dim) == (8, 16)
    assert (config.dsa.index_topk, config.dsa.index_kpool) == (INDEX_TOPK, 1)
    is_yarn = "rope_parameters" in CASES[checkpoint.name]
    assert (config.rope_scaling is not None) == is_yarn
    latent = MlaLatentSpec(kv_lora_rank=32, qk_rope_head_dim=8)
    indexer = PagedIndexerSpec(index_head_dim=16)
    assert (
        cache_specs(config, indexer_paged=True)
        == (SparseAttentionSpec(latent=latent, indexer=indexer),) * 3
    )
    model = load_checkpoint(checkpoint, DeepseekForCausalLM)
    assert all(isinstance(layer.self_attn, SparseMlaAttention) for layer in model.model.layers)


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    assert_counts_equal_transformers(
        checkpoint, deepseek_param_counts(checkpoint.config), DeepseekForCausalLM
    )


def test_the_indexer_selection_changes_the_logits(
    checkpoint: FamilyCheckpoint, tmp_path: Path, paged_runner: Any
) -> None:
    """With ``index_topk`` past the prompt every query attends densely: other logits, still
    transformers'."""
    hf_dense = save_tiny_v32(tmp_path, 64, **CASES[checkpoint.name])
    dense = FamilyCheckpoint.saved("dense", tmp_path, hf_dense, PROMPT_LENS)
    prompt = checkpoint.prompts[checkpoint.longest_id]
    sparse_logits = paged_runner(
        load_checkpoint(checkpoint, DeepseekForCausalLM), num_blocks=32, block_size=4
    ).step({0: prompt})[0]
    dense_logits = paged_runner(
        load_checkpoint(dense, DeepseekForCausalLM), num_blocks=32, block_size=4
    ).step({0: prompt})[0]
    torch.testing.assert_close(dense_logits, hf_logits(dense.hf_model, prompt), atol=1e-4, rtol=0)
    # The first INDEX_TOPK positions see at most INDEX_TOPK tokens: dense either way.
    torch.testing.assert_close(
        sparse_logits[:INDEX_TOPK], dense_logits[:INDEX_TOPK], atol=1e-4, rtol=0
    )
    assert (sparse_logits[INDEX_TOPK:] - dense_logits[INDEX_TOPK:]).abs().max() > 1e-2
