"""gpt-oss's GGUF metadata (``gpt-oss``): the architecture's fixed parts (sliding layers at even
indices, the SwiGLU's alpha and clamp, YaRN untruncated) beside what the file says, and a file
without its window refused by name (the round trip from a real checkpoint is
metrale-model-arch's ``test_gguf_gpt_oss``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import ConfigError, LayerType, model_config_from_gguf

TinyGguf = Callable[..., Path]
ARCH = "gpt-oss"
KEYS = {
    "block_count": 3,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "attention__sliding_window": 128,
    "rope__scaling__type": "yarn",
    "rope__scaling__factor": 32.0,
    "rope__scaling__original_context_length": 4096,
    "rope__scaling__yarn_beta_fast": 32.0,
    "rope__scaling__yarn_beta_slow": 1.0,
}


def test_fixed_parts_beside_the_file(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf(ARCH, **KEYS))
    assert config.model_type == "gpt_oss"
    sliding, full = LayerType.SLIDING_ATTENTION, LayerType.FULL_ATTENTION
    assert config.layer_types == (sliding, full, sliding)
    assert (config.sliding_window, config.swiglu_alpha, config.swiglu_limit) == (128, 1.702, 7.0)
    assert config.moe is not None
    assert (config.moe.num_experts, config.moe.moe_intermediate_size) == (4, 16)
    scaling = config.rope_scaling
    assert scaling is not None
    assert (scaling.factor, scaling.beta_fast, scaling.beta_slow) == (32.0, 32.0, 1.0)
    assert scaling.truncate is False


def test_a_file_without_its_window_is_refused(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(ARCH, skip=("attention.sliding_window",), **KEYS)
    with pytest.raises(ConfigError, match=re.escape("'gpt-oss.attention.sliding_window'")):
        model_config_from_gguf(path)
