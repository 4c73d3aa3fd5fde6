"""Tiny random checkpoints for the tensor-parallel tests: a Qwen3 (q/k norms) and a Qwen3-MoE
(tied embeddings), over SmolLM2's vocabulary; the Llama is the package's ``tiny_model_dir``."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrale_testing import save_random_model

from metrale_model_arch import Tokenizer


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save_random_model(
        tmp_path_factory.mktemp("tiny-qwen3"),
        default_tokenizer,
        "Qwen3Config",
        "Qwen3ForCausalLM",
        intermediate_size=96,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    return save_random_model(
        tmp_path_factory.mktemp("tiny-qwen3-moe"),
        default_tokenizer,
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        tie_word_embeddings=True,
    )


@pytest.fixture(scope="session")
def ringed_mistral_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    # A window of 4 on both layers: each rank keeps its half of the heads' K/V in rings.
    return save_random_model(
        tmp_path_factory.mktemp("mistral"),
        default_tokenizer,
        "MistralConfig",
        "MistralForCausalLM",
        intermediate_size=96,
        sliding_window=4,
    )
