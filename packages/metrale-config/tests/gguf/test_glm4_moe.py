"""GLM-4.5's GGUF metadata: MTP blocks after the stack, leading dense layers, llama.cpp's
defaults, and the gating it cannot run refused (the round trip from a real checkpoint is
metrale-model-arch's ``test_gguf_families``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import ConfigError, MoeConfig, MtpConfig, model_config_from_gguf

TinyGguf = Callable[..., Path]
MOE_KEYS = {
    "block_count": 4,
    "expert_count": 8,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "expert_shared_count": 1,
    "leading_dense_block_count": 1,
    "nextn_predict_layers": 1,
    "rope__dimension_count": 4,
}


def test_mtp_blocks_follow_the_stack(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("glm4moe", **MOE_KEYS))
    assert config.model_type == "glm4_moe"
    assert (config.num_hidden_layers, len(config.layer_types)) == (3, 3)
    assert config.partial_rotary_factor == 0.5
    assert config.moe == MoeConfig(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        num_shared_experts=1,
        shared_expert_intermediate_size=16,
        norm_topk_prob=False,
        mlp_layer_types=("dense", "sparse", "sparse"),
    )
    assert config.mtp == MtpConfig(num_layers=1, mlp_layer_types=("sparse",))


def test_without_mtp_blocks_every_block_is_a_layer(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("glm4moe", **{**MOE_KEYS, "nextn_predict_layers": 0}))
    assert (config.num_hidden_layers, config.mtp) == (4, None)


def test_softmax_gating_is_refused(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf("glm4moe", **MOE_KEYS, expert_gating_func=1)
    with pytest.raises(ConfigError, match=re.escape("'glm4moe.expert_gating_func' must be 2")):
        model_config_from_gguf(path)
