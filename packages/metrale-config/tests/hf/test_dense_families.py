"""The dense families' switches as parsed from the configs transformers saves, and from the
older spellings real checkpoints carry (Phi-3's ``rope_scaling`` "su", Gemma 3's
``rope_local_base_freq``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers

from metrale_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    ConfigError,
    ModelConfig,
    NormLayout,
    RopeScaling,
    model_config_from_hf_dict,
    model_config_from_hf_file,
)

TINY: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
F, S = FULL_ATTENTION, SLIDING_ATTENTION


def saved(tmp_path: Path, config_class: str, **fields: Any) -> ModelConfig:
    getattr(transformers, config_class)(**TINY, **fields).save_pretrained(tmp_path)
    return model_config_from_hf_file(tmp_path)


def test_olmo2_norms_after_attention_and_mlp_over_whole_projections(tmp_path: Path) -> None:
    config = saved(tmp_path, "Olmo2Config", attention_bias=True)
    assert config.norm_layout == NormLayout.POST
    assert config.qk_norm
    assert not config.qk_norm_per_head
    assert config.qkv_bias
    assert config.o_proj_bias
    assert not config.mlp_bias
    assert config.rms_norm_eps == 1e-5
    assert config.eos_token_ids == (50279,)


def test_granite_reads_its_four_multipliers(tmp_path: Path) -> None:
    config = saved(
        tmp_path,
        "GraniteConfig",
        embedding_multiplier=12.0,
        attention_multiplier=0.015625,
        residual_multiplier=0.22,
        logits_scaling=8.0,
        mlp_bias=True,
    )
    assert (config.embedding_multiplier, config.attention_scale) == (12.0, 0.015625)
    assert (config.residual_multiplier, config.logits_scaling) == (0.22, 8.0)
    assert config.mlp_bias
    assert config.norm_layout == NormLayout.PRE


def test_smollm3_nope_layers_from_the_interval_or_the_list(tmp_path: Path) -> None:
    config = saved(tmp_path, "SmolLM3Config", no_rope_layer_interval=3)
    assert config.nope_layers == (2, 5)
    assert config.tie_word_embeddings
    assert config.rope_theta == 2000000.0
    assert config.layer_types == (F,) * 6
    listed = model_config_from_hf_dict(
        {"model_type": "smollm3", **TINY, "no_rope_layers": [1, 0, 1, 1, 0, 0]}, source="x"
    )
    assert listed.nope_layers == (1, 4, 5)
    with pytest.raises(ConfigError, match="'no_rope_layers' must have 6 entries"):
        model_config_from_hf_dict(
            {"model_type": "smollm3", **TINY, "no_rope_layers": [1, 0]}, source="x"
        )


def test_smollm3_slides_only_its_nope_layers(tmp_path: Path) -> None:
    config = saved(
        tmp_path,
        "SmolLM3Config",
        use_sliding_window=True,
        sliding_window=32,
        no_rope_layer_interval=2,
    )
    assert config.sliding_window == 32
    assert config.layer_types == (F, S, F, S, F, S)


def test_phi3_old_su_rope_scaling_is_longrope_with_its_factors() -> None:
    factors = {"short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0]}
    config = model_config_from_hf_dict(
        {
            "model_type": "phi3",
            **TINY,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.5,
            "sliding_window": 262144,
            "rope_scaling": {"type": "su", **factors},
        },
        source="Phi-3-mini-128k-like",
    )
    assert config.rope_scaling == RopeScaling(
        rope_type="longrope",
        factor=32.0,
        original_max_position_embeddings=4096,
        short_factor=(1.0, 1.5),
        long_factor=(2.0, 4.0),
    )
    assert config.partial_rotary_factor == 0.5
    assert config.sliding_window == 262144
    assert config.layer_types == (S,) * 6


def test_phi3_without_window_or_scaling_is_plain(tmp_path: Path) -> None:
    config = saved(tmp_path, "Phi3Config")
    assert config.rope_scaling is None
    assert config.sliding_window is None
    assert config.layer_types == (F,) * 6
    assert config.partial_rotary_factor == 1.0


def test_gemma2_alternates_windows_and_caps_scores(tmp_path: Path) -> None:
    config = saved(tmp_path, "Gemma2Config", head_dim=8, query_pre_attn_scalar=64)
    assert config.layer_types == (S, F) * 3
    assert config.sliding_window == 4096
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.attention_scale == 64**-0.5
    assert config.embedding_multiplier == 64**0.5
    assert config.hidden_act == "gelu_pytorch_tanh"
    assert config.norm_layout == NormLayout.SANDWICH
    assert config.norm_weight_offset == 1.0
    assert config.tie_word_embeddings
    assert not config.qk_norm


def test_gemma3_text_five_local_to_one_global_with_their_rope_bases(tmp_path: Path) -> None:
    fields = {**TINY, "num_hidden_layers": 12}
    transformers.Gemma3TextConfig(
        **fields, rope_scaling={"rope_type": "linear", "factor": 8.0}
    ).save_pretrained(tmp_path)
    config = model_config_from_hf_file(tmp_path)
    assert config.layer_types == (S, S, S, S, S, F) * 2
    assert config.rope_theta == 1000000.0
    assert config.rope_scaling == RopeScaling(rope_type="linear", factor=8.0)
    assert config.local_rope_theta == 10000.0
    assert config.qk_norm
    assert config.qk_norm_per_head
    assert config.attn_logit_softcapping is None
    assert config.final_logit_softcapping is None
    legacy = model_config_from_hf_dict(
        {"model_type": "gemma3_text", **TINY, "rope_theta": 50.0, "rope_local_base_freq": 5.0},
        source="an older save",
    )
    assert (legacy.rope_theta, legacy.local_rope_theta) == (50.0, 5.0)


def test_gemma_refuses_bidirectional_attention() -> None:
    with pytest.raises(ConfigError, match="use_bidirectional_attention"):
        model_config_from_hf_dict(
            {"model_type": "gemma3_text", **TINY, "use_bidirectional_attention": True}, source="x"
        )
