"""``gemma3`` configs: the text part is the ``gemma3_text`` config it holds, the vision part a
SigLIP tower with the projector's fields; from what transformers saves and from the sparse
``config.json`` the published checkpoints carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import transformers

from metrale_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    ConfigError,
    RopeScaling,
    SiglipVisionConfig,
    model_config_from_hf_dict,
    model_config_from_hf_file,
)

TEXT: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 32,
    "sliding_window_pattern": 2,
}
VISION: dict[str, Any] = {
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "image_size": 32,
    "patch_size": 4,
}
# google/gemma-3-4b-it's config.json (its text_config names a few fields, the rest default).
PUBLISHED: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
S, F = SLIDING_ATTENTION, FULL_ATTENTION


def test_the_text_part_is_its_gemma3_text_config(tmp_path: Path) -> None:
    transformers.Gemma3Config(
        text_config=TEXT,
        vision_config=VISION,
        mm_tokens_per_image=16,
        image_token_index=300,
        boi_token_index=301,
        eoi_token_index=302,
    ).save_pretrained(tmp_path)
    config = model_config_from_hf_file(tmp_path)
    text = model_config_from_hf_dict({**TEXT, "model_type": "gemma3_text"}, source="text")
    assert config.model_type == "gemma3"
    assert config.layer_types == (S, F, S, F)
    ignored = {"source", "model_type", "architectures", "torch_dtype", "siglip_vision"}
    for field in attrs.fields(type(config)):
        if field.name not in ignored:
            assert getattr(config, field.name) == getattr(text, field.name), field.name
    assert config.siglip_vision == SiglipVisionConfig(
        num_hidden_layers=3,
        hidden_size=48,
        intermediate_size=96,
        num_attention_heads=4,
        image_size=32,
        patch_size=4,
        mm_tokens_per_image=16,
        image_token_id=300,
        boi_token_id=301,
        eoi_token_id=302,
    )
    assert config.siglip_vision.pool_size == 2


def test_the_published_sparse_config_takes_transformers_defaults() -> None:
    config = model_config_from_hf_dict(PUBLISHED, source="gemma-3-4b-it")
    hf = transformers.Gemma3Config(**PUBLISHED).text_config
    assert (config.vocab_size, config.num_attention_heads) == (hf.vocab_size, 8)
    assert (config.num_key_value_heads, config.head_dim) == (hf.num_key_value_heads, 256)
    assert config.max_position_embeddings == hf.max_position_embeddings
    assert config.layer_types == (S, S, S, S, S, F) * 5 + (S, S, S, S)
    assert config.sliding_window == 1024
    assert config.rope_scaling == RopeScaling(rope_type="linear", factor=8.0)
    assert (config.rope_theta, config.local_rope_theta) == (1000000.0, 10000.0)
    assert config.attention_scale == 256**-0.5
    assert config.embedding_multiplier == 2560**0.5
    assert config.eos_token_ids == (1, 106)
    assert config.architectures == ("Gemma3ForConditionalGeneration",)
    assert config.tie_word_embeddings
    assert config.torch_dtype == "bfloat16"
    vision = config.siglip_vision
    assert vision is not None
    assert (vision.patches_per_side, vision.tokens_per_side, vision.pool_size) == (64, 16, 4)
    assert (vision.image_token_id, vision.boi_token_id, vision.eoi_token_id) == (
        262144,
        255999,
        256000,
    )
    assert vision.layer_norm_eps == 1e-6
    assert vision.hidden_act == "gelu_pytorch_tanh"


def test_no_vision_config_means_no_tower() -> None:
    data = {key: value for key, value in PUBLISHED.items() if key != "vision_config"}
    assert model_config_from_hf_dict(data, source="x").siglip_vision is None


def test_the_token_ids_read_under_either_name() -> None:
    data = {**PUBLISHED, "image_token_id": 7}
    del data["image_token_index"]
    vision = model_config_from_hf_dict(data, source="x").siglip_vision
    assert vision is not None
    assert vision.image_token_id == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mm_tokens_per_image": 250}, "'mm_tokens_per_image' must be a square whose side"),
        ({"mm_tokens_per_image": 9}, r"divides the 64 patches a side of an image, got 9"),
        ({"vision_config": {**VISION, "image_size": 30}}, r"'vision_config.image_size' \(30\)"),
        ({"vision_config": {**VISION, "image_size": [32, 32]}}, "must be an integer"),
        ({"vision_config": {**VISION, "hidden_size": 50}}, "multiple of num_attention_heads"),
        ({"text_config": {"hidden_size": "big"}}, "'text_config.hidden_size' must be an integer"),
    ],
)
def test_what_cannot_be_built_is_refused_by_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf_dict({**PUBLISHED, **change}, source="x")
