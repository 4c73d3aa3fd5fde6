from __future__ import annotations

import attrs
import pytest

from metrale_config import ModelConfig, MoeConfig
from metrale_model_arch.families import LlamaForCausalLM
from metrale_model_arch.registry import SUPPORTED_MODEL_TYPES, UnsupportedModelError, family_for


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_runs_its_model_types(tiny_config: ModelConfig, model_type: str) -> None:
    assert model_type in SUPPORTED_MODEL_TYPES
    assert family_for(attrs.evolve(tiny_config, model_type=model_type)) is LlamaForCausalLM


def test_parsed_but_unrunnable_model_type_lists_the_supported_ones(
    tiny_config: ModelConfig,
) -> None:
    moe = attrs.evolve(
        tiny_config,
        model_type="qwen3_moe",
        moe=MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    )
    with pytest.raises(UnsupportedModelError) as info:
        family_for(moe)
    message = str(info.value)
    assert "'qwen3_moe'" in message
    assert "tiny test config" in message
    assert "llama, mistral, qwen2, qwen3" in message


def test_unsupported_model_error_is_a_value_error() -> None:
    assert issubclass(UnsupportedModelError, ValueError)


def test_llama_family_refuses_moe_layers_under_a_llama_model_type(
    tiny_config: ModelConfig,
) -> None:
    moe = attrs.evolve(
        tiny_config, moe=MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    )
    with pytest.raises(ValueError, match="does not support moe"):
        LlamaForCausalLM(moe)
