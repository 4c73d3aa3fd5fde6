"""Configs the memory math is checked on: transformers' default GLM-5.3 and a tiny Llama."""

from __future__ import annotations

from typing import Any

import pytest

from metrale_config import ModelConfig, model_config_from_hf_dict

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def glm5_next_config(**text_overrides: Any) -> ModelConfig:
    """transformers' default GLM-5.3 (``Glm5NextConfig()``), its text config overridden."""
    transformers = pytest.importorskip("transformers")
    data = transformers.Glm5NextConfig().to_dict()
    data["text_config"] = {**data["text_config"], **text_overrides}
    return model_config_from_hf_dict(data, source="Glm5NextConfig()")


@pytest.fixture(scope="session")
def glm5_next() -> ModelConfig:
    return glm5_next_config()


@pytest.fixture(scope="session")
def glm5_next_with_mtp() -> ModelConfig:
    """The default config plus one sparse-attention MTP (draft) layer."""
    return glm5_next_config(num_nextn_predict_layers=1, mtp_layer_types=["indexed_attention"])


@pytest.fixture(scope="session")
def tiny_llama() -> ModelConfig:
    return model_config_from_hf_dict(TINY_LLAMA, source="tiny llama")
