"""``glm4_moe`` (GLM-4.5 / 4.6) configs: the fields and schedules transformers derives."""

from __future__ import annotations

from typing import Any

import pytest

from metrale_config import ConfigError, model_config_from_hf_dict

# zai-org/GLM-4.5's config.json, the fields the architecture reads.
GLM_4_5: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "eos_token_id": [151329, 151336, 151338],
    "pad_token_id": 151329,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "partial_rotary_factor": 0.5,
    "intermediate_size": 12288,
    "max_position_embeddings": 131072,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 1536,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_hidden_layers": 92,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_qk_norm": True,
    "vocab_size": 151552,
}


def parse(**changes: Any) -> Any:
    data = {key: value for key, value in {**GLM_4_5, **changes}.items() if value is not ...}
    return model_config_from_hf_dict(data, source="config.json")


def test_the_published_glm_4_5_config() -> None:
    config = parse()
    assert config.model_type == "glm4_moe"
    assert (config.hidden_size, config.head_dim, config.num_hidden_layers) == (5120, 128, 92)
    assert (config.num_attention_heads, config.num_key_value_heads) == (96, 8)
    assert config.partial_rotary_factor == 0.5
    assert config.rope_theta == 1e6
    assert config.rope_scaling is None
    assert config.qkv_bias
    assert not config.o_proj_bias
    assert config.qk_norm
    assert config.eos_token_ids == (151329, 151336, 151338)
    moe = config.moe
    assert moe is not None
    assert moe.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 89
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (160, 8, 1536)
    assert (moe.num_shared_experts, moe.shared_expert_intermediate_size) == (1, 1536)
    assert (moe.routed_scaling_factor, moe.norm_topk_prob) == (2.5, True)
    assert (moe.n_group, moe.topk_group) == (1, 1)
    assert config.mtp is not None
    assert config.mtp.num_layers == 1
    assert config.mtp.mlp_layer_types == ("sparse",)


def test_partial_rotary_from_rope_parameters_first_then_the_field_then_half() -> None:
    rope = {"rope_type": "default", "rope_theta": 10.0, "partial_rotary_factor": 0.75}
    assert parse(rope_parameters=rope).partial_rotary_factor == 0.75
    assert parse(rope_parameters=rope).rope_theta == 10.0
    assert parse(partial_rotary_factor=0.25).partial_rotary_factor == 0.25
    assert parse(partial_rotary_factor=...).partial_rotary_factor == 0.5


def test_transformers_defaults_for_omitted_fields() -> None:
    config = parse(
        first_k_dense_replace=...,
        n_routed_experts=...,
        n_shared_experts=...,
        num_nextn_predict_layers=...,
        use_qk_norm=...,
        attention_bias=...,
        routed_scaling_factor=...,
    )
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("dense",) + ("sparse",) * 91
    assert config.moe.num_experts == 128
    assert config.moe.num_shared_experts == 1
    assert config.moe.routed_scaling_factor == 1.0
    assert config.mtp is not None
    assert config.mtp.num_layers == 1
    assert not config.qk_norm
    assert not config.qkv_bias


def test_no_mtp_layers_and_no_shared_experts() -> None:
    config = parse(num_nextn_predict_layers=0, n_shared_experts=0, first_k_dense_replace=100)
    assert config.mtp is None
    assert config.moe is not None
    assert config.moe.shared_expert_intermediate_size is None
    assert set(config.moe.mlp_layer_types) == {"dense"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("first_k_dense_replace", -1), ("partial_rotary_factor", 0.0), ("n_shared_experts", -2)],
)
def test_impossible_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"config.json: field '{field}'"):
        parse(**{field: value})
