"""``qwen2_5_vl`` configs: the hub's flat config.json and transformers 5's nested save, read as
transformers reads them."""

from __future__ import annotations

from typing import Any

import pytest

from metrale_config import ConfigError, LayerType, model_config_from_hf_dict

transformers = pytest.importorskip("transformers")

# Qwen/Qwen2.5-VL-7B-Instruct's config.json (flat text fields, the legacy mrope rope_scaling).
QWEN2_5_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 152064,
}


def test_the_published_7b_config() -> None:
    config = model_config_from_hf_dict(QWEN2_5_VL_7B, source="config.json")
    assert (config.hidden_size, config.head_dim, config.num_hidden_layers) == (3584, 128, 28)
    assert (config.num_attention_heads, config.num_key_value_heads) == (28, 4)
    assert (config.rope_theta, config.rope_scaling) == (1e6, None)
    assert config.mrope_section == (16, 24, 24)
    assert (config.qkv_bias, config.o_proj_bias, config.tie_word_embeddings) == (True, False, False)
    assert config.sliding_window is None
    assert set(config.layer_types) == {LayerType.FULL_ATTENTION}
    assert config.torch_dtype == "bfloat16"
    vision = config.vision
    assert vision is not None
    assert (vision.depth, vision.hidden_size, vision.num_heads, vision.head_dim) == (
        32,
        1280,
        16,
        80,
    )
    assert (vision.window_size, vision.fullatt_block_indexes) == (112, (7, 15, 23, 31))
    assert (vision.out_hidden_size, vision.projection_intermediate_size) == (3584, 5120)
    assert (vision.image_token_id, vision.video_token_id) == (151655, 151656)
    assert (vision.vision_start_token_id, vision.vision_end_token_id) == (151652, 151653)
    assert vision.rms_norm_eps == 1e-6


@pytest.mark.parametrize("layout", ["flat", "transformers-5"])
def test_the_fields_are_those_transformers_reads(layout: str) -> None:
    reference = transformers.Qwen2_5_VLConfig(**QWEN2_5_VL_7B)
    data = QWEN2_5_VL_7B if layout == "flat" else reference.to_dict()
    if layout != "flat":
        assert "text_config" in data
    config = model_config_from_hf_dict(data, source="config.json")
    text, vision = reference.text_config, reference.vision_config
    assert config.vocab_size == text.vocab_size
    assert config.intermediate_size == text.intermediate_size
    assert config.max_position_embeddings == text.max_position_embeddings
    assert config.rms_norm_eps == text.rms_norm_eps
    assert config.rope_theta == text.rope_parameters["rope_theta"]
    assert list(config.mrope_section) == text.rope_parameters["mrope_section"]
    assert config.tie_word_embeddings == reference.tie_word_embeddings
    assert config.vision is not None
    assert config.vision.window_size == vision.window_size
    assert list(config.vision.fullatt_block_indexes) == list(vision.fullatt_block_indexes)
    assert config.vision.image_token_id == reference.image_token_id


def test_text_config_tie_word_embeddings_ties_the_head() -> None:
    data = transformers.Qwen2_5_VLConfig(**QWEN2_5_VL_7B).to_dict()
    data["text_config"] = {**data["text_config"], "tie_word_embeddings": True}
    data["tie_word_embeddings"] = False
    assert model_config_from_hf_dict(data, source="x").tie_word_embeddings


def test_a_config_without_a_vision_config_has_no_tower() -> None:
    data = {k: v for k, v in QWEN2_5_VL_7B.items() if k != "vision_config"}
    assert model_config_from_hf_dict(data, source="x").vision is None


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]}},
        {"rope_scaling": None, "rope_parameters": {"rope_type": "default", "mrope_section": [64]}},
    ],
    ids=["wrong-sum", "one-section"],
)
def test_an_mrope_section_that_does_not_fill_half_a_head_is_refused(rope: dict[str, Any]) -> None:
    with pytest.raises(
        ConfigError, match=r"mrope_section. must be three sizes summing to head_dim // 2 \(64\)"
    ):
        model_config_from_hf_dict({**QWEN2_5_VL_7B, **rope}, source="x")


def test_a_window_smaller_than_a_merged_patch_is_refused() -> None:
    vision = {**QWEN2_5_VL_7B["vision_config"], "window_size": 20}
    with pytest.raises(ConfigError, match=r"vision_config.window_size' \(20\) must hold"):
        model_config_from_hf_dict({**QWEN2_5_VL_7B, "vision_config": vision}, source="x")
