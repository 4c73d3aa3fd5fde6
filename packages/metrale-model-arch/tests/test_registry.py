from __future__ import annotations

import attrs
import pytest

from metrale_config import ModelConfig, MoeConfig
from metrale_model_arch.families import LlamaForCausalLM
from metrale_model_arch.registry import (
    ARCHITECTURES,
    PLANNED_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    UnsupportedModelError,
    architecture_for,
    family_for,
    planned_architecture,
)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_runs_its_model_types(tiny_config: ModelConfig, model_type: str) -> None:
    assert model_type in SUPPORTED_MODEL_TYPES
    assert family_for(attrs.evolve(tiny_config, model_type=model_type)) is LlamaForCausalLM


@pytest.fixture
def planned_only(monkeypatch: pytest.MonkeyPatch) -> str:
    """A model type with a memory plan and no torch module (as glm5_next was before it ran)."""
    record = attrs.evolve(
        ARCHITECTURES["glm5_next"], model_type="planned_only", module=None, checkpoint_mapping=None
    )
    monkeypatch.setitem(ARCHITECTURES, "planned_only", record)
    return "planned_only"


def test_parsed_but_unrunnable_model_type_lists_the_supported_ones(
    tiny_config: ModelConfig, planned_only: str
) -> None:
    with pytest.raises(UnsupportedModelError) as info:
        family_for(attrs.evolve(tiny_config, model_type=planned_only))
    message = str(info.value)
    assert "'planned_only'" in message
    assert "tiny test config" in message
    assert (
        "deepseek_v2, deepseek_v3, deepseek_v32, gemma2, gemma3, gemma3_text, glm4_moe, "
        "glm5_next, glm5_next_text, gpt_oss, granite, kimi_linear, llama, mistral, mixtral, "
        "olmo2, phi3, qwen2, qwen2_5_vl, qwen3, qwen3_moe, qwen3_next, smollm3" in message
    )


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


def test_planned_types_plan_but_do_not_run(tiny_config: ModelConfig, planned_only: str) -> None:
    config = attrs.evolve(tiny_config, model_type=planned_only)
    record = planned_architecture(config)
    assert record.module is None
    assert record.skeleton is not None
    assert not record.is_runnable
    with pytest.raises(UnsupportedModelError, match=rf"'{planned_only}'.*supported model types: "):
        architecture_for(config)


@pytest.mark.parametrize("model_type", ["glm5_next", "glm5_next_text"])
def test_glm5_next_runs(model_type: str) -> None:
    record = ARCHITECTURES[model_type]
    assert record.is_runnable
    assert model_type in SUPPORTED_MODEL_TYPES
    assert model_type in PLANNED_MODEL_TYPES


def test_unknown_type_is_refused_for_planning_too(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, model_type="gpt2")
    with pytest.raises(UnsupportedModelError, match=r"no weight plan for model_type 'gpt2'"):
        planned_architecture(config)
    with pytest.raises(
        UnsupportedModelError, match="supported model types: deepseek_v2, deepseek_v3, "
    ):
        architecture_for(config)


def test_every_record_is_keyed_by_its_model_type() -> None:
    assert all(name == record.model_type for name, record in ARCHITECTURES.items())
    assert {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm5_next"} <= set(
        ARCHITECTURES
    )


def test_gguf_names_say_which_families_llama_cpp_permuted() -> None:
    assert ARCHITECTURES["llama"].gguf_names is not None
    assert ARCHITECTURES["llama"].gguf_names.permuted_projection("blk.0.attn_q.weight") == "q"
    assert ARCHITECTURES["qwen3"].gguf_names is not None
    assert ARCHITECTURES["qwen3"].gguf_names.permuted_projection("blk.0.attn_q.weight") is None
    assert ARCHITECTURES["glm5_next"].gguf_names is None
