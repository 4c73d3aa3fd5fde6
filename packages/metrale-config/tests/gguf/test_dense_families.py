"""The dense families' GGUF metadata: llama.cpp's fixed values where its converter writes
nothing, and refusals of what this cannot run (tiny written files; the round trip from a real
checkpoint is metrale-model-arch's ``test_gguf_families``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    ConfigError,
    NormLayout,
    RopeScaling,
    model_config_from_gguf,
)

TinyGguf = Callable[..., Path]
FULL, SLIDING = FULL_ATTENTION, SLIDING_ATTENTION


def test_gemma2_takes_llama_cpps_defaults(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("gemma2", block_count=3))
    assert config.model_type == "gemma2"
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.sliding_window == 4096
    assert config.layer_types == (SLIDING, FULL, SLIDING)
    assert config.attention_scale == 8**-0.5
    assert (config.hidden_act, config.norm_layout) == ("gelu_pytorch_tanh", NormLayout.SANDWICH)
    assert (config.norm_weight_offset, config.embedding_multiplier) == (1.0, math.sqrt(32))


@pytest.mark.parametrize(("arch", "num_layers_27b"), [("gemma2", 46), ("gemma3", 62)])
def test_gemma_27b_scales_by_hidden_over_heads(
    tiny_gguf: TinyGguf, arch: str, num_layers_27b: int
) -> None:
    keys = {"attention__key_length": 16, "attention__sliding_window": 6}
    small = model_config_from_gguf(tiny_gguf(arch, **keys))
    assert small.attention_scale == 16**-0.5
    big = model_config_from_gguf(tiny_gguf(arch, block_count=num_layers_27b, **keys))
    assert big.attention_scale == (32 // 4) ** -0.5
    scaled = model_config_from_gguf(tiny_gguf(arch, attention__scale=0.25, **keys))
    assert scaled.attention_scale == 0.25


def test_gemma3_slides_five_layers_in_six_with_its_local_base(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("gemma3", block_count=7, attention__sliding_window=6))
    assert config.model_type == "gemma3_text"
    assert config.layer_types == (SLIDING,) * 5 + (FULL, SLIDING)
    assert (config.sliding_window, config.local_rope_theta) == (6, 10000.0)
    assert config.final_logit_softcapping is None
    declared = tiny_gguf(
        "gemma3",
        attention__sliding_window=6,
        attention__sliding_window_pattern=2,
        rope__freq_base_swa=50.0,
    )
    config = model_config_from_gguf(declared)
    assert (config.layer_types, config.local_rope_theta) == ((SLIDING, FULL), 50.0)


def test_gemma3_without_a_window_is_all_full_attention(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("gemma3"))
    assert (config.sliding_window, config.layer_types) == (None, (FULL, FULL))


def test_phi3_partial_rotary_longrope_and_no_window(tiny_gguf: TinyGguf) -> None:
    factors = {"rope_factors_long.weight": (2,), "rope_factors_short.weight": (2,)}
    path = tiny_gguf(
        "phi3",
        rope__dimension_count=4,
        rope__scaling__original_context_length=64,
        attention__sliding_window=0,
        tensors=factors,
    )
    config = model_config_from_gguf(path)
    assert config.partial_rotary_factor == 0.5
    assert (config.sliding_window, config.layer_types) == (None, (FULL, FULL))
    assert config.rope_scaling == RopeScaling(
        rope_type="longrope",
        factor=4.0,
        original_max_position_embeddings=64,
        short_factor=(0.0, 0.0),
        long_factor=(0.0, 0.0),
    )


def test_phi3_longrope_needs_its_original_context(tiny_gguf: TinyGguf) -> None:
    factors = {"rope_factors_long.weight": (4,), "rope_factors_short.weight": (4,)}
    with pytest.raises(
        ConfigError, match=re.escape("'phi3.rope.scaling.original_context_length' is missing")
    ):
        model_config_from_gguf(tiny_gguf("phi3", tensors=factors))


def test_olmo2_refuses_olmo3s_sliding_window(tiny_gguf: TinyGguf) -> None:
    with pytest.raises(ConfigError, match=re.escape("'olmo2.attention.sliding_window' is not")):
        model_config_from_gguf(tiny_gguf("olmo2", attention__sliding_window=4096))
    config = model_config_from_gguf(tiny_gguf("olmo2"))
    assert (config.norm_layout, config.qk_norm_per_head) == (NormLayout.POST, False)


GRANITE_SCALES = {
    "embedding_scale": 12.0,
    "residual_scale": 0.22,
    "attention__scale": 0.0078125,
    "logit_scale": 8.0,
}


def test_granite_reads_its_four_multipliers(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("granite", **GRANITE_SCALES))
    assert (config.embedding_multiplier, config.residual_multiplier) == (12.0, 0.22)
    assert (config.attention_scale, config.logits_scaling) == (0.0078125, 8.0)


@pytest.mark.parametrize("missing", list(GRANITE_SCALES))
def test_granite_refuses_a_missing_multiplier(tiny_gguf: TinyGguf, missing: str) -> None:
    path = tiny_gguf("granite", **GRANITE_SCALES, skip=(missing.replace("__", "."),))
    key = f"granite.{missing.replace('__', '.')}"
    with pytest.raises(ConfigError, match=re.escape(f"'{key}' is missing")):
        model_config_from_gguf(path)


def test_smollm3_skips_rope_every_fourth_layer(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("smollm3", block_count=8))
    assert config.nope_layers == (3, 7)
