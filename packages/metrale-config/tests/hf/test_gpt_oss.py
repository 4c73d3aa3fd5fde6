"""gpt-oss's fields as transformers saves them and as the published configs spell them
(``rope_scaling`` with a top-level ``rope_theta``, ``quant_method: mxfp4``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers

from metrale_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    RopeScaling,
    model_config_from_hf_dict,
    model_config_from_hf_file,
)

TINY: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
}
F, S = FULL_ATTENTION, SLIDING_ATTENTION
YARN = RopeScaling(
    rope_type="yarn",
    factor=32.0,
    original_max_position_embeddings=4096,
    beta_fast=32.0,
    beta_slow=1.0,
    truncate=False,
)


def test_transformers_defaults(tmp_path: Path) -> None:
    transformers.GptOssConfig(**TINY).save_pretrained(tmp_path)
    config = model_config_from_hf_file(tmp_path)
    assert config.model_type == "gpt_oss"
    assert config.layer_types == (S, F, S, F)
    assert config.sliding_window == 128
    assert (config.rope_theta, config.rope_scaling) == (150000.0, YARN)
    assert (config.qkv_bias, config.o_proj_bias) == (True, True)
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    assert config.moe is not None
    assert (config.moe.num_experts, config.moe.num_experts_per_tok) == (8, 4)
    assert config.moe.moe_intermediate_size == 32
    assert config.moe.mlp_layer_types == ("sparse",) * 4


def test_the_published_spelling() -> None:
    legacy = {
        "model_type": "gpt_oss",
        **TINY,
        "rope_theta": 150000,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "layer_types": ["full_attention", "sliding_attention"] * 2,
        "quantization_config": {"quant_method": "mxfp4"},
    }
    config = model_config_from_hf_dict(legacy, source="x")
    assert (config.rope_theta, config.rope_scaling) == (150000.0, YARN)
    assert config.layer_types == (F, S, F, S)
    assert config.quantization_method == "mxfp4"


def test_no_window_means_full_layers() -> None:
    config = model_config_from_hf_dict(
        {"model_type": "gpt_oss", **TINY, "sliding_window": None}, source="x"
    )
    assert config.layer_types == (F,) * 4
